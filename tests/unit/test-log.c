/*
 * test-log.c: the runtime helpers of src/common: logging (prefix, levels,
 * COGPU_LOG, truncation, the warning cap, whole lines under threads), error
 * names and per-thread messages, fault points (a child that SIGKILLs or
 * stalls itself) and the monotonic clock.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "task.h"

/* --- Capturing stderr --------------------------------------------------- */

static int cap_saved = -1;

/* Points fd 2 at a fresh file (O_APPEND, so lines from threads are not
 * overwritten by each other). */
static void cap_begin(void) {
  fflush(stderr);
  cap_saved = dup(2);
  int fd = open(th_path("stderr.txt"), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND,
                0600);
  ASSERT(cap_saved >= 0 && fd >= 0);
  ASSERT(dup2(fd, 2) == 2);
  close(fd);
}

/* Restores fd 2 and returns what was written (a static buffer). */
static const char *cap_end(void) {
  static char buf[1 << 18];
  dup2(cap_saved, 2);
  close(cap_saved);
  int fd = open(th_path("stderr.txt"), O_RDONLY);
  ASSERT(fd >= 0);
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = 0;
  return buf;
}

static int count_str(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

/* --- Logging ------------------------------------------------------------ */

TEST_IMPL(log_prefix) {
  char want[256];
  cogpu__log_set_level(COGPU_LOG_DEBUG);
  cap_begin();
  cogpu__log(COGPU_LOG_WARN, "hello %d", 42);
  cogpu__log(COGPU_LOG_ERROR, "broken %s", "pipe");
  cogpu__log(COGPU_LOG_INFO, "with newline\n"); /* not doubled */
  cogpu__log(COGPU_LOG_DEBUG, "%s", "");
  const char *out = cap_end();
  int pid = (int)getpid();
  snprintf(want, sizeof want,
           "cogpu[%d]: warn: hello 42\n"
           "cogpu[%d]: error: broken pipe\n"
           "cogpu[%d]: info: with newline\n"
           "cogpu[%d]: debug: \n",
           pid, pid, pid, pid);
  ASSERT_STREQ(out, want);
}

TEST_IMPL(log_level_filter) {
  static const int levels[] = {COGPU_LOG_OFF, COGPU_LOG_ERROR, COGPU_LOG_WARN,
                               COGPU_LOG_INFO, COGPU_LOG_DEBUG};
  for (int l = 0; l < 5; l++) {
    cogpu__log_set_level(levels[l]);
    ASSERT_EQ(cogpu__log_level(), levels[l]);
    cap_begin();
    cogpu__log(COGPU_LOG_ERROR, "e");
    cogpu__log(COGPU_LOG_WARN, "w");
    cogpu__log(COGPU_LOG_INFO, "i");
    cogpu__log(COGPU_LOG_DEBUG, "d");
    cogpu__log(COGPU_LOG_OFF, "never"); /* not a message level */
    cogpu__log(99, "never");
    const char *out = cap_end();
    ASSERT_EQ(count_str(out, "\n"), l);
    ASSERT_EQ(count_str(out, ": error: e\n"), l >= 1);
    ASSERT_EQ(count_str(out, ": warn: w\n"), l >= 2);
    ASSERT_EQ(count_str(out, ": info: i\n"), l >= 3);
    ASSERT_EQ(count_str(out, ": debug: d\n"), l >= 4);
    ASSERT(!strstr(out, "never"));
  }
}

TEST_IMPL(log_env_level) {
  static const struct {
    const char *env;
    int level;
  } cases[] = {{"off", COGPU_LOG_OFF},     {"error", COGPU_LOG_ERROR},
               {"warn", COGPU_LOG_WARN},   {"info", COGPU_LOG_INFO},
               {"debug", COGPU_LOG_DEBUG}, {"DEBUG", COGPU_LOG_DEBUG},
               {"", COGPU_LOG_WARN},       {NULL, COGPU_LOG_WARN}};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(cases); i++) {
    if (cases[i].env)
      setenv("COGPU_LOG", cases[i].env, 1);
    else
      unsetenv("COGPU_LOG");
    cogpu__log_set_level(-1); /* read COGPU_LOG again */
    cap_begin();
    ASSERT_EQ(cogpu__log_level(), cases[i].level);
    ASSERT_STREQ(cap_end(), ""); /* valid values give no warning */
  }
  /* Read once: a later change of the environment is not seen. */
  setenv("COGPU_LOG", "error", 1);
  ASSERT_EQ(cogpu__log_level(), COGPU_LOG_WARN);
}

