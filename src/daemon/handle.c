/*
 * handle.c: what cogpud does with each client message. Every message has
 * passed cogpu__msg_check; identity comes from the connection (SO_PEERCRED),
 * never from the message. Authorisation: a client acts on its own slot and
 * on jobs of its own user; root and the admin group on all.
 *
 * The dispatch layer (daemon-int.h): it replies through conn.c, hands
 * work to the services (a history query, a usage page; the ledger's own
 * calls decide suspensions, which the loop hands to the suspender) and
 * turns what they hand back into replies: an operation's result
 * (cogpu__daemon_susp_result), a query's answer
 * (cogpu__daemon_history_answered). It never calls the loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/daemon-int.h"

static int fail(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *req, int rc,
                const char *fmt, ...) COGPU_PRINTF(5, 6);
static int fail(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *req, int rc,
                const char *fmt, ...) {
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r.u.reply.msg, sizeof r.u.reply.msg, fmt, ap);
  va_end(ap);
  cogpu__daemon_reply(d, c, req, rc, &r);
  return 0;
}

/* Every change of waiter_conn goes through here, which keeps count. */
static void set_waiter_conn(cogpu__daemon_t *d, uint32_t w, dconn_t *c) {
  d->nwaitconns += (c != NULL) - (d->waiter_conn[w] != NULL);
  d->waiter_conn[w] = c;
}

/* --- acting for a client ---------------------------------------------------
 */

/* The proxy handle acts as the connection's process. */
static struct cogpu_s *as(cogpu__daemon_t *d, dconn_t *c) {
  struct cogpu_s *h = &d->proxy;
  h->slot = c->slot;
  h->gen = c->gen;
  h->res_slot = c->res_slot;
  h->res_gen = c->res_gen;
  h->priority = c->priority;
  return h;
}

static int cap_priority(cogpu__daemon_t *d, dconn_t *c, int prio,
                        bool *capped) {
  int cap = (int)d->cfg.v[COGPU_OPT_PRIORITY_CAP].i;
  if (!c->admin && prio > cap) {
    *capped = true;
    return cap;
  }
  return prio;
}

static size_t user_slots(cogpu__daemon_t *d, uid_t uid) {
  size_t n = 0;
  ledger_state_t *st = d->dh->st;
  LEDGER_FOR_SLOTS(st, s)
  n += st->slots[s].state == SLOT_ACTIVE && st->slots[s].uid == uid;
  return n;
}

static size_t user_waiters(cogpu__daemon_t *d, uid_t uid) {
  size_t n = 0;
  ledger_state_t *st = d->dh->st;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    const ledger_waiter_t *wt = &st->waiters[w];
    n += wt->state != W_FREE && wt->owner < LEDGER_MAX_SLOTS &&
         st->slots[wt->owner].uid == uid;
  }
  return n;
}

static uint32_t free_slot(cogpu__daemon_t *d) {
  ledger_state_t *st = d->dh->st;
  static uint32_t next;
  for (uint32_t k = 0; k < LEDGER_MAX_SLOTS; k++) {
    uint32_t s = (next + k) % LEDGER_MAX_SLOTS;
    if (s != d->dh->slot && st->slots[s].state == SLOT_FREE &&
        !d->slot_conn[s]) {
      next = s + 1;
      return s;
    }
  }
  return UINT32_MAX;
}

/* May connection c act on slot s's job? Its own user's, or an admin. */
static bool may_use(const cogpu__daemon_t *d, const dconn_t *c, uint32_t s) {
  return c->admin || d->dh->st->slots[s].uid == c->uid;
}

static int parse_token(const char *tok, uint32_t *slot, uint32_t *gen) {
  unsigned s, g;
  char extra;
  if (sscanf(tok, "%u.%u%c", &s, &g, &extra) != 2 || s >= LEDGER_MAX_SLOTS)
    return -EINVAL;
  *slot = s;
  *gen = g;
  return 0;
}

static void send_gpus(cogpu__daemon_t *d, dconn_t *c) {
  const ledger_hdr_t *hd = &d->dh->st->hdr;
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    cogpu__msg_t m;
    cogpu__msg_init(&m, COGPU_M_GPU, 0);
    m.u.gpu.index = g;
    m.u.gpu.nvml_index = hd->gpus[g].index;
    m.u.gpu.total = hd->gpus[g].total;
    m.u.gpu.margin = hd->gpus[g].margin;
    snprintf(m.u.gpu.uuid, sizeof m.u.gpu.uuid, "%s", hd->gpus[g].uuid);
    snprintf(m.u.gpu.name, sizeof m.u.gpu.name, "%s", hd->gpus[g].name);
    cogpu__daemon_send(d, c, &m, -1);
  }
}

static void identity_reply(cogpu__daemon_t *d, dconn_t *c, cogpu__msg_t *r) {
  ledger_slot_t *sl = &d->dh->st->slots[c->slot];
  r->u.reply.slot = c->slot;
  r->u.reply.gen = c->gen;
  r->u.reply.res_slot = c->res_slot;
  r->u.reply.res_gen = c->res_gen;
  r->u.reply.secret[0] = sl->secret[0];
  r->u.reply.secret[1] = sl->secret[1];
  r->u.reply.ngpus = d->dh->st->hdr.ngpus;
  r->u.reply.policy = d->dh->st->hdr.policy;
  r->u.reply.a = (uint64_t)c->pid;
}

static int on_attach(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  const cogpu__m_attach_t *a = &m->u.attach;
  uid_t owner = c->uid;
  if (a->flags & COGPU_ATTACH_FOR_UID) {
    if (c->uid != 0)
      return fail(d, c, m, -EPERM,
                  "only root may book a job for another "
                  "user") -
             1;
    owner = a->for_uid;
  }
  long most = d->cfg.v[COGPU_OPT_USER_MAX_CLIENTS].i;
  if (!c->admin && (long)user_slots(d, owner) >= most)
    return fail(d, c, m, -EAGAIN,
                "user %u already has %ld processes attached "
                "(user_max_clients)",
                (unsigned)owner, most) -
           1;
  uint32_t job = 0, job_gen = 0;
  ledger_state_t *st = d->dh->st;
  if (a->join[0]) {
    if (parse_token(a->join, &job, &job_gen) ||
        st->slots[job].state != SLOT_ACTIVE ||
        atomic_load(&st->slots[job].gen) != job_gen || job == d->dh->slot)
      return fail(d, c, m, -ESRCH, "the job of token '%s' has ended", a->join) -
             1;
    /* A token is not a key: only the job's own user joins it (and the
     * job's, when the token is a step's). */
    uint32_t root = cogpu__ledger_job_of(d->dh, job);
    if ((st->slots[job].uid != owner || st->slots[root].uid != owner) &&
        !c->admin)
      return fail(d, c, m, -EPERM,
                  "job token '%s' belongs to another user: refused", a->join) -
             1;
    /* Root booking for a user joins only what root booked for that user:
     * never a registration the user (or anyone) made under the job's id. */
    if ((a->flags & COGPU_ATTACH_FOR_UID) &&
        (st->slots[job].uid != owner ||
         !(st->slots[job].flags & COGPU_MARK_BOOKED)))
      return fail(d, c, m, -EPERM,
                  "job token '%s' was not booked for user %u by root: "
                  "refused",
                  a->join, (unsigned)owner) -
             1;
  }
  uint32_t s = free_slot(d);
  if (s == UINT32_MAX)
    return fail(d, c, m, -ENOSPC, "all %u client slots are in use",
                LEDGER_MAX_SLOTS) -
           1;
  bool capped = false;
  int prio = cap_priority(d, c, a->priority, &capped);
  struct cogpu_s *h = d->dh;
  cogpu__ledger_lock(h);
  ledger_slot_t *sl = &st->slots[s];
  c->gen = atomic_fetch_add(&sl->gen, 1) + 1;
  c->slot = c->res_slot = s;
  c->res_gen = c->gen;
  c->priority = prio;
  cogpu__ledger_slot_fill(h, s, c->pid, (uint32_t)owner, prio, a->command,
                          a->job_id);
  if (getrandom(sl->secret, sizeof sl->secret, 0) != sizeof sl->secret) {
    sl->secret[0] = cogpu__now_ns() ^ (uint64_t)c->pid << 32;
    sl->secret[1] = (uint64_t)random() << 31 ^ (uint64_t)random();
  }
  sl->starttime = cogpu__proc_starttime(c->pid);
  sl->last_op = 0;
  if (a->flags & COGPU_ATTACH_FOR_UID)
    cogpu__ledger_tx_set(h, &sl->flags, sl->flags | COGPU_MARK_BOOKED);
  cogpu__ledger_tx_set(h, &sl->state, SLOT_ACTIVE);
  cogpu__ledger_tx_commit(h);
  if (a->join[0]) {
    cogpu__ledger_slot_join(h, s, &job, &job_gen);
    c->res_slot = job;
    c->res_gen = job_gen;
  }
  cogpu__ledger_serve(h);
  cogpu__ledger_unlock(h);
  c->kind = DC_MAIN;
  d->slot_conn[s] = c;
  cogpu__daemon_watch_process(d, c);
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  identity_reply(d, c, &r);
  if (capped) {
    r.u.reply.flags |= COGPU_REPLY_PRIORITY_CAPPED;
    snprintf(r.u.reply.msg, sizeof r.u.reply.msg,
             "priority %d capped to %d (priority_cap; only admins may go "
             "higher)",
             a->priority, prio);
  }
  cogpu__daemon_reply(d, c, m, 0, &r);
  send_gpus(d, c);
  return 0;
}

