/*
 * lock.c: the ledger lock, its undo log, client liveness and repair.
 *
 * The lock is a futex word holding its owner's (slot, generation). It is
 * never abandoned: a waiter that sleeps longer than LOCK_CHECK_MS checks the
 * owner's liveness (the kernel-held OFD lock on the owner's slot byte) and,
 * if the owner died, takes the lock over and repairs the state: the dead
 * holder's transaction is rolled back from the undo log, so the state is as
 * it was before that transaction began.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "ledger-int.h"

#define LOCK_CHECK_MS 50
/* How long an entry point waits for a live holder (item 3 of issue 11):
 * the lock is held for microseconds, so this is a holder that stopped. */
#define LOCK_BOUND_MS 5000
#define LOCK_SPINS 100

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

static void repair_recount(struct cogpu_s *h);
static bool lock_mine(struct cogpu_s *h);

static uint32_t lockw_make(uint32_t slot, uint32_t gen) {
  return (slot + 1) | ((gen & LOCKW_GEN_MASK) << LOCKW_GEN_SHIFT);
}

bool cogpu__ledger_slot_alive(struct cogpu_s *h, uint32_t slot, uint32_t gen) {
  if (slot >= LEDGER_MAX_SLOTS)
    return false;
  ledger_slot_t *s = &h->st->slots[slot];
  uint32_t cur = atomic_load_explicit(&s->gen, memory_order_acquire);
  if ((cur & LOCKW_GEN_MASK) != (gen & LOCKW_GEN_MASK))
    return false;
  if (cogpu__ledger_trusted(h))
    return s->state == SLOT_ACTIVE; /* the daemon frees the dead itself */
  /* Our own OFD lock does not conflict with our own probe. */
  if (slot == h->slot)
    return true;
  struct flock fl = {.l_type = F_WRLCK,
                     .l_whence = SEEK_SET,
                     .l_start = LEDGER_LOCK_BASE + slot,
                     .l_len = 1};
  if (lock_mine(h))
    atomic_fetch_add_explicit(&cogpu__ledger_probes_locked, 1,
                              memory_order_relaxed);
  if (fcntl(h->fd, F_OFD_GETLK, &fl) != 0)
    return true; /* cannot tell: never reclaim on doubt */
  return fl.l_type != F_UNLCK;
}

/* Owner of a held lock word is dead: the slot's lock is free or the slot
 * was claimed again (generation moved on). */
static bool lock_owner_dead(struct cogpu_s *h, uint32_t w) {
  uint32_t slot1 = w & LOCKW_SLOT_MASK;
  if (slot1 == 0)
    return false;
  return !cogpu__ledger_slot_alive(h, slot1 - 1, w >> LOCKW_GEN_SHIFT);
}

/* Takes the lock; bound_ms >= 0 gives up after that long if one holder,
 * alive, keeps it and none of its threads runs (stopped by SIGSTOP,
 * Ctrl-Z, a cgroup freezer or a debugger): -EBUSY, with a message naming
 * it. */
