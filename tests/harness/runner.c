/*
 * runner.c: runs every registered test in its own process, with a timeout, a
 * private temporary directory and node state, and prints TAP plus a closing
 * "N passed, N failed, N skipped" line. `run-tests [FILTER...]` runs the
 * tests whose name contains any FILTER; `run-tests --list` lists them;
 * `run-tests --helper NAME ARGS` runs a helper (used by multi-process tests).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "task.h"

/* Room to spare: a test or helper past the table would not run at all,
 * so registering one fails the whole run instead (too_many). */
#define MAX_TESTS 2048
#define MAX_HELPERS 512

typedef struct {
  const char *name;
  th_test_fn fn;
  const char *file;
  int timeout_s;
  bool single; /* daemonless (single-user mode) only: not run in node mode */
} test_t;

typedef struct {
  const char *name;
  th_helper_fn fn;
} helper_t;

static test_t tests[MAX_TESTS];
static int ntests;
static helper_t helpers[MAX_HELPERS];
static int nhelpers;
static char tmpdir[PATH_MAX];
static char builddir[PATH_MAX];
static char selfexe[PATH_MAX];

/* Seen when the suite outgrew a table of 512: the last four tests linked
 * were dropped without a word, and every pass was green without them. */
static void too_many(const char *what, const char *name, int max) {
  fprintf(stderr,
          "run-tests: more than %d %s: %s would not run (raise the "
          "table's size in tests/harness/runner.c)\n",
          max, what, name);
  _exit(70);
}

void th_register_test(const char *name, th_test_fn fn, const char *file,
                      int timeout_s) {
  if (ntests == MAX_TESTS)
    too_many("tests", name, MAX_TESTS);
  tests[ntests++] = (test_t){name, fn, file, timeout_s, false};
}

void th_register_single(const char *name, th_test_fn fn, const char *file,
                        int timeout_s) {
  if (ntests == MAX_TESTS)
    too_many("tests", name, MAX_TESTS);
  tests[ntests++] = (test_t){name, fn, file, timeout_s, true};
}

void th_register_helper(const char *name, th_helper_fn fn) {
  if (nhelpers == MAX_HELPERS)
    too_many("helpers", name, MAX_HELPERS);
  helpers[nhelpers++] = (helper_t){name, fn};
}

static void (*on_end[8])(void);
static int non_end;

void th_on_end(void (*fn)(void)) {
  if (non_end == (int)(sizeof on_end / sizeof on_end[0]))
    too_many("end handlers in one test", "one", non_end);
  on_end[non_end++] = fn;
}

/* In the test's process, as it ends: the latest first, each once. */
static void run_on_end(void) {
  while (non_end > 0)
    on_end[--non_end]();
}

void th_fail(const char *file, int line, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "FAIL %s:%d: %s\n", file, line, msg);
  fflush(stderr);
  run_on_end();
  exit(1);
}

/* Helpers are new processes: they find the test's directory in the
 * environment. */
const char *th_tmpdir(void) {
  if (!tmpdir[0] && getenv("COGPU_TEST_TMPDIR"))
    snprintf(tmpdir, sizeof tmpdir, "%s", getenv("COGPU_TEST_TMPDIR"));
  return tmpdir;
}

const char *th_path(const char *name) {
  static char bufs[8][PATH_MAX + 256];
  static int next;
  char *b = bufs[next++ % 8];
  snprintf(b, sizeof bufs[0], "%s/%s", th_tmpdir(), name);
  return b;
}

const char *th_build_dir(void) {
  return builddir;
}

void th_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f)
    th_fail(__FILE__, __LINE__, "cannot write %s: %s", path, strerror(errno));
  fputs(text, f);
  fclose(f);
}

int th_ms(int ms) {
  const char *m = getenv("COGPU_TEST_TIMEOUT_MULTIPLIER");
  int k = m ? atoi(m) : 1;
  return ms * (k > 0 ? k : 1);
}

void th_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

