/*
 * conn.c: cogpud's connections, the bottom layer: accepting them (peer
 * credentials, the per-user cap, pausing when out of descriptors),
 * receiving messages (with the descriptors SCM_RIGHTS brings: each is
 * handed over or closed), sending replies, the pidfd connections that
 * watch clients' processes, and ending connections (at once, or after the
 * batch of events: cogpu__daemon_end_later, cogpu__daemon_reap).
 *
 * It knows nothing of what messages mean nor of the services: a message
 * received, and a connection that ends, go up through the two calls the
 * loop gave it (d->on_message, d->on_close).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/daemon-int.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

dconn_t cogpu__conn_listen_mark;

static uint64_t conn_now_ms(void) {
  return cogpu__now_ns() / 1000000u;
}

/* Each connection costs the daemon a descriptor, so a user's are capped,
 * not only their slots and waits: each attached process has its main
 * connection, each waiting request one of its own, and the rest are for
 * queries (status, history, suspend) and connections not attached yet. */
#define USER_CONN_SLACK 64

static long user_max_conns(const cogpu__daemon_t *d) {
  return d->cfg.v[COGPU_OPT_USER_MAX_CLIENTS].i +
         d->cfg.v[COGPU_OPT_USER_MAX_WAITERS].i + USER_CONN_SLACK;
}

static uint32_t uid_hash(uid_t uid) {
  uint32_t h = (uint32_t)uid;
  h ^= h >> 16;
  h *= 0x45d9f3bu;
  h ^= h >> 16;
  return h;
}

/* The entry of uid in the table (a free one, or NULL when !add). */
static duser_t *user_slot(duser_t *t, uint32_t cap, uid_t uid, bool add) {
  for (uint32_t i = uid_hash(uid) & (cap - 1);; i = (i + 1) & (cap - 1)) {
    if (!t[i].used)
      return add ? &t[i] : NULL;
    if (t[i].uid == uid)
      return &t[i];
  }
}

/* uid's entry, made if needed; NULL when out of memory. */
static duser_t *user_get(cogpu__daemon_t *d, uid_t uid) {
  if ((d->users_used + 1) * 2 > d->users_cap) {
    uint32_t cap = d->users_cap ? d->users_cap * 2 : 64;
    duser_t *t = cap > d->users_cap ? calloc(cap, sizeof *t) : NULL;
    if (t) {
      for (uint32_t i = 0; i < d->users_cap; i++)
        if (d->users[i].used)
          *user_slot(t, cap, d->users[i].uid, true) = d->users[i];
      free(d->users);
      d->users = t;
      d->users_cap = cap;
    } else if (d->users_used + 1 >= d->users_cap) {
      return NULL; /* no free entry left to probe for */
    }
  }
  duser_t *u = user_slot(d->users, d->users_cap, uid, true);
  if (!u->used) {
    *u = (duser_t){.uid = uid, .used = true};
    d->users_used++;
  }
  return u;
}

static void user_drop(cogpu__daemon_t *d, uid_t uid) {
  duser_t *u =
      d->users_cap ? user_slot(d->users, d->users_cap, uid, false) : NULL;
  if (!u || !u->conns)
    return;
  u->conns--;
  /* Well under the cap again: a new refusal is a new episode, said
   * again. At the cap, a user who closes and opens in turn is told
   * once. */
  if (u->conns <= user_max_conns(d) / 2)
    u->said = false;
}

dconn_t *cogpu__conn_new(cogpu__daemon_t *d, int fd, int kind) {
  dconn_t *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->fd = fd;
  c->kind = kind;
  c->waiter = -1;
  c->passed_fd = -1;
  c->id = ++d->next_conn_id;
  c->next = d->conns;
  if (d->conns)
    d->conns->prev = c;
  d->conns = c;
  d->nconns++;
  return c;
}

/* Ends a connection: what it held is freed at once, but the record itself
 * only after the current batch of events (cogpu__daemon_reap), which may still
 * name it. */
void cogpu__conn_end(cogpu__daemon_t *d, dconn_t *c) {
  if (c->dead)
    return;
  c->dead = true;
  cogpu__daemon_reap_list(d, c);
  d->on_close(d, c);
  if (c->fd >= 0) {
    if (!d->fuzz)
      epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    /* A descriptor is free: a paused listening socket is tried again
     * after this batch. */
    d->accept_retry_ms = 0;
  }
  if (c->counted) {
    c->counted = false;
    user_drop(d, c->uid);
  }
}

