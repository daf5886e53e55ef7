/*
 * bench.h: helpers shared by the benchmarks in bench/ (clock, percentiles,
 * environment knobs, shared memory, JSON-lines output).
 *
 * Everything here is static inline so that each bench-*.c stays a single
 * translation unit linked only against libcogpu.a (see the Makefile's bench
 * rule). Output is one JSON object per line on stdout, the format that
 * style.md section 8 asks for, so runs can be saved and compared by tools.
 */
#ifndef COGPU_BENCH_H
#define COGPU_BENCH_H

#include <errno.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "cogpu.h"

/* CLOCK_MONOTONIC is system-wide, so stamps taken in different processes
 * compare directly (the wake-up benchmark depends on this). */
static inline uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void bench_die(const char *what, int rc) {
  fprintf(stderr, "bench: %s failed: %d (%s)\n", what, rc,
          rc < 0 ? strerror(-rc) : "");
  exit(1);
}

/* A positive integer knob from the environment, or def. Bad values are
 * fatal: a silently ignored knob would make a run look like another.
 * BENCH_SMOKE=1 (CI's smoke run: does every benchmark still run end to
 * end?) makes each default a hundredth of itself, at least 1: counts,
 * rounds and durations shrink to a second or so, and the figures mean
 * nothing. */
static inline long bench_env_knob(const char *name, long def, bool scale) {
  const char *s = getenv(name);
  const char *smoke = getenv("BENCH_SMOKE");
  if (scale && smoke && !strcmp(smoke, "1"))
    def = def / 100 > 0 ? def / 100 : 1;
  if (!s || !*s)
    return def;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v <= 0) {
    fprintf(stderr, "bench: %s must be a positive integer, not '%s'\n", name,
            s);
    exit(2);
  }
  return v;
}

/* A count, a number of rounds or a duration: smaller in a smoke run. */
static inline long bench_env_long(const char *name, long def) {
  return bench_env_knob(name, def, true);
}

/* A value the run needs as it is (a time derived from the others). */
static inline long bench_env_exact(const char *name, long def) {
  return bench_env_knob(name, def, false);
}

/* Zero-filled memory shared with children forked afterwards. MAP_NORESERVE:
 * sample buffers are sized for the worst case but only touched pages cost. */
static inline void *bench_shared_alloc(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    perror("bench: mmap");
    exit(1);
  }
  return p;
}

/* Process-shared futex wait/wake, for start barriers and hand-offs that
 * must not burn the two cores the measured processes need. */
static inline void bench_futex_wait(_Atomic uint32_t *w, uint32_t val) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, NULL, NULL, 0);
}
static inline void bench_futex_wake(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}
/* Wait until *w >= target. */
static inline void bench_wait_ge(_Atomic uint32_t *w, uint32_t target) {
  for (;;) {
    uint32_t v = atomic_load(w);
    if (v >= target)
      return;
    bench_futex_wait(w, v);
  }
}
static inline void bench_store_wake(_Atomic uint32_t *w, uint32_t v) {
  atomic_store(w, v);
  bench_futex_wake(w);
}

/* --- which ledger ---------------------------------------------------- */

/* The ledger path a benchmark measures, as the library chooses it
 * (node_mode): "node" (every reserve is a round trip to cogpud) or
 * "single" (the daemonless shared-memory ledger). run.sh sets
 * COGPU_NODE_MODE for each run; with "auto" the daemon's socket decides. */
static inline const char *bench_ledger_mode(void) {
  const char *m = getenv("COGPU_NODE_MODE");
  if (m && strcmp(m, "daemon") == 0)
    return "node";
  if (m && strcmp(m, "single") == 0)
    return "single";
  const char *sock = getenv("COGPU_SOCKET");
  return access(sock && *sock ? sock : "/run/cogpu/cogpu.sock", F_OK) == 0
             ? "node"
             : "single";
}

/* Checks that an attached handle uses the ledger bench_ledger_mode() names
 * (in node mode, status comes from the daemon and says so), so that a
 * result is never labelled with the other mode. */
static inline void bench_check_mode(cogpu_t *h) {
  cogpu_status_t *st;
  int rc = cogpu_status(h, &st);
  if (rc)
    bench_die("cogpu_status", rc);
  bool node = strncmp(st->state_path, "cogpud ", 7) == 0;
  cogpu_status_free(st);
  if (node != (strcmp(bench_ledger_mode(), "node") == 0)) {
    fprintf(stderr, "bench: the library uses the %s ledger, not the %s one\n",
            node ? "node" : "single", bench_ledger_mode());
    exit(2);
  }
}

/* --- statistics ------------------------------------------------------- */

