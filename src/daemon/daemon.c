/*
 * daemon.c: cogpud's life: the node state (opened, or recovered after a
 * crash), the listening socket (from systemd, or made here), and the event
 * loop. The loop sleeps in epoll_wait; a timer is armed only while
 * something is due (waiters for the deadlock guard and the mmu age,
 * clients still to come back after a restart, systemd's watchdog, jobs
 * whose memory timelines are sampled once a second), so an idle daemon
 * uses no CPU.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/daemon-int.h"
#include "node/node.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static dconn_t mark_timer, mark_signal, mark_susp, mark_hist;
static int sigfd = -1;
static uint64_t watchdog_us;

static uint64_t now_ms(void) {
  return cogpu__now_ns() / 1000000u;
}

/* --- the operation queue ----------------------------------------------------
 * The suspensions and resumes the ledger decides (its host's list of
 * operations) are the loop's: taken after each message, each closed
 * connection and each tick, held here from the moment they are handed to
 * the suspender until their result is final, and never more than one per
 * job (slot and generation of the state now open). A second operation for
 * a job that has one is merged (the same one: it is under way) or refused:
 * the ledger never decides one (a job in SUSPENDING or RESUMING waits for
 * its operation's result), and recovery asks for one only for the jobs
 * that have none. So no job is resumed twice (issue 23, 6: recovery's
 * service pass and its scan of half-done jobs both submitted a resume). */

static dop_t *op_find(cogpu__daemon_t *d, uint32_t slot, uint32_t gen) {
  for (dop_t *o = d->ops; o; o = o->next)
    if (o->slot == slot && o->gen == gen && o->epoch == d->state_epoch)
      return o;
  return NULL;
}

/* Queues op on job (slot, gen) and hands it to the suspender; -EALREADY
 * when the job has an operation already (nothing done). */
static int op_add(cogpu__daemon_t *d, uint32_t slot, uint32_t gen, int op) {
  if (op_find(d, slot, gen))
    return -EALREADY;
  dop_t *o = calloc(1, sizeof *o);
  int rc = o ? cogpu__susp_submit(d, ++d->next_op_id, slot, gen, op) : -ENOMEM;
  if (rc) {
    free(o);
    /* Not handed over: the state says what was meant; a suspension is
     * reported failed (a resume stays due). */
    struct cogpu_s *h = d->dh;
    cogpu__ledger_lock(h);
    if (op == LEDGER_OP_SUSPEND)
      cogpu__ledger_suspend_done(h, slot, gen, rc, false, 0);
    cogpu__ledger_unlock(h);
    return rc;
  }
  *o = (dop_t){.id = d->next_op_id,
               .slot = slot,
               .gen = gen,
               .op = op,
               .epoch = d->state_epoch,
               .next = d->ops};
  d->ops = o;
  return 0;
}

static void op_remove(cogpu__daemon_t *d, uint64_t id) {
  for (dop_t **pp = &d->ops; *pp; pp = &(*pp)->next)
    if ((*pp)->id == id) {
      dop_t *o = *pp;
      *pp = o->next;
      free(o);
      return;
    }
}

/* Takes the operations the ledger decided. */
static void ops_pump(cogpu__daemon_t *d) {
  if (!d->susp || !d->dh)
    return;
  ledger_susp_op_t ops[64];
  size_t n;
  while ((n = cogpu__ledger_take_susp_ops(d->dh, ops, 64)) > 0)
    for (size_t i = 0; i < n; i++) {
      int rc = op_add(d, ops[i].slot, ops[i].gen, ops[i].op);
      cogpu__assert_why(rc != -EALREADY,
                        "the ledger decided a second operation for a job");
      if (rc != -EALREADY)
        continue;
      const dop_t *o = op_find(d, ops[i].slot, ops[i].gen);
      cogpu__log(COGPU_LOG_ERROR,
                 "the ledger asked for operation %d on slot %u while its "
                 "operation %d is under way: %s",
                 ops[i].op, ops[i].slot, o->op,
                 o->op == ops[i].op ? "merged" : "refused");
    }
}

/* The suspender has done operations: each is final (its result applied
 * and answered, its place in the queue freed) or runs again, keeping its
 * place. */
