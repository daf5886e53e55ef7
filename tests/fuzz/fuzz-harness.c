/*
 * fuzz-harness.c: cogpud's message handler driven as a function
 * (fuzz-harness.h). The fake connections live on the daemon's own list, as
 * accepted ones do, so that a RESET frees them the way it frees real ones;
 * the harness notices and replaces those that went.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon-int.h"
#include "fuzz-harness.h"

static cogpu__daemon_t fz_d;
static dconn_t *fz_conn[FZ_CONNS];
static fz_stats_t fz_st;
static char fz_why[256];

/* The users behind the connections: root (an admin), two connections of
 * each of two users, and a third user. */
static const uid_t fz_uid[FZ_CONNS] = {0, 1000, 1000, 1001, 1001, 1002};

#define FZ_MAX_CLIENTS 3
#define FZ_MAX_WAITERS 2

static dconn_t *fz_new_conn(int i) {
  dconn_t *c = cogpu__conn_new(&fz_d, -1, DC_NEW);
  if (!c)
    abort();
  c->pid = getpid();
  c->uid = fz_uid[i];
  c->gid = fz_uid[i];
  c->admin = fz_uid[i] == 0;
  return c;
}

/* Ends a connection as the daemon's loop does: what it held goes at
 * once, its record at the reap. */
static void fz_free_conn(dconn_t *c) {
  cogpu__daemon_end_later(&fz_d, c);
  cogpu__daemon_reap(&fz_d);
}

static bool fz_listed(const dconn_t *c) {
  for (const dconn_t *x = fz_d.conns; x; x = x->next)
    if (x == c)
      return true;
  return false;
}

int fz_init(const char *dir, const char **why) {
  cogpu__config_t cfg;
  *why = fz_why;
  mkdir(dir, 0700);
  /* Through the environment, not cogpu__config_set: a RESET reloads the
   * configuration, and must find the same directory and limits (never the
   * directory of a daemon the machine or the test suite runs). */
  char n[16];
  setenv("COGPU_DAEMON_DIR", dir, 1);
  snprintf(n, sizeof n, "%d", FZ_MAX_CLIENTS);
  setenv("COGPU_USER_MAX_CLIENTS", n, 1);
  snprintf(n, sizeof n, "%d", FZ_MAX_WAITERS);
  setenv("COGPU_USER_MAX_WAITERS", n, 1);
  setenv("COGPU_ADMIN_GROUP", "", 1);
  int rc = cogpu__config_load(&cfg);
  if (rc == 0)
    rc = cogpu__daemon_init(&fz_d, &cfg, true);
  if (rc) {
    snprintf(fz_why, sizeof fz_why, "%s", cogpu_last_error());
    return rc;
  }
  for (int i = 0; i < FZ_CONNS; i++)
    fz_conn[i] = fz_new_conn(i);
  return 0;
}

void fz_reset(void) {
  for (int i = 0; i < FZ_CONNS; i++) {
    if (fz_listed(fz_conn[i]))
      fz_free_conn(fz_conn[i]);
    fz_conn[i] = fz_new_conn(i);
  }
}

void fz_fini(void) {
  while (fz_d.conns)
    fz_free_conn(fz_d.conns);
  cogpu__daemon_fini(&fz_d);
}

const fz_stats_t *fz_stats(void) {
  return &fz_st;
}

/* Patches the identity of a live slot into WAIT or RESUME. */
static void fz_patch(cogpu__msg_t *m) {
  cogpu__m_resume_t *who = m->type == COGPU_M_WAIT     ? &m->u.wait.who
                           : m->type == COGPU_M_RESUME ? &m->u.resume
                                                       : NULL;
  if (!who || !(m->seq & 0x80000000u))
    return;
  ledger_state_t *st = fz_d.dh->st;
  uint32_t live[8], n = 0;
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS && n < 8; s++)
    if (st->slots[s].state == SLOT_ACTIVE && s != fz_d.dh->slot)
      live[n++] = s;
  if (n == 0)
    return;
  uint32_t s = live[((m->seq >> 8) & 0xff) % n];
  const ledger_slot_t *sl = &st->slots[s];
  who->slot = s;
  who->gen = atomic_load(&sl->gen);
  who->secret[0] = sl->secret[0];
  who->secret[1] = sl->secret[1];
}

static uint32_t fz_user_slots(uid_t uid) {
  ledger_state_t *st = fz_d.dh->st;
  uint32_t n = 0;
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++)
    n += st->slots[s].state == SLOT_ACTIVE && s != fz_d.dh->slot &&
         st->slots[s].uid == uid;
  return n;
}

