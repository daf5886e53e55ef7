/*
 * bench-preload.c: what the preload library (libcogpu-preload.so) adds to
 * a CUDA program's driver calls, on the fake driver (tests/fakes/cuda).
 *
 * Like a program that loads CUDA itself, it does dlopen("libcuda.so.1") and
 * dlsym for every entry point: with the preload in LD_PRELOAD, dlsym hands
 * out the hooks. It also resolves the same entry points with glibc's own
 * dlsym (found with dlvsym), which the preload does not override, so it can
 * call the driver's functions directly. Each measurement alternates blocks
 * of calls by both routes in the same process, so the difference between
 * them is the cost of the hooks under the same conditions. Without the
 * preload both routes are the same function, and their difference shows
 * the noise of the measurement.
 *
 * Measured, after warm-up, each call timed alone (the sample includes one
 * clock read, reported as clock_ns):
 *   alloc_free     cuMemAlloc_v2(1 MiB) + cuMemFree_v2, as a pair
 *   alloc, free    each half of the pair alone (a second pass)
 *   mem_get_info   cuMemGetInfo_v2
 *   launch_kernel  cuLaunchKernel (a no-op in the fake driver)
 *   launch_graph   cuGraphLaunch of a graph without memory nodes, and
 *   launch_graph_mem  of one that allocates and frees 1 MiB: the hook
 *                  reads each used device's graph allocator afterwards
 *   ctx_get_device cuCtxGetDevice: not hooked, but every memory hook calls
 *                  the driver's once, so it is part of what they add
 *   alloc_burst, free_burst  BENCH_BURST allocations of 1 MiB, then their
 *                  frees: on demand, this includes growing and shrinking
 *                  the reservation every grow_step
 *   startup        wall time of fork + exec + wait of `cudaprog direct init
 *                  ctx` (BENCH_CUDAPROG, default ../tests/cudaprog next to
 *                  this binary), which inherits this environment; with the
 *                  preload loaded here, runs without it (LD_PRELOAD
 *                  removed) alternate with runs with it
 *
 * Knobs (environment): BENCH_ITERS (100000 calls per route and
 * measurement), BENCH_BURST (512), BENCH_BURST_ROUNDS (20),
 * BENCH_STARTUP_RUNS (20), BENCH_CUDAPROG.
 * Output: JSON lines (bench.h) with "preload" (whether LD_PRELOAD holds
 * libcogpu-preload.so), "mode" (none, reserve: COGPU_MEM set, on_demand),
 * "route" (dlsym or driver) and, on dlsym lines, "added_median_ns" and
 * "added_p99_ns": dlsym minus driver; "batch_ns" (cheap calls): per-call
 * median of batches of 100 calls timed together, without a clock read per
 * call; "ledger" (single, or node: the reservation booked through cogpud,
 * bench_ledger_mode). Start-up lines give "preload" and "mode" of the runs
 * of cudaprog,
 * and on the line with the preload, what it added.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdbool.h>
#include <sys/wait.h>

#include "bench.h"
#include "cuda/cuda-abi.h"

#define REQ_BYTES (1ull << 20)
#define BLOCK 1000 /* calls per route before switching to the other */
#define BATCH 100  /* calls per batch for the batch figure */

typedef struct bench_mod_s *module_t; /* CUmodule: opaque to us */

typedef struct api_s {
  CUresult (*init)(unsigned);
  CUresult (*primary)(CUcontext *, CUdevice);
  CUresult (*set_current)(CUcontext);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free)(CUdeviceptr);
  CUresult (*info)(size_t *, size_t *);
  CUresult (*load)(module_t *, const void *);
  CUresult (*function)(CUfunction *, module_t, const char *);
  CUresult (*ctx_device)(CUdevice *);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                     unsigned, unsigned, unsigned, CUstream, void **, void **);
  CUresult (*graph_create)(CUgraph *, unsigned);
  CUresult (*graph_alloc)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                          CUDA_MEM_ALLOC_NODE_PARAMS *);
  CUresult (*graph_free)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                         CUdeviceptr);
  CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*graph_launch)(CUgraphExec, CUstream);
} api_t;

