/*
 * bench-scrape.c: what a Prometheus scrape costs the node (docs/metrics.md),
 * with 1,000 clients holding memory and 1,000 requests waiting.
 *
 * A scrape is what `cogpu metrics` and each GET /metrics of `cogpu
 * exporter` do: one cogpu_status snapshot, then rendering the text outside
 * any lock. Measured in the same run, alternating:
 *   - "scrape": cogpu_status + cli_metrics_render (tools/cogpu/metrics.c);
 *   - "status_snapshot": cogpu_status alone;
 *   - "scrape_render": rendering alone;
 *   - "lock_hold_scrape" and "lock_hold_status": how long the ledger lock
 *     was held during each (the sum over the call: taken once), measured by
 *     wrapping the ledger's lock and unlock at link time (-Wl,--wrap), so
 *     the library under test is the one that ships.
 * Both ledgers (run.sh's BENCH_MODES): single-user (the in-process
 * ledger, where the snapshot first probes every client's liveness), and
 * node mode, where the daemon takes the snapshot under its lock and sends
 * it as a sealed memfd; there the lock is the daemon's, and the lock_hold
 * lines are left out (bench-daemon times the daemon's side).
 *
 * Clients and waiters are handles of this process (one slot and one OFD
 * liveness lock each), the waiters a thread each, asleep on their futex:
 * sweep_interval is set long so no housekeeping tick takes the lock during
 * the measurement.
 */
#include <pthread.h>
#include <sys/resource.h>

#include "bench.h"
#include "cli.h"
#include "internal.h"

/* The wrapped lock calls (ledger/lock.c), timed. */
struct cogpu_s;
void __real_cogpu__ledger_lock(struct cogpu_s *h);
int __real_cogpu__ledger_lock_bounded(struct cogpu_s *h);
void __real_cogpu__ledger_unlock(struct cogpu_s *h);
void __wrap_cogpu__ledger_lock(struct cogpu_s *h);
int __wrap_cogpu__ledger_lock_bounded(struct cogpu_s *h);
void __wrap_cogpu__ledger_unlock(struct cogpu_s *h);

static _Thread_local uint64_t locked_at, held_ns;

void __wrap_cogpu__ledger_lock(struct cogpu_s *h) {
  __real_cogpu__ledger_lock(h);
  locked_at = bench_now_ns();
}

int __wrap_cogpu__ledger_lock_bounded(struct cogpu_s *h) {
  int rc = __real_cogpu__ledger_lock_bounded(h);
  if (rc == 0)
    locked_at = bench_now_ns();
  return rc;
}

void __wrap_cogpu__ledger_unlock(struct cogpu_s *h) {
  held_ns += bench_now_ns() - locked_at;
  __real_cogpu__ledger_unlock(h);
}

#define MIB (1024ull * 1024)

static void *waiter(void *arg) {
  cogpu_t *h = arg;
  cogpu_request_t r = {.gpu = 0,
                       .bytes = 40ull << 30,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_WAIT_FOREVER};
  cogpu_reserve(h, &r, NULL); /* waits until the process exits */
  return NULL;
}

