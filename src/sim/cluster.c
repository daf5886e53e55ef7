/*
 * cluster.c: seed 001's cluster-level scheduler (Sajjapongse's
 * dissertation with Becchi, chapter 4; docs/simulation.md, "The cluster
 * policies (seed 001)"): its scheduling API (Table 4-1) as a small
 * interface over the run (engine-int.h, cogpu__sim_cl_*), and the two
 * policies the seed ships, written on that interface only:
 *  - colocate (Listing 4-2): every node shares its GPUs memory-safely
 *    (cogpu's booking) among at most --shares vGPUs per GPU; a job's
 *    processes all go on the one node with the most free vGPUs (the
 *    node's weight less the processes on it), the stronger (larger GPUs)
 *    on a tie; a job larger than any node takes whole idle nodes;
 *  - latency (Listing 4-3): colocate, with short jobs tried before long
 *    ones, and a short one-GPU job that finds no room suspending running
 *    long ones (device limit 0) where that makes room; they resume when
 *    room returns on their GPU.
 * A job is short when its trace run time is at most the median of the
 * trace's GPU jobs: the seed assumes lengths known from profiling, and
 * the trace's own run time stands in for that knowledge.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sim/engine-int.h"

typedef struct cl_s {
  uint32_t *vgpus; /* per node: processes a GPU may hold */
  /* Nodes by free vGPUs: a bit set per count (0 .. top_w), over the
   * nodes' ranks (the larger GPUs first, then the lower number), so that
   * colocate walks the nodes from the best down. */
  uint32_t *nfree; /* per node: its free vGPUs, as indexed */
  uint64_t *nmax;  /* per node, max_node_gpus each: node_keys */
  /* For each k, the largest k-th key of any node (a max tree over the
   * nodes, segp leaves): a job of k GPUs whose need is above it fits on no
   * node, found at once. */
  uint64_t *kmax;
  uint32_t segp;
  uint32_t *rank;    /* per node: its rank */
  uint32_t *byrank;  /* per rank: the node */
  uint64_t *bits;    /* (top_w + 1) x words */
  uint32_t words;    /* 64-bit words per count */
  uint32_t top_w;    /* the largest node weight (GPUs x vGPUs) */
  int64_t short_max; /* latency: the longest run time that is short, ms */
} cl_t;

/* --- the API (Table 4-1) ------------------------------------------------ */

uint32_t cogpu__sim_cl_nodes(const sim_run_t *r) {
  return r->c->nnodes;
}

void cogpu__sim_cl_query(const sim_run_t *r, uint32_t n, sim_cl_node_t *out) {
  const cl_t *cl = r->cl;
  const sim_node_t *nd = &r->c->nodes[n];
  out->ngpus = nd->ngpus;
  out->vgpus = cl->vgpus[n];
  out->gpu_total = nd->gpu_total;
  out->waiting = r->nq[n].n;
  out->procs = 0;
  for (uint32_t g = nd->gpu0; g < nd->gpu0 + nd->ngpus; g++)
    out->procs += (uint32_t)r->gpu[g].nclients;
}

int cogpu__sim_cl_set_sharing(sim_run_t *r, uint32_t n, int kind) {
  if (n >= r->c->nnodes)
    return -EINVAL;
  return kind == r->p->kind ? 0 : -ENOTSUP;
}

/* The largest node weight: the most free vGPUs a node can have. */
static void cl_top(sim_run_t *r) {
  cl_t *cl = r->cl;
  cl->top_w = 0;
  for (uint32_t n = 0; n < r->c->nnodes; n++) {
    uint32_t w = r->c->nodes[n].ngpus * cl->vgpus[n];
    if (w > cl->top_w)
      cl->top_w = w;
  }
}

static uint32_t free_vgpus(const sim_run_t *r, uint32_t n);

static void bit_set(cl_t *cl, uint32_t f, uint32_t rk, bool on) {
  uint64_t *w = &cl->bits[(size_t)f * cl->words + rk / 64];
  uint64_t m = 1ull << (rk % 64);
  *w = on ? *w | m : *w & ~m;
}

/* The placement keys (free memory) of node n's GPUs that have a free
 * vGPU, largest first: a node whose k-th largest is below j's need cannot
 * hold j's k processes and is passed over at one comparison (under
 * overload, most nodes at every failed try). */
