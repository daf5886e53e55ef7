/*
 * bench-daemon.c: what only node mode has, measured against a running
 * cogpud (bench/run.sh starts a private one; COGPU_NODE_MODE=daemon).
 *
 *  1. Connected clients: one process attaches up to BENCH_CLIENTS handles
 *     (each cogpu_attach is a connection and a slot of its own), timing
 *     every attach and reading the daemon's memory (VmRSS) before and
 *     after; then a reserve+release round trip (one handle, uncontended)
 *     with that many connected, against the same with one connected.
 *  2. Idle: the daemon's CPU time (utime+stime ticks from /proc/PID/stat,
 *     nanoseconds from /proc/PID/schedstat) and its wake-ups (context
 *     switches) over BENCH_IDLE_MS with BENCH_IDLE_CLIENTS attached clients
 *     doing nothing, and again with all BENCH_CLIENTS attached. Expected:
 *     no CPU at all (the daemon sleeps in epoll_wait, no timer armed).
 *  3. Status: cogpu_status (a snapshot the daemon builds and passes as a
 *     memfd) with BENCH_STATUS_CLIENTS clients holding 1 MiB each and
 *     BENCH_STATUS_WAITERS requests queued (threads, each with a handle of
 *     its own, asking for the whole GPU), and with nothing on the node.
 *     Then the daemon's idle CPU with those waiters queued (a timer runs
 *     while requests wait: the policy's sweep).
 *
 * The daemon's PID: BENCH_DAEMON_PID, else the socket's peer credentials.
 * Knobs: BENCH_CLIENTS (10000), BENCH_IDLE_CLIENTS (1000), BENCH_IDLE_MS
 * (5000), BENCH_ITERS (20000 round trips), BENCH_STATUS_CLIENTS (1000),
 * BENCH_STATUS_WAITERS (1000), BENCH_STATUS_ROUNDS (200).
 * Output: JSON lines (bench.h), all "mode":"node": "daemon_attach",
 * "reserve_release_connected" (one per client count), "daemon_idle" (one
 * sample: CPU ns over the window), "status_snapshot" (one per load).
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "bench.h"
#include "cogpu.h"

#define REQ_BYTES (1ull << 20)

static pid_t daemon_pid;
static uint64_t clock_ns;

/* --- the daemon, seen from /proc ------------------------------------------ */

static pid_t find_daemon(void) {
  const char *e = getenv("BENCH_DAEMON_PID");
  if (e && *e)
    return (pid_t)bench_env_exact("BENCH_DAEMON_PID", 1);
  const char *path = getenv("COGPU_SOCKET");
  if (!path || !*path)
    path = "/run/cogpu/cogpu.sock";
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct ucred cr = {0};
  socklen_t len = sizeof cr;
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || cr.pid <= 0) {
    fprintf(stderr, "bench: cannot find cogpud's PID at %s\n", path);
    exit(1);
  }
  close(fd);
  return cr.pid;
}

static long status_kb(const char *key) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)daemon_pid);
  FILE *f = fopen(path, "re");
  long v = -1;
  size_t kl = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtol(line + kl + 1, NULL, 10);
      break;
    }
  if (f)
    fclose(f);
  return v;
}

typedef struct cpu_s {
  uint64_t ticks;  /* utime + stime, clock ticks */
  uint64_t run_ns; /* schedstat: time on a CPU */
  long ctxsw;      /* voluntary + involuntary context switches */
} cpu_t;

static cpu_t daemon_cpu(void) {
  cpu_t c = {0};
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)daemon_pid);
  FILE *f = fopen(path, "re");
  if (f) {
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, stt = 0;
    if (p &&
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
               &ut, &stt) == 2)
      c.ticks = ut + stt;
  }
  snprintf(path, sizeof path, "/proc/%d/schedstat", (int)daemon_pid);
  f = fopen(path, "re");
  unsigned long long run = 0;
  if (f) {
    if (fscanf(f, "%llu", &run) == 1)
      c.run_ns = run;
    fclose(f);
  }
  c.ctxsw = status_kb("voluntary_ctxt_switches") +
            status_kb("nonvoluntary_ctxt_switches");
  return c;
}