enum { R_DLSYM, R_DRIVER, NROUTES };
static const char *const route_name[NROUTES] = {"dlsym", "driver"};
static api_t apis[NROUTES];
static CUfunction kernel;
static CUgraphExec graph_plain, graph_mem;
static bool preload;
static const char *mode;
static uint64_t clock_ns;

static void check(CUresult rc, const char *call) {
  if (rc != CUDA_SUCCESS) {
    fprintf(stderr, "bench: %s returned CUDA error %d\n", call, rc);
    exit(1);
  }
}

typedef void *dlsym_ft(void *, const char *);

#define RESOLVE(a, field, name, lookup, lib)                                   \
  do {                                                                         \
    (a)->field = (__typeof__((a)->field))lookup(lib, name);                    \
    if (!(a)->field) {                                                         \
      fprintf(stderr, "bench: %s not found in libcuda.so.1\n", name);          \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static void resolve(api_t *a, dlsym_ft *lookup, void *lib) {
  RESOLVE(a, init, "cuInit", lookup, lib);
  RESOLVE(a, primary, "cuDevicePrimaryCtxRetain", lookup, lib);
  RESOLVE(a, set_current, "cuCtxSetCurrent", lookup, lib);
  RESOLVE(a, alloc, "cuMemAlloc_v2", lookup, lib);
  RESOLVE(a, free, "cuMemFree_v2", lookup, lib);
  RESOLVE(a, info, "cuMemGetInfo_v2", lookup, lib);
  RESOLVE(a, load, "cuModuleLoadData", lookup, lib);
  RESOLVE(a, function, "cuModuleGetFunction", lookup, lib);
  RESOLVE(a, ctx_device, "cuCtxGetDevice", lookup, lib);
  RESOLVE(a, launch, "cuLaunchKernel", lookup, lib);
  RESOLVE(a, graph_create, "cuGraphCreate", lookup, lib);
  RESOLVE(a, graph_alloc, "cuGraphAddMemAllocNode", lookup, lib);
  RESOLVE(a, graph_free, "cuGraphAddMemFreeNode", lookup, lib);
  RESOLVE(a, graph_instantiate, "cuGraphInstantiateWithFlags", lookup, lib);
  RESOLVE(a, graph_launch, "cuGraphLaunch", lookup, lib);
}

/* The process's dlsym (the preload's when it is loaded) for the dlsym
 * route; glibc's own for the driver route. */
static void bind_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "bench: %s\n", dlerror());
    exit(1);
  }
  dlsym_ft *real = (dlsym_ft *)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
  if (!real)
    real = (dlsym_ft *)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
  if (!real) {
    fprintf(stderr, "bench: glibc's dlsym not found\n");
    exit(1);
  }
  resolve(&apis[R_DLSYM], dlsym, lib);
  resolve(&apis[R_DRIVER], real, lib);
  if (preload && apis[R_DLSYM].alloc == apis[R_DRIVER].alloc) {
    fprintf(stderr, "bench: the preload is loaded but dlsym did not return "
                    "its hooks\n");
    exit(1);
  }
}

/* The way programs start: through the hooks (the reservation is taken at
 * the first context in reserve mode). */
static void setup(void) {
  const api_t *a = &apis[R_DLSYM];
  CUcontext ctx;
  module_t mod;
  check(a->init(0), "cuInit");
  check(a->primary(&ctx, 0), "cuDevicePrimaryCtxRetain");
  check(a->set_current(ctx), "cuCtxSetCurrent");
  /* An empty kernel as PTX text: the real driver JIT-compiles it for the
   * GPU at hand; the fake driver accepts any image. */
  static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
                            ".visible .entry kernel()\n{\n\tret;\n}\n";
  check(a->load(&mod, ptx), "cuModuleLoadData");
  check(a->function(&kernel, mod, "kernel"), "cuModuleGetFunction");
  CUgraph g;
  check(a->graph_create(&g, 0), "cuGraphCreate");
  check(a->graph_instantiate(&graph_plain, g, 0), "cuGraphInstantiate");
  CUgraphNode an, fn;
  CUDA_MEM_ALLOC_NODE_PARAMS p = {.bytesize = REQ_BYTES};
  p.poolProps.allocType = 1;
  p.poolProps.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
  check(a->graph_create(&g, 0), "cuGraphCreate");
  check(a->graph_alloc(&an, g, NULL, 0, &p), "cuGraphAddMemAllocNode");
  check(a->graph_free(&fn, g, &an, 1, p.dptr), "cuGraphAddMemFreeNode");
  check(a->graph_instantiate(&graph_mem, g, 0), "cuGraphInstantiate");
}

