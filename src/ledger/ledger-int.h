/*
 * ledger-int.h: the node state's shared-memory layout and the ledger's
 * internal interfaces.
 *
 * The state is one file, state_dir/state, mapped by every attached process.
 * Consistency rests on three mechanisms:
 *  - Liveness without PIDs: each client holds an OFD write lock on one byte
 *    of the file (LEDGER_LOCK_BASE + slot). The kernel drops it when the
 *    process dies, whatever its PID namespace and however its PID is reused.
 *  - A lock that cannot be abandoned: a futex word naming its owner's
 *    (slot, generation). A waiter that finds the owner dead takes it over.
 *  - An undo log: every store under the lock is logged first, so a takeover
 *    rolls a dead holder's half-done transaction back.
 * The layout is versioned; a file that is not exactly this version is never
 * read beyond its header.
 */
#ifndef COGPU_LEDGER_INT_H
#define COGPU_LEDGER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "cogpu.h"
#include "internal.h"
#include "ledger/core.h"
#include "ledger/ledger.h"
#include "nvml/nvml.h"

#define LEDGER_MAGIC "COGPUST\0"
/* 7: hdr.slot_map, the slots in use. */
#define LEDGER_VERSION 10u
#define LEDGER_MAX_GPUS COGPU_NVML_MAX_GPUS
/* Enough for the node daemon's 10,000 connected clients; a slot costs
 * nothing until it is used (the file's pages are touched on use). */
#define LEDGER_MAX_SLOTS 16384u
#define LEDGER_MAX_WAITERS 4096u
#define LEDGER_TX_MAX 32u
/* Liveness lock bytes live far past the end of the data, at an offset that
 * every layout version keeps, so a newer or older cogpu can still tell
 * whether a state file is in use before refusing it. */
#define LEDGER_LOCK_BASE ((off_t)1 << 40)
#define LEDGER_LOCK_MASTER (LEDGER_LOCK_BASE - 1) /* held during creation */

/* Lock word: bits 0-14 slot+1, bit 15 contended, bits 16-31 generation. */
#define LOCKW_SLOT_MASK 0x7fffu
#define LOCKW_CONTENDED 0x8000u
#define LOCKW_GEN_SHIFT 16
#define LOCKW_GEN_MASK 0xffffu

enum slot_state { SLOT_FREE = 0, SLOT_ACTIVE = 1 };
/* ledger_slot_t.leaving: no; yes; yes, and NVML lists the process on none
 * of the GPUs where the slot holds memory (the daemon frees it). */
enum { LEDGER_LEAVING_NO = 0, LEDGER_LEAVING = 1, LEDGER_LEAVING_GONE = 2 };
/* W_REFUSED: failed by the deadlock guard; the waiter returns
 * COGPU_EDEADLOCK. */
enum waiter_state {
  W_FREE = 0,
  W_WAITING = 1,
  W_GRANTED = 2,
  W_REFUSED = 3,
  W_JOB_SPARE = 4 /* its job has unclaimed memory: claim, then ask again */
};
/* A job's suspension (node mode, suspend.c): NONE -> SUSPENDING (its
 * processes are being locked and checkpointed; its memory is still on the
 * GPU and counted in held) -> SUSPENDED (its footprint is in host memory:
 * held on susp_gpu moved to parked, no longer reserved on the GPU; a
 * resume entry waits in the queue unless it was suspended by hand) ->
 * RESUMING (the resume entry was served: the footprint is reserved in held
 * again, and only then are its processes restored) -> NONE. */
enum susp_state {
  SUSP_NONE = 0,
  SUSP_SUSPENDING = 1,
  SUSP_SUSPENDED = 2,
  SUSP_RESUMING = 3
};

typedef struct ledger_gpu_s {
  /* Set at creation, covered by the header checksum. */
  char uuid[96];
  char name[96];
  uint32_t index;
  uint32_t pad0;
  uint64_t total;
  uint64_t margin;
  /* Updated under the lock. */
  uint64_t foreign;
  uint64_t reserved;  /* derived: sum of slots' held[g] */
  uint64_t nclients;  /* derived: slots with held[g] > 0 or exclusive */
  uint64_t excl_slot; /* slot+1 of the exclusive holder, 0 if none */
  /* How long the copy of the last job parked here took (ns; the daemon's
   * measure; 0: none yet): what a parking costs on this GPU's link. */
  uint64_t park_ns;
  /* When the last job that moved away from this GPU was parked here
   * (monotonic; migration): the order window after that parking goes on
   * here as if it were still parked (suspend.c, in_order). */
  uint64_t moved_park_ns;
} ledger_gpu_t;

