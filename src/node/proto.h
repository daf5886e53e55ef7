/*
 * proto.h: the node protocol between cogpud (the node daemon) and its
 * clients (libcogpu, the preload library, the CLI, the Slurm plug-in).
 *
 * Transport: a SOCK_SEQPACKET Unix socket, so each message arrives whole or
 * not at all; a message of any size other than sizeof(cogpu__msg_t) shows as
 * MSG_TRUNC or a short read and ends that connection. Every message has the
 * same fixed size and layout: a versioned header and a union of payloads.
 * Every field is validated by cogpu__msg_check() before it is used; strings
 * must be NUL-terminated inside their field. Identity never comes from a
 * message: the daemon takes the peer's uid, gid and pid from SO_PEERCRED.
 *
 * Connections:
 *  - the main connection of an attached process: ATTACH (or RESUME after a
 *    daemon restart) first, then requests, each answered by one REPLY with
 *    the same seq. Closing it detaches: the daemon frees the process's slot.
 *  - a wait connection, one per request that must wait: WAIT names the
 *    slot (authenticated by the secret from ATTACH and the peer's uid) and
 *    the request. The daemon answers when the policy serves it (REPLY rc 0)
 *    or refuses it; the client confirms a grant with ACK. A wait connection
 *    closed before ACK cancels the request, and a grant not acknowledged is
 *    taken back, so a client that gives up at its own deadline never leaves
 *    memory booked to itself.
 *  - a query connection: STATUS (answered with a sealed memfd holding the
 *    snapshot) or RESET, without attaching.
 *
 * Versions (rolling upgrades: the processes of a node are not all upgraded
 * at once; a job started before a package upgrade keeps running on the old
 * library against the restarted, newer cogpud):
 *  - the header (magic, version, type, seq, rc) and the message size never
 *    change; version names the layout of the rest.
 *  - every message of a connection carries the version of its first. The
 *    daemon accepts COGPU_PROTO_VERSION_MIN to COGPU_PROTO_VERSION, the
 *    current one and the one before it (one release), translates an older
 *    request to the current form on the way in (cogpu__msg_to_current) and
 *    answers it in its own layout (cogpu__msg_to_version).
 *  - a version the daemon does not accept is answered, before it ends the
 *    connection, with a refusal that every version can read: a REPLY whose
 *    header carries the daemon's own version, rc -EPROTONOSUPPORT, a and b
 *    the lowest and highest version it accepts, and msg its release
 *    ("0.1.0"); a client reads it as such whatever its version
 *    (cogpu__msg_is_refusal) and says what to upgrade. Version 2 daemons
 *    (cogpu 0.1.0) ended the connection without a word: a client that gets
 *    no answer at all asks again in the version before its own
 *    (client.c).
 *  - what travels beside messages is part of the version too: the
 *    snapshot (COGPU_SNAP_VERSION) and history memfds a client reads, and
 *    the usage page it passes (its size is checked). A version that changes
 *    one of them has the daemon write and read the older layout for a
 *    client of the older version.
 * Version history: 2: cogpu 0.1.0. 3: the refusal above; replies carry the
 * daemon's release (reply.release); the snapshot is version 4 (the
 * checkpoint copies' counters), version 3 for a client of protocol 2.
 * Requests are the same in 2 and 3.
 */
#ifndef COGPU_NODE_PROTO_H
#define COGPU_NODE_PROTO_H

#include <stdbool.h>
#include <stdint.h>

#include "cogpu.h"

#define COGPU_PROTO_MAGIC 0x55504743u /* "CGPU" */
#define COGPU_PROTO_VERSION 3u
/* The oldest version cogpud still serves: the previous release's. */
#define COGPU_PROTO_VERSION_MIN 2u
#define COGPU_MSG_SIZE 512u

