/*
 * ledger.c: a process's attachment to the node state (the ledger backend of
 * the public API, backend.c): attach, release, detach, lookups, fork and
 * exit. The fast path (nobody waiting, the request
 * fits) is one uncontended lock, a few stores and an unlock: no system
 * call. Everything slow (liveness checks, NVML) happens only when a request
 * does not fit, on a waiter's housekeeping tick, or at attach.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ledger-int.h"

/* The child must not keep its parent's liveness lock alive: closing its
 * copy of the descriptor does not release the lock (the parent's copy holds
 * it), and marks the handle as the parent's. */
void cogpu__ledger_forked(struct cogpu_s *h) {
  if (!h->forked && h->fd >= 0)
    close(h->fd);
  h->fd = -1;
  h->forked = true;
}

/* The PID as the outermost visible PID namespace numbers it (NSpid's first
 * field), which is what NVML and other processes on the host see. */
static int self_host_pid(void) {
  FILE *f = fopen("/proc/self/status", "re");
  char line[256];
  int pid = getpid();
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "NSpid:", 6) == 0) {
      pid = atoi(line + 6);
      break;
    }
  if (f)
    fclose(f);
  return pid > 0 ? pid : getpid();
}

/* Drop a multi-byte character cut short at the end of s by truncation. */
static void utf8_trim_tail(char *s) {
  size_t n = strlen(s), i = n;
  while (i > 0 && ((unsigned char)s[i - 1] & 0xc0) == 0x80)
    i--;
  if (i == 0 || (unsigned char)s[i - 1] < 0xc0)
    return;
  unsigned char lead = (unsigned char)s[i - 1];
  size_t need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
  if (n - (i - 1) < need)
    s[i - 1] = 0;
}

void cogpu__ledger_slot_fill(struct cogpu_s *h, uint32_t slot, int pid,
                             uint32_t uid, int priority, const char *command,
                             const char *job_id) {
  ledger_slot_t *s = &h->st->slots[slot];
  cogpu__ledger_slot_mark(h, slot); /* before it becomes active */
  s->pid = pid;
  s->uid = uid;
  s->priority = priority;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  s->attached_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  snprintf(s->command, sizeof s->command, "%s", command ? command : "");
  snprintf(s->job_id, sizeof s->job_id, "%s", job_id ? job_id : "");
  utf8_trim_tail(s->command);
  utf8_trim_tail(s->job_id);
  memset(s->held, 0, sizeof s->held);
  memset(s->claim, 0, sizeof s->claim);
  memset(s->lent, 0, sizeof s->lent);
  s->job = s->job_gen = 0;
  s->flags = s->susp = s->susp_gpu = s->parked = s->susp_manual = 0;
  s->susp_since_ns = s->susp_count = s->susp_retry_ns = 0;
  s->grew_ns = 0;
  s->leaving = LEDGER_LEAVING_NO;
  for (uint32_t g = 0; g < LEDGER_MAX_GPUS; g++) {
    atomic_store_explicit(&s->usage.used[g], 0, memory_order_relaxed);
    atomic_store_explicit(&s->usage.peak[g], 0, memory_order_relaxed);
  }
  atomic_store_explicit(&s->usage.peak_ns, 0, memory_order_relaxed);
  memset(s->job_peak, 0, sizeof s->job_peak);
  s->job_peak_ns = s->held_max = s->held_max_gpu = s->waited_ns = 0;
  s->guard_fails = s->exit_status = 0;
  s->group = s->group_gen = s->group_peak_ns = 0;
  memset(s->group_peak, 0, sizeof s->group_peak);
  s->escaped = s->escaped_max = s->escaped_gpu = 0;
  s->escaped_pid = 0;
}

