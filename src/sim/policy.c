/*
 * policy.c: the simulator's policies, each behind sim_policy_t
 * (docs/simulation.md, "Policies"):
 *  - exclusive: a job gets whole GPUs (the baseline);
 *  - shares: N jobs per GPU whatever their memory (Slurm's shards);
 *  - cogpu[:firstfit|bestfit|fgd]: packing by memory, each node deciding
 *    by the ledger's core;
 *  - cogpu+suspend[:...]: cogpu, and a job that finds no room suspends
 *    lower-priority jobs to host memory;
 *  - rqueue-links: exclusive, and a multi-GPU job that finds no node with
 *    enough idle GPUs runs on idle GPUs of other nodes, a fixed factor
 *    slower, with at most remote_links per node (cogpu's first, simpler
 *    reading of seed 002; gqueue and rqueue, its paper's own, are in
 *    rqueue.c);
 *  - colocate and latency: seed 001's cluster-level policies (cluster.c).
 * What a booking means on a GPU (the kind) is the engine's; a policy
 * chooses GPUs (find) and what to do when there are none (fallback).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sim/engine-int.h"

/* --- finding GPUs -----------------------------------------------------------
 */

/* The first GPUs (in the cluster's order) where j fits: one node for a
 * job no larger than a node, whole idle nodes otherwise. */
static bool find_first(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  uint32_t k = r->t->jobs[j].ngpus;
  uint64_t need = cogpu__sim_need_key(r, j);
  if (k > r->c->max_node_gpus)
    return cogpu__sim_whole_nodes(r, j, s);
  for (uint32_t g = cogpu__sim_index_first(r, 0, need); g != SIM_NONE;) {
    const sim_node_t *nd = &r->c->nodes[r->c->gpu_node[g]];
    uint32_t got = 0;
    for (uint32_t x = g; x < nd->gpu0 + nd->ngpus && got < k; x++)
      if (r->key[x] >= need && cogpu__sim_gpu_ok(r, j, x))
        s->gpus[got++] = x;
    if (got == k) {
      s->ngpus = k;
      return true;
    }
    g = cogpu__sim_index_first(r, nd->gpu0 + nd->ngpus, need);
  }
  return false;
}

/* The GPU that j leaves least free (ties: the lower index); for a job of
 * several GPUs, the node whose GPUs it leaves least free in total, using
 * the least free of them. */
static bool find_best(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  uint32_t k = r->t->jobs[j].ngpus;
  uint64_t need = cogpu__sim_need_key(r, j);
  if (k > r->c->max_node_gpus)
    return cogpu__sim_whole_nodes(r, j, s);
  if (k == 1) {
    for (uint32_t g = cogpu__sim_index_best(r, need, 0, SIM_NONE);
         g != SIM_NONE; g = cogpu__sim_index_best(r, need, r->key[g], g))
      if (cogpu__sim_gpu_ok(r, j, g)) {
        s->gpus[0] = g;
        s->ngpus = 1;
        return true;
      }
    return false;
  }
  /* Nodes from the least free in total (the sum of their keys; ties: the
   * lower index): the first with k GPUs where j fits is the one it leaves
   * least free, without weighing every node with room. */
  for (uint32_t n = cogpu__sim_index_node_next(r, 0, SIM_NONE); n != SIM_NONE;
       n = cogpu__sim_index_node_next(r, r->nsum[n], n)) {
    const sim_node_t *nd = &r->c->nodes[n];
    if (r->nsum[n] < (uint64_t)k * need)
      continue; /* too little free in all: no k GPUs of need */
    uint32_t cand[SIM_MAX_NODE_GPUS], nc = 0;
    for (uint32_t x = nd->gpu0; x < nd->gpu0 + nd->ngpus; x++)
      if (r->key[x] >= need && cogpu__sim_gpu_ok(r, j, x))
        cand[nc++] = x;
    if (nc < k)
      continue;
    /* The k least free, by insertion (a node has at most 16). */
    for (uint32_t a = 1; a < nc; a++)
      for (uint32_t b = a; b > 0 && r->key[cand[b]] < r->key[cand[b - 1]];
           b--) {
        uint32_t t = cand[b];
        cand[b] = cand[b - 1];
        cand[b - 1] = t;
      }
    memcpy(s->gpus, cand, k * sizeof *cand);
    s->ngpus = k;
    return true;
  }
  return false;
}

static bool find_placement(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  switch (r->p->place) {
  case SIM_BESTFIT:
    return find_best(r, j, s);
  case SIM_FGD:
    if (r->t->jobs[j].ngpus > r->c->max_node_gpus)
      return cogpu__sim_whole_nodes(r, j, s);
    return cogpu__sim_fgd_find(r, j, s);
  default:
    return find_first(r, j, s);
  }
}

/* --- cogpu+suspend: preemption by priority -------------------------------- */

typedef struct victim_s {
  uint32_t job;
  int32_t prio;
  uint64_t ticket, bytes;
} victim_t;