typedef struct ledger_slot_s {
  _Atomic uint32_t gen; /* bumped when claimed; names the owner in the lock */
  uint32_t pad0;
  uint64_t state; /* enum slot_state */
  int32_t pid;    /* in the PID namespace of /proc (host PID when visible) */
  uint32_t uid;
  int32_t priority;
  uint32_t pad1;
  uint64_t attached_ns; /* CLOCK_REALTIME, for status */
  char command[128];
  char job_id[64];
  uint64_t held[LEDGER_MAX_GPUS];
  /* A process that joined a job takes its share of the job's reservation
   * from the job's slot (claim), so that the job's memory is counted once
   * however many of its processes use it, one after another or at once. */
  uint64_t job;                    /* joined job's slot+1, 0 for none */
  uint64_t job_gen;                /* that slot's generation */
  uint64_t claim[LEDGER_MAX_GPUS]; /* member: bytes taken from its job */
  uint64_t lent[LEDGER_MAX_GPUS];  /* job: its members' claims (derived) */
  /* Node mode (the daemon's state, readable by root only): what a client
   * proves to re-register after a daemon restart, and its process's start
   * time, which with the host PID names the process without ambiguity. */
  uint64_t secret[2];
  uint64_t starttime;
  /* The client's last request that changed the ledger, and its answer: a
   * request resent after a daemon restart is answered, not done twice. */
  /* When the slot last gave memory back (monotonic): a job that released
   * within the last tick is making progress, whatever else it waits for
   * (threads of one process reserve and release at once). */
  uint64_t released_ns;
  /* When the job (its slot) last asked for more on a GPU where it already
   * held memory (monotonic, coarse): a job that grows now. Growth waits
   * in order behind it while its growth and the request do not both fit
   * (suspend.c, order_holds): the deadlock that would park someone. */
  uint64_t grew_ns;
  /* Node mode: the process's connection closed while the slot held memory
   * and the process had not gone (LEDGER_LEAVING_*). The driver frees a
   * process's memory when the process has gone, after its connection
   * closed (the kernel closes descriptors in turn at exit; a library's
   * destructor may close first): granted to a waiter at the close, that
   * memory was refused to it by the driver. The slot keeps its bookings
   * until the daemon sees the process gone (its pidfd), the process
   * connects again to the slot (it lost its connection), or NVML lists it
   * on no GPU; meanwhile it neither grows, waits nor is parked. A new
   * image (exec) attaches a slot of its own: whether the driver freed the
   * old one's memory is not known here, so that slot stays booked. */
  uint64_t leaving;
  uint64_t last_op;
  int64_t last_rc;
  int64_t last_gpu;
  uint64_t last_a;
  /* Suspension (suspend.c). flags: COGPU_MARK_* the process reported
   * (it uses CUDA; what it used that cannot be checkpointed). The rest is
   * the job's (its slot's): state, the one GPU it holds memory on, the
   * footprint moved to host memory, whether a person suspended it (it then
   * resumes only when asked), since when (monotonic), how often, and until
   * when it is not to be picked again after a suspension failed. */
  uint64_t flags;
  uint64_t susp;
  uint64_t susp_gpu;
  uint64_t parked;
  uint64_t susp_manual;
  uint64_t susp_since_ns;
  uint64_t susp_count;
  uint64_t susp_retry_ns;
  /* Migration (suspend.c, option migrate). A process names GPUs as it saw
   * them when it started (the preload library keeps the ledger index of
   * each of its devices); a restore onto other GPUs moves them under it,
   * and the daemon translates what the process sends and what it is
   * answered. gpu_map: the process's own (not its job's: a process that
   * starts after the move sees the GPUs where they are), the GPU each of
   * its GPUs is on now, as a nibble per GPU XOR its index (0: none
   * moved); see cogpu__ledger_map_phys. susp_from: the job's, the GPU a
   * resume under way moves it from, + 1 (0: not moving), and the kind of
   * that resume (LEDGER_RESUME_*), which it keeps if the move is refused. */
  uint64_t gpu_map;
  uint64_t susp_from;
  uint64_t susp_from_kind;
  /* Usage and the job's figures for its history record (usage.c,
   * docs/history.md). `usage` is the process's own page in single-user
   * mode (it writes it, relaxed atomics); in node mode the daemon copies
   * the process's memfd page into it. The rest is the job's (its slot's):
   * the peaks of its processes that have ended (job_peak, and when the
   * highest was reached), the most its reservation held on one GPU, time
   * spent in the queue, requests the deadlock guard failed, and the exit
   * status its cogpu run reported (wait status + 1; 0 unknown). Figures,
   * not bookings: written outside the undo log. */
  cogpu__usage_t usage;
  uint64_t job_peak[LEDGER_MAX_GPUS];
  uint64_t job_peak_ns;
  uint64_t held_max;
  uint64_t held_max_gpu;
  uint64_t waited_ns;
  uint64_t guard_fails;
  uint64_t exit_status;
  /* A step of a job (a Slurm step's slurmstepd): a process that joined the
   * job through the step's own token (cogpu__step_token) belongs to the
   * job, for its bookings and the job's figures, and to the step, for the
   * step's report: group is the step's slot+1 (0: it joined the job
   * itself), group_gen that slot's generation. group_peak is a step's
   * job_peak: the peaks of the step's processes that have ended. */
  uint64_t group;
  uint64_t group_gen;
  uint64_t group_peak[LEDGER_MAX_GPUS];
  uint64_t group_peak_ns;
  /* Memory that escaped the preload library (foreign.c): what processes of
   * the job that are not clients (they dropped LD_PRELOAD, are static, or
   * load the driver privately) hold on its GPUs, as NVML last said; the
   * biggest such process and its GPU; the most it came to. Counted as foreign
   * (no one else is granted it) and named here for the job. Figures, written at
   * each foreign refresh outside the undo log. */
  uint64_t escaped;
  int64_t escaped_pid;
  uint64_t escaped_gpu;
  uint64_t escaped_max;
} ledger_slot_t;
_Static_assert(COGPU_USAGE_GPUS == LEDGER_MAX_GPUS,
               "a usage page has a word per ledger GPU");

/* A resume entry: queued when the ledger parked the job (it waits until
 * the job can grow to its expected peak), or by `cogpu resume` (back as
 * soon as its footprint fits). */
enum { LEDGER_RESUME_AUTO = 1, LEDGER_RESUME_BY_HAND = 2 };

typedef struct ledger_waiter_s {
  _Atomic uint32_t futex; /* 0 while waiting; set to 1 to wake */
  uint32_t pad0;
  uint64_t state; /* enum waiter_state */
  uint64_t slot;  /* slot the grant goes to (the job's) */
  uint64_t gen;   /* that slot's generation when enqueued */
  uint64_t owner; /* slot of the waiting process (its liveness) */
  int64_t gpu;    /* asked for, or COGPU_GPU_AUTO */
  uint64_t bytes;
  int64_t priority;
  uint64_t ticket; /* arrival order */
  uint64_t since_ns;
  uint64_t exclusive;
  int64_t granted_gpu;
  uint64_t nowait; /* only asking: leaves the queue at once if not served */
  /* A suspended job's resume: it asks for the job's parked footprint plus
   * what the job's own requests on that GPU ask (computed when served);
   * no client waits on it, the daemon restores the job when it is served. */
  uint64_t resume; /* 0, or LEDGER_RESUME_AUTO or _BY_HAND */
  /* COGPU__REQ_DEVICE_WAIT, COGPU__REQ_JOB_SPARE (internal.h). */
  uint64_t flags;
} ledger_waiter_t;

typedef struct ledger_txent_s {
  uint64_t off; /* byte offset in the state of the 8-byte field */
  uint64_t old;
} ledger_txent_t;

/* The node's counters (cogpu metrics). Each is bumped in the transaction
 * that makes the decision it counts (a grant, a refusal, a request leaving
 * the queue), so a transaction a dead holder left half done and that is
 * rolled back is not counted either. Monotonic; a repair never recounts
 * them. */
typedef struct ledger_counters_s {
  uint64_t admit[COGPU_ADMIT_NRESULTS];
  uint64_t wait_bucket[COGPU_WAIT_BUCKETS]; /* not cumulative; last: +Inf */
  uint64_t wait_sum_us;
  uint64_t suspensions;
  uint64_t suspend_failures;
  uint64_t resumes;
  uint64_t resume_failures;
  uint64_t deadlock_suspensions;
  uint64_t copy_bytes; /* checkpoint copies done: bytes out and back */
  uint64_t copy_us;    /* and the time they took */
} ledger_counters_t;

