/*
 * client.c: node mode, the client side (node.h). One main connection per
 * attached process carries its requests, one at a time under a mutex; its
 * closing is how the daemon learns that the process ended. A request that
 * must wait gets a connection of its own, so a waiting thread never holds
 * up the process's other threads, and giving up is closing it: the daemon
 * then cancels the request, or takes back a grant that was not acknowledged.
 * The client's own clock bounds every wait, whatever the daemon does.
 *
 * When the daemon restarts (kill -9, systemctl restart), a request fails
 * with EOF or EPIPE: the client reconnects within daemon_wait, proves with
 * the secret it got at attach that it owns its slot (RESUME), and sends the
 * request again; the daemon answers a request it already did from the
 * slot's record instead of doing it twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "node/node.h"
#include "node/proto.h"
#include "nvml/nvml.h"

#define NODE_MAX_GPUS COGPU_NVML_MAX_GPUS

/* A descriptor kept across the program's own code, named by device and
 * inode when it was made. A program that closes descriptors it does not
 * know of (daemonising; a bug) may get the number again for a socket or
 * file of its own: the library must then neither write its messages into
 * it nor close it. */
typedef struct {
  dev_t dev;
  ino_t ino;
} fd_id_t;

static fd_id_t fd_id(int fd) {
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0)
    return (fd_id_t){0, 0};
  return (fd_id_t){sb.st_dev, sb.st_ino};
}

/* Is fd still the descriptor named id? */
static bool fd_is(int fd, fd_id_t id) {
  struct stat sb;
  return fd >= 0 && (id.dev || id.ino) && fstat(fd, &sb) == 0 &&
         sb.st_dev == id.dev && sb.st_ino == id.ino;
}

struct cogpu__node_s {
  pthread_mutex_t mu; /* the main connection: one request at a time */
  int fd;
  bool forked, lost;
  char sock[256];
  int64_t daemon_wait_ms;
  uint32_t seq;
  uint32_t slot, gen, res_slot, res_gen;
  uint64_t secret[2];
  uint32_t ngpus, policy;
  uint32_t late_seq; /* a reserve that gave up waiting for its reply */
  uint64_t late_bytes;
  /* The usage page (backend.h): its memfd, kept to pass it again to a
   * daemon that restarted; usage_state 0 not made, 1 passed, 2 failed. */
  int usage_fd;
  int usage_state;
  /* What fd and usage_fd are (fd_is): the program may close them under
   * the library and get their numbers for files of its own. */
  fd_id_t fd_id, usage_id;
  cogpu__usage_t *usage;
  cogpu__m_gpu_t gpus[NODE_MAX_GPUS];
};

/* --- sockets ----------------------------------------------------------- */

static uint64_t now_ms(void) {
  return cogpu__now_ns() / 1000000u;
}

static uint64_t deadline_after(int64_t ms) {
  return ms < 0 ? UINT64_MAX : now_ms() + (uint64_t)ms;
}

static int ms_until(uint64_t deadline) {
  if (deadline == UINT64_MAX)
    return -1;
  uint64_t now = now_ms();
  if (now >= deadline)
    return 0;
  uint64_t left = deadline - now;
  return left > 1000000 ? 1000000 : (int)left;
}

/* Connects to the daemon; while it restarts (no socket, or nobody
 * listening) tries again until the deadline. */
static int sock_connect(const char *path, uint64_t deadline) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    return cogpu__seterr(-ENAMETOOLONG, "socket path %s is too long", path);
  strcpy(sa.sun_path, path);
  unsigned delay_ms = 5;
  for (;;) {
    int fd = cogpu__fault_fails(COGPU_FP_CLIENT_SOCKET)
                 ? (errno = EMFILE, -1)
                 : socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return cogpu__seterr(-errno,
                           "cannot reach the node daemon at %s: socket: %s",
                           path, strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
      return fd;
    int e = errno;
    close(fd);
    bool retry = e == ECONNREFUSED || e == ENOENT || e == EAGAIN;
    int left = ms_until(deadline);
    /* One documented code (docs/errors.md): -EACCES when the socket
     * refuses us, -ECONNREFUSED when no daemon accepted within
     * daemon_wait (no socket, nobody listening, or a full backlog). */
    if (!retry || left == 0)
      return cogpu__seterr(e == EACCES || e == EPERM ? -EACCES : -ECONNREFUSED,
                           "cannot reach the node daemon at %s: %s (is "
                           "cogpud running? `cogpu doctor` checks)",
                           path, strerror(e));
    unsigned d =
        left >= 0 && (unsigned)left < delay_ms ? (unsigned)left : delay_ms;
    usleep(d * 1000u);
    if (delay_ms < 200)
      delay_ms *= 2;
  }
}

/* Sends one message: 0, -EPIPE (the daemon went away: after a restart,
 * callers connect again), another -errno, or -EIO for a short write, which
 * the daemon refuses as a malformed message: not taken for a daemon that
 * went away (a restart, or one of an older protocol, proto.h). */
static int msg_send(int fd, const cogpu__msg_t *m) {
  size_t len =
      cogpu__fault_fails(COGPU_FP_CLIENT_SEND) ? sizeof *m / 2 : sizeof *m;
  ssize_t n = send(fd, m, len, MSG_NOSIGNAL);
  if (n == (ssize_t)sizeof *m)
    return 0;
  if (n < 0)
    return -errno;
  return cogpu__seterr(-EIO,
                       "a short write to the node daemon (%zd of %zu bytes)", n,
                       sizeof *m);
}

/* The daemon refused this client's protocol version (proto.h, "Versions"):
 * -EPROTONOSUPPORT, and what to upgrade as the last error. */
