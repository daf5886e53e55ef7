/*
 * test-kill.c: processes dying anywhere (holding the lock, in the middle of
 * a transaction, while waiting, just after a grant, at random) never block
 * anyone and never leak memory: the ledger stays consistent and usable.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "internal.h"
#include "ledger-helpers.h"

static cogpu_request_t req(int gpu, uint64_t bytes, int64_t timeout_ms) {
  return (cogpu_request_t){.gpu = gpu,
                           .bytes = bytes,
                           .priority = COGPU_PRIORITY_DEFAULT,
                           .timeout_ms = timeout_ms};
}

static pid_t hold_with_fault(const char *fault, const char *name, int gpu,
                             uint64_t bytes, int hold_ms) {
  setenv("COGPU_FAULT", fault, 1);
  pid_t p = lt_hold(name, gpu, bytes, 0, COGPU_WAIT_FOREVER, hold_ms);
  unsetenv("COGPU_FAULT");
  return p;
}

static void expect_killed(pid_t p) {
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 128 + SIGKILL);
}

/* After a death, a full-capacity reservation must succeed promptly: the
 * lock is free and nothing leaked. */
static void expect_all_free(void) {
  cogpu_t *h = lt_attach(0);
  cogpu_status_t *st = lt_status();
  cogpu_request_t r = req(0, st->gpus[0].capacity_bytes, th_ms(5000));
  cogpu_status_free(st);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  lt_check_invariants();
  cogpu_detach(h);
}

TEST_IMPL_SINGLE(fault_dies_holding_lock) {
  pid_t p = hold_with_fault("lock_held", "victim", 0, 1 * GiB, 0);
  expect_killed(p);
  expect_all_free();
}

TEST_IMPL_SINGLE(fault_dies_before_unlock) {
  pid_t p = hold_with_fault("before_unlock:2", "victim", 0, 4 * GiB, 0);
  expect_killed(p);
  expect_all_free();
}

TEST_IMPL_SINGLE(fault_dies_mid_transaction) {
  /* Pass 2 of tx_middle is the reservation's first store: the process dies
   * with its slot's bytes written and the GPU's total not. */
  pid_t p = hold_with_fault("tx_middle:2", "victim", 0, 4 * GiB, 0);
  expect_killed(p);
  expect_all_free();
}

TEST_IMPL_SINGLE(fault_dies_mid_grant_to_live_waiter) {
  th_setenv("COGPU_MARGIN", "0");
  /* The releaser: attach (store 1), reserve 12G (store 2), release 4G
   * (store 3), then serving the waiter starts a transaction: dies after its
   * first store, the waiter's bytes written, the rest not. */
  setenv("COGPU_FAULT", "tx_middle:4", 1);
  pid_t rel = th_spawn_helper("grant_victim", NULL);
  unsetenv("COGPU_FAULT");
  lt_wait_nclients(0, 1, 5000);
  pid_t w = lt_hold("waiter", 0, 8 * GiB, 0, COGPU_WAIT_FOREVER, -1);
  lt_wait_nwaiting(0, 1, 5000);
  ASSERT_OK(kill(rel, SIGUSR1)); /* go: release 4G */
  expect_killed(rel);
  /* The half-done grant is rolled back and redone once: exactly 8G. */
  for (int i = 0; i < th_ms(5000) / 10 && lt_reserved_by(0, "waiter") == 0; i++)
    th_sleep_ms(10);
  ASSERT_UEQ(lt_reserved_by(0, "waiter"), 8 * GiB);
  lt_check_invariants();
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 8 * GiB);
  cogpu_status_free(st);
  kill(w, SIGKILL);
  th_wait(w, th_ms(5000));
}

static volatile sig_atomic_t go;
static void on_usr1(int sig) {
  (void)sig;
  go = 1;
}

HELPER_IMPL(grant_victim) {
  (void)argc;
  (void)argv;
  signal(SIGUSR1, on_usr1);
  cogpu_attach_opts_t o = {.command = "releaser"};
  cogpu_t *h;
  if (cogpu_attach(&o, &h) != 0)
    return 2;
  cogpu_request_t r = req(0, 12 * GiB, 0);
  if (cogpu_reserve(h, &r, NULL) != 0)
    return 3;
  for (int i = 0; i < 1000 && !go; i++)
    th_sleep_ms(10);
  cogpu_release(h, 0, 4 * GiB);
  return 4; /* should have died */
}

