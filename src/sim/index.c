/*
 * index.c: the placement index over the cluster's GPUs.
 *
 * Each GPU has a key: what it has free in the policy's unit (free bytes,
 * free thousandths of the GPU, free shares, or 1 for an idle GPU), or 0
 * when nothing may be placed there now. A segment tree of the largest key
 * finds the first GPU at or after an index whose key is at least a need in
 * O(log n) (first fit); a treap over (key, GPU) finds the smallest key at
 * least a need in O(log n) (best fit). For best fit of a job of several
 * GPUs a second treap orders the nodes by the sum of their GPUs' keys, so
 * that the least free node with room is found from the least free up. The
 * treap's priorities come from the run's seeded generator; they shape the tree,
 * never the answer, which is the unique smallest pair.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sim/engine-int.h"

static uint64_t rng_next(uint64_t *s) {
  /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* (ka, a) < (kb, b) */
static bool tr_less(uint64_t ka, uint32_t a, uint64_t kb, uint32_t b) {
  return ka != kb ? ka < kb : a < b;
}

/* Splits t into (< (k, g)) and (>= (k, g)). */
static void tr_split(sim_treap_t *tr, uint32_t t, uint64_t k, uint32_t g,
                     uint32_t *a, uint32_t *b) {
  if (t == SIM_NONE) {
    *a = *b = SIM_NONE;
    return;
  }
  if (tr_less(tr->key[t], t, k, g)) {
    tr_split(tr, tr->r[t], k, g, &tr->r[t], b);
    *a = t;
  } else {
    tr_split(tr, tr->l[t], k, g, a, &tr->l[t]);
    *b = t;
  }
}

static uint32_t tr_merge(sim_treap_t *tr, uint32_t a, uint32_t b) {
  if (a == SIM_NONE)
    return b;
  if (b == SIM_NONE)
    return a;
  if (tr->pri[a] > tr->pri[b]) {
    tr->r[a] = tr_merge(tr, tr->r[a], b);
    return a;
  }
  tr->l[b] = tr_merge(tr, a, tr->l[b]);
  return b;
}

static void tr_insert(sim_treap_t *tr, uint32_t g) {
  uint32_t a, b;
  tr->l[g] = tr->r[g] = SIM_NONE;
  tr_split(tr, tr->root, tr->key[g], g, &a, &b);
  tr->root = tr_merge(tr, tr_merge(tr, a, g), b);
}

static void tr_erase(sim_treap_t *tr, uint32_t g) {
  uint32_t a, b, c, d;
  tr_split(tr, tr->root, tr->key[g], g, &a, &b);
  /* b starts with g: split it off (the next pair up is (key, g + 1)). */
  tr_split(tr, b, tr->key[g], g + 1, &c, &d);
  tr->root = tr_merge(tr, a, d);
}

int cogpu__sim_index_init(sim_run_t *r) {
  uint32_t n = r->c->ngpus;
  r->segn = 1;
  while (r->segn < n)
    r->segn *= 2;
  r->seg = calloc(2 * (size_t)r->segn, sizeof *r->seg);
  r->key = calloc(n, sizeof *r->key);
  sim_treap_t *tr = &r->tr;
  bool best = r->p->place == SIM_BESTFIT;
  if (best) {
    tr->l = malloc(n * sizeof *tr->l);
    tr->r = malloc(n * sizeof *tr->r);
    tr->pri = malloc(n * sizeof *tr->pri);
    tr->key = r->key;
  }
  sim_treap_t *nt = &r->ntr;
  uint32_t nn = r->c->nnodes;
  if (best) {
    nt->l = malloc((nn ? nn : 1) * sizeof *nt->l);
    nt->r = malloc((nn ? nn : 1) * sizeof *nt->r);
    nt->pri = malloc((nn ? nn : 1) * sizeof *nt->pri);
    r->nsum = calloc(nn ? nn : 1, sizeof *r->nsum);
    nt->key = r->nsum;
  }
  if (!r->seg || !r->key || (best && (!tr->l || !tr->r || !tr->pri)) ||
      (best && (!nt->l || !nt->r || !nt->pri || !r->nsum)))
    return cogpu__seterr(-ENOMEM, "out of memory for the placement index");
  tr->root = SIM_NONE;
  nt->root = SIM_NONE;
  for (uint32_t g = 0; g < n; g++) {
    if (best) {
      tr->pri[g] = (uint32_t)rng_next(&r->rng);
      tr_insert(tr, g);
    }
  }
  /* After the GPUs' priorities: the GPU treap's shape stays as it was. */
  for (uint32_t x = 0; best && x < nn; x++) {
    nt->pri[x] = (uint32_t)rng_next(&r->rng);
    tr_insert(nt, x);
  }
  return 0;
}