static void node_keys(const sim_run_t *r, uint32_t n) {
  cl_t *cl = r->cl;
  const sim_node_t *nd = &r->c->nodes[n];
  uint64_t *top = &cl->nmax[(size_t)n * r->c->max_node_gpus];
  uint32_t c = 0;
  for (uint32_t x = nd->gpu0; x < nd->gpu0 + nd->ngpus; x++) {
    uint64_t k = r->gpu[x].nclients < cl->vgpus[n] ? r->key[x] : 0;
    uint32_t i = c++;
    for (; i > 0 && top[i - 1] < k; i--)
      top[i] = top[i - 1];
    top[i] = k;
  }
  for (; c < r->c->max_node_gpus; c++)
    top[c] = 0;
  if (!cl->kmax)
    return;
  for (uint32_t k = 0; k < r->c->max_node_gpus; k++) {
    uint64_t *t = &cl->kmax[(size_t)k * 2 * cl->segp];
    uint32_t i = cl->segp + n;
    t[i] = top[k];
    for (i /= 2; i > 0; i /= 2)
      t[i] = t[2 * i] > t[2 * i + 1] ? t[2 * i] : t[2 * i + 1];
  }
}

/* GPU g changed: its node moves to the set of its new free count. */
static void cl_on_gpu(sim_run_t *r, uint32_t g) {
  cl_t *cl = r->cl;
  if (!cl || !cl->bits)
    return; /* the run's set-up, before the index exists */
  uint32_t n = r->c->gpu_node[g], f = free_vgpus(r, n);
  node_keys(r, n);
  if (f == cl->nfree[n])
    return;
  bit_set(cl, cl->nfree[n], cl->rank[n], false);
  bit_set(cl, f, cl->rank[n], true);
  cl->nfree[n] = f;
}

/* A node's rank key: the larger GPUs first, then the lower number. */
typedef struct rank_key_s {
  uint64_t mem;
  uint32_t n;
} rank_key_t;

static int cmp_rank(const void *a, const void *b) {
  const rank_key_t *x = a, *y = b;
  if (x->mem != y->mem)
    return x->mem > y->mem ? -1 : 1;
  return x->n < y->n ? -1 : x->n > y->n;
}

/* (Re)builds the index of nodes by free vGPUs (after a vGPU count changed:
 * the counts' range may have). */
static int cl_index(sim_run_t *r) {
  cl_t *cl = r->cl;
  uint32_t nn = r->c->nnodes;
  free(cl->bits);
  cl->words = (nn + 63) / 64;
  cl->bits = calloc(((size_t)cl->top_w + 1) * (cl->words ? cl->words : 1),
                    sizeof *cl->bits);
  if (!cl->bits)
    return -ENOMEM;
  rank_key_t *keys = malloc((nn ? nn : 1) * sizeof *keys);
  if (!keys)
    return -ENOMEM;
  for (uint32_t i = 0; i < nn; i++)
    keys[i] = (rank_key_t){.mem = r->c->nodes[i].gpu_total, .n = i};
  qsort(keys, nn, sizeof *keys, cmp_rank);
  for (uint32_t i = 0; i < nn; i++) {
    cl->byrank[i] = keys[i].n;
    cl->rank[keys[i].n] = i;
  }
  free(keys);
  free(cl->kmax);
  cl->kmax = NULL;
  for (cl->segp = 1; cl->segp < nn; cl->segp *= 2)
    ;
  cl->kmax = calloc((size_t)(r->c->max_node_gpus ? r->c->max_node_gpus : 1) *
                        2 * cl->segp,
                    sizeof *cl->kmax);
  if (!cl->kmax)
    return -ENOMEM;
  for (uint32_t n = 0; n < nn; n++) {
    node_keys(r, n);
    cl->nfree[n] = free_vgpus(r, n);
    bit_set(cl, cl->nfree[n], cl->rank[n], true);
  }
  return 0;
}

int cogpu__sim_cl_set_vgpus(sim_run_t *r, uint32_t n, uint32_t v) {
  cl_t *cl = r->cl;
  if (n >= r->c->nnodes || v == 0 || v > 1024)
    return -EINVAL;
  cl->vgpus[n] = v;
  /* The core bounds the clients of every GPU (max_clients), resumes
   * included, with one figure for the run: the largest count set.
   * Placement holds each node to its own. */
  if (v > r->rules.max_clients)
    r->rules.max_clients = v;
  cl_top(r);
  return cl->bits ? cl_index(r) : 0;
}

