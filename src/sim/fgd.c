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
  uint64_t mem;  /* bytes per GPU (traces in bytes) */
  uint16_t spec; /* gpu_spec id, 0: any model */
  uint32_t mask; /* its models (sim_trace_t's spec_mask), 0: any */
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
  if (x->spec != y->spec)
    return x->spec < y->spec ? -1 : 1;
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
        .spec = j->ngpus ? j->spec : 0,
        .mask = j->ngpus && j->spec ? t->spec_mask[j->spec - 1] : 0,
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
 * (UINT64_MAX: not tracked), cap bytes per GPU (shares in bytes), bit the
 * node's model's bit in the trace's gpu_spec masks. */
static double node_frag(const typs_t *ty, const uint32_t *left, uint32_t ng,
                        uint64_t cpu_left, uint64_t cap, uint32_t bit) {
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
    if (m->mask && !(m->mask & bit)) {
      f += m->p * (double)L; /* not a model it may use */
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
    f += node_frag(&st->ty, left, nd->ngpus, UINT64_MAX, nd->gpu_total,
                   r->model_bit[nd->model]);
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
  /* Idle nodes of one shape (and model: gpu_spec) give the same answer,
   * and the first of them wins ties: only that one is worked out. */
  struct {
    uint32_t ngpus, model;
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
        dup = seen[i].ngpus == nd->ngpus && seen[i].total == nd->gpu_total &&
              seen[i].model == nd->model;
      if (dup)
        continue;
      if (nseen < 16)
        seen[nseen++] = (typeof(seen[0])){nd->ngpus, nd->model, nd->gpu_total};
    }
    uint32_t cand[SIM_MAX_NODE_GPUS], nc = 0;
    for (uint32_t x = 0; x < nd->ngpus; x++) {
      left[x] = left_of(r, nd->gpu0 + x);
      if (r->key[nd->gpu0 + x] >= need && cogpu__sim_gpu_ok(r, j, nd->gpu0 + x))
        cand[nc++] = x;
    }
    double before = node_frag(&st->ty, left, nd->ngpus, UINT64_MAX,
                              nd->gpu_total, r->model_bit[nd->model]);
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
        double d = node_frag(&st->ty, after, nd->ngpus, UINT64_MAX,
                             nd->gpu_total, r->model_bit[nd->model]) -
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
      double d = node_frag(&st->ty, after, nd->ngpus, UINT64_MAX, nd->gpu_total,
                           r->model_bit[nd->model]) -
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

/* --- the arrivals-only experiment (FGD's Fig. 9a) ------------------------
 * Pods arrive one by one and never leave; a pod that cannot be placed
 * fails and is gone. The order is a random permutation of the whole
 * trace, then copies drawn uniformly (with replacement) from it are
 * appended until the arrived GPU request would pass `upto` % of the
 * cluster (the artifact's rule, per-GPU share compared, GPUs x share
 * added). Nodes are ranked by a random permutation fixed for the run: a
 * tie between nodes goes to the lower rank. Every node is a filter on
 * CPU, host memory and GPU; each placement scores the feasible nodes
 * (docs/simulation.md has the scores). */

enum { FP_RANDOM, FP_DOTPROD, FP_CLUSTERING, FP_PACKING, FP_BESTFIT, FP_FGD };

typedef struct fnode_s {
  int64_t cpu, mem; /* left: milli-CPU, MiB */
  uint32_t gpu0, ng, rank;
  uint32_t bit;      /* its model's bit in the gpu_spec masks */
  uint32_t tags[17]; /* GPU pods by tag: 0 share, k: k whole GPUs */
  uint32_t gpods;
} fnode_t;

static uint64_t frng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, n) without modulo bias. */
static uint64_t frng_below(uint64_t *s, uint64_t n) {
  uint64_t lim = UINT64_MAX - UINT64_MAX % n, x;
  do
    x = frng(s);
  while (x >= lim);
  return x % n;
}

static int fgd_place_id(const char *p) {
  static const char *const names[] = {"random",  "dotprod", "clustering",
                                      "packing", "bestfit", "fgd"};
  for (int i = 0; i < 6; i++)
    if (!strcmp(p, names[i]))
      return i;
  return -1;
}

static uint32_t tag_of(const sim_job_t *j) {
  return j->ngpus == 1 && j->milli < 1000 ? 0 : j->ngpus > 16 ? 16 : j->ngpus;
}

/* Can pod j (its gpu_spec's models: mask, 0 any) go on node n; if so,
 * which GPUs (best: the least free that fits; whole GPUs: the lowest free
 * ones). */
static bool ffit(const fnode_t *n, const uint32_t *left, const sim_job_t *j,
                 uint32_t mask, uint32_t *gpus) {
  if (n->cpu < (int64_t)j->cpu_milli || n->mem < (int64_t)j->host_mib)
    return false;
  if (j->ngpus == 0)
    return true;
  if (j->ngpus > n->ng || (mask && !(mask & n->bit)))
    return false;
  if (j->ngpus == 1 && j->milli < 1000) {
    uint32_t best = SIM_NONE;
    for (uint32_t g = 0; g < n->ng; g++)
      if (left[n->gpu0 + g] >= j->milli &&
          (best == SIM_NONE || left[n->gpu0 + g] < left[n->gpu0 + best]))
        best = g;
    if (best == SIM_NONE)
      return false;
    gpus[0] = best;
    return true;
  }
  uint32_t got = 0;
  for (uint32_t g = 0; g < n->ng && got < j->ngpus; g++)
    if (left[n->gpu0 + g] >= 1000)
      gpus[got++] = g;
  return got == j->ngpus;
}

static uint64_t gleft(const fnode_t *n, const uint32_t *left) {
  uint64_t s = 0;
  for (uint32_t g = 0; g < n->ng; g++)
    s += left[n->gpu0 + g];
  return s;
}

/* FGD's score of putting j on GPU set `after` (left after) of node n. */
static int64_t fgd_score(const typs_t *ty, const fnode_t *n,
                         const uint32_t *before, const uint32_t *after,
                         const sim_job_t *j) {
  double fb = node_frag(ty, before, n->ng, (uint64_t)n->cpu, 0, n->bit);
  int64_t cpu_after = n->cpu - (int64_t)j->cpu_milli;
  double fa = node_frag(ty, after, n->ng,
                        cpu_after < 0 ? 0 : (uint64_t)cpu_after, 0, n->bit);
  double d = (fb - fa) / 1000.0;
  return (int64_t)(100.0 / (1.0 + exp(-d)));
}

/* Node n's score for pod j under the placement; *gpu gets the GPU (sharing
 * pods) the placement would use. */
static int64_t fscore(int place, const typs_t *ty, const fnode_t *n,
                      const uint32_t *left, const sim_job_t *j,
                      const uint32_t *fit, uint32_t *gpu) {
  uint64_t gl = gleft(n, left), req = (uint64_t)j->ngpus * j->milli;
  *gpu = fit[0];
  switch (place) {
  case FP_DOTPROD: {
    double dot = (double)n->cpu / 128000.0 * (double)j->cpu_milli / 128000.0 +
                 (double)gl / 8000.0 * (double)req / 8000.0;
    return (int64_t)(100.0 * (1.0 - dot / 2.0));
  }
  case FP_CLUSTERING: {
    if (!j->ngpus)
      return 0;
    int64_t s = 25 * (8000 - (int64_t)gl) / 8000;
    uint32_t t = tag_of(j);
    if (n->gpods == 0)
      s += 25;
    else if (n->tags[t] == n->gpods)
      s += 75;
    else if (n->tags[t] > 0)
      s += 50;
    return s;
  }
  case FP_PACKING: {
    if (!j->ngpus)
      return 0;
    uint32_t freeg = 0;
    for (uint32_t g = 0; g < n->ng; g++)
      freeg += left[n->gpu0 + g] >= 1000;
    if (freeg == n->ng) {
      int64_t a = 33 - (int64_t)freeg, b = freeg;
      return a > b ? a : b;
    }
    uint32_t k = j->ngpus, chosen_free = 0;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < k; i++) {
      uint32_t l = left[n->gpu0 + fit[i]];
      chosen_free += l >= 1000;
      sum += l * 100 / 1000;
    }
    if (chosen_free) {
      int64_t a = 50 - (int64_t)chosen_free;
      return a > 33 ? a : 33;
    }
    int64_t a = 100 - (int64_t)sum / 10;
    return a > 50 ? a : 50;
  }
  case FP_BESTFIT: {
    double x = 0.5 * (double)(n->cpu - (int64_t)j->cpu_milli) / 128000.0 +
               0.5 * ((double)gl - (double)req) / 8000.0;
    return (int64_t)(100.0 * (1.0 - x));
  }
  case FP_FGD: {
    uint32_t before[SIM_MAX_NODE_GPUS], after[SIM_MAX_NODE_GPUS];
    memcpy(before, left + n->gpu0, n->ng * sizeof *before);
    if (j->ngpus == 1 && j->milli < 1000) {
      int64_t best = -1;
      for (uint32_t g = 0; g < n->ng; g++) {
        if (before[g] < j->milli)
          continue;
        bool dup = false;
        for (uint32_t q = 0; q < g && !dup; q++)
          dup = before[q] == before[g] && before[q] >= j->milli;
        if (dup)
          continue; /* same free part: same score, lower index kept */
        memcpy(after, before, n->ng * sizeof *after);
        after[g] -= j->milli;
        int64_t s = fgd_score(ty, n, before, after, j);
        if (s > best) {
          best = s;
          *gpu = g;
        }
      }
      return best;
    }
    memcpy(after, before, n->ng * sizeof *after);
    for (uint32_t i = 0; i < j->ngpus; i++)
      after[fit[i]] -= j->milli;
    return fgd_score(ty, n, before, after, j);
  }
  default:
    return 0;
  }
}

