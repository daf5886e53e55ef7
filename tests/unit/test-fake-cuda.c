/*
 * test-fake-cuda.c: the fake libcuda.so.1 of tests/fakes/cuda, reached the
 * way the preload library reaches the real driver: dlopen and dlsym, never
 * linked. Devices and UUIDs (against the fake NVML), CUDA_VISIBLE_DEVICES,
 * memory that round-trips data, out-of-memory, the cost of contexts, usage
 * shared between processes and reclaimed from killed ones, pools, VMM and
 * arrays, cuGetProcAddress's resolution, fault injection, and the fake
 * NVML listing fake-CUDA processes.
 *
 * Each test runs in a fresh process that has not loaded the fake yet; a
 * child forked after dlopen keeps the library but starts with no CUDA
 * state (it calls cuInit and makes a context of its own).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../fakes/cuda/fake-cuda.h"
#include "nvml/nvml.h"
#include "task.h"

#define KIB (1024ull)
#define MIB (1024ull * 1024)
#define GIB (1024ull * 1024 * 1024)

static void *lib;

static void *sym(const char *name) {
  void *p = dlsym(lib, name);
  if (!p)
    th_fail(__FILE__, __LINE__, "libcuda.so.1 lacks %s", name);
  return p;
}

/* An entry point of the fake, typed as fake-cuda.h declares it. */
#define F(name) ((__typeof__(&name))sym(#name))
#define CU_OK(call) ASSERT_EQ(call, CUDA_SUCCESS)

/* Loads the fake with its state in the test's directory. */
static void fc_open(const char *gpus, const char *ctx_bytes) {
  setenv("FAKE_CUDA_STATE", th_path("fake-cuda"), 1);
  th_setenv("FAKE_NVML_GPUS", gpus);
  setenv("FAKE_CUDA_CTX_BYTES", ctx_bytes, 1);
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    th_fail(__FILE__, __LINE__, "dlopen libcuda.so.1: %s", dlerror());
  ASSERT(dlsym(lib, "fake_cuda_stats")); /* the fake, not a real driver */
}

static CUcontext fc_init_ctx(CUdevice dev) {
  CUcontext ctx;
  CU_OK(F(cuInit)(0));
  CU_OK(F(cuCtxCreate_v2)(&ctx, 0, dev));
  return ctx;
}

static uint64_t used(int nvml) {
  unsigned long long u;
  ASSERT_EQ(F(fake_cuda_stats)(nvml, &u, NULL, NULL), 0);
  return u;
}

static uint64_t ooms(int nvml) {
  unsigned long long n;
  ASSERT_EQ(F(fake_cuda_stats)(nvml, NULL, NULL, &n), 0);
  return n;
}

static uint64_t peak(int nvml) {
  unsigned long long p;
  ASSERT_EQ(F(fake_cuda_stats)(nvml, NULL, &p, NULL), 0);
  return p;
}

/* Runs fn(arg) in a forked child; its exit code (0: every check held). */
static int in_child(void (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    fn(arg);
    fflush(NULL);
    _exit(0);
  }
  return th_exit_code(th_wait(pid, th_ms(20000)));
}

static void put_byte(int fd, char c) {
  ASSERT_EQ(write(fd, &c, 1), 1);
}

static char get_byte(int fd) {
  char c = 0;
  ASSERT_EQ(read(fd, &c, 1), 1);
  return c;
}

static void uuid_string(const CUuuid *u, char *buf, size_t len) {
  const unsigned char *b = (const unsigned char *)u->bytes;
  snprintf(buf, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
           b[11], b[12], b[13], b[14], b[15]);
}

/* The NVML index of a device (the fake's PCI bus id). */
static int nvml_of(CUdevice dev) {
  int bus = -1;
  CU_OK(F(cuDeviceGetAttribute)(&bus, 33, dev)); /* PCI_BUS_ID */
  return bus;
}

/* --- Devices -------------------------------------------------------------- */

TEST_IMPL(fakecuda_devices) {
  int n = -1, v = 0;
  const char *s;
  fc_open("16G,8G", "300M");
  /* Before cuInit, only a few calls work. */
  ASSERT_EQ(F(cuDeviceGetCount)(&n), CUDA_ERROR_NOT_INITIALIZED);
  CU_OK(F(cuDriverGetVersion)(&v));
  ASSERT_EQ(v, 13000);
  CU_OK(F(cuGetErrorName)(CUDA_ERROR_OUT_OF_MEMORY, &s));
  ASSERT_STREQ(s, "CUDA_ERROR_OUT_OF_MEMORY");
  CU_OK(F(cuGetErrorString)(CUDA_ERROR_OUT_OF_MEMORY, &s));
  ASSERT_STREQ(s, "out of memory");
  CU_OK(F(cuGetErrorString)(CUDA_ERROR_INVALID_CONTEXT, &s));
  ASSERT_STREQ(s, "invalid device context");
  ASSERT_EQ(F(cuGetErrorName)(12345, &s), CUDA_ERROR_INVALID_VALUE);
  ASSERT(s == NULL);

  ASSERT_EQ(F(cuInit)(1), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuInit)(0));
  CU_OK(F(cuInit)(0));
  CU_OK(F(cuDeviceGetCount)(&n));
  ASSERT_EQ(n, 2);

  /* The same GPUs as the fake NVML describes. */
  cogpu__gpu_desc_t g[COGPU_NVML_MAX_GPUS];
  size_t ng = 0;
  ASSERT_OK(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &ng));
  ASSERT_EQ(ng, 2);
  for (int i = 0; i < 2; i++) {
    CUdevice dev = -1;
    char name[64], text[64];
    size_t total = 0;
    CUuuid u;
    CU_OK(F(cuDeviceGet)(&dev, i));
    ASSERT_EQ(dev, i);
    CU_OK(F(cuDeviceGetName)(name, sizeof name, dev));
    ASSERT_STREQ(name, g[i].name);
    CU_OK(F(cuDeviceTotalMem_v2)(&total, dev));
    ASSERT_UEQ(total, g[i].total);
    CU_OK(F(cuDeviceGetUuid_v2)(&u, dev));
    uuid_string(&u, text, sizeof text);
    ASSERT_STREQ(text, g[i].uuid);
    memset(&u, 0, sizeof u);
    CU_OK(F(cuDeviceGetUuid)(&u, dev));
    uuid_string(&u, text, sizeof text);
    ASSERT_STREQ(text, g[i].uuid);
    ASSERT_EQ(nvml_of(dev), i);
  }
  char name[64];
  CU_OK(F(cuDeviceGetName)(name, 6, 0)); /* truncated, as the driver does */
  ASSERT_STREQ(name, "Fake ");
  unsigned total32 = 0;
  CU_OK(F(cuDeviceTotalMem)(&total32, 1)); /* legacy: saturates */
  ASSERT_EQ(total32, 0xffffffffu);
  CUdevice dev;
  ASSERT_EQ(F(cuDeviceGet)(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  int cc = 0, attr = -1;
  CU_OK(F(cuDeviceGetAttribute)(&cc, 75, 0)); /* COMPUTE_CAPABILITY_MAJOR */
  ASSERT_EQ(cc, 9);
  CU_OK(F(cuDeviceGetAttribute)(&attr, 9999, 0));
  ASSERT_EQ(attr, 0);
  ASSERT_EQ(F(cuDeviceGetAttribute)(&attr, 33, 2), CUDA_ERROR_INVALID_DEVICE);

  /* The state file is where FAKE_CUDA_STATE says. */
  struct stat sb;
  ASSERT_EQ(stat(th_path("fake-cuda"), &sb), 0);
}

typedef struct {
  const char *gpus, *visible; /* visible NULL: unset */
  CUresult init;
  int n, nvml[4];
} visible_case_t;

static void visible_child(void *arg) {
  const visible_case_t *c = arg;
  int n = -1;
  th_setenv("FAKE_NVML_GPUS", c->gpus);
  if (c->visible)
    setenv("CUDA_VISIBLE_DEVICES", c->visible, 1);
  else
    unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_EQ(F(cuInit)(0), c->init);
  if (c->init != CUDA_SUCCESS) {
    ASSERT_EQ(F(cuDeviceGetCount)(&n), CUDA_ERROR_NOT_INITIALIZED);
    ASSERT_EQ(F(cuInit)(0), c->init); /* settled once per process */
    return;
  }
  CU_OK(F(cuDeviceGetCount)(&n));
  ASSERT_EQ(n, c->n);
  for (int i = 0; i < n; i++) {
    CUuuid u;
    char text[64], want[64];
    ASSERT_EQ(nvml_of(i), c->nvml[i]);
    CU_OK(F(cuDeviceGetUuid_v2)(&u, i));
    uuid_string(&u, text, sizeof text);
    snprintf(want, sizeof want, "GPU-fa4e0000-0000-4000-8000-%012x",
             c->nvml[i]);
    ASSERT_STREQ(text, want);
  }
}

TEST_IMPL(fakecuda_visible_devices) {
  const char *three = "16G,8G,4G";
  char seventeen[128] = "1G";
  for (int i = 1; i < 17; i++)
    strcat(seventeen, ",1G");
  const visible_case_t cases[] = {
      {three, NULL, CUDA_SUCCESS, 3, {0, 1, 2}},
      {three, "2,0", CUDA_SUCCESS, 2, {2, 0}},
      {three, "1,7,0", CUDA_SUCCESS, 1, {1}}, /* stops at an invalid one */
      {three, "0,0,1", CUDA_SUCCESS, 1, {0}}, /* ... or a repeated one */
      {three, "1,-1,0", CUDA_SUCCESS, 1, {1}},
      {three,
       "GPU-fa4e0000-0000-4000-8000-000000000002,1",
       CUDA_SUCCESS,
       2,
       {2, 1}},
      {three, "GPU-fa4e", CUDA_ERROR_NO_DEVICE, 0, {0}}, /* ambiguous */
      {"16G", "GPU-fa4e", CUDA_SUCCESS, 1, {0}},         /* unique prefix */
      {seventeen,
       "GPU-fa4e0000-0000-4000-8000-00000000001,3",
       CUDA_SUCCESS,
       2,
       {16, 3}},
      {three, "", CUDA_ERROR_NO_DEVICE, 0, {0}},
      {three, "-1", CUDA_ERROR_NO_DEVICE, 0, {0}},
      {three, "GPU-ffff", CUDA_ERROR_NO_DEVICE, 0, {0}},
  };
  fc_open(three, "300M");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int code = in_child(visible_child, (void *)&cases[i]);
    if (code != 0)
      th_fail(__FILE__, __LINE__, "CUDA_VISIBLE_DEVICES=%s: child failed",
              cases[i].visible ? cases[i].visible : "(unset)");
  }
}

