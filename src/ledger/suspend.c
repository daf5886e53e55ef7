/*
 * suspend.c: the ledger's side of suspending a job (node mode).
 *
 * The node daemon suspends a job through the driver's process checkpoint
 * API: its processes are locked, their device memory is copied to host
 * memory and released, and later restored at the same addresses. The
 * ledger decides *whom* (a deadlock that would otherwise fail a request; a
 * waiter of higher priority; a job idle too long) and keeps the books; the
 * daemon performs the driver calls in a thread of its own, never under the
 * lock, and reports back (cogpu__ledger_suspend_done, _resume_done).
 *
 * The unit is a job: its slot (the reservation) and every process of the
 * job that uses CUDA (COGPU_MARK_CUDA). Its footprint is what the job
 * holds on its one GPU: a job holding memory on several GPUs, exclusive
 * use, or a process that used what the checkpoint API cannot move
 * (managed memory, IPC or shareable VMM handles) is never picked.
 *
 * Reserve before restore: a restore that runs out of device memory leaves
 * the process wedged on current drivers. So the resume is a queue entry
 * like any other request, for the whole footprint plus what the job's own
 * waiting requests ask on that GPU; only when the policy serves it is the
 * footprint booked again (SUSPENDED -> RESUMING) and the daemon told to
 * restore. The job's own requests are held back while it is suspended and
 * granted together with its resume.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ledger-int.h"

/* Operations for the daemon, collected in its host under the lock (one
 * thread: the daemon's), taken after it. A job has at most one in flight
 * (its state says which), so the list never holds more than one per slot. */
size_t cogpu__ledger_take_susp_ops(struct cogpu_s *h, ledger_susp_op_t *out,
                                   size_t max) {
  ledger_host_t *ho = h->host;
  if (!ho)
    return 0;
  size_t n = ho->nops < max ? ho->nops : max;
  memcpy(out, ho->ops, n * sizeof *out);
  memmove(ho->ops, ho->ops + n, (ho->nops - n) * sizeof *ho->ops);
  ho->nops -= n;
  return n;
}

static void push_op(struct cogpu_s *h, uint32_t s, int op) {
  ledger_host_t *ho = h->host;
  if (!ho)
    return; /* no daemon to do it: nothing decides one without a host */
  if (ho->nops == LEDGER_SUSP_OPS_MAX) {
    /* Never expected (one per job in flight); the daemon's recovery scan
     * finds a job stuck in a transitional state on its next tick. */
    cogpu__log(COGPU_LOG_ERROR, "too many suspensions in flight");
    return;
  }
  ho->ops[ho->nops++] = (ledger_susp_op_t){
      .slot = s, .gen = atomic_load(&h->st->slots[s].gen), .op = op};
}

/* Does slot m belong to the job of slot s (its own process, or a member
 * that joined it in this generation)? */
static bool of_job(const ledger_state_t *st, uint32_t s, uint32_t m) {
  const ledger_slot_t *ms = &st->slots[m];
  if (ms->state != SLOT_ACTIVE)
    return false;
  if (m == s)
    return true;
  return ms->job == (uint64_t)s + 1 &&
         ms->job_gen == atomic_load(&st->slots[s].gen);
}

size_t cogpu__ledger_job_pids(struct cogpu_s *h, uint32_t s, int32_t *pids,
                              uint64_t *starts, size_t max) {
  size_t n = 0;
  LEDGER_FOR_SLOTS_WHILE(h->st, m, n < max)
  if (of_job(h->st, s, m) && (h->st->slots[m].flags & COGPU_MARK_CUDA)) {
    if (starts)
      starts[n] = h->st->slots[m].starttime;
    pids[n++] = h->st->slots[m].pid;
  }
  return n;
}

size_t cogpu__ledger_job_members(struct cogpu_s *h, uint32_t s, uint32_t *slots,
                                 size_t max) {
  size_t n = 0;
  LEDGER_FOR_SLOTS_WHILE(h->st, m, n < max)
  if (of_job(h->st, s, m) && (h->st->slots[m].flags & COGPU_MARK_CUDA))
    slots[n++] = m;
  return n;
}

static const char *mark_name(uint64_t bits) {
  if (bits & COGPU_MARK_MANAGED)
    return "managed memory";
  if (bits & COGPU_MARK_IPC)
    return "CUDA IPC handles";
  if (bits & COGPU_MARK_VMM_EXPORT)
    return "shareable VMM handles";
  if (bits & COGPU_MARK_BROKEN)
    return "an earlier suspension or resume that failed";
  return "an unsupported feature";
}

int cogpu__ledger_suspendable(struct cogpu_s *h, uint32_t s, int *gpu,
                              char *why, size_t len) {
  ledger_state_t *st = h->st;
  ledger_hdr_t *hd = &st->hdr;
  const ledger_slot_t *sl = &st->slots[s];
  why[0] = 0;
  if (s >= LEDGER_MAX_SLOTS || sl->state != SLOT_ACTIVE)
    return snprintf(why, len, "no such job"), -ESRCH;
  if (sl->job && sl->job != (uint64_t)s + 1 &&
      of_job(st, (uint32_t)sl->job - 1, s))
    return snprintf(why, len, "pid %d is a process of another job", sl->pid),
           -EINVAL;
  if (sl->susp != SUSP_NONE)
    return snprintf(why, len, "already %s",
                    sl->susp == SUSP_SUSPENDED    ? "suspended"
                    : sl->susp == SUSP_SUSPENDING ? "being suspended"
                                                  : "being resumed"),
           -EALREADY;
  int on = -1;
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    if (hd->gpus[g].excl_slot == s + 1)
      return snprintf(why, len, "it uses GPU %u exclusively", g), -EPERM;
    if (sl->held[g] == 0)
      continue;
    if (on >= 0)
      return snprintf(why, len, "it holds memory on more than one GPU"), -EPERM;
    on = (int)g;
  }
  if (on < 0)
    return snprintf(why, len, "it holds no GPU memory"), -EPERM;
  size_t ncuda = 0;
  LEDGER_FOR_SLOTS(st, m) {
    if (!of_job(st, s, m))
      continue;
    const ledger_slot_t *ms = &st->slots[m];
    if (ms->leaving != LEDGER_LEAVING_NO)
      return snprintf(why, len,
                      "its process %d is exiting (its connection closed)",
                      ms->pid),
             -EPERM;
    uint64_t bad = ms->flags & (COGPU_MARK_UNSUSPENDABLE | COGPU_MARK_BROKEN);
    if (bad)
      return snprintf(why, len, "its process %d used %s", ms->pid,
                      mark_name(bad)),
             -EPERM;
    ncuda += (ms->flags & COGPU_MARK_CUDA) != 0;
  }
  if (ncuda == 0)
    return snprintf(why, len,
                    "none of its processes runs under the preload library"),
           -EPERM;
  *gpu = on;
  return 0;
}