pid_t th_spawn_helper(const char *name, const char *const args[]) {
  const char *argv[64];
  int n = 0;
  argv[n++] = selfexe;
  argv[n++] = "--helper";
  argv[n++] = name;
  for (int i = 0; args && args[i] && n < 63; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid < 0)
    th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
  if (pid == 0) {
    execv(selfexe, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

int th_exit_code(int st) {
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  if (WIFSIGNALED(st))
    return 128 + WTERMSIG(st);
  return -1;
}

/* A /proc file of pid's thread tid, its first line, into buf ("" if it
 * cannot be read). */
static void proc_line(pid_t pid, const char *tid, const char *name, char *buf,
                      size_t len) {
  char path[128];
  snprintf(path, sizeof path, "/proc/%d/task/%s/%s", (int)pid, tid, name);
  buf[0] = 0;
  FILE *f = fopen(path, "re");
  if (!f)
    return;
  if (!fgets(buf, (int)len, f))
    buf[0] = 0;
  fclose(f);
  buf[strcspn(buf, "\n")] = 0;
}

/* Where each thread of a process that does not end is: its state, the
 * kernel function it sleeps in and its system call, so that a hang seen
 * once under load says where it was (the process is killed next). */
static void dump_threads(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  if (!dir)
    return;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char stat[512], wchan[128], sys[256], comm[64];
    proc_line(pid, e->d_name, "stat", stat, sizeof stat);
    proc_line(pid, e->d_name, "wchan", wchan, sizeof wchan);
    proc_line(pid, e->d_name, "syscall", sys, sizeof sys);
    proc_line(pid, e->d_name, "comm", comm, sizeof comm);
    const char *st = strrchr(stat, ')');
    fprintf(stderr, "# thread %s (%s): state %c, wchan %s, syscall %s\n",
            e->d_name, comm, st && st[1] ? st[2] : '?', wchan[0] ? wchan : "-",
            sys[0] ? sys : "-");
  }
  closedir(dir);
}

int th_wait(pid_t pid, int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  int st;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return st;
    if (r < 0 && errno != EINTR)
      th_fail(__FILE__, __LINE__, "waitpid %d: %s", (int)pid, strerror(errno));
    if (now_ms() > deadline) {
      dump_threads(pid);
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      th_fail(__FILE__, __LINE__, "process %d still running after %d ms",
              (int)pid, timeout_ms);
    }
    th_sleep_ms(2);
  }
}

/* Reads what is available on fd into buf at *len (keeping one byte for the
 * NUL); returns false at end of file. */
static bool drain(int fd, char *buf, size_t cap, size_t *len) {
  char tmp[4096];
  ssize_t r = read(fd, tmp, sizeof tmp);
  if (r <= 0)
    return r < 0 && (errno == EINTR || errno == EAGAIN);
  size_t room = cap > *len + 1 ? cap - *len - 1 : 0;
  size_t k = (size_t)r < room ? (size_t)r : room;
  if (buf && k) {
    memcpy(buf + *len, tmp, k);
    *len += k;
    buf[*len] = 0;
  }
  return true;
}

void th_apply_env(const char *const env[]) {
  for (int i = 0; env && env[i]; i++) {
    char kv[4096];
    snprintf(kv, sizeof kv, "%s", env[i]);
    char *eq = strchr(kv, '=');
    if (!eq)
      continue;
    *eq = 0;
    th_setenv(kv, eq[1] ? eq + 1 : NULL);
  }
}

int th_run(const char *const argv[], const char *const env[], char *out,
           size_t outlen, char *err, size_t errlen, int timeout_ms) {
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC))
    th_fail(__FILE__, __LINE__, "pipe: %s", strerror(errno));
  if (out && outlen)
    out[0] = 0;
  if (err && errlen)
    err[0] = 0;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    th_apply_env(env);
    execvp(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  fcntl(po[0], F_SETFL, O_NONBLOCK);
  fcntl(pe[0], F_SETFL, O_NONBLOCK);
  size_t ol = 0, el = 0;
  bool oo = true, eo = true;
  int64_t deadline = now_ms() + timeout_ms;
  int st = 0;
  bool done = false;
  while (!done || oo || eo) {
    if (oo)
      oo = drain(po[0], out, outlen, &ol);
    if (eo)
      eo = drain(pe[0], err, errlen, &el);
    if (!done && waitpid(pid, &st, WNOHANG) == pid)
      done = true;
    if (now_ms() > deadline) {
      dump_threads(pid);
      kill(pid, SIGKILL);
      if (!done)
        waitpid(pid, &st, 0);
      th_fail(__FILE__, __LINE__, "%s ran longer than %d ms; stderr: %s",
              argv[0], timeout_ms, err ? err : "");
    }
    if (!done || oo || eo)
      th_sleep_ms(1);
  }
  close(po[0]);
  close(pe[0]);
  return th_exit_code(st);
}

