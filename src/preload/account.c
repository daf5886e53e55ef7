/*
 * account.c: a process's GPU memory, counted against its job's reservation
 * in the node ledger.
 *
 * Per CUDA device the process keeps `used` (what its allocations hold) and
 * `reserved` (what it may use). A process of a job (cogpu run, Slurm) grows
 * first by claiming what the job holds and none of its other processes has
 * taken (`base`), and only then by growing the job; so processes running at
 * once share the job's reservation, and what one frees goes back to the
 * job for the others. An allocation adds to `used`; while that stays
 * within `reserved` it costs one atomic add, no lock and no system call.
 * Beyond it the reservation grows through the ledger: in reserve mode (mem
 * set) only if memory is free now (or waiting, with grow_wait), otherwise
 * out-of-memory; on demand, waiting in the node's queue per its policy.
 * Frees shrink an on-demand reservation again once more than two grow_steps
 * are spare, down to one.
 *
 * Nothing here may crash or stop the application: when the ledger cannot
 * be used, the process runs unaccounted, and says so once.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "nvml/nvml.h"
#include "preload/preload-int.h"
#include "preload/table.h"

#define PL_MAX_DEVS 64
#define PL_MAX_POOLS 256

enum { DEV_UNKNOWN = 0, DEV_ACCOUNTED, DEV_UNACCOUNTED };

typedef struct pl_dev_s {
  _Atomic int state;
  int gpu; /* ledger index */
  _Atomic int64_t used;
  _Atomic int64_t reserved;
  uint64_t base;                 /* part of reserved claimed from the job */
  _Atomic uint32_t primary_refs; /* primary context retains */
  _Atomic int shrink_pending;    /* a free found mu taken: shrink at unlock */
  _Atomic int grow_pending;      /* an adjustment found mu taken: grow then */
  /* At most one thread waits in the ledger for this device, without mu;
   * other growers wait on cv for its answer (wait_rc, per wait_gen). */
  bool waiting;
  unsigned wait_gen;
  int wait_rc;
  pthread_cond_t cv;
  _Atomic uint64_t graph; /* the graph allocator's footprint, charged */
  pthread_mutex_t mu;     /* mapping, growing, shrinking */
} pl_dev_t;

typedef struct pl_pool_s {
  CUmemoryPool pool;
  CUdevice dev;
  uint64_t accounted; /* the pool's reserved footprint, as last charged */
} pl_pool_t;

static pl_dev_t pl_devs[PL_MAX_DEVS];
static pl_pool_t pl_pools[PL_MAX_POOLS];
static size_t pl_npools;
static pthread_mutex_t pl_pool_mu = PTHREAD_MUTEX_INITIALIZER;

static pthread_mutex_t pl_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int pl_attached; /* 0 not tried, 1 attached, 2 unaccounted */
static cogpu_t *pl_h;
static bool
    pl_member; /* joined a job, which took `mem` for all its processes */
static cogpu__config_t pl_cfg;
static pl_table_t pl_tables[4]; /* pointers, VMM handles, arrays, contexts */
/* Where this process publishes its used bytes and their peak per GPU
 * (backend.h: its slot, or the memfd the daemon maps), or NULL. Relaxed
 * atomics only: one store per allocation and free, and a compare-and-swap
 * only when the peak rises; nothing on kernel launches. */
static _Atomic(cogpu__usage_t *) pl_usage;

/* Contexts that own memory, by a small id (0: none known), so that what a
 * context held can be forgotten when the driver frees it with the context
 * (cuCtxDestroy, the last primary release, a primary reset). */
#define PL_MAX_CTX_IDS 256
static _Atomic(CUcontext) pl_ctx_ids[PL_MAX_CTX_IDS];

static pl_table_t *table_for(pl_kind_t k) {
  switch (k) {
  case PL_KIND_MEM:
  case PL_KIND_POOL:
    return &pl_tables[0];
  case PL_KIND_HANDLE:
    return &pl_tables[1];
  case PL_KIND_ARRAY:
  case PL_KIND_MIPMAP:
    return &pl_tables[2];
  default:
    return &pl_tables[3];
  }
}

static void pl_fork_child(void) {
  /* CUDA does not survive fork: the child starts from nothing and attaches
   * on its own if it uses CUDA. The ledger marks the handle as the
   * parent's. */
  pl_h = NULL;
  atomic_store(&pl_attached, 0);
  atomic_store(&pl_usage, NULL); /* the parent's page is the parent's */
  for (int i = 0; i < PL_MAX_DEVS; i++) {
    atomic_store(&pl_devs[i].state, DEV_UNKNOWN);
    atomic_store(&pl_devs[i].used, 0);
    atomic_store(&pl_devs[i].reserved, 0);
    atomic_store(&pl_devs[i].graph, 0); /* the child's allocator is empty */
    atomic_store(&pl_devs[i].shrink_pending, 0);
    atomic_store(&pl_devs[i].grow_pending, 0);
    pl_devs[i].waiting = false;
    pl_devs[i].wait_rc = 0;
    pthread_cond_init(&pl_devs[i].cv, NULL);
    /* The parent's primary contexts are not the child's: its first
     * retain creates (and is charged) a context of its own. */
    atomic_store(&pl_devs[i].primary_refs, 0);
    pl_devs[i].base = 0;
    pthread_mutex_init(&pl_devs[i].mu, NULL);
  }
  pl_npools = 0;
  for (int i = 0; i < PL_MAX_CTX_IDS; i++)
    atomic_store(&pl_ctx_ids[i], NULL);
  pthread_mutex_init(&pl_mu, NULL);
  pthread_mutex_init(&pl_pool_mu, NULL);
  for (int i = 0; i < 4; i++)
    cogpu__pl_table_clear(&pl_tables[i]);
}