enum cogpu__msg_type {
  COGPU_M_ATTACH = 1, /* main connection: register this process */
  COGPU_M_RESUME,     /* main connection: re-register after a restart */
  COGPU_M_RESERVE,    /* try to reserve now (never waits) */
  COGPU_M_RELEASE,
  COGPU_M_CLAIM,   /* take part of the job's reservation */
  COGPU_M_UNCLAIM, /* give it back to the job */
  COGPU_M_ROOM,    /* capacity and free bytes of a GPU; job's spare */
  COGPU_M_HELD,
  COGPU_M_FIND_JOB,
  COGPU_M_DETACH,  /* main connection: it detaches; its memory is freed at
                      the close (unsaid, only once its process has gone) */
  COGPU_M_WAIT,    /* wait connection: a request that waits */
  COGPU_M_ACK,     /* wait connection: the grant was received */
  COGPU_M_STATUS,  /* query connection: snapshot in a memfd */
  COGPU_M_RESET,   /* query connection: admin only */
  COGPU_M_MARK,    /* main connection: what this process uses (backend.h) */
  COGPU_M_SUSPEND, /* query connection: suspend or resume a job; answered
                      when done */
  COGPU_M_USAGE,   /* main connection: this process's usage page (a sealed
                      memfd passed with SCM_RIGHTS; backend.h) */
  COGPU_M_JOB_END, /* main connection: the job's exit status; the reply
                      is its end-of-job report */
  COGPU_M_HISTORY, /* query connection: finished jobs (a memfd) */
  COGPU_M_RECHECK, /* main connection: re-read foreign memory on a GPU;
                      the reply's a is the GPU's over-commitment */
  COGPU_M_REPLY = 64,
  COGPU_M_GPU, /* after ATTACH's reply: one per GPU */
  COGPU_M__MAX
};

/* Payloads. Sizes are fixed; strings are NUL-terminated in their field. */
typedef struct cogpu__m_attach_s {
  int32_t priority;
  uint32_t for_uid; /* root only: book the job for this user (Slurm) */
  uint32_t flags;   /* COGPU_ATTACH_* */
  uint32_t pad;
  char command[128];
  char job_id[64];
  char join[24]; /* job token "slot.gen", or empty */
} cogpu__m_attach_t;
#define COGPU_ATTACH_FOR_UID 0x1u

typedef struct cogpu__m_resume_s {
  uint32_t slot, gen;
  uint64_t secret[2];
  uint32_t res_slot, res_gen;
} cogpu__m_resume_t;

typedef struct cogpu__m_reserve_s {
  int32_t gpu; /* or COGPU_GPU_AUTO */
  uint32_t flags;
  uint64_t bytes;
  int32_t priority; /* or COGPU_PRIORITY_DEFAULT */
  uint32_t pad;
  int64_t timeout_ms; /* WAIT: the client's bound, for status only */
} cogpu__m_reserve_t;

typedef struct cogpu__m_wait_s {
  cogpu__m_resume_t who;
  cogpu__m_reserve_t req;
  /* After a daemon restart: the queue entry this request had, so that it
   * keeps its place (0 for a new request). */
  uint32_t prev_waiter;
  uint32_t pad;
  uint64_t prev_ticket;
} cogpu__m_wait_t;

typedef struct cogpu__m_gpu_amount_s {
  int32_t gpu;
  uint32_t pad;
  uint64_t bytes;
} cogpu__m_gpu_amount_t;

typedef struct cogpu__m_find_job_s {
  char job_id[64];
} cogpu__m_find_job_t;

typedef struct cogpu__m_reset_s {
  uint32_t force;
} cogpu__m_reset_t;

typedef struct cogpu__m_mark_s {
  uint32_t flags; /* COGPU_MARK_* (backend.h); checked by the daemon */
  uint32_t pad;
} cogpu__m_mark_t;

/* SUSPEND: the job named by a process's pid (any of its processes) or by
 * its job id; resume 1 to resume it. */
typedef struct cogpu__m_suspend_s {
  int32_t pid; /* 0: by job_id */
  uint32_t resume;
  char job_id[64];
} cogpu__m_suspend_t;

typedef struct cogpu__m_usage_s {
  uint32_t size; /* sizeof(cogpu__usage_t) */
  uint32_t pad;
} cogpu__m_usage_t;

typedef struct cogpu__m_job_end_s {
  int32_t exit_status; /* a wait(2) status, or -1: unknown */
  uint32_t flags;      /* COGPU_JOB_END_* */
} cogpu__m_job_end_t;
/* The report of the sender's step (cogpu__step_end), not its job's. */
#define COGPU_JOB_END_STEP 1u

