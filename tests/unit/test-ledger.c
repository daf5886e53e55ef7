/*
 * test-ledger.c: the C API in one process: attach, reserve, release,
 * grow/shrink, exclusive use, auto placement, client limits, foreign
 * memory, lookups and argument checking.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "internal.h"
#include "ledger-helpers.h"
#include "ledger/ledger-int.h"

static cogpu_request_t req(int gpu, uint64_t bytes, int64_t timeout_ms) {
  return (cogpu_request_t){.gpu = gpu,
                           .bytes = bytes,
                           .priority = COGPU_PRIORITY_DEFAULT,
                           .timeout_ms = timeout_ms};
}

TEST_IMPL_SINGLE(ledger_attach_creates_state) {
  th_setenv("FAKE_NVML_GPUS", "16G,8G");
  cogpu_t *h = lt_attach(0);
  ASSERT_EQ(cogpu_gpu_count(h), 2);
  struct stat sb;
  ASSERT_EQ(stat(th_path("state/state"), &sb), 0);
  ASSERT_EQ(sb.st_mode & 0777, 0600); /* this user's own */
  cogpu_status_t *st = lt_status();
  ASSERT_EQ(st->ngpus, 2);
  ASSERT_STREQ(st->policy, "fifo");
  ASSERT_UEQ(st->gpus[0].total_bytes, 16 * GiB);
  ASSERT_UEQ(st->gpus[1].total_bytes, 8 * GiB);
  /* Default margin: 2% of the total. */
  ASSERT_UEQ(st->gpus[0].margin_bytes, 16 * GiB * 2 / 100);
  ASSERT_UEQ(st->gpus[0].capacity_bytes, 16 * GiB - 16 * GiB * 2 / 100);
  ASSERT_CONTAINS(st->gpus[1].uuid, "GPU-");
  cogpu_status_free(st);
  ASSERT_OK(cogpu_detach(h));
}

TEST_IMPL(ledger_reserve_release) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = req(0, 4 * GiB, COGPU_NOWAIT);
  int gpu = -1;
  ASSERT_OK(cogpu_reserve(h, &r, &gpu));
  ASSERT_EQ(gpu, 0);
  uint64_t held;
  ASSERT_OK(cogpu_held(h, 0, &held));
  ASSERT_UEQ(held, 4 * GiB);
  /* Grow, then shrink, then release all. */
  ASSERT_OK(cogpu_reserve(h, &r, &gpu));
  ASSERT_OK(cogpu_held(h, 0, &held));
  ASSERT_UEQ(held, 8 * GiB);
  ASSERT_OK(cogpu_release(h, 0, 3 * GiB));
  ASSERT_OK(cogpu_held(h, 0, &held));
  ASSERT_UEQ(held, 5 * GiB);
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 5 * GiB);
  ASSERT_EQ(st->gpus[0].nclients, 1);
  ASSERT_UEQ(st->gpus[0].clients[0].reserved_bytes, 5 * GiB);
  ASSERT_EQ(st->gpus[0].clients[0].pid, getpid());
  cogpu_status_free(st);
  ASSERT_EQ(cogpu_release(h, 0, 6 * GiB), -EINVAL);
  ASSERT_CONTAINS(cogpu_last_error(), "held");
  ASSERT_OK(cogpu_release(h, 0, COGPU_ALL));
  st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  ASSERT_EQ(st->gpus[0].nclients, 0);
  cogpu_status_free(st);
  cogpu_detach(h);
}

