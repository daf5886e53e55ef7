/*
 * daemon-int.h: cogpud, the node daemon: the one writer of the node's
 * ledger (a root-only file under daemon_dir), serving clients over a Unix
 * socket (src/node/proto.h). One thread writes the ledger: an epoll loop
 * over the listening socket, client connections, a timer, the services'
 * eventfds and, after a restart, the pidfds of clients that have not
 * reconnected yet. It never blocks on a client: sockets are non-blocking,
 * and a client that does not read its replies is disconnected.
 *
 * The daemon is in layers; each calls only those below it:
 *
 *   daemon.c   the loop: epoll, the timer, the node state's life, and the
 *              queue of suspension operations (at most one per job)
 *   handle.c   the dispatch: a message validated, authorised, acted on
 *              with the ledger's functions; work handed to the services,
 *              and their results turned into replies
 *   suspend.c  the services: they take work and hand back results, and
 *   record.c   answer no client (no dconn_t, no reply)
 *   state.c    the node state's life: opened, opened late, reset
 *   conn.c     the connections: accept, receive, send, end
 *
 * conn.c hands a received message and a connection's end up through the
 * two calls the loop gives it (on_message, on_close): it knows no layer
 * above it. The services call neither conn.c nor handle.c nor the loop
 * (record.c tells the suspender the peaks of ended jobs, one service to
 * another, on the loop's thread); the suspender's thread never touches
 * the ledger.
 */
#ifndef COGPU_DAEMON_INT_H
#define COGPU_DAEMON_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "internal.h"
#include "ledger/ledger-int.h"
#include "node/proto.h"

enum dconn_kind { DC_NEW = 0, DC_MAIN, DC_WAIT, DC_QUERY, DC_PIDFD };

/* How often one connection's RECHECK (a client whose allocation the
 * driver refused) may make the daemon read NVML (handle.c). */
#define RECHECK_EVERY_MS 20u

typedef struct dconn_s {
  int fd;
  int kind; /* enum dconn_kind */
  /* The protocol version of its first message (0: none yet): its other
   * messages must carry the same, and every answer is in its layout. */
  uint16_t version;
  pid_t pid;
  uid_t uid;
  gid_t gid;
  bool admin;
  /* MAIN: the client's slot and the job its reservations go to. WAIT: the
   * same, of the process that waits. PIDFD: the orphaned slot watched. */
  uint32_t slot, gen, res_slot, res_gen;
  int priority;
  uint64_t recheck_ms; /* MAIN: when its last RECHECK read NVML */
  /* WAIT: the queue entry (-1 none) and a grant sent but not yet
   * acknowledged, taken back if the connection closes first. */
  int64_t waiter;
  uint64_t ticket;
  uint32_t op_seq; /* the request's id (its WAIT's seq), recorded at grant */
  /* When the client's own bound runs out (monotonic ns; UINT64_MAX none):
   * a wait connection closed about then ended in a timeout, one closed
   * earlier was cancelled (the counters tell them apart). */
  uint64_t wait_deadline_ns;
  bool grant_pending;
  int grant_gpu;
  uint64_t grant_bytes;
  bool grant_excl;
  /* QUERY: a `cogpu suspend`/`resume` answered when the job's op is done. */
  bool susp_pending;
  uint32_t susp_slot, susp_gen;
  int susp_op;
  /* QUERY: a `cogpu history` answered when the history writer has run it
   * (record.c); `id` names the connection to that answer, which may come
   * after the connection has gone. */
  bool hist_pending;
  uint32_t hist_seq; /* the HISTORY request's sequence number */
  uint64_t id;
  int passed_fd; /* a descriptor that came with the message (-1: none) */
  bool counted;  /* in its user's count of connections (admins: not) */
  bool closing;  /* to be ended after this batch of events */
  /* MAIN: the client said it detaches (DETACH): its memory is given back
   * at the close, not kept until its process has gone. */
  bool detached;
  bool dead;        /* ended: its record is freed after this batch */
  bool reap_listed; /* on the daemon's reap list */
  /* MAIN: the PIDFD connection watching its process (NULL: none); that
   * PIDFD connection: the MAIN one it watches for. A registration lasts as
   * long as the process that made it: its connection handed to another
   * process (SCM_RIGHTS, a child made without fork's handlers) no longer
   * holds it once that process has exited, so that its PID, free for
   * anyone's next process, names nothing (issue 23). */
  struct dconn_s *watch;
  struct dconn_s *prev, *next; /* every connection, for reset and exit */
  struct dconn_s *reap_next;   /* the reap list: closing or dead ones */
} dconn_t;

