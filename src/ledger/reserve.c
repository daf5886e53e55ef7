/*
 * reserve.c: cogpu_reserve: the fast path, the queue, and waiting.
 *
 * A request that fits while nobody waits is granted at once. Otherwise the
 * request joins the queue and the node's policy decides (cogpu__ledger_serve);
 * if it is not served at once, the caller sleeps on its waiter's futex until a
 * release serves it, its timeout passes, or a housekeeping tick (reclaiming
 * dead clients, refreshing foreign memory) comes round.
 */
#include <errno.h>
#include <string.h>

#include "ledger-int.h"

/* The checks and the fast path are inline in cogpu__ledger_reserve (the
 * calls cost a tenth of an uncontended reserve, issue 24) and out of line
 * for the daemon. */
static inline __attribute__((always_inline)) int
reserve_check(struct cogpu_s *h, const cogpu_request_t *req, reserve_req_t *r) {
  if (!h || !h->st || !req)
    return cogpu__seterr(-EINVAL, "cogpu_reserve: NULL handle or request");
  if (h->forked)
    return cogpu__seterr(-EINVAL, "this handle belongs to the parent process "
                                  "(fork): attach again in the child");
  if (req->flags & ~COGPU__REQ_FLAGS)
    return cogpu__seterr(-EINVAL, "unknown request flags 0x%x", req->flags);
  if (req->timeout_ms < COGPU_WAIT_FOREVER)
    return cogpu__seterr(-EINVAL, "negative timeout %lld ms",
                         (long long)req->timeout_ms);
  ledger_hdr_t *hd = &h->st->hdr;
  if (req->gpu != COGPU_GPU_AUTO &&
      (req->gpu < 0 || (uint32_t)req->gpu >= hd->ngpus))
    return cogpu__seterr(-ENODEV, "no GPU %d on this node (%u GPUs)", req->gpu,
                         hd->ngpus);
  r->exclusive = req->flags & COGPU_REQ_EXCLUSIVE;
  r->flags = req->flags & (COGPU__REQ_DEVICE_WAIT | COGPU__REQ_JOB_SPARE);
  r->bytes = r->exclusive ? 0 : req->bytes;
  if (!r->exclusive && r->bytes == 0)
    return cogpu__seterr(-EINVAL, "cannot reserve 0 bytes");
  r->gpu = req->gpu;
  r->priority =
      req->priority == COGPU_PRIORITY_DEFAULT ? h->priority : req->priority;
  r->timeout_ms = req->timeout_ms;
  uint64_t most = 0;
  for (uint32_t g = 0; g < hd->ngpus; g++)
    if (r->gpu == COGPU_GPU_AUTO || (int64_t)g == r->gpu) {
      ledger_gpu_t *gp = &hd->gpus[g];
      uint64_t cap = gp->total > gp->margin ? gp->total - gp->margin : 0;
      most = cap > most ? cap : most;
    }
  char need[32], have[32];
  if (r->bytes > most)
    return cogpu__seterr(-E2BIG, "request of %s is larger than %s (%s usable)",
                         cogpu__fmt_size(r->bytes, need, sizeof need),
                         r->gpu == COGPU_GPU_AUTO ? "any GPU of this node"
                                                  : "the GPU",
                         cogpu__fmt_size(most, have, sizeof have));
  return 0;
}

int cogpu__ledger_reserve_check(struct cogpu_s *h, const cogpu_request_t *req,
                                reserve_req_t *r) {
  return reserve_check(h, req, r);
}