static uint32_t fz_user_waiters(uid_t uid) {
  ledger_state_t *st = fz_d.dh->st;
  uint32_t n = 0;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++) {
    const ledger_waiter_t *wt = &st->waiters[w];
    n += wt->state != W_FREE && wt->owner < LEDGER_MAX_SLOTS &&
         st->slots[wt->owner].uid == uid;
  }
  return n;
}

/* Invariants beyond the ledger's own (cogpu__daemon_check), and what the
 * authorisation rules promise about the message just handled on c (from a
 * connection of kind `before`). */
static int fz_check(const dconn_t *c, int before, const cogpu__msg_t *m,
                    int rc) {
  cogpu__daemon_t *d = &fz_d;
  if (cogpu__daemon_check(d, fz_why, sizeof fz_why))
    return -1;
  ledger_state_t *st = d->dh->st;
  for (int i = 0; i < FZ_CONNS; i++) {
    const dconn_t *x = fz_conn[i];
    if (x->kind == DC_MAIN && d->slot_conn[x->slot] != x) {
      snprintf(fz_why, sizeof fz_why, "connection %d lost its slot %u", i,
               x->slot);
      return -1;
    }
  }
  if (rc != 0 || c->admin || before != DC_NEW)
    return 0;
  if (m->type == COGPU_M_ATTACH && c->kind == DC_MAIN) {
    const ledger_slot_t *sl = &st->slots[c->slot];
    long cap = d->cfg.v[COGPU_OPT_PRIORITY_CAP].i;
    if (sl->uid != c->uid)
      return snprintf(fz_why, sizeof fz_why, "uid %u attached as uid %u",
                      (unsigned)c->uid, sl->uid),
             -1;
    if (sl->priority > cap)
      return snprintf(fz_why, sizeof fz_why, "uid %u has priority %d > %ld",
                      (unsigned)c->uid, sl->priority, cap),
             -1;
    if (fz_user_slots(c->uid) > FZ_MAX_CLIENTS)
      return snprintf(fz_why, sizeof fz_why, "uid %u has %u slots",
                      (unsigned)c->uid, fz_user_slots(c->uid)),
             -1;
    if (c->res_slot != c->slot && st->slots[c->res_slot].uid != c->uid)
      return snprintf(fz_why, sizeof fz_why, "uid %u joined slot %u of uid %u",
                      (unsigned)c->uid, c->res_slot,
                      st->slots[c->res_slot].uid),
             -1;
  }
  if ((m->type == COGPU_M_WAIT || m->type == COGPU_M_RESUME) &&
      c->kind != DC_NEW && st->slots[c->slot].uid != c->uid)
    return snprintf(fz_why, sizeof fz_why, "uid %u took over slot %u of uid %u",
                    (unsigned)c->uid, c->slot, st->slots[c->slot].uid),
           -1;
  if (m->type == COGPU_M_WAIT && c->kind == DC_WAIT &&
      fz_user_waiters(c->uid) > FZ_MAX_WAITERS)
    return snprintf(fz_why, sizeof fz_why, "uid %u has %u waiters",
                    (unsigned)c->uid, fz_user_waiters(c->uid)),
           -1;
  return 0;
}

int fz_feed(const uint8_t *buf, size_t len, const char **why) {
  *why = fz_why;
  for (size_t off = 0; off + COGPU_MSG_SIZE <= len; off += COGPU_MSG_SIZE) {
    cogpu__msg_t m;
    memcpy(&m, buf + off, sizeof m);
    int i = (int)((m.seq & 0xff) % FZ_CONNS);
    fz_patch(&m);
    dconn_t *c = fz_conn[i];
    int before = c->kind;
    fz_st.msgs++;
    int rc = cogpu__daemon_handle(&fz_d, c, &m, sizeof m);
    /* A RESET ends every main and wait connection, as it does real ones;
     * their records go when the daemon's loop would free them. */
    if (c->dead)
      c->closing = false; /* the harness frees the asker's own record */
    cogpu__daemon_reap(&fz_d);
    bool gone = false;
    for (int k = 0; k < FZ_CONNS; k++)
      if (!fz_listed(fz_conn[k])) {
        fz_conn[k] = fz_new_conn(k);
        gone |= k == i;
      }
    if (gone)
      continue;
    c = fz_conn[i];
    if (rc == 0 && c->version != m.version) {
      snprintf(fz_why, sizeof fz_why,
               "a message of version %u was served on a connection of %u",
               (unsigned)m.version, (unsigned)c->version);
      return -1;
    }
    if (rc == 0) {
      fz_st.accepted++;
      fz_st.old_accepted += m.version == COGPU_PROTO_VERSION_MIN;
      fz_st.attached += before == DC_NEW && c->kind == DC_MAIN;
      fz_st.reserved_ok += m.type == COGPU_M_RESERVE;
    }
    if (fz_check(c, before, &m, rc) != 0)
      return -1;
    if (rc != 0) {
      fz_st.closed++;
      fz_free_conn(c);
      fz_conn[i] = fz_new_conn(i);
      if (fz_check(fz_conn[i], DC_NEW, &m, -1) != 0)
        return -1;
    }
  }
  return 0;
}

