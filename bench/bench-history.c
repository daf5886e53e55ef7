/*
 * bench-history.c: what keeping the job history costs (docs/history.md).
 *
 * 1. The insert rate of src/history itself: cogpu__hist_add (one
 *    transaction: the insert, then retention by age and by rows), each
 *    call timed, BENCH_ITERS of them into a database that holds
 *    BENCH_HIST_ROWS records already (0, and the default history_max_rows,
 *    100,000), in the same run on two file systems: the disk (a directory
 *    under TMPDIR, or BENCH_HIST_DIR) and memory (/dev/shm, a tmpfs: the
 *    baseline without a disk; the same code, SQLite in WAL mode with
 *    synchronous=NORMAL, which syncs at checkpoints only). "hist_insert"
 *    applies the default retention (90 days, 100,000 rows);
 *    "hist_insert_bare" none, so the difference is retention's share.
 *
 * 2. Node mode (run.sh starts a cogpud whose history is BENCH_HISTORY_DB):
 *    the time from a job's end to its record committed by the daemon's
 *    writer thread. A job here is a handle of this process that reserved
 *    64 MiB (a job that never used GPU memory is not recorded); its end is
 *    cogpu_detach. "job_record" is from the detach's start until a
 *    read-only connection to the database sees the record (polled every
 *    BENCH_POLL_US, 20 µs); "job_end_recorded" the detach alone, and
 *    "job_end_unrecorded" the detach of a job that reserved nothing, in
 *    the same run, alternating: the writer thread must add nothing to the
 *    job's end.
 */
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include "bench.h"
#include "history/history.h"

static void fill_rec(cogpu__hist_rec_t *r, long i) {
  memset(r, 0, sizeof *r);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  r->end_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  r->start_ms = r->end_ms - 60000;
  r->uid = 1000;
  snprintf(r->user, sizeof r->user, "alice");
  snprintf(r->command, sizeof r->command,
           "python train.py --config run-%04ld.yaml", i % 10000);
  snprintf(r->job_id, sizeof r->job_id, "%ld", 4000000 + i);
  r->gpu = 0;
  snprintf(r->gpu_uuid, sizeof r->gpu_uuid,
           "GPU-00000000-0000-0000-0000-000000000000");
  snprintf(r->gpu_name, sizeof r->gpu_name, "NVIDIA H100 80GB HBM3");
  r->declared = 12ull << 30;
  r->peak = 7ull << 30;
  r->peak_after_ms = 1234;
  r->run_ms = 60000;
  /* A minute's timeline, one sample a second, as the daemon keeps it. */
  static cogpu__hist_tl_t tl;
  memset(&tl, 0, sizeof tl);
  for (int k = 0; k < 60; k++)
    cogpu__hist_tl_add(&tl, (uint64_t)k * 1000, (uint64_t)k << 27);
  cogpu__hist_tl_store(r, &tl);
}

/* `rows` records, in one transaction of SQLite's own (the same columns):
 * a history as a busy node has it. */
static void prefill(const char *path, long rows) {
  if (rows == 0)
    return;
  sqlite3 *db;
  if (sqlite3_open(path, &db) != SQLITE_OK)
    bench_die("sqlite3_open", -EIO);
  char sql[1024];
  snprintf(sql, sizeof sql,
           "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
           "WHERE i < %ld) INSERT INTO jobs (start_ms, end_ms, uid, user, "
           "command, job_id, gpu, gpu_uuid, gpu_name, declared, peak, "
           "peak_after_ms, waited_ms, run_ms, exit_status, suspensions, "
           "guard_failures, tl_ms, timeline) SELECT "
           "strftime('%%s','now') * 1000 - 86400000 + i, "
           "strftime('%%s','now') * 1000 - 86400000 + i + 60000, 1000, "
           "'alice', 'python train.py --config run-' || (i %% 10000) || "
           "'.yaml', i, 0, 'GPU-x', 'NVIDIA H100 80GB HBM3', 12884901888, "
           "7516192768, 1234, 0, 60000, 0, 0, 0, 1000, zeroblob(480) FROM n",
           rows);
  char *err = NULL;
  if (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK ||
      sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    fprintf(stderr, "bench-history: prefill: %s\n", err ? err : "?");
    exit(1);
  }
  sqlite3_close(db);
}

