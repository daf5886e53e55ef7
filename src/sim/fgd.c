/*
 * fgd.c: fragmentation as FGD (Weng et al., ATC'23) defines it, the FGD
 * placement for the replay, and the arrivals-only experiment of FGD's
 * Fig. 9a (docs/simulation.md, "Validation against FGD").
 *
 * The measure: the workload's "typical pods" are its most common shapes
 * (CPU, share of a GPU, number of GPUs), the most frequent first until
 * they cover 95 % of the pods, their frequencies renormalised. A node's
 * fragmentation is the expected amount of its free GPU (in thousandths)
 * that a typical pod could not use: all of it if the pod cannot go there
 * at all (or uses no GPU), else the free part of the GPUs too small for
 * it. FGD places a pod where that expectation grows least.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sim/engine-int.h"

typedef struct typ_s {
  uint32_t cpu;   /* milli-CPU */
  uint32_t milli; /* per GPU; 0: no GPU */
  uint32_t ngpus;
  uint64_t mem; /* bytes per GPU (traces in bytes) */
  uint64_t count;
  double p;
} typ_t;

typedef struct typs_s {
  typ_t *v;
  size_t n;
} typs_t;

static int cmp_typ_key(const void *a, const void *b) {
  const typ_t *x = a, *y = b;
  if (x->cpu != y->cpu)
    return x->cpu < y->cpu ? -1 : 1;
  if (x->milli != y->milli)
    return x->milli < y->milli ? -1 : 1;
  if (x->ngpus != y->ngpus)
    return x->ngpus < y->ngpus ? -1 : 1;
  return x->mem < y->mem ? -1 : x->mem > y->mem;
}

/* Most frequent first; ties: larger CPU, then larger share, then more
 * GPUs (a total order: the same trace gives the same list). */
static int cmp_typ_freq(const void *a, const void *b) {
  const typ_t *x = a, *y = b;
  if (x->count != y->count)
    return x->count > y->count ? -1 : 1;
  return -cmp_typ_key(a, b);
}

/* The typical pods of t; with_cpu false keys on the GPU shape only (the
 * replay does not track CPUs). */
static int typical(const sim_trace_t *t, bool with_cpu, typs_t *out) {
  out->v = NULL;
  out->n = 0;
  if (t->n == 0)
    return 0;
  typ_t *v = malloc(t->n * sizeof *v);
  if (!v)
    return -ENOMEM;
  for (size_t i = 0; i < t->n; i++) {
    const sim_job_t *j = &t->jobs[i];
    uint32_t cpu = with_cpu ? (j->cpu_milli ? j->cpu_milli : 100) : 0;
    v[i] = (typ_t){
        .cpu = cpu,
        .milli = j->ngpus ? (j->milli ? j->milli : (j->mem ? 0 : 1000)) : 0,
        .ngpus = j->ngpus,
        .mem = j->ngpus && !j->milli ? j->mem : 0,
        .count = 1};
  }
  qsort(v, t->n, sizeof *v, cmp_typ_key);
  size_t m = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (m && cmp_typ_key(&v[m - 1], &v[i]) == 0)
      v[m - 1].count++;
    else
      v[m++] = v[i];
  }
  qsort(v, m, sizeof *v, cmp_typ_freq);
  uint64_t cum = 0, sum = 0;
  size_t k = 0;
  while (k < m && (double)cum < 0.95 * (double)t->n)
    cum += v[k++].count;
  for (size_t i = 0; i < k; i++)
    sum += v[i].count;
  for (size_t i = 0; i < k; i++)
    v[i].p = (double)v[i].count / (double)sum;
  out->v = v;
  out->n = k;
  return 0;
}

/* A typical pod's share of a GPU of `cap` bytes, in thousandths. */
static uint32_t typ_milli(const typ_t *m, uint64_t cap) {
  if (m->milli || !m->ngpus)
    return m->milli;
  if (!cap)
    return 1000;
  uint64_t x = (m->mem * 1000 + cap - 1) / cap;
  return x > 1000 ? 1001 : (uint32_t)x; /* 1001: never fits */
}

/* Node fragmentation, in thousandths of a GPU: left[] per GPU, cpu left
 * (UINT64_MAX: not tracked), cap bytes per GPU (shares in bytes). */
static double node_frag(const typs_t *ty, const uint32_t *left, uint32_t ng,
                        uint64_t cpu_left, uint64_t cap) {
  uint64_t L = 0;
  for (uint32_t g = 0; g < ng; g++)
    L += left[g];
  if (L == 0)
    return 0;
  double f = 0;
  for (size_t i = 0; i < ty->n; i++) {
    const typ_t *m = &ty->v[i];
    uint32_t d = typ_milli(m, cap);
    if (!m->ngpus || d == 0) {
      f += m->p * (double)L; /* uses no GPU: every free part is lost */
      continue;
    }
    uint32_t fit = 0;
    uint64_t small = 0;
    for (uint32_t g = 0; g < ng; g++) {
      if (left[g] >= d)
        fit++;
      else
        small += left[g];
    }
    if (fit >= m->ngpus && cpu_left >= m->cpu)
      f += m->p * (double)small;
    else
      f += m->p * (double)L;
  }
  return f;
}

/* --- in the replay ------------------------------------------------------ */

typedef struct fgd_state_s {
  typs_t ty;
} fgd_state_t;

