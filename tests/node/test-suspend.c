/*
 * test-suspend.c: suspension through the driver's checkpoint API, driven
 * through the public interfaces (cogpu run, cogpu suspend/resume, cogpu
 * status, the preload library) against the fake driver, whose checkpoint
 * API moves a process's device memory off the GPU and wedges a process for
 * good if it is restored without room (tests/fakes/cuda). Each test runs
 * against a node daemon (the runner's in node mode, one it starts
 * otherwise): suspension needs the daemon.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "cuda/cuda-abi.h"
#include "internal.h"
#include "ledger-helpers.h"

/* Every test here runs against a node daemon it starts itself when the
 * runner gives none: once per build. */
TEST_FILE_ONCE()

/* The node for these tests: a 16 GiB fake GPU, no margin, a fast tick,
 * and host-memory bounds that the fake's footprints (which cost the host
 * nothing) never reach. */
static void su_begin(void) {
  if (th_sanitizer_runtime()[0])
    setenv("LD_PRELOAD", th_sanitizer_runtime(), 1);
  setenv("COGPU_NODE_MODE", "daemon", 1);
  setenv("COGPU_CONTEXT_BYTES", "300M", 1);
  setenv("FAKE_CUDA_CTX_BYTES", "300M", 1);
  setenv("COGPU_LOG", "warn", 1);
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_SWEEP_INTERVAL", "100ms");
  th_setenv("COGPU_SUSPEND_HOST_MARGIN", "0");
  if (!getenv("COGPU_SUSPEND_MAX")) /* a test of the bound sets its own */
    th_setenv("COGPU_SUSPEND_MAX", "1T");
  if (th_daemon_pid() <= 0)
    th_daemon_start();
}

/* The file a job started with SU_HELD waits for (cudaprog's waitfile). */
static const char *su_go(const char *tag) {
  char name[64];
  snprintf(name, sizeof name, "%s.go", tag);
  return th_path(name);
}

/* Lets the job end (if it was started SU_HELD) and waits for it. */
static int su_finish(pid_t pid, const char *tag, int ms) {
  th_write_file(su_go(tag), "");
  int code = th_exit_code(th_wait(pid, th_ms(ms)));
  if (code != 0)
    fprintf(stderr, "[%s exit %d]\n%s\n", tag, code, lt_slurp(tag));
  return code;
}

/* The client of GPU 0 whose pid is pid, in a fresh status (NULL if not
 * listed); *st to free. */
static const cogpu_client_info_t *su_client(cogpu_status_t **st, int pid) {
  *st = lt_status();
  for (size_t i = 0; i < (*st)->gpus[0].nclients; i++)
    if ((*st)->gpus[0].clients[i].pid == pid)
      return &(*st)->gpus[0].clients[i];
  return NULL;
}

/* Waits (bounded) until the job of `pid` is in `state`. */
static void su_wait_state(int pid, int state, int ms) {
  for (int t = 0;; t += 20) {
    cogpu_status_t *st;
    const cogpu_client_info_t *c = su_client(&st, pid);
    bool ok = c && c->state == state;
    cogpu_status_free(st);
    if (ok)
      return;
    if (t > th_ms(ms))
      th_fail(__FILE__, __LINE__, "job of pid %d not in state %d", pid, state);
    th_sleep_ms(20);
  }
}

/* Runs `cogpu ARGS...`; returns its exit code, stdout and stderr in out. */
static int su_cogpu(char *out, size_t len, const char *const argv[]) {
  char err[4096];
  int rc = th_run(argv, NULL, out, len / 2, err, sizeof err, th_ms(30000));
  size_t n = strlen(out);
  snprintf(out + n, len - n, "%s", err);
  return rc;
}

/* Waits (bounded) until th_path(tag) (a job's output) holds `needle`. */
static void su_wait_text(const char *tag, const char *needle, int ms) {
  for (int t = 0;; t += 20) {
    const char *log = lt_slurp(tag);
    if (strstr(log, needle))
      return;
    if (t > th_ms(ms))
      th_fail(__FILE__, __LINE__, "no \"%s\" in %s:\n%s", needle, tag, log);
    th_sleep_ms(20);
  }
}

/* Waits (bounded) until the daemon's log holds `needle`: the loop logs a
 * resume when it takes the suspender's report, after the driver let the
 * job go on, so a loaded machine can finish the job first. */
static void su_wait_log(const char *needle, int ms) {
  su_wait_text("cogpud.log", needle, ms);
}

/* The pid of the (first) client of GPU 0 holding at least `bytes`, waited
 * for (bounded). */
static int su_holder(uint64_t bytes) {
  for (int t = 0;; t += 20) {
    int pid = 0;
    cogpu_status_t *st = lt_status();
    for (size_t i = 0; i < st->gpus[0].nclients && !pid; i++)
      if (st->gpus[0].clients[i].reserved_bytes >= bytes)
        pid = st->gpus[0].clients[i].pid;
    cogpu_status_free(st);
    if (pid)
      return pid;
    if (t > th_ms(15000))
      th_fail(__FILE__, __LINE__, "no job came to hold %llu bytes",
              (unsigned long long)bytes);
    th_sleep_ms(20);
  }
}

/* lt_go_when_held on GPU 0, the file th_path(go). */
static void su_release_when_held(size_t n, uint64_t bytes, const char *go) {
  lt_go_when_held(0, n, bytes, th_path(go));
}

/* Times the job of pid has been suspended, waited for (bounded) to reach
 * at least n while it runs again. */
static void su_wait_suspensions(int pid, unsigned n, int ms) {
  for (int t = 0;; t += 20) {
    cogpu_status_t *st;
    const cogpu_client_info_t *c = su_client(&st, pid);
    bool ok = c && c->suspensions >= n;
    cogpu_status_free(st);
    if (ok)
      return;
    if (t > th_ms(ms))
      th_fail(__FILE__, __LINE__, "job of pid %d never suspended %u times", pid,
              n);
    th_sleep_ms(20);
  }
}

/* A job's hold that lasts until su_finish lets it end: for tests that
 * suspend, resume or inspect the job meanwhile (a fixed hold ran out
 * before the command in loaded sanitizer passes: "no process attached"). */
#define SU_HELD "held"

static pid_t su_job(const char *tag, const char *prio, const char *take,
                    const char *hold) {
  char w[4200];
  if (strcmp(hold, SU_HELD) == 0) {
    snprintf(w, sizeof w, "waitfile:%s", su_go(tag));
    hold = w;
  }
  const char *argv[] = {"cogpu",       "run",    "--priority", prio,  "--",
                        lt_cudaprog(), "direct", "init",       "ctx", take,
                        hold,          "verify", "freeall",    NULL};
  const char *as[24];
  return lt_spawn_logged(tag, lt_as_user(1, argv, as, 24));
}

/* `cogpu VERB PID` (suspend or resume) as user n (0: root, the admin);
 * its exit code, output in out. */
static int su_cmd_as(int n, const char *verb, int pid, char *out, size_t len) {
  char pidtxt[16];
  snprintf(pidtxt, sizeof pidtxt, "%d", pid);
  const char *argv[] = {"cogpu", verb, pidtxt, NULL};
  const char *as[12];
  return su_cogpu(out, len, n ? lt_as_user(n, argv, as, 12) : argv);
}

static int su_cmd(const char *verb, int pid, char *out, size_t len) {
  return su_cmd_as(0, verb, pid, out, len);
}

/* Starts a growing job: `cogpu run [--mem mem] -- cudaprog` taking its
 * context, then `steps` steps of 512 MiB `hold_ms` apart, then checking
 * its data; output in th_path(tag). */
static pid_t su_growing_prio(const char *tag, const char *mem, int steps,
                             const char *hold, const char *prio) {
  const char *argv[64];
  int k = 0;
  argv[k++] = "cogpu";
  argv[k++] = "run";
  if (prio) {
    argv[k++] = "--priority";
    argv[k++] = prio;
  }
  if (mem) {
    argv[k++] = "--mem";
    argv[k++] = mem;
  }
  argv[k++] = "--";
  argv[k++] = lt_cudaprog();
  argv[k++] = "direct";
  argv[k++] = "init";
  argv[k++] = "ctx";
  for (int s = 0; s < steps && k < 58; s++) {
    argv[k++] = "alloc:512M";
    argv[k++] = hold;
  }
  argv[k++] = "verify";
  argv[k++] = "freeall";
  argv[k] = NULL;
  /* As a user of the node, not root: the daemon (root) suspends another
   * user's processes, as on a real node (issue 26). */
  const char *as[72];
  return lt_spawn_logged(tag, lt_as_user(1, argv, as, 72));
}

static pid_t su_growing(const char *tag, const char *mem, int steps,
                        const char *hold) {
  return su_growing_prio(tag, mem, steps, hold, NULL);
}

/* Eight unmodified programs, each growing to 4.8 GiB (its 300 MiB context,
 * then 9 steps of 512 MiB) of a 16 GiB GPU, started together: without
 * suspension some die (hold-and-wait; the deadlock guard fails one). With
 * it all complete, none is told out-of-memory, the device never holds
 * more than its size, and each suspended job finds its data intact. */
enum { GROW_N = 8 };

/* What every mix on the fake 16 GiB GPU must end with: nobody told
 * out-of-memory by the driver, the device never over its size, no process
 * left wedged, the node state consistent. */