/* Does the message prove ownership of the slot it names? */
static int authenticate(cogpu__daemon_t *d, dconn_t *c,
                        const cogpu__m_resume_t *who) {
  ledger_state_t *st = d->dh->st;
  if (who->slot >= LEDGER_MAX_SLOTS || who->slot == d->dh->slot)
    return -ESRCH;
  ledger_slot_t *sl = &st->slots[who->slot];
  if (sl->state != SLOT_ACTIVE || atomic_load(&sl->gen) != who->gen ||
      sl->secret[0] != who->secret[0] || sl->secret[1] != who->secret[1])
    return -ESRCH;
  if (sl->uid != c->uid && c->uid != 0)
    return -EPERM;
  c->slot = who->slot;
  c->gen = who->gen;
  c->res_slot = who->slot;
  c->res_gen = who->gen;
  if (sl->job && sl->job <= LEDGER_MAX_SLOTS && sl->job - 1 == who->res_slot &&
      sl->job_gen == who->res_gen) {
    c->res_slot = who->res_slot;
    c->res_gen = who->res_gen;
  }
  c->priority = sl->priority;
  return 0;
}

static int on_resume(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  int rc = authenticate(d, c, &m->u.resume);
  if (rc)
    return fail(d, c, m, rc, "no such registration on this node") - 1;
  dconn_t *old = d->slot_conn[c->slot];
  if (old && old->kind == DC_MAIN)
    return fail(d, c, m, -EBUSY, "this registration is connected") - 1;
  if (old && old->kind == DC_PIDFD) {
    d->slot_conn[c->slot] = NULL; /* stops watching the orphan */
    cogpu__daemon_end_later(d, old);
  }
  ledger_slot_t *sl = &d->dh->st->slots[c->slot];
  if (sl->leaving != LEDGER_LEAVING_NO) {
    /* Its process is back (it lost its connection, it did not exit). */
    cogpu__ledger_lock(d->dh);
    cogpu__ledger_tx_set(d->dh, &sl->leaving, LEDGER_LEAVING_NO);
    cogpu__ledger_tx_commit(d->dh);
    cogpu__ledger_unlock(d->dh);
  }
  c->kind = DC_MAIN;
  d->slot_conn[c->slot] = c;
  cogpu__daemon_watch_process(d, c);
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  identity_reply(d, c, &r);
  cogpu__daemon_reply(d, c, m, 0, &r);
  return 0;
}

/* A GPU index as the client's process names it (where the GPU was when
 * it started) into the ledger's, and back: a process restored onto other
 * GPUs (migration) goes on naming them as before (docs/suspension.md,
 * "Migration"). Negative ones (COGPU_GPU_AUTO, "none") pass as they are. */
static int gpu_in(cogpu__daemon_t *d, const dconn_t *c, int gpu) {
  return c->slot < LEDGER_MAX_SLOTS
             ? cogpu__ledger_gpu_phys(&d->dh->st->slots[c->slot], gpu)
             : gpu;
}

static int gpu_out(cogpu__daemon_t *d, const dconn_t *c, int gpu) {
  return c->slot < LEDGER_MAX_SLOTS
             ? cogpu__ledger_gpu_view(&d->dh->st->slots[c->slot], gpu)
             : gpu;
}

/* A request resent after a restart that was already done is answered from
 * the slot's record. */
static bool replay(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  ledger_slot_t *sl = &d->dh->st->slots[c->slot];
  if (m->seq == 0 || sl->last_op != m->seq)
    return false;
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  r.u.reply.gpu = (int32_t)gpu_out(d, c, (int)sl->last_gpu);
  r.u.reply.a = sl->last_a;
  cogpu__daemon_reply(d, c, m, (int)sl->last_rc, &r);
  return true;
}

/* The request's record goes into the transaction of the change it makes
 * (cogpu__ledger_tx_commit); if no change was committed, nothing is to
 * be recorded atomically and the caller records the answer itself. */
static void record_with(struct cogpu_s *h, uint32_t op, int64_t gpu,
                        uint64_t a) {
  h->rec_pending = op != 0;
  h->rec_op = op;
  h->rec_gpu = gpu;
  h->rec_a = a;
}

/* Was the record committed with the change? (Clears it either way.) */
static bool recorded(struct cogpu_s *h) {
  bool pending = h->rec_pending;
  h->rec_pending = false;
  return !pending;
}

static void record(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m,
                   int rc, int gpu, uint64_t a) {
  struct cogpu_s *h = d->dh;
  ledger_slot_t *sl = &h->st->slots[c->slot];
  cogpu__ledger_tx_set(h, &sl->last_op, m->seq);
  cogpu__ledger_tx_set(h, (uint64_t *)&sl->last_rc, (uint64_t)(int64_t)rc);
  cogpu__ledger_tx_set(h, (uint64_t *)&sl->last_gpu, (uint64_t)(int64_t)gpu);
  cogpu__ledger_tx_set(h, &sl->last_a, a);
  cogpu__ledger_tx_commit(h);
}

static int to_request(cogpu__daemon_t *d, dconn_t *c,
                      const cogpu__m_reserve_t *q, cogpu_request_t *req,
                      bool *capped) {
  req->gpu = gpu_in(d, c, q->gpu);
  req->bytes = q->bytes;
  req->flags = q->flags;
  req->timeout_ms = q->timeout_ms;
  req->priority = q->priority == COGPU_PRIORITY_DEFAULT
                      ? c->priority
                      : cap_priority(d, c, q->priority, capped);
  return 0;
}

static int on_reserve(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  if (replay(d, c, m))
    return 0;
  cogpu_request_t req;
  bool capped = false;
  to_request(d, c, &m->u.reserve, &req, &capped);
  req.timeout_ms = COGPU_NOWAIT;
  struct cogpu_s *h = as(d, c);
  reserve_req_t r;
  cogpu__clearerr();
  int rc = cogpu__ledger_reserve_check(h, &req, &r);
  int g = -1;
  if (rc == 0) {
    cogpu__ledger_foreign_refresh(d->dh, false); /* no grant on a stale one */
    cogpu__ledger_lock(h);
    cogpu__ledger_check_job(h);
    c->res_slot = h->res_slot;
    record_with(h, m->seq, -1, 0);
    g = cogpu__ledger_reserve_fast(h, &r);
    bool done = recorded(h);
    if (g < 0) {
      int64_t w = -1;
      g = cogpu__ledger_reserve_queue(h, &r, &w);
      if (g == -1) {
        /* A client that will wait opens a wait connection next: the
         * request is counted there, once. Its bound says which. */
        g = cogpu__ledger_dequeue_as(h, (uint32_t)w,
                                     m->u.reserve.timeout_ms != 0
                                         ? LEDGER_ADMIT_NONE
                                         : COGPU_ADMIT_REFUSED);
        if (g == -2)
          rc = cogpu__ledger_refused(&r);
        else if (g == -3)
          rc = cogpu__ledger_spare_answer();
      }
    }
    if (g < -1 && rc == 0)
      rc = g;
    if (rc == 0 && g < 0) {
      char need[32];
      rc = cogpu__seterr(-EAGAIN, "%s not available now",
                         r.exclusive
                             ? "exclusive use is"
                             : cogpu__fmt_size(r.bytes, need, sizeof need));
    }
    if (!done || g < 0 || rc)
      record(d, c, m, rc, g, 0);
    cogpu__ledger_unlock(h);
  }
  if (rc == -EAGAIN)
    cogpu__ledger_foreign_refresh(d->dh, false); /* for the next try */
  cogpu__msg_t rp;
  memset(&rp, 0, sizeof rp);
  rp.u.reply.gpu = gpu_out(d, c, g);
  if (capped)
    rp.u.reply.flags |= COGPU_REPLY_PRIORITY_CAPPED;
  cogpu__daemon_reply(d, c, m, rc, &rp);
  return 0;
}