static int lock_take(struct cogpu_s *h, int64_t bound_ms) {
  _Atomic uint32_t *lk = &h->st->hdr.lock;
  uint64_t start = 0;
  uint32_t me = lockw_make(h->slot, h->gen);
  uint32_t cur = 0;
  if (atomic_compare_exchange_strong_explicit(
          lk, &cur, me, memory_order_acquire, memory_order_relaxed))
    goto locked;
  /* The locked sections last tens of nanoseconds: a short spin usually
   * beats a sleep and wake-up of microseconds. */
  for (int spin = 0; spin < LOCK_SPINS; spin++) {
    cpu_relax();
    cur = 0;
    if (atomic_load_explicit(lk, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_weak_explicit(
            lk, &cur, me, memory_order_acquire, memory_order_relaxed))
      goto locked;
  }
  uint64_t since = cogpu__now_ns();
  uint32_t held = atomic_load_explicit(lk, memory_order_relaxed);
  start = since;
  for (;;) {
    cur = atomic_load_explicit(lk, memory_order_relaxed);
    if (cur == 0) {
      /* Others may be asleep: keep the contended mark so unlock wakes one. */
      if (atomic_compare_exchange_strong_explicit(
              lk, &cur, me | LOCKW_CONTENDED, memory_order_acquire,
              memory_order_relaxed))
        goto locked;
      continue;
    }
    if (!(cur & LOCKW_CONTENDED)) {
      uint32_t want = cur | LOCKW_CONTENDED;
      if (!atomic_compare_exchange_strong_explicit(
              lk, &cur, want, memory_order_relaxed, memory_order_relaxed))
        continue;
      cur = want;
    }
    cogpu__ledger_futex_wait(lk, cur, LOCK_CHECK_MS);
    if (cogpu__now_ns() - since < (uint64_t)LOCK_CHECK_MS * 1000000u)
      continue;
    uint32_t w = atomic_load_explicit(lk, memory_order_relaxed);
    if (w != 0 && lock_owner_dead(h, w) &&
        atomic_compare_exchange_strong_explicit(lk, &w, me | LOCKW_CONTENDED,
                                                memory_order_acquire,
                                                memory_order_relaxed)) {
      cogpu__log(COGPU_LOG_WARN,
                 "ledger lock held by a dead client (slot %u): recovered",
                 (w & LOCKW_SLOT_MASK) - 1);
      atomic_fetch_add(&h->st->hdr.repairs, 1);
      cogpu__ledger_repair(h);
      goto locked;
    }
    since = cogpu__now_ns();
    /* The bound is for one holder that keeps the lock: a lock that
     * changed hands since (a busy node) starts the count again, and so
     * does a holder with a thread that runs or waits for a CPU (a loaded
     * machine, not a stopped process: giving up then failed jobs that
     * were only slow to be served). */
    if ((w & ~LOCKW_CONTENDED) != (held & ~LOCKW_CONTENDED)) {
      held = w;
      start = since;
    }
    if (bound_ms >= 0 && w != 0 &&
        since - start >= cogpu__ms_to_ns((uint64_t)bound_ms)) {
      uint32_t s1 = w & LOCKW_SLOT_MASK;
      int pid = s1 && s1 <= LEDGER_MAX_SLOTS ? h->st->slots[s1 - 1].pid : 0;
      if (pid > 0 && cogpu__proc_runnable(pid)) {
        start = since;
        continue;
      }
      return cogpu__seterr(-EBUSY,
                           "the node's ledger has been locked for %lld ms by "
                           "pid %d (slot %u), which is alive but does not "
                           "run (stopped?); gave up",
                           (long long)bound_ms, pid, s1 ? s1 - 1 : 0);
    }
  }
locked:
  cogpu__fault(COGPU_FP_LOCK_HELD);
  if (config_debug)
    cogpu__ledger_verify(h);
  return 0;
}

bool cogpu__ledger_lock_contended(struct cogpu_s *h) {
  return atomic_load_explicit(&h->st->hdr.lock, memory_order_relaxed) &
         LOCKW_CONTENDED;
}

void cogpu__ledger_lock(struct cogpu_s *h) {
  (void)lock_take(h, -1);
}

int cogpu__ledger_lock_bounded(struct cogpu_s *h) {
  return lock_take(h, cogpu__ledger_trusted(h) ? -1 : LOCK_BOUND_MS);
}

bool cogpu__ledger_verify(struct cogpu_s *h) {
  char why[160];
  if (cogpu__ledger_invariants(h, why, sizeof why) == 0)
    return true;
  cogpu__log(COGPU_LOG_WARN,
             "the node's counters did not add up (%s): recounted from the "
             "clients' slots",
             why);
  repair_recount(h);
  return false;
}

/* Waiters served while a handle holds the lock, woken once it is
 * released. A waiter entry reused in between only gets a spurious wake-up,
 * which every sleeper tolerates. The list is the lock holder's handle's:
 * thread-local storage cost a __tls_get_addr call at every unlock (the
 * preload library's TLS model is the dynamic one, so that it can be
 * dlopened). It is short: beyond it, a waiter is woken at once, and finds
 * the lock held for a moment. In the daemon (trusted mode) every answered
 * waiter is collected instead, for the daemon to answer over its wait
 * connection. */
void cogpu__ledger_wake_later(struct cogpu_s *h, uint32_t waiter) {
  ledger_host_t *ho = h->host;
  if (ho) {
    if (ho->nwakes < LEDGER_MAX_WAITERS)
      ho->wakes[ho->nwakes++] = waiter;
    return;
  }
  if (h->wake_n < LEDGER_WAKE_LATER_MAX)
    h->wake_list[h->wake_n++] = (uint16_t)waiter;
  else
    cogpu__ledger_futex_wake(&h->st->waiters[waiter].futex, 1);
}

size_t cogpu__ledger_take_wakes_of(struct cogpu_s *h, uint32_t *out,
                                   size_t max) {
  ledger_host_t *ho = h->host;
  if (!ho)
    return 0;
  size_t n = ho->nwakes < max ? ho->nwakes : max;
  memcpy(out, ho->wakes, n * sizeof *out);
  ho->nwakes = 0;
  return n;
}

void cogpu__ledger_unlock(struct cogpu_s *h) {
  cogpu__fault(COGPU_FP_BEFORE_UNLOCK);
  /* Taken while the lock is held: the list is the holder's. */
  uint16_t wake[LEDGER_WAKE_LATER_MAX];
  uint32_t n = h->wake_n;
  if (n)
    memcpy(wake, h->wake_list, n * sizeof *wake);
  h->wake_n = 0;
  uint32_t old =
      atomic_exchange_explicit(&h->st->hdr.lock, 0, memory_order_release);
  if (old & LOCKW_CONTENDED)
    cogpu__ledger_futex_wake(&h->st->hdr.lock, 1);
  if (cogpu__ledger_trusted(h))
    return; /* the daemon takes the list and answers the waiters itself */
  for (uint32_t i = 0; i < n; i++)
    cogpu__ledger_futex_wake(&h->st->waiters[wake[i]].futex, 1);
}

/* A transaction longer than the log: a programming error; commit what we
 * have rather than overflow (cogpu__ledger_tx_set). */
void cogpu__ledger_tx_overflow(struct cogpu_s *h) {
  cogpu__log(COGPU_LOG_ERROR, "ledger transaction too long");
  cogpu__ledger_tx_commit(h);
}

void cogpu__ledger_tx_commit(struct cogpu_s *h) {
  /* Only with a change: an empty commit (a fast path that granted
   * nothing) must not record the request as answered, rc 0, on a GPU it
   * never got; the caller records what happens next (handle.c). */
  if (h->rec_pending &&
      atomic_load_explicit(&h->st->hdr.tx_n, memory_order_relaxed) > 0) {
    /* The daemon records the client's request with its change. */
    h->rec_pending = false;
    ledger_slot_t *sl = &h->st->slots[h->slot];
    int64_t gpu = h->rec_gpu >= 0 ? h->rec_gpu : h->granted_gpu;
    cogpu__ledger_tx_set(h, &sl->last_op, h->rec_op);
    cogpu__ledger_tx_set(h, (uint64_t *)&sl->last_rc, 0);
    cogpu__ledger_tx_set(h, (uint64_t *)&sl->last_gpu, (uint64_t)gpu);
    cogpu__ledger_tx_set(h, &sl->last_a, h->rec_a);
  }
  atomic_signal_fence(memory_order_seq_cst);
  atomic_store_explicit(&h->st->hdr.tx_n, 0, memory_order_release);
  if (config_debug) {
    /* Every transaction keeps the ledger consistent on its own. */
    char why[160];
    cogpu__assert_why(cogpu__ledger_invariants(h, why, sizeof why) == 0, why);
  }
}

/* The ledger's invariants: each GPU's reserved is the sum of what the
 * active slots hold there and nclients the number of those holding
 * something (or exclusive use); no free slot holds bytes; nwaiting is the
 * number of waiting entries; a job lends exactly its members' claims. */
int cogpu__ledger_invariants(struct cogpu_s *h, char *why, size_t len) {
  const ledger_state_t *st = h->st;
  const ledger_hdr_t *hd = &st->hdr;
  uint32_t ng = hd->ngpus < LEDGER_MAX_GPUS ? hd->ngpus : LEDGER_MAX_GPUS;
  uint64_t reserved[LEDGER_MAX_GPUS] = {0}, nclients[LEDGER_MAX_GPUS] = {0};
  bool lends = false;
  LEDGER_FOR_SLOTS(st, s) {
    const ledger_slot_t *sl = &st->slots[s];
    for (uint32_t g = 0; g < ng; g++) {
      if (sl->state != SLOT_ACTIVE) {
        if (sl->held[g])
          return snprintf(why, len, "free slot %u holds %llu bytes on GPU %u",
                          s, (unsigned long long)sl->held[g], g);
        continue;
      }
      reserved[g] += sl->held[g];
      nclients[g] += sl->held[g] > 0 || hd->gpus[g].excl_slot == s + 1;
      lends |= sl->lent[g] > 0 || sl->claim[g] > 0;
    }
  }
  for (uint32_t g = 0; g < ng; g++) {
    if (reserved[g] != hd->gpus[g].reserved)
      return snprintf(why, len, "GPU %u: reserved %llu, slots hold %llu", g,
                      (unsigned long long)hd->gpus[g].reserved,
                      (unsigned long long)reserved[g]);
    if (nclients[g] != hd->gpus[g].nclients)
      return snprintf(why, len, "GPU %u: nclients %llu, %llu slots hold", g,
                      (unsigned long long)hd->gpus[g].nclients,
                      (unsigned long long)nclients[g]);
  }
  uint64_t nw = 0;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++)
    nw += st->waiters[w].state == W_WAITING;
  if (nw != hd->nwaiting)
    return snprintf(why, len, "nwaiting %llu, %llu waiting entries",
                    (unsigned long long)hd->nwaiting, (unsigned long long)nw);
  if (!lends)
    return 0;
  /* Jobs' lent against their members' claims: summed per job in a pass
   * over the members, then compared (only when anybody lends or claims). */
  LEDGER_FOR_SLOTS(st, s) {
    const ledger_slot_t *job = &st->slots[s];
    if (job->state != SLOT_ACTIVE)
      continue;
    bool any = false;
    for (uint32_t g = 0; g < ng; g++)
      any |= job->lent[g] > 0;
    if (!any)
      continue;
    uint64_t sum[LEDGER_MAX_GPUS] = {0};
    LEDGER_FOR_SLOTS(st, m) {
      const ledger_slot_t *ms = &st->slots[m];
      if (m == s || ms->state != SLOT_ACTIVE || ms->job != (uint64_t)s + 1 ||
          ms->job_gen != atomic_load(&job->gen))
        continue;
      for (uint32_t g = 0; g < ng; g++)
        sum[g] += ms->claim[g];
    }
    for (uint32_t g = 0; g < ng; g++)
      if (sum[g] != job->lent[g])
        return snprintf(why, len,
                        "job slot %u lends %llu on GPU %u, its members "
                        "claim %llu",
                        s, (unsigned long long)job->lent[g], g,
                        (unsigned long long)sum[g]);
  }
  return 0;
}