static void ops_done(cogpu__daemon_t *d) {
  cogpu__susp_op_t *o;
  while ((o = cogpu__susp_take(d))) {
    if (cogpu__daemon_susp_result(d, o)) {
      cogpu__susp_again(d, o);
      continue;
    }
    op_remove(d, o->id);
    cogpu__susp_release(d, o);
  }
  if (!d->dh)
    return;
  ops_pump(d);
  cogpu__daemon_answer_waiters(d);
}

/* After a restart: jobs a previous daemon left half-way. A suspension
 * under way is undone (its footprint is still booked: restore, unlock); a
 * resume under way is done again (its footprint is booked). The
 * recovery's first service pass may already have served a parked job's
 * resume (SUSPENDED -> RESUMING, its operation decided): that one is taken
 * first, and the job is not given a second. */
static void ops_recover(cogpu__daemon_t *d) {
  if (!d->susp || !d->dh)
    return;
  ops_pump(d);
  ledger_state_t *st = d->dh->st;
  LEDGER_FOR_SLOTS(st, s) {
    const ledger_slot_t *sl = &st->slots[s];
    uint32_t gen = atomic_load(&sl->gen);
    if (sl->state != SLOT_ACTIVE || op_find(d, s, gen))
      continue;
    if (sl->susp == SUSP_SUSPENDING)
      op_add(d, s, gen, SUSP_OP_UNDO);
    else if (sl->susp == SUSP_RESUMING)
      op_add(d, s, gen, LEDGER_OP_RESUME);
  }
}

/* What the connections hand up: a message, handled by the dispatch, and a
 * connection's end; after either, the operations the ledger decided are
 * taken into the queue. */
static int loop_message(cogpu__daemon_t *d, dconn_t *c, const void *buf,
                        size_t len) {
  int rc = cogpu__daemon_handle(d, c, buf, len);
  ops_pump(d);
  return rc;
}

static void loop_close(cogpu__daemon_t *d, dconn_t *c) {
  cogpu__daemon_close(d, c);
  ops_pump(d);
}

/* --- recovery after a restart ------------------------------------------------
 */

/* Slots of the previous daemon's clients: kept while their process lives
 * (watched by pidfd), until it reconnects; freed if it is gone. */
static void recover(cogpu__daemon_t *d) {
  if (!d->dh)
    return;
  ledger_state_t *st = d->dh->st;
  struct cogpu_s *h = d->dh;
  unsigned kept = 0, freed = 0;
  cogpu__ledger_lock(h);
  LEDGER_FOR_SLOTS(st, s) {
    ledger_slot_t *sl = &st->slots[s];
    if (sl->state != SLOT_ACTIVE || s == h->slot)
      continue;
    uint64_t t = cogpu__proc_starttime(sl->pid);
    if (t == 0 || t != sl->starttime) {
      cogpu__ledger_slot_free(h, s);
      freed++;
      continue;
    }
    kept++;
    int pfd = (int)syscall(SYS_pidfd_open, sl->pid, 0);
    if (pfd < 0)
      continue; /* no pidfd (kernel < 5.3): the timer checks it */
    /* Not watched (no memory): the timer checks it. */
    d->slot_conn[s] =
        cogpu__conn_pidfd(d, pfd, sl->pid, sl->uid, s, atomic_load(&sl->gen));
  }
  /* Queue entries, waiting or answered, wait for their clients to come
   * back and ask again (answered ones are answered then); those whose
   * clients do not come back are dropped at the deadline, a grant staying
   * granted (the client may have taken it). */
  unsigned waiting = 0;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++)
    waiting += st->waiters[w].state != W_FREE;
  cogpu__ledger_serve(h);
  cogpu__ledger_unlock(h);
  uint32_t drop[LEDGER_MAX_WAITERS];
  cogpu__ledger_take_wakes_of(h, drop, LEDGER_MAX_WAITERS);
  d->orphans_dirty = true;
  if (waiting)
    d->rebind_deadline_ms = now_ms() + 10000;
  if (kept || freed || waiting)
    cogpu__log(COGPU_LOG_WARN,
               "recovered the node state: %u clients kept until they "
               "reconnect, %u gone, %u requests waiting",
               kept, freed, waiting);
}

/* Periodic work: the policy's time-based decisions, foreign memory,
 * orphans without a pidfd, queue entries whose clients did not return. */