TEST_IMPL(log_env_invalid) {
  setenv("COGPU_LOG", "loud", 1);
  cogpu__log_set_level(-1);
  cap_begin();
  cogpu__log(COGPU_LOG_INFO, "not shown");
  ASSERT_EQ(cogpu__log_level(), COGPU_LOG_WARN);
  cogpu__log(COGPU_LOG_WARN, "shown");
  const char *out = cap_end();
  char want[128];
  snprintf(want, sizeof want, "cogpu[%d]: warn: invalid COGPU_LOG 'loud'",
           (int)getpid());
  ASSERT_EQ(count_str(out, "\n"), 2);
  ASSERT(strncmp(out, want, strlen(want)) == 0);
  ASSERT_CONTAINS(out, "off|error|warn|info|debug");
  ASSERT_CONTAINS(out, ": warn: shown\n");
}

TEST_IMPL(log_truncation) {
  char msg[5000];
  memset(msg, 'a', sizeof msg - 1);
  msg[sizeof msg - 1] = 0;
  cogpu__log_set_level(COGPU_LOG_INFO);
  cap_begin();
  cogpu__log(COGPU_LOG_INFO, "%s", msg);
  cogpu__log(COGPU_LOG_INFO, "after");
  const char *out = cap_end();
  const char *nl = strchr(out, '\n');
  ASSERT(nl != NULL);
  size_t len = (size_t)(nl - out) + 1;
  ASSERT_EQ(len, 1024); /* one whole buffer, newline included */
  ASSERT(strncmp(nl - 3, "...\n", 4) == 0);
  ASSERT(strncmp(nl - 4, "a...", 4) == 0);
  ASSERT_EQ(count_str(out, "\n"), 2);
  ASSERT_CONTAINS(nl + 1, ": info: after\n");

  /* A message that fills the line exactly is not cut. */
  char prefix[64];
  int p = snprintf(prefix, sizeof prefix, "cogpu[%d]: info: ", (int)getpid());
  msg[1023 - p] = 0;
  cap_begin();
  cogpu__log(COGPU_LOG_INFO, "%s", msg);
  out = cap_end();
  ASSERT_EQ(strlen(out), 1024);
  ASSERT(!strstr(out, "..."));
  ASSERT_EQ(out[1023], '\n');
}

TEST_IMPL(log_warning_cap) {
  cogpu__log_set_level(COGPU_LOG_DEBUG);
  cap_begin();
  for (int i = 0; i < 150; i++)
    cogpu__log(COGPU_LOG_WARN, "warning %d", i);
  cogpu__log(COGPU_LOG_ERROR, "errors still pass");
  cogpu__log(COGPU_LOG_INFO, "info still passes");
  const char *out = cap_end();
  ASSERT_EQ(count_str(out, ": warn: warning "), 100);
  ASSERT_CONTAINS(out, ": warn: warning 99\n");
  ASSERT(!strstr(out, ": warn: warning 100\n"));
  ASSERT_EQ(count_str(out, "further warnings are suppressed"), 1);
  ASSERT_CONTAINS(out, ": error: errors still pass\n");
  ASSERT_CONTAINS(out, ": info: info still passes\n");
  ASSERT_EQ(count_str(out, "\n"), 103);
}

TEST_IMPL(log_keeps_errno) {
  cogpu__log_set_level(COGPU_LOG_DEBUG);
  cap_begin();
  errno = EXDEV;
  cogpu__log(COGPU_LOG_ERROR, "x");
  ASSERT_EQ(errno, EXDEV);
  /* Also when the write fails (fd 2 closed). */
  close(2);
  errno = ENOTTY;
  cogpu__log(COGPU_LOG_ERROR, "lost");
  ASSERT_EQ(errno, ENOTTY);
  cap_end();
}

