/*
 * test-core.c: the node's decision core (src/ledger/core.c) on a node held
 * in plain memory, as the cluster simulator holds one: the fit and its
 * rules, booking and its inverse, the service order of each policy, the
 * service pass (fifo blocking, mmu first fit, the starvation guard, "any
 * GPU" placement, entries dropped and skipped) and the guard's victim
 * order. The ledger's own tests (test-ledger.c, test-policy.c) check the
 * same decisions on the shared state.
 */
#include "internal.h"
#include "ledger/core.h"
#include "task.h"

#define GiB (1024ull * 1024 * 1024)
#define MAXE 64

/* A node in plain memory. */
typedef struct node_s {
  cogpu__core_rules_t rules;
  uint32_t ngpus;
  cogpu__core_gpu_t gpu[4];
  cogpu__core_entry_t e[MAXE];
  uint64_t bytes[MAXE];
  int kind[MAXE];
  int64_t served_on[MAXE]; /* -1 not served */
  int dropped[MAXE];
  uint32_t serve_log[MAXE];
  size_t nserved;
} node_t;

static void n_entry(void *ctx, uint32_t id, cogpu__core_entry_t *out) {
  *out = ((node_t *)ctx)->e[id];
}
static int n_kind(void *ctx, uint32_t id) {
  node_t *n = ctx;
  return n->served_on[id] >= 0 ? COGPU_CORE_SKIP : n->kind[id];
}
static uint64_t n_free(void *ctx, uint32_t g) {
  return cogpu__core_free(&((node_t *)ctx)->gpu[g]);
}
static bool n_fits(void *ctx, uint32_t id, uint32_t g) {
  node_t *n = ctx;
  return cogpu__core_fits(&n->rules, &n->gpu[g], id + 1, 0, n->bytes[id],
                          false);
}
static bool n_could_fit(void *ctx, uint32_t id, uint32_t g) {
  node_t *n = ctx;
  return n->bytes[id] <= n->gpu[g].capacity;
}
static void n_serve(void *ctx, uint32_t id, uint32_t g) {
  node_t *n = ctx;
  n->gpu[g] = cogpu__core_granted(&n->gpu[g], id + 1, 0, n->bytes[id], false);
  n->served_on[id] = g;
  n->serve_log[n->nserved++] = id;
}
static void n_drop(void *ctx, uint32_t id) {
  ((node_t *)ctx)->dropped[id]++;
}

static const cogpu__core_ops_t n_ops = {.entry = n_entry,
                                        .kind = n_kind,
                                        .free = n_free,
                                        .fits = n_fits,
                                        .could_fit = n_could_fit,
                                        .serve = n_serve,
                                        .drop = n_drop};

static void node_init(node_t *n, uint32_t policy, uint32_t ngpus,
                      uint64_t cap) {
  memset(n, 0, sizeof *n);
  n->rules.policy = policy;
  n->rules.mmu_max_age_ns = UINT64_MAX;
  n->ngpus = ngpus;
  for (uint32_t g = 0; g < ngpus; g++)
    n->gpu[g].capacity = cap;
  for (int i = 0; i < MAXE; i++)
    n->served_on[i] = -1;
}

/* Entry id asks for bytes on gpu, arriving at `t` with ticket id. */
static void node_ask(node_t *n, uint32_t id, int64_t gpu, uint64_t bytes,
                     int64_t prio, uint64_t t) {
  n->e[id] = (cogpu__core_entry_t){
      .gpu = gpu, .priority = prio, .ticket = id, .since_ns = t};
  n->bytes[id] = bytes;
  n->kind[id] = COGPU_CORE_REQUEST;
}

/* A pass over entries [0, k) at time now. */
static void node_pass(node_t *n, uint32_t k, uint64_t now) {
  uint32_t ids[MAXE];
  size_t m = 0;
  for (uint32_t i = 0; i < k; i++)
    if (n->served_on[i] < 0)
      ids[m++] = i;
  cogpu__core_order(&n->rules, ids, m, &n_ops, n);
  cogpu__core_serve(&n->rules, now, n->ngpus, ids, m, &n_ops, n);
}

