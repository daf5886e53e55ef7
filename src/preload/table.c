/*
 * table.c: what each live allocation holds, for its free. Lock-free open
 * addressing over lazily touched anonymous memory, so tracking an
 * allocation costs one compare-and-swap and no system call. Keys are the
 * driver's pointers or handles (never 0 or 1); a deleted entry leaves a
 * tombstone that a later insert reuses.
 *
 * Tombstones never turn back into empty entries (that cannot be done
 * without a lock while inserts race), so after millions of allocations
 * most of the table is tombstones and a probe would rarely meet an empty
 * entry. Lookups therefore stop after the longest distance any insert ever
 * went from a key's home (max_probe), which stays small while the live
 * entries are few: a free of an untracked pointer costs a few probes
 * however long the program has run. An insert raises max_probe before it
 * returns, and a key is only looked up after the allocation it names was
 * returned, so no lookup stops short of its key.
 */
#include <stdatomic.h>
#include <sys/mman.h>

#include "preload/preload-int.h"
#include "preload/table.h"

#define KEY_EMPTY 0u
#define KEY_TOMB 1u

static uint64_t table_hash(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

/* Fresh zeroed memory at the table's place (also used after fork, so the
 * child starts with an empty table at the same address). */
static int table_map(pl_table_t *t, bool fixed) {
  size_t len = t->cap * sizeof(pl_entry_t);
  void *p = mmap(fixed ? (void *)t->e : NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
                     (fixed ? MAP_FIXED : 0),
                 -1, 0);
  if (p == MAP_FAILED)
    return -1;
  t->e = p;
  return 0;
}

int cogpu__pl_table_init(pl_table_t *t, size_t cap) {
  t->cap = cap;
  t->e = NULL;
  atomic_store(&t->max_probe, 0);
  return table_map(t, false);
}

void cogpu__pl_table_clear(pl_table_t *t) {
  if (t->e)
    table_map(t, true);
  atomic_store(&t->max_probe, 0);
}

static void table_saw_probe(pl_table_t *t, size_t i) {
  size_t m = atomic_load_explicit(&t->max_probe, memory_order_relaxed);
  while (i > m && !atomic_compare_exchange_weak_explicit(
                      &t->max_probe, &m, i, memory_order_release,
                      memory_order_relaxed)) {
  }
}

bool cogpu__pl_table_put(pl_table_t *t, uint64_t key, uint64_t val) {
  if (!t->e || key <= KEY_TOMB)
    return false;
  size_t mask = t->cap - 1;
  for (size_t i = 0, k = table_hash(key) & mask; i < t->cap;
       i++, k = (k + 1) & mask) {
    uint64_t cur = atomic_load_explicit(&t->e[k].key, memory_order_relaxed);
    if (cur != KEY_EMPTY && cur != KEY_TOMB)
      continue;
    /* Claim the entry, then fill it: nobody looks a key up before the
     * allocation it names has been returned, which is after this. */
    if (atomic_compare_exchange_strong_explicit(&t->e[k].key, &cur, key,
                                                memory_order_acq_rel,
                                                memory_order_relaxed)) {
      atomic_store_explicit(&t->e[k].val, val, memory_order_release);
      table_saw_probe(t, i);
      return true;
    }
  }
  return false; /* full: the allocation goes untracked */
}

bool cogpu__pl_table_take(pl_table_t *t, uint64_t key, uint64_t *val) {
  if (!t->e || key <= KEY_TOMB)
    return false;
  size_t mask = t->cap - 1;
  size_t n = atomic_load_explicit(&t->max_probe, memory_order_acquire) + 1;
  for (size_t i = 0, k = table_hash(key) & mask; i < n && i < t->cap;
       i++, k = (k + 1) & mask) {
    uint64_t cur = atomic_load_explicit(&t->e[k].key, memory_order_acquire);
    if (cur == KEY_EMPTY)
      return false;
    if (cur != key)
      continue;
    *val = atomic_load_explicit(&t->e[k].val, memory_order_acquire);
    /* Only one of two racing frees of the same pointer wins. */
    return atomic_compare_exchange_strong_explicit(&t->e[k].key, &cur, KEY_TOMB,
                                                   memory_order_acq_rel,
                                                   memory_order_relaxed);
  }
  return false;
}

void cogpu__pl_table_take_if(pl_table_t *t, bool (*pick)(uint64_t val, void *),
                             void (*got)(uint64_t key, uint64_t val, void *),
                             void *arg) {
  for (size_t k = 0; t->e && k < t->cap; k++) {
    uint64_t cur = atomic_load_explicit(&t->e[k].key, memory_order_acquire);
    if (cur == KEY_EMPTY || cur == KEY_TOMB)
      continue;
    uint64_t val = atomic_load_explicit(&t->e[k].val, memory_order_acquire);
    if (pick(val, arg) && atomic_compare_exchange_strong_explicit(
                              &t->e[k].key, &cur, KEY_TOMB,
                              memory_order_acq_rel, memory_order_relaxed))
      got(cur, val, arg);
  }
}
