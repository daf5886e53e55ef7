/*
 * nvml.c: the NVML boundary (see nvml.h). libnvidia-ml.so.1 is opened with
 * dlopen and the few NVML types cogpu needs are declared here, so cogpu
 * builds without NVIDIA headers and runs (reporting COGPU_ENVML) without
 * the driver.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "nvml/nvml.h"

#define NVML_SONAME "libnvidia-ml.so.1"

/* --- The part of the NVML ABI cogpu uses -------------------------------- */

typedef int nvml_ret_t;
enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_INSUFFICIENT_SIZE = 7
};

typedef struct nvml_device_s *nvml_device_t;

typedef struct {
  unsigned long long total, free, used;
} nvml_memory_t;

/* nvmlProcessInfo_v1_t: the unversioned process queries fill these. */
typedef struct {
  unsigned int pid;
  unsigned long long used;
} nvml_proc_v1_t;

/* nvmlProcessInfo_v2_t: filled by the _v2 queries, and by _v3 on most
 * drivers. Both layouts keep pid at offset 0 and the bytes at offset 8. */
typedef struct {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
} nvml_proc_v2_t;

/* Drivers 535.43 to 535.86 wrote 32-byte entries through the _v3 queries
 * (with a usedGpuCcProtectedMemory field) without renaming them. Every slot
 * is sized for that, so a layout surprise gives wrong figures, never a heap
 * overrun. */
#define NVML_PROC_SLOT 32

#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)

typedef nvml_ret_t (*nvml_procs_fn)(nvml_device_t, unsigned int *, void *);

typedef struct {
  nvml_procs_fn fn;
  char name[96]; /* the symbol found, for messages */
  size_t stride; /* bytes per entry in that symbol's layout */
} nvml_procs_api_t;

typedef struct {
  nvml_ret_t (*init)(void);
  const char *(*error_string)(nvml_ret_t);
  nvml_ret_t (*count)(unsigned int *);
  nvml_ret_t (*handle)(unsigned int, nvml_device_t *);
  nvml_ret_t (*uuid)(nvml_device_t, char *, unsigned int);
  nvml_ret_t (*name)(nvml_device_t, char *, unsigned int);
  nvml_ret_t (*memory)(nvml_device_t, nvml_memory_t *);
  nvml_procs_api_t compute;
  nvml_procs_api_t graphics; /* fn may be NULL: graphics are optional */
  /* Optional (idle detection): per-process utilisation samples. */
  nvml_ret_t (*util)(nvml_device_t, void *, unsigned int *, unsigned long long);
} nvml_api_t;

/* nvmlProcessUtilizationSample_t. */
typedef struct {
  unsigned int pid;
  unsigned long long timestamp; /* CPU timestamp, microseconds */
  unsigned int sm, mem, enc, dec;
} nvml_util_sample_t;

/* --- Loading ------------------------------------------------------------ */

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static nvml_api_t nvml;
static int nvml_open_rc;
static char nvml_open_msg[512];

static const char *nvml_strerror(nvml_ret_t r) {
  static __thread char buf[32];
  const char *s = nvml.error_string ? nvml.error_string(r) : NULL;
  if (s)
    return s;
  snprintf(buf, sizeof buf, "NVML error %d", r);
  return buf;
}

/* First of the NULL-ended names that lib exports, or NULL; *found gets its
 * position. Older drivers only have the older names. */
static void *nvml_sym(void *lib, const char *const *names, int *found) {
  for (int i = 0; names[i]; i++) {
    void *p = dlsym(lib, names[i]);
    if (p) {
      if (found)
        *found = i;
      return p;
    }
  }
  return NULL;
}

#define NVML_NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The _v2 queries come first: their layout never changed, while _v3 wrote
 * a larger one on some 535 drivers (see NVML_PROC_SLOT). */
static void nvml_bind_procs(void *lib, nvml_procs_api_t *api,
                            const char *base) {
  char v2[96], v3[96];
  snprintf(v2, sizeof v2, "%s_v2", base);
  snprintf(v3, sizeof v3, "%s_v3", base);
  const char *const names[] = {v2, v3, base, NULL};
  static const size_t strides[] = {
      sizeof(nvml_proc_v2_t), sizeof(nvml_proc_v2_t), sizeof(nvml_proc_v1_t)};
  int i = 0;
  api->fn = (nvml_procs_fn)nvml_sym(lib, names, &i);
  snprintf(api->name, sizeof api->name, "%s", names[i]);
  api->stride = strides[i];
}