/* --- per-call measurements ------------------------------------------------ */

static void op_alloc_free(const api_t *a) {
  CUdeviceptr p;
  check(a->alloc(&p, REQ_BYTES), "cuMemAlloc_v2");
  check(a->free(p), "cuMemFree_v2");
}

static void op_info(const api_t *a) {
  size_t fr, tot;
  check(a->info(&fr, &tot), "cuMemGetInfo_v2");
}

static void op_launch(const api_t *a) {
  check(a->launch(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL),
        "cuLaunchKernel");
}

static void op_graph(const api_t *a) {
  check(a->graph_launch(graph_plain, NULL), "cuGraphLaunch");
}

static void op_graph_mem(const api_t *a) {
  check(a->graph_launch(graph_mem, NULL), "cuGraphLaunch");
}

static void op_ctx_device(const api_t *a) {
  CUdevice dev;
  check(a->ctx_device(&dev), "cuCtxGetDevice");
}

static uint64_t *alloc_samples(size_t n) {
  uint64_t *s = malloc(n * sizeof *s);
  if (!s)
    bench_die("malloc", -ENOMEM);
  return s;
}

/* One line per route; sorts the samples. `batch` (per-call ns of calls
 * timed BATCH at a time, by route) may be NULL. */
static void emit_routes(const char *bench, const char *call,
                        uint64_t *s[NROUTES], size_t n, const double *batch) {
  bench_stats_t st[NROUTES];
  for (int r = 0; r < NROUTES; r++)
    st[r] = bench_stats(s[r], n);
  for (int r = 0; r < NROUTES; r++) {
    char extra[160] = "";
    if (r == R_DLSYM)
      snprintf(extra, sizeof extra,
               ",\"added_median_ns\":%" PRId64 ",\"added_p99_ns\":%" PRId64,
               (int64_t)(st[R_DLSYM].median - st[R_DRIVER].median),
               (int64_t)(st[R_DLSYM].p99 - st[R_DRIVER].p99));
    if (batch) {
      size_t len = strlen(extra);
      snprintf(extra + len, sizeof extra - len, ",\"batch_ns\":%.1f", batch[r]);
    }
    bench_emit(bench, 1, &st[r],
               "\"call\":\"%s\",\"route\":\"%s\",\"preload\":%s,"
               "\"mode\":\"%s\",\"ledger\":\"%s\",\"bytes\":%llu,"
               "\"clock_ns\":%" PRIu64 "%s",
               call, route_name[r], preload ? "true" : "false", mode,
               bench_ledger_mode(), REQ_BYTES, clock_ns, extra);
  }
}

/* Per-call cost of `op` by each route: blocks of BLOCK calls alternate
 * between the routes. With `batched`, also the median over batches of
 * BATCH calls timed together (no clock read per call). */
static void measure(const char *bench, const char *call,
                    void (*op)(const api_t *), long iters, bool batched) {
  size_t n = (size_t)(iters + BLOCK - 1) / BLOCK * BLOCK;
  uint64_t *s[NROUTES];
  for (int r = 0; r < NROUTES; r++) {
    s[r] = alloc_samples(n);
    for (long i = 0; i < iters / 10; i++) /* warm-up */
      op(&apis[r]);
  }
  for (size_t done = 0; done < n; done += BLOCK)
    for (int r = 0; r < NROUTES; r++)
      for (size_t i = done; i < done + BLOCK; i++) {
        uint64_t t0 = bench_now_ns();
        op(&apis[r]);
        s[r][i] = bench_now_ns() - t0;
      }
  double batch[NROUTES];
  if (batched) {
    size_t nb = n / BATCH;
    uint64_t *b[NROUTES];
    for (int r = 0; r < NROUTES; r++)
      b[r] = alloc_samples(nb);
    for (size_t k = 0; k < nb; k++)
      for (int r = 0; r < NROUTES; r++) {
        uint64_t t0 = bench_now_ns();
        for (int i = 0; i < BATCH; i++)
          op(&apis[r]);
        b[r][k] = bench_now_ns() - t0;
      }
    for (int r = 0; r < NROUTES; r++) {
      batch[r] = (double)bench_stats(b[r], nb).median / BATCH;
      free(b[r]);
    }
  }
  emit_routes(bench, call, s, n, batched ? batch : NULL);
  for (int r = 0; r < NROUTES; r++)
    free(s[r]);
}

