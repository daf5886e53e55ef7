/*
 * bench-sim.c: the cluster simulator's speed (docs/simulation.md,
 * docs/benchmarks.md): jobs simulated per second under each policy, on
 * the Alibaba openb trace and its 1,213 nodes (when the traces are there:
 * COGPU_TRACES, default ../shared/traces) and on a synthetic trace of
 * BENCH_SIM_JOBS jobs (1,000,000) on 1,250 nodes of 8 GPUs (10,000 GPUs).
 * Each line's baseline is the exclusive policy in the same run
 * (`vs_exclusive`: its time over exclusive's), so a result is read
 * against the same machine and load.
 *
 * The synthetic trace: Poisson arrivals at BENCH_SIM_LOAD (percent, 80)
 * of the GPUs' capacity, 1 GPU (80 %), 2 (10 %), 4 (5 %) or 8 (5 %), 4 to
 * 80 GiB per GPU, run times exponential with a mean of one hour; a fixed
 * seed. Above 100 % the queue grows without bound: the overload case
 * (docs/benchmarks.md).
 *
 * BENCH_SIM_TSUBAME=1 runs instead seed 002's comparison (docs/simulation.md,
 * "The G and R queues"): a synthetic TSUBAME2.5-like trace (tsubame()
 * below) on 480 nodes of 3 GPUs, at the node loads of BENCH_SIM_LOADS
 * (percent, a comma list; 90,95,100,105), under gqueue and rqueue (and
 * exclusive, rqueue-links for context), one line per load and policy with
 * the change against gqueue.
 *
 * BENCH_SIM_POLICIES (a comma list) runs only those policies, and
 * BENCH_SIM_ALIBABA=0 skips the Alibaba trace: a process per policy gives
 * each its own peak memory (`maxrss_mb`, the process's peak resident set
 * after the run, the trace included).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h"
#include "internal.h"
#include "sim/sim-int.h"

static uint64_t rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double unif(uint64_t *s) {
  return (double)(rng(s) >> 11) / 9007199254740992.0;
}

static void synthetic(sim_trace_t *t, size_t n, uint32_t gpus, double load) {
  uint64_t s = 42;
  double now = 0, mean_gpus = 0.8 + 0.2 + 0.2 + 0.4, mean_run = 3600;
  double rate = load * gpus / (mean_gpus * mean_run); /* jobs per second */
  memset(t, 0, sizeof *t);
  for (size_t i = 0; i < n; i++) {
    now += -log(1 - unif(&s)) / rate;
    double u = unif(&s);
    uint32_t g = u < 0.8 ? 1 : u < 0.9 ? 2 : u < 0.95 ? 4 : 8;
    sim_job_t j = {.submit = (int64_t)(now * 1000),
                   .dur = (int64_t)(-log(1 - unif(&s)) * mean_run * 1000),
                   .mem = (uint64_t)(4 + unif(&s) * 76) * SIM_GIB,
                   .ngpus = g,
                   .prio = (int32_t)(rng(&s) % 2),
                   .line = (uint32_t)i + 2};
    if (cogpu__sim_trace_add(t, &j, NULL))
      bench_die("trace_add", -1);
  }
}

/* A TSUBAME2.5 G-queue-like trace (seed 002, which publishes no trace):
 * jobs of 1, 2, 3 or 6 GPUs (5, 5, 60, 30 %, BENCH_SIM_MIX to change;
 * 6 GPUs is 2 nodes of 3: mostly whole nodes, as the few idle GPUs the
 * paper reports under its G queue suggest),
 * run times log-normal with a median of 30 min (sigma 1.5, cut at a day),
 * Poisson arrivals at `load` of the nodes as the G queue uses them (a job
 * takes whole nodes: ceil(GPUs / 3)); each process asks 4 of a node's 8
 * CPUs (the G queue's 4 per node) and 1 to 22 GB of memory per node
 * (Table II's node memory); CUDA calls and transfer bytes are left to the
 * paper's estimate (rqueue.c). A fixed seed: the same trace every run. */