static void idle(const char *what, int clients, int waiters) {
  long ms = bench_env_long("BENCH_IDLE_MS", 5000);
  /* Let the last replies and closes settle first. */
  struct timespec ts = {0, 200 * 1000000};
  nanosleep(&ts, NULL);
  cpu_t a = daemon_cpu();
  uint64_t t0 = bench_now_ns();
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = ms % 1000 * 1000000;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  uint64_t el = bench_now_ns() - t0;
  cpu_t b = daemon_cpu();
  uint64_t run = b.run_ns - a.run_ns;
  bench_stats_t st = bench_stats(&run, 1);
  bench_emit("daemon_idle", 1, &st,
             "\"mode\":\"node\",\"load\":\"%s\",\"clients\":%d,"
             "\"waiters\":%d,\"window_ms\":%.0f,\"cpu_ticks\":%" PRIu64
             ",\"clk_tck\":%ld,\"cpu_ns\":%" PRIu64 ",\"ctx_switches\":%ld",
             what, clients, waiters, (double)el / 1e6, b.ticks - a.ticks,
             sysconf(_SC_CLK_TCK), run, b.ctxsw - a.ctxsw);
}

/* --- round trips ---------------------------------------------------------- */

static const cogpu_request_t req = {.gpu = 0,
                                    .bytes = REQ_BYTES,
                                    .priority = COGPU_PRIORITY_DEFAULT,
                                    .timeout_ms = COGPU_NOWAIT,
                                    .flags = 0};

static void round_trips(cogpu_t *h, int connected) {
  long iters = bench_env_long("BENCH_ITERS", 20000);
  uint64_t *d = malloc((size_t)iters * sizeof *d);
  if (!d)
    bench_die("malloc", -ENOMEM);
  for (long i = -1000; i < iters; i++) { /* 1000 warm-up pairs */
    uint64_t t0 = bench_now_ns();
    int rc = cogpu_reserve(h, &req, NULL);
    if (rc == 0)
      rc = cogpu_release(h, 0, REQ_BYTES);
    uint64_t t1 = bench_now_ns();
    if (rc)
      bench_die("reserve/release", rc);
    if (i >= 0)
      d[i] = t1 - t0;
  }
  bench_stats_t st = bench_stats(d, (size_t)iters);
  bench_emit("reserve_release_connected", 1, &st,
             "\"mode\":\"node\",\"load\":\"uncontended\",\"clients\":%d,"
             "\"bytes\":%llu,\"clock_ns\":%" PRIu64,
             connected, REQ_BYTES, clock_ns);
  free(d);
}

/* --- 1. and 2.: many connected clients ------------------------------------ */

static void emit_attach(uint64_t *lat, int from, int to, long rss0, long rss1,
                        double secs) {
  int n = to - from;
  bench_stats_t st = bench_stats(lat + from, (size_t)n);
  bench_emit("daemon_attach", 1, &st,
             "\"mode\":\"node\",\"clients_before\":%d,\"clients_after\":%d,"
             "\"daemon_rss_kb_before\":%ld,\"daemon_rss_kb_after\":%ld,"
             "\"daemon_rss_bytes_per_client\":%.0f,\"seconds\":%.3f,"
             "\"clock_ns\":%" PRIu64,
             from, to, rss0, rss1, n ? (double)(rss1 - rss0) * 1024.0 / n : 0.0,
             secs, clock_ns);
}