TEST_IMPL(ledger_nowait_and_timeout) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *a = lt_attach(0);
  cogpu_request_t r = req(0, 12 * GiB, COGPU_NOWAIT);
  ASSERT_OK(cogpu_reserve(a, &r, NULL));
  pid_t p = lt_hold("b", 0, 8 * GiB, 0, COGPU_NOWAIT, 0);
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(5000))), HOLD_AGAIN);
  uint64_t t0 = (uint64_t)time(NULL);
  p = lt_hold("b", 0, 8 * GiB, 0, 300, 0);
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(5000))), HOLD_TIMEDOUT);
  ASSERT_LE((uint64_t)time(NULL) - t0, 3);
  /* Nothing left behind by the failed requests. */
  ASSERT_EQ(lt_nwaiting(0), 0);
  lt_check_invariants();
  /* Too large for the GPU at all: refused at once, whatever the timeout. */
  r = req(0, 17 * GiB, COGPU_WAIT_FOREVER);
  ASSERT_EQ(cogpu_reserve(a, &r, NULL), -E2BIG);
  ASSERT_CONTAINS(cogpu_last_error(), "larger than");
  cogpu_detach(a);
}

TEST_IMPL(ledger_waiter_served_on_release) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *a = lt_attach(0);
  cogpu_request_t r = req(0, 12 * GiB, COGPU_NOWAIT);
  ASSERT_OK(cogpu_reserve(a, &r, NULL));
  pid_t p = lt_hold("b", 0, 8 * GiB, 0, COGPU_WAIT_FOREVER, -1);
  lt_wait_nwaiting(0, 1, 5000);
  ASSERT_UEQ(lt_reserved_by(0, "b"), 0);
  ASSERT_OK(cogpu_release(a, 0, 4 * GiB));
  /* Served inside the release: visible at once, no sleep needed. */
  ASSERT_UEQ(lt_reserved_by(0, "b"), 8 * GiB);
  ASSERT_EQ(lt_nwaiting(0), 0);
  lt_check_invariants();
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  cogpu_detach(a);
}

TEST_IMPL(ledger_auto_placement) {
  th_setenv("FAKE_NVML_GPUS", "8G,16G,12G");
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  int gpu = -9;
  cogpu_request_t r = req(COGPU_GPU_AUTO, 4 * GiB, COGPU_NOWAIT);
  ASSERT_OK(cogpu_reserve(h, &r, &gpu));
  ASSERT_EQ(gpu, 1); /* 16G free: the most */
  ASSERT_OK(cogpu_reserve(h, &r, &gpu));
  ASSERT_EQ(gpu, 1); /* 12G free on both 1 and 2: the first */
  ASSERT_OK(cogpu_reserve(h, &r, &gpu));
  ASSERT_EQ(gpu, 2);  /* 12G on 2 vs 8G on 1 */
  r.bytes = 11 * GiB; /* fits only on... none of 8, 8, 8 free */
  ASSERT_EQ(cogpu_reserve(h, &r, &gpu), -EAGAIN);
  r.bytes = 13 * GiB; /* larger than all but GPU 1: waits, not E2BIG */
  ASSERT_EQ(cogpu_reserve(h, &r, &gpu), -EAGAIN);
  r.bytes = 17 * GiB;
  ASSERT_EQ(cogpu_reserve(h, &r, &gpu), -E2BIG);
  cogpu_detach(h);
}