typedef struct bench_stats_s {
  size_t n;
  uint64_t min, median, p90, p99, p999, max;
  double mean;
} bench_stats_t;

static inline int bench_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array (p in 0..100). */
static inline uint64_t bench_pct(const uint64_t *s, size_t n, double p) {
  if (n == 0)
    return 0;
  double r = p / 100.0 * (double)n;
  size_t k = (size_t)r;
  if ((double)k < r)
    k++; /* ceil */
  if (k < 1)
    k = 1;
  if (k > n)
    k = n;
  return s[k - 1];
}

/* Sorts v in place. */
static inline bench_stats_t bench_stats(uint64_t *v, size_t n) {
  bench_stats_t st = {.n = n};
  if (n == 0)
    return st;
  qsort(v, n, sizeof v[0], bench_cmp_u64);
  double sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += (double)v[i];
  st.min = v[0];
  st.max = v[n - 1];
  st.median = bench_pct(v, n, 50);
  st.p90 = bench_pct(v, n, 90);
  st.p99 = bench_pct(v, n, 99);
  st.p999 = bench_pct(v, n, 99.9);
  st.mean = sum / (double)n;
  return st;
}

/* Median cost of one bench_now_ns() call: every timed sample includes one,
 * so it is reported next to the results (a VM without a usable TSC makes it
 * a system call). */
static inline uint64_t bench_clock_overhead_ns(void) {
  enum { N = 1001 };
  uint64_t d[N];
  for (int i = 0; i < N; i++) {
    uint64_t a = bench_now_ns();
    d[i] = bench_now_ns() - a;
  }
  return bench_stats(d, N).median;
}

/* --- JSON-lines output ------------------------------------------------ */

/* Writes s as a JSON string literal (with the quotes). */
static inline void bench_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

/* The commit under test: run.sh passes it (it knows whether the tree is
 * dirty); a binary run by hand asks git, else "unknown". */
static inline void bench_commit(char *buf, size_t len) {
  const char *s = getenv("COGPU_BENCH_COMMIT");
  snprintf(buf, len, "unknown");
  if (s && *s) {
    snprintf(buf, len, "%s", s);
    return;
  }
  FILE *p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
  if (!p)
    return;
  char line[64];
  if (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\r\n")] = 0;
    if (*line)
      snprintf(buf, len, "%s", line);
  }
  pclose(p);
}

/*
 * Prints one result line: {"bench":..., "procs":..., <stats>, <extra>,
 * "commit", "machine", "date"}. `extra_fmt` (may be NULL) is a printf format
 * for further `"key":value` pairs, written without a leading comma.
 */
__attribute__((format(printf, 4, 5))) static inline void
bench_emit(const char *bench, int procs, const bench_stats_t *st,
           const char *extra_fmt, ...) {
  static char commit[64], machine[160], date[32];
  if (!*commit) {
    bench_commit(commit, sizeof commit);
    struct utsname u;
    snprintf(machine, sizeof machine, "%s, %ld cpus",
             uname(&u) == 0 ? u.nodename : "unknown",
             sysconf(_SC_NPROCESSORS_ONLN));
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  }
  /* Other work on the machine skews latencies (a 2-core VM is easily
   * disturbed): record the 1-minute load average next to every result. */
  double load = -1;
  FILE *la = fopen("/proc/loadavg", "r");
  if (la) {
    if (fscanf(la, "%lf", &load) != 1)
      load = -1;
    fclose(la);
  }
  FILE *f = stdout;
  fprintf(f, "{\"bench\":");
  bench_json_str(f, bench);
  fprintf(f,
          ",\"procs\":%d,\"n\":%zu,\"min_ns\":%" PRIu64
          ",\"median_ns\":%" PRIu64 ",\"p90_ns\":%" PRIu64
          ",\"p99_ns\":%" PRIu64 ",\"p999_ns\":%" PRIu64 ",\"max_ns\":%" PRIu64
          ",\"mean_ns\":%.1f",
          procs, st->n, st->min, st->median, st->p90, st->p99, st->p999,
          st->max, st->mean);
  if (extra_fmt) {
    fputc(',', f);
    va_list ap;
    va_start(ap, extra_fmt);
    vfprintf(f, extra_fmt, ap);
    va_end(ap);
  }
  fprintf(f, ",\"commit\":");
  bench_json_str(f, commit);
  fprintf(f, ",\"machine\":");
  bench_json_str(f, machine);
  fprintf(f, ",\"date\":");
  bench_json_str(f, date);
  fprintf(f, ",\"loadavg\":%.2f", load);
  fprintf(f, "}\n");
  fflush(f);
}

#endif /* COGPU_BENCH_H */