/* Frees the records of ended connections (and ends those marked for it):
 * those on the reap list only, so that it costs nothing when no
 * connection ended, and not the node's number of clients when one did. */
void cogpu__daemon_reap(cogpu__daemon_t *d) {
  /* Ending one may list others (a process's waits end with it). */
  while (d->reap_list) {
    dconn_t *list = d->reap_list;
    d->reap_list = NULL;
    for (dconn_t *c = list, *next; c; c = next) {
      next = c->reap_next;
      if (c->closing && !c->dead)
        cogpu__conn_end(d, c);
      c->reap_listed = false;
      if (!c->dead)
        continue;
      if (c->prev)
        c->prev->next = c->next;
      else
        d->conns = c->next;
      if (c->next)
        c->next->prev = c->prev;
      d->nconns--;
      free(c);
    }
  }
}

static bool in_group(pid_t pid, gid_t gid, gid_t want) {
  if (gid == want)
    return true;
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  bool yes = false;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "Groups:", 7) == 0) {
      char *p = line + 7, *end;
      for (;;) {
        unsigned long g = strtoul(p, &end, 10);
        if (end == p)
          break;
        yes |= (gid_t)g == want;
        p = end;
      }
      break;
    }
  if (f)
    fclose(f);
  return yes;
}

/* The listening socket is not polled for a while: it stays readable
 * while connections wait, and returning at once to epoll_wait would
 * spin. Tried again when a connection ends (a descriptor is free) or
 * after ACCEPT_RETRY_MS. */
#define ACCEPT_RETRY_MS 100u

static void accept_pause(cogpu__daemon_t *d, int err) {
  if (!d->accept_paused && epoll_ctl(d->epfd, EPOLL_CTL_DEL, d->lfd, NULL) == 0)
    d->accept_paused = true;
  d->accept_retry_ms = conn_now_ms() + ACCEPT_RETRY_MS;
  if (d->fd_short)
    return;
  d->fd_short = true;
  struct rlimit rl = {0};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (err == EMFILE || err == ENFILE)
    cogpu__log(COGPU_LOG_WARN,
               "out of descriptors (%s; %llu connections, RLIMIT_NOFILE "
               "%llu): not accepting connections until some close",
               strerror(err), (unsigned long long)d->nconns,
               (unsigned long long)rl.rlim_cur);
  else
    cogpu__log(COGPU_LOG_WARN,
               "accept: %s: not accepting connections for a while",
               strerror(err));
}

void cogpu__conn_accept_resume(cogpu__daemon_t *d) {
  struct epoll_event ev = {.events = EPOLLIN,
                           .data.ptr = &cogpu__conn_listen_mark};
  if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->lfd, &ev) == 0)
    d->accept_paused = false;
  else
    d->accept_retry_ms = conn_now_ms() + ACCEPT_RETRY_MS;
}

void cogpu__conn_accept(cogpu__daemon_t *d) {
  for (;;) {
    int fd = cogpu__fault_fails(COGPU_FP_ACCEPT)
                 ? (errno = EMFILE, -1)
                 : accept4(d->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      /* Out of descriptors or memory: the connection stays queued. */
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        accept_pause(d, errno);
      return;
    }
    if (d->fd_short) {
      d->fd_short = false;
      cogpu__log(COGPU_LOG_INFO, "accepting connections again");
    }
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 ||
        cr.pid <= 0) {
      /* A peer whose PID this namespace cannot see (pid 0) is refused:
       * its process could not be told apart from another. */
      close(fd);
      continue;
    }
    bool admin = cr.uid == 0 || (d->have_admin_group &&
                                 in_group(cr.pid, cr.gid, d->admin_gid));
    duser_t *u = admin ? NULL : user_get(d, cr.uid);
    long most = user_max_conns(d);
    if (!admin && (!u || (long)u->conns >= most)) {
      if (!u)
        cogpu__log(COGPU_LOG_WARN,
                   "out of memory: a connection of uid %u refused",
                   (unsigned)cr.uid);
      else if (!u->said)
        cogpu__log(COGPU_LOG_WARN,
                   "user %u has %ld connections to the daemon "
                   "(user_max_clients + user_max_waiters + %d): refusing "
                   "more until some close",
                   (unsigned)cr.uid, most, USER_CONN_SLACK);
      if (u)
        u->said = true;
      close(fd);
      continue;
    }
    dconn_t *c = cogpu__conn_new(d, fd, DC_NEW);
    if (!c) {
      /* Said, not silent: the client sees its connection closed at once. */
      cogpu__log(COGPU_LOG_WARN,
                 "out of memory: a connection of pid %d (uid %u) refused",
                 (int)cr.pid, (unsigned)cr.uid);
      close(fd);
      continue;
    }
    c->pid = cr.pid;
    c->uid = cr.uid;
    c->gid = cr.gid;
    c->admin = admin;
    if (u) {
      u->conns++;
      c->counted = true;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
      cogpu__conn_end(d, c);
  }
}

