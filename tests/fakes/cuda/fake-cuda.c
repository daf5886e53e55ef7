/*
 * fake-cuda.c: a test double for the CUDA driver, libcuda.so.1, built as
 * BUILD/tests/fakes/libcuda.so.1 and found through LD_LIBRARY_PATH. This
 * file holds initialisation and configuration, fault injection, devices,
 * contexts, streams, modules and launches, error strings, and the table of
 * this process's allocations; memory.c has the memory calls, procaddr.c
 * cuGetProcAddress, state.c the accounting shared between processes,
 * checkpoint.c the process checkpoint API and the entry gate through which
 * every call of a process that another one locked waits.
 *
 * Configuration, read by cuInit (once per process, and again in a forked
 * child, which starts afresh as with a real driver):
 *
 *   FAKE_NVML_GPUS        the GPUs, as for the fake NVML ("16G,8G"; unset:
 *                         one 16G GPU); same names, sizes and UUIDs.
 *   CUDA_VISIBLE_DEVICES  as the real driver reads it: a comma list of
 *                         indices, UUIDs or unique UUID prefixes ("GPU-..."),
 *                         in ordinal order; the list stops at the first
 *                         invalid or repeated entry; empty: no device.
 *   FAKE_CUDA_CTX_BYTES   device memory each context costs (suffixes K, M,
 *                         G, T; default 300M).
 *   FAKE_CUDA_STATE       the state file shared by processes (default
 *                         /tmp/fake-cuda-<uid>.state), see state.c.
 *   FAKE_CUDA_FAIL        fault injection: "ENTRY:N" makes the Nth call of
 *                         that exported entry point in this process return
 *                         CUDA_ERROR_UNKNOWN, with no effect; "ENTRY:N+"
 *                         the Nth and every later call; a "/oom" suffix
 *                         returns CUDA_ERROR_OUT_OF_MEMORY instead (memory
 *                         another process held for a moment: the driver
 *                         refuses what it has a moment later); comma list. Read
 *                         at the process's first call (after a fork, the
 *                         child's first), as is FAKE_CUDA_SLOW.
 *   FAKE_CUDA_EXPLAIN     "1": each refusal for want of memory says on
 *                         stderr who held the GPU's memory and in what state
 *                         each holder's process was (a diagnostic; the test
 *                         runner keeps it in a test's environment).
 *   FAKE_CUDA_SLOW        "ENTRY:MS": every call of that entry point takes
 *                         MS milliseconds more, in flight (a Lock waits for
 *                         it); comma list.
 *   FAKE_CUDA_PRIVATE_ENTRIES  set (to anything): cuGetProcAddress hands
 *                         out private functions, not the exported ones, for
 *                         cuMemAlloc_v2 and cuMemFree_v2 (read at each
 *                         call), as a driver might: an interposer cannot
 *                         recognise them.
 *   FAKE_CUDA_DRIVER_VERSION  what cuDriverGetVersion reports (read at each
 *                         call; default 13000, 2000 to 99999). The entry
 *                         points of later versions are then absent from
 *                         cuGetProcAddress, and below 12080 the checkpoint
 *                         calls return CUDA_ERROR_NOT_SUPPORTED.
 *
 * checkpoint.c reads FAKE_CUDA_KERNEL_MS, FAKE_CUDA_CHECKPOINT and
 * FAKE_CUDA_CKPT_GBPS (described there).
 */
#include <limits.h>
#include <pthread.h>
#include <time.h>

#include "fake-cuda-int.h"

#define FAKE_CTX_STACK 64 /* contexts a thread may push */
#define FAKE_MAX_RULES 32 /* FAKE_CUDA_FAIL entries */

static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;

void fake_lock(void) {
  pthread_mutex_lock(&g_mutex);
}

void fake_unlock(void) {
  pthread_mutex_unlock(&g_mutex);
}

/* --- Configuration -------------------------------------------------------- */

static bool g_ready; /* cuInit succeeded; read without the lock */
static bool g_init_done;
static CUresult g_init_result;

static unsigned g_ngpus; /* GPUs of FAKE_NVML_GPUS, by NVML index */
static uint64_t g_total[FAKE_CUDA_MAX_GPUS];
static char g_label[FAKE_CUDA_MAX_GPUS][32];
static unsigned g_ndev; /* visible devices, by ordinal */
static unsigned g_nvml_of[FAKE_CUDA_MAX_GPUS];
static uint64_t g_ctx_bytes;

bool fake_ready(void) {
  return __atomic_load_n(&g_ready, __ATOMIC_ACQUIRE);
}