static void rm_rf(const char *path) {
  pid_t pid = fork();
  if (pid == 0) {
    execlp("rm", "rm", "-rf", path, (char *)NULL);
    _exit(127);
  }
  int st;
  waitpid(pid, &st, 0);
}

/* Environment every test starts from: a private state directory, no config
 * file, the fake NVML with one 16 GiB GPU, quick housekeeping. */
/* In a sanitizer build every test program carries the sanitizer runtime,
 * which must be initialised before any other library's code runs; cogpu
 * run adds the preload library, instrumented too, to LD_PRELOAD. Preloading
 * the runtime first keeps instrumented commands started under cogpu run
 * working. (Tools that cannot bear it, python3 under TSan, are run with
 * LD_PRELOAD cleared.) */
static int runtime_of(struct dl_phdr_info *info, size_t size, void *out) {
  (void)size;
  if (strstr(info->dlpi_name, "libasan.so") ||
      strstr(info->dlpi_name, "libtsan.so")) {
    snprintf(out, PATH_MAX, "%s", info->dlpi_name);
    return 1;
  }
  return 0;
}

const char *th_sanitizer_runtime(void) {
  static char rt[PATH_MAX];
  if (!rt[0])
    dl_iterate_phdr(runtime_of, rt);
  return rt;
}

static void sanitizer_env(void) {
  char supp[PATH_MAX + 64];
  const char *rt = th_sanitizer_runtime();
  if (!rt[0])
    return;
  setenv("LD_PRELOAD", rt, 1);
  snprintf(supp, sizeof supp,
           "suppressions=%s/../tests/lsan.supp:print_suppressions=0", builddir);
  setenv("LSAN_OPTIONS", supp, 1);
}

/* Node mode (COGPU_TEST_NODE=1): every test gets a private cogpud of its
 * own, started with the test's environment, and its processes must use it
 * (node_mode=daemon). */
static bool node_mode(void) {
  const char *s = getenv("COGPU_TEST_NODE");
  return s && strcmp(s, "1") == 0;
}

static pid_t daemon_pid = -1;
static pid_t daemon_owner = -1; /* the test process: only it restarts */

bool th_node_mode(void) {
  return node_mode();
}

pid_t th_daemon_pid(void) {
  return daemon_pid;
}

static bool daemon_answers(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  if (fd >= 0)
    close(fd);
  return ok;
}

static void daemon_start(bool must);

void th_daemon_start(void) {
  daemon_start(true);
}

static void daemon_start(bool must) {
  char bin[PATH_MAX + 16], log[PATH_MAX + 16];
  snprintf(bin, sizeof bin, "%s/cogpud", builddir);
  snprintf(log, sizeof log, "%s/cogpud.log", tmpdir);
  const char *sock = getenv("COGPU_SOCKET");
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0)
      dup2(fd, 2);
    /* The daemon reads only its own configuration: none here. */
    unsetenv("COGPU_NODE_MODE");
    execl(bin, "cogpud", (char *)NULL);
    _exit(127);
  }
  daemon_pid = pid;
  daemon_owner = getpid();
  for (int i = 0; i < 2000; i++) {
    if (daemon_answers(sock))
      return;
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      daemon_pid = -1;
      if (!must)
        return; /* a setting it refuses: the test's clients say the same */
      th_fail(__FILE__, __LINE__, "cogpud exited at start (see %s)", log);
    }
    th_sleep_ms(5);
  }
  th_fail(__FILE__, __LINE__, "cogpud did not come up in 10 s (see %s)", log);
}

void th_daemon_stop(int sig) {
  if (daemon_pid <= 0)
    return;
  kill(daemon_pid, sig);
  int st;
  waitpid(daemon_pid, &st, 0);
  daemon_pid = -1;
}

/* Settings that are the node's: in node mode they reach the ledger only
 * through the daemon's own environment, so setting one restarts the
 * test's daemon with a fresh state. */