static int many_clients(void) {
  int k = (int)bench_env_long("BENCH_CLIENTS", 10000);
  int k_idle = (int)bench_env_long("BENCH_IDLE_CLIENTS", 1000);
  if (k_idle > k)
    k_idle = k;
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)k + 64) {
    fprintf(stderr,
            "bench: RLIMIT_NOFILE %llu is too low for %d clients (ulimit -n)\n",
            (unsigned long long)rl.rlim_cur, k);
    return -1;
  }
  cogpu_t **hs = calloc((size_t)k, sizeof *hs);
  uint64_t *lat = malloc((size_t)k * sizeof *lat);
  if (!hs || !lat)
    bench_die("malloc", -ENOMEM);

  /* The round trip with one client connected, for the ratio below. */
  int rc = cogpu_attach(NULL, &hs[0]);
  if (rc)
    bench_die("cogpu_attach", rc);
  bench_check_mode(hs[0]);
  round_trips(hs[0], 1);
  cogpu_detach(hs[0]);
  hs[0] = NULL;

  long rss0 = status_kb("VmRSS");
  uint64_t t_start = bench_now_ns();
  long rss_mid = rss0;
  double secs_mid = 0;
  for (int i = 0; i < k; i++) {
    uint64_t t0 = bench_now_ns();
    rc = cogpu_attach(NULL, &hs[i]);
    lat[i] = bench_now_ns() - t0;
    if (rc) {
      fprintf(stderr, "bench: attach %d: %s\n", i + 1, cogpu_last_error());
      return -1;
    }
    if (i + 1 == k_idle && k_idle < k) {
      rss_mid = status_kb("VmRSS");
      secs_mid = (double)(bench_now_ns() - t_start) / 1e9;
      emit_attach(lat, 0, k_idle, rss0, rss_mid, secs_mid);
      idle("attached", k_idle, 0);
      t_start = bench_now_ns() - (uint64_t)(secs_mid * 1e9);
    }
  }
  double secs = (double)(bench_now_ns() - t_start) / 1e9;
  long rss1 = status_kb("VmRSS");
  if (k_idle < k)
    emit_attach(lat, k_idle, k, rss_mid, rss1, secs - secs_mid);
  emit_attach(lat, 0, k, rss0, rss1, secs);
  idle("attached", k, 0);
  round_trips(hs[k - 1], k);

  uint64_t t0 = bench_now_ns();
  for (int i = 0; i < k; i++)
    cogpu_detach(hs[i]);
  double detach_s = (double)(bench_now_ns() - t0) / 1e9;
  /* The daemon frees the slots as it reads the closes: wait for it. */
  for (int i = 0; i < 1000; i++) {
    cogpu_t *h;
    if (cogpu_attach(NULL, &h) != 0)
      break;
    cogpu_status_t *st;
    size_t n = 0;
    if (cogpu_status(h, &st) == 0) {
      n = st->gpus[0].nclients;
      cogpu_status_free(st);
    }
    cogpu_detach(h);
    if (n == 0)
      break;
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "bench-daemon: %d detaches took %.3f s; daemon RSS %ld kB\n",
          k, detach_s, status_kb("VmRSS"));
  free(hs);
  free(lat);
  return 0;
}

/* --- 3.: status with clients and waiters ---------------------------------- */

typedef struct waiter_arg_s {
  uint64_t bytes;
  int rc;
} waiter_arg_t;

static void *waiter_main(void *p) {
  waiter_arg_t *a = p;
  cogpu_t *h;
  a->rc = cogpu_attach(NULL, &h);
  if (a->rc)
    return NULL;
  /* Bounded: a waiter left over must not outlive the run by much. */
  cogpu_request_t rq = {.gpu = 0,
                        .bytes = a->bytes,
                        .priority = COGPU_PRIORITY_DEFAULT,
                        .timeout_ms = 120000,
                        .flags = 0};
  a->rc = cogpu_reserve(h, &rq, NULL);
  if (a->rc == 0)
    cogpu_release(h, 0, COGPU_ALL);
  cogpu_detach(h);
  return NULL;
}