/* Each half of the pair timed alone. */
static void measure_halves(long iters) {
  size_t n = (size_t)(iters + BLOCK - 1) / BLOCK * BLOCK;
  uint64_t *sa[NROUTES], *sf[NROUTES];
  for (int r = 0; r < NROUTES; r++) {
    sa[r] = alloc_samples(n);
    sf[r] = alloc_samples(n);
  }
  for (size_t done = 0; done < n; done += BLOCK)
    for (int r = 0; r < NROUTES; r++)
      for (size_t i = done; i < done + BLOCK; i++) {
        CUdeviceptr p;
        uint64_t t0 = bench_now_ns();
        CUresult rc = apis[r].alloc(&p, REQ_BYTES);
        uint64_t t1 = bench_now_ns();
        CUresult rc2 = rc ? rc : apis[r].free(p);
        uint64_t t2 = bench_now_ns();
        check(rc2, "cuMemAlloc_v2/cuMemFree_v2");
        sa[r][i] = t1 - t0;
        sf[r][i] = t2 - t1;
      }
  emit_routes("alloc", "cuMemAlloc_v2", sa, n, NULL);
  emit_routes("free", "cuMemFree_v2", sf, n, NULL);
  for (int r = 0; r < NROUTES; r++) {
    free(sa[r]);
    free(sf[r]);
  }
}

/* Many allocations held at once, then freed oldest first: on demand the
 * reservation grows every grow_step and shrinks again on the frees. */
static void measure_burst(long burst, long rounds) {
  size_t n = (size_t)(burst * rounds);
  uint64_t *sa[NROUTES], *sf[NROUTES];
  CUdeviceptr *p = malloc((size_t)burst * sizeof *p);
  if (!p)
    bench_die("malloc", -ENOMEM);
  for (int r = 0; r < NROUTES; r++) {
    sa[r] = alloc_samples(n);
    sf[r] = alloc_samples(n);
  }
  for (long k = -1; k < rounds; k++) /* round -1: warm-up */
    for (int r = 0; r < NROUTES; r++) {
      const api_t *a = &apis[r];
      for (long i = 0; i < burst; i++) {
        uint64_t t0 = bench_now_ns();
        CUresult rc = a->alloc(&p[i], REQ_BYTES);
        uint64_t t1 = bench_now_ns();
        check(rc, "cuMemAlloc_v2");
        if (k >= 0)
          sa[r][(size_t)(k * burst + i)] = t1 - t0;
      }
      for (long i = 0; i < burst; i++) {
        uint64_t t0 = bench_now_ns();
        CUresult rc = a->free(p[i]);
        uint64_t t1 = bench_now_ns();
        check(rc, "cuMemFree_v2");
        if (k >= 0)
          sf[r][(size_t)(k * burst + i)] = t1 - t0;
      }
    }
  char call[64];
  snprintf(call, sizeof call, "cuMemAlloc_v2 x%ld held", burst);
  emit_routes("alloc_burst", call, sa, n, NULL);
  snprintf(call, sizeof call, "cuMemFree_v2 x%ld, oldest first", burst);
  emit_routes("free_burst", call, sf, n, NULL);
  for (int r = 0; r < NROUTES; r++) {
    free(sa[r]);
    free(sf[r]);
  }
  free(p);
}

/* --- process start-up ----------------------------------------------------- */

/* BENCH_CUDAPROG, or tests/cudaprog of the build this binary is in. */
static void cudaprog_path(char *buf, size_t len) {
  const char *s = getenv("BENCH_CUDAPROG");
  if (s && *s) {
    snprintf(buf, len, "%s", s);
    return;
  }
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    *buf = 0;
    return;
  }
  exe[n] = 0;
  char *slash = strrchr(exe, '/'); /* .../B/bench/bench-preload */
  if (slash)
    *slash = 0;
  slash = strrchr(exe, '/');
  if (slash)
    *slash = 0;
  snprintf(buf, len, "%s/tests/cudaprog", exe);
}