static void slot_fill(struct cogpu_s *h, const cogpu_attach_opts_t *o) {
  char cmd[128];
  if (o && o->command)
    snprintf(cmd, sizeof cmd, "%s", o->command);
  else
    cogpu__self_cmdline(cmd, sizeof cmd);
  cogpu__ledger_slot_fill(h, h->slot, self_host_pid(), (uint32_t)geteuid(),
                          o ? o->priority : 0, cmd, o ? o->job_id : NULL);
}

/* A free slot holds nothing. One that does (a grant into a freed slot by an
 * older build, a corrupting bug) is never inherited: its bytes are dropped
 * and the derived counters recounted from the active slots. */
static void slot_check_reuse(struct cogpu_s *h) {
  ledger_slot_t *s = &h->st->slots[h->slot];
  bool dirty = false;
  for (uint32_t g = 0; g < LEDGER_MAX_GPUS; g++)
    dirty |= s->held[g] || s->claim[g] || s->lent[g];
  if (!dirty)
    return;
  cogpu__log(COGPU_LOG_WARN,
             "slot %u was free but still held memory: dropped, and the "
             "node's counters recounted",
             h->slot);
  memset(s->held, 0, sizeof s->held);
  memset(s->claim, 0, sizeof s->claim);
  memset(s->lent, 0, sizeof s->lent);
  cogpu__ledger_recount(h);
}

/* Settings that are the node's, fixed when the state was created: say so
 * when this process was configured otherwise, instead of silently
 * ignoring it. */
static void warn_node_settings(struct cogpu_s *h) {
  const cogpu__optval_t *p = &h->cfg.v[COGPU_OPT_POLICY];
  if (p->source != COGPU_SRC_DEFAULT && (uint32_t)p->i != h->st->hdr.policy)
    cogpu__log(COGPU_LOG_WARN,
               "policy %s (%s) ignored: the node's state uses %s; an admin "
               "applies a new policy with `cogpu reset`",
               p->s, p->where, cogpu_policy_name((int)h->st->hdr.policy));
}

static int attach_join(struct cogpu_s *h, const char *token);

static int ledger_open(const cogpu__config_t *cfg,
                       const cogpu_attach_opts_t *opts, bool observer,
                       struct cogpu_s **out) {
  struct cogpu_s *h = calloc(1, sizeof *h);
  if (!h)
    return cogpu__seterr(-ENOMEM, "out of memory");
  h->fd = -1;
  h->cfg = *cfg;
  int rc = cogpu__ledger_shm_open(h);
  if (rc != 0) {
    free(h);
    return rc;
  }
  cogpu__fault(COGPU_FP_ATTACH);
  h->priority = opts ? opts->priority : 0;
  ledger_sweep_t sw;
  cogpu__ledger_sweep_probe(h, &sw); /* outside the lock: a syscall a slot */
  rc = cogpu__ledger_lock_bounded(h);
  if (rc) {
    cogpu__ledger_shm_close(h);
    free(h);
    return rc;
  }
  if (h->st->slots[h->slot].state == SLOT_ACTIVE)
    cogpu__ledger_slot_free(h, h->slot); /* left by a dead previous owner */
  else
    slot_check_reuse(h);
  cogpu__ledger_sweep_apply(h, &sw);
  if (!observer) {
    slot_fill(h, opts);
    cogpu__ledger_tx_set(h, &h->st->slots[h->slot].state, SLOT_ACTIVE);
    cogpu__ledger_tx_commit(h);
  }
  cogpu__ledger_serve(h);
  cogpu__ledger_unlock(h);
  if (!observer)
    warn_node_settings(h);
  *out = h;
  return 0;
}

int cogpu__ledger_open(const cogpu__config_t *cfg,
                       const cogpu_attach_opts_t *opts, bool observer,
                       struct cogpu_s **out) {
  int rc = ledger_open(cfg, opts, observer, out);
  if (rc == 0 && !observer && opts && opts->join && *opts->join) {
    rc = attach_join(*out, opts->join);
    if (rc) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", cogpu_last_error());
      cogpu__ledger_close(*out);
      *out = NULL;
      cogpu__clearerr();
      return cogpu__seterr(rc, "%s", msg);
    }
  }
  return rc;
}

