/*
 * sim-int.h: the cluster simulator's internal interface (docs/simulation.md).
 *
 * The simulator replays a job trace on a cluster of simulated nodes, in
 * virtual time (integer milliseconds), under one policy at a time. Every
 * node decides as a real cogpu node does: it admits and books through the
 * ledger's own decision core (ledger/core.h: cogpu__core_fits, _granted,
 * _released), serves its queue with cogpu__core_order and cogpu__core_serve
 * over plain arrays, and times its deadlock guard with cogpu__core_guard_due
 * and cogpu__core_victim_before. Nothing here re-implements those.
 *
 * Dependencies: common (internal.h: sizes, durations, errors) and
 * ledger/core.h only. The `cogpu sim` command (tools/cogpu/cmd-sim.c), the
 * tests and bench-sim drive it through this header.
 */
#ifndef COGPU_SIM_INT_H
#define COGPU_SIM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ledger/core.h"

#define SIM_GIB (1024ull * 1024 * 1024)
#define SIM_MAX_MODELS 32
/* The latest time and the longest duration a trace may give, in ms (about
 * 31,700 years): sums of times stay far from int64's end. A row past it
 * is out of range (docs/simulation.md). */
#define SIM_MAX_MS 1000000000000000ll
/* The most GPU memory a trace may give a job, per GPU (1 PiB): more is
 * out of range, not wrapped or saturated. */
#define SIM_MAX_BYTES (1ull << 50)

/* --- The trace ----------------------------------------------------------- */

enum sim_format {
  SIM_FMT_ALIBABA = 0,
  SIM_FMT_PHILLY,
  SIM_FMT_POLLUX,
  SIM_FMT_SACCT,
  SIM_FMT_COGPU,
  SIM_FMT__COUNT
};

/* Why a row was skipped (counted, reported with file:line). */
enum sim_skip {
  SIM_SKIP_COLUMNS = 0, /* wrong number of fields */
  SIM_SKIP_NUMBER,      /* a field that must be a number is not */
  SIM_SKIP_RANGE,       /* a number out of range (negative time, ...) */
  SIM_SKIP_ORDER,       /* ends before it starts */
  SIM_SKIP_NEVER_RAN,   /* sacct: never started (no Start) */
  SIM_SKIP_UNKNOWN,     /* a model or application not in the tables */
  SIM_SKIP_SYNTAX,      /* cogpu JSON: not a record */
  SIM_SKIP__COUNT
};

/* One job of the trace, as replayed. Times in ms from the trace's origin. */
typedef struct sim_job_s {
  int64_t submit; /* arrival */
  int64_t dur;    /* run time at full speed (ms of work) */
  uint64_t mem;   /* bytes per GPU; 0 with milli 0: the whole GPU */
  uint32_t milli; /* a share of each GPU in thousandths (alibaba); 0: bytes */
  uint32_t ngpus; /* 0: a CPU-only job (starts at once, holds no GPU) */
  int32_t prio;   /* higher is more important (suspension victims) */
  uint32_t line;  /* the trace line it came from */
  uint32_t tl_n;  /* memory timeline points (cogpu format), 0: none */
  uint32_t cpu_milli;
  uint64_t tl_off;   /* first point in sim_trace_t.tl */
  int64_t tl_step;   /* ms of work between points */
  uint64_t host_mib; /* host memory asked (alibaba; FGD's fit) */
  uint16_t spec;     /* GPU models it may run on: 0 any, k sim_trace_t's
                        spec_mask[k - 1] (alibaba gpu_spec) */
  uint32_t calls;    /* rqueue: CUDA calls per node; 0: not in the trace
                        (estimated as seed 002 does, docs/simulation.md) */
  uint64_t xfer;     /* rqueue: bytes moved per node and kind of transfer;
                        0: not in the trace (estimated) */
} sim_job_t;

