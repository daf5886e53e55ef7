/*
 * checkpoint.c: the process checkpoint API of the fake libcuda.so.1
 * (cuCheckpointProcess*, driver 570+), the entry gate that makes a locked
 * process's calls wait, the work a process submits (kernel launches) that a
 * Lock waits for and the fake NVML reports as utilisation, and the test
 * hooks fake_cuda_ckpt_*.
 *
 * The caller (cogpu's node daemon, say) and the target are different
 * processes: every operation works on the target's entry in the shared state
 * file (fake-cuda-state.h), and the target does not cooperate, except that
 * each of its CUDA calls passes the entry gate. States and operations, as in
 * cuda.h and what is known of driver 580 (../shared/notes/suspension.md):
 *
 *   GetState   reports RUNNING, LOCKED, CHECKPOINTED or FAILED. A Lock under
 *              way reads RUNNING; a process wedged by a Restore that lacked
 *              memory reads CHECKPOINTED, as driver 580.95 reports it
 *              (NVIDIA/cuda-checkpoint#44), though it is stuck for good.
 *   Lock       RUNNING -> LOCKED. New calls of the target wait at entry;
 *              Lock waits for the calls already in flight, then for the
 *              target's submitted work (FAKE_CUDA_KERNEL_MS per launch),
 *              bounded by timeoutMs (0: no bound). On timeout the target is
 *              RUNNING again and Lock returns CUDA_ERROR_NOT_READY.
 *   Checkpoint LOCKED -> CHECKPOINTED. Everything the target holds on each
 *              GPU (allocations, pools, contexts) leaves the GPU counters
 *              for the entry's ckpt_bytes, after the modelled copy time;
 *              the fake NVML no longer lists it. Its fake device memory,
 *              host mappings of its own, is kept: same data, same addresses
 *              after Restore. A target that used managed memory, IPC or a
 *              shareable VMM handle fails with CUDA_ERROR_NOT_SUPPORTED and
 *              is left FAILED (wedged), holding its GPU memory until killed.
 *   Restore    CHECKPOINTED -> LOCKED. The bytes are charged back first, all
 *              GPUs or none, each onto the GPU gpuPairs maps it to (driver
 *              580, CUDA 13.0: every GPU the process could see named once,
 *              same chip, never for a process with a restricted
 *              CUDA_VISIBLE_DEVICES: CUDA_ERROR_INVALID_VALUE, the target
 *              still CHECKPOINTED; see restore_pairs). A moved target keeps
 *              its view of its devices (ordinals, UUIDs): what the real
 *              driver reports after such a restore is not yet checked on
 *              one. If one GPU lacks free memory: CUDA_ERROR_OUT_OF_MEMORY, and
 * the target is wedged for good: each later Restore returns
 *              CUDA_ERROR_OPERATING_SYSTEM, Unlock CUDA_ERROR_ILLEGAL_STATE,
 *              and its waiting calls never return (driver 580.95).
 *   Unlock     LOCKED -> RUNNING; the target's waiting calls proceed.
 *   GetRestoreThreadId  the thread of the target that ran cuInit.
 *
 * Errors, in the order checked: FAKE_CUDA_FAIL (CUDA_ERROR_UNKNOWN, no
 * effect), the caller has not called cuInit (CUDA_ERROR_NOT_INITIALIZED),
 * the API is unsupported (CUDA_ERROR_NOT_SUPPORTED), non-zero reserved
 * fields or NULL outputs (CUDA_ERROR_INVALID_VALUE), no live fake-CUDA
 * process of that pid, or the caller's own pid for an operation that
 * changes state (CUDA_ERROR_INVALID_VALUE), a caller whose effective uid is
 * neither 0 nor the target's uid (CUDA_ERROR_NOT_PERMITTED: the real
 * driver's "operation not permitted" without ptrace rights,
 * NVIDIA/cuda-checkpoint#25), another operation on the target under way or
 * the wrong state (CUDA_ERROR_ILLEGAL_STATE). A target that dies during an
 * operation makes it return CUDA_ERROR_INVALID_VALUE.
 *
 * One operation per target at a time: a caller claims the entry
 * (ckpt_caller). A caller that dies mid-operation leaves the target as the
 * operation had got it, settled by the next process that looks: a Lock that
 * was waiting is undone (RUNNING), a Checkpoint that had not moved the
 * bytes leaves the target LOCKED, a Restore that had charged them completes
 * (LOCKED). A LOCKED target stays locked: the daemon that locked it must
 * unlock it after a restart.
 *
 * Configuration, from the environment of the process making the call:
 *
 *   FAKE_CUDA_CHECKPOINT      "unsupported": every checkpoint call returns
 *                             CUDA_ERROR_NOT_SUPPORTED (MIG, platforms
 *                             without it); unset or anything else: supported.
 *   FAKE_CUDA_DRIVER_VERSION  below 12080 (driver 570), the API is absent:
 *                             cuGetProcAddress does not find it, and the
 *                             exported functions return
 *                             CUDA_ERROR_NOT_SUPPORTED (see fake-cuda.c).
 *   FAKE_CUDA_CKPT_GBPS       modelled copy bandwidth in GB/s (10^9 bytes):
 *                             Checkpoint and Restore take bytes/bandwidth.
 *                             Unset, 0 or invalid: instant.
 *   FAKE_CUDA_SLOW            (fake-cuda.c) "cuCheckpointProcessGetState:MS"
 *                             makes GetState as slow as reported in the
 *                             field (seconds), and so for the others.
 *   FAKE_CUDA_KERNEL_MS       (the target's) each kernel or graph launch
 *                             keeps the process busy that many milliseconds
 *                             more, after its earlier work; cuCtxSynchronize
 *                             and cuStreamSynchronize wait for it. Unset or
 *                             invalid: 0.
 *
 * Not modelled: Yama's ptrace_scope and CAP_SYS_PTRACE (only uids count);
 * persistence mode; host memory (the checkpointed
 * copy costs the fake nothing, and no cgroup sees it); exactly which calls
 * a real driver holds (those "which launch work, manage resources, or
 * otherwise impact GPU state", says cuda-checkpoint's README: the fake
 * holds every entry point except the checkpoint calls and its test hooks,
 * which is stricter); the ~1 MiB nvidia-smi still shows for a checkpointed
 * process (NVIDIA/cuda-checkpoint#31).
 *
 * Waits never spin: futex waits on words of the shared mapping (not
 * FUTEX_PRIVATE: other processes wake them), each at most CKPT_POLL_MS, so
 * that a waiter also notices a process that died.
 */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>