static void time_status(cogpu_t *h, const char *what, int clients,
                        int waiters) {
  long rounds = bench_env_long("BENCH_STATUS_ROUNDS", 200);
  uint64_t *d = malloc((size_t)rounds * sizeof *d);
  if (!d)
    bench_die("malloc", -ENOMEM);
  size_t nc = 0, nw = 0;
  for (long i = -5; i < rounds; i++) {
    cogpu_status_t *st;
    uint64_t t0 = bench_now_ns();
    int rc = cogpu_status(h, &st);
    uint64_t t1 = bench_now_ns();
    if (rc)
      bench_die("cogpu_status", rc);
    nc = st->gpus[0].nclients;
    nw = st->gpus[0].nwaiting;
    cogpu_status_free(st);
    if (i >= 0)
      d[i] = t1 - t0;
  }
  bench_stats_t st = bench_stats(d, (size_t)rounds);
  bench_emit("status_snapshot", 1, &st,
             "\"mode\":\"node\",\"load\":\"%s\",\"clients\":%d,\"waiters\":%d,"
             "\"listed_clients\":%zu,\"listed_waiters\":%zu,"
             "\"clock_ns\":%" PRIu64,
             what, clients, waiters, nc, nw, clock_ns);
  free(d);
}

static int status_load(void) {
  int nc = (int)bench_env_long("BENCH_STATUS_CLIENTS", 1000);
  int nw = (int)bench_env_long("BENCH_STATUS_WAITERS", 1000);
  cogpu_t *h;
  int rc = cogpu_attach(NULL, &h);
  if (rc)
    bench_die("cogpu_attach", rc);
  time_status(h, "empty", 1, 0);
  cogpu_status_t *st;
  rc = cogpu_status(h, &st);
  if (rc)
    bench_die("cogpu_status", rc);
  uint64_t cap = st->gpus[0].capacity_bytes;
  cogpu_status_free(st);

  cogpu_t **hs = calloc((size_t)nc, sizeof *hs);
  for (int i = 0; i < nc; i++) {
    rc = cogpu_attach(NULL, &hs[i]);
    if (rc == 0)
      rc = cogpu_reserve(hs[i], &req, NULL);
    if (rc)
      bench_die("client attach/reserve", rc);
  }
  pthread_t *tid = calloc((size_t)nw, sizeof *tid);
  waiter_arg_t *args = calloc((size_t)nw, sizeof *args);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 256 * 1024);
  for (int i = 0; i < nw; i++) {
    args[i].bytes = cap; /* the whole GPU: waits while anyone holds any */
    if (pthread_create(&tid[i], &at, waiter_main, &args[i]) != 0)
      bench_die("pthread_create", -EAGAIN);
  }
  /* Until every request is queued. */
  uint64_t until = bench_now_ns() + 60ull * 1000000000u;
  for (;;) {
    rc = cogpu_status(h, &st);
    if (rc)
      bench_die("cogpu_status", rc);
    size_t q = st->gpus[0].nwaiting;
    cogpu_status_free(st);
    if (q >= (size_t)nw)
      break;
    if (bench_now_ns() > until) {
      fprintf(stderr, "bench: only %zu of %d requests queued\n", q, nw);
      return -1;
    }
    struct timespec ts = {0, 20 * 1000000};
    nanosleep(&ts, NULL);
  }
  time_status(h, "clients_and_waiters", nc + nw + 1, nw);
  idle("waiters_queued", nc + nw + 1, nw);
  /* Leave: the process's end closes every connection, which cancels the
   * waits (the daemon's job, not this benchmark's). */
  fflush(stdout);
  _exit(0);
}

int main(void) {
  alarm(600); /* last resort (run.sh bounds it too) */
  if (strcmp(bench_ledger_mode(), "node") != 0) {
    fprintf(stderr, "bench-daemon: node mode only (COGPU_NODE_MODE=daemon "
                    "and a running cogpud): skipped\n");
    return 0;
  }
  daemon_pid = find_daemon();
  clock_ns = bench_clock_overhead_ns();
  int rc = many_clients() ? 1 : 0;
  fflush(stdout);
  if (rc)
    return rc;
  /* In a child: it ends with its waiters still queued. */
  pid_t pid = fork();
  if (pid < 0)
    bench_die("fork", -errno);
  if (pid == 0)
    status_load();
  int ws;
  if (waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws) || WEXITSTATUS(ws))
    rc = 1;
  return rc;
}