static int refused(const cogpu__msg_t *r) {
  unsigned ours = cogpu__proto_client_version;
  unsigned lo = (unsigned)r->u.reply.a, hi = (unsigned)r->u.reply.b;
  if (ours > hi)
    return cogpu__seterr(
        -EPROTONOSUPPORT,
        "cogpud on this node speaks node protocol %u to %u (cogpu %s); this "
        "program speaks protocol %u (cogpu %s): cogpud is older than this "
        "program. Upgrade the cogpu package on this node (its upgrade "
        "restarts cogpud), or restart cogpud if it was upgraded already "
        "(systemctl restart cogpud)",
        lo, hi, r->u.reply.msg, ours, COGPU_VERSION_STRING);
  return cogpu__seterr(
      -EPROTONOSUPPORT,
      "this program speaks node protocol %u (cogpu %s), which cogpud on this "
      "node (cogpu %s) no longer accepts (it speaks %u to %u): upgrade this "
      "program to the node's cogpu release (or rebuild it against the "
      "node's libcogpu)",
      ours, COGPU_VERSION_STRING, r->u.reply.msg, lo, hi);
}

/* Receives one message within the deadline: 0, -ETIMEDOUT, -EPIPE (the
 * daemon went away), -EPROTONOSUPPORT (it refused this client's protocol
 * version; the last error says what to upgrade) or -EPROTO. Takes a passed
 * descriptor if fd_out. */
static int msg_recv(int fd, cogpu__msg_t *m, uint64_t deadline, int *fd_out) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, ms_until(deadline));
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -errno;
    if (r == 0)
      return -ETIMEDOUT;
    break;
  }
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } cbuf;
  struct iovec iov = {.iov_base = m, .iov_len = sizeof *m};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = cbuf.buf,
                      .msg_controllen = sizeof cbuf.buf};
  ssize_t n;
  do
    n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == ECONNRESET || errno == EPIPE))
    return -EPIPE;
  if (n < 0)
    return -errno;
  /* Every descriptor that came is kept (the one asked for) or closed,
   * even with an empty message; more than one is a violation. */
  int got = -1;
  int nfds = cogpu__msg_fds(&mh, fd_out && *fd_out < 0 ? &got : NULL);
  char why[64];
  if (n > 0 && !(mh.msg_flags & MSG_TRUNC) &&
      m->version != cogpu__proto_client_version &&
      cogpu__msg_is_refusal(m, (size_t)n)) {
    if (got >= 0)
      close(got);
    return refused(m);
  }
  if (n == 0 || nfds < 0 || nfds > 1 || (mh.msg_flags & MSG_TRUNC) ||
      m->version != cogpu__proto_client_version ||
      cogpu__msg_check(m, (size_t)n, why, sizeof why) != 0) {
    if (got >= 0)
      close(got);
    return n == 0 ? -EPIPE : -EPROTO; /* n == 0: the daemon went away */
  }
  if (got >= 0)
    *fd_out = got;
  return 0;
}

/* A failed request's rc, with the daemon's message as the last error. */
static int reply_rc(const cogpu__msg_t *r) {
  if (r->rc == 0)
    return 0;
  return cogpu__seterr(
      r->rc, "%s", r->u.reply.msg[0] ? r->u.reply.msg : cogpu_strerror(r->rc));
}

/* Whether the daemon answers a STATUS of version v: 1 yes, 0 it ended the
 * connection without an answer (or gave none in time), < 0 unreachable.
 * Read here, not by msg_recv, which takes only this client's version. */
static int answers_version(const char *sock, uint16_t v, uint64_t dl) {
  int fd = sock_connect(sock, dl);
  if (fd < 0)
    return fd;
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_STATUS, 1);
  m.version = v;
  int ok = 0;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (msg_send(fd, &m) == 0 && poll(&p, 1, ms_until(dl)) == 1) {
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } cbuf;
    struct iovec iov = {.iov_base = &r, .iov_len = sizeof r};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = cbuf.buf,
                        .msg_controllen = sizeof cbuf.buf};
    ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    if (n >= 0)
      cogpu__msg_fds(&mh, NULL); /* the snapshot: closed unread */
    ok = n == (ssize_t)sizeof r && !(mh.msg_flags & MSG_TRUNC) &&
         r.magic == COGPU_PROTO_MAGIC && r.type == COGPU_M_REPLY &&
         r.version == v;
  }
  close(fd);
  return ok;
}

/* The daemon ended the connection at this client's first message without
 * a word. cogpud of protocol 2 (cogpu 0.1.0) does so to a version it does
 * not know, where later ones send a refusal (proto.h). Asks again, with a
 * STATUS (which changes nothing), in this version and then in the one
 * before it: when only the older one is answered, says what to upgrade and
 * returns -EPROTONOSUPPORT; otherwise 0 (the daemon was restarting, or
 * failed, and the caller reports that as before). */
static int older_daemon(const char *sock, uint64_t dl) {
  uint16_t ours = cogpu__proto_client_version;
  if (ours <= 1 || answers_version(sock, ours, dl) != 0 ||
      answers_version(sock, (uint16_t)(ours - 1), dl) != 1)
    return 0;
  return cogpu__seterr(
      -EPROTONOSUPPORT,
      "cogpud on this node speaks node protocol %u (cogpu %s or older); this "
      "program speaks protocol %u (cogpu %s): cogpud is older than this "
      "program. Upgrade the cogpu package on this node (its upgrade "
      "restarts cogpud), or restart cogpud if it was upgraded already "
      "(systemctl restart cogpud)",
      (unsigned)(ours - 1), ours - 1 <= 2 ? "0.1.0" : "of that protocol",
      (unsigned)ours, COGPU_VERSION_STRING);
}