static void rm_db(const char *path) {
  char p[600];
  unlink(path);
  snprintf(p, sizeof p, "%s-wal", path);
  unlink(p);
  snprintf(p, sizeof p, "%s-shm", path);
  unlink(p);
}

/* cogpu__hist_add, `iters` times, into dir/history.db holding `rows`. */
static void inserts(const char *fs, const char *dir, long rows, long iters,
                    bool retention) {
  char path[512];
  snprintf(path, sizeof path, "%s/history.db", dir);
  rm_db(path);
  cogpu__hist_t *h;
  int rc = cogpu__hist_open(path, true, &h);
  if (rc) {
    fprintf(stderr, "bench-history: %s\n", cogpu_last_error());
    exit(1);
  }
  prefill(path, rows);
  cogpu__hist_rec_t *r = malloc(sizeof *r);
  uint64_t *s = malloc((size_t)iters * sizeof *s);
  if (!r || !s)
    bench_die("malloc", -ENOMEM);
  int64_t age = retention ? 90ll * 86400 * 1000 : -1;
  int64_t max_rows = retention ? 100000 : 0;
  for (long i = -iters / 10; i < iters; i++) { /* first tenth: warm-up */
    fill_rec(r, i);
    uint64_t t0 = bench_now_ns();
    rc = cogpu__hist_add(h, r, age, max_rows);
    uint64_t t = bench_now_ns() - t0;
    if (rc) {
      fprintf(stderr, "bench-history: %s\n", cogpu_last_error());
      exit(1);
    }
    if (i >= 0)
      s[i] = t;
  }
  cogpu__hist_close(h);
  bench_stats_t st = bench_stats(s, (size_t)iters);
  bench_emit(retention ? "hist_insert" : "hist_insert_bare", 1, &st,
             "\"fs\":\"%s\",\"rows\":%ld,\"per_s\":%.0f", fs, rows,
             st.mean > 0 ? 1e9 / st.mean : 0.0);
  free(r);
  free(s);
  rm_db(path);
}

/* --- node mode: from a job's end to its record ------------------------- */

static int64_t max_id(sqlite3_stmt *q) {
  sqlite3_reset(q);
  int64_t id = -1;
  if (sqlite3_step(q) == SQLITE_ROW)
    id = sqlite3_column_int64(q, 0);
  return id;
}