/* Runs before main, single-threaded. */
__attribute__((constructor)) static void pl_init(void) {
  for (int i = 0; i < PL_MAX_DEVS; i++) {
    pthread_mutex_init(&pl_devs[i].mu, NULL);
    pthread_cond_init(&pl_devs[i].cv, NULL);
  }
  static const size_t caps[4] = {1u << 20, 1u << 16, 1u << 16, 1u << 12};
  for (int i = 0; i < 4; i++)
    cogpu__pl_table_init(&pl_tables[i], caps[i]);
  pthread_atfork(NULL, NULL, pl_fork_child);
}

static bool pl_attach(void) {
  int st = atomic_load_explicit(&pl_attached, memory_order_acquire);
  if (st)
    return st == 1;
  pthread_mutex_lock(&pl_mu);
  if (atomic_load(&pl_attached) == 0) {
    int rc = cogpu__config_load(&pl_cfg);
    cogpu_attach_opts_t o = {.priority = (int)pl_cfg.v[COGPU_OPT_PRIORITY].i,
                             .job_id = pl_cfg.v[COGPU_OPT_JOB_ID].s,
                             .join = pl_cfg.v[COGPU_OPT_JOB_TOKEN].s};
    if (rc == 0)
      rc = cogpu_attach(&o, &pl_h);
    pl_member = rc == 0 && o.join && *o.join;
    if (rc == -ESRCH) {
      cogpu__log(COGPU_LOG_WARN, "%s; reserving on its own",
                 cogpu_last_error());
      o.join = NULL;
      rc = cogpu_attach(&o, &pl_h);
    }
    if (rc)
      cogpu__log(COGPU_LOG_ERROR,
                 "GPU memory of this process is not accounted: %s",
                 cogpu_last_error());
    /* The node daemon may suspend this process (it runs CUDA under us). */
    if (rc == 0 && cogpu__mark(pl_h, COGPU_MARK_CUDA) != 0)
      cogpu__log(COGPU_LOG_DEBUG, "mark: %s", cogpu_last_error());
    if (rc == 0)
      atomic_store_explicit(&pl_usage, cogpu__usage_page(pl_h),
                            memory_order_release);
    atomic_store_explicit(&pl_attached, rc ? 2 : 1, memory_order_release);
  }
  pthread_mutex_unlock(&pl_mu);
  return atomic_load(&pl_attached) == 1;
}

/* Marks this process once per kind (one request each, ever). */
void cogpu__pl_mark(uint32_t flag) {
  static _Atomic uint32_t sent;
  if ((atomic_load_explicit(&sent, memory_order_relaxed) & flag) ||
      !pl_attach())
    return;
  if (atomic_fetch_or(&sent, flag) & flag)
    return;
  if (cogpu__mark(pl_h, flag) != 0)
    cogpu__log(COGPU_LOG_WARN,
               "could not record that this process uses "
               "what cannot be suspended: %s",
               cogpu_last_error());
}

static void uuid_text(const CUuuid *u, char *buf, size_t len) {
  const unsigned char *b = (const unsigned char *)u->bytes;
  snprintf(buf, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
           b[11], b[12], b[13], b[14], b[15]);
}

/* Which ledger GPU a CUDA ordinal is: by UUID, never by index (CUDA
 * ordinals and NVML indices differ under CUDA_VISIBLE_DEVICES). */
static void dev_map(CUdevice dev, pl_dev_t *d) {
  CUuuid u;
  char text[64];
  cuDeviceGetUuid_ft *get = REAL(cuDeviceGetUuid);
  int gpu = -1;
  if (pl_attach() && get && get(&u, dev) == CUDA_SUCCESS) {
    uuid_text(&u, text, sizeof text);
    if (cogpu_gpu_lookup(pl_h, text, &gpu) != 0)
      cogpu__log(COGPU_LOG_WARN,
                 "CUDA device %d (%s) is not in the node "
                 "ledger: not accounted",
                 dev, text);
  }
  d->gpu = gpu;
  atomic_store_explicit(&d->state, gpu >= 0 ? DEV_ACCOUNTED : DEV_UNACCOUNTED,
                        memory_order_release);
}

static pl_dev_t *dev_get(CUdevice dev) {
  if (dev < 0 || dev >= PL_MAX_DEVS)
    return NULL;
  pl_dev_t *d = &pl_devs[dev];
  int st = atomic_load_explicit(&d->state, memory_order_acquire);
  if (st == DEV_UNKNOWN) {
    pthread_mutex_lock(&d->mu);
    if (atomic_load(&d->state) == DEV_UNKNOWN)
      dev_map(dev, d);
    pthread_mutex_unlock(&d->mu);
    st = atomic_load(&d->state);
  }
  return st == DEV_ACCOUNTED ? d : NULL;
}

_Atomic uint32_t *cogpu__pl_primary_refs(CUdevice dev) {
  return dev >= 0 && dev < PL_MAX_DEVS ? &pl_devs[dev].primary_refs : NULL;
}

CUdevice cogpu__pl_current_device(void) {
  CUdevice dev = -1;
  cuCtxGetDevice_ft *get = REAL(cuCtxGetDevice);
  if (!get || get(&dev) != CUDA_SUCCESS)
    return -1;
  return dev;
}

static uint64_t cfg_u(int id) {
  return pl_cfg.v[id].u;
}