/* "16G", "512M", "4096": binary suffixes, as the fake NVML reads them. */
static bool parse_size(const char *s, uint64_t *out) {
  char *end;
  if (*s < '0' || *s > '9')
    return false;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  const char *units = "KMGT";
  const char *u = *end ? strchr(units, *end & ~0x20) : NULL;
  if (u) {
    int shift = 10 * (int)(u - units + 1);
    if (v > (~0ULL >> shift))
      return false;
    v <<= shift;
    end++;
  }
  *out = v;
  return *end == 0 && errno == 0;
}

static bool parse_gpus(void) {
  const char *s = getenv("FAKE_NVML_GPUS");
  g_ngpus = 0;
  if (!s)
    s = "16G";
  while (*s) {
    size_t n = strcspn(s, ",");
    if (g_ngpus == FAKE_CUDA_MAX_GPUS || n == 0 || n >= sizeof g_label[0])
      return false;
    memcpy(g_label[g_ngpus], s, n);
    g_label[g_ngpus][n] = 0;
    if (!parse_size(g_label[g_ngpus], &g_total[g_ngpus]))
      return false;
    g_ngpus++;
    s += n + (s[n] == ',');
  }
  return true;
}

/* The fake NVML's UUID of GPU `nvml`. */
static void uuid_text(unsigned nvml, char *buf, size_t len) {
  snprintf(buf, len, "GPU-fa4e0000-0000-4000-8000-%012x", nvml);
}

/* One CUDA_VISIBLE_DEVICES entry: its NVML index, or -1 if invalid. */
static int visible_entry(const char *tok) {
  size_t len = strlen(tok);
  if (len && strspn(tok, "0123456789") == len) {
    unsigned long v = strtoul(tok, NULL, 10);
    return len < 6 && v < g_ngpus ? (int)v : -1;
  }
  if (strncmp(tok, "GPU-", 4) != 0)
    return -1;
  int match = -1;
  for (unsigned i = 0; i < g_ngpus; i++) {
    char uuid[64];
    uuid_text(i, uuid, sizeof uuid);
    if (strncasecmp(uuid, tok, len) == 0) {
      if (match >= 0)
        return -1; /* ambiguous prefix */
      match = (int)i;
    }
  }
  return match;
}

static void parse_visible(void) {
  const char *s = getenv("CUDA_VISIBLE_DEVICES");
  g_ndev = 0;
  if (!s) {
    for (unsigned i = 0; i < g_ngpus; i++)
      g_nvml_of[g_ndev++] = i;
    return;
  }
  while (*s && g_ndev < FAKE_CUDA_MAX_GPUS) {
    char tok[128];
    size_t n = strcspn(s, ",");
    if (n >= sizeof tok)
      return;
    memcpy(tok, s, n);
    tok[n] = 0;
    /* Surrounding blanks are tolerated. */
    char *t = tok + strspn(tok, " \t");
    for (char *e = t + strlen(t); e > t && (e[-1] == ' ' || e[-1] == '\t');)
      *--e = 0;
    int nvml = visible_entry(t);
    if (nvml < 0)
      return;
    for (unsigned k = 0; k < g_ndev; k++)
      if (g_nvml_of[k] == (unsigned)nvml)
        return; /* a repeated device ends the list, as invalid ones do */
    g_nvml_of[g_ndev++] = (unsigned)nvml;
    s += n + (s[n] == ',');
  }
}

bool fake_device(CUdevice dev, unsigned *nvml) {
  if (!fake_ready() || dev < 0 || (unsigned)dev >= g_ndev)
    return false;
  if (nvml)
    *nvml = g_nvml_of[dev];
  return true;
}

/* --- Fault injection ------------------------------------------------------ */

/* A FAKE_CUDA_FAIL rule (nth > 0), or a FAKE_CUDA_SLOW one (slow_ms > 0). */
typedef struct {
  char entry[64];
  unsigned long nth, calls, slow_ms;
  bool onward;
  CUresult rc; /* what a failing call returns */
} fail_rule_t;

static fail_rule_t g_rules[FAKE_MAX_RULES];
static int g_nrules = -1; /* -1: the variables not read yet */

/* Adds the rules of variable `var`: "ENTRY:N[+][/oom]" (fail) or
 * "ENTRY:MS" (slow). */