static void repair_rollback(struct cogpu_s *h) {
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t n = atomic_load(&hd->tx_n);
  if (n > LEDGER_TX_MAX)
    n = LEDGER_TX_MAX; /* a corrupt count: roll back what can be read */
  for (uint64_t i = n; i-- > 0;) {
    uint64_t off = hd->tx[i].off;
    if (off % 8 || off + 8 > sizeof(ledger_state_t))
      continue;
    *(uint64_t *)((char *)h->st + off) = hd->tx[i].old;
  }
  if (n)
    cogpu__log(COGPU_LOG_INFO, "rolled back %u stores of a dead client",
               (unsigned)n);
  atomic_store(&hd->tx_n, 0);
}

/* Jobs' lent counters from their live members' claims. */
static void recount_lent(struct cogpu_s *h) {
  uint32_t ng = h->st->hdr.ngpus;
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++)
    memset(h->st->slots[s].lent, 0, sizeof h->st->slots[s].lent);
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++) {
    ledger_slot_t *sl = &h->st->slots[s];
    if (sl->state != SLOT_ACTIVE || !sl->job || sl->job > LEDGER_MAX_SLOTS)
      continue;
    ledger_slot_t *job = &h->st->slots[sl->job - 1];
    if (job->state != SLOT_ACTIVE || atomic_load(&job->gen) != sl->job_gen)
      continue;
    for (uint32_t g = 0; g < ng; g++)
      job->lent[g] += sl->claim[g];
  }
}