/* A user's connections (daemon.c), for the per-user cap. */
typedef struct duser_s {
  uid_t uid;
  uint32_t conns;
  bool used; /* the entry names a uid */
  bool said; /* a refusal was logged: not again until well under the cap */
} duser_t;

typedef struct cogpu__susp_s cogpu__susp_t;
typedef struct cogpu__susp_op_s cogpu__susp_op_t;

/* An operation of the loop's queue (daemon.c): handed to the suspender,
 * its result not final yet. At most one per job: slot and generation of
 * the state opened epoch-th (a reset opens a new one, whose generations
 * start anew). */
typedef struct dop_s {
  uint64_t id;
  uint32_t slot, gen;
  int op;
  uint32_t epoch;
  struct dop_s *next;
} dop_t;
struct cogpu__drec_s;

typedef struct cogpu__daemon_s {
  cogpu__config_t cfg;
  cogpu__susp_t *susp;       /* suspend.c; NULL when fuzzing */
  dop_t *ops;                /* the operation queue (daemon.c) */
  uint64_t next_op_id;       /* dop_t.id */
  uint32_t state_epoch;      /* states opened so far (dop_t.epoch) */
  struct cogpu__drec_s *rec; /* record.c: usage pages and job history */
  struct cogpu_s *dh;        /* the daemon's own attachment to its state */
  struct cogpu_s proxy;      /* acts for one client at a time */
  int epfd, lfd, tfd;
  uint64_t next_conn_id; /* dconn_t.id */
  bool lfd_owned;        /* created here (unlink at exit), not from systemd */
  bool activated;        /* the socket came from systemd (sd_listen_fds) */
  /* The socket this daemon bound: removed at exit only if still there. */
  dev_t sock_dev;
  ino_t sock_ino;
  /* Held for the daemon's whole life (lockfile.c): one daemon per
   * daemon_dir and per socket; -1 when not taken. */
  int dir_lock_fd, sock_lock_fd;
  gid_t admin_gid;
  bool have_admin_group;
  dconn_t **slot_conn;   /* LEDGER_MAX_SLOTS: MAIN connection per slot */
  dconn_t **waiter_conn; /* LEDGER_MAX_WAITERS: WAIT connection */
  /* After a restart: waiters whose client has not come back by then are
   * dropped (ms on the monotonic clock, 0 when none). */
  uint64_t rebind_deadline_ms;
  /* Kept so that the loop's per-message work does not grow with the
   * node's size: wait connections in waiter_conn, the connections to be
   * ended or freed after this batch (cogpu__daemon_end_later), whether slots
   * may be without a connection (known only after a scan: due when the state
   * was opened or recovered and after each tick), the timer's period now
   * (ms, 0: disarmed), and the tick's own period (0: none due) and when it
   * is next due (monotonic ms): the timer may fire more often than the
   * tick, to sample the jobs' memory (record.c). */
  uint32_t nwaitconns;
  dconn_t *reap_list;
  bool orphans_dirty, orphans;
  uint64_t timer_ms;
  uint64_t tick_ms, next_tick_ms;
  uint64_t nconns;
  dconn_t *conns;
  /* Connections per user who is not an admin: open addressing by uid
   * (users_cap a power of two, at most half full); an entry stays once
   * made, so the table grows with the users the node has, not with their
   * connections. */
  duser_t *users;
  uint32_t users_cap, users_used;
  /* Out of descriptors (or another accept error): the listening socket
   * is not polled until a connection ends or until accept_retry_ms
   * (monotonic ms), so a socket that stays readable cannot spin the loop;
   * fd_short until an accept succeeds again (said once per episode). */
  bool accept_paused, fd_short;
  uint64_t accept_retry_ms;
  /* What the ledger's code is given to run as the daemon's (its hooks,
   * its wake list): the ledger keeps no globals. */
  ledger_host_t host;
  /* The connection whose message is being handled (NULL between them),
   * and the deadlock guard's hooks that ask about it (daemon.c). */
  const dconn_t *handling;
  ledger_guard_hooks_t guard_hooks;
  /* What the connections hand up (conn.c knows nothing above it): a
   * message received on c (0, or -1: c is to end), and c's end. Set by
   * the loop: the dispatch's, then the operations the ledger decided. */
  int (*on_message)(struct cogpu__daemon_s *d, dconn_t *c, const void *buf,
                    size_t len);
  void (*on_close)(struct cogpu__daemon_s *d, dconn_t *c);
  bool stop;
  bool failed; /* stopped because it cannot keep a ledger: exit 1 */
  bool fuzz;   /* no sockets: replies are dropped (fuzzing, tests) */
} cogpu__daemon_t;