TEST_IMPL(core_fit_rules) {
  cogpu__core_rules_t r = {.policy = COGPU_POLICY_FIFO, .max_clients = 2};
  cogpu__core_gpu_t g = {.capacity = 10 * GiB};
  ASSERT(cogpu__core_fits(&r, &g, 1, 0, 10 * GiB, false));
  ASSERT(!cogpu__core_fits(&r, &g, 1, 0, 10 * GiB + 1, false));
  g = cogpu__core_granted(&g, 1, 0, 4 * GiB, false);
  ASSERT_EQ(g.reserved, 4 * GiB);
  ASSERT_EQ(g.nclients, 1);
  /* A second grant to the same holder is not a new client. */
  g = cogpu__core_granted(&g, 1, 4 * GiB, 1 * GiB, false);
  ASSERT_EQ(g.nclients, 1);
  /* Exclusive use needs the GPU to oneself: holder 1 may, 2 may not. */
  ASSERT(cogpu__core_fits(&r, &g, 1, 5 * GiB, 0, true));
  ASSERT(!cogpu__core_fits(&r, &g, 2, 0, 0, true));
  g = cogpu__core_granted(&g, 2, 0, 1 * GiB, false);
  ASSERT_EQ(g.nclients, 2);
  /* max_clients: a third holder is refused, an existing one may grow. */
  ASSERT(!cogpu__core_fits(&r, &g, 3, 0, 1, false));
  ASSERT(cogpu__core_fits(&r, &g, 2, 1 * GiB, 1, false));
  /* Giving everything back ends being a client. */
  g = cogpu__core_released(&g, 2, 1 * GiB, 1 * GiB, false);
  ASSERT_EQ(g.nclients, 1);
  ASSERT_EQ(g.reserved, 5 * GiB);
  /* Exclusive: nobody else fits beside it, and it counts as a client. */
  cogpu__core_gpu_t e = {.capacity = 10 * GiB};
  e = cogpu__core_granted(&e, 7, 0, 0, true);
  ASSERT_EQ(e.excl, 7);
  ASSERT_EQ(e.nclients, 1);
  ASSERT(!cogpu__core_fits(&r, &e, 8, 0, 1, false));
  ASSERT(cogpu__core_fits(&r, &e, 7, 0, 1, false));
  e = cogpu__core_released(&e, 7, 0, 0, true);
  ASSERT_EQ(e.excl, 0);
  ASSERT_EQ(e.nclients, 0);
  /* Releasing more than held gives back what is held, no wrap. */
  cogpu__core_gpu_t w = {.capacity = 10 * GiB};
  w = cogpu__core_granted(&w, 1, 0, 2 * GiB, false);
  w = cogpu__core_released(&w, 1, 2 * GiB, 5 * GiB, false);
  ASSERT_EQ(w.reserved, 0);
  ASSERT_EQ(w.nclients, 0);
  ASSERT_EQ(cogpu__core_capacity(10, 3, 4), 3);
  ASSERT_EQ(cogpu__core_capacity(10, 8, 4), 0);
}

static int ref_cmp_prio(const void *a, const void *b, void *ctx) {
  const node_t *n = ctx;
  const cogpu__core_entry_t *x = &n->e[*(const uint32_t *)a],
                            *y = &n->e[*(const uint32_t *)b];
  if (x->priority != y->priority)
    return x->priority > y->priority ? -1 : 1;
  return x->ticket < y->ticket ? -1 : x->ticket > y->ticket;
}

TEST_IMPL(core_order_matches_reference) {
  static node_t n;
  unsigned seed = 12345;
  for (int round = 0; round < 200; round++) {
    node_init(&n, COGPU_POLICY_PRIO_FIFO, 1, GiB);
    uint32_t ids[MAXE], ref[MAXE];
    uint32_t k = 1 + (uint32_t)(rand_r(&seed) % MAXE);
    for (uint32_t i = 0; i < k; i++) {
      n.e[i].priority = rand_r(&seed) % 4;
      n.e[i].ticket = (uint64_t)(rand_r(&seed) % 1000) * MAXE + i;
      ids[i] = ref[i] = i;
    }
    cogpu__core_order(&n.rules, ids, k, &n_ops, &n);
    qsort_r(ref, k, sizeof ref[0], ref_cmp_prio, &n);
    for (uint32_t i = 0; i < k; i++)
      ASSERT_EQ(ids[i], ref[i]);
  }
  /* fifo ignores priority. */
  node_init(&n, COGPU_POLICY_FIFO, 1, GiB);
  node_ask(&n, 0, 0, 1, 0, 0);
  node_ask(&n, 1, 0, 1, 100, 0);
  uint32_t two[2] = {1, 0};
  cogpu__core_order(&n.rules, two, 2, &n_ops, &n);
  ASSERT_EQ(two[0], 0);
}

TEST_IMPL(core_serve_fifo_blocks_mmu_fills) {
  static node_t n;
  /* 10 GiB GPU holding 6; queue: 8 GiB (cannot fit), then 2 GiB (fits). */
  for (int pol = 0; pol < 2; pol++) {
    node_init(&n, pol ? COGPU_POLICY_MMU : COGPU_POLICY_FIFO, 1, 10 * GiB);
    n.gpu[0] = cogpu__core_granted(&n.gpu[0], 100, 0, 6 * GiB, false);
    node_ask(&n, 0, 0, 8 * GiB, 0, 0);
    node_ask(&n, 1, 0, 2 * GiB, 0, 0);
    node_pass(&n, 2, 1);
    ASSERT_EQ(n.served_on[0], -1);
    /* fifo: the head blocks what is behind it; mmu: first fit. */
    ASSERT_EQ(n.served_on[1], pol ? 0 : -1);
  }
  /* A head that could never fit (larger than the GPU) blocks nothing. */
  node_init(&n, COGPU_POLICY_FIFO, 1, 10 * GiB);
  node_ask(&n, 0, 0, 11 * GiB, 0, 0);
  node_ask(&n, 1, 0, 2 * GiB, 0, 0);
  node_pass(&n, 2, 1);
  ASSERT_EQ(n.served_on[1], 0);
}