int cogpu__ledger_suspend_begin(struct cogpu_s *h, uint32_t s, bool manual,
                                char *why, size_t len) {
  int g;
  int rc = cogpu__ledger_suspendable(h, s, &g, why, len);
  if (rc)
    return rc;
  ledger_slot_t *sl = &h->st->slots[s];
  const ledger_suspender_t *sp = cogpu__ledger_suspender(h);
  if (!sp)
    return snprintf(why, len, "suspension needs the node daemon (cogpud)"),
           -ENOTSUP;
  rc = sp->can(sp->ctx, sl->held[g], why, len);
  if (rc)
    return rc;
  cogpu__ledger_tx_set(h, &sl->susp_gpu, (uint64_t)g);
  cogpu__ledger_tx_set(h, &sl->susp_manual, manual);
  cogpu__ledger_tx_set(h, &sl->susp, SUSP_SUSPENDING);
  cogpu__ledger_tx_commit(h);
  push_op(h, s, LEDGER_OP_SUSPEND);
  return 0;
}

/* The job's resume entry: the job's priority, and a place at the back of
 * the queue as it is now. Not its oldest request's place: the requests
 * already waiting are those it was suspended for, and a resume ahead of
 * them would hold back, under fifo, the very memory it just gave up. */
static void enqueue_resume(struct cogpu_s *h, uint32_t s, bool by_hand) {
  ledger_hdr_t *hd = &h->st->hdr;
  ledger_slot_t *sl = &h->st->slots[s];
  uint64_t ticket = hd->next_ticket;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state != W_FREE)
      continue;
    atomic_store(&wt->futex, 0);
    wt->slot = s;
    wt->gen = atomic_load(&sl->gen);
    wt->owner = s;
    wt->gpu = (int64_t)sl->susp_gpu;
    wt->bytes = sl->parked;
    wt->priority = sl->priority;
    wt->since_ns = cogpu__now_ns();
    wt->exclusive = 0;
    wt->nowait = 0;
    wt->granted_gpu = -1;
    wt->resume = by_hand ? LEDGER_RESUME_BY_HAND : LEDGER_RESUME_AUTO;
    cogpu__ledger_tx_set(h, &wt->ticket, ticket);
    cogpu__ledger_tx_set(h, &hd->next_ticket, hd->next_ticket + 1);
    cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting + 1);
    cogpu__ledger_tx_set(h, &wt->state, W_WAITING);
    cogpu__ledger_tx_commit(h);
    return;
  }
  /* The queue is full: the daemon's tick tries again (a suspended job
   * without a resume entry is found by cogpu__ledger_susp_check). */
  cogpu__log(COGPU_LOG_ERROR,
             "queue full: job of pid %d cannot queue its "
             "resume yet",
             sl->pid);
}

static bool has_resume_entry(struct cogpu_s *h, uint32_t s) {
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    const ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state == W_WAITING && wt->resume && wt->slot == s &&
        wt->gen == atomic_load(&h->st->slots[s].gen))
      return true;
  }
  return false;
}

/* What the job of slot s holds on its GPU (susp_gpu) leaves the GPU's
 * books for its parked footprint: the driver has it in host memory. In
 * the caller's transaction. */
static void park_footprint(struct cogpu_s *h, uint32_t s) {
  ledger_slot_t *sl = &h->st->slots[s];
  ledger_gpu_t *gp = &h->st->hdr.gpus[sl->susp_gpu];
  uint64_t held = sl->held[sl->susp_gpu];
  cogpu__ledger_tx_set(h, &sl->parked, held);
  cogpu__ledger_tx_set(h, &sl->held[sl->susp_gpu], 0);
  cogpu__ledger_tx_set(h, &gp->reserved, gp->reserved - held);
  if (held && gp->excl_slot != s + 1)
    cogpu__ledger_tx_set(h, &gp->nclients, gp->nclients - 1);
}

void cogpu__ledger_suspend_done(struct cogpu_s *h, uint32_t s, uint32_t gen,
                                int rc, bool broken, uint64_t took_ns) {
  ledger_hdr_t *hd = &h->st->hdr;
  ledger_slot_t *sl = &h->st->slots[s];
  if (sl->state != SLOT_ACTIVE || atomic_load(&sl->gen) != gen ||
      sl->susp != SUSP_SUSPENDING)
    return; /* the job ended meanwhile: its slot went with its memory */
  if (rc) {
    /* Its memory never left the GPU: it stays booked as it was. Not picked
     * again for a while (its kernel may still be running). */
    cogpu__ledger_tx_set(h, &sl->susp, SUSP_NONE);
    cogpu__ledger_tx_set(h, &sl->susp_retry_ns,
                         cogpu__now_ns() + cogpu__ms_to_ns(30000));
    if (broken)
      cogpu__ledger_tx_set(h, &sl->flags, sl->flags | COGPU_MARK_BROKEN);
    cogpu__ledger_count(h, &hd->counters.suspend_failures);
    cogpu__ledger_tx_commit(h);
    cogpu__ledger_serve(h);
    return;
  }
  ledger_gpu_t *gp = &hd->gpus[sl->susp_gpu];
  park_footprint(h, s);
  cogpu__ledger_tx_set(h, &sl->susp_since_ns, cogpu__now_ns());
  if (took_ns)
    cogpu__ledger_tx_set(h, &gp->park_ns, took_ns);
  cogpu__ledger_tx_set(h, &sl->susp_count, sl->susp_count + 1);
  cogpu__ledger_tx_set(h, &sl->susp, SUSP_SUSPENDED);
  cogpu__ledger_count(h, &hd->counters.suspensions);
  cogpu__ledger_tx_commit(h);
  cogpu__ledger_note_left(h); /* the driver has just freed that memory */
  if (!sl->susp_manual)
    enqueue_resume(h, s, false);
  cogpu__ledger_serve(h);
}