/* With nobody waiting, grant at once where it fits (auto: most free). */
static inline __attribute__((always_inline)) int
reserve_fast(struct cogpu_s *h, const reserve_req_t *r) {
  ledger_hdr_t *hd = &h->st->hdr;
  /* A suspended job's requests wait for its resume. */
  if (hd->nwaiting || h->st->slots[h->res_slot].susp != SUSP_NONE)
    return -1;
  int best = -1;
  uint64_t best_free = 0;
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    if (r->gpu != COGPU_GPU_AUTO && (int64_t)g != r->gpu)
      continue;
    /* Admission needs the daemon's hooks: single-user mode pays a load. */
    if (!cogpu__ledger_fits(h, g, h->res_slot, r->bytes, r->exclusive) ||
        (h->host && h->host->suspender &&
         cogpu__ledger_admit_holds(h, h->res_slot, r->bytes, r->exclusive, g,
                                   UINT64_MAX)))
      continue;
    uint64_t cap = cogpu__ledger_capacity(&hd->gpus[g]),
             res = hd->gpus[g].reserved;
    uint64_t fr = cap > res ? cap - res : 0;
    /* "Any GPU": where most is free once the jobs there have grown to the
     * peaks the daemon learnt of them (issue 24: a GPU whose jobs are
     * about to take its free memory is not the roomy one). A scan of the
     * slots, only for a placement, and only with the daemon's hooks. */
    if (r->gpu == COGPU_GPU_AUTO && hd->ngpus > 1 && h->host &&
        h->host->suspender) {
      uint64_t grow = cogpu__ledger_growth_beside(h, h->res_slot, g);
      fr = fr > grow ? fr - grow : 0;
    }
    if (best < 0 || fr > best_free) {
      best = (int)g;
      best_free = fr;
    }
  }
  if (best >= 0 && !cogpu__ledger_grant(h, (uint32_t)best, h->res_slot, h->slot,
                                        r->bytes, r->exclusive))
    return -1;
  if (best >= 0)
    cogpu__ledger_count_admit(h, COGPU_ADMIT_IMMEDIATE);
  cogpu__ledger_tx_commit(h);
  return best;
}

int cogpu__ledger_reserve_fast(struct cogpu_s *h, const reserve_req_t *r) {
  /* The daemon's path (single-user mode has no suspension): a job that
   * asks for more where it holds memory is one that grows. */
  ledger_slot_t *js = &h->st->slots[h->res_slot];
  for (uint32_t g = 0; g < h->st->hdr.ngpus; g++)
    if (js->held[g] && (r->gpu == COGPU_GPU_AUTO || r->gpu == (int64_t)g)) {
      js->flags |= COGPU_MARK_GREW;
      /* Growing now: asking past the most it has held (a job that frees
       * and allocates again at its plateau asks, but does not grow). A
       * figure: outside the undo log. */
      if (js->held[g] + r->bytes > js->held_max)
        js->grew_ns = cogpu__coarse_ns();
      break;
    }
  return reserve_fast(h, r);
}

int64_t cogpu__ledger_enqueue(struct cogpu_s *h, const reserve_req_t *r) {
  ledger_hdr_t *hd = &h->st->hdr;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state != W_FREE)
      continue;
    /* Fields first, state last: a death in between leaves it free. */
    atomic_store(&wt->futex, 0);
    wt->slot = h->res_slot;
    wt->gen = atomic_load(&h->st->slots[h->res_slot].gen);
    wt->owner = h->slot;
    wt->gpu = r->gpu;
    wt->bytes = r->bytes;
    wt->priority = r->priority;
    wt->since_ns = cogpu__now_ns();
    wt->exclusive = r->exclusive;
    wt->nowait = r->timeout_ms == 0;
    wt->granted_gpu = -1;
    wt->resume = 0;
    wt->flags = r->flags;
    cogpu__ledger_tx_set(h, &wt->ticket, hd->next_ticket);
    cogpu__ledger_tx_set(h, &hd->next_ticket, hd->next_ticket + 1);
    cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting + 1);
    cogpu__ledger_tx_set(h, &wt->state, W_WAITING);
    cogpu__ledger_tx_commit(h);
    return w;
  }
  return -1;
}

/* Leave the queue: returns the granted GPU, or -1 if it was not granted.
 * An entry still waiting ends here unanswered, counted as `why`; grants
 * and refusals were counted when they were made. */
