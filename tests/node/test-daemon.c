/*
 * test-daemon.c: the node daemon's life: clients across kill -9 and
 * restarts of cogpud under load, a client's own timeout while the daemon
 * does not answer, death of clients, an idle daemon, and clients in
 * another PID namespace. Each test runs against a daemon of its own (the
 * runner's in node mode, one it starts otherwise).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ledger-helpers.h"

/* Reserves bytes on gpu at once, or fails the test. */
static void nd_reserve(cogpu_t *h, int gpu, uint64_t bytes) {
  cogpu_request_t r = {.gpu = gpu,
                       .bytes = bytes,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
}

static void nd_begin(void) {
  setenv("COGPU_NODE_MODE", "daemon", 1);
  th_setenv("COGPU_MARGIN", "0");
  if (th_daemon_pid() <= 0)
    th_daemon_start();
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Waits until file `path` exists (a helper's "ready"). */
static void wait_file(const char *path, int ms) {
  for (int t = 0; access(path, F_OK) != 0; t += 5) {
    if (t > th_ms(ms))
      th_fail(__FILE__, __LINE__, "%s did not appear", path);
    th_sleep_ms(5);
  }
}

/* A client that holds 1 GiB, then reserves and releases 256 MiB again and
 * again for ms milliseconds; every call must succeed, and at the end it
 * must still hold exactly its 1 GiB. Exit 0 when all of that held. */
HELPER_IMPL(nd_churner) {
  (void)argc;
  int ms = atoi(argv[0]);
  cogpu_t *h;
  if (cogpu_attach(NULL, &h) != 0) {
    fprintf(stderr, "churner: attach: %s\n", cogpu_last_error());
    return 10;
  }
  cogpu_request_t base = {.gpu = 0,
                          .bytes = GiB,
                          .priority = COGPU_PRIORITY_DEFAULT,
                          .timeout_ms = 20000};
  if (cogpu_reserve(h, &base, NULL) != 0) {
    fprintf(stderr, "churner: base: %s\n", cogpu_last_error());
    return 11;
  }
  th_write_file(argv[1], "ready");
  uint64_t end = now_ms() + (uint64_t)ms;
  long rounds = 0;
  while (now_ms() < end) {
    cogpu_request_t r = base;
    r.bytes = 256 * MiB;
    int rc = cogpu_reserve(h, &r, NULL);
    if (rc == 0)
      rc = cogpu_release(h, 0, 256 * MiB);
    if (rc != 0) {
      fprintf(stderr, "churner: round %ld: %d %s\n", rounds, rc,
              cogpu_last_error());
      return 12;
    }
    rounds++;
  }
  uint64_t held = 0;
  if (cogpu_held(h, 0, &held) != 0 || held != GiB) {
    fprintf(stderr, "churner: holds %llu after %ld rounds: %s\n",
            (unsigned long long)held, rounds, cogpu_last_error());
    return 13;
  }
  fprintf(stderr, "churner: %ld rounds\n", rounds);
  cogpu_detach(h);
  return 0;
}

/* Asks for `gib` GiB with a bound of `ms`: exit 0 when granted. */
HELPER_IMPL(nd_waiter) {
  (void)argc;
  cogpu_t *h;
  if (cogpu_attach(NULL, &h) != 0)
    return 10;
  th_write_file(argv[2], "ready");
  cogpu_request_t r = {.gpu = 0,
                       .bytes = (uint64_t)atoi(argv[0]) * GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = atoi(argv[1])};
  int rc = cogpu_reserve(h, &r, NULL);
  if (rc != 0) {
    fprintf(stderr, "waiter: %d %s\n", rc, cogpu_last_error());
    return rc == -ETIMEDOUT ? 3 : 12;
  }
  uint64_t held = 0;
  if (cogpu_held(h, 0, &held) != 0 || held != r.bytes)
    return 13;
  cogpu_detach(h);
  return 0;
}

static uint64_t reserved_now(void) {
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(NULL, &st));
  uint64_t r = st->gpus[0].reserved_bytes;
  cogpu_status_free(st);
  return r;
}

/* The node ends empty (bounded wait). */
static void wait_empty(int ms) {
  for (int t = 0; reserved_now() != 0; t += 20) {
    ASSERT_LT(t, th_ms(ms));
    th_sleep_ms(20);
  }
}

/* kill -9 of cogpud, twice, and a graceful restart, while 6 clients churn
 * and one waits for memory that only frees when they are done: no call
 * fails, every reservation is where it was, the waiter keeps its place
 * and is served, and the node ends empty. */
TEST_IMPL_T(daemon_kill9_under_load, 90) {
  nd_begin();
  enum { N = 6 };
  pid_t c[N];
  char ready[N][64];
  for (int i = 0; i < N; i++) {
    snprintf(ready[i], sizeof ready[i], "%s", th_path("r"));
    snprintf(ready[i] + strlen(ready[i]), 8, "%d", i);
    c[i] = th_spawn_helper("nd_churner",
                           (const char *const[]){"3000", ready[i], NULL});
  }
  for (int i = 0; i < N; i++)
    wait_file(ready[i], 10000);
  /* 16 GiB: 6 held, up to 1.5 churning; 10 GiB must wait for them. */
  const char *wready = th_path("w");
  pid_t w = th_spawn_helper("nd_waiter",
                            (const char *const[]){"10", "30000", wready, NULL});
  wait_file(wready, 10000);
  th_sleep_ms(300);
  ASSERT_GE(reserved_now(), 6 * GiB);
  th_daemon_stop(SIGKILL);
  th_sleep_ms(200);
  th_daemon_start();
  ASSERT_GE(reserved_now(), 6 * GiB); /* nothing was lost */
  th_sleep_ms(400);
  th_daemon_stop(SIGKILL);
  th_daemon_start();
  th_sleep_ms(400);
  th_daemon_stop(SIGTERM); /* systemctl restart */
  th_daemon_start();
  for (int i = 0; i < N; i++)
    ASSERT_EQ(th_exit_code(th_wait(c[i], th_ms(30000))), 0);
  ASSERT_EQ(th_exit_code(th_wait(w, th_ms(30000))), 0);
  wait_empty(5000);
}

/* A job started by `cogpu run --mem` keeps its reservation across a
 * restart of the daemon, and gives it back when it ends. */
TEST_IMPL(daemon_restart_keeps_cogpu_run_job) {
  nd_begin();
  const char *ready = th_path("ready");
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "touch %s; sleep 2", ready);
  pid_t p = fork();
  if (p == 0) {
    execlp("cogpu", "cogpu", "run", "--mem", "4G", "--", "sh", "-c", cmd,
           (char *)NULL);
    _exit(127);
  }
  wait_file(ready, 10000);
  ASSERT_UEQ(reserved_now(), 4 * GiB);
  th_daemon_stop(SIGKILL);
  th_daemon_start();
  ASSERT_UEQ(reserved_now(), 4 * GiB);
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(20000))), 0);
  wait_empty(5000);
}