int cogpu__ledger_resume_ask(struct cogpu_s *h, uint32_t s, char *why,
                             size_t len) {
  ledger_slot_t *sl = &h->st->slots[s];
  why[0] = 0;
  if (s >= LEDGER_MAX_SLOTS || sl->state != SLOT_ACTIVE)
    return snprintf(why, len, "no such job"), -ESRCH;
  if (sl->susp == SUSP_NONE)
    return snprintf(why, len, "it is not suspended"), -EALREADY;
  if (sl->susp == SUSP_SUSPENDING && sl->susp_manual) {
    /* Resumed as soon as its suspension is done. */
    cogpu__ledger_tx_set(h, &sl->susp_manual, 0);
    cogpu__ledger_tx_commit(h);
  }
  if (sl->susp != SUSP_SUSPENDED)
    return 0; /* on its way: its answer comes when that is done */
  if (sl->susp_manual) {
    cogpu__ledger_tx_set(h, &sl->susp_manual, 0);
    cogpu__ledger_tx_commit(h);
  }
  if (!has_resume_entry(h, s))
    enqueue_resume(h, s, true);
  cogpu__ledger_serve(h);
  return 0;
}

/* The job of slot s and its requests waiting on GPU `from` go to `to`;
 * each process the restore moves sees its GPUs where they now are. */
static void move_job(struct cogpu_s *h, uint32_t s, uint32_t from,
                     uint32_t to) {
  ledger_state_t *st = h->st;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    ledger_waiter_t *o = &st->waiters[w];
    if (o->state == W_WAITING && o->slot == s &&
        o->gen == atomic_load(&st->slots[s].gen) && o->gpu == (int64_t)from)
      cogpu__ledger_tx_set(h, (uint64_t *)&o->gpu, to);
  }
  /* The shares its processes took of its memory go with it (a member's
   * claim, the job's lent): left on `from`, the job's booking on `to`
   * would look unclaimed, and a member's next allocation would be taken
   * from it as spare instead of booked. */
  LEDGER_FOR_SLOTS(st, m) {
    ledger_slot_t *ms = &st->slots[m];
    if (!of_job(st, s, m))
      continue;
    uint64_t c = ms->claim[from], l = ms->lent[from];
    cogpu__ledger_tx_set(h, &ms->claim[from], ms->claim[to]);
    cogpu__ledger_tx_set(h, &ms->claim[to], c);
    cogpu__ledger_tx_set(h, &ms->lent[from], ms->lent[to]);
    cogpu__ledger_tx_set(h, &ms->lent[to], l);
    if (ms->flags & COGPU_MARK_CUDA)
      cogpu__ledger_tx_set(h, &ms->gpu_map,
                           cogpu__ledger_map_swap(ms->gpu_map, from, to));
  }
  cogpu__ledger_tx_set(h, &st->slots[s].susp_gpu, to);
}

/* The driver refused to restore the job onto the GPU it was to move to,
 * before any of its processes moved (they are all still checkpointed): it
 * goes back to where it was parked, its footprint off the other GPU, and
 * queues its resume there; it is never moved again. */
static void move_refused(struct cogpu_s *h, uint32_t s) {
  ledger_slot_t *sl = &h->st->slots[s];
  uint32_t to = (uint32_t)sl->susp_gpu, from = (uint32_t)sl->susp_from - 1;
  park_footprint(h, s);
  move_job(h, s, to, from);
  cogpu__ledger_tx_set(h, &sl->susp_from, 0);
  cogpu__ledger_tx_set(h, &sl->flags, sl->flags | COGPU_MARK_NOMOVE);
  cogpu__ledger_tx_set(h, &sl->susp, SUSP_SUSPENDED);
  cogpu__ledger_tx_commit(h);
  cogpu__ledger_note_left(h);
  enqueue_resume(h, s, sl->susp_from_kind == LEDGER_RESUME_BY_HAND);
  cogpu__ledger_serve(h);
}

void cogpu__ledger_resume_done(struct cogpu_s *h, uint32_t s, uint32_t gen,
                               int rc) {
  ledger_slot_t *sl = &h->st->slots[s];
  if (sl->state != SLOT_ACTIVE || atomic_load(&sl->gen) != gen ||
      sl->susp != SUSP_RESUMING)
    return;
  if (rc == -EXDEV && sl->susp_from > 0 && sl->susp_from <= h->st->hdr.ngpus &&
      sl->susp_gpu < h->st->hdr.ngpus) {
    move_refused(h, s);
    return;
  }
  cogpu__ledger_tx_set(h, &sl->susp_from, 0);
  cogpu__ledger_tx_set(h, &sl->susp, SUSP_NONE);
  if (rc) /* its memory stays booked: whatever the driver did with it */
    cogpu__ledger_tx_set(h, &sl->flags, sl->flags | COGPU_MARK_BROKEN);
  ledger_counters_t *cn = &h->st->hdr.counters;
  cogpu__ledger_count(h, rc ? &cn->resume_failures : &cn->resumes);
  cogpu__ledger_tx_commit(h);
  cogpu__ledger_serve(h);
}

/* --- The policy's side ------------------------------------------------------
 */

bool cogpu__ledger_held_back(struct cogpu_s *h, const ledger_waiter_t *wt) {
  return !wt->resume && wt->slot < LEDGER_MAX_SLOTS &&
         h->st->slots[wt->slot].susp != SUSP_NONE;
}

/* The job's requests on g that wait for its resume. */
static uint64_t pending_on(struct cogpu_s *h, uint32_t s, uint32_t g) {
  uint64_t sum = 0;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    const ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state == W_WAITING && !wt->resume && wt->slot == s &&
        !wt->exclusive && (wt->gpu == COGPU_GPU_AUTO || wt->gpu == (int64_t)g))
      sum += wt->bytes;
  }
  return sum;
}

/* Is slot t a job's own slot (not a process that joined another job)? */
static bool is_job(const ledger_state_t *st, uint32_t t) {
  const ledger_slot_t *sl = &st->slots[t];
  return sl->state == SLOT_ACTIVE && (!sl->job || sl->job == (uint64_t)t + 1);
}

/* Is slot t a job running on g: holding memory there, neither parked nor
 * being parked? */