/* Recompute what is derived from the slots and waiters, and drop entries
 * that cannot be valid (e.g. written by a corrupting bug). Runs under the
 * lock, outside any transaction: each store here is idempotent. */
static void repair_recount(struct cogpu_s *h) {
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t reserved[LEDGER_MAX_GPUS] = {0}, nclients[LEDGER_MAX_GPUS] = {0};
  /* Every slot, not the map's: the map is rebuilt here too. */
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++) {
    ledger_slot_t *sl = &h->st->slots[s];
    if (sl->state == SLOT_ACTIVE || sl->escaped)
      cogpu__ledger_slot_mark(h, s);
    else
      cogpu__ledger_slot_unmark(h, s);
    if (sl->state != SLOT_ACTIVE)
      continue;
    for (uint32_t g = 0; g < hd->ngpus; g++) {
      if (sl->held[g] > hd->gpus[g].total)
        sl->held[g] = 0;
      reserved[g] += sl->held[g];
      nclients[g] += sl->held[g] > 0 || hd->gpus[g].excl_slot == s + 1;
    }
  }
  recount_lent(h);
  uint64_t nw = 0;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state == W_FREE)
      continue;
    /* A waiter whose job's slot is gone waits on for its own process. */
    if (wt->state == W_WAITING && wt->owner < LEDGER_MAX_SLOTS &&
        h->st->slots[wt->owner].state == SLOT_ACTIVE &&
        (wt->slot >= LEDGER_MAX_SLOTS ||
         h->st->slots[wt->slot].state != SLOT_ACTIVE)) {
      wt->slot = wt->owner;
      wt->gen = atomic_load(&h->st->slots[wt->owner].gen);
    }
    bool ok = wt->slot < LEDGER_MAX_SLOTS && wt->owner < LEDGER_MAX_SLOTS &&
              h->st->slots[wt->slot].state == SLOT_ACTIVE &&
              h->st->slots[wt->owner].state == SLOT_ACTIVE &&
              (wt->gpu == COGPU_GPU_AUTO ||
               (wt->gpu >= 0 && (uint64_t)wt->gpu < hd->ngpus));
    if (!ok)
      wt->state = W_FREE;
    else if (wt->state == W_WAITING)
      nw++;
  }
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    ledger_gpu_t *gp = &hd->gpus[g];
    if (gp->reserved != reserved[g] || gp->nclients != nclients[g])
      cogpu__log(COGPU_LOG_WARN, "GPU %u: recounted reservations", g);
    gp->reserved = reserved[g];
    gp->nclients = nclients[g];
    uint64_t ex = gp->excl_slot;
    if (ex &&
        (ex > LEDGER_MAX_SLOTS || h->st->slots[ex - 1].state != SLOT_ACTIVE))
      gp->excl_slot = 0;
  }
  hd->nwaiting = nw;
}