/* One request and its reply on a fresh connection (queries). */
static int query(const cogpu__config_t *cfg, cogpu__msg_t *m,
                 cogpu__msg_t *reply, int *fd_out) {
  uint64_t dl = deadline_after(cfg->v[COGPU_OPT_DAEMON_WAIT].i);
  int fd = sock_connect(cfg->v[COGPU_OPT_SOCKET].s, dl);
  if (fd < 0)
    return fd;
  int rc = msg_send(fd, m);
  while (rc == 0) {
    rc = msg_recv(fd, reply, dl, fd_out);
    if (rc == 0 && (reply->type != COGPU_M_REPLY || reply->seq != m->seq))
      continue;
    break;
  }
  close(fd);
  if (rc == -EPIPE &&
      older_daemon(cfg->v[COGPU_OPT_SOCKET].s, deadline_after(2000)) != 0)
    return -EPROTONOSUPPORT;
  if (rc == -EPIPE || rc == -EPROTO)
    return cogpu__seterr(rc, "the node daemon closed the connection");
  if (rc == -ETIMEDOUT)
    return cogpu__seterr(rc, "the node daemon did not answer in time");
  return rc;
}

/* --- mode ---------------------------------------------------------------- */

int cogpu__node_mode(const cogpu__config_t *cfg) {
  int mode = (int)cfg->v[COGPU_OPT_NODE_MODE].i; /* auto|daemon|single */
  if (mode == 2)
    return 0;
  if (mode == 1)
    return 1;
  /* The socket's presence decides, not whether the daemon answers now: a
   * daemon that is restarting must be waited for, never replaced by a
   * ledger of this process's own. */
  struct stat sb;
  if (stat(cfg->v[COGPU_OPT_SOCKET].s, &sb) == 0 && S_ISSOCK(sb.st_mode))
    return 1;
  /* Nor a daemon whose socket was removed under it: its lock says it
   * lives, and failing after daemon_wait beats booking the GPUs twice. */
  return cogpu__node_daemon_alive(cfg);
}

/* --- attach, resume ---------------------------------------------------- */

static void take_identity(cogpu__node_t *n, const cogpu__m_reply_t *r) {
  n->slot = r->slot;
  n->gen = r->gen;
  n->res_slot = r->res_slot;
  n->res_gen = r->res_gen;
  n->secret[0] = r->secret[0];
  n->secret[1] = r->secret[1];
}

int cogpu__node_attach(const cogpu__config_t *cfg, const cogpu_attach_opts_t *o,
                       uint32_t for_uid, cogpu__node_t **out) {
  cogpu__node_t *n = calloc(1, sizeof *n);
  if (!n)
    return cogpu__seterr(-ENOMEM, "out of memory");
  pthread_mutex_init(&n->mu, NULL);
  n->usage_fd = -1;
  snprintf(n->sock, sizeof n->sock, "%s", cfg->v[COGPU_OPT_SOCKET].s);
  n->daemon_wait_ms = cfg->v[COGPU_OPT_DAEMON_WAIT].i;
  uint64_t dl = deadline_after(n->daemon_wait_ms);
  n->fd = sock_connect(n->sock, dl);
  if (n->fd < 0) {
    int rc = n->fd;
    free(n);
    return rc;
  }
  n->fd_id = fd_id(n->fd);
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_ATTACH, ++n->seq);
  cogpu__m_attach_t *a = &m.u.attach;
  a->priority = o ? o->priority : 0;
  if (for_uid != (uint32_t)-1) {
    a->flags |= COGPU_ATTACH_FOR_UID;
    a->for_uid = for_uid;
  }
  if (o && o->command)
    snprintf(a->command, sizeof a->command, "%s", o->command);
  else
    cogpu__self_cmdline(a->command, sizeof a->command);
  if (o && o->job_id)
    snprintf(a->job_id, sizeof a->job_id, "%s", o->job_id);
  if (o && o->join && *o->join) {
    unsigned ts, tg;
    char extra;
    if (strlen(o->join) >= sizeof a->join ||
        sscanf(o->join, "%u.%u%c", &ts, &tg, &extra) != 2) {
      cogpu__node_detach(n);
      return cogpu__seterr(-EINVAL, "invalid job token '%s'", o->join);
    }
    snprintf(a->join, sizeof a->join, "%s", o->join);
  }
  int rc = msg_send(n->fd, &m);
  if (rc == 0)
    rc = msg_recv(n->fd, &r, dl, NULL);
  if (rc == 0 && (r.type != COGPU_M_REPLY || r.seq != m.seq))
    rc = -EPROTO;
  if (rc == -EPIPE && older_daemon(n->sock, deadline_after(2000)) != 0)
    rc = -EPROTONOSUPPORT;
  if (rc == 0)
    rc = reply_rc(&r);
  else if (rc != -EPROTONOSUPPORT) /* the last error says what to upgrade */
    rc = cogpu__seterr(rc, "the node daemon did not accept this process: %s",
                       strerror(-rc));
  if (rc == 0) {
    take_identity(n, &r.u.reply);
    n->ngpus = r.u.reply.ngpus;
    n->policy = r.u.reply.policy;
    if (n->ngpus > NODE_MAX_GPUS)
      rc = cogpu__seterr(-EPROTO, "the node daemon reports %u GPUs", n->ngpus);
    for (uint32_t g = 0; rc == 0 && g < n->ngpus; g++) {
      cogpu__msg_t gm;
      rc = msg_recv(n->fd, &gm, dl, NULL);
      if (rc == 0 && gm.type != COGPU_M_GPU)
        rc = -EPROTO;
      if (rc == 0)
        n->gpus[g] = gm.u.gpu;
      else
        rc = cogpu__seterr(rc, "the node daemon's GPU list was cut short");
    }
  }
  if (rc) {
    close(n->fd);
    free(n);
    return rc;
  }
  if (r.u.reply.flags & COGPU_REPLY_PRIORITY_CAPPED)
    cogpu__log(COGPU_LOG_WARN, "%s", r.u.reply.msg);
  /* Served, but by another release: a node half way through an upgrade. */
  if (r.u.reply.release[0] && strcmp(r.u.reply.release, COGPU_VERSION_STRING))
    cogpu__log(COGPU_LOG_INFO,
               "cogpud on this node is cogpu %s; this program "
               "is cogpu %s",
               r.u.reply.release, COGPU_VERSION_STRING);
  *out = n;
  return 0;
}

