/*
 * rqueue.c: seed 002's two queues (Markthub et al., PDCAT'14;
 * docs/simulation.md, "The G and R queues"), as the paper defines them:
 *  - gqueue: TSUBAME2.5's G queue, simplified as in its Fig. 5: first come,
 *    first served, and a job's processes get whole nodes (a node holds one
 *    job, whatever GPUs of it the job leaves idle);
 *  - rqueue: the R queue of its Fig. 6: as many processes as can get whole
 *    free nodes, and each other one runs on the least occupied node with
 *    CPUs for it and uses idle GPUs of the least occupied nodes through
 *    rCUDA; run times follow its performance model (eq. 2-6), with each
 *    node's network link shared fairly by the jobs on the node.
 * A job of k GPUs on nodes of G GPUs has ceil(k / G) processes (one per
 * node, the trace's node count), its GPUs spread evenly over them.
 *
 * The model's parameters are the paper's (its Table II and section II).
 * A job's trace run time is its time alone on whole nodes (the G queue it
 * was logged on); the part that is neither network nor GPU transfer
 * (time_other) is that run time less the model's transfer terms, and the
 * run time under any sharing is time_other plus the terms then.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sim/engine-int.h"

/* Seed 002, Table II and section II (per ms, bytes in decimal GB as the
 * paper's GB/s). */
#define RQ_NET_BW 7e6       /* bytes per ms: FDR InfiniBand, net_bw */
#define RQ_GPU_GPU_BW 171e6 /* gpu_gpu_bw */
#define RQ_GPU_CPU_BW 7e6   /* gpu_cpu_bw */
#define RQ_GPU_LAT 0.99     /* ms per CUDA call, native */
#define RQ_RCUDA_LAT 3.47   /* ms per CUDA call through rCUDA */
#define RQ_OVERHEAD 1.09    /* rCUDA's bandwidth overhead */
/* The paper's estimate of a job's CUDA calls per node: uniform 100 to
 * 100,000 (Table I, gpu_call_count). */
#define RQ_CALLS_MIN 100
#define RQ_CALLS_MAX 100000

typedef struct rq_s {
  uint32_t *pres;    /* per node: jobs with a process or a GPU there */
  uint32_t *cpu;     /* per node: CPU (milli) its processes take */
  uint32_t **plist;  /* per node: those jobs */
  uint32_t *pcap;    /* per node: plist's room */
  uint64_t *boff;    /* per job: its first process in base */
  uint32_t *base;    /* per process: the node it runs on */
  double *other;     /* per job: time_other, ms */
  double *xfer;      /* per job: bytes per node and kind of transfer */
  uint32_t *calls;   /* per job: CUDA calls per node */
  uint8_t *rcuda;    /* per job: some process uses rCUDA */
  uint32_t *scratch; /* nodes a job touches */
  uint32_t *nodes;   /* a copy of them */
  uint8_t *mark;     /* per node: touched, while listing */
  uint32_t *tag;     /* per node: 1 + the job last counted there */
} rq_t;

static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Processes of job j: one per node of the largest node's size. */
static uint32_t nproc(const sim_run_t *r, uint32_t j) {
  uint32_t k = r->t->jobs[j].ngpus, g = r->c->max_node_gpus;
  return k == 0 ? 0 : (k + g - 1) / g;
}

/* GPUs of process p of job j: k spread evenly, the first ones one more. */
static uint32_t proc_gpus(const sim_run_t *r, uint32_t j, uint32_t p) {
  uint32_t k = r->t->jobs[j].ngpus, n = nproc(r, j);
  return k / n + (p < k % n);
}

static uint32_t proc_cpu(const sim_run_t *r, uint32_t j) {
  uint32_t n = nproc(r, j);
  return n ? r->t->jobs[j].cpu_milli / n : 0;
}