int cogpu__sim_cl_set_limit(sim_run_t *r, uint32_t j, uint32_t gpus) {
  const sim_js_t *s = &r->js[j];
  if (gpus >= r->t->jobs[j].ngpus)
    return 0; /* its full count: a suspended job's resume is queued */
  if (gpus > 0 || s->st != JS_RUN || s->nslot != 1)
    return -ENOTSUP;
  cogpu__sim_suspend(r, j);
  return 0;
}

/* --- colocate (Listing 4-2) --------------------------------------------- */

/* Free vGPUs of node n (its weight less the processes on it). */
static uint32_t free_vgpus(const sim_run_t *r, uint32_t n) {
  sim_cl_node_t q;
  cogpu__sim_cl_query(r, n, &q);
  uint32_t w = q.ngpus * q.vgpus;
  return q.procs < w ? w - q.procs : 0;
}

/* May j's process go on GPU g of node n now (its memory, and a vGPU)? */
static bool gpu_fits(const sim_run_t *r, uint32_t j, uint32_t n, uint32_t g,
                     uint64_t need) {
  const cl_t *cl = r->cl;
  return r->key[g] >= need && r->gpu[g].nclients < cl->vgpus[n] &&
         cogpu__sim_gpu_ok(r, j, g);
}

/* Does node n hold all k of j's processes now (k GPUs where j fits)? */
static bool node_holds(const sim_run_t *r, uint32_t j, uint32_t n, uint32_t k,
                       uint64_t need) {
  const cl_t *cl = r->cl;
  if (cl->nmax[(size_t)n * r->c->max_node_gpus + k - 1] < need)
    return false;
  const sim_node_t *nd = &r->c->nodes[n];
  uint32_t fit = 0;
  for (uint32_t x = nd->gpu0; x < nd->gpu0 + nd->ngpus && fit < k; x++)
    fit += gpu_fits(r, j, n, x, need);
  return fit == k;
}

/* The node with the most free vGPUs that holds all of j's processes (one
 * per GPU) now; ties: the larger GPUs, then the lower number. Within it,
 * the GPUs with the fewest processes (ties: the most free memory, then
 * the lower number), as the node's round-robin sharing would spread
 * them. */
static bool cl_find(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  const cl_t *cl = r->cl;
  uint32_t k = r->t->jobs[j].ngpus;
  if (k > r->c->max_node_gpus)
    return cogpu__sim_whole_nodes(r, j, s); /* the fewest nodes: whole */
  uint64_t need = cogpu__sim_need_key(r, j);
  if (cl->kmax[(size_t)(k - 1) * 2 * cl->segp + 1] < need)
    return false; /* no node has k GPUs with a vGPU and the memory */
  uint32_t best = SIM_NONE;
  /* From the most free vGPUs down (at least k: a vGPU per process), each
   * count in rank order: the first node that holds j is the answer. A
   * node without a GPU of j's memory is passed over at one comparison. */
  for (uint32_t f = cl->top_w + 1; f-- > k && best == SIM_NONE;) {
    const uint64_t *b = &cl->bits[(size_t)f * cl->words];
    for (uint32_t w = 0; w < cl->words && best == SIM_NONE; w++)
      for (uint64_t m = b[w]; m; m &= m - 1) {
        uint32_t n = cl->byrank[w * 64 + (uint32_t)__builtin_ctzll(m)];
        if (node_holds(r, j, n, k, need)) {
          best = n;
          break;
        }
      }
  }
  if (best == SIM_NONE)
    return false;
  const sim_node_t *nd = &r->c->nodes[best];
  uint32_t cand[SIM_MAX_NODE_GPUS], nc = 0;
  for (uint32_t x = nd->gpu0; x < nd->gpu0 + nd->ngpus; x++)
    if (gpu_fits(r, j, best, x, need))
      cand[nc++] = x;
  /* By insertion (a node has at most 16 GPUs). */
  for (uint32_t a = 1; a < nc; a++)
    for (uint32_t b = a; b > 0; b--) {
      uint32_t x = cand[b], y = cand[b - 1];
      uint64_t cx = r->gpu[x].nclients, cy = r->gpu[y].nclients;
      if (cx > cy || (cx == cy && r->key[x] <= r->key[y]))
        break;
      cand[b] = y;
      cand[b - 1] = x;
    }
  memcpy(s->gpus, cand, k * sizeof *cand);
  s->ngpus = k;
  return true;
}

/* --- latency (Listing 4-3) ---------------------------------------------- */

static bool is_short(const sim_run_t *r, uint32_t j) {
  const cl_t *cl = r->cl;
  return r->t->jobs[j].dur <= cl->short_max;
}