/* A GPU's free part in thousandths, as the policy's booking means it. */
static uint32_t left_of(const sim_run_t *r, uint32_t g) {
  const cogpu__core_gpu_t *gp = &r->gpu[g];
  switch (r->p->kind) {
  case SIM_EXCLUSIVE:
    return gp->nclients == 0 ? 1000 : 0;
  case SIM_SHARES:
    return gp->nclients >= r->o->shares
               ? 0
               : (uint32_t)((r->o->shares - gp->nclients) * 1000 /
                            r->o->shares);
  default:
    if (gp->excl || !r->cap[g])
      return 0;
    return (uint32_t)(cogpu__core_free(gp) * 1000 / r->cap[g]);
  }
}

int cogpu__sim_fgd_init(sim_run_t *r) {
  fgd_state_t *st = calloc(1, sizeof *st);
  if (!st)
    return -ENOMEM;
  r->pol = st;
  return typical(r->t, false, &st->ty);
}

void cogpu__sim_fgd_free(sim_run_t *r) {
  fgd_state_t *st = r->pol;
  if (st)
    free(st->ty.v);
  free(st);
  r->pol = NULL;
}

double cogpu__sim_frag(sim_run_t *r) {
  fgd_state_t *st = r->pol;
  double f = 0;
  uint32_t left[SIM_MAX_NODE_GPUS];
  for (uint32_t n = 0; n < r->c->nnodes; n++) {
    const sim_node_t *nd = &r->c->nodes[n];
    for (uint32_t g = 0; g < nd->ngpus; g++)
      left[g] = left_of(r, nd->gpu0 + g);
    f += node_frag(&st->ty, left, nd->ngpus, UINT64_MAX, nd->gpu_total);
  }
  return f / 1000.0;
}

bool cogpu__sim_fgd_find(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  fgd_state_t *st = r->pol;
  uint32_t k = r->t->jobs[j].ngpus;
  uint64_t need = cogpu__sim_need_key(r, j);
  double best = INFINITY;
  bool found = false;
  uint32_t left[SIM_MAX_NODE_GPUS], after[SIM_MAX_NODE_GPUS];
  /* Idle nodes of one shape give the same answer, and the first of them
   * wins ties: only that one is worked out. */
  struct {
    uint32_t ngpus;
    uint64_t total;
  } seen[16];
  uint32_t nseen = 0;
  for (uint32_t g = cogpu__sim_index_first(r, 0, need); g != SIM_NONE;
       g = cogpu__sim_index_first(r,
                                  r->c->nodes[r->c->gpu_node[g]].gpu0 +
                                      r->c->nodes[r->c->gpu_node[g]].ngpus,
                                  need)) {
    uint32_t n = r->c->gpu_node[g];
    const sim_node_t *nd = &r->c->nodes[n];
    if (cogpu__sim_node_free(r, n)) {
      bool dup = false;
      for (uint32_t i = 0; i < nseen && !dup; i++)
        dup = seen[i].ngpus == nd->ngpus && seen[i].total == nd->gpu_total;
      if (dup)
        continue;
      if (nseen < 16)
        seen[nseen++] = (typeof(seen[0])){nd->ngpus, nd->gpu_total};
    }
    uint32_t cand[SIM_MAX_NODE_GPUS], nc = 0;
    for (uint32_t x = 0; x < nd->ngpus; x++) {
      left[x] = left_of(r, nd->gpu0 + x);
      if (r->key[nd->gpu0 + x] >= need && cogpu__sim_gpu_ok(r, j, nd->gpu0 + x))
        cand[nc++] = x;
    }
    double before =
        node_frag(&st->ty, left, nd->ngpus, UINT64_MAX, nd->gpu_total);
    if (nc >= k && k == 1) {
      /* Each GPU it fits on (one of each free amount: equal ones give
       * equal answers, the lowest index is kept). */
      for (uint32_t i = 0; i < nc; i++) {
        bool dup = false;
        for (uint32_t q = 0; q < i && !dup; q++)
          dup = left[cand[q]] == left[cand[i]];
        if (dup)
          continue;
        memcpy(after, left, nd->ngpus * sizeof *after);
        uint32_t use =
            (uint32_t)(r->p->kind == SIM_COGPU
                           ? (cogpu__sim_need_bytes(r, j, nd->gpu0 + cand[i]) *
                                  1000 +
                              r->cap[nd->gpu0 + cand[i]] - 1) /
                                 r->cap[nd->gpu0 + cand[i]]
                           : 1000);
        after[cand[i]] = after[cand[i]] > use ? after[cand[i]] - use : 0;
        double d =
            node_frag(&st->ty, after, nd->ngpus, UINT64_MAX, nd->gpu_total) -
            before;
        if (d < best) {
          best = d;
          s->gpus[0] = nd->gpu0 + cand[i];
          s->ngpus = 1;
          found = true;
        }
      }
    } else if (nc >= k) {
      /* Several GPUs: the least free ones it fits on. */
      for (uint32_t a = 1; a < nc; a++)
        for (uint32_t b = a; b > 0 && left[cand[b]] < left[cand[b - 1]]; b--) {
          uint32_t t = cand[b];
          cand[b] = cand[b - 1];
          cand[b - 1] = t;
        }
      memcpy(after, left, nd->ngpus * sizeof *after);
      for (uint32_t i = 0; i < k; i++)
        after[cand[i]] = 0;
      double d =
          node_frag(&st->ty, after, nd->ngpus, UINT64_MAX, nd->gpu_total) -
          before;
      if (d < best) {
        best = d;
        for (uint32_t i = 0; i < k; i++)
          s->gpus[i] = nd->gpu0 + cand[i];
        s->ngpus = k;
        found = true;
      }
    }
  }
  return found;
}