typedef struct sim_trace_s {
  sim_job_t *jobs;
  size_t n, cap;
  uint64_t *tl; /* timeline points, bytes per GPU */
  size_t ntl, captl;
  size_t rows;    /* data rows read */
  size_t skipped; /* rows skipped, by reason in skip[] */
  size_t skip[SIM_SKIP__COUNT];
  uint32_t first_skip_line[SIM_SKIP__COUNT];
  bool frac;     /* shares of a GPU (milli) rather than bytes */
  bool timeless; /* no times (FGD's multi-GPU pod lists): --fgd only */
  /* gpu_spec: each distinct spec (as written), as a set of the model
   * names below */
  char **spec_str;
  uint32_t *spec_mask;
  uint32_t nspec, nspec_models;
  char spec_models[SIM_MAX_MODELS][24];
} sim_trace_t;

/* --- The cluster -----------------------------------------------------------
 */

#define SIM_MAX_NODE_GPUS COGPU_CORE_MAX_GPUS

typedef struct sim_node_s {
  uint32_t gpu0;  /* its first GPU in the cluster's numbering */
  uint32_t ngpus; /* at most SIM_MAX_NODE_GPUS */
  uint32_t model;
  uint32_t cpu_milli;
  uint64_t gpu_total; /* bytes per GPU */
  uint64_t host_mib;  /* host memory: the suspension bound */
} sim_node_t;

typedef struct sim_cluster_s {
  sim_node_t *nodes;
  uint32_t nnodes, ngpus, max_node_gpus;
  uint32_t *gpu_node; /* node of each GPU */
  uint32_t nmodels;
  char models[SIM_MAX_MODELS][24];
  uint64_t model_mem[SIM_MAX_MODELS];
  uint64_t max_gpu_total;
} sim_cluster_t;

/* --- Options ---------------------------------------------------------------
 */

typedef struct sim_model_mem_s {
  char name[24];
  uint64_t bytes;
} sim_model_mem_t;

typedef struct sim_opts_s {
  uint64_t seed;
  bool strict;               /* a malformed row is fatal */
  int64_t time_unit;         /* philly: ms per trace tick */
  uint32_t node_policy;      /* enum cogpu__policy of every node */
  int64_t mmu_max_age;       /* ms; <0: never */
  int64_t guard_delay;       /* ms: the deadlock guard's delay */
  uint64_t margin_pct;       /* cogpu: percent of each GPU kept free */
  uint32_t shares;           /* shares: jobs per GPU */
  int64_t crash_after;       /* shares: ms a job runs before it dies of OOM */
  uint32_t max_crashes;      /* a job that crashed this often is given up */
  double time_scale;         /* arrivals compressed by this factor */
  double susp_gibps;         /* suspension copy rate, GiB/s */
  double resume_gibps;       /* resume copy rate, GiB/s */
  uint64_t host_reserve_mib; /* per node host memory never used for it */
  double remote_slowdown;    /* rqueue: run time factor with remote GPUs */
  uint32_t remote_links;     /* rqueue: remote GPUs a node serves or uses */
  int64_t sample;            /* ms between time-series samples; 0: auto */
  int64_t sched_delay;       /* ms from what lets a job start to its scan */
  bool quiet;                /* no progress line */
  /* Tests: each pass tries the queue job by job, in the scan's order,
   * without the class index (the reference the index must agree with). */
  bool scan_walk;
  uint32_t nmodel_mem;
  sim_model_mem_t model_mem[SIM_MAX_MODELS];
} sim_opts_t;

void cogpu__sim_opts_default(sim_opts_t *o);
/* "G2=32G,G3=80G": per-model GPU memory overrides. 0 or -EINVAL (message
 * set). */
int cogpu__sim_parse_model_mem(sim_opts_t *o, const char *s);

/* --- Readers (trace.c) -----------------------------------------------------
 */

int cogpu__sim_format(const char *name); /* enum sim_format, or -1 */
const char *cogpu__sim_format_name(int f);
const char *cogpu__sim_skip_name(int why);
/* Reads a trace; malformed rows are reported on `err` as FILE:LINE: why,
 * counted and skipped, or fatal with o->strict. Jobs are sorted by
 * arrival (stable). 0, or a negative errno with the message set and `t`
 * emptied (nothing left to free). */
int cogpu__sim_read_trace(sim_trace_t *t, const char *path, int format,
                          const sim_opts_t *o, FILE *err);