static void tsubame(sim_trace_t *t, size_t n, uint32_t nodes, double load) {
  uint64_t s = 2014;
  static const uint32_t gp[] = {1, 2, 3, 6};
  double pr[] = {0.05, 0.05, 0.60, 0.30};
  const char *mix = getenv("BENCH_SIM_MIX");
  if (mix && *mix) {
    double sum = 0;
    for (int i = 0; i < 4 && mix; i++) {
      pr[i] = strtod(mix, NULL);
      sum += pr[i];
      mix = strchr(mix, ',');
      mix = mix ? mix + 1 : NULL;
    }
    for (int i = 0; i < 4; i++)
      pr[i] /= sum > 0 ? sum : 1;
  }
  double mean_nodes = 0, mu = log(1800.0), sigma = 1.5;
  for (int i = 0; i < 4; i++)
    mean_nodes += pr[i] * ((gp[i] + 2) / 3);
  /* The mean of the cut log-normal, by its closed form. */
  double cut = log(86400.0), m0 = exp(mu + sigma * sigma / 2);
  double mean_run =
      m0 * 0.5 * erfc(-(cut - mu - sigma * sigma) / (sigma * sqrt(2))) +
      86400.0 * 0.5 * erfc((cut - mu) / (sigma * sqrt(2)));
  double rate = load * nodes / (mean_nodes * mean_run);
  double now = 0;
  memset(t, 0, sizeof *t);
  for (size_t i = 0; i < n; i++) {
    now += -log(1 - unif(&s)) / rate;
    double u = unif(&s), acc = 0;
    uint32_t g = 6;
    for (int k = 0; k < 4; k++)
      if (u < (acc += pr[k])) {
        g = gp[k];
        break;
      }
    /* Box-Muller: a standard normal. */
    double z = sqrt(-2 * log(1 - unif(&s))) * cos(2 * M_PI * unif(&s));
    double run = exp(mu + sigma * z);
    if (run > 86400.0)
      run = 86400.0; /* a day: the queue's wall-time limit (assumed) */
    uint32_t np = (g + 2) / 3;
    sim_job_t j = {.submit = (int64_t)(now * 1000),
                   .dur = (int64_t)(run * 1000),
                   .ngpus = g,
                   .cpu_milli = 4000 * np,
                   .host_mib = (uint64_t)(np * (1 + unif(&s) * 21) * 953.67),
                   .line = (uint32_t)i + 2};
    if (cogpu__sim_trace_add(t, &j, NULL))
      bench_die("trace_add", -1);
  }
}