int main(void) {
  int nclients = (int)bench_env_long("BENCH_CLIENTS", 1000);
  int nwaiters = (int)bench_env_long("BENCH_WAITERS", 1000);
  int iters = (int)bench_env_long("BENCH_ITERS", 200);
  setenv("COGPU_SWEEP_INTERVAL", "1h", 1);
  setenv("COGPU_NODE_MODE", "single", 0); /* run.sh says which */
  const char *ledger = bench_ledger_mode();
  bool node = strcmp(ledger, "node") == 0;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  /* Clients: 16 MiB each on GPU 0 (FAKE_NVML_GPUS, run.sh: 80G), and job
   * ids and commands of a realistic length to render. */
  cogpu_t *obs = NULL;
  cogpu_attach_opts_t o = {.command = "bench-scrape observer"};
  int rc = cogpu_attach(&o, &obs);
  if (rc)
    bench_die("cogpu_attach", rc);
  bench_check_mode(obs);
  for (int i = 0; i < nclients; i++) {
    char cmd[96], job[32];
    snprintf(cmd, sizeof cmd, "python train.py --config run-%04d.yaml", i);
    snprintf(job, sizeof job, "%d", 4000000 + i);
    cogpu_attach_opts_t co = {.command = cmd, .job_id = job};
    cogpu_t *h;
    rc = cogpu_attach(&co, &h);
    if (rc)
      bench_die("cogpu_attach (client)", rc);
    cogpu_request_t r = {.gpu = 0,
                         .bytes = 16 * MIB,
                         .priority = COGPU_PRIORITY_DEFAULT,
                         .timeout_ms = 0};
    rc = cogpu_reserve(h, &r, NULL);
    if (rc)
      bench_die("cogpu_reserve (client)", rc);
  }
  /* Waiters: each asks for 40 GiB, more than is free (80 GiB less what the
   * clients hold, less the first waiter... under fifo all wait). */
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 64 * 1024);
  for (int i = 0; i < nwaiters; i++) {
    char cmd[64];
    snprintf(cmd, sizeof cmd, "waiting job %d", i);
    cogpu_attach_opts_t wo = {.command = cmd, .job_id = "waiting"};
    cogpu_t *h;
    rc = cogpu_attach(&wo, &h);
    if (rc)
      bench_die("cogpu_attach (waiter)", rc);
    pthread_t t;
    if (pthread_create(&t, &at, waiter, h))
      bench_die("pthread_create", -EAGAIN);
  }
  /* Until every waiter is queued. */
  for (;;) {
    cogpu_status_t *st;
    rc = cogpu_status(obs, &st);
    if (rc)
      bench_die("cogpu_status", rc);
    size_t nw = st->gpus[0].nwaiting;
    size_t nc = st->gpus[0].nclients;
    cogpu_status_free(st);
    /* The first waiter may fit (80G - 16G) and hold 40G: then the others
     * wait behind it. */
    if (nw + (nc > (size_t)nclients) >= (size_t)nwaiters)
      break;
    usleep(10000);
  }
  uint64_t *scrape = calloc((size_t)iters, sizeof *scrape),
           *status = calloc((size_t)iters, sizeof *status),
           *render = calloc((size_t)iters, sizeof *render),
           *hold_scrape = calloc((size_t)iters, sizeof *hold_scrape),
           *hold_status = calloc((size_t)iters, sizeof *hold_status);
  if (!scrape || !status || !render || !hold_scrape || !hold_status)
    bench_die("calloc", -ENOMEM);
  size_t bytes = 0;
  cli_metrics_opts_t mo = {.max_jobs = -1, .status_seconds = 0};
  for (int i = 0; i < iters; i++) {
    cogpu_status_t *st;
    held_ns = 0;
    uint64_t t0 = bench_now_ns();
    rc = cogpu_status(obs, &st);
    uint64_t t1 = bench_now_ns();
    if (rc)
      bench_die("cogpu_status", rc);
    status[i] = t1 - t0;
    hold_status[i] = held_ns;
    cogpu_status_free(st);

    held_ns = 0;
    t0 = bench_now_ns();
    rc = cogpu_status(obs, &st);
    if (rc)
      bench_die("cogpu_status", rc);
    uint64_t tr = bench_now_ns();
    char *buf;
    rc = cli_metrics_render(st, &mo, &buf, &bytes);
    t1 = bench_now_ns();
    if (rc)
      bench_die("render", rc);
    scrape[i] = t1 - t0;
    render[i] = t1 - tr;
    hold_scrape[i] = held_ns;
    free(buf);
    cogpu_status_free(st);
  }
/* "mode" as bench-reserve's lines, for compare.py's node/single table. */
#define FMT                                                                    \
  "\"clients\":%d,\"waiters\":%d,\"text_bytes\":%zu,\"ledger\":\"%s\","        \
  "\"mode\":\"%s\""
  bench_stats_t s = bench_stats(scrape, (size_t)iters);
  bench_emit("scrape", 1, &s, FMT, nclients, nwaiters, bytes, ledger, ledger);
  s = bench_stats(render, (size_t)iters);
  bench_emit("scrape_render", 1, &s, FMT, nclients, nwaiters, bytes, ledger,
             ledger);
  s = bench_stats(status, (size_t)iters);
  bench_emit("status_snapshot_plain", 1, &s, FMT, nclients, nwaiters, bytes,
             ledger, ledger);
  if (!node) {
    s = bench_stats(hold_scrape, (size_t)iters);
    bench_emit("lock_hold_scrape", 1, &s, FMT, nclients, nwaiters, bytes,
               ledger, ledger);
    s = bench_stats(hold_status, (size_t)iters);
    bench_emit("lock_hold_status", 1, &s, FMT, nclients, nwaiters, bytes,
               ledger, ledger);
  }
  /* The waiters sleep for ever: leave without detaching 2,000 handles. */
  fflush(stdout);
  _exit(0);
}