static void parse_list(const char *var, bool slow) {
  const char *s = getenv(var);
  while (s && *s && g_nrules < FAKE_MAX_RULES) {
    size_t n = strcspn(s, ",");
    char item[128];
    if (n < sizeof item) {
      memcpy(item, s, n);
      item[n] = 0;
      char *oom = slow ? NULL : strstr(item, "/oom");
      if (oom && oom[4] == 0)
        *oom = 0;
      else
        oom = NULL;
      char *colon = strrchr(item, ':'), *end;
      fail_rule_t *r = &g_rules[g_nrules];
      if (colon && colon - item < (ptrdiff_t)sizeof r->entry) {
        *colon = 0;
        unsigned long v = strtoul(colon + 1, &end, 10);
        bool onward = !slow && *end == '+';
        if (v > 0 && end > colon + 1 && end[onward] == 0) {
          *r = (fail_rule_t){.nth = slow ? 0 : v,
                             .slow_ms = slow ? v : 0,
                             .onward = onward,
                             .rc = oom ? CUDA_ERROR_OUT_OF_MEMORY
                                       : CUDA_ERROR_UNKNOWN};
          memcpy(r->entry, item, (size_t)(colon - item) + 1);
          g_nrules++;
          s += n + (s[n] == ',');
          continue;
        }
      }
    }
    fprintf(stderr, "fake-cuda: ignoring %s entry '%.*s'\n", var, (int)n, s);
    s += n + (s[n] == ',');
  }
}

static void parse_rules(void) {
  g_nrules = 0;
  parse_list("FAKE_CUDA_FAIL", false);
  parse_list("FAKE_CUDA_SLOW", true);
}