/* victim_before's order on jobs: the lowest priority, then the newest. */
static int cmp_victim(const void *a, const void *b) {
  const victim_t *x = a, *y = b;
  cogpu__core_entry_t ex = {.priority = x->prio, .ticket = x->ticket};
  cogpu__core_entry_t ey = {.priority = y->prio, .ticket = y->ticket};
  if (cogpu__core_victim_before(&ex, &ey))
    return -1;
  if (cogpu__core_victim_before(&ey, &ex))
    return 1;
  return x->job < y->job ? -1 : x->job > y->job;
}

/* May j (its gpu_spec) use node n's GPUs? */
static bool spec_node(const sim_run_t *r, uint32_t j, uint32_t n) {
  return cogpu__sim_spec_ok(r->t, &r->t->jobs[j],
                            r->model_bit[r->c->nodes[n].model]);
}

int cogpu__sim_suspend_pick(sim_run_t *r, uint32_t j,
                            bool (*may)(const sim_run_t *r, uint32_t j,
                                        uint32_t h),
                            uint32_t *out, uint32_t *nout, uint32_t *gpu) {
  const sim_job_t *jb = &r->t->jobs[j];
  if (jb->ngpus != 1)
    return 0;
  victim_t v[64];
  for (uint32_t g = 0; g < r->c->ngpus; g++) {
    uint32_t n = r->c->gpu_node[g];
    if (r->nq[n].n || r->gpu[g].excl || !spec_node(r, j, n))
      continue;
    uint64_t need = cogpu__sim_need_bytes(r, j, g);
    uint64_t room = cogpu__core_free(&r->gpu[g]);
    if (need > r->cap[g])
      continue;
    /* Under a bound on clients per GPU (vGPUs), a full GPU needs one
     * client out whatever memory is free (none without a bound). */
    uint64_t mc = r->rules.max_clients, nc = r->gpu[g].nclients;
    uint32_t min_take = mc && nc >= mc ? (uint32_t)(nc - mc + 1) : 0;
    uint32_t nv = 0;
    uint64_t could = room;
    for (uint32_t sl = r->hhead[g]; sl != SIM_NONE && nv < 64;
         sl = r->hnext[sl]) {
      uint32_t h = cogpu__sim_slot_job(r, sl);
      const sim_js_t *hs = &r->js[h];
      if (hs->st != JS_RUN || hs->nslot != 1 || !may(r, j, h) || r->jh[sl] == 0)
        continue;
      v[nv++] = (victim_t){.job = h,
                           .prio = r->t->jobs[h].prio,
                           .ticket = hs->ticket,
                           .bytes = r->jh[sl]};
      could += r->jh[sl];
    }
    if (could < need || nv < min_take)
      continue;
    qsort(v, nv, sizeof *v, cmp_victim);
    const sim_node_t *nd = &r->c->nodes[n];
    uint64_t host = nd->host_mib > r->o->host_reserve_mib
                        ? nd->host_mib - r->o->host_reserve_mib
                        : 0;
    uint64_t parked = r->susp_mib[n], got = room;
    uint32_t take = 0;
    while ((got < need || take < min_take) && take < nv) {
      parked += (v[take].bytes + (1 << 20) - 1) >> 20;
      got += v[take].bytes;
      take++;
    }
    if (got < need || take < min_take || parked > host)
      continue;
    for (uint32_t i = 0; i < take; i++)
      out[i] = v[i].job;
    *nout = take;
    *gpu = g;
    return 1;
  }
  return 0;
}

/* cogpu+suspend's victims: lower priority than the job that waits. */
static bool may_prio(const sim_run_t *r, uint32_t j, uint32_t h) {
  return r->t->jobs[h].prio < r->t->jobs[j].prio;
}

/* A one-GPU job that finds no room suspends running one-GPU jobs of lower
 * priority on the first GPU where that makes room and the node's host
 * memory can take them; it then waits there for their memory, ahead of
 * their resumes. */
static int fallback_suspend(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  (void)s;
  if (r->t->jobs[j].prio <= 0)
    return 0;
  uint32_t v[64], nv = 0, g = 0;
  if (!cogpu__sim_suspend_pick(r, j, may_prio, v, &nv, &g))
    return 0;
  for (uint32_t i = 0; i < nv; i++)
    cogpu__sim_suspend(r, v[i]);
  int rc = cogpu__sim_enqueue_start(r, j, g);
  return rc ? rc : 2;
}

/* --- rqueue: remote GPUs ----------------------------------------------------
 */

/* Idle GPUs of node n (exclusive keys: 1 for an idle GPU). */
static uint32_t idle_on(const sim_run_t *r, uint32_t n) {
  const sim_node_t *nd = &r->c->nodes[n];
  uint32_t c = 0;
  for (uint32_t g = nd->gpu0; g < nd->gpu0 + nd->ngpus; g++)
    c += r->key[g] > 0;
  return c;
}

/* A job of several GPUs that no node (or set of idle nodes) can hold: it
 * runs on the node with the most idle GPUs and uses idle GPUs of other
 * nodes over the network, each remote GPU taking a link at both ends
 * (remote_links per node), at remote_slowdown. */