static int check_handle(struct cogpu_s *h) {
  if (!h || !h->st)
    return cogpu__seterr(-EINVAL, "invalid cogpu handle");
  if (h->forked)
    return cogpu__seterr(-EINVAL, "this handle belongs to the parent process "
                                  "(fork): attach again in the child");
  return 0;
}

int cogpu__ledger_lock_live(struct cogpu_s *h) {
  int rc = cogpu__ledger_lock_bounded(h);
  if (rc)
    return rc;
  rc = cogpu__ledger_handle_live(h);
  if (rc) {
    cogpu__ledger_unlock(h);
    return rc;
  }
  cogpu__ledger_check_job(h);
  return 0;
}

int cogpu__ledger_handle_live(struct cogpu_s *h) {
  if (cogpu__ledger_me_live(h))
    return 0;
  return cogpu__seterr(-EINVAL, "this handle is detached (the process is "
                                "exiting, or its slot was reclaimed)");
}

void cogpu__ledger_check_job(struct cogpu_s *h) {
  if (cogpu__ledger_job_live(h))
    return;
  cogpu__log(COGPU_LOG_WARN, "the job this process joined has ended; "
                             "reserving on its own from now on");
  h->res_slot = h->slot;
}

/* Make reservations go to the job named by token ("slot.gen", from
 * cogpu_job_token in the job's first process). */
static int attach_join(struct cogpu_s *h, const char *token) {
  unsigned slot, gen;
  char extra;
  if (sscanf(token, "%u.%u%c", &slot, &gen, &extra) != 2 ||
      slot >= LEDGER_MAX_SLOTS)
    return cogpu__seterr(-EINVAL, "invalid job token '%s'", token);
  ledger_slot_t *s = &h->st->slots[slot];
  int rc = cogpu__ledger_lock_bounded(h);
  if (rc)
    return rc;
  bool live = s->state == SLOT_ACTIVE && atomic_load(&s->gen) == gen &&
              cogpu__ledger_slot_alive(h, slot, gen);
  if (live) {
    cogpu__ledger_slot_join(h, h->slot, &slot, &gen);
    h->res_slot = slot;
    h->res_gen = gen;
  }
  cogpu__ledger_unlock(h);
  if (!live)
    return cogpu__seterr(-ESRCH, "the job of token '%s' has ended", token);
  return 0;
}

void cogpu__ledger_slot_join(struct cogpu_s *h, uint32_t slot, uint32_t *job,
                             uint32_t *job_gen) {
  ledger_slot_t *me = &h->st->slots[slot];
  uint32_t root = cogpu__ledger_job_of(h, *job);
  if (root != *job) {
    /* A step's token: the job is the step's, the step is the figures'.
     * Jobs nest one level only: a member's claims come from a job slot. */
    me->group = *job + 1u;
    me->group_gen = *job_gen;
    *job_gen = atomic_load(&h->st->slots[root].gen);
    *job = root;
  }
  cogpu__ledger_tx_set(h, &me->job, *job + 1);
  cogpu__ledger_tx_set(h, &me->job_gen, *job_gen);
  cogpu__ledger_tx_commit(h);
}

static int check_gpu(struct cogpu_s *h, int gpu) {
  if (gpu < 0 || (uint32_t)gpu >= h->st->hdr.ngpus)
    return cogpu__seterr(-ENODEV, "no GPU %d on this node (%u GPUs)", gpu,
                         h->st->hdr.ngpus);
  return 0;
}

uint64_t cogpu__ledger_left_ago_ms(struct cogpu_s *h) {
  if (check_handle(h) != 0)
    return UINT64_MAX;
  uint32_t at = atomic_load_explicit(&h->st->hdr.left_ms, memory_order_acquire);
  if (at == 0)
    return UINT64_MAX;
  return (uint32_t)((uint32_t)(cogpu__now_ns() / 1000000u) - at);
}