/* HISTORY: the records the asking user may see (all for root and the
 * admin group), newest first; answered with a sealed memfd of
 * cogpu__hist_hdr_t and its records (history/history.h). */
typedef struct cogpu__m_history_s {
  uint32_t last;    /* at most this many (0: no bound) */
  uint32_t has_uid; /* 1: only user uid's */
  uint32_t uid;
  uint32_t pad;
  int64_t since_s; /* ended at or after (Unix seconds; 0: any) */
} cogpu__m_history_t;

/* REPLY: rc 0 or a negative code; msg explains a failure. */
typedef struct cogpu__m_reply_s {
  int32_t gpu;
  uint32_t flags; /* COGPU_REPLY_* */
  uint64_t a, b;  /* per request: room (capacity, free), held, spare...
                     ROOM: ticket is how long ago a client last left (ms) */
  /* ATTACH/RESUME: who the client is now. WAIT: queue entry. */
  uint32_t slot, gen, res_slot, res_gen;
  uint64_t secret[2];
  uint32_t ngpus, policy;
  uint32_t waiter;
  uint32_t pad;
  uint64_t ticket;
  char msg[320];
  /* JOB_END: a peak, b reserved, c time to peak (ms), d waited (ms),
   * e run time (ms), n1 suspensions, n2 deadlock-guard failures, ticket
   * the most its processes held outside the preload library. */
  uint64_t c, d, e;
  uint32_t n1, n2;
  /* Version 3: the daemon's release (COGPU_VERSION_STRING), so that a
   * node half way through an upgrade shows; zero in version 2. */
  char release[16];
} cogpu__m_reply_t;
#define COGPU_REPLY_PRIORITY_CAPPED 0x1u
#define COGPU_REPLY_QUEUED 0x2u /* WAIT: not served yet; answer follows */
/* WAIT: the job was suspended while the request waited (a: its footprint
 * in bytes, gpu: the GPU); the answer follows when it resumes. */
#define COGPU_REPLY_SUSPENDED 0x4u
/* WAIT's grant, and SUSPEND's answer: the job was resumed; a: how long it
 * was suspended, in ms. */
#define COGPU_REPLY_RESUMED 0x8u

typedef struct cogpu__m_gpu_s {
  uint32_t index, nvml_index;
  uint64_t total, margin;
  char uuid[96];
  char name[96];
} cogpu__m_gpu_t;

typedef struct cogpu__msg_s {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t seq;
  int32_t rc;
  union {
    cogpu__m_attach_t attach;
    cogpu__m_resume_t resume;
    cogpu__m_reserve_t reserve;
    cogpu__m_wait_t wait;
    cogpu__m_gpu_amount_t amount;
    cogpu__m_find_job_t find_job;
    cogpu__m_reset_t reset;
    cogpu__m_mark_t mark;
    cogpu__m_suspend_t suspend;
    cogpu__m_usage_t usage;
    cogpu__m_job_end_t job_end;
    cogpu__m_history_t history;
    cogpu__m_reply_t reply;
    cogpu__m_gpu_t gpu;
    char raw[COGPU_MSG_SIZE - 16];
  } u;
} cogpu__msg_t;

_Static_assert(sizeof(cogpu__msg_t) == COGPU_MSG_SIZE,
               "protocol messages have one fixed size");

/* The version this process's client side speaks: COGPU_PROTO_VERSION,
 * changed only by tests, to act as a client of another release. */
extern uint16_t cogpu__proto_client_version;

/* Sets magic, version (cogpu__proto_client_version), type and seq, and
 * zeroes the payload. */
void cogpu__msg_init(cogpu__msg_t *m, int type, uint32_t seq);

/* Checks a received message: size, magic, version, a known type, and every
 * field of its payload as that version lays it out (ranges, NUL-terminated
 * strings). Returns 0, -EPROTONOSUPPORT for a well-formed header of a
 * version outside COGPU_PROTO_VERSION_MIN..COGPU_PROTO_VERSION, or -EPROTO,
 * with a reason in why. */
int cogpu__msg_check(const cogpu__msg_t *m, size_t len, char *why,
                     size_t whylen);