static bool running_on(const ledger_state_t *st, uint32_t t, uint32_t g) {
  const ledger_slot_t *o = &st->slots[t];
  return o->state == SLOT_ACTIVE && o->held[g] != 0 && is_job(st, t) &&
         o->susp != SUSP_SUSPENDING && o->susp != SUSP_SUSPENDED &&
         o->leaving == LEDGER_LEAVING_NO; /* it gives back, never grows */
}

/* Does job a go before job b ? Higher priority, then older. */
static bool goes_before(const ledger_state_t *st, uint32_t a, uint32_t b) {
  const ledger_slot_t *x = &st->slots[a], *y = &st->slots[b];
  if (x->priority != y->priority)
    return x->priority > y->priority;
  if (x->attached_ns != y->attached_ns)
    return x->attached_ns < y->attached_ns;
  return a < b;
}

/* The leader of g (issue 25): of the jobs running there, the one of
 * highest priority, then the oldest; -1 if none. It is what a deadlock is
 * broken for: never the victim while another job can be parked, its
 * growth never held back, and when memory is scarce, memory goes to it
 * first, so that it ends and gives everything back (a deadlock broken
 * for everybody at once hands each waiter one chunk and forms again). */
static int64_t leader_of(struct cogpu_s *h, uint32_t g) {
  int64_t best = -1;
  LEDGER_FOR_SLOTS(h->st, t) {
    if (running_on(h->st, t, g) &&
        (best < 0 || goes_before(h->st, t, (uint32_t)best)))
      best = t;
  }
  return best;
}

/* The job whose resume entry wt is, on g, while it is still parked; NULL
 * for any other entry. parked_at and parked_need walk the queue with it:
 * the service pass asks for each waiter, and nobody waiting costs
 * nothing. */
static const ledger_slot_t *
parked_entry(struct cogpu_s *h, const ledger_waiter_t *wt, uint32_t g) {
  if (!wt->resume || wt->gpu != (int64_t)g || wt->slot >= LEDGER_MAX_SLOTS)
    return NULL;
  const ledger_slot_t *o = &h->st->slots[wt->slot];
  return o->state == SLOT_ACTIVE && atomic_load(&o->gen) == wt->gen &&
                 o->susp == SUSP_SUSPENDED
             ? o
             : NULL;
}

/* When the ledger last parked a job of g (for a deadlock or a preemption,
 * not by hand: it has its automatic resume entry) that is still parked
 * (monotonic ns, when its copy ended), 0 if none. */
static uint64_t parked_at(struct cogpu_s *h, uint32_t g) {
  uint64_t last = 0, left = h->st->hdr.nwaiting;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS && left; w++) {
    const ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state != W_WAITING)
      continue;
    left--;
    const ledger_slot_t *o = parked_entry(h, wt, g);
    if (o && wt->resume == LEDGER_RESUME_AUTO && o->susp_since_ns > last)
      last = o->susp_since_ns;
  }
  return last;
}

static uint64_t expect_of(struct cogpu_s *h, uint32_t s, uint32_t g) {
  const ledger_suspender_t *sp = cogpu__ledger_suspender(h);
  return sp && sp->expect ? sp->expect(sp->ctx, h, s, g) : 0;
}

/* What the jobs running on g other than s are expected to grow by: for
 * each whose peak is known, that peak less what it holds now. 0 with
 * `any` false when no other job holds memory there (nothing that will end
 * and give memory back). */
static uint64_t others_growth(struct cogpu_s *h, uint32_t s, uint32_t g,
                              bool *any) {
  uint64_t sum = 0;
  *any = false;
  LEDGER_FOR_SLOTS(h->st, t) {
    const ledger_slot_t *o = &h->st->slots[t];
    if (t == s || o->state != SLOT_ACTIVE || o->held[g] == 0 ||
        !is_job(h->st, t))
      continue;
    *any = true;
    uint64_t e = expect_of(h, t, g);
    if (e > o->held[g])
      sum += e - o->held[g];
  }
  return sum;
}

uint64_t cogpu__ledger_growth_beside(struct cogpu_s *h, uint32_t s,
                                     uint32_t g) {
  bool any;
  return cogpu__ledger_suspender(h) ? others_growth(h, s, g, &any) : 0;
}

/* What the jobs parked on g (by the ledger: not by hand) before a request
 * that waits since `since` (UINT64_MAX: one that arrives now) will take
 * back when they resume: each one's learnt peak, or its footprint. A job
 * parked while the request already waited may have been parked for it
 * (idle or priority preemption): that request goes first. Read from their
 * resume entries, so that the common case (nobody waits: the fast path)
 * costs nothing; a job still being parked holds its memory, which the
 * fit counts already. */
static uint64_t parked_need(struct cogpu_s *h, uint32_t g, uint64_t since) {
  uint64_t sum = 0, left = h->st->hdr.nwaiting;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS && left; w++) {
    const ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state != W_WAITING)
      continue;
    left--;
    const ledger_slot_t *o = parked_entry(h, wt, g);
    if (!o || wt->since_ns >= since)
      continue;
    uint64_t e = expect_of(h, (uint32_t)wt->slot, g);
    sum += e > o->parked ? e : o->parked;
  }
  return sum;
}

/* Would slot s fit on g grown to `peak` (never less than `base`, what it
 * asks now; a peak learnt above what g can give now counts as all of it),
 * beside `extra` that others are expected to take? */
static bool fits_grown(struct cogpu_s *h, uint32_t g, uint32_t s, uint64_t base,
                       uint64_t peak, uint64_t extra) {
  uint64_t want = peak > base ? peak : base;
  uint64_t cap = cogpu__ledger_capacity(&h->st->hdr.gpus[g]);
  if (want > cap)
    want = cap > base ? cap : base;
  return extra <= UINT64_MAX - want &&
         cogpu__ledger_fits(h, g, s, want + extra, false);
}

bool cogpu__ledger_admit_held(struct cogpu_s *h, const ledger_waiter_t *wt,
                              uint32_t g) {
  return !wt->resume && wt->slot < LEDGER_MAX_SLOTS &&
         cogpu__ledger_admit_holds(h, (uint32_t)wt->slot, wt->bytes,
                                   wt->exclusive, g, wt->since_ns);
}

