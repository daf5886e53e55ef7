/*
 * fake-nvml.c: a test double for libnvidia-ml.so.1, built as
 * BUILD/tests/fakes/libnvidia-ml.so.1 and found through LD_LIBRARY_PATH. It
 * exports the NVML calls cogpu makes, with their real signatures and
 * calling conventions, and describes GPUs and processes from the
 * environment, read at every call so that a test can change it on the fly:
 *
 *   FAKE_NVML_GPUS   comma-separated memory sizes, one per GPU ("80G,40G";
 *                    suffixes K, M, G, T are binary). Unset: one 16G GPU.
 *   FAKE_NVML_PROCS  file re-read at every process query: lines
 *                    "INDEX PID BYTES [compute|graphics|both]" (BYTES may
 *                    take a suffix, or be NA for "not available"); blank
 *                    lines and # comments are ignored. Missing: no process.
 *                    A GPU's used memory is the sum of its processes.
 *   FAKE_NVML_FAIL   comma list of failures: init (nvmlInit: driver not
 *                    loaded), count (nvmlDeviceGetCount: unknown error),
 *                    procs (process queries: unknown error), zero (no GPU).
 *   FAKE_NVML_CALLS  file to which nvmlInit and every process query append
 *                    one line with their name.
 *   FAKE_CUDA_STATE  the fake libcuda.so.1's state file (tests/fakes/cuda):
 *                    if it exists, every live process holding fake CUDA
 *                    memory on a GPU is also one of its compute processes
 *                    (its bytes added to a FAKE_NVML_PROCS line of the same
 *                    pid), and counts in the GPU's used memory. A process
 *                    checkpointed by cuCheckpointProcessCheckpoint holds
 *                    nothing on the GPU, so it is not listed, as with the
 *                    real driver.
 *
 * nvmlDeviceGetProcessUtilization reports the fake CUDA processes only (no
 * FAKE_NVML_PROCS line has any work): one sample per process whose latest
 * busy period on the GPU (each kernel launch keeps it busy
 * FAKE_CUDA_KERNEL_MS, see tests/fakes/cuda/checkpoint.c; an instant
 * kernel still counts) ends after lastSeenTimeStamp. Its timeStamp is the
 * end of that period, or now if it is still busy; smUtil the percentage of
 * the last second (or of the time since lastSeenTimeStamp, if shorter) it
 * was busy, at least 1; memUtil the same; encUtil and decUtil 0. FAKE_NVML_FAIL
 * "util" makes it fail with NVML_ERROR_UNKNOWN. Copies and memsets are not
 * work.
 */
#include <ctype.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../cuda/fake-cuda-state.h"

#define FAKE_API __attribute__((visibility("default")))

/* --- The NVML ABI, as nvml.h declares it ------------------------------ */

typedef enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
  unsigned int pid;
  unsigned long long timeStamp; /* CPU time, microseconds since the epoch */
  unsigned int smUtil;
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)

FAKE_API nvmlReturn_t nvmlInit_v2(void);
FAKE_API nvmlReturn_t nvmlInit(void);
FAKE_API nvmlReturn_t nvmlShutdown(void);
FAKE_API const char *nvmlErrorString(nvmlReturn_t result);
FAKE_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
FAKE_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount);
FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                    nvmlDevice_t *device);
FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index,
                                                 nvmlDevice_t *device);
FAKE_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid,
                                        unsigned int length);
FAKE_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name,
                                        unsigned int length);
FAKE_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device,
                                              nvmlMemory_t *memory);
FAKE_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos);
FAKE_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos);
FAKE_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos);
FAKE_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos);
FAKE_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos);
FAKE_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos);
FAKE_API nvmlReturn_t nvmlDeviceGetProcessUtilization(
    nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
    unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp);

/* --- Configuration ------------------------------------------------------ */

#define FAKE_MAX_GPUS 64

/* Handles point into this array; the struct is opaque to callers. */
struct nvmlDevice_st {
  char tag;
};
static struct nvmlDevice_st fake_devices[FAKE_MAX_GPUS];
static int fake_inits; /* nvmlInit minus nvmlShutdown calls */

typedef struct {
  unsigned count;
  unsigned long long size[FAKE_MAX_GPUS];
  char label[FAKE_MAX_GPUS][32]; /* the size as written, for the name */
} fake_gpus_t;