static int on_release(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  if (replay(d, c, m))
    return 0;
  struct cogpu_s *h = as(d, c);
  int gpu = m->u.amount.gpu;
  cogpu__clearerr();
  int rc = 0;
  if ((uint32_t)gpu >= h->st->hdr.ngpus)
    rc = cogpu__seterr(-ENODEV, "no GPU %d on this node", gpu);
  if (rc == 0) {
    cogpu__ledger_lock(h);
    cogpu__ledger_check_job(h);
    c->res_slot = h->res_slot;
    record_with(h, m->seq, gpu, 0);
    rc = cogpu__ledger_release_locked(h, gpu, m->u.amount.bytes);
    if (!recorded(h) || rc)
      record(d, c, m, rc, gpu, 0);
    cogpu__ledger_unlock(h);
  }
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  return cogpu__daemon_reply(d, c, m, rc, &r) ? -1 : 0;
}

static int on_claim(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m,
                    bool give_back) {
  if (replay(d, c, m))
    return 0;
  struct cogpu_s *h = as(d, c);
  uint64_t got = 0;
  cogpu__clearerr();
  int rc =
      give_back
          ? cogpu__ledger_unclaim(h, m->u.amount.gpu, m->u.amount.bytes)
          : cogpu__ledger_claim(h, m->u.amount.gpu, m->u.amount.bytes, &got);
  c->res_slot = h->res_slot;
  cogpu__ledger_lock(h);
  record(d, c, m, rc, m->u.amount.gpu, got);
  cogpu__ledger_unlock(h);
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  r.u.reply.a = got;
  cogpu__daemon_reply(d, c, m, rc, &r);
  return 0;
}

static int on_query_amount(cogpu__daemon_t *d, dconn_t *c,
                           const cogpu__msg_t *m) {
  struct cogpu_s *h = as(d, c);
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  int gpu = m->u.amount.gpu;
  cogpu__clearerr();
  int rc = 0;
  if (m->type == COGPU_M_ROOM) {
    rc = cogpu__ledger_room(h, gpu, &r.u.reply.a, &r.u.reply.b);
    r.u.reply.ticket = cogpu__ledger_left_ago_ms(h);
  } else if (m->type == COGPU_M_RECHECK) {
    /* A client asks after a driver refusal, rarely: one that asks again
     * and again gets NVML read for it once per RECHECK_EVERY_MS, and the
     * figures as they are meanwhile. */
    uint64_t now = cogpu__now_ns() / 1000000u;
    bool refresh = !c->recheck_ms || now - c->recheck_ms >= RECHECK_EVERY_MS;
    if (refresh)
      c->recheck_ms = now;
    rc = cogpu__ledger_over(h, gpu, refresh, &r.u.reply.a);
  } else if ((uint32_t)gpu >= h->st->hdr.ngpus) {
    rc = cogpu__seterr(-ENODEV, "no GPU %d on this node", gpu);
  } else {
    r.u.reply.a = h->st->slots[h->res_slot].held[gpu];
    r.u.reply.b = cogpu__ledger_job_spare(h, gpu);
  }
  cogpu__daemon_reply(d, c, m, rc, &r);
  return 0;
}

static int on_find_job(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  ledger_state_t *st = d->dh->st;
  /* A registration root booked for a user (a Slurm step) looks only for
   * what root booked for the same user: the job's earlier step. */
  const ledger_slot_t *me =
      c->slot < LEDGER_MAX_SLOTS ? &st->slots[c->slot] : NULL;
  bool booked = me && (me->flags & COGPU_MARK_BOOKED);
  LEDGER_FOR_SLOTS(st, s) {
    ledger_slot_t *sl = &st->slots[s];
    if (s == c->slot || sl->state != SLOT_ACTIVE || sl->job ||
        strncmp(sl->job_id, m->u.find_job.job_id, sizeof sl->job_id) != 0 ||
        !may_use(d, c, s))
      continue;
    if (booked && (sl->uid != me->uid || !(sl->flags & COGPU_MARK_BOOKED)))
      continue;
    cogpu__msg_t r;
    memset(&r, 0, sizeof r);
    r.u.reply.slot = s;
    r.u.reply.gen = atomic_load(&sl->gen);
    cogpu__daemon_reply(d, c, m, 0, &r);
    return 0;
  }
  return fail(d, c, m, -ESRCH, "no live job '%s' of yours on this node",
              m->u.find_job.job_id);
}

/* --- waiting ---------------------------------------------------------------
 */

static void grant_reply(cogpu__daemon_t *d, dconn_t *c, int rc, int gpu) {
  cogpu__msg_t r, req;
  memset(&r, 0, sizeof r);
  cogpu__msg_init(&req, COGPU_M_WAIT, 1);
  r.u.reply.gpu = gpu_out(d, c, gpu);
  /* Granted with its job's resume: say how long the job was away. */
  const ledger_slot_t *job = &d->dh->st->slots[c->res_slot];
  if (rc == 0 && job->susp == SUSP_RESUMING) {
    r.u.reply.flags = COGPU_REPLY_RESUMED;
    r.u.reply.a = (cogpu__now_ns() - job->susp_since_ns) / 1000000u;
  }
  cogpu__daemon_reply(d, c, &req, rc, &r);
}

/* Hands a grant to its wait connection, and records it in the slot under
 * the request's id: a client that asks again after a daemon restart (it
 * never saw the answer) gets this grant, not a second one. */
static void hand_grant(cogpu__daemon_t *d, dconn_t *c, int gpu, uint64_t bytes,
                       bool excl) {
  c->grant_pending = true;
  c->grant_gpu = gpu;
  c->grant_bytes = bytes;
  c->grant_excl = excl;
  if (c->op_seq) {
    cogpu__msg_t id;
    cogpu__msg_init(&id, COGPU_M_WAIT, c->op_seq);
    cogpu__ledger_lock(d->dh);
    record(d, c, &id, 0, gpu, bytes | (excl ? 1ull << 63 : 0));
    cogpu__ledger_unlock(d->dh);
  }
  grant_reply(d, c, 0, gpu);
}

/* A waiting request's queue entry, answered while its client was away (a
 * daemon restart): answer it now. */
static void answer_rebound(cogpu__daemon_t *d, dconn_t *c, uint32_t w) {
  ledger_waiter_t *wt = &d->dh->st->waiters[w];
  if (wt->state == W_GRANTED) {
    hand_grant(d, c, (int)wt->granted_gpu, wt->bytes, wt->exclusive != 0);
  } else if (wt->state == W_REFUSED) {
    reserve_req_t r = {.bytes = wt->bytes, .exclusive = wt->exclusive != 0};
    struct cogpu_s *h = as(d, c);
    cogpu__ledger_lock(h);
    cogpu__ledger_dequeue(h, w);
    cogpu__ledger_unlock(h);
    set_waiter_conn(d, w, NULL);
    c->waiter = -1;
    grant_reply(d, c, cogpu__ledger_refused(&r), -1);
    cogpu__daemon_end_later(d, c);
  } else if (wt->state == W_JOB_SPARE) {
    struct cogpu_s *h = as(d, c);
    cogpu__ledger_lock(h);
    cogpu__ledger_dequeue(h, w);
    cogpu__ledger_unlock(h);
    set_waiter_conn(d, w, NULL);
    c->waiter = -1;
    grant_reply(d, c, cogpu__ledger_spare_answer(), -1);
    cogpu__daemon_end_later(d, c);
  }
}