int cogpu__ledger_room(struct cogpu_s *h, int gpu, uint64_t *capacity,
                       uint64_t *free_bytes) {
  int rc = check_handle(h);
  if (rc == 0)
    rc = check_gpu(h, gpu);
  if (rc)
    return rc;
  ledger_gpu_t *g = &h->st->hdr.gpus[gpu];
  uint64_t cap = cogpu__ledger_capacity(g);
  uint64_t res = __atomic_load_n(&g->reserved, __ATOMIC_RELAXED);
  *capacity = cap;
  *free_bytes = cap > res ? cap - res : 0;
  return 0;
}

uint64_t cogpu__ledger_job_spare(struct cogpu_s *h, int gpu) {
  if (check_handle(h) || check_gpu(h, gpu) || h->res_slot == h->slot)
    return 0;
  const ledger_slot_t *job = &h->st->slots[h->res_slot];
  uint64_t held = __atomic_load_n(&job->held[gpu], __ATOMIC_RELAXED);
  uint64_t lent = __atomic_load_n(&job->lent[gpu], __ATOMIC_RELAXED);
  return held > lent ? held - lent : 0;
}

int cogpu__ledger_job_token(struct cogpu_s *h, char *buf, size_t len) {
  int rc = check_handle(h);
  if (rc)
    return rc;
  if (!buf || len < 24)
    return cogpu__seterr(-EINVAL, "cogpu_job_token: buffer too small");
  snprintf(buf, len, "%u.%u", h->res_slot,
           h->res_slot == h->slot ? h->gen : h->res_gen);
  return 0;
}

int cogpu__ledger_step_token(struct cogpu_s *h, char *buf, size_t len) {
  int rc = check_handle(h);
  if (rc)
    return rc;
  if (!buf || len < 24)
    return cogpu__seterr(-EINVAL, "cogpu__step_token: buffer too small");
  snprintf(buf, len, "%u.%u", h->slot, h->gen);
  return 0;
}

void cogpu__ledger_close(struct cogpu_s *h) {
  /* A stopped lock holder: the slot is left to the others' sweep, which
   * finds it dead once our liveness lock goes with the descriptor. */
  /* An observer (status) never made its slot active: nothing to free. */
  bool active = h->st && h->st->slots[h->slot].state == SLOT_ACTIVE &&
                atomic_load(&h->st->slots[h->slot].gen) == h->gen;
  if (!h->forked && active && !atomic_load(&h->done) &&
      cogpu__ledger_lock_bounded(h) == 0) {
    atomic_store(&h->done, true);
    cogpu__ledger_slot_free(h, h->slot);
    cogpu__ledger_serve(h);
    cogpu__ledger_unlock(h);
  }
  cogpu__ledger_shm_close(h);
  free(h);
}

int cogpu__ledger_gpu_count(struct cogpu_s *h) {
  int rc = check_handle(h);
  return rc ? rc : (int)h->st->hdr.ngpus;
}

int cogpu__ledger_gpu_lookup(struct cogpu_s *h, const char *spec, int *gpu) {
  int rc = check_handle(h);
  if (rc)
    return rc;
  const char *uuids[LEDGER_MAX_GPUS];
  uint32_t n = h->st->hdr.ngpus;
  for (uint32_t g = 0; g < n && g < LEDGER_MAX_GPUS; g++)
    uuids[g] = h->st->hdr.gpus[g].uuid;
  return cogpu__gpu_spec(spec, uuids, n, gpu);
}

int cogpu__ledger_held(struct cogpu_s *h, int gpu, uint64_t *bytes) {
  int rc = check_handle(h);
  if (rc == 0)
    rc = check_gpu(h, gpu);
  if (rc == 0 && !bytes)
    rc = cogpu__seterr(-EINVAL, "bytes is NULL");
  if (rc == 0)
    *bytes =
        __atomic_load_n(&h->st->slots[h->res_slot].held[gpu], __ATOMIC_RELAXED);
  return rc;
}