static void rq_fini(sim_run_t *r) {
  rq_t *q = r->rq;
  if (!q)
    return;
  for (uint32_t n = 0; q->plist && n < r->c->nnodes; n++)
    free(q->plist[n]);
  free(q->plist);
  free(q->pres);
  free(q->cpu);
  free(q->pcap);
  free(q->boff);
  free(q->base);
  free(q->other);
  free(q->xfer);
  free(q->calls);
  free(q->rcuda);
  free(q->scratch);
  free(q->nodes);
  free(q->mark);
  free(q->tag);
  free(q);
  r->rq = NULL;
}

/* The model's transfer terms of job j (ms): time_net with n jobs on its
 * nodes (eq. 4, without the connection latency, which no sharing
 * changes), plus time_gpu_comm, native (eq. 6) or through rCUDA with the
 * link's bandwidth shared by n (eq. 1, 2). */
static double terms(const rq_t *q, uint32_t j, bool rcuda, uint32_t n) {
  double d = q->xfer[j], c = q->calls[j];
  double net = d * n / RQ_NET_BW;
  if (!rcuda)
    return net + c * RQ_GPU_LAT + d / RQ_GPU_GPU_BW + d / RQ_GPU_CPU_BW;
  /* Both kinds of GPU transfer (to and from the host, between GPUs) go
   * over the network with rCUDA. */
  return net + c * RQ_RCUDA_LAT + 2 * d / (RQ_NET_BW / n) * RQ_OVERHEAD;
}

static int rq_init(sim_run_t *r) {
  const sim_trace_t *t = r->t;
  uint32_t nn = r->c->nnodes;
  rq_t *q = calloc(1, sizeof *q);
  if (!q)
    return -ENOMEM;
  r->rq = q;
  q->pres = calloc(nn, sizeof *q->pres);
  q->cpu = calloc(nn, sizeof *q->cpu);
  q->plist = calloc(nn, sizeof *q->plist);
  q->pcap = calloc(nn, sizeof *q->pcap);
  q->mark = calloc(nn, 1);
  q->tag = calloc(nn, sizeof *q->tag);
  q->boff = malloc((t->n + 1) * sizeof *q->boff);
  q->other = malloc((t->n + 1) * sizeof *q->other);
  q->xfer = malloc((t->n + 1) * sizeof *q->xfer);
  q->calls = malloc((t->n + 1) * sizeof *q->calls);
  q->rcuda = calloc(t->n + 1, 1);
  if (!q->pres || !q->cpu || !q->plist || !q->pcap || !q->mark || !q->tag ||
      !q->boff || !q->other || !q->xfer || !q->calls || !q->rcuda)
    return -ENOMEM;
  uint64_t off = 0, maxk = 0;
  for (size_t j = 0; j < t->n; j++) {
    const sim_job_t *jb = &t->jobs[j];
    uint32_t np = nproc(r, (uint32_t)j);
    q->boff[j] = off;
    off += np;
    if (jb->ngpus + np > maxk)
      maxk = jb->ngpus + np;
    /* Estimated where the trace lacks them, as the paper did (Table I):
     * calls uniform in 100..100,000 (drawn from the seed and the job, so
     * every policy of a run sees the same), bytes the memory the job asks
     * per node (its host memory, else its GPUs' memory on a process). */
    q->calls[j] =
        jb->calls
            ? jb->calls
            : RQ_CALLS_MIN +
                  (uint32_t)(mix(r->o->seed * 0x100000001b3ull ^ (uint64_t)j) %
                             (RQ_CALLS_MAX - RQ_CALLS_MIN + 1));
    double d = (double)jb->xfer;
    if (!jb->xfer && np) {
      if (jb->host_mib)
        d = (double)jb->host_mib * 1048576.0 / np;
      else {
        uint64_t per = jb->milli ? r->c->max_gpu_total / 1000 * jb->milli
                       : jb->mem ? jb->mem
                                 : r->c->max_gpu_total;
        d = (double)per * proc_gpus(r, (uint32_t)j, 0);
      }
    }
    q->xfer[j] = d;
    double o = (double)jb->dur - terms(q, (uint32_t)j, false, 1);
    q->other[j] = o > 0 ? o : 0;
  }
  q->boff[t->n] = off;
  q->base = malloc((off + 1) * sizeof *q->base);
  q->scratch = malloc((maxk + 1) * sizeof *q->scratch);
  q->nodes = malloc((maxk + 1) * sizeof *q->nodes);
  if (!q->base || !q->scratch || !q->nodes)
    return -ENOMEM;
  return 0;
}