typedef struct ledger_hdr_s {
  char magic[8];
  uint32_t version;
  uint32_t hdr_size;
  uint64_t file_size;
  uint32_t slot_size;
  uint32_t waiter_size;
  uint32_t max_slots;
  uint32_t max_waiters;
  uint32_t ngpus;
  uint32_t policy; /* enum cogpu__policy */
  uint64_t created_ns;
  uint64_t max_clients;
  uint64_t mmu_max_age_ms;
  uint64_t foreign_refresh_ms;
  uint64_t sweep_interval_ms;
  uint64_t checksum; /* over the header's fixed part and the GPU descriptors */
  /* Mutable part. */
  _Atomic uint32_t lock;
  /* When a client last left (exit, death, detach) or released all it held
   * on a GPU: CLOCK_MONOTONIC in ms, modulo 2^32; 0 never. The driver may
   * still hold that client's memory for a moment, which is the only reason
   * the preload library retries a driver's refusal. A hint, outside the
   * undo log (it was padding: the layout is unchanged). */
  _Atomic uint32_t left_ms;
  _Atomic uint64_t tx_n;
  ledger_txent_t tx[LEDGER_TX_MAX];
  uint64_t next_ticket;
  uint64_t nwaiting;              /* derived: waiters in W_WAITING */
  _Atomic uint64_t foreign_at_ns; /* last NVML refresh (monotonic) */
  _Atomic uint64_t repairs;       /* times a dead holder was recovered */
  /* The slots in use: a bit for every slot that is active or still
   * accounts for memory that escaped the preload library (foreign.c). A
   * superset: a set bit may stand for a free slot (its holder died between
   * freeing the slot and clearing the bit, or a transaction making it
   * active was rolled back), never the other way round, because the bit is
   * set before a slot becomes active and cleared only once it is free, both
   * under the lock. Scans walk it (LEDGER_FOR_SLOTS), so a status or an
   * attach reads the slots in use, not the whole 23 MiB table (every page
   * of which it touched before: 40 s for 100 attaches under TSan). A
   * recount rebuilds it from every slot. Outside the undo log. */
  _Atomic uint64_t slot_map[LEDGER_MAX_SLOTS / 64];
  ledger_gpu_t gpus[LEDGER_MAX_GPUS];
  ledger_counters_t counters;
} ledger_hdr_t;

typedef struct ledger_state_s {
  ledger_hdr_t hdr;
  ledger_slot_t slots[LEDGER_MAX_SLOTS];
  ledger_waiter_t waiters[LEDGER_MAX_WAITERS];
} ledger_state_t;

/* The first slot from s on whose bit is set in the slot map, or
 * LEDGER_MAX_SLOTS. Lock-free readers (the sweep's probes) may miss a slot
 * made active meanwhile, as they may when reading its state. */
static inline uint32_t cogpu__ledger_slot_next(const ledger_state_t *st,
                                               uint32_t s) {
  while (s < LEDGER_MAX_SLOTS) {
    uint64_t w =
        atomic_load_explicit((_Atomic uint64_t *)&st->hdr.slot_map[s / 64],
                             memory_order_relaxed) >>
        (s % 64);
    if (w)
      return s + (uint32_t)__builtin_ctzll(w);
    s = (s / 64 + 1) * 64;
  }
  return LEDGER_MAX_SLOTS;
}
/* Every slot that may be in use, in order; the body still checks the
 * slot's state. _WHILE stops early once cond is false. */
#define LEDGER_FOR_SLOTS_WHILE(st, s, cond)                                    \
  for (uint32_t s = cogpu__ledger_slot_next((st), 0);                          \
       s < LEDGER_MAX_SLOTS && (cond);                                         \
       s = cogpu__ledger_slot_next((st), s + 1))
#define LEDGER_FOR_SLOTS(st, s) LEDGER_FOR_SLOTS_WHILE(st, s, true)
/* Bit maps over slots (uint8_t[LEDGER_MAX_SLOTS / 8]): the scans that
 * mark slots in one pass and test them in another (policy.c's deadlock
 * guard, suspend.c's jobs that grow). */
#define LEDGER_BIT_SET(map, i) ((map)[(i) / 8] |= (uint8_t)(1u << ((i) % 8)))
#define LEDGER_BIT_GET(map, i) (((map)[(i) / 8] >> ((i) % 8)) & 1u)

/* A process's attachment to the ledger: the ledger backend's handle behind
 * a public cogpu_t in single-user mode (api-int.h), or the daemon's own
 * handle and its proxy (trusted mode). The tag is the one the daemon names
 * (struct cogpu_s); the public handle is the facade's, struct
 * cogpu_handle_s.
 *
 * Its lifecycle: attached, then either done (its slot was freed: at exit,
 * by the exit destructor, while other threads of the process may still
 * call in) or forked (in a fork child: the slot is the parent's). `done`
 * is set under the ledger lock before the slot is freed, and every entry
 * point that changes the ledger re-checks it, with the slot's state and
 * generation, under the lock (cogpu__ledger_handle_live): nothing is ever
 * granted into a freed slot. */
#define LEDGER_WAKE_LATER_MAX 16
struct ledger_host_s;
struct cogpu_s {
  /* The daemon that runs this handle (trusted mode: its hooks and its
   * wake list; shared by the daemon's own handle and its proxy), or NULL:
   * a process's own handle (single-user mode). Never a global: a test
   * process holds both kinds at once. */
  struct ledger_host_s *host;
  ledger_state_t *st;
  int fd;
  /* Waiters served while this handle holds the lock, woken once it is
   * released (lock.c); written only under the lock. */
  uint16_t wake_list[LEDGER_WAKE_LATER_MAX];
  uint16_t wake_n;
  uint32_t slot; /* this process's own slot: lock owner, liveness */
  uint32_t gen;
  uint32_t res_slot; /* where reservations go: own slot, or a joined job's */
  uint32_t res_gen;  /* the joined slot's generation */
  int priority;
  bool forked;        /* set in a fork child: the handle is the parent's */
  _Atomic bool done;  /* its slot was freed (exit): refuse every call */
  bool unlinked_said; /* told that its state was deleted and replaced */
  /* The daemon's proxy: the client's request to record in its slot
   * (last_op) in the same transaction as the change it makes, so that a
   * daemon killed in between leaves both or neither. */
  bool rec_pending;
  uint32_t rec_op;
  int64_t rec_gpu; /* -1: the GPU of the grant in the transaction */
  uint64_t rec_a;
  int64_t granted_gpu; /* set by cogpu__ledger_grant */
  char path[512];
  cogpu__config_t cfg;
};

/* --- Trusted mode (the node daemon) ----------------------------------------
 * In the daemon's process the ledger is written by one thread on behalf of
 * its clients, and a client is alive while its connection is: the daemon
 * frees a slot when the connection closes. So liveness is the slot's state
 * and generation, the lock is never contended, and wake-ups are collected
 * for the daemon (cogpu__ledger_take_wakes) instead of futex calls. A
 * handle is trusted when it has a host (ledger_host_t, at the end of this
 * file). */
#define cogpu__ledger_trusted(h) ((h)->host != NULL)

/* --- shm.c: the state file ---------------------------------------------- */
/* Open (creating if needed) and map the node state per cfg; claims a slot
 * for h (h->st, h->fd, h->slot, h->gen set). */
int cogpu__ledger_shm_open(struct cogpu_s *h);
void cogpu__ledger_shm_close(struct cogpu_s *h);
uint64_t cogpu__ledger_checksum(const ledger_hdr_t *hdr);
/* Is any client slot of the file behind fd locked by a live process? */
int cogpu__ledger_shm_in_use(int fd, bool *in_use);
/* Off the fast path, without the lock: if the state file was deleted under
 * us (RemoveIPC), re-publish it for newcomers by reference, or say loudly
 * that a second state exists. 0 when linked or re-published. */
