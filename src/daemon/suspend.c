/*
 * suspend.c: cogpud's suspender, a service: it performs the suspensions
 * and resumes the ledger decides (ledger/suspend.c) through the CUDA
 * driver's process checkpoint API. The loop (daemon.c) hands it each
 * operation and takes it back done; the dispatch (handle.c) applies the
 * result to the ledger and answers who waits. It answers no client itself
 * and knows nothing of connections.
 *
 * The driver calls run in a thread of their own: cuInit takes seconds in a
 * fresh process, and a lock waits for the target's running kernels, a
 * checkpoint or a restore copies the footprint (seconds per tens of GiB).
 * The loop never waits for them: it hands the thread a job (the pids to
 * act on, read from the ledger under the lock) and takes the result
 * when the thread reports on an eventfd. Nothing is held across a driver
 * call: a locked process blocks inside the driver, and anything it held
 * would stall every client.
 *
 * The daemon needs ptrace rights over its targets (it runs as root) and
 * must have called cuInit (done once at start, in the thread). Without
 * libcuda, without the API (a driver before 570) or when cuInit fails, it
 * serves as before and says why nothing can be suspended.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "cuda/cuda-abi.h"
#include "daemon-int.h"
#include "nvml/nvml.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same on every architecture (Linux 5.3) */
#endif

#define SUSP_MAX_PIDS 64

/* An operation, with what only the suspender needs of it. */
typedef struct sjob_s {
  cogpu__susp_op_t o; /* first: what the loop is handed back */
  /* The job's processes, each named by its PID, its start time and a
   * pidfd taken when the operation was queued (-1: none; start time
   * only): a PID reused by another process, another user's, is never
   * locked, checkpointed, restored or unlocked (issue 23). */
  int32_t pids[SUSP_MAX_PIDS];
  uint64_t starts[SUSP_MAX_PIDS];
  int pidfds[SUSP_MAX_PIDS];
  unsigned lock_ms;
  /* Resume: the footprint the restore puts back on the GPU (NVML index
   * gpu). Onto another GPU than the one it was parked on (migration):
   * the pairs that map each GPU of the node to where it goes, and the
   * ledger index of both GPUs (move_to -1: not moving). */
  unsigned gpu;
  uint64_t need;
  CUcheckpointGpuPair pairs[LEDGER_MAX_GPUS];
  unsigned npairs;
  int move_from, move_to;
  struct sjob_s *next;
} sjob_t;
_Static_assert(offsetof(sjob_t, o) == 0, "an operation is its job");

enum { CAP_INIT = 0, CAP_OK, CAP_NONE };

typedef struct cu_api_s {
  CUresult (*init)(unsigned);
  CUresult (*version)(int *);
  CUresult (*lock)(int, CUcheckpointLockArgs *);
  CUresult (*checkpoint)(int, CUcheckpointCheckpointArgs *);
  CUresult (*restore)(int, CUcheckpointRestoreArgs *);
  CUresult (*unlock)(int, CUcheckpointUnlockArgs *);
  CUresult (*get_state)(int, CUprocessState *); /* optional: NULL */
} cu_api_t;

/* Idle tracking (max_idle): when each registration's process last did GPU
 * work (monotonic ns), by slot and generation. A process new in a slot, or
 * one that has an old process's PID, starts afresh, and there is nothing
 * to fill up or to forget (issue 23: a PID-keyed table handed a reused
 * PID its old time, and stopped working once 8,192 PIDs had been seen). */
typedef struct idle_ent_s {
  uint32_t gen; /* the slot's generation this entry is of */
  uint64_t last_ns;
} idle_ent_t;

/* Learnt peaks (issue 25): the peaks of the last LEARN_RUNS ended runs of
 * a command, by user, command line and GPU model, from the job history at
 * start and from each job that ends. A hint for resume admission, not a
 * booking: a table of fixed size, where a newer key may take an older
 * one's place. Loop thread only. */
#define LEARN_SIZE 1024u
#define LEARN_RUNS 4u
typedef struct learn_ent_s {
  uint64_t key; /* a hash of the three; 0: empty */
  uint32_t uid;
  char command[128];
  char model[96];
  uint64_t peaks[LEARN_RUNS];
  unsigned next;
} learn_ent_t;

struct cogpu__susp_s {
  cogpu__daemon_t *d;
  learn_ent_t *learnt;
  bool admit_learnt; /* the option: expectations are used */
  pthread_t thr;
  bool started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sjob_t *todo, **todo_tail, *done;
  sjob_t *taken; /* loop thread: done jobs not yet handed back */
  int efd;
  bool stop;
  int cap;      /* CAP_*, under mu */
  int driver;   /* cuDriverGetVersion's (13000: CUDA 13.0), under mu */
  bool migrate; /* the option */
  char cap_why[256];
  cu_api_t cu;
  ledger_suspender_t sp;
  idle_ent_t *idle;
  /* Each slot's footprint when it was suspended (by generation): what its
   * resume will put back on the GPU. */
  uint64_t parked[LEDGER_MAX_SLOTS];
  uint32_t parked_gen[LEDGER_MAX_SLOTS];
  uint64_t sampled_us; /* NVML samples read up to here (epoch µs) */
  bool idle_warned;
  bool ever_ok; /* a suspension has succeeded: the driver supports them */
  /* hook_room's figure and when it was read (monotonic; 0: read again).
   * Loop thread only. */
  uint64_t room, room_ns;
};

