/*
 * core.c: the node's service order and service pass, on any state
 * (core.h). The ledger and the cluster simulator both call these; what
 * they hold the state in is behind cogpu__core_ops_t.
 */
#include <string.h>

#include "cogpu.h"
#include "internal.h"
#include "ledger/core.h"

static bool by_priority(const cogpu__core_rules_t *r) {
  return r->policy == COGPU_POLICY_PRIO_FIFO ||
         r->policy == COGPU_POLICY_PRIO_MMU;
}

static bool first_fit(const cogpu__core_rules_t *r) {
  return r->policy == COGPU_POLICY_MMU || r->policy == COGPU_POLICY_PRIO_MMU;
}

bool cogpu__core_before(const cogpu__core_rules_t *r,
                        const cogpu__core_entry_t *a,
                        const cogpu__core_entry_t *b) {
  if (by_priority(r) && a->priority != b->priority)
    return a->priority > b->priority;
  return a->ticket < b->ticket;
}

void cogpu__core_order(const cogpu__core_rules_t *r, uint32_t *ids, size_t n,
                       const cogpu__core_ops_t *ops, void *ctx) {
  /* Binary insertion: stable, in place (the ledger sorts on a user
   * thread's stack, inside a CUDA call: no scratch array), O(n log n)
   * comparisons and a memmove per entry out of place. */
  for (size_t i = 1; i < n; i++) {
    uint32_t id = ids[i];
    cogpu__core_entry_t e, o;
    ops->entry(ctx, id, &e);
    ops->entry(ctx, ids[i - 1], &o);
    if (!cogpu__core_before(r, &e, &o))
      continue;                /* in order already: the usual case */
    size_t lo = 0, hi = i - 1; /* the first entry e goes before is in it */
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      ops->entry(ctx, ids[mid], &o);
      if (cogpu__core_before(r, &e, &o))
        hi = mid;
      else
        lo = mid + 1;
    }
    memmove(ids + lo + 1, ids + lo, (i - lo) * sizeof ids[0]);
    ids[lo] = id;
  }
}

int64_t cogpu__core_starving(const cogpu__core_rules_t *r, uint64_t now,
                             const uint32_t *ids, size_t n,
                             const cogpu__core_ops_t *ops, void *ctx) {
  if (!first_fit(r) || n == 0)
    return -1;
  uint64_t oldest = UINT64_MAX;
  int64_t who = -1;
  for (size_t i = 0; i < n; i++) {
    cogpu__core_entry_t e;
    ops->entry(ctx, ids[i], &e);
    if (e.since_ns < oldest) {
      oldest = e.since_ns;
      who = (int64_t)i;
    }
  }
  /* mmu_max_age = inf is UINT64_MAX: never due. */
  if (now < oldest || now - oldest < r->mmu_max_age_ns)
    return -1;
  return who;
}

size_t cogpu__core_candidates(const cogpu__core_entry_t *e, uint32_t ngpus,
                              uint32_t *gpus, const cogpu__core_ops_t *ops,
                              void *ctx) {
  if (e->gpu != COGPU_GPU_AUTO) {
    if (e->gpu < 0 || (uint64_t)e->gpu >= ngpus)
      return 0;
    gpus[0] = (uint32_t)e->gpu;
    return 1;
  }
  uint64_t fr[COGPU_CORE_MAX_GPUS];
  size_t n = 0;
  for (uint32_t g = 0; g < ngpus && g < COGPU_CORE_MAX_GPUS; g++) {
    uint64_t f = ops->free(ctx, g);
    size_t k = n++;
    while (k > 0 && f > fr[k - 1]) {
      gpus[k] = gpus[k - 1];
      fr[k] = fr[k - 1];
      k--;
    }
    gpus[k] = g;
    fr[k] = f;
  }
  return n;
}

void cogpu__core_serve(const cogpu__core_rules_t *r, uint64_t now,
                       uint32_t ngpus, uint32_t *ids, size_t n,
                       const cogpu__core_ops_t *ops, void *ctx) {
  cogpu__assert(ngpus <= COGPU_CORE_MAX_GPUS);
  if (ngpus > COGPU_CORE_MAX_GPUS) /* a release build: never past the arrays */
    ngpus = COGPU_CORE_MAX_GPUS;
  int64_t starving = cogpu__core_starving(r, now, ids, n, ops, ctx);
  int64_t starving_id = -1;
  if (starving > 0) {
    /* To the front: it is served first, as under fifo. */
    uint32_t id = ids[starving];
    memmove(ids + 1, ids, (size_t)starving * sizeof ids[0]);
    ids[0] = id;
  }
  if (starving >= 0)
    starving_id = ids[0];
  bool blocked[COGPU_CORE_MAX_GPUS] = {false};
  uint32_t gpus[COGPU_CORE_MAX_GPUS];
  bool ff = first_fit(r);
  for (size_t i = 0; i < n; i++) {
    uint32_t id = ids[i];
    int kind = ops->kind(ctx, id);
    if (kind == COGPU_CORE_SKIP)
      continue;
    if (kind == COGPU_CORE_DROP) {
      ops->drop(ctx, id);
      continue;
    }
    cogpu__core_entry_t e;
    ops->entry(ctx, id, &e);
    bool starves = (int64_t)id == starving_id;
    if (kind == COGPU_CORE_RESUME) {
      if (e.gpu < 0 || (uint64_t)e.gpu >= ngpus)
        continue;
      uint32_t g = (uint32_t)e.gpu;
      if (!blocked[g] && ops->fits(ctx, id, g)) {
        ops->serve(ctx, id, g);
        continue;
      }
      /* Its GPU cannot take it now: another may (migration), most free
       * first, never one that holds an earlier request back. */
      size_t ng = ops->moves
                      ? cogpu__core_candidates(
                            &(cogpu__core_entry_t){.gpu = COGPU_GPU_AUTO},
                            ngpus, gpus, ops, ctx)
                      : 0;
      for (size_t k = 0; k < ng; k++)
        if (gpus[k] != g && !blocked[gpus[k]] && ops->moves(ctx, id, gpus[k])) {
          ops->serve(ctx, id, gpus[k]);
          break;
        }
      /* A resume that cannot go yet holds back nobody behind it (issue
       * 25): behind it are the jobs still running on its GPU, whose
       * growth is what lets them finish and give it room; held back,
       * they would all wait, and the next deadlock would park another. */
      continue;
    }
    size_t ng = cogpu__core_candidates(&e, ngpus, gpus, ops, ctx);
    bool served = false;
    for (size_t k = 0; k < ng && !served; k++) {
      uint32_t g = gpus[k];
      if (!blocked[g] && ops->fits(ctx, id, g)) {
        ops->serve(ctx, id, g);
        served = true;
      }
    }
    if (served || (ff && !starves))
      continue;
    /* Not served: under fifo (or for the starving one) nothing behind it
     * is served where it could ever fit, so that it is not overtaken
     * forever by smaller requests. */
    for (size_t k = 0; k < ng; k++)
      if (ops->could_fit(ctx, id, gpus[k]))
        blocked[gpus[k]] = true;
  }
}