/* Host memory (issue 25): only jobs that grow take part in a deadlock
 * (each of its holders waits for more), so what the deadlocks of the node
 * could have to park is the memory of the jobs that grow, but each GPU's
 * leader (parked one after another, the leader gets all of its GPU). While
 * host memory could not take that, the growth of a job that is not its
 * GPU's leader waits. Otherwise a deadlock would find nobody it can park,
 * and fail a request: the out-of-memory that suspension is there to
 * replace. A job's first memory is never held here (most jobs never grow,
 * and one that does is held at its first growth), and a node whose host
 * can park all of its GPUs' memory holds nothing back (one comparison). */
static bool host_holds(struct cogpu_s *h, uint32_t s, uint64_t bytes,
                       uint32_t g) {
  const ledger_suspender_t *sp = cogpu__ledger_suspender(h);
  if (!sp->on_deadlock || !sp->room || h->st->slots[s].held[g] == 0)
    return false;
  uint64_t room = sp->room(sp->ctx), cap = 0;
  const ledger_hdr_t *hd = &h->st->hdr;
  for (uint32_t x = 0; x < hd->ngpus; x++)
    cap += cogpu__ledger_capacity(&hd->gpus[x]);
  if (room >= cap)
    return false;
  int64_t lead = leader_of(h, g);
  if (lead < 0 || lead == (int64_t)s)
    return false; /* the leader, or the first job on g: what ends */
  /* Per GPU, what its deadlocks may park: the memory of its other jobs
   * that grow (s among them), but never more than what its leader could
   * grow into; nothing where every job that grows has a learnt peak and
   * all of them fit at their peaks together (no deadlock can form). */
  uint64_t stake = 0;
  for (uint32_t x = 0; x < hd->ngpus; x++) {
    int64_t lx = x == g ? lead : leader_of(h, x);
    uint64_t others = x == g ? bytes : 0, peaks = 0;
    bool known = true;
    LEDGER_FOR_SLOTS(h->st, t) {
      const ledger_slot_t *o = &h->st->slots[t];
      if (!running_on(h->st, t, x))
        continue;
      bool grows = (o->flags & COGPU_MARK_GREW) || t == s;
      uint64_t te = expect_of(h, t, x);
      uint64_t at = o->held[x] + (t == s && x == g ? bytes : 0);
      known = known && (!grows || te);
      peaks += te > at ? te : at;
      if ((int64_t)t != lx && grows)
        others += o->held[x];
    }
    uint64_t c = cogpu__ledger_capacity(&hd->gpus[x]);
    if (known && peaks <= c)
      continue;
    uint64_t lh = lx < 0 ? 0 : h->st->slots[lx].held[x];
    uint64_t most = c > lh ? c - lh : 0;
    stake += others < most ? others : most;
  }
  return stake > room;
}

/* The window in which growth on g goes in order (issue 25): while the
 * ledger has a job of g parked (for a deadlock or a preemption), until
 * LEDGER_LEAD_HOLD_MS after the last parking, or twice as long as that
 * parking's copy took if longer: out of order, the next deadlock parks
 * another job, which costs a copy out and one back, so growth waits in
 * order for as long as that would cost, and no longer (the checkpoint
 * bandwidth, as measured on this GPU, weighs suspension against waiting).
 * Bounded (LEDGER_LEAD_HOLD_MAX_MS) so that a job ahead that has stopped
 * growing (a service) keeps nobody waiting for its end; counted from the
 * end of the parking's copy, which the jobs ahead wait for (seconds over
 * a slow link), not from its start. */
static uint64_t order_hold_ns(struct cogpu_s *h, uint32_t g) {
  uint64_t hold = cogpu__ms_to_ns(LEDGER_LEAD_HOLD_MS),
           most = cogpu__ms_to_ns(LEDGER_LEAD_HOLD_MAX_MS),
           copy = h->st->hdr.gpus[g].park_ns;
  if (copy > hold / 2)
    hold = copy < most / 2 ? 2 * copy : most;
  return hold;
}

static bool in_order(struct cogpu_s *h, uint32_t g) {
  uint64_t at = parked_at(h, g), moved = h->st->hdr.gpus[g].moved_park_ns;
  if (moved > at)
    at = moved; /* a job parked here has moved to another GPU */
  return at && !cogpu__core_guard_due(at, cogpu__now_ns(), order_hold_ns(h, g));
}

/* The jobs that grow now on g (order_holds): those that asked for more
 * where they held memory since `since` (coarse ns), and those with a
 * request waiting there (still asking, however long ago). */
typedef struct {
  uint64_t since;
  bool any_wait;
  uint8_t waits[LEDGER_MAX_SLOTS / 8];
} growing_t;

static void growing_init(struct cogpu_s *h, uint32_t g, uint64_t since,
                         growing_t *f) {
  f->since = since;
  f->any_wait = h->st->hdr.nwaiting != 0;
  if (!f->any_wait)
    return;
  memset(f->waits, 0, sizeof f->waits);
  uint64_t left = h->st->hdr.nwaiting;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS && left; w++) {
    const ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state != W_WAITING)
      continue;
    left--;
    if (!wt->resume && wt->slot < LEDGER_MAX_SLOTS &&
        (wt->gpu == COGPU_GPU_AUTO || wt->gpu == (int64_t)g))
      LEDGER_BIT_SET(f->waits, wt->slot);
  }
}

static bool growing(const ledger_state_t *st, uint32_t t, const growing_t *f) {
  return st->slots[t].grew_ns >= f->since ||
         (f->any_wait && LEDGER_BIT_GET(f->waits, t));
}

/* What the jobs running on g ahead of slot s (every one but s, with all)
 * are expected to grow by: each one's learnt peak less what it holds, and
 * (guess) for one of unknown peak as much again as it holds: after a
 * deadlock, a job of unknown peak is one that grows. With `only`, only
 * the jobs that grow now count. */
static uint64_t ahead_need(struct cogpu_s *h, uint32_t s, uint32_t g, bool all,
                           bool guess, const growing_t *only) {
  uint64_t sum = 0;
  LEDGER_FOR_SLOTS(h->st, t) {
    if (t == s || !running_on(h->st, t, g) ||
        (!all && !goes_before(h->st, t, s)) ||
        (only && !growing(h->st, t, only)))
      continue;
    const ledger_slot_t *o = &h->st->slots[t];
    uint64_t e = expect_of(h, t, g);
    uint64_t n =
        e ? (e > o->held[g] ? e - o->held[g] : 0) : (guess ? o->held[g] : 0);
    sum = n > UINT64_MAX - sum ? UINT64_MAX : sum + n;
  }
  return sum;
}