/* --- Memory --------------------------------------------------------------- */

TEST_IMPL(fakecuda_alloc_copy) {
  CUdeviceptr d, d2, p;
  fc_open("16G", "64M");
  CU_OK(F(cuInit)(0));
  /* No context yet. */
  ASSERT_EQ(F(cuMemAlloc_v2)(&d, MIB), CUDA_ERROR_INVALID_CONTEXT);
  CUcontext ctx;
  CU_OK(F(cuCtxCreate_v2)(&ctx, 0, 0));
  ASSERT_UEQ(used(0), 64 * MIB);

  size_t n = MIB + 3;
  CU_OK(F(cuMemAlloc_v2)(&d, n));
  ASSERT_UEQ(used(0), 64 * MIB + n);
  unsigned char *buf = malloc(n), *back = malloc(n);
  ASSERT(buf && back);
  for (size_t i = 0; i < n; i++)
    buf[i] = (unsigned char)(i * 7);
  CU_OK(F(cuMemcpyHtoD_v2)(d, buf, n));
  CU_OK(F(cuMemsetD8_v2)(d + 10, 0xab, 5));
  memset(buf + 10, 0xab, 5);
  CU_OK(F(cuMemAlloc_v2)(&d2, n));
  CU_OK(F(cuMemcpyDtoD_v2)(d2, d, n));
  CU_OK(F(cuMemcpyDtoH_v2)(back, d2, n));
  ASSERT(memcmp(buf, back, n) == 0);
  CU_OK(F(cuMemsetD32_v2)(d2 + 4, 0xdeadbeef, 2));
  CU_OK(F(cuMemcpyDtoH_v2_ptds)(back, d2, 16));
  uint32_t w[4];
  memcpy(w, back, sizeof w);
  ASSERT_EQ(w[1], 0xdeadbeef);
  ASSERT_EQ(w[2], 0xdeadbeef);
  ASSERT(memcmp(back, buf, 4) == 0 && memcmp(back + 12, buf + 12, 4) == 0);
  /* Out of bounds, unaligned, unknown. */
  ASSERT_EQ(F(cuMemcpyHtoD_v2)(d, buf, n + 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuMemcpyDtoH_v2)(back, d + n, 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuMemsetD32_v2)(d + 1, 0, 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuMemsetD8_v2)(0x1000, 0, 1), CUDA_ERROR_INVALID_VALUE);

  /* Pitch: width rounded up to 512. */
  size_t pitch = 0;
  uint64_t before = used(0);
  CU_OK(F(cuMemAllocPitch_v2)(&p, &pitch, 1000, 3, 4));
  ASSERT_UEQ(pitch, 1024);
  ASSERT_UEQ(used(0), before + 3 * 1024);
  ASSERT_EQ(F(cuMemAllocPitch_v2)(&p, &pitch, 1000, 3, 3),
            CUDA_ERROR_INVALID_VALUE);
  /* Managed memory counts; page-locked host memory does not. */
  CUdeviceptr m;
  CU_OK(F(cuMemAllocManaged)(&m, 4096, 1));
  ASSERT_UEQ(used(0), before + 3 * 1024 + 4096);
  void *h = NULL;
  CU_OK(F(cuMemAllocHost_v2)(&h, MIB));
  memset(h, 1, MIB);
  CU_OK(F(cuMemcpyHtoD_v2)(m, h, 4096));
  ASSERT_UEQ(used(0), before + 3 * 1024 + 4096);
  CU_OK(F(cuMemFreeHost)(h));
  ASSERT_EQ(F(cuMemFreeHost)(h), CUDA_ERROR_INVALID_VALUE);
  /* The legacy API: 32-bit pointer and size. */
  fake_CUdeviceptr_v1 d1 = 0;
  CU_OK(F(cuMemAlloc)(&d1, 4096));
  ASSERT(d1 != 0);
  CU_OK(F(cuMemsetD8_v2)(d1, 7, 4096));
  ASSERT_UEQ(used(0), before + 3 * 1024 + 2 * 4096);
  CU_OK(F(cuMemFree)(d1));
  /* Free memory is what the whole GPU has left. */
  size_t fr = 0, tot = 0;
  CU_OK(F(cuMemGetInfo_v2)(&fr, &tot));
  ASSERT_UEQ(tot, 16 * GIB);
  ASSERT_UEQ(fr, 16 * GIB - used(0));
  unsigned fr32 = 0, tot32 = 0;
  CU_OK(F(cuMemGetInfo)(&fr32, &tot32));
  ASSERT_EQ(tot32, 0xffffffffu);
  /* A big allocation costs nothing until touched. */
  CUdeviceptr big;
  CU_OK(F(cuMemAlloc_v2)(&big, 12 * GIB));
  CU_OK(F(cuMemsetD8_v2)(big + 6 * GIB, 1, 4096));
  CU_OK(F(cuMemFree_v2)(big));

  CU_OK(F(cuMemFree_v2)(d));
  CU_OK(F(cuMemFree_v2)(d2));
  CU_OK(F(cuMemFree_v2)(p));
  CU_OK(F(cuMemFree_v2)(m));
  ASSERT_EQ(F(cuMemFree_v2)(d), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuMemFree_v2)(0x1234), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuMemAlloc_v2)(&d, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_UEQ(used(0), 64 * MIB);
  /* What a context holds goes with it. */
  CU_OK(F(cuMemAlloc_v2)(&d, 5 * MIB));
  CU_OK(F(cuCtxDestroy_v2)(ctx));
  ASSERT_UEQ(used(0), 0);
  ASSERT_EQ(F(cuMemAlloc_v2)(&d, MIB), CUDA_ERROR_INVALID_CONTEXT);
  free(buf);
  free(back);
}