TEST_IMPL(ledger_exclusive) {
  th_setenv("FAKE_NVML_GPUS", "16G,16G");
  cogpu_t *a = lt_attach(0);
  cogpu_request_t r = req(0, 1 * GiB, COGPU_NOWAIT);
  ASSERT_OK(cogpu_reserve(a, &r, NULL));
  /* Someone else holds GPU 0: exclusive use waits or fails there. */
  pid_t p = lt_hold("x", 0, 0, 0, COGPU_NOWAIT, 0);
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(5000))), HOLD_AGAIN);
  /* Auto exclusive takes the idle GPU 1. */
  p = lt_hold("x", COGPU_GPU_AUTO, 0, 0, COGPU_NOWAIT, -1);
  lt_wait_nclients(1, 1, 5000);
  cogpu_status_t *st = lt_status();
  ASSERT(st->gpus[1].exclusive);
  ASSERT(st->gpus[1].clients[0].exclusive);
  cogpu_status_free(st);
  /* Nobody else may reserve on an exclusively held GPU. */
  r.gpu = 1;
  ASSERT_EQ(cogpu_reserve(a, &r, NULL), -EAGAIN);
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  /* Its death ends the exclusive use. */
  r.timeout_ms = th_ms(5000);
  ASSERT_OK(cogpu_reserve(a, &r, NULL));
  /* Own exclusive use on a GPU we already hold memory on. */
  r = (cogpu_request_t){
      .gpu = 0, .timeout_ms = 0, .flags = COGPU_REQ_EXCLUSIVE};
  ASSERT_OK(cogpu_reserve(a, &r, NULL));
  st = lt_status();
  ASSERT(st->gpus[0].exclusive);
  cogpu_status_free(st);
  ASSERT_OK(cogpu_release(a, 0, COGPU_ALL));
  st = lt_status();
  ASSERT(!st->gpus[0].exclusive);
  ASSERT_EQ(st->gpus[0].nclients, 0);
  cogpu_status_free(st);
  cogpu_detach(a);
}

TEST_IMPL(ledger_max_clients) {
  th_setenv("COGPU_MAX_CLIENTS", "2");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = req(0, 1 * GiB, COGPU_NOWAIT);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  pid_t p = lt_hold("second", 0, 1 * GiB, 0, COGPU_NOWAIT, -1);
  lt_wait_nclients(0, 2, 5000);
  pid_t q = lt_hold("third", 0, 1 * GiB, 0, COGPU_NOWAIT, 0);
  ASSERT_EQ(th_exit_code(th_wait(q, th_ms(5000))), HOLD_AGAIN);
  /* A client already on the GPU may grow. */
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  q = lt_hold("third", 0, 1 * GiB, 0, COGPU_WAIT_FOREVER, 0);
  lt_wait_nwaiting(0, 1, 5000);
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  /* The third is served once the second's slot is reclaimed. */
  ASSERT_EQ(th_exit_code(th_wait(q, th_ms(10000))), HOLD_OK);
  cogpu_detach(h);
}

TEST_IMPL(ledger_foreign_memory) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_FOREIGN_REFRESH", "100ms");
  th_write_file(th_path("procs"), "0 999999 6442450944\n"); /* 6 GiB */
  th_setenv("FAKE_NVML_PROCS", th_path("procs"));
  cogpu_t *h = lt_attach(0);
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].foreign_bytes, 6 * GiB);
  ASSERT_UEQ(st->gpus[0].capacity_bytes, 10 * GiB);
  cogpu_status_free(st);
  cogpu_request_t r = req(0, 12 * GiB, COGPU_NOWAIT);
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), -EAGAIN);
  /* Our own process is known, not foreign. */
  char line[64];
  snprintf(line, sizeof line, "0 %d 1073741824\n", (int)getpid());
  th_write_file(th_path("procs"), line);
  th_sleep_ms(150);
  st = lt_status();
  ASSERT_UEQ(st->gpus[0].foreign_bytes, 0);
  cogpu_status_free(st);
  /* A waiter is served when foreign memory goes away. */
  th_write_file(th_path("procs"), "0 999999 6442450944\n");
  th_sleep_ms(150);
  cogpu_status_free(lt_status());
  r.timeout_ms = th_ms(10000);
  pid_t p = lt_hold("w", 0, 12 * GiB, 0, th_ms(10000), 0);
  lt_wait_nwaiting(0, 1, 5000);
  th_write_file(th_path("procs"), "");
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), HOLD_OK);
  cogpu_detach(h);
}

/* Memory held outside cogpu that appears after a client attached (its
 * attach read NVML) is seen by that client's next grant: no grant rests
 * on a foreign figure older than foreign_refresh. Before, a reservation
 * was granted on the figure of the attach, and the driver then refused
 * memory the ledger had granted. */
