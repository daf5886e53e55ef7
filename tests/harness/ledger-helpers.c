/*
 * ledger-helpers.c: see ledger-helpers.h.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "ledger-helpers.h"

cogpu_t *lt_attach(int priority) {
  cogpu_attach_opts_t o = {.priority = priority};
  cogpu_t *h = NULL;
  ASSERT_OK(cogpu_attach(&o, &h));
  return h;
}

cogpu_status_t *lt_status(void) {
  cogpu_status_t *st = NULL;
  ASSERT_OK(cogpu_status(NULL, &st));
  return st;
}

size_t lt_nwaiting(int g) {
  cogpu_status_t *st = lt_status();
  size_t n = st->gpus[g].nwaiting;
  cogpu_status_free(st);
  return n;
}

static size_t lt_nclients(int g) {
  cogpu_status_t *st = lt_status();
  size_t n = st->gpus[g].nclients;
  cogpu_status_free(st);
  return n;
}

void lt_wait_nwaiting(int g, size_t n, int timeout_ms) {
  for (int t = 0; t < th_ms(timeout_ms); t += 5) {
    if (lt_nwaiting(g) == n)
      return;
    th_sleep_ms(5);
  }
  th_fail(__FILE__, __LINE__, "GPU %d: %zu waiters, expected %zu", g,
          lt_nwaiting(g), n);
}

void lt_wait_nclients(int g, size_t n, int timeout_ms) {
  for (int t = 0; t < th_ms(timeout_ms); t += 5) {
    if (lt_nclients(g) == n)
      return;
    th_sleep_ms(5);
  }
  th_fail(__FILE__, __LINE__, "GPU %d: %zu clients, expected %zu", g,
          lt_nclients(g), n);
}

void lt_go_when_held(int g, size_t n, uint64_t bytes, const char *go) {
  for (int t = 0;; t += 20) {
    size_t have = 0;
    cogpu_status_t *st = lt_status();
    for (size_t i = 0; (size_t)g < st->ngpus && i < st->gpus[g].nclients; i++)
      have += st->gpus[g].clients[i].reserved_bytes >= bytes;
    cogpu_status_free(st);
    if (have >= n)
      break;
    if (t > th_ms(30000))
      th_fail(__FILE__, __LINE__, "%zu jobs never held %llu bytes on GPU %d", n,
              (unsigned long long)bytes, g);
    th_sleep_ms(20);
  }
  th_write_file(go, "");
}

uint64_t lt_reserved_by(int g, const char *cmd) {
  cogpu_status_t *st = lt_status();
  uint64_t b = 0;
  for (size_t i = 0; i < st->gpus[g].nclients; i++)
    if (strcmp(st->gpus[g].clients[i].command, cmd) == 0)
      b += st->gpus[g].clients[i].reserved_bytes;
  cogpu_status_free(st);
  return b;
}

void lt_check_invariants(void) {
  cogpu_status_t *st = lt_status();
  for (size_t g = 0; g < st->ngpus; g++) {
    uint64_t sum = 0;
    for (size_t i = 0; i < st->gpus[g].nclients; i++)
      sum += st->gpus[g].clients[i].reserved_bytes;
    ASSERT_UEQ(sum, st->gpus[g].reserved_bytes);
    ASSERT_ULE(st->gpus[g].reserved_bytes, st->gpus[g].capacity_bytes);
    uint64_t parked = 0;
    for (size_t i = 0; i < st->gpus[g].nclients; i++)
      parked += st->gpus[g].clients[i].suspended_bytes;
    ASSERT_UEQ(parked, st->gpus[g].suspended_bytes);
  }
  cogpu_status_free(st);
}

typedef void lt_stats_fn(int, unsigned long long *, unsigned long long *,
                         unsigned long long *);

static lt_stats_fn *fake_stats(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  ASSERT(lib != NULL);
  lt_stats_fn *stats = (lt_stats_fn *)dlsym(lib, "fake_cuda_stats");
  ASSERT(stats != NULL);
  return stats;
}

void lt_fake_cuda_stats(unsigned long long *peak, unsigned long long *ooms) {
  unsigned long long used;
  fake_stats()(0, &used, peak, ooms);
}

void lt_fake_reset_peak(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  ASSERT(lib != NULL);
  void (*reset)(void) = (void (*)(void))dlsym(lib, "fake_cuda_reset_peak");
  ASSERT(reset != NULL);
  reset();
}

unsigned long long lt_fake_wedged(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  ASSERT(lib != NULL);
  unsigned long long (*wedged)(void) =
      (unsigned long long (*)(void))dlsym(lib, "fake_cuda_ckpt_wedged");
  ASSERT(wedged != NULL);
  return wedged();
}

unsigned long long lt_fake_cuda_used(void) {
  return lt_fake_gpu_used(0);
}

unsigned long long lt_fake_gpu_used(int g) {
  unsigned long long used = 0, peak, ooms;
  fake_stats()(g, &used, &peak, &ooms);
  return used;
}

pid_t lt_hold(const char *name, int gpu, uint64_t bytes, int prio,
              int64_t timeout_ms, int hold_ms) {
  char a[5][32];
  snprintf(a[0], 32, "%d", gpu);
  snprintf(a[1], 32, "%llu", (unsigned long long)bytes);
  snprintf(a[2], 32, "%d", prio);
  snprintf(a[3], 32, "%lld", (long long)timeout_ms);
  snprintf(a[4], 32, "%d", hold_ms);
  const char *args[] = {name, a[0], a[1], a[2], a[3], a[4], NULL};
  return th_spawn_helper("hold", args);
}

HELPER_IMPL(hold) {
  if (argc < 6)
    return 99;
  cogpu_attach_opts_t o = {.priority = atoi(argv[3]), .command = argv[0]};
  cogpu_t *h;
  if (cogpu_attach(&o, &h) != 0) {
    fprintf(stderr, "hold %s: attach: %s\n", argv[0], cogpu_last_error());
    return HOLD_OTHER;
  }
  uint64_t bytes = strtoull(argv[2], NULL, 10);
  cogpu_request_t r = {.gpu = atoi(argv[1]),
                       .bytes = bytes,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = atoll(argv[4]),
                       .flags = bytes ? 0 : COGPU_REQ_EXCLUSIVE};
  int gpu, rc = cogpu_reserve(h, &r, &gpu);
  if (rc == -ETIMEDOUT)
    return HOLD_TIMEDOUT;
  if (rc == -EAGAIN)
    return HOLD_AGAIN;
  if (rc != 0) {
    fprintf(stderr, "hold %s: reserve: %s\n", argv[0], cogpu_last_error());
    return HOLD_OTHER;
  }
  int hold_ms = atoi(argv[5]);
  if (hold_ms < 0)
    for (int i = 0; i < 600; i++) /* bounded: 60 s */
      th_sleep_ms(100);
  else
    th_sleep_ms(hold_ms);
  cogpu_release(h, gpu, COGPU_ALL);
  cogpu_detach(h);
  return HOLD_OK;
}