/* Wait connection c takes queue entry w, left by the previous daemon:
 * told it is queued, or answered at once if it was answered meanwhile. */
static void rebind(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m,
                   uint32_t w) {
  const ledger_waiter_t *wt = &d->dh->st->waiters[w];
  c->waiter = w;
  c->ticket = wt->ticket;
  set_waiter_conn(d, w, c);
  if (wt->state != W_WAITING) {
    answer_rebound(d, c, w);
    return;
  }
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  r.u.reply.flags = COGPU_REPLY_QUEUED;
  r.u.reply.waiter = w;
  r.u.reply.ticket = wt->ticket;
  cogpu__daemon_reply(d, c, m, 0, &r);
}

static int on_wait(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  const cogpu__m_wait_t *wm = &m->u.wait;
  int rc = authenticate(d, c, &wm->who);
  if (rc)
    return fail(d, c, m, rc, "no such registration on this node") - 1;
  c->kind = DC_WAIT;
  c->waiter = -1;
  c->op_seq = m->seq;
  /* Only for the counters; after a daemon restart a client sends its
   * whole bound again, so its closing then counts as a cancel. */
  /* Saturated: a bound of 30,000 years must not wrap to "already past"
   * and count its cancel as a timeout. */
  c->wait_deadline_ns = wm->req.timeout_ms > 0
                            ? cogpu__deadline_ns(wm->req.timeout_ms)
                            : UINT64_MAX;
  ledger_state_t *st = d->dh->st;
  /* After a daemon restart: a request already granted is handed its grant
   * again (the client never saw it), never granted twice. */
  const ledger_slot_t *sl = &st->slots[c->slot];
  if (m->seq && sl->last_op == m->seq && sl->last_rc == 0 &&
      sl->last_gpu >= 0 && (uint64_t)sl->last_gpu < st->hdr.ngpus) {
    c->grant_pending = true;
    c->grant_gpu = (int)sl->last_gpu;
    c->grant_bytes = sl->last_a & ~(1ull << 63);
    c->grant_excl = (sl->last_a >> 63) != 0;
    grant_reply(d, c, 0, c->grant_gpu);
    return 0;
  }
  /* After a daemon restart: the same request keeps its queue entry. */
  if (wm->prev_waiter && wm->prev_waiter <= LEDGER_MAX_WAITERS) {
    uint32_t w = wm->prev_waiter - 1;
    ledger_waiter_t *wt = &st->waiters[w];
    if (wt->state != W_FREE && wt->owner == c->slot &&
        wt->ticket == wm->prev_ticket && !d->waiter_conn[w]) {
      rebind(d, c, m, w);
      return 0;
    }
  }
  /* After a daemon restart: a client that never learnt its queue entry
   * (the old daemon died before answering "queued") asks anew, with no
   * entry to name. An entry of this process's left by the old daemon, for
   * the same request (GPU, bytes, exclusive), is taken as its: granted
   * meanwhile (the recovery's service pass), a second entry would be
   * granted too, and the first stay granted past the rebind deadline,
   * memory nobody asked for (seen: a churner holding 1.25 GiB of its 1 in
   * daemon_kill9_under_load). Two equal requests of one process are
   * interchangeable. */
  if (!wm->prev_waiter && d->rebind_deadline_ms) {
    for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
      ledger_waiter_t *wt = &st->waiters[w];
      if (wt->state == W_FREE || wt->resume || d->waiter_conn[w] ||
          wt->owner != c->slot || wt->gpu != gpu_in(d, c, wm->req.gpu) ||
          wt->exclusive != ((wm->req.flags & COGPU_REQ_EXCLUSIVE) != 0) ||
          (!wt->exclusive && wt->bytes != wm->req.bytes))
        continue;
      rebind(d, c, m, w);
      return 0;
    }
  }
  long most = d->cfg.v[COGPU_OPT_USER_MAX_WAITERS].i;
  if (!c->admin && (long)user_waiters(d, c->uid) >= most)
    return fail(d, c, m, -EAGAIN,
                "user %u already has %ld requests waiting "
                "(user_max_waiters)",
                (unsigned)c->uid, most) -
           1;
  cogpu_request_t req;
  bool capped = false;
  to_request(d, c, &wm->req, &req, &capped);
  if (req.timeout_ms == COGPU_NOWAIT)
    req.timeout_ms = COGPU_WAIT_FOREVER; /* the client bounds its wait */
  struct cogpu_s *h = as(d, c);
  reserve_req_t r;
  cogpu__clearerr();
  rc = cogpu__ledger_reserve_check(h, &req, &r);
  if (rc)
    return fail(d, c, m, rc, "%s", cogpu_last_error()) - 1;
  cogpu__ledger_foreign_refresh(d->dh, false); /* no grant on a stale one */
  cogpu__ledger_lock(h);
  cogpu__ledger_check_job(h);
  c->res_slot = h->res_slot;
  int64_t w = -1;
  record_with(h, c->op_seq, -1, r.bytes | (r.exclusive ? 1ull << 63 : 0));
  int g = cogpu__ledger_reserve_fast(h, &r);
  recorded(h);
  if (g < 0)
    g = cogpu__ledger_reserve_queue(h, &r, &w);
  cogpu__ledger_unlock(h);
  if (g >= 0) {
    hand_grant(d, c, g, r.bytes, r.exclusive);
    return 0;
  }
  if (g < -1)
    return fail(d, c, m, g, "%s", cogpu_last_error()) - 1;
  c->waiter = w;
  c->ticket = st->waiters[w].ticket;
  set_waiter_conn(d, (uint32_t)w, c);
  cogpu__msg_t rp;
  memset(&rp, 0, sizeof rp);
  rp.u.reply.flags = COGPU_REPLY_QUEUED;
  rp.u.reply.waiter = (uint32_t)w;
  rp.u.reply.ticket = c->ticket;
  cogpu__fault(COGPU_FP_QUEUED); /* queued, the client not told */
  cogpu__daemon_reply(d, c, m, 0, &rp);
  return 0;
}

/* The grant was delivered: the queue entry is no longer needed. */
static int on_ack(cogpu__daemon_t *d, dconn_t *c) {
  if (!c->grant_pending)
    return -1;
  c->grant_pending = false;
  if (c->waiter >= 0) {
    struct cogpu_s *h = as(d, c);
    cogpu__ledger_lock(h);
    cogpu__ledger_dequeue(h, (uint32_t)c->waiter);
    cogpu__ledger_unlock(h);
    set_waiter_conn(d, (uint32_t)c->waiter, NULL);
    c->waiter = -1;
  }
  return -1; /* the exchange is over */
}

/* Answers the wait connections whose requests the policy has served or
 * refused, or whose entries are gone (their job ended). */
void cogpu__daemon_answer_waiters(cogpu__daemon_t *d) {
  static uint32_t woken[LEDGER_MAX_WAITERS];
  size_t n = cogpu__ledger_take_wakes_of(d->dh, woken, LEDGER_MAX_WAITERS);
  ledger_state_t *st = d->dh->st;
  for (size_t i = 0; i < n; i++) {
    uint32_t w = woken[i];
    dconn_t *c = d->waiter_conn[w];
    ledger_waiter_t *wt = &st->waiters[w];
    if (!c || c->grant_pending)
      continue;
    (void)wt;
    answer_rebound(d, c, w);
  }
}

/* After a slot was freed: wait connections whose entries went with it. */
static void drop_orphaned_waits(cogpu__daemon_t *d) {
  ledger_state_t *st = d->dh->st;
  if (d->nwaitconns == 0)
    return; /* the common case: nothing waits */
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    dconn_t *c = d->waiter_conn[w];
    if (!c ||
        (st->waiters[w].state != W_FREE && st->waiters[w].ticket == c->ticket))
      continue;
    set_waiter_conn(d, (uint32_t)w, NULL);
    c->waiter = -1;
    if (!c->grant_pending) {
      grant_reply(d, c, -ECANCELED, -1);
      cogpu__daemon_end_later(d, c);
    }
  }
}

