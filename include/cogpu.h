/*
 * cogpu.h: the public C API of cogpu, a memory-safe GPU co-scheduler.
 *
 * A process attaches to its node's ledger, reserves GPU memory before it
 * allocates it, and releases it afterwards. A reservation that does not fit
 * waits in the GPU's queue (per the node's policy) instead of failing, or
 * fails at once when asked not to wait. Reservations of a process that dies,
 * even by SIGKILL, return to the pool automatically.
 *
 * Errors: every fallible function returns 0 or a negative error code: a
 * negated errno (-EINVAL, -EAGAIN, -ETIMEDOUT, ...) or one of the COGPU_E*
 * codes below. cogpu_strerror() names any code; cogpu_last_error() returns a
 * message for the calling thread's last failure, with details (which key,
 * which file, what to do). docs/errors.md is the one complete list of each
 * function's codes, when and what to do; the lists below are summaries. In
 * node mode every call that talks to the daemon may also return
 * -ECONNREFUSED (no daemon within daemon_wait), -ETIMEDOUT (no answer),
 * -ENOTCONN (the daemon lost this process's registration: attach again),
 * -EPROTO (a malformed reply) and -EACCES (the socket refuses this user).
 *
 * Thread safety: a handle may be used by many threads at once. Fork: a child
 * does not inherit its parent's attachment; it must attach on its own (the
 * parent's handle is unusable in the child and must not be detached there).
 */
#ifndef COGPU_H
#define COGPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COGPU_API __attribute__((visibility("default")))

#define COGPU_VERSION_MAJOR 0
#define COGPU_VERSION_MINOR 1
#define COGPU_VERSION_PATCH 0
#define COGPU_VERSION_STRING "0.1.0"

/* Error codes that have no errno equivalent (XX(name, value, message)). */
#define COGPU_ERRNO_MAP(XX)                                                    \
  XX(ESTATE, -4001, "node state is corrupt or from an incompatible version")   \
  XX(ENVML, -4002, "NVML (libnvidia-ml.so.1) is unavailable")                  \
  XX(ENOGPU, -4003, "no GPU on this node")                                     \
  XX(ECONFIG, -4004, "invalid configuration")                                  \
  XX(EDEADLOCK, -4005, "request would deadlock")

typedef enum {
#define COGPU_ERR_ENUM_(name, val, msg) COGPU_##name = (val),
  COGPU_ERRNO_MAP(COGPU_ERR_ENUM_)
#undef COGPU_ERR_ENUM_
} cogpu_errno_t;

/* Short symbolic name of an error code ("ETIMEDOUT", "ESTATE"). */
COGPU_API const char *cogpu_err_name(int rc);
/* Human-readable description of an error code. Never NULL. */
COGPU_API const char *cogpu_strerror(int rc);
/* Message describing the calling thread's last failed cogpu call (empty
 * string when none). Valid until the thread's next cogpu call. */
COGPU_API const char *cogpu_last_error(void);

/* --- Attaching ------------------------------------------------------- */

typedef struct cogpu_handle_s cogpu_t;

typedef struct cogpu_attach_opts_s {
  int priority;        /* default priority of requests; higher is served first
                          by the priority-* policies; 0 is normal */
  const char *job_id;  /* shown in status (e.g. a Slurm job id); may be NULL */
  const char *command; /* shown in status; NULL reads /proc/self/cmdline */
  const char *join;    /* a job token (cogpu_job_token) from another process
                          of the same job: this process's reservations are
                          then the job's; NULL for a job of its own */
} cogpu_attach_opts_t;