/* A PIDFD connection for process pid of slot/gen (pidfd pfd, which it
 * owns from here), watched by the loop; NULL (pfd closed) if it cannot be
 * made. pidfd_open's descriptors are close-on-exec. */
dconn_t *cogpu__conn_pidfd(cogpu__daemon_t *d, int pfd, pid_t pid, uid_t uid,
                           uint32_t slot, uint32_t gen) {
  dconn_t *c = cogpu__conn_new(d, pfd, DC_PIDFD);
  if (!c) {
    close(pfd);
    return NULL;
  }
  c->pid = pid;
  c->uid = uid;
  c->slot = c->res_slot = slot;
  c->gen = c->res_gen = gen;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
  if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, pfd, &ev) != 0) {
    cogpu__conn_end(d, c);
    return NULL;
  }
  return c;
}

void cogpu__daemon_watch_process(cogpu__daemon_t *d, dconn_t *c) {
  if (d->fuzz || c->kind != DC_MAIN || c->watch || !d->dh)
    return;
  const ledger_slot_t *sl = &d->dh->st->slots[c->slot];
  int pfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
  if (pfd < 0)
    return;
  /* The pidfd is of the process that attached, or that one has gone. */
  if (cogpu__proc_starttime(c->pid) != sl->starttime) {
    close(pfd);
    cogpu__daemon_end_later(d, c);
    return;
  }
  dconn_t *w = cogpu__conn_pidfd(d, pfd, c->pid, c->uid, c->slot, c->gen);
  if (w) {
    w->watch = c;
    c->watch = w;
  }
}

/* The deadlock guard's question (ledger-int.h): is an answer to process
 * slot s due, its request being handled now or unread in its connection?
 * Seen in a loaded .ci/run: a thread's reserve, being handled, ran the
 * guard while the threads holding that process's memory slept behind it,
 * waiting their turn on the connection to send their releases. */