/* --- status and reset --------------------------------------------------------
 */

static int on_status(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  /* On a process's main connection, as that process: its entries are
   * marked as its own. */
  struct cogpu_s *h = c->kind == DC_MAIN ? as(d, c) : d->dh;
  cogpu_status_t st;
  memset(&st, 0, sizeof st);
  cogpu__ledger_foreign_refresh(h, false);
  cogpu__ledger_lock(h);
  int rc = cogpu__ledger_status_fill(h, &st);
  cogpu__ledger_unlock(h);
  cogpu__susp_status(d, &st);
  /* Clients see the daemon's socket: the state file is root's own. */
  snprintf(st.state_path, sizeof st.state_path, "cogpud %.400s",
           d->cfg.v[COGPU_OPT_SOCKET].s);
  char *buf = NULL;
  size_t size = 0;
  int mfd = -1;
  const char *what = "cannot read the node's state";
  if (rc == 0) {
    what = "out of memory for the status snapshot";
    rc = cogpu__fault_fails(COGPU_FP_SNAP_ALLOC)
             ? -ENOMEM
             : cogpu__snap_build(&st,
                                 c->version < COGPU_PROTO_VERSION
                                     ? COGPU_SNAP_VERSION_V3
                                     : COGPU_SNAP_VERSION,
                                 &buf, &size);
  }
  if (rc == 0) {
    what = "cannot pass the status snapshot";
    /* A short write (a fault test's) sets no errno: its error is EIO, not
     * whatever an earlier call left there. */
    size_t wlen = cogpu__fault_fails(COGPU_FP_SNAP_WRITE) ? size / 2 : size;
    errno = 0;
    mfd = memfd_create("cogpu-status", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mfd < 0 || write(mfd, buf, wlen) != (ssize_t)size ||
        fcntl(mfd, F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
      rc = errno ? -errno : -EIO;
      if (mfd >= 0)
        close(mfd);
      mfd = -1;
    }
  }
  free(buf);
  for (size_t g = 0; g < st.ngpus; g++) {
    free(st.gpus[g].clients);
    free(st.gpus[g].waiting);
  }
  free(st.gpus);
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  r.magic = COGPU_PROTO_MAGIC;
  r.version = COGPU_PROTO_VERSION;
  r.type = COGPU_M_REPLY;
  r.seq = m->seq;
  r.rc = mfd >= 0 ? 0 : rc < 0 ? rc : -EIO;
  if (mfd < 0) {
    snprintf(r.u.reply.msg, sizeof r.u.reply.msg, "%s: %s", what,
             strerror(-r.rc));
    cogpu__log(COGPU_LOG_WARN, "status for pid %d: %s", (int)c->pid,
               r.u.reply.msg);
  }
  cogpu__daemon_send(d, c, &r, mfd);
  if (mfd >= 0)
    close(mfd);
  return c->kind == DC_MAIN ? 0 : -1;
}

static int on_reset(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  if (!c->admin)
    return fail(d, c, m, -EPERM,
                "only root or the admin group may reset the "
                "node") -
           1;
  int live = 0;
  cogpu__clearerr();
  int rc = cogpu__daemon_reset(d, m->u.reset.force, &live);
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  r.u.reply.a = (uint64_t)live;
  cogpu__daemon_reply(d, c, m, rc, &r);
  return -1;
}

/* Does process pid see every GPU of the node? As the driver reads
 * CUDA_VISIBLE_DEVICES: unset, every GPU; else the list up to its first
 * entry that names none (an index or a UUID prefix naming one GPU), of
 * which each GPU must be named. One whose environment cannot be read
 * (gone, or not the daemon's to read) is taken as seeing only some. */
static bool sees_all_gpus(pid_t pid, const ledger_hdr_t *hd) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f)
    return false;
  char *var = NULL, *val = NULL;
  size_t cap = 0;
  ssize_t n;
  bool read_any = false;
  while ((n = getdelim(&var, &cap, '\0', f)) > 0) {
    read_any = true;
    if (strncmp(var, "CUDA_VISIBLE_DEVICES=", 21) == 0) {
      free(val);
      val = strdup(var + 21);
    }
  }
  fclose(f);
  free(var);
  if (!read_any || !val) {
    free(val);
    return read_any; /* unset: it sees them all */
  }
  bool seen[LEDGER_MAX_GPUS] = {false};
  uint32_t count = 0;
  for (char *save = NULL, *tok = strtok_r(val, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    tok += strspn(tok, " \t");
    size_t len = strcspn(tok, " \t");
    tok[len] = 0;
    int g = -1;
    if (len && strspn(tok, "0123456789") == len) {
      unsigned long v = strtoul(tok, NULL, 10);
      g = len < 6 && v < hd->ngpus ? (int)v : -1;
    } else if (len) {
      for (uint32_t k = 0; k < hd->ngpus; k++)
        if (strncasecmp(hd->gpus[k].uuid, tok, len) == 0)
          g = g < 0 ? (int)k : -2; /* a prefix of two names neither */
    }
    if (g < 0 || seen[g])
      break; /* the driver's list ends here */
    seen[g] = true;
    count++;
  }
  free(val);
  return count == hd->ngpus;
}

/* What a process reports about itself (the preload library: it uses CUDA;
 * it used something that cannot be checkpointed). Only the bits a client
 * may set. */
static int on_mark(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  if (m->u.mark.flags & ~COGPU_MARK_ALL)
    return fail(d, c, m, -EINVAL, "unknown mark 0x%x", m->u.mark.flags) - 1;
  struct cogpu_s *h = as(d, c);
  uint32_t flags = m->u.mark.flags;
  /* A process that runs CUDA and sees only some of the node's GPUs cannot
   * be restored onto another (the driver refuses any GPU mapping for it):
   * its job is never moved (docs/suspension.md, "Migration"). */
  bool nomove =
      (flags & COGPU_MARK_CUDA) && !sees_all_gpus(c->pid, &h->st->hdr);
  cogpu__ledger_lock(h);
  int rc = cogpu__ledger_mark_locked(h, flags);
  if (rc == 0 && nomove && !(h->st->slots[h->slot].flags & COGPU_MARK_NOMOVE)) {
    ledger_slot_t *me = &h->st->slots[h->slot];
    cogpu__ledger_tx_set(h, &me->flags, me->flags | COGPU_MARK_NOMOVE);
    cogpu__ledger_tx_commit(h);
  }
  cogpu__ledger_unlock(h);
  cogpu__daemon_reply(d, c, m, rc, &r);
  return 0;
}

/* The process's usage page (record.c). */
static int on_usage(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  int rc =
      cogpu__daemon_rec_usage(d, c->slot, c->gen, c->passed_fd, m->u.usage.size,
                              r.u.reply.msg, sizeof r.u.reply.msg);
  cogpu__daemon_reply(d, c, m, rc, &r);
  return 0;
}

/* cogpu run's end: the job's exit status for its record, and its report. */
static int on_job_end(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  struct cogpu_s *h = as(d, c);
  cogpu__job_report_t rep;
  cogpu__ledger_lock(h);
  cogpu__ledger_check_job(h);
  ledger_slot_t *js = &h->st->slots[h->res_slot];
  /* Only the job's own process says how it ended. */
  if (h->res_slot == h->slot)
    js->exit_status = m->u.job_end.exit_status >= 0
                          ? (uint64_t)m->u.job_end.exit_status + 1
                          : 0;
  if (m->u.job_end.flags & COGPU_JOB_END_STEP)
    cogpu__ledger_step_report(h, h->slot, &rep);
  else
    cogpu__ledger_job_report(h, h->res_slot, &rep);
  cogpu__ledger_unlock(h);
  r.u.reply.gpu = rep.gpu;
  r.u.reply.a = rep.peak;
  r.u.reply.b = rep.reserved;
  r.u.reply.c = rep.peak_after_ms;
  r.u.reply.d = rep.waited_ms;
  r.u.reply.e = rep.run_ms;
  r.u.reply.n1 = rep.suspensions;
  r.u.reply.n2 = rep.guard_failures;
  r.u.reply.ticket = rep.escaped;
  cogpu__daemon_reply(d, c, m, 0, &r);
  return 0;
}

