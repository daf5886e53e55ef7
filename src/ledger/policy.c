/*
 * policy.c: which waiters are served, in which order, on which GPU.
 *
 * fifo: the first waiter in arrival order is served first; while it does
 * not fit, the waiters behind it on the same GPU wait too.
 * mmu (maximum memory utilisation): every waiter that fits is served, in
 * arrival order. To keep large requests from starving, a waiter older than
 * the node's mmu_max_age is served as under fifo: memory is held back for
 * it until it fits.
 * priority-fifo, priority-mmu: the same, ordered by priority (higher first),
 * then by arrival.
 */
#include <string.h>

#include "ledger-int.h"

_Static_assert(LEDGER_MAX_GPUS <= COGPU_CORE_MAX_GPUS,
               "a service pass covers every GPU of a node");

cogpu__core_rules_t cogpu__ledger_core_rules(struct cogpu_s *h) {
  const ledger_hdr_t *hd = &h->st->hdr;
  return (cogpu__core_rules_t){.policy = hd->policy,
                               .max_clients = hd->max_clients,
                               .mmu_max_age_ns =
                                   cogpu__ms_to_ns(hd->mmu_max_age_ms)};
}

static uint64_t gpu_free(const ledger_gpu_t *g) {
  cogpu__core_gpu_t c = cogpu__ledger_core_gpu(g);
  return cogpu__core_free(&c);
}

bool cogpu__ledger_grant(struct cogpu_s *h, uint32_t gi, uint32_t slot,
                         uint32_t member, uint64_t bytes, bool exclusive) {
  ledger_gpu_t *g = &h->st->hdr.gpus[gi];
  ledger_slot_t *s = &h->st->slots[slot];
  h->granted_gpu = gi;
  /* Bytes in a free slot would be counted by no sweep, ever. */
  if (slot >= LEDGER_MAX_SLOTS || member >= LEDGER_MAX_SLOTS ||
      s->state != SLOT_ACTIVE || h->st->slots[member].state != SLOT_ACTIVE) {
    cogpu__log(COGPU_LOG_WARN, "refused a grant into slot %u: not active",
               slot);
    return false;
  }
  if (member != slot && bytes) {
    /* Grown for one process of the job: that process's share, not free
     * for the job's other processes to claim. */
    ledger_slot_t *m = &h->st->slots[member];
    cogpu__ledger_tx_set(h, &s->lent[gi], s->lent[gi] + bytes);
    cogpu__ledger_tx_set(h, &m->claim[gi], m->claim[gi] + bytes);
  }
  cogpu__core_gpu_t was = cogpu__ledger_core_gpu(g);
  cogpu__core_gpu_t now = cogpu__core_granted(&was, (uint64_t)slot + 1,
                                              s->held[gi], bytes, exclusive);
  if (now.excl != was.excl)
    cogpu__ledger_tx_set(h, &g->excl_slot, now.excl);
  if (now.nclients != was.nclients)
    cogpu__ledger_tx_set(h, &g->nclients, now.nclients);
  if (bytes) {
    cogpu__ledger_tx_set(h, &s->held[gi], s->held[gi] + bytes);
    cogpu__ledger_tx_set(h, &g->reserved, now.reserved);
    /* The job's declaration, for its history record: a figure, kept out
     * of the undo log (a rolled-back grant may leave it high). */
    if (s->held[gi] > s->held_max) {
      s->held_max = s->held[gi];
      s->held_max_gpu = gi;
    }
  }
  return true;
}

static void core_entry(void *ctx, uint32_t id, cogpu__core_entry_t *out) {
  const ledger_waiter_t *wt = &((struct cogpu_s *)ctx)->st->waiters[id];
  *out = (cogpu__core_entry_t){.gpu = wt->gpu,
                               .priority = wt->priority,
                               .ticket = wt->ticket,
                               .since_ns = wt->since_ns};
}

/* Only the order is needed of the ops here; the pass's are below. */
static const cogpu__core_ops_t order_ops = {.entry = core_entry};

size_t cogpu__ledger_queue_order(struct cogpu_s *h, uint32_t *idx) {
  size_t n = 0;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++)
    if (h->st->waiters[w].state == W_WAITING)
      idx[n++] = w;
  cogpu__core_rules_t r = cogpu__ledger_core_rules(h);
  cogpu__core_order(&r, idx, n, &order_ops, h);
  return n;
}

/* A waiter whose slot is not the one it was queued for (freed, or claimed
 * again since) can never be served: it leaves the queue. */