static void su_clean_end(void) {
  unsigned long long peak = 0, ooms = 0;
  lt_fake_cuda_stats(&peak, &ooms);
  ASSERT_EQ(ooms, 0);
  ASSERT_ULE(peak, 16 * GiB);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* How many times `needle` occurs in `hay`. */
static int su_count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* The eight, started together (or, one_by_one, each after the last has
 * ended), checked: all complete, their data intact, none told
 * out-of-memory, the device never over its size. Returns the suspensions
 * (each prints a line), the most of one job in *most, and the makespan in
 * *ms. */
static int run_growing(const char *mem, bool one_by_one, int *most,
                       uint64_t *ms) {
  lt_fake_reset_peak();
  pid_t p[GROW_N];
  char tag[GROW_N][16];
  int suspensions = 0, failed = 0;
  *most = 0;
  uint64_t t0 = cogpu__now_ns();
  for (int i = 0; i < GROW_N; i++) {
    snprintf(tag[i], sizeof tag[i], "job%d%s", i, one_by_one ? "s" : "");
    p[i] = su_growing(tag[i], mem, 9, "hold:50");
    if (one_by_one)
      failed += su_finish(p[i], tag[i], 120000) != 0;
  }
  for (int i = 0; i < GROW_N && !one_by_one; i++)
    failed += su_finish(p[i], tag[i], 120000) != 0;
  *ms = (cogpu__now_ns() - t0) / 1000000u;
  for (int i = 0; i < GROW_N; i++) {
    const char *out = lt_slurp(tag[i]);
    int n = su_count(out, "suspended: this job");
    if (n)
      ASSERT_CONTAINS(out, "resumed after");
    ASSERT_CONTAINS(out, "verify ok");
    suspensions += n;
    *most = n > *most ? n : *most;
  }
  ASSERT_EQ(failed, 0);
  su_clean_end();
  ASSERT_UEQ(lt_fake_cuda_used(), 0);
  return suspensions;
}

/* Unknown peaks (a node that never ran them), and it converges (issue
 * 25): before resume admission and the victim order, a resumed job was
 * parked again for its next chunk (17 suspensions for 8 jobs); before
 * growth in order after a deadlock, the memory a parked job gave up went
 * a chunk to each waiter and the deadlocks parked 4 to 7 (9 once in CI),
 * then 2 in every run; since growth goes in order while jobs ahead grow,
 * the jobs on demand form no deadlock (0 in a plain run). The bound is
 * the target, one suspension per job on average; a loaded
 * machine may let a held job's wait run out (bounded) and park one. */
static int growing_jobs(const char *mem) {
  su_begin();
  int most;
  uint64_t ms;
  int n = run_growing(mem, false, &most, &ms);
  fprintf(stderr, "# %d suspensions (most %d of one job), %llu ms\n", n, most,
          (unsigned long long)ms);
  ASSERT_LE(n, GROW_N);
  return n;
}

TEST_IMPL_T(susp_growing_jobs_on_demand, 180) {
  growing_jobs(NULL);
}

/* The same programs declaring too little: growth past --mem waits (the
 * default now), and suspension keeps that from deadlocking. Eight
 * declarations of 2 GiB fill the GPU before any job grows: the first
 * growth is a deadlock, broken by parking. */
TEST_IMPL_T(susp_growing_jobs_underdeclared, 180) {
  ASSERT_GT(growing_jobs("2G"), 0);
}

/* Host memory that cannot park what the deadlocks would need (issue 25):
 * with suspend_max at 3 GiB, the eight could park one job of theirs at
 * most. Before, the next deadlock found nobody it could park and failed a
 * request (the old out-of-memory by another name). Now memory goes to the
 * GPU's leader while the others' memory would pass what the host can
 * park: all complete, none is told out-of-memory, and the host never held
 * more than 3 GiB of them. */
TEST_IMPL_T(susp_growing_jobs_host_tight, 180) {
  th_setenv("COGPU_SUSPEND_MAX", "3G");
  su_begin();
  int most;
  uint64_t ms;
  int n = run_growing(NULL, false, &most, &ms);
  fprintf(stderr, "# %d suspensions, %llu ms\n", n, (unsigned long long)ms);
  ASSERT_LE(n, GROW_N);
  const char *log = lt_slurp("cogpud.log");
  ASSERT(!strstr(log, "failing the request"));
}

/* `cogpu run -- cudaprog direct init ctx STEPS... freeall` as user 1,
 * output in th_path(tag); STEPS ends with NULL. */
static pid_t su_steps(const char *tag, const char *const *steps) {
  const char *argv[32];
  int k = 0;
  argv[k++] = "cogpu";
  argv[k++] = "run";
  argv[k++] = "--";
  argv[k++] = lt_cudaprog();
  argv[k++] = "direct";
  argv[k++] = "init";
  argv[k++] = "ctx";
  for (; *steps && k < 30; steps++)
    argv[k++] = *steps;
  argv[k++] = "freeall";
  argv[k] = NULL;
  const char *as[40];
  return lt_spawn_logged(tag, lt_as_user(1, argv, as, 40));
}

/* Growth in order before any deadlock (issue 25: the first run of jobs
 * the node has never seen). Two jobs of unknown peak hold 4.3 GiB each
 * of the 16 GiB GPU, then grow together, 1 GiB at a time, to 10.3 GiB
 * each. Side by side they deadlocked near 8 GiB each and one was parked
 * (its copy out and back over a slow link made such a first run slower
 * than one at a time). Now the younger waits while the older grows; the
 * older ends and the younger grows: no suspension, nobody told
 * out-of-memory, the device never over its size. */
TEST_IMPL_T(susp_growth_in_order_before_deadlock, 90) {
  su_begin();
  lt_fake_reset_peak();
  char go[4200];
  snprintf(go, sizeof go, "waitfile:%s", th_path("grow"));
  const char *steps[20];
  int k = 0;
  steps[k++] = "alloc:4G";
  steps[k++] = go;
  for (int i = 0; i < 6; i++) {
    steps[k++] = "alloc:1G";
    steps[k++] = "hold:50";
  }
  steps[k++] = "verify";
  steps[k] = NULL;
  pid_t older = su_steps("older", steps);
  su_holder(4300 * MiB);
  pid_t younger = su_steps("younger", steps);
  su_release_when_held(2, 4300 * MiB, "grow");
  ASSERT_EQ(su_finish(older, "older", 60000), 0);
  ASSERT_EQ(su_finish(younger, "younger", 60000), 0);
  for (int i = 0; i < 2; i++) {
    const char *out = lt_slurp(i ? "younger" : "older");
    ASSERT_CONTAINS(out, "verify ok");
    ASSERT(!strstr(out, "suspended: this job"));
  }
  ASSERT(!strstr(lt_slurp("cogpud.log"), "suspended the job of pid"));
  su_clean_end();
}

/* ...and bounded: a job that has stopped growing (a service, a training
 * loop past its first steps) keeps nobody waiting. "older" grew to
 * 8.3 GiB and holds it; "younger" grows to 6.3 GiB, which fits beside
 * what older holds but not beside as much again: it is served once
 * older has not asked for more for a second, and ends while older still
 * holds its memory (held until older ended, it would wait as long as
 * the service lives). */
TEST_IMPL_T(susp_growth_order_not_behind_settled_job, 60) {
  su_begin();
  const char *os[] = {"alloc:4G", "alloc:4G", "waitfile:older.go", "verify",
                      NULL};
  char ogo[4200];
  snprintf(ogo, sizeof ogo, "waitfile:%s", su_go("older"));
  os[2] = ogo;
  const char *ys[] = {"alloc:2G", "alloc:4G", "verify", NULL};
  pid_t older = su_steps("older", os);
  int older_pid = su_holder(8492 * MiB);
  pid_t younger = su_steps("younger", ys);
  ASSERT_EQ(su_finish(younger, "younger", 30000), 0);
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, older_pid);
  ASSERT(c && c->state == COGPU_JOB_RUNNING);
  ASSERT_UEQ(c->reserved_bytes, 8492 * MiB);
  cogpu_status_free(st);
  ASSERT_EQ(su_finish(older, "older", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("younger"), "verify ok");
  ASSERT_CONTAINS(lt_slurp("older"), "verify ok");
  su_clean_end();
}

/* ...and a job at its plateau that frees and allocates again (no caching
 * allocator) asks for memory over and over but does not grow: it holds
 * nobody. "older" grew to 9.3 GiB, then cycles 1 GiB below that; once it
 * has cycled 250 times (its last growth at least 1.25 s back, past the
 * second in which a job counts as growing), "younger" grows to 6.3 GiB,
 * which fits beside older at its most but not beside as much again: it
 * is served at once, never waiting, while older cycles. Counted as
 * growing at each cycle, older held each of younger's requests. */
TEST_IMPL_T(susp_growth_order_not_behind_plateau, 60) {
  su_begin();
  char cyc[4200], ogo[4200];
  snprintf(cyc, sizeof cyc, "cycle:1G:%s", th_path("stop"));
  snprintf(ogo, sizeof ogo, "waitfile:%s", su_go("older"));
  const char *os[] = {"alloc:4G", "alloc:4G", "alloc:1G", "free",
                      cyc,        ogo,        "verify",   NULL};
  const char *ys[] = {"alloc:2G", "alloc:4G", "verify", NULL};
  pid_t older = su_steps("older", os);
  su_holder(9516 * MiB); /* its most: 8.3 GiB and the 1 GiB it cycles */
  su_wait_text("older", "cycled 250", 30000);
  pid_t younger = su_steps("younger", ys);
  ASSERT_EQ(su_finish(younger, "younger", 30000), 0);
  th_write_file(th_path("stop"), "");
  ASSERT_EQ(su_finish(older, "older", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("younger"), "verify ok");
  ASSERT(!strstr(lt_slurp("younger"), "waiting for"));
  ASSERT_CONTAINS(lt_slurp("older"), "verify ok");
  su_clean_end();
}

/* Growth in order after a deadlock (issue 25), and its bound. Three jobs
 * of unknown peak hold 2.1, 6.3 and 6.3 GiB of the 16 GiB GPU and each
 * asks 2 GiB more: a deadlock. The leader (the oldest, "lead") holds the
 * least, and is not parked (it was: the fewest bytes): the deadlock is
 * broken for it, and "park" (the fewer bytes of the two others) goes.
 * The leader's 2 GiB is granted; "next"'s 2 GiB fits too, but waits
 * behind what the leader may still grow by (as much again as it holds).
 * The leader then stops growing and holds, like a service: "next" is
 * served once the order window after the parking closes, and ends while
 * the leader still runs (held until the leader ended, it would wait as
 * long as the service lives). The parked job resumes and ends; nobody is
 * told out-of-memory. */
TEST_IMPL_T(susp_order_after_deadlock_is_bounded, 90) {
  su_begin();
  lt_fake_reset_peak();
  char go[4200], lgo[4200];
  snprintf(go, sizeof go, "waitfile:%s", th_path("grow"));
  snprintf(lgo, sizeof lgo, "waitfile:%s", su_go("lead"));
  const char *ls[] = {"alloc:1900M", go, "alloc:2G", lgo, "verify", NULL};
  const char *ps[] = {"alloc:6144M", go, "alloc:2G", "verify", NULL};
  const char *ns[] = {"alloc:6200M", go, "alloc:2G", "verify", NULL};
  pid_t lead = su_steps("lead", ls);
  int lead_pid = su_holder(2200 * MiB);
  pid_t park = su_steps("park", ps);
  su_holder(6444 * MiB);
  pid_t next = su_steps("next", ns);
  /* All three hold their first memory, then all grow at once. */
  su_release_when_held(3, 2200 * MiB, "grow");
  /* "next" ends while the leader still holds its memory, not growing. */
  ASSERT_EQ(su_finish(next, "next", 60000), 0);
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, lead_pid);
  ASSERT(c && c->state == COGPU_JOB_RUNNING && c->suspensions == 0);
  ASSERT_UEQ(c->reserved_bytes, 4248 * MiB);
  cogpu_status_free(st);
  ASSERT_EQ(su_finish(park, "park", 60000), 0);
  ASSERT_EQ(su_finish(lead, "lead", 60000), 0);
  ASSERT_CONTAINS(lt_slurp("park"), "suspended: this job");
  ASSERT(!strstr(lt_slurp("lead"), "suspended: this job"));
  ASSERT(!strstr(lt_slurp("next"), "suspended: this job"));
  for (int i = 0; i < 3; i++)
    ASSERT_CONTAINS(lt_slurp(i == 0   ? "lead"
                             : i == 1 ? "park"
                                      : "next"),
                    "verify ok");
  su_clean_end();
}

/* The three jobs of a deadlock on GPU 0 (as in
 * susp_order_after_deadlock_is_bounded): "lead" holds 2.1 GiB, "park" 6.3
 * and "next" 6.4, each waiting for the file `grow_lead` (the leader) or
 * `grow` (the others) before it asks 2 GiB more; "lead" and "next" then
 * hold until su_finish lets them end. Their processes, and the pids
 * status lists "park" and "next" under. */
typedef struct su_trio_s {
  pid_t lead, park, next;
  int park_pid, next_pid;
} su_trio_t;

static su_trio_t su_trio(const char *grow_lead, const char *grow) {
  char go1[4200], go2[4200], lgo[4200], ngo[4200];
  snprintf(go1, sizeof go1, "waitfile:%s", th_path(grow_lead));
  snprintf(go2, sizeof go2, "waitfile:%s", th_path(grow));
  snprintf(lgo, sizeof lgo, "waitfile:%s", su_go("lead"));
  snprintf(ngo, sizeof ngo, "waitfile:%s", su_go("next"));
  const char *ls[] = {"alloc:1900M", go1, "alloc:2G", lgo, "verify", NULL};
  const char *ps[] = {"alloc:6144M", go2, "alloc:2G", "verify", NULL};
  const char *ns[] = {"alloc:6200M", go2, "alloc:2G", ngo, "verify", NULL};
  su_trio_t t;
  t.lead = su_steps("lead", ls);
  su_holder(2200 * MiB);
  t.park = su_steps("park", ps);
  t.park_pid = su_holder(6444 * MiB);
  t.next = su_steps("next", ns);
  t.next_pid = su_holder(6500 * MiB);
  return t;
}

/* The order window follows the link (issue 25: the checkpoint bandwidth,
 * as measured, weighs suspension against waiting). The same three jobs
 * over a 1.5 GB/s link: parking "park" (6.3 GiB) takes about 4.5 s, and
 * another parking would cost that again twice (out and back), so "next"
 * waits in order for twice the parking's copy after it, not the 5 s a
 * fast link gets. The copy's time is the daemon's own (its log line);
 * when the parking ended, from the snapshot's suspended_seconds with the
 * clock read before the status was asked (never later than it was); when
 * "next" was served, as first seen (never earlier). So a loaded machine
 * can only make the wait seen longer than it was. */
TEST_IMPL_T(susp_order_window_follows_copy_time, 120) {
  th_setenv("FAKE_CUDA_CKPT_GBPS", "1.5");
  su_begin();
  /* The leader asks first (its request queued ahead of the others'), so
   * that its growth is granted before "next" is looked at: the order is
   * then what holds "next", whichever the machine runs first. */
  su_trio_t j = su_trio("grow1", "grow2");
  pid_t lead = j.lead, park = j.park, next = j.next;
  int park_pid = j.park_pid, next_pid = j.next_pid;
  su_release_when_held(3, 2200 * MiB, "grow1");
  lt_wait_nwaiting(0, 1, 30000);
  th_write_file(th_path("grow2"), "");
  uint64_t parked = 0, served = 0;
  for (int t = 0; !served; t += 10) {
    uint64_t before = cogpu__now_ns();
    cogpu_status_t *st = lt_status();
    uint64_t now = cogpu__now_ns();
    for (size_t i = 0; i < st->gpus[0].nclients; i++) {
      const cogpu_client_info_t *c = &st->gpus[0].clients[i];
      uint64_t away = (uint64_t)(c->suspended_seconds * 1e9);
      if (c->pid == park_pid && c->state == COGPU_JOB_SUSPENDED && !parked &&
          away <= before)
        parked = before - away;
      if (c->pid == next_pid && c->reserved_bytes >= 6500 * MiB + 2 * GiB)
        served = now;
    }
    cogpu_status_free(st);
    if (t > th_ms(60000))
      th_fail(__FILE__, __LINE__, "next never served");
    th_sleep_ms(10);
  }
  const char *log = lt_slurp("cogpud.log"),
             *line = strstr(log, "suspended the job of pid");
  const char *in = line ? strstr(line, " in ") : NULL;
  double copy = in ? strtod(in + 4, NULL) : 0;
  if (!parked || !copy)
    th_fail(__FILE__, __LINE__,
            "park never seen parked (%llu) or no copy time "
            "in the log: %s",
            (unsigned long long)parked, log);
  double held = served > parked ? (double)(served - parked) / 1e9 : 0;
  fprintf(stderr, "# parking took %.2f s, next held %.2f s after it\n", copy,
          held);
  ASSERT(copy > 2.5); /* 6.3 GiB at 1.5 GB/s: the link is slow */
  ASSERT(held >= 2 * copy - 0.05);
  ASSERT_EQ(su_finish(next, "next", 60000), 0);
  ASSERT_EQ(su_finish(park, "park", 60000), 0);
  ASSERT_EQ(su_finish(lead, "lead", 60000), 0);
  ASSERT_CONTAINS(lt_slurp("park"), "verify ok");
  su_clean_end();
}

/* The host rule holds back growth, never a first allocation: most jobs
 * never grow and take no part in a deadlock. With suspend_max at 1 GiB, a
 * job declaring --mem 8G takes it at once beside one holding 4 GiB
 * (counting every job's memory, the rule had held it back), and runs
 * within it. */
TEST_IMPL_T(susp_host_tight_first_memory_not_held, 60) {
  th_setenv("COGPU_SUSPEND_MAX", "1G");
  su_begin();
  pid_t a = su_job("a", "0", "alloc:4G", SU_HELD);
  su_holder(4 * GiB);
  char w[4200];
  snprintf(w, sizeof w, "waitfile:%s", su_go("b"));
  const char *argv[] = {
      "cogpu", "run", "--mem",    "8G", "--",     lt_cudaprog(), "direct",
      "init",  "ctx", "alloc:7G", w,    "verify", "freeall",     NULL};
  const char *as[24];
  pid_t b = lt_spawn_logged("b", lt_as_user(1, argv, as, 24));
  su_holder(8 * GiB);
  ASSERT_EQ(su_finish(b, "b", 30000), 0);
  ASSERT_EQ(su_finish(a, "a", 30000), 0);
  ASSERT(!strstr(lt_slurp("b"), "waiting for"));
  ASSERT_CONTAINS(lt_slurp("b"), "verify ok");
}

/* Sixteen of them on two 16 GiB GPUs (2.4 times their memory), half at a
 * higher priority, placed on demand where most is free (issue 25's wider
 * shapes): all complete with their data, none is told out-of-memory, and
 * suspension still converges: at most one per job on average. */
TEST_IMPL_T(susp_growing_jobs_two_gpus_priorities, 240) {
  th_setenv("FAKE_NVML_GPUS", "16G,16G");
  su_begin();
  enum { N = 16 };
  pid_t p[N];
  char tag[N][16];
  for (int i = 0; i < N; i++) {
    snprintf(tag[i], sizeof tag[i], "job%d", i);
    p[i] = su_growing_prio(tag[i], NULL, 9, "hold:50", i % 2 ? "5" : "0");
  }
  int failed = 0, suspensions = 0;
  for (int i = 0; i < N; i++)
    failed += su_finish(p[i], tag[i], 200000) != 0;
  for (int i = 0; i < N; i++) {
    const char *out = lt_slurp(tag[i]);
    ASSERT_CONTAINS(out, "verify ok");
    suspensions += su_count(out, "suspended: this job");
  }
  fprintf(stderr, "# %d suspensions for %d jobs\n", suspensions, N);
  ASSERT_EQ(failed, 0);
  /* Issue 25's target is one per job on average: 7 to 9 for the 16 on
   * a loaded 2-core VM under ASan (11 to 14 before growth in order after
   * a deadlock); the thrash this guards against took 2 to 4 per suspended
   * job. */
  ASSERT_LE(suspensions, N);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* Many small jobs (issue 25's wider shapes): 32 programs growing to
 * 1.8 GiB each (a context and three steps of 512 MiB) on one 16 GiB GPU,
 * 3.6 times its memory, started together: all complete with their data,
 * none is told out-of-memory, the device never holds more than its size,
 * and suspension converges (at most one per job on average).
 *
 * With 32 contexts the GPU runs within a context of full, and jobs waiting
 * in order are served the moment one ends: the driver never refuses what
 * the ledger granted. It did, once in about forty loaded ASan runs, for
 * two reasons now gone: the daemon freed an ended process's memory when
 * its connection closed, before the process had gone (it keeps it booked
 * until then: test-exit.c), and the fake driver refused on a figure read
 * before another process reaped dead processes' memory. The jobs log at
 * info, so that a refusal shows the preload library's retry. */
TEST_IMPL_T(susp_growing_32_small_jobs, 300) {
  su_begin();
  setenv("COGPU_LOG", "info", 1); /* the jobs' (the daemon runs already) */
  enum { N = 32 };
  lt_fake_reset_peak();
  pid_t p[N];
  char tag[N][16];
  for (int i = 0; i < N; i++) {
    snprintf(tag[i], sizeof tag[i], "small%d", i);
    p[i] = su_growing(tag[i], NULL, 3, "hold:100");
  }
  int failed = 0, suspensions = 0, retried = 0;
  for (int i = 0; i < N; i++)
    failed += su_finish(p[i], tag[i], 250000) != 0;
  for (int i = 0; i < N; i++) {
    const char *out = lt_slurp(tag[i]);
    ASSERT_CONTAINS(out, "verify ok");
    ASSERT(!strstr(out, "alloc: error"));
    ASSERT(!strstr(out, "the driver is out of memory that cogpu counts"));
    suspensions += su_count(out, "suspended: this job");
    retried += su_count(out, "the driver refused memory cogpu granted");
  }
  fprintf(stderr, "# %d suspensions for %d jobs, %d retried\n", suspensions, N,
          retried);
  ASSERT_EQ(failed, 0);
  unsigned long long peak = 0, ooms = 0;
  lt_fake_cuda_stats(&peak, &ooms);
  ASSERT_EQ(ooms, 0);
  ASSERT_EQ(retried, 0);
  ASSERT_ULE(peak, 16 * GiB);
  /* One per job on average (issue 25): 13 to 15 for the 32 on a loaded
   * 2-core VM under ASan. */
  ASSERT_LE(suspensions, N);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
  ASSERT_UEQ(lt_fake_cuda_used(), 0);
}

/* The eight growing jobs while programs outside cogpu come and go (1.5 GiB
 * for 0.4 s, again and again, as root: another user's work the node does
 * not manage): suspension and resumes go on around the outside's memory.
 * Every job completes with its data, none fails of the driver's refusal
 * (a refusal of memory the ledger granted waits for the outside), nothing
 * is left wedged, and the node ends empty and consistent. */
TEST_IMPL_T(susp_growing_jobs_foreign_memory, 240) {
  th_setenv("COGPU_FOREIGN_REFRESH", "200ms");
  su_begin();
  lt_fake_reset_peak();
  char churn[4096 + 256];
  snprintf(churn, sizeof churn,
           "while [ ! -e %s ]; do %s direct init ctx alloc:1200M hold:400 "
           "freeall >/dev/null 2>&1 && echo >>%s; sleep 0.2; done",
           th_path("stop"), lt_cudaprog(), th_path("rounds"));
  /* No sanitizer runtime in the shell (TSan's crashed it): the outside
   * programs need none either. */
  const char *ch[] = {"env", "LD_PRELOAD=", "sh", "-c", churn, NULL};
  pid_t c = lt_spawn_logged("churn", ch);
  pid_t p[GROW_N];
  char tag[GROW_N][16];
  for (int i = 0; i < GROW_N; i++) {
    snprintf(tag[i], sizeof tag[i], "job%d", i);
    p[i] = su_growing(tag[i], NULL, 9, "hold:50");
  }
  int failed = 0, suspensions = 0;
  for (int i = 0; i < GROW_N; i++)
    failed += su_finish(p[i], tag[i], 200000) != 0;
  /* The outside held its memory at least once while the jobs ran. */
  struct stat rs;
  ASSERT(stat(th_path("rounds"), &rs) == 0 && rs.st_size > 0);
  th_write_file(th_path("stop"), "");
  ASSERT_EQ(th_exit_code(th_wait(c, th_ms(30000))), 0);
  for (int i = 0; i < GROW_N; i++) {
    const char *out = lt_slurp(tag[i]);
    ASSERT_CONTAINS(out, "verify ok");
    ASSERT(!strstr(out, "alloc: error"));
    suspensions += su_count(out, "suspended: this job");
  }
  fprintf(stderr, "# %d suspensions for %d jobs\n", suspensions, GROW_N);
  ASSERT_EQ(failed, 0);
  unsigned long long peak = 0, ooms = 0;
  lt_fake_cuda_stats(&peak, &ooms);
  ASSERT_ULE(peak, 16 * GiB);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  cogpu_status_free(st);
}

/* `cogpu run [--gpu gpu] -- cudaprog direct init ctx alloc:first
 * waitfile:TMP/go alloc:then freeall` as user 1, output in th_path(tag). */
static pid_t su_two_step(const char *tag, const char *gpu, const char *first,
                         const char *go, const char *then) {
  char a1[32], a2[32], w[4200];
  snprintf(a1, sizeof a1, "alloc:%s", first);
  snprintf(a2, sizeof a2, "alloc:%s", then);
  snprintf(w, sizeof w, "waitfile:%s", th_path(go));
  const char *argv[16];
  int k = 0;
  argv[k++] = "cogpu";
  argv[k++] = "run";
  if (gpu) {
    argv[k++] = "--gpu";
    argv[k++] = gpu;
  }
  argv[k++] = "--";
  argv[k++] = lt_cudaprog();
  argv[k++] = "direct";
  argv[k++] = "init";
  argv[k++] = "ctx";
  argv[k++] = a1;
  argv[k++] = w;
  argv[k++] = a2;
  argv[k++] = "freeall";
  argv[k] = NULL;
  const char *as[24];
  return lt_spawn_logged(tag, lt_as_user(1, argv, as, 24));
}

/* GPU g's reserved bytes, once they reach at least `want` (bounded). */
static uint64_t su_reserved_at_least(int g, uint64_t want) {
  for (int t = 0;; t += 10) {
    cogpu_status_t *st = lt_status();
    uint64_t r = st->gpus[g].reserved_bytes;
    cogpu_status_free(st);
    if (r >= want)
      return r;
    if (t > th_ms(30000))
      th_fail(__FILE__, __LINE__, "GPU %d never reserved %llu (has %llu)", g,
              (unsigned long long)want, (unsigned long long)r);
    th_sleep_ms(10);
  }
}

/* Issue 24, item 4: an on-demand job goes where it fits once the jobs
 * already there have grown to the peaks the node learnt of them. GPU 0
 * runs a job holding 0.8 GiB whose command the node has seen grow to
 * 10.8 GiB; GPU 1 one holding 4.3 GiB of unknown peak. GPU 0 has the most
 * free now (15.2 against 11.7 GiB), but 5.2 once its job grows: a new
 * job without --gpu goes to GPU 1 (before: GPU 0, where the two then
 * wait on each other). */
TEST_IMPL_T(susp_placement_counts_learnt_growth, 90) {
  th_setenv("FAKE_NVML_GPUS", "16G,16G");
  su_begin();
  /* The node learns the big one's peak: a run to its end, alone. */
  th_write_file(th_path("go0"), "");
  ASSERT_EQ(su_finish(su_two_step("learn", "0", "512M", "go0", "10G"), "learn",
                      60000),
            0);
  /* The same command again (the same line: the learnt key), waiting. */
  pid_t big = su_two_step("big", "0", "512M", "gobig", "10G");
  su_reserved_at_least(0, 812 * MiB);
  pid_t other = su_two_step("other", "1", "4G", "goother", "1M");
  su_reserved_at_least(1, 4 * GiB + 300 * MiB);
  pid_t fresh = su_two_step("fresh", NULL, "1G", "gofresh", "1M");
  uint64_t r1 = su_reserved_at_least(1, 5 * GiB + 600 * MiB);
  cogpu_status_t *st = lt_status();
  uint64_t r0 = st->gpus[0].reserved_bytes;
  cogpu_status_free(st);
  ASSERT_UEQ(r0, 812 * MiB); /* the new job took nothing on GPU 0 */
  ASSERT_UEQ(r1, 5 * GiB + 600 * MiB);
  th_write_file(th_path("gofresh"), "");
  th_write_file(th_path("goother"), "");
  th_write_file(th_path("gobig"), "");
  ASSERT_EQ(su_finish(fresh, "fresh", 60000), 0);
  ASSERT_EQ(su_finish(other, "other", 60000), 0);
  ASSERT_EQ(su_finish(big, "big", 60000), 0);
  lt_check_invariants();
}

/* Peaks the node has learnt (issue 25): after the eight have run one at a
 * time, the daemon knows what their command needs, and the eight started
 * together are admitted three at a time (what fits at 4.8 GiB each): no
 * deadlock forms and nobody is suspended. */
static void growing_learnt(const char *mem) {
  su_begin();
  int most;
  uint64_t alone_ms, together_ms;
  ASSERT_EQ(run_growing(mem, true, &most, &alone_ms), 0);
  ASSERT_EQ(run_growing(mem, false, &most, &together_ms), 0);
  /* Said, not asserted: on a loaded machine (or under TSan) the jobs are
   * CPU-bound, and eight at once are no faster than one after another.
   * bench/suspend-mix.sh measures the makespans (docs/benchmarks.md). */
  fprintf(stderr, "# one at a time %llu ms, together %llu ms\n",
          (unsigned long long)alone_ms, (unsigned long long)together_ms);
}

TEST_IMPL_T(susp_growing_jobs_learnt, 240) {
  growing_learnt(NULL);
}

TEST_IMPL_T(susp_growing_jobs_learnt_underdeclared, 240) {
  growing_learnt("2G");
}

/* `cogpu suspend PID` parks a job: its memory leaves the device (another
 * job can use it), status shows it suspended with its footprint; `cogpu
 * resume` brings it back, data intact, and it finishes normally. */
TEST_IMPL_T(susp_manual_suspend_resume, 60) {
  su_begin();
  /* The job's slot is cogpu run's; it is named by its program's pid. */
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  char out[4096];
  /* By the job's own user, as its owner would. */
  ASSERT_EQ(su_cmd_as(1, "suspend", cpid, out, sizeof out), 0);
  ASSERT_CONTAINS(out, "moved to host memory");
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, cpid);
  ASSERT(c != NULL);
  ASSERT_EQ(c->state, COGPU_JOB_SUSPENDED);
  ASSERT_UEQ(c->reserved_bytes, 0);
  ASSERT(c->suspended_bytes >= 4 * GiB);
  ASSERT_UEQ(st->gpus[0].suspended_bytes, c->suspended_bytes);
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  /* The node's figures: what is suspended, its bound, the host's memory. */
  ASSERT_STREQ(st->suspension, "yes");
  ASSERT_UEQ(st->suspended_bytes, c->suspended_bytes);
  ASSERT(st->suspend_max_bytes > 0 && st->host_available_bytes > 0);
  /* Its copy out, counted: the footprint, in some time. */
  uint64_t footprint = c->suspended_bytes;
  ASSERT_UEQ(st->counters.checkpoint_bytes, footprint);
  ASSERT(st->counters.checkpoint_seconds >= 0);
  cogpu_status_free(st);
  const char *stat[] = {"cogpu", "status", NULL};
  ASSERT_EQ(su_cogpu(out, sizeof out, stat), 0);
  ASSERT_CONTAINS(out, "suspension yes  suspended ");
  ASSERT_CONTAINS(out, "[suspended: ");
  const char *json[] = {"cogpu", "status", "--json", NULL};
  ASSERT_EQ(su_cogpu(out, sizeof out, json), 0);
  char want[64];
  snprintf(want, sizeof want, "\"checkpoint_bytes\":%llu",
           (unsigned long long)footprint);
  ASSERT_CONTAINS(out, want);
  ASSERT_CONTAINS(out, "\"checkpoint_seconds\":");
  ASSERT_UEQ(lt_fake_cuda_used(), 0); /* the device is empty */
  /* Another job may use that memory meanwhile. */
  pid_t other = lt_hold("other", 0, 12 * GiB, 0, 0, 300);
  ASSERT_EQ(th_exit_code(th_wait(other, th_ms(10000))), HOLD_OK);
  /* The job stays parked (suspended by hand) until resumed. */
  th_sleep_ms(300);
  c = su_client(&st, cpid);
  ASSERT(c && c->state == COGPU_JOB_SUSPENDED);
  cogpu_status_free(st);
  ASSERT_EQ(su_cmd_as(1, "resume", cpid, out, sizeof out), 0);
  ASSERT_CONTAINS(out, "resumed");
  c = su_client(&st, cpid);
  ASSERT(c && c->state == COGPU_JOB_RUNNING && c->reserved_bytes >= 4 * GiB);
  /* And back. */
  ASSERT_UEQ(st->counters.checkpoint_bytes, 2 * footprint);
  cogpu_status_free(st);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* Issue 23, items 7 and 8. `cogpu reset --force` while a job is parked:
 * the state is the only record that its processes are checkpointed, so
 * the reset is refused (it used to make a new state and leave the job
 * wedged in the driver); the job is resumed and finishes, and a reset
 * then goes through. */
TEST_IMPL_T(susp_reset_refused_while_parked, 60) {
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  char out[4096];
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  const char *reset[] = {"cogpu", "reset", "--force", NULL};
  ASSERT_NE(su_cogpu(out, sizeof out, reset), 0);
  ASSERT_CONTAINS(out, "suspended or being moved");
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, cpid);
  ASSERT(c && c->state == COGPU_JOB_SUSPENDED);
  cogpu_status_free(st);
  ASSERT_EQ(su_cmd("resume", cpid, out, sizeof out), 0);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_EQ(lt_fake_wedged(), 0);
  ASSERT_EQ(su_cogpu(out, sizeof out, reset), 0);
  lt_check_invariants();
}

/* Reserve before restore: a resume waits in the queue until the GPU has
 * room for the whole footprint; the driver's restore is never tried
 * without it (the fake would wedge the process for good). */
TEST_IMPL_T(susp_resume_waits_for_room, 60) {
  su_begin();
  pid_t job = su_job("job", "0", "alloc:6G", SU_HELD);
  int cpid = su_holder(6 * GiB);
  char pidtxt[16], out[4096];
  snprintf(pidtxt, sizeof pidtxt, "%d", cpid);
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  /* 12 GiB taken meanwhile, held until the test lets it go: 6.3 GiB no
   * longer fit (a fixed 2 s hold ended before the resume below was asked
   * on a loaded machine, and the resume was served). */
  pid_t big = lt_hold("big", 0, 12 * GiB, 0, 0, -1);
  lt_wait_nclients(0, 2, th_ms(5000));
  const char *res[] = {"cogpu", "resume", pidtxt, "--timeout", "500ms", NULL};
  ASSERT_EQ(su_cogpu(out, sizeof out, res), 125);
  ASSERT_CONTAINS(out, "not done");
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, cpid);
  ASSERT(c && c->state == COGPU_JOB_SUSPENDED);
  cogpu_status_free(st);
  ASSERT_EQ(lt_fake_wedged(), 0);
  /* When the other job leaves, the resume (still queued) is served. */
  kill(big, SIGKILL);
  ASSERT_EQ(th_exit_code(th_wait(big, th_ms(10000))), 128 + SIGKILL);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* --- Migration (option migrate) --------------------------------------------
 * Two fake GPUs of one model. A job of 6 GiB on GPU 0 is parked by hand,
 * and 12 GiB are taken on GPU 0 meanwhile: when it is to resume, its own
 * GPU has no room and GPU 1 has. */

/* The client `pid` of GPU g in a fresh status (NULL if not listed); *st to
 * free. */
static const cogpu_client_info_t *su_client_on(cogpu_status_t **st, int g,
                                               int pid) {
  *st = lt_status();
  if ((size_t)g >= (*st)->ngpus)
    return NULL;
  for (size_t i = 0; i < (*st)->gpus[g].nclients; i++)
    if ((*st)->gpus[g].clients[i].pid == pid)
      return &(*st)->gpus[g].clients[i];
  return NULL;
}

/* Waits (bounded) until the client `pid` holds at least `bytes` on GPU g,
 * running. */
static void su_wait_held_on(int g, int pid, uint64_t bytes) {
  for (int t = 0;; t += 20) {
    cogpu_status_t *st;
    const cogpu_client_info_t *c = su_client_on(&st, g, pid);
    bool ok = c && c->state == COGPU_JOB_RUNNING && c->reserved_bytes >= bytes;
    cogpu_status_free(st);
    if (ok)
      return;
    if (t > th_ms(20000)) {
      cogpu_status_t *now = lt_status();
      char seen[512] = "";
      for (size_t k = 0; k < now->ngpus; k++)
        for (size_t i = 0; i < now->gpus[k].nclients; i++)
          snprintf(seen + strlen(seen), sizeof seen - strlen(seen),
                   " [GPU %zu: pid %d %llu, state %d]", k,
                   now->gpus[k].clients[i].pid,
                   (unsigned long long)now->gpus[k].clients[i].reserved_bytes,
                   (int)now->gpus[k].clients[i].state);
      cogpu_status_free(now);
      th_fail(__FILE__, __LINE__, "job of pid %d never held %llu on GPU %d:%s",
              pid, (unsigned long long)bytes, g, seen);
    }
    th_sleep_ms(20);
  }
}

/* The job: 6 GiB, then (after "TAG.go1") 1 GiB more, then (after
 * "TAG.go") its data checked and freed. As user 1, on its device 0. */
static pid_t su_mig_job(const char *tag) {
  char w1[4200], w2[4200], name[64];
  snprintf(name, sizeof name, "%s.go1", tag);
  snprintf(w1, sizeof w1, "waitfile:%s", th_path(name));
  snprintf(w2, sizeof w2, "waitfile:%s", su_go(tag));
  const char *argv[] = {"cogpu",   "run",      "--",  lt_cudaprog(),
                        "direct",  "init",     "ctx", "alloc:6G",
                        w1,        "alloc:1G", w2,    "verify",
                        "freeall", NULL};
  const char *as[24];
  return lt_spawn_logged(tag, lt_as_user(1, argv, as, 24));
}

/* Parks the job of tag by hand, then has 12 GiB taken on GPU 0 (held
 * until killed); returns the job's pid in status, the holder in *big. */
static int su_mig_park(const char *tag, pid_t *big) {
  (void)tag;
  int cpid = su_holder(6 * GiB);
  char out[4096];
  ASSERT_EQ(su_cmd_as(1, "suspend", cpid, out, sizeof out), 0);
  *big = lt_hold("big", 0, 12 * GiB, 0, 0, -1);
  su_holder(12 * GiB);
  return cpid;
}

/* The job, resumed, runs on GPU 1: the ledger books it there, the driver
 * holds its memory there, though its process names its device GPU 0 as
 * when it started; what it asks for next is booked and charged on GPU 1;
 * its data is intact; and its memory leaves GPU 1 when it ends. */
TEST_IMPL_T(susp_migrate_resumes_on_another_gpu, 60) {
  th_setenv("FAKE_NVML_GPUS", "16G,16G");
  th_setenv("COGPU_MIGRATE", "yes");
  su_begin();
  pid_t job = su_mig_job("job");
  pid_t big;
  int cpid = su_mig_park("job", &big);
  ASSERT_UEQ(lt_fake_gpu_used(1), 0);
  char out[4096];
  ASSERT_EQ(su_cmd_as(1, "resume", cpid, out, sizeof out), 0);
  ASSERT_CONTAINS(out, "resumed");
  su_wait_held_on(1, cpid, 6 * GiB);
  cogpu_status_t *st;
  ASSERT(su_client_on(&st, 0, cpid) == NULL); /* nothing left on GPU 0 */
  cogpu_status_free(st);
  ASSERT(lt_fake_gpu_used(1) >= 6 * GiB);
  ASSERT_CONTAINS(lt_slurp("cogpud.log"), "(moved from GPU 0)");
  /* Its next gigabyte: on GPU 1, in the books and in the driver. */
  th_write_file(th_path("job.go1"), "");
  su_wait_held_on(1, cpid, 7 * GiB);
  ASSERT(lt_fake_gpu_used(1) >= 7 * GiB);
  ASSERT_UEQ(lt_fake_gpu_used(0), 0); /* big books, and takes nothing */
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_UEQ(lt_fake_gpu_used(1), 0);
  kill(big, SIGKILL);
  ASSERT_EQ(th_exit_code(th_wait(big, th_ms(10000))), 128 + SIGKILL);
  su_clean_end();
}

/* Migration after a deadlock, untouched by hand: three jobs of unknown
 * peak deadlock on GPU 0 (as in susp_order_after_deadlock_is_bounded);
 * "park" (6.3 GiB) is parked for the leader. GPU 1 holds 10 GiB ("big")
 * and 3 GiB ("small") meanwhile: nothing can take "park" back (GPU 0
 * holds the other two, which hold what they grew to). When "big" leaves,
 * GPU 1 has room for "park" and the 2 GiB it waited for, and a quarter
 * more, but not beside as much again as "small" holds, which may still
 * grow: it stays parked (moved there at once, it would have made the
 * next deadlock). When "small" leaves too, "park"'s own resume entry is
 * served on GPU 1; it finishes there with its data while the other two
 * still hold GPU 0. */
TEST_IMPL_T(susp_migrate_after_deadlock, 90) {
  th_setenv("FAKE_NVML_GPUS", "16G,16G");
  th_setenv("COGPU_MIGRATE", "yes");
  su_begin();
  pid_t big = lt_hold("big", 1, 10 * GiB, 0, 0, -1);
  pid_t small = lt_hold("small", 1, 3 * GiB, 0, 0, -1);
  lt_wait_nclients(1, 2, 10000);
  su_trio_t j = su_trio("grow", "grow");
  pid_t lead = j.lead, park = j.park, next = j.next;
  int park_pid = j.park_pid, next_pid = j.next_pid;
  su_release_when_held(3, 2200 * MiB, "grow");
  /* "park" parked, the other two grown and holding on GPU 0. */
  su_wait_state(park_pid, COGPU_JOB_SUSPENDED, 30000);
  su_wait_held_on(0, next_pid, 6500 * MiB + 2 * GiB);
  ASSERT_UEQ(lt_fake_gpu_used(1), 0);
  kill(big, SIGKILL);
  ASSERT_EQ(th_exit_code(th_wait(big, th_ms(10000))), 128 + SIGKILL);
  /* Its release and the service pass after it are one step of the
   * daemon: once GPU 1 shows "small" alone, the resume was looked at. */
  lt_wait_nclients(1, 1, 10000);
  su_wait_state(park_pid, COGPU_JOB_SUSPENDED, 1000);
  kill(small, SIGKILL);
  ASSERT_EQ(th_exit_code(th_wait(small, th_ms(10000))), 128 + SIGKILL);
  ASSERT_EQ(su_finish(park, "park", 60000), 0);
  ASSERT_CONTAINS(lt_slurp("park"), "verify ok");
  su_wait_log("(moved from GPU 0)", 10000);
  /* The other two held GPU 0 all along. */
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client_on(&st, 0, next_pid);
  ASSERT(c && c->state == COGPU_JOB_RUNNING);
  cogpu_status_free(st);
  ASSERT_UEQ(lt_fake_gpu_used(1), 0);
  ASSERT_EQ(su_finish(next, "next", 60000), 0);
  ASSERT_EQ(su_finish(lead, "lead", 60000), 0);
  ASSERT(!strstr(lt_slurp("lead"), "suspended: this job"));
  su_clean_end();
}

/* Where the job is not moved, it waits for room where it was parked and
 * resumes there: "off", a node without the option; "restricted", a job
 * whose process sees only GPU 0 (CUDA_VISIBLE_DEVICES=0: the driver
 * refuses any GPU mapping for it); "refused", a driver that refuses the
 * move (its first restore fails, the process still checkpointed). GPU 1
 * is never used. */
static void not_moved(const char *how) {
  th_setenv("FAKE_NVML_GPUS", "16G,16G");
  if (strcmp(how, "off") != 0)
    th_setenv("COGPU_MIGRATE", "yes");
  if (strcmp(how, "refused") == 0) /* the daemon's first restore fails */
    th_setenv("FAKE_CUDA_FAIL", "cuCheckpointProcessRestore:1");
  su_begin();
  if (strcmp(how, "refused") == 0)
    unsetenv("FAKE_CUDA_FAIL");
  if (strcmp(how, "restricted") == 0)
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  pid_t job = su_mig_job("job");
  unsetenv("CUDA_VISIBLE_DEVICES");
  pid_t big;
  int cpid = su_mig_park("job", &big);
  char pidtxt[16], out[4096];
  snprintf(pidtxt, sizeof pidtxt, "%d", cpid);
  const char *res[] = {"cogpu", "resume", pidtxt, "--timeout", "500ms", NULL};
  ASSERT_EQ(su_cogpu(out, sizeof out, res), 125);
  ASSERT_CONTAINS(out, "not done");
  if (strcmp(how, "refused") == 0) {
    /* The move was tried, refused, and undone. */
    su_wait_log("cannot move to GPU 1", 20000);
  } else {
    /* Not even tried: the daemon knew it could not move it. */
    ASSERT(strstr(lt_slurp("cogpud.log"), "cannot move") == NULL);
  }
  su_wait_state(cpid, COGPU_JOB_SUSPENDED, 10000);
  ASSERT_UEQ(lt_fake_gpu_used(1), 0);
  kill(big, SIGKILL);
  ASSERT_EQ(th_exit_code(th_wait(big, th_ms(10000))), 128 + SIGKILL);
  su_wait_held_on(0, cpid, 6 * GiB);
  th_write_file(th_path("job.go1"), "");
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT(strstr(lt_slurp("cogpud.log"), "moved from GPU") == NULL);
  ASSERT_UEQ(lt_fake_gpu_used(1), 0);
  su_clean_end();
}

TEST_IMPL_T(susp_migrate_off_by_default, 60) {
  not_moved("off");
}

TEST_IMPL_T(susp_migrate_not_for_restricted_devices, 60) {
  not_moved("restricted");
}

TEST_IMPL_T(susp_migrate_refused_by_driver_waits, 60) {
  not_moved("refused");
}

/* A job holding 12 GiB (priority low_prio) is suspended to make room for
 * another's 8 GiB (priority high_prio); both complete, data intact. */
static void preempted(const char *low_prio, const char *high_prio) {
  su_begin();
  /* The low job holds its memory (idle) until it has been suspended once:
   * a fixed hold ended before a slow start of the high one on a loaded
   * machine (TSan), and nothing was left to preempt. */
  char go[PATH_MAX + 16];
  snprintf(go, sizeof go, "waitfile:%s", th_path("go"));
  pid_t low = su_job("low", low_prio, "alloc:12G", go);
  int lpid = su_holder(12 * GiB);
  pid_t high = su_job("high", high_prio, "alloc:8G", "hold:200");
  su_wait_suspensions(lpid, 1, 20000);
  th_write_file(th_path("go"), "");
  ASSERT_EQ(su_finish(high, "high", 30000), 0);
  ASSERT_EQ(su_finish(low, "low", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("low"), "verify ok");
  unsigned long long peak = 0, ooms = 0;
  lt_fake_cuda_stats(&peak, &ooms);
  ASSERT_EQ(ooms, 0);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* preempt_priority: a request of higher priority suspends a job of lower
 * priority that holds the memory it needs. */
TEST_IMPL_T(susp_priority_preemption, 90) {
  th_setenv("COGPU_PREEMPT_PRIORITY", "yes");
  preempted("-5", "10");
}

/* Without preempt_priority (the default) the same high-priority request
 * waits for the low one to finish: nothing is suspended. */
TEST_IMPL_T(susp_no_priority_preemption_by_default, 90) {
  su_begin();
  pid_t low = su_job("low", "-5", "alloc:12G", "hold:1500");
  int lpid = su_holder(12 * GiB);
  pid_t high = su_job("high", "10", "alloc:8G", "hold:100");
  /* Once the high request waits (an event, bounded), a window in which
   * nothing may happen: the low job is never suspended for it. */
  for (int t = 0;; t += 20) {
    cogpu_status_t *w = lt_status();
    size_t n = w->ngpus ? w->gpus[0].nwaiting : 0;
    cogpu_status_free(w);
    if (n > 0)
      break;
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "the high-priority request never waited");
    th_sleep_ms(20);
  }
  th_sleep_ms(800);
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, lpid);
  ASSERT(c && c->suspensions == 0 && c->state == COGPU_JOB_RUNNING);
  cogpu_status_free(st);
  ASSERT_EQ(su_finish(low, "low", 30000), 0);
  ASSERT_EQ(su_finish(high, "high", 30000), 0);
  lt_check_invariants();
}

/* max_idle: a job whose processes did no GPU work for that long is
 * suspended while another's request (of the same priority) waits. */
TEST_IMPL_T(susp_idle_preemption, 90) {
  th_setenv("COGPU_MAX_IDLE", "500ms");
  preempted("0", "0");
}

/* Deadlock between a job that used managed memory (cannot be checkpointed)
 * and one that did not: only the second is ever suspended, and both
 * complete. */
TEST_IMPL_T(susp_unsuspendable_never_picked, 90) {
  su_begin();
  char go[PATH_MAX + 16];
  snprintf(go, sizeof go, "waitfile:%s", th_path("go"));
  const char *a[] = {"cogpu",  "run",      "--",      lt_cudaprog(),
                     "direct", "init",     "ctx",     "managed:7G",
                     go,       "alloc:4G", "freeall", NULL};
  const char *b[] = {
      "cogpu",    "run", "--",       lt_cudaprog(), "direct",  "init", "ctx",
      "alloc:7G", go,    "alloc:4G", "verify",      "freeall", NULL};
  pid_t pa = lt_spawn_logged("a", a);
  pid_t pb = lt_spawn_logged("b", b);
  su_release_when_held(2, 7 * GiB, "go");
  ASSERT_EQ(su_finish(pa, "a", 60000), 0);
  ASSERT_EQ(su_finish(pb, "b", 60000), 0);
  ASSERT(strstr(lt_slurp("a"), "suspended:") == NULL);
  ASSERT_CONTAINS(lt_slurp("b"), "suspended: this job");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* Both deadlocked jobs used managed memory: nothing can be suspended, so
 * the deadlock guard fails one request, saying why. Both hold 7 GiB
 * before either asks for 4 GiB more (they wait for the file "grow"):
 * one after the other, the second waits in order while the first grows,
 * and there is no deadlock. */
TEST_IMPL_T(susp_guard_says_why_nothing_suspends, 90) {
  su_begin();
  char go[4200];
  snprintf(go, sizeof go, "waitfile:%s", th_path("grow"));
  const char *a[] = {"cogpu",  "run",      "--",      lt_cudaprog(),
                     "direct", "init",     "ctx",     "managed:7G",
                     go,       "alloc:4G", "freeall", NULL};
  pid_t pa = lt_spawn_logged("a", a);
  pid_t pb = lt_spawn_logged("b", a);
  su_release_when_held(2, 7 * GiB, "grow");
  int ca = th_exit_code(th_wait(pa, th_ms(30000)));
  int cb = th_exit_code(th_wait(pb, th_ms(30000)));
  ASSERT((ca == 0 && cb == 2) || (ca == 2 && cb == 0));
  ASSERT_CONTAINS(lt_slurp(ca == 2 ? "a" : "b"), "deadlock");
  char out[4096];
  const char *sus[] = {"cogpu", "status", NULL};
  su_cogpu(out, sizeof out, sus);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* Issue 24, item 5. A driver that exports the checkpoint API but supports
 * none of it (CUDA_ERROR_NOT_SUPPORTED): the first suspension fails at the
 * driver, and the daemon learns it for the node, once (its log, `cogpu
 * status`, `cogpu doctor`); a later one is refused without asking the
 * driver again. Before: one failed try per job, 190 in 30 runs. */
TEST_IMPL_T(susp_unsupported_driver_learnt_once, 60) {
  th_setenv("FAKE_CUDA_CHECKPOINT", "unsupported");
  su_begin();
  pid_t a = su_job("a", "0", "alloc:2G", "waitfile:end");
  pid_t b = su_job("b", "0", "alloc:2G", "waitfile:end");
  int pa = su_holder(2 * GiB + 300 * MiB);
  char out[4096];
  ASSERT_NE(su_cmd("suspend", pa, out, sizeof out), 0);
  ASSERT_CONTAINS(out, "locking pid"); /* the driver was asked */
  int pb = 0;
  for (int t = 0; !pb; t += 20) {
    cogpu_status_t *st = lt_status();
    for (size_t i = 0; i < st->gpus[0].nclients && !pb; i++)
      if (st->gpus[0].clients[i].pid != pa &&
          st->gpus[0].clients[i].reserved_bytes >= 2 * GiB)
        pb = st->gpus[0].clients[i].pid;
    cogpu_status_free(st);
    if (t > th_ms(15000))
      th_fail(__FILE__, __LINE__, "the second job never held its memory");
    if (!pb)
      th_sleep_ms(20);
  }
  ASSERT_NE(su_cmd("suspend", pb, out, sizeof out), 0);
  ASSERT_CONTAINS(out, "the driver does not support checkpointing");
  ASSERT(!strstr(out, "locking pid")); /* not asked again */
  cogpu_status_t *st = lt_status();
  ASSERT_CONTAINS(st->suspension, "does not support checkpointing");
  cogpu_status_free(st);
  const char *doc[] = {"cogpu", "doctor", NULL};
  su_cogpu(out, sizeof out, doc);
  ASSERT_CONTAINS(out, "suspension: the driver does not support");
  const char *log = lt_slurp("cogpud.log");
  const char *first = strstr(log, "jobs cannot be suspended");
  ASSERT(first && !strstr(first + 1, "jobs cannot be suspended"));
  th_write_file(th_path("end"), "");
  ASSERT_EQ(su_finish(a, "a", 20000), 0);
  ASSERT_EQ(su_finish(b, "b", 20000), 0);
  lt_check_invariants();
}

/* Host memory: a suspension whose footprint would pass suspend_max is not
 * made, and the command says why. */
TEST_IMPL_T(susp_host_memory_bound, 60) {
  th_setenv("COGPU_SUSPEND_MAX", "1G");
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  char out[4096];
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 125);
  ASSERT_CONTAINS(out, "suspend_max");
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, cpid);
  ASSERT(c && c->state == COGPU_JOB_RUNNING && c->suspensions == 0);
  cogpu_status_free(st);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
}

/* A user cannot suspend another user's job (two unprivileged users: the
 * job's and another); root can (done elsewhere). */
TEST_IMPL_T(susp_other_user_refused, 60) {
  if (geteuid() != 0)
    SKIP("needs root: runs the command as another user (setpriv)");
  su_begin();
  pid_t job = su_job("job", "0", "alloc:2G", SU_HELD);
  int cpid = su_holder(2 * GiB);
  char out[8192];
  ASSERT_EQ(su_cmd_as(2, "suspend", cpid, out, sizeof out), 125);
  ASSERT_CONTAINS(out, "another user");
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, cpid);
  ASSERT(c && c->suspensions == 0);
  cogpu_status_free(st);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
}

/* Only jobs under the daemon: a job that holds memory without the preload
 * library cannot be suspended, and the command says why. */
TEST_IMPL_T(susp_refuses_what_it_cannot_checkpoint, 60) {
  su_begin();
  pid_t h = lt_hold("plain", 0, 2 * GiB, 0, 0, -1);
  lt_wait_nclients(0, 1, th_ms(5000));
  char pidtxt[16], out[4096];
  snprintf(pidtxt, sizeof pidtxt, "%d", (int)h);
  const char *sus[] = {"cogpu", "suspend", pidtxt, NULL};
  ASSERT_EQ(su_cogpu(out, sizeof out, sus), 125);
  ASSERT_CONTAINS(out, "preload library");
  const char *none[] = {"cogpu", "suspend", "no-such-job", NULL};
  ASSERT_EQ(su_cogpu(out, sizeof out, none), 125);
  ASSERT_CONTAINS(out, "no job 'no-such-job'");
  kill(h, SIGKILL);
  th_wait(h, th_ms(5000));
}

/* kill -9 of a suspended job: its footprint and its entries go with it. */
TEST_IMPL_T(susp_kill_suspended_job, 60) {
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", "hold:30000");
  int cpid = su_holder(4 * GiB);
  char out[4096];
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  ASSERT_EQ(kill(cpid, SIGKILL), 0);
  th_wait(job, th_ms(10000));
  for (int t = 0;; t += 20) {
    cogpu_status_t *st = lt_status();
    bool gone = st->gpus[0].nclients == 0 && st->gpus[0].nwaiting == 0 &&
                st->gpus[0].suspended_bytes == 0;
    cogpu_status_free(st);
    if (gone)
      break;
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "the killed job's entries stayed");
    th_sleep_ms(20);
  }
  ASSERT_UEQ(lt_fake_cuda_used(), 0);
  lt_check_invariants();
}