/* A context's measured cost per device (0: not measured). */
static _Atomic uint64_t pl_ctx_cost[PL_MAX_DEVS];

uint64_t cogpu__pl_context_bytes(CUdevice dev) {
  pl_attach();
  uint64_t m =
      dev >= 0 && dev < PL_MAX_DEVS ? atomic_load(&pl_ctx_cost[dev]) : 0;
  return m ? m : cfg_u(COGPU_OPT_CONTEXT_BYTES);
}

/* What NVML says this process holds on d's GPU (0: it cannot say: no
 * NVML, or this process's pid is not the one NVML sees, in a container). */
static uint64_t nvml_own_used(const pl_dev_t *d) {
  cogpu_status_t *st = NULL;
  int index = -1;
  if (cogpu_status(pl_h, &st) == 0) {
    if ((size_t)d->gpu < st->ngpus)
      index = st->gpus[d->gpu].index;
    cogpu_status_free(st);
  }
  cogpu__gpu_proc_t procs[256];
  size_t n = 0;
  if (index < 0 || cogpu__nvml_open() != 0 ||
      cogpu__nvml_processes((unsigned)index, procs, COGPU_ARRAY_SIZE(procs),
                            &n) != 0)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (procs[i].pid == (unsigned)getpid())
      return procs[i].used;
  return 0;
}

/* The driver's cost of a context differs by GPU, driver and CUDA version
 * (hundreds of MiB), and a fixed context_bytes either books memory the job
 * never holds or lets it hold more than it booked. So the first context on
 * a device is charged the estimate while it is made (the memory must be
 * there first), then NVML's figure for this process, less what its own
 * allocations hold, is what it costs: the estimate is settled to it, and
 * later contexts on the device are charged that. The page's peak forgets
 * the estimate if nothing outgrew it meanwhile. */
uint64_t cogpu__pl_context_settle(CUdevice dev, uint64_t charged) {
  pl_dev_t *d = dev_get(dev);
  if (!d || !pl_cfg.v[COGPU_OPT_CONTEXT_MEASURE].i || dev >= PL_MAX_DEVS ||
      atomic_load(&pl_ctx_cost[dev]))
    return charged;
  uint64_t seen = nvml_own_used(d);
  int64_t used = atomic_load(&d->used);
  /* The rest of what NVML sees is this process's own allocations. */
  int64_t cost = (int64_t)seen - (used - (int64_t)charged);
  if (seen == 0 || cost <= 0 || (uint64_t)cost > 4 * charged + (1ull << 30))
    return charged; /* no figure, or one that cannot be a context's */
  uint64_t none = 0;
  if (!atomic_compare_exchange_strong(&pl_ctx_cost[dev], &none, (uint64_t)cost))
    return charged; /* another thread's context measured first */
  int64_t delta = cost - (int64_t)charged;
  cogpu__pl_adjust(dev, delta);
  cogpu__usage_t *u = atomic_load_explicit(&pl_usage, memory_order_acquire);
  if (u && delta < 0) {
    uint64_t was = used > 0 ? (uint64_t)used : 0;
    atomic_compare_exchange_strong(&u->peak[d->gpu], &was,
                                   was - (uint64_t)-delta);
  }
  char c[32], e[32];
  cogpu__log(COGPU_LOG_INFO,
             "a CUDA context on GPU %d costs %s (context_bytes: %s)", d->gpu,
             cogpu__fmt_size((uint64_t)cost, c, sizeof c),
             cogpu__fmt_size(charged, e, sizeof e));
  return (uint64_t)cost;
}

/* Reserve `bytes` more for d through the ledger; prints one line when it
 * has to wait. */
static int dev_reserve(pl_dev_t *d, uint64_t bytes, int64_t timeout_ms,
                       uint32_t flags) {
  cogpu_request_t r = {.gpu = d->gpu,
                       .bytes = bytes,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT,
                       .flags = flags};
  int rc = cogpu_reserve(pl_h, &r, NULL);
  if (rc != -EAGAIN || timeout_ms == COGPU_NOWAIT)
    return rc;
  char need[32];
  cogpu__log(COGPU_LOG_WARN, "waiting for %s of GPU memory on GPU %d",
             cogpu__fmt_size(bytes, need, sizeof need), d->gpu);
  r.timeout_ms = timeout_ms;
  return cogpu_reserve(pl_h, &r, NULL);
}

/* How long growing may wait: in reserve mode not at all (unless
 * grow_wait), on demand as the node's queue decides. */
static int64_t grow_timeout(void) {
  bool reserve_mode = cfg_u(COGPU_OPT_MEM) > 0;
  return reserve_mode && !pl_cfg.v[COGPU_OPT_GROW_WAIT].i
             ? COGPU_NOWAIT
             : pl_cfg.v[COGPU_OPT_TIMEOUT].i;
}

static void dev_pending(pl_dev_t *d);

/* Reserve `bytes` more for d, waiting up to `timeout` in the node's queue
 * without holding d->mu (held on entry and on return). Only one thread
 * waits in the ledger per device; another that needs to wait meanwhile
 * waits for that one's answer, then looks again. 0: look again (what was
 * reserved is in d->reserved); otherwise the wait failed. */
