/*
 * test-policy.c: the order of service of each waiting policy, made
 * deterministic: the test holds the GPU, queues waiters one by one, and
 * releases in steps; grants happen inside the release, so the state right
 * after it shows exactly whom the policy served.
 */
#include <signal.h>
#include <stdlib.h>

#include "ledger-helpers.h"

typedef struct {
  const char *name;
  uint64_t bytes;
  int prio;
  pid_t pid;
} waiter_t;

/* Hold all 16 GiB, then queue the waiters in order. */
static cogpu_t *setup(const char *policy, waiter_t *w, size_t n) {
  th_setenv("COGPU_POLICY", policy);
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = {.gpu = 0,
                       .bytes = 16 * GiB,
                       .timeout_ms = 0,
                       .priority = COGPU_PRIORITY_DEFAULT};
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  for (size_t i = 0; i < n; i++) {
    w[i].pid =
        lt_hold(w[i].name, 0, w[i].bytes, w[i].prio, COGPU_WAIT_FOREVER, -1);
    lt_wait_nwaiting(0, i + 1, 5000);
  }
  return h;
}

static void teardown(cogpu_t *h, waiter_t *w, size_t n) {
  lt_check_invariants();
  for (size_t i = 0; i < n; i++) {
    kill(w[i].pid, SIGKILL);
    th_wait(w[i].pid, th_ms(5000));
  }
  cogpu_detach(h);
}

/* "1" if the waiter holds its bytes, "0" if not, for each waiter. */
static void expect_served(waiter_t *w, size_t n, const char *want) {
  char got[16] = {0};
  for (size_t i = 0; i < n; i++)
    got[i] = lt_reserved_by(0, w[i].name) == w[i].bytes ? '1' : '0';
  ASSERT_STREQ(got, want);
}

/* Queue 12G, 8G and 4G with the given priorities; release 8G, then the
 * rest, checking whom the policy served after each step. */
static void scenario(const char *policy, const int prio[3],
                     const char *after_first, const char *after_all) {
  waiter_t w[] = {{"w12", 12 * GiB, prio[0], 0},
                  {"w8", 8 * GiB, prio[1], 0},
                  {"w4", 4 * GiB, prio[2], 0}};
  cogpu_t *h = setup(policy, w, 3);
  ASSERT_OK(cogpu_release(h, 0, 8 * GiB));
  expect_served(w, 3, after_first);
  ASSERT_OK(cogpu_release(h, 0, COGPU_ALL));
  expect_served(w, 3, after_all);
  teardown(h, w, 3);
}

static const int same_prio[3] = {0, 0, 0};
static const int rising_prio[3] = {0, 1, 5};

TEST_IMPL(policy_fifo_order) {
  /* The 12G head does not fit in 8G: everyone behind it waits. Then the
   * head is served, and the 8G behind it does not fit: the 4G waits too. */
  scenario("fifo", same_prio, "000", "100");
}

TEST_IMPL(policy_mmu_order) {
  /* First fit: the 8G is served at once; then 12G does not fit beside it,
   * the 4G does. */
  scenario("mmu", same_prio, "010", "011");
}

TEST_IMPL(policy_priority_fifo_order) {
  /* Order w4 (p5), w8 (p1), w12 (p0): 4G, then the 8G does not fit in the
   * 4G left and blocks. With all memory back: 8G fits, 12G does not. */
  scenario("priority-fifo", rising_prio, "001", "011");
}

TEST_IMPL(policy_priority_mmu_order) {
  /* Same first step (nothing else fits in the 4G left); with all memory
   * back, the 8G fits and nothing else does. */
  scenario("priority-mmu", rising_prio, "001", "011");
}

/* A high-priority large request ahead of a small low-priority one. */
static void head_scenario(const char *policy, const char *after_first) {
  waiter_t w[] = {{"lo4", 4 * GiB, 0, 0}, {"hi12", 12 * GiB, 9, 0}};
  cogpu_t *h = setup(policy, w, 2);
  ASSERT_OK(cogpu_release(h, 0, 8 * GiB));
  expect_served(w, 2, after_first);
  ASSERT_OK(cogpu_release(h, 0, COGPU_ALL));
  expect_served(w, 2, "11");
  teardown(h, w, 2);
}

TEST_IMPL(policy_priority_fifo_head_blocks) {
  /* The high-priority head does not fit: the small one waits behind it. */
  head_scenario("priority-fifo", "00");
}

TEST_IMPL(policy_priority_mmu_head_passed) {
  /* First fit: the small one is served past the head. */
  head_scenario("priority-mmu", "10");
}

TEST_IMPL(policy_mmu_starvation_guard) {
  /* Past mmu_max_age the oldest waiter is served first: memory is held
   * back for it instead of going to a smaller, younger request. */
  th_setenv("COGPU_MMU_MAX_AGE", "300ms");
  waiter_t w[] = {{"old12", 12 * GiB, 0, 0}, {"young4", 4 * GiB, 0, 0}};
  cogpu_t *h = setup("mmu", w, 2);
  th_sleep_ms(400);
  ASSERT_OK(cogpu_release(h, 0, 4 * GiB));
  expect_served(w, 2, "00");
  ASSERT_OK(cogpu_release(h, 0, COGPU_ALL));
  expect_served(w, 2, "11");
  teardown(h, w, 2);
}