/* Wall time of one run of cudaprog, or 0 if it failed; `bare`: without
 * LD_PRELOAD. */
static uint64_t run_once(const char *prog, bool bare) {
  fflush(stdout);
  uint64_t t0 = bench_now_ns();
  pid_t pid = fork();
  if (pid < 0)
    bench_die("fork", -errno);
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0)
      dup2(fd, STDOUT_FILENO);
    if (bare)
      unsetenv("LD_PRELOAD");
    execl(prog, "cudaprog", "direct", "init", "ctx", (char *)NULL);
    _exit(127);
  }
  int ws;
  if (waitpid(pid, &ws, 0) < 0)
    bench_die("waitpid", -errno);
  uint64_t t = bench_now_ns() - t0;
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    fprintf(stderr, "bench: %s direct init ctx failed (status %#x)\n", prog,
            ws);
    return 0;
  }
  return t;
}

/* With the preload loaded here, runs with and without it alternate, so
 * both see the same conditions; without it, only runs without. */
static int measure_startup(long runs) {
  char prog[4200];
  cudaprog_path(prog, sizeof prog);
  if (!*prog || access(prog, X_OK) != 0) {
    fprintf(stderr, "bench: no cudaprog at '%s': start-up not measured\n",
            prog);
    return 1;
  }
  int kinds = preload ? 2 : 1; /* kind 0: without the preload */
  uint64_t *s[2];
  for (int k = 0; k < kinds; k++) {
    s[k] = alloc_samples((size_t)runs);
    for (int i = 0; i < 2; i++) /* warm-up: page cache, state files */
      if (!run_once(prog, k == 0))
        return 1;
  }
  for (long i = 0; i < runs; i++)
    for (int k = 0; k < kinds; k++)
      if (!(s[k][i] = run_once(prog, k == 0)))
        return 1;
  bench_stats_t st[2];
  for (int k = 0; k < kinds; k++)
    st[k] = bench_stats(s[k], (size_t)runs);
  for (int k = 0; k < kinds; k++) {
    char extra[96] = "";
    if (k == 1)
      snprintf(extra, sizeof extra,
               ",\"added_median_ns\":%" PRId64 ",\"added_p99_ns\":%" PRId64,
               (int64_t)(st[1].median - st[0].median),
               (int64_t)(st[1].p99 - st[0].p99));
    bench_emit("startup", 1, &st[k],
               "\"call\":\"cudaprog direct init ctx\",\"preload\":%s,"
               "\"mode\":\"%s\"%s",
               k ? "true" : "false", k ? mode : "none", extra);
    free(s[k]);
  }
  return 0;
}

int main(void) {
  alarm(140); /* last resort; run.sh bounds it too */
  const char *lp = getenv("LD_PRELOAD");
  preload = lp && strstr(lp, "libcogpu-preload.so");
  const char *mem = getenv("COGPU_MEM");
  mode = !preload ? "none" : mem && *mem ? "reserve" : "on_demand";
  long iters = bench_env_long("BENCH_ITERS", 100000);
  long burst = bench_env_long("BENCH_BURST", 512);
  long rounds = bench_env_long("BENCH_BURST_ROUNDS", 20);
  long runs = bench_env_long("BENCH_STARTUP_RUNS", 20);
  clock_ns = bench_clock_overhead_ns();

  bind_driver();
  setup();
  measure("alloc_free", "cuMemAlloc_v2+cuMemFree_v2", op_alloc_free, iters,
          false);
  measure_halves(iters);
  measure("mem_get_info", "cuMemGetInfo_v2", op_info, iters, true);
  measure("launch_kernel", "cuLaunchKernel", op_launch, iters, true);
  measure("launch_graph", "cuGraphLaunch", op_graph, iters, true);
  measure("launch_graph_mem", "cuGraphLaunch", op_graph_mem, iters, true);
  /* Not hooked; the memory hooks call it once each to learn the device. */
  measure("ctx_get_device", "cuCtxGetDevice", op_ctx_device, iters, true);
  measure_burst(burst, rounds);
  return measure_startup(runs);
}