enum { FAKE_COMPUTE = 1, FAKE_GRAPHICS = 2 };

typedef struct {
  unsigned index, pid;
  unsigned long long bytes;
  int kinds;
} fake_proc_t;

static bool fake_failing(const char *what) {
  const char *s = getenv("FAKE_NVML_FAIL");
  size_t len = strlen(what);
  while (s && *s) {
    size_t n = strcspn(s, ",");
    if (n == len && strncmp(s, what, n) == 0)
      return true;
    s += n + (s[n] == ',');
  }
  return false;
}

static void fake_record(const char *call) {
  const char *path = getenv("FAKE_NVML_CALLS");
  if (!path || !*path)
    return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return;
  char line[128];
  int n = snprintf(line, sizeof line, "%s\n", call);
  /* One write per line, so concurrent processes do not interleave. */
  if (write(fd, line, (size_t)n) < 0) {
  }
  close(fd);
}

/* "16G", "512M", "4096": binary suffixes; false on anything else. */
static bool fake_parse_size(const char *s, unsigned long long *out) {
  char *end;
  if (!isdigit((unsigned char)*s))
    return false;
  unsigned long long v = strtoull(s, &end, 10);
  const char *units = "KMGT";
  const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
  if (u) {
    v <<= 10 * (u - units + 1);
    end++;
  }
  *out = v;
  return *end == 0;
}

static bool fake_gpus(fake_gpus_t *g) {
  const char *s = getenv("FAKE_NVML_GPUS");
  g->count = 0;
  if (fake_failing("zero"))
    return true;
  if (!s)
    s = "16G";
  while (*s) {
    size_t n = strcspn(s, ",");
    if (g->count == FAKE_MAX_GPUS || n == 0 || n >= sizeof g->label[0])
      return false;
    char *label = g->label[g->count];
    memcpy(label, s, n);
    label[n] = 0;
    if (!fake_parse_size(label, &g->size[g->count++]))
      return false;
    s += n + (s[n] == ',');
  }
  return true;
}

static bool fake_gpus_or_complain(fake_gpus_t *g) {
  if (fake_gpus(g))
    return true;
  fprintf(stderr, "fake-nvml: bad FAKE_NVML_GPUS '%s'\n",
          getenv("FAKE_NVML_GPUS"));
  return false;
}

static int fake_kinds(const char *s) {
  if (!*s || strcmp(s, "compute") == 0)
    return FAKE_COMPUTE;
  if (strcmp(s, "graphics") == 0)
    return FAKE_GRAPHICS;
  if (strcmp(s, "both") == 0)
    return FAKE_COMPUTE | FAKE_GRAPHICS;
  return 0;
}

static bool fake_parse_proc(const char *line, fake_proc_t *p) {
  char bytes[64], kind[16] = "";
  int k = sscanf(line, "%u %u %63s %15s", &p->index, &p->pid, bytes, kind);
  if (k < 3)
    return false;
  p->kinds = fake_kinds(kind);
  if (strcmp(bytes, "NA") == 0) {
    p->bytes = NVML_VALUE_NOT_AVAILABLE_ULL;
    return p->kinds != 0;
  }
  return p->kinds != 0 && fake_parse_size(bytes, &p->bytes);
}

/* Appends p to the malloc'd array (*out, *n) of capacity *cap. */
static bool fake_push_proc(fake_proc_t **out, size_t *n, size_t *cap,
                           const fake_proc_t *p) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 64;
    fake_proc_t *v = realloc(*out, c * sizeof *v);
    if (!v)
      return false;
    *out = v;
    *cap = c;
  }
  (*out)[(*n)++] = *p;
  return true;
}

/* Merges the live processes of the fake CUDA state (FAKE_CUDA_STATE) that
 * hold memory on GPU `index`, as compute processes: a pid already listed
 * as a compute process gets the bytes added. */