static const char *cu_err(CUresult r) {
  switch (r) {
  case CUDA_ERROR_NOT_READY:
    return "its GPU work did not finish in time (lock timeout)";
  case CUDA_ERROR_NOT_SUPPORTED:
    return "the driver does not support checkpointing it";
  case CUDA_ERROR_ILLEGAL_STATE:
    return "it is in the wrong state";
  case CUDA_ERROR_OUT_OF_MEMORY:
    return "out of device memory";
  case CUDA_ERROR_INVALID_VALUE:
    return "no such CUDA process";
  case CUDA_ERROR_NOT_INITIALIZED:
    return "CUDA not initialised in the daemon";
  default:
    return "driver error";
  }
}

/* --- the thread ------------------------------------------------------------
 */

static void load_cuda(cogpu__susp_t *s) {
  char why[256] = "";
  int v = 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(why, sizeof why, "cannot load libcuda.so.1: %s", dlerror());
  } else {
    *(void **)&s->cu.init = dlsym(lib, "cuInit");
    *(void **)&s->cu.version = dlsym(lib, "cuDriverGetVersion");
    *(void **)&s->cu.lock = dlsym(lib, "cuCheckpointProcessLock");
    *(void **)&s->cu.checkpoint = dlsym(lib, "cuCheckpointProcessCheckpoint");
    *(void **)&s->cu.restore = dlsym(lib, "cuCheckpointProcessRestore");
    *(void **)&s->cu.unlock = dlsym(lib, "cuCheckpointProcessUnlock");
    *(void **)&s->cu.get_state = dlsym(lib, "cuCheckpointProcessGetState");
    CUresult r;
    if (!s->cu.init || !s->cu.lock || !s->cu.checkpoint || !s->cu.restore ||
        !s->cu.unlock)
      snprintf(why, sizeof why,
               "the driver has no checkpoint API (driver 570 or later "
               "needed)");
    else if ((r = s->cu.init(0)) != CUDA_SUCCESS)
      snprintf(why, sizeof why, "cuInit failed (CUDA error %d)", r);
    else if (s->cu.version && s->cu.version(&v) == CUDA_SUCCESS)
      cogpu__log(COGPU_LOG_INFO,
                 "suspension through the checkpoint API of "
                 "CUDA driver %d.%d",
                 v / 1000, v % 1000 / 10);
  }
  pthread_mutex_lock(&s->mu);
  s->cap = why[0] ? CAP_NONE : CAP_OK;
  s->driver = v;
  snprintf(s->cap_why, sizeof s->cap_why, "%s", why);
  pthread_mutex_unlock(&s->mu);
  if (why[0])
    cogpu__log(COGPU_LOG_WARN, "jobs cannot be suspended: %s", why);
}

/* Is process i of the job still the one that attached? Not once it has
 * exited (its pidfd says so, and stays valid whatever later takes its
 * PID), nor when its PID now names a process started at another time. */
static bool same_process(const sjob_t *j, int i) {
  if (j->pids[i] <= 0)
    return false;
  if (j->pidfds[i] >= 0) {
    struct pollfd p = {.fd = j->pidfds[i], .events = POLLIN};
    return poll(&p, 1, 0) == 0;
  }
  return cogpu__proc_starttime(j->pids[i]) == j->starts[i];
}

static void sjob_free(sjob_t *j) {
  for (int i = 0; i < j->o.npids; i++)
    if (j->pidfds[i] >= 0)
      close(j->pidfds[i]);
  free(j);
}

/* The job's processes as the ledger names them now, each checked against
 * its start time once its pidfd is held (so that the pidfd is of the
 * process that attached, or of none). */
static void sjob_take_pids(struct cogpu_s *h, sjob_t *j) {
  j->o.npids = (int)cogpu__ledger_job_pids(h, j->o.slot, j->pids, j->starts,
                                           SUSP_MAX_PIDS);
  for (int i = 0; i < j->o.npids; i++) {
    j->pidfds[i] = -1;
    j->pidfds[i] = (int)syscall(SYS_pidfd_open, j->pids[i], 0);
    if (j->pidfds[i] >= 0)
      fcntl(j->pidfds[i], F_SETFD, FD_CLOEXEC);
    if (cogpu__proc_starttime(j->pids[i]) != j->starts[i]) {
      if (j->pidfds[i] >= 0)
        close(j->pidfds[i]);
      j->pidfds[i] = -1;
      j->pids[i] = 0; /* gone, or its PID is another's now */
    }
  }
}

/* Puts every process of the job back to RUNNING, restoring those that were
 * checkpointed: used when a suspension fails half-way and by recovery.
 * Only ever called while the ledger still books the job's footprint. */
static void undo(cogpu__susp_t *s, sjob_t *j) {
  for (int i = 0; i < j->o.npids; i++) {
    CUcheckpointRestoreArgs ra = {0};
    CUcheckpointUnlockArgs ua = {0};
    if (!same_process(j, i))
      continue; /* gone: nothing of it to put back */
    CUresult r = s->cu.restore(j->pids[i], &ra);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_ILLEGAL_STATE &&
        r != CUDA_ERROR_INVALID_VALUE) {
      j->o.broken = true;
      snprintf(j->o.msg, sizeof j->o.msg, "restoring pid %d failed: %s",
               j->pids[i], cu_err(r));
    }
    r = s->cu.unlock(j->pids[i], &ua);
    (void)r; /* not locked (never was, or gone): nothing to do */
  }
}

/* The driver exports the checkpoint API but answers CUDA_ERROR_NOT_SUPPORTED
 * (an older driver, a GPU or a configuration it does not support) and no
 * suspension ever succeeded here: learnt once, for the node, said once
 * (log, `cogpu status`, `cogpu doctor`), instead of one failed try per job
 * before each fallback. A driver that did suspend a job once keeps
 * trying: a refusal is then that process's. */