int cogpu__ledger_shm_check_linked(struct cogpu_s *h);
/* The magic `cogpu reset` writes into a state it removes. */
#define LEDGER_RETIRED_MAGIC "COGPURT\0"

/* --- lock.c: lock, undo log, liveness, repair ------------------------------
 */
void cogpu__ledger_lock(struct cogpu_s *h);
/* Does someone wait for the lock (which the caller holds)? */
bool cogpu__ledger_lock_contended(struct cogpu_s *h);
/* The same, for the entry points: gives up with -EBUSY (message naming the
 * holder's pid) when a live holder keeps the lock 5 s (it is stopped), so
 * that no program hangs in a CUDA call, and no `cogpu status`, because of
 * another process. Unbounded in the daemon. */
int cogpu__ledger_lock_bounded(struct cogpu_s *h);
void cogpu__ledger_unlock(struct cogpu_s *h);
/* The fast paths' lock and unlock, inline at the end of this header. */
static inline int cogpu__ledger_lock_fast(struct cogpu_s *h);
static inline void cogpu__ledger_unlock_fast(struct cogpu_s *h);
/* Wake this waiter when the lock is next released by this thread. */
void cogpu__ledger_wake_later(struct cogpu_s *h, uint32_t waiter);
bool cogpu__ledger_slot_alive(struct cogpu_s *h, uint32_t slot, uint32_t gen);
void cogpu__ledger_tx_commit(struct cogpu_s *h);
/* Roll back a dead holder's transaction and recompute derived counters. */
void cogpu__ledger_repair(struct cogpu_s *h);
/* 0 if the ledger's invariants hold; otherwise says which does not (why,
 * len) and returns nonzero. Lock held. */
int cogpu__ledger_invariants(struct cogpu_s *h, char *why, size_t len);
/* Lock held: check the invariants; if they do not hold (a counter went
 * wrong: a bug, or a process that wrote the state), recount and say so.
 * Returns whether they held. */
bool cogpu__ledger_verify(struct cogpu_s *h);
/* Recompute the derived counters from the slots and waiters (lock held,
 * no transaction open); logs a warning for each that was wrong. */
void cogpu__ledger_recount(struct cogpu_s *h);
/* Free one slot: its reservations, exclusivity and waiters. */
void cogpu__ledger_slot_free(struct cogpu_s *h, uint32_t s);
/* Slot s's connection closed while its process lives and it holds memory
 * (lock held): it keeps its bookings, its requests are cancelled, and it
 * is neither grown, waited behind nor parked (ledger_slot_t.leaving). */
void cogpu__ledger_slot_leave(struct cogpu_s *h, uint32_t s);
/* Does slot s hold memory on some GPU, its own or claimed from its job? */
bool cogpu__ledger_slot_holds(const ledger_state_t *st, uint32_t s);
/* The slot map (hdr.slot_map), lock held: set slot s's bit (before the
 * slot becomes active); clear it, if the slot is free and accounts for no
 * escaped memory. */
void cogpu__ledger_slot_mark(struct cogpu_s *h, uint32_t s);
void cogpu__ledger_slot_unmark(struct cogpu_s *h, uint32_t s);
/* Record that a client left or released all it held (hdr.left_ms). */
void cogpu__ledger_note_left(struct cogpu_s *h);
/* The sweep, in two halves so that the lock is never held across a system
 * call: cogpu__ledger_sweep_probe, without the lock, finds active slots
 * whose liveness lock is free (one F_OFD_GETLK each) and records them with
 * their generations; cogpu__ledger_sweep_apply, with the lock, frees those
 * that are still active with the same generation (and their waiters), and
 * returns how many. At most LEDGER_SWEEP_MAX a sweep; more is set when
 * there were more, which the next sweep takes. */
#define LEDGER_SWEEP_MAX 64u
typedef struct ledger_sweep_s {
  uint32_t n;
  bool more;
  uint32_t slot[LEDGER_SWEEP_MAX];
  uint32_t gen[LEDGER_SWEEP_MAX];
} ledger_sweep_t;
void cogpu__ledger_sweep_probe(struct cogpu_s *h, ledger_sweep_t *sw);
int cogpu__ledger_sweep_apply(struct cogpu_s *h, const ledger_sweep_t *sw);
/* Liveness probes made while this process held the lock (for tests). */
extern _Atomic uint64_t cogpu__ledger_probes_locked;

/* --- policy.c: who is served ---------------------------------------------- */
static inline uint64_t cogpu__ledger_capacity(const ledger_gpu_t *g) {
  return cogpu__core_capacity(g->total, g->margin, g->foreign);
}
/* A GPU and the node's rules as the decisions (core.h) see them. Inline:
 * the fast path's fit and booking read the GPU through it. */
static inline cogpu__core_gpu_t cogpu__ledger_core_gpu(const ledger_gpu_t *g) {
  return (cogpu__core_gpu_t){
      .capacity = cogpu__core_capacity(g->total, g->margin, g->foreign),
      .reserved = g->reserved,
      .nclients = g->nclients,
      .excl = g->excl_slot};
}
cogpu__core_rules_t cogpu__ledger_core_rules(struct cogpu_s *h);
/* Can `bytes` (or exclusive use) be granted on GPU gi to slot now? */
static inline bool cogpu__ledger_fits(struct cogpu_s *h, uint32_t gi,
                                      uint32_t slot, uint64_t bytes,
                                      bool exclusive) {
  ledger_hdr_t *hd = &h->st->hdr;
  cogpu__core_gpu_t g = cogpu__ledger_core_gpu(&hd->gpus[gi]);
  cogpu__core_rules_t r = {.max_clients = hd->max_clients};
  return cogpu__core_fits(&r, &g, (uint64_t)slot + 1,
                          h->st->slots[slot].held[gi], bytes, exclusive);
}
/* Grant to `slot` on GPU gi (transactional; no commit), for the process
 * of slot `member` (the job's own slot, or one of its processes). Refuses
 * (false, nothing written) a slot that is not active. */
bool cogpu__ledger_grant(struct cogpu_s *h, uint32_t gi, uint32_t slot,
                         uint32_t member, uint64_t bytes, bool exclusive);
/* Set by the daemon (trusted mode): has process slot s a request the
 * daemon has not answered yet (being handled now, or in its connection's
 * buffer)? A process's requests share one connection, in turn, so its
 * other threads may wait behind that one, asleep, with a release in hand:
 * its job is moving (policy.c's deadlock guard). NULL elsewhere: in
 * single-user mode a release is the process's own call, seen as a
 * contended lock or a runnable thread. */
typedef struct ledger_guard_hooks_s {
  void *ctx;
  bool (*answer_due)(void *ctx, uint32_t s);
} ledger_guard_hooks_t;
/* Serve every waiter the node's policy allows now, waking each. */
void cogpu__ledger_serve(struct cogpu_s *h);
/* How long a request must wait, and a job must not have released, before
 * the deadlock guard counts it: a housekeeping tick, at most
 * LEDGER_GUARD_DELAY_MS in the daemon. */
