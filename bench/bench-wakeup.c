/*
 * bench-wakeup.c: wake-up latency, from a release to the waiter it serves
 * running again with its reservation granted.
 *
 * Process A holds three quarters of GPU 0; process B asks for half of it
 * with COGPU_WAIT_FOREVER and goes to sleep in the queue. Once B is seen
 * asleep, A stamps CLOCK_MONOTONIC (system-wide, so stamps compare across
 * processes), passes the stamp through shared memory and calls
 * cogpu_release; B stamps again the moment cogpu_reserve returns. Each
 * round then resets (B releases, A reserves again).
 *
 * For scale, the same hand-off is measured on a bare futex (no cogpu): the
 * operating system's own wake-up cost, which cogpu cannot go below.
 *
 * In node mode (bench/run.sh runs it once in each mode, and every line
 * says which: "mode" "single" or "node") the release is A's round trip to
 * cogpud, which answers B's wait connection; B's cogpu_reserve sleeps
 * several times there (its first try, the wait connection), so the
 * slept-once/slept-again split means something in single mode only.
 *
 * Knobs: BENCH_WAKE_ROUNDS (1000). Output: JSON lines (bench.h); benches
 * "wakeup" (release -> waiter running), "release_with_waiter" (duration of
 * A's cogpu_release call, which serves and wakes B) and
 * "futex_wakeup_baseline".
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "bench.h"
#include "cogpu.h"

typedef struct shared_s {
  _Atomic uint32_t a_ready;  /* round A is set up for (A holds its share) */
  _Atomic uint32_t b_asking; /* round B is about to request in */
  _Atomic uint32_t b_done;   /* round B finished */
  _Atomic uint32_t word;     /* baseline: the futex B sleeps on */
  _Atomic uint32_t failed;
  _Atomic uint64_t t0; /* A's stamp just before releasing / waking */
  uint64_t *sleeps;    /* per round: times B slept inside cogpu_reserve */
  uint64_t lat[];      /* per round, written by B */
} shared_t;

/* Voluntary context switches of the calling process so far: how many times
 * it went to sleep. Read around cogpu_reserve, outside the timed window. */
static uint64_t nvcsw(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (uint64_t)ru.ru_nvcsw;
}

/* Is pid asleep (state S in /proc/pid/stat)? */
static bool sleeping(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return false;
  buf[n] = 0;
  /* The command name may hold spaces and parentheses: the state follows
   * the last ')'. */
  char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && p[2] == 'S';
}

static void nap_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

/* Wait until B sleeps (polling gently: on two cores a spinning A would take
 * B's CPU). B announced it is about to ask, and between that and its futex
 * sleep in the queue nothing else can block it: A holds no lock meanwhile. */
static void wait_asleep(pid_t pid) {
  uint64_t until = bench_now_ns() + 10ull * 1000000000u;
  while (!sleeping(pid)) {
    if (bench_now_ns() > until) {
      fprintf(stderr, "bench: waiter %d never went to sleep\n", (int)pid);
      kill(pid, SIGKILL);
      exit(1);
    }
    nap_us(20);
  }
}

/* Wait until B's request is in the queue. Asleep alone is not enough in
 * node mode: B also sleeps waiting for the daemon's answer to its first
 * try, and a release that overtook it would be no wake-up at all. */
static void wait_queued(cogpu_t *h, pid_t pid) {
  uint64_t until = bench_now_ns() + 10ull * 1000000000u;
  for (;;) {
    cogpu_status_t *st;
    int rc = cogpu_status(h, &st);
    if (rc)
      bench_die("cogpu_status", rc);
    size_t nw = st->gpus[0].nwaiting;
    cogpu_status_free(st);
    if (nw >= 1)
      return;
    if (bench_now_ns() > until) {
      fprintf(stderr, "bench: waiter %d never queued\n", (int)pid);
      kill(pid, SIGKILL);
      exit(1);
    }
    nap_us(20);
  }
}