const char *lt_cudaprog(void) {
  static char p[4096];
  snprintf(p, sizeof p, "%s/tests/cudaprog", th_build_dir());
  return p;
}

pid_t lt_spawn_logged(const char *tag, const char *const argv[]) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    int fd = open(th_path(tag), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

char *lt_slurp(const char *tag) {
  static char buf[65536];
  int fd = open(th_path(tag), O_RDONLY);
  ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : 0;
  if (fd >= 0)
    close(fd);
  buf[n > 0 ? n : 0] = 0;
  return buf;
}

uint64_t lt_cpu_ticks(pid_t pid) {
  char buf[1024];
  const char *s = cogpu__proc_stat(pid, buf, sizeof buf);
  ASSERT(s);
  unsigned long long ut = 0, st = 0;
  /* Fields 14 and 15, counted from the state (field 3). */
  ASSERT_EQ(sscanf(s, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                   &ut, &st),
            2);
  return ut + st;
}

char lt_proc_state(pid_t pid) {
  char buf[1024];
  const char *s = cogpu__proc_stat(pid, buf, sizeof buf);
  return s ? s[0] : 0;
}

bool lt_in_sleep_call(pid_t pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f)
    return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  long nr = strtol(buf, NULL, 10);
  return nr == SYS_nanosleep || nr == SYS_clock_nanosleep;
}

int lt_fd_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  ASSERT(dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(dir));)
    n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

#ifndef SYS_clone3
#define SYS_clone3 435
#endif

/* clone3 with set_tid (Linux 5.5) asks for the PID itself, which processes
 * forking beside us (tests run in parallel) cannot take first;
 * ns_last_pid, its older way, is tried where clone3 is missing. */
pid_t lt_fork_as_pid(pid_t pid) {
  for (int t = 0; t < th_ms(10000); t += 10) {
    struct clone_args ca = {.exit_signal = SIGCHLD,
                            .set_tid = (uint64_t)(uintptr_t)&pid,
                            .set_tid_size = 1};
    long c = syscall(SYS_clone3, &ca, sizeof ca);
    if (c >= 0)
      return (pid_t)c;     /* 0 in the child; pid in the parent */
    if (errno == EEXIST) { /* still taken: the old one not reaped yet */
      th_sleep_ms(10);
      continue;
    }
    if (errno != ENOSYS)
      return -1;
    break;
  }
  for (int tries = 0; tries < 2000; tries++) {
    FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
    if (!f)
      return -1;
    fprintf(f, "%d", pid - 1);
    fclose(f);
    pid_t c = fork();
    if (c == 0 && getpid() != pid)
      _exit(0);
    if (c == 0 || c == pid || c < 0)
      return c;
    waitpid(c, NULL, 0);
  }
  return -1;
}

/* --- test users ---------------------------------------------------------- */

static char lt_users[2][40];
/* useradd and userdel without a sanitizer build's runtime (its leak check
 * would fail them). */
static const char *const lt_plain_env[] = {"LD_PRELOAD=", NULL};