/* The records whose arrived share rounds to one point. */
typedef struct fbin_s {
  double alloc, frag, ratio;
  size_t n, nratio;
} fbin_t;

int cogpu__sim_fgd(const sim_trace_t *t, const sim_cluster_t *c,
                   const char *place, const sim_opts_t *o, double upto,
                   sim_fgd_point_t **pts, size_t *npts, size_t *failed) {
  int pl = fgd_place_id(place);
  if (pl < 0)
    return cogpu__seterr(-EINVAL,
                         "unknown FGD placement '%s' (random, dotprod, "
                         "clustering, packing, bestfit, fgd)",
                         place);
  if (!t->frac)
    return cogpu__seterr(-EINVAL, "the FGD experiment needs a trace of GPU "
                                  "shares (--format alibaba)");
  uint64_t s = o->seed;
  uint64_t cap = (uint64_t)c->ngpus * 1000, total = 0;
  for (size_t i = 0; i < t->n; i++)
    total += (uint64_t)t->jobs[i].ngpus * t->jobs[i].milli;
  /* The order: a permutation of the trace, then the drawn copies. */
  size_t n = t->n, capo = t->n * 2 + 16;
  uint32_t *order = malloc(capo * sizeof *order);
  fnode_t *nodes = calloc(c->nnodes, sizeof *nodes);
  uint32_t *left = malloc((c->ngpus ? c->ngpus : 1) * sizeof *left);
  uint32_t *perm = malloc(c->nnodes * sizeof *perm);
  typs_t ty = {0};
  size_t nbins = (size_t)upto + 3;
  fbin_t *bin = calloc(nbins, sizeof *bin);
  /* Each node's fragmentation now (thousandths of a GPU): a placement
   * changes one node's only, so the cluster's is kept as a running sum. */
  double *nfrag = malloc((c->nnodes ? c->nnodes : 1) * sizeof *nfrag);
  int rc = typical(t, true, &ty);
  if (!order || !nodes || !left || !perm || !bin || !nfrag || rc) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    order[i] = (uint32_t)i;
  for (size_t i = n; i > 1; i--) {
    size_t k = frng_below(&s, i);
    uint32_t x = order[i - 1];
    order[i - 1] = order[k];
    order[k] = x;
  }
  double limit = upto / 100.0 * (double)cap;
  for (;;) {
    uint32_t k = (uint32_t)frng_below(&s, t->n);
    const sim_job_t *j = &t->jobs[k];
    if ((double)(total + j->milli) > limit)
      break;
    total += (uint64_t)j->ngpus * j->milli;
    if (n == capo) {
      capo *= 2;
      uint32_t *no = realloc(order, capo * sizeof *no);
      if (!no) {
        rc = -ENOMEM;
        goto out;
      }
      order = no;
    }
    order[n++] = k;
  }
  for (uint32_t i = 0; i < c->nnodes; i++)
    perm[i] = i;
  for (uint32_t i = c->nnodes; i > 1; i--) {
    uint32_t k = (uint32_t)frng_below(&s, i), x = perm[i - 1];
    perm[i - 1] = perm[k];
    perm[k] = x;
  }
  uint32_t bits[SIM_MAX_MODELS];
  cogpu__sim_spec_bits(t, c, bits);
  for (uint32_t i = 0; i < c->nnodes; i++) {
    const sim_node_t *nd = &c->nodes[i];
    nodes[i] = (fnode_t){.cpu = nd->cpu_milli,
                         .mem = (int64_t)nd->host_mib,
                         .gpu0 = nd->gpu0,
                         .ng = nd->ngpus,
                         .rank = perm[i],
                         .bit = bits[nd->model]};
    for (uint32_t g = 0; g < nd->ngpus; g++)
      left[nd->gpu0 + g] = 1000;
  }
  uint64_t arrived = 0, used = 0;
  double frag = 0;
  for (uint32_t i = 0; i < c->nnodes; i++) {
    const fnode_t *nd = &nodes[i];
    nfrag[i] =
        node_frag(&ty, left + nd->gpu0, nd->ng, (uint64_t)nd->cpu, 0, nd->bit);
    frag += nfrag[i];
  }
  *failed = 0;
  uint32_t *feas = malloc(c->nnodes * sizeof *feas);
  if (!feas) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const sim_job_t *j = &t->jobs[order[i]];
    uint32_t jmask = j->spec && j->ngpus ? t->spec_mask[j->spec - 1] : 0;
    uint32_t fit[SIM_MAX_NODE_GPUS], bfit[SIM_MAX_NODE_GPUS];
    uint32_t best = SIM_NONE, bgpu = 0, nf = 0;
    int64_t bscore = INT64_MIN;
    for (uint32_t x = 0; x < c->nnodes; x++) {
      const fnode_t *nd = &nodes[x];
      if (!ffit(nd, left, j, jmask, fit))
        continue;
      feas[nf++] = x;
      if (pl == FP_RANDOM)
        continue;
      uint32_t gpu;
      int64_t sc = fscore(pl, &ty, nd, left, j, fit, &gpu);
      if (sc > bscore || (sc == bscore && nd->rank < nodes[best].rank)) {
        bscore = sc;
        best = x;
        bgpu = gpu;
        memcpy(bfit, fit, sizeof fit);
      }
    }
    if (pl == FP_RANDOM && nf) {
      best = feas[frng_below(&s, nf)];
      ffit(&nodes[best], left, j, jmask, bfit);
      if (j->ngpus == 1 && j->milli < 1000) {
        /* A uniform pick among the GPUs it fits on. */
        uint32_t seen = 0;
        for (uint32_t g = 0; g < nodes[best].ng; g++)
          if (left[nodes[best].gpu0 + g] >= j->milli &&
              frng_below(&s, ++seen) == 0)
            bgpu = g;
      } else {
        bgpu = bfit[0];
      }
    }
    arrived += (uint64_t)j->ngpus * j->milli;
    if (best == SIM_NONE) {
      (*failed)++;
    } else {
      fnode_t *nd = &nodes[best];
      nd->cpu -= j->cpu_milli;
      nd->mem -= (int64_t)j->host_mib;
      if (j->ngpus == 1 && j->milli < 1000) {
        left[nd->gpu0 + bgpu] -= j->milli;
      } else {
        for (uint32_t g = 0; g < j->ngpus; g++)
          left[nd->gpu0 + bfit[g]] -= j->milli;
      }
      used += (uint64_t)j->ngpus * j->milli;
      if (j->ngpus) {
        nd->tags[tag_of(j)]++;
        nd->gpods++;
      }
      frag -= nfrag[best];
      nfrag[best] = node_frag(&ty, left + nd->gpu0, nd->ng,
                              nd->cpu < 0 ? 0 : (uint64_t)nd->cpu, 0, nd->bit);
      frag += nfrag[best];
    }
    /* The artifact's merge: the arrived share rounded half to even, the
     * allocation rounded to 0.01 %. */
    double a = nearbyint((double)arrived / c->ngpus / 10.0);
    double u = nearbyint((double)used / c->ngpus / 10.0 * 100.0) / 100.0;
    if (a >= 0 && a < (double)nbins) {
      fbin_t *b = &bin[(size_t)a];
      b->alloc += u;
      b->n++;
      /* Fragmentation as the artifact reports it: the amount as a share
       * of the cluster's GPUs, and the ratio to the idle GPU (none idle:
       * no ratio, as its NaN that the mean skips). */
      b->frag += frag / 10.0 / c->ngpus;
      uint64_t idle = cap - used;
      if (idle) {
        b->ratio += 100.0 * frag / (double)idle;
        b->nratio++;
      }
    }
  }
  free(feas);
  *npts = 0;
  *pts = malloc(nbins * sizeof **pts);
  if (!*pts) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t k = 0; k + 2 < nbins; k++) {
    fbin_t b = bin[k];
    if (!b.n) {
      /* None rounded to k: those within one point of it. */
      for (size_t q = k ? k - 1 : 0; q <= k + 1 && q < nbins; q++) {
        b.alloc += bin[q].alloc;
        b.frag += bin[q].frag;
        b.ratio += bin[q].ratio;
        b.n += bin[q].n;
        b.nratio += bin[q].nratio;
      }
    }
    if (!b.n)
      continue;
    (*pts)[(*npts)++] = (sim_fgd_point_t){
        .arrived = (double)k,
        .alloc = b.alloc / (double)b.n,
        .frag = b.frag / (double)b.n,
        .frag_ratio = b.nratio ? b.ratio / (double)b.nratio : 0};
  }
out:
  free(order);
  free(nodes);
  free(left);
  free(perm);
  free(ty.v);
  free(bin);
  free(nfrag);
  return rc == -ENOMEM ? cogpu__seterr(rc, "out of memory") : rc;
}
