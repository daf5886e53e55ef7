/*
 * schedgpu.c: the schedGPU compatibility API (schedgpu.h) over one
 * process-wide cogpu handle.
 */
#include <errno.h>
#include <pthread.h>

#include "api/api-int.h"
#include "schedgpu.h"

enum {
  SG_SUCCESS = 0,
  SG_INVALID_VALUE = 1,
  SG_MEMORY_ALLOCATION = 2,
  SG_INIT_ERROR = 3,
  SG_INVALID_DEVICE = 101,
  SG_NOT_READY = 600
};

static pthread_mutex_t sg_mu = PTHREAD_MUTEX_INITIALIZER;
static cogpu_t *sg_handle;
static int sg_timeout_s;
static int sg_priority;

static int sg_attach(void) {
  if (sg_handle && !sg_handle->forked)
    return SG_SUCCESS;
  cogpu_attach_opts_t o = {.priority = sg_priority};
  /* After fork the parent's handle is not ours; attach anew. */
  sg_handle = NULL;
  return cogpu_attach(&o, &sg_handle) == 0 ? SG_SUCCESS : SG_INIT_ERROR;
}

int schedGPUInit(int timeout_seconds, int priority) {
  if (timeout_seconds < 0) {
    cogpu__seterr(-EINVAL, "schedGPUInit: negative timeout %d",
                  timeout_seconds);
    return SG_INVALID_VALUE;
  }
  pthread_mutex_lock(&sg_mu);
  sg_timeout_s = timeout_seconds;
  sg_priority = priority;
  int rc = sg_attach();
  if (rc == SG_SUCCESS)
    sg_handle->be->set_priority(sg_handle->b, priority);
  pthread_mutex_unlock(&sg_mu);
  return rc;
}

static cogpu_t *sg_get(int *rc) {
  pthread_mutex_lock(&sg_mu);
  *rc = sg_attach();
  cogpu_t *h = sg_handle;
  pthread_mutex_unlock(&sg_mu);
  return h;
}

static int sg_code(int rc) {
  switch (rc) {
  case 0:
    return SG_SUCCESS;
  case -EAGAIN:
  case -EBUSY:
    return SG_NOT_READY;
  case -ETIMEDOUT:
  case -E2BIG:
  case -ENOSPC:
    return SG_MEMORY_ALLOCATION;
  case -ENODEV:
    return SG_INVALID_DEVICE;
  case -EINVAL:
    return SG_INVALID_VALUE;
  default:
    return SG_INIT_ERROR;
  }
}

int preCudaMalloc(int *device, size_t bytes, bool block) {
  if (!device || bytes == 0) {
    cogpu__seterr(-EINVAL, "preCudaMalloc: %s",
                  device ? "0 bytes" : "device is NULL");
    return SG_INVALID_VALUE;
  }
  int rc;
  cogpu_t *h = sg_get(&rc);
  if (rc != SG_SUCCESS)
    return rc;
  cogpu_request_t req = {
      .gpu = *device < 0 ? COGPU_GPU_AUTO : *device,
      .bytes = bytes,
      .priority = COGPU_PRIORITY_DEFAULT,
      .timeout_ms = !block             ? COGPU_NOWAIT
                    : sg_timeout_s > 0 ? (int64_t)sg_timeout_s * 1000
                                       : COGPU_WAIT_FOREVER,
  };
  int gpu = -1;
  rc = cogpu_reserve(h, &req, &gpu);
  if (rc == 0)
    *device = gpu;
  return sg_code(rc);
}

int postCudaFree(int device, size_t bytes) {
  int rc;
  cogpu_t *h = sg_get(&rc);
  if (rc != SG_SUCCESS)
    return rc;
  if (bytes == 0) {
    cogpu__seterr(-EINVAL, "postCudaFree: 0 bytes");
    return SG_INVALID_VALUE;
  }
  return sg_code(cogpu_release(h, device, bytes));
}