static void on_tick(cogpu__daemon_t *d) {
  struct cogpu_s *h = d->dh;
  if (!h)
    return;
  ledger_state_t *st = h->st;
  cogpu__ledger_foreign_refresh(h, false);
  LEDGER_FOR_SLOTS(st, s) {
    dconn_t *w = d->slot_conn[s];
    if (st->slots[s].state != SLOT_ACTIVE ||
        st->slots[s].leaving != LEDGER_LEAVING_GONE || !w ||
        w->kind != DC_PIDFD)
      continue;
    cogpu__log(COGPU_LOG_INFO,
               "client pid %d holds no GPU memory by NVML: the memory its "
               "slot %u kept is freed",
               (int)st->slots[s].pid, s);
    cogpu__conn_end(d, w);
  }
  cogpu__ledger_lock(h);
  LEDGER_FOR_SLOTS(st, s) {
    ledger_slot_t *sl = &st->slots[s];
    if (sl->state != SLOT_ACTIVE || s == h->slot || d->slot_conn[s])
      continue;
    if (cogpu__proc_starttime(sl->pid) != sl->starttime)
      cogpu__ledger_slot_free(h, s);
  }
  if (d->rebind_deadline_ms && now_ms() >= d->rebind_deadline_ms) {
    d->rebind_deadline_ms = 0;
    for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++)
      if (st->waiters[w].state != W_FREE && !d->waiter_conn[w] &&
          !st->waiters[w].resume)    /* a job's resume has no client */
        cogpu__ledger_dequeue(h, w); /* a grant stays granted */
  }
  cogpu__ledger_susp_check(h);
  cogpu__ledger_serve(h);
  cogpu__ledger_unlock(h);
  cogpu__susp_sample(d);
  d->orphans_dirty = true; /* some may be left: look again */
  ops_pump(d);
  cogpu__daemon_answer_waiters(d);
  if (watchdog_us)
    sd_notify(0, "WATCHDOG=1");
}

static bool orphans_unwatched(cogpu__daemon_t *d) {
  if (!d->dh)
    return false;
  ledger_state_t *st = d->dh->st;
  LEDGER_FOR_SLOTS(st, s)
  if (st->slots[s].state == SLOT_ACTIVE && s != d->dh->slot && !d->slot_conn[s])
    return true;
  return false;
}

/* Arms the timer only while something is due. Runs after every batch of
 * events, so it costs O(1): slots without a connection (orphans) appear
 * only when a state is opened or recovered (clients of a previous daemon
 * whose pidfd could not be watched) and go only at a tick, so they are
 * counted then, not at every message. The tick's work (on_tick: NVML,
 * the sweep) keeps its own period; the memory timelines' samples, cheap,
 * may make the timer fire more often than it, never the tick run more
 * often. */
static void arm_timer(cogpu__daemon_t *d) {
  uint64_t ms = 0;
  if (d->orphans_dirty) {
    d->orphans = orphans_unwatched(d);
    d->orphans_dirty = false;
  }
  if (d->dh && (d->dh->st->hdr.nwaiting || d->rebind_deadline_ms || d->orphans))
    ms = d->dh->st->hdr.nwaiting ? cogpu__ledger_guard_delay_ms(d->dh)
                                 : d->dh->st->hdr.sweep_interval_ms;
  if (watchdog_us && (ms == 0 || ms > watchdog_us / 2000))
    ms = watchdog_us / 2000;
  if (ms != d->tick_ms)
    d->next_tick_ms = now_ms() + ms;
  d->tick_ms = ms;
  bool sampling = cogpu__daemon_rec_sampling(d);
  if (sampling && (ms == 0 || ms > REC_SAMPLE_MS))
    ms = REC_SAMPLE_MS;
  /* Re-arming at every batch would also restart the period, so that a
   * busy daemon never ticked: only a change is set. */
  if (ms == d->timer_ms)
    return;
  /* Sampling that starts now takes its first sample within half a period:
   * a job's first second then has a sample of its own. */
  uint64_t first =
      sampling && !d->timer_ms && ms == REC_SAMPLE_MS ? ms / 2 : ms;
  d->timer_ms = ms;
  struct itimerspec its = {0};
  if (ms) {
    its.it_interval.tv_sec = (time_t)(ms / 1000);
    its.it_interval.tv_nsec = (long)(ms % 1000) * 1000000;
    its.it_value.tv_sec = (time_t)(first / 1000);
    its.it_value.tv_nsec = (long)(first % 1000) * 1000000;
  }
  timerfd_settime(d->tfd, 0, &its, NULL);
}

