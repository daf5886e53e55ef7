/*
 * proto.c: building and checking node-protocol messages (proto.h). The
 * check is the daemon's only way in for client bytes, so it is strict: a
 * message that is not exactly one known, well-formed message is refused,
 * and the daemon ends that connection.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cogpu.h"
#include "internal.h"
#include "node/proto.h"

uint16_t cogpu__proto_client_version = COGPU_PROTO_VERSION;

void cogpu__msg_init(cogpu__msg_t *m, int type, uint32_t seq) {
  memset(m, 0, sizeof *m);
  m->magic = COGPU_PROTO_MAGIC;
  m->version = cogpu__proto_client_version;
  m->type = (uint16_t)type;
  m->seq = seq;
}

bool cogpu__msg_str_ok(const char *s, size_t size) {
  return memchr(s, 0, size) != NULL;
}

/* Calls fn on each descriptor of mh's SCM_RIGHTS headers, bounded by the
 * control data the kernel filled in; returns how many there were. */
static int each_fd(const struct msghdr *mh, void (*fn)(int, void *),
                   void *arg) {
  int n = 0;
  const char *end = (const char *)mh->msg_control + mh->msg_controllen;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR((struct msghdr *)mh); cm;
       cm = CMSG_NXTHDR((struct msghdr *)mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
        cm->cmsg_len < CMSG_LEN(0))
      continue;
    const char *data = (const char *)CMSG_DATA(cm);
    size_t len = cm->cmsg_len - CMSG_LEN(0);
    if (len > (size_t)(end - data))
      len = (size_t)(end - data);
    for (size_t k = 0; k + sizeof(int) <= len; k += sizeof(int), n++) {
      int fd;
      memcpy(&fd, data + k, sizeof fd);
      if (fn)
        fn(fd, arg);
    }
  }
  return n;
}

static void close_fd(int fd, void *arg) {
  (void)arg;
  close(fd);
}

static void take_fd(int fd, void *arg) {
  *(int *)arg = fd;
}

int cogpu__msg_fds(const struct msghdr *mh, int *fd) {
  if (!mh->msg_control || mh->msg_controllen < sizeof(struct cmsghdr))
    return (mh->msg_flags & MSG_CTRUNC) ? -1 : 0;
  int n = each_fd(mh, NULL, NULL);
  bool cut = (mh->msg_flags & MSG_CTRUNC) != 0;
  if (n == 1 && !cut && fd)
    each_fd(mh, take_fd, fd);
  else
    each_fd(mh, close_fd, NULL);
  return cut ? -1 : n;
}

#define STR_OK(field) cogpu__msg_str_ok((field), sizeof(field))

static int bad(char *why, size_t len, const char *what) {
  snprintf(why, len, "%s", what);
  return -EPROTO;
}

/* GPU indices are checked against the node's GPUs by the daemon; here only
 * the range any node can have. */
static bool gpu_ok(int32_t gpu, bool auto_ok) {
  return (auto_ok && gpu == COGPU_GPU_AUTO) || (gpu >= 0 && gpu < 64);
}

static int check_reserve(const cogpu__m_reserve_t *r, char *why, size_t len) {
  if (!gpu_ok(r->gpu, true))
    return bad(why, len, "reserve: bad GPU");
  if (r->flags & ~COGPU__REQ_FLAGS)
    return bad(why, len, "reserve: unknown flags");
  if (r->timeout_ms < COGPU_WAIT_FOREVER)
    return bad(why, len, "reserve: negative timeout");
  if (!(r->flags & COGPU_REQ_EXCLUSIVE) && r->bytes == 0)
    return bad(why, len, "reserve: 0 bytes");
  if (r->pad)
    return bad(why, len, "reserve: reserved field not zero");
  return 0;
}

