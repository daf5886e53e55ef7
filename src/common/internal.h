/*
 * internal.h: declarations shared by every cogpu component (cogpu__ prefix):
 * logging, error messages, option table and parsers. Nothing here is part of
 * the public API.
 */
#ifndef COGPU_INTERNAL_H
#define COGPU_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cogpu.h"

#define COGPU_HIDDEN __attribute__((visibility("hidden")))
#define COGPU_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define COGPU_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* A wait that its caller may give up for reasons of its own (the Slurm
 * plug-in: the job was cancelled or ran out of time while its step waited
 * for memory). stop(arg) is asked every every_ms while the wait goes on;
 * true ends it with -ECANCELED, and the request leaves the queue. */
typedef struct cogpu__abort_s {
  bool (*stop)(void *arg);
  void *arg;
  int every_ms;
} cogpu__abort_t;

/* --- Logging (log.c) --------------------------------------------------
 * One write(2) per line to stderr, "cogpu[pid]: level: message". No malloc,
 * no stdio: safe inside interposed calls and after fork. The level comes from
 * COGPU_LOG, read on first use (cogpu__log_set_level overrides). */
enum cogpu__log_level {
  COGPU_LOG_OFF = 0,
  COGPU_LOG_ERROR,
  COGPU_LOG_WARN,
  COGPU_LOG_INFO,
  COGPU_LOG_DEBUG
};
void cogpu__log(int level, const char *fmt, ...) COGPU_PRINTF(2, 3);
void cogpu__log_set_level(int level);
int cogpu__log_level(void);

/* --- Debug builds and assertions (log.c) ------------------------------
 * COGPU_DEBUG (set in the ASan and TSan builds, or `make DEBUG=1`) turns on
 * checks that cost too much for a release build: the ledger's invariants
 * after every commit. config_debug is a constant, so every check is
 * compiled in every build (jemalloc's config_debug) and the compiler drops
 * it from a release build. cogpu__assert logs the failed condition and
 * aborts; it is for invariants of our own making only, never for what
 * another process could have written (that is repaired, not asserted). */
#ifdef COGPU_DEBUG
static const bool config_debug = true;
#else
static const bool config_debug = false;
#endif
_Noreturn void cogpu__assert_fail(const char *file, int line, const char *cond,
                                  const char *why);