CUresult fake_fail_now(const char *entry) {
  CUresult fail = CUDA_SUCCESS;
  unsigned long slow_ms = 0;
  fake_lock();
  if (g_nrules < 0)
    parse_rules();
  for (int i = 0; i < g_nrules; i++) {
    fail_rule_t *r = &g_rules[i];
    if (strcmp(r->entry, entry) != 0)
      continue;
    if (r->slow_ms) {
      slow_ms += r->slow_ms;
    } else {
      r->calls++;
      if (!fail && (r->calls == r->nth || (r->onward && r->calls > r->nth)))
        fail = r->rc;
    }
  }
  fake_unlock();
  /* Past the entry gate: the call is in flight while it takes its time. */
  if (slow_ms && !fail) {
    struct timespec ts = {(time_t)(slow_ms / 1000),
                          (long)(slow_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  return fail;
}

/* --- This process's objects ----------------------------------------------- */

static fake_obj_t *g_objs;
static size_t g_nobjs, g_capobjs;
static uint64_t g_next_handle = 0x10000;

bool fake_obj_add(const fake_obj_t *o) {
  if (g_nobjs == g_capobjs) {
    size_t cap = g_capobjs ? 2 * g_capobjs : 256;
    fake_obj_t *v = realloc(g_objs, cap * sizeof *v);
    if (!v)
      return false;
    g_objs = v;
    g_capobjs = cap;
  }
  g_objs[g_nobjs++] = *o;
  return true;
}

fake_obj_t *fake_obj_find(uint64_t key, unsigned kinds) {
  for (size_t i = 0; i < g_nobjs; i++)
    if (g_objs[i].key == key && (g_objs[i].kind & kinds))
      return &g_objs[i];
  return NULL;
}

fake_obj_t *fake_obj_containing(uint64_t ptr, uint64_t len, unsigned kinds) {
  for (size_t i = 0; i < g_nobjs; i++) {
    fake_obj_t *o = &g_objs[i];
    if ((o->kind & kinds) && o->length && ptr >= o->key &&
        ptr - o->key < o->length && len <= o->length - (ptr - o->key))
      return o;
  }
  return NULL;
}

void fake_obj_release(fake_obj_t *o) {
  if (o->kind == FAKE_MEM_POOL)
    fake_pool_put(o->pool, o->bytes);
  else if (o->bytes)
    fake_state_refund(o->nvml, o->bytes);
  if (o->length)
    munmap((void *)(uintptr_t)o->key, o->length);
  *o = g_objs[--g_nobjs];
}

uint64_t fake_new_handle(void) {
  g_next_handle += 0x10;
  return g_next_handle;
}

void *fake_map(uint64_t bytes, bool low32) {
  if (bytes == 0 || bytes > SIZE_MAX / 2)
    return NULL;
  void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
                     (low32 ? MAP_32BIT : 0),
                 -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* Releases every object a context owns. */
static void release_owned(CUcontext ctx) {
  for (size_t i = g_nobjs; i-- > 0;)
    if (g_objs[i].ctx == ctx)
      fake_obj_release(&g_objs[i]);
}

/* --- Contexts ------------------------------------------------------------- */

static struct CUctx_st g_primary[FAKE_CUDA_MAX_GPUS]; /* by ordinal */
static struct CUctx_st *g_ctxs;                       /* others, alive */
static __thread CUcontext tl_stack[FAKE_CTX_STACK];
static __thread int tl_depth;

static bool ctx_alive(CUcontext c) {
  if (!c)
    return false;
  if (c >= g_primary && c < g_primary + g_ndev)
    return c->refs > 0;
  for (struct CUctx_st *k = g_ctxs; k; k = k->next)
    if (k == c)
      return true;
  return false;
}

CUcontext fake_current(void) {
  CUcontext c = tl_depth ? tl_stack[tl_depth - 1] : NULL;
  return ctx_alive(c) ? c : NULL;
}

/* Takes a context off this thread's stack, wherever it is. */
static void unstack(CUcontext c) {
  int k = 0;
  for (int i = 0; i < tl_depth; i++)
    if (tl_stack[i] != c)
      tl_stack[k++] = tl_stack[i];
  tl_depth = k;
}

static CUresult ctx_create(CUcontext *pctx, CUdevice dev) {
  unsigned nvml;
  if (!pctx)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  struct CUctx_st *c = NULL;
  if (!fake_device(dev, &nvml))
    r = CUDA_ERROR_INVALID_DEVICE;
  else if (tl_depth == FAKE_CTX_STACK)
    r = CUDA_ERROR_UNKNOWN;
  else if (!(c = calloc(1, sizeof *c)))
    r = CUDA_ERROR_OUT_OF_MEMORY;
  else if ((r = fake_state_charge(nvml, g_ctx_bytes)) != CUDA_SUCCESS)
    free(c);
  if (r == CUDA_SUCCESS) {
    *c = (struct CUctx_st){dev, nvml, false, 1, g_ctxs};
    g_ctxs = c;
    tl_stack[tl_depth++] = c;
    *pctx = c;
  }
  fake_unlock();
  return r;
}

static CUresult ctx_destroy(CUcontext ctx) {
  fake_lock();
  struct CUctx_st **pp = &g_ctxs;
  while (*pp && *pp != ctx)
    pp = &(*pp)->next;
  if (!ctx || !*pp) {
    fake_unlock();
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *pp = ctx->next;
  release_owned(ctx);
  fake_state_refund(ctx->nvml, g_ctx_bytes);
  unstack(ctx);
  free(ctx);
  fake_unlock();
  return CUDA_SUCCESS;
}

/* Ends a primary context's life: its objects and its cost go. */
static void primary_deactivate(struct CUctx_st *p) {
  release_owned(p);
  fake_state_refund(p->nvml, g_ctx_bytes);
  p->refs = 0;
}

static CUresult primary_release(CUdevice dev) {
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!fake_device(dev, NULL))
    r = CUDA_ERROR_INVALID_DEVICE;
  else if (g_primary[dev].refs == 1)
    primary_deactivate(&g_primary[dev]);
  else if (g_primary[dev].refs > 1)
    g_primary[dev].refs--;
  /* Releasing an inactive primary context is harmless (it may follow a
   * cuDevicePrimaryCtxReset). */
  fake_unlock();
  return r;
}

static CUresult primary_reset(CUdevice dev) {
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!fake_device(dev, NULL))
    r = CUDA_ERROR_INVALID_DEVICE;
  else if (g_primary[dev].refs > 0)
    primary_deactivate(&g_primary[dev]);
  fake_unlock();
  return r;
}

static CUresult push_current(CUcontext ctx) {
  CUresult r = CUDA_SUCCESS;
  fake_lock();
  if (!ctx_alive(ctx))
    r = CUDA_ERROR_INVALID_CONTEXT;
  else if (tl_depth == FAKE_CTX_STACK)
    r = CUDA_ERROR_UNKNOWN;
  else
    tl_stack[tl_depth++] = ctx;
  fake_unlock();
  return r;
}

static CUresult pop_current(CUcontext *pctx) {
  if (tl_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = tl_stack[--tl_depth];
  if (pctx)
    *pctx = c;
  return CUDA_SUCCESS;
}

/* The device of ctx, or of the current context if ctx is NULL. */
static CUresult ctx_device(CUcontext ctx, CUdevice *device) {
  if (!device)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUcontext c = ctx ? (ctx_alive(ctx) ? ctx : NULL) : fake_current();
  if (c)
    *device = c->ordinal;
  fake_unlock();
  return c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* Waits for the work the process submitted (FAKE_CUDA_KERNEL_MS). */
static CUresult ctx_sync(CUcontext ctx) {
  CUresult r = ctx_device(ctx, &(CUdevice){0});
  if (r == CUDA_SUCCESS)
    fake_work_wait();
  return r;
}

/* --- Fork ----------------------------------------------------------------- */

/* A forked child starts with no CUDA state, as with a real driver: it must
 * call cuInit and make a context of its own. The parent's allocations are
 * the parent's (still charged to it); the child's copies are dropped. */

static unsigned long long g_launches;

static void atfork_prepare(void) {
  fake_lock();
}

static void atfork_parent(void) {
  fake_unlock();
}

static void atfork_child(void) {
  /* Unlock (not re-initialise): the child's only thread held it across the
   * fork, and thread sanitizers track it as held until unlocked. */
  fake_unlock();
  for (size_t i = 0; i < g_nobjs; i++)
    if (g_objs[i].length)
      munmap((void *)(uintptr_t)g_objs[i].key, g_objs[i].length);
  free(g_objs);
  g_objs = NULL;
  g_nobjs = g_capobjs = 0;
  while (g_ctxs) {
    struct CUctx_st *next = g_ctxs->next;
    free(g_ctxs);
    g_ctxs = next;
  }
  memset(g_primary, 0, sizeof g_primary);
  fake_pools_forget();
  fake_graphs_forget();
  fake_state_forget();
  tl_depth = 0;
  g_launches = 0;
  g_nrules = -1;
  g_init_done = false;
  __atomic_store_n(&g_ready, false, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void fake_cuda_setup(void) {
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* --- Initialisation ------------------------------------------------------- */

static CUresult init_locked(void) {
  if (!parse_gpus()) {
    fprintf(stderr, "fake-cuda: bad FAKE_NVML_GPUS '%s'\n",
            getenv("FAKE_NVML_GPUS"));
    return CUDA_ERROR_UNKNOWN;
  }
  const char *cb = getenv("FAKE_CUDA_CTX_BYTES");
  if (!parse_size(cb ? cb : "300M", &g_ctx_bytes)) {
    fprintf(stderr, "fake-cuda: bad FAKE_CUDA_CTX_BYTES '%s'\n", cb);
    return CUDA_ERROR_UNKNOWN;
  }
  parse_visible();
  if (g_ndev == 0)
    return CUDA_ERROR_NO_DEVICE;
  CUresult r = fake_state_open();
  for (unsigned i = 0; r == CUDA_SUCCESS && i < g_ngpus; i++)
    fake_state_set_total(i, g_total[i]);
  if (r == CUDA_SUCCESS)
    r = fake_state_join(g_ndev, g_ngpus);
  for (unsigned o = 0; r == CUDA_SUCCESS && o < g_ndev; o++)
    g_primary[o] = (struct CUctx_st){(int)o, g_nvml_of[o], true, 0, NULL};
  return r;
}

FAKE_API CUresult cuInit(unsigned int Flags) {
  FAKE_ENTER();
  if (Flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  if (!g_init_done) {
    g_init_result = init_locked();
    g_init_done = true;
    if (g_init_result == CUDA_SUCCESS)
      __atomic_store_n(&g_ready, true, __ATOMIC_RELEASE);
  }
  CUresult r = g_init_result;
  fake_unlock();
  return r;
}

int fake_driver_version(void) {
  const char *s = getenv("FAKE_CUDA_DRIVER_VERSION");
  char *end;
  long v = s ? strtol(s, &end, 10) : 13000;
  if (s && (end == s || *end || v < 2000 || v > 99999)) {
    fprintf(stderr, "fake-cuda: bad FAKE_CUDA_DRIVER_VERSION '%s'\n", s);
    v = 13000;
  }
  return (int)v;
}

FAKE_API CUresult cuDriverGetVersion(int *driverVersion) {
  FAKE_ENTER();
  if (!driverVersion)
    return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = fake_driver_version();
  return CUDA_SUCCESS;
}

/* --- Errors --------------------------------------------------------------- */

static const struct {
  CUresult code;
  const char *name, *text;
} g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
     "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED",
     "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
     "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
     "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
     "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE",
     "invalid resource handle"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
     "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED",
     "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
     "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_string(CUresult error, const char **pStr, bool name) {
  if (!pStr)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
    if (g_errors[i].code == error) {
      *pStr = name ? g_errors[i].name : g_errors[i].text;
      return CUDA_SUCCESS;
    }
  *pStr = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult cuGetErrorString(CUresult error, const char **pStr) {
  FAKE_ENTER();
  return error_string(error, pStr, false);
}

FAKE_API CUresult cuGetErrorName(CUresult error, const char **pStr) {
  FAKE_ENTER();
  return error_string(error, pStr, true);
}

FAKE_API const unsigned long long fake_cuda_export_table[8] = {
    sizeof fake_cuda_export_table, 0xfa4ec0da};

FAKE_API CUresult cuGetExportTable(const void **ppExportTable,
                                   const CUuuid *pExportTableId) {
  FAKE_ENTER();
  if (!ppExportTable || !pExportTableId)
    return CUDA_ERROR_INVALID_VALUE;
  *ppExportTable = fake_cuda_export_table;
  return CUDA_SUCCESS;
}

/* --- Devices -------------------------------------------------------------- */

FAKE_API CUresult cuDeviceGetCount(int *count) {
  FAKE_ENTER_INIT();
  if (!count)
    return CUDA_ERROR_INVALID_VALUE;
  *count = (int)g_ndev;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  FAKE_ENTER_INIT();
  if (!device)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(ordinal, NULL))
    return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  unsigned nvml;
  FAKE_ENTER_INIT();
  if (!name || len <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(dev, &nvml))
    return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "Fake GPU %s", g_label[nvml]);
  return CUDA_SUCCESS;
}

/* The 16 bytes of GPU nvml's UUID. */
static void uuid_bytes(unsigned nvml, CUuuid *uuid) {
  char text[64];
  uuid_text(nvml, text, sizeof text);
  /* The 32 hex digits after "GPU-", dashes skipped. */
  int k = 0;
  for (const char *s = text + 4; *s && k < 32; s++) {
    if (*s == '-')
      continue;
    int v = *s <= '9' ? *s - '0' : (*s | 0x20) - 'a' + 10;
    if (k % 2 == 0)
      uuid->bytes[k / 2] = (char)(v << 4);
    else
      uuid->bytes[k / 2] = (char)(uuid->bytes[k / 2] | v);
    k++;
  }
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev) {
  unsigned nvml;
  if (!uuid)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(dev, &nvml))
    return CUDA_ERROR_INVALID_DEVICE;
  uuid_bytes(nvml, uuid);
  return CUDA_SUCCESS;
}

bool fake_uuid_nvml(const CUuuid *u, unsigned *nvml) {
  for (unsigned i = 0; u && fake_ready() && i < g_ngpus; i++) {
    CUuuid v;
    uuid_bytes(i, &v);
    if (memcmp(u->bytes, v.bytes, sizeof v.bytes) == 0) {
      *nvml = i;
      return true;
    }
  }
  return false;
}

FAKE_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  FAKE_ENTER_INIT();
  return device_uuid(uuid, dev);
}

FAKE_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  FAKE_ENTER_INIT();
  return device_uuid(uuid, dev);
}

FAKE_API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
  unsigned nvml;
  FAKE_ENTER_INIT();
  if (!bytes)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(dev, &nvml))
    return CUDA_ERROR_INVALID_DEVICE;
  *bytes = g_total[nvml] > UINT_MAX ? UINT_MAX : (unsigned)g_total[nvml];
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  unsigned nvml;
  FAKE_ENTER_INIT();
  if (!bytes)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(dev, &nvml))
    return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)g_total[nvml];
  return CUDA_SUCCESS;
}