int cogpu__ledger_dequeue_as(struct cogpu_s *h, uint32_t w, int why) {
  ledger_hdr_t *hd = &h->st->hdr;
  ledger_waiter_t *wt = &h->st->waiters[w];
  int gpu = wt->state == W_GRANTED     ? (int)wt->granted_gpu
            : wt->state == W_REFUSED   ? -2
            : wt->state == W_JOB_SPARE ? -3
                                       : -1;
  /* Time in the queue, for the job's record (a figure, not a booking). */
  if (wt->slot < LEDGER_MAX_SLOTS && !wt->resume) {
    ledger_slot_t *js = &h->st->slots[wt->slot];
    if (js->state == SLOT_ACTIVE && atomic_load(&js->gen) == wt->gen)
      js->waited_ns += cogpu__now_ns() - wt->since_ns;
  }
  if (wt->state == W_WAITING) {
    cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting - 1);
    if (!wt->resume)
      cogpu__ledger_count_admit(h, why);
  }
  cogpu__ledger_tx_set(h, &wt->state, W_FREE);
  cogpu__ledger_tx_commit(h);
  if (gpu == -1)
    cogpu__ledger_serve(h); /* a fifo head leaving may unblock those behind */
  return gpu;
}

int cogpu__ledger_dequeue(struct cogpu_s *h, uint32_t w) {
  return cogpu__ledger_dequeue_as(h, w, COGPU_ADMIT_CANCELLED);
}

int cogpu__ledger_spare_answer(void) {
  return cogpu__seterr(COGPU__EJOB_SPARE,
                       "the job now holds memory none of its processes "
                       "claimed: claim it, then ask for the rest");
}

int cogpu__ledger_refused(const reserve_req_t *r) {
  char need[32];
  return cogpu__seterr(
      COGPU_EDEADLOCK,
      "request for %s refused: every job holding memory on the GPU was "
      "waiting for more, so none could ever proceed (deadlock guard)",
      r->exclusive ? "exclusive use"
                   : cogpu__fmt_size(r->bytes, need, sizeof need));
}

/* A waiter that was answered (granted or refused): leave the queue and
 * return 0 with the GPU, or the refusal. */
static int answered(struct cogpu_s *h, uint32_t w, const reserve_req_t *r,
                    int *gpu_out) {
  int g = cogpu__ledger_dequeue(h, w);
  if (g == -2)
    return cogpu__ledger_refused(r);
  if (g == -3)
    return cogpu__ledger_spare_answer();
  *gpu_out = g;
  return 0;
}

static bool is_answered(const ledger_waiter_t *wt) {
  return wt->state == W_GRANTED || wt->state == W_REFUSED ||
         wt->state == W_JOB_SPARE;
}

/* Is entry w still this request? An entry is named by its index and its
 * ticket (never reused): an entry freed under a sleeper (its process's
 * slot was reclaimed, or a repair dropped it) may already be another
 * process's request, which must be neither taken nor cancelled. */
static bool waiter_mine(struct cogpu_s *h, uint32_t w, uint64_t ticket) {
  const ledger_waiter_t *wt = &h->st->waiters[w];
  return wt->state != W_FREE && wt->ticket == ticket && wt->owner == h->slot;
}

static int waiter_lost(const reserve_req_t *r) {
  char need[32];
  return cogpu__seterr(
      -ECANCELED,
      "the request for %s left the queue without an answer (the node "
      "reclaimed this process's entry); ask again",
      r->exclusive ? "exclusive use"
                   : cogpu__fmt_size(r->bytes, need, sizeof need));
}

static int64_t ms_left(uint64_t deadline_ns) {
  uint64_t now = cogpu__now_ns();
  return now >= deadline_ns ? 0 : (int64_t)((deadline_ns - now) / 1000000u);
}