/* The daemon killed while a job is suspended: the next one knows it, and
 * resumes it on request; the job finishes with its data. */
TEST_IMPL_T(susp_daemon_restart_while_suspended, 60) {
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  char out[4096];
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  th_daemon_stop(SIGKILL);
  th_daemon_start();
  su_wait_state(cpid, COGPU_JOB_SUSPENDED, 10000);
  ASSERT_EQ(su_cmd("resume", cpid, out, sizeof out), 0);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* Issue 23, item 6. A parked job's resume is queued but the GPU is full;
 * the daemon is killed, and the job that filled the GPU ends meanwhile.
 * The next daemon's recovery serves the resume: the job is restored once
 * (it was restored twice: the recovery's service pass and its scan of
 * transitional states both submitted it). */
TEST_IMPL_T(susp_restart_resumes_once, 60) {
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  char out[4096], pidtxt[16];
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  pid_t other = lt_hold("other", 0, 12 * GiB, 0, 0, -1);
  for (int t = 0;; t += 20) {
    cogpu_status_t *st = lt_status();
    uint64_t r = st->gpus[0].reserved_bytes;
    cogpu_status_free(st);
    if (r >= 12 * GiB)
      break;
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "the other job never held its 12G");
    th_sleep_ms(20);
  }
  /* Asked to resume: it waits in the queue (4.3G do not fit beside 12G). */
  snprintf(pidtxt, sizeof pidtxt, "%d", cpid);
  const char *res[] = {"cogpu", "resume", pidtxt, NULL};
  pid_t rp = lt_spawn_logged("resume", res);
  lt_wait_nwaiting(0, 1, th_ms(10000));
  th_daemon_stop(SIGKILL);
  kill(other, SIGKILL); /* it ends while no daemon runs */
  th_wait(other, th_ms(10000));
  th_daemon_start();
  th_wait(rp, th_ms(30000)); /* its answer died with the daemon, or came */
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_EQ(lt_fake_wedged(), 0);
  /* Seen once the loop logged it (failed once in a loaded TSan run, read
   * before it was written). */
  su_wait_log("resumed the job of pid", 10000);
  const char *log = lt_slurp("cogpud.log");
  const char *first = strstr(log, "resumed the job of pid");
  if (strstr(first + 1, "resumed the job of pid") ||
      strstr(log, "resuming the job of pid"))
    th_fail(__FILE__, __LINE__, "resumed more than once:\n%s", log);
  lt_check_invariants();
}