TEST_IMPL(ledger_foreign_fresh_at_grant) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_FOREIGN_REFRESH", "1ms");
  th_write_file(th_path("procs"), "");
  th_setenv("FAKE_NVML_PROCS", th_path("procs"));
  cogpu_t *h = lt_attach(0);
  th_write_file(th_path("procs"), "0 999999 2G\n");
  th_sleep_ms(2); /* the scenario: the figure is older than the interval */
  cogpu_request_t r = req(0, 15 * GiB, COGPU_NOWAIT);
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), -EAGAIN);
  r.bytes = 14 * GiB;
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  ASSERT_OK(cogpu_release(h, 0, 14 * GiB));
  cogpu_detach(h);
}

TEST_IMPL(ledger_lookup) {
  th_setenv("FAKE_NVML_GPUS", "8G,8G");
  cogpu_t *h = lt_attach(0);
  int g = -1;
  ASSERT_OK(cogpu_gpu_lookup(h, "1", &g));
  ASSERT_EQ(g, 1);
  cogpu_status_t *st = lt_status();
  ASSERT_OK(cogpu_gpu_lookup(h, st->gpus[1].uuid, &g));
  ASSERT_EQ(g, 1);
  char prefix[40];
  snprintf(prefix, sizeof prefix, "%.*s", 36, st->gpus[0].uuid);
  ASSERT_OK(cogpu_gpu_lookup(h, st->gpus[0].uuid, &g));
  ASSERT_EQ(g, 0);
  ASSERT_EQ(cogpu_gpu_lookup(h, "GPU-fa4e", &g), -ENODEV); /* ambiguous */
  ASSERT_CONTAINS(cogpu_last_error(), "more than one");
  ASSERT_EQ(cogpu_gpu_lookup(h, "2", &g), -ENODEV);
  ASSERT_EQ(cogpu_gpu_lookup(h, "GPU-nope", &g), -ENODEV);
  ASSERT_EQ(cogpu_gpu_lookup(h, "", &g), -EINVAL);
  cogpu_status_free(st);
  cogpu_detach(h);
}

TEST_IMPL(ledger_bad_arguments) {
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = req(0, 1 * GiB, COGPU_NOWAIT);
  ASSERT_EQ(cogpu_reserve(NULL, &r, NULL), -EINVAL);
  ASSERT_EQ(cogpu_reserve(h, NULL, NULL), -EINVAL);
  r.gpu = 5;
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), -ENODEV);
  r.gpu = -2;
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), -ENODEV);
  r.gpu = 0;
  r.bytes = 0;
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), -EINVAL);
  r.bytes = 1;
  r.timeout_ms = -5;
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), -EINVAL);
  r.timeout_ms = 0;
  r.flags = 0x80;
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), -EINVAL);
  ASSERT_EQ(cogpu_release(h, 3, 1), -ENODEV);
  ASSERT_EQ(cogpu_release(h, 0, 1), -EINVAL);
  uint64_t b;
  ASSERT_EQ(cogpu_held(h, 0, NULL), -EINVAL);
  ASSERT_EQ(cogpu_held(NULL, 0, &b), -EINVAL);
  ASSERT_EQ(cogpu_attach(NULL, NULL), -EINVAL);
  ASSERT_EQ(cogpu_status(NULL, NULL), -EINVAL);
  ASSERT_EQ(cogpu_detach(NULL), -EINVAL);
  lt_check_invariants();
  cogpu_detach(h);
}

TEST_IMPL(ledger_no_nvml) {
  th_setenv("FAKE_NVML_FAIL", "init");
  cogpu_t *h = NULL;
  ASSERT_EQ(cogpu_attach(NULL, &h), COGPU_ENVML);
  ASSERT_CONTAINS(cogpu_last_error(), "nvmlInit");
  ASSERT(h == NULL);
}

TEST_IMPL(ledger_bad_config) {
  th_setenv("COGPU_POLICY", "lifo");
  cogpu_t *h = NULL;
  ASSERT_EQ(cogpu_attach(NULL, &h), COGPU_ECONFIG);
  ASSERT_CONTAINS(cogpu_last_error(), "COGPU_POLICY");
}