void cogpu__sim_trace_free(sim_trace_t *t);
/* Appends a job (and its timeline, tl_n points); 0 or -ENOMEM. */
int cogpu__sim_trace_add(sim_trace_t *t, const sim_job_t *j,
                         const uint64_t *tl);
/* Sorts by submit time, stable. */
void cogpu__sim_trace_sort(sim_trace_t *t);

/* Reads an openb-style node list (sn,cpu_milli,memory_mib,gpu,model[,
 * gpu_mem]). */
int cogpu__sim_read_cluster(sim_cluster_t *c, const char *path,
                            const sim_opts_t *o, FILE *err);
/* n nodes of g GPUs of `mem` bytes each, `host` bytes of host memory. */
int cogpu__sim_make_cluster(sim_cluster_t *c, uint32_t n, uint32_t g,
                            uint64_t mem, uint64_t host);
void cogpu__sim_cluster_free(sim_cluster_t *c);
/* bits[m] for each model m of c: its bit in t's spec_mask (0: no spec
 * names it). */
void cogpu__sim_spec_bits(const sim_trace_t *t, const sim_cluster_t *c,
                          uint32_t *bits);
/* May job j go on a node of model bit `bit` (from cogpu__sim_spec_bits)? */
static inline bool cogpu__sim_spec_ok(const sim_trace_t *t, const sim_job_t *j,
                                      uint32_t bit) {
  return !j->spec || !j->ngpus || (t->spec_mask[j->spec - 1] & bit);
}
/* The documented GPU memory of a model name (the alibaba table, with the
 * overrides of o), or 0 if unknown. */
uint64_t cogpu__sim_model_mem(const sim_opts_t *o, const char *model);

/* --- Policies and the engine (engine.c, policy.c) ------------------------ */

enum sim_kind { SIM_EXCLUSIVE = 0, SIM_SHARES, SIM_COGPU };
enum sim_place { SIM_FIRSTFIT = 0, SIM_BESTFIT, SIM_FGD };

struct sim_run_s;

/* Where a job goes: a node (or, for a job larger than a node, several)
 * and its GPUs, in the cluster's numbering. */
typedef struct sim_slot_s {
  uint32_t ngpus;
  uint32_t nremote; /* rqueue: GPUs on other nodes than the first */
  uint32_t *gpus;   /* ngpus entries (the job's own array) */
} sim_slot_t;

/* A policy: a small module behind one interface. */
typedef struct sim_policy_s {
  const char *name;
  int kind;  /* enum sim_kind: what a GPU's booking means */
  int place; /* enum sim_place */
  bool suspend;
  bool remote;
  /* Strict first come, first served: the scan stops at the first queued
   * job that cannot start (the G and R queues of seed 002), instead of
   * the greedy backfill. */
  bool fcfs;
  /* Prepare the policy's own state. */
  int (*init)(struct sim_run_s *r);
  /* Choose GPUs for job j now (fill s), or false. */
  bool (*find)(struct sim_run_s *r, uint32_t j, sim_slot_t *s);
  /* Nothing could be found for j: try harder. 0: no; 1: s is filled
   * (remote GPUs); 2: j was placed by the fallback itself (it preempted);
   * < 0: an error. */
  int (*fallback)(struct sim_run_s *r, uint32_t j, sim_slot_t *s);
  /* j was placed on the slots find or fallback chose (its GPUs booked),
   * just before it starts: a policy whose run times depend on who shares
   * a node sets them here (cogpu__sim_set_slow). 0 or a negative errno. */
  int (*on_start)(struct sim_run_s *r, uint32_t j);
  /* A job ended (finished, crashed or failed) and gave its GPUs back. 0
   * or a negative errno. */
  int (*on_finish)(struct sim_run_s *r, uint32_t j);
  void (*fini)(struct sim_run_s *r);
  /* The scan class of queued job j (0 to 3): with it the scan tries the
   * higher classes first, each in queue order (the latency policy's short
   * jobs first); without it, all jobs go in queue order, classed by
   * priority under suspension. A job's class never changes. */
  uint32_t (*rank)(const struct sim_run_s *r, uint32_t j);
  /* GPU g's bookings changed (its clients or its free memory): a policy
   * that indexes nodes by them updates its index. */
  void (*on_gpu)(struct sim_run_s *r, uint32_t g);
} sim_policy_t;

