/*
 * hooks-ctx.c: contexts and what a program is told about memory.
 * A context costs device memory (context_bytes, counted once per primary
 * context and per created context); in reserve mode the first context on a
 * device is where the job waits for its reservation. cuMemGetInfo reports
 * the job's share, so frameworks size their caches to it.
 */
#include <stdatomic.h>

#include "preload/preload-int.h"

static CUresult not_loaded(void) {
  return CUDA_ERROR_NOT_INITIALIZED;
}

static uint64_t ctx_bytes(CUdevice dev) {
  return cogpu__pl_context_bytes(dev);
}

/* Prepare the device, charge a context, create it; undo on failure. */
static CUresult ctx_create(CUdevice dev, CUcontext *pctx,
                           CUresult (*call)(void *), void *args) {
  uint64_t bytes = ctx_bytes(dev);
  CUresult rc = cogpu__pl_context_prepare(dev);
  if (rc == CUDA_SUCCESS)
    rc = cogpu__pl_charge(dev, bytes);
  if (rc != CUDA_SUCCESS)
    return rc;
  pl_retry_t retry = {.charged = bytes};
  do
    rc = call(args);
  while (cogpu__pl_retry(dev, rc, &retry));
  if (rc == CUDA_SUCCESS && pctx) {
    bytes = cogpu__pl_context_settle(dev, bytes);
    cogpu__pl_context_known(*pctx);
    cogpu__pl_track(PL_KIND_CTX, (uintptr_t)*pctx, dev, bytes);
  } else
    cogpu__pl_uncharge(dev, bytes);
  return rc;
}

typedef struct ctx_args_s {
  void *fn;
  CUcontext *pctx;
  void *params;
  int nparams;
  unsigned int flags;
  CUdevice dev;
} ctx_args_t;

static CUresult call_v2(void *a) {
  ctx_args_t *x = a;
  return ((cuCtxCreate_v2_ft *)x->fn)(x->pctx, x->flags, x->dev);
}
static CUresult call_v3(void *a) {
  ctx_args_t *x = a;
  return ((cuCtxCreate_v3_ft *)x->fn)(x->pctx, x->params, x->nparams, x->flags,
                                      x->dev);
}
static CUresult call_v4(void *a) {
  ctx_args_t *x = a;
  return ((cuCtxCreate_v4_ft *)x->fn)(x->pctx, x->params, x->flags, x->dev);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  ctx_args_t a = {(void *)REAL(cuCtxCreate_v2), pctx, NULL, 0, flags, dev};
  return a.fn ? ctx_create(dev, pctx, call_v2, &a) : not_loaded();
}

CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int n,
                        unsigned int flags, CUdevice dev) {
  ctx_args_t a = {(void *)REAL(cuCtxCreate_v3), pctx, params, n, flags, dev};
  return a.fn ? ctx_create(dev, pctx, call_v3, &a) : not_loaded();
}

CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags,
                        CUdevice dev) {
  ctx_args_t a = {(void *)REAL(cuCtxCreate_v4), pctx, params, 0, flags, dev};
  return a.fn ? ctx_create(dev, pctx, call_v4, &a) : not_loaded();
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  cuCtxDestroy_v2_ft *real = REAL(cuCtxDestroy_v2);
  if (!real)
    return not_loaded();
  pl_taken_t t = cogpu__pl_take(PL_KIND_CTX, (uintptr_t)ctx);
  CUresult rc = cogpu__pl_settle(&t, real(ctx));
  /* What the context held went with it. */
  if (rc == CUDA_SUCCESS)
    cogpu__pl_context_gone(ctx);
  return rc;
}

/* Primary contexts are reference counted by the driver: the memory is
 * charged at the first retain and credited at the last release. No lock is
 * held around the driver or a wait for memory: two first retains racing
 * both charge, and the one that was not first gives it back. */
static _Atomic(CUcontext) primary_ctx[64];
/* What the primary context on each device was charged (its last release
 * gives back exactly that). */