void cogpu__ledger_repair(struct cogpu_s *h) {
  repair_rollback(h);
  repair_recount(h);
}

void cogpu__ledger_recount(struct cogpu_s *h) {
  repair_recount(h);
}

/* Frees one dead slot: its reservations, exclusivity and waiters. */
/* A member leaving its job gives back what it claimed of the job's
 * reservation, for the job's other processes. */
static void slot_unclaim(struct cogpu_s *h, ledger_slot_t *sl) {
  if (!sl->job || sl->job > LEDGER_MAX_SLOTS) {
    for (uint32_t g = 0; g < h->st->hdr.ngpus; g++)
      if (sl->claim[g]) { /* a claim without a job: nothing to give it to */
        cogpu__ledger_tx_set(h, &sl->claim[g], 0);
        cogpu__ledger_tx_commit(h);
      }
    return;
  }
  ledger_slot_t *job = &h->st->slots[sl->job - 1];
  bool same =
      job->state == SLOT_ACTIVE && atomic_load(&job->gen) == sl->job_gen;
  for (uint32_t g = 0; g < h->st->hdr.ngpus; g++) {
    if (!sl->claim[g])
      continue;
    if (same)
      cogpu__ledger_tx_set(
          h, &job->lent[g],
          job->lent[g] > sl->claim[g] ? job->lent[g] - sl->claim[g] : 0);
    cogpu__ledger_tx_set(h, &sl->claim[g], 0);
    cogpu__ledger_tx_commit(h);
  }
  cogpu__ledger_tx_set(h, &sl->job, 0);
  cogpu__ledger_tx_commit(h);
}

/* A waiter of a process whose job's slot goes away waits on for the
 * process's own slot instead (the process still sleeps on it), and is
 * woken to notice. Returns false when the process is not there either. */
static bool waiter_retarget(struct cogpu_s *h, ledger_waiter_t *wt,
                            uint32_t w) {
  uint64_t o = wt->owner;
  if (o >= LEDGER_MAX_SLOTS || h->st->slots[o].state != SLOT_ACTIVE)
    return false;
  cogpu__ledger_tx_set(h, &wt->slot, o);
  cogpu__ledger_tx_set(h, &wt->gen, atomic_load(&h->st->slots[o].gen));
  cogpu__ledger_tx_commit(h);
  cogpu__ledger_wake_later(h, w);
  return true;
}

void cogpu__ledger_note_left(struct cogpu_s *h) {
  uint32_t ms = (uint32_t)(cogpu__now_ns() / 1000000u);
  atomic_store_explicit(&h->st->hdr.left_ms, ms ? ms : 1, memory_order_release);
}

/* A job's slot is being freed while processes of the job live on (a
 * grandchild of `cogpu run`, which PR_SET_PDEATHSIG does not reach). What
 * each one claimed of the job's reservation becomes its own reservation,
 * so that memory it still uses stays counted, and it is marked as a
 * process whose job ended (job = its own slot): what it later gives back
 * of those claims leaves its own reservation (cogpu__ledger_unclaim). One
 * transaction per GPU, each clearing the claim it moved: a holder killed
 * in between leaves a state that the next attempt completes, never one
 * that counts a claim twice. No system call: dead members are reclaimed by
 * the sweep as usual. */
