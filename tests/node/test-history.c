/*
 * test-history.c: each job's exact GPU memory peak, its history record and
 * the end-of-job line (docs/history.md), on the fake driver, in both
 * modes (make check: single-user, cogpu run records; make check-node: the
 * daemon records). The peak must equal the fake driver's own peak for
 * every allocation route.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/api.h"
#include "history/history.h"
#include "internal.h"
#include "ledger-helpers.h"

static void hist_env(void) {
  if (th_sanitizer_runtime()[0])
    setenv("LD_PRELOAD", th_sanitizer_runtime(), 1);
  th_setenv("COGPU_MARGIN", "0");
  setenv("COGPU_CONTEXT_BYTES", "300M", 1);
  setenv("FAKE_CUDA_CTX_BYTES", "300M", 1);
  setenv("COGPU_LOG", "warn", 1);
}

/* In node mode the jobs, and `cogpu history`, run as an ordinary user of
 * the node (the daemon, root, keeps the history): what that user sees of
 * their own jobs (issue 26). In single-user mode, as the test's user (the
 * history is that user's own). */
static pid_t spawn_job(const char *tag, const char *const argv[]) {
  static const char *as[64];
  return lt_spawn_logged(tag,
                         th_node_mode() ? lt_as_user(1, argv, as, 64) : argv);
}

static int run_logged(const char *tag, const char *const argv[]) {
  pid_t p = spawn_job(tag, argv);
  return th_exit_code(th_wait(p, th_ms(30000)));
}

/* `cogpu history --json` (with extra arguments), its output. */
static char *history_json(const char *a1, const char *a2) {
  const char *argv[] = {"cogpu", "history", "--json", a1, a2, NULL};
  int code = run_logged("hist", argv);
  char *out = lt_slurp("hist");
  if (code != 0)
    th_fail(__FILE__, __LINE__, "cogpu history failed (%d): %s", code, out);
  return out;
}

#define ASSERT_NOT_CONTAINS(hay, needle)                                       \
  do {                                                                         \
    const char *h_ = (hay), *n_ = (needle);                                    \
    if (h_ && strstr(h_, n_))                                                  \
      th_fail(__FILE__, __LINE__, "\"%s\" found in: %s", n_, h_);              \
  } while (0)

static unsigned long long field_u(const char *json, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(json, k);
  if (!p)
    th_fail(__FILE__, __LINE__, "no %s in %s", key, json);
  return strtoull(p + strlen(k), NULL, 10);
}

/* A job whose one process allocates by `op` (then frees it all): its
 * record's peak, its end-of-job line's, and the fake's per-GPU peak (the
 * job runs alone on a fresh fake) agree to the byte. */
static void peak_exact(const char *route, const char *op, const char *op2) {
  hist_env();
  const char *argv[] = {"cogpu",
                        "run",
                        "--mem",
                        "6G",
                        "--",
                        lt_cudaprog(),
                        route,
                        "init",
                        "ctx",
                        op,
                        op2 ? op2 : "hold:1",
                        "freeall",
                        NULL};
  ASSERT_EQ(run_logged("job", argv), 0);
  unsigned long long fpeak, ooms;
  lt_fake_cuda_stats(&fpeak, &ooms);
  ASSERT_EQ(ooms, 0);
  char *h = history_json(NULL, NULL);
  ASSERT_UEQ(field_u(h, "peak_bytes"), fpeak);
  ASSERT_UEQ(field_u(h, "declared_bytes"), 6ull << 30);
  ASSERT_CONTAINS(lt_slurp("job"), "used at most");
  ASSERT_CONTAINS(lt_slurp("job"), "(reserved 6.0 GiB");
}

TEST_IMPL(history_peak_direct) {
  peak_exact("direct", "alloc:1G", "alloc:300M");
}
TEST_IMPL(history_peak_pool) {
  peak_exact("direct", "async:1G", "async:64M");
}
TEST_IMPL(history_peak_vmm) {
  peak_exact("direct", "vmm:1G", NULL);
}
TEST_IMPL(history_peak_graph) {
  peak_exact("direct", "graph:1G", NULL);
}
TEST_IMPL(history_peak_runtime_route) {
  peak_exact("runtime", "alloc:2G", NULL);
}

/* A crash is recorded with its signal; the line still comes. (SIGABRT,
 * not SIGSEGV: the sanitizer builds' runtime, preloaded into the shell,
 * turns a SIGSEGV into exit 1.) */