static uint64_t unclaimed(const ledger_slot_t *job, int gpu) {
  return job->held[gpu] > job->lent[gpu] ? job->held[gpu] - job->lent[gpu] : 0;
}

/* Checks the handle and GPU, then takes the lock with the job re-checked
 * (the caller unlocks). */
static int gpu_call_lock(struct cogpu_s *h, int gpu) {
  int rc = check_handle(h);
  if (rc == 0)
    rc = check_gpu(h, gpu);
  return rc ? rc : cogpu__ledger_lock_live_fast(h);
}

/* Moves n bytes on gpu between the job's unclaimed part and this
 * process's claim (n < 0: back to the job), in one transaction. */
static void claim_move(struct cogpu_s *h, int gpu, int64_t n) {
  ledger_slot_t *job = &h->st->slots[h->res_slot];
  ledger_slot_t *me = &h->st->slots[h->slot];
  uint64_t lent = job->lent[gpu], back = n < 0 ? (uint64_t)-n : 0;
  cogpu__ledger_tx_set(h, &job->lent[gpu],
                       back ? (lent > back ? lent - back : 0)
                            : lent + (uint64_t)n);
  cogpu__ledger_tx_set(h, &me->claim[gpu], me->claim[gpu] + (uint64_t)n);
  cogpu__ledger_tx_commit(h);
}

int cogpu__ledger_claim(struct cogpu_s *h, int gpu, uint64_t want,
                        uint64_t *got) {
  int rc = gpu_call_lock(h, gpu);
  if (rc)
    return rc;
  *got = 0;
  if (h->res_slot != h->slot &&
      unclaimed(&h->st->slots[h->res_slot], gpu) < want) {
    /* Members that died give their claims back; the sweep costs a probe
     * per client, made without the lock, so only when the job is short. */
    ledger_sweep_t sw;
    cogpu__ledger_unlock(h);
    cogpu__ledger_sweep_probe(h, &sw);
    rc = gpu_call_lock(h, gpu);
    if (rc)
      return rc;
    cogpu__ledger_sweep_apply(h, &sw);
  }
  if (h->res_slot != h->slot) {
    uint64_t free_part = unclaimed(&h->st->slots[h->res_slot], gpu);
    *got = want < free_part ? want : free_part;
    if (*got)
      claim_move(h, gpu, (int64_t)*got);
  }
  cogpu__ledger_unlock(h);
  return 0;
}

/* A process whose job ended (its slot names itself as its job): what it
 * claimed became its own reservation, so giving a claim back releases it
 * from there. */
static bool job_ended(struct cogpu_s *h) {
  const ledger_slot_t *me = &h->st->slots[h->slot];
  return me->job == (uint64_t)h->slot + 1;
}

int cogpu__ledger_unclaim(struct cogpu_s *h, int gpu, uint64_t bytes) {
  int rc = gpu_call_lock(h, gpu);
  if (rc)
    return rc;
  if (h->res_slot != h->slot) {
    uint64_t mine = h->st->slots[h->slot].claim[gpu];
    uint64_t n = bytes < mine ? bytes : mine;
    if (n)
      claim_move(h, gpu, -(int64_t)n);
  } else if (job_ended(h)) {
    uint64_t held = h->st->slots[h->slot].held[gpu];
    rc = cogpu__ledger_release_locked(h, gpu, bytes < held ? bytes : held);
  }
  cogpu__ledger_unlock(h);
  return rc;
}