static void slot_orphan_members(struct cogpu_s *h, uint32_t s) {
  ledger_hdr_t *hd = &h->st->hdr;
  ledger_slot_t *job = &h->st->slots[s];
  uint32_t gen = atomic_load(&job->gen);
  LEDGER_FOR_SLOTS(h->st, m) {
    ledger_slot_t *ms = &h->st->slots[m];
    if (m == s || ms->state != SLOT_ACTIVE || ms->job != (uint64_t)s + 1 ||
        ms->job_gen != gen)
      continue;
    for (uint32_t g = 0; g < hd->ngpus; g++) {
      uint64_t c = ms->claim[g];
      if (!c)
        continue;
      ledger_gpu_t *gp = &hd->gpus[g];
      if (job->susp == SUSP_SUSPENDED && job->susp_gpu == g) {
        /* Its memory is in host memory: the process stays suspended as a
         * job of its own, and is resumed as one (its resume entry comes
         * from the daemon's tick). */
        cogpu__ledger_tx_set(h, &ms->parked, ms->parked + c);
        cogpu__ledger_tx_set(h, &ms->susp_gpu, g);
        cogpu__ledger_tx_set(h, &ms->susp_since_ns, job->susp_since_ns);
        cogpu__ledger_tx_set(h, &ms->susp, SUSP_SUSPENDED);
        cogpu__ledger_tx_set(h, &job->lent[g],
                             job->lent[g] > c ? job->lent[g] - c : 0);
        cogpu__ledger_tx_set(h, &ms->claim[g], 0);
        cogpu__ledger_tx_commit(h);
        continue;
      }
      if (ms->held[g] == 0 && gp->excl_slot != m + 1)
        cogpu__ledger_tx_set(h, &gp->nclients, gp->nclients + 1);
      cogpu__ledger_tx_set(h, &ms->held[g], ms->held[g] + c);
      cogpu__ledger_tx_set(h, &gp->reserved, gp->reserved + c);
      cogpu__ledger_tx_set(h, &job->lent[g],
                           job->lent[g] > c ? job->lent[g] - c : 0);
      cogpu__ledger_tx_set(h, &ms->claim[g], 0);
      cogpu__ledger_tx_commit(h);
    }
    cogpu__ledger_tx_set(h, &ms->job, (uint64_t)m + 1);
    cogpu__ledger_tx_set(h, &ms->job_gen, atomic_load(&ms->gen));
    cogpu__ledger_tx_commit(h);
    cogpu__log(COGPU_LOG_INFO,
               "job of pid %d ended while its process pid %d lives: that "
               "process's share is now its own reservation",
               job->pid, ms->pid);
  }
}

/* Frees queue entry wt (lock held): a request that still waits leaves the
 * queue, counted as cancelled unless it is a job's resume (no process
 * asked for it). */
static void waiter_drop(struct cogpu_s *h, ledger_waiter_t *wt) {
  ledger_hdr_t *hd = &h->st->hdr;
  if (wt->state == W_WAITING) {
    cogpu__ledger_tx_set(h, &hd->nwaiting, hd->nwaiting - 1);
    if (!wt->resume) /* its process died or detached while it waited */
      cogpu__ledger_count_admit(h, COGPU_ADMIT_CANCELLED);
  }
  cogpu__ledger_tx_set(h, &wt->state, W_FREE);
  cogpu__ledger_tx_commit(h);
}

bool cogpu__ledger_slot_holds(const ledger_state_t *st, uint32_t s) {
  const ledger_slot_t *sl = &st->slots[s];
  for (uint32_t g = 0; g < st->hdr.ngpus; g++)
    if (sl->held[g] || sl->claim[g])
      return true;
  return false;
}

void cogpu__ledger_slot_leave(struct cogpu_s *h, uint32_t s) {
  ledger_slot_t *sl = &h->st->slots[s];
  cogpu__assert(sl->state == SLOT_ACTIVE);
  /* Only the requests it made itself: a resume of its job, parked, waits
   * for the job's room whatever became of this process's connection. */
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state == W_WAITING && wt->slot == s && !wt->resume)
      waiter_drop(h, wt);
  }
  cogpu__ledger_tx_set(h, &sl->leaving, LEDGER_LEAVING);
  cogpu__ledger_tx_commit(h);
}