TEST_IMPL(history_after_crash) {
  hist_env();
  const char *argv[] = {"cogpu",
                        "run",
                        "--",
                        "sh",
                        "-c",
                        "\"$0\" direct init ctx alloc:1G hold:1 & wait $!; "
                        "kill -ABRT $$",
                        lt_cudaprog(),
                        NULL};
  int code = run_logged("job", argv);
  ASSERT_NE(code, 0);
  char *h = history_json("--last", "1");
  ASSERT_UEQ(field_u(h, "peak_bytes"), 300ull * MiB + GiB);
  ASSERT_CONTAINS(h, "\"signal\":6");
}

/* kill -9 of cogpu run (its command dies with it): the daemon still knows
 * the job's last peak from the usage page and records it. Single-user mode
 * records from cogpu run itself, which this kills. */
TEST_IMPL(history_after_kill9) {
  if (!th_node_mode())
    SKIP("single-user mode records only from cogpu run");
  hist_env();
  const char *argv[] = {"cogpu", "run", "--",       lt_cudaprog(), "direct",
                        "init",  "ctx", "alloc:2G", "hold:20000",  NULL};
  pid_t p = spawn_job("job", argv);
  for (int i = 0; i < 250; i++) {
    cogpu_status_t *st = lt_status();
    uint64_t peak =
        st->gpus[0].nclients ? st->gpus[0].clients[0].peak_bytes : 0;
    cogpu_status_free(st);
    if (peak == 300ull * MiB + 2 * GiB)
      break;
    th_sleep_ms(20);
  }
  kill(p, SIGKILL);
  th_wait(p, th_ms(10000));
  char *h = NULL;
  for (int i = 0; i < 100; i++) {
    h = history_json(NULL, NULL);
    if (strstr(h, "peak_bytes"))
      break;
    th_sleep_ms(50);
  }
  ASSERT_UEQ(field_u(h, "peak_bytes"), 300ull * MiB + 2 * GiB);
  ASSERT_CONTAINS(h, "\"exit_status\":null");
}

/* The figures reach status while the job runs. */
TEST_IMPL(history_status_shows_used_and_peak) {
  hist_env();
  const char *argv[] = {"cogpu",  "run",        "--",        lt_cudaprog(),
                        "direct", "init",       "ctx",       "alloc:1G",
                        "free",   "alloc:512M", "hold:3000", NULL};
  pid_t p = spawn_job("job", argv);
  uint64_t used = 0, peak = 0, gused = 0;
  for (int i = 0; i < 250; i++) {
    cogpu_status_t *st = lt_status();
    if (st->gpus[0].nclients) {
      used = st->gpus[0].clients[0].used_bytes;
      peak = st->gpus[0].clients[0].peak_bytes;
      gused = st->gpus[0].used_bytes;
    }
    cogpu_status_free(st);
    if (used == 300ull * MiB + 512 * MiB)
      break;
    th_sleep_ms(20);
  }
  ASSERT_UEQ(used, 300ull * MiB + 512 * MiB);
  ASSERT_UEQ(gused, used);
  ASSERT_UEQ(peak, 300ull * MiB + GiB);
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(30000))), 0);
}

TEST_IMPL(history_job_report_off) {
  hist_env();
  setenv("COGPU_JOB_REPORT", "no", 1);
  const char *argv[] = {"cogpu", "run", "--",       lt_cudaprog(), "direct",
                        "init",  "ctx", "alloc:1G", "freeall",     NULL};
  ASSERT_EQ(run_logged("job", argv), 0);
  ASSERT_NOT_CONTAINS(lt_slurp("job"), "used at most");
}

TEST_IMPL(history_bad_input) {
  const char *a[] = {"cogpu", "history", "--since", "yesterday-ish", NULL};
  ASSERT_EQ(run_logged("a", a), 2);
  ASSERT_CONTAINS(lt_slurp("a"), "--since 'yesterday-ish'");
  const char *b[] = {"cogpu", "history", "--user", "no-such-user-xyz", NULL};
  ASSERT_EQ(run_logged("b", b), 2);
  ASSERT_CONTAINS(lt_slurp("b"), "no user named 'no-such-user-xyz'");
}

/* Retention by rows: three jobs, history_max_rows=2 keeps the newest two.
 * In node mode the daemon's configuration decides, so it is set before
 * the daemon starts (the runner's daemon reads the environment then). */
TEST_IMPL_SINGLE(history_retention_rows) {
  hist_env();
  setenv("COGPU_HISTORY_MAX_ROWS", "2", 1);
  for (int i = 0; i < 3; i++) {
    char op[32];
    snprintf(op, sizeof op, "alloc:%dM", 100 * (i + 1));
    const char *argv[] = {"cogpu", "run", "--", lt_cudaprog(), "direct",
                          "init",  "ctx", op,   "freeall",     NULL};
    ASSERT_EQ(run_logged("job", argv), 0);
  }
  char *h = history_json(NULL, NULL);
  ASSERT_NOT_CONTAINS(h, "alloc:100M");
  ASSERT_CONTAINS(h, "alloc:200M");
  ASSERT_CONTAINS(h, "alloc:300M");
}