static int reserve_wait(struct cogpu_s *h, uint32_t w, uint64_t ticket,
                        const reserve_req_t *r, int *gpu_out) {
  ledger_waiter_t *wt = &h->st->waiters[w];
  /* Saturated: a bound of centuries waits, it does not wrap into the past;
   * one past 584 years is no bound at all. */
  uint64_t deadline = cogpu__deadline_ns(r->timeout_ms);
  int64_t tick = (int64_t)h->st->hdr.sweep_interval_ms;
  const cogpu__opt_desc_t *sweep = &cogpu__opt_table[COGPU_OPT_SWEEP_INTERVAL];
  if (tick < sweep->min || tick > sweep->max)
    tick = 1000; /* a state written by a bad configuration: stay live */
  cogpu__fault(COGPU_FP_WAITING);
  ledger_sweep_t sw;
  for (;;) {
    int64_t left = deadline == UINT64_MAX ? tick : ms_left(deadline);
    if (atomic_load_explicit(&wt->futex, memory_order_acquire) == 0 && left > 0)
      cogpu__ledger_futex_wait(&wt->futex, 0, left < tick ? left : tick);
    /* Not answered: probe for dead clients before taking the lock. */
    sw.n = 0;
    if (atomic_load_explicit(&wt->futex, memory_order_acquire) == 0) {
      cogpu__ledger_shm_check_linked(h);
      cogpu__ledger_sweep_probe(h, &sw);
    }
    cogpu__ledger_lock(h);
    if (!waiter_mine(h, w, ticket)) {
      cogpu__ledger_unlock(h);
      return waiter_lost(r);
    }
    if (is_answered(wt)) {
      cogpu__ledger_check_job(h); /* granted to its own slot if it ended */
      int rc = answered(h, w, r, gpu_out);
      cogpu__ledger_unlock(h);
      cogpu__fault(COGPU_FP_GRANTED);
      return rc;
    }
    if (deadline != UINT64_MAX && ms_left(deadline) == 0) {
      cogpu__ledger_dequeue_as(h, w, COGPU_ADMIT_TIMEOUT);
      cogpu__ledger_unlock(h);
      char need[32];
      return cogpu__seterr(-ETIMEDOUT, "timed out after %lld ms waiting for %s",
                           (long long)r->timeout_ms,
                           r->exclusive
                               ? "exclusive use"
                               : cogpu__fmt_size(r->bytes, need, sizeof need));
    }
    /* Housekeeping tick: dead clients and foreign memory may have moved,
     * and the deadlock guard looks at waiters that have waited a tick. */
    cogpu__ledger_sweep_apply(h, &sw);
    cogpu__ledger_serve(h);
    cogpu__ledger_unlock(h);
    cogpu__ledger_foreign_refresh(h, false);
  }
}

/* The request's turn under the policy, with the lock held: join the queue
 * and let the policy run. Returns the granted GPU (having left the queue),
 * -1 when not served yet (*w is its waiter), or a negative error. */
int cogpu__ledger_reserve_queue(struct cogpu_s *h, const reserve_req_t *r,
                                int64_t *w) {
  /* It did not fit: were the figures right? A counter gone wrong would
   * keep an idle node at "0 B free" for good. Recounted, it may fit now. */
  *w = -1;
  if (!cogpu__ledger_verify(h)) {
    int g = cogpu__ledger_reserve_fast(h, r);
    if (g >= 0)
      return g;
  }
  *w = cogpu__ledger_enqueue(h, r);
  if (*w < 0) {
    cogpu__ledger_count_admit(h, COGPU_ADMIT_REFUSED);
    cogpu__ledger_tx_commit(h);
    return cogpu__seterr(-ENOSPC, "the wait queue is full (%u waiters)",
                         LEDGER_MAX_WAITERS);
  }
  cogpu__ledger_serve(h);
  if (!is_answered(&h->st->waiters[*w]))
    return -1;
  int g = -1, rc = answered(h, (uint32_t)*w, r, &g);
  return rc ? rc : g;
}

/* Not served at once: bring the figures up to date (memory of dead clients,
 * foreign processes that went away) before answering "not now" or
 * sleeping. The request stays queued meanwhile, keeping its place. */