void cogpu__ledger_slot_free(struct cogpu_s *h, uint32_t s) {
  ledger_hdr_t *hd = &h->st->hdr;
  ledger_slot_t *sl = &h->st->slots[s];
  bool lends = false;
  cogpu__ledger_usage_free(h, s);
  for (uint32_t g = 0; g < hd->ngpus; g++)
    if (sl->held[g] || sl->claim[g]) {
      cogpu__ledger_note_left(h); /* it may have had memory on the GPU */
      break;
    }
  for (uint32_t g = 0; g < hd->ngpus && !lends; g++)
    lends = sl->lent[g] > 0;
  if (lends)
    slot_orphan_members(h, s);
  slot_unclaim(h, sl);
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    ledger_gpu_t *gp = &hd->gpus[g];
    if (sl->held[g]) {
      cogpu__ledger_tx_set(h, &gp->reserved, gp->reserved - sl->held[g]);
      cogpu__ledger_tx_set(h, &gp->nclients, gp->nclients - 1);
      cogpu__ledger_tx_set(h, &sl->held[g], 0);
    } else if (gp->excl_slot == s + 1) {
      cogpu__ledger_tx_set(h, &gp->nclients, gp->nclients - 1);
    }
    if (gp->excl_slot == s + 1)
      cogpu__ledger_tx_set(h, &gp->excl_slot, 0);
    cogpu__ledger_tx_commit(h);
  }
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    ledger_waiter_t *wt = &h->st->waiters[w];
    if (wt->state == W_FREE || (wt->slot != s && wt->owner != s))
      continue;
    if (wt->state == W_WAITING && wt->owner != s &&
        waiter_retarget(h, wt, (uint32_t)w))
      continue;
    waiter_drop(h, wt);
  }
  cogpu__ledger_tx_set(h, &sl->state, SLOT_FREE);
  cogpu__ledger_tx_commit(h);
  cogpu__ledger_slot_unmark(h, s);
}

void cogpu__ledger_slot_mark(struct cogpu_s *h, uint32_t s) {
  cogpu__assert(s < LEDGER_MAX_SLOTS);
  atomic_fetch_or_explicit(&h->st->hdr.slot_map[s / 64], 1ull << (s % 64),
                           memory_order_relaxed);
}

void cogpu__ledger_slot_unmark(struct cogpu_s *h, uint32_t s) {
  if (s >= LEDGER_MAX_SLOTS || h->st->slots[s].state == SLOT_ACTIVE ||
      h->st->slots[s].escaped)
    return;
  atomic_fetch_and_explicit(&h->st->hdr.slot_map[s / 64], ~(1ull << (s % 64)),
                            memory_order_relaxed);
}

/* Liveness probes (F_OFD_GETLK) made while this process held the ledger
 * lock; a test reads it to show that sweeps keep system calls out of the
 * critical section. Counting costs a load next to a system call. */
_Atomic uint64_t cogpu__ledger_probes_locked;

static bool lock_mine(struct cogpu_s *h) {
  uint32_t w = atomic_load_explicit(&h->st->hdr.lock, memory_order_relaxed);
  return (w & ~LOCKW_CONTENDED) == lockw_make(h->slot, h->gen);
}

/* --- liveness in bulk -------------------------------------------------------
 * F_OFD_GETLK walks the file's list of locks until it meets one that
 * conflicts, so probing each of n clients costs O(n²) in the kernel: with
 * 2,000 clients, 11 ms of every status snapshot (bench-scrape). From
 * PROBE_BULK_MIN clients on, the held liveness bytes are read from
 * /proc/locks in one pass, and only the slots not listed there are probed
 * one by one. A byte listed as locked is held, as surely as a probe that
 * met its lock (both read the kernel's lock list at one moment, and only
 * clients lock those bytes); a slot is found dead only by a probe of its
 * own, so nothing is reclaimed on /proc/locks' word. Without /proc/locks
 * every slot is probed, as below the threshold. */
#define PROBE_BULK_MIN 64
#define PROC_LOCKS_BUF 65536

/* One line of /proc/locks: "1: OFDLCK ADVISORY WRITE -1 00:1a:1234 START
 * END" (END may be EOF). Marks in `held` the slots of the state file
 * (`dev`: " MAJ:MIN:INO ") whose byte it locks; a request still blocked
 * ("1: -> ...") holds nothing. */