#define LEDGER_GUARD_DELAY_MS 200u
/* How much longer, at most, a waiting process with a runnable thread keeps
 * the guard off (policy.c): a thread that spins for ever must not keep a
 * real deadlock standing. */
#define LEDGER_GUARD_RUNNABLE_MS 5000u
/* How long after the ledger last parked a job of a GPU its growth goes in
 * order, the jobs ahead first (suspend.c, in_order): at least this, and
 * twice the last parking's copy there, at most LEDGER_LEAD_HOLD_MAX_MS. */
#define LEDGER_LEAD_HOLD_MS 5000u
#define LEDGER_LEAD_HOLD_MAX_MS 300000u
/* A job "grows now" (suspend.c, order_holds) for this long after it last
 * asked for more where it held memory: jobs warming up ask every few
 * tens or hundreds of milliseconds; one that has not asked for a second
 * has settled (a service, a training loop past its first steps), and
 * keeps nobody waiting behind it. */
#define LEDGER_GROWING_MS 1000u
uint64_t cogpu__ledger_guard_delay_ms(struct cogpu_s *h);
/* Service order of the waiting waiters (indices), per policy; returns n. */
size_t cogpu__ledger_queue_order(struct cogpu_s *h, uint32_t *idx);

/* --- ledger.c, reserve.c, status.c, usage.c: the backend's operations ----
 * (backend.c binds them; backend.def says what each does). */
/* Attach per cfg (and join opts->join's job); an observer claims a slot
 * (to take the lock) but is not listed as a client. */
int cogpu__ledger_open(const cogpu__config_t *cfg,
                       const cogpu_attach_opts_t *opts, bool observer,
                       struct cogpu_s **out);
/* Free the slot (unless forked, detached or its lock is held by a stopped
 * process: then the others' sweep does) and unmap. */
void cogpu__ledger_close(struct cogpu_s *h);
void cogpu__ledger_forked(struct cogpu_s *h);
void cogpu__ledger_at_exit(struct cogpu_s *h);
int cogpu__ledger_reserve(struct cogpu_s *h, const cogpu_request_t *req,
                          int *gpu_out);
int cogpu__ledger_reserve_abortable(struct cogpu_s *h,
                                    const cogpu_request_t *req, int *gpu_out,
                                    const cogpu__abort_t *ab);
int cogpu__ledger_release(struct cogpu_s *h, int gpu, uint64_t bytes);
int cogpu__ledger_held(struct cogpu_s *h, int gpu, uint64_t *bytes);
int cogpu__ledger_gpu_count(struct cogpu_s *h);
int cogpu__ledger_gpu_lookup(struct cogpu_s *h, const char *spec, int *gpu);
int cogpu__ledger_job_token(struct cogpu_s *h, char *buf, size_t len);
int cogpu__ledger_step_token(struct cogpu_s *h, char *buf, size_t len);
int cogpu__ledger_status(struct cogpu_s *h, const cogpu__config_t *cfg,
                         cogpu_status_t **out);
int cogpu__ledger_mark(struct cogpu_s *h, uint32_t flags);
cogpu__usage_t *cogpu__ledger_usage_page(struct cogpu_s *h);
int cogpu__ledger_job_end(struct cogpu_s *h, int exit_status, bool step,
                          cogpu__job_report_t *out);
int cogpu__ledger_job_sample(struct cogpu_s *h, uint64_t *used, unsigned *ngpus,
                             uint64_t *at_ms);

/* With the lock held: is h still attached (not done, its slot active with
 * its generation)? And the job it joined (if any) still there? Inline: the
 * fast paths ask both under every lock (cogpu__ledger_lock_live_fast). */
static inline bool cogpu__ledger_me_live(struct cogpu_s *h) {
  const ledger_slot_t *me = &h->st->slots[h->slot];
  return !atomic_load_explicit(&h->done, memory_order_relaxed) &&
         me->state == SLOT_ACTIVE &&
         atomic_load_explicit(&me->gen, memory_order_relaxed) == h->gen;
}
static inline bool cogpu__ledger_job_live(struct cogpu_s *h) {
  const ledger_slot_t *job = &h->st->slots[h->res_slot];
  return h->res_slot == h->slot ||
         (job->state == SLOT_ACTIVE &&
          atomic_load_explicit(&job->gen, memory_order_relaxed) == h->res_gen);
}
/* cogpu__ledger_me_live, or sets the error and returns it. */
int cogpu__ledger_handle_live(struct cogpu_s *h);
/* Takes the lock (bounded), checks the handle is live and its job; on
 * failure the lock is not held. */
int cogpu__ledger_lock_live(struct cogpu_s *h);

/* With the lock held: if the joined job's slot is gone (its process died
 * and the slot was reclaimed), fall back to the handle's own slot. */
void cogpu__ledger_check_job(struct cogpu_s *h);

/* --- reserve.c: the parts of cogpu_reserve, for the daemon ---------------- */
typedef struct reserve_req_s {
  int64_t gpu;
  uint64_t bytes;
  int64_t priority;
  int64_t timeout_ms;
  bool exclusive;
  uint32_t flags; /* COGPU__REQ_DEVICE_WAIT, COGPU__REQ_JOB_SPARE */
} reserve_req_t;
int cogpu__ledger_reserve_check(struct cogpu_s *h, const cogpu_request_t *req,
                                reserve_req_t *r);
/* With the lock held: grant at once if nobody waits and it fits; returns
 * the GPU or -1. */
int cogpu__ledger_reserve_fast(struct cogpu_s *h, const reserve_req_t *r);
/* With the lock held: join the queue and let the policy run; returns the
 * granted GPU (having left the queue), -1 if queued (*w), or an error. */
int cogpu__ledger_reserve_queue(struct cogpu_s *h, const reserve_req_t *r,
                                int64_t *w);
int64_t cogpu__ledger_enqueue(struct cogpu_s *h, const reserve_req_t *r);
/* Leave the queue: the granted GPU, -1 not granted, -2 refused. An entry
 * still waiting is counted as cancelled. */
int cogpu__ledger_dequeue(struct cogpu_s *h, uint32_t w);
/* The same; an entry still waiting is counted as `why` (COGPU_ADMIT_*), or
 * not at all with LEDGER_ADMIT_NONE (the daemon's first, non-waiting try of
 * a request its client will wait for). */
#define LEDGER_ADMIT_NONE (-1)
int cogpu__ledger_dequeue_as(struct cogpu_s *h, uint32_t w, int why);
/* COGPU__EJOB_SPARE with its message: a waiter answered W_JOB_SPARE. */
int cogpu__ledger_spare_answer(void);
int cogpu__ledger_refused(const reserve_req_t *r);

/* --- ledger.c / status.c: for the daemon ------------------------------------
 */
/* With the lock held: give back bytes of h's reservation on gpu (COGPU_ALL
 * for all, which also ends exclusive use). */