static bool fake_cuda_procs(unsigned index, fake_proc_t **out, size_t *n,
                            size_t *cap) {
  const char *path = getenv("FAKE_CUDA_STATE");
  const fake_cuda_state_t *st = path && *path && index < FAKE_CUDA_MAX_GPUS
                                    ? fake_cuda_state_map_ro(path)
                                    : NULL;
  bool ok = true;
  for (int i = 0; st && ok && i < FAKE_CUDA_MAX_PROCS; i++) {
    const fake_cuda_proc_state_t *e = &st->proc[i];
    int pid = __atomic_load_n(&e->pid, __ATOMIC_ACQUIRE);
    uint64_t used = __atomic_load_n(&e->used[index], __ATOMIC_ACQUIRE);
    if (pid <= 0 || used == 0 || !fake_cuda_entry_alive(e))
      continue;
    size_t k = 0;
    while (k < *n && !((*out)[k].pid == (unsigned)pid &&
                       ((*out)[k].kinds & FAKE_COMPUTE)))
      k++;
    if (k == *n) {
      fake_proc_t p = {index, (unsigned)pid, used, FAKE_COMPUTE};
      ok = fake_push_proc(out, n, cap, &p);
    } else if ((*out)[k].bytes != NVML_VALUE_NOT_AVAILABLE_ULL) {
      (*out)[k].bytes += used;
    }
  }
  if (st)
    munmap((void *)st, sizeof *st);
  return ok;
}

/* The processes of GPU `index` that have one of `kinds`, into a malloc'd
 * array (*out, *n). False on an unreadable line. */
static bool fake_procs(unsigned index, int kinds, fake_proc_t **out,
                       size_t *n) {
  const char *path = getenv("FAKE_NVML_PROCS");
  *out = NULL;
  *n = 0;
  FILE *f = path ? fopen(path, "re") : NULL;
  char line[512];
  bool ok = true;
  size_t cap = 0;
  while (ok && f && fgets(line, sizeof line, f)) {
    const char *s = line + strspn(line, " \t");
    fake_proc_t p;
    if (*s == '#' || *s == '\n' || *s == 0)
      continue;
    if (!(ok = fake_parse_proc(s, &p)))
      fprintf(stderr, "fake-nvml: bad line in %s: %s", path, line);
    else if (p.index == index && (p.kinds & kinds))
      ok = fake_push_proc(out, n, &cap, &p);
  }
  if (f)
    fclose(f);
  if (ok && (kinds & FAKE_COMPUTE))
    ok = fake_cuda_procs(index, out, n, &cap);
  if (!ok) {
    free(*out);
    *out = NULL;
    *n = 0;
  }
  return ok;
}

/* --- Initialisation and errors ------------------------------------------ */