static int reap(pid_t pid) {
  int ws;
  return waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0
             ? 0
             : -1;
}

/* --- cogpu wake-up --------------------------------------------------- */

static void waiter(shared_t *sh, uint32_t rounds, uint64_t bytes) {
  alarm(120); /* a wedged round must not hang the suite */
  cogpu_t *h;
  int rc = cogpu_attach(NULL, &h);
  if (rc) {
    fprintf(stderr, "bench: waiter: attach: %s\n", cogpu_last_error());
    atomic_store(&sh->failed, 1);
    bench_store_wake(&sh->b_asking, UINT32_MAX);
    _exit(1);
  }
  cogpu_request_t rq = {.gpu = 0,
                        .bytes = bytes,
                        .priority = COGPU_PRIORITY_DEFAULT,
                        .timeout_ms = COGPU_WAIT_FOREVER,
                        .flags = 0};
  for (uint32_t i = 1; i <= rounds; i++) {
    bench_wait_ge(&sh->a_ready, i);
    bench_store_wake(&sh->b_asking, i);
    uint64_t cs0 = nvcsw();
    rc = cogpu_reserve(h, &rq, NULL);
    uint64_t t1 = bench_now_ns();
    sh->sleeps[i - 1] = nvcsw() - cs0;
    if (rc) {
      fprintf(stderr, "bench: waiter: reserve: %s\n", cogpu_last_error());
      atomic_store(&sh->failed, 1);
      bench_store_wake(&sh->b_done, UINT32_MAX);
      _exit(1);
    }
    sh->lat[i - 1] = t1 - atomic_load(&sh->t0);
    rc = cogpu_release(h, 0, COGPU_ALL);
    if (rc)
      bench_die("waiter: release", rc);
    bench_store_wake(&sh->b_done, i);
  }
  cogpu_detach(h);
  _exit(0);
}

static int cogpu_wakeup(uint32_t rounds, uint64_t clock_ns) {
  shared_t *sh = bench_shared_alloc(sizeof *sh + rounds * sizeof(uint64_t));
  sh->sleeps = bench_shared_alloc(rounds * sizeof(uint64_t));
  uint64_t *rel = malloc(rounds * sizeof *rel);
  cogpu_t *h;
  int rc = cogpu_attach(NULL, &h);
  if (rc || !rel)
    bench_die("cogpu_attach", rc ? rc : -ENOMEM);
  cogpu_status_t *st;
  rc = cogpu_status(h, &st);
  if (rc)
    bench_die("cogpu_status", rc);
  bench_check_mode(h);
  uint64_t cap = st->gpus[0].capacity_bytes;
  cogpu_status_free(st);
  uint64_t a_bytes = cap / 4 * 3, b_bytes = cap / 2; /* B fits only alone */
  cogpu_request_t rq = {.gpu = 0,
                        .bytes = a_bytes,
                        .priority = COGPU_PRIORITY_DEFAULT,
                        .timeout_ms = COGPU_NOWAIT,
                        .flags = 0};

  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0)
    bench_die("fork", -errno);
  if (pid == 0)
    waiter(sh, rounds, b_bytes);

  for (uint32_t i = 1; i <= rounds; i++) {
    rc = cogpu_reserve(h, &rq, NULL);
    if (rc)
      bench_die("holder: reserve", rc);
    bench_store_wake(&sh->a_ready, i);
    bench_wait_ge(&sh->b_asking, i);
    if (atomic_load(&sh->failed))
      break;
    wait_queued(h, pid);
    wait_asleep(pid);
    uint64_t t0 = bench_now_ns();
    atomic_store(&sh->t0, t0);
    rc = cogpu_release(h, 0, a_bytes);
    rel[i - 1] = bench_now_ns() - t0;
    if (rc)
      bench_die("holder: release", rc);
    bench_wait_ge(&sh->b_done, i);
    if (atomic_load(&sh->failed))
      break;
  }
  cogpu_detach(h);
  if (reap(pid) || atomic_load(&sh->failed)) {
    fprintf(stderr, "bench: the waiter failed\n");
    return -1;
  }
  /* More than one sleep in a round: woken for its grant, the waiter found
   * the ledger lock still held (the releaser wakes it before unlocking) and
   * slept again until the unlock. Counted to tell that cost apart. */
  uint64_t *once = malloc(rounds * sizeof *once);
  uint64_t *again = malloc(rounds * sizeof *again);
  if (!once || !again)
    bench_die("malloc", -ENOMEM);
  size_t n1 = 0, n2 = 0;
  for (uint32_t i = 0; i < rounds; i++) {
    if (sh->sleeps[i] > 1)
      again[n2++] = sh->lat[i];
    else
      once[n1++] = sh->lat[i];
  }
  bench_stats_t s1 = bench_stats(once, n1), s2 = bench_stats(again, n2);
  bench_stats_t s = bench_stats(sh->lat, rounds);
  bench_emit("wakeup", 2, &s,
             "\"mode\":\"%s\",\"waiter_bytes\":%" PRIu64
             ",\"holder_bytes\":%" PRIu64
             ",\"rounds_slept_again\":%zu,\"median_ns_slept_once\":%" PRIu64
             ",\"median_ns_slept_again\":%" PRIu64 ",\"clock_ns\":%" PRIu64,
             bench_ledger_mode(), b_bytes, a_bytes, n2, s1.median, s2.median,
             clock_ns);
  free(once);
  free(again);
  s = bench_stats(rel, rounds);
  bench_emit("release_with_waiter", 2, &s,
             "\"mode\":\"%s\",\"clock_ns\":%" PRIu64, bench_ledger_mode(),
             clock_ns);
  free(rel);
  munmap(sh->sleeps, rounds * sizeof(uint64_t));
  munmap(sh, sizeof *sh + rounds * sizeof(uint64_t));
  return 0;
}