/* The timer fired: the tick when its period is up (always when the timer
 * runs at the tick's own period), then the timelines' sample. */
static void on_timer(cogpu__daemon_t *d) {
  uint64_t now = now_ms();
  if (d->tick_ms &&
      (d->tick_ms <= d->timer_ms || now + d->timer_ms / 2 >= d->next_tick_ms)) {
    d->next_tick_ms = now + d->tick_ms;
    on_tick(d);
  }
  cogpu__daemon_rec_sample(d);
}

/* --- set-up
 * --------------------------------------------------------------------- */

static int make_socket(cogpu__daemon_t *d) {
  if (d->activated) {
    d->lfd = SD_LISTEN_FDS_START;
    int fl = fcntl(d->lfd, F_GETFL);
    fcntl(d->lfd, F_SETFL, fl | O_NONBLOCK);
    return 0;
  }
  const char *path = d->cfg.v[COGPU_OPT_SOCKET].s;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    return cogpu__seterr(-ENAMETOOLONG, "socket path %s is too long", path);
  strcpy(sa.sun_path, path);
  struct stat sb;
  if (lstat(path, &sb) == 0) {
    if (!S_ISSOCK(sb.st_mode))
      return cogpu__seterr(-EEXIST, "%s exists and is not a socket", path);
    /* Left by a daemon that died: claim() found nobody answering on it,
     * and holds the socket's lock. */
    unlink(path);
  }
  d->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (d->lfd < 0)
    return cogpu__seterr(-errno, "socket: %s", strerror(errno));
  mode_t old = umask(0);
  int rc = bind(d->lfd, (struct sockaddr *)&sa, sizeof sa);
  umask(old);
  /* The path is done with before listen(): once a client can connect,
   * the socket file may be gone (removed by someone), and a check after
   * that failed a daemon that had started (daemon_socket_gone_...). */
  if (rc != 0 || chmod(path, 0666) != 0 || lstat(path, &sb) != 0 ||
      listen(d->lfd, 4096) != 0) {
    rc =
        cogpu__seterr(-errno, "cannot listen on %s: %s", path, strerror(errno));
    close(d->lfd);
    d->lfd = -1;
    return rc;
  }
  d->lfd_owned = true;
  d->sock_dev = sb.st_dev;
  d->sock_ino = sb.st_ino;
  return 0;
}

static int lock_replace(const char *path, mode_t mode) {
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  int fd =
      open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0)
    return cogpu__seterr(-errno, "cannot create %s: %s", tmp, strerror(errno));
  int rc = fchmod(fd, mode) == 0 && rename(tmp, path) == 0 ? 0 : -errno;
  close(fd);
  if (rc) {
    unlink(tmp);
    return cogpu__seterr(rc, "cannot replace %s: %s", path, strerror(-rc));
  }
  return 0;
}

/* Takes the lock file at path (mode: 0644 where users probe it, else 0600)
 * for the daemon's whole life (lockfile.c), or says which daemon holds it:
 * `what` it runs, and `why` a second one must not. */