/* The daemon killed in the middle of a suspension (a slow checkpoint):
 * the next daemon undoes it, so the job runs again and finishes. */
TEST_IMPL_T(susp_daemon_killed_mid_suspend, 60) {
  th_setenv("FAKE_CUDA_CKPT_GBPS", "2"); /* 4 GiB: about 2 s */
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  char pidtxt[16];
  snprintf(pidtxt, sizeof pidtxt, "%d", cpid);
  const char *sus[] = {"cogpu", "suspend", pidtxt, NULL};
  pid_t s = lt_spawn_logged("suspend", sus);
  su_wait_state(cpid, COGPU_JOB_SUSPENDING, 5000);
  th_sleep_ms(300);
  th_daemon_stop(SIGKILL);
  th_wait(s, th_ms(10000));
  th_daemon_start();
  su_wait_state(cpid, COGPU_JOB_RUNNING, 20000);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* Chaos: growing jobs that deadlock again and again, with random kill -9s
 * among them while suspensions and resumes go on. The survivors complete,
 * nothing is left locked or wedged, and the books balance. */
TEST_IMPL_T(susp_chaos_kills, 180) {
  su_begin();
  enum { N = 6 };
  pid_t p[N];
  char tag[N][16];
  for (int i = 0; i < N; i++) {
    snprintf(tag[i], sizeof tag[i], "job%d", i);
    p[i] = su_growing(tag[i], NULL, 10, "hold:60");
  }
  /* Kill the program (not cogpu run) of jobs 1, 3 and 5 at random times,
   * whatever state they are in. */
  unsigned seed = (unsigned)getpid();
  for (int i = 1; i < N; i += 2) {
    th_sleep_ms(200 + (int)(rand_r(&seed) % 700));
    char parent[16], o[256], e[256];
    snprintf(parent, sizeof parent, "%d", (int)p[i]);
    /* Not through a shell: a sanitizer runtime preloaded into dash faults. */
    static const char *const noenv[] = {"LD_PRELOAD=", NULL};
    /* The program by name: cogpu run's other child, once the program has
     * ended, can be LeakSanitizer's tracer at its exit, and killing that
     * left cogpu run waiting for it for good (ASan, under load). */
    const char *argv[] = {"pkill", "-KILL",    "-P", parent,
                          "-x",    "cudaprog", NULL};
    th_run(argv, noenv, o, sizeof o, e, sizeof e, th_ms(10000));
  }
  for (int i = 0; i < N; i++) {
    int code = th_exit_code(th_wait(p[i], th_ms(120000)));
    if (i % 2 == 0) {
      if (code != 0)
        th_fail(__FILE__, __LINE__, "job %d exit %d:\n%s", i, code,
                lt_slurp(tag[i]));
      ASSERT_CONTAINS(lt_slurp(tag[i]), "verify ok");
    }
  }
  ASSERT_EQ(lt_fake_wedged(), 0);
  for (int t = 0; lt_fake_cuda_used() != 0; t += 20) {
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "device memory left: %llu",
              lt_fake_cuda_used());
    th_sleep_ms(20);
  }
  lt_check_invariants();
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].suspended_bytes, 0);
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  cogpu_status_free(st);
}