int cogpu__msg_check(const cogpu__msg_t *m, size_t len, char *why, size_t wl) {
  if (len != sizeof *m)
    return bad(why, wl, "message of the wrong size");
  if (m->magic != COGPU_PROTO_MAGIC)
    return bad(why, wl, "bad magic");
  if (m->version < COGPU_PROTO_VERSION_MIN ||
      m->version > COGPU_PROTO_VERSION) {
    snprintf(why, wl, "protocol version %u (this build accepts %u to %u)",
             (unsigned)m->version, COGPU_PROTO_VERSION_MIN,
             COGPU_PROTO_VERSION);
    return -EPROTONOSUPPORT;
  }
  switch (m->type) {
  case COGPU_M_ATTACH: {
    const cogpu__m_attach_t *a = &m->u.attach;
    if (!STR_OK(a->command) || !STR_OK(a->job_id) || !STR_OK(a->join))
      return bad(why, wl, "attach: unterminated string");
    if (a->flags & ~COGPU_ATTACH_FOR_UID || a->pad)
      return bad(why, wl, "attach: unknown flags");
    if (a->priority < -1000000 || a->priority > 1000000)
      return bad(why, wl, "attach: priority out of range");
    return 0;
  }
  case COGPU_M_RESUME:
    return 0; /* every value is checked against the slot it names */
  case COGPU_M_RESERVE:
    return check_reserve(&m->u.reserve, why, wl);
  case COGPU_M_WAIT:
    return check_reserve(&m->u.wait.req, why, wl);
  case COGPU_M_RELEASE:
    if (!gpu_ok(m->u.amount.gpu, false))
      return bad(why, wl, "release: bad GPU");
    return 0;
  case COGPU_M_CLAIM:
  case COGPU_M_UNCLAIM:
  case COGPU_M_ROOM:
  case COGPU_M_RECHECK:
  case COGPU_M_HELD:
    if (!gpu_ok(m->u.amount.gpu, false))
      return bad(why, wl, "bad GPU");
    return 0;
  case COGPU_M_FIND_JOB:
    if (!STR_OK(m->u.find_job.job_id) || !m->u.find_job.job_id[0])
      return bad(why, wl, "find_job: empty or unterminated job id");
    return 0;
  case COGPU_M_RESET:
    if (m->u.reset.force > 1)
      return bad(why, wl, "reset: bad force flag");
    return 0;
  case COGPU_M_MARK:
    if (m->u.mark.pad)
      return bad(why, wl, "mark: bad padding");
    return 0;
  case COGPU_M_SUSPEND:
    if (!STR_OK(m->u.suspend.job_id) || m->u.suspend.resume > 1 ||
        m->u.suspend.pid < 0 ||
        (m->u.suspend.pid == 0 && !m->u.suspend.job_id[0]))
      return bad(why, wl, "suspend: no job named, or bad fields");
    return 0;
  case COGPU_M_USAGE:
    if (m->u.usage.pad)
      return bad(why, wl, "usage: bad padding");
    return 0; /* the size is checked against the passed memfd */
  case COGPU_M_JOB_END:
    if ((m->u.job_end.flags & ~COGPU_JOB_END_STEP) ||
        m->u.job_end.exit_status < -1)
      return bad(why, wl, "job_end: bad fields");
    return 0;
  case COGPU_M_HISTORY:
    if (m->u.history.pad || m->u.history.has_uid > 1 ||
        m->u.history.since_s < 0)
      return bad(why, wl, "history: bad fields");
    return 0;
  case COGPU_M_DETACH:
  case COGPU_M_ACK:
  case COGPU_M_STATUS:
    return 0;
  case COGPU_M_REPLY:
    if (!STR_OK(m->u.reply.msg))
      return bad(why, wl, "reply: unterminated message");
    if (m->version >= 3 && !STR_OK(m->u.reply.release))
      return bad(why, wl, "reply: unterminated release");
    return 0;
  case COGPU_M_GPU:
    if (!STR_OK(m->u.gpu.uuid) || !STR_OK(m->u.gpu.name))
      return bad(why, wl, "gpu: unterminated string");
    return 0;
  default:
    return bad(why, wl, "unknown message type");
  }
}

/* Requests are laid out alike in versions 2 and 3: only the version
 * changes. A later version that moves a request's fields translates them
 * here, from the layout m->version names. */
void cogpu__msg_to_current(cogpu__msg_t *m) {
  m->version = COGPU_PROTO_VERSION;
}

void cogpu__msg_to_version(cogpu__msg_t *m, uint16_t v) {
  m->version = v;
  /* Version 2 replies end before release: bytes its clients never read,
   * zero as version 2 daemons sent them. */
  if (v < 3 && m->type == COGPU_M_REPLY)
    memset(m->u.reply.release, 0, sizeof m->u.reply.release);
}

void cogpu__msg_refusal(cogpu__msg_t *r, const cogpu__msg_t *req) {
  memset(r, 0, sizeof *r);
  r->magic = COGPU_PROTO_MAGIC;
  r->version = COGPU_PROTO_VERSION;
  r->type = COGPU_M_REPLY;
  r->seq = req->seq;
  r->rc = -EPROTONOSUPPORT;
  r->u.reply.gpu = -1;
  r->u.reply.a = COGPU_PROTO_VERSION_MIN;
  r->u.reply.b = COGPU_PROTO_VERSION;
  snprintf(r->u.reply.msg, sizeof r->u.reply.msg, "%s", COGPU_VERSION_STRING);
  snprintf(r->u.reply.release, sizeof r->u.reply.release, "%s",
           COGPU_VERSION_STRING);
}

bool cogpu__msg_is_refusal(const cogpu__msg_t *m, size_t len) {
  /* Only what every version keeps in place: the header, a, b and msg. */
  return len == sizeof *m && m->magic == COGPU_PROTO_MAGIC &&
         m->type == COGPU_M_REPLY && m->rc == -EPROTONOSUPPORT &&
         m->u.reply.a <= m->u.reply.b && m->u.reply.b <= UINT16_MAX &&
         STR_OK(m->u.reply.msg);
}