static int take_lock(const char *path, mode_t mode, const char *what,
                     const char *why, int *out) {
  for (int tries = 0;; tries++) {
    if (tries == 8)
      return cogpu__seterr(-EBUSY, "cannot lock %s: it keeps changing", path);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
      return cogpu__seterr(-errno, "cannot open the lock file %s: %s", path,
                           strerror(errno));
    struct stat sb, at;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() ||
        sb.st_nlink != 1) {
      close(fd);
      return cogpu__seterr(-EPERM,
                           "the lock file %s is not a plain file of the "
                           "daemon's uid %u: refused (someone else made it)",
                           path, (unsigned)geteuid());
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
      /* Held only if path still names it: another daemon may have put a
       * fresh file in its place (below) since it was opened. */
      if (lstat(path, &at) != 0 || at.st_ino != sb.st_ino ||
          at.st_dev != sb.st_dev) {
        close(fd);
        continue;
      }
      /* The pid is for the message below; users may read it (mode). */
      char buf[32];
      int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
      if (fchmod(fd, mode) != 0 || ftruncate(fd, 0) != 0 ||
          pwrite(fd, buf, (size_t)n, 0) != n)
        cogpu__log(COGPU_LOG_WARN, "lock file %s: %s", path, strerror(errno));
      *out = fd;
      return 0;
    }
    int e = errno;
    if (e != EAGAIN && e != EACCES) {
      close(fd);
      return cogpu__seterr(-e, "cannot lock %s: %s", path, strerror(e));
    }
    /* A daemon's lock is a write lock. A read lock is anyone who can read
     * the file holding it to keep daemons out: a fresh file replaces it.
     * None any more: try again. */
    struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_OFD_GETLK, &q) == 0 && q.l_type != F_WRLCK) {
      close(fd);
      if (q.l_type == F_RDLCK) {
        cogpu__log(COGPU_LOG_WARN,
                   "%s is read-locked (by pid %d, or a process holding an "
                   "OFD lock): replaced",
                   path, (int)q.l_pid);
        int rc = lock_replace(path, mode);
        if (rc)
          return rc;
      }
      continue;
    }
    long pid = cogpu__node_lock_pid(fd);
    close(fd);
    char who[32] = "pid unknown";
    if (pid > 0)
      snprintf(who, sizeof who, "pid %ld", pid);
    return cogpu__seterr(-EBUSY,
                         "another cogpud (%s) runs %s (it holds %s): not "
                         "starting a second one, which would %s; stop that "
                         "one first",
                         who, what, path, why);
  }
}

/* 0 when no one answers on the socket path (none there, or a dead
 * daemon's), a refusal otherwise. */
static int socket_free(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    return cogpu__seterr(-ENAMETOOLONG, "socket path %s is too long", path);
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return cogpu__seterr(-errno, "socket: %s", strerror(errno));
  /* EAGAIN: a full backlog, so someone listens. */
  int e = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : errno;
  close(fd);
  if (e == ENOENT || e == ECONNREFUSED)
    return 0;
  return cogpu__seterr(-EBUSY,
                       "something answers on %s (%s): a cogpud with another "
                       "daemon_dir? Not starting a second daemon on that "
                       "socket; stop that one first, or give this one "
                       "another socket",
                       path, e ? strerror(e) : "it accepted a connection");
}

/* One daemon per daemon_dir and per socket, settled before the state or
 * the socket is touched: a second daemon started by hand used to unlink
 * the first's socket, bind its own, and unlink that at its exit, leaving
 * the first daemon serving no one and clients in single-user mode. Locks,
 * not "does it answer", decide: the kernel drops them when a daemon dies
 * (kill -9 included), and a daemon that is starting or stopped (SIGSTOP)
 * holds them but may not answer. A daemon of another daemon_dir on the
 * same socket, or of an older version that takes no lock, is found by
 * connecting. Socket-activated daemons take the locks too. */
static int claim(cogpu__daemon_t *d) {
  const char *dir = d->cfg.v[COGPU_OPT_DAEMON_DIR].s;
  const char *sock = d->cfg.v[COGPU_OPT_SOCKET].s;
  char path[4200], what[4200];
  int rc = cogpu__daemon_check_dir(dir);
  if (rc)
    return rc;
  if (cogpu__node_lock_path(&d->cfg, false, path, sizeof path) != 0)
    return cogpu__seterr(-ENAMETOOLONG, "daemon_dir %s is too long", dir);
  snprintf(what, sizeof what, "with daemon_dir %s", dir);
  /* Root's alone: users probe the lock beside the socket. */
  rc =
      take_lock(path, 0600, what, "write the same node state", &d->dir_lock_fd);
  if (rc || d->fuzz)
    return rc;
  d->activated = sd_listen_fds(1) == 1;
  if (!d->activated) {
    char sdir[256];
    snprintf(sdir, sizeof sdir, "%s", sock);
    char *slash = strrchr(sdir, '/');
    if (slash && slash != sdir) {
      *slash = 0;
      if (mkdir(sdir, 0755) == 0)
        chmod(sdir, 0755);
    }
  }
  if (cogpu__node_lock_path(&d->cfg, true, path, sizeof path) != 0)
    return cogpu__seterr(-ENAMETOOLONG, "socket path %s is too long", sock);
  /* A socket named after the daemon_dir's own files would make its lock
   * one of them (and 0644). */
  snprintf(what, sizeof what, "%s/", dir);
  const char *base =
      strncmp(path, what, strlen(what)) == 0 ? path + strlen(what) : NULL;
  if (base &&
      (!strcmp(base, COGPU_DAEMON_LOCK_NAME) || !strncmp(base, "state", 5)))
    return cogpu__seterr(-EINVAL,
                         "socket %s: its lock file %s would be one of "
                         "daemon_dir's own files; name the socket otherwise",
                         sock, path);
  snprintf(what, sizeof what, "on the socket %s", sock);
  rc = take_lock(path, 0644, what, "take that socket over", &d->sock_lock_fd);
  if (rc && d->activated && (rc == -EROFS || rc == -EACCES)) {
    /* systemd's socket in a directory this daemon may not write (a
     * socket path outside ReadWritePaths): the daemon_dir's lock still
     * guards the state; only clients' probe of this lock is lost. */
    cogpu__log(COGPU_LOG_WARN, "%s", cogpu_last_error());
    return 0;
  }
  if (rc || d->activated)
    return rc;
  return socket_free(sock);
}