/* The client's own clock bounds its wait, whatever the daemon does: with
 * cogpud stopped (SIGSTOP), a request bounded by 400 ms returns
 * -ETIMEDOUT in about that time. */
TEST_IMPL(daemon_stopped_client_timeout_honoured) {
  nd_begin();
  cogpu_t *a = lt_attach(0);
  nd_reserve(a, 0, 15 * GiB);
  cogpu_t *b = lt_attach(0);
  cogpu_request_t r = {.gpu = 0,
                       .bytes = 2 * GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = 400};
  kill(th_daemon_pid(), SIGSTOP);
  uint64_t t0 = now_ms();
  int rc = cogpu_reserve(b, &r, NULL);
  uint64_t took = now_ms() - t0;
  kill(th_daemon_pid(), SIGCONT);
  ASSERT_EQ(rc, -ETIMEDOUT);
  ASSERT_GE(took, 390);
  ASSERT_LE(took, (uint64_t)th_ms(1500));
  /* The cancelled request left nothing behind. */
  ASSERT_UEQ(reserved_now(), 15 * GiB);
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(NULL, &st));
  ASSERT_EQ(st->gpus[0].nwaiting, 0);
  cogpu_status_free(st);
  cogpu_detach(b);
  cogpu_detach(a);
}

/* A client killed outright gives its memory back at once (its connection
 * closes), and its waiting request goes with it. */
TEST_IMPL(daemon_client_death_frees_at_once) {
  nd_begin();
  const char *ready = th_path("ready");
  pid_t p = th_spawn_helper("nd_churner",
                            (const char *const[]){"60000", ready, NULL});
  wait_file(ready, 10000);
  ASSERT_GE(reserved_now(), GiB);
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  uint64_t t0 = now_ms();
  while (reserved_now() != 0) {
    ASSERT_LT(now_ms() - t0, (uint64_t)th_ms(1000));
    th_sleep_ms(2);
  }
}

static uint64_t cpu_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  ASSERT(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  unsigned long ut = 0, stime = 0;
  char *q = strrchr(buf, ')');
  ASSERT(q && sscanf(q + 2,
                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu "
                     "%lu",
                     &ut, &stime) == 2);
  return ut + stime;
}

/* With clients attached and nothing changing, the daemon sleeps: no CPU
 * time in two seconds (it has no timer while nobody waits). A tick or two
 * is the machine's noise (a loaded host, TSan's runtime), not a wake-up
 * loop, which would cost hundreds. */
TEST_IMPL(daemon_idle_uses_no_cpu) {
  nd_begin();
  cogpu_t *h[8];
  for (int i = 0; i < 8; i++) {
    h[i] = lt_attach(0);
    nd_reserve(h[i], 0, GiB);
  }
  th_sleep_ms(200);
  uint64_t before = cpu_ticks(th_daemon_pid());
  th_sleep_ms(2000);
  uint64_t after = cpu_ticks(th_daemon_pid());
  ASSERT_LE(after - before, 2);
  for (int i = 0; i < 8; i++)
    cogpu_detach(h[i]);
}

/* A client in a PID namespace of its own (a container) is listed by its
 * PID on the host, which is what NVML reports for its GPU memory. */
TEST_IMPL(daemon_pid_namespace_client_host_pid) {
  if (geteuid() != 0)
    SKIP("needs root for a PID namespace (unshare)");
  nd_begin();
  const char *ready = th_path("ready");
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "touch %s; exec sleep 3", ready);
  pid_t p = fork();
  if (p == 0) {
    /* LeakSanitizer cannot stop the world of a PID namespace's init. */
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    execlp("unshare", "unshare", "--pid", "--fork", "cogpu", "run", "--mem",
           "2G", "--", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  wait_file(ready, 10000);
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(NULL, &st));
  ASSERT_EQ(st->gpus[0].nclients, 1);
  int pid = st->gpus[0].clients[0].pid;
  cogpu_status_free(st);
  /* In its namespace cogpu run is PID 1; on the host it is a child of the
   * unshare process this test started. */
  ASSERT_NE(pid, 1);
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  FILE *f = fopen(path, "r");
  ASSERT(f);
  bool found = false;
  while (fgets(buf, sizeof buf, f))
    if (strncmp(buf, "NSpid:", 6) == 0)
      found = strstr(buf, "\t1\n") || strstr(buf, " 1\n");
  fclose(f);
  ASSERT(found); /* the same process: PID 1 inside */
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(20000))), 0);
}