/* --- conn.c: connections (the bottom layer) ------------------------------
 * It calls nothing above it but d->on_message and d->on_close. */

/* Puts c on the list that cogpu__daemon_reap goes through (once). */
static inline void cogpu__daemon_reap_list(cogpu__daemon_t *d, dconn_t *c) {
  if (c->reap_listed)
    return;
  c->reap_listed = true;
  c->reap_next = d->reap_list;
  d->reap_list = c;
}

/* Marks c to be ended after this batch of events. */
static inline void cogpu__daemon_end_later(cogpu__daemon_t *d, dconn_t *c) {
  c->closing = true;
  cogpu__daemon_reap_list(d, c);
}

/* The listening socket's mark in the loop's epoll set. */
extern dconn_t cogpu__conn_listen_mark;
/* Accepts what connections wait (credentials, per-user cap), and polls
 * the listening socket again after a pause (out of descriptors). */
void cogpu__conn_accept(cogpu__daemon_t *d);
void cogpu__conn_accept_resume(cogpu__daemon_t *d);
/* Reads c's messages (and its pidfd's exit), each handed to on_message. */
void cogpu__conn_readable(cogpu__daemon_t *d, dconn_t *c, uint32_t events);
/* A PIDFD connection watching process pid of slot (generation gen), which
 * owns pfd from here; NULL (pfd closed) if it cannot be made. */
dconn_t *cogpu__conn_pidfd(cogpu__daemon_t *d, int pfd, pid_t pid, uid_t uid,
                           uint32_t slot, uint32_t gen);
/* Watches the process of MAIN connection c (its slot's PID and start
 * time) through a pidfd: when it exits, c is ended (see dconn_t.watch).
 * Without pidfds (kernel < 5.3), nothing: its connection alone holds it. */
void cogpu__daemon_watch_process(cogpu__daemon_t *d, dconn_t *c);
/* A connection of kind on fd (-1: none), listed; NULL when out of memory. */
dconn_t *cogpu__conn_new(cogpu__daemon_t *d, int fd, int kind);
/* Ends c now: on_close frees what it held; its record goes at the reap. */
void cogpu__conn_end(cogpu__daemon_t *d, dconn_t *c);
/* Frees the records of connections that ended during a batch of events
 * (a reset ends every client's), and ends those marked closing. */
void cogpu__daemon_reap(cogpu__daemon_t *d);
/* The deadlock guard's question (ledger_guard_hooks_t, ctx the daemon):
 * is an answer to process slot s due, its request being handled now or
 * unread in its connection? */
bool cogpu__conn_answer_due(void *ctx, uint32_t s);
/* Sends msg on c, in the layout of c's version, passing passfd (-1:
 * none); a client that does not read its replies is ended. */
int cogpu__daemon_send(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *msg,
                       int passfd);
/* A reply to req on c (rc's message when r has none). */
int cogpu__daemon_reply(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *req,
                        int rc, cogpu__msg_t *r);
/* A reply to sequence number seq on c, passing fd (-1: none). */
int cogpu__daemon_reply_fd(cogpu__daemon_t *d, dconn_t *c, uint32_t seq, int rc,
                           cogpu__msg_t *r, int fd);

/* --- state.c: the node state's life (above conn.c) ----------------------- */

/* daemon_dir made if needed, and checked: the daemon's user's own, not a
 * link, writable by nobody else. */