/* CUdevice_attribute values answered with something other than 0: those of
 * an H100-like device. */
static const struct {
  int attrib, value;
} g_attributes[] = {
    {1, 1024},      /* MAX_THREADS_PER_BLOCK */
    {2, 1024},      /* MAX_BLOCK_DIM_X */
    {3, 1024},      /* MAX_BLOCK_DIM_Y */
    {4, 64},        /* MAX_BLOCK_DIM_Z */
    {5, INT_MAX},   /* MAX_GRID_DIM_X */
    {6, 65535},     /* MAX_GRID_DIM_Y */
    {7, 65535},     /* MAX_GRID_DIM_Z */
    {8, 49152},     /* MAX_SHARED_MEMORY_PER_BLOCK */
    {9, 65536},     /* TOTAL_CONSTANT_MEMORY */
    {10, 32},       /* WARP_SIZE */
    {12, 65536},    /* MAX_REGISTERS_PER_BLOCK */
    {13, 1980000},  /* CLOCK_RATE (kHz) */
    {16, 132},      /* MULTIPROCESSOR_COUNT */
    {19, 1},        /* CAN_MAP_HOST_MEMORY */
    {31, 1},        /* CONCURRENT_KERNELS */
    {32, 1},        /* ECC_ENABLED */
    {36, 2619000},  /* MEMORY_CLOCK_RATE (kHz) */
    {37, 5120},     /* GLOBAL_MEMORY_BUS_WIDTH */
    {38, 52428800}, /* L2_CACHE_SIZE */
    {39, 2048},     /* MAX_THREADS_PER_MULTIPROCESSOR */
    {40, 3},        /* ASYNC_ENGINE_COUNT */
    {41, 1},        /* UNIFIED_ADDRESSING */
    {75, 9},        /* COMPUTE_CAPABILITY_MAJOR */
    {76, 0},        /* COMPUTE_CAPABILITY_MINOR */
    {81, 233472},   /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    {83, 1},        /* MANAGED_MEMORY */
    {89, 1},        /* CONCURRENT_MANAGED_ACCESS */
    {97, 232448},   /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    {102, 1},       /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    {115, 1},       /* MEMORY_POOLS_SUPPORTED */
};
#define FAKE_ATTR_PCI_BUS_ID 33