int cogpu__ledger_release_locked(struct cogpu_s *h, int gpu, uint64_t bytes);
/* With the lock held: take back an exclusive grant that was not delivered. */
void cogpu__ledger_end_exclusive(struct cogpu_s *h, int gpu);
/* With the lock held: the snapshot cogpu_status returns. */
int cogpu__ledger_status_fill(struct cogpu_s *h, cogpu_status_t *st);
/* The waiters answered since the last call (trusted mode); returns n. */
size_t cogpu__ledger_take_wakes_of(struct cogpu_s *h, uint32_t *out,
                                   size_t max);
/* Fills a slot for a client of the daemon (trusted mode, lock held). */
void cogpu__ledger_slot_fill(struct cogpu_s *h, uint32_t slot, int pid,
                             uint32_t uid, int priority, const char *command,
                             const char *job_id);
/* The daemon's own attachment (trusted mode), recovered; and its end. */
int cogpu__ledger_open_trusted(const cogpu__config_t *cfg,
                               struct ledger_host_s *host,
                               struct cogpu_s **out);
void cogpu__ledger_close_trusted(struct cogpu_s *h);
/* Lock held: the slot's owner joins the job of slot *job (generation *job_gen).
 * If that slot is itself a member of a live job (a step's token), the owner
 * joins that job, in the step: *job and *job_gen then name the job. */
void cogpu__ledger_slot_join(struct cogpu_s *h, uint32_t slot, uint32_t *job,
                             uint32_t *job_gen);

/* --- wait.c: sleeping and waking ----------------------------------------- */
/* Sleep until *word != val or timeout_ms passes (-1 = no bound). */
void cogpu__ledger_futex_wait(_Atomic uint32_t *word, uint32_t val,
                              int64_t timeout_ms);
void cogpu__ledger_futex_wake(_Atomic uint32_t *word, int n);

/* --- suspend.c: suspending jobs (node mode) --------------------------------
 * Set by the daemon (trusted mode only): what it can do and the node's
 * options. NULL elsewhere: the deadlock guard then fails a request, as it
 * must without a process that can suspend. */
typedef struct ledger_suspender_s {
  void *ctx;
  bool on_deadlock;    /* suspend a victim instead of failing a request */
  bool on_priority;    /* a waiter of higher priority suspends lower holders */
  int64_t max_idle_ms; /* suspend a job idle this long when others wait; -1 */
  /* 0 if host memory can take `bytes` more of suspended footprint now;
   * otherwise a negative code and why. */
  int (*can)(void *ctx, uint64_t bytes, char *why, size_t len);
  /* How long the job of slot s has done no GPU work (ms); 0 if busy or
   * unknown. */
  uint64_t (*idle_ms)(void *ctx, struct cogpu_s *h, uint32_t s);
  /* The most the job of slot s is expected to hold on GPU g, learnt from
   * earlier runs of its command (its user's, on that GPU model); 0 when
   * unknown. A resume waits until the job can grow to it (issue 25). */
  uint64_t (*expect)(void *ctx, struct cogpu_s *h, uint32_t s, uint32_t g);
  /* How much more suspended footprint host memory can take now (what
   * `can` would accept); UINT64_MAX when the daemon cannot suspend at all
   * (nothing to keep parkable). Admission keeps what a deadlock may have
   * to park within it (docs/suspension.md, "Host memory"). */
  uint64_t (*room)(void *ctx);
  /* Whether a parked job may be restored onto another GPU now (option
   * migrate, and a driver with restore onto a GPU mapping); NULL: never. */
  bool (*can_move)(void *ctx);
} ledger_suspender_t;
/* Admission on a GPU where jobs are parked or peaks are learnt, or where
 * host memory could not park what a deadlock would need (issue 25): true
 * if the request of wt, a job's first memory on g or its growth there, is
 * to wait although it fits (docs/suspension.md, "Admission"). Lock held. */
bool cogpu__ledger_admit_held(struct cogpu_s *h, const ledger_waiter_t *wt,
                              uint32_t g);
/* What the jobs running on g, other than slot s, are expected to grow by
 * (each learnt peak less what it holds; 0 without the daemon's learnt
 * peaks). Lock held; a scan of the slots. */
uint64_t cogpu__ledger_growth_beside(struct cogpu_s *h, uint32_t s, uint32_t g);
/* The same as cogpu__ledger_admit_held for a request of slot s (its first
 * memory on g, or growth there) waiting since `since` (monotonic ns;
 * UINT64_MAX: not queued, the fast path). */
bool cogpu__ledger_admit_holds(struct cogpu_s *h, uint32_t s, uint64_t bytes,
                               bool exclusive, uint32_t g, uint64_t since);

/* A process's GPU map (ledger_slot_t.gpu_map): the GPU its GPU g is on. */
_Static_assert(LEDGER_MAX_GPUS <= 16, "a GPU map has a nibble per GPU");
static inline uint32_t cogpu__ledger_map_phys(uint64_t map, uint32_t g) {
  return g < LEDGER_MAX_GPUS ? g ^ (uint32_t)((map >> (4 * g)) & 0xf) : g;
}
/* The GPU of its view that is on GPU p now. */
static inline uint32_t cogpu__ledger_map_view(uint64_t map, uint32_t p) {
  for (uint32_t g = 0; map && g < LEDGER_MAX_GPUS; g++)
    if (cogpu__ledger_map_phys(map, g) == p)
      return g;
  return p;
}
/* The map after a restore that swapped GPUs a and b under the process. */
static inline uint64_t cogpu__ledger_map_swap(uint64_t map, uint32_t a,
                                              uint32_t b) {
  uint64_t out = 0;
  for (uint32_t g = 0; g < LEDGER_MAX_GPUS; g++) {
    uint32_t p = cogpu__ledger_map_phys(map, g);
    p = p == a ? b : p == b ? a : p;
    out |= (uint64_t)((p ^ g) & 0xf) << (4 * g);
  }
  return out;
}
/* A GPU index a process sent, as the ledger's (negative ones, such as
 * COGPU_GPU_AUTO, and those past the node's as they are); and back. */
static inline int cogpu__ledger_gpu_phys(const ledger_slot_t *sl, int g) {
  return g >= 0 && g < (int)LEDGER_MAX_GPUS
             ? (int)cogpu__ledger_map_phys(sl->gpu_map, (uint32_t)g)
             : g;
}
static inline int cogpu__ledger_gpu_view(const ledger_slot_t *sl, int g) {
  return g >= 0 && g < (int)LEDGER_MAX_GPUS
             ? (int)cogpu__ledger_map_view(sl->gpu_map, (uint32_t)g)
             : g;
}

/* May the resume entry wt go onto GPU g, not its job's own, now? Only with
 * the suspender's consent (migration on, a driver that can), a job none of
 * whose processes is kept from moving (COGPU_MARK_NOMOVE), onto a GPU of
 * the same model where it fits by the rules of its own (docs/suspension.md,
 * "Migration"). Lock held. */