TEST_IMPL(ledger_fork_child_reattaches) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = req(0, 8 * GiB, COGPU_NOWAIT);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  pid_t pid = fork();
  if (pid == 0) {
    /* The parent's handle is not the child's. */
    if (cogpu_reserve(h, &r, NULL) != -EINVAL)
      _exit(1);
    cogpu_t *c;
    if (cogpu_attach(NULL, &c) != 0)
      _exit(2);
    r.bytes = 4 * GiB;
    if (cogpu_reserve(c, &r, NULL) != 0)
      _exit(3);
    _exit(0); /* implicit detach at exit */
  }
  ASSERT_EQ(th_exit_code(th_wait(pid, th_ms(5000))), 0);
  /* The child's exit released its own reservation, not ours. */
  uint64_t held;
  ASSERT_OK(cogpu_held(h, 0, &held));
  ASSERT_UEQ(held, 8 * GiB);
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 8 * GiB);
  cogpu_status_free(st);
  cogpu_detach(h);
}

/* Many threads of one process reserving and releasing at once. */
static cogpu_t *thr_h;
static int thr_rounds;
/* A thread's failure, said by the main thread: which call, its code and
 * message (cogpu_last_error is per thread). */
static char thr_err[8][320];
static void *thr_main(void *arg) {
  char *err = arg;
  for (int i = 0; i < thr_rounds; i++) {
    cogpu_request_t r = req(0, 1 * GiB, COGPU_WAIT_FOREVER);
    int rc = cogpu_reserve(thr_h, &r, NULL);
    if (rc == 0 && (rc = cogpu_release(thr_h, 0, 1 * GiB)) != 0)
      snprintf(err, sizeof thr_err[0], "round %d: release: %s: %s", i,
               cogpu_err_name(rc), cogpu_last_error());
    else if (rc)
      snprintf(err, sizeof thr_err[0], "round %d: reserve: %s: %s", i,
               cogpu_err_name(rc), cogpu_last_error());
    if (rc)
      return err;
  }
  return NULL;
}

/* A time limit of its own: under TSan on a loaded machine (load 8) the
 * 500 rounds passed 120 s. */
TEST_IMPL_T(ledger_threads, 60) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("FAKE_NVML_GPUS", "4G");
  thr_h = lt_attach(0);
  /* In node mode every call is a round trip, and half the threads wait
   * on connections of their own: fewer rounds exercise the same. So in the
   * sanitizer builds, where every lock and commit also checks the whole
   * ledger's invariants (16,384 slots) under instrumentation: 2,000 rounds
   * took 30 s under ASan and over 120 s under TSan on a loaded 2-core
   * machine, 500 still interleave the 8 threads thousands of times; under
   * TSan with both cores busy 500 passed 240 s, so 200 there. */
  thr_rounds = th_node_mode() || strstr(th_sanitizer_runtime(), "tsan") ? 200
               : th_sanitizer_runtime()[0]                              ? 500
                                                                        : 2000;
  pthread_t t[8];
  for (int i = 0; i < 8; i++)
    ASSERT_EQ(pthread_create(&t[i], NULL, thr_main, thr_err[i]), 0);
  const char *failed = NULL;
  for (int i = 0; i < 8; i++) {
    void *ret;
    pthread_join(t[i], &ret); /* all joined before failing: no thread leak */
    if (ret && !failed)
      failed = ret;
  }
  if (failed)
    th_fail(__FILE__, __LINE__, "a thread failed: %s", failed);
  uint64_t held;
  ASSERT_OK(cogpu_held(thr_h, 0, &held));
  ASSERT_UEQ(held, 0);
  lt_check_invariants();
  cogpu_detach(thr_h);
}

/* A thread that waits while another thread of its process holds memory
 * and runs (here: spins): the ledger sees one process, holding and
 * waiting; the guard must see the running thread, which may yet release,
 * and leave the wait alone, for a bounded time. */