/*
 * Attach the calling process to the node ledger, creating the node state on
 * first use (GPUs are discovered through NVML, without a CUDA context).
 * `opts` may be NULL for defaults. On success stores a handle in *out.
 * Errors (docs/errors.md): -EINVAL, -ENOMEM, -EACCES/-EPERM (state owner or
 * mode refused; node: joining another user's job), -ENOTDIR/-ENOENT (bad
 * state_dir), COGPU_ESTATE (state unreadable and in use; run `cogpu
 * doctor`), COGPU_ENVML, COGPU_ENOGPU, COGPU_ECONFIG, -ENOSPC (no free
 * client slot, or no room for the state), -EBUSY (single: the ledger is
 * locked by a process that does not run: stopped; the message names its
 * pid), -ESRCH (opts->join names a job that ended), -EROFS/-EDQUOT/-EIO
 * (the file system's), and in node mode -ECONNREFUSED, -ETIMEDOUT, -EPROTO,
 * -ENAMETOOLONG (socket path).
 */
COGPU_API int cogpu_attach(const cogpu_attach_opts_t *opts, cogpu_t **out);

/* A token ("slot.generation") naming this handle's job, for processes the
 * job starts: attaching with it (cogpu_attach_opts_t.join) makes their
 * reservations part of the job's, listed under the job in status. The
 * job's reservations live as long as its first process. buf needs 24
 * bytes. Errors: -EINVAL (bad handle or buffer). */
COGPU_API int cogpu_job_token(cogpu_t *h, char *buf, size_t len);

/* Release everything the handle holds, leave any queue, free the handle.
 * Also happens implicitly when the process exits or dies. Errors: -EINVAL
 * (a NULL or detached handle). */
COGPU_API int cogpu_detach(cogpu_t *h);

/* --- Reserving --------------------------------------------------------- */

#define COGPU_GPU_AUTO (-1)     /* the GPU with most free capacity that fits */
#define COGPU_WAIT_FOREVER (-1) /* timeout_ms: wait without bound */
#define COGPU_NOWAIT 0          /* timeout_ms: fail with -EAGAIN at once */
#define COGPU_PRIORITY_DEFAULT INT32_MIN /* use the handle's priority */
#define COGPU_ALL UINT64_MAX /* cogpu_release: everything on the GPU */

#define COGPU_REQ_EXCLUSIVE 0x1u /* the whole GPU: nobody else may reserve */

typedef struct cogpu_request_s {
  int gpu;            /* GPU index (as NVML numbers them) or COGPU_GPU_AUTO */
  uint64_t bytes;     /* bytes to add to this process's reservation on the GPU;
                         ignored with COGPU_REQ_EXCLUSIVE */
  int priority;       /* or COGPU_PRIORITY_DEFAULT */
  int64_t timeout_ms; /* COGPU_NOWAIT, a bound in ms, or COGPU_WAIT_FOREVER */
  unsigned flags;     /* COGPU_REQ_* */
} cogpu_request_t;

/*
 * Reserve req->bytes more on a GPU, growing this process's reservation
 * there. If it does not fit now, wait in the GPU's queue (without polling
 * and without signals) until the node's policy serves it or the timeout
 * passes. On success the chosen GPU index is stored in *gpu_out (may be NULL).
 * Errors: -EINVAL (bad argument, or a handle detached at exit or from a
 * fork's parent), -ENODEV (no such GPU), -E2BIG (larger than the GPU's
 * capacity: it could never fit), -EAGAIN (COGPU_NOWAIT and it does not fit
 * now, the GPU's client limit included), -ETIMEDOUT, -ENOSPC (the wait
 * queue is full), COGPU_EDEADLOCK (refused by the deadlock guard), -EBUSY
 * (single: the ledger is locked by a process that does not run: stopped),
 * -ECANCELED (the request's queue entry was removed: ask again), -ENOMEM,
 * and the node-mode codes above (docs/errors.md).
 */
COGPU_API int cogpu_reserve(cogpu_t *h, const cogpu_request_t *req,
                            int *gpu_out);

/* Give back `bytes` of this process's reservation on `gpu` (COGPU_ALL for
 * all of it, which also ends exclusive use), waking waiters that now fit.
 * Errors: -EINVAL (more than held, or a detached handle), -ENODEV, -EBUSY
 * (single: the ledger is locked by a process that does not run), and the
 * node-mode codes above (docs/errors.md). */