static void no_checkpoints(cogpu__susp_t *s) {
  pthread_mutex_lock(&s->mu);
  bool first = s->cap == CAP_OK;
  s->cap = CAP_NONE;
  snprintf(s->cap_why, sizeof s->cap_why,
           "the driver does not support checkpointing "
           "(cuCheckpointProcessLock: CUDA_ERROR_NOT_SUPPORTED)");
  pthread_mutex_unlock(&s->mu);
  if (first)
    cogpu__log(COGPU_LOG_WARN, "jobs cannot be suspended: %s", s->cap_why);
}

static void run_suspend(cogpu__susp_t *s, sjob_t *j) {
  int locked = 0;
  for (; locked < j->o.npids; locked++) {
    CUcheckpointLockArgs la = {.timeoutMs = j->lock_ms};
    if (!same_process(j, locked)) {
      j->o.rc = -ESRCH;
      snprintf(j->o.msg, sizeof j->o.msg,
               "process %d of the job has ended (its PID may be another "
               "process's now)",
               j->pids[locked] > 0 ? j->pids[locked] : 0);
      break;
    }
    CUresult r = s->cu.lock(j->pids[locked], &la);
    if (r == CUDA_ERROR_NOT_SUPPORTED && !s->ever_ok)
      no_checkpoints(s);
    if (r != CUDA_SUCCESS) {
      j->o.rc = r == CUDA_ERROR_NOT_READY ? -EBUSY : -EIO;
      snprintf(j->o.msg, sizeof j->o.msg, "locking pid %d: %s", j->pids[locked],
               cu_err(r));
      break;
    }
  }
  if (j->o.rc == 0)
    for (int i = 0; i < j->o.npids; i++) {
      CUcheckpointCheckpointArgs ca = {0};
      if (!same_process(j, i)) {
        j->o.rc = -ESRCH;
        snprintf(j->o.msg, sizeof j->o.msg, "process %d of the job has ended",
                 j->pids[i]);
        break;
      }
      CUresult r = s->cu.checkpoint(j->pids[i], &ca);
      if (r != CUDA_SUCCESS) {
        j->o.rc = -EIO;
        snprintf(j->o.msg, sizeof j->o.msg, "checkpointing pid %d: %s",
                 j->pids[i], cu_err(r));
        break;
      }
    }
  if (j->o.rc) {
    sjob_t part = *j;
    part.o.npids = locked;
    part.o.broken = false;
    undo(s, &part);
    j->o.broken = part.o.broken;
  } else {
    s->ever_ok = true;
  }
}

/* Reserve before restore covers what the ledger knows; the driver may
 * still hold memory the ledger has already given back: a process whose
 * connection closed is not gone yet (its device memory is torn down after
 * its sockets close, and a large one takes a while), or a process outside
 * cogpu's view started since the last foreign refresh. A restore into that
 * memory fails for good (the process stays wedged), so the restore starts
 * only when the driver reports the footprint free; until then the job
 * stays in RESUMING, its footprint booked, and the loop tries again. No
 * NVML: nothing to ask, the restore goes ahead. */
static bool room_for(sjob_t *j) {
  uint64_t free_b = 0;
  if (j->need == 0 || cogpu__nvml_mem_free(j->gpu, &free_b) != 0 ||
      free_b >= j->need)
    return true;
  char a[32], b[32];
  cogpu__fmt_size(free_b, a, sizeof a);
  cogpu__fmt_size(j->need, b, sizeof b);
  j->o.rc = -EAGAIN;
  snprintf(j->o.msg, sizeof j->o.msg,
           "the driver has %s free on the GPU, and its memory needs %s "
           "(processes that ended and are still exiting, or memory used "
           "outside cogpu's view)",
           a, b);
  return false;
}

/* Does a process of the job still have its memory in host memory? A
 * resume a previous daemon began may have restored it already (killed
 * mid-restore, or after the restore and before the unlock): the process
 * then holds its footprint on the GPU, LOCKED, and waiting for the driver
 * to have that much free again would wait for memory it holds itself
 * (issue 25: the new daemon left such jobs locked for good). Without
 * GetState: assumed so. GetState is slow on some drivers (seconds): asked
 * only here, once per process of a resume. */
static bool any_checkpointed(cogpu__susp_t *s, sjob_t *j) {
  if (!s->cu.get_state)
    return true;
  for (int i = 0; i < j->o.npids; i++) {
    CUprocessState st = CU_PROCESS_STATE_RUNNING;
    if (!same_process(j, i))
      continue;
    if (s->cu.get_state(j->pids[i], &st) != CUDA_SUCCESS ||
        st == CU_PROCESS_STATE_CHECKPOINTED)
      return true;
  }
  return false;
}

/* The restore's arguments, whole: the struct's layout changed from one
 * CUDA release to the next (12.9: reserved bytes only; 13.0 to 13.2:
 * gpuPairs, gpuPairsCount, reserved, reserved1; 13.3: gpuPairs,
 * gpuPairsCount, reserved; 13.4: a custom storage pointer after them), but
 * it is 64 bytes in each, and the pairs and their count lead it from 13.0
 * on. All zero but those two, it means the same to each driver. */
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64,
               "the restore arguments are 64 bytes in every CUDA release");
static void restore_args(const sjob_t *j, CUcheckpointRestoreArgs *ra) {
  memset(ra, 0, sizeof *ra);
  if (j->npairs) {
    ra->gpuPairs = (CUcheckpointGpuPair *)j->pairs;
    ra->gpuPairsCount = j->npairs;
  }
}