/* A corrupt database: cogpu run runs the job as without history, and says
 * why; `cogpu history` is a clear error. */
TEST_IMPL_SINGLE(history_corrupt_database) {
  hist_env();
  char dir[4200], path[4300];
  snprintf(dir, sizeof dir, "%s/history", getenv("COGPU_TEST_TMPDIR"));
  mkdir(dir, 0700);
  snprintf(path, sizeof path, "%s/history.db", dir);
  th_write_file(path, "this is not an SQLite database, not at all......"
                      "................................................");
  const char *argv[] = {"cogpu", "run", "--",       lt_cudaprog(), "direct",
                        "init",  "ctx", "alloc:1G", "freeall",     NULL};
  ASSERT_EQ(run_logged("job", argv), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "job history is off");
  ASSERT_CONTAINS(lt_slurp("job"), "alloc 1073741824 ok");
  const char *h[] = {"cogpu", "history", NULL};
  ASSERT_EQ(run_logged("h", h), 125);
  ASSERT_CONTAINS(lt_slurp("h"), "not a database");
}

/* An unwritable directory: the same. */
TEST_IMPL_SINGLE(history_unwritable_dir) {
  hist_env();
  setenv("COGPU_HISTORY_DIR", "/proc/cogpu-history", 1);
  const char *argv[] = {"cogpu", "run", "--",       lt_cudaprog(), "direct",
                        "init",  "ctx", "alloc:1G", "freeall",     NULL};
  ASSERT_EQ(run_logged("job", argv), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "job history is off");
  ASSERT_CONTAINS(lt_slurp("job"), "used at most");
}

/* Learned reservations: the second run of a command with --mem auto
 * reserves what the first one peaked at, plus auto_margin, rounded up to
 * 64 MiB; `cogpu history --suggest` prints the same figure; a command
 * never run before runs on demand and says so; and a job that needs more
 * than it learned still grows (on demand, beyond the reservation). */
TEST_IMPL(history_mem_auto_learns) {
  hist_env();
  th_setenv("COGPU_AUTO_MARGIN", "10");
  const char *first[] = {"cogpu",  "run",     "--",  lt_cudaprog(),
                         "direct", "init",    "ctx", "alloc:1G",
                         "hold:1", "freeall", NULL};
  ASSERT_EQ(run_logged("first", first), 0);
  unsigned long long peak = field_u(history_json(NULL, NULL), "peak_bytes");
  ASSERT(peak > 1ull << 30);
  unsigned long long want = peak + peak / 10;
  want = (want + (64ull << 20) - 1) / (64ull << 20) * (64ull << 20);
  char bytes[64];
  snprintf(bytes, sizeof bytes, "\"suggested_bytes\":%llu}", want);
  const char *sug[] = {"cogpu", "history",     "--suggest", "--json",
                       "--",    lt_cudaprog(), "direct",    "init",
                       "ctx",   "alloc:1G",    "hold:1",    "freeall",
                       NULL};
  ASSERT_EQ(run_logged("sug", sug), 0);
  ASSERT_CONTAINS(lt_slurp("sug"), bytes);
  ASSERT_CONTAINS(lt_slurp("sug"), "\"runs\":1,");
  const char *second[] = {"cogpu",       "run",     "--mem", "auto", "--",
                          lt_cudaprog(), "direct",  "init",  "ctx",  "alloc:1G",
                          "hold:1",      "freeall", NULL};
  ASSERT_EQ(run_logged("second", second), 0);
  ASSERT_CONTAINS(lt_slurp("second"), "--mem auto: reserving ");
  char *h = history_json("--last", "1");
  ASSERT_UEQ(field_u(h, "declared_bytes"), want);
  /* Never run before: on demand. */
  const char *fresh[] = {"cogpu", "run",         "--mem",   "auto",
                         "--",    lt_cudaprog(), "direct",  "init",
                         "ctx",   "alloc:2G",    "freeall", NULL};
  ASSERT_EQ(run_logged("fresh", fresh), 0);
  ASSERT_CONTAINS(lt_slurp("fresh"), "no earlier run of this command");
  ASSERT_CONTAINS(lt_slurp("fresh"), "used at most 2.3 GiB");
}

/* mem=auto as a default (COGPU_MEM here; a site's config file alike):
 * cogpu run without --mem learns, as --mem auto does. Its first run has
 * nothing to learn from and runs on demand, saying where mem=auto came
 * from; the second reserves the first's peak plus auto_margin; an explicit
 * --mem SIZE overrides it. */