static _Atomic uint64_t primary_bytes[64];
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  cuDevicePrimaryCtxRetain_ft *real = REAL(cuDevicePrimaryCtxRetain);
  if (!real)
    return not_loaded();
  _Atomic uint32_t *refs = cogpu__pl_primary_refs(dev);
  if (!refs)
    return real(pctx, dev);
  bool charged = false;
  uint64_t bytes = ctx_bytes(dev);
  if (atomic_load(refs) == 0) {
    CUresult rc = cogpu__pl_context_prepare(dev);
    if (rc == CUDA_SUCCESS)
      rc = cogpu__pl_charge(dev, bytes);
    if (rc != CUDA_SUCCESS)
      return rc;
    charged = true;
  }
  CUresult rc;
  pl_retry_t retry = {.charged = bytes};
  do
    rc = real(pctx, dev);
  while (charged && cogpu__pl_retry(dev, rc, &retry));
  if (rc == CUDA_SUCCESS && pctx && dev < 64) {
    cogpu__pl_context_known(*pctx);
    atomic_store(&primary_ctx[dev], *pctx);
  }
  bool first = rc == CUDA_SUCCESS && atomic_fetch_add(refs, 1) == 0;
  if (charged && !first)
    cogpu__pl_uncharge(dev, bytes);
  else if (first && !charged)
    cogpu__pl_adjust(dev, (int64_t)bytes);
  if (first && dev < 64)
    atomic_store(&primary_bytes[dev], cogpu__pl_context_settle(dev, bytes));
  return rc;
}

static uint64_t primary_charge(CUdevice dev) {
  uint64_t b = dev >= 0 && dev < 64 ? atomic_load(&primary_bytes[dev]) : 0;
  return b ? b : ctx_bytes(dev);
}

static CUresult primary_release(cuDevicePrimaryCtxRelease_ft *real,
                                CUdevice dev) {
  if (!real)
    return not_loaded();
  CUresult rc = real(dev);
  _Atomic uint32_t *refs = cogpu__pl_primary_refs(dev);
  if (rc == CUDA_SUCCESS && refs) {
    uint32_t n = atomic_load(refs);
    while (n > 0 && !atomic_compare_exchange_weak(refs, &n, n - 1)) {
    }
    if (n == 1) {
      cogpu__pl_uncharge(dev, primary_charge(dev));
      if (dev < 64)
        cogpu__pl_context_gone(atomic_load(&primary_ctx[dev]));
    }
  }
  return rc;
}

/* A reset frees the primary context and everything in it, however often it
 * was retained (later releases are then no-ops for the driver, and here). */
static CUresult primary_reset(cuDevicePrimaryCtxReset_ft *real, CUdevice dev) {
  if (!real)
    return not_loaded();
  CUresult rc = real(dev);
  _Atomic uint32_t *refs = cogpu__pl_primary_refs(dev);
  if (rc == CUDA_SUCCESS && refs) {
    if (atomic_exchange(refs, 0) > 0)
      cogpu__pl_uncharge(dev, primary_charge(dev));
    if (dev < 64)
      cogpu__pl_context_gone(atomic_load(&primary_ctx[dev]));
  }
  return rc;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return primary_reset(REAL(cuDevicePrimaryCtxReset), dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return primary_reset(REAL(cuDevicePrimaryCtxReset_v2), dev);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return primary_release(REAL(cuDevicePrimaryCtxRelease), dev);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return primary_release(REAL(cuDevicePrimaryCtxRelease_v2), dev);
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
  cuMemGetInfo_v2_ft *real = REAL(cuMemGetInfo_v2);
  if (!real)
    return not_loaded();
  size_t rf = 0, rt = 0;
  /* NULL arguments are the driver's to judge. */
  CUresult rc = real(free_b ? &rf : NULL, total_b ? &rt : NULL);
  if (rc != CUDA_SUCCESS)
    return rc;
  uint64_t f = rf, t = rt;
  cogpu__pl_meminfo(cogpu__pl_current_device(), &f, &t, rf);
  if (free_b)
    *free_b = f;
  if (total_b)
    *total_b = t;
  return rc;
}

CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b) {
  cuMemGetInfo_ft *real = REAL(cuMemGetInfo);
  if (!real)
    return not_loaded();
  unsigned int rf = 0, rt = 0;
  CUresult rc = real(free_b ? &rf : NULL, total_b ? &rt : NULL);
  if (rc != CUDA_SUCCESS)
    return rc;
  uint64_t f = rf, t = rt;
  cogpu__pl_meminfo(cogpu__pl_current_device(), &f, &t, rf);
  if (free_b)
    *free_b = f > UINT32_MAX ? UINT32_MAX : (unsigned int)f;
  if (total_b)
    *total_b = t > UINT32_MAX ? UINT32_MAX : (unsigned int)t;
  return rc;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  cuDeviceTotalMem_v2_ft *real = REAL(cuDeviceTotalMem_v2);
  if (!real)
    return not_loaded();
  CUresult rc = real(bytes, dev);
  uint64_t share;
  if (rc == CUDA_SUCCESS && bytes && cogpu__pl_report_total(dev, &share) &&
      share && share < *bytes)
    *bytes = share;
  return rc;
}