static uint64_t fz_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

void fz_version(cogpu__msg_t *m) {
  int i = (int)((m->seq & 0xff) % FZ_CONNS);
  m->version = i % 2 ? COGPU_PROTO_VERSION_MIN : COGPU_PROTO_VERSION;
}

void fz_make(cogpu__msg_t *m, int t, uint64_t *rnd) {
  static const uint64_t sizes[] = {0,           1,          1 << 20,
                                   1ull << 30,  4ull << 30, 15ull << 30,
                                   16ull << 30, UINT64_MAX};
  cogpu__msg_init(m, t, (uint32_t)fz_rand(rnd));
  uint64_t r = fz_rand(rnd);
  fz_version(m);
  if ((r >> 52) % 97 == 1) /* now and then a version cogpud refuses */
    m->version =
        (r >> 51) % 2 ? COGPU_PROTO_VERSION + 1 : COGPU_PROTO_VERSION_MIN - 1;
  int gpu = r % 8 == 0 ? (int)(r >> 8) % 3 - 1 : 0; /* -1 is GPU_AUTO */
  uint64_t bytes = sizes[(r >> 16) % 8];
  switch (t) {
  case COGPU_M_ATTACH:
    m->u.attach.priority = (int32_t)((r >> 8) % 2001) - 1000;
    snprintf(m->u.attach.command, sizeof m->u.attach.command, "fuzz %u",
             (unsigned)(r >> 32));
    snprintf(m->u.attach.job_id, sizeof m->u.attach.job_id, "J%u",
             (unsigned)(r >> 40) % 4);
    if (r % 4 == 0)
      snprintf(m->u.attach.join, sizeof m->u.attach.join, "%u.%u",
               (unsigned)(r >> 24) % 8, (unsigned)(r >> 48) % 8);
    if (r % 16 == 1) {
      m->u.attach.flags = COGPU_ATTACH_FOR_UID;
      m->u.attach.for_uid = 1000 + (uint32_t)(r >> 20) % 3;
    }
    break;
  case COGPU_M_RESERVE:
  case COGPU_M_WAIT: {
    cogpu__m_reserve_t *q = t == COGPU_M_WAIT ? &m->u.wait.req : &m->u.reserve;
    q->gpu = gpu;
    q->bytes = bytes ? bytes : 1;
    q->flags = r % 11 == 0 ? COGPU_REQ_EXCLUSIVE : 0;
    q->priority =
        r % 3 == 0 ? COGPU_PRIORITY_DEFAULT : (int32_t)(r >> 33) % 2000;
    q->timeout_ms = (int64_t)(r >> 40) % 3 - 1;
    if (t == COGPU_M_WAIT) {
      m->seq |= 0x80000000u; /* a live slot's identity, patched in */
      if (r % 5 == 0) {
        m->u.wait.prev_waiter = (uint32_t)(r >> 12) % 8;
        m->u.wait.prev_ticket = (r >> 20) % 8;
      }
    }
    break;
  }
  case COGPU_M_RESUME:
    m->seq |= 0x80000000u;
    m->u.resume.res_slot = (uint32_t)(r >> 8) % 8;
    m->u.resume.res_gen = (uint32_t)(r >> 16) % 8;
    break;
  case COGPU_M_RELEASE:
  case COGPU_M_CLAIM:
  case COGPU_M_UNCLAIM:
  case COGPU_M_ROOM:
  case COGPU_M_RECHECK:
  case COGPU_M_HELD:
    m->u.amount.gpu = gpu < 0 ? 0 : gpu;
    m->u.amount.bytes = bytes;
    break;
  case COGPU_M_FIND_JOB:
    snprintf(m->u.find_job.job_id, sizeof m->u.find_job.job_id, "J%u",
             (unsigned)(r >> 40) % 4);
    break;
  case COGPU_M_RESET:
    m->u.reset.force = (uint32_t)(r >> 8) % 2;
    break;
  default:
    break;
  }
}