static int msg_send_fd(int fd, const cogpu__msg_t *m, int passfd) {
  struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof *m};
  char cbuf[CMSG_SPACE(sizeof(int))];
  memset(cbuf, 0, sizeof cbuf);
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = cbuf,
                      .msg_controllen = sizeof cbuf};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &passfd, sizeof passfd);
  ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL);
  if (r == (ssize_t)sizeof *m)
    return 0;
  return r < 0 ? -errno : -EPIPE;
}

/* Passes the usage page on the main connection and waits for the answer
 * (mu held). */
static int usage_pass(cogpu__node_t *n, uint64_t dl) {
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_USAGE, ++n->seq);
  m.u.usage.size = (uint32_t)sizeof(cogpu__usage_t);
  if (!fd_is(n->usage_fd, n->usage_id))
    return -EBADF; /* closed by the program: never pass its files */
  int rc = msg_send_fd(n->fd, &m, n->usage_fd);
  while (rc == 0) {
    rc = msg_recv(n->fd, &r, dl, NULL);
    if (rc == 0 && r.type == COGPU_M_REPLY && r.seq == m.seq)
      return reply_rc(&r);
  }
  return rc;
}

/* The daemon went away: reconnect and re-register (mu held), trying again
 * while it restarts (a daemon can die again between accept and reply),
 * until the deadline. */
static int node_resume(cogpu__node_t *n, uint64_t dl) {
  if (fd_is(n->fd, n->fd_id))
    close(n->fd);
  n->fd = -1;
  if (n->lost)
    return cogpu__seterr(-ENOTCONN, "the node daemon no longer knows this "
                                    "process");
  for (;;) {
    int fd = sock_connect(n->sock, dl);
    if (fd < 0)
      return fd;
    cogpu__msg_t m, r;
    cogpu__msg_init(&m, COGPU_M_RESUME, ++n->seq);
    m.u.resume = (cogpu__m_resume_t){.slot = n->slot,
                                     .gen = n->gen,
                                     .secret = {n->secret[0], n->secret[1]},
                                     .res_slot = n->res_slot,
                                     .res_gen = n->res_gen};
    int rc = msg_send(fd, &m);
    if (rc == 0)
      rc = msg_recv(fd, &r, dl, NULL);
    if (rc == 0 && r.rc != 0) {
      /* The daemon lost its state (a new node state): this process's
       * reservations are gone with it, and nothing it does is accounted. */
      n->lost = true;
      cogpu__log(COGPU_LOG_ERROR,
                 "the node daemon no longer has this process's registration "
                 "(%s: it restarted with a new state, or this process's "
                 "connection closed while it held no memory): its GPU "
                 "memory is no longer accounted",
                 r.u.reply.msg);
      close(fd);
      return cogpu__seterr(-ENOTCONN, "the node daemon no longer knows this "
                                      "process");
    }
    if (rc == 0) {
      n->fd = fd;
      n->fd_id = fd_id(fd);
      cogpu__log(COGPU_LOG_INFO, "reconnected to the node daemon");
      /* The new daemon reads this process's usage from its page too. */
      if (n->usage_state == 1 && usage_pass(n, dl) != 0)
        cogpu__log(COGPU_LOG_WARN, "the restarted node daemon did not take "
                                   "this process's usage page");
      return 0;
    }
    close(fd);
    /* A daemon of a release that refuses this one's protocol (a package
     * downgraded under running jobs): the last error says what to do. */
    if (rc == -EPROTONOSUPPORT)
      return rc;
    if (rc == -EPIPE && ms_until(dl) == 0 &&
        older_daemon(n->sock, deadline_after(2000)) != 0)
      return -EPROTONOSUPPORT;
    if ((rc != -EPIPE && rc != -ECONNRESET && rc != -EPROTO) ||
        ms_until(dl) == 0)
      return cogpu__seterr(rc, "cannot re-register with the node daemon: %s",
                           strerror(-rc));
    usleep(5000);
  }
}

/* A reply that came after its request gave up: a grant nobody took is
 * given back at once. */
static void late_reply(cogpu__node_t *n, const cogpu__msg_t *r) {
  if (!n->late_seq || r->seq != n->late_seq)
    return;
  n->late_seq = 0;
  if (r->rc != 0 || r->u.reply.gpu < 0)
    return;
  cogpu__msg_t rel;
  cogpu__msg_init(&rel, COGPU_M_RELEASE, ++n->seq);
  rel.u.amount.gpu = r->u.reply.gpu;
  rel.u.amount.bytes = n->late_bytes;
  if (msg_send(n->fd, &rel) == 0)
    cogpu__log(COGPU_LOG_INFO, "gave back a grant that came too late");
}

/* A request on the main connection and its reply, within bound_ms (or
 * daemon_wait, whichever is shorter; -1: daemon_wait); after a daemon
 * restart, re-register and send it again (same seq: done at most once). */