bool cogpu__conn_answer_due(void *ctx, uint32_t s) {
  const cogpu__daemon_t *d = ctx;
  const dconn_t *c = s < LEDGER_MAX_SLOTS ? d->slot_conn[s] : NULL;
  /* A PIDFD connection (a slot kept for a process that left, or one of a
   * previous daemon's clients) reads as readable when the process has
   * gone: no request of its can be due. */
  if (!c || c->kind != DC_MAIN)
    return false;
  if (c == d->handling)
    return true;
  struct pollfd p = {.fd = c->fd, .events = POLLIN};
  return !d->fuzz && c->fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

void cogpu__conn_readable(cogpu__daemon_t *d, dconn_t *c, uint32_t events) {
  if (c->dead)
    return; /* ended earlier in this batch */
  if (c->kind == DC_PIDFD && c->watch) {
    /* The process of a live registration exited: whoever holds its
     * connection now does not hold its registration. */
    dconn_t *m = c->watch;
    cogpu__log(COGPU_LOG_INFO,
               "client pid %d exited while another process held its "
               "connection: its slot %u is freed",
               (int)c->pid, c->slot);
    m->watch = NULL;
    c->watch = NULL;
    cogpu__daemon_end_later(d, m);
    cogpu__conn_end(d, c);
    return;
  }
  if (c->kind == DC_PIDFD) {
    const ledger_slot_t *sl = d->dh ? &d->dh->st->slots[c->slot] : NULL;
    bool leaving = sl && sl->state == SLOT_ACTIVE &&
                   atomic_load(&sl->gen) == c->gen &&
                   sl->leaving != LEDGER_LEAVING_NO;
    cogpu__log(COGPU_LOG_INFO,
               leaving ? "client pid %d has gone: the memory its slot %u "
                         "kept is freed"
                       : "client pid %d ended while the daemon was away: its "
                         "slot %u is freed",
               (int)c->pid, c->slot);
    cogpu__conn_end(d, c);
    return;
  }
  for (int i = 0; i < 16; i++) {
    cogpu__msg_t m;
    struct iovec iov = {.iov_base = &m, .iov_len = sizeof m};
    /* Room for one descriptor (a usage page). Whatever comes is installed
     * by the kernel as far as it fits (two fit this buffer), with any
     * message, even an empty one: each is handed over or closed. */
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } cbuf;
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = cbuf.buf,
                        .msg_controllen = sizeof cbuf.buf};
    ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      break;
    c->passed_fd = -1;
    /* More than one, or more than fitted (MSG_CTRUNC): a violation. */
    int nfds = n >= 0 ? cogpu__msg_fds(&mh, &c->passed_fd) : 0;
    if (nfds < 0 || nfds > 1)
      cogpu__log(COGPU_LOG_INFO,
                 "client pid %d (uid %u): more than one descriptor with a "
                 "message: disconnected",
                 (int)c->pid, (unsigned)c->uid);
    d->handling = c;
    bool bad = n <= 0 || nfds < 0 || nfds > 1 || (mh.msg_flags & MSG_TRUNC) ||
               d->on_message(d, c, &m, (size_t)n) != 0;
    d->handling = NULL;
    /* A descriptor is the handler's to keep (dup) or not: never leaked. */
    if (c->passed_fd >= 0)
      close(c->passed_fd);
    c->passed_fd = -1;
    if (bad) {
      cogpu__conn_end(d, c);
      return;
    }
  }
  if (events & (EPOLLHUP | EPOLLERR))
    cogpu__conn_end(d, c);
}

/* --- replies ---------------------------------------------------------------
 */

/* Every message to a client goes through here: in the layout of the
 * client's version (a refusal, sent before any version was taken, in the
 * daemon's own). */
int cogpu__daemon_send(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *msg,
                       int passfd) {
  cogpu__msg_t out = *msg;
  cogpu__msg_t *m = &out;
  if (m->type == COGPU_M_REPLY && m->rc != -EPROTONOSUPPORT)
    snprintf(m->u.reply.release, sizeof m->u.reply.release, "%s",
             COGPU_VERSION_STRING);
  if (c->version)
    cogpu__msg_to_version(m, c->version);
  if (d->fuzz || c->fd < 0)
    return 0;
  struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof *m};
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (passfd >= 0) {
    memset(cbuf, 0, sizeof cbuf);
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &passfd, sizeof passfd);
  }
  ssize_t n = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n != (ssize_t)sizeof *m) {
    /* A client that does not read its replies loses its connection; it
     * never holds up the daemon. */
    cogpu__daemon_end_later(d, c);
    return -1;
  }
  return 0;
}

int cogpu__daemon_reply(cogpu__daemon_t *d, dconn_t *c, const cogpu__msg_t *req,
                        int rc, cogpu__msg_t *r) {
  r->magic = COGPU_PROTO_MAGIC;
  r->version = COGPU_PROTO_VERSION;
  r->type = COGPU_M_REPLY;
  r->seq = req->seq;
  r->rc = rc;
  if (rc && !r->u.reply.msg[0])
    snprintf(r->u.reply.msg, sizeof r->u.reply.msg, "%s",
             *cogpu_last_error() ? cogpu_last_error() : cogpu_strerror(rc));
  return cogpu__daemon_send(d, c, r, -1);
}

int cogpu__daemon_reply_fd(cogpu__daemon_t *d, dconn_t *c, uint32_t seq, int rc,
                           cogpu__msg_t *r, int fd) {
  r->magic = COGPU_PROTO_MAGIC;
  r->version = COGPU_PROTO_VERSION;
  r->type = COGPU_M_REPLY;
  r->seq = seq;
  r->rc = rc;
  return cogpu__daemon_send(d, c, r, rc ? -1 : fd);
}