static int fallback_remote(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  uint32_t k = r->t->jobs[j].ngpus, L = r->o->remote_links;
  if (k < 2 || L == 0)
    return 0;
  /* Fewer GPUs anywhere than it needs (an overloaded queue's usual case):
   * no need to look at every node. */
  if (r->nkeyed < k)
    return 0;
  uint32_t home = SIM_NONE, best = 0;
  for (uint32_t n = 0; n < r->c->nnodes; n++) {
    if (!spec_node(r, j, n))
      continue;
    uint32_t c = idle_on(r, n);
    if (c > best && r->links[n] < L) {
      best = c;
      home = n;
    }
  }
  if (home == SIM_NONE || best >= k)
    return 0;
  uint32_t remote = k - best;
  if (r->links[home] + remote > L)
    return 0;
  uint32_t got = 0;
  const sim_node_t *hd = &r->c->nodes[home];
  for (uint32_t g = hd->gpu0; g < hd->gpu0 + hd->ngpus; g++)
    if (r->key[g] > 0)
      s->gpus[got++] = g;
  uint32_t used[SIM_MAX_NODE_GPUS * 64], nu = 0;
  for (uint32_t n = 0; n < r->c->nnodes && got < k; n++) {
    if (n == home || r->links[n] >= L || !spec_node(r, j, n))
      continue;
    const sim_node_t *nd = &r->c->nodes[n];
    uint32_t here = 0;
    for (uint32_t g = nd->gpu0;
         g < nd->gpu0 + nd->ngpus && got < k && r->links[n] + here < L; g++)
      if (r->key[g] > 0) {
        s->gpus[got++] = g;
        here++;
      }
    if (here && nu < COGPU_ARRAY_SIZE(used))
      used[nu++] = n;
  }
  if (got < k)
    return 0;
  /* Book the links: the engine books the GPUs. */
  r->links[home] += remote;
  for (uint32_t g = best; g < k; g++)
    r->links[r->c->gpu_node[s->gpus[g]]]++;
  s->ngpus = k;
  s->nremote = remote;
  return 1;
}

static int finish_remote(sim_run_t *r, uint32_t j) {
  const sim_js_t *s = &r->js[j];
  if (!s->remote || s->nslot == 0)
    return 0;
  uint32_t home = r->c->gpu_node[r->jg[r->goff[j]]];
  for (uint32_t k = 0; k < s->nslot; k++) {
    uint32_t n = r->c->gpu_node[r->jg[r->goff[j] + k]];
    if (n != home) {
      r->links[n]--;
      r->links[home]--;
    }
  }
  return 0;
}

/* --- the table -------------------------------------------------------------
 */

static const struct {
  const char *name;
  int kind;
  bool suspend, remote;
} bases[] = {{"exclusive", SIM_EXCLUSIVE, false, false},
             {"shares", SIM_SHARES, false, false},
             {"cogpu", SIM_COGPU, false, false},
             {"cogpu+suspend", SIM_COGPU, true, false},
             {"rqueue-links", SIM_EXCLUSIVE, false, true}};

int cogpu__sim_policy(const char *name, sim_policy_t *p) {
  /* Seed 002's two queues, as its paper defines them (rqueue.c). */
  if (!strcmp(name, "gqueue") || !strcmp(name, "rqueue"))
    return cogpu__sim_rq_policy(name, p);
  /* Seed 001's cluster-level policies (cluster.c). */
  if (!strcmp(name, "colocate") || !strcmp(name, "latency"))
    return cogpu__sim_cl_policy(name, p);
  memset(p, 0, sizeof *p);
  const char *colon = strchr(name, ':');
  size_t bl = colon ? (size_t)(colon - name) : strlen(name);
  int b = -1;
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bases); i++)
    if (strlen(bases[i].name) == bl && !strncmp(bases[i].name, name, bl))
      b = (int)i;
  if (b < 0)
    return cogpu__seterr(-EINVAL,
                         "unknown policy '%s' (exclusive, shares, "
                         "cogpu[:firstfit|bestfit|fgd], cogpu+suspend[:...], "
                         "gqueue, rqueue, rqueue-links, colocate, latency)",
                         name);
  p->name = name;
  p->kind = bases[b].kind;
  p->suspend = bases[b].suspend;
  p->remote = bases[b].remote;
  /* cogpu packs by best fit unless told; the others fill in order, as
   * Slurm's default node selection does. */
  p->place = p->kind == SIM_COGPU ? SIM_BESTFIT : SIM_FIRSTFIT;
  if (colon) {
    const char *pl = colon + 1;
    if (!strcmp(pl, "firstfit"))
      p->place = SIM_FIRSTFIT;
    else if (!strcmp(pl, "bestfit"))
      p->place = SIM_BESTFIT;
    else if (!strcmp(pl, "fgd"))
      p->place = SIM_FGD;
    else
      return cogpu__seterr(-EINVAL,
                           "unknown placement '%s' in policy '%s' (firstfit, "
                           "bestfit, fgd)",
                           pl, name);
  }
  p->find = find_placement;
  if (p->suspend)
    p->fallback = fallback_suspend;
  if (p->remote) {
    p->fallback = fallback_remote;
    p->on_finish = finish_remote;
  }
  return 0;
}