int cogpu__daemon_init(cogpu__daemon_t *d, const cogpu__config_t *cfg,
                       bool fuzz) {
  memset(d, 0, sizeof *d);
  d->cfg = *cfg;
  d->fuzz = fuzz;
  d->epfd = d->lfd = d->tfd = -1;
  d->dir_lock_fd = d->sock_lock_fd = -1;
  d->on_message = loop_message;
  d->on_close = loop_close;
  d->slot_conn = calloc(LEDGER_MAX_SLOTS, sizeof *d->slot_conn);
  d->waiter_conn = calloc(LEDGER_MAX_WAITERS, sizeof *d->waiter_conn);
  if (!d->slot_conn || !d->waiter_conn)
    return cogpu__seterr(-ENOMEM, "out of memory");
  d->guard_hooks =
      (ledger_guard_hooks_t){.ctx = d, .answer_due = cogpu__conn_answer_due};
  d->host.guard = &d->guard_hooks;
  const char *grp = cfg->v[COGPU_OPT_ADMIN_GROUP].s;
  if (*grp) {
    struct group *gr = getgrnam(grp);
    if (!gr)
      return cogpu__seterr(COGPU_ECONFIG, "admin_group: no group named '%s'",
                           grp);
    d->admin_gid = gr->gr_gid;
    d->have_admin_group = true;
  }
  int rc = claim(d);
  if (rc)
    return rc;
  rc = cogpu__daemon_ensure_state(d);
  if (rc == COGPU_ENVML || rc == COGPU_ENOGPU) {
    /* The NVIDIA driver may load after the daemon starts (at boot): serve
     * anyway, and discover the GPUs at the first request. */
    cogpu__log(COGPU_LOG_WARN, "no node state yet: %s", cogpu_last_error());
    rc = 0;
  }
  if (rc || fuzz)
    return rc;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max; /* two descriptors per client: its socket
                                  and a pidfd of its process */
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  d->epfd = epoll_create1(EPOLL_CLOEXEC);
  d->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (d->epfd < 0 || d->tfd < 0)
    return cogpu__seterr(-errno, "epoll/timerfd: %s", strerror(errno));
  rc = make_socket(d);
  if (rc)
    return rc;
  sigset_t ss;
  sigemptyset(&ss);
  sigaddset(&ss, SIGTERM);
  sigaddset(&ss, SIGINT);
  sigprocmask(SIG_BLOCK, &ss, NULL);
  signal(SIGPIPE, SIG_IGN);
  sigfd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN,
                           .data.ptr = &cogpu__conn_listen_mark};
  epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->lfd, &ev);
  ev.data.ptr = &mark_timer;
  epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->tfd, &ev);
  ev.data.ptr = &mark_signal;
  if (sigfd >= 0)
    epoll_ctl(d->epfd, EPOLL_CTL_ADD, sigfd, &ev);
  rc = cogpu__susp_start(d);
  if (rc)
    return rc;
  ev.data.ptr = &mark_susp;
  epoll_ctl(d->epfd, EPOLL_CTL_ADD, cogpu__susp_fd(d), &ev);
  rc = cogpu__daemon_rec_start(d);
  if (rc)
    return cogpu__seterr(rc, "out of memory");
  if (cogpu__daemon_rec_fd(d) >= 0) {
    ev.data.ptr = &mark_hist;
    epoll_ctl(d->epfd, EPOLL_CTL_ADD, cogpu__daemon_rec_fd(d), &ev);
  }
  recover(d);
  ops_recover(d);
  if (sd_watchdog_enabled(0, &watchdog_us) <= 0)
    watchdog_us = 0;
  return 0;
}