/* Is process i of the job still checkpointed (nothing of it restored)? */
static bool still_checkpointed(cogpu__susp_t *s, sjob_t *j, int i) {
  CUprocessState st = CU_PROCESS_STATE_RUNNING;
  return s->cu.get_state && same_process(j, i) &&
         s->cu.get_state(j->pids[i], &st) == CUDA_SUCCESS &&
         st == CU_PROCESS_STATE_CHECKPOINTED;
}

static void run_resume(cogpu__susp_t *s, sjob_t *j) {
  if (j->o.rc)
    return; /* refused before it began (cogpu__susp_submit) */
  if (any_checkpointed(s, j) && !room_for(j))
    return;
  bool moved = false; /* a process of the job is on the new GPU now */
  for (int i = 0; i < j->o.npids; i++) {
    CUcheckpointRestoreArgs ra;
    CUcheckpointUnlockArgs ua = {0};
    if (!same_process(j, i))
      continue; /* the process is gone (its PID may be another's) */
    restore_args(j, &ra);
    CUresult r = s->cu.restore(j->pids[i], &ra);
    if (j->npairs && !moved && r != CUDA_SUCCESS &&
        r != CUDA_ERROR_ILLEGAL_STATE && still_checkpointed(s, j, i)) {
      /* The driver will not put it there (a mapping it does not take),
       * and nothing of the job has moved: it goes back to wait where it
       * was parked (the ledger, on -EXDEV), still checkpointed. */
      j->o.rc = -EXDEV;
      snprintf(j->o.msg, sizeof j->o.msg,
               "the driver refused to restore pid %d onto GPU %d "
               "(CUDA error %d: %s)",
               j->pids[i], j->move_to, r, cu_err(r));
      return;
    }
    if (r == CUDA_ERROR_INVALID_VALUE)
      continue; /* the process is gone */
    moved |= r == CUDA_SUCCESS;
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_ILLEGAL_STATE) {
      j->o.rc = -EIO;
      j->o.broken = true;
      snprintf(j->o.msg, sizeof j->o.msg, "restoring pid %d: %s", j->pids[i],
               cu_err(r));
      continue;
    }
    r = s->cu.unlock(j->pids[i], &ua);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_ILLEGAL_STATE &&
        r != CUDA_ERROR_INVALID_VALUE) {
      j->o.rc = -EIO;
      snprintf(j->o.msg, sizeof j->o.msg, "unlocking pid %d: %s", j->pids[i],
               cu_err(r));
    }
  }
}

/* The first job due now, unlinked from the list; NULL if none is. Under
 * mu. The list is short (a job has at most one operation in flight). */
static sjob_t *take_ready(cogpu__susp_t *s) {
  uint64_t now = cogpu__now_ns();
  for (sjob_t **pp = &s->todo; *pp; pp = &(*pp)->next) {
    sjob_t *j = *pp;
    if (j->o.not_before_ns > now)
      continue;
    *pp = j->next;
    if (!*pp)
      s->todo_tail = pp;
    j->next = NULL;
    return j;
  }
  return NULL;
}

/* When the earliest deferred job is due (monotonic ns), 0 if none waits. */
static uint64_t next_due(cogpu__susp_t *s) {
  uint64_t when = 0;
  for (sjob_t *j = s->todo; j; j = j->next)
    if (!when || j->o.not_before_ns < when)
      when = j->o.not_before_ns;
  return when;
}

static void enqueue(cogpu__susp_t *s, sjob_t *j) {
  j->next = NULL;
  pthread_mutex_lock(&s->mu);
  *s->todo_tail = j;
  s->todo_tail = &j->next;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* A GPU's UUID as NVML writes it ("GPU-" and 32 hex digits in groups) into
 * the driver's 16 bytes; false if it is not one (a MIG instance's, say). */
static bool uuid_bytes(const char *text, CUuuid *u) {
  if (strncmp(text, "GPU-", 4) != 0)
    return false;
  const char *p = text + 4;
  for (int k = 0; k < 16; k++) {
    unsigned v;
    if (*p == '-')
      p++;
    if (sscanf(p, "%2x", &v) != 1 || !p[0] || !p[1] || p[0] == '-' ||
        p[1] == '-')
      return false;
    u->bytes[k] = (char)v;
    p += 2;
  }
  return *p == 0;
}

/* A resume onto another GPU: a pair for every GPU of the node (the driver
 * needs each GPU the process can see named), `from` and `to` swapped, the
 * others onto themselves. */
static bool move_pairs(struct cogpu_s *h, sjob_t *j, uint32_t from,
                       uint32_t to) {
  const ledger_hdr_t *hd = &h->st->hdr;
  j->npairs = 0;
  for (uint32_t g = 0; g < hd->ngpus && g < LEDGER_MAX_GPUS; g++) {
    uint32_t n = g == from ? to : g == to ? from : g;
    if (!uuid_bytes(hd->gpus[g].uuid, &j->pairs[g].oldUuid) ||
        !uuid_bytes(hd->gpus[n].uuid, &j->pairs[g].newUuid))
      return false;
    j->npairs++;
  }
  j->move_from = (int)from;
  j->move_to = (int)to;
  return true;
}

