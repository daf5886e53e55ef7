/*
 * bench-pl-table.c: the preload library's allocation table (src/preload/
 * table.c) as a long run uses it: what a lookup that finds nothing costs
 * (the free of a pointer cogpu never tracked, passed to the driver) after
 * millions of allocation/free pairs, against the same lookup on the fresh
 * table, measured in the same run. The table has the size the library
 * gives its pointer table (2^20 entries); 64 allocations stay live.
 *
 * Knobs (environment): BENCH_CHURN (16777216: pairs in all; a line after
 * each of 1M, 4M, 8M and 16M, those not above it), BENCH_ITERS (100000
 * lookups per line). Output: JSON lines, "call":"miss" with "pairs" (done
 * before the line; 0 is the baseline) and "vs_fresh" (median over the
 * fresh table's median).
 */
#include "bench.h"
#include "preload/table.h"

#define CAP (1u << 20)
#define LIVE 64

static uint64_t key_of(uint64_t i) {
  return (i + 2) * 4096;
}

static bench_stats_t misses(pl_table_t *t, long iters, uint64_t *s) {
  uint64_t v;
  for (long i = 0; i < iters; i++) {
    uint64_t k = 0xdead00000000ull + (uint64_t)i * 8192;
    uint64_t t0 = bench_now_ns();
    if (cogpu__pl_table_take(t, k, &v))
      bench_die("found an untracked key", -EINVAL);
    s[i] = bench_now_ns() - t0;
  }
  return bench_stats(s, (size_t)iters);
}

int main(void) {
  long churn = bench_env_long("BENCH_CHURN", 16l << 20);
  long iters = bench_env_long("BENCH_ITERS", 100000);
  uint64_t *s = malloc((size_t)iters * sizeof *s), v;
  pl_table_t t;
  if (!s || cogpu__pl_table_init(&t, CAP) != 0)
    bench_die("setup", -ENOMEM);
  uint64_t clock_ns = bench_clock_overhead_ns();
  /* LIVE allocations stay live throughout, as a program's do. */
  for (uint64_t i = 0; i < LIVE; i++)
    cogpu__pl_table_put(&t, key_of(i), i);
  bench_stats_t fresh = misses(&t, iters, s);
  bench_emit("pl-table", 1, &fresh,
             "\"call\":\"miss\",\"pairs\":0,\"vs_fresh\":1.0,"
             "\"clock_ns\":%" PRIu64,
             clock_ns);
  static const long marks[] = {1l << 20, 4l << 20, 8l << 20, 16l << 20};
  uint64_t next = LIVE;
  long done = 0;
  for (size_t m = 0; m < sizeof marks / sizeof marks[0]; m++) {
    if (marks[m] > churn)
      break;
    for (; done < marks[m]; done++, next++) {
      if (!cogpu__pl_table_put(&t, key_of(next), next) ||
          !cogpu__pl_table_take(&t, key_of(next), &v))
        bench_die("put/take", -EIO);
    }
    bench_stats_t st = misses(&t, iters, s);
    bench_emit("pl-table", 1, &st,
               "\"call\":\"miss\",\"pairs\":%ld,\"vs_fresh\":%.1f,"
               "\"clock_ns\":%" PRIu64,
               done,
               (double)st.median / (double)(fresh.median ? fresh.median : 1),
               clock_ns);
  }
  free(s);
  return 0;
}