/* Serves a batch of events but the timer's; true when the timer fired
 * (its expiry read). */
static bool dispatch(cogpu__daemon_t *d, struct epoll_event *evs, int n) {
  bool timer = false;
  for (int i = 0; i < n; i++) {
    dconn_t *c = evs[i].data.ptr;
    if (c == &cogpu__conn_listen_mark) {
      cogpu__conn_accept(d);
    } else if (c == &mark_timer) {
      uint64_t x;
      if (read(d->tfd, &x, sizeof x) < 0) {
        /* nothing: the tick runs anyway */
      }
      timer = true;
    } else if (c == &mark_signal) {
      d->stop = true;
    } else if (c == &mark_susp) {
      ops_done(d);
    } else if (c == &mark_hist) {
      cogpu__daemon_history_answered(d);
    } else {
      cogpu__conn_readable(d, c, evs[i].events);
    }
  }
  return timer;
}

int cogpu__daemon_run(cogpu__daemon_t *d) {
  sd_notify(0, "READY=1");
  cogpu__log(COGPU_LOG_INFO, "cogpud ready on %s (%u GPUs)",
             d->cfg.v[COGPU_OPT_SOCKET].s, d->dh ? d->dh->st->hdr.ngpus : 0);
  while (!d->stop) {
    arm_timer(d);
    struct epoll_event evs[64];
    int wait_ms = -1;
    if (d->accept_paused) {
      uint64_t now = now_ms();
      wait_ms = now >= d->accept_retry_ms ? 0 : (int)(d->accept_retry_ms - now);
    }
    int n = epoll_wait(d->epfd, evs, 64, wait_ms);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return cogpu__seterr(-errno, "epoll_wait: %s", strerror(errno));
    if (dispatch(d, evs, n)) {
      /* The timer's decisions (the deadlock guard above all) rest on the
       * releases clients have made: every message already sent is read
       * first, this batch's and any that came while it was served, so a
       * release in a socket's buffer is never taken for a stuck job. */
      cogpu__daemon_reap(d);
      n = epoll_wait(d->epfd, evs, 64, 0);
      if (n > 0)
        dispatch(d, evs, n);
      on_timer(d);
    }
    /* Connections that ended or must end (replies that could not be
     * sent), now that no event of this batch can name them. */
    cogpu__daemon_reap(d);
    if (d->accept_paused && now_ms() >= d->accept_retry_ms)
      cogpu__conn_accept_resume(d);
  }
  sd_notify(0, "STOPPING=1");
  if (d->failed)
    return cogpu__seterr(COGPU_ESTATE, "stopped: a reset could not make a "
                                       "new node state (see above)");
  return 0;
}

/* Stopping is not detaching: the state keeps every client's reservation,
 * and clients re-register with the next daemon. */
void cogpu__daemon_fini(cogpu__daemon_t *d) {
  cogpu__susp_stop(d);
  while (d->ops) {
    dop_t *o = d->ops;
    d->ops = o->next;
    free(o);
  }
  cogpu__daemon_rec_stop(d);
  while (d->conns) {
    dconn_t *c = d->conns;
    d->conns = c->next;
    if (c->fd >= 0)
      close(c->fd);
    free(c);
  }
  if (d->lfd >= 0 && d->lfd_owned) {
    /* Only the socket this daemon bound: one bound there since is
     * another daemon's (never this one's to remove). */
    const char *path = d->cfg.v[COGPU_OPT_SOCKET].s;
    struct stat sb;
    if (lstat(path, &sb) == 0 && sb.st_dev == d->sock_dev &&
        sb.st_ino == d->sock_ino)
      unlink(path);
    close(d->lfd);
  }
  if (d->tfd >= 0)
    close(d->tfd);
  if (d->epfd >= 0)
    close(d->epfd);
  cogpu__ledger_close_trusted(d->dh);
  free(d->slot_conn);
  free(d->waiter_conn);
  free(d->users);
  /* Last: the next daemon may start once this one no longer writes. */
  if (d->sock_lock_fd >= 0)
    close(d->sock_lock_fd);
  if (d->dir_lock_fd >= 0)
    close(d->dir_lock_fd);
}