/* The nodes job j touches (its processes' and its GPUs'), each once, in
 * q->scratch; their number. */
static uint32_t touched(sim_run_t *r, uint32_t j) {
  rq_t *q = r->rq;
  uint32_t m = 0, np = nproc(r, j);
  for (uint32_t p = 0; p < np; p++) {
    uint32_t n = q->base[q->boff[j] + p];
    if (!q->mark[n]) {
      q->mark[n] = 1;
      q->scratch[m++] = n;
    }
  }
  for (uint32_t k = 0; k < r->js[j].nslot; k++) {
    uint32_t n = r->c->gpu_node[r->jg[r->goff[j] + k]];
    if (!q->mark[n]) {
      q->mark[n] = 1;
      q->scratch[m++] = n;
    }
  }
  for (uint32_t i = 0; i < m; i++)
    q->mark[q->scratch[i]] = 0;
  return m;
}

/* j's speed from the jobs now on its nodes: the model's run time over the
 * trace's (exactly 1 alone on whole nodes, unless the model's transfer
 * terms alone outlast the trace's run time). */
static int reslow(sim_run_t *r, uint32_t j) {
  rq_t *q = r->rq;
  int64_t dur = r->t->jobs[j].dur;
  if (dur <= 0)
    return 0;
  uint32_t m = touched(r, j), n = 1;
  for (uint32_t i = 0; i < m; i++)
    if (q->pres[q->scratch[i]] > n)
      n = q->pres[q->scratch[i]];
  double slow;
  if (!q->rcuda[j] && n == 1) {
    double alone = q->other[j] + terms(q, j, false, 1);
    slow = q->other[j] > 0 ? 1.0 : alone / (double)dur;
  } else {
    slow = (q->other[j] + terms(q, j, q->rcuda[j], n)) / (double)dur;
  }
  if (slow < 1.0)
    slow = 1.0;
  return cogpu__sim_set_slow(r, j, slow);
}

/* Counts j on node n, once (finding places tentatively). */
static void touch(sim_run_t *r, uint32_t j, uint32_t n) {
  rq_t *q = r->rq;
  if (q->tag[n] != j + 1) {
    q->tag[n] = j + 1;
    q->pres[n]++;
  }
}

/* Takes j's count off node n, if it is there. */
static void untouch(sim_run_t *r, uint32_t j, uint32_t n) {
  rq_t *q = r->rq;
  if (q->tag[n] == j + 1) {
    q->tag[n] = 0;
    q->pres[n]--;
  }
}

/* Is node n free for a whole-node process of j (seed 002's
 * find_GQ_suitable_servers: no job, the CPUs, enough GPUs)? */
static bool node_free(sim_run_t *r, uint32_t j, uint32_t n, uint32_t gpus) {
  const rq_t *q = r->rq;
  const sim_node_t *nd = &r->c->nodes[n];
  if (q->pres[n] || nd->ngpus < gpus ||
      q->cpu[n] + proc_cpu(r, j) > nd->cpu_milli)
    return false;
  for (uint32_t g = nd->gpu0; g < nd->gpu0 + gpus; g++)
    if (!r->key[g] || !cogpu__sim_gpu_ok(r, j, g))
      return false;
  return true;
}

/* Takes a whole free node for process p of j (tentatively: pres and cpu
 * counted, GPUs listed in s), or false. */