static void run_tsubame(void) {
  const char *loads = getenv("BENCH_SIM_LOADS");
  if (!loads || !*loads)
    loads = "90,95,100,105";
  size_t n = (size_t)bench_env_long("BENCH_SIM_JOBS", 63484);
  static const char *const pols[] = {"gqueue", "rqueue", "exclusive",
                                     "rqueue-links"};
  sim_opts_t o;
  cogpu__sim_opts_default(&o);
  o.quiet = true;
  sim_cluster_t c;
  if (cogpu__sim_make_cluster(&c, 480, 3, 6 * SIM_GIB, 54 * SIM_GIB))
    bench_die("cluster", -1);
  for (uint32_t i = 0; i < c.nnodes; i++)
    c.nodes[i].cpu_milli = 8000;
  for (const char *l = loads; l;) {
    double load = strtod(l, NULL) / 100.0;
    l = strchr(l, ',');
    l = l ? l + 1 : NULL;
    sim_trace_t t;
    tsubame(&t, n, c.nnodes, load);
    sim_result_t g = {0};
    for (size_t i = 0; i < COGPU_ARRAY_SIZE(pols); i++) {
      sim_policy_t p;
      sim_result_t r;
      if (cogpu__sim_policy(pols[i], &p))
        bench_die("policy", -1);
      uint64_t a = bench_now_ns();
      int rc = cogpu__sim_run(&t, &c, &p, &o, &r, NULL, NULL);
      if (rc)
        bench_die(cogpu_last_error(), rc);
      double secs = (double)(bench_now_ns() - a) / 1e9;
      if (i == 0)
        g = r;
      double ex = r.jct_mean - r.wait_mean, gex = g.jct_mean - g.wait_mean;
      printf(
          "{\"bench\":\"sim-tsubame\",\"load\":%.2f,\"policy\":\"%s\","
          "\"jobs\":%zu,\"done\":%zu,\"wait_mean_s\":%.1f,"
          "\"exec_mean_s\":%.1f,\"lifetime_mean_s\":%.1f,"
          "\"idle_gpus\":%.2f,\"remote_jobs\":%zu,"
          "\"wait_change_pct\":%.2f,\"exec_change_pct\":%.2f,"
          "\"lifetime_change_pct\":%.2f,\"idle_change_pct\":%.2f,"
          "\"seconds\":%.2f}\n",
          load, pols[i], t.n, r.done, r.wait_mean, ex, r.jct_mean, r.idle_gpus,
          r.remote_jobs, 100 * (r.wait_mean - g.wait_mean) / g.wait_mean,
          100 * (ex - gex) / gex, 100 * (r.jct_mean - g.jct_mean) / g.jct_mean,
          100 * (r.idle_gpus - g.idle_gpus) / g.idle_gpus, secs);
      fflush(stdout);
    }
    cogpu__sim_trace_free(&t);
  }
  cogpu__sim_cluster_free(&c);
}

static double maxrss_mb(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) ? 0 : (double)ru.ru_maxrss / 1024.0;
}

/* Is policy p in the comma list `only` (NULL: all)? */
static bool chosen(const char *only, const char *p) {
  if (!only || !*only)
    return true;
  size_t l = strlen(p);
  for (const char *s = only; s;) {
    const char *e = strchr(s, ',');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n == l && !strncmp(s, p, l))
      return true;
    s = e ? e + 1 : NULL;
  }
  return false;
}

/* FNV-1a over each job's start, end, node, crashes and suspensions. */
static uint64_t outcome_hash(const sim_outcome_t *o, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t j = 0; j < n; j++) {
    uint64_t f[5] = {(uint64_t)o[j].start, (uint64_t)o[j].end, o[j].node,
                     o[j].crashes, o[j].suspensions};
    for (size_t i = 0; i < 5; i++)
      for (int b = 0; b < 64; b += 8)
        h = (h ^ ((f[i] >> b) & 0xff)) * 1099511628211ull;
  }
  return h;
}

static void measure(const char *trace, double load, const sim_trace_t *t,
                    const sim_cluster_t *c, const char *const *pols,
                    size_t npol, int reps) {
  const char *only = getenv("BENCH_SIM_POLICIES");
  sim_opts_t o;
  cogpu__sim_opts_default(&o);
  o.quiet = true;
  double excl_ns = 0;
  for (size_t i = 0; i < npol; i++) {
    if (!chosen(only, pols[i]))
      continue;
    sim_policy_t p;
    if (cogpu__sim_policy(pols[i], &p))
      bench_die("policy", -1);
    uint64_t v[64];
    sim_result_t r;
    /* The per-job outcomes, hashed: a change meant to make the simulator
     * faster must leave this figure alone (compare runs of the same
     * trace). */
    sim_outcome_t *out = calloc(t->n ? t->n : 1, sizeof *out);
    if (!out)
      bench_die("outcomes", -1);
    for (int k = 0; k < reps; k++) {
      uint64_t a = bench_now_ns();
      int rc = cogpu__sim_run(t, c, &p, &o, &r, NULL, out);
      if (rc)
        bench_die(cogpu_last_error(), rc);
      v[k] = bench_now_ns() - a;
    }
    uint64_t h = outcome_hash(out, t->n);
    free(out);
    bench_stats_t st = bench_stats(v, (size_t)reps);
    if (!strcmp(pols[i], "exclusive"))
      excl_ns = (double)st.median;
    bench_emit("sim", 1, &st,
               "\"trace\":\"%s\",\"load\":%.2f,\"policy\":\"%s\","
               "\"jobs\":%zu,\"gpus\":%u,\"events\":%zu,\"seconds\":%.3f,"
               "\"jobs_per_s\":%.0f,\"vs_exclusive\":%.3f,"
               "\"wait_mean_s\":%.1f,\"maxrss_mb\":%.0f,"
               "\"outcomes\":\"%016" PRIx64 "\"",
               trace, load, pols[i], t->n, c->ngpus, r.events,
               (double)st.median / 1e9,
               (double)t->n / ((double)st.median / 1e9),
               excl_ns > 0 ? (double)st.median / excl_ns : 1.0, r.wait_mean,
               maxrss_mb(), h);
    fflush(stdout);
  }
}