static bool waiter_stale(struct cogpu_s *h, const ledger_waiter_t *wt) {
  if (wt->slot >= LEDGER_MAX_SLOTS || wt->owner >= LEDGER_MAX_SLOTS)
    return true;
  const ledger_slot_t *s = &h->st->slots[wt->slot];
  return s->state != SLOT_ACTIVE || atomic_load(&s->gen) != wt->gen ||
         h->st->slots[wt->owner].state != SLOT_ACTIVE;
}

static void drop_stale(struct cogpu_s *h, uint32_t w) {
  ledger_waiter_t *wt = &h->st->waiters[w];
  ledger_hdr_t *hd = &h->st->hdr;
  cogpu__log(COGPU_LOG_WARN, "dropped a queue entry of a slot that is gone");
  cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting - 1);
  if (!wt->resume)
    cogpu__ledger_count_admit(h, COGPU_ADMIT_CANCELLED);
  cogpu__ledger_tx_set(h, &wt->state, W_FREE);
  cogpu__ledger_tx_commit(h);
  cogpu__ledger_wake_later(h, w);
}

static void serve_one(struct cogpu_s *h, uint32_t w, uint32_t g) {
  ledger_waiter_t *wt = &h->st->waiters[w];
  ledger_hdr_t *hd = &h->st->hdr;
  if (!cogpu__ledger_grant(h, g, (uint32_t)wt->slot, (uint32_t)wt->owner,
                           wt->bytes, wt->exclusive)) {
    drop_stale(h, w);
    return;
  }
  cogpu__ledger_tx_set(h, (uint64_t *)&wt->granted_gpu, g);
  cogpu__ledger_tx_set(h, &wt->state, W_GRANTED);
  cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting - 1);
  uint64_t now = cogpu__now_ns();
  cogpu__ledger_count_wait(h, now > wt->since_ns ? now - wt->since_ns : 0);
  cogpu__ledger_tx_commit(h);
  atomic_store_explicit(&wt->futex, 1, memory_order_release);
  /* Woken after the unlock: woken now, it would find the lock held and
   * sleep a second time. */
  cogpu__ledger_wake_later(h, w);
}

/* A suspended job's resume entry: book its footprint, then grant its own
 * waiting requests on that GPU, which the fit counted. Not those of a job
 * moving to another GPU: should the driver refuse the move, its footprint
 * goes back off that GPU (cogpu__ledger_resume_done), which a grant given
 * meanwhile would have made more than the footprint; they are served as
 * any request once it runs there. */
static void serve_resume(struct cogpu_s *h, uint32_t w, uint32_t g) {
  ledger_waiter_t *wt = &h->st->waiters[w];
  uint32_t s = (uint32_t)wt->slot;
  cogpu__ledger_resume_serve(h, w, g);
  if (h->st->slots[s].susp != SUSP_RESUMING || h->st->slots[s].susp_from)
    return;
  for (uint32_t v = 0; v < LEDGER_MAX_WAITERS; v++) {
    ledger_waiter_t *o = &h->st->waiters[v];
    if (o->state == W_WAITING && !o->resume && o->slot == s && !o->exclusive &&
        (o->gpu == COGPU_GPU_AUTO || o->gpu == (int64_t)g) &&
        cogpu__ledger_fits(h, g, s, o->bytes, false))
      serve_one(h, v, g);
  }
}

/* Could the waiter ever fit on g, were everybody else gone? */
/* Whether the waiter holds back those behind it on g (fifo). A job held
 * back by admission (cogpu__ledger_admit_held) does not: behind it is the
 * growth of the jobs running there, which is what it waits for. */
static bool could_fit(struct cogpu_s *h, const ledger_waiter_t *wt,
                      uint32_t g) {
  if (!wt->exclusive && wt->bytes > cogpu__ledger_capacity(&h->st->hdr.gpus[g]))
    return false;
  return !cogpu__ledger_admit_held(h, wt, g);
}

uint64_t cogpu__ledger_guard_delay_ms(struct cogpu_s *h) {
  uint64_t tick = h->st->hdr.sweep_interval_ms;
  /* The daemon sees every release as it happens and runs its timer at this
   * delay while requests wait: a deadlock is broken within a fraction of a
   * second, not a tick of up to an hour later. */
  if (cogpu__ledger_trusted(h) && tick > LEDGER_GUARD_DELAY_MS)
    return LEDGER_GUARD_DELAY_MS;
  return tick;
}