static bool take_free_node(sim_run_t *r, uint32_t j, uint32_t p, sim_slot_t *s,
                           uint32_t *from) {
  rq_t *q = r->rq;
  uint32_t gpus = proc_gpus(r, j, p);
  for (uint32_t n = *from; n < r->c->nnodes; n++) {
    if (!node_free(r, j, n, gpus))
      continue;
    const sim_node_t *nd = &r->c->nodes[n];
    for (uint32_t g = nd->gpu0; g < nd->gpu0 + gpus; g++)
      s->gpus[s->ngpus++] = g;
    q->base[q->boff[j] + p] = n;
    q->cpu[n] += proc_cpu(r, j);
    touch(r, j, n);
    *from = n + 1;
    return true;
  }
  *from = r->c->nnodes;
  return false;
}

/* Undoes what finding placed tentatively for j: processes 0..np-1 and
 * the GPUs in s. */
static void revert(sim_run_t *r, uint32_t j, uint32_t np, sim_slot_t *s) {
  rq_t *q = r->rq;
  for (uint32_t p = 0; p < np; p++) {
    uint32_t n = q->base[q->boff[j] + p];
    q->cpu[n] -= proc_cpu(r, j);
    untouch(r, j, n);
  }
  for (uint32_t k = 0; k < s->ngpus; k++)
    untouch(r, j, r->c->gpu_node[s->gpus[k]]);
  s->ngpus = 0;
  s->nremote = 0;
}

/* gqueue, and the first step of rqueue: every process on a whole free
 * node, the lowest-numbered first. */
static bool find_whole(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  uint32_t np = nproc(r, j), from = 0;
  s->ngpus = s->nremote = 0;
  if (r->idle_node_gpus < r->t->jobs[j].ngpus)
    return false; /* fewer GPUs on empty nodes than it needs */
  for (uint32_t p = 0; p < np; p++)
    if (!take_free_node(r, j, p, s, &from)) {
      revert(r, j, p, s);
      return false;
    }
  ((rq_t *)r->rq)->rcuda[j] = 0;
  return true;
}

/* Is GPU g already listed in s? */
static bool listed(const sim_slot_t *s, uint32_t g) {
  for (uint32_t i = 0; i < s->ngpus; i++)
    if (s->gpus[i] == g)
      return true;
  return false;
}

/* Idle GPUs of node n that s has not taken and j may use. */
static uint32_t idle_left(sim_run_t *r, uint32_t j, uint32_t n,
                          const sim_slot_t *s) {
  const sim_node_t *nd = &r->c->nodes[n];
  uint32_t c = 0;
  for (uint32_t g = nd->gpu0; g < nd->gpu0 + nd->ngpus; g++)
    c += r->key[g] && !listed(s, g) && cogpu__sim_gpu_ok(r, j, g);
  return c;
}

/* rqueue: the processes that found no whole free node each run on the
 * least occupied node with CPUs for them (step 1) and use idle GPUs of
 * the least occupied nodes that have some through rCUDA (step 2); ties go
 * to the lower-numbered node. All or nothing (Fig. 6's revert). */
static int fallback_rcuda(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  rq_t *q = r->rq;
  uint32_t np = nproc(r, j), k = r->t->jobs[j].ngpus, from = 0, p = 0;
  s->ngpus = s->nremote = 0;
  if (r->nkeyed < k)
    return 0; /* fewer idle GPUs in all than it needs */
  while (p < np && take_free_node(r, j, p, s, &from))
    p++;
  uint32_t cpu = proc_cpu(r, j);
  for (; p < np; p++) {
    uint32_t home = SIM_NONE;
    for (uint32_t n = 0; n < r->c->nnodes; n++)
      if (q->cpu[n] + cpu <= r->c->nodes[n].cpu_milli &&
          (home == SIM_NONE || q->pres[n] < q->pres[home]))
        home = n;
    if (home == SIM_NONE)
      break;
    q->base[q->boff[j] + p] = home;
    q->cpu[home] += cpu;
    touch(r, j, home);
    uint32_t want = proc_gpus(r, j, p), got = 0;
    while (got < want) {
      uint32_t srv = SIM_NONE;
      for (uint32_t n = 0; n < r->c->nnodes; n++)
        if ((srv == SIM_NONE || q->pres[n] < q->pres[srv]) &&
            idle_left(r, j, n, s))
          srv = n;
      if (srv == SIM_NONE)
        break;
      touch(r, j, srv);
      const sim_node_t *nd = &r->c->nodes[srv];
      for (uint32_t g = nd->gpu0; g < nd->gpu0 + nd->ngpus && got < want; g++)
        if (r->key[g] && !listed(s, g) && cogpu__sim_gpu_ok(r, j, g)) {
          s->gpus[s->ngpus++] = g;
          s->nremote++;
          got++;
        }
    }
    if (got < want) {
      p++;
      break;
    }
  }
  if (s->ngpus < k) {
    revert(r, j, p, s);
    return 0;
  }
  q->rcuda[j] = 1;
  return 1;
}