TEST_IMPL(history_mem_auto_default) {
  hist_env();
  th_setenv("COGPU_AUTO_MARGIN", "10");
  setenv("COGPU_MEM", "auto", 1);
  const char *argv[] = {"cogpu",  "run",     "--",  lt_cudaprog(),
                        "direct", "init",    "ctx", "alloc:1G",
                        "hold:1", "freeall", NULL};
  ASSERT_EQ(run_logged("first", argv), 0);
  ASSERT_CONTAINS(lt_slurp("first"),
                  "mem=auto (from env COGPU_MEM): no earlier run of this "
                  "command on this node: running on demand");
  unsigned long long peak = field_u(history_json(NULL, NULL), "peak_bytes");
  ASSERT_UEQ(peak, 300ull * MiB + GiB);
  unsigned long long want = peak + peak / 10;
  want = (want + (64ull << 20) - 1) / (64ull << 20) * (64ull << 20);
  ASSERT_EQ(run_logged("second", argv), 0);
  ASSERT_CONTAINS(lt_slurp("second"), "mem=auto (from env COGPU_MEM): "
                                      "reserving ");
  ASSERT_UEQ(field_u(history_json("--last", "1"), "declared_bytes"), want);
  const char *sized[] = {"cogpu",       "run",     "--mem", "2G",  "--",
                         lt_cudaprog(), "direct",  "init",  "ctx", "alloc:1G",
                         "hold:1",      "freeall", NULL};
  ASSERT_EQ(run_logged("sized", sized), 0);
  ASSERT_NOT_CONTAINS(lt_slurp("sized"), "mem=auto");
  ASSERT_UEQ(field_u(history_json("--last", "1"), "declared_bytes"), 2 * GiB);
  /* A site's config file alike. */
  unsetenv("COGPU_MEM");
  char conf[4300], from[4400];
  snprintf(conf, sizeof conf, "%s/cogpu.conf", getenv("COGPU_TEST_TMPDIR"));
  th_write_file(conf, "mem = auto\n");
  setenv("COGPU_CONFIG", conf, 1);
  ASSERT_EQ(run_logged("file", argv), 0);
  snprintf(from, sizeof from, "mem=auto (from %s:1): reserving ", conf);
  ASSERT_CONTAINS(lt_slurp("file"), from);
  setenv("COGPU_CONFIG", "", 1);
}

/* The first record's "timeline_bytes" into v (at most max values); returns
 * how many it has. */
static size_t timeline_of(const char *json, unsigned long long *v, size_t max) {
  const char *p = strstr(json, "\"timeline_bytes\":[");
  if (!p)
    th_fail(__FILE__, __LINE__, "no timeline in %s", json);
  p += strlen("\"timeline_bytes\":[");
  size_t n = 0;
  while (*p && *p != ']') {
    char *end;
    unsigned long long x = strtoull(p, &end, 10);
    if (end == p)
      th_fail(__FILE__, __LINE__, "bad timeline in %s", json);
    if (n < max)
      v[n] = x;
    n++;
    p = *end == ',' ? end + 1 : end;
  }
  return n;
}

/* The memory timeline follows the job's real profile, sampled about once a
 * second: a job that holds 1 GiB (and its context) for 1.5 s, then 2 GiB
 * more for 1.5 s. Its timeline (1 s apart) has a sample of each plateau,
 * grows without dropping until its highest point, which is the record's
 * exact peak, and starts below it; it has about one sample per second of
 * the job's recorded span. Single-user mode: cogpu run samples;
 * node mode: the daemon. */
TEST_IMPL(history_timeline_follows_profile) {
  hist_env();
  const char *argv[] = {"cogpu",     "run",      "--",        lt_cudaprog(),
                        "direct",    "init",     "ctx",       "alloc:1G",
                        "hold:1500", "alloc:2G", "hold:1500", "freeall",
                        NULL};
  ASSERT_EQ(run_logged("job", argv), 0);
  char *h = history_json("--last", "1");
  unsigned long long peak = field_u(h, "peak_bytes");
  ASSERT_UEQ(peak, 300ull * MiB + 3 * GiB);
  ASSERT_CONTAINS(h, "\"timeline_interval_seconds\":1.000,");
  unsigned long long v[COGPU_HIST_TL_MAX];
  size_t n = timeline_of(h, v, COGPU_HIST_TL_MAX);
  /* One sample a second of the job's real span (a loaded machine makes the
   * 3 s of holds longer; the count follows the span, not the plan), and
   * one more for each partial second at either end. */
  unsigned long long span_s =
      (field_u(h, "end_ms") - field_u(h, "start_ms") + 999) / 1000;
  if (n < 3 || n > span_s + 2)
    th_fail(__FILE__, __LINE__, "%zu samples in a job of %llu s: %s", n, span_s,
            h);
  size_t top = 0;
  bool low_plateau = false;
  for (size_t i = 0; i < n; i++) {
    if (v[i] > v[top])
      top = i;
    low_plateau |= v[i] == 300ull * MiB + GiB;
  }
  ASSERT_UEQ(v[top], peak);
  ASSERT(v[0] < peak);
  ASSERT(low_plateau);
  for (size_t i = 1; i <= top; i++)
    if (v[i] < v[i - 1])
      th_fail(__FILE__, __LINE__, "the timeline drops while it grows: %s", h);
}