bool cogpu__ledger_resume_moves(struct cogpu_s *h, const ledger_waiter_t *wt,
                                uint32_t g);

enum { LEDGER_OP_SUSPEND = 1, LEDGER_OP_RESUME = 2 };
#define LEDGER_SUSP_OPS_MAX 1024u
typedef struct ledger_susp_op_s {
  uint32_t slot, gen;
  int op;
} ledger_susp_op_t;
/* Suspensions and resumes the ledger decided since the last call. */
size_t cogpu__ledger_take_susp_ops(struct cogpu_s *h, ledger_susp_op_t *out,
                                   size_t max);
/* The pids of the job of slot s that use CUDA, and (starts, if not NULL)
 * each one's start time as it attached (node mode). */
size_t cogpu__ledger_job_pids(struct cogpu_s *h, uint32_t s, int32_t *pids,
                              uint64_t *starts, size_t max);
/* The slots of the job of slot s whose processes use CUDA. */
size_t cogpu__ledger_job_members(struct cogpu_s *h, uint32_t s, uint32_t *slots,
                                 size_t max);
/* 0 and the job's GPU if the job of slot s could be suspended; otherwise
 * a negative code and why. Lock held. */
int cogpu__ledger_suspendable(struct cogpu_s *h, uint32_t s, int *gpu,
                              char *why, size_t len);
/* NONE -> SUSPENDING and an op for the daemon; or why not. */
int cogpu__ledger_suspend_begin(struct cogpu_s *h, uint32_t s, bool manual,
                                char *why, size_t len);
/* The daemon's report: SUSPENDING -> SUSPENDED (rc 0; took_ns: how long
 * the copy took, 0 if unknown), or back to NONE (broken: the driver may
 * have left the job unusable: never again). */
void cogpu__ledger_suspend_done(struct cogpu_s *h, uint32_t s, uint32_t gen,
                                int rc, bool broken, uint64_t took_ns);
/* Ask for a suspended job's resume (by hand); 0 when under way. */
int cogpu__ledger_resume_ask(struct cogpu_s *h, uint32_t s, char *why,
                             size_t len);
/* RESUMING -> NONE; rc -EXDEV: the driver refused the move to another GPU
 * before anything moved: back to SUSPENDED where it was. */
void cogpu__ledger_resume_done(struct cogpu_s *h, uint32_t s, uint32_t gen,
                               int rc);
/* For the policy: a request of a suspended job waits for its resume. */
bool cogpu__ledger_held_back(struct cogpu_s *h, const ledger_waiter_t *wt);
bool cogpu__ledger_resume_fits(struct cogpu_s *h, const ledger_waiter_t *wt);
/* Books the footprint on g, its own GPU or one cogpu__ledger_resume_moves
 * allowed (SUSPENDED -> RESUMING); the caller then serves the job's
 * held-back requests there. */
void cogpu__ledger_resume_serve(struct cogpu_s *h, uint32_t w, uint32_t g);
/* Is a suspension under way on GPU g? */
bool cogpu__ledger_susp_busy(struct cogpu_s *h, uint32_t g);
/* The deadlock guard's alternative to failing a request: true if a job
 * holding memory on g is being suspended; else why none can be. */
bool cogpu__ledger_suspend_for_deadlock(struct cogpu_s *h, uint32_t g,
                                        char *why, size_t len);
/* Priority and idle preemption (per the suspender's options). */
void cogpu__ledger_preempt(struct cogpu_s *h);
/* The daemon's tick: suspended jobs that lack a resume entry get one. */
void cogpu__ledger_susp_check(struct cogpu_s *h);
/* Record what this process reported about itself (lock held). */
int cogpu__ledger_mark_locked(struct cogpu_s *h, uint32_t flags);

/* --- counters.c: the node's counters (cogpu metrics) ----------------------
 * Each adds to the open transaction (no commit): the caller commits with
 * the decision it counts. */
/* cogpu__ledger_count and cogpu__ledger_count_admit: inline, at the end
 * of this file. */
/* A grant after waiting: COGPU_ADMIT_WAITED and the wait histogram. */
void cogpu__ledger_count_wait(struct cogpu_s *h, uint64_t waited_ns);
/* A checkpoint copy the daemon's suspender has done (a suspension's or a
 * resume's): bytes moved and the time it took, counted (lock held). */
void cogpu__ledger_count_copy(struct cogpu_s *h, uint64_t bytes,
                              uint64_t took_ns);
/* The counters as cogpu_status reports them (lock held). */
void cogpu__ledger_counters_fill(struct cogpu_s *h, cogpu_counters_t *c);
/* Upper bounds of the wait histogram's buckets, in ms (last: UINT64_MAX). */
extern const uint64_t cogpu__ledger_wait_le_ms[COGPU_WAIT_BUCKETS];

/* --- usage.c: what jobs' processes use (docs/history.md) -------------------
 * Set by the daemon (trusted mode): `sync` copies slot s's usage from the
 * page its process passed (single-user mode needs none: the slot is the
 * page); `ended` is told, with the lock held, that job slot s is being
 * freed (its figures folded in), to record it; it must not block. NULL
 * elsewhere: single-user mode records from cogpu run (cogpu__job_end). */
typedef struct ledger_usage_hooks_s {
  void *ctx;
  void (*sync)(void *ctx, struct cogpu_s *h, uint32_t s);
  void (*ended)(void *ctx, struct cogpu_s *h, uint32_t s);
} ledger_usage_hooks_t;
/* Lock held, at the start of freeing slot s: a process of a job leaves its
 * peaks with the job; a job takes its live processes' peaks and is told to
 * `ended`. */
void cogpu__ledger_usage_free(struct cogpu_s *h, uint32_t s);
/* Lock held: the job slot slot s belongs to (itself, or the live job it
 * joined). */
uint32_t cogpu__ledger_job_of(struct cogpu_s *h, uint32_t s);
/* Lock held: the job of slot s on GPU g: bytes its live processes use now
 * and its peak. */
void cogpu__ledger_job_usage(struct cogpu_s *h, uint32_t s, uint32_t g,
                             uint64_t *used, uint64_t *peak);
/* Lock held: the report of job slot s (cogpu__job_end's figures). */
void cogpu__ledger_job_report(struct cogpu_s *h, uint32_t s,
                              cogpu__job_report_t *out);
/* Lock held: the report of the step of slot s (cogpu__step_end's
 * figures): the peak, its time and the run time of the processes that
 * joined through s (s itself included); the rest is its job's. */
void cogpu__ledger_step_report(struct cogpu_s *h, uint32_t s,
                               cogpu__job_report_t *out);
/* Lock held: per job slot, used and peak on GPU g (arrays of
 * LEDGER_MAX_SLOTS), for snapshots: one pass over the slots. */
void cogpu__ledger_usage_by_job(struct cogpu_s *h, uint32_t g, uint64_t *used,
                                uint64_t *peak);

/* --- foreign.c: memory held by processes cogpu does not know ---------------
 */