int cogpu__daemon_check_dir(const char *dir);
/* Opens the node state if it is not open yet (at start; later when the
 * GPUs could not be discovered before). */
int cogpu__daemon_ensure_state(cogpu__daemon_t *d);
/* `cogpu reset`: forgets the node state (force: though processes are
 * attached; *live: how many were). */
int cogpu__daemon_reset(cogpu__daemon_t *d, bool force, int *live);

/* --- handle.c: the dispatch ------------------------------------------------
 * It validates, authorises and acts on one message at a time with the
 * ledger's functions, hands work to the services, and turns what they
 * hand back into replies. It calls conn.c and the services, never the
 * loop. */

/* One received message on connection c (the core that the fuzzer drives):
 * validates it, acts, replies. Returns 0, or -1 when the connection must
 * be closed (a protocol violation or a finished exchange). */
int cogpu__daemon_handle(cogpu__daemon_t *d, dconn_t *c, const void *buf,
                         size_t len);
/* A connection ended: frees what it held (slot, queue entry, grant). */
void cogpu__daemon_close(cogpu__daemon_t *d, dconn_t *c);
/* Answers the wait connections whose requests were served or refused. */
void cogpu__daemon_answer_waiters(cogpu__daemon_t *d);
/* An operation the suspender has done: applied to the ledger and told to
 * who waits for it; 1 when it is to be run again (o says how), 0 when its
 * result is final. */
int cogpu__daemon_susp_result(cogpu__daemon_t *d, cogpu__susp_op_t *o);
/* Sends the history writer's answers to the connections that asked. */
void cogpu__daemon_history_answered(cogpu__daemon_t *d);
/* Checks the ledger's invariants; returns 0 or a description's length. */
int cogpu__daemon_check(cogpu__daemon_t *d, char *why, size_t len);

/* --- daemon.c: the loop (the top) ------------------------------------------
 * It owns the epoll set, the timer, the node state's life and the queue
 * of suspension operations (one per job); it calls every layer below. */

/* Opens (or recovers) the node state and, unless fuzzing, the socket. */
int cogpu__daemon_init(cogpu__daemon_t *d, const cogpu__config_t *cfg,
                       bool fuzz);
/* Runs until SIGTERM/SIGINT (or d->stop). */
int cogpu__daemon_run(cogpu__daemon_t *d);
void cogpu__daemon_fini(cogpu__daemon_t *d);

/* --- suspend.c: the suspender (a service) ------------------------------
 * It runs the operations the loop hands it, in a thread of its own, and
 * hands each back done; it answers no client and decides nothing of the
 * ledger's (it gives the ledger its hooks: may a job be suspended, how
 * long has it been idle, what will its resume need). */

/* A suspension operation: handed to the suspender by the loop (which
 * holds at most one per job, a job being its slot and generation), and
 * handed back with its result. */
#define SUSP_OP_UNDO                                                           \
  3 /* a suspension put back: its job ended meanwhile,                         \
       or a previous daemon left it half done */
/* Restores tried before a job is given up (the last failure ends it). */
#define SUSP_RESTORE_TRIES 3u
struct cogpu__susp_op_s {
  uint64_t id; /* the loop's name for it */
  uint32_t slot, gen;
  int op; /* LEDGER_OP_SUSPEND, LEDGER_OP_RESUME or SUSP_OP_UNDO */
  int npids;
  uint64_t bytes; /* the footprint (held when the operation was handed) */
  /* When it may run again (monotonic ns), and how a resume has waited for
   * the driver to have room: since when, when it was last said, how often;
   * how many restores the driver refused. */
  uint64_t not_before_ns, waiting_since_ns, warned_ns;
  unsigned tries, restore_tries;
  /* The result. */
  int rc;
  bool broken; /* a process was left locked or checkpointed */
  uint64_t took_ns;
  char msg[256];
};

/* Starts the suspender's thread (it loads libcuda and calls cuInit) and
 * gives the ledger its hooks. */
int cogpu__susp_start(cogpu__daemon_t *d);
void cogpu__susp_stop(cogpu__daemon_t *d);
/* The eventfd the thread signals when it has done operations. */
int cogpu__susp_fd(cogpu__daemon_t *d);
/* Hands the thread operation op (named id) on job (slot, gen): its
 * processes and footprint are read from the ledger now. 0, or -ENOMEM,
 * -ENOTSUP (no suspender). */