/* Parses "exclusive", "shares", "cogpu[:firstfit|bestfit|fgd]",
 * "cogpu+suspend[:...]", "gqueue", "rqueue", "rqueue-links", "colocate",
 * "latency" into *p. 0 or -EINVAL. */
int cogpu__sim_policy(const char *name, sim_policy_t *p);

/* What a run reports (metrics.c computes the derived figures). */
typedef struct sim_result_s {
  char policy[48];
  size_t jobs, gpu_jobs, done, unplaceable, crashes, guard_failures;
  size_t suspensions, remote_jobs, abandoned;
  double wait_mean, wait_p50, wait_p95, wait_p99; /* seconds */
  double jct_mean, jct_p50, jct_p95, jct_p99;     /* seconds */
  double makespan;                                /* seconds */
  double alloc_ratio;            /* time-weighted GPUs allocated / GPUs */
  double mem_ratio;              /* time-weighted bytes booked / bytes */
  double idle_gpus;              /* time-weighted mean of GPUs with nothing */
  double frag_ratio;             /* time-weighted FGD fragmentation / GPUs */
  double queue_mean;             /* time-weighted jobs waiting in the cluster */
  uint64_t suspended_bytes;      /* moved to host memory, in total */
  uint64_t suspended_peak_bytes; /* most at one time */
  size_t events;
  double sim_seconds; /* wall time of the run (not written to outputs) */
} sim_result_t;

typedef struct sim_sample_s {
  int64_t t;
  uint32_t alloc_gpus, idle_gpus, queued, running;
  double mem_ratio, frag;
  uint64_t suspended;
} sim_sample_t;

typedef struct sim_series_s {
  sim_sample_t *v;
  size_t n, cap;
} sim_series_t;

/* Per-job outcome, for tests and the per-job CSV. */
typedef struct sim_outcome_s {
  int64_t start; /* first grant, -1: never */
  int64_t end;   /* -1: never */
  uint32_t node; /* where it last ran */
  uint16_t crashes, suspensions;
  uint8_t remote;
  uint8_t failed;   /* could not run on this cluster (results: not run) */
  uint8_t given_up; /* crashed too often (results: given up) */
} sim_outcome_t;

/* Replays t on c under p. out (may be NULL) gets one outcome per job. */
int cogpu__sim_run(const sim_trace_t *t, const sim_cluster_t *c,
                   const sim_policy_t *p, const sim_opts_t *o,
                   sim_result_t *res, sim_series_t *series, sim_outcome_t *out);

/* --- Output (output.c) ------------------------------------------------- */

typedef struct sim_report_s {
  const char *trace_path;
  const char *format;
  const char *cluster_desc;
  const sim_trace_t *trace;
  const sim_cluster_t *cluster;
  const sim_opts_t *opts;
  size_t npol;
  const sim_result_t *res;
  const sim_series_t *series;
} sim_report_t;

/* DIR/results.json, DIR/<policy>.csv, DIR/summary.md, and PNG plots when
 * gnuplot is installed. 0 or a negative errno (message set). */
int cogpu__sim_write(const char *dir, const sim_report_t *rep);

/* --- FGD-style experiment (fgd.c) --------------------------------------- */

typedef struct sim_fgd_point_s {
  double arrived;    /* arrived GPU request / cluster GPUs, percent */
  double alloc;      /* allocated GPU / cluster GPUs, percent */
  double frag;       /* FGD fragmentation / cluster GPUs, percent */
  double frag_ratio; /* FGD fragmentation / idle GPU, percent */
} sim_fgd_point_t;

/* Arrivals only up to `upto` percent of the cluster's GPU capacity;
 * `place`: random, dotprod, clustering, packing, bestfit, fgd. */
int cogpu__sim_fgd(const sim_trace_t *t, const sim_cluster_t *c,
                   const char *place, const sim_opts_t *o, double upto,
                   sim_fgd_point_t **pts, size_t *npts, size_t *failed);

#endif /* COGPU_SIM_INT_H */