TEST_IMPL_SINGLE(fault_waiter_dies) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = req(0, 16 * GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  pid_t w1 = lt_hold("w1", 0, 12 * GiB, 0, COGPU_WAIT_FOREVER, -1);
  lt_wait_nwaiting(0, 1, 5000);
  pid_t w2 = lt_hold("w2", 0, 4 * GiB, 0, COGPU_WAIT_FOREVER, -1);
  lt_wait_nwaiting(0, 2, 5000);
  ASSERT_OK(cogpu_release(h, 0, 4 * GiB));
  ASSERT_UEQ(lt_reserved_by(0, "w2"), 0); /* fifo: behind w1 */
  kill(w1, SIGKILL);
  th_wait(w1, th_ms(5000));
  /* w2's housekeeping tick reclaims the dead head and serves w2. */
  for (int i = 0; i < th_ms(3000) / 10 && lt_reserved_by(0, "w2") == 0; i++)
    th_sleep_ms(10);
  ASSERT_UEQ(lt_reserved_by(0, "w2"), 4 * GiB);
  ASSERT_EQ(lt_nwaiting(0), 0);
  lt_check_invariants();
  kill(w2, SIGKILL);
  th_wait(w2, th_ms(5000));
  cogpu_detach(h);
}

TEST_IMPL_SINGLE(fault_dies_while_waiting_and_after_grant) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = req(0, 12 * GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  pid_t a = hold_with_fault("waiting", "a", 0, 8 * GiB, 0);
  expect_killed(a);
  /* a's entry is gone before b asks: otherwise the wait below could see
   * a's and release before b has queued (b is then granted at once, and
   * never passes the fault point). */
  lt_wait_nwaiting(0, 0, 5000);
  pid_t b = hold_with_fault("granted", "b", 0, 8 * GiB, 0);
  lt_wait_nwaiting(0, 1, 5000);
  ASSERT_OK(cogpu_release(h, 0, COGPU_ALL));
  expect_killed(b);
  cogpu_detach(h);
  expect_all_free();
}

/* The chaos loop: workers reserve, hold and release at random; the test
 * SIGKILLs random ones and starts new ones, some of them set to die at a
 * fault point. Afterwards the ledger must be empty and fully usable. */
HELPER_IMPL(chaos_worker) {
  (void)argc;
  (void)argv;
  srand((unsigned)getpid());
  cogpu_t *h;
  if (cogpu_attach(NULL, &h) != 0)
    return 2;
  for (;;) {
    int gpu;
    uint64_t bytes = (uint64_t)(1 + rand() % 8) * GiB;
    cogpu_request_t r = req(rand() % 3 == 0 ? COGPU_GPU_AUTO : rand() % 2,
                            bytes, rand() % 4 == 0 ? 0 : 200 + rand() % 800);
    r.priority = rand() % 3;
    if (cogpu_reserve(h, &r, &gpu) == 0) {
      th_sleep_ms(rand() % 20);
      cogpu_release(h, gpu, rand() % 2 ? bytes : COGPU_ALL);
    }
  }
}

static const char *chaos_faults[] = {"lock_held", "tx_middle", "before_unlock",
                                     "waiting", "granted"};

static pid_t chaos_spawn(void) {
  char f[64];
  if (rand() % 2) {
    snprintf(f, sizeof f, "%s:%d", chaos_faults[rand() % 5], 1 + rand() % 20);
    setenv("COGPU_FAULT", f, 1);
  }
  pid_t p = th_spawn_helper("chaos_worker", NULL);
  unsetenv("COGPU_FAULT");
  return p;
}

static void chaos(const char *policy) {
  enum { N = 16 };
  th_setenv("FAKE_NVML_GPUS", "16G,12G");
  th_setenv("COGPU_POLICY", policy);
  th_setenv("COGPU_SWEEP_INTERVAL", "200ms");
  srand((unsigned)time(NULL));
  pid_t pids[N];
  for (int i = 0; i < N; i++)
    pids[i] = chaos_spawn();
  for (int round = 0; round < 40; round++) {
    th_sleep_ms(50);
    int k = rand() % N;
    kill(pids[k], SIGKILL);
    for (int i = 0; i < N; i++) {
      int st;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i])
        pids[i] = chaos_spawn();
    }
    if (round % 10 == 0) {
      /* The ledger stays live and consistent throughout. */
      cogpu_status_t *s = lt_status();
      for (size_t g = 0; g < s->ngpus; g++) {
        uint64_t sum = 0;
        for (size_t c = 0; c < s->gpus[g].nclients; c++)
          sum += s->gpus[g].clients[c].reserved_bytes;
        ASSERT_UEQ(sum, s->gpus[g].reserved_bytes);
        ASSERT_ULE(s->gpus[g].reserved_bytes, s->gpus[g].capacity_bytes);
      }
      cogpu_status_free(s);
    }
  }
  for (int i = 0; i < N; i++) {
    kill(pids[i], SIGKILL);
    waitpid(pids[i], NULL, 0);
  }
  cogpu_status_t *s = lt_status();
  for (size_t g = 0; g < s->ngpus; g++) {
    ASSERT_UEQ(s->gpus[g].reserved_bytes, 0);
    ASSERT_EQ(s->gpus[g].nclients, 0);
    ASSERT_EQ(s->gpus[g].nwaiting, 0);
  }
  cogpu_status_free(s);
  expect_all_free();
}