/* The daemon killed in the middle of a resume (a slow restore): the next
 * daemon finds the footprint booked and the job half restored, and does
 * the resume again; the job finishes with its data. */
TEST_IMPL_T(susp_daemon_killed_mid_resume, 60) {
  th_setenv("FAKE_CUDA_CKPT_GBPS", "2"); /* 4 GiB: about 2 s each way */
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  char pidtxt[16], out[4096];
  snprintf(pidtxt, sizeof pidtxt, "%d", cpid);
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  const char *res[] = {"cogpu", "resume", pidtxt, NULL};
  pid_t r = lt_spawn_logged("resume", res);
  su_wait_state(cpid, COGPU_JOB_RESUMING, 5000);
  th_sleep_ms(300);
  th_daemon_stop(SIGKILL);
  th_wait(r, th_ms(10000));
  th_daemon_start();
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* The same on a full GPU (issue 25): the restore had put the job's memory
 * back when the daemon died, so the job holds it, locked. The next daemon
 * must not wait for the driver to have the footprint free (the job holds
 * it itself: the GPU has no other room until the neighbour ends): it asks
 * the driver that the job is no longer checkpointed, and unlocks it. */
TEST_IMPL_T(susp_daemon_killed_mid_resume_full_gpu, 60) {
  th_setenv("FAKE_CUDA_CKPT_GBPS", "2"); /* 4 GiB: about 2 s each way */
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  pid_t big = su_job("big", "0", "alloc:11G", "hold:60000");
  su_holder(11 * GiB);
  unsigned long long full = lt_fake_cuda_used();
  char pidtxt[16], out[4096];
  snprintf(pidtxt, sizeof pidtxt, "%d", cpid);
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  const char *res[] = {"cogpu", "resume", pidtxt, NULL};
  pid_t r = lt_spawn_logged("resume", res);
  /* Killed once the restore has charged the job's memory back (its copy
   * then takes about 2 s more). */
  for (int t = 0; lt_fake_cuda_used() < full; t += 10) {
    if (t > th_ms(20000))
      th_fail(__FILE__, __LINE__, "the restore never charged the memory");
    th_sleep_ms(10);
  }
  th_daemon_stop(SIGKILL);
  th_wait(r, th_ms(10000));
  th_daemon_start();
  /* It finishes while its neighbour still holds the rest of the GPU. */
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_EQ(kill(big, 0), 0);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
  kill(big, SIGTERM);
  th_wait(big, th_ms(10000));
}

/* Exactly one suspension per job at a time: a second `cogpu suspend`
 * while the first is under way is refused, and so is a resume of a job
 * that is not suspended. */
TEST_IMPL_T(susp_one_at_a_time, 60) {
  th_setenv("FAKE_CUDA_CKPT_GBPS", "4"); /* 4 GiB: about 1 s */
  su_begin();
  pid_t job = su_job("job", "0", "alloc:4G", SU_HELD);
  int cpid = su_holder(4 * GiB);
  char pidtxt[16], out[4096];
  snprintf(pidtxt, sizeof pidtxt, "%d", cpid);
  const char *res[] = {"cogpu", "resume", pidtxt, NULL};
  ASSERT_EQ(su_cogpu(out, sizeof out, res), 125);
  ASSERT_CONTAINS(out, "not suspended");
  const char *sus[] = {"cogpu", "suspend", pidtxt, NULL};
  pid_t first = lt_spawn_logged("first", sus);
  su_wait_state(cpid, COGPU_JOB_SUSPENDING, 5000);
  ASSERT_EQ(su_cogpu(out, sizeof out, sus), 125);
  ASSERT_CONTAINS(out, "already being suspended");
  ASSERT_EQ(su_finish(first, "first", 20000), 0);
  ASSERT_EQ(su_cogpu(out, sizeof out, res), 0);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* The job a suspension made room for is killed: the suspended one resumes
 * in the memory that frees, and completes. */
TEST_IMPL_T(susp_waiter_killed, 60) {
  su_begin();
  char go[PATH_MAX + 16];
  snprintf(go, sizeof go, "waitfile:%s", th_path("go"));
  const char *argv[] = {
      "cogpu",    "run", "--",       lt_cudaprog(), "direct", "init",    "ctx",
      "alloc:7G", go,    "alloc:4G", "hold:3000",   "verify", "freeall", NULL};
  pid_t a = lt_spawn_logged("a", argv);
  pid_t b = lt_spawn_logged("b", argv);
  su_release_when_held(2, 7 * GiB, "go");
  /* One of them is suspended so that the other may grow; kill that one. */
  int suspended = 0, runner = 0;
  for (int t = 0; !runner; t += 20) {
    cogpu_status_t *st = lt_status();
    for (size_t i = 0; i < st->gpus[0].nclients; i++) {
      const cogpu_client_info_t *c = &st->gpus[0].clients[i];
      if (c->state == COGPU_JOB_SUSPENDED)
        suspended = c->pid;
      else if (c->reserved_bytes >= 11 * GiB)
        runner = c->pid;
    }
    cogpu_status_free(st);
    if (t > th_ms(20000))
      th_fail(__FILE__, __LINE__, "no job was suspended for the other");
    th_sleep_ms(20);
  }
  ASSERT(suspended != 0);
  ASSERT_EQ(kill(runner, SIGKILL), 0);
  int ca = th_exit_code(th_wait(a, th_ms(30000)));
  int cb = th_exit_code(th_wait(b, th_ms(30000)));
  /* The killed job's cogpu run dies of its command's signal; the other
   * completes. */
  ASSERT((ca == 0) != (cb == 0));
  ASSERT_CONTAINS(lt_slurp(ca == 0 ? "a" : "b"), "verify ok");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* Reserve before restore covers what the ledger knows; memory the driver
 * still holds and the ledger does not (a program outside cogpu that started
 * after the ledger's last NVML read, here; a killed job's process that is
 * still exiting, in susp_waiter_killed) must not be restored into, or the
 * job is wedged for good. The resume waits, the job showing as resuming,
 * until the driver has the room; then the job goes on with its data. */
TEST_IMPL_T(susp_resume_waits_for_the_driver, 60) {
  th_setenv("COGPU_FOREIGN_REFRESH", "1h");
  su_begin();
  /* Both hold their memory until the test lets them go (a fixed 2.5 s
   * and 1.5 s ran out under load before the commands came). */
  pid_t job = su_job("job", "0", "alloc:8G", SU_HELD);
  int cpid = su_holder(8 * GiB); /* its status read NVML: the last time */
  char out[4096];
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  char hw[4200];
  snprintf(hw, sizeof hw, "waitfile:%s", su_go("holder"));
  const char *hold[] = {lt_cudaprog(), "direct", "init", "ctx",
                        "alloc:10G",   hw,       NULL};
  pid_t holder = lt_spawn_logged("holder", hold);
  for (int i = 0; i < 500 && lt_fake_cuda_used() < 10 * GiB; i++)
    th_sleep_ms(10);
  ASSERT(lt_fake_cuda_used() >= 10 * GiB);
  char pidtxt[16];
  snprintf(pidtxt, sizeof pidtxt, "%d", cpid);
  const char *res[] = {"cogpu", "resume", pidtxt, NULL};
  pid_t r = lt_spawn_logged("resume", res);
  /* The resume is under way (an event, not a fixed 400 ms), and stays so
   * while the holder has the memory: the daemon waits for the driver. */
  su_wait_state(cpid, COGPU_JOB_RESUMING, 10000);
  th_sleep_ms(300);
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, cpid);
  ASSERT(c && c->state == COGPU_JOB_RESUMING);
  cogpu_status_free(st);
  ASSERT_EQ(su_finish(holder, "holder", 10000), 0);
  ASSERT_EQ(su_finish(r, "resume", 15000), 0);
  ASSERT_EQ(su_finish(job, "job", 20000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_CONTAINS(lt_slurp("cogpud.log"), "waits for the driver");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* The driver's lock waits for a job's running kernels, bounded by
 * suspend_lock_timeout: a job busy with a long kernel is not suspended by
 * hand (the command says why) and runs on untouched. */
TEST_IMPL_T(susp_lock_timeout_by_hand, 60) {
  th_setenv("COGPU_SUSPEND_LOCK_TIMEOUT", "300ms");
  su_begin();
  setenv("FAKE_CUDA_KERNEL_MS", "4000", 1); /* the job's, not the daemon's */
  const char *argv[] = {"cogpu",     "run",       "--",     lt_cudaprog(),
                        "direct",    "init",      "ctx",    "alloc:4G",
                        "graph:64M", "hold:1500", "verify", "freeall",
                        NULL};
  pid_t job = lt_spawn_logged("job", argv);
  unsetenv("FAKE_CUDA_KERNEL_MS");
  int cpid = su_holder(4 * GiB);
  for (int t = 0; !strstr(lt_slurp("job"), "graph launched"); t += 20) {
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "the job never launched its kernel");
    th_sleep_ms(20);
  }
  char out[4096];
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 125);
  ASSERT_CONTAINS(out, "lock timeout");
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, cpid);
  ASSERT(c && c->state == COGPU_JOB_RUNNING && c->suspensions == 0);
  cogpu_status_free(st);
  ASSERT_EQ(su_finish(job, "job", 30000), 0);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* In a deadlock, the first victim (lowest priority) is busy with a long
 * kernel: its lock times out, and the next job is suspended instead; both
 * complete. The deadlock is made, not hoped for: both hold their 7 GiB
 * before either goes on (a fixed 300 ms overlap missed it in a loaded
 * TSan pass, where the second job started after the first had ended). */
TEST_IMPL_T(susp_lock_timeout_next_victim, 90) {
  th_setenv("COGPU_SUSPEND_LOCK_TIMEOUT", "300ms");
  su_begin();
  char go[4200];
  snprintf(go, sizeof go, "waitfile:%s", th_path("go"));
  setenv("FAKE_CUDA_KERNEL_MS", "3000", 1);
  const char *busy[] = {
      "cogpu",    "run",      "--priority", "-5",       "--", lt_cudaprog(),
      "direct",   "init",     "ctx",        "alloc:7G", go,   "graph:64M",
      "hold:300", "alloc:4G", "verify",     "freeall",  NULL};
  pid_t a = lt_spawn_logged("busy", busy);
  unsetenv("FAKE_CUDA_KERNEL_MS");
  const char *calm[] = {
      "cogpu",    "run", "--",       lt_cudaprog(), "direct", "init",    "ctx",
      "alloc:7G", go,    "hold:300", "alloc:4G",    "verify", "freeall", NULL};
  pid_t b = lt_spawn_logged("calm", calm);
  su_reserved_at_least(0, 2 * (7 * GiB + 300 * MiB));
  th_write_file(th_path("go"), "");
  ASSERT_EQ(su_finish(a, "busy", 60000), 0);
  ASSERT_EQ(su_finish(b, "calm", 60000), 0);
  ASSERT_CONTAINS(lt_slurp("calm"), "suspended: this job");
  /* The busy one was tried first (it is the lowest priority). */
  ASSERT_CONTAINS(lt_slurp("cogpud.log"), "lock timeout");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* A 2 GiB job suspended by hand under a daemon whose restores fail as
 * FAKE_CUDA_FAIL says (the daemon is the only caller of Restore); its pid,
 * the job's process, and the suspension done. */
static int restore_case(const char *fail, pid_t *job) {
  setenv("FAKE_CUDA_FAIL", fail, 1);
  su_begin();
  unsetenv("FAKE_CUDA_FAIL");
  const char *argv[] = {"cogpu",     "run",    "--",      lt_cudaprog(),
                        "direct",    "init",   "ctx",     "alloc:2G",
                        "hold:1500", "verify", "freeall", NULL};
  *job = lt_spawn_logged("job", argv);
  int cpid = su_holder(2 * GiB);
  char out[4096];
  ASSERT_EQ(su_cmd("suspend", cpid, out, sizeof out), 0);
  return cpid;
}

/* The driver refuses a restore once (an error that leaves the process
 * checkpointed): the daemon tries again and the job resumes, data intact. */
TEST_IMPL_T(susp_restore_refused_once_is_retried, 60) {
  pid_t job;
  int cpid = restore_case("cuCheckpointProcessRestore:1", &job);
  char out[4096];
  ASSERT_EQ(su_cmd("resume", cpid, out, sizeof out), 0);
  ASSERT_EQ(su_finish(job, "job", 20000), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  ASSERT_CONTAINS(lt_slurp("cogpud.log"), "trying again");
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
}

/* The driver refuses every restore: the job could never run again (its
 * processes would wait in the driver for good, holding their memory). It
 * is ended: `cogpu resume` says why, the job's stderr says why, its
 * cogpu run ends by SIGKILL, and the node is left empty. */
TEST_IMPL_T(susp_restore_refused_ends_the_job, 60) {
  pid_t job;
  int cpid = restore_case("cuCheckpointProcessRestore:1+", &job);
  char out[4096];
  uint64_t t0 = cogpu__now_ns();
  ASSERT_NE(su_cmd("resume", cpid, out, sizeof out), 0);
  ASSERT_CONTAINS(out, "restoring pid");
  int code = th_exit_code(th_wait(job, th_ms(20000)));
  ASSERT_EQ(code, 128 + SIGKILL);
  ASSERT_LT((int64_t)((cogpu__now_ns() - t0) / 1000000), th_ms(10000));
  /* (The line is appended; cogpu run, writing at its own offset of the
   * log, may overwrite its start: the end is what is checked.) */
  ASSERT_CONTAINS(lt_slurp("job"), "it cannot continue and is ended (cogpud)");
  ASSERT_CONTAINS(lt_slurp("cogpud.log"), "ending them");
  /* Its slot and memory are the node's again. */
  for (int t = 0;; t += 50) {
    cogpu_status_t *st = lt_status();
    bool empty = st->gpus[0].nclients == 0 && st->gpus[0].reserved_bytes == 0;
    cogpu_status_free(st);
    if (empty)
      break;
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "the ended job's reservation stayed");
    th_sleep_ms(50);
  }
  lt_check_invariants();
}

/* --- PID reuse (issue 23) -------------------------------------------------
 */

/* As uid 65534: attaches with job id argv[0], reserves 1 GiB, says it uses
 * CUDA, then hands its connection to a child made without fork's handlers
 * (so the library does not close it there) and exits: the registration
 * lives on, naming a PID that is free for anyone's next process. */
HELPER_IMPL(susp_stale_registration) {
  if (argc != 1 || setresgid(65534, 65534, 65534) != 0 ||
      setresuid(65534, 65534, 65534) != 0)
    return 2;
  cogpu_attach_opts_t o = {.job_id = argv[0], .command = "stale"};
  cogpu_t *h = NULL;
  cogpu_request_t q = {.gpu = 0,
                       .bytes = GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  if (cogpu_attach(&o, &h) != 0 || cogpu_reserve(h, &q, NULL) != 0 ||
      cogpu__mark(h, COGPU_MARK_CUDA) != 0) {
    fprintf(stderr, "stale: %s\n", cogpu_last_error());
    return 3;
  }
  long child = syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
  if (child == 0) {
    for (;;)
      pause(); /* holds the connection; ended with the test */
  }
  _exit(child > 0 ? 0 : 4);
}

/* Starts argv (as root) as PID `pid`, or returns -1 if that PID could not
 * be had. */
static pid_t spawn_as_pid(pid_t pid, const char *const argv[]) {
  pid_t c = lt_fork_as_pid(pid);
  if (c == 0) {
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  return c;
}

static int ckpt_state_of(pid_t pid) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  int (*state)(int) =
      lib ? (int (*)(int))dlsym(lib, "fake_cuda_ckpt_state") : NULL;
  if (!state)
    th_fail(__FILE__, __LINE__, "the fake driver's fake_cuda_ckpt_state");
  return state(pid);
}

static bool listed(int pid) {
  cogpu_status_t *st;
  bool r = su_client(&st, pid) != NULL;
  cogpu_status_free(st);
  return r;
}

/* A user's process registers (1 GiB, uses CUDA), hands its connection to
 * a child and exits; its PID is then taken by root's CUDA process. The
 * registration ends with the process that made it (the daemon watches
 * each client's pidfd), so neither the user's `cogpu suspend PID` nor
 * `cogpu suspend JOB` (the registration's job id) finds anything, and
 * root's process is never touched. (Besides, a PID names a registration
 * only while its start time is the registered one, and the suspender
 * checks each process through a pidfd before every driver call.) */
TEST_IMPL_T(susp_pid_reuse_never_hits_another_process, 60) {
  if (geteuid() != 0)
    SKIP("needs root: runs clients as another user, chooses PIDs "
         "(ns_last_pid)");
  ASSERT(chmod(th_tmpdir(), 0711) == 0);
  su_begin();
  const char *args[] = {"stalejob", NULL};
  pid_t stale = th_spawn_helper("susp_stale_registration", args);
  ASSERT_EQ(th_exit_code(th_wait(stale, th_ms(20000))), 0);
  /* Its registration ends with it, though its connection lives on. */
  for (int t = 0; listed(stale); t += 20) {
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "the exited process is still booked");
    th_sleep_ms(20);
  }
  const char *victim_argv[] = {lt_cudaprog(), "direct",     "init", "ctx",
                               "alloc:512M",  "hold:60000", NULL};
  pid_t victim = spawn_as_pid(stale, victim_argv);
  if (victim < 0)
    th_fail(__FILE__, __LINE__, "PID %d could not be had again", stale);
  for (int t = 0; ckpt_state_of(victim) != CU_PROCESS_STATE_RUNNING; t += 20) {
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "root's CUDA process never started");
    th_sleep_ms(20);
  }
  char pidtxt[16], out[4096], err[4096];
  snprintf(pidtxt, sizeof pidtxt, "%d", stale);
  const char *const by_pid[] = {
      "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
      "cogpu",   "suspend",       pidtxt,          NULL};
  ASSERT_NE(
      th_run(by_pid, NULL, out, sizeof out, err, sizeof err, th_ms(20000)), 0);
  ASSERT_CONTAINS(err, "no process");
  const char *const by_job[] = {"setpriv",       "--reuid=65534",
                                "--regid=65534", "--clear-groups",
                                "cogpu",         "suspend",
                                "stalejob",      "--timeout",
                                "10s",           NULL};
  ASSERT_NE(
      th_run(by_job, NULL, out, sizeof out, err, sizeof err, th_ms(20000)), 0);
  ASSERT_CONTAINS(err, "no job 'stalejob'");
  ASSERT_EQ(ckpt_state_of(victim), CU_PROCESS_STATE_RUNNING);
  kill(victim, SIGKILL);
  waitpid(victim, NULL, 0);
}

/* A CUDA program under the preload library alone (a job of its own, no
 * cogpu run), holding 8 GiB until killed; as PID `pid` if pid > 0. */
static pid_t preloaded_holder(pid_t pid) {
  char pre[4200];
  const char *rt = th_sanitizer_runtime();
  snprintf(pre, sizeof pre, "%s%s%s/libcogpu-preload.so", rt, rt[0] ? " " : "",
           th_build_dir());
  const char *argv[] = {lt_cudaprog(), "direct",      "init", "ctx",
                        "alloc:8G",    "hold:600000", NULL};
  char *old = getenv("LD_PRELOAD") ? strdup(getenv("LD_PRELOAD")) : NULL;
  setenv("LD_PRELOAD", pre, 1);
  pid_t p = pid > 0 ? spawn_as_pid(pid, argv) : -1;
  if (pid <= 0 && (p = fork()) == 0) {
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  if (old)
    setenv("LD_PRELOAD", old, 1);
  else
    unsetenv("LD_PRELOAD");
  free(old);
  return p;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static unsigned suspensions_of(int pid) {
  cogpu_status_t *st;
  const cogpu_client_info_t *c = su_client(&st, pid);
  unsigned n = c ? c->suspensions : 0;
  cogpu_status_free(st);
  return n;
}

/* max_idle keeps its time per registration: a process that takes the PID
 * of one that sat idle (and was suspended for it) starts afresh; it is
 * idle only once it has been idle for max_idle itself (issue 23: it
 * inherited the old process's time and was suspended at once). */
TEST_IMPL_T(susp_idle_time_not_inherited_by_pid, 90) {
  if (geteuid() != 0)
    SKIP("needs root to choose PIDs (ns_last_pid)");
  /* Idleness alone: no suspension to break a wait that holds memory. */
  th_setenv("COGPU_SUSPEND", "no");
  th_setenv("COGPU_MAX_IDLE", "3s");
  su_begin();
  pid_t a = preloaded_holder(0);
  ASSERT_EQ(su_holder(8 * GiB), a);
  pid_t w = su_job("w", "0", "alloc:10G", "hold:100");
  su_wait_suspensions(a, 1, 30000); /* idle 3 s while w waited */
  ASSERT_EQ(su_finish(w, "w", 30000), 0);
  kill(a, SIGKILL);
  waitpid(a, NULL, 0);
  for (int t = 0; listed(a); t += 20) {
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "the killed job stayed listed");
    th_sleep_ms(20);
  }
  pid_t b = preloaded_holder(a);
  if (b < 0)
    th_fail(__FILE__, __LINE__, "PID %d could not be had again", a);
  ASSERT_EQ(su_holder(8 * GiB), b);
  int64_t t0 = mono_ms();
  pid_t w2 = su_job("w2", "0", "alloc:10G", "hold:100");
  /* Not before it has been idle for max_idle itself. */
  while (mono_ms() - t0 < 1500) {
    ASSERT_EQ(suspensions_of(b), 0);
    th_sleep_ms(50);
  }
  su_wait_suspensions(b, 1, 30000); /* then it is */
  ASSERT_EQ(su_finish(w2, "w2", 30000), 0);
  kill(b, SIGKILL);
  waitpid(b, NULL, 0);
}
