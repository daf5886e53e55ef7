/*
 * engine-int.h: the run state shared by the engine (engine.c), the
 * placement index (index.c), the policies (policy.c) and the FGD measure
 * (fgd.c). Not used outside src/sim.
 */
#ifndef COGPU_SIM_ENGINE_INT_H
#define COGPU_SIM_ENGINE_INT_H

#include "sim/sim-int.h"

#define SIM_NONE UINT32_MAX
/* Scan classes: 4 priority classes x 65 sizes, then the one apart. */
#define SIM_NCLASS (4 * 65 + 1)
/* The latest simulated time a run reaches (ms; about 127 million years):
 * past it the run stops with an error. */
#define SIM_MAX_NOW 4000000000000000000ll

/* A job's state in a run. */
enum sim_js_state {
  JS_FUTURE = 0, /* not arrived */
  JS_QUEUED,     /* in the cluster queue */
  JS_NODEWAIT,   /* placed; its first reservation waits in a node's queue */
  JS_RUN,        /* running */
  JS_BLOCKED,    /* a growth waits in its node's queue; no progress */
  JS_SUSPENDING, /* its memory is being copied to host memory */
  JS_SUSPENDED,  /* in host memory; its resume waits in the node's queue */
  JS_RESUMING,   /* being copied back */
  JS_DONE,
  JS_FAILED /* can never run on this cluster */
};

typedef struct sim_js_s {
  uint8_t st;
  uint8_t remote;       /* runs with remote GPUs (rqueue) */
  uint8_t grow_pending; /* suspended while a growth waited: ask again */
  uint8_t gave_up;      /* JS_FAILED after too many crashes, not unplaceable */
  uint16_t crashes, susp;
  uint32_t epoch;        /* bumps invalidate its pending events */
  uint32_t nwait;        /* its entries in node queues not yet served */
  uint32_t tl_k;         /* timeline point in force */
  uint32_t nslot;        /* GPUs it holds a place on */
  uint32_t qprev, qnext; /* cluster queue links */
  /* Its scan class's treap (engine.c, c_append): children, its class,
   * its need there and the smallest need of its subtree. */
  uint32_t tl, tr;
  uint16_t ccls;
  double cneed, tmin;
  uint64_t qseq; /* its place in the cluster queue (increasing) */
  uint32_t node; /* its (first) node */
  int64_t done;  /* ms of work done before seg */
  int64_t seg;   /* when its current running stretch began */
  int64_t start, end, queued_at;
  int64_t released_at; /* when it last gave memory back */
  uint64_t ticket;     /* when it started (victim order: newest first) */
  double slow;         /* wall time per ms of work (rqueue: > 1) */
} sim_js_t;

/* A node-queue entry: a request (a first reservation or a growth) or a
 * suspended job's resume, on one GPU. */
typedef struct sim_ent_s {
  uint32_t job;
  uint32_t k;   /* the job's GPU slot */
  uint32_t gpu; /* the node's GPU index */
  uint8_t kind; /* COGPU_CORE_REQUEST or COGPU_CORE_RESUME */
  uint8_t served;
  uint64_t bytes;
  uint64_t ticket;
  int64_t since; /* ms */
} sim_ent_t;

typedef struct sim_nq_s {
  uint32_t *ids;
  uint32_t n, cap;
} sim_nq_t;

typedef struct sim_ev_s {
  int64_t t;
  uint64_t seq;
  uint32_t type, a, epoch, pad;
} sim_ev_t;

/* Best-fit order: a treap over (key, GPU). */
typedef struct sim_treap_s {
  uint32_t *l, *r, *pri;
  uint64_t *key;
  uint32_t root;
} sim_treap_t;