static int on_history(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  /* The query is named by the connection's id: its answer may come after
   * the connection has gone (cogpu__daemon_history_answered). */
  int rc = cogpu__daemon_rec_query(d, c->id, c->uid, c->admin, &m->u.history,
                                   r.u.reply.msg, sizeof r.u.reply.msg);
  if (rc == 1) {
    c->hist_pending = true;
    c->hist_seq = m->seq;
    return 0;
  }
  cogpu__daemon_reply(d, c, m, rc, &r);
  return -1;
}

/* --- suspensions: `cogpu suspend`/`resume`, and the suspender's results ---
 */

/* Tell the waiting requests of a job that it was suspended. */
static void note_waiters(cogpu__daemon_t *d, uint32_t slot) {
  ledger_state_t *st = d->dh->st;
  const ledger_slot_t *sl = &st->slots[slot];
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS && d->nwaitconns; w++) {
    dconn_t *c = d->waiter_conn[w];
    const ledger_waiter_t *wt = &st->waiters[w];
    if (!c || wt->state != W_WAITING || wt->slot != slot || wt->resume)
      continue;
    cogpu__msg_t r, req;
    memset(&r, 0, sizeof r);
    cogpu__msg_init(&req, COGPU_M_WAIT, 1);
    r.u.reply.flags = COGPU_REPLY_SUSPENDED;
    r.u.reply.gpu = (int32_t)sl->susp_gpu;
    r.u.reply.a = sl->parked;
    cogpu__daemon_reply(d, c, &req, 0, &r);
  }
}

/* Answer the `cogpu suspend`/`resume` commands waiting on this job. */
static void answer_manual(cogpu__daemon_t *d, uint32_t slot, uint32_t gen,
                          int op, int rc, const char *msg, uint64_t bytes,
                          uint64_t ms, uint64_t took_ms) {
  for (dconn_t *c = d->conns; c; c = c->next) {
    if (c->kind != DC_QUERY || !c->susp_pending || c->susp_slot != slot ||
        c->susp_gen != gen || c->susp_op != op)
      continue;
    cogpu__msg_t r, req;
    memset(&r, 0, sizeof r);
    cogpu__msg_init(&req, COGPU_M_SUSPEND, 1);
    r.u.reply.a = bytes;
    r.u.reply.b = ms;
    r.u.reply.ticket = took_ms;
    if (rc)
      snprintf(r.u.reply.msg, sizeof r.u.reply.msg, "%s", msg);
    c->susp_pending = false;
    cogpu__daemon_reply(d, c, &req, rc, &r);
    cogpu__daemon_end_later(d, c);
  }
}

/* An operation the suspender has done: its result applied to the ledger,
 * and told to whoever waits for it (the job's waiting requests, the
 * `cogpu suspend`/`resume` that asked). 1 when it is to run again (o says
 * how: the same resume later, or the undo of a suspension whose job ended
 * meanwhile), 0 when it is over. */
int cogpu__daemon_susp_result(cogpu__daemon_t *d, cogpu__susp_op_t *j) {
  struct cogpu_s *h = d->dh;
  if (!h)
    return 0;
  ledger_slot_t *sl = &h->st->slots[j->slot];
  bool same = sl->state == SLOT_ACTIVE && atomic_load(&sl->gen) == j->gen;
  char sz[32], rate[48] = "";
  cogpu__fmt_size(j->bytes, sz, sizeof sz);
  double secs = (double)j->took_ns / 1e9;
  /* The copy's speed as it happened (the link, the driver, the host's
   * memory): what a parking costs on this node (docs/suspension.md). */
  if (secs >= 0.01 && j->bytes)
    snprintf(rate, sizeof rate, " (%.1f GB/s)", (double)j->bytes / secs / 1e9);
  if (j->op == LEDGER_OP_SUSPEND) {
    if (!same && j->rc == 0) {
      /* The job ended meanwhile and its processes outlived it (their
       * share became their own, booked on the GPU): put them back. */
      j->op = SUSP_OP_UNDO;
      return 1;
    }
    if (j->rc == 0)
      cogpu__log(COGPU_LOG_WARN,
                 "suspended the job of pid %d (%s, %d processes) in "
                 "%.2f s%s",
                 sl->pid, sz, j->npids, secs, rate);
    else
      cogpu__log(COGPU_LOG_WARN, "could not suspend the job of pid %d: %s",
                 sl->pid, j->msg);
    cogpu__ledger_lock(h);
    if (j->rc == 0)
      cogpu__ledger_count_copy(h, j->bytes, j->took_ns);
    cogpu__ledger_suspend_done(h, j->slot, j->gen, j->rc, j->broken,
                               j->rc ? 0 : j->took_ns);
    cogpu__ledger_unlock(h);
    if (j->rc == 0 && same)
      note_waiters(d, j->slot);
    answer_manual(d, j->slot, j->gen, LEDGER_OP_SUSPEND, j->rc, j->msg,
                  j->bytes, j->took_ns / 1000000u, j->took_ns / 1000000u);
    if (j->rc && j->broken && same)
      cogpu__susp_end_stuck(d, j->slot, j->gen, j->msg);
  } else if (j->op == LEDGER_OP_RESUME && j->rc == -EAGAIN) {
    if (!same || sl->susp != SUSP_RESUMING)
      return 0; /* the job ended while it waited */
    /* The driver does not have the room yet: try again soon (20 ms,
     * doubling to half a second), and say so at once, then every
     * minute while it lasts. */
    uint64_t now = cogpu__now_ns();
    if (!j->waiting_since_ns)
      j->waiting_since_ns = now;
    if (!j->warned_ns || now - j->warned_ns >= cogpu__ms_to_ns(60000)) {
      cogpu__log(COGPU_LOG_WARN,
                 "the resume of the job of pid %d waits for the driver: "
                 "%s",
                 sl->pid, j->msg);
      j->warned_ns = now;
    }
    unsigned ms = j->tries < 5 ? 20u << j->tries : 500u;
    j->tries++;
    j->not_before_ns = now + cogpu__ms_to_ns(ms);
    return 1;
  } else if (j->op == LEDGER_OP_RESUME && j->rc && j->broken && same &&
             sl->susp == SUSP_RESUMING &&
             j->restore_tries + 1 < SUSP_RESTORE_TRIES) {
    /* The driver refused a restore: it may be passing (an error that
     * leaves the process checkpointed); tried again at 100 ms, 400 ms. */
    cogpu__log(COGPU_LOG_WARN, "resuming the job of pid %d: %s; trying again",
               sl->pid, j->msg);
    j->not_before_ns =
        cogpu__now_ns() + cogpu__ms_to_ns(100u << (2 * j->restore_tries));
    j->restore_tries++;
    return 1;
  } else if (j->op == LEDGER_OP_RESUME && j->rc == -EXDEV) {
    /* The move to another GPU was refused before anything moved: the job
     * waits again where it was parked, and is never moved again; a
     * `cogpu resume` waiting for it is answered when it is back. */
    if (same)
      cogpu__log(COGPU_LOG_WARN,
                 "the job of pid %d cannot move to GPU %u: %s; it waits to "
                 "resume on GPU %u",
                 sl->pid, (unsigned)sl->susp_gpu, j->msg,
                 (unsigned)sl->susp_from - 1);
    cogpu__ledger_lock(h);
    cogpu__ledger_resume_done(h, j->slot, j->gen, j->rc);
    cogpu__ledger_unlock(h);
  } else if (j->op == LEDGER_OP_RESUME) {
    uint64_t away = same ? (cogpu__now_ns() - sl->susp_since_ns) : 0;
    char moved[64] = "";
    if (same && sl->susp_from)
      snprintf(moved, sizeof moved, " on GPU %u (moved from GPU %u)",
               (unsigned)sl->susp_gpu, (unsigned)sl->susp_from - 1);
    if (j->rc == 0)
      cogpu__log(COGPU_LOG_WARN,
                 "resumed the job of pid %d (%s)%s in %.2f s%s, after %.1f s "
                 "suspended",
                 sl->pid, sz, moved, secs, rate, (double)away / 1e9);
    else
      cogpu__log(COGPU_LOG_ERROR, "resuming the job of pid %d: %s", sl->pid,
                 j->msg);
    cogpu__ledger_lock(h);
    if (j->rc == 0)
      cogpu__ledger_count_copy(h, j->bytes, j->took_ns);
    cogpu__ledger_resume_done(h, j->slot, j->gen, j->rc);
    cogpu__ledger_unlock(h);
    answer_manual(d, j->slot, j->gen, LEDGER_OP_RESUME, j->rc, j->msg, j->bytes,
                  away / 1000000u, j->took_ns / 1000000u);
    if (j->rc && j->broken && same)
      cogpu__susp_end_stuck(d, j->slot, j->gen, j->msg);
  } else {
    cogpu__ledger_lock(h);
    if (same && sl->susp == SUSP_SUSPENDING)
      cogpu__ledger_suspend_done(h, j->slot, j->gen, -ECANCELED, j->broken, 0);
    cogpu__ledger_unlock(h);
    if (j->broken)
      cogpu__log(COGPU_LOG_ERROR,
                 "putting back the processes of a "
                 "suspension: %s",
                 j->msg);
  }
  return 0;
}