/* A forked child logs with its own pid. */
TEST_IMPL(log_pid_after_fork) {
  cogpu__log_set_level(COGPU_LOG_INFO);
  cap_begin();
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    cogpu__log(COGPU_LOG_INFO, "from the child");
    _exit(0);
  }
  ASSERT_EQ(th_exit_code(th_wait(pid, th_ms(10000))), 0);
  const char *out = cap_end();
  char want[64];
  snprintf(want, sizeof want, "cogpu[%d]: info: from the child\n", (int)pid);
  ASSERT_STREQ(out, want);
}

#define LOG_THREADS 4
#define LOG_LINES 500

static void *log_thread(void *arg) {
  int t = (int)(intptr_t)arg;
  for (int i = 0; i < LOG_LINES; i++)
    cogpu__log(COGPU_LOG_INFO, "thread %d line %d %s", t, i,
               "padding padding padding padding padding padding");
  return NULL;
}

/* Each line is one write, so lines of concurrent threads never mix. */
TEST_IMPL(log_threads_whole_lines) {
  cogpu__log_set_level(COGPU_LOG_INFO);
  cap_begin();
  pthread_t th[LOG_THREADS];
  for (int t = 0; t < LOG_THREADS; t++)
    ASSERT_EQ(pthread_create(&th[t], NULL, log_thread, (void *)(intptr_t)t), 0);
  for (int t = 0; t < LOG_THREADS; t++)
    pthread_join(th[t], NULL);
  const char *out = cap_end();
  char prefix[64];
  snprintf(prefix, sizeof prefix, "cogpu[%d]: info: thread ", (int)getpid());
  int seen[LOG_THREADS] = {0}, lines = 0;
  for (const char *p = out; *p; p = strchr(p, '\n') + 1) {
    ASSERT(strncmp(p, prefix, strlen(prefix)) == 0);
    int t, i, n = 0;
    ASSERT_EQ(sscanf(p + strlen(prefix), "%d line %d padding%n", &t, &i, &n),
              2);
    ASSERT(n > 0 && t >= 0 && t < LOG_THREADS);
    ASSERT_EQ(i, seen[t]); /* in order per thread, none lost */
    seen[t]++;
    lines++;
  }
  ASSERT_EQ(lines, LOG_THREADS * LOG_LINES);
}

/* --- Errors --------------------------------------------------------------- */

TEST_IMPL(err_names) {
  ASSERT_STREQ(cogpu_err_name(0), "OK");
  ASSERT_STREQ(cogpu_strerror(0), "success");
  ASSERT_STREQ(cogpu_err_name(COGPU_ESTATE), "ESTATE");
  ASSERT_STREQ(cogpu_strerror(COGPU_ESTATE),
               "node state is corrupt or from an incompatible version");
  ASSERT_STREQ(cogpu_err_name(COGPU_ECONFIG), "ECONFIG");
  ASSERT_STREQ(cogpu_err_name(COGPU_EDEADLOCK), "EDEADLOCK");
  ASSERT_STREQ(cogpu_err_name(-ETIMEDOUT), "ETIMEDOUT");
  ASSERT_STREQ(cogpu_strerror(-ETIMEDOUT), strerror(ETIMEDOUT));
  ASSERT_STREQ(cogpu_err_name(-EAGAIN), "EAGAIN");
  ASSERT_STREQ(cogpu_err_name(-EINVAL), "EINVAL");
  ASSERT_STREQ(cogpu_err_name(-ENOMEM), "ENOMEM");
  ASSERT_STREQ(cogpu_err_name(-E2BIG), "E2BIG");
  ASSERT_STREQ(cogpu_err_name(-ENODEV), "ENODEV");
  ASSERT_STREQ(cogpu_strerror(-EINVAL), "Invalid argument");
  /* Unknown codes, and positive values (not cogpu return codes). */
  const int unknown[] = {-3999, -4000, -4999, -99999, INT32_MIN, 1, EINVAL};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(unknown); i++) {
    ASSERT_STREQ(cogpu_err_name(unknown[i]), "EUNKNOWN");
    ASSERT_STREQ(cogpu_strerror(unknown[i]), "unknown error");
  }
}