typedef struct sim_run_s {
  const sim_trace_t *t;
  const sim_cluster_t *c;
  const sim_policy_t *p;
  const sim_opts_t *o;
  cogpu__core_rules_t rules;
  int64_t now;
  uint64_t rng;

  /* GPUs */
  cogpu__core_gpu_t *gpu;
  uint64_t *used;  /* bytes jobs really use there (shares: may exceed) */
  uint64_t *cap;   /* what may be booked */
  uint32_t *hhead; /* holders: the first (job slot) of each GPU's list */

  /* jobs */
  sim_js_t *js;
  uint64_t *goff;          /* the job's first slot in the arrays below */
  uint32_t *jg;            /* slot -> GPU (cluster numbering) */
  uint64_t *jh;            /* slot -> bytes held there */
  uint32_t *hnext, *hprev; /* slot -> next/previous holder of its GPU */
  uint32_t *jent;          /* slot -> its waiting entry, or SIM_NONE */
  uint8_t *inlist;         /* slot -> on its GPU's holder list */

  /* the cluster queue, in order of (re)submission */
  uint32_t qhead, qtail;
  size_t qlen;

  /* events */
  sim_ev_t *heap;
  size_t nh, caph;
  uint64_t seq, ticket;
  size_t next_arrival;

  /* nodes */
  sim_nq_t *nq;
  uint32_t *nbusy;         /* GPUs with a holder */
  uint64_t *susp_mib;      /* host memory holding suspended jobs */
  uint32_t *links;         /* rqueue: remote GPU links in use */
  int64_t *guard_at;       /* latest deadlock-guard check scheduled */
  uint64_t idle_node_gpus; /* GPUs of nodes with nothing on them */

  /* node-queue entries */
  sim_ent_t *ent;
  uint32_t nent, capent, free_ent;

  /* placement index: max key per GPU (segment tree), best-fit treap */
  uint64_t *seg;
  uint32_t segn;
  sim_treap_t tr;
  uint64_t *key; /* the key each GPU has in the index */
  /* best fit: nodes by the sum of their GPUs' keys (a treap over (sum,
   * node)), for jobs of several GPUs */
  sim_treap_t ntr;
  uint64_t *nsum;

  /* policy state (fgd.c) */
  void *pol;
  /* the G and R queues' own state (rqueue.c) */
  void *rq;
  /* seed 001's cluster scheduler's state (cluster.c) */
  void *cl;
  /* each cluster model's bit in the trace's gpu_spec masks */
  uint32_t model_bit[SIM_MAX_MODELS];

  /* counters and integrals */
  uint64_t alloc_gpus;
  uint64_t booked, total_bytes, used_bytes;
  uint64_t susp_now;
  int64_t last;
  double i_alloc, i_mem, i_queue;
  sim_result_t *res;
  sim_series_t *series;
  int64_t sample, next_sample;
  double frag_sum;
  size_t frag_n;
  bool too_late;     /* an event was due past SIM_MAX_NOW */
  bool scan_due;     /* a scan is due at an EV_SCAN (--sched-delay) */
  bool freed;        /* something was released: the cluster queue is scanned */
  uint32_t new_from; /* first job queued since the last scan */
  double fail_need[4][65]; /* scan: smallest need that failed, by prio */
  /* The queue by scan class (SIM_NCLASS: priority class x GPUs up to 64,
   * and one for the jobs the scan never skips: whole GPUs of any size, a
   * gpu_spec), each a treap in queue order that knows its smallest needs
   * (engine.c, c_append). The scan visits, in each class, only the jobs
   * no failure rules out: the big jobs an overloaded queue piles up at
   * its head are not stepped over one by one at every release. */
  uint32_t croot[SIM_NCLASS], ccount[SIM_NCLASS];
  uint64_t qseq;   /* jobs queued so far: a job's place in the queue */
  uint32_t nkeyed; /* GPUs whose key is not 0 (somewhere to place) */
} sim_run_t;

/* engine.c, for the policies */
uint64_t cogpu__sim_need_key(const sim_run_t *r, uint32_t j);
uint64_t cogpu__sim_need_bytes(const sim_run_t *r, uint32_t j, uint32_t g);
bool cogpu__sim_gpu_ok(const sim_run_t *r, uint32_t j, uint32_t g);
uint64_t cogpu__sim_gpu_key(const sim_run_t *r, uint32_t g);
bool cogpu__sim_node_free(const sim_run_t *r, uint32_t n);
bool cogpu__sim_whole_nodes(sim_run_t *r, uint32_t j, sim_slot_t *s);
void cogpu__sim_suspend(sim_run_t *r, uint32_t j);
/* j runs at `slow` ms of wall time per ms of work from now on (its work
 * so far kept, its end moved); a job not running keeps it for its run. */
int cogpu__sim_set_slow(sim_run_t *r, uint32_t j, double slow);
int cogpu__sim_enqueue_start(sim_run_t *r, uint32_t j, uint32_t g);
/* The job a GPU slot belongs to. */
uint32_t cogpu__sim_slot_job(const sim_run_t *r, uint64_t sl);