/* Growth on g in order: a job grows only into what the jobs ahead of it
 * (higher priority, then older) leave after their expected growth (a
 * learnt peak less what the job holds; for one of unknown peak, as much
 * again as it holds). Granted, it would take what they are about to ask
 * for, and the deadlock that follows parks somebody. In order, the
 * leader gets what it needs, ends and gives everything back, and the
 * next one leads. Two windows:
 *  - after a parking on g (in_order), behind every job ahead: without
 *    it, the memory a parked job gave up went one chunk to each waiter,
 *    and the next deadlock parked another job (eight jobs growing
 *    together parked four or five, 28 GiB moved for a 16 GiB GPU);
 *  - before any deadlock (issue 25: the first run of jobs the node has
 *    never seen), behind the jobs ahead that grow now (asked for more
 *    than they had held within LEDGER_GROWING_MS, or wait for more):
 *    eight jobs of unknown peak growing together deadlocked with 2 GiB
 *    each and parked two of them, which at 0.5 GB/s took longer than
 *    running them one at a time. Bounded like the order after a parking
 *    (order_hold_ns: 5 s, or twice the last parking's copy on g): a
 *    request that has waited that long (since: when it began to wait;
 *    UINT64_MAX, one that asks now) goes on as if nobody grew. A job that
 *    settled keeps nobody waiting, and a node where nothing grows (or
 *    nothing is short) pays one scan of the slots per request that grows,
 *    with the daemon's hooks only.
 * Waiting costs a job nothing that parking would not cost more: a job
 * held while it holds memory is still a waiter of the deadlock guard, so
 * if the jobs ahead deadlock anyway the guard parks as before. Only growth
 * is held (admit_holds): most jobs never grow, and one that does is held
 * at its first growth, while it holds little (the cheapest to park). */
static bool order_holds(struct cogpu_s *h, uint32_t s, uint64_t bytes,
                        uint32_t g, uint64_t since) {
  bool window = in_order(h, g);
  growing_t f;
  if (!window) {
    uint64_t now = cogpu__coarse_ns(),
             grow = cogpu__ms_to_ns(LEDGER_GROWING_MS);
    if (now <= grow ||
        (since != UINT64_MAX &&
         cogpu__core_guard_due(since, cogpu__now_ns(), order_hold_ns(h, g))))
      return false;
    growing_init(h, g, now - grow, &f);
  }
  uint64_t need = ahead_need(h, s, g, false, true, window ? NULL : &f);
  if (!window && !need)
    return false; /* nobody ahead grows now */
  return need > UINT64_MAX - bytes ||
         !cogpu__ledger_fits(h, g, s, bytes + need, false);
}

bool cogpu__ledger_admit_holds(struct cogpu_s *h, uint32_t s, uint64_t bytes,
                               bool exclusive, uint32_t g, uint64_t since) {
  if (!cogpu__ledger_suspender(h) || exclusive || s >= LEDGER_MAX_SLOTS ||
      g >= h->st->hdr.ngpus)
    return false;
  if (host_holds(h, s, bytes, g))
    return true;
  if (h->st->slots[s].held[g] != 0)
    return order_holds(h, s, bytes, g, since);
  uint64_t parked = parked_need(h, g, since);
  uint64_t e = expect_of(h, s, g);
  if (!parked && !e)
    return false;
  bool any;
  uint64_t growth = others_growth(h, s, g, &any);
  if (!any && !parked)
    return false;
  /* New jobs wait behind the parked ones, and a job of known peak until
   * it can grow to it beside the others' known peaks: admitted anyway, it
   * would make the deadlock that parks someone. */
  return growth > UINT64_MAX - parked ||
         !fits_grown(h, g, s, bytes, e, growth + parked);
}

/* Resume admission (issue 25). A job given back only its footprint and
 * the chunk it waited for asks for the next chunk at once, and the next
 * deadlock picks it again: each cycle moves its whole footprint twice to
 * gain one chunk. So a resume waits until the job can grow to what it is
 * expected to need (its command's learnt peak; unknown: a quarter more
 * than it has asked for so far), beside what the jobs still running on
 * the GPU are expected to grow to. Only the footprint is booked; the rest
 * is room left free, not a reservation. A GPU where no other job holds
 * memory resumes on the footprint alone: nothing running there would end
 * and give more back. */
/* Would the resume entry wt fit on g by those rules (g: its own GPU, or
 * one it would move to, with its requests waiting on its own, `own`)? On
 * another GPU the jobs running there count as growing (those of unknown
 * peak by as much again as they hold), as after a deadlock: a job moved
 * beside jobs still growing made the next deadlock there (the two-GPU
 * mix parked twice with migration, once without). */
static bool resume_fits_on(struct cogpu_s *h, const ledger_waiter_t *wt,
                           uint32_t g, uint32_t own) {
  uint32_t s = (uint32_t)wt->slot;
  const ledger_slot_t *sl = &h->st->slots[s];
  if (sl->susp != SUSP_SUSPENDED || g >= h->st->hdr.ngpus)
    return false;
  uint64_t need = sl->parked + pending_on(h, s, own);
  if (!cogpu__ledger_fits(h, g, s, need, false))
    return false;
  if (wt->resume == LEDGER_RESUME_BY_HAND)
    return true; /* a person asked (cogpu resume): back when it fits */
  bool any;
  others_growth(h, s, g, &any);
  if (!any)
    return true;
  /* Behind the growth of every job running there (in the order window,
   * of those of unknown peak too): a job resumed into the room they were
   * parked for is parked again at their next deadlock. */
  uint64_t e = expect_of(h, s, g);
  return fits_grown(
      h, g, s, need, e ? e : need + need / 4,
      ahead_need(h, s, g, true, g != own || in_order(h, g), NULL));
}

bool cogpu__ledger_resume_fits(struct cogpu_s *h, const ledger_waiter_t *wt) {
  return resume_fits_on(h, wt, (uint32_t)wt->gpu, (uint32_t)wt->gpu);
}