#define cogpu__assert_why(cond, why)                                           \
  do {                                                                         \
    if (config_debug && !(cond))                                               \
      cogpu__assert_fail(__FILE__, __LINE__, #cond, (why));                    \
  } while (0)
#define cogpu__assert(cond) cogpu__assert_why(cond, "")

/* --- Errors (err.c) ---------------------------------------------------
 * cogpu__seterr formats the thread's last-error message and returns rc, so
 * callers write `return cogpu__seterr(-EINVAL, "bad size '%s'", s);`. */
int cogpu__seterr(int rc, const char *fmt, ...) COGPU_PRINTF(2, 3);
void cogpu__clearerr(void);

/* --- Parsers (parse.c) -------------------------------------------------
 * All return 0 or -EINVAL (with a message via cogpu__seterr naming `what`).
 * Sizes: "4096", "512K", "512M", "12G", "1T", "12GiB", "12gib", "12GB"
 * (binary: K=1024); no fractions, no negatives, overflow refused.
 * Durations: "0", "250ms", "30s", "5m", "2h", "1d", a bare number means
 * seconds; "inf"/"infinity"/"forever" gives -1. Result in milliseconds.
 * Booleans: 1/true/yes/on and 0/false/no/off. Ints: decimal, range-checked. */
int cogpu__parse_size(const char *what, const char *s, uint64_t *out);
int cogpu__parse_duration_ms(const char *what, const char *s, int64_t *out);
int cogpu__parse_bool(const char *what, const char *s, bool *out);
int cogpu__parse_int(const char *what, const char *s, long min, long max,
                     long *out);
/* A GPU named by index ("1") or by a UUID or a unique prefix of one, among
 * n GPUs with these UUIDs: 0 and *gpu, -EINVAL or -ENODEV (message set). */
int cogpu__gpu_spec(const char *spec, const char *const *uuids, size_t n,
                    int *gpu);
/* Formats a byte count as "12.0 GiB" into buf; returns buf. */
char *cogpu__fmt_size(uint64_t bytes, char *buf, size_t len);

/* --- Options (options.c, table in options.def) ------------------------ */
enum cogpu__opt_id {
#define XX(NAME, key, type, def, min, max, form, help) COGPU_OPT_##NAME,
#include "options.def"
#undef XX
  COGPU_OPT__COUNT
};

enum cogpu__opt_type {
  COGPU_OPT_TYPE_STRING,
  COGPU_OPT_TYPE_ENUM,
  COGPU_OPT_TYPE_SIZE,
  COGPU_OPT_TYPE_SIZE_OR_PCT,
  COGPU_OPT_TYPE_SIZE_OR_AUTO,
  COGPU_OPT_TYPE_DURATION,
  COGPU_OPT_TYPE_INT,
  COGPU_OPT_TYPE_BOOL,
  COGPU_OPT_TYPE_MODE
};

enum cogpu__opt_source {
  COGPU_SRC_DEFAULT = 0,
  COGPU_SRC_FILE,
  COGPU_SRC_ENV,
  COGPU_SRC_CLI /* set by cogpu__config_set, e.g. a command-line flag */
};

typedef struct cogpu__opt_desc_s {
  const char *name; /* "STATE_DIR": env var is COGPU_STATE_DIR */
  const char *key;  /* "state_dir": config-file key */
  int type;         /* enum cogpu__opt_type */
  const char *def;  /* default, as text */
  int64_t min, max; /* INT: bounds; DURATION: bounds in ms (inf is -1);
                       INT64_MIN and INT64_MAX where unbounded */
  const char *form; /* accepted form, for messages and docs */
  const char *help;
} cogpu__opt_desc_t;

/* The descriptor table, indexed by enum cogpu__opt_id. */
extern const cogpu__opt_desc_t cogpu__opt_table[COGPU_OPT__COUNT];

/* A parsed value. ENUM: i = index into the '|'-separated form. SIZE: u.
 * SIZE_OR_PCT: pct = true and i = percent (0..100), or pct = false and u =
 * bytes. SIZE_OR_AUTO: u = bytes and i = 0, or "auto": i = 1 and u = 0, so
 * that a reader that takes only sizes sees 0. DURATION: i = ms (-1 = inf). INT:
 * i. BOOL: i = 0/1. MODE: i = mode bits. STRING: s. Every value also keeps its
 * text and its source. */
typedef struct cogpu__optval_s {
  int64_t i;
  uint64_t u;
  bool pct;
  int source; /* enum cogpu__opt_source */
  char s[256];
  char where[300]; /* "default", "/etc/cogpu.conf:12", "env COGPU_POLICY" */
} cogpu__optval_t;

typedef struct cogpu__config_s {
  cogpu__optval_t v[COGPU_OPT__COUNT];
} cogpu__config_t;

/* Fill cfg from defaults, then the config file ($COGPU_CONFIG, default
 * /etc/cogpu.conf; a missing default file is fine, a missing file named by
 * COGPU_CONFIG is an error), then COGPU_* environment variables (read with
 * secure_getenv). File format: `key = value` lines, '#' comments, blank
 * lines; unknown keys and bad values are errors naming file:line, the key
 * and the accepted form. Returns 0 or COGPU_ECONFIG (message set). */
int cogpu__config_load(cogpu__config_t *cfg);
/* Set one option from text (source COGPU_SRC_CLI), validating it. */
int cogpu__config_set(cogpu__config_t *cfg, int id, const char *text);
/* Index of the option whose key or NAME is `name`, or -1. */
int cogpu__opt_find(const char *name);
/* Policy names, in the order of the POLICY enum form. */
enum cogpu__policy {
  COGPU_POLICY_FIFO = 0,
  COGPU_POLICY_MMU,
  COGPU_POLICY_PRIO_FIFO,
  COGPU_POLICY_PRIO_MMU,
  COGPU_POLICY__COUNT
};

/* --- Fault points (fault.c) --------------------------------------------
 * Named points where tests can make the process die (SIGKILL itself),
 * stall, or fail the operation there. Driven by
 * COGPU_FAULT="NAME[:count[:kill|stall|fail]]" (at the count-th pass,
 * default 1; kill by default) read once; costs one predictable branch when
 * unset. One list (X(ID, name, where)); IDs are stable, never reused, and
 * new points go at the end. */
#define COGPU_FAULT_POINTS(X)                                                  \
  X(LOCK_HELD, lock_held, "just after taking the ledger lock")                 \
  X(TX_MIDDLE, tx_middle, "between two stores of one transaction")             \
  X(BEFORE_UNLOCK, before_unlock, "transaction committed, lock still held")    \
  X(WAITING, waiting, "enqueued, lock released, before sleeping")              \
  X(GRANTED, granted, "woken with a grant, before returning")                  \
  X(ATTACH, attach, "slot claimed, not yet initialised")                       \
  X(CREATE, create, "state file half written")                                 \
  X(HIST_BATCH, history_batch,                                                 \
    "cogpud: the history writer's batch allocated (fail: out of memory)")      \
  X(HIST_WRITE, history_write,                                                 \
    "cogpud: a history answer written to its memfd (fail: a short write)")     \
  X(ACCEPT, accept, "cogpud: a connection accepted (fail: EMFILE)")            \
  X(SNAP_ALLOC, snapshot_alloc,                                                \
    "cogpud: a status snapshot's buffer allocated (fail: out of memory)")      \
  X(SNAP_WRITE, snapshot_write,                                                \
    "cogpud: a status snapshot written to its memfd (fail: a short write)")    \
  X(CLIENT_SOCKET, client_socket,                                              \
    "node client: its socket to cogpud made (fail: EMFILE)")                   \
  X(CLIENT_SEND, client_send,                                                  \
    "node client: a request sent to cogpud (fail: a short write)")             \
  X(CLIENT_ALLOC, client_alloc,                                                \
    "node client: the status snapshot's buffer allocated (fail: out of "       \
    "memory)")                                                                 \
  X(HIST_OPEN, history_open,                                                   \
    "history: the database file opened (fail: EMFILE)")                        \
  X(QUEUED, queued, "cogpud: a request queued, before it is answered")
enum cogpu__fault_point {
  COGPU_FP_NONE = 0,
#define X(id, name, where) COGPU_FP_##id,
  COGPU_FAULT_POINTS(X)
#undef X
      COGPU_FP__COUNT
};
/* Inline, so that a point costs a load and a branch where no fault is
 * set (the ledger's hot path passes several per reserve+release): the
 * configuration word is 0 when off (fault.c), anything else goes out of
 * line, including the first pass, which reads COGPU_FAULT. */
extern atomic_llong cogpu__fault_conf;
void cogpu__fault_slow(int point, long long conf);
static inline void cogpu__fault(int point) {
  long long conf =
      atomic_load_explicit(&cogpu__fault_conf, memory_order_relaxed);
  if (__builtin_expect(conf != 0, 0))
    cogpu__fault_slow(point, conf);
}
/* At a point where an operation can fail: true when COGPU_FAULT says
 * "NAME:count:fail" and this is the count-th pass (once); otherwise as
 * cogpu__fault. */
bool cogpu__fault_fails(int point);

/* A request flag that only cogpu's own code sets (not in cogpu.h): the
 * preload library asks again for memory its reservation covered but the
 * driver refused, because the ledger, reading the GPU again, found it held
 * outside cogpu (foreign). While the GPU has foreign memory such a wait is
 * for the outside, not for a cogpu job: the deadlock guard leaves it
 * alone (policy.c). A client that sets it on a GPU without foreign memory
 * gains nothing. */
#define COGPU__REQ_DEVICE_WAIT 0x80000000u
/* Another of cogpu's own: a process of a job (one that joined it) that
 * waits for more of the node asks to stop waiting as soon as its job holds
 * memory that none of its processes claimed (another process left or gave
 * some back): it claims that first and waits, if at all, only for the
 * rest. The wait then ends with COGPU__EJOB_SPARE. */
#define COGPU__REQ_JOB_SPARE 0x40000000u
#define COGPU__REQ_FLAGS                                                       \
  (COGPU_REQ_EXCLUSIVE | COGPU__REQ_DEVICE_WAIT | COGPU__REQ_JOB_SPARE)
#define COGPU__EJOB_SPARE (-4100)

/* The calling process's command line, arguments joined by spaces,
 * truncated to len (proc.c). */
void cogpu__self_cmdline(char *buf, size_t len);
/* Does a thread of pid, other than the calling one, run or wait for a CPU
 * right now (state R)? False where /proc cannot tell (proc.c). */
bool cogpu__proc_runnable(pid_t pid);
/* A process's start time (clock ticks since boot; 0 if it is gone): with
 * its PID, it names the process without ambiguity (proc.c). */
uint64_t cogpu__proc_starttime(pid_t pid);
/* /proc/PID/stat read into buf: its fields from the state (field 3) on, or
 * NULL when the process is gone. */
const char *cogpu__proc_stat(pid_t pid, char *buf, size_t len);
/* The name of user uid, or the number when it has none. */
void cogpu__user_name(uint32_t uid, char *buf, size_t len);

/* mkdir -p: dir and its missing parents, with mode (less the umask);
 * what is there already must be a directory. 0, or a negative errno with
 * the message naming the directory (fs.c). */
int cogpu__mkdirs(const char *dir, mode_t mode);

/* Monotonic clock in nanoseconds. */
uint64_t cogpu__now_ns(void);
/* The same clock at the kernel's tick (a few ms behind, at most): a
 * quarter of the cost, for ages of a second or more on hot paths. */
uint64_t cogpu__coarse_ns(void);
/* Time arithmetic that saturates at UINT64_MAX instead of wrapping, so that
 * a huge duration (centuries, or an "inf" stored as UINT64_MAX ms) means a
 * very long time, never a short one. cogpu__ms_to_ns takes milliseconds and
 * gives nanoseconds; cogpu__add_sat adds two times. */
uint64_t cogpu__ms_to_ns(uint64_t ms);
uint64_t cogpu__add_sat(uint64_t a, uint64_t b);
/* now + ms, saturated: the deadline of a bound of ms milliseconds;
 * negative ms (COGPU_WAIT_FOREVER) gives UINT64_MAX. */
uint64_t cogpu__deadline_ns(int64_t ms);

#endif /* COGPU_INTERNAL_H */