/* A checked request of an older version in the current form (in place). */
void cogpu__msg_to_current(cogpu__msg_t *m);

/* A message of the current form in the layout of version v (in place;
 * COGPU_PROTO_VERSION_MIN <= v <= COGPU_PROTO_VERSION). */
void cogpu__msg_to_version(cogpu__msg_t *m, uint16_t v);

/* The refusal of a request whose version the daemon does not accept (see
 * "Versions" above). */
void cogpu__msg_refusal(cogpu__msg_t *r, const cogpu__msg_t *req);

/* Whether len bytes of m are a refusal, of any version: the only message
 * of another version than its own that a client reads. */
bool cogpu__msg_is_refusal(const cogpu__msg_t *m, size_t len);

/* A string field holds a NUL within its size. */
bool cogpu__msg_str_ok(const char *s, size_t size);

struct msghdr;
/* The descriptors that came with a received message (mh as recvmsg filled
 * it in; only after a recvmsg that did not fail): the kernel installs
 * every one that fits the control buffer, however many the sender put in
 * however many headers, so each is either handed back or closed here. When
 * exactly one came, the control data was whole and fd is not NULL, *fd
 * gets it; every other is closed. Returns how many came, or -1 when the
 * control data was cut short (MSG_CTRUNC: the sender sent more than the
 * buffer holds, and what arrived is closed). The protocol passes at most
 * one: a caller treats more, or -1, as a violation. */
int cogpu__msg_fds(const struct msghdr *mh, int *fd);

/* --- The status snapshot (STATUS's memfd) -------------------------------
 * A header, then ngpus GPU records, then nclients client records and
 * nwaiters waiter records, each naming its GPU. Written by the daemon and
 * read by clients with cogpu__snap_build and cogpu__snap_parse (snap.c),
 * both generated from the lists below, as are the records' structs: a
 * field is one line. Read with bounds checks: every count is checked
 * against the file's size before use, every GPU a record names against
 * the GPUs, every enumeration against its range.
 *
 * One line per field, in wire order: X(KIND, ...) with KIND
 *  NUM(type, name, status)      a number, copied as is
 *  STR(size, name, status)      a string, NUL-terminated on both sides
 *  ARR(type, n, name, status)   n numbers
 *  BOUNDS(type, n, name, status) a histogram's bounds: rising, the last
 *                               UINT64_MAX (+Inf), or the snapshot is
 *                               malformed
 *  USEC(type, name, status)     seconds (double) as microseconds
 *  OWN(type, name, status)      a bool, as 1 or 0 (read: only 1 is true)
 *  ENUM(type, name, status, max) an enumeration; a value above max reads
 *                               as 0
 *  FRAME(type, name)            framing the codec writes and checks itself
 *                               (magic, version, counts, the GPU a record
 *                               is listed under)
 *  PAD(type, name)              zero
 * status names the field of cogpu_status_t (header), cogpu_gpu_info_t,
 * cogpu_client_info_t or cogpu_waiter_info_t it carries.
 *
 * The layout is part of the protocol (see "Versions" above): a client of
 * protocol 3 reads COGPU_SNAP_VERSION 4 (and 3, from a daemon of protocol
 * 2), one of protocol 2 (cogpu 0.1.0) reads version 3 only, and each
 * refuses a snapshot of any other size. So a new field is a new line here
 * and a new protocol version, whose daemon still writes the older layout
 * for the older clients (version 3: COGPU_SNAP_HDR_V3, the records that
 * follow unchanged); the sizes asserted below are those of version 4, to
 * stop a field added without one. */
#define COGPU_SNAP_MAGIC 0x50414e53u /* "SNAP" */
#define COGPU_SNAP_VERSION 4u
#define COGPU_SNAP_VERSION_V3 3u

/* Version 4's header: version 3's, then the checkpoint copies' counters. */
#define COGPU_SNAP_HDR(X)                                                      \
  COGPU_SNAP_HDR_V3(X)                                                         \
  X(NUM, uint64_t, checkpoint_bytes, counters.checkpoint_bytes)                \
  X(USEC, uint64_t, checkpoint_us, counters.checkpoint_seconds)