static cogpu_t *rt_h;
static int rt_rc;
static uint64_t rt_waited_ms;
static char rt_err[256]; /* cogpu_last_error is per thread */
static atomic_int rt_done;
static void *rt_wait(void *arg) {
  (void)arg;
  uint64_t t0 = cogpu__now_ns();
  cogpu_request_t r = req(0, 2 * GiB, COGPU_WAIT_FOREVER);
  rt_rc = cogpu_reserve(rt_h, &r, NULL);
  snprintf(rt_err, sizeof rt_err, "%s", rt_rc ? cogpu_last_error() : "");
  rt_waited_ms = (cogpu__now_ns() - t0) / 1000000;
  atomic_store(&rt_done, 1);
  return NULL;
}

/* Spins (runnable all along) until the waiter returns or ms pass. */
static void rt_spin(uint64_t ms) {
  uint64_t end = cogpu__now_ns() + ms * 1000000;
  while (!atomic_load(&rt_done) && cogpu__now_ns() < end) {
  }
}

TEST_IMPL_T(ledger_runnable_thread_defers_guard, 60) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_SWEEP_INTERVAL", "200ms"); /* the guard's delay */
  th_setenv("FAKE_NVML_GPUS", "4G");
  rt_h = lt_attach(0);
  cogpu_request_t r = req(0, 3 * GiB, COGPU_NOWAIT);
  ASSERT_OK(cogpu_reserve(rt_h, &r, NULL));
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, rt_wait, NULL), 0);
  /* Seven guard delays of running while the other thread waits: before,
   * the guard refused the wait after one (EDEADLOCK). */
  rt_spin(1400);
  ASSERT_OK(cogpu_release(rt_h, 0, 3 * GiB));
  pthread_join(t, NULL);
  if (rt_rc)
    th_fail(__FILE__, __LINE__, "the waiter got %s after %llu ms: %s",
            cogpu_err_name(rt_rc), (unsigned long long)rt_waited_ms, rt_err);
  ASSERT_OK(cogpu_release(rt_h, 0, 2 * GiB));

  /* A thread that runs for ever does not keep a real deadlock standing:
   * the wait is refused once the bound has passed, not before. */
  ASSERT_OK(cogpu_reserve(rt_h, &r, NULL));
  atomic_store(&rt_done, 0);
  ASSERT_EQ(pthread_create(&t, NULL, rt_wait, NULL), 0);
  rt_spin(40000);
  pthread_join(t, NULL);
  ASSERT_EQ(rt_rc, COGPU_EDEADLOCK);
  ASSERT_GE(rt_waited_ms, LEDGER_GUARD_RUNNABLE_MS);
  ASSERT_OK(cogpu_release(rt_h, 0, 3 * GiB));
  lt_check_invariants();
  cogpu_detach(rt_h);
}

HELPER_IMPL(join_child) {
  (void)argc;
  cogpu_attach_opts_t o = {.join = argv[0], .command = "child"};
  cogpu_t *h;
  if (cogpu_attach(&o, &h) != 0) {
    fprintf(stderr, "join: %s\n", cogpu_last_error());
    return 2;
  }
  cogpu_request_t r = {.gpu = 0,
                       .bytes = 3 * GiB,
                       .timeout_ms = 0,
                       .priority = COGPU_PRIORITY_DEFAULT};
  if (cogpu_reserve(h, &r, NULL) != 0)
    return 3;
  return 0; /* exits holding it: the job keeps it */
}

HELPER_IMPL(claim_and_die) {
  (void)argc;
  cogpu_attach_opts_t o = {.join = argv[0], .command = "member"};
  cogpu_t *h;
  uint64_t got = 0;
  if (cogpu_attach(&o, &h) != 0 || cogpu__claim(h, 0, UINT64_MAX, &got) != 0 ||
      got != 4 * GiB)
    return 2;
  raise(SIGKILL); /* dies holding its claim */
  return 3;
}