/* The job a request names: by a pid of any of its processes, or by job id;
 * the job's slot. */
static int64_t find_job(cogpu__daemon_t *d, const cogpu__m_suspend_t *q) {
  ledger_state_t *st = d->dh->st;
  LEDGER_FOR_SLOTS(st, s) {
    const ledger_slot_t *sl = &st->slots[s];
    if (sl->state != SLOT_ACTIVE || s == d->dh->slot)
      continue;
    /* A PID names a registration only while it is the registered
     * process's (its start time): once that process has ended, its PID
     * may be another user's process. */
    bool hit = q->pid ? sl->pid == q->pid &&
                            cogpu__proc_starttime(q->pid) == sl->starttime
                      : strcmp(sl->job_id, q->job_id) == 0 &&
                            (!sl->job || sl->job == (uint64_t)s + 1);
    if (!hit)
      continue;
    if (sl->job && sl->job != (uint64_t)s + 1 && sl->job <= LEDGER_MAX_SLOTS) {
      const ledger_slot_t *job = &st->slots[sl->job - 1];
      if (job->state == SLOT_ACTIVE && atomic_load(&job->gen) == sl->job_gen)
        return (int64_t)sl->job - 1;
    }
    return s;
  }
  return -1;
}

static int on_suspend(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *m) {
  const cogpu__m_suspend_t *q = &m->u.suspend;
  cogpu__msg_t r;
  memset(&r, 0, sizeof r);
  int64_t s = find_job(d, q);
  int rc = 0;
  if (s < 0) {
    rc = -ESRCH;
    if (q->pid)
      snprintf(r.u.reply.msg, sizeof r.u.reply.msg,
               "no process %d attached to cogpu on this node", q->pid);
    else
      snprintf(r.u.reply.msg, sizeof r.u.reply.msg, "no job '%s' on this node",
               q->job_id);
  } else if (d->dh->st->slots[s].uid != c->uid && c->uid != 0 && !c->admin) {
    rc = -EPERM;
    snprintf(r.u.reply.msg, sizeof r.u.reply.msg,
             "the job of pid %d belongs to another user",
             d->dh->st->slots[s].pid);
  } else if (!d->susp) {
    rc = -ENOTSUP;
    snprintf(r.u.reply.msg, sizeof r.u.reply.msg,
             "this daemon cannot suspend jobs");
  }
  if (rc) {
    cogpu__daemon_reply(d, c, m, rc, &r);
    return -1;
  }
  struct cogpu_s *h = d->dh;
  ledger_slot_t *sl = &h->st->slots[s];
  char why[256];
  cogpu__ledger_lock(h);
  if (q->resume)
    rc = cogpu__ledger_resume_ask(h, (uint32_t)s, why, sizeof why);
  else
    rc = cogpu__ledger_suspend_begin(h, (uint32_t)s, true, why, sizeof why);
  cogpu__ledger_unlock(h);
  if (rc) {
    snprintf(r.u.reply.msg, sizeof r.u.reply.msg,
             "cannot %s the job of pid "
             "%d: %s",
             q->resume ? "resume" : "suspend", sl->pid, why);
    cogpu__daemon_reply(d, c, m, rc, &r);
    return -1;
  }
  /* Answered when its operation is done (cogpu__daemon_susp_result); the
   * loop hands the operation the ledger queued to the suspender. */
  c->susp_pending = true;
  c->susp_slot = (uint32_t)s;
  c->susp_gen = atomic_load(&sl->gen);
  c->susp_op = q->resume ? LEDGER_OP_RESUME : LEDGER_OP_SUSPEND;
  return 0;
}

/* The history writer answered: each answer goes to its connection if that
 * is still there (a client that gave up is not waited for). */
void cogpu__daemon_history_answered(cogpu__daemon_t *d) {
  for (cogpu__rec_answer_t *q = cogpu__daemon_rec_take(d), *next; q; q = next) {
    next = q->next;
    dconn_t *c = d->conns;
    while (c && (c->id != q->tag || !c->hist_pending || c->dead))
      c = c->next;
    if (c) {
      cogpu__msg_t r;
      memset(&r, 0, sizeof r);
      snprintf(r.u.reply.msg, sizeof r.u.reply.msg, "%s", q->msg);
      c->hist_pending = false;
      cogpu__daemon_reply_fd(d, c, c->hist_seq, q->rc, &r, q->fd);
      cogpu__daemon_end_later(d, c);
    }
    cogpu__daemon_rec_answer_free(q);
  }
}

/* --- dispatch ---------------------------------------------------------------
 */