TEST_IMPL(fakecuda_out_of_memory) {
  CUdeviceptr a, b;
  CUcontext c2, pc;
  fc_open("1G", "100M");
  fc_init_ctx(0);
  ASSERT_UEQ(ooms(0), 0);
  ASSERT_EQ(F(cuMemAlloc_v2)(&a, 2 * GIB), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_UEQ(ooms(0), 1);
  ASSERT_UEQ(used(0), 100 * MIB);
  CU_OK(F(cuMemAlloc_v2)(&a, 924 * MIB)); /* exactly full */
  ASSERT_UEQ(used(0), GIB);
  ASSERT_EQ(F(cuMemAlloc_v2)(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(F(cuMemAllocAsync)(&b, 1, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  /* Contexts do not fit either. */
  ASSERT_EQ(F(cuCtxCreate_v2)(&c2, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(F(cuDevicePrimaryCtxRetain)(&pc, 0), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_UEQ(ooms(0), 5);
  ASSERT_UEQ(peak(0), GIB);
  CU_OK(F(cuMemFree_v2)(a));
  ASSERT_UEQ(used(0), 100 * MIB);
  ASSERT_UEQ(peak(0), GIB);
  F(fake_cuda_reset_peak)();
  ASSERT_UEQ(peak(0), 100 * MIB);
  CU_OK(F(cuMemAlloc_v2)(&a, 10 * MIB));
  ASSERT_UEQ(peak(0), 110 * MIB);
  ASSERT_UEQ(ooms(0), 5);
}

/* --- Contexts ------------------------------------------------------------- */

static void *no_context_thread(void *arg) {
  CUcontext ctx = arg, cur = (CUcontext)1;
  CUdeviceptr d;
  /* The current context is per thread. */
  CU_OK(F(cuCtxGetCurrent)(&cur));
  ASSERT(cur == NULL);
  ASSERT_EQ(F(cuMemAlloc_v2)(&d, MIB), CUDA_ERROR_INVALID_CONTEXT);
  CU_OK(F(cuCtxSetCurrent)(ctx));
  CU_OK(F(cuMemAlloc_v2)(&d, MIB));
  CU_OK(F(cuMemFree_v2)(d));
  return NULL;
}

TEST_IMPL(fakecuda_contexts) {
  CUcontext a, b, c, v1, cur, p, p2;
  CUdevice dev = -1;
  CUdeviceptr d;
  fc_open("16G,8G", "64M");
  CU_OK(F(cuInit)(0));
  CU_OK(F(cuCtxGetCurrent)(&cur));
  ASSERT(cur == NULL);
  ASSERT_EQ(F(cuCtxGetDevice)(&dev), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(F(cuCtxSynchronize)(), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(F(cuCtxCreate_v2)(&a, 0, 2), CUDA_ERROR_INVALID_DEVICE);

  /* Each context costs FAKE_CUDA_CTX_BYTES on its device. */
  CU_OK(F(cuCtxCreate_v2)(&a, 0, 1));
  ASSERT_UEQ(used(1), 64 * MIB);
  ASSERT_UEQ(used(0), 0);
  CU_OK(F(cuCtxGetDevice)(&dev));
  ASSERT_EQ(dev, 1);
  CU_OK(F(cuCtxCreate_v3)(&b, NULL, 0, 0, 0));
  ASSERT_UEQ(used(0), 64 * MIB);
  CU_OK(F(cuCtxGetCurrent)(&cur));
  ASSERT(cur == b);
  CU_OK(F(cuCtxPopCurrent_v2)(&cur));
  ASSERT(cur == b);
  CU_OK(F(cuCtxGetDevice)(&dev));
  ASSERT_EQ(dev, 1);
  CU_OK(F(cuCtxPushCurrent_v2)(b));
  CU_OK(F(cuCtxGetDevice_v2)(&dev, a));
  ASSERT_EQ(dev, 1);
  CU_OK(F(cuCtxCreate_v4)(&c, NULL, 0, 0));
  CU_OK(F(cuCtxCreate)(&v1, 0, 0));
  ASSERT_UEQ(used(0), 3 * 64 * MIB);
  CU_OK(F(cuCtxPopCurrent)(&cur));
  ASSERT(cur == v1);
  CU_OK(F(cuCtxDestroy)(v1));
  /* c is current: its allocation and cost go when it is destroyed. */
  CU_OK(F(cuMemAlloc_v2)(&d, 10 * MIB));
  ASSERT_UEQ(used(0), 2 * 64 * MIB + 10 * MIB);
  CU_OK(F(cuCtxSynchronize)());
  CU_OK(F(cuCtxDestroy_v2)(c));
  ASSERT_UEQ(used(0), 64 * MIB);
  ASSERT_EQ(F(cuCtxDestroy_v2)(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_OK(F(cuCtxGetCurrent)(&cur)); /* c was popped */
  ASSERT(cur == b);

  /* The primary context is charged once, while retained. */
  CU_OK(F(cuDevicePrimaryCtxRetain)(&p, 0));
  ASSERT_UEQ(used(0), 2 * 64 * MIB);
  CU_OK(F(cuDevicePrimaryCtxRetain)(&p2, 0));
  ASSERT(p == p2);
  ASSERT_UEQ(used(0), 2 * 64 * MIB);
  ASSERT_EQ(F(cuCtxDestroy_v2)(p), CUDA_ERROR_INVALID_CONTEXT);
  CU_OK(F(cuCtxSetCurrent)(p));
  CU_OK(F(cuMemAlloc_v2)(&d, 10 * MIB));
  CU_OK(F(cuDevicePrimaryCtxRelease_v2)(0));
  ASSERT_UEQ(used(0), 2 * 64 * MIB + 10 * MIB);
  CU_OK(F(cuDevicePrimaryCtxRelease)(0));
  ASSERT_UEQ(used(0), 64 * MIB);
  /* Released: no longer usable. */
  ASSERT_EQ(F(cuMemAlloc_v2)(&d, MIB), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(F(cuCtxSetCurrent)(p), CUDA_ERROR_INVALID_CONTEXT);
  /* Reset ends it at once; a release after it is harmless. */
  CU_OK(F(cuDevicePrimaryCtxRetain)(&p, 1));
  ASSERT_UEQ(used(1), 2 * 64 * MIB);
  CU_OK(F(cuDevicePrimaryCtxReset_v2)(1));
  ASSERT_UEQ(used(1), 64 * MIB);
  CU_OK(F(cuDevicePrimaryCtxRelease_v2)(1));
  ASSERT_UEQ(used(1), 64 * MIB);

  pthread_t t;
  CU_OK(F(cuCtxSetCurrent)(NULL)); /* pops p */
  CU_OK(F(cuCtxGetCurrent)(&cur));
  ASSERT(cur == a);
  ASSERT_EQ(pthread_create(&t, NULL, no_context_thread, a), 0);
  ASSERT_EQ(pthread_join(t, NULL), 0);
  CU_OK(F(cuCtxDestroy_v2)(a)); /* also off this thread's stack */
  CU_OK(F(cuCtxDestroy_v2)(b));
  ASSERT_UEQ(used(0), 0);
  ASSERT_UEQ(used(1), 0);
  ASSERT_EQ(F(cuCtxPopCurrent_v2)(&cur), CUDA_ERROR_INVALID_CONTEXT);
}

/* --- Processes ------------------------------------------------------------ */

typedef struct {
  int to_parent, from_parent;
  CUdeviceptr parent_ptr;
  uint64_t bytes;
  CUdevice dev;
} peer_t;

/* Allocates p->bytes, says 'a', waits; frees, says 'f', waits; exits
 * without destroying its context. */
static void peer_child(void *arg) {
  peer_t *p = arg;
  CUdeviceptr d;
  /* A forked child starts with no CUDA state. */
  ASSERT_EQ(F(cuMemAlloc_v2)(&d, MIB), CUDA_ERROR_NOT_INITIALIZED);
  fc_init_ctx(p->dev);
  ASSERT_EQ(F(cuMemFree_v2)(p->parent_ptr), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuMemAlloc_v2)(&d, p->bytes));
  CU_OK(F(cuMemsetD8_v2)(d, 1, 4096));
  put_byte(p->to_parent, 'a');
  ASSERT_EQ(get_byte(p->from_parent), 'g');
  CU_OK(F(cuMemFree_v2)(d));
  put_byte(p->to_parent, 'f');
  ASSERT_EQ(get_byte(p->from_parent), 'g');
}

/* Starts peer_child; returns its pid, with the pipes in *p. */
static pid_t start_peer(peer_t *p) {
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    p->to_parent = up[1];
    p->from_parent = down[0];
    peer_child(p);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  p->to_parent = up[0]; /* the parent's ends */
  p->from_parent = down[1];
  return pid;
}

TEST_IMPL(fakecuda_two_processes) {
  CUdeviceptr d;
  fc_open("16G", "100M");
  fc_init_ctx(0);
  CU_OK(F(cuMemAlloc_v2)(&d, GIB));
  peer_t p = {.parent_ptr = d, .bytes = 2 * GIB, .dev = 0};
  pid_t pid = start_peer(&p);
  ASSERT_EQ(get_byte(p.to_parent), 'a');
  ASSERT_UEQ(used(0), 3 * GIB + 200 * MIB);
  size_t fr, tot;
  CU_OK(F(cuMemGetInfo_v2)(&fr, &tot));
  ASSERT_UEQ(fr, 16 * GIB - 3 * GIB - 200 * MIB);
  put_byte(p.from_parent, 'g');
  ASSERT_EQ(get_byte(p.to_parent), 'f');
  ASSERT_UEQ(used(0), GIB + 200 * MIB);
  put_byte(p.from_parent, 'g');
  ASSERT_EQ(th_exit_code(th_wait(pid, th_ms(10000))), 0);
  /* It exited holding its context: that comes back once it is seen dead. */
  ASSERT_UEQ(used(0), GIB + 100 * MIB);
  CU_OK(F(cuMemFree_v2)(d)); /* the parent's memory is intact */
  ASSERT_UEQ(used(0), 100 * MIB);
}

/* Allocates `bytes` on device 0, says 'r', and waits to be killed. */
static void holder_child(void *arg) {
  peer_t *p = arg;
  CUdeviceptr d;
  fc_init_ctx(0);
  CU_OK(F(cuMemAlloc_v2)(&d, p->bytes));
  put_byte(p->to_parent, 'r');
  for (;;)
    pause();
}

static pid_t start_holder(uint64_t bytes) {
  int up[2];
  ASSERT_EQ(pipe(up), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    peer_t p = {.to_parent = up[1], .bytes = bytes};
    close(up[0]);
    holder_child(&p);
    _exit(0);
  }
  close(up[1]);
  ASSERT_EQ(get_byte(up[0]), 'r');
  close(up[0]);
  return pid;
}

TEST_IMPL(fakecuda_killed_process_reclaimed) {
  CUdeviceptr d;
  fc_open("16G", "100M");
  fc_init_ctx(0);
  pid_t pid = start_holder(4 * GIB);
  ASSERT_UEQ(used(0), 4 * GIB + 200 * MIB);
  kill(pid, SIGKILL);
  th_wait(pid, th_ms(10000));
  ASSERT_UEQ(used(0), 100 * MIB); /* noticed dead: given back */

  /* An allocation that does not fit looks for dead processes first. */
  pid = start_holder(15 * GIB);
  ASSERT_EQ(F(cuMemAlloc_v2)(&d, 2 * GIB), CUDA_ERROR_OUT_OF_MEMORY);
  kill(pid, SIGKILL);
  th_wait(pid, th_ms(10000));
  CU_OK(F(cuMemAlloc_v2)(&d, 2 * GIB));
  ASSERT_UEQ(ooms(0), 1);

  /* A zombie (dead, not yet waited for) holds nothing either. */
  pid = start_holder(GIB);
  ASSERT_UEQ(used(0), 2 * GIB + GIB + 200 * MIB);
  kill(pid, SIGKILL);
  int waited = 0;
  while (used(0) != 2 * GIB + 100 * MIB && waited < th_ms(5000)) {
    th_sleep_ms(5);
    waited += 5;
  }
  ASSERT_UEQ(used(0), 2 * GIB + 100 * MIB);
  th_wait(pid, th_ms(10000));
}

/* --- Pools ---------------------------------------------------------------- */

static uint64_t pool_attr(CUmemoryPool pool, int attr) {
  cuuint64_t v = ~0ull;
  CU_OK(F(cuMemPoolGetAttribute)(pool, attr, &v));
  return v;
}

TEST_IMPL(fakecuda_pools) {
  CUmemoryPool pool, cur;
  CUdeviceptr a, b, c, x, plain;
  CUstream s;
  fc_open("16G", "64M");
  fc_init_ctx(0);
  uint64_t base = used(0);
  CU_OK(F(cuDeviceGetDefaultMemPool)(&pool, 0));
  CU_OK(F(cuDeviceGetMemPool)(&cur, 0));
  ASSERT(pool == cur);
  CU_OK(F(cuStreamCreate)(&s, 0));

  /* Reserved in 2 MiB granules, charged to the device. */
  CU_OK(F(cuMemAllocAsync)(&a, MIB, NULL));
  ASSERT_UEQ(used(0), base + 2 * MIB);
  ASSERT_UEQ(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 2 * MIB);
  ASSERT_UEQ(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), MIB);
  CU_OK(F(cuMemAllocAsync_ptsz)(&b, 512 * KIB, s));
  ASSERT_UEQ(used(0), base + 2 * MIB);
  CU_OK(F(cuMemAllocAsync)(&c, 3 * MIB, s));
  ASSERT_UEQ(used(0), base + 6 * MIB);
  ASSERT_UEQ(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
             4 * MIB + 512 * KIB);
  char msg[] = "stream-ordered", back[sizeof msg];
  CU_OK(F(cuMemcpyHtoD_v2)(c, msg, sizeof msg));
  CU_OK(F(cuMemcpyDtoH_v2)(back, c, sizeof msg));
  ASSERT_STREQ(back, msg);

  /* Freed memory stays reserved, and is reused. */
  CU_OK(F(cuMemFreeAsync)(a, NULL));
  CU_OK(F(cuMemFreeAsync_ptsz)(b, s));
  CU_OK(F(cuMemFree_v2)(c)); /* cuMemFree takes them too */
  ASSERT_UEQ(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
  ASSERT_UEQ(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 6 * MIB);
  ASSERT_UEQ(used(0), base + 6 * MIB);
  CU_OK(F(cuMemAllocAsync)(&a, 5 * MIB, s));
  ASSERT_UEQ(used(0), base + 6 * MIB);
  ASSERT_EQ(F(cuMemFreeAsync)(a + 1, s), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuMemAlloc_v2)(&plain, MIB));
  ASSERT_EQ(F(cuMemFreeAsync)(plain, s), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuMemFree_v2)(plain));
  /* Trimming keeps what live allocations use. */
  CU_OK(F(cuMemPoolTrimTo)(pool, 0));
  ASSERT_UEQ(used(0), base + 6 * MIB);
  CU_OK(F(cuMemFreeAsync)(a, s));
  CU_OK(F(cuMemPoolTrimTo)(pool, 3 * MIB));
  ASSERT_UEQ(used(0), base + 4 * MIB);
  CU_OK(F(cuMemPoolTrimTo)(pool, 0));
  ASSERT_UEQ(used(0), base);
  ASSERT_UEQ(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  ASSERT_UEQ(pool_attr(pool, 6), 6 * MIB); /* RESERVED_MEM_HIGH */
  ASSERT_UEQ(pool_attr(pool, 8), 5 * MIB); /* USED_MEM_HIGH */
  ASSERT_EQ(F(cuMemPoolDestroy)(pool), CUDA_ERROR_INVALID_VALUE);

  /* A pool of one's own; destroyed, it goes with its last allocation. */
  fake_CUmemPoolProps props = {.allocType = 1,
                               .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
  CUmemoryPool mine;
  CU_OK(F(cuMemPoolCreate)(&mine, &props));
  CU_OK(F(cuMemAllocFromPoolAsync)(&x, 3 * MIB, mine, s));
  ASSERT_UEQ(used(0), base + 4 * MIB);
  CU_OK(F(cuDeviceSetMemPool)(0, mine));
  CU_OK(F(cuMemAllocAsync)(&a, MIB, s)); /* from the current pool */
  ASSERT_UEQ(used(0), base + 4 * MIB);
  ASSERT_UEQ(pool_attr(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4 * MIB);
  CU_OK(F(cuMemFreeAsync)(a, s));
  CU_OK(F(cuMemPoolDestroy)(mine));
  CU_OK(F(cuDeviceGetMemPool)(&cur, 0));
  ASSERT(cur == pool);
  ASSERT_UEQ(used(0), base + 4 * MIB);
  CU_OK(F(cuMemFreeAsync_ptsz)(x, s));
  ASSERT_UEQ(used(0), base);
  ASSERT_EQ(F(cuMemPoolTrimTo)(mine, 0), CUDA_ERROR_INVALID_VALUE);
  /* A pool with a size limit. */
  props.maxSize = 4 * MIB;
  CU_OK(F(cuMemPoolCreate)(&mine, &props));
  ASSERT_EQ(F(cuMemAllocFromPoolAsync_ptsz)(&x, 5 * MIB, mine, s),
            CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(F(cuMemPoolDestroy)(mine));
  /* Bigger than the GPU. */
  ASSERT_EQ(F(cuMemAllocAsync)(&x, 17 * GIB, s), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_UEQ(used(0), base);
  CU_OK(F(cuStreamDestroy_v2)(s));
}

/* --- Graphs -------------------------------------------------------------- */

static uint64_t graph_attr(CUdevice dev, int attr) {
  cuuint64_t v = ~0ull;
  CU_OK(F(cuDeviceGetGraphMemAttribute)(dev, attr, &v));
  return v;
}

/* An executable graph allocating `bytes` on dev and freeing them (`freed`)
 * or not. */
static CUresult graph_of(CUdevice dev, uint64_t bytes, bool freed,
                         CUgraphExec *exec) {
  CUgraph g;
  CUgraphNode a, f;
  CUDA_MEM_ALLOC_NODE_PARAMS p = {.bytesize = bytes};
  p.poolProps.allocType = 1;
  p.poolProps.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, dev};
  CU_OK(F(cuGraphCreate)(&g, 0));
  CU_OK(F(cuGraphAddMemAllocNode)(&a, g, NULL, 0, &p));
  ASSERT(p.dptr != 0);
  if (freed)
    CU_OK(F(cuGraphAddMemFreeNode)(&f, g, &a, 1, p.dptr));
  CUresult rc = F(cuGraphInstantiateWithFlags)(exec, g, 0);
  CU_OK(F(cuGraphDestroy)(g));
  return rc;
}

TEST_IMPL(fakecuda_graph_memory) {
  fc_open("16G", "64M");
  fc_init_ctx(0);
  uint64_t base = used(0);
  CUgraphExec small, big, huge;
  CU_OK(graph_of(0, 3 * GIB, true, &small));
  CU_OK(graph_of(0, 5 * GIB, true, &big));
  ASSERT_UEQ(used(0), base); /* nothing until a launch */
  /* A launch grows the allocator to what the graph needs; it keeps it. */
  CU_OK(F(cuGraphLaunch)(small, NULL));
  ASSERT_UEQ(used(0), base + 3 * GIB);
  CU_OK(F(cuGraphUpload_ptsz)(big, NULL));
  ASSERT_UEQ(used(0), base + 5 * GIB);
  CU_OK(F(cuGraphLaunch_ptsz)(small, NULL));
  ASSERT_UEQ(used(0), base + 5 * GIB);
  ASSERT_UEQ(graph_attr(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 5 * GIB);
  ASSERT_UEQ(graph_attr(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0);
  /* Destroying a graph keeps the memory; a trim gives it back. */
  CU_OK(F(cuGraphExecDestroy)(big));
  ASSERT_UEQ(used(0), base + 5 * GIB);
  CU_OK(F(cuDeviceGraphMemTrim)(0));
  ASSERT_UEQ(used(0), base);
  ASSERT_UEQ(graph_attr(0, 3), 5 * GIB); /* RESERVED_MEM_HIGH */
  /* More than the GPU has: out of memory, nothing kept. */
  CU_OK(graph_of(0, 17 * GIB, true, &huge));
  ASSERT_EQ(F(cuGraphLaunch)(huge, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_UEQ(used(0), base);
  ASSERT_UEQ(ooms(0), 1);
  /* Not modelled: an allocation that outlives its graph. */
  CUgraphExec outliving;
  ASSERT_EQ(graph_of(0, GIB, false, &outliving), CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(F(cuDeviceGraphMemTrim)(7), CUDA_ERROR_INVALID_DEVICE);
  CU_OK(F(cuGraphExecDestroy)(small));
  CU_OK(F(cuGraphExecDestroy)(huge));
}

/* --- VMM and arrays ------------------------------------------------------- */

TEST_IMPL(fakecuda_vmm_and_arrays) {
  fc_open("16G,8G", "0");
  /* Ordinals are not NVML indices here. */
  setenv("CUDA_VISIBLE_DEVICES", "1,0", 1);
  fc_init_ctx(0);
  ASSERT_EQ(nvml_of(0), 1);
  ASSERT_UEQ(used(0), 0);
  ASSERT_UEQ(used(1), 0);

  CUmemAllocationProp prop = {.type = 1,
                              .location = {CU_MEM_LOCATION_TYPE_DEVICE, 1}};
  size_t gran = 0;
  CU_OK(F(cuMemGetAllocationGranularity)(&gran, &prop, 0));
  ASSERT_UEQ(gran, 2 * MIB);
  CUmemGenericAllocationHandle h;
  ASSERT_EQ(F(cuMemCreate)(&h, 3 * MIB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuMemCreate)(&h, 6 * MIB, &prop, 0)); /* ordinal 1: NVML 0 */
  ASSERT_UEQ(used(0), 6 * MIB);
  ASSERT_UEQ(used(1), 0);
  CUdeviceptr va = 0;
  CU_OK(F(cuMemAddressReserve)(&va, 8 * MIB, 0, 0, 0));
  ASSERT(va != 0 && va % (2 * MIB) == 0);
  ASSERT_UEQ(used(0), 6 * MIB);
  ASSERT_EQ(F(cuMemMap)(va, 8 * MIB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuMemMap)(va, 6 * MIB, 0, h, 0));
  fake_CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, 3};
  CU_OK(F(cuMemSetAccess)(va, 6 * MIB, &acc, 1));
  char msg[] = "mapped", back[sizeof msg];
  CU_OK(F(cuMemcpyHtoD_v2)(va + 4 * MIB, msg, sizeof msg));
  CU_OK(F(cuMemcpyDtoH_v2)(back, va + 4 * MIB, sizeof msg));
  ASSERT_STREQ(back, msg);
  ASSERT_UEQ(used(0), 6 * MIB); /* mapping costs nothing */
  CU_OK(F(cuMemUnmap)(va, 6 * MIB));
  CU_OK(F(cuMemRelease)(h));
  ASSERT_UEQ(used(0), 0);
  ASSERT_EQ(F(cuMemRelease)(h), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuMemAddressFree)(va, 2 * MIB), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuMemAddressFree)(va, 8 * MIB));
  prop.location.id = 2;
  ASSERT_EQ(F(cuMemCreate)(&h, 2 * MIB, &prop, 0), CUDA_ERROR_INVALID_DEVICE);

  /* Arrays, on the context's device (NVML 1). */
  CUarray a2, a1, a3;
  CUmipmappedArray m2, m1;
  CUDA_ARRAY_DESCRIPTOR d2 = {100, 50, CU_AD_FORMAT_FLOAT, 4};
  CU_OK(F(cuArrayCreate_v2)(&a2, &d2));
  ASSERT_UEQ(used(1), 100 * 50 * 4 * 4);
  CUDA_ARRAY_DESCRIPTOR d1 = {1000, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1};
  CU_OK(F(cuArrayCreate_v2)(&a1, &d1));
  ASSERT_UEQ(used(1), 80000 + 1000);
  CUDA_ARRAY3D_DESCRIPTOR d3 = {10, 20, 30, CU_AD_FORMAT_HALF, 2, 0};
  CU_OK(F(cuArray3DCreate_v2)(&a3, &d3));
  ASSERT_UEQ(used(1), 81000 + 10 * 20 * 30 * 2 * 2);
  /* Mipmaps: every level halves each extent, down to 1. */
  CUDA_ARRAY3D_DESCRIPTOR md = {64, 32, 0, CU_AD_FORMAT_UNSIGNED_INT32, 1, 0};
  CU_OK(F(cuMipmappedArrayCreate)(&m2, &md, 4));
  ASSERT_UEQ(used(1), 105000 + (64 * 32 + 32 * 16 + 16 * 8 + 8 * 4) * 4);
  CUDA_ARRAY3D_DESCRIPTOR md1 = {8, 0, 0, CU_AD_FORMAT_SIGNED_INT8, 1, 0};
  CU_OK(F(cuMipmappedArrayCreate)(&m1, &md1, 5));
  ASSERT_UEQ(used(1), 105000 + 10880 + 8 + 4 + 2 + 1 + 1);
  CUDA_ARRAY_DESCRIPTOR bad = {10, 10, 0x55, 1};
  ASSERT_EQ(F(cuArrayCreate_v2)(&a1, &bad), CUDA_ERROR_INVALID_VALUE);
  bad.Format = CU_AD_FORMAT_FLOAT;
  bad.NumChannels = 3;
  ASSERT_EQ(F(cuArrayCreate_v2)(&a1, &bad), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuMipmappedArrayCreate)(&m1, &md, 0), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuArrayDestroy)(a1));
  CU_OK(F(cuArrayDestroy)(a2));
  CU_OK(F(cuArrayDestroy)(a3));
  CU_OK(F(cuMipmappedArrayDestroy)(m1));
  CU_OK(F(cuMipmappedArrayDestroy)(m2));
  ASSERT_EQ(F(cuArrayDestroy)(a1), CUDA_ERROR_INVALID_HANDLE);
  ASSERT_EQ(F(cuMipmappedArrayDestroy)(m1), CUDA_ERROR_INVALID_HANDLE);
  ASSERT_UEQ(used(1), 0);

  /* IPC: a handle can be made for an allocation's base, not opened. */
  CUdeviceptr ip;
  fake_CUipcMemHandle ih = {{0}};
  ASSERT_EQ(F(cuIpcGetMemHandle)(&ih, 0x1000), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuMemAlloc_v2)(&ip, MIB));
  CU_OK(F(cuIpcGetMemHandle)(&ih, ip));
  ASSERT_EQ(F(cuIpcGetMemHandle)(&ih, ip + 16), CUDA_ERROR_INVALID_VALUE);
  CU_OK(F(cuMemFree_v2)(ip));
  ASSERT_EQ(F(cuIpcOpenMemHandle_v2)(&ip, ih, 1), CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(F(cuIpcCloseMemHandle)(0), CUDA_ERROR_NOT_SUPPORTED);
}

/* --- cuGetProcAddress ----------------------------------------------------- */

/* cuGetProcAddress_v2's answer for (symbol, version, flags): the exported
 * variant `want`, or NULL for the failure `status`. */
static void check_proc(const char *symbol, int version, cuuint64_t flags,
                       const char *want,
                       CUdriverProcAddressQueryResult status) {
  void *pfn = (void *)1;
  CUdriverProcAddressQueryResult st = 99;
  CUresult r = F(cuGetProcAddress_v2)(symbol, &pfn, version, flags, &st);
  void *legacy = (void *)1;
  CUresult r4 = F(cuGetProcAddress)(symbol, &legacy, version, flags);
  if (want) {
    if (r != CUDA_SUCCESS || pfn != sym(want) || st != 0)
      th_fail(__FILE__, __LINE__, "%s@%d/%llu: %d, status %d, not %s", symbol,
              version, (unsigned long long)flags, r, (int)st, want);
  } else if (r != CUDA_ERROR_NOT_FOUND || pfn != NULL || st != status) {
    th_fail(__FILE__, __LINE__, "%s@%d/%llu: %d, status %d, wanted %d", symbol,
            version, (unsigned long long)flags, r, (int)st, (int)status);
  }
  ASSERT_EQ(r4, r);
  ASSERT(legacy == pfn);
}

TEST_IMPL(fakecuda_get_proc_address) {
  const cuuint64_t PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                   LEG = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  const CUdriverProcAddressQueryResult
      NF = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
      VNS = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  fc_open("16G", "300M");
  /* Works before cuInit. */
  check_proc("cuMemAlloc", 3000, 0, "cuMemAlloc", 0);
  check_proc("cuMemAlloc", 3020, 0, "cuMemAlloc_v2", 0);
  check_proc("cuMemAlloc", 12000, 0, "cuMemAlloc_v2", 0);
  check_proc("cuMemAlloc", 1000, 0, NULL, VNS);
  check_proc("cuMemFree", 13000, PT, "cuMemFree_v2", 0);
  check_proc("cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2", 0);
  check_proc("cuMemAllocAsync", 12000, 0, "cuMemAllocAsync", 0);
  check_proc("cuMemAllocAsync", 12000, LEG, "cuMemAllocAsync", 0);
  check_proc("cuMemAllocAsync", 12000, PT, "cuMemAllocAsync_ptsz", 0);
  check_proc("cuMemAllocAsync", 11000, PT, NULL, VNS);
  check_proc("cuMemFreeAsync", 11020, PT, "cuMemFreeAsync_ptsz", 0);
  check_proc("cuMemAllocFromPoolAsync", 12080, PT,
             "cuMemAllocFromPoolAsync_ptsz", 0);
  check_proc("cuGetProcAddress", 11030, 0, "cuGetProcAddress", 0);
  check_proc("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", 0);
  check_proc("cuGetProcAddress", 11020, 0, NULL, VNS);
  check_proc("cuCtxCreate", 2000, 0, "cuCtxCreate", 0);
  check_proc("cuCtxCreate", 11000, 0, "cuCtxCreate_v2", 0);
  check_proc("cuCtxCreate", 11040, 0, "cuCtxCreate_v3", 0);
  check_proc("cuCtxCreate", 12050, 0, "cuCtxCreate_v4", 0);
  check_proc("cuCtxCreate", 13000, 0, "cuCtxCreate_v4", 0);
  check_proc("cuCtxDestroy", 12000, 0, "cuCtxDestroy_v2", 0);
  check_proc("cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease",
             0);
  check_proc("cuDevicePrimaryCtxRelease", 11000, 0,
             "cuDevicePrimaryCtxRelease_v2", 0);
  check_proc("cuDeviceTotalMem", 12000, 0, "cuDeviceTotalMem_v2", 0);
  check_proc("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2", 0);
  check_proc("cuCtxGetDevice", 12090, 0, "cuCtxGetDevice", 0);
  check_proc("cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2", 0);
  check_proc("cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2", 0);
  check_proc("cuMemcpyHtoD", 12000, PT, "cuMemcpyHtoD_v2_ptds", 0);
  check_proc("cuMemcpyHtoD", 6000, PT, "cuMemcpyHtoD_v2", 0);
  check_proc("cuLaunchKernel", 12000, PT, "cuLaunchKernel_ptsz", 0);
  check_proc("cuLaunchKernel", 12000, 0, "cuLaunchKernel", 0);
  check_proc("cuStreamSynchronize", 12000, PT, "cuStreamSynchronize_ptsz", 0);
  check_proc("cuMemCreate", 12000, 0, "cuMemCreate", 0);
  check_proc("cuMemCreate", 10010, 0, NULL, VNS);
  check_proc("cuArrayCreate", 12000, 0, "cuArrayCreate_v2", 0);
  check_proc("cuMipmappedArrayCreate", 12000, 0, "cuMipmappedArrayCreate", 0);
  check_proc("cuNoSuchEntry", 12000, 0, NULL, NF);
  check_proc("cuMemAlloc_v2", 12000, 0, NULL, NF); /* names are base names */
  check_proc("", 12000, 0, NULL, NF);

  void *pfn;
  ASSERT_EQ(F(cuGetProcAddress_v2)(NULL, &pfn, 12000, 0, NULL),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuGetProcAddress_v2)("cuInit", &pfn, 12000, 8, NULL),
            CUDA_ERROR_INVALID_VALUE);
  /* The status may be left out; what comes back can be called. */
  CU_OK(F(cuGetProcAddress_v2)("cuDriverGetVersion", &pfn, 12000, 0, NULL));
  int v = 0;
  CU_OK(((CUresult(*)(int *))pfn)(&v));
  ASSERT_EQ(v, 13000);
}

/* --- Fault injection ------------------------------------------------------ */

static void fail_init_child(void *arg) {
  (void)arg;
  setenv("FAKE_CUDA_FAIL", "cuInit:1", 1);
  ASSERT_EQ(F(cuInit)(0), CUDA_ERROR_UNKNOWN);
  CU_OK(F(cuInit)(0)); /* the failed call had no effect */
}

TEST_IMPL(fakecuda_fault_injection) {
  CUcontext c1, c2;
  CUdeviceptr d[3] = {0};
  fake_CUdeviceptr_v1 d1 = 0;
  fc_open("16G", "100M");
  setenv("FAKE_CUDA_FAIL",
         "cuCtxCreate_v2:2,cuMemAlloc_v2:3,bogus,cuMemFree_v2:2+", 1);
  CU_OK(F(cuInit)(0));
  CU_OK(F(cuCtxCreate_v2)(&c1, 0, 0));
  ASSERT_EQ(F(cuCtxCreate_v2)(&c2, 0, 0), CUDA_ERROR_UNKNOWN);
  ASSERT_UEQ(used(0), 100 * MIB);
  CU_OK(F(cuCtxCreate_v2)(&c2, 0, 0));
  ASSERT_UEQ(used(0), 200 * MIB);
  CU_OK(F(cuMemAlloc_v2)(&d[0], MIB));
  CU_OK(F(cuMemAlloc_v2)(&d[1], MIB));
  ASSERT_EQ(F(cuMemAlloc_v2)(&d[2], MIB), CUDA_ERROR_UNKNOWN);
  ASSERT_UEQ(d[2], 0);
  ASSERT_UEQ(used(0), 202 * MIB);
  CU_OK(F(cuMemAlloc_v2)(&d[2], MIB));
  /* Other variants count separately. */
  CU_OK(F(cuMemAlloc)(&d1, 4096));
  CU_OK(F(cuMemFree_v2)(d[0]));
  ASSERT_EQ(F(cuMemFree_v2)(d[1]), CUDA_ERROR_UNKNOWN);
  ASSERT_EQ(F(cuMemFree_v2)(d[1]), CUDA_ERROR_UNKNOWN); /* and every later */
  ASSERT_UEQ(used(0), 202 * MIB + 4096);
  /* A forked child counts its own calls. */
  ASSERT_EQ(in_child(fail_init_child, NULL), 0);
}

/* --- The fake NVML sees fake-CUDA processes ------------------------------- */

static const cogpu__gpu_proc_t *find_proc(const cogpu__gpu_proc_t *p, size_t n,
                                          unsigned pid) {
  for (size_t i = 0; i < n; i++)
    if (p[i].pid == pid)
      return &p[i];
  return NULL;
}

typedef int (*nvml_handle_fn)(unsigned, void **);
typedef int (*nvml_mem_fn)(void *, unsigned long long *);

/* nvmlDeviceGetMemoryInfo's used bytes of GPU `index`. */
static uint64_t nvml_used(unsigned index) {
  void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT(nv);
  int (*init)(void) = (int (*)(void))dlsym(nv, "nvmlInit_v2");
  nvml_handle_fn handle =
      (nvml_handle_fn)dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
  nvml_mem_fn mem = (nvml_mem_fn)dlsym(nv, "nvmlDeviceGetMemoryInfo");
  ASSERT(init && handle && mem);
  void *dev;
  unsigned long long m[3]; /* total, free, used */
  ASSERT_EQ(init(), 0);
  ASSERT_EQ(handle(index, &dev), 0);
  ASSERT_EQ(mem(dev, m), 0);
  return m[2];
}

TEST_IMPL(fakecuda_nvml_lists_processes) {
  CUdeviceptr d;
  cogpu__gpu_proc_t p[16];
  size_t n = 0;
  char procs[128];
  unsigned me = (unsigned)getpid();
  fc_open("16G,8G", "100M");
  /* The fake NVML's own list: pid 4242, and this process (merged). */
  snprintf(procs, sizeof procs, "0 4242 1G\n0 %u 10M\n", me);
  th_write_file(th_path("procs"), procs);
  th_setenv("FAKE_NVML_PROCS", th_path("procs"));
  fc_init_ctx(0);
  CU_OK(F(cuMemAlloc_v2)(&d, GIB));
  peer_t peer = {.bytes = 512 * MIB, .dev = 1};
  pid_t pid = start_peer(&peer);
  ASSERT_EQ(get_byte(peer.to_parent), 'a');

  ASSERT_OK(cogpu__nvml_processes(0, p, 16, &n));
  ASSERT_EQ(n, 2);
  ASSERT(find_proc(p, n, 4242) && find_proc(p, n, 4242)->used == GIB);
  ASSERT(find_proc(p, n, me));
  ASSERT_UEQ(find_proc(p, n, me)->used, GIB + 110 * MIB);
  ASSERT_OK(cogpu__nvml_processes(1, p, 16, &n));
  ASSERT_EQ(n, 1);
  ASSERT_EQ(p[0].pid, (unsigned)pid);
  ASSERT_UEQ(p[0].used, 612 * MIB);
  ASSERT_UEQ(nvml_used(0), 2 * GIB + 110 * MIB);
  ASSERT_UEQ(nvml_used(1), 612 * MIB);

  /* Gone: no longer listed, even before anyone reclaims its memory. */
  kill(pid, SIGKILL);
  th_wait(pid, th_ms(10000));
  ASSERT_OK(cogpu__nvml_processes(1, p, 16, &n));
  ASSERT_EQ(n, 0);
  ASSERT_UEQ(nvml_used(1), 0);
  /* Without FAKE_CUDA_STATE, the fake NVML knows nothing of it. */
  unsetenv("FAKE_CUDA_STATE");
  ASSERT_OK(cogpu__nvml_processes(0, p, 16, &n));
  ASSERT_EQ(n, 2);
  ASSERT_UEQ(find_proc(p, n, me)->used, 10 * MIB);
}

/* --- Threads
 * ---------------------------------------------------------------------------
 */

typedef struct {
  CUcontext ctx;
  unsigned seed;
  int ooms;
} worker_t;

/* Allocates and frees, plainly and from the default pool, keeping up to
 * four allocations live. */
static void *alloc_worker(void *arg) {
  worker_t *w = arg;
  CUdeviceptr live[4] = {0};
  bool pooled[4] = {false};
  CU_OK(F(cuCtxSetCurrent)(w->ctx));
  for (int i = 0; i < 300; i++) {
    int slot = i % 4;
    if (live[slot]) {
      CUresult r = pooled[slot] ? F(cuMemFreeAsync)(live[slot], NULL)
                                : F(cuMemFree_v2)(live[slot]);
      CU_OK(r);
      live[slot] = 0;
    }
    size_t bytes = 1 + (size_t)(rand_r(&w->seed) % (48 * MIB));
    pooled[slot] = i % 3 == 0;
    CUresult r = pooled[slot] ? F(cuMemAllocAsync)(&live[slot], bytes, NULL)
                              : F(cuMemAlloc_v2)(&live[slot], bytes);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      w->ooms++;
      live[slot] = 0;
      continue;
    }
    CU_OK(r);
    CU_OK(F(cuMemsetD8_v2)(live[slot], (unsigned char)i, 1));
  }
  for (int slot = 0; slot < 4; slot++)
    if (live[slot])
      CU_OK(F(cuMemFree_v2)(live[slot]));
  return NULL;
}

TEST_IMPL(fakecuda_threads) {
  enum { NT = 8 };
  pthread_t t[NT];
  worker_t w[NT];
  CUmemoryPool pool;
  /* 96M: one thread alone, holding 4 allocations of up to 48M, already
   * runs out, so out-of-memory happens however the threads are scheduled
   * (with 512M it needed several threads at once, and a loaded machine
   * could run them one after another). */
  fc_open("96M", "0");
  CUcontext ctx = fc_init_ctx(0);
  for (int i = 0; i < NT; i++) {
    w[i] = (worker_t){ctx, (unsigned)i * 7919u + 1, 0};
    ASSERT_EQ(pthread_create(&t[i], NULL, alloc_worker, &w[i]), 0);
  }
  int total_ooms = 0;
  for (int i = 0; i < NT; i++) {
    ASSERT_EQ(pthread_join(t[i], NULL), 0);
    total_ooms += w[i].ooms;
  }
  ASSERT_UEQ(ooms(0), (uint64_t)total_ooms);
  ASSERT(total_ooms > 0);
  ASSERT(peak(0) <= 96 * MIB);
  CU_OK(F(cuDeviceGetDefaultMemPool)(&pool, 0));
  CU_OK(F(cuMemPoolTrimTo)(pool, 0));
  ASSERT_UEQ(used(0), 0);
}

/* --- Streams, modules, launches, export tables ---------------------------- */

static void launch_child(void *arg) {
  (void)arg;
  ASSERT_UEQ(F(fake_cuda_launch_count)(), 0);
}

TEST_IMPL(fakecuda_misc) {
  CUstream s;
  fake_CUmodule mod;
  CUfunction fn;
  fc_open("16G", "0");
  CU_OK(F(cuInit)(0));
  ASSERT_EQ(F(cuStreamCreate)(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
  fc_init_ctx(0);
  CU_OK(F(cuStreamCreate)(&s, 0));
  CU_OK(F(cuStreamSynchronize)(s));
  CU_OK(F(cuStreamSynchronize_ptsz)(NULL));
  ASSERT_EQ(F(cuStreamSynchronize)((CUstream)0x999), CUDA_ERROR_INVALID_HANDLE);
  CU_OK(F(cuModuleLoadData)(&mod, "fatbin"));
  CU_OK(F(cuModuleGetFunction)(&fn, mod, "kernel"));
  void *args[1] = {NULL};
  CU_OK(F(cuLaunchKernel)(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
  CU_OK(F(cuLaunchKernel)(fn, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
  CU_OK(F(cuLaunchKernel_ptsz)(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
  ASSERT_EQ(F(cuLaunchKernel)(NULL, 1, 1, 1, 1, 1, 1, 0, s, args, NULL),
            CUDA_ERROR_INVALID_HANDLE);
  ASSERT_UEQ(F(fake_cuda_launch_count)(), 3);
  ASSERT_EQ(in_child(launch_child, NULL), 0);
  CU_OK(F(cuModuleUnload)(mod));
  CU_OK(F(cuStreamDestroy_v2)(s));
  ASSERT_EQ(F(cuStreamDestroy_v2)(s), CUDA_ERROR_INVALID_HANDLE);

  const void *table = NULL;
  CUuuid id = {{0}};
  CU_OK(F(cuGetExportTable)(&table, &id));
  ASSERT(table == sym("fake_cuda_export_table"));
}