/* Sets the speed of every job on the nodes in q->scratch[0..m) (j's own
 * list, copied: reslow reuses scratch). */
static int reslow_nodes(sim_run_t *r, const uint32_t *nodes, uint32_t m) {
  rq_t *q = r->rq;
  for (uint32_t i = 0; i < m; i++) {
    uint32_t n = nodes[i];
    for (uint32_t x = 0; x < q->pres[n]; x++) {
      int rc = reslow(r, q->plist[n][x]);
      if (rc)
        return rc;
    }
  }
  return 0;
}

/* Lists j on the nodes it now holds (counted there by finding), and sets
 * its speed and that of every job sharing a node with it. */
static int rq_start(sim_run_t *r, uint32_t j) {
  rq_t *q = r->rq;
  uint32_t m = touched(r, j);
  for (uint32_t i = 0; i < m; i++) {
    uint32_t n = q->scratch[i];
    /* pres[n] counts j already; plist gets it at pres[n] - 1. */
    if (q->pcap[n] < q->pres[n]) {
      uint32_t nc = q->pcap[n] ? 2 * q->pcap[n] : 4;
      while (nc < q->pres[n])
        nc *= 2;
      uint32_t *nl = realloc(q->plist[n], nc * sizeof *nl);
      if (!nl)
        return -ENOMEM;
      q->plist[n] = nl;
      q->pcap[n] = nc;
    }
    q->plist[n][q->pres[n] - 1] = j;
    q->tag[n] = 0; /* counted for good: a later find of j counts anew */
  }
  memcpy(q->nodes, q->scratch, m * sizeof *q->nodes);
  return reslow_nodes(r, q->nodes, m);
}

/* Takes j off its nodes and gives the others there their new speed. */
static int rq_finish(sim_run_t *r, uint32_t j) {
  rq_t *q = r->rq;
  uint32_t m = touched(r, j), np = nproc(r, j), cpu = proc_cpu(r, j);
  for (uint32_t p = 0; p < np; p++)
    q->cpu[q->base[q->boff[j] + p]] -= cpu;
  for (uint32_t i = 0; i < m; i++) {
    uint32_t n = q->scratch[i], w = 0;
    for (uint32_t x = 0; x < q->pres[n]; x++)
      if (q->plist[n][x] != j)
        q->plist[n][w++] = q->plist[n][x];
    q->pres[n] = w;
  }
  memcpy(q->nodes, q->scratch, m * sizeof *q->nodes);
  return reslow_nodes(r, q->nodes, m);
}

static bool rq_find(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  return find_whole(r, j, s);
}

int cogpu__sim_rq_policy(const char *name, sim_policy_t *p) {
  memset(p, 0, sizeof *p);
  p->name = name;
  p->kind = SIM_EXCLUSIVE;
  p->place = SIM_FIRSTFIT;
  p->fcfs = true;
  p->init = rq_init;
  p->fini = rq_fini;
  p->find = rq_find;
  p->on_start = rq_start;
  p->on_finish = rq_finish;
  if (!strcmp(name, "rqueue")) {
    p->remote = true;
    p->fallback = fallback_rcuda;
    return 0;
  }
  if (!strcmp(name, "gqueue"))
    return 0;
  return cogpu__seterr(-EINVAL, "unknown policy '%s'", name);
}