static int rpc_bounded(cogpu__node_t *n, cogpu__msg_t *m, cogpu__msg_t *r,
                       int *fd_out, int64_t bound_ms) {
  if (n->forked)
    return cogpu__seterr(-EINVAL, "this handle belongs to the parent process "
                                  "(fork): attach again in the child");
  int64_t ms = n->daemon_wait_ms;
  if (bound_ms >= 0 && (ms < 0 || bound_ms < ms))
    ms = bound_ms;
  uint64_t dl = deadline_after(ms);
  pthread_mutex_lock(&n->mu);
  m->seq = ++n->seq;
  if (n->fd >= 0 && !fd_is(n->fd, n->fd_id)) {
    cogpu__log(COGPU_LOG_WARN,
               "the program closed this process's connection to the node "
               "daemon (descriptor %d is now another file): connecting "
               "again",
               n->fd);
    n->fd = -1; /* the program's now: neither written nor closed */
  }
  int rc = n->fd < 0 ? -EPIPE : 0;
  for (;;) {
    if (rc == 0)
      rc = msg_send(n->fd, m);
    while (rc == 0) {
      rc = msg_recv(n->fd, r, dl, fd_out);
      if (rc == 0 && r->type == COGPU_M_REPLY && r->seq == m->seq)
        break;
      if (rc == 0 && r->type == COGPU_M_REPLY)
        late_reply(n, r);
      if (fd_out && *fd_out >= 0) {
        close(*fd_out); /* came with a stale reply */
        *fd_out = -1;
      }
    }
    if (rc == 0 || (rc != -EPIPE && rc != -ECONNRESET && rc != -EPROTO))
      break;
    rc = node_resume(n, dl);
    if (rc)
      break;
  }
  if (rc == -ETIMEDOUT && m->type == COGPU_M_RESERVE &&
      !(m->u.reserve.flags & COGPU_REQ_EXCLUSIVE)) {
    /* The daemon may still grant it: remember to give it back. */
    n->late_seq = m->seq;
    n->late_bytes = m->u.reserve.bytes;
  }
  pthread_mutex_unlock(&n->mu);
  if (rc == -ETIMEDOUT)
    return cogpu__seterr(rc, "the node daemon did not answer in time");
  if (rc)
    return rc < 0 ? rc : -EIO;
  return reply_rc(r);
}

static int rpc_fd(cogpu__node_t *n, cogpu__msg_t *m, cogpu__msg_t *r,
                  int *fd_out) {
  return rpc_bounded(n, m, r, fd_out, -1);
}

static int rpc(cogpu__node_t *n, cogpu__msg_t *m, cogpu__msg_t *r) {
  return rpc_fd(n, m, r, NULL);
}

/* Ends the connection and waits (bounded) for the daemon to close its side,
 * which it does after freeing this client's slot: once cogpu_detach (or
 * `cogpu run`) returns, the node no longer counts the client, and its job
 * is in the history that the next command reads. */
static void hang_up(int fd) {
  uint64_t dl = deadline_after(500);
  if (shutdown(fd, SHUT_WR) == 0)
    for (;;) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      int ms = ms_until(dl);
      if (ms <= 0 || poll(&p, 1, ms) <= 0)
        break;
      char buf[512];
      ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
        break; /* closed by the daemon (or gone) */
    }
  close(fd);
}

void cogpu__node_detach(cogpu__node_t *n) {
  if (!n)
    return;
  if (!n->forked && fd_is(n->fd, n->fd_id)) {
    /* Said, so that the daemon gives the memory back at once: a connection
     * that closes unsaid is a process exiting, whose memory the daemon
     * keeps booked until the process has gone (the driver frees it then). */
    cogpu__msg_t m;
    cogpu__msg_init(&m, COGPU_M_DETACH, ++n->seq);
    (void)msg_send(n->fd, &m);
    hang_up(n->fd);
  }
  if (n->usage)
    munmap(n->usage, sizeof(cogpu__usage_t));
  if (fd_is(n->usage_fd, n->usage_id))
    close(n->usage_fd);
  pthread_mutex_destroy(&n->mu);
  free(n);
}

void cogpu__node_forked(cogpu__node_t *n) {
  if (fd_is(n->fd, n->fd_id))
    close(n->fd); /* the parent's connection stays open in the parent */
  n->fd = -1;
  n->forked = true;
  pthread_mutex_init(&n->mu, NULL);
  /* The parent's page stays the parent's: the child never writes it. */
  n->usage = NULL;
  if (fd_is(n->usage_fd, n->usage_id))
    close(n->usage_fd);
  n->usage_fd = -1;
  n->usage_state = 2;
}

/* --- requests ------------------------------------------------------------ */

static int check_gpu(cogpu__node_t *n, int gpu) {
  if (gpu < 0 || (uint32_t)gpu >= n->ngpus)
    return cogpu__seterr(-ENODEV, "no GPU %d on this node (%u GPUs)", gpu,
                         n->ngpus);
  return 0;
}

static int amount_rpc(cogpu__node_t *n, int type, int gpu, uint64_t bytes,
                      cogpu__msg_t *r) {
  int rc = check_gpu(n, gpu);
  if (rc)
    return rc;
  cogpu__msg_t m;
  cogpu__msg_init(&m, type, 0);
  m.u.amount.gpu = gpu;
  m.u.amount.bytes = bytes;
  return rpc(n, &m, r);
}

/* msg_recv for a waiting request: with an abort hook, in slices of
 * ab->every_ms, asking between them whether to give up (-ECANCELED). */
static int wait_recv(int fd, cogpu__msg_t *m, uint64_t deadline,
                     const cogpu__abort_t *ab) {
  if (!ab || !ab->stop)
    return msg_recv(fd, m, deadline, NULL);
  for (;;) {
    uint64_t slice = deadline_after(ab->every_ms > 0 ? ab->every_ms : 1000);
    int rc = msg_recv(fd, m, slice < deadline ? slice : deadline, NULL);
    if (rc != -ETIMEDOUT || ms_until(deadline) == 0)
      return rc;
    if (ab->stop(ab->arg))
      return -ECANCELED;
  }
}