static void *worker(void *arg) {
  cogpu__susp_t *s = arg;
  load_cuda(s);
  pthread_mutex_lock(&s->mu);
  for (;;) {
    sjob_t *j = NULL;
    while (!s->stop && !(j = take_ready(s))) {
      uint64_t when = next_due(s);
      if (!when) {
        pthread_cond_wait(&s->cv, &s->mu);
        continue;
      }
      struct timespec ts = {(time_t)(when / 1000000000u),
                            (long)(when % 1000000000u)};
      pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    if (s->stop)
      break;
    int cap = s->cap;
    pthread_mutex_unlock(&s->mu);
    uint64_t t0 = cogpu__now_ns();
    if (cap != CAP_OK) {
      j->o.rc = -ENOTSUP;
      snprintf(j->o.msg, sizeof j->o.msg, "%s", s->cap_why);
    } else if (j->o.op == LEDGER_OP_SUSPEND) {
      run_suspend(s, j);
    } else if (j->o.op == LEDGER_OP_RESUME) {
      run_resume(s, j);
    } else {
      undo(s, j);
    }
    j->o.took_ns = cogpu__now_ns() - t0;
    pthread_mutex_lock(&s->mu);
    j->next = s->done;
    s->done = j;
    uint64_t one = 1;
    if (write(s->efd, &one, sizeof one) < 0) {
      /* the counter is only a wake-up: a full one wakes the loop anyway */
    }
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* --- the ledger's hooks ------------------------------------------------------
 */

static uint64_t meminfo(const char *key) {
  FILE *f = fopen("/proc/meminfo", "re");
  char line[256];
  uint64_t v = 0;
  size_t kl = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtoull(line + kl + 1, NULL, 10) * 1024u;
      break;
    }
  if (f)
    fclose(f);
  return v;
}

/* Bytes suspended now, and being suspended (their copies are on the way
 * into host memory). */
/* The node's suspended footprints, and (in_flight) the part of them whose
 * copy to host memory is still under way: not yet out of MemAvailable. */
static uint64_t suspended_total_of(cogpu__daemon_t *d, uint64_t *in_flight) {
  uint64_t sum = 0, flying = 0;
  ledger_state_t *st = d->dh->st;
  LEDGER_FOR_SLOTS(st, s) {
    const ledger_slot_t *sl = &st->slots[s];
    if (sl->state != SLOT_ACTIVE)
      continue;
    if (sl->susp == SUSP_SUSPENDED)
      sum += sl->parked;
    else if (sl->susp == SUSP_SUSPENDING && sl->susp_gpu < LEDGER_MAX_GPUS)
      flying += sl->held[sl->susp_gpu];
  }
  if (in_flight)
    *in_flight = flying;
  return sum + flying;
}

static uint64_t suspended_total(cogpu__daemon_t *d) {
  return suspended_total_of(d, NULL);
}

static uint64_t suspend_max(cogpu__daemon_t *d) {
  uint64_t most = d->cfg.v[COGPU_OPT_SUSPEND_MAX].u;
  return most ? most : meminfo("MemTotal") / 2;
}

static int hook_can(void *ctx, uint64_t bytes, char *why, size_t len) {
  cogpu__susp_t *s = ctx;
  cogpu__daemon_t *d = s->d;
  pthread_mutex_lock(&s->mu);
  int cap = s->cap;
  pthread_mutex_unlock(&s->mu);
  if (cap == CAP_INIT)
    return snprintf(why, len, "the daemon is still initialising CUDA"), -EAGAIN;
  if (cap == CAP_NONE)
    return snprintf(why, len, "%s", s->cap_why), -ENOTSUP;
  char a[32], b[32];
  uint64_t avail = meminfo("MemAvailable");
  uint64_t margin = d->cfg.v[COGPU_OPT_SUSPEND_HOST_MARGIN].u;
  uint64_t most = suspend_max(d);
  uint64_t flying;
  uint64_t now = suspended_total_of(d, &flying);
  /* Several may be parked at once: the copies under way still count
   * against the host memory they are about to take. */
  avail = avail > flying ? avail - flying : 0;
  if (now + bytes > most)
    return snprintf(why, len, "%s more suspended would pass suspend_max (%s)",
                    cogpu__fmt_size(bytes, a, sizeof a),
                    cogpu__fmt_size(most, b, sizeof b)),
           -ENOSPC;
  if (avail < bytes || avail - bytes < margin)
    return snprintf(why, len,
                    "host memory: %s available, %s needed plus "
                    "suspend_host_margin",
                    cogpu__fmt_size(avail, a, sizeof a),
                    cogpu__fmt_size(bytes, b, sizeof b)),
           -ENOMEM;
  return 0;
}

/* hook_can's two bounds as one figure: how much more host memory can take
 * of suspended footprint. Admission asks on each request while the host
 * cannot park the node's GPUs' memory, so MemAvailable and the suspended
 * total are read at most every 100 ms, and again after each suspension or
 * resume is decided or done (cogpu__susp_submit, cogpu__susp_take). */
static uint64_t hook_room(void *ctx) {
  cogpu__susp_t *s = ctx;
  cogpu__daemon_t *d = s->d;
  pthread_mutex_lock(&s->mu);
  int cap = s->cap;
  pthread_mutex_unlock(&s->mu);
  if (cap != CAP_OK)
    return UINT64_MAX; /* nothing can be parked: nothing to keep parkable */
  uint64_t now = cogpu__now_ns();
  if (s->room_ns && now - s->room_ns < cogpu__ms_to_ns(100))
    return s->room;
  uint64_t flying, avail = meminfo("MemAvailable");
  uint64_t total = suspended_total_of(d, &flying), most = suspend_max(d);
  uint64_t margin = d->cfg.v[COGPU_OPT_SUSPEND_HOST_MARGIN].u;
  avail = avail > flying ? avail - flying : 0;
  uint64_t by_max = most > total ? most - total : 0;
  uint64_t by_host = avail > margin ? avail - margin : 0;
  s->room = by_max < by_host ? by_max : by_host;
  s->room_ns = now;
  return s->room;
}

/* Migration needs the option and a driver that restores onto a GPU
 * mapping: CUDA 13.0 (driver 580) or later, whose checkpoint calls work. */
static bool hook_can_move(void *ctx) {
  cogpu__susp_t *s = ctx;
  if (!s->migrate)
    return false;
  pthread_mutex_lock(&s->mu);
  bool ok = s->cap == CAP_OK && s->driver >= 13000;
  pthread_mutex_unlock(&s->mu);
  return ok;
}

void cogpu__susp_status(cogpu__daemon_t *d, cogpu_status_t *st) {
  cogpu__susp_t *s = d->susp;
  if (!d->dh)
    return;
  st->suspended_bytes = suspended_total(d);
  st->suspend_max_bytes = suspend_max(d);
  st->host_available_bytes = meminfo("MemAvailable");
  st->host_margin_bytes = d->cfg.v[COGPU_OPT_SUSPEND_HOST_MARGIN].u;
  int cap = CAP_NONE;
  if (s) {
    pthread_mutex_lock(&s->mu);
    cap = s->cap;
    pthread_mutex_unlock(&s->mu);
  }
  snprintf(st->suspension, sizeof st->suspension, "%.120s",
           !s                   ? "no: not in this daemon"
           : cap == CAP_INIT    ? "starting (cuInit)"
           : cap == CAP_NONE    ? s->cap_why
           : !s->sp.on_deadlock ? "yes (by hand; suspend=no)"
                                : "yes");
}

/* Slot m's entry, fresh (idle from now) if it was of an earlier
 * registration. */
static idle_ent_t *idle_of(cogpu__susp_t *s, struct cogpu_s *h, uint32_t m) {
  idle_ent_t *e = &s->idle[m];
  uint32_t gen = atomic_load(&h->st->slots[m].gen);
  if (e->gen != gen) {
    e->gen = gen;
    e->last_ns = cogpu__now_ns(); /* idle from when first seen */
  }
  return e;
}

static uint64_t hook_idle_ms(void *ctx, struct cogpu_s *h, uint32_t slot) {
  cogpu__susp_t *s = ctx;
  uint32_t members[SUSP_MAX_PIDS];
  size_t n = cogpu__ledger_job_members(h, slot, members, SUSP_MAX_PIDS);
  uint64_t least = UINT64_MAX;
  for (size_t i = 0; i < n; i++) {
    /* Read after the entry: a fresh one is stamped now, and a time taken
     * before it made it look idle for 584 years (every new process was
     * suspended at once). */
    uint64_t last = idle_of(s, h, members[i])->last_ns, now = cogpu__now_ns();
    uint64_t idle = now > last ? now - last : 0;
    least = idle < least ? idle : least;
  }
  return n == 0 ? 0 : least / 1000000u;
}

static uint64_t learn_key(uint32_t uid, const char *command,
                          const char *model) {
  uint64_t k = 1469598103934665603ull ^ uid; /* FNV-1a */
  for (const char *p = command; *p; p++)
    k = (k ^ (unsigned char)*p) * 1099511628211ull;
  k = (k ^ 0xff) * 1099511628211ull;
  for (const char *p = model; *p; p++)
    k = (k ^ (unsigned char)*p) * 1099511628211ull;
  return k ? k : 1;
}

/* The entry of (uid, command, model), or (create) the place for it. */
static learn_ent_t *learn_find(cogpu__susp_t *s, uint32_t uid,
                               const char *command, const char *model,
                               bool create) {
  if (!s || !s->learnt || !command[0])
    return NULL;
  uint64_t k = learn_key(uid, command, model);
  for (unsigned i = 0; i < 8; i++) {
    learn_ent_t *e = &s->learnt[(k + i) % LEARN_SIZE];
    if (e->key == k && e->uid == uid && !strcmp(e->command, command) &&
        !strcmp(e->model, model))
      return e;
    if (!e->key || (create && i == 7)) {
      if (!create)
        return NULL;
      /* Empty, or the last place to look: taken over (a lost hint). */
      memset(e, 0, sizeof *e);
      e->key = k;
      e->uid = uid;
      snprintf(e->command, sizeof e->command, "%s", command);
      snprintf(e->model, sizeof e->model, "%s", model);
      return e;
    }
  }
  return NULL;
}

void cogpu__susp_learn(cogpu__daemon_t *d, uint32_t uid, const char *command,
                       const char *model, uint64_t peak) {
  learn_ent_t *e = learn_find(d->susp, uid, command, model, true);
  if (!e || !peak)
    return;
  e->peaks[e->next++ % LEARN_RUNS] = peak;
}

static uint64_t hook_expect(void *ctx, struct cogpu_s *h, uint32_t slot,
                            uint32_t g) {
  const ledger_slot_t *sl = &h->st->slots[slot];
  if (!((cogpu__susp_t *)ctx)->admit_learnt)
    return 0;
  learn_ent_t *e =
      learn_find(ctx, sl->uid, sl->command, h->st->hdr.gpus[g].name, false);
  uint64_t most = 0;
  for (unsigned i = 0; e && i < LEARN_RUNS; i++)
    most = e->peaks[i] > most ? e->peaks[i] : most;
  return most;
}

static int cmp_unsigned(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  return x < y ? -1 : x > y;
}

/* On the timer, while jobs may be preempted for idleness: which pids did
 * GPU work since the last look. */
void cogpu__susp_sample(cogpu__daemon_t *d);
void cogpu__susp_sample(cogpu__daemon_t *d) {
  cogpu__susp_t *s = d->susp;
  if (!s || s->sp.max_idle_ms < 0 || !d->dh || d->dh->st->hdr.nwaiting == 0)
    return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t now_us =
      (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000;
  uint64_t since = s->sampled_us ? s->sampled_us : now_us - 1000000u;
  s->sampled_us = now_us;
  ledger_hdr_t *hd = &d->dh->st->hdr;
  static unsigned busy[LEDGER_MAX_GPUS * 256];
  size_t nbusy = 0;
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    unsigned *pids = busy + nbusy;
    size_t n = 0;
    if (cogpu__nvml_busy_pids(hd->gpus[g].index, since, pids, 256, &n)) {
      if (!s->idle_warned)
        cogpu__log(COGPU_LOG_WARN, "max_idle: cannot tell idle jobs: %s",
                   cogpu_last_error());
      s->idle_warned = true;
      continue;
    }
    nbusy += n;
  }
  /* The registrations of the busy PIDs did GPU work now. */
  qsort(busy, nbusy, sizeof *busy, cmp_unsigned);
  ledger_state_t *st = d->dh->st;
  LEDGER_FOR_SLOTS_WHILE(st, m, nbusy) {
    unsigned pid = (unsigned)st->slots[m].pid;
    if (st->slots[m].state == SLOT_ACTIVE &&
        bsearch(&pid, busy, nbusy, sizeof *busy, cmp_unsigned))
      idle_of(s, d->dh, m)->last_ns = cogpu__now_ns();
  }
}

/* --- the loop's side
 * ----------------------------------------------------------- */

int cogpu__susp_start(cogpu__daemon_t *d) {
  cogpu__susp_t *s = calloc(1, sizeof *s);
  if (!s)
    return cogpu__seterr(-ENOMEM, "out of memory");
  s->d = d;
  s->idle = calloc(LEDGER_MAX_SLOTS, sizeof *s->idle);
  s->learnt = calloc(LEARN_SIZE, sizeof *s->learnt);
  s->admit_learnt = d->cfg.v[COGPU_OPT_ADMIT_LEARNT].i != 0;
  s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* cogpu__now_ns's */
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  s->todo_tail = &s->todo;
  s->sp = (ledger_suspender_t){
      .ctx = s,
      .on_deadlock = d->cfg.v[COGPU_OPT_SUSPEND].i != 0,
      .on_priority = d->cfg.v[COGPU_OPT_PREEMPT_PRIORITY].i != 0,
      .max_idle_ms = d->cfg.v[COGPU_OPT_MAX_IDLE].i,
      .can = hook_can,
      .idle_ms = hook_idle_ms,
      .expect = hook_expect,
      .room = hook_room,
      .can_move = hook_can_move};
  s->migrate = d->cfg.v[COGPU_OPT_MIGRATE].i != 0;
  if (!s->idle || !s->learnt || s->efd < 0 ||
      pthread_create(&s->thr, NULL, worker, s) != 0) {
    int e = errno;
    if (s->efd >= 0)
      close(s->efd);
    free(s->idle);
    free(s->learnt);
    free(s);
    return cogpu__seterr(-e, "cannot start the suspender: %s", strerror(e));
  }
  s->started = true;
  d->susp = s;
  d->host.suspender = &s->sp;
  return 0;
}

int cogpu__susp_fd(cogpu__daemon_t *d) {
  return d->susp ? d->susp->efd : -1;
}

void cogpu__susp_stop(cogpu__daemon_t *d) {
  cogpu__susp_t *s = d->susp;
  if (!s)
    return;
  d->host.suspender = NULL;
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  /* A driver call may take long (a restore of tens of GiB): the daemon
   * stops anyway; the next one finds the job half done and finishes it. */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 2;
  if (pthread_timedjoin_np(s->thr, NULL, &ts) != 0)
    return; /* leaked on purpose: it still runs */
  while (s->todo) {
    sjob_t *j = s->todo;
    s->todo = j->next;
    sjob_free(j);
  }
  while (s->done) {
    sjob_t *j = s->done;
    s->done = j->next;
    sjob_free(j);
  }
  while (s->taken) {
    sjob_t *j = s->taken;
    s->taken = j->next;
    sjob_free(j);
  }
  close(s->efd);
  free(s->idle);
  free(s->learnt);
  free(s);
  d->susp = NULL;
}

/* --- what the loop hands over and takes back -------------------------------
 * The loop owns the operations (one in flight per job); the suspender runs
 * each one handed to it and hands it back done. */

int cogpu__susp_submit(cogpu__daemon_t *d, uint64_t id, uint32_t slot,
                       uint32_t gen, int op) {
  cogpu__susp_t *s = d->susp;
  struct cogpu_s *h = d->dh;
  if (!s || !h)
    return -ENOTSUP;
  sjob_t *j = calloc(1, sizeof *j);
  if (!j)
    return -ENOMEM;
  j->o.id = id;
  j->o.slot = slot;
  j->o.gen = gen;
  j->o.op = op;
  const ledger_slot_t *sl = &h->st->slots[slot];
  sjob_take_pids(h, j);
  /* The footprint: still in held while suspending, booked back into held
   * when resuming. */
  j->o.bytes = sl->susp_gpu < LEDGER_MAX_GPUS ? sl->held[sl->susp_gpu] : 0;
  j->lock_ms = (unsigned)d->cfg.v[COGPU_OPT_SUSPEND_LOCK_TIMEOUT].i;
  j->move_from = j->move_to = -1;
  if (op == LEDGER_OP_RESUME && sl->susp_gpu < h->st->hdr.ngpus) {
    j->gpu = h->st->hdr.gpus[sl->susp_gpu].index;
    if (sl->susp_from && sl->susp_from <= h->st->hdr.ngpus &&
        !move_pairs(h, j, (uint32_t)sl->susp_from - 1,
                    (uint32_t)sl->susp_gpu)) {
      /* Not a GPU the driver can name: not moved (the ledger puts it
       * back where it was). */
      j->npairs = 0;
      j->o.rc = -EXDEV;
      snprintf(j->o.msg, sizeof j->o.msg,
               "GPU %u or %u has no UUID the driver takes",
               (unsigned)sl->susp_from - 1, (unsigned)sl->susp_gpu);
    }
    /* What the suspension took off the GPU; after a daemon restart that
     * is not known here, and the whole booking stands for it. */
    j->need = s->parked_gen[slot] == gen ? s->parked[slot] : j->o.bytes;
  }
  enqueue(s, j);
  s->room_ns = 0; /* a footprint on its way in or out of host memory */
  return 0;
}

cogpu__susp_op_t *cogpu__susp_take(cogpu__daemon_t *d) {
  cogpu__susp_t *s = d->susp;
  if (!s)
    return NULL;
  if (!s->taken) {
    /* The wake-up is read before the list is taken: a job done meanwhile
     * wakes the loop again. */
    uint64_t x;
    if (read(s->efd, &x, sizeof x) < 0) {
      /* spurious: nothing to take */
    }
    pthread_mutex_lock(&s->mu);
    s->taken = s->done;
    s->done = NULL;
    pthread_mutex_unlock(&s->mu);
  }
  sjob_t *j = s->taken;
  if (!j)
    return NULL;
  s->taken = j->next;
  j->next = NULL;
  s->room_ns = 0;
  if (j->o.op == LEDGER_OP_SUSPEND && j->o.rc == 0) {
    /* What its resume will put back (loop thread only). */
    s->parked[j->o.slot] = j->o.bytes;
    s->parked_gen[j->o.slot] = j->o.gen;
  }
  return &j->o;
}

void cogpu__susp_again(cogpu__daemon_t *d, cogpu__susp_op_t *o) {
  sjob_t *j = (sjob_t *)o;
  o->rc = 0;
  o->broken = false;
  o->msg[0] = 0;
  enqueue(d->susp, j);
}

void cogpu__susp_release(cogpu__daemon_t *d, cogpu__susp_op_t *o) {
  (void)d;
  sjob_free((sjob_t *)o);
}

/* --- A job the driver cannot give back ------------------------------------
 * A process whose restore failed (or whose failed suspension could not be
 * undone) stays locked in the driver: its CUDA calls never return, and it
 * holds its memory, for good. Left alone it hangs its job forever, so it
 * is ended: each of its processes is told why on its stderr, then killed.
 * Its slot is freed as its connection closes, like any job that dies. */

/* Its stderr, if it is something one may append a line to: a file, a
 * pipe or a terminal; never another device, whose open may act. */
static void tell_stderr(pid_t pid, const char *line) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/2", (int)pid);
  struct stat sb;
  if (stat(path, &sb) != 0)
    return;
  bool tty = S_ISCHR(sb.st_mode) &&
             (major(sb.st_rdev) == 4 || major(sb.st_rdev) == 5 ||
              (major(sb.st_rdev) >= 136 && major(sb.st_rdev) <= 143));
  if (!S_ISREG(sb.st_mode) && !S_ISFIFO(sb.st_mode) && !tty)
    return;
  int fd = open(path, O_WRONLY | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0)
    return;
  if (write(fd, line, strlen(line)) < 0) {
    /* a full pipe or a closed terminal: the daemon's log says it too */
  }
  close(fd);
}

/* SIGKILL to the process of slot sl, if it is still the one the slot
 * names (PID and start time): through a pidfd where the kernel has them,
 * so that a PID reused in between is never hit. */
static void kill_slot_process(const ledger_slot_t *sl) {
  pid_t pid = sl->pid;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
  int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pfd >= 0) {
    if (cogpu__proc_starttime(pid) == sl->starttime)
      syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
    close(pfd);
    return;
  }
#endif
  if (cogpu__proc_starttime(pid) == sl->starttime)
    kill(pid, SIGKILL);
}

void cogpu__susp_end_stuck(cogpu__daemon_t *d, uint32_t slot, uint32_t gen,
                           const char *why) {
  ledger_state_t *st = d->dh->st;
  const ledger_slot_t *job = &st->slots[slot];
  if (job->state != SLOT_ACTIVE || atomic_load(&job->gen) != gen)
    return;
  char line[512];
  snprintf(line, sizeof line,
           "cogpu[%d]: error: the GPU driver could not give this job its "
           "memory back after a suspension (%s); it cannot continue and is "
           "ended (cogpud)\n",
           (int)getpid(), why);
  cogpu__log(COGPU_LOG_ERROR,
             "the driver could not give the job of pid %d its memory back "
             "(%s): its processes would wait for good; ending them",
             job->pid, why);
  LEDGER_FOR_SLOTS(st, s) {
    const ledger_slot_t *sl = &st->slots[s];
    bool mine = s == slot ||
                (sl->job == (uint64_t)slot + 1 && sl->job_gen == (uint64_t)gen);
    if (!mine || sl->state != SLOT_ACTIVE || !(sl->flags & COGPU_MARK_CUDA) ||
        sl->pid <= 0)
      continue;
    tell_stderr(sl->pid, line);
    kill_slot_process(sl);
  }
}