TEST_IMPL(policy_mmu_huge_age_is_no_guard) {
  /* 18446744073710 ms is 2^64 ns plus 448384 ns: unsaturated, the guard age
   * wrapped to under a millisecond and the old request held memory back. A
   * guard age of centuries behaves as inf does. */
  th_setenv("COGPU_MMU_MAX_AGE", "18446744073710ms");
  waiter_t w[] = {{"old12", 12 * GiB, 0, 0}, {"young4", 4 * GiB, 0, 0}};
  cogpu_t *h = setup("mmu", w, 2);
  th_sleep_ms(50);
  ASSERT_OK(cogpu_release(h, 0, 4 * GiB));
  expect_served(w, 2, "01");
  teardown(h, w, 2);
}

TEST_IMPL(policy_mmu_without_guard_serves_small) {
  /* The control: with a long guard age the small request goes first. */
  th_setenv("COGPU_MMU_MAX_AGE", "1h");
  waiter_t w[] = {{"old12", 12 * GiB, 0, 0}, {"young4", 4 * GiB, 0, 0}};
  cogpu_t *h = setup("mmu", w, 2);
  ASSERT_OK(cogpu_release(h, 0, 4 * GiB));
  expect_served(w, 2, "01");
  teardown(h, w, 2);
}

TEST_IMPL(policy_status_positions) {
  waiter_t w[] = {
      {"a", 12 * GiB, 0, 0}, {"b", 8 * GiB, 3, 0}, {"c", 4 * GiB, 1, 0}};
  cogpu_t *h = setup("priority-fifo", w, 3);
  cogpu_status_t *st = lt_status();
  ASSERT_STREQ(st->policy, "priority-fifo");
  ASSERT_EQ(st->gpus[0].nwaiting, 3);
  const char *order[] = {"b", "c", "a"};
  for (int i = 0; i < 3; i++) {
    ASSERT_STREQ(st->gpus[0].waiting[i].command, order[i]);
    ASSERT_EQ(st->gpus[0].waiting[i].position, i + 1);
    ASSERT(st->gpus[0].waiting[i].waiting_seconds >= 0);
  }
  ASSERT_UEQ(st->gpus[0].waiting[0].requested_bytes, 8 * GiB);
  ASSERT_EQ(st->gpus[0].waiting[0].priority, 3);
  cogpu_status_free(st);
  teardown(h, w, 3);
}

TEST_IMPL(policy_fifo_queues_are_per_gpu) {
  /* A blocked head on GPU 1 does not hold up requests for GPU 0. */
  th_setenv("FAKE_NVML_GPUS", "16G,16G");
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = {.gpu = 1,
                       .bytes = 16 * GiB,
                       .timeout_ms = 0,
                       .priority = COGPU_PRIORITY_DEFAULT};
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  pid_t p = lt_hold("blocked", 1, 8 * GiB, 0, COGPU_WAIT_FOREVER, -1);
  lt_wait_nwaiting(1, 1, 5000);
  r.gpu = 0;
  r.bytes = 8 * GiB;
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  /* Auto avoids the full GPU too. */
  r.gpu = COGPU_GPU_AUTO;
  int g = -1;
  ASSERT_OK(cogpu_reserve(h, &r, &g));
  ASSERT_EQ(g, 0);
  ASSERT_EQ(lt_nwaiting(1), 1);
  lt_check_invariants();
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  cogpu_detach(h);
}

TEST_IMPL(policy_deadlock_guard) {
  /* Two jobs each hold 8G of 16G and each waits for 4G more: nobody can
   * proceed. The guard fails the lower-priority one (then the newer). */
  th_setenv("COGPU_MARGIN", "0");
  pid_t a = th_spawn_helper("grab_then_grow", (const char *[]){"a", "5", NULL});
  lt_wait_nclients(0, 1, 5000);
  pid_t b = th_spawn_helper("grab_then_grow", (const char *[]){"b", "1", NULL});
  /* b is refused (exit 3); a then gets its 4G from b's release. */
  ASSERT_EQ(th_exit_code(th_wait(b, th_ms(10000))), 3);
  ASSERT_EQ(th_exit_code(th_wait(a, th_ms(10000))), 0);
}

HELPER_IMPL(grab_then_grow) {
  (void)argc;
  cogpu_attach_opts_t o = {.command = argv[0], .priority = atoi(argv[1])};
  cogpu_t *h;
  if (cogpu_attach(&o, &h))
    return 1;
  cogpu_request_t r = {.gpu = 0,
                       .bytes = 8 * GiB,
                       .timeout_ms = 0,
                       .priority = COGPU_PRIORITY_DEFAULT};
  if (cogpu_reserve(h, &r, NULL))
    return 2;
  /* Wait until both hold their 8G, so the second request deadlocks. */
  for (int i = 0;
       i < 500 && lt_reserved_by(0, "a") + lt_reserved_by(0, "b") < 16 * GiB;
       i++)
    th_sleep_ms(10);
  r.bytes = 4 * GiB;
  r.timeout_ms = 20000;
  int rc = cogpu_reserve(h, &r, NULL);
  if (rc == COGPU_EDEADLOCK) {
    if (!strstr(cogpu_last_error(), "deadlock"))
      return 4;
    cogpu_release(h, 0, COGPU_ALL);
    return 3;
  }
  return rc == 0 ? 0 : 5;
}