/* A waiter that counts for the deadlock guard: really waiting (not just
 * asking), for g, for longer than the guard's delay (a housekeeping tick),
 * so that a job whose other thread is about to release is not failed (or
 * suspended) in passing. One that waits for memory held outside cogpu
 * (COGPU__REQ_DEVICE_WAIT, while g has foreign memory) waits for the
 * outside, not for a cogpu job: its job is moving, as one that runs. */
static bool guard_waiting(struct cogpu_s *h, const ledger_waiter_t *wt,
                          uint32_t g, uint64_t now) {
  return wt->state == W_WAITING && !wt->nowait && !wt->resume &&
         !((wt->flags & COGPU__REQ_DEVICE_WAIT) &&
           h->st->hdr.gpus[g].foreign) &&
         !cogpu__ledger_held_back(h, wt) &&
         (wt->gpu == COGPU_GPU_AUTO || wt->gpu == (int64_t)g) &&
         cogpu__core_guard_due(
             wt->since_ns, now,
             cogpu__ms_to_ns(cogpu__ledger_guard_delay_ms(h)));
}

/* The job slot a member slot belongs to, or -1 (not a member, or its job
 * is gone, or it is a process whose job ended: then it is its own). */
static int64_t member_of(struct cogpu_s *h, uint32_t m) {
  const ledger_slot_t *ms = &h->st->slots[m];
  if (ms->state != SLOT_ACTIVE || !ms->job || ms->job > LEDGER_MAX_SLOTS ||
      ms->job == (uint64_t)m + 1)
    return -1;
  const ledger_slot_t *job = &h->st->slots[ms->job - 1];
  if (job->state != SLOT_ACTIVE || atomic_load(&job->gen) != ms->job_gen)
    return -1;
  return (int64_t)ms->job - 1;
}

/* Every job holding memory on g looks stuck from the ledger, which sees
 * processes, not threads: a process that waits may have another thread
 * with its grant in hand and no CPU yet, about to release, on a loaded
 * host (the daemon's 200 ms is a short time there). /proc sees threads:
 * while a waiting process of a holding job has a runnable thread, other
 * than the caller's, or a request the daemon has not answered (threads
 * asleep behind it: the host's guard hooks), the job is moving. Looked at
 * only now (a deadlock is rare, the scan above is free of system calls), once
 * per process, and for LEDGER_GUARD_RUNNABLE_MS at most into a wait, so that a
 * thread that spins for ever cannot keep a real deadlock standing. */
static bool runnable_holder(struct cogpu_s *h, uint32_t g, uint64_t now,
                            const uint8_t *owner_w) {
  uint8_t seen[LEDGER_MAX_SLOTS / 8] = {0};
  uint64_t bound = cogpu__ms_to_ns(cogpu__ledger_guard_delay_ms(h) +
                                   LEDGER_GUARD_RUNNABLE_MS);
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    const ledger_waiter_t *wt = &h->st->waiters[w];
    uint32_t o = wt->owner;
    if (o >= LEDGER_MAX_SLOTS || !LEDGER_BIT_GET(owner_w, o) ||
        LEDGER_BIT_GET(seen, o) || !guard_waiting(h, wt, g, now) ||
        cogpu__core_guard_due(wt->since_ns, now, bound))
      continue;
    LEDGER_BIT_SET(seen, o);
    /* A thread that waits for the ledger's lock (which this pass holds)
     * is about to act: it may be the release (seen: a holder's other
     * thread, done spinning, blocked on this lock and so asleep, and the
     * guard refused its sibling's wait). */
    if (cogpu__ledger_lock_contended(h))
      return true;
    int64_t job = member_of(h, o);
    const ledger_slot_t *js = &h->st->slots[job >= 0 ? (uint32_t)job : o];
    const ledger_guard_hooks_t *gh = cogpu__ledger_guard_hooks(h);
    if (js->held[g] > 0 && ((gh && gh->answer_due(gh->ctx, o)) ||
                            cogpu__proc_runnable(h->st->slots[o].pid)))
      return true;
  }
  return false;
}

/* The waiter to fail on GPU g if every job holding memory there waits for
 * more there: nobody would ever release, so nobody could proceed. A job
 * waits only when all of its processes do: each live member process, and
 * its own process if that holds memory of its own (what no member
 * claimed); one member waiting while another runs may yet see the other
 * release. The victim is the waiting holder of lowest priority, then the
 * newest. A pass over the waiters marks the processes that wait and the
 * slots waited for, a pass over the members marks the jobs with a running
 * member, and a pass over the slots looks for a holder that does not wait:
 * O(slots + waiters), not their product, and no system call. */