COGPU_API int cogpu_release(cogpu_t *h, int gpu, uint64_t bytes);

/* Bytes this process holds on `gpu`. Errors: -EINVAL, -ENODEV, and the
 * node-mode codes above. */
COGPU_API int cogpu_held(cogpu_t *h, int gpu, uint64_t *bytes);

/* Resolve "0", "GPU-8f3c..." (a UUID or a unique prefix of one) to an
 * index. Errors: -ENODEV (none, or an ambiguous prefix), -EINVAL (empty
 * name or bad handle). */
COGPU_API int cogpu_gpu_lookup(cogpu_t *h, const char *spec, int *gpu);

/* Number of GPUs in the node state, or -EINVAL for a bad handle. */
COGPU_API int cogpu_gpu_count(cogpu_t *h);

/* --- Status ---------------------------------------------------------- */

typedef struct cogpu_client_info_s {
  int pid;
  unsigned uid;
  char user[32];
  char command[128];
  char job_id[64];
  int priority;
  uint64_t reserved_bytes; /* on this GPU */
  bool exclusive;
  bool own; /* the handle given to cogpu_status */
  /* Suspension (node mode): the job's state; while suspended its footprint
   * (suspended_bytes) is in host memory and reserved_bytes is 0. */
  int state; /* COGPU_JOB_RUNNING, _SUSPENDING, _SUSPENDED, _RESUMING,
                _EXITING */
  unsigned suspensions;     /* times it was suspended */
  uint64_t suspended_bytes; /* footprint moved to host memory */
  double suspended_seconds; /* how long it has been suspended */
  /* GPU memory its processes hold on this GPU now, and the most they held
   * at once, as the preload library counted every allocation (0 for a
   * client that allocates without the preload library). */
  uint64_t used_bytes;
  uint64_t peak_bytes;
  /* GPU memory on this GPU held by processes of the job that escaped the
   * preload library (not clients: they dropped LD_PRELOAD, are static, or
   * load the driver privately), as NVML last said, and the biggest such
   * process. It counts as foreign memory, not in used_bytes. */
  uint64_t escaped_bytes;
  int escaped_pid;
} cogpu_client_info_t;

enum {
  COGPU_JOB_RUNNING = 0,
  COGPU_JOB_SUSPENDING = 1,
  COGPU_JOB_SUSPENDED = 2,
  COGPU_JOB_RESUMING = 3,
  /* Its process closed its connection to the node daemon and has not gone:
   * its memory stays booked until the driver has freed it. */
  COGPU_JOB_EXITING = 4
};

typedef struct cogpu_waiter_info_s {
  int pid;
  unsigned uid;
  char user[32];
  char command[128];
  char job_id[64];
  int gpu; /* the GPU asked for, or COGPU_GPU_AUTO */
  uint64_t requested_bytes;
  int priority;
  bool exclusive;
  double waiting_seconds;
  int position; /* 1-based place in service order on this GPU */
  bool own;     /* the handle given to cogpu_status */
} cogpu_waiter_info_t;

typedef struct cogpu_gpu_info_s {
  int index;
  char uuid[96];
  char name[96];
  uint64_t total_bytes;
  uint64_t margin_bytes;
  uint64_t foreign_bytes;   /* held by processes cogpu does not know */
  uint64_t capacity_bytes;  /* total - margin - foreign */
  uint64_t reserved_bytes;  /* sum of clients' reservations */
  int max_clients;          /* 0: unlimited */
  bool exclusive;           /* held exclusively by one client */
  uint64_t suspended_bytes; /* its suspended jobs' footprints (host memory) */
  uint64_t used_bytes;      /* sum of its clients' used_bytes */
  size_t nclients;
  cogpu_client_info_t *clients;
  size_t nwaiting;
  cogpu_waiter_info_t *waiting; /* in service order */
} cogpu_gpu_info_t;