static int job_record(const char *db_path, long iters) {
  long poll_us = bench_env_long("BENCH_POLL_US", 20);
  sqlite3 *db = NULL;
  sqlite3_stmt *q = NULL;
  cogpu_t *obs;
  int rc = cogpu_attach(NULL, &obs);
  if (rc)
    bench_die("cogpu_attach", rc);
  bench_check_mode(obs);
  /* One recorded job first: the daemon makes the database at start, the
   * writer opens its connection at the first record. */
  for (int k = 0; k < 2 && !q; k++) {
    cogpu_t *h;
    cogpu_request_t r = {.gpu = 0,
                         .bytes = 64ull << 20,
                         .priority = COGPU_PRIORITY_DEFAULT,
                         .timeout_ms = COGPU_NOWAIT};
    if (cogpu_attach(NULL, &h) || cogpu_reserve(h, &r, NULL))
      bench_die("attach/reserve", -EIO);
    cogpu_detach(h);
    usleep(200000);
    if (!db && sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) !=
                   SQLITE_OK) {
      fprintf(stderr, "bench-history: %s: %s\n", db_path,
              db ? sqlite3_errmsg(db) : "cannot open");
      return 1;
    }
    if (sqlite3_prepare_v2(db, "SELECT max(id) FROM jobs", -1, &q, NULL) !=
        SQLITE_OK)
      q = NULL;
  }
  if (!q || max_id(q) < 1) {
    fprintf(stderr, "bench-history: the daemon wrote no record to %s\n",
            db_path);
    return 1;
  }
  uint64_t *rec = malloc((size_t)iters * sizeof *rec),
           *end_rec = malloc((size_t)iters * sizeof *end_rec),
           *end_none = malloc((size_t)iters * sizeof *end_none);
  if (!rec || !end_rec || !end_none)
    bench_die("malloc", -ENOMEM);
  for (long i = 0; i < iters; i++) {
    for (int kind = 0; kind < 2; kind++) {
      char job[32];
      snprintf(job, sizeof job, "bench-%ld-%d", i, kind);
      cogpu_attach_opts_t o = {.job_id = job, .command = "bench-history"};
      cogpu_t *h;
      rc = cogpu_attach(&o, &h);
      if (rc)
        bench_die("cogpu_attach", rc);
      cogpu_request_t r = {.gpu = 0,
                           .bytes = 64ull << 20,
                           .priority = COGPU_PRIORITY_DEFAULT,
                           .timeout_ms = COGPU_NOWAIT};
      if (kind == 0 && (rc = cogpu_reserve(h, &r, NULL)) != 0)
        bench_die("cogpu_reserve", rc);
      int64_t before = max_id(q);
      uint64_t t0 = bench_now_ns();
      cogpu_detach(h);
      uint64_t t1 = bench_now_ns();
      if (kind == 1) {
        end_none[i] = t1 - t0;
        continue;
      }
      end_rec[i] = t1 - t0;
      for (;;) {
        if (max_id(q) > before)
          break;
        if (bench_now_ns() - t0 > 10000000000ull) {
          fprintf(stderr, "bench-history: no record after 10 s\n");
          return 1;
        }
        struct timespec ts = {0, poll_us * 1000};
        nanosleep(&ts, NULL);
      }
      rec[i] = bench_now_ns() - t0;
    }
  }
  sqlite3_finalize(q);
  sqlite3_close(db);
  cogpu_detach(obs);
  bench_stats_t s = bench_stats(rec, (size_t)iters);
  bench_emit("job_record", 1, &s, "\"ledger\":\"node\",\"poll_us\":%ld",
             poll_us);
  s = bench_stats(end_rec, (size_t)iters);
  bench_emit("job_end_recorded", 1, &s, "\"ledger\":\"node\"");
  s = bench_stats(end_none, (size_t)iters);
  bench_emit("job_end_unrecorded", 1, &s, "\"ledger\":\"node\"");
  free(rec);
  free(end_rec);
  free(end_none);
  return 0;
}

int main(void) {
  alarm(280); /* last resort; run.sh bounds it too */
  long iters = bench_env_long("BENCH_ITERS", 2000);
  long jobs = bench_env_long("BENCH_JOBS", 200);
  const char *big = getenv("BENCH_HIST_ROWS");
  long sizes[2] = {0, big && *big ? atol(big) : 100000};
  /* The disk and memory directories, private (cogpu__hist_open refuses a
   * directory others can write). */
  char disk[512], mem[512];
  const char *d = getenv("BENCH_HIST_DIR");
  const char *tmp = getenv("TMPDIR");
  snprintf(disk, sizeof disk, "%s/cogpu-bench-hist.XXXXXX",
           d && *d       ? d
           : tmp && *tmp ? tmp
                         : "/tmp");
  snprintf(mem, sizeof mem, "/dev/shm/cogpu-bench-hist.XXXXXX");
  if (!mkdtemp(disk) || !mkdtemp(mem))
    bench_die("mkdtemp", -errno);
  const char *dirs[2] = {disk, mem}, *fs[2] = {"disk", "memory"};
  for (int k = 0; k < 2; k++)
    for (int f = 0; f < 2; f++) {
      inserts(fs[f], dirs[f], sizes[k], iters, true);
      inserts(fs[f], dirs[f], sizes[k], iters, false);
    }
  rmdir(disk);
  rmdir(mem);
  const char *db = getenv("BENCH_HISTORY_DB");
  if (db && *db && strcmp(bench_ledger_mode(), "node") == 0)
    return job_record(db, jobs);
  fprintf(stderr, "bench-history: no daemon (BENCH_HISTORY_DB): the time to "
                  "record a job is not measured\n");
  return 0;
}