static int64_t deadlock_victim(struct cogpu_s *h, uint32_t g) {
  int64_t victim = -1;
  uint64_t now = cogpu__now_ns();
  _Static_assert(LEDGER_MAX_SLOTS % 8 == 0, "bitmaps");
  uint8_t waits[LEDGER_MAX_SLOTS / 8] = {0};   /* slots waited for */
  uint8_t owner_w[LEDGER_MAX_SLOTS / 8] = {0}; /* processes that wait */
  uint8_t running[LEDGER_MAX_SLOTS / 8] = {0}; /* jobs with a running member */
  bool any = false;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    const ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->slot < LEDGER_MAX_SLOTS && wt->owner < LEDGER_MAX_SLOTS &&
        guard_waiting(h, wt, g, now)) {
      LEDGER_BIT_SET(waits, wt->slot);
      LEDGER_BIT_SET(owner_w, wt->owner);
      any = true;
    }
  }
  if (!any)
    return -1;
  LEDGER_FOR_SLOTS(h->st, m) {
    int64_t job = member_of(h, m);
    if (job >= 0 && !LEDGER_BIT_GET(owner_w, m))
      LEDGER_BIT_SET(running, (uint32_t)job);
  }
  LEDGER_FOR_SLOTS(h->st, s) {
    const ledger_slot_t *sl = &h->st->slots[s];
    bool holds = sl->state == SLOT_ACTIVE &&
                 (sl->held[g] > 0 || h->st->hdr.gpus[g].excl_slot == s + 1);
    if (!holds)
      continue;
    bool own =
        sl->held[g] > sl->lent[g] || h->st->hdr.gpus[g].excl_slot == s + 1;
    /* A job that gave memory back within the last tick is moving: one of
     * its threads waits while others release. */
    bool moving = !cogpu__core_guard_due(
        sl->released_ns, now, cogpu__ms_to_ns(cogpu__ledger_guard_delay_ms(h)));
    bool stuck = LEDGER_BIT_GET(waits, s) && !LEDGER_BIT_GET(running, s) &&
                 !moving && (!own || LEDGER_BIT_GET(owner_w, s));
    if (!stuck)
      return -1; /* someone can still make progress and release */
  }
  if (runnable_holder(h, g, now, owner_w))
    return -1;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    const ledger_waiter_t *wt = &h->st->waiters[w];
    if (!guard_waiting(h, wt, g, now) || wt->slot >= LEDGER_MAX_SLOTS ||
        h->st->slots[wt->slot].held[g] == 0)
      continue;
    cogpu__core_entry_t e, v;
    core_entry(h, w, &e);
    if (victim >= 0)
      core_entry(h, (uint32_t)victim, &v);
    if (victim < 0 || cogpu__core_victim_before(&e, &v))
      victim = w;
  }
  return victim;
}

static void deadlock_guard(struct cogpu_s *h) {
  ledger_hdr_t *hd = &h->st->hdr;
  for (uint32_t g = 0; g < hd->ngpus && hd->nwaiting; g++) {
    if (hd->gpus[g].nclients == 0)
      continue;
    int64_t v = deadlock_victim(h, g);
    if (v < 0 || cogpu__ledger_susp_busy(h, g))
      continue; /* none, or a suspension under way will free memory */
    /* Suspending a job breaks the deadlock without failing anyone. */
    char why[192];
    if (cogpu__ledger_suspend_for_deadlock(h, g, why, sizeof why)) {
      cogpu__ledger_count(h, &hd->counters.deadlock_suspensions);
      cogpu__ledger_tx_commit(h);
      continue;
    }
    ledger_waiter_t *wt = &h->st->waiters[v];
    /* Whichever process serves the queue breaks the deadlock; only the
     * daemon's log, or the victim's own stderr, may name the victim: in
     * another process's it lands in an unrelated job's output. The victim
     * learns why from its refusal (COGPU_EDEADLOCK). */
    cogpu__log(
        cogpu__ledger_trusted(h) || wt->owner == h->slot ? COGPU_LOG_WARN
                                                         : COGPU_LOG_DEBUG,
        "GPU %u: every job holding memory waits for more, and none "
        "can be suspended (%s); failing the request of pid %d "
        "(%llu bytes) to break the deadlock",
        g, why, h->st->slots[wt->slot].pid, (unsigned long long)wt->bytes);
    h->st->slots[wt->slot].guard_fails++; /* a figure, for its record */
    cogpu__ledger_tx_set(h, &wt->state, W_REFUSED);
    cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting - 1);
    cogpu__ledger_count_admit(h, COGPU_ADMIT_DEADLOCK);
    cogpu__ledger_tx_commit(h);
    atomic_store_explicit(&wt->futex, 1, memory_order_release);
    cogpu__ledger_wake_later(h, (uint32_t)v);
  }
}