FAKE_API nvmlReturn_t nvmlInit_v2(void) {
  fake_record("nvmlInit_v2");
  if (fake_failing("init"))
    return NVML_ERROR_DRIVER_NOT_LOADED;
  __atomic_add_fetch(&fake_inits, 1, __ATOMIC_SEQ_CST);
  return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlInit(void) {
  return nvmlInit_v2();
}

FAKE_API nvmlReturn_t nvmlShutdown(void) {
  int n = __atomic_load_n(&fake_inits, __ATOMIC_SEQ_CST);
  while (n > 0 &&
         !__atomic_compare_exchange_n(&fake_inits, &n, n - 1, false,
                                      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return n > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

FAKE_API const char *nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
  case NVML_SUCCESS:
    return "Success";
  case NVML_ERROR_UNINITIALIZED:
    return "Uninitialized";
  case NVML_ERROR_INVALID_ARGUMENT:
    return "Invalid Argument";
  case NVML_ERROR_NOT_SUPPORTED:
    return "Not Supported";
  case NVML_ERROR_NOT_FOUND:
    return "Not Found";
  case NVML_ERROR_INSUFFICIENT_SIZE:
    return "Insufficient Size";
  case NVML_ERROR_DRIVER_NOT_LOADED:
    return "Driver Not Loaded";
  default:
    return "Unknown Error";
  }
}

static bool fake_ready(void) {
  return __atomic_load_n(&fake_inits, __ATOMIC_SEQ_CST) > 0;
}

/* --- Devices ------------------------------------------------------------ */

FAKE_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
  fake_gpus_t g;
  if (!fake_ready())
    return NVML_ERROR_UNINITIALIZED;
  if (!deviceCount)
    return NVML_ERROR_INVALID_ARGUMENT;
  if (fake_failing("count") || !fake_gpus_or_complain(&g))
    return NVML_ERROR_UNKNOWN;
  *deviceCount = g.count;
  return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
  return nvmlDeviceGetCount_v2(deviceCount);
}

FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                    nvmlDevice_t *device) {
  fake_gpus_t g;
  if (!fake_ready())
    return NVML_ERROR_UNINITIALIZED;
  if (!fake_gpus_or_complain(&g))
    return NVML_ERROR_UNKNOWN;
  if (!device || index >= g.count)
    return NVML_ERROR_INVALID_ARGUMENT;
  *device = &fake_devices[index];
  return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index,
                                                 nvmlDevice_t *device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* The GPU behind a handle, with the configuration; false if invalid. */
static bool fake_device(nvmlDevice_t device, fake_gpus_t *g, unsigned *index) {
  if (!fake_ready() || device < fake_devices ||
      device >= fake_devices + FAKE_MAX_GPUS || !fake_gpus_or_complain(g))
    return false;
  *index = (unsigned)(device - fake_devices);
  return *index < g->count;
}

static nvmlReturn_t fake_copy(char *dst, unsigned int length, const char *src) {
  if (!dst)
    return NVML_ERROR_INVALID_ARGUMENT;
  if (strlen(src) + 1 > length)
    return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(dst, src, strlen(src) + 1);
  return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid,
                                        unsigned int length) {
  fake_gpus_t g;
  unsigned i;
  char buf[96];
  if (!fake_device(device, &g, &i))
    return NVML_ERROR_INVALID_ARGUMENT;
  snprintf(buf, sizeof buf, "GPU-fa4e0000-0000-4000-8000-%012x", i);
  return fake_copy(uuid, length, buf);
}

FAKE_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name,
                                        unsigned int length) {
  fake_gpus_t g;
  unsigned i;
  char buf[96];
  if (!fake_device(device, &g, &i))
    return NVML_ERROR_INVALID_ARGUMENT;
  snprintf(buf, sizeof buf, "Fake GPU %s", g.label[i]);
  return fake_copy(name, length, buf);
}

FAKE_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device,
                                              nvmlMemory_t *memory) {
  fake_gpus_t g;
  unsigned i;
  fake_proc_t *p;
  size_t n;
  if (!memory || !fake_device(device, &g, &i))
    return NVML_ERROR_INVALID_ARGUMENT;
  if (!fake_procs(i, FAKE_COMPUTE | FAKE_GRAPHICS, &p, &n))
    return NVML_ERROR_UNKNOWN;
  unsigned long long used = 0;
  for (size_t k = 0; k < n; k++)
    if (p[k].bytes != NVML_VALUE_NOT_AVAILABLE_ULL)
      used += p[k].bytes;
  free(p);
  memory->total = g.size[i];
  memory->used = used < g.size[i] ? used : g.size[i];
  memory->free = memory->total - memory->used;
  return NVML_SUCCESS;
}

/* --- Processes ---------------------------------------------------------- */

/* One process query, with NVML's conventions: *infoCount in is the room in
 * infos, out the number written, or the number needed with
 * INSUFFICIENT_SIZE (a zero count with NULL infos asks for it). The entry
 * layout (v1 or v2) is the caller's `entry` size. */
static nvmlReturn_t fake_query(const char *call, int kinds, nvmlDevice_t device,
                               unsigned int *infoCount, void *infos,
                               size_t entry) {
  fake_gpus_t g;
  unsigned i;
  fake_proc_t *p;
  size_t n;
  fake_record(call);
  if (!infoCount || !fake_device(device, &g, &i))
    return NVML_ERROR_INVALID_ARGUMENT;
  if (fake_failing("procs") || !fake_procs(i, kinds, &p, &n))
    return NVML_ERROR_UNKNOWN;
  nvmlReturn_t r = NVML_SUCCESS;
  if (n > *infoCount)
    r = NVML_ERROR_INSUFFICIENT_SIZE;
  else if (n && !infos)
    r = NVML_ERROR_INVALID_ARGUMENT;
  for (size_t k = 0; r == NVML_SUCCESS && k < n; k++) {
    nvmlProcessInfo_v2_t e = {p[k].pid, p[k].bytes, ~0u, ~0u};
    memcpy((char *)infos + k * entry, &e, entry);
  }
  if (r != NVML_ERROR_INVALID_ARGUMENT)
    *infoCount = (unsigned)n;
  free(p);
  return r;
}