TEST_IMPL_SINGLE_T(fault_chaos_fifo, 120) {
  chaos("fifo");
}
TEST_IMPL_SINGLE_T(fault_chaos_priority_mmu, 120) {
  chaos("priority-mmu");
}

/* A process of a job: claims its share, grows the job, gives part back. */
HELPER_IMPL(job_member) {
  (void)argc;
  cogpu_attach_opts_t o = {.join = argv[0], .command = "member"};
  cogpu_t *h;
  uint64_t got;
  cogpu_request_t r = {.gpu = 0,
                       .bytes = GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = 0};
  if (cogpu_attach(&o, &h) || cogpu__claim(h, 0, UINT64_MAX, &got) ||
      cogpu_reserve(h, &r, NULL) || cogpu_release(h, 0, GiB / 2))
    return 2;
  return 0;
}

/* Wherever a job's process dies in its transactions, what it claimed of
 * the job's reservation returns to the job: the next process claims all
 * the job holds. */
TEST_IMPL_SINGLE(fault_job_member_dies_anywhere) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_attach_opts_t o = {.command = "job"};
  cogpu_t *job;
  ASSERT_OK(cogpu_attach(&o, &job));
  cogpu_request_t r = {.gpu = 0,
                       .bytes = 4 * GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = 0};
  ASSERT_OK(cogpu_reserve(job, &r, NULL));
  char tok[32], fault[32];
  ASSERT_OK(cogpu_job_token(job, tok, sizeof tok));
  const char *args[] = {tok, NULL};
  int killed = 0;
  for (int n = 1; n <= 40; n++) {
    snprintf(fault, sizeof fault, "tx_middle:%d", n);
    setenv("COGPU_FAULT", fault, 1);
    int st = th_wait(th_spawn_helper("job_member", args), th_ms(10000));
    unsetenv("COGPU_FAULT");
    bool died = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    ASSERT(died || (WIFEXITED(st) && WEXITSTATUS(st) == 0));
    killed += died;
    cogpu_attach_opts_t m = {.join = tok, .command = "next"};
    cogpu_t *next;
    uint64_t held, got;
    ASSERT_OK(cogpu_attach(&m, &next));
    ASSERT_OK(cogpu__claim(next, 0, UINT64_MAX, &got));
    ASSERT_OK(cogpu_held(job, 0, &held));
    ASSERT_UEQ(got, held);
    ASSERT_OK(cogpu_detach(next));
    lt_check_invariants();
    if (!died)
      break; /* past the member's last transaction */
  }
  ASSERT_GT(killed, 3);
  cogpu_detach(job);
}

/* N handles of one process (each its own liveness lock), 1 MiB each, held
 * until killed (at most 60 s). */
HELPER_IMPL(many_handles) {
  int n = argc > 0 ? atoi(argv[0]) : 0;
  for (int i = 0; i < n; i++) {
    char cmd[32];
    snprintf(cmd, sizeof cmd, "many-%d", i);
    cogpu_attach_opts_t o = {.command = cmd};
    cogpu_t *h;
    cogpu_request_t r = req(0, MiB, COGPU_NOWAIT);
    if (cogpu_attach(&o, &h) != 0 || cogpu_reserve(h, &r, NULL) != 0) {
      fprintf(stderr, "handle %d: %s\n", i, cogpu_last_error());
      return 1;
    }
  }
  th_sleep_ms(60000);
  return 0;
}

/* Liveness with many clients (from 64 on, status reads the held liveness
 * locks from /proc/locks in one pass, and probes alone only the slots not
 * listed there): a client killed among 100 live ones is reclaimed by the
 * next status, and none of the live ones is; when they all die, the next
 * sweeps reclaim them all (64 a sweep). */
TEST_IMPL_SINGLE(fault_liveness_many_clients) {
  pid_t many =
      th_spawn_helper("many_handles", (const char *const[]){"100", NULL});
  lt_wait_nclients(0, 100, th_ms(20000));
  pid_t dead = lt_hold("victim", 0, 64 * MiB, 0, COGPU_NOWAIT, -1);
  lt_wait_nclients(0, 101, th_ms(10000));
  kill(dead, SIGKILL);
  expect_killed(dead);
  cogpu_status_t *st = lt_status();
  ASSERT_EQ(st->gpus[0].nclients, 100);
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 100 * MiB);
  for (size_t i = 0; i < st->gpus[0].nclients; i++)
    ASSERT(strncmp(st->gpus[0].clients[i].command, "many-", 5) == 0);
  cogpu_status_free(st);
  lt_check_invariants();
  kill(many, SIGKILL);
  expect_killed(many);
  size_t left = 100;
  for (int i = 0; i < 3 && left; i++) {
    st = lt_status();
    left = st->gpus[0].nclients;
    cogpu_status_free(st);
  }
  ASSERT_EQ(left, 0);
  st = lt_status();
  ASSERT_EQ(st->gpus[0].nclients, 0);
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  cogpu_status_free(st);
  expect_all_free();
}