FAKE_API CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev) {
  unsigned nvml;
  FAKE_ENTER_INIT();
  if (!pi)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(dev, &nvml))
    return CUDA_ERROR_INVALID_DEVICE;
  *pi = 0;
  if (attrib == FAKE_ATTR_PCI_BUS_ID)
    *pi = (int)nvml;
  for (size_t i = 0; i < sizeof g_attributes / sizeof g_attributes[0]; i++)
    if (g_attributes[i].attrib == attrib)
      *pi = g_attributes[i].value;
  return CUDA_SUCCESS;
}

/* --- Contexts ------------------------------------------------------------- */

FAKE_API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags,
                              CUdevice dev) {
  FAKE_ENTER_INIT();
  (void)flags;
  return ctx_create(pctx, dev);
}

FAKE_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags,
                                 CUdevice dev) {
  FAKE_ENTER_INIT();
  (void)flags;
  return ctx_create(pctx, dev);
}

FAKE_API CUresult cuCtxCreate_v3(CUcontext *pctx,
                                 struct CUexecAffinityParam_st *paramsArray,
                                 int numParams, unsigned int flags,
                                 CUdevice dev) {
  FAKE_ENTER_INIT();
  (void)paramsArray;
  (void)numParams;
  (void)flags;
  return ctx_create(pctx, dev);
}