/* Short jobs are tried first (sorting the unassigned-job queue). */
static uint32_t cl_rank(const sim_run_t *r, uint32_t j) {
  return is_short(r, j) ? 1 : 0;
}

static bool may_long(const sim_run_t *r, uint32_t j, uint32_t h) {
  (void)j;
  return !is_short(r, h);
}

/* A short job that found no room: suspend long jobs (device limit 0). The
 * seed suspends every long job once all GPUs are taken; here only those
 * whose suspension makes room for it on one GPU, so that no copy is made
 * for nothing; it then waits there for their memory, ahead of their
 * resumes. */
static int cl_fallback(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  (void)s;
  if (!is_short(r, j))
    return 0;
  uint32_t v[64], nv = 0, g = 0;
  if (!cogpu__sim_suspend_pick(r, j, may_long, v, &nv, &g))
    return 0;
  for (uint32_t i = 0; i < nv; i++) {
    int rc = cogpu__sim_cl_set_limit(r, v[i], 0);
    if (rc)
      return rc;
  }
  int rc = cogpu__sim_enqueue_start(r, j, g);
  return rc ? rc : 2;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* --- set-up ---------------------------------------------------------------
 */

static void cl_fini(sim_run_t *r) {
  cl_t *cl = r->cl;
  if (!cl)
    return;
  free(cl->vgpus);
  free(cl->nfree);
  free(cl->nmax);
  free(cl->kmax);
  free(cl->rank);
  free(cl->byrank);
  free(cl->bits);
  free(cl);
  r->cl = NULL;
}

/* Scheduler_Main's initialisation: every node shares memory-safely with
 * --shares vGPUs per GPU (the seed's n-way sharing; 4 was its best). */
static int cl_init(sim_run_t *r) {
  cl_t *cl = calloc(1, sizeof *cl);
  if (!cl)
    return -ENOMEM;
  r->cl = cl;
  uint32_t nn = cogpu__sim_cl_nodes(r);
  cl->vgpus = calloc(nn ? nn : 1, sizeof *cl->vgpus);
  cl->nfree = calloc(nn ? nn : 1, sizeof *cl->nfree);
  cl->nmax = calloc((size_t)(nn ? nn : 1) * (r->c->max_node_gpus + 1),
                    sizeof *cl->nmax);
  cl->rank = calloc(nn ? nn : 1, sizeof *cl->rank);
  cl->byrank = calloc(nn ? nn : 1, sizeof *cl->byrank);
  if (!cl->vgpus || !cl->nfree || !cl->nmax || !cl->rank || !cl->byrank)
    return -ENOMEM;
  uint32_t v = r->o->shares ? r->o->shares : 1;
  for (uint32_t n = 0; n < nn; n++) {
    int rc = cogpu__sim_cl_set_sharing(r, n, SIM_COGPU);
    if (!rc)
      rc = cogpu__sim_cl_set_vgpus(r, n, v);
    if (rc)
      return rc;
  }
  int rc = cl_index(r);
  if (rc)
    return rc;
  /* latency: the median run time of the GPU jobs (the lower one). */
  size_t m = 0;
  for (size_t j = 0; j < r->t->n; j++)
    m += r->t->jobs[j].ngpus > 0;
  int64_t *d = malloc((m ? m : 1) * sizeof *d);
  if (!d)
    return -ENOMEM;
  m = 0;
  for (size_t j = 0; j < r->t->n; j++)
    if (r->t->jobs[j].ngpus)
      d[m++] = r->t->jobs[j].dur;
  qsort(d, m, sizeof *d, cmp_i64);
  cl->short_max = m ? d[(m - 1) / 2] : 0;
  free(d);
  return 0;
}

int cogpu__sim_cl_policy(const char *name, sim_policy_t *p) {
  memset(p, 0, sizeof *p);
  p->name = name;
  p->kind = SIM_COGPU;
  p->place = SIM_FIRSTFIT; /* its own search: no best-fit index to keep */
  p->init = cl_init;
  p->fini = cl_fini;
  p->find = cl_find;
  p->on_gpu = cl_on_gpu;
  if (!strcmp(name, "latency")) {
    /* The deadlock guard suspends too, as under cogpu+suspend. */
    p->suspend = true;
    p->fallback = cl_fallback;
    p->rank = cl_rank;
    return 0;
  }
  if (!strcmp(name, "colocate"))
    return 0;
  return cogpu__seterr(-EINVAL, "unknown policy '%s'", name);
}