/* After the last job ends, the daemon no longer wakes to sample: an idle
 * node sleeps in epoll_wait (no voluntary context switch of its loop's
 * thread in 2.5 s), as it did before timelines were sampled. */
TEST_IMPL(history_timeline_idle_daemon_sleeps) {
  if (!th_node_mode())
    SKIP("the daemon's sampling");
  hist_env();
  const char *argv[] = {"cogpu",     "run",     "--",  lt_cudaprog(),
                        "direct",    "init",    "ctx", "alloc:1G",
                        "hold:1200", "freeall", NULL};
  ASSERT_EQ(run_logged("job", argv), 0);
  char *h = history_json("--last", "1");
  unsigned long long v[COGPU_HIST_TL_MAX];
  ASSERT(timeline_of(h, v, COGPU_HIST_TL_MAX) >= 1);
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)th_daemon_pid());
  unsigned long long sw[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    if (k)
      th_sleep_ms(2500);
    FILE *f = fopen(path, "r");
    ASSERT(f);
    while (fgets(line, sizeof line, f))
      sscanf(line, "voluntary_ctxt_switches: %llu", &sw[k]);
    fclose(f);
  }
  ASSERT_UEQ(sw[1] - sw[0], 0);
}

/* The timeline's bound, on the history component itself: a job of any
 * length, sampled at any rate, keeps at most COGPU_HIST_TL_MAX samples
 * (every other one dropped, keeping the higher, and the interval doubled
 * each time it fills); samples closer than the interval keep their
 * highest; a second the sampler skipped holds the sample before it; and
 * the database stores and returns the timeline as it was. */
TEST_IMPL_SINGLE(history_timeline_bounded) {
  cogpu__hist_tl_t *t = calloc(1, sizeof *t);
  ASSERT(t);
  /* Fast: every 10 ms for 3 s, growing: one sample per second, each the
   * highest of its second. */
  for (uint64_t ms = 0; ms < 3000; ms += 10)
    cogpu__hist_tl_add(t, ms, ms * 1000);
  ASSERT_EQ(t->n, 3);
  ASSERT_UEQ(t->ms, 1000);
  ASSERT_UEQ(t->v[0], 990 * 1000);
  ASSERT_UEQ(t->v[2], 2990 * 1000);
  /* A skipped second: 3 s and 4 s were not sampled. */
  cogpu__hist_tl_add(t, 5500, 7);
  ASSERT_EQ(t->n, 6);
  ASSERT_UEQ(t->v[3], 2990 * 1000);
  ASSERT_UEQ(t->v[4], 2990 * 1000);
  ASSERT_UEQ(t->v[5], 7);
  /* Long: once a second for a day, one spike at 1 h; growing slowly. */
  memset(t, 0, sizeof *t);
  uint64_t day = 24 * 3600 * 1000ull;
  for (uint64_t ms = 500; ms < day; ms += 1000) {
    cogpu__hist_tl_add(t, ms, ms == 3600500 ? 1ull << 40 : ms / 1000);
    ASSERT(t->n <= COGPU_HIST_TL_MAX);
  }
  ASSERT(t->n > COGPU_HIST_TL_MAX / 2);
  /* 86,400 s in at most 128 slots: 1024 s each (1000 ms doubled 10 times). */
  ASSERT_UEQ(t->ms, 1024000);
  uint64_t top = 0;
  for (uint32_t k = 0; k < t->n; k++)
    top = t->v[k] > top ? t->v[k] : top;
  ASSERT_UEQ(top, 1ull << 40); /* the spike survived every halving */
  ASSERT_UEQ(t->v[3600500 / t->ms], 1ull << 40);
  /* Stored and read back as it was, interval included. */
  char path[4300];
  snprintf(path, sizeof path, "%s/tl/history.db", getenv("COGPU_TEST_TMPDIR"));
  cogpu__hist_t *db = NULL;
  ASSERT_OK(cogpu__hist_open(path, true, &db));
  cogpu__hist_rec_t *r = calloc(1, sizeof *r);
  ASSERT(r);
  r->gpu = 0;
  r->end_ms = 1;
  cogpu__hist_tl_store(r, t);
  ASSERT_OK(cogpu__hist_add(db, r, -1, 0));
  cogpu__hist_rec_t *out = NULL;
  size_t n = 0;
  cogpu__hist_filter_t f = {.has_uid = false};
  ASSERT_OK(cogpu__hist_query(db, &f, &out, &n));
  ASSERT_EQ(n, 1);
  ASSERT_EQ(out[0].tl_n, t->n);
  ASSERT_UEQ(out[0].tl_ms, t->ms);
  ASSERT_EQ(memcmp(out[0].tl, t->v, t->n * sizeof t->v[0]), 0);
  free(out);
  free(r);
  free(t);
  cogpu__hist_close(db);
}