int cogpu__susp_submit(cogpu__daemon_t *d, uint64_t id, uint32_t slot,
                       uint32_t gen, int op);
/* An operation done (NULL: none now), the caller's until it hands it back
 * to run again (cogpu__susp_again, at o->not_before_ns) or releases it. */
cogpu__susp_op_t *cogpu__susp_take(cogpu__daemon_t *d);
void cogpu__susp_again(cogpu__daemon_t *d, cogpu__susp_op_t *o);
void cogpu__susp_release(cogpu__daemon_t *d, cogpu__susp_op_t *o);
/* A job the driver cannot give back (a failed restore): its processes are
 * told why on their stderr, and killed. */
void cogpu__susp_end_stuck(cogpu__daemon_t *d, uint32_t slot, uint32_t gen,
                           const char *why);
/* Learns that a run of command by uid on a GPU of that model peaked at
 * peak bytes: what resume admission expects of the command's next jobs
 * (loop thread). */
void cogpu__susp_learn(cogpu__daemon_t *d, uint32_t uid, const char *command,
                       const char *model, uint64_t peak);
/* The suspension figures of a status snapshot (host memory, bounds). */
void cogpu__susp_status(cogpu__daemon_t *d, cogpu_status_t *st);
/* On the timer: which processes did GPU work (max_idle). */
void cogpu__susp_sample(cogpu__daemon_t *d);

/* --- record.c: usage pages and the job history --------------------------- */
/* Installs the ledger's usage hooks and starts the history writer. */
int cogpu__daemon_rec_start(cogpu__daemon_t *d);
void cogpu__daemon_rec_stop(cogpu__daemon_t *d);
/* Unmaps the usage page of a freed slot. */
void cogpu__daemon_rec_drop(cogpu__daemon_t *d, uint32_t slot);
/* Whether jobs run whose memory timelines are sampled: the loop's timer
 * then fires at least every REC_SAMPLE_MS. */
#define REC_SAMPLE_MS 1000u
bool cogpu__daemon_rec_sampling(cogpu__daemon_t *d);
/* On the timer: a sample of every running job's used bytes (at most one
 * per REC_SAMPLE_MS; never blocks: no SQLite, no system call but the
 * clock). */
void cogpu__daemon_rec_sample(cogpu__daemon_t *d);
/* Records written to the database so far. */
uint64_t cogpu__daemon_rec_written(cogpu__daemon_t *d);
/* USAGE: maps fd (a sealed memfd of size bytes, which stays the caller's)
 * as the usage page of slot (generation gen); else an error, said in msg. */
int cogpu__daemon_rec_usage(cogpu__daemon_t *d, uint32_t slot, uint32_t gen,
                            int fd, uint64_t size, char *msg, size_t len);
/* HISTORY of a user (uid; admin: may see every user's jobs): decides what
 * the user may see and hands the query to the history writer thread; 1
 * when it will be answered (an answer carrying tag, from
 * cogpu__daemon_rec_take), else an error said in msg. The loop never waits
 * for SQLite. */
int cogpu__daemon_rec_query(cogpu__daemon_t *d, uint64_t tag, uid_t uid,
                            bool admin, const cogpu__m_history_t *q, char *msg,
                            size_t len);
/* A query's answer: its records (fd, a sealed memfd, the answer's until
 * freed) or an error (rc, msg). */
typedef struct cogpu__rec_answer_s {
  struct cogpu__rec_answer_s *next;
  uint64_t tag; /* the asker's (cogpu__daemon_rec_query) */
  int rc;
  int fd;
  char msg[sizeof(((cogpu__msg_t *)0)->u.reply.msg)];
} cogpu__rec_answer_t;
/* The descriptor the loop polls for answered queries (-1: none), the
 * answers (a list, the caller's, each freed with _answer_free). */
int cogpu__daemon_rec_fd(cogpu__daemon_t *d);
cogpu__rec_answer_t *cogpu__daemon_rec_take(cogpu__daemon_t *d);
void cogpu__daemon_rec_answer_free(cogpu__rec_answer_t *a);

#endif /* COGPU_DAEMON_INT_H */
