/*
 * test-pl-table.c: the preload library's lock-free allocation table,
 * driven directly by racing threads (TSan checks it here as well as inside
 * the preload library under the preload tests).
 */
#include <pthread.h>

#include "internal.h"
#include "preload/table.h"
#include "task.h"

TEST_IMPL(pl_table_put_take) {
  pl_table_t t;
  ASSERT_EQ(cogpu__pl_table_init(&t, 1024), 0);
  uint64_t v = 0;
  ASSERT(!cogpu__pl_table_take(&t, 0x1000, &v)); /* never put */
  ASSERT(cogpu__pl_table_put(&t, 0x1000, 42));
  ASSERT(cogpu__pl_table_put(&t, 0x2000, 43));
  ASSERT(cogpu__pl_table_take(&t, 0x1000, &v));
  ASSERT_UEQ(v, 42);
  ASSERT(!cogpu__pl_table_take(&t, 0x1000, &v)); /* only once */
  ASSERT(cogpu__pl_table_take(&t, 0x2000, &v));
  ASSERT_UEQ(v, 43);
  /* Keys 0 and 1 are reserved markers: refused, not stored. */
  ASSERT(!cogpu__pl_table_put(&t, 0, 1));
  ASSERT(!cogpu__pl_table_put(&t, 1, 1));
}

TEST_IMPL(pl_table_full_and_tombstones) {
  pl_table_t t;
  ASSERT_EQ(cogpu__pl_table_init(&t, 64), 0);
  for (uint64_t k = 2; k < 66; k++)
    ASSERT(cogpu__pl_table_put(&t, k * 4096, k));
  ASSERT(!cogpu__pl_table_put(&t, 999 * 4096, 1)); /* full: not tracked */
  uint64_t v;
  for (uint64_t k = 2; k < 66; k += 2)
    ASSERT(cogpu__pl_table_take(&t, k * 4096, &v));
  /* Tombstones are reused, and lookups probe past them. */
  for (uint64_t k = 100; k < 132; k++)
    ASSERT(cogpu__pl_table_put(&t, k * 4096, k));
  for (uint64_t k = 3; k < 66; k += 2) {
    ASSERT(cogpu__pl_table_take(&t, k * 4096, &v));
    ASSERT_UEQ(v, k);
  }
  /* After fork-style clearing nothing is left. */
  cogpu__pl_table_clear(&t);
  ASSERT(!cogpu__pl_table_take(&t, 100 * 4096, &v));
}

/* After a long run of allocation/free pairs nearly every entry is a
 * tombstone: a lookup that finds nothing (the free of an untracked pointer)
 * must still stop after a few probes, not walk the whole table. */
TEST_IMPL(pl_table_misses_stay_fast_after_churn) {
  pl_table_t t;
  ASSERT_EQ(cogpu__pl_table_init(&t, 1u << 16), 0);
  uint64_t v;
  for (uint64_t i = 0; i < (1u << 20); i++) {
    ASSERT(cogpu__pl_table_put(&t, (i + 2) * 4096, i));
    ASSERT(cogpu__pl_table_take(&t, (i + 2) * 4096, &v));
  }
  uint64_t t0 = cogpu__now_ns();
  for (uint64_t i = 0; i < 2000; i++)
    ASSERT(!cogpu__pl_table_take(&t, 0xdead00000000ull + i * 8192, &v));
  uint64_t per_miss = (cogpu__now_ns() - t0) / 2000;
  /* A whole-table walk is 65536 probes (tens of microseconds). */
  ASSERT_ULE(per_miss, 5000);
  /* What is live is still found. */
  ASSERT(cogpu__pl_table_put(&t, 0x5000, 7));
  ASSERT(cogpu__pl_table_take(&t, 0x5000, &v));
  ASSERT_UEQ(v, 7);
}

static pl_table_t shared_t;

static void *table_worker(void *arg) {
  uint64_t base = (uint64_t)(uintptr_t)arg << 32;
  for (uint64_t i = 0; i < 20000; i++) {
    uint64_t key = base + (i % 64 + 1) * 4096, v = 0;
    if (!cogpu__pl_table_put(&shared_t, key, i))
      return (void *)1;
    if (!cogpu__pl_table_take(&shared_t, key, &v) || v != i)
      return (void *)2;
  }
  return NULL;
}

/* Racing frees of one key: exactly one wins. */
static _Atomic int racing_wins;
static void *table_racer(void *arg) {
  uint64_t v;
  (void)arg;
  if (cogpu__pl_table_take(&shared_t, 0x7000, &v))
    racing_wins++;
  return NULL;
}

TEST_IMPL(pl_table_threads) {
  ASSERT_EQ(cogpu__pl_table_init(&shared_t, 1u << 12), 0);
  pthread_t th[8];
  for (uintptr_t i = 0; i < 8; i++)
    ASSERT_EQ(pthread_create(&th[i], NULL, table_worker, (void *)(i + 1)), 0);
  for (int i = 0; i < 8; i++) {
    void *r;
    pthread_join(th[i], &r);
    ASSERT(r == NULL);
  }
  for (int round = 0; round < 200; round++) {
    racing_wins = 0;
    ASSERT(cogpu__pl_table_put(&shared_t, 0x7000, 7));
    for (int i = 0; i < 4; i++)
      pthread_create(&th[i], NULL, table_racer, NULL);
    for (int i = 0; i < 4; i++)
      pthread_join(th[i], NULL);
    ASSERT_EQ(racing_wins, 1);
  }
}