#define COGPU_SNAP_HDR_V3(X)                                                   \
  X(FRAME, uint32_t, magic)                                                    \
  X(FRAME, uint32_t, version)                                                  \
  X(FRAME, uint32_t, ngpus)                                                    \
  X(FRAME, uint32_t, nclients)                                                 \
  X(FRAME, uint32_t, nwaiters)                                                 \
  X(NUM, uint32_t, layout_version, layout_version)                             \
  X(STR, 16, policy, policy)                                                   \
  X(STR, 512, state_path, state_path)                                          \
  X(NUM, uint64_t, suspended, suspended_bytes)                                 \
  X(NUM, uint64_t, suspend_max, suspend_max_bytes)                             \
  X(NUM, uint64_t, host_available, host_available_bytes)                       \
  X(NUM, uint64_t, host_margin, host_margin_bytes)                             \
  X(STR, 128, suspension, suspension)                                          \
  /* The node's counters (cogpu_counters_t). */                                \
  X(ARR, uint64_t, COGPU_ADMIT_NRESULTS, admit, counters.admissions)           \
  X(BOUNDS, uint64_t, COGPU_WAIT_BUCKETS, wait_le_ms, counters.wait_le_ms)     \
  X(ARR, uint64_t, COGPU_WAIT_BUCKETS, wait_count, counters.wait_count)        \
  X(USEC, uint64_t, wait_sum_us, counters.wait_sum_seconds)                    \
  X(NUM, uint64_t, suspensions, counters.suspensions)                          \
  X(NUM, uint64_t, suspend_failures, counters.suspend_failures)                \
  X(NUM, uint64_t, resumes, counters.resumes)                                  \
  X(NUM, uint64_t, resume_failures, counters.resume_failures)                  \
  X(NUM, uint64_t, deadlock_suspensions, counters.deadlock_suspensions)

#define COGPU_SNAP_GPU(X)                                                      \
  X(NUM, int32_t, index, index)                                                \
  X(NUM, int32_t, max_clients, max_clients)                                    \
  X(NUM, uint64_t, total, total_bytes)                                         \
  X(NUM, uint64_t, margin, margin_bytes)                                       \
  X(NUM, uint64_t, foreign, foreign_bytes)                                     \
  X(NUM, uint64_t, capacity, capacity_bytes)                                   \
  X(NUM, uint64_t, reserved, reserved_bytes)                                   \
  X(NUM, uint32_t, exclusive, exclusive)                                       \
  X(PAD, uint32_t, pad)                                                        \
  X(STR, 96, uuid, uuid)                                                       \
  X(STR, 96, name, name)                                                       \
  X(NUM, uint64_t, suspended, suspended_bytes)                                 \
  X(NUM, uint64_t, used, used_bytes)

#define COGPU_SNAP_CLIENT(X)                                                   \
  X(FRAME, uint32_t, gpu)                                                      \
  X(NUM, int32_t, pid, pid)                                                    \
  X(NUM, uint32_t, uid, uid)                                                   \
  X(NUM, int32_t, priority, priority)                                          \
  X(NUM, uint64_t, reserved, reserved_bytes)                                   \
  X(NUM, uint32_t, exclusive, exclusive)                                       \
  /* 1 for the asking process's job (STATUS on its main connection). */        \
  X(OWN, uint32_t, slot, own)                                                  \
  X(STR, 128, command, command)                                                \
  X(STR, 64, job_id, job_id)                                                   \
  X(ENUM, uint32_t, state, state, COGPU_JOB_EXITING)                           \
  X(NUM, uint32_t, suspensions, suspensions)                                   \
  X(NUM, uint64_t, suspended_bytes, suspended_bytes)                           \
  X(NUM, double, suspended_seconds, suspended_seconds)                         \
  X(NUM, uint64_t, used, used_bytes)                                           \
  X(NUM, uint64_t, peak, peak_bytes)                                           \
  X(NUM, uint64_t, escaped, escaped_bytes)                                     \
  X(NUM, int32_t, escaped_pid, escaped_pid)                                    \
  X(PAD, uint32_t, pad)