int cogpu__daemon_handle(cogpu__daemon_t *d, dconn_t *c, const void *buf,
                         size_t len) {
  cogpu__msg_t m;
  char why[96];
  if (len != sizeof m || d->failed)
    return -1;
  memcpy(&m, buf, sizeof m);
  int crc = cogpu__msg_check(&m, len, why, sizeof why);
  if (crc == -EPROTONOSUPPORT && !c->version) {
    /* A client of another release: told what this daemon speaks, in the
     * layout every version reads, so that it can say what to upgrade. */
    cogpu__log(COGPU_LOG_WARN,
               "client pid %d (uid %u) speaks node protocol %u; this cogpud "
               "(cogpu %s) accepts %u to %u: refused",
               (int)c->pid, (unsigned)c->uid, (unsigned)m.version,
               COGPU_VERSION_STRING, COGPU_PROTO_VERSION_MIN,
               COGPU_PROTO_VERSION);
    cogpu__msg_t r;
    cogpu__msg_refusal(&r, &m);
    cogpu__daemon_send(d, c, &r, -1);
    return -1;
  }
  if (crc == 0 && c->version && m.version != c->version) {
    snprintf(why, sizeof why, "protocol version %u after %u",
             (unsigned)m.version, (unsigned)c->version);
    crc = -EPROTO;
  }
  if (crc != 0) {
    cogpu__log(COGPU_LOG_INFO, "client pid %d (uid %u): %s: disconnected",
               (int)c->pid, (unsigned)c->uid, why);
    return -1;
  }
  c->version = m.version;
  cogpu__msg_to_current(&m);
  int rc = cogpu__daemon_ensure_state(d);
  if (rc != 0) {
    /* No GPUs discovered yet: every request gets the reason. */
    cogpu__msg_t r;
    memset(&r, 0, sizeof r);
    int err = rc;
    snprintf(r.u.reply.msg, sizeof r.u.reply.msg, "%s", cogpu_last_error());
    cogpu__daemon_reply(d, c, &m, err, &r);
    return -1;
  }
  switch (c->kind) {
  case DC_NEW:
    switch (m.type) {
    case COGPU_M_ATTACH:
      rc = on_attach(d, c, &m);
      break;
    case COGPU_M_RESUME:
      rc = on_resume(d, c, &m);
      break;
    case COGPU_M_WAIT:
      rc = on_wait(d, c, &m);
      break;
    case COGPU_M_STATUS:
      c->kind = DC_QUERY;
      rc = on_status(d, c, &m);
      break;
    case COGPU_M_RESET:
      c->kind = DC_QUERY;
      rc = on_reset(d, c, &m);
      break;
    case COGPU_M_SUSPEND:
      c->kind = DC_QUERY;
      rc = on_suspend(d, c, &m);
      break;
    case COGPU_M_HISTORY:
      c->kind = DC_QUERY;
      rc = on_history(d, c, &m);
      break;
    default:
      rc = -1;
    }
    break;
  case DC_MAIN:
    if (m.type == COGPU_M_RELEASE || m.type == COGPU_M_CLAIM ||
        m.type == COGPU_M_UNCLAIM || m.type == COGPU_M_ROOM ||
        m.type == COGPU_M_RECHECK || m.type == COGPU_M_HELD)
      m.u.amount.gpu = gpu_in(d, c, m.u.amount.gpu);
    switch (m.type) {
    case COGPU_M_RESERVE:
      rc = on_reserve(d, c, &m);
      break;
    case COGPU_M_RELEASE:
      rc = on_release(d, c, &m);
      break;
    case COGPU_M_CLAIM:
    case COGPU_M_UNCLAIM:
      rc = on_claim(d, c, &m, m.type == COGPU_M_UNCLAIM);
      break;
    case COGPU_M_ROOM:
    case COGPU_M_RECHECK:
    case COGPU_M_HELD:
      rc = on_query_amount(d, c, &m);
      break;
    case COGPU_M_FIND_JOB:
      rc = on_find_job(d, c, &m);
      break;
    case COGPU_M_STATUS:
      rc = on_status(d, c, &m);
      break;
    case COGPU_M_MARK:
      rc = on_mark(d, c, &m);
      break;
    case COGPU_M_USAGE:
      rc = on_usage(d, c, &m);
      break;
    case COGPU_M_JOB_END:
      rc = on_job_end(d, c, &m);
      break;
    case COGPU_M_DETACH:
      /* No reply: the client waits for the close (node/client.c). */
      c->detached = true;
      c->closing = true;
      rc = 0;
      break;
    default:
      rc = -1;
    }
    break;
  case DC_WAIT:
    rc = m.type == COGPU_M_ACK ? on_ack(d, c) : -1;
    break;
  default:
    rc = -1;
  }
  if (!d->dh)
    return -1; /* a reset made no new state: nothing more to do here */
  cogpu__daemon_answer_waiters(d);
  drop_orphaned_waits(d);
  return rc < 0 || c->closing ? -1 : 0;
}

/* --- closing
 * ------------------------------------------------------------------ */

/* A MAIN connection closed without DETACH while its process lives (its
 * watcher has not fired) and its slot holds memory: the process is
 * exiting (the kernel closes its descriptors one by one, the driver's
 * after ours or not; PyTorch frees its cache at the driver's teardown, not
 * before), or it closed the descriptor itself. Its memory is in use until
 * the driver frees it: the slot keeps it, watched by the pidfd, and is
 * freed when the process has gone (ledger_slot_t.leaving). True if so. */
static bool keep_leaving(cogpu__daemon_t *d, dconn_t *c) {
  ledger_state_t *st = d->dh->st;
  ledger_slot_t *sl = &st->slots[c->slot];
  dconn_t *w = c->watch;
  if (c->kind != DC_MAIN || c->detached || !w || w->dead ||
      d->slot_conn[c->slot] != c || sl->state != SLOT_ACTIVE ||
      atomic_load(&sl->gen) != c->gen || !cogpu__ledger_slot_holds(st, c->slot))
    return false;
  struct cogpu_s *h = as(d, c);
  w->watch = NULL;
  c->watch = NULL;
  d->slot_conn[c->slot] = w;
  cogpu__ledger_lock(h);
  cogpu__ledger_slot_leave(h, c->slot);
  cogpu__ledger_serve(h);
  cogpu__ledger_unlock(h);
  cogpu__log(COGPU_LOG_INFO,
             "client pid %d closed its connection holding memory: its slot "
             "%u keeps it until the process has gone",
             (int)c->pid, c->slot);
  return true;
}

void cogpu__daemon_close(cogpu__daemon_t *d, dconn_t *c) {
  if (!d->dh)
    return;
  ledger_state_t *st = d->dh->st;
  if (keep_leaving(d, c)) {
    cogpu__daemon_answer_waiters(d);
    drop_orphaned_waits(d);
    return;
  }
  if (c->watch) {
    /* A MAIN connection's watcher, or a watcher's MAIN connection: the
     * other ends with it (a watcher fired unlinks itself first). */
    c->watch->watch = NULL;
    cogpu__daemon_end_later(d, c->watch);
    c->watch = NULL;
  }
  if (c->kind == DC_MAIN || c->kind == DC_PIDFD) {
    if (d->slot_conn[c->slot] == c) {
      d->slot_conn[c->slot] = NULL;
      struct cogpu_s *h = as(d, c);
      ledger_slot_t *sl = &st->slots[c->slot];
      if (sl->state == SLOT_ACTIVE && atomic_load(&sl->gen) == c->gen) {
        cogpu__ledger_lock(h);
        cogpu__ledger_slot_free(h, c->slot);
        cogpu__ledger_serve(h);
        cogpu__ledger_unlock(h);
      }
      cogpu__daemon_rec_drop(d, c->slot);
    }
  } else if (c->kind == DC_WAIT) {
    struct cogpu_s *h = as(d, c);
    ledger_slot_t *sl = &st->slots[c->slot];
    bool live = sl->state == SLOT_ACTIVE && atomic_load(&sl->gen) == c->gen;
    cogpu__ledger_lock(h);
    if (c->waiter >= 0 && d->waiter_conn[c->waiter] == c) {
      set_waiter_conn(d, (uint32_t)c->waiter, NULL);
      ledger_waiter_t *wt = &st->waiters[c->waiter];
      /* The client set its deadline a moment before the daemon did (the
       * message's way here): a close within this slack of the daemon's
       * is its timeout. */
      uint64_t slack = cogpu__ms_to_ns(250);
      bool timed_out = c->wait_deadline_ns != UINT64_MAX &&
                       cogpu__now_ns() + slack >= c->wait_deadline_ns;
      if (wt->state != W_FREE && wt->ticket == c->ticket)
        cogpu__ledger_dequeue_as(h, (uint32_t)c->waiter,
                                 timed_out ? COGPU_ADMIT_TIMEOUT
                                           : COGPU_ADMIT_CANCELLED);
    }
    /* A grant the client never acknowledged: it gave up (its own timeout)
     * before it saw it, so the memory is not its. */
    if (c->grant_pending && live) {
      cogpu__ledger_check_job(h);
      if (c->grant_bytes)
        cogpu__ledger_release_locked(
            h, c->grant_gpu,
            c->grant_bytes <= st->slots[h->res_slot].held[c->grant_gpu]
                ? c->grant_bytes
                : st->slots[h->res_slot].held[c->grant_gpu]);
      if (c->grant_excl)
        cogpu__ledger_end_exclusive(h, c->grant_gpu);
    }
    cogpu__ledger_serve(h);
    cogpu__ledger_unlock(h);
  }
  cogpu__daemon_answer_waiters(d);
  drop_orphaned_waits(d);
}

/* --- invariants
 * ---------------------------------------------------------------- */

int cogpu__daemon_check(cogpu__daemon_t *d, char *why, size_t len) {
  if (!d->dh)
    return 0;
  /* The ledger's own invariants, and the daemon's: every main connection
   * names an active slot of its generation. */
  int rc = cogpu__ledger_invariants(d->dh, why, len);
  if (rc)
    return rc;
  ledger_state_t *st = d->dh->st;
  LEDGER_FOR_SLOTS(st, s) {
    const dconn_t *c = d->slot_conn[s];
    if (c && c->kind == DC_MAIN &&
        (st->slots[s].state != SLOT_ACTIVE ||
         atomic_load(&st->slots[s].gen) != c->gen))
      return snprintf(why, len, "connection of slot %u outlived its slot", s);
  }
  return 0;
}