static void lt_users_remove(void) {
  for (int i = 0; i < 2; i++) {
    if (!lt_users[i][0])
      continue;
    const char *argv[] = {"userdel", lt_users[i], NULL};
    char out[512], err[512];
    th_run(argv, lt_plain_env, out, sizeof out, err, sizeof err, 20000);
    lt_users[i][0] = 0;
  }
}

/* Users an earlier test left behind (killed at its time limit): theirs is
 * a PID that no longer runs. */
static void lt_users_reap(void) {
  FILE *f = fopen("/etc/passwd", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f)) {
    int pid, n;
    char name[40];
    if (sscanf(line, "cogpu-t%d-%d:", &pid, &n) != 2 || kill(pid, 0) == 0 ||
        errno != ESRCH)
      continue;
    snprintf(name, sizeof name, "cogpu-t%d-%d", pid, n);
    const char *argv[] = {"userdel", name, NULL};
    char out[512], err[512];
    th_run(argv, lt_plain_env, out, sizeof out, err, sizeof err, 20000);
  }
  if (f)
    fclose(f);
}

void lt_test_user(int n, unsigned *uid, unsigned *gid) {
  ASSERT(n == 1 || n == 2);
  if (geteuid() != 0)
    th_fail(__FILE__, __LINE__, "test users need root");
  char *name = lt_users[n - 1];
  if (!name[0]) {
    static bool reaped, registered;
    if (!reaped)
      lt_users_reap();
    reaped = true;
    snprintf(lt_users[n - 1], sizeof lt_users[0], "cogpu-t%d-%d", (int)getpid(),
             n);
    if (!registered)
      th_on_end(lt_users_remove);
    registered = true;
    const char *argv[] = {"useradd", "-M",           "-N", "-s", "/bin/sh",
                          "-d",      "/nonexistent", name, NULL};
    char out[1024], err[1024];
    /* Tests at once each take /etc/passwd's lock: a busy lock is tried
     * again (useradd exits 1 or 10 when it cannot lock a file). */
    int rc = -1;
    for (int t = 0; t < 100 && rc != 0; t++) {
      rc = th_run(argv, lt_plain_env, out, sizeof out, err, sizeof err,
                  th_ms(20000));
      if (rc == 9) /* the name is taken: a leftover of this PID */
        rc = 0;
      if (rc != 0 && rc != 1 && rc != 10)
        break;
      if (rc != 0)
        th_sleep_ms(50); /* a lock held by another test's useradd */
    }
    if (rc != 0)
      th_fail(__FILE__, __LINE__, "useradd %s: exit %d: %s", name, rc, err);
  }
  struct passwd *pw = getpwnam(name);
  if (!pw)
    th_fail(__FILE__, __LINE__, "no user %s after useradd", name);
  *uid = (unsigned)pw->pw_uid;
  *gid = (unsigned)pw->pw_gid;
}

const char *lt_user_ids(int n) {
  if (geteuid() != 0)
    return "-";
  unsigned uid, gid;
  lt_test_user(n, &uid, &gid);
  ASSERT(chmod(th_tmpdir(), 0711) == 0);
  static char ids[2][32];
  snprintf(ids[n - 1], sizeof ids[0], "%u:%u", uid, gid);
  return ids[n - 1];
}

void lt_become(const char *ids) {
  unsigned uid, gid;
  if (!ids || strcmp(ids, "-") == 0)
    return;
  if (sscanf(ids, "%u:%u", &uid, &gid) != 2 || setgroups(0, NULL) != 0 ||
      setgid(gid) != 0 || setuid(uid) != 0) {
    fprintf(stderr, "lt_become %s: %s\n", ids, strerror(errno));
    _exit(120);
  }
}

const char *lt_user_dir(void) {
  static char dir[4200];
  snprintf(dir, sizeof dir, "%s/users", th_tmpdir());
  if (access(dir, F_OK) != 0) {
    ASSERT(mkdir(dir, 01777) == 0 && chmod(dir, 01777) == 0);
    ASSERT(chmod(th_tmpdir(), 0711) == 0);
  }
  return dir;
}

const char *const *lt_as_user(int n, const char *const *argv, const char **buf,
                              size_t max) {
  if (geteuid() != 0)
    return argv;
  unsigned uid, gid;
  lt_test_user(n, &uid, &gid);
  ASSERT(chmod(th_tmpdir(), 0711) == 0);
  static char ids[2][2][24];
  snprintf(ids[n - 1][0], sizeof ids[0][0], "--reuid=%u", uid);
  snprintf(ids[n - 1][1], sizeof ids[0][0], "--regid=%u", gid);
  size_t k = 0;
  const char *pre[] = {"setpriv", ids[n - 1][0], ids[n - 1][1],
                       "--clear-groups"};
  for (size_t i = 0; i < 4 && k + 1 < max; i++)
    buf[k++] = pre[i];
  for (size_t i = 0; argv[i] && k + 1 < max; i++)
    buf[k++] = argv[i];
  buf[k] = NULL;
  return buf;
}