/* The wait connection of one request (see the file comment). */
static int node_wait(cogpu__node_t *n, const cogpu_request_t *req, int *gpu_out,
                     const cogpu__abort_t *ab) {
  uint64_t deadline = deadline_after(req->timeout_ms);
  uint32_t prev_w = 0;
  uint64_t prev_ticket = 0;
  /* The request's id, the same across daemon restarts: a grant the daemon
   * made before it died is handed over, not made twice. */
  pthread_mutex_lock(&n->mu);
  uint32_t op = ++n->seq;
  pthread_mutex_unlock(&n->mu);
  for (int restarts = 0;; restarts++) {
    int fd = sock_connect(n->sock, deadline_after(n->daemon_wait_ms));
    if (fd < 0)
      return fd;
    cogpu__msg_t m, r;
    cogpu__msg_init(&m, COGPU_M_WAIT, op);
    m.u.wait.who = (cogpu__m_resume_t){.slot = n->slot,
                                       .gen = n->gen,
                                       .secret = {n->secret[0], n->secret[1]},
                                       .res_slot = n->res_slot,
                                       .res_gen = n->res_gen};
    m.u.wait.req = (cogpu__m_reserve_t){.gpu = req->gpu,
                                        .flags = req->flags,
                                        .bytes = req->bytes,
                                        .priority = req->priority,
                                        .timeout_ms = req->timeout_ms};
    m.u.wait.prev_waiter = prev_w;
    m.u.wait.prev_ticket = prev_ticket;
    int rc = msg_send(fd, &m);
    for (;;) {
      if (rc == 0)
        rc = wait_recv(fd, &r, deadline, ab);
      if (rc == 0 && r.type == COGPU_M_REPLY &&
          (r.u.reply.flags & COGPU_REPLY_QUEUED)) {
        prev_w = r.u.reply.waiter + 1;
        prev_ticket = r.u.reply.ticket;
        continue;
      }
      if (rc == 0 && r.type == COGPU_M_REPLY &&
          (r.u.reply.flags & COGPU_REPLY_SUSPENDED)) {
        char sz[32];
        cogpu__log(COGPU_LOG_WARN,
                   "suspended: this job's %s on GPU %d moved to host "
                   "memory so that other jobs can run; it resumes, with "
                   "this request, when the GPU has room",
                   cogpu__fmt_size(r.u.reply.a, sz, sizeof sz), r.u.reply.gpu);
        continue;
      }
      break;
    }
    if (rc == 0 && r.type == COGPU_M_REPLY && r.rc == 0 &&
        (r.u.reply.flags & COGPU_REPLY_RESUMED))
      cogpu__log(COGPU_LOG_WARN, "resumed after %.1f s suspended",
                 (double)r.u.reply.a / 1000.0);
    if (rc == 0 && r.type == COGPU_M_REPLY && r.rc == 0) {
      cogpu__msg_t ack;
      cogpu__msg_init(&ack, COGPU_M_ACK, 2);
      rc = msg_send(fd, &ack);
      close(fd);
      if (rc == 0) {
        if (gpu_out)
          *gpu_out = r.u.reply.gpu;
        return 0;
      }
      /* The daemon went away before the acknowledgement: it takes the
       * grant back when it recovers; ask again. */
    } else {
      close(fd); /* a timeout cancels the request in the daemon */
      if (rc == 0)
        return reply_rc(&r);
      if (rc == -ECANCELED)
        return cogpu__seterr(-ECANCELED, "the wait was given up");
      if (rc == -ETIMEDOUT) {
        char need[32];
        return cogpu__seterr(
            -ETIMEDOUT, "timed out after %lld ms waiting for %s",
            (long long)req->timeout_ms,
            req->flags & COGPU_REQ_EXCLUSIVE
                ? "exclusive use"
                : cogpu__fmt_size(req->bytes, need, sizeof need));
      }
    }
    /* The daemon restarted: re-register, then wait again, keeping the
     * queue entry if the daemon still has it. */
    pthread_mutex_lock(&n->mu);
    rc = node_resume(n, deadline_after(n->daemon_wait_ms));
    pthread_mutex_unlock(&n->mu);
    if (rc)
      return rc;
    if (ms_until(deadline) == 0 || restarts > 100)
      return cogpu__seterr(-ETIMEDOUT, "timed out waiting across a restart "
                                       "of the node daemon");
  }
}

int cogpu__node_reserve(cogpu__node_t *n, const cogpu_request_t *req,
                        int *gpu_out, const cogpu__abort_t *ab) {
  if (!req)
    return cogpu__seterr(-EINVAL, "cogpu_reserve: NULL request");
  if (req->gpu != COGPU_GPU_AUTO && check_gpu(n, req->gpu))
    return -ENODEV;
  if (req->flags & ~COGPU__REQ_FLAGS)
    return cogpu__seterr(-EINVAL, "unknown request flags 0x%x", req->flags);
  if (req->timeout_ms < COGPU_WAIT_FOREVER)
    return cogpu__seterr(-EINVAL, "negative timeout %lld ms",
                         (long long)req->timeout_ms);
  if (!(req->flags & COGPU_REQ_EXCLUSIVE) && req->bytes == 0)
    return cogpu__seterr(-EINVAL, "cannot reserve 0 bytes");
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_RESERVE, 0);
  m.u.reserve = (cogpu__m_reserve_t){.gpu = req->gpu,
                                     .flags = req->flags,
                                     .bytes = req->bytes,
                                     .priority = req->priority,
                                     .timeout_ms = req->timeout_ms};
  /* The daemon answers at once (it never waits here); the bound tells it
   * whether a refusal is final or a wait follows, for its counters. The
   * request's own bound covers the daemon's answer too. */
  uint64_t t0 = cogpu__now_ns() / 1000000u;
  int rc =
      rpc_bounded(n, &m, &r, NULL, req->timeout_ms > 0 ? req->timeout_ms : -1);
  if (rc == 0) {
    if (gpu_out)
      *gpu_out = r.u.reply.gpu;
    return 0;
  }
  if (rc != -EAGAIN || req->timeout_ms == COGPU_NOWAIT)
    return rc;
  cogpu_request_t rest = *req;
  if (rest.timeout_ms > 0) {
    uint64_t spent = cogpu__now_ns() / 1000000u - t0;
    rest.timeout_ms = spent >= (uint64_t)rest.timeout_ms
                          ? 1
                          : rest.timeout_ms - (int64_t)spent;
  }
  return node_wait(n, &rest, gpu_out, ab);
}