#define COGPU_SNAP_WAITER(X)                                                   \
  X(FRAME, uint32_t, gpu)                                                      \
  X(NUM, int32_t, pid, pid)                                                    \
  X(NUM, uint32_t, uid, uid)                                                   \
  X(NUM, int32_t, priority, priority)                                          \
  X(NUM, int32_t, asked_gpu, gpu)                                              \
  X(NUM, uint32_t, exclusive, exclusive)                                       \
  X(NUM, uint64_t, bytes, requested_bytes)                                     \
  X(NUM, double, waiting_seconds, waiting_seconds)                             \
  X(NUM, uint32_t, position, position)                                         \
  /* 1 for the asking process's request. */                                    \
  X(OWN, uint32_t, owner_slot, own)                                            \
  X(STR, 128, command, command)                                                \
  X(STR, 64, job_id, job_id)

/* The records' members, in list order. */
#define COGPU_SNAP_MEMBER(kind, ...) COGPU_SNAP_MEMBER_##kind(__VA_ARGS__)
#define COGPU_SNAP_MEMBER_NUM(type, name, status) type name;
#define COGPU_SNAP_MEMBER_STR(size, name, status) char name[size];
#define COGPU_SNAP_MEMBER_ARR(type, n, name, status) type name[n];
#define COGPU_SNAP_MEMBER_BOUNDS(type, n, name, status) type name[n];
#define COGPU_SNAP_MEMBER_USEC(type, name, status) type name;
#define COGPU_SNAP_MEMBER_OWN(type, name, status) type name;
#define COGPU_SNAP_MEMBER_ENUM(type, name, status, max) type name;
#define COGPU_SNAP_MEMBER_FRAME(type, name) type name;
#define COGPU_SNAP_MEMBER_PAD(type, name) type name;

typedef struct cogpu__snap_hdr_s {
  COGPU_SNAP_HDR(COGPU_SNAP_MEMBER)
} cogpu__snap_hdr_t;
typedef struct cogpu__snap_hdr_v3_s {
  COGPU_SNAP_HDR_V3(COGPU_SNAP_MEMBER)
} cogpu__snap_hdr_v3_t;
typedef struct cogpu__snap_gpu_s {
  COGPU_SNAP_GPU(COGPU_SNAP_MEMBER)
} cogpu__snap_gpu_t;
typedef struct cogpu__snap_client_s {
  COGPU_SNAP_CLIENT(COGPU_SNAP_MEMBER)
} cogpu__snap_client_t;
typedef struct cogpu__snap_waiter_s {
  COGPU_SNAP_WAITER(COGPU_SNAP_MEMBER)
} cogpu__snap_waiter_t;

/* Version 4's layout, and version 3's header (see above). */
_Static_assert(sizeof(cogpu__snap_hdr_t) == 1064 &&
                   sizeof(cogpu__snap_hdr_v3_t) == 1048 &&
                   sizeof(cogpu__snap_gpu_t) == 264 &&
                   sizeof(cogpu__snap_client_t) == 280 &&
                   sizeof(cogpu__snap_waiter_t) == 240,
               "the snapshot's layout changed: a new protocol version "
               "(proto.h, Versions) that still writes the older layouts");
/* The snapshot's layout is the protocol's, not cogpu.h's: a change to the
 * public counts must come with a new snapshot version. */
_Static_assert(COGPU_ADMIT_NRESULTS == 6 && COGPU_WAIT_BUCKETS == 15,
               "snapshot counters");

/* The snapshot of st (complete: GPUs with their clients and waiters) in
 * layout `version` (COGPU_SNAP_VERSION, or COGPU_SNAP_VERSION_V3 for a
 * client of protocol 2), in a buffer of *size bytes the caller frees.
 * Returns 0, -EINVAL (another version) or -ENOMEM. */
int cogpu__snap_build(const cogpu_status_t *st, unsigned version, char **buf,
                      size_t *size);

/* Fills st (zeroed by the caller) from size bytes of a snapshot of version
 * 4 or 3 (whose counters of checkpoint copies read as 0). Returns 0,
 * -EPROTO when it is malformed (a count, size, GPU or bound out of range),
 * or -ENOMEM; on failure st may hold allocations: free it with
 * cogpu_status_free. */
int cogpu__snap_parse(const char *p, size_t size, cogpu_status_t *st);

#endif /* COGPU_NODE_PROTO_H */