TEST_IMPL(core_serve_starving_guard) {
  static node_t n;
  const uint64_t age = 60ull * 1000000000;
  /* mmu: an old large request starves behind small ones until past the
   * age; then memory is held back for it. */
  node_init(&n, COGPU_POLICY_MMU, 1, 10 * GiB);
  n.rules.mmu_max_age_ns = age;
  n.gpu[0] = cogpu__core_granted(&n.gpu[0], 100, 0, 4 * GiB, false);
  node_ask(&n, 0, 0, 8 * GiB, 0, 0);       /* old, large */
  node_ask(&n, 1, 0, 2 * GiB, 0, age / 2); /* young, small */
  node_pass(&n, 2, age - 1);               /* not yet starving */
  ASSERT_EQ(n.served_on[1], 0);
  node_init(&n, COGPU_POLICY_MMU, 1, 10 * GiB);
  n.rules.mmu_max_age_ns = age;
  n.gpu[0] = cogpu__core_granted(&n.gpu[0], 100, 0, 4 * GiB, false);
  node_ask(&n, 0, 0, 8 * GiB, 0, 0);
  node_ask(&n, 1, 0, 2 * GiB, 0, age / 2);
  node_pass(&n, 2, age); /* starving: blocks the small one */
  ASSERT_EQ(n.served_on[0], -1);
  ASSERT_EQ(n.served_on[1], -1);
  /* Priority-mmu: the starving entry is served first even behind higher
   * priority ones, once it fits. */
  node_init(&n, COGPU_POLICY_PRIO_MMU, 1, 10 * GiB);
  n.rules.mmu_max_age_ns = age;
  node_ask(&n, 0, 0, 6 * GiB, 10, age); /* high priority, young */
  node_ask(&n, 1, 0, 8 * GiB, 0, 0);    /* low, starving */
  node_pass(&n, 2, age);
  ASSERT_EQ(n.served_on[1], 0);
  ASSERT_EQ(n.served_on[0], -1);
  ASSERT_EQ(n.serve_log[0], 1);
}

TEST_IMPL(core_serve_any_gpu_and_kinds) {
  static node_t n;
  node_init(&n, COGPU_POLICY_FIFO, 3, 10 * GiB);
  n.gpu[0] = cogpu__core_granted(&n.gpu[0], 100, 0, 5 * GiB, false);
  n.gpu[1] = cogpu__core_granted(&n.gpu[1], 101, 0, 2 * GiB, false);
  n.gpu[2] = cogpu__core_granted(&n.gpu[2], 102, 0, 2 * GiB, false);
  node_ask(&n, 0, COGPU_GPU_AUTO, 1 * GiB, 0,
           0); /* most free: 1 (tie: lower) */
  node_ask(&n, 1, COGPU_GPU_AUTO, 8 * GiB, 0, 0); /* after 0: GPU 2 */
  node_ask(&n, 2, 0, 1 * GiB, 0, 0);
  n.kind[2] = COGPU_CORE_DROP;
  node_ask(&n, 3, 0, 1 * GiB, 0, 0);
  n.kind[3] = COGPU_CORE_SKIP;
  node_ask(&n, 4, 7, 1 * GiB, 0, 0); /* no such GPU: never served */
  node_pass(&n, 5, 1);
  ASSERT_EQ(n.served_on[0], 1);
  ASSERT_EQ(n.served_on[1], 2);
  ASSERT_EQ(n.dropped[2], 1);
  ASSERT_EQ(n.served_on[2], -1);
  ASSERT_EQ(n.served_on[3], -1);
  ASSERT_EQ(n.served_on[4], -1);
}

TEST_IMPL(core_guard_timing_and_victim) {
  ASSERT(!cogpu__core_guard_due(100, 250, 200));
  ASSERT(cogpu__core_guard_due(100, 300, 200));
  ASSERT(!cogpu__core_guard_due(300, 100, 0)); /* a clock behind: not due */
  cogpu__core_entry_t lo_old = {.priority = 0, .ticket = 1},
                      lo_new = {.priority = 0, .ticket = 2},
                      hi = {.priority = 5, .ticket = 9};
  ASSERT(cogpu__core_victim_before(&lo_new, &lo_old));
  ASSERT(cogpu__core_victim_before(&lo_old, &hi));
  ASSERT(!cogpu__core_victim_before(&hi, &lo_new));
}