FAKE_API CUresult cuCtxCreate_v4(CUcontext *pctx,
                                 struct CUctxCreateParams_st *ctxCreateParams,
                                 unsigned int flags, CUdevice dev) {
  FAKE_ENTER_INIT();
  (void)ctxCreateParams;
  (void)flags;
  return ctx_create(pctx, dev);
}

FAKE_API CUresult cuCtxDestroy(CUcontext ctx) {
  FAKE_ENTER_INIT();
  return ctx_destroy(ctx);
}

FAKE_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  FAKE_ENTER_INIT();
  return ctx_destroy(ctx);
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  unsigned nvml;
  FAKE_ENTER_INIT();
  if (!pctx)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!fake_device(dev, &nvml))
    r = CUDA_ERROR_INVALID_DEVICE;
  else if (g_primary[dev].refs == 0)
    r = fake_state_charge(nvml, g_ctx_bytes);
  if (r == CUDA_SUCCESS) {
    g_primary[dev].refs++;
    *pctx = &g_primary[dev];
  }
  fake_unlock();
  return r;
}

FAKE_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  FAKE_ENTER_INIT();
  return primary_release(dev);
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FAKE_ENTER_INIT();
  return primary_release(dev);
}

FAKE_API CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  FAKE_ENTER_INIT();
  return primary_reset(dev);
}

FAKE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  FAKE_ENTER_INIT();
  return primary_reset(dev);
}

FAKE_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKE_ENTER_INIT();
  CUresult r = CUDA_SUCCESS;
  fake_lock();
  if (!ctx) {
    if (tl_depth > 0)
      tl_depth--;
  } else if (!ctx_alive(ctx)) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else if (tl_depth == 0) {
    tl_stack[tl_depth++] = ctx;
  } else {
    tl_stack[tl_depth - 1] = ctx;
  }
  fake_unlock();
  return r;
}

FAKE_API CUresult cuCtxGetCurrent(CUcontext *pctx) {
  FAKE_ENTER_INIT();
  if (!pctx)
    return CUDA_ERROR_INVALID_VALUE;
  *pctx = tl_depth ? tl_stack[tl_depth - 1] : NULL;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxGetDevice(CUdevice *device) {
  FAKE_ENTER_INIT();
  return ctx_device(NULL, device);
}

FAKE_API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
  FAKE_ENTER_INIT();
  return ctx_device(ctx, device);
}

FAKE_API CUresult cuCtxPushCurrent(CUcontext ctx) {
  FAKE_ENTER_INIT();
  return push_current(ctx);
}

FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FAKE_ENTER_INIT();
  return push_current(ctx);
}

FAKE_API CUresult cuCtxPopCurrent(CUcontext *pctx) {
  FAKE_ENTER_INIT();
  return pop_current(pctx);
}

FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
  FAKE_ENTER_INIT();
  return pop_current(pctx);
}

FAKE_API CUresult cuCtxSynchronize(void) {
  FAKE_ENTER_INIT();
  return ctx_sync(NULL);
}

FAKE_API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  FAKE_ENTER_INIT();
  return ctx_sync(ctx);
}

/* --- Streams -------------------------------------------------------------- */

#define FAKE_STREAM_LEGACY ((CUstream)0x1)     /* CU_STREAM_LEGACY */
#define FAKE_STREAM_PER_THREAD ((CUstream)0x2) /* CU_STREAM_PER_THREAD */