static int reserve_slow(struct cogpu_s *h, const reserve_req_t *r, uint32_t w,
                        uint64_t ticket, int *gpu_out) {
  cogpu__ledger_foreign_refresh(h, false);
  cogpu__ledger_shm_check_linked(h);
  ledger_sweep_t sw;
  cogpu__ledger_sweep_probe(h, &sw);
  cogpu__ledger_lock(h);
  if (cogpu__ledger_sweep_apply(h, &sw))
    cogpu__ledger_serve(h);
  if (!waiter_mine(h, w, ticket)) {
    cogpu__ledger_unlock(h);
    return waiter_lost(r);
  }
  if (is_answered(&h->st->waiters[w]) || r->timeout_ms == 0) {
    int g = cogpu__ledger_dequeue_as(h, w, COGPU_ADMIT_REFUSED);
    cogpu__ledger_unlock(h);
    if (g == -2)
      return cogpu__ledger_refused(r);
    if (g == -3)
      return cogpu__ledger_spare_answer();
    if (g >= 0) {
      /* Granted while queued (served between its queueing and this
       * look): a waiter's grant like reserve_wait's, and the same fault
       * point (a test's holder was granted here, and never died there). */
      cogpu__fault(COGPU_FP_GRANTED);
      *gpu_out = g;
      return 0;
    }
    char need[32];
    return cogpu__seterr(-EAGAIN, "%s not available now",
                         r->exclusive
                             ? "exclusive use is"
                             : cogpu__fmt_size(r->bytes, need, sizeof need));
  }
  cogpu__ledger_unlock(h);
  return reserve_wait(h, w, ticket, r, gpu_out);
}

int cogpu__ledger_reserve(struct cogpu_s *h, const cogpu_request_t *req,
                          int *gpu_out) {
  reserve_req_t r = {0};
  int rc = reserve_check(h, req, &r);
  if (rc)
    return rc;
  /* No grant on a foreign figure older than foreign_refresh: a process
   * outside cogpu that appeared since would make the driver refuse what
   * the ledger grants. A clock read when fresh; NVML when stale. */
  if (!cogpu__ledger_foreign_fresh(h)) {
    rc = cogpu__ledger_foreign_refresh(h, false);
    if (rc)
      return rc;
  }
  int64_t w = -1;
  uint64_t ticket = 0;
  rc = cogpu__ledger_lock_live_fast(h);
  if (rc)
    return rc;
  int g = reserve_fast(h, &r);
  if (g < 0)
    g = cogpu__ledger_reserve_queue(h, &r, &w);
  if (g == -1)
    ticket = h->st->waiters[w].ticket;
  cogpu__ledger_unlock_fast(h);
  if (g < -1)
    return g;
  if (g == -1) {
    rc = reserve_slow(h, &r, (uint32_t)w, ticket, &g);
    if (rc)
      return rc;
  }
  if (gpu_out)
    *gpu_out = g;
  return 0;
}

/* The wait is on the ledger's futex, which nothing but a grant wakes: it
 * waits in slices instead, each one a fresh request (so under fifo it may
 * lose its place to a request that came between two slices). */
int cogpu__ledger_reserve_abortable(struct cogpu_s *h,
                                    const cogpu_request_t *req, int *gpu_out,
                                    const cogpu__abort_t *ab) {
  if (!ab || !ab->stop || !req || req->timeout_ms == COGPU_NOWAIT)
    return cogpu__ledger_reserve(h, req, gpu_out);
  int64_t every = ab->every_ms > 0 ? ab->every_ms : 1000;
  uint64_t t0 = cogpu__now_ns() / 1000000u;
  for (;;) {
    cogpu_request_t slice = *req;
    int64_t left = -1; /* forever */
    if (req->timeout_ms > 0) {
      int64_t spent = (int64_t)(cogpu__now_ns() / 1000000u - t0);
      left = req->timeout_ms > spent ? req->timeout_ms - spent : 0;
      if (left == 0)
        return cogpu__seterr(-ETIMEDOUT, "timed out after %lld ms",
                             (long long)req->timeout_ms);
    }
    slice.timeout_ms = left >= 0 && left < every ? left : every;
    int rc = cogpu__ledger_reserve(h, &slice, gpu_out);
    if (rc != -ETIMEDOUT || (left >= 0 && left <= every))
      return rc;
    if (ab->stop(ab->arg))
      return cogpu__seterr(-ECANCELED, "the wait was given up");
  }
}
