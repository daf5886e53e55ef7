/*
 * table.h: the preload library's lock-free allocation table (table.c).
 */
#ifndef COGPU_PRELOAD_TABLE_H
#define COGPU_PRELOAD_TABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pl_entry_s {
  _Atomic uint64_t key;
  _Atomic uint64_t val;
} pl_entry_t;

typedef struct pl_table_s {
  pl_entry_t *e;
  size_t cap;               /* a power of two */
  _Atomic size_t max_probe; /* the farthest any key was put from its home */
} pl_table_t;

int cogpu__pl_table_init(pl_table_t *t, size_t cap);
void cogpu__pl_table_clear(pl_table_t *t);
bool cogpu__pl_table_put(pl_table_t *t, uint64_t key, uint64_t val);
bool cogpu__pl_table_take(pl_table_t *t, uint64_t key, uint64_t *val);
/* Take every entry whose value `pick` accepts, calling `got` with each
 * (racing takes of the same key are settled as in take). */
void cogpu__pl_table_take_if(pl_table_t *t, bool (*pick)(uint64_t val, void *),
                             void (*got)(uint64_t key, uint64_t val, void *),
                             void *arg);

#endif