/* The service pass's view of the ledger (core.h). */
static int core_kind(void *ctx, uint32_t id) {
  struct cogpu_s *h = ctx;
  const ledger_waiter_t *wt = &h->st->waiters[id];
  if (wt->state != W_WAITING)
    return COGPU_CORE_SKIP; /* served with its job's resume, earlier */
  if (waiter_stale(h, wt))
    return COGPU_CORE_DROP;
  if (cogpu__ledger_held_back(h, wt))
    return COGPU_CORE_SKIP; /* served with its job's resume */
  return wt->resume ? COGPU_CORE_RESUME : COGPU_CORE_REQUEST;
}

static uint64_t core_free(void *ctx, uint32_t g) {
  return gpu_free(&((struct cogpu_s *)ctx)->st->hdr.gpus[g]);
}

static bool core_fits(void *ctx, uint32_t id, uint32_t g) {
  struct cogpu_s *h = ctx;
  const ledger_waiter_t *wt = &h->st->waiters[id];
  if (wt->resume)
    return cogpu__ledger_resume_fits(h, wt);
  return cogpu__ledger_fits(h, g, (uint32_t)wt->slot, wt->bytes,
                            wt->exclusive) &&
         !cogpu__ledger_admit_held(h, wt, g);
}

static bool core_could_fit(void *ctx, uint32_t id, uint32_t g) {
  struct cogpu_s *h = ctx;
  return could_fit(h, &h->st->waiters[id], g);
}

static bool core_moves(void *ctx, uint32_t id, uint32_t g) {
  struct cogpu_s *h = ctx;
  return cogpu__ledger_resume_moves(h, &h->st->waiters[id], g);
}

static void core_serve(void *ctx, uint32_t id, uint32_t g) {
  struct cogpu_s *h = ctx;
  if (h->st->waiters[id].resume)
    serve_resume(h, id, g);
  else
    serve_one(h, id, g);
}

static void core_drop(void *ctx, uint32_t id) {
  drop_stale(ctx, id);
}

static const cogpu__core_ops_t serve_ops = {.entry = core_entry,
                                            .kind = core_kind,
                                            .free = core_free,
                                            .fits = core_fits,
                                            .could_fit = core_could_fit,
                                            .moves = core_moves,
                                            .serve = core_serve,
                                            .drop = core_drop};

/* A process of a job waits for more of the node (COGPU__REQ_JOB_SPARE)
 * while its job now holds memory none of its processes claimed: another
 * process left or gave some back since it asked. The job's own memory
 * comes first: its wait ends (W_JOB_SPARE), it claims, and asks again
 * only for the rest. Without this it waited for the node, which may never
 * have room, while its own job had it: a job waiting on itself. */
static void serve_job_spare(struct cogpu_s *h) {
  ledger_hdr_t *hd = &h->st->hdr;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS && hd->nwaiting; w++) {
    ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state != W_WAITING || !(wt->flags & COGPU__REQ_JOB_SPARE) ||
        wt->resume || wt->exclusive || wt->slot == wt->owner ||
        wt->slot >= LEDGER_MAX_SLOTS || wt->gpu < 0 ||
        (uint64_t)wt->gpu >= hd->ngpus)
      continue;
    const ledger_slot_t *job = &h->st->slots[wt->slot];
    if (job->state != SLOT_ACTIVE || atomic_load(&job->gen) != wt->gen ||
        job->held[wt->gpu] <= job->lent[wt->gpu])
      continue;
    cogpu__ledger_tx_set(h, &wt->state, W_JOB_SPARE);
    cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting - 1);
    cogpu__ledger_tx_commit(h);
    atomic_store_explicit(&wt->futex, 1, memory_order_release);
    cogpu__ledger_wake_later(h, w);
  }
}

void cogpu__ledger_serve(struct cogpu_s *h) {
  ledger_hdr_t *hd = &h->st->hdr;
  if (hd->nwaiting == 0)
    return;
  serve_job_spare(h);
  if (hd->nwaiting == 0)
    return;
  uint32_t order[LEDGER_MAX_WAITERS];
  size_t n = cogpu__ledger_queue_order(h, order);
  cogpu__core_rules_t r = cogpu__ledger_core_rules(h);
  cogpu__core_serve(&r, cogpu__now_ns(), hd->ngpus, order, n, &serve_ops, h);
  deadlock_guard(h);
  cogpu__ledger_preempt(h);
}