/* Every code of COGPU_ERRNO_MAP has its name and message. */
TEST_IMPL(err_map_complete) {
#define ERR_CHECK(name, val, msg)                                              \
  ASSERT_EQ(COGPU_##name, val);                                                \
  ASSERT_STREQ(cogpu_err_name(val), #name);                                    \
  ASSERT_STREQ(cogpu_strerror(val), msg);
  COGPU_ERRNO_MAP(ERR_CHECK)
#undef ERR_CHECK
}

TEST_IMPL(err_seterr) {
  ASSERT_STREQ(cogpu_last_error(), "");
  errno = EXDEV;
  ASSERT_EQ(cogpu__seterr(-EINVAL, "bad size '%s'", "x"), -EINVAL);
  ASSERT_EQ(errno, EXDEV);
  ASSERT_STREQ(cogpu_last_error(), "bad size 'x'");
  ASSERT_EQ(cogpu__seterr(COGPU_ESTATE, "state %d", 7), COGPU_ESTATE);
  ASSERT_STREQ(cogpu_last_error(), "state 7");
  /* Wrapping the current message in a new one. */
  cogpu__seterr(-EIO, "outer: %s", cogpu_last_error());
  ASSERT_STREQ(cogpu_last_error(), "outer: state 7");
  cogpu__clearerr();
  ASSERT_STREQ(cogpu_last_error(), "");
  /* A long message is cut, never overflows. */
  char big[4000];
  memset(big, 'z', sizeof big - 1);
  big[sizeof big - 1] = 0;
  cogpu__seterr(-EINVAL, "%s", big);
  ASSERT_EQ(strlen(cogpu_last_error()), 1023);
}

static void *err_thread(void *arg) {
  char *seen = arg;
  snprintf(seen, 64, "%s", cogpu_last_error()); /* must be empty */
  cogpu__seterr(-EAGAIN, "from the thread");
  return NULL;
}

TEST_IMPL(err_last_error_per_thread) {
  char seen[64] = "unset";
  cogpu__seterr(-EINVAL, "main thread message");
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, NULL, err_thread, seen), 0);
  pthread_join(th, NULL);
  ASSERT_STREQ(seen, "");
  ASSERT_STREQ(cogpu_last_error(), "main thread message");
}

/* --- Fault points -----------------------------------------------------------
 */

/* Runs `passes` passes of point in a child with COGPU_FAULT=spec; each pass
 * survived writes one byte to a pipe. Returns the child's exit code (128+sig
 * when killed) and stores the number of passes survived. */
static int fault_run(const char *spec, int point, int passes, int *survived,
                     int64_t *elapsed_ms) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  uint64_t t0 = cogpu__now_ns();
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    if (spec)
      setenv("COGPU_FAULT", spec, 1);
    else
      unsetenv("COGPU_FAULT");
    for (int i = 0; i < passes; i++) {
      cogpu__fault(point);
      if (write(fds[1], "x", 1) != 1)
        _exit(2);
    }
    _exit(0);
  }
  close(fds[1]);
  int code = th_exit_code(th_wait(pid, th_ms(20000)));
  if (elapsed_ms)
    *elapsed_ms = (int64_t)((cogpu__now_ns() - t0) / 1000000);
  char buf[4096];
  ssize_t n = read(fds[0], buf, sizeof buf);
  close(fds[0]);
  *survived = n > 0 ? (int)n : 0;
  return code;
}

TEST_IMPL(fault_kill_first_pass) {
  int survived;
  ASSERT_EQ(fault_run("lock_held", COGPU_FP_LOCK_HELD, 5, &survived, NULL),
            128 + SIGKILL);
  ASSERT_EQ(survived, 0);
  ASSERT_EQ(fault_run("LOCK_HELD:1", COGPU_FP_LOCK_HELD, 5, &survived, NULL),
            128 + SIGKILL);
  ASSERT_EQ(survived, 0);
}

TEST_IMPL(fault_kill_count) {
  int survived;
  ASSERT_EQ(fault_run("lock_held:2", COGPU_FP_LOCK_HELD, 5, &survived, NULL),
            128 + SIGKILL);
  ASSERT_EQ(survived, 1);
  ASSERT_EQ(fault_run("create:4:kill", COGPU_FP_CREATE, 10, &survived, NULL),
            128 + SIGKILL);
  ASSERT_EQ(survived, 3);
  /* Fewer passes than the count: survives. */
  ASSERT_EQ(fault_run("granted:3", COGPU_FP_GRANTED, 2, &survived, NULL), 0);
  ASSERT_EQ(survived, 2);
}