/* How requests for memory ended (cogpu_counters_t.admissions). */
enum {
  COGPU_ADMIT_IMMEDIATE = 0, /* granted without joining the queue */
  COGPU_ADMIT_WAITED = 1,    /* granted after joining the queue */
  COGPU_ADMIT_TIMEOUT = 2,   /* its wait bound ran out in the queue */
  COGPU_ADMIT_REFUSED = 3,   /* not available and not to wait (a bound of
                                0, grow_wait=no), or the queue was full */
  COGPU_ADMIT_DEADLOCK = 4,  /* failed by the deadlock guard */
  COGPU_ADMIT_CANCELLED = 5, /* left the queue unanswered: its process gave
                                up (a signal) or died */
  COGPU_ADMIT_NRESULTS = 6
};

/* Buckets of the wait-time histogram: 14 bounds and +Inf. */
#define COGPU_WAIT_BUCKETS 15

/* Counters of the node's decisions, monotonic since the node state was
 * created (cogpu reset starts them again). Requests that were malformed or
 * larger than any GPU are not counted: they never reach the policy. */
typedef struct cogpu_counters_s {
  uint64_t admissions[COGPU_ADMIT_NRESULTS]; /* by COGPU_ADMIT_* */
  /* Time requests granted after joining the queue (COGPU_ADMIT_WAITED)
   * spent there: per bucket (not cumulative) under wait_le_ms[i], the
   * last bound UINT64_MAX (+Inf); the counts add up to that admission
   * count. */
  uint64_t wait_le_ms[COGPU_WAIT_BUCKETS];
  uint64_t wait_count[COGPU_WAIT_BUCKETS];
  double wait_sum_seconds;
  /* Suspension (node mode): suspensions and resumes done, those the
   * driver failed, and suspensions the deadlock guard made instead of
   * failing a request. */
  uint64_t suspensions;
  uint64_t suspend_failures;
  uint64_t resumes;
  uint64_t resume_failures;
  uint64_t deadlock_suspensions;
  /* The copies of suspensions and resumes done (node mode): the bytes
   * moved, out and back, and the time the copies took. Their ratio is the
   * node's checkpoint bandwidth, as it happened (the link, the driver,
   * the host's memory); their rates, how much of the node's time goes to
   * moving memory. Appended last: cogpu_status_t is the library's to
   * allocate, so a program built against an older cogpu.h reads the
   * fields it knows at the same offsets. */
  uint64_t checkpoint_bytes;
  double checkpoint_seconds;
} cogpu_counters_t;

typedef struct cogpu_status_s {
  char policy[16];
  char state_path[512];
  unsigned layout_version;
  size_t ngpus;
  cogpu_gpu_info_t *gpus;
  /* Suspension (node mode; 0 and empty otherwise): the node's suspended
   * footprints, their bound (suspend_max), the host memory available now
   * and the margin suspensions leave (suspend_host_margin), and whether
   * the daemon can suspend ("yes", or why not). */
  uint64_t suspended_bytes;
  uint64_t suspend_max_bytes;
  uint64_t host_available_bytes;
  uint64_t host_margin_bytes;
  char suspension[128];
  /* The node's counters (cogpu metrics), since its state was created. */
  cogpu_counters_t counters;
} cogpu_status_t;

/* A consistent snapshot of the node (h may be NULL: attaches briefly as an
 * observer). Reclaims dead clients first. Free with cogpu_status_free().
 * Errors (docs/errors.md): -EINVAL, -ENOMEM, -EBUSY (single: a stopped
 * lock holder), with h NULL those of cogpu_attach, and the node-mode
 * codes above. */
COGPU_API int cogpu_status(cogpu_t *h, cogpu_status_t **out);
COGPU_API void cogpu_status_free(cogpu_status_t *st);

/* Name of the policy in force on the node ("fifo", "mmu", ...). */
COGPU_API const char *cogpu_policy_name(int policy);

#ifdef __cplusplus
}
#endif
#endif /* COGPU_H */