static int dev_wait(pl_dev_t *d, uint64_t bytes, int64_t timeout,
                    uint32_t flags) {
  if (d->waiting) {
    unsigned gen = d->wait_gen;
    dev_pending(d);
    while (d->waiting && d->wait_gen == gen)
      pthread_cond_wait(&d->cv, &d->mu);
    return d->wait_rc;
  }
  d->waiting = true;
  dev_pending(d);
  pthread_mutex_unlock(&d->mu);
  int rc = dev_reserve(d, bytes, timeout, flags);
  pthread_mutex_lock(&d->mu);
  if (rc == 0)
    atomic_fetch_add(&d->reserved, (int64_t)bytes);
  d->waiting = false;
  d->wait_gen++;
  d->wait_rc = rc;
  pthread_cond_broadcast(&d->cv);
  return rc;
}

/* Grow d's reservation until it covers `used`; d->mu held. flags go with
 * the requests (COGPU__REQ_DEVICE_WAIT). */
static CUresult dev_grow(pl_dev_t *d, int64_t timeout, uint32_t flags) {
  uint64_t step = cfg_u(COGPU_OPT_GROW_STEP), limit = cfg_u(COGPU_OPT_LIMIT);
  /* A process of a job stops waiting when its job's own memory comes free
   * (another of its processes left): it claims that first, below. */
  if (pl_member)
    flags |= COGPU__REQ_JOB_SPARE;
  for (;;) {
    int64_t used = atomic_load(&d->used), res = atomic_load(&d->reserved);
    if (used <= res)
      return CUDA_SUCCESS;
    uint64_t need = (uint64_t)(used - res);
    uint64_t want = need > step ? need : step;
    if (limit && (uint64_t)res + want > limit)
      want = need;
    /* The job's memory first: it is counted once, whichever of its
     * processes uses it. */
    uint64_t got = 0;
    if (pl_member && cogpu__claim(pl_h, d->gpu, want, &got) == 0 && got) {
      d->base += got;
      atomic_fetch_add(&d->reserved, (int64_t)got);
      continue;
    }
    int rc = dev_reserve(d, want, COGPU_NOWAIT, flags);
    /* A step that does not fit now, or never (a grow_step larger than the
     * GPU: -E2BIG), is cut to what is needed. */
    if ((rc == -EAGAIN || rc == -E2BIG) && want > need)
      rc = dev_reserve(d, want = need, COGPU_NOWAIT, flags);
    if (rc == 0) {
      atomic_fetch_add(&d->reserved, (int64_t)want);
      continue;
    }
    if (rc == -EAGAIN && timeout != COGPU_NOWAIT)
      rc = dev_wait(d, need, timeout, flags);
    if (rc == COGPU__EJOB_SPARE)
      continue; /* claim it, then ask for the rest */
    if (rc) {
      cogpu__log(COGPU_LOG_WARN, "GPU %d: out of memory for this job: %s",
                 d->gpu, cogpu_last_error());
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
}

/* Give back what a reservation holds beyond one spare step (a process of
 * its own in reserve mode keeps mem): first what it grew the job by, to
 * the node, then what it claimed of the job's memory, to the job. */
static void dev_shrink(pl_dev_t *d) {
  uint64_t step = cfg_u(COGPU_OPT_GROW_STEP);
  uint64_t floor = pl_member ? 0 : cfg_u(COGPU_OPT_MEM);
  int64_t used = atomic_load(&d->used), res = atomic_load(&d->reserved);
  uint64_t keep = (uint64_t)(used > 0 ? used : 0) + step;
  keep = keep > floor ? keep : floor;
  if ((uint64_t)res <= keep + step)
    return;
  uint64_t excess = (uint64_t)res - keep;
  uint64_t grown = (uint64_t)res - d->base;
  uint64_t drop = excess < grown ? excess : grown;
  if (drop && cogpu_release(pl_h, d->gpu, drop) == 0) {
    atomic_fetch_sub(&d->reserved, (int64_t)drop);
    excess -= drop;
  }
  if (excess && excess <= d->base &&
      cogpu__unclaim(pl_h, d->gpu, excess) == 0) {
    d->base -= excess;
    atomic_fetch_sub(&d->reserved, (int64_t)excess);
  }
}

/* d->mu held: what adjustments and frees asked for while it was taken.
 * Neither waits: growing here only takes memory that is free now. */
static void dev_pending(pl_dev_t *d) {
  if (atomic_exchange(&d->grow_pending, 0))
    dev_grow(d, COGPU_NOWAIT, 0);
  if (atomic_exchange(&d->shrink_pending, 0))
    dev_shrink(d);
}

/* Release d->mu, first doing what others asked for meanwhile. A request
 * made after that check and before the unlock is seen by the re-check
 * (whoever sets a flag then tries the lock itself), so none is lost. */
static void dev_unlock(pl_dev_t *d) {
  for (;;) {
    dev_pending(d);
    pthread_mutex_unlock(&d->mu);
    if (!atomic_load(&d->grow_pending) && !atomic_load(&d->shrink_pending))
      return;
    if (pthread_mutex_trylock(&d->mu) != 0)
      return; /* its holder will do it */
  }
}

/* Says, once per process, why the limit refused memory: an out-of-memory
 * error alone does not tell a user that cogpu refused it, nor that a limit
 * below context_bytes leaves room for no context at all. */
static void limit_refused(const pl_dev_t *d, uint64_t bytes, int64_t used) {
  static _Atomic int said;
  if (atomic_exchange(&said, 1))
    return;
  uint64_t limit = cfg_u(COGPU_OPT_LIMIT), ctx = cfg_u(COGPU_OPT_CONTEXT_BYTES);
  char b[32], u[32], l[32], c[32];
  cogpu__fmt_size(bytes, b, sizeof b);
  cogpu__fmt_size((uint64_t)used, u, sizeof u);
  cogpu__fmt_size(limit, l, sizeof l);
  cogpu__fmt_size(ctx, c, sizeof c);
  if (limit < ctx)
    cogpu__log(COGPU_LOG_ERROR,
               "GPU %d: out of memory: limit (%s) is below context_bytes "
               "(%s), so no CUDA context fits; raise limit or lower "
               "context_bytes",
               d->gpu, l, c);
  else
    cogpu__log(COGPU_LOG_WARN,
               "GPU %d: out of memory: %s more would make this process hold "
               "%s, over its limit (%s)",
               d->gpu, b, u, l);
}

/* Publishes d's used bytes (exact: every allocation and free passes
 * here), raising the peak when `grew`. bench-peak's baseline library is
 * built with COGPU_BENCH_NO_USAGE, without it (its cost, measured). */
static void usage_put(const pl_dev_t *d, int64_t used, bool grew) {
#ifdef COGPU_BENCH_NO_USAGE
  (void)d;
  (void)used;
  (void)grew;
  return;
#endif
  cogpu__usage_t *u = atomic_load_explicit(&pl_usage, memory_order_acquire);
  if (!u)
    return;
  uint64_t v = used > 0 ? (uint64_t)used : 0;
  atomic_store_explicit(&u->used[d->gpu], v, memory_order_relaxed);
  if (!grew)
    return;
  uint64_t p = atomic_load_explicit(&u->peak[d->gpu], memory_order_relaxed);
  while (v > p) {
    if (atomic_compare_exchange_weak_explicit(&u->peak[d->gpu], &p, v,
                                              memory_order_relaxed,
                                              memory_order_relaxed)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      atomic_store_explicit(
          &u->peak_ns, (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
          memory_order_relaxed);
      break;
    }
  }
}

CUresult cogpu__pl_charge(CUdevice dev, uint64_t bytes) {
  pl_dev_t *d = dev_get(dev);
  if (!d || bytes == 0)
    return CUDA_SUCCESS;
  int64_t used = atomic_fetch_add(&d->used, (int64_t)bytes) + (int64_t)bytes;
  uint64_t limit = cfg_u(COGPU_OPT_LIMIT);
  if (limit && (uint64_t)used > limit) {
    atomic_fetch_sub(&d->used, (int64_t)bytes);
    limit_refused(d, bytes, used);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (used <= atomic_load_explicit(&d->reserved, memory_order_relaxed)) {
    usage_put(d, used, true);
    return CUDA_SUCCESS;
  }
  pthread_mutex_lock(&d->mu);
  CUresult rc = dev_grow(d, grow_timeout(), 0);
  dev_unlock(d);
  if (rc != CUDA_SUCCESS)
    usage_put(d, atomic_fetch_sub(&d->used, (int64_t)bytes) - (int64_t)bytes,
              false);
  else
    usage_put(d, atomic_load(&d->used), true);
  return rc;
}

/* The driver refused memory that d's reservation covers, and no client
 * left moments ago. If the ledger, reading the GPU again, finds the node's
 * reservations and the memory held outside cogpu over the GPU's capacity,
 * the memory it granted is the outside's for now (a process outside
 * cogpu appeared since the grant): give back what this allocation needs of
 * the reservation and wait for it in the node's queue like any request
 * (seen in status, served in the policy's order, and no deadlock for the
 * guard while the outside holds it), then ask the driver again. Otherwise
 * the refusal is a true out-of-memory, returned at once (PyTorch frees its
 * cache and retries). Each round needs the outside to have grown again
 * (a grant means the fresh figures fit), so it ends. */
enum { OUTSIDE_NOT_OVER, OUTSIDE_SERVED, OUTSIDE_FAILED };
static int outside_wait(pl_dev_t *d, pl_retry_t *r) {
  uint64_t over = 0;
  int rc0 = pl_h ? cogpu__recheck(pl_h, d->gpu, &over) : -EINVAL;
  if (rc0 != 0 || over == 0) {
    cogpu__log(COGPU_LOG_INFO,
               "GPU %d: the driver refused memory cogpu granted, and the "
               "node is not over the GPU (%s)",
               d->gpu, rc0 ? cogpu_last_error() : "read again just now");
    return OUTSIDE_NOT_OVER;
  }
  uint64_t step = cfg_u(COGPU_OPT_GROW_STEP);
  uint64_t give = r->charged > step ? r->charged : step;
  char o[32], g[32];
  if (!r->outside)
    cogpu__log(COGPU_LOG_WARN,
               "GPU %d: the driver refused memory cogpu granted: the node is "
               "%s over the GPU with memory held outside cogpu; waiting for "
               "%s in the queue",
               d->gpu, cogpu__fmt_size(over, o, sizeof o),
               cogpu__fmt_size(give, g, sizeof g));
  r->outside = true;
  pthread_mutex_lock(&d->mu);
  int64_t res = atomic_load(&d->reserved);
  if ((int64_t)give > res)
    give = res > 0 ? (uint64_t)res : 0;
  if (give && cogpu_release(pl_h, d->gpu, give) == 0) {
    /* The ledger takes a process's claim on its job first. */
    atomic_fetch_sub(&d->reserved, (int64_t)give);
    d->base -= give < d->base ? give : d->base;
  }
  CUresult rc =
      dev_grow(d, pl_cfg.v[COGPU_OPT_TIMEOUT].i, COGPU__REQ_DEVICE_WAIT);
  dev_unlock(d);
  return rc == CUDA_SUCCESS ? OUTSIDE_SERVED : OUTSIDE_FAILED;
}

/* After a refusal with the node not over the GPU: ask the driver once
 * more, at once. Memory held outside cogpu when the driver refused may
 * have gone by the time the GPU was read again (a program that ends; seen
 * with programs outside cogpu coming and going every few hundred ms, under
 * TSan). A second refusal with the node still not over is an
 * out-of-memory, returned then: PyTorch frees its cache and retries, and
 * must not wait for it (preload_genuine_out_of_memory_is_fast). */
static bool outside_or_once_more(pl_dev_t *d, pl_retry_t *r) {
  int w = outside_wait(d, r);
  if (w != OUTSIDE_NOT_OVER)
    return w == OUTSIDE_SERVED;
  if (r->again)
    return false;
  r->again = true;
  return true;
}

/* The ledger sees a process die when the kernel drops its file lock; the
 * driver frees that process's memory when it tears down its device files,
 * which may come later (a large context takes a while). In that window the
 * driver refuses memory the ledger rightly granted: wait a little for it
 * rather than fail the job. Any other refusal is the outside's memory
 * (outside_wait) or a true out-of-memory. */
bool cogpu__pl_retry(CUdevice dev, CUresult rc, pl_retry_t *r) {
  pl_dev_t *d = dev_get(dev);
  if (rc != CUDA_ERROR_OUT_OF_MEMORY || !d)
    return false;
  if (r->outside)
    return outside_or_once_more(d, r);
  uint64_t now = cogpu__now_ns();
  int64_t wait_ms = pl_cfg.v[COGPU_OPT_DRIVER_WAIT].i;
  /* Only when a client left moments ago (within driver_wait) is there a
   * reason to think the driver still holds its memory. */
  if (r->n == 0 &&
      (wait_ms <= 0 || cogpu__left_ago_ms(pl_h) > (uint64_t)wait_ms))
    return outside_or_once_more(d, r);
  if (r->n == 0) {
    r->deadline_ns = now + (uint64_t)wait_ms * 1000000u;
    cogpu__log(COGPU_LOG_INFO,
               "GPU %d: the driver refused memory cogpu granted; "
               "retrying for up to %lld ms",
               d->gpu, (long long)wait_ms);
  }
  if (now >= r->deadline_ns) {
    if (outside_wait(d, r) == OUTSIDE_SERVED)
      return true;
    cogpu__log(COGPU_LOG_WARN,
               "GPU %d: the driver is out of memory that cogpu counts as "
               "free (memory used outside cogpu's view?)",
               d->gpu);
    return false;
  }
  /* 1, 2, 4 ... ms, then every 50 ms: a death is usually settled within
   * a few milliseconds. */
  uint64_t sleep_ms = r->n < 6 ? 1u << r->n : 50;
  uint64_t left_ms = (r->deadline_ns - now + 999999u) / 1000000u;
  struct timespec ts = {
      0, (long)((sleep_ms < left_ms ? sleep_ms : left_ms) * 1000000u)};
  r->n++;
  nanosleep(&ts, NULL);
  return true;
}

void cogpu__pl_uncharge(CUdevice dev, uint64_t bytes) {
  pl_dev_t *d = dev_get(dev);
  if (!d || bytes == 0)
    return;
  int64_t used = atomic_fetch_sub(&d->used, (int64_t)bytes) - (int64_t)bytes;
  usage_put(d, used, false);
  uint64_t step = cfg_u(COGPU_OPT_GROW_STEP);
  if (atomic_load(&d->reserved) - used <= (int64_t)(2 * step))
    return;
  /* A free never blocks: if another thread holds the device, it shrinks
   * on its way out. Retry once in case it left just now. */
  atomic_store(&d->shrink_pending, 1);
  if (pthread_mutex_trylock(&d->mu) == 0)
    dev_unlock(d);
}

void cogpu__pl_adjust(CUdevice dev, int64_t delta) {
  pl_dev_t *d = dev_get(dev);
  if (!d || !delta)
    return;
  int64_t used = atomic_fetch_add(&d->used, delta) + delta;
  usage_put(d, used, delta > 0);
  /* The driver already holds it: cover it if memory is free now; if not,
   * the job is over its reservation until it frees. Never waits, not even
   * for d->mu: whoever holds it does the growing on its way out. */
  if (delta > 0 && used > atomic_load(&d->reserved)) {
    atomic_store(&d->grow_pending, 1);
    if (pthread_mutex_trylock(&d->mu) == 0)
      dev_unlock(d);
  }
}

static unsigned ctx_id(CUcontext c, bool add) {
  for (unsigned i = 1; c && i < PL_MAX_CTX_IDS; i++) {
    CUcontext cur = atomic_load_explicit(&pl_ctx_ids[i], memory_order_acquire);
    if (cur == c)
      return i;
    if (!cur && !add)
      return 0; /* ids are handed out in order and never taken back */
    if (!cur) {
      CUcontext none = NULL;
      if (atomic_compare_exchange_strong(&pl_ctx_ids[i], &none, c))
        return i;
      if (none == c)
        return i;
    }
  }
  return 0;
}

void cogpu__pl_context_known(CUcontext ctx) {
  ctx_id(ctx, true);
}

static unsigned current_ctx_id(void) {
  cuCtxGetCurrent_ft *get = REAL(cuCtxGetCurrent);
  CUcontext c = NULL;
  return get && get(&c) == CUDA_SUCCESS ? ctx_id(c, false) : 0;
}

/* Entries pack device (8 bits), kind (8 bits), the owning context's id
 * (8 bits) and bytes (40 bits: 1 TiB). */
#define PL_BYTES_MASK 0xffffffffffull
static uint64_t track_value(pl_kind_t kind, CUdevice dev, unsigned ctx,
                            uint64_t bytes) {
  return ((uint64_t)(dev & 0xff) << 56) | ((uint64_t)kind << 48) |
         ((uint64_t)(ctx & 0xff) << 40) | (bytes & PL_BYTES_MASK);
}

void cogpu__pl_track(pl_kind_t kind, uint64_t key, CUdevice dev,
                     uint64_t bytes) {
  /* Memory a context owns goes with it; pools and VMM handles do not. */
  bool owned =
      kind == PL_KIND_MEM || kind == PL_KIND_ARRAY || kind == PL_KIND_MIPMAP;
  uint64_t v = track_value(kind, dev, owned ? current_ctx_id() : 0, bytes);
  if (!cogpu__pl_table_put(table_for(kind), key, v))
    cogpu__log(COGPU_LOG_WARN, "allocation table full: an allocation is "
                               "not tracked");
}

bool cogpu__pl_untrack(pl_kind_t table, uint64_t key, CUdevice *dev,
                       uint64_t *bytes, pl_kind_t *kind) {
  uint64_t v;
  if (!cogpu__pl_table_take(table_for(table), key, &v))
    return false;
  *dev = (CUdevice)(v >> 56);
  *bytes = v & PL_BYTES_MASK;
  *kind = (pl_kind_t)((v >> 48) & 0xff);
  return true;
}

static bool owned_by(uint64_t v, void *arg) {
  return ((v >> 40) & 0xff) == *(unsigned *)arg;
}

static void freed_with_context(uint64_t key, uint64_t v, void *arg) {
  (void)key;
  (void)arg;
  pl_kind_t kind = (pl_kind_t)((v >> 48) & 0xff);
  if (kind != PL_KIND_POOL)
    cogpu__pl_uncharge((CUdevice)(v >> 56), v & PL_BYTES_MASK);
}

void cogpu__pl_context_gone(CUcontext ctx) {
  unsigned id = ctx_id(ctx, false);
  if (!id)
    return;
  cogpu__pl_table_take_if(table_for(PL_KIND_MEM), owned_by, freed_with_context,
                          &id);
  cogpu__pl_table_take_if(table_for(PL_KIND_ARRAY), owned_by,
                          freed_with_context, &id);
}

/* cogpu run placed this on-demand job on a GPU with a stake of one context
 * (stake_gpu): the first context of a process of the job takes it there
 * (its growth claims the job's unclaimed memory first), or, on another
 * GPU, gives it back, so that it does not stay booked where the job never
 * runs. Only what no process of the job has claimed is taken (claim) and
 * released: another process's memory is never touched. Once per process. */
static atomic_int pl_stake_done;
static void stake_settle(const pl_dev_t *d) {
  int64_t sg = pl_cfg.v[COGPU_OPT_STAKE_GPU].i;
  if (!pl_member || sg < 0 || atomic_exchange(&pl_stake_done, 1) ||
      sg == d->gpu)
    return;
  uint64_t got = 0;
  if (cogpu__claim(pl_h, (int)sg, cfg_u(COGPU_OPT_CONTEXT_BYTES), &got) == 0 &&
      got)
    cogpu_release(pl_h, (int)sg, got);
}

/* Before the first context on dev: attach, map it, and in reserve mode take
 * the reservation, waiting for it. mem=auto is read as 0 here (on demand):
 * learning a size from the job history is cogpu run's, and this library
 * reads no history. */
CUresult cogpu__pl_context_prepare(CUdevice dev) {
  pl_dev_t *d = dev_get(dev);
  if (d)
    stake_settle(d);
  uint64_t mem = d && !pl_member ? cfg_u(COGPU_OPT_MEM) : 0;
  if (!d || mem == 0)
    return CUDA_SUCCESS;
  CUresult rc = CUDA_SUCCESS;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    int64_t res = atomic_load(&d->reserved);
    if ((uint64_t)res >= mem)
      break;
    if (dev_wait(d, mem - (uint64_t)res, pl_cfg.v[COGPU_OPT_TIMEOUT].i, 0)) {
      cogpu__log(COGPU_LOG_ERROR, "cannot reserve GPU memory: %s",
                 cogpu_last_error());
      rc = CUDA_ERROR_OUT_OF_MEMORY;
      break;
    }
  }
  dev_unlock(d);
  return rc;
}

bool cogpu__pl_meminfo(CUdevice dev, uint64_t *free_b, uint64_t *total_b,
                       uint64_t real_free) {
  pl_dev_t *d = dev_get(dev);
  if (!d)
    return false;
  int64_t used = atomic_load(&d->used), res = atomic_load(&d->reserved);
  uint64_t u = used > 0 ? (uint64_t)used : 0;
  uint64_t limit = cfg_u(COGPU_OPT_LIMIT), mem = cfg_u(COGPU_OPT_MEM);
  uint64_t share = limit ? limit
                   : mem ? (mem > (uint64_t)res ? mem : (uint64_t)res)
                         : 0;
  uint64_t fr;
  if (share) {
    *total_b = share;
    fr = share > u ? share - u : 0;
    /* The job's other processes use part of a shared reservation. */
    uint64_t mine = (res > used ? (uint64_t)(res - used) : 0) +
                    cogpu__job_spare(pl_h, d->gpu);
    if (pl_member && !limit && mine < fr)
      fr = mine;
  } else {
    uint64_t cap = 0, gfree = 0;
    cogpu__room(pl_h, d->gpu, &cap, &gfree);
    *total_b = cap;
    fr = gfree + (res > used ? (uint64_t)(res - used) : 0);
  }
  *free_b = fr < real_free ? fr : real_free;
  return true;
}

bool cogpu__pl_report_total(CUdevice dev, uint64_t *total) {
  if (!pl_attach() || !pl_cfg.v[COGPU_OPT_REPORT_TOTAL].i)
    return false;
  uint64_t fr;
  return cogpu__pl_meminfo(dev, &fr, total, UINT64_MAX);
}

uint64_t cogpu__pl_pool_index(CUmemoryPool pool, CUdevice dev) {
  pthread_mutex_lock(&pl_pool_mu);
  size_t i = 0;
  while (i < pl_npools && pl_pools[i].pool != pool)
    i++;
  if (i == pl_npools && pl_npools < PL_MAX_POOLS)
    pl_pools[pl_npools++] = (pl_pool_t){pool, dev, 0};
  pthread_mutex_unlock(&pl_pool_mu);
  return i;
}

void cogpu__pl_pool_created(CUmemoryPool pool, CUdevice dev) {
  pthread_mutex_lock(&pl_pool_mu);
  size_t i = 0;
  while (i < pl_npools && pl_pools[i].pool != pool)
    i++;
  pl_pool_t old = i < pl_npools ? pl_pools[i] : (pl_pool_t){0};
  if (i < pl_npools || pl_npools < PL_MAX_POOLS)
    pl_pools[i == pl_npools ? pl_npools++ : i] = (pl_pool_t){pool, dev, 0};
  pthread_mutex_unlock(&pl_pool_mu);
  /* The handle of a destroyed pool came back: what that pool held is gone. */
  if (old.accounted)
    cogpu__pl_uncharge(old.dev, old.accounted);
}

CUdevice cogpu__pl_pool_device(CUmemoryPool pool, CUdevice fallback) {
  CUdevice dev = fallback;
  pthread_mutex_lock(&pl_pool_mu);
  for (size_t i = 0; i < pl_npools; i++)
    if (pl_pools[i].pool == pool)
      dev = pl_pools[i].dev;
  pthread_mutex_unlock(&pl_pool_mu);
  return dev;
}

CUmemoryPool cogpu__pl_pool_at(uint64_t index, CUdevice *dev) {
  CUmemoryPool p = NULL;
  pthread_mutex_lock(&pl_pool_mu);
  if (index < pl_npools) {
    p = pl_pools[index].pool;
    *dev = pl_pools[index].dev;
  }
  pthread_mutex_unlock(&pl_pool_mu);
  return p;
}

/* A pool keeps more than its live allocations (granules, freed memory not
 * yet trimmed): what it reserves from the device is what counts. */
void cogpu__pl_pool_sync(CUmemoryPool pool, CUdevice dev) {
  cuMemPoolGetAttribute_ft *get = REAL(cuMemPoolGetAttribute);
  cuuint64_t now = 0;
  if (!pool || !get ||
      get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &now) != CUDA_SUCCESS)
    return;
  uint64_t i = cogpu__pl_pool_index(pool, dev);
  pthread_mutex_lock(&pl_pool_mu);
  int64_t delta = 0;
  if (i < pl_npools) {
    delta = (int64_t)now - (int64_t)pl_pools[i].accounted;
    pl_pools[i].accounted = now;
  }
  pthread_mutex_unlock(&pl_pool_mu);
  if (delta > 0)
    cogpu__pl_adjust(dev, delta);
  else if (delta < 0)
    cogpu__pl_uncharge(dev, (uint64_t)-delta);
}

/* Graph allocations come from each device's graph allocator, which keeps
 * what it took until trimmed: its footprint is what the process holds.
 * Only devices this process already uses are read. */
void cogpu__pl_graph_sync(void) {
  cuDeviceGetGraphMemAttribute_ft *get = REAL(cuDeviceGetGraphMemAttribute);
  for (int i = 0; get && i < PL_MAX_DEVS; i++) {
    pl_dev_t *d = &pl_devs[i];
    cuuint64_t now = 0;
    if (atomic_load_explicit(&d->state, memory_order_acquire) !=
            DEV_ACCOUNTED ||
        get(i, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &now) != CUDA_SUCCESS)
      continue;
    int64_t delta = (int64_t)now - (int64_t)atomic_exchange(&d->graph, now);
    if (delta > 0)
      cogpu__pl_adjust(i, delta);
    else if (delta < 0)
      cogpu__pl_uncharge(i, (uint64_t)-delta);
  }
}

/* Frees take the entry out first (a racing free of the same key cannot
 * credit twice), let the driver free, then settle: credit the device the
 * memory came from, or put the entry back if the driver refused. A free of
 * something never tracked is the driver's business alone. */
pl_taken_t cogpu__pl_take(pl_kind_t table, uint64_t key) {
  pl_taken_t t = {.key = key};
  t.known = cogpu__pl_untrack(table, key, &t.dev, &t.val, &t.kind);
  return t;
}

CUresult cogpu__pl_settle(const pl_taken_t *t, CUresult rc) {
  if (!t->known)
    return rc;
  if (rc != CUDA_SUCCESS) {
    cogpu__pl_track(t->kind, t->key, t->dev, t->val);
  } else if (t->kind == PL_KIND_POOL) {
    CUdevice pdev = -1;
    CUmemoryPool pool = cogpu__pl_pool_at(t->val, &pdev);
    cogpu__pl_pool_sync(pool, pdev);
  } else {
    cogpu__pl_uncharge(t->dev, t->val);
  }
  return rc;
}