int cogpu__node_release(cogpu__node_t *n, int gpu, uint64_t bytes) {
  cogpu__msg_t r;
  return amount_rpc(n, COGPU_M_RELEASE, gpu, bytes, &r);
}

int cogpu__node_held(cogpu__node_t *n, int gpu, uint64_t *bytes) {
  cogpu__msg_t r;
  if (!bytes)
    return cogpu__seterr(-EINVAL, "bytes is NULL");
  int rc = amount_rpc(n, COGPU_M_HELD, gpu, 0, &r);
  if (rc == 0)
    *bytes = r.u.reply.a;
  return rc;
}

uint64_t cogpu__node_job_spare(cogpu__node_t *n, int gpu) {
  cogpu__msg_t r;
  if (n->res_slot == n->slot)
    return 0;
  return amount_rpc(n, COGPU_M_HELD, gpu, 0, &r) ? 0 : r.u.reply.b;
}

uint64_t cogpu__node_left_ago_ms(cogpu__node_t *n) {
  cogpu__msg_t r;
  if (n->ngpus == 0 || amount_rpc(n, COGPU_M_ROOM, 0, 0, &r) != 0)
    return UINT64_MAX;
  return r.u.reply.ticket;
}

int cogpu__node_room(cogpu__node_t *n, int gpu, uint64_t *capacity,
                     uint64_t *free_bytes) {
  cogpu__msg_t r;
  int rc = amount_rpc(n, COGPU_M_ROOM, gpu, 0, &r);
  if (rc == 0) {
    *capacity = r.u.reply.a;
    *free_bytes = r.u.reply.b;
  }
  return rc;
}

int cogpu__node_recheck(cogpu__node_t *n, int gpu, uint64_t *over) {
  cogpu__msg_t r;
  int rc = amount_rpc(n, COGPU_M_RECHECK, gpu, 0, &r);
  *over = rc == 0 ? r.u.reply.a : 0;
  return rc;
}

int cogpu__node_claim(cogpu__node_t *n, int gpu, uint64_t want, uint64_t *got) {
  cogpu__msg_t r;
  *got = 0;
  int rc = amount_rpc(n, COGPU_M_CLAIM, gpu, want, &r);
  if (rc == 0)
    *got = r.u.reply.a;
  return rc;
}

int cogpu__node_unclaim(cogpu__node_t *n, int gpu, uint64_t bytes) {
  cogpu__msg_t r;
  return amount_rpc(n, COGPU_M_UNCLAIM, gpu, bytes, &r);
}

int cogpu__node_find_job(cogpu__node_t *n, const char *job_id, char *tok,
                         size_t len) {
  if (!job_id || !*job_id || len < 24)
    return cogpu__seterr(-EINVAL, "find_job: empty job id or short buffer");
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_FIND_JOB, 0);
  if (strlen(job_id) >= sizeof m.u.find_job.job_id)
    return cogpu__seterr(-ESRCH, "no live job '%s' on this node", job_id);
  snprintf(m.u.find_job.job_id, sizeof m.u.find_job.job_id, "%s", job_id);
  int rc = rpc(n, &m, &r);
  if (rc == 0)
    snprintf(tok, len, "%u.%u", r.u.reply.slot, r.u.reply.gen);
  return rc;
}

int cogpu__node_mark(cogpu__node_t *n, uint32_t flags) {
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_MARK, 0);
  m.u.mark.flags = flags;
  return rpc(n, &m, &r);
}

int cogpu__node_suspend(const cogpu__config_t *cfg, int pid, const char *job_id,
                        bool resume, int64_t timeout_ms, uint64_t *bytes,
                        uint64_t *ms, uint64_t *took_ms) {
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_SUSPEND, 1);
  m.u.suspend.pid = pid;
  m.u.suspend.resume = resume;
  if (job_id && strlen(job_id) >= sizeof m.u.suspend.job_id)
    return cogpu__seterr(-ESRCH, "no job '%s' on this node", job_id);
  snprintf(m.u.suspend.job_id, sizeof m.u.suspend.job_id, "%s",
           job_id ? job_id : "");
  int fd = sock_connect(cfg->v[COGPU_OPT_SOCKET].s,
                        deadline_after(cfg->v[COGPU_OPT_DAEMON_WAIT].i));
  if (fd < 0)
    return fd;
  /* Answered when done: a suspension takes seconds per tens of GiB, and a
   * resume waits for room on the GPU. Giving up here leaves it under way. */
  uint64_t dl = deadline_after(timeout_ms);
  int rc = msg_send(fd, &m);
  while (rc == 0) {
    rc = msg_recv(fd, &r, dl, NULL);
    if (rc == 0 && (r.type != COGPU_M_REPLY || r.seq != m.seq))
      continue;
    break;
  }
  close(fd);
  if (rc == -ETIMEDOUT)
    return cogpu__seterr(rc,
                         "not done after %lld ms; it goes on in the "
                         "node daemon (see cogpu status)",
                         (long long)timeout_ms);
  if (rc)
    return cogpu__seterr(rc, "the node daemon closed the connection");
  if (bytes)
    *bytes = r.u.reply.a;
  if (ms)
    *ms = r.u.reply.b;
  if (took_ms)
    *took_ms = r.u.reply.ticket;
  return reply_rc(&r);
}

int cogpu__node_job_token(cogpu__node_t *n, char *buf, size_t len) {
  if (!buf || len < 24)
    return cogpu__seterr(-EINVAL, "cogpu_job_token: buffer too small");
  snprintf(buf, len, "%u.%u", n->res_slot,
           n->res_slot == n->slot ? n->gen : n->res_gen);
  return 0;
}