static bool node_setting(const char *k) {
  static const char *const keys[] = {"COGPU_POLICY",
                                     "COGPU_MARGIN",
                                     "COGPU_MAX_CLIENTS",
                                     "COGPU_MMU_MAX_AGE",
                                     "COGPU_FOREIGN_REFRESH",
                                     "COGPU_SWEEP_INTERVAL",
                                     "COGPU_PRIORITY_CAP",
                                     "COGPU_ADMIN_GROUP",
                                     "COGPU_USER_MAX_CLIENTS",
                                     "COGPU_USER_MAX_WAITERS",
                                     "COGPU_SUSPEND",
                                     "COGPU_PREEMPT_PRIORITY",
                                     "COGPU_MAX_IDLE",
                                     "COGPU_SUSPEND_LOCK_TIMEOUT",
                                     "COGPU_SUSPEND_HOST_MARGIN",
                                     "COGPU_SUSPEND_MAX",
                                     "COGPU_CONFIG"};
  /* The fake NVML, and the fake driver's checkpoint API as its caller (the
   * daemon) sees it. */
  if (strncmp(k, "FAKE_NVML_", 10) == 0 ||
      strcmp(k, "FAKE_CUDA_CHECKPOINT") == 0 ||
      strcmp(k, "FAKE_CUDA_CKPT_GBPS") == 0)
    return true;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (strcmp(k, keys[i]) == 0)
      return true;
  return false;
}