/* index.c */
int cogpu__sim_index_init(sim_run_t *r);
void cogpu__sim_index_free(sim_run_t *r);
void cogpu__sim_index_set(sim_run_t *r, uint32_t g, uint64_t key);
/* The first GPU at or after `from` with key >= need, or SIM_NONE. */
uint32_t cogpu__sim_index_first(const sim_run_t *r, uint32_t from,
                                uint64_t need);
/* The GPU with the smallest key >= need whose (key, index) is after
 * (after_key, after_g) (after_g SIM_NONE: from the start), or SIM_NONE. */
uint32_t cogpu__sim_index_best(const sim_run_t *r, uint64_t need,
                               uint64_t after_key, uint32_t after_g);
/* Best fit: the node whose GPUs' keys add up to the least, after (sum,
 * node) (after_n SIM_NONE: from the start), or SIM_NONE. */
uint32_t cogpu__sim_index_node_next(const sim_run_t *r, uint64_t after_sum,
                                    uint32_t after_n);

/* policy.c: the running one-GPU jobs whose suspension makes room for
 * one-GPU job j on one GPU (memory, and a client's place under the core's
 * max_clients), among those may(r, j, h) allows, in
 * cogpu__core_victim_before's order, with host memory on the node to hold
 * them: 1 with *nv of them in v (at most 64) and the GPU in *gpu, or 0. */
int cogpu__sim_suspend_pick(sim_run_t *r, uint32_t j,
                            bool (*may)(const sim_run_t *r, uint32_t j,
                                        uint32_t h),
                            uint32_t *v, uint32_t *nv, uint32_t *gpu);

/* cluster.c: seed 001's scheduling API (Sajjapongse/Becchi, Table 4-1),
 * which its policies (colocate, latency) are written on. The callbacks
 * are sim_policy_t's: arrival is `find`/`fallback` (called when a job
 * arrives and again while it waits, after each release: the seed's loop
 * over its unassigned-job queue), completion `on_finish`. */
typedef struct sim_cl_node_s {
  uint32_t ngpus;     /* mccsQueryNodeInfo */
  uint32_t vgpus;     /* vGPUs per GPU (mccsSetNodeVGPUConf) */
  uint32_t procs;     /* processes on its GPUs (NumAssignedProcesses) */
  uint32_t waiting;   /* entries in its queue (mccsQueryNodeQueues) */
  uint64_t gpu_total; /* bytes per GPU */
} sim_cl_node_t;
/* mccsGetNodeList: nodes are 0 .. this - 1. */
uint32_t cogpu__sim_cl_nodes(const sim_run_t *r);
void cogpu__sim_cl_query(const sim_run_t *r, uint32_t n, sim_cl_node_t *out);
/* mccsSetNodeSharingP: kind is enum sim_kind. What a booking means is the
 * engine's, one for the whole run: 0 for the run's kind, else -ENOTSUP. */
int cogpu__sim_cl_set_sharing(sim_run_t *r, uint32_t n, int kind);
/* mccsSetNodeVGPUConf: at most v processes per GPU of node n (1 to 1024).
 * 0 or -EINVAL. */
int cogpu__sim_cl_set_vgpus(sim_run_t *r, uint32_t n, uint32_t v);
/* mccsSetDeviceLimit: job j may use `gpus` GPUs. 0 suspends a running
 * one-GPU job (the engine's suspension, its copy timed); its full count
 * lets a suspended job resume (the node's queue serves its resume when
 * room returns, as it does for every suspension). 0, or -ENOTSUP for what
 * the engine cannot do (shrink a job, suspend a job of several GPUs or
 * one not running). */
int cogpu__sim_cl_set_limit(sim_run_t *r, uint32_t j, uint32_t gpus);
int cogpu__sim_cl_policy(const char *name, sim_policy_t *p);

/* rqueue.c: seed 002's G queue (gqueue) and R queue (rqueue). */
int cogpu__sim_rq_policy(const char *name, sim_policy_t *p);

/* fgd.c: FGD's fragmentation of the cluster now (in GPUs), and its
 * placement. */
int cogpu__sim_fgd_init(sim_run_t *r);
void cogpu__sim_fgd_free(sim_run_t *r);
double cogpu__sim_frag(sim_run_t *r);
bool cogpu__sim_fgd_find(sim_run_t *r, uint32_t j, sim_slot_t *s);

#endif /* COGPU_SIM_ENGINE_INT_H */