void cogpu__sim_index_free(sim_run_t *r) {
  free(r->seg);
  free(r->key);
  free(r->tr.l);
  free(r->tr.r);
  free(r->tr.pri);
  r->tr.key = NULL;
  free(r->ntr.l);
  free(r->ntr.r);
  free(r->ntr.pri);
  free(r->nsum);
  r->ntr.key = NULL;
}

void cogpu__sim_index_set(sim_run_t *r, uint32_t g, uint64_t key) {
  if (r->key[g] == key)
    return;
  uint64_t old = r->key[g];
  if (r->tr.pri)
    tr_erase(&r->tr, g);
  if (key && !r->key[g])
    r->nkeyed++;
  else if (!key && r->key[g])
    r->nkeyed--;
  r->key[g] = key;
  if (r->tr.pri)
    tr_insert(&r->tr, g);
  if (r->ntr.pri) {
    uint32_t n = r->c->gpu_node[g];
    tr_erase(&r->ntr, n);
    r->nsum[n] = r->nsum[n] - old + key;
    tr_insert(&r->ntr, n);
  }
  uint32_t i = r->segn + g;
  r->seg[i] = key;
  for (i /= 2; i >= 1; i /= 2) {
    uint64_t m =
        r->seg[2 * i] > r->seg[2 * i + 1] ? r->seg[2 * i] : r->seg[2 * i + 1];
    if (r->seg[i] == m)
      break; /* nothing above changes */
    r->seg[i] = m;
  }
}

/* Leftmost leaf >= from with key >= need under node i covering [lo, hi). */
static uint32_t seg_first(const sim_run_t *r, uint32_t i, uint32_t lo,
                          uint32_t hi, uint32_t from, uint64_t need) {
  if (hi <= from || r->seg[i] < need)
    return SIM_NONE;
  if (hi - lo == 1)
    return lo;
  uint32_t mid = lo + (hi - lo) / 2;
  uint32_t g = seg_first(r, 2 * i, lo, mid, from, need);
  if (g != SIM_NONE)
    return g;
  return seg_first(r, 2 * i + 1, mid, hi, from, need);
}

uint32_t cogpu__sim_index_first(const sim_run_t *r, uint32_t from,
                                uint64_t need) {
  if (from >= r->c->ngpus || need == 0 || r->seg[1] < need)
    return need == 0 && from < r->c->ngpus ? from : SIM_NONE;
  uint32_t g = seg_first(r, 1, 0, r->segn, from, need);
  return g < r->c->ngpus ? g : SIM_NONE;
}

uint32_t cogpu__sim_index_best(const sim_run_t *r, uint64_t need,
                               uint64_t after_key, uint32_t after_g) {
  const sim_treap_t *tr = &r->tr;
  uint32_t best = SIM_NONE;
  for (uint32_t t = tr->root; t != SIM_NONE;) {
    bool ok =
        tr->key[t] >= need &&
        (after_g == SIM_NONE || tr_less(after_key, after_g, tr->key[t], t));
    if (ok) {
      best = t;
      t = tr->l[t];
    } else {
      t = tr->r[t];
    }
  }
  return best;
}

uint32_t cogpu__sim_index_node_next(const sim_run_t *r, uint64_t after_sum,
                                    uint32_t after_n) {
  const sim_treap_t *tr = &r->ntr;
  uint32_t best = SIM_NONE;
  for (uint32_t t = tr->root; t != SIM_NONE;) {
    if (after_n == SIM_NONE || tr_less(after_sum, after_n, tr->key[t], t)) {
      best = t;
      t = tr->l[t];
    } else {
      t = tr->r[t];
    }
  }
  return best;
}