/* Binds every symbol; returns the name of a missing required one. */
static const char *nvml_bind(void *lib) {
  nvml.error_string = nvml_sym(lib, NVML_NAMES("nvmlErrorString"), NULL);
#define NVML_BIND(field, ...)                                                  \
  if (!(nvml.field = nvml_sym(lib, NVML_NAMES(__VA_ARGS__), NULL)))            \
    return NVML_NAMES(__VA_ARGS__)[0];
  NVML_BIND(init, "nvmlInit_v2", "nvmlInit")
  NVML_BIND(count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount")
  NVML_BIND(handle, "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetHandleByIndex")
  NVML_BIND(uuid, "nvmlDeviceGetUUID")
  NVML_BIND(name, "nvmlDeviceGetName")
  NVML_BIND(memory, "nvmlDeviceGetMemoryInfo")
#undef NVML_BIND
  nvml_bind_procs(lib, &nvml.compute, "nvmlDeviceGetComputeRunningProcesses");
  if (!nvml.compute.fn)
    return "nvmlDeviceGetComputeRunningProcesses";
  nvml_bind_procs(lib, &nvml.graphics, "nvmlDeviceGetGraphicsRunningProcesses");
  *(void **)&nvml.util =
      nvml_sym(lib, NVML_NAMES("nvmlDeviceGetProcessUtilization"), NULL);
  return NULL;
}

/* Runs once per process. NVML is never shut down: other code in the process
 * may use it too, and its initialisation is reference-counted anyway. */
static int nvml_load(void) {
  void *lib = dlopen(NVML_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(nvml_open_msg, sizeof nvml_open_msg,
             "cannot load " NVML_SONAME ": %s; is the NVIDIA driver installed "
             "and its library on the loader path (ldconfig -p | grep "
             "nvidia-ml)?",
             dlerror());
    return COGPU_ENVML;
  }
  const char *missing = nvml_bind(lib);
  if (missing) {
    snprintf(nvml_open_msg, sizeof nvml_open_msg,
             NVML_SONAME " has no %s; the NVIDIA driver is too old", missing);
    dlclose(lib);
    return COGPU_ENVML;
  }
  nvml_ret_t r = nvml.init();
  if (r != NVML_SUCCESS) {
    snprintf(nvml_open_msg, sizeof nvml_open_msg,
             "nvmlInit failed: %s; is the NVIDIA kernel driver loaded "
             "(does nvidia-smi work)?",
             nvml_strerror(r));
    nvml.error_string = NULL; /* the library goes away */
    dlclose(lib);
    return COGPU_ENVML;
  }
  cogpu__log(COGPU_LOG_DEBUG, "NVML loaded; processes listed with %s",
             nvml.compute.name);
  return 0;
}

static void nvml_open_once(void) {
  nvml_open_rc = nvml_load();
}

int cogpu__nvml_open(void) {
  pthread_once(&nvml_once, nvml_open_once);
  if (nvml_open_rc != 0)
    return cogpu__seterr(nvml_open_rc, "%s", nvml_open_msg);
  return 0;
}

/* --- Discovery ---------------------------------------------------------- */

static int nvml_fail(const char *call, unsigned index, nvml_ret_t r) {
  return cogpu__seterr(COGPU_ENVML, "%s failed for GPU %u: %s", call, index,
                       nvml_strerror(r));
}

static int nvml_device(unsigned index, nvml_device_t *dev) {
  nvml_ret_t r = nvml.handle(index, dev);
  return r == NVML_SUCCESS ? 0
                           : nvml_fail("nvmlDeviceGetHandleByIndex", index, r);
}

static int nvml_describe(unsigned index, cogpu__gpu_desc_t *d) {
  nvml_device_t dev;
  nvml_memory_t mem;
  nvml_ret_t r;
  int rc = nvml_device(index, &dev);
  if (rc)
    return rc;
  memset(d, 0, sizeof *d);
  d->index = index;
  if ((r = nvml.uuid(dev, d->uuid, sizeof d->uuid)) != NVML_SUCCESS)
    return nvml_fail("nvmlDeviceGetUUID", index, r);
  if ((r = nvml.name(dev, d->name, sizeof d->name)) != NVML_SUCCESS)
    return nvml_fail("nvmlDeviceGetName", index, r);
  if ((r = nvml.memory(dev, &mem)) != NVML_SUCCESS)
    return nvml_fail("nvmlDeviceGetMemoryInfo", index, r);
  d->uuid[sizeof d->uuid - 1] = d->name[sizeof d->name - 1] = 0;
  d->total = mem.total;
  return 0;
}

int cogpu__nvml_discover(cogpu__gpu_desc_t *gpus, size_t max, size_t *n) {
  unsigned count = 0;
  *n = 0;
  int rc = cogpu__nvml_open();
  if (rc)
    return rc;
  nvml_ret_t r = nvml.count(&count);
  if (r != NVML_SUCCESS)
    return cogpu__seterr(COGPU_ENVML, "nvmlDeviceGetCount failed: %s",
                         nvml_strerror(r));
  if (count == 0)
    return cogpu__seterr(COGPU_ENOGPU, "NVML reports no GPU on this node "
                                       "(check nvidia-smi -L)");
  if (count > max)
    cogpu__log(COGPU_LOG_INFO, "NVML reports %u GPUs; using the first %zu",
               count, max);
  size_t k = count < max ? count : max;
  for (size_t i = 0; i < k; i++)
    if ((rc = nvml_describe((unsigned)i, &gpus[i])) != 0)
      return rc;
  *n = k;
  return 0;
}

int cogpu__nvml_mem_free(unsigned index, uint64_t *free_bytes) {
  nvml_device_t dev;
  nvml_memory_t mem;
  int rc = cogpu__nvml_open();
  if (rc || (rc = nvml_device(index, &dev)))
    return rc;
  nvml_ret_t r = nvml.memory(dev, &mem);
  if (r != NVML_SUCCESS)
    return nvml_fail("nvmlDeviceGetMemoryInfo", index, r);
  *free_bytes = mem.total > mem.used ? mem.total - mem.used : 0;
  return 0;
}

/* --- Processes ---------------------------------------------------------- */

/* The first query offers this many entries, enough for nearly every node,
 * so the common case is one call per list. */
#define NVML_PROCS_FIRST 64
/* Bounds the retries on a list that grows between calls. */
#define NVML_PROCS_MAX 4096
#define NVML_PROCS_TRIES 8

typedef struct {
  cogpu__gpu_proc_t *v;
  size_t n;
} nvml_plist_t;

static int nvml_plist_add(nvml_plist_t *l, const unsigned char *buf,
                          unsigned cnt, size_t stride) {
  /* +1: a realloc to zero bytes may free and return NULL. */
  cogpu__gpu_proc_t *v = realloc(l->v, (l->n + cnt + 1) * sizeof *v);
  if (!v)
    return cogpu__seterr(-ENOMEM, "out of memory listing GPU processes");
  l->v = v;
  for (unsigned i = 0; i < cnt; i++) {
    nvml_proc_v1_t e;
    memcpy(&e, buf + (size_t)i * stride, sizeof e);
    v[l->n].pid = e.pid;
    v[l->n].used = e.used == NVML_VALUE_NOT_AVAILABLE_ULL ? 0 : e.used;
    l->n++;
  }
  return 0;
}

/* Room for the next try: what NVML asked for plus headroom, since the list
 * may grow again before the next call. */
static unsigned nvml_procs_grow(unsigned need, unsigned cap) {
  unsigned next = need > cap ? need + need / 8 + 8 : cap * 2;
  return next < NVML_PROCS_MAX ? next : NVML_PROCS_MAX;
}

/* One NVML process query, retried while the offered array is too small.
 * Returns 0 or an error rc; *nr gets NVML's last return code. */
static int nvml_procs_query(const nvml_procs_api_t *api, unsigned index,
                            nvml_device_t dev, nvml_plist_t *out,
                            nvml_ret_t *nr) {
  unsigned cap = NVML_PROCS_FIRST;
  for (int t = 0; t < NVML_PROCS_TRIES; t++) {
    unsigned char *buf = calloc(cap, NVML_PROC_SLOT);
    if (!buf)
      return cogpu__seterr(-ENOMEM, "out of memory listing GPU processes");
    unsigned cnt = cap;
    *nr = api->fn(dev, &cnt, buf);
    int rc = 0;
    if (*nr == NVML_SUCCESS)
      rc = nvml_plist_add(out, buf, cnt < cap ? cnt : cap, api->stride);
    free(buf);
    if (*nr != NVML_ERROR_INSUFFICIENT_SIZE)
      return rc;
    if (cap >= NVML_PROCS_MAX)
      break;
    cap = nvml_procs_grow(cnt, cap);
  }
  return cogpu__seterr(COGPU_ENVML,
                       "%s: the processes on GPU %u do not fit in %u entries",
                       api->name, index, cap);
}

/* Compute processes are required, except where NVML cannot list them
 * (NOT_SUPPORTED: some consumer GPUs), which reads as none. Graphics
 * processes are best effort. */
static int nvml_procs_list(const nvml_procs_api_t *api, bool required,
                           unsigned index, nvml_device_t dev,
                           nvml_plist_t *out) {
  nvml_ret_t r = NVML_SUCCESS;
  int rc = nvml_procs_query(api, index, dev, out, &r);
  if (rc || r == NVML_SUCCESS)
    return rc;
  if (!required || r == NVML_ERROR_NOT_SUPPORTED) {
    cogpu__log(COGPU_LOG_DEBUG, "%s on GPU %u: %s; taken as no process",
               api->name, index, nvml_strerror(r));
    return 0;
  }
  return nvml_fail(api->name, index, r);
}

static int nvml_pid_cmp(const void *a, const void *b) {
  unsigned x = ((const cogpu__gpu_proc_t *)a)->pid;
  unsigned y = ((const cogpu__gpu_proc_t *)b)->pid;
  return (x > y) - (x < y);
}

/* A process doing both compute and graphics is listed twice, with the same
 * memory: keep one entry per pid, with the larger figure. */
static size_t nvml_merge(cogpu__gpu_proc_t *v, size_t n) {
  size_t k = 0;
  if (n)
    qsort(v, n, sizeof *v, nvml_pid_cmp);
  for (size_t i = 0; i < n; i++) {
    if (k && v[k - 1].pid == v[i].pid) {
      if (v[i].used > v[k - 1].used)
        v[k - 1].used = v[i].used;
      continue;
    }
    v[k++] = v[i];
  }
  return k;
}

int cogpu__nvml_processes(unsigned index, cogpu__gpu_proc_t *procs, size_t max,
                          size_t *n) {
  nvml_device_t dev;
  nvml_plist_t l = {NULL, 0};
  *n = 0;
  int rc = cogpu__nvml_open();
  if (!rc)
    rc = nvml_device(index, &dev);
  if (!rc)
    rc = nvml_procs_list(&nvml.compute, true, index, dev, &l);
  if (!rc && nvml.graphics.fn)
    rc = nvml_procs_list(&nvml.graphics, false, index, dev, &l);
  if (!rc) {
    size_t k = nvml_merge(l.v, l.n);
    if (k > max)
      cogpu__log(COGPU_LOG_DEBUG, "GPU %u: %zu processes, keeping %zu", index,
                 k, max);
    *n = k < max ? k : max;
    if (*n)
      memcpy(procs, l.v, *n * sizeof *procs);
  }
  free(l.v);
  return rc;
}

/* NVML_ERROR_NOT_FOUND: no sample in the window (nothing ran). */
#define NVML_ERROR_NOT_FOUND_ 6

int cogpu__nvml_busy_pids(unsigned index, uint64_t since_us, unsigned *pids,
                          size_t max, size_t *n) {
  nvml_device_t dev;
  *n = 0;
  int rc = cogpu__nvml_open();
  if (rc)
    return rc;
  if (!nvml.util)
    return cogpu__seterr(-ENOTSUP, "this NVML has no "
                                   "nvmlDeviceGetProcessUtilization");
  if ((rc = nvml_device(index, &dev)) != 0)
    return rc;
  unsigned int count = 0;
  nvml_ret_t r = nvml.util(dev, NULL, &count, since_us);
  if (r == NVML_ERROR_NOT_FOUND_ || (r == NVML_SUCCESS && count == 0))
    return 0;
  if (r != NVML_ERROR_INSUFFICIENT_SIZE && r != NVML_SUCCESS)
    return nvml_fail("nvmlDeviceGetProcessUtilization", index, r);
  /* Room for a few more that may start between the two calls. */
  count += 8;
  nvml_util_sample_t *v = calloc(count, sizeof *v);
  if (!v)
    return cogpu__seterr(-ENOMEM, "out of memory");
  r = nvml.util(dev, v, &count, since_us);
  if (r == NVML_ERROR_NOT_FOUND_) {
    free(v);
    return 0;
  }
  if (r != NVML_SUCCESS) {
    free(v);
    return nvml_fail("nvmlDeviceGetProcessUtilization", index, r);
  }
  for (unsigned i = 0; i < count && *n < max; i++)
    if (v[i].sm > 0 || v[i].mem > 0)
      pids[(*n)++] = v[i].pid;
  free(v);
  return 0;
}