int cogpu__ledger_find_job(struct cogpu_s *h, const char *job_id, char *tok,
                           size_t len) {
  int rc = check_handle(h);
  if (rc)
    return rc;
  if (!job_id || !*job_id || len < 24)
    return cogpu__seterr(-EINVAL, "find_job: empty job id or short buffer");
  if (cogpu__ledger_lock_bounded(h))
    return -EBUSY;
  rc = -ESRCH;
  LEDGER_FOR_SLOTS_WHILE(h->st, s, rc) {
    ledger_slot_t *sl = &h->st->slots[s];
    uint32_t gen = atomic_load(&sl->gen);
    if (s == h->slot || sl->state != SLOT_ACTIVE || sl->job ||
        strncmp(sl->job_id, job_id, sizeof sl->job_id) != 0 ||
        !cogpu__ledger_slot_alive(h, s, gen))
      continue;
    snprintf(tok, len, "%u.%u", s, gen);
    rc = 0;
  }
  cogpu__ledger_unlock(h);
  return rc ? cogpu__seterr(rc, "no live job '%s' on this node", job_id) : 0;
}

/* Release while the job is suspended (a thread of one of its processes
 * that was not in a CUDA call): what it gives back comes off the parked
 * footprint, which is not on the GPU and so not in its reserved count. */
static int release_parked(struct cogpu_s *h, int gpu, uint64_t bytes) {
  ledger_slot_t *s = &h->st->slots[h->res_slot];
  ledger_slot_t *me = &h->st->slots[h->slot];
  if (bytes == COGPU_ALL)
    bytes = s->parked;
  if (bytes > s->parked)
    return cogpu__seterr(
        -EINVAL, "cannot release %llu bytes on GPU %d: %llu held",
        (unsigned long long)bytes, gpu, (unsigned long long)s->parked);
  cogpu__ledger_tx_set(h, &s->parked, s->parked - bytes);
  uint64_t unclaim = bytes < me->claim[gpu] ? bytes : me->claim[gpu];
  if (s != me && unclaim) {
    cogpu__ledger_tx_set(h, &me->claim[gpu], me->claim[gpu] - unclaim);
    cogpu__ledger_tx_set(h, &s->lent[gpu],
                         s->lent[gpu] > unclaim ? s->lent[gpu] - unclaim : 0);
  }
  cogpu__ledger_tx_commit(h);
  cogpu__ledger_serve(h);
  return 0;
}

int cogpu__ledger_release_locked(struct cogpu_s *h, int gpu, uint64_t bytes) {
  ledger_hdr_t *hd = &h->st->hdr;
  ledger_gpu_t *g = &hd->gpus[gpu];
  ledger_slot_t *s = &h->st->slots[h->res_slot];
  if (s->susp == SUSP_SUSPENDED && s->susp_gpu == (uint64_t)gpu)
    return release_parked(h, gpu, bytes);
  uint64_t held = s->held[gpu];
  bool all = bytes == COGPU_ALL;
  bool excl = g->excl_slot == h->res_slot + 1;
  if (all)
    bytes = held;
  if (bytes > held)
    return cogpu__seterr(
        -EINVAL, "cannot release %llu bytes on GPU %d: %llu held",
        (unsigned long long)bytes, gpu, (unsigned long long)held);
  bool ends_excl = all && excl;
  if (all && bytes)
    cogpu__ledger_note_left(h);
  cogpu__core_gpu_t was = cogpu__ledger_core_gpu(g);
  cogpu__core_gpu_t now = cogpu__core_released(&was, (uint64_t)h->res_slot + 1,
                                               held, bytes, ends_excl);
  if (bytes) {
    cogpu__ledger_tx_set(h, &s->held[gpu], held - bytes);
    cogpu__ledger_tx_set(h, &g->reserved, now.reserved);
  }
  ledger_slot_t *me = &h->st->slots[h->slot];
  uint64_t unclaim = bytes < me->claim[gpu] ? bytes : me->claim[gpu];
  if (s != me && unclaim) {
    cogpu__ledger_tx_set(h, &me->claim[gpu], me->claim[gpu] - unclaim);
    cogpu__ledger_tx_set(h, &s->lent[gpu],
                         s->lent[gpu] > unclaim ? s->lent[gpu] - unclaim : 0);
  }
  if (now.excl != was.excl)
    cogpu__ledger_tx_set(h, &g->excl_slot, now.excl);
  if (now.nclients != was.nclients)
    cogpu__ledger_tx_set(h, &g->nclients, now.nclients);
  cogpu__ledger_tx_commit(h);
  /* A hint for the deadlock guard, no transaction needed; the coarse clock
   * (a tick, 4 ms, behind at most) against a delay of 10 ms or more, for a
   * quarter of the precise clock's cost. Only while someone waits: the
   * guard counts a wait from its guard delay after it began, by when a
   * release made before it is older than the delay and no sign of a
   * moving job anyway (policy.c). */
  if (bytes && hd->nwaiting)
    s->released_ns = me->released_ns = cogpu__coarse_ns();
  if (hd->nwaiting) /* the common case, nobody waits, without a call */
    cogpu__ledger_serve(h);
  return 0;
}