CUresult fake_stream_ctx(CUstream stream, CUcontext *ctx) {
  if (!stream || stream == FAKE_STREAM_LEGACY ||
      stream == FAKE_STREAM_PER_THREAD) {
    *ctx = fake_current();
    return *ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  }
  fake_obj_t *o = fake_obj_find((uint64_t)(uintptr_t)stream, FAKE_OBJ_STREAM);
  if (!o)
    return CUDA_ERROR_INVALID_HANDLE;
  *ctx = o->ctx;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  FAKE_ENTER_INIT();
  (void)Flags;
  if (!phStream)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_SUCCESS;
  fake_lock();
  CUcontext c = fake_current();
  if (!c) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else {
    fake_obj_t o = {.key = fake_new_handle(),
                    .kind = FAKE_OBJ_STREAM,
                    .nvml = c->nvml,
                    .ctx = c};
    if (!fake_obj_add(&o))
      r = CUDA_ERROR_OUT_OF_MEMORY;
    else
      *phStream = (CUstream)(uintptr_t)o.key;
  }
  fake_unlock();
  return r;
}

static CUresult stream_destroy(CUstream hStream) {
  fake_lock();
  fake_obj_t *o = fake_obj_find((uint64_t)(uintptr_t)hStream, FAKE_OBJ_STREAM);
  if (o)
    fake_obj_release(o);
  fake_unlock();
  return o ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FAKE_API CUresult cuStreamDestroy(CUstream hStream) {
  FAKE_ENTER_INIT();
  return stream_destroy(hStream);
}

FAKE_API CUresult cuStreamDestroy_v2(CUstream hStream) {
  FAKE_ENTER_INIT();
  return stream_destroy(hStream);
}

static CUresult stream_sync(CUstream hStream) {
  CUcontext c;
  fake_lock();
  CUresult r = fake_stream_ctx(hStream, &c);
  fake_unlock();
  if (r == CUDA_SUCCESS)
    fake_work_wait();
  return r;
}

FAKE_API CUresult cuStreamSynchronize(CUstream hStream) {
  FAKE_ENTER_INIT();
  return stream_sync(hStream);
}

FAKE_API CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  FAKE_ENTER_INIT();
  return stream_sync(hStream);
}

/* --- Modules and launches ------------------------------------------------- */

static struct CUmod_st { char tag; } g_module;
static struct CUfunc_st { char tag; } g_function;

FAKE_API CUresult cuModuleLoadData(fake_CUmodule *module, const void *image) {
  FAKE_ENTER_INIT();
  if (!module || !image)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUcontext c = fake_current();
  fake_unlock();
  if (!c)
    return CUDA_ERROR_INVALID_CONTEXT;
  *module = &g_module;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuModuleUnload(fake_CUmodule hmod) {
  FAKE_ENTER_INIT();
  return hmod == &g_module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FAKE_API CUresult cuModuleGetFunction(CUfunction *hfunc, fake_CUmodule hmod,
                                      const char *name) {
  FAKE_ENTER_INIT();
  if (!hfunc || !name)
    return CUDA_ERROR_INVALID_VALUE;
  if (hmod != &g_module)
    return CUDA_ERROR_INVALID_HANDLE;
  *hfunc = &g_function;
  return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, CUstream hStream) {
  CUcontext c;
  if (!f)
    return CUDA_ERROR_INVALID_HANDLE;
  fake_lock();
  CUresult r = fake_stream_ctx(hStream, &c);
  if (r == CUDA_SUCCESS)
    fake_work_launched(c->nvml);
  fake_unlock();
  if (r == CUDA_SUCCESS)
    __atomic_add_fetch(&g_launches, 1, __ATOMIC_RELAXED);
  return r;
}

FAKE_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                                 unsigned int gridDimY, unsigned int gridDimZ,
                                 unsigned int blockDimX, unsigned int blockDimY,
                                 unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, CUstream hStream,
                                 void **kernelParams, void **extra) {
  FAKE_ENTER_INIT();
  (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX;
  (void)blockDimY, (void)blockDimZ, (void)sharedMemBytes;
  (void)kernelParams, (void)extra;
  return launch(f, hStream);
}

FAKE_API CUresult cuLaunchKernel_ptsz(
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
    void **kernelParams, void **extra) {
  FAKE_ENTER_INIT();
  (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX;
  (void)blockDimY, (void)blockDimZ, (void)sharedMemBytes;
  (void)kernelParams, (void)extra;
  return launch(f, hStream);
}

FAKE_API unsigned long long fake_cuda_launch_count(void) {
  return __atomic_load_n(&g_launches, __ATOMIC_RELAXED);
}