/* Migration (option migrate; docs/suspension.md, "Migration"). A job
 * parked on a GPU that cannot take it back yet may be restored onto
 * another GPU of the node that can, by the driver's restore onto a GPU
 * mapping (driver 580+). Only onto a GPU of the same model and size (the
 * driver restores onto the same chip only, and the job's learnt peak is
 * of that model), and only a job none of whose processes is kept from it:
 * one that sees only some of the node's GPUs (CUDA_VISIBLE_DEVICES: the
 * driver refuses any mapping for it), or one whose move the driver has
 * refused once (COGPU_MARK_NOMOVE, set by the daemon). */
bool cogpu__ledger_resume_moves(struct cogpu_s *h, const ledger_waiter_t *wt,
                                uint32_t g) {
  const ledger_suspender_t *sp = cogpu__ledger_suspender(h);
  ledger_state_t *st = h->st;
  uint32_t own = (uint32_t)wt->gpu, s = (uint32_t)wt->slot;
  /* The hook first: off (the default), nothing else is looked at. */
  if (!sp || !sp->can_move || !sp->can_move(sp->ctx) || g == own ||
      g >= st->hdr.ngpus || own >= st->hdr.ngpus || s >= LEDGER_MAX_SLOTS)
    return false;
  const ledger_gpu_t *a = &st->hdr.gpus[own], *b = &st->hdr.gpus[g];
  if (a->total != b->total || strcmp(a->name, b->name) != 0 ||
      (st->slots[s].flags & COGPU_MARK_NOMOVE))
    return false;
  LEDGER_FOR_SLOTS(st, m) {
    if (of_job(st, s, m) && (st->slots[m].flags & COGPU_MARK_CUDA) &&
        (st->slots[m].flags & COGPU_MARK_NOMOVE))
      return false;
  }
  return resume_fits_on(h, wt, g, own);
}

void cogpu__ledger_resume_serve(struct cogpu_s *h, uint32_t w, uint32_t g) {
  ledger_hdr_t *hd = &h->st->hdr;
  ledger_waiter_t *wt = &h->st->waiters[w];
  uint32_t s = (uint32_t)wt->slot, own = (uint32_t)wt->gpu;
  ledger_slot_t *sl = &h->st->slots[s];
  cogpu__assert(sl->susp == SUSP_SUSPENDED);
  if (sl->susp != SUSP_SUSPENDED || g >= hd->ngpus)
    return; /* a release build: no resume of what is not parked */
  /* Booked first: the daemon restores only what the ledger holds. */
  if (sl->parked && !cogpu__ledger_grant(h, g, s, s, sl->parked, false))
    return;
  if (g != own) {
    /* The growth it was parked for goes on in order on its old GPU: its
     * leaving ends no deadlock there (without this, the two-GPU mix
     * parked a second job on the GPU a moved job had left). */
    cogpu__ledger_tx_set(h, &hd->gpus[own].moved_park_ns, sl->susp_since_ns);
    move_job(h, s, own, g);
    cogpu__ledger_tx_set(h, &sl->susp_from, (uint64_t)own + 1);
    cogpu__ledger_tx_set(h, &sl->susp_from_kind, wt->resume);
  }
  cogpu__ledger_tx_set(h, &sl->parked, 0);
  cogpu__ledger_tx_set(h, &sl->susp, SUSP_RESUMING);
  cogpu__ledger_tx_set(h, &wt->state, W_FREE);
  cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting - 1);
  cogpu__ledger_tx_commit(h);
  push_op(h, s, LEDGER_OP_RESUME);
}

bool cogpu__ledger_susp_busy(struct cogpu_s *h, uint32_t g) {
  LEDGER_FOR_SLOTS(h->st, s) {
    const ledger_slot_t *sl = &h->st->slots[s];
    if (sl->state == SLOT_ACTIVE && sl->susp == SUSP_SUSPENDING &&
        sl->susp_gpu == g)
      return true;
  }
  return false;
}

/* Candidate order (issue 25): lowest priority first; the leader of g last
 * (lead: the deadlock is broken for it); then the job
 * suspended fewest times, so a job just resumed is not picked again while
 * a job that was never parked holds memory (the hysteresis that stops a
 * resumed job from being parked for its next chunk, over and over); then
 * the fewest bytes on g (the least to move out and back); then the newest. */
static bool worse_victim(const ledger_slot_t *a, const ledger_slot_t *b,
                         uint32_t g, const ledger_slot_t *lead) {
  if (a->priority != b->priority)
    return a->priority < b->priority;
  if ((a == lead) != (b == lead))
    return b == lead; /* the leader last: the deadlock is broken for it */
  if (a->susp_count != b->susp_count)
    return a->susp_count < b->susp_count;
  if (a->held[g] != b->held[g])
    return a->held[g] < b->held[g];
  return a->attached_ns > b->attached_ns;
}

/* Are the jobs running on g (neither parked nor being parked), two or
 * more, expected to need more than g has? */
static bool running_over(struct cogpu_s *h, uint32_t g) {
  uint64_t sum = 0;
  unsigned n = 0;
  LEDGER_FOR_SLOTS(h->st, t) {
    if (!running_on(h->st, t, g))
      continue;
    const ledger_slot_t *o = &h->st->slots[t];
    uint64_t e = expect_of(h, t, g);
    sum += e > o->held[g] ? e : o->held[g];
    n++;
  }
  return n > 1 && sum > cogpu__ledger_capacity(&h->st->hdr.gpus[g]);
}

typedef bool (*victim_ok_fn)(struct cogpu_s *h, uint32_t s, const void *arg);

/* Suspends the first job holding memory on g, in victim order, that `ok`
 * accepts and that can be suspended now; true if one was begun. Reasons
 * for those that could not go to why (the first one). */