TEST_IMPL(fault_other_points_pass) {
  int survived;
  ASSERT_EQ(fault_run(NULL, COGPU_FP_LOCK_HELD, 100, &survived, NULL), 0);
  ASSERT_EQ(survived, 100);
  for (int p = COGPU_FP_NONE; p < COGPU_FP__COUNT; p++) {
    if (p == COGPU_FP_TX_MIDDLE)
      continue;
    ASSERT_EQ(fault_run("tx_middle", p, 3, &survived, NULL), 0);
    ASSERT_EQ(survived, 3);
  }
  /* Every point has its name. */
  const char *names[] = {NULL,
                         "lock_held",
                         "tx_middle",
                         "before_unlock",
                         "waiting",
                         "granted",
                         "attach",
                         "create",
                         "history_batch",
                         "history_write",
                         "accept",
                         "snapshot_alloc",
                         "snapshot_write",
                         "client_socket",
                         "client_send",
                         "client_alloc",
                         "history_open",
                         "queued"};
  ASSERT_EQ(sizeof names / sizeof names[0], COGPU_FP__COUNT);
  for (int p = COGPU_FP_LOCK_HELD; p < COGPU_FP__COUNT; p++)
    ASSERT_EQ(fault_run(names[p], p, 1, &survived, NULL), 128 + SIGKILL);
}

/* ":fail": the count-th pass of the point fails, once; the process lives. */
TEST_IMPL(fault_fail_once) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    setenv("COGPU_FAULT", "history_write:2:fail", 1);
    bool a = cogpu__fault_fails(COGPU_FP_HIST_WRITE);
    bool b = cogpu__fault_fails(COGPU_FP_HIST_WRITE);
    bool c = cogpu__fault_fails(COGPU_FP_HIST_WRITE);
    bool other = cogpu__fault_fails(COGPU_FP_HIST_BATCH);
    _exit(!a && b && !c && !other ? 0 : 1);
  }
  ASSERT_EQ(th_exit_code(th_wait(pid, th_ms(10000))), 0);
}

TEST_IMPL_T(fault_stall, 60) {
  int survived;
  int64_t ms;
  ASSERT_EQ(fault_run("waiting:2:stall", COGPU_FP_WAITING, 3, &survived, &ms),
            0);
  ASSERT_EQ(survived, 3);
  ASSERT_GE(ms, 1900);
  ASSERT_LT(ms, th_ms(10000));
}

TEST_IMPL(fault_bad_value_ignored) {
  const char *bad[] = {
      "bogus",        "lock_held:0",      "lock_held:x",
      "lock_held:-1", "lock_held:1:boom", "lock_held:",
      ":1",           "lock_held2",       "lock_held:1:stall:x"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bad); i++) {
    int survived;
    cap_begin(); /* the child inherits fd 2 */
    int code = fault_run(bad[i], COGPU_FP_LOCK_HELD, 3, &survived, NULL);
    const char *out = cap_end();
    if (code != 0 || survived != 3)
      th_fail(__FILE__, __LINE__, "COGPU_FAULT=%s: exit %d after %d passes",
              bad[i], code, survived);
    ASSERT_CONTAINS(out, ": error: invalid COGPU_FAULT '");
    ASSERT_CONTAINS(out, bad[i]);
    ASSERT_EQ(count_str(out, "\n"), 1); /* reported once */
  }
}

/* --- Clock ------------------------------------------------------------------
 */

TEST_IMPL(clock_now_ns) {
  struct timespec ts;
  uint64_t a = cogpu__now_ns();
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t m = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  th_sleep_ms(20);
  uint64_t b = cogpu__now_ns();
  ASSERT_ULE(a, m);
  ASSERT_ULE(m, b);
  ASSERT(b - a >= 20000000u);
  ASSERT(b - a < (uint64_t)th_ms(5000) * 1000000u);
}
