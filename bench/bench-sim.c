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
 * BENCH_SIM_POLICIES (a comma list) runs only those policies, and
 * BENCH_SIM_ALIBABA=0 skips the Alibaba trace: a process per policy gives
 * each its own peak memory (`maxrss_mb`, the process's peak resident set
 * after the run, the trace included).
 */
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
    for (int k = 0; k < reps; k++) {
      uint64_t a = bench_now_ns();
      int rc = cogpu__sim_run(t, c, &p, &o, &r, NULL, NULL);
      if (rc)
        bench_die(cogpu_last_error(), rc);
      v[k] = bench_now_ns() - a;
    }
    bench_stats_t st = bench_stats(v, (size_t)reps);
    if (!strcmp(pols[i], "exclusive"))
      excl_ns = (double)st.median;
    bench_emit("sim", 1, &st,
               "\"trace\":\"%s\",\"load\":%.2f,\"policy\":\"%s\","
               "\"jobs\":%zu,\"gpus\":%u,\"events\":%zu,\"seconds\":%.3f,"
               "\"jobs_per_s\":%.0f,\"vs_exclusive\":%.3f,"
               "\"wait_mean_s\":%.1f,\"maxrss_mb\":%.0f",
               trace, load, pols[i], t->n, c->ngpus, r.events,
               (double)st.median / 1e9,
               (double)t->n / ((double)st.median / 1e9),
               excl_ns > 0 ? (double)st.median / excl_ns : 1.0, r.wait_mean,
               maxrss_mb());
    fflush(stdout);
  }
}

int main(void) {
  static const char *const pols[] = {
      "exclusive", "shares",        "cogpu", "cogpu:firstfit",
      "cogpu:fgd", "cogpu+suspend", "rqueue"};
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
  static const char *const big[] = {"exclusive",     "shares",
                                    "cogpu",         "cogpu:firstfit",
                                    "cogpu+suspend", "rqueue"};
  measure("synthetic", load, &t, &c, big, COGPU_ARRAY_SIZE(big), 1);
  cogpu__sim_trace_free(&t);
  cogpu__sim_cluster_free(&c);
  return 0;
}