static bool suspend_some(struct cogpu_s *h, uint32_t g, victim_ok_fn ok,
                         const void *arg, char *why, size_t len) {
  uint64_t now = cogpu__now_ns();
  uint8_t tried[LEDGER_MAX_SLOTS / 8] = {0};
  char reason[192];
  why[0] = 0;
  int64_t li = leader_of(h, g);
  const ledger_slot_t *lead = li < 0 ? NULL : &h->st->slots[li];
  /* What host memory can take: a job that would not fit there is not
   * tried, so that the tries go to those that can be parked (the smaller
   * ones), not to a refusal each. */
  const ledger_suspender_t *sp = cogpu__ledger_suspender(h);
  uint64_t room = sp && sp->room ? sp->room(sp->ctx) : UINT64_MAX;
  bool too_big = false;
  /* A few candidates at most: each try scans the slots. */
  for (int tries = 0; tries < 16; tries++) {
    int64_t best = -1;
    LEDGER_FOR_SLOTS(h->st, s) {
      const ledger_slot_t *sl = &h->st->slots[s];
      if (sl->state != SLOT_ACTIVE || sl->held[g] == 0 ||
          sl->susp != SUSP_NONE || sl->leaving != LEDGER_LEAVING_NO ||
          (tried[s / 8] >> (s % 8)) & 1u)
        continue;
      if (sl->held[g] > room) {
        too_big = true;
        continue;
      }
      if (best < 0 || worse_victim(sl, &h->st->slots[best], g, lead))
        best = s;
    }
    if (best < 0) {
      if (too_big && !why[0]) {
        char a[32];
        snprintf(why, len,
                 "host memory can take %s more suspended, less than any "
                 "job here holds",
                 cogpu__fmt_size(room, a, sizeof a));
      }
      return false;
    }
    uint32_t s = (uint32_t)best;
    tried[s / 8] |= (uint8_t)(1u << (s % 8));
    const ledger_slot_t *sl = &h->st->slots[s];
    if (ok && !ok(h, s, arg))
      continue;
    if (now < sl->susp_retry_ns) {
      if (!why[0])
        snprintf(why, len, "pid %d: its last suspension failed", sl->pid);
      continue;
    }
    int rc = cogpu__ledger_suspend_begin(h, s, false, reason, sizeof reason);
    if (rc == 0) {
      cogpu__log(COGPU_LOG_INFO, "GPU %u: suspending the job of pid %d", g,
                 sl->pid);
      return true;
    }
    /* The daemon is still starting CUDA (cuInit takes seconds): nobody is
     * failed meanwhile; the next tick tries again. */
    if (rc == -EAGAIN)
      return true;
    if (!why[0])
      snprintf(why, len, "pid %d: %s", sl->pid, reason);
  }
  return false;
}

bool cogpu__ledger_suspend_for_deadlock(struct cogpu_s *h, uint32_t g,
                                        char *why, size_t len) {
  const ledger_suspender_t *sp = cogpu__ledger_suspender(h);
  if (!sp || !sp->on_deadlock) {
    snprintf(why, len, "%s",
             sp ? "suspension is off (suspend=no)"
                : "suspension needs the node daemon (cogpud)");
    return false;
  }
  if (!suspend_some(h, g, NULL, NULL, why, len))
    return false;
  /* Park enough at once (issue 25): while the jobs left running on g are
   * expected to need more than it has, one deadlock would follow another,
   * each found only after the guard's wait; parked now, the rest run to
   * their end. Only what is known counts (a job of unknown peak counts
   * what it holds), and one job is always left to run. */
  char more[192];
  for (int n = 0; n < 16 && running_over(h, g); n++)
    if (!suspend_some(h, g, NULL, NULL, more, sizeof more))
      break;
  return true;
}

/* The first waiter on g in service order that is not served and could be:
 * what a preemption would make room for. */
static const ledger_waiter_t *blocked_head(struct cogpu_s *h, uint32_t g,
                                           const uint32_t *order, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const ledger_waiter_t *wt = &h->st->waiters[order[i]];
    if (wt->state != W_WAITING || wt->nowait || wt->exclusive ||
        cogpu__ledger_held_back(h, wt) ||
        (wt->gpu != COGPU_GPU_AUTO && wt->gpu != (int64_t)g))
      continue;
    if (wt->bytes > cogpu__ledger_capacity(&h->st->hdr.gpus[g]))
      continue;
    return wt;
  }
  return NULL;
}

static bool lower_priority(struct cogpu_s *h, uint32_t s, const void *arg) {
  const ledger_waiter_t *wt = arg;
  return h->st->slots[s].priority < wt->priority && wt->slot != s;
}

static bool idle_enough(struct cogpu_s *h, uint32_t s, const void *arg) {
  const ledger_waiter_t *wt = arg;
  const ledger_suspender_t *sp = cogpu__ledger_suspender(h);
  return wt->slot != s &&
         sp->idle_ms(sp->ctx, h, s) >= (uint64_t)sp->max_idle_ms;
}

void cogpu__ledger_preempt(struct cogpu_s *h) {
  const ledger_suspender_t *sp = cogpu__ledger_suspender(h);
  ledger_hdr_t *hd = &h->st->hdr;
  if (!sp || (!sp->on_priority && sp->max_idle_ms < 0) || hd->nwaiting == 0)
    return;
  uint32_t order[LEDGER_MAX_WAITERS];
  size_t n = cogpu__ledger_queue_order(h, order);
  char why[192];
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    const ledger_waiter_t *head = blocked_head(h, g, order, n);
    if (!head || cogpu__ledger_susp_busy(h, g))
      continue;
    if (cogpu__ledger_fits(h, g, (uint32_t)head->slot, head->bytes, false) &&
        !cogpu__ledger_admit_held(h, head, g))
      continue; /* it is about to be served */
    if (sp->on_priority &&
        suspend_some(h, g, lower_priority, head, why, sizeof why))
      continue;
    if (sp->max_idle_ms >= 0)
      suspend_some(h, g, idle_enough, head, why, sizeof why);
  }
}

/* The daemon's tick: a suspended job without its resume entry (the queue
 * was full, or a restart dropped it) gets one. */
void cogpu__ledger_susp_check(struct cogpu_s *h) {
  LEDGER_FOR_SLOTS(h->st, s) {
    const ledger_slot_t *sl = &h->st->slots[s];
    if (sl->state == SLOT_ACTIVE && sl->susp == SUSP_SUSPENDED &&
        !sl->susp_manual && !has_resume_entry(h, s))
      enqueue_resume(h, s, false);
  }
}

int cogpu__ledger_mark_locked(struct cogpu_s *h, uint32_t flags) {
  if (flags & ~COGPU_MARK_ALL)
    return cogpu__seterr(-EINVAL, "unknown mark 0x%x", flags);
  ledger_slot_t *me = &h->st->slots[h->slot];
  if ((me->flags | flags) != me->flags) {
    cogpu__ledger_tx_set(h, &me->flags, me->flags | flags);
    cogpu__ledger_tx_commit(h);
  }
  return 0;
}