void th_daemon_restart_fresh(void) {
  th_daemon_stop(SIGTERM);
  char dir[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/cogpud", tmpdir);
  rm_rf(dir);
  daemon_start(false);
}

void th_setenv(const char *k, const char *v) {
  if (v)
    setenv(k, v, 1);
  else
    unsetenv(k);
  /* A program a test starts with its own environment (th_run) changes
   * only itself; the daemon is the test process's. */
  if (node_mode() && node_setting(k) && getpid() == daemon_owner)
    th_daemon_restart_fresh();
}

static void test_env(void) {
  extern char **environ;
  char names[64][128];
  int n = 0;
  for (char **e = environ; *e && n < 64; e++)
    if ((strncmp(*e, "COGPU_", 6) == 0 && strncmp(*e, "COGPU_TEST_", 11)) ||
        (strncmp(*e, "FAKE_", 5) == 0 &&
         /* a diagnostic of the fake driver, kept for a run that asks */
         strncmp(*e, "FAKE_CUDA_EXPLAIN=", 18) != 0)) {
      size_t l = strcspn(*e, "=");
      snprintf(names[n++], sizeof names[0], "%.*s", (int)l, *e);
    }
  for (int i = 0; i < n; i++)
    unsetenv(names[i]);
  char buf[PATH_MAX + 4096];
  setenv("COGPU_TEST_TMPDIR", tmpdir, 1);
  snprintf(buf, sizeof buf, "%s/state", tmpdir);
  setenv("COGPU_STATE_DIR", buf, 1);
  setenv("COGPU_CONFIG", "", 1);
  setenv("COGPU_LOG", "error", 1);
  /* Never a node daemon the machine may run: a private one in node mode,
   * none otherwise. */
  snprintf(buf, sizeof buf, "%s/cogpud.sock", tmpdir);
  setenv("COGPU_SOCKET", buf, 1);
  snprintf(buf, sizeof buf, "%s/cogpud", tmpdir);
  setenv("COGPU_DAEMON_DIR", buf, 1);
  /* The job history of the test's own (never /var/lib/cogpu, nor the
   * user's). */
  snprintf(buf, sizeof buf, "%s/history", tmpdir);
  setenv("COGPU_HISTORY_DIR", buf, 1);
  if (node_mode())
    setenv("COGPU_NODE_MODE", "daemon", 1);
  setenv("FAKE_NVML_GPUS", "16G", 1);
  snprintf(buf, sizeof buf, "%s/fake-cuda", tmpdir);
  setenv("FAKE_CUDA_STATE", buf, 1);
  snprintf(buf, sizeof buf, "%s:%s", builddir,
           getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
  setenv("PATH", buf, 1);
  sanitizer_env();
}

/* --- running tests, several at once ---------------------------------------
 *
 * Each test runs in its own process group with its own directory, state,
 * socket, daemon and history (test_env), so tests share the machine and
 * nothing else; `-j N` runs N at once (default: twice the CPUs, capped at
 * 8: most tests wait on events, not on the CPU). Tests that share
 * something outside their directory are grouped (TEST_FILE_GROUP): no two
 * tests of one group run at once, and a test of group "alone" runs with
 * nothing else. A test's output (stdout and stderr, its programs' too)
 * goes to a log beside its directory and is printed when it ends if it
 * failed or was skipped (COGPU_TEST_VERBOSE=1: always), so the outputs of
 * concurrent tests never interleave. */

typedef struct {
  const test_t *t;
  pid_t pid;
  int64_t t0;
  char dir[PATH_MAX];
} running_t;

#define MAX_JOBS 64
#define MAX_GROUPS 32

static struct {
  const char *file;
  const char *group;
  int most;
} groups[MAX_GROUPS];
static int ngroups;

void th_register_group(const char *file, const char *group, int most) {
  if (ngroups == MAX_GROUPS)
    too_many("files in groups", file, MAX_GROUPS);
  groups[ngroups++] = (typeof(groups[0])){file, group, most < 1 ? 1 : most};
}

static const char *group_of(const test_t *t) {
  for (int i = 0; i < ngroups; i++)
    if (strcmp(groups[i].file, t->file) == 0)
      return groups[i].group;
  return NULL;
}

static const char *once_files[MAX_GROUPS];
static int nonce;

void th_register_file_once(const char *file) {
  if (nonce == MAX_GROUPS)
    too_many("files run once", file, MAX_GROUPS);
  once_files[nonce++] = file;
}

static bool file_once(const test_t *t) {
  for (int i = 0; i < nonce; i++)
    if (strcmp(once_files[i], t->file) == 0)
      return true;
  return false;
}

static int group_most(const char *g) {
  int most = 1;
  for (int i = 0; i < ngroups; i++)
    if (strcmp(groups[i].group, g) == 0)
      most = groups[i].most;
  return most;
}

static void log_path(const char *dir, char *buf, size_t len) {
  snprintf(buf, len, "%s.log", dir);
}

static int start_one(const test_t *t, running_t *r) {
  snprintf(tmpdir, sizeof tmpdir, "%s/cogpu-test-%d-%s",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(),
           t->name);
  snprintf(r->dir, sizeof r->dir, "%s", tmpdir);
  rm_rf(tmpdir);
  char log[PATH_MAX + 8];
  log_path(tmpdir, log, sizeof log);
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (mkdir(tmpdir, 0700) != 0 || fd < 0) {
    fprintf(stderr, "mkdir %s: %s\n", tmpdir, strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  fflush(NULL);
  r->t = t;
  r->t0 = now_ms();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    test_env();
    /* Whatever a test or a program it starts writes by a relative path
     * (sbatch's slurm-<job>.out, a core file) lands in the test's own
     * directory, never in the source tree. */
    if (chdir(tmpdir) != 0) {
      fprintf(stderr, "chdir %s: %s\n", tmpdir, strerror(errno));
      _exit(1);
    }
    if (node_mode())
      th_daemon_start();
    t->fn();
    run_on_end();
    fflush(NULL);
    _exit(0);
  }
  close(fd);
  if (pid < 0) {
    fprintf(stderr, "fork: %s\n", strerror(errno));
    return -1;
  }
  setpgid(pid, pid); /* before the runner may signal the group */
  r->pid = pid;
  return 0;
}

/* The last `max` bytes of the test's log, on stderr, each line marked
 * with the test's name; the first line starting with "skip: " goes to
 * reason (the test's SKIP). */
static void show_log(const running_t *r, bool print, char *reason,
                     size_t rlen) {
  char path[PATH_MAX + 8], buf[65536];
  log_path(r->dir, path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  off_t size = lseek(fd, 0, SEEK_END);
  off_t from = size > (off_t)sizeof buf - 1 ? size - (off_t)sizeof buf + 1 : 0;
  ssize_t n = pread(fd, buf, sizeof buf - 1, from);
  close(fd);
  unlink(path);
  if (n <= 0)
    return;
  buf[n] = 0;
  if (reason) {
    const char *k = strstr(buf, "skip: ");
    if (k && (k == buf || k[-1] == '\n'))
      snprintf(reason, rlen, "%.*s", (int)strcspn(k + 6, "\n"), k + 6);
  }
  if (!print)
    return;
  if (from)
    fprintf(stderr, "# %s: ... (%lld bytes before)\n", r->t->name,
            (long long)from);
  for (char *line = buf, *nl; *line; line = nl) {
    nl = strchr(line, '\n');
    nl = nl ? nl + 1 : line + strlen(line);
    fprintf(stderr, "# %s: %.*s%s", r->t->name, (int)(nl - line), line,
            nl[-1] == '\n' ? "" : "\n");
  }
}

/* The test's result, once its process is reaped (st) or it timed out. */
static int finish_one(running_t *r, int st, bool timed_out, char *reason,
                      size_t rlen) {
  /* Whatever the test left running (helpers) is ended with it. */
  kill(-r->pid, SIGKILL);
  int code = timed_out ? 124 : th_exit_code(st);
  const char *v = getenv("COGPU_TEST_VERBOSE");
  show_log(r, code != 0 || (v && *v == '1'), reason, rlen);
  /* COGPU_TEST_KEEP=1 keeps every test's files, passed or not (to study
   * a run that passed, e.g. the real-run replay's record). */
  const char *keep = getenv("COGPU_TEST_KEEP");
  if ((code == 0 || code == TH_SKIP) && !(keep && *keep == '1'))
    rm_rf(r->dir);
  else
    fprintf(stderr, "# kept %s for inspection\n", r->dir);
  if (timed_out)
    fprintf(stderr, "# %s timed out after %d ms\n", r->t->name,
            th_ms(r->t->timeout_s * 1000));
  fflush(stderr);
  return code;
}

static bool selected(const test_t *t, int nf, char **filters) {
  const char *name = t->name;
  if ((t->single || file_once(t)) && node_mode())
    return false;
  if (nf == 0)
    return true;
  for (int i = 0; i < nf; i++)
    if (strstr(name, filters[i]))
      return true;
  return false;
}

/* COGPU_TEST_JOBS, else twice the CPUs, at most 8. */
static int default_jobs(void) {
  const char *e = getenv("COGPU_TEST_JOBS");
  if (e && atoi(e) >= 1)
    return atoi(e) < MAX_JOBS ? atoi(e) : MAX_JOBS;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  n = n < 1 ? 1 : n * 2;
  return n > 8 ? 8 : (int)n;
}

/* May test t start beside the running ones? */
static bool may_start(const test_t *t, const running_t *run, int nrun) {
  const char *g = group_of(t);
  if (g && strcmp(g, "alone") == 0 && nrun > 0)
    return false;
  int same = 0;
  for (int i = 0; i < nrun; i++) {
    const char *o = group_of(run[i].t);
    if (o && strcmp(o, "alone") == 0)
      return false;
    same += o && g && strcmp(o, g) == 0;
  }
  return !g || same < group_most(g);
}

static int run_all(int jobs, int nf, char **filters) {
  static const test_t *todo[MAX_TESTS];
  static char why[MAX_TESTS][160]; /* by skip */
  static const char *skipped[MAX_TESTS];
  running_t run[MAX_JOBS];
  int n = 0, nrun = 0, k = 0, pass = 0, fail = 0, skip = 0;
  for (int i = 0; i < ntests; i++)
    if (selected(&tests[i], nf, filters))
      todo[n++] = &tests[i];
  /* Longest first (a test's timeout says how long it may be), so that no
   * long test starts last and runs on alone; otherwise in file order. */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && todo[j]->timeout_s > todo[j - 1]->timeout_s; j--) {
      const test_t *x = todo[j];
      todo[j] = todo[j - 1];
      todo[j - 1] = x;
    }
  printf("TAP version 13\n1..%d\n", n);
  fflush(stdout);
  int64_t t_all = now_ms();
  for (int left = n; left > 0 || nrun > 0;) {
    /* Grouped tests first: a group's tests run one after another, so the
     * longest chain (the Slurm tests) starts at once. */
    for (int pick = 0; pick < 2; pick++)
      for (int i = 0; i < n && nrun < jobs; i++) {
        if (!todo[i] || (pick == 0) != (group_of(todo[i]) != NULL) ||
            !may_start(todo[i], run, nrun))
          continue;
        if (start_one(todo[i], &run[nrun]) == 0) {
          nrun++;
        } else {
          k++;
          fail++;
          printf("not ok %d - %s (cannot start)\n", k, todo[i]->name);
        }
        todo[i] = NULL;
        left--;
      }
    /* Reap what ended; kill what ran past its time. */
    bool any = false;
    for (int i = 0; i < nrun; i++) {
      int st = 0;
      pid_t r = waitpid(run[i].pid, &st, WNOHANG);
      int64_t took = now_ms() - run[i].t0;
      bool late = r == 0 && took > th_ms(run[i].t->timeout_s * 1000);
      if (r == 0 && !late)
        continue;
      if (late) {
        kill(-run[i].pid, SIGKILL);
        kill(run[i].pid, SIGKILL);
        waitpid(run[i].pid, &st, 0);
      }
      why[skip][0] = 0;
      int code = finish_one(&run[i], st, late, why[skip], sizeof why[0]);
      k++;
      if (code == 0) {
        pass++;
        printf("ok %d - %s (%" PRId64 " ms)\n", k, run[i].t->name, took);
      } else if (code == TH_SKIP) {
        printf("ok %d - %s # SKIP %s\n", k, run[i].t->name, why[skip]);
        skipped[skip++] = run[i].t->name;
      } else {
        fail++;
        printf("not ok %d - %s (exit %d)\n", k, run[i].t->name, code);
      }
      fflush(stdout);
      run[i--] = run[--nrun];
      any = true;
    }
    if (!any && nrun > 0)
      th_sleep_ms(5);
  }
  /* Skips are listed with their reasons: a green run that skipped what
   * matters is not a green run. */
  for (int i = 0; i < skip; i++)
    printf("# skipped %s: %s\n", skipped[i],
           why[i][0] ? why[i] : "(no reason)");
  printf("%d passed, %d failed, %d skipped in %.0f s (-j %d)\n", pass, fail,
         skip, (double)(now_ms() - t_all) / 1e3, jobs);
  return fail ? 1 : 0;
}

int main(int argc, char **argv) {
  if (!realpath("/proc/self/exe", selfexe))
    snprintf(selfexe, sizeof selfexe, "%s", argv[0]);
  snprintf(builddir, sizeof builddir, "%s", selfexe);
  /* The binary lives in BUILD/tests/; the build directory is BUILD. */
  for (int k = 0; k < 2; k++) {
    char *slash = strrchr(builddir, '/');
    if (slash)
      *slash = 0;
  }
  /* The fakes are found the way the loader finds the real libraries, via
   * LD_LIBRARY_PATH, which the loader reads only at start-up: re-execute
   * once with it set. */
  if (!getenv("COGPU_TEST_REEXEC")) {
    char lp[2 * PATH_MAX + 64];
    const char *old = getenv("LD_LIBRARY_PATH");
    snprintf(lp, sizeof lp, "%s/tests/fakes%s%s", builddir, old ? ":" : "",
             old ? old : "");
    setenv("LD_LIBRARY_PATH", lp, 1);
    setenv("COGPU_TEST_REEXEC", "1", 1);
    execv(selfexe, argv);
    perror("re-exec");
    return 1;
  }
  if (argc >= 3 && strcmp(argv[1], "--helper") == 0) {
    for (int i = 0; i < nhelpers; i++)
      if (strcmp(helpers[i].name, argv[2]) == 0)
        return helpers[i].fn(argc - 3, argv + 3);
    fprintf(stderr, "no helper %s\n", argv[2]);
    return 127;
  }
  if (argc >= 2 && strcmp(argv[1], "--list") == 0) {
    for (int i = 0; i < ntests; i++)
      printf("%s\t%s\n", tests[i].name, tests[i].file);
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);
  int jobs = default_jobs();
  int first = 1;
  if (argc >= 2 && strncmp(argv[1], "-j", 2) == 0) {
    const char *v = argv[1][2] ? argv[1] + 2 : argc >= 3 ? argv[2] : "";
    char *end;
    long j = strtol(v, &end, 10);
    if (!*v || *end || j < 1 || j > MAX_JOBS) {
      fprintf(stderr, "run-tests: -j takes a number from 1 to %d\n", MAX_JOBS);
      return 2;
    }
    jobs = (int)j;
    first += argv[1][2] ? 1 : 2;
  }
  return run_all(jobs, argc - first, argv + first);
}