/* --- bare futex baseline ----------------------------------------------- */

static int futex_baseline(uint32_t rounds, uint64_t clock_ns) {
  shared_t *sh = bench_shared_alloc(sizeof *sh + rounds * sizeof(uint64_t));
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0)
    bench_die("fork", -errno);
  if (pid == 0) {
    alarm(120);
    for (uint32_t i = 1; i <= rounds; i++) {
      bench_store_wake(&sh->b_asking, i);
      while (atomic_load(&sh->word) < i)
        bench_futex_wait(&sh->word, i - 1);
      sh->lat[i - 1] = bench_now_ns() - atomic_load(&sh->t0);
      bench_store_wake(&sh->b_done, i);
    }
    _exit(0);
  }
  for (uint32_t i = 1; i <= rounds; i++) {
    bench_wait_ge(&sh->b_asking, i);
    wait_asleep(pid);
    atomic_store(&sh->t0, bench_now_ns());
    bench_store_wake(&sh->word, i);
    bench_wait_ge(&sh->b_done, i);
  }
  if (reap(pid))
    return -1;
  bench_stats_t s = bench_stats(sh->lat, rounds);
  bench_emit("futex_wakeup_baseline", 2, &s,
             "\"mode\":\"%s\",\"clock_ns\":%" PRIu64, bench_ledger_mode(),
             clock_ns);
  munmap(sh, sizeof *sh + rounds * sizeof(uint64_t));
  return 0;
}

int main(void) {
  alarm(300); /* last resort if a child wedges (run.sh bounds it too) */
  uint32_t rounds = (uint32_t)bench_env_long("BENCH_WAKE_ROUNDS", 1000);
  uint64_t clock_ns = bench_clock_overhead_ns();
  int rc = cogpu_wakeup(rounds, clock_ns) ? 1 : 0;
  if (futex_baseline(rounds, clock_ns))
    rc = 1;
  return rc;
}