/* A history query never holds up the node: the daemon hands it to its
 * history thread, behind the records queued before it. With the database
 * locked for writing by another program (BEGIN EXCLUSIVE), the thread is
 * stuck in SQLite's bounded busy wait on a job's record; a `cogpu history`
 * then waits in that thread, while other clients' requests are answered
 * at once (before, the loop waited up to 1 s for the writer); one user
 * cannot queue more than a few history queries; and history works again
 * once the lock is gone. */
#include <sqlite3.h>

TEST_IMPL(history_query_does_not_block_the_daemon) {
  if (!th_node_mode())
    SKIP("the daemon's history thread");
  hist_env();
  const char *job[] = {"cogpu",  "run",     "--",  lt_cudaprog(),
                       "direct", "init",    "ctx", "alloc:64M",
                       "hold:1", "freeall", NULL};
  ASSERT_EQ(run_logged("job", job), 0);
  history_json("--last", "1"); /* the database exists, with a record */
  char db[600];
  snprintf(db, sizeof db, "%s/history.db", getenv("COGPU_HISTORY_DIR"));
  /* The locker holds the database until the test lets it go (closes
   * rel[1], or ends): a fixed 6 s ran out before the queries below came,
   * under load. */
  int pfd[2], rel[2];
  ASSERT_EQ(pipe(pfd), 0);
  ASSERT_EQ(pipe(rel), 0);
  pid_t locker = fork();
  if (locker == 0) {
    close(pfd[0]);
    close(rel[1]);
    sqlite3 *s = NULL;
    if (sqlite3_open(db, &s) != SQLITE_OK ||
        sqlite3_exec(s, "BEGIN EXCLUSIVE", NULL, NULL, NULL) != SQLITE_OK)
      _exit(2);
    if (write(pfd[1], "L", 1) != 1)
      _exit(3);
    char c;
    while (read(rel[0], &c, 1) < 0 && errno == EINTR)
      ;
    sqlite3_exec(s, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(s);
    _exit(0);
  }
  close(pfd[1]);
  close(rel[0]);
  char ch;
  ASSERT_EQ(read(pfd[0], &ch, 1), 1);
  close(pfd[0]);
  /* Their records keep the history thread in SQLite's busy wait, each for
   * its bounded 2 s: three, so that the queries below find it there
   * however slowly a loaded machine spawns them (one record's 2 s ran
   * out first, under load, and no query was refused). */
  pid_t jobs[3];
  char jtag[3][16];
  for (int i = 0; i < 3; i++) {
    snprintf(jtag[i], sizeof jtag[i], "job2-%d", i);
    jobs[i] = lt_spawn_logged(jtag[i], job);
  }
  for (int i = 0; i < 3; i++)
    ASSERT_EQ(th_exit_code(th_wait(jobs[i], th_ms(30000))), 0);
  /* Seven queries of one user while the thread is busy: up to the
   * per-user bound (queued, being run, or answered and not yet sent) they
   * wait in the daemon's hands; beyond it they are refused at once, with
   * the reason. Which ones: the order they connect in, not the order they
   * were started in. */
  const char *hist[] = {"cogpu", "history", NULL};
  enum { NQ = 7 };
  pid_t q[NQ];
  char tag[NQ][16];
  for (int i = 0; i < NQ; i++) {
    snprintf(tag[i], sizeof tag[i], "hist%d", i);
    q[i] = lt_spawn_logged(tag[i], hist);
  }
  /* Meanwhile other clients are served without delay. */
  for (int i = 0; i < 5; i++) {
    uint64_t t0 = cogpu__now_ns();
    const char *st[] = {"cogpu", "status", NULL};
    ASSERT_EQ(run_logged("status", st), 0);
    uint64_t ms = (cogpu__now_ns() - t0) / 1000000;
    if (ms > (uint64_t)th_ms(500))
      th_fail(__FILE__, __LINE__,
              "cogpu status took %llu ms while a history query waited for "
              "the history thread",
              (unsigned long long)ms);
  }
  close(rel[1]); /* the lock goes */
  /* Each query was answered (once the thread was free: readers are not
   * blocked in WAL mode) or refused with the reason; at least one of
   * each. */
  int busy = 0, answered = 0;
  for (int i = 0; i < NQ; i++) {
    int rc = th_exit_code(th_wait(q[i], th_ms(30000)));
    bool refused = strstr(lt_slurp(tag[i]), "too many history requests");
    if (rc != 0 && !refused)
      th_fail(__FILE__, __LINE__, "cogpu history (%s) exited %d: %s", tag[i],
              rc, lt_slurp(tag[i]));
    busy += refused;
    answered += rc == 0;
  }
  ASSERT_GE(busy, 1);
  ASSERT_GE(answered, 1);
  th_wait(locker, th_ms(30000));
  /* Once the lock is gone, a new job is recorded again. */
  ASSERT_EQ(run_logged("job3", job), 0);
  char *h = history_json("--last", "1");
  ASSERT_CONTAINS(h, "\"peak_bytes\":");
}

/* The context's real cost (the fake driver's 200M, not context_bytes'
 * 512M estimate) is what the job is counted: 800M of data and a context
 * fit a 1G limit, the record's peak is the GPU's to the byte, and the
 * estimate never shows. Without context_measure the estimate counts, and
 * the same job is refused by its limit. */
TEST_IMPL(history_context_cost_measured) {
  hist_env();
  unsetenv("COGPU_CONTEXT_BYTES"); /* the default estimate, 512M */
  setenv("FAKE_CUDA_CTX_BYTES", "200M", 1);
  setenv("COGPU_LIMIT", "1G", 1);
  const char *argv[] = {"cogpu",       "run",     "--mem", "1G",  "--",
                        lt_cudaprog(), "direct",  "init",  "ctx", "alloc:800M",
                        "hold:1",      "freeall", NULL};
  ASSERT_EQ(run_logged("job", argv), 0);
  unsigned long long fpeak, ooms;
  lt_fake_cuda_stats(&fpeak, &ooms);
  ASSERT_EQ(ooms, 0);
  ASSERT_UEQ(fpeak, 1000ull << 20);
  char *h = history_json(NULL, NULL);
  ASSERT_UEQ(field_u(h, "peak_bytes"), fpeak);
  setenv("COGPU_CONTEXT_MEASURE", "no", 1);
  ASSERT_NE(run_logged("job2", argv), 0);
  ASSERT_CONTAINS(lt_slurp("job2"), "alloc: error 2"); /* out of memory */
}

/* A process's handle with `bytes` used (and peak) on GPU 0, as the preload
 * library would publish them. */
static cogpu_t *member_using(const char *token, const char *cmd,
                             uint64_t bytes) {
  cogpu_attach_opts_t o = {.join = token, .command = cmd, .job_id = "steps"};
  cogpu_t *h = NULL;
  if (cogpu_attach(&o, &h) != 0)
    th_fail(__FILE__, __LINE__, "join %s: %s", token, cogpu_last_error());
  cogpu__usage_t *u = cogpu__usage_page(h);
  if (!u)
    th_fail(__FILE__, __LINE__, "no usage page: %s", cogpu_last_error());
  atomic_store(&u->peak[0], bytes);
  atomic_store(&u->used[0], bytes);
  return h;
}

static uint64_t job_used_now(void) {
  cogpu_status_t *st = lt_status();
  uint64_t u = st->gpus[0].nclients ? st->gpus[0].clients[0].used_bytes : 0;
  cogpu_status_free(st);
  return u;
}

/* Issue 22 (a Slurm step's report is its own). A process that joins a job
 * through a step's token (cogpu__step_token) is the job's (its token is
 * the job's, the job's report counts it) and the step's: the step's
 * report counts its processes only, live or ended, and the job's own
 * (its processes that joined the job itself) does not count them. */
TEST_IMPL(history_step_report_is_the_steps) {
  hist_env();
  cogpu_attach_opts_t o = {.job_id = "steps", .command = "job"};
  cogpu_t *job = NULL, *step = NULL;
  ASSERT_EQ(cogpu_attach(&o, &job), 0);
  cogpu_request_t q = {.gpu = 0,
                       .bytes = 4 * GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  ASSERT_EQ(cogpu_reserve(job, &q, NULL), 0);
  char jt[64], st[64], t[64];
  ASSERT_EQ(cogpu_job_token(job, jt, sizeof jt), 0);
  ASSERT_EQ(cogpu__step_token(job, t, sizeof t), 0);
  ASSERT_STREQ(t, jt); /* the job's own step: its token is the job's */
  o.join = jt;
  o.command = "step";
  ASSERT_EQ(cogpu_attach(&o, &step), 0);
  ASSERT_EQ(cogpu__step_token(step, st, sizeof st), 0);
  ASSERT_NE(strcmp(st, jt), 0);
  cogpu_t *direct = member_using(jt, "direct", 2 * GiB);
  cogpu_t *task = member_using(st, "task", 1 * GiB);
  ASSERT_EQ(cogpu_job_token(task, t, sizeof t), 0);
  ASSERT_STREQ(t, jt); /* the task is the job's */
  cogpu__job_report_t r;
  ASSERT_EQ(cogpu__step_end(step, -1, &r), 0);
  ASSERT_UEQ(r.peak, 1 * GiB);
  ASSERT_UEQ(r.reserved, 4 * GiB); /* the job's reservation */
  ASSERT_EQ(cogpu__step_end(job, -1, &r), 0);
  ASSERT_UEQ(r.peak, 2 * GiB); /* the job's own step: not the task */
  ASSERT_EQ(cogpu__job_end(job, -1, &r), 0);
  ASSERT_UEQ(r.peak, 3 * GiB); /* direct and task at once, counted now */
  /* The task ends: its peak stays with its step, not the job's own. */
  ASSERT_EQ(cogpu_detach(task), 0);
  for (int i = 0; job_used_now() != 2 * GiB; i++) {
    if (i > th_ms(10000) / 20)
      th_fail(__FILE__, __LINE__, "the task never left: %llu used",
              (unsigned long long)job_used_now());
    th_sleep_ms(20);
  }
  ASSERT_EQ(cogpu__step_end(step, -1, &r), 0);
  ASSERT_UEQ(r.peak, 1 * GiB);
  ASSERT_EQ(cogpu__step_end(job, -1, &r), 0);
  ASSERT_UEQ(r.peak, 2 * GiB);
  ASSERT_EQ(cogpu_detach(direct), 0);
  ASSERT_EQ(cogpu_detach(step), 0);
  ASSERT_EQ(cogpu_detach(job), 0);
}

/* The node daemon, started again with fault `spec` in its environment
 * (its clients' stays clean). */
static void daemon_with_fault(const char *spec) {
  setenv("COGPU_NODE_MODE", "daemon", 1);
  th_daemon_stop(SIGTERM);
  setenv("COGPU_FAULT", spec, 1);
  th_daemon_start();
  unsetenv("COGPU_FAULT");
}

/* cogpud cannot allocate its history writer's batch: it says history is
 * off, at start, and serves jobs (before, every record was dropped and
 * nothing said so). */
TEST_IMPL(history_writer_out_of_memory_says_so) {
  hist_env();
  daemon_with_fault("history_batch:1:fail");
  /* Said as it starts (it may answer its socket a moment before). */
  const char *want = "job history is off: out of memory for the writer";
  for (int t = 0; !strstr(lt_slurp("cogpud.log"), want); t += 10) {
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "cogpud never said '%s': %s", want,
              lt_slurp("cogpud.log"));
    th_sleep_ms(10);
  }
  const char *job[] = {"cogpu", "run", "--mem", "1G", "--", "true", NULL};
  ASSERT_EQ(run_logged("job", job), 0);
}

/* A history answer written short: that `cogpu history` fails with the
 * write's own error (EIO), not one an earlier call left in errno; the
 * daemon lives, and the next query is answered whole. */
TEST_IMPL(history_short_answer_fails_cleanly) {
  hist_env();
  daemon_with_fault("history_write:1:fail");
  const char *job[] = {"cogpu", "run", "--mem", "1G", "--", "true", NULL};
  ASSERT_EQ(run_logged("job", job), 0);
  const char *q[] = {"cogpu", "history", "--json", NULL};
  ASSERT_NE(run_logged("q1", q), 0);
  ASSERT_CONTAINS(lt_slurp("q1"),
                  "cannot pass the history: Input/output error");
  /* The job's record is written before the next query is answered. */
  ASSERT_CONTAINS(history_json(NULL, NULL), "\"exit_status\":0");
}

/* cogpud cannot open its history file (out of descriptors, EMFILE) when
 * it starts: it says history is off and why, serves jobs, and writes the
 * next job's record when the file opens again (and says so). */
TEST_IMPL(history_writer_emfile_recovers) {
  hist_env();
  daemon_with_fault("history_open:1:fail");
  const char *want = "cannot open it: Too many open files";
  for (int t = 0; !strstr(lt_slurp("cogpud.log"), want); t += 10) {
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "cogpud never said '%s': %s", want,
              lt_slurp("cogpud.log"));
    th_sleep_ms(10);
  }
  const char *job[] = {"cogpu", "run", "--mem", "1G", "--", "true", NULL};
  ASSERT_EQ(run_logged("job", job), 0);
  /* The job's record is written before the query is answered. */
  ASSERT_CONTAINS(history_json(NULL, NULL), "\"exit_status\":0");
}