/* A job's processes share its reservation: each takes (claims) what the
 * others have not, and what a process took returns to the job when it
 * detaches or dies. */
TEST_IMPL(ledger_job_claims) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_attach_opts_t o = {.command = "job"};
  cogpu_t *job, *a, *b;
  ASSERT_OK(cogpu_attach(&o, &job));
  cogpu_request_t r = req(0, 4 * GiB, 0);
  ASSERT_OK(cogpu_reserve(job, &r, NULL));
  char tok[32];
  ASSERT_OK(cogpu_job_token(job, tok, sizeof tok));
  uint64_t got = 1;
  ASSERT_OK(cogpu__claim(job, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, 0); /* the job's own process claims nothing */
  cogpu_attach_opts_t m = {.join = tok, .command = "member"};
  ASSERT_OK(cogpu_attach(&m, &a));
  ASSERT_OK(cogpu_attach(&m, &b));
  ASSERT_OK(cogpu__claim(a, 0, GiB, &got));
  ASSERT_UEQ(got, GiB);
  ASSERT_OK(cogpu__claim(b, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, 3 * GiB);
  ASSERT_OK(cogpu__claim(a, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, 0);
  ASSERT_EQ(cogpu__claim(a, 9, 1, &got), -ENODEV);
  /* Part of a claim given back goes to the job, for its other processes,
   * not to the node; no more than was claimed, and nothing for the job's
   * own process. */
  ASSERT_OK(cogpu__unclaim(b, 0, GiB));
  ASSERT_OK(cogpu__unclaim(job, 0, GiB));
  ASSERT_EQ(cogpu__unclaim(b, 9, 1), -ENODEV);
  ASSERT_UEQ(lt_reserved_by(0, "job"), 4 * GiB);
  ASSERT_OK(cogpu__claim(a, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, GiB);
  lt_check_invariants();
  /* What a process grows the job by is its own, not for others to claim;
   * what it releases leaves the job. */
  cogpu_t *c;
  cogpu_request_t more = req(0, 2 * GiB, 0);
  ASSERT_OK(cogpu_reserve(a, &more, NULL));
  ASSERT_OK(cogpu_attach(&m, &c));
  ASSERT_OK(cogpu__claim(c, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, 0);
  ASSERT_UEQ(lt_reserved_by(0, "job"), 6 * GiB);
  ASSERT_OK(cogpu_release(a, 0, 2 * GiB));
  ASSERT_OK(cogpu__claim(c, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, 0);
  ASSERT_UEQ(lt_reserved_by(0, "job"), 4 * GiB);
  cogpu_detach(c);
  ASSERT_OK(cogpu__unclaim(b, 0, 10 * GiB)); /* all of its 2G */
  ASSERT_OK(cogpu__claim(a, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, 2 * GiB);
  cogpu_detach(b);
  ASSERT_OK(cogpu__claim(a, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, 0);
  cogpu_detach(a);
  const char *args[] = {tok, NULL};
  int st = th_wait(th_spawn_helper("claim_and_die", args), th_ms(5000));
  ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  ASSERT_OK(cogpu_attach(&m, &a));
  ASSERT_OK(cogpu__claim(a, 0, UINT64_MAX, &got));
  ASSERT_UEQ(got, 4 * GiB);
  /* Claims move nothing between the job and the GPU. */
  ASSERT_UEQ(lt_reserved_by(0, "job"), 4 * GiB);
  lt_check_invariants();
  cogpu_detach(a);
  cogpu_detach(job);
}

TEST_IMPL(ledger_job_join) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_attach_opts_t o = {.command = "job"};
  cogpu_t *h;
  ASSERT_OK(cogpu_attach(&o, &h));
  cogpu_request_t r = req(0, 4 * GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  char tok[32];
  ASSERT_OK(cogpu_job_token(h, tok, sizeof tok));
  const char *args[] = {tok, NULL};
  ASSERT_EQ(
      th_exit_code(th_wait(th_spawn_helper("join_child", args), th_ms(5000))),
      0);
  /* The child's 3G are the job's: listed under it, and they outlive the
   * child. */
  ASSERT_UEQ(lt_reserved_by(0, "job"), 7 * GiB);
  ASSERT_UEQ(lt_reserved_by(0, "child"), 0);
  uint64_t held;
  ASSERT_OK(cogpu_held(h, 0, &held));
  ASSERT_UEQ(held, 7 * GiB);
  lt_check_invariants();
  /* Bad and stale tokens are refused. */
  cogpu_t *x = NULL;
  o.join = "banana";
  ASSERT_EQ(cogpu_attach(&o, &x), -EINVAL);
  o.join = "1023.77";
  ASSERT_EQ(cogpu_attach(&o, &x), -ESRCH);
  ASSERT_CONTAINS(cogpu_last_error(), "ended");
  ASSERT(x == NULL);
  cogpu_detach(h);
  /* The job ended: everything is back. */
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  cogpu_status_free(st);
}

/* The slot map against every slot: each active slot's bit is set (scans
 * walk the map, so a slot without its bit would be invisible to status,
 * sweeps and the invariants), and no other bit is. */
static void expect_slot_map(const ledger_state_t *st, uint32_t active) {
  uint32_t n = 0, marked = 0;
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++) {
    bool bit = atomic_load(&st->hdr.slot_map[s / 64]) >> (s % 64) & 1;
    if (st->slots[s].state == SLOT_ACTIVE) {
      ASSERT(bit);
      n++;
    }
    marked += bit;
  }
  ASSERT_EQ(n, active);
  ASSERT_EQ(marked, active);
}

/* Slots in use are walked through the header's slot map: attaching marks a
 * slot, detaching, a kill -9 reclaimed by a sweep, and a recount after the
 * map was wiped all leave it naming exactly the active slots. */
TEST_IMPL_SINGLE(ledger_slot_map) {
  cogpu_t *h = lt_attach(0);
  const ledger_state_t *st = cogpu__ledger_of(h)->st;
  cogpu_t *more[5];
  for (int i = 0; i < 5; i++)
    more[i] = lt_attach(0);
  pid_t other = lt_hold("other", 0, 64 * MiB, 0, COGPU_NOWAIT, -1);
  lt_wait_nclients(0, 1, th_ms(10000));
  expect_slot_map(st, 7);
  for (int i = 0; i < 3; i++)
    ASSERT_OK(cogpu_detach(more[i]));
  expect_slot_map(st, 4);
  kill(other, SIGKILL);
  ASSERT_EQ(th_exit_code(th_wait(other, th_ms(10000))), 128 + SIGKILL);
  cogpu_status_t *s = lt_status(); /* its sweep reclaims the dead one */
  ASSERT_EQ(s->gpus[0].nclients, 0);
  cogpu_status_free(s);
  expect_slot_map(st, 3);
  /* Wiped (a bug, a process writing the state): the counters no longer add
   * up over the map, and the recount that follows rebuilds it. */
  struct cogpu_s *lh = cogpu__ledger_of(h);
  cogpu__ledger_lock(lh);
  for (uint32_t w = 0; w < LEDGER_MAX_SLOTS / 64; w++)
    atomic_store(&lh->st->hdr.slot_map[w], 0);
  lh->st->hdr.gpus[0].reserved = 16 * GiB;
  cogpu__ledger_unlock(lh);
  cogpu_request_t r = req(0, 8 * GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  expect_slot_map(st, 3);
  ASSERT_OK(cogpu_release(h, 0, COGPU_ALL));
  for (int i = 3; i < 5; i++)
    ASSERT_OK(cogpu_detach(more[i]));
  expect_slot_map(st, 1);
  ASSERT_OK(cogpu_detach(h));
}