#define FAKE_QUERY(kinds, entry)                                               \
  fake_query(__func__, kinds, device, infoCount, infos, sizeof(entry))

FAKE_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos) {
  return FAKE_QUERY(FAKE_COMPUTE, nvmlProcessInfo_v2_t);
}

FAKE_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos) {
  return FAKE_QUERY(FAKE_COMPUTE, nvmlProcessInfo_v2_t);
}

FAKE_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos) {
  return FAKE_QUERY(FAKE_COMPUTE, nvmlProcessInfo_v1_t);
}

FAKE_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos) {
  return FAKE_QUERY(FAKE_GRAPHICS, nvmlProcessInfo_v2_t);
}

FAKE_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos) {
  return FAKE_QUERY(FAKE_GRAPHICS, nvmlProcessInfo_v2_t);
}

FAKE_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(
    nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos) {
  return FAKE_QUERY(FAKE_GRAPHICS, nvmlProcessInfo_v1_t);
}

/* --- Utilisation -------------------------------------------------------- */

/* The samples of GPU `index` after `since` (see the top of this file), at
 * most `max` of them into out (NULL: just count); the number there are. */
static unsigned fake_util_samples(unsigned index, unsigned long long since,
                                  nvmlProcessUtilizationSample_t *out,
                                  unsigned max) {
  const char *path = getenv("FAKE_CUDA_STATE");
  const fake_cuda_state_t *st = path && *path && index < FAKE_CUDA_MAX_GPUS
                                    ? fake_cuda_state_map_ro(path)
                                    : NULL;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long now = (unsigned long long)ts.tv_sec * 1000000ull +
                           (unsigned long long)ts.tv_nsec / 1000;
  /* The period smUtil measures: the last second, or less. */
  unsigned long long lo = now > 1000000 ? now - 1000000 : 0;
  if (since > lo)
    lo = since;
  unsigned n = 0;
  for (int i = 0; st && i < FAKE_CUDA_MAX_PROCS; i++) {
    const fake_cuda_proc_state_t *e = &st->proc[i];
    int pid = __atomic_load_n(&e->pid, __ATOMIC_ACQUIRE);
    unsigned long long from =
        __atomic_load_n(&e->work_from_us[index], __ATOMIC_ACQUIRE);
    unsigned long long until =
        __atomic_load_n(&e->work_until_us[index], __ATOMIC_ACQUIRE);
    if (pid <= 0 || until == 0 || until <= since || from > now ||
        !fake_cuda_entry_alive(e))
      continue;
    unsigned long long end = until < now ? until : now;
    unsigned long long start = from > lo ? from : lo;
    unsigned util = 1;
    if (now > lo && end > start)
      util = (unsigned)((100 * (end - start) + (now - lo) - 1) / (now - lo));
    util = util < 1 ? 1 : util > 100 ? 100 : util;
    if (out && n < max)
      out[n] = (nvmlProcessUtilizationSample_t){(unsigned)pid, end, util,
                                                util,          0,   0};
    n++;
  }
  if (st)
    munmap((void *)st, sizeof *st);
  return n;
}

/* NVML's protocol: NVML_ERROR_NOT_FOUND when no process has a sample since
 * lastSeenTimeStamp; with utilization NULL, or *processSamplesCount too
 * small, NVML_ERROR_INSUFFICIENT_SIZE and the count needed. */
FAKE_API nvmlReturn_t nvmlDeviceGetProcessUtilization(
    nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
    unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp) {
  fake_gpus_t g;
  unsigned i;
  fake_record(__func__);
  if (!processSamplesCount || !fake_device(device, &g, &i))
    return NVML_ERROR_INVALID_ARGUMENT;
  if (fake_failing("util"))
    return NVML_ERROR_UNKNOWN;
  unsigned room = utilization ? *processSamplesCount : 0;
  unsigned n = fake_util_samples(i, lastSeenTimeStamp, utilization, room);
  if (n == 0)
    return NVML_ERROR_NOT_FOUND;
  *processSamplesCount = n;
  return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