/* Refresh every GPU's foreign bytes from NVML if older than the node's
 * interval (or always, when force); takes and releases the lock itself.
 * The reserve paths call it before every grant, so that no grant rests on
 * a figure older than the interval. 0, or the bounded lock's -EBUSY (a
 * stopped holder: the caller gives up rather than wait a second bound). */
int cogpu__ledger_foreign_refresh(struct cogpu_s *h, bool force);
/* By how much the reservations and foreign memory on gpu exceed it (0
 * when they fit), after a refresh when `refresh` (cogpu__ledger_recheck;
 * the daemon limits how often one connection makes it refresh). */
int cogpu__ledger_over(struct cogpu_s *h, int gpu, bool refresh,
                       uint64_t *over);

#define LEDGER_OFF(h, ptr) ((uint64_t)((char *)(ptr) - (char *)(h)->st))

/* --- the host: what the daemon gives the ledger (trusted mode) ---------
 * Its hooks (each NULL until the daemon's service that provides it has
 * started: the suspender, the usage records, the deadlock guard's view of
 * the connections) and the waiters answered under the lock, collected for
 * the daemon to answer over their wait connections (lock.c). Given to
 * cogpu__ledger_open_trusted, owned by the daemon. */
typedef struct ledger_host_s {
  const ledger_suspender_t *suspender;
  const ledger_usage_hooks_t *usage;
  const ledger_guard_hooks_t *guard;
  uint32_t wakes[LEDGER_MAX_WAITERS];
  size_t nwakes;
  /* Suspensions and resumes decided, for the daemon's suspender. */
  ledger_susp_op_t ops[LEDGER_SUSP_OPS_MAX];
  size_t nops;
} ledger_host_t;

static inline const ledger_suspender_t *
cogpu__ledger_suspender(const struct cogpu_s *h) {
  return h->host ? h->host->suspender : NULL;
}
static inline const ledger_usage_hooks_t *
cogpu__ledger_usage_hooks(const struct cogpu_s *h) {
  return h->host ? h->host->usage : NULL;
}
static inline const ledger_guard_hooks_t *
cogpu__ledger_guard_hooks(const struct cogpu_s *h) {
  return h->host ? h->host->guard : NULL;
}

/* Undo log (lock.c): record the old value, publish the entry, then store.
 * A holder killed anywhere in between leaves either an entry whose store
 * did not happen (rolling it back rewrites the same value) or no entry and
 * no store. Inline: a reserve+release makes a dozen of these, and the
 * calls were a sixth of its time. */
void cogpu__ledger_tx_overflow(struct cogpu_s *h);
static inline void cogpu__ledger_tx_set(struct cogpu_s *h, uint64_t *field,
                                        uint64_t value) {
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t n = atomic_load_explicit(&hd->tx_n, memory_order_relaxed);
  if (__builtin_expect(n >= LEDGER_TX_MAX, 0)) {
    cogpu__ledger_tx_overflow(h);
    n = 0;
  }
  hd->tx[n].off = LEDGER_OFF(h, field);
  hd->tx[n].old = *field;
  atomic_store_explicit(&hd->tx_n, n + 1, memory_order_release);
  atomic_signal_fence(memory_order_seq_cst);
  /* Atomic (a plain store on every target we build for): some readers look
   * without the lock (foreign refresh, room, spare), and a torn or racy
   * store is what they must never see. */
  __atomic_store_n(field, value, __ATOMIC_RELAXED);
  if (n == 0)
    cogpu__fault(COGPU_FP_TX_MIDDLE); /* first store done, others not */
}

/* counters.c's two on every admission, inline beside the undo log. */
static inline void cogpu__ledger_count(struct cogpu_s *h, uint64_t *counter) {
  cogpu__ledger_tx_set(h, counter, *counter + 1);
}
/* COGPU_ADMIT_* (nothing for LEDGER_ADMIT_NONE). */
static inline void cogpu__ledger_count_admit(struct cogpu_s *h, int result) {
  if (result >= 0 && result < COGPU_ADMIT_NRESULTS)
    cogpu__ledger_count(h, &h->st->hdr.counters.admit[result]);
}

/* The uncontended halves of the bounded lock and of the unlock, and the
 * handle's checks under the lock, inline for the reserve and release fast
 * paths (issue 24: the calls around an uncontended reserve and release
 * cost more than the work in them). A lock held by another, or waiters to
 * wake, take lock.c's whole path. */
static inline int cogpu__ledger_lock_fast(struct cogpu_s *h) {
  uint32_t cur = 0;
  uint32_t me = (h->slot + 1) | ((h->gen & LOCKW_GEN_MASK) << LOCKW_GEN_SHIFT);
  if (__builtin_expect(!atomic_compare_exchange_strong_explicit(
                           &h->st->hdr.lock, &cur, me, memory_order_acquire,
                           memory_order_relaxed),
                       0))
    return cogpu__ledger_lock_bounded(h);
  cogpu__fault(COGPU_FP_LOCK_HELD);
  if (config_debug)
    cogpu__ledger_verify(h);
  return 0;
}

static inline void cogpu__ledger_unlock_fast(struct cogpu_s *h) {
  if (__builtin_expect(h->wake_n != 0, 0)) {
    cogpu__ledger_unlock(h);
    return;
  }
  cogpu__fault(COGPU_FP_BEFORE_UNLOCK);
  uint32_t old =
      atomic_exchange_explicit(&h->st->hdr.lock, 0, memory_order_release);
  if (__builtin_expect(old & LOCKW_CONTENDED, 0))
    cogpu__ledger_futex_wake(&h->st->hdr.lock, 1);
}

/* cogpu__ledger_lock_live and its checks, inline. */
static inline int cogpu__ledger_lock_live_fast(struct cogpu_s *h) {
  int rc = cogpu__ledger_lock_fast(h);
  if (rc)
    return rc;
  if (__builtin_expect(!cogpu__ledger_me_live(h) || !cogpu__ledger_job_live(h),
                       0)) {
    cogpu__ledger_unlock_fast(h);
    return cogpu__ledger_lock_live(h); /* says why, or falls back */
  }
  return 0;
}

/* Is the foreign figure younger than foreign_refresh? foreign.c's test,
 * inline, because every reserve asks it (no grant on a stale figure): the
 * coarse clock, a few ns. It runs at most a kernel tick (4 ms) behind,
 * nothing against a second; a figure never read, and intervals under
 * 20 ms (tests), go to cogpu__ledger_foreign_refresh, which reads the
 * precise clock. */
static inline bool cogpu__ledger_foreign_fresh(struct cogpu_s *h) {
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t last =
      atomic_load_explicit(&hd->foreign_at_ns, memory_order_relaxed);
  uint64_t ms = hd->foreign_refresh_ms;
  if (!last || ms < 20 || ms > UINT64_MAX / 1000000u)
    return false;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  /* A clock behind the figure: it was read a moment ago, with the precise
   * clock (as foreign.c takes it). */
  return now < last || now - last < ms * 1000000u;
}

#endif /* COGPU_LEDGER_INT_H */