int main(void) {
  const char *ts = getenv("BENCH_SIM_TSUBAME");
  if (ts && !strcmp(ts, "1")) {
    run_tsubame();
    return 0;
  }
  static const char *const pols[] = {
      "exclusive",    "shares",        "cogpu",  "cogpu:firstfit",
      "cogpu:fgd",    "cogpu+suspend", "gqueue", "rqueue",
      "rqueue-links", "colocate",      "latency"};
  int reps = (int)bench_env_long("BENCH_SIM_REPS", 5);
  if (reps > 64)
    reps = 64;
  const char *dir = getenv("COGPU_TRACES");
  char pods[4096], nodes[4096];
  snprintf(pods, sizeof pods,
           "%s/alibaba-clusterdata/openb_pod_list_default.csv",
           dir && *dir ? dir : "../shared/traces");
  snprintf(nodes, sizeof nodes,
           "%s/alibaba-clusterdata/openb_node_list_gpu_node.csv",
           dir && *dir ? dir : "../shared/traces");
  sim_opts_t o;
  cogpu__sim_opts_default(&o);
  const char *ali = getenv("BENCH_SIM_ALIBABA");
  long loadpct = bench_env_exact("BENCH_SIM_LOAD", 80);
  double load = (double)loadpct / 100.0;
  if (ali && !strcmp(ali, "0")) {
    /* skipped on request */
  } else if (access(pods, R_OK) == 0) {
    sim_trace_t t;
    sim_cluster_t c;
    memset(&t, 0, sizeof t);
    if (cogpu__sim_read_trace(&t, pods, SIM_FMT_ALIBABA, &o, stderr) ||
        cogpu__sim_read_cluster(&c, nodes, &o, stderr))
      bench_die(cogpu_last_error(), -1);
    measure("alibaba-openb-default", 0, &t, &c, pols, COGPU_ARRAY_SIZE(pols),
            reps);
    cogpu__sim_trace_free(&t);
    cogpu__sim_cluster_free(&c);
  } else {
    fprintf(stderr, "bench-sim: no %s (set COGPU_TRACES): Alibaba skipped\n",
            pods);
  }
  size_t n = (size_t)bench_env_long("BENCH_SIM_JOBS", 1000000);
  sim_trace_t t;
  sim_cluster_t c;
  synthetic(&t, n, 10000, load);
  if (cogpu__sim_make_cluster(&c, 1250, 8, 80 * SIM_GIB, 1024 * SIM_GIB))
    bench_die("cluster", -1);
  /* FGD's placement weighs every candidate node: left out at this size. */
  static const char *const big[] = {
      "exclusive", "shares", "cogpu",        "cogpu:firstfit", "cogpu+suspend",
      "gqueue",    "rqueue", "rqueue-links", "colocate",       "latency"};
  measure("synthetic", load, &t, &c, big, COGPU_ARRAY_SIZE(big), 1);
  cogpu__sim_trace_free(&t);
  cogpu__sim_cluster_free(&c);
  return 0;
}