static void locks_line(const char *line, const char *dev, uint64_t *held) {
  const char *p = strstr(line, dev);
  if (!p || strstr(line, "->"))
    return;
  p += strlen(dev);
  char *end;
  unsigned long long a = strtoull(p, &end, 10), b;
  if (end == p)
    return;
  while (*end == ' ')
    end++;
  if (strncmp(end, "EOF", 3) == 0) {
    b = ~0ull;
  } else {
    p = end;
    b = strtoull(p, &end, 10);
    if (end == p)
      return;
  }
  unsigned long long lo = (unsigned long long)LEDGER_LOCK_BASE;
  unsigned long long hi = lo + LEDGER_MAX_SLOTS - 1;
  if (b < lo || a > hi)
    return;
  for (unsigned long long x = a > lo ? a : lo; x <= b && x <= hi; x++)
    held[(x - lo) / 64] |= 1ull << ((x - lo) % 64);
}

/* The slots whose liveness byte /proc/locks lists as locked, a bit each,
 * or NULL (no /proc/locks, or out of memory). */
static uint64_t *locks_listed(struct cogpu_s *h) {
  struct stat sb;
  if (fstat(h->fd, &sb) != 0)
    return NULL;
  char dev[64];
  snprintf(dev, sizeof dev, " %02x:%02x:%llu ", major(sb.st_dev),
           minor(sb.st_dev), (unsigned long long)sb.st_ino);
  int fd = open("/proc/locks", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  uint64_t *held = calloc(LEDGER_MAX_SLOTS / 64, sizeof *held);
  char *buf = malloc(PROC_LOCKS_BUF);
  size_t have = 0;
  bool ok = held && buf;
  while (ok) {
    ssize_t n = read(fd, buf + have, PROC_LOCKS_BUF - 1 - have);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    have += (size_t)n;
    buf[have] = 0;
    char *line = buf, *nl;
    while ((nl = strchr(line, '\n'))) {
      *nl = 0;
      locks_line(line, dev, held);
      line = nl + 1;
    }
    have = (size_t)(buf + have - line);
    ok = have < PROC_LOCKS_BUF - 1; /* a line that long is not /proc/locks' */
    memmove(buf, line, have);
  }
  close(fd);
  free(buf);
  if (!ok) {
    free(held);
    return NULL;
  }
  return held;
}

void cogpu__ledger_sweep_probe(struct cogpu_s *h, ledger_sweep_t *sw) {
  sw->n = 0;
  sw->more = false;
  if (cogpu__ledger_trusted(h))
    return; /* the daemon frees a client when its connection closes */
  uint32_t active = 0;
  LEDGER_FOR_SLOTS_WHILE(h->st, s, active < PROBE_BULK_MIN)
  active +=
      __atomic_load_n(&h->st->slots[s].state, __ATOMIC_RELAXED) == SLOT_ACTIVE;
  uint64_t *held = active >= PROBE_BULK_MIN ? locks_listed(h) : NULL;
  LEDGER_FOR_SLOTS(h->st, s) {
    ledger_slot_t *sl = &h->st->slots[s];
    if (s == h->slot ||
        __atomic_load_n(&sl->state, __ATOMIC_RELAXED) != SLOT_ACTIVE)
      continue;
    if (held && (held[s / 64] >> (s % 64) & 1))
      continue;
    uint32_t gen = atomic_load_explicit(&sl->gen, memory_order_acquire);
    if (cogpu__ledger_slot_alive(h, s, gen))
      continue;
    if (sw->n == LEDGER_SWEEP_MAX) {
      sw->more = true; /* the next sweep takes the rest */
      break;
    }
    sw->slot[sw->n] = s;
    sw->gen[sw->n] = gen;
    sw->n++;
  }
  free(held);
}

int cogpu__ledger_sweep_apply(struct cogpu_s *h, const ledger_sweep_t *sw) {
  int n = 0;
  for (uint32_t i = 0; i < sw->n; i++) {
    uint32_t s = sw->slot[i];
    ledger_slot_t *sl = &h->st->slots[s];
    /* Probed dead without the lock: still the same claim of the slot? A
     * slot whose generation moved on was claimed again by a live process;
     * a dead process's generation never moves, so it stays dead. */
    if (sl->state != SLOT_ACTIVE || s == h->slot ||
        (atomic_load(&sl->gen) & LOCKW_GEN_MASK) !=
            (sw->gen[i] & LOCKW_GEN_MASK))
      continue;
    cogpu__log(COGPU_LOG_INFO, "reclaiming dead client pid %d (slot %u)",
               sl->pid, s);
    cogpu__ledger_slot_free(h, s);
    n++;
  }
  return n;
}