void cogpu__ledger_end_exclusive(struct cogpu_s *h, int gpu) {
  ledger_gpu_t *g = &h->st->hdr.gpus[gpu];
  if (g->excl_slot != h->res_slot + 1)
    return;
  cogpu__ledger_tx_set(h, &g->excl_slot, 0);
  if (h->st->slots[h->res_slot].held[gpu] == 0)
    cogpu__ledger_tx_set(h, &g->nclients, g->nclients - 1);
  cogpu__ledger_tx_commit(h);
  cogpu__ledger_serve(h);
}

int cogpu__ledger_release(struct cogpu_s *h, int gpu, uint64_t bytes) {
  int rc = gpu_call_lock(h, gpu);
  if (rc)
    return rc;
  rc = cogpu__ledger_release_locked(h, gpu, bytes);
  cogpu__ledger_unlock_fast(h);
  return rc;
}

/* At exit (api.c's destructor): free the slot, so waiters are served now
 * rather than at their next housekeeping tick. */
void cogpu__ledger_at_exit(struct cogpu_s *h) {
  if (h->forked || !h->st || atomic_load(&h->done) ||
      cogpu__ledger_lock_bounded(h) != 0)
    return;
  /* Other threads may still call in: from now on they are refused. */
  atomic_store(&h->done, true);
  cogpu__ledger_slot_free(h, h->slot);
  cogpu__ledger_serve(h);
  cogpu__ledger_unlock(h);
}

/* The node daemon's attachment to its own state (trusted mode): opened with
 * the daemon's configuration, then recovered from a previous daemon that
 * died: its lock word is cleared and a half-done transaction rolled back.
 * The daemon's own slot holds no reservation and is never a client. */
int cogpu__ledger_open_trusted(const cogpu__config_t *cfg,
                               struct ledger_host_s *host,
                               struct cogpu_s **out) {
  struct cogpu_s *h = calloc(1, sizeof *h);
  if (!h)
    return cogpu__seterr(-ENOMEM, "out of memory");
  h->host = host;
  h->fd = -1;
  h->cfg = *cfg;
  int rc = cogpu__ledger_shm_open(h);
  if (rc) {
    free(h);
    return rc;
  }
  atomic_store(&h->st->hdr.lock, 0);
  cogpu__ledger_repair(h);
  h->st->slots[h->slot].state = SLOT_FREE;
  *out = h;
  return 0;
}

void cogpu__ledger_close_trusted(struct cogpu_s *h) {
  if (!h)
    return;
  cogpu__ledger_shm_close(h);
  free(h);
}

int cogpu__ledger_mark(struct cogpu_s *h, uint32_t flags) {
  int rc = check_handle(h);
  if (rc)
    return rc;
  rc = cogpu__ledger_lock_live(h);
  if (rc)
    return rc;
  rc = cogpu__ledger_mark_locked(h, flags);
  cogpu__ledger_unlock(h);
  return rc;
}