int cogpu__node_step_token(cogpu__node_t *n, char *buf, size_t len) {
  if (!buf || len < 24)
    return cogpu__seterr(-EINVAL, "cogpu__step_token: buffer too small");
  snprintf(buf, len, "%u.%u", n->slot, n->gen);
  return 0;
}

int cogpu__node_gpu_count(cogpu__node_t *n) {
  return (int)n->ngpus;
}

int cogpu__node_gpu_lookup(cogpu__node_t *n, const char *spec, int *gpu) {
  const char *uuids[NODE_MAX_GPUS];
  for (uint32_t g = 0; g < n->ngpus; g++)
    uuids[g] = n->gpus[g].uuid;
  return cogpu__gpu_spec(spec, uuids, n->ngpus, gpu);
}

/* --- usage --------------------------------------------------------------- */

/* The page is a memfd sealed against shrinking and growing, so that the
 * daemon's mapping of it can never fault; the daemon maps it read-only. */
cogpu__usage_t *cogpu__node_usage_page(cogpu__node_t *n) {
  if (!n || n->forked)
    return NULL;
  pthread_mutex_lock(&n->mu);
  if (n->usage_state == 0) {
    n->usage_state = 2;
    size_t size = sizeof(cogpu__usage_t);
    int fd = memfd_create("cogpu-usage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)size) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
      p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int rc = p == MAP_FAILED ? -errno : 0;
    if (rc == 0) {
      n->usage_fd = fd;
      n->usage_id = fd_id(fd);
      n->usage = p;
      rc =
          n->fd < 0 ? -EPIPE : usage_pass(n, deadline_after(n->daemon_wait_ms));
    }
    if (rc == 0) {
      n->usage_state = 1;
    } else {
      cogpu__log(COGPU_LOG_WARN,
                 "this process's GPU memory use will not reach its job's "
                 "record: %s",
                 rc < 0 ? strerror(-rc) : cogpu_last_error());
      if (p != MAP_FAILED)
        munmap(p, size);
      if (fd >= 0)
        close(fd);
      n->usage = NULL;
      n->usage_fd = -1;
    }
  }
  cogpu__usage_t *u = n->usage;
  pthread_mutex_unlock(&n->mu);
  return u;
}

int cogpu__node_job_end(cogpu__node_t *n, int exit_status, bool step,
                        cogpu__job_report_t *out) {
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_JOB_END, 0);
  m.u.job_end.exit_status = exit_status < 0 ? -1 : exit_status;
  m.u.job_end.flags = step ? COGPU_JOB_END_STEP : 0;
  int rc = rpc(n, &m, &r);
  if (rc)
    return rc;
  const cogpu__m_reply_t *p = &r.u.reply;
  *out = (cogpu__job_report_t){.gpu = p->gpu,
                               .peak = p->a,
                               .reserved = p->b,
                               .peak_after_ms = p->c,
                               .waited_ms = p->d,
                               .run_ms = p->e,
                               .suspensions = p->n1,
                               .guard_failures = p->n2,
                               .escaped = p->ticket};
  return 0;
}

/* --- status and reset ---------------------------------------------------- */

int cogpu__node_status(const cogpu__config_t *cfg, cogpu__node_t *n,
                       cogpu_status_t **out) {
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_STATUS, 1);
  int mfd = -1;
  /* On the process's own connection, the daemon marks its entries. */
  int rc = n ? rpc_fd(n, &m, &r, &mfd) : query(cfg, &m, &r, &mfd);
  if (rc == 0)
    rc = reply_rc(&r);
  if (rc == 0 && mfd < 0)
    rc = cogpu__seterr(-EPROTO, "the node daemon sent no snapshot");
  struct stat sb;
  if (rc == 0 && (fstat(mfd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
                  sb.st_size <= 0 || sb.st_size > (256 << 20)))
    rc = cogpu__seterr(-EPROTO, "the node daemon's snapshot is unreadable");
  cogpu_status_t *st = NULL;
  if (rc == 0) {
    /* Read, not mapped: a file that changed size under us cannot fault. */
    size_t size = (size_t)sb.st_size;
    char *buf = cogpu__fault_fails(COGPU_FP_CLIENT_ALLOC) ? NULL : malloc(size);
    st = calloc(1, sizeof *st);
    ssize_t got = buf ? pread(mfd, buf, size, 0) : -1;
    if (!buf || !st)
      rc = cogpu__seterr(-ENOMEM,
                         "out of memory for the node's status snapshot "
                         "(%zu bytes)",
                         size);
    else if (got != (ssize_t)size || cogpu__snap_parse(buf, size, st) != 0)
      rc = cogpu__seterr(-EPROTO, "the node daemon's snapshot is malformed");
    free(buf);
  }
  if (mfd >= 0)
    close(mfd);
  if (rc) {
    cogpu_status_free(st);
    return rc;
  }
  *out = st;
  return 0;
}

int cogpu__node_history(const cogpu__config_t *cfg, bool has_uid, uint32_t uid,
                        int64_t since_s, uint32_t last, int *mfd) {
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_HISTORY, 1);
  m.u.history = (cogpu__m_history_t){
      .last = last, .has_uid = has_uid, .uid = uid, .since_s = since_s};
  *mfd = -1;
  int rc = query(cfg, &m, &r, mfd);
  if (rc == 0)
    rc = reply_rc(&r);
  if (rc == 0 && *mfd < 0)
    rc = cogpu__seterr(-EPROTO, "the node daemon sent no history");
  if (rc && *mfd >= 0) {
    close(*mfd);
    *mfd = -1;
  }
  return rc;
}

int cogpu__node_reset(const cogpu__config_t *cfg, bool force, int *live) {
  cogpu__msg_t m, r;
  cogpu__msg_init(&m, COGPU_M_RESET, 1);
  m.u.reset.force = force;
  int rc = query(cfg, &m, &r, NULL);
  if (rc == 0 && live)
    *live = (int)r.u.reply.a;
  return rc ? rc : reply_rc(&r);
}