#include "fake-cuda-int.h"

#define CKPT_POLL_MS 50
#define NS_PER_MS 1000000ull
#define CKPT_MIN_DRIVER 12080 /* driver 570, CUDA 12.8 */

/* --- Time and futexes ----------------------------------------------------- */

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t real_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000;
}

static uint64_t min_u64(uint64_t a, uint64_t b) {
  return a < b ? a : b;
}

static struct timespec ns_timespec(uint64_t ns) {
  return (struct timespec){(time_t)(ns / 1000000000ull),
                           (long)(ns % 1000000000ull)};
}

static void sleep_ns(uint64_t ns) {
  struct timespec ts = ns_timespec(ns);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Waits while *word == val, at most `ns`: a shared futex, since the word is
 * in the state file's mapping and other processes change it. */
static void futex_wait(uint32_t *word, uint32_t val, uint64_t ns) {
  struct timespec ts = ns_timespec(ns);
  syscall(SYS_futex, word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(uint32_t *word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A decimal environment variable; `def` if unset or not a number. */
static uint64_t env_u64(const char *name, uint64_t def) {
  const char *s = getenv(name);
  char *end;
  if (!s || *s < '0' || *s > '9')
    return def;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  return *end || errno ? def : v;
}

/* --- Work ----------------------------------------------------------------- */

void fake_work_launched(unsigned nvml) {
  fake_cuda_proc_state_t *e = fake_state_self();
  if (!e || nvml >= FAKE_CUDA_MAX_GPUS)
    return;
  nvml = fake_state_phys(e, nvml); /* the GPU it runs on now */
  uint64_t ms = env_u64("FAKE_CUDA_KERNEL_MS", 0);
  if (ms > 24ull * 3600 * 1000)
    ms = 24ull * 3600 * 1000;
  /* Work queues after the process's earlier work, as on one stream. */
  uint64_t now = mono_ns();
  uint64_t busy = __atomic_load_n(&e->busy_until_ns, __ATOMIC_ACQUIRE);
  __atomic_store_n(&e->busy_until_ns,
                   (busy > now ? busy : now) + ms * NS_PER_MS,
                   __ATOMIC_RELEASE);
  uint64_t t = real_us();
  uint64_t until = __atomic_load_n(&e->work_until_us[nvml], __ATOMIC_ACQUIRE);
  if (until < t) {
    __atomic_store_n(&e->work_from_us[nvml], t, __ATOMIC_RELEASE);
    until = t;
  }
  __atomic_store_n(&e->work_until_us[nvml], until + ms * 1000,
                   __ATOMIC_RELEASE);
}

void fake_work_wait(void) {
  fake_cuda_proc_state_t *e = fake_state_self();
  for (;;) {
    uint64_t now = mono_ns();
    uint64_t busy =
        e ? __atomic_load_n(&e->busy_until_ns, __ATOMIC_ACQUIRE) : 0;
    if (busy <= now)
      return;
    sleep_ns(busy - now);
  }
}

void fake_ckpt_mark(uint32_t what) {
  fake_cuda_proc_state_t *e = fake_state_self();
  if (e)
    __atomic_or_fetch(&e->ckpt_unsupported, what, __ATOMIC_ACQ_REL);
}

/* --- The entry gate ------------------------------------------------------- */

/* Calls a fake entry point makes of another (none today) pass freely: the
 * outer call already counts as in flight, and waiting inside it would
 * deadlock with a Lock waiting for it. */
static __thread int tl_gate_depth;

static void claim_settle_dead(fake_cuda_proc_state_t *e);

static void inflight_drop(fake_cuda_proc_state_t *e) {
  /* seq_cst with the Lock's store of LOCKING and load of inflight: either
   * the Lock sees this call leave, or this call sees the Lock and wakes it.
   */
  if (__atomic_sub_fetch(&e->inflight, 1, __ATOMIC_SEQ_CST) == 0 &&
      __atomic_load_n(&e->ckpt_state, __ATOMIC_SEQ_CST) != FAKE_CKPT_RUNNING)
    futex_wake(&e->inflight);
}

fake_gate_t fake_gate_enter(void) {
  fake_gate_t g = {NULL};
  if (tl_gate_depth++ > 0)
    return g;
  fake_cuda_proc_state_t *e = fake_state_self();
  if (!e)
    return g; /* not joined (before cuInit): nobody can lock it */
  for (;;) {
    /* Count first, then look: a Lock stores its state first, then looks
     * at the count (both seq_cst), so no call slips past a Lock that
     * returned. */
    __atomic_add_fetch(&e->inflight, 1, __ATOMIC_SEQ_CST);
    uint32_t s = __atomic_load_n(&e->ckpt_state, __ATOMIC_SEQ_CST);
    if (s == FAKE_CKPT_RUNNING) {
      g.entry = e;
      return g;
    }
    inflight_drop(e);
    /* A Lock whose caller died would hold this process for ever. */
    if (s == FAKE_CKPT_LOCKING)
      claim_settle_dead(e);
    futex_wait(&e->ckpt_state, s, CKPT_POLL_MS * NS_PER_MS);
  }
}

void fake_gate_leave(fake_gate_t *gate) {
  tl_gate_depth--;
  if (gate->entry)
    inflight_drop(gate->entry);
}

/* --- Claims --------------------------------------------------------------- */

static void set_state(fake_cuda_proc_state_t *e, uint32_t s) {
  __atomic_store_n(&e->ckpt_state, s, __ATOMIC_SEQ_CST);
  futex_wake(&e->ckpt_state);
}

static bool any_ckpt_bytes(const fake_cuda_proc_state_t *e) {
  for (int g = 0; g < FAKE_CUDA_MAX_GPUS; g++)
    if (__atomic_load_n(&e->ckpt_bytes[g], __ATOMIC_ACQUIRE))
      return true;
  return false;
}

/* Moves what the entry holds on the GPUs to its checkpointed bytes. Each
 * GPU's count goes down by exactly what the entry held, so no byte is
 * given back twice. */
static void move_to_host(fake_cuda_proc_state_t *e) {
  fake_cuda_state_t *st = fake_state_shared();
  for (int g = 0; g < FAKE_CUDA_MAX_GPUS; g++) {
    uint64_t u = __atomic_exchange_n(&e->used[g], 0, __ATOMIC_ACQ_REL);
    if (!u)
      continue;
    __atomic_add_fetch(&e->ckpt_bytes[g], u, __ATOMIC_ACQ_REL);
    __atomic_sub_fetch(&st->gpu[g].used, u, __ATOMIC_ACQ_REL);
  }
}

/* Settles what a dead caller left half done (the claim is now ours). */
static void settle(fake_cuda_proc_state_t *e, uint32_t op) {
  uint32_t s = __atomic_load_n(&e->ckpt_state, __ATOMIC_SEQ_CST);
  if (op == FAKE_CKPT_OP_LOCK && s == FAKE_CKPT_LOCKING) {
    set_state(e, FAKE_CKPT_RUNNING); /* as a Lock that timed out */
  } else if (op == FAKE_CKPT_OP_CHECKPOINT && s == FAKE_CKPT_LOCKED &&
             any_ckpt_bytes(e)) {
    move_to_host(e); /* it died while moving the bytes: finish */
    set_state(e, FAKE_CKPT_CHECKPOINTED);
  } else if (op == FAKE_CKPT_OP_RESTORE && s == FAKE_CKPT_CHECKPOINTED) {
    /* All charged back: the restore completes. Part of them: they go back
     * to the host, as before the restore. */
    if (any_ckpt_bytes(e))
      move_to_host(e);
    else
      set_state(e, FAKE_CKPT_LOCKED);
  }
}

static void claim_release(fake_cuda_proc_state_t *e) {
  __atomic_store_n(&e->ckpt_op, FAKE_CKPT_OP_NONE, __ATOMIC_RELAXED);
  __atomic_store_n(&e->ckpt_caller_start, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&e->ckpt_caller, 0, __ATOMIC_SEQ_CST);
}

/* Claims the entry for operation `op`: false if a live process has one
 * under way. The claim of a dead caller is taken over, and what it left
 * half done settled first. */
static bool claim(fake_cuda_proc_state_t *e, uint32_t op) {
  int me = (int)getpid();
  bool zombie;
  uint64_t start = fake_cuda_proc_start(me, &zombie);
  for (;;) {
    int c = __atomic_load_n(&e->ckpt_caller, __ATOMIC_SEQ_CST);
    if (c != 0 && fake_cuda_pid_alive(c, __atomic_load_n(&e->ckpt_caller_start,
                                                         __ATOMIC_ACQUIRE)))
      return false;
    if (!__atomic_compare_exchange_n(&e->ckpt_caller, &c, me, false,
                                     __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
      continue;
    if (c != 0)
      settle(e, __atomic_load_n(&e->ckpt_op, __ATOMIC_ACQUIRE));
    __atomic_store_n(&e->ckpt_caller_start, start, __ATOMIC_RELEASE);
    __atomic_store_n(&e->ckpt_op, op, __ATOMIC_RELEASE);
    return true;
  }
}

/* If the entry's caller died, settle what it left; nothing otherwise. */
static void claim_settle_dead(fake_cuda_proc_state_t *e) {
  int c = __atomic_load_n(&e->ckpt_caller, __ATOMIC_SEQ_CST);
  if (c != 0 && claim(e, FAKE_CKPT_OP_NONE))
    claim_release(e);
}

/* --- Common checks -------------------------------------------------------- */

static bool ckpt_supported(void) {
  const char *m = getenv("FAKE_CUDA_CHECKPOINT");
  return fake_driver_version() >= CKPT_MIN_DRIVER &&
         !(m && strcmp(m, "unsupported") == 0);
}

static bool all_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i])
      return false;
  return true;
}

/* The entry of live fake-CUDA process `pid`, or NULL. */
static fake_cuda_proc_state_t *find(int pid) {
  fake_cuda_state_t *st = fake_state_shared();
  if (pid <= 0 || !st)
    return NULL;
  for (int i = 0; i < FAKE_CUDA_MAX_PROCS; i++) {
    fake_cuda_proc_state_t *e = &st->proc[i];
    if (__atomic_load_n(&e->pid, __ATOMIC_ACQUIRE) == pid &&
        fake_cuda_entry_alive(e))
      return e;
  }
  return NULL;
}

/* What every checkpoint call checks, in this order; on success *out is the
 * target's entry. `args_ok` tells whether the arguments are valid;
 * `changes` whether the call changes the target's state (refused on the
 * caller's own pid: it would wait for itself). */
static CUresult begin(const char *entry, int pid, bool args_ok, bool changes,
                      fake_cuda_proc_state_t **out) {
  if (fake_fail_now(entry))
    return CUDA_ERROR_UNKNOWN;
  if (!fake_ready())
    return CUDA_ERROR_NOT_INITIALIZED;
  if (!ckpt_supported())
    return CUDA_ERROR_NOT_SUPPORTED;
  if (!args_ok || (changes && pid == (int)getpid()))
    return CUDA_ERROR_INVALID_VALUE;
  fake_cuda_proc_state_t *e = find(pid);
  if (!e)
    return CUDA_ERROR_INVALID_VALUE;
  uid_t me = geteuid();
  if (me != 0 && me != __atomic_load_n(&e->uid, __ATOMIC_ACQUIRE))
    return CUDA_ERROR_NOT_PERMITTED;
  *out = e;
  return CUDA_SUCCESS;
}

/* Claims the target's entry for `op`, then checks that the entry is still
 * the target's (a reclaimer that marked it first wins: see state_reap). */
static CUresult begin_op(fake_cuda_proc_state_t *e, int pid, uint32_t op) {
  if (!claim(e, op))
    return CUDA_ERROR_ILLEGAL_STATE;
  if (__atomic_load_n(&e->pid, __ATOMIC_SEQ_CST) != pid) {
    claim_release(e);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* Ends an operation with result r. */
static CUresult end_op(fake_cuda_proc_state_t *e, CUresult r) {
  claim_release(e);
  return r;
}

/* The process is stuck for good; counted for fake_cuda_ckpt_wedged. */
static void wedge(fake_cuda_proc_state_t *e, uint32_t how) {
  __atomic_store_n(&e->ckpt_wedge, how, __ATOMIC_RELEASE);
  set_state(e, FAKE_CKPT_FAILED);
  __atomic_add_fetch(&fake_state_shared()->ckpt_wedged, 1, __ATOMIC_ACQ_REL);
}

/* Takes the time the modelled copy of `bytes` needs; false if the target
 * died meanwhile. */
static bool transfer(fake_cuda_proc_state_t *e, uint64_t bytes) {
  const char *s = getenv("FAKE_CUDA_CKPT_GBPS");
  double gbps = s ? strtod(s, NULL) : 0;
  uint64_t ns = 0;
  if (gbps > 0) {
    double t = (double)bytes / gbps; /* bytes / (GB/s) = ns */
    ns = t > 3600e9 ? (uint64_t)3600e9 : (uint64_t)t;
  }
  for (uint64_t end = mono_ns() + ns;;) {
    if (!fake_cuda_entry_alive(e))
      return false;
    uint64_t now = mono_ns();
    if (now >= end)
      return true;
    sleep_ns(min_u64(end - now, CKPT_POLL_MS * NS_PER_MS));
  }
}

/* --- The API -------------------------------------------------------------- */

FAKE_API CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state) {
  fake_cuda_proc_state_t *e;
  CUresult r = begin(__func__, pid, state != NULL, false, &e);
  if (r != CUDA_SUCCESS)
    return r;
  claim_settle_dead(e);
  uint32_t s = __atomic_load_n(&e->ckpt_state, __ATOMIC_SEQ_CST);
  if (s == FAKE_CKPT_LOCKING)
    s = FAKE_CKPT_RUNNING;
  else if (s == FAKE_CKPT_FAILED &&
           __atomic_load_n(&e->ckpt_wedge, __ATOMIC_ACQUIRE) ==
               FAKE_CKPT_WEDGE_RESTORE)
    s = FAKE_CKPT_CHECKPOINTED;
  *state = (CUprocessState)s;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
  fake_cuda_proc_state_t *e;
  CUresult r = begin(__func__, pid, tid != NULL, false, &e);
  if (r == CUDA_SUCCESS)
    *tid = __atomic_load_n(&e->restore_tid, __ATOMIC_ACQUIRE);
  return r;
}

/* Waits until the target has no call in flight and no work left; false on
 * CUDA_ERROR_NOT_READY at `deadline` or CUDA_ERROR_INVALID_VALUE if it
 * died. */
static CUresult lock_wait(fake_cuda_proc_state_t *e, uint64_t deadline) {
  for (;;) {
    if (!fake_cuda_entry_alive(e))
      return CUDA_ERROR_INVALID_VALUE;
    uint64_t now = mono_ns();
    uint32_t n = __atomic_load_n(&e->inflight, __ATOMIC_SEQ_CST);
    uint64_t busy = __atomic_load_n(&e->busy_until_ns, __ATOMIC_ACQUIRE);
    if (n == 0 && busy <= now)
      return CUDA_SUCCESS;
    if (now >= deadline)
      return CUDA_ERROR_NOT_READY;
    uint64_t wait = min_u64(deadline - now, CKPT_POLL_MS * NS_PER_MS);
    if (n)
      futex_wait(&e->inflight, n, wait);
    else
      sleep_ns(min_u64(wait, busy - now));
  }
}

FAKE_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
  fake_cuda_proc_state_t *e;
  bool ok = !args || (args->reserved0 == 0 &&
                      all_zero(args->reserved1, sizeof args->reserved1));
  CUresult r = begin(__func__, pid, ok, true, &e);
  if (r == CUDA_SUCCESS)
    r = begin_op(e, pid, FAKE_CKPT_OP_LOCK);
  if (r != CUDA_SUCCESS)
    return r;
  uint32_t s = FAKE_CKPT_RUNNING;
  if (!__atomic_compare_exchange_n(&e->ckpt_state, &s, FAKE_CKPT_LOCKING, false,
                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    return end_op(e, CUDA_ERROR_ILLEGAL_STATE);
  unsigned ms = args ? args->timeoutMs : 0;
  r = lock_wait(e, ms ? mono_ns() + ms * NS_PER_MS : UINT64_MAX);
  set_state(e, r == CUDA_SUCCESS ? FAKE_CKPT_LOCKED : FAKE_CKPT_RUNNING);
  return end_op(e, r);
}

FAKE_API CUresult
cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
  fake_cuda_proc_state_t *e;
  bool ok = !args || all_zero(args->reserved, sizeof args->reserved);
  CUresult r = begin(__func__, pid, ok, true, &e);
  if (r == CUDA_SUCCESS)
    r = begin_op(e, pid, FAKE_CKPT_OP_CHECKPOINT);
  if (r != CUDA_SUCCESS)
    return r;
  if (__atomic_load_n(&e->ckpt_state, __ATOMIC_SEQ_CST) != FAKE_CKPT_LOCKED)
    return end_op(e, CUDA_ERROR_ILLEGAL_STATE);
  if (__atomic_load_n(&e->ckpt_unsupported, __ATOMIC_ACQUIRE)) {
    wedge(e, FAKE_CKPT_WEDGE_CHECKPOINT);
    return end_op(e, CUDA_ERROR_NOT_SUPPORTED);
  }
  uint64_t bytes = 0;
  for (int g = 0; g < FAKE_CUDA_MAX_GPUS; g++)
    bytes += __atomic_load_n(&e->used[g], __ATOMIC_ACQUIRE);
  /* The GPU memory is free only once the copy is done. */
  if (!transfer(e, bytes))
    return end_op(e, CUDA_ERROR_INVALID_VALUE);
  move_to_host(e);
  set_state(e, FAKE_CKPT_CHECKPOINTED);
  return end_op(e, CUDA_SUCCESS);
}

/* gpuPairs (driver 580, CUDA 13.0): where each GPU goes, into to[] (NVML
 * indices; a GPU not moved maps onto itself). As cuda.h and what is known
 * of driver 580 say (../shared/notes/suspension.md): the pairs name fake
 * GPUs, each old and each new GPU at most once, and every GPU the process
 * could see; a GPU goes only onto one of the same chip (here: the same
 * size); and a process started with a restricted CUDA_VISIBLE_DEVICES is
 * refused even an identity mapping (CUDA_ERROR_INVALID_VALUE, as
 * NVIDIA's cuda-python team reported). Before CUDA 13.0 the struct had
 * no such fields: the bytes must be zero. */
static CUresult restore_pairs(const fake_cuda_proc_state_t *e,
                              const CUcheckpointRestoreArgs *args,
                              unsigned to[FAKE_CUDA_MAX_GPUS]) {
  bool from_named[FAKE_CUDA_MAX_GPUS] = {false};
  bool to_named[FAKE_CUDA_MAX_GPUS] = {false};
  for (unsigned g = 0; g < FAKE_CUDA_MAX_GPUS; g++)
    to[g] = g;
  if (!args || args->gpuPairsCount == 0)
    return CUDA_SUCCESS;
  unsigned ngpus = __atomic_load_n(&e->ngpus, __ATOMIC_ACQUIRE);
  if (fake_driver_version() < 13000 || args->gpuPairsCount > ngpus ||
      __atomic_load_n(&e->sees, __ATOMIC_ACQUIRE) < ngpus)
    return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < args->gpuPairsCount; i++) {
    unsigned from, dest;
    if (!fake_uuid_nvml(&args->gpuPairs[i].oldUuid, &from) ||
        !fake_uuid_nvml(&args->gpuPairs[i].newUuid, &dest) || from >= ngpus ||
        dest >= ngpus || from_named[from] || to_named[dest] ||
        fake_state_total(from) != fake_state_total(dest))
      return CUDA_ERROR_INVALID_VALUE;
    from_named[from] = to_named[dest] = true;
    to[from] = dest;
  }
  for (unsigned g = 0; g < ngpus; g++)
    if (!from_named[g])
      return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

/* After a restore that moved GPUs: the owner's view follows its memory. */
static void remap(fake_cuda_proc_state_t *e,
                  const unsigned to[FAKE_CUDA_MAX_GPUS]) {
  for (unsigned v = 0; v < FAKE_CUDA_MAX_GPUS; v++) {
    unsigned now = to[fake_state_phys(e, v)];
    __atomic_store_n(&e->moved[v], (uint8_t)(now == v ? 0 : now + 1),
                     __ATOMIC_RELEASE);
  }
}

FAKE_API CUresult cuCheckpointProcessRestore(int pid,
                                             CUcheckpointRestoreArgs *args) {
  fake_cuda_proc_state_t *e;
  bool ok = !args || ((args->gpuPairsCount == 0 || args->gpuPairs) &&
                      all_zero(args->reserved, sizeof args->reserved) &&
                      args->reserved1 == 0);
  CUresult r = begin(__func__, pid, ok, true, &e);
  if (r == CUDA_SUCCESS)
    r = begin_op(e, pid, FAKE_CKPT_OP_RESTORE);
  if (r != CUDA_SUCCESS)
    return r;
  uint32_t s = __atomic_load_n(&e->ckpt_state, __ATOMIC_SEQ_CST);
  if (s == FAKE_CKPT_FAILED)
    return end_op(e, CUDA_ERROR_OPERATING_SYSTEM);
  if (s != FAKE_CKPT_CHECKPOINTED)
    return end_op(e, CUDA_ERROR_ILLEGAL_STATE);
  unsigned to[FAKE_CUDA_MAX_GPUS];
  if ((r = restore_pairs(e, args, to)) != CUDA_SUCCESS)
    return end_op(e, r);
  /* Charged back first, all GPUs or none, so the memory is taken from the
   * start of the copy; onto the GPU each pair names. Each GPU's bytes are
   * either checkpointed or charged, never both. */
  uint64_t bytes = 0;
  for (unsigned g = 0; r == CUDA_SUCCESS && g < FAKE_CUDA_MAX_GPUS; g++) {
    uint64_t b = __atomic_load_n(&e->ckpt_bytes[g], __ATOMIC_ACQUIRE);
    if (b && (r = fake_state_charge_entry(e, to[g], b)) == CUDA_SUCCESS) {
      __atomic_sub_fetch(&e->ckpt_bytes[g], b, __ATOMIC_ACQ_REL);
      bytes += b;
    }
  }
  if (r != CUDA_SUCCESS) {
    move_to_host(e); /* what was charged goes back */
    wedge(e, FAKE_CKPT_WEDGE_RESTORE);
    return end_op(e, r);
  }
  remap(e, to);
  if (!transfer(e, bytes))
    return end_op(e, CUDA_ERROR_INVALID_VALUE);
  set_state(e, FAKE_CKPT_LOCKED);
  return end_op(e, CUDA_SUCCESS);
}

FAKE_API CUresult cuCheckpointProcessUnlock(int pid,
                                            CUcheckpointUnlockArgs *args) {
  fake_cuda_proc_state_t *e;
  bool ok = !args || all_zero(args->reserved, sizeof args->reserved);
  CUresult r = begin(__func__, pid, ok, true, &e);
  if (r == CUDA_SUCCESS)
    r = begin_op(e, pid, FAKE_CKPT_OP_UNLOCK);
  if (r != CUDA_SUCCESS)
    return r;
  if (__atomic_load_n(&e->ckpt_state, __ATOMIC_SEQ_CST) != FAKE_CKPT_LOCKED)
    return end_op(e, CUDA_ERROR_ILLEGAL_STATE);
  set_state(e, FAKE_CKPT_RUNNING);
  return end_op(e, CUDA_SUCCESS);
}

/* --- Test hooks ----------------------------------------------------------- */

/* The state file, mapped on first use; NULL if it cannot be. */
static fake_cuda_state_t *hook_state(void) {
  fake_lock();
  bool ok = fake_state_open() == CUDA_SUCCESS;
  fake_unlock();
  return ok ? fake_state_shared() : NULL;
}

FAKE_API int fake_cuda_ckpt_state(int pid) {
  if (!hook_state())
    return -1;
  fake_cuda_proc_state_t *e = find(pid);
  if (!e)
    return -1;
  claim_settle_dead(e);
  return (int)__atomic_load_n(&e->ckpt_state, __ATOMIC_SEQ_CST);
}

FAKE_API unsigned long long fake_cuda_ckpt_bytes(int pid, int nvml_index) {
  fake_cuda_proc_state_t *e =
      hook_state() && nvml_index >= 0 && nvml_index < FAKE_CUDA_MAX_GPUS
          ? find(pid)
          : NULL;
  return e ? __atomic_load_n(&e->ckpt_bytes[nvml_index], __ATOMIC_ACQUIRE) : 0;
}

FAKE_API unsigned long long fake_cuda_ckpt_wedged(void) {
  fake_cuda_state_t *st = hook_state();
  return st ? __atomic_load_n(&st->ckpt_wedged, __ATOMIC_ACQUIRE) : 0;
}
