/*
 * bench-peak.c: what peak tracking (docs/history.md: the usage page, one
 * relaxed store per allocation and free, a compare-and-swap and a clock
 * read when the peak rises) adds to an allocation through the preload
 * library, on the fake driver.
 *
 * Peak tracking has no run-time switch, so the baseline is a second build
 * of the preload library, for this benchmark only, with the usage page's
 * update compiled out (-DCOGPU_BENCH_NO_USAGE: $(B)/bench/
 * libcogpu-preload-nousage.so, `make bench`). The parent runs BENCH_ROUNDS
 * child processes of each library, alternating which goes first, all in
 * the same run; each child is this program with that library in
 * LD_PRELOAD and COGPU_MEM=8G (every allocation inside the reservation:
 * the hot path).
 *
 * A child calls cuMemAlloc_v2 and cuMemFree_v2 by two routes, as
 * bench-preload does: through the hooks (dlsym) and directly (glibc's own
 * dlsym), alternating blocks of 1000 calls. The fake driver's allocation
 * (an mmap and munmap) costs microseconds and moves by a microsecond from
 * one process to the next, far more than a store; each child's "added"
 * figure, hooks minus driver in the same process and the same moments,
 * cancels that. Measured per child:
 *   pair     an alloc + free pair of 1 MiB, each pair timed alone, and
 *            batches of 100 pairs timed together (no clock read a pair)
 *   held     BENCH_BURST allocations held at once, below the process's
 *            peak (a warm-up burst reached it): one store each
 *   rising   the next BENCH_BURST allocations, each raising the peak: a
 *            compare-and-swap and a clock read each
 * Each child checks that the library is the one it claims: with tracking,
 * `cogpu status` shows its peak; without it, none.
 *
 * Output: per measurement and library ("tracking": true/false) a line of
 * the hooked calls' samples (all children pooled) with "added_median_ns",
 * the median over the children of their added medians, and on the
 * tracking line "tracking_added_ns": its added median minus that of the
 * library without tracking (the cost of peak tracking), and the spread of
 * the children's added medians (p25, p75). Knobs: BENCH_ROUNDS (20
 * children per library), BENCH_ITERS (20000 pairs per route and child),
 * BENCH_BURST (256), BENCH_PRELOAD and BENCH_PRELOAD_NOUSAGE (the two
 * libraries: by default $(B)/libcogpu-preload.so and
 * $(B)/bench/libcogpu-preload-nousage.so next to this binary).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "bench.h"
#include "cuda/cuda-abi.h"

#define REQ_BYTES (1ull << 20)
#define BLOCK 1000
#define BATCH 100

enum { M_PAIR, M_PAIR_BATCH, M_HELD, M_RISING, NMEAS };
static const char *const meas_name[NMEAS] = {
    "peak_alloc_free", "peak_alloc_free_batch", "peak_alloc_held",
    "peak_alloc_rising"};
enum { R_HOOK, R_DRIVER, NROUTES };

typedef struct api_s {
  CUresult (*init)(unsigned);
  CUresult (*primary)(CUcontext *, CUdevice);
  CUresult (*set_current)(CUcontext);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free)(CUdeviceptr);
} api_t;

typedef void *dlsym_ft(void *, const char *);

static void check(CUresult rc, const char *call) {
  if (rc != CUDA_SUCCESS) {
    fprintf(stderr, "bench-peak: %s returned CUDA error %d\n", call, rc);
    exit(1);
  }
}

static void resolve(api_t *a, dlsym_ft *lookup, void *lib) {
  a->init = (__typeof__(a->init))lookup(lib, "cuInit");
  a->primary = (__typeof__(a->primary))lookup(lib, "cuDevicePrimaryCtxRetain");
  a->set_current = (__typeof__(a->set_current))lookup(lib, "cuCtxSetCurrent");
  a->alloc = (__typeof__(a->alloc))lookup(lib, "cuMemAlloc_v2");
  a->free = (__typeof__(a->free))lookup(lib, "cuMemFree_v2");
  if (!a->init || !a->primary || !a->set_current || !a->alloc || !a->free) {
    fprintf(stderr, "bench-peak: an entry point is missing in libcuda\n");
    exit(1);
  }
}

/* Samples a child writes: per measurement and route, `per[m]` of them. */
typedef struct layout_s {
  size_t per[NMEAS];
  size_t child_words; /* uint64_t words per child, whole pages (mmap) */
} layout_t;

static layout_t layout(long iters, long burst) {
  layout_t l;
  l.per[M_PAIR] = (size_t)(iters + BLOCK - 1) / BLOCK * BLOCK;
  l.per[M_PAIR_BATCH] = l.per[M_PAIR] / BATCH;
  l.per[M_HELD] = (size_t)burst;
  l.per[M_RISING] = (size_t)burst;
  l.child_words = 0;
  for (int m = 0; m < NMEAS; m++)
    l.child_words += NROUTES * l.per[m];
  l.child_words = (l.child_words + 511) / 512 * 512;
  return l;
}

static uint64_t *slot_of(uint64_t *base, const layout_t *l, int m, int r) {
  size_t off = 0;
  for (int k = 0; k < m; k++)
    off += NROUTES * l->per[k];
  return base + off + (size_t)r * l->per[m];
}

/* This process's peak on GPU 0 as `cogpu status` shows it. */
static uint64_t my_peak(void) {
  cogpu_status_t *st;
  if (cogpu_status(NULL, &st) != 0)
    return 0;
  uint64_t p = 0;
  for (size_t i = 0; i < st->gpus[0].nclients; i++)
    if (st->gpus[0].clients[i].pid == getpid())
      p = st->gpus[0].clients[i].peak_bytes;
  cogpu_status_free(st);
  return p;
}

static int child(int fd, long index, long iters, long burst, bool tracking) {
  layout_t l = layout(iters, burst);
  size_t bytes = l.child_words * sizeof(uint64_t);
  uint64_t *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                        (off_t)((size_t)index * bytes));
  if (base == MAP_FAILED) {
    perror("bench-peak: mmap");
    return 1;
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  dlsym_ft *real = (dlsym_ft *)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
  if (!real)
    real = (dlsym_ft *)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
  if (!lib || !real) {
    fprintf(stderr, "bench-peak: no libcuda.so.1 or glibc's dlsym\n");
    return 1;
  }
  api_t api[NROUTES];
  resolve(&api[R_HOOK], dlsym, lib);
  resolve(&api[R_DRIVER], real, lib);
  if (api[R_HOOK].alloc == api[R_DRIVER].alloc) {
    fprintf(stderr, "bench-peak: the preload library is not loaded\n");
    return 1;
  }
  CUcontext ctx;
  check(api[R_HOOK].init(0), "cuInit");
  check(api[R_HOOK].primary(&ctx, 0), "cuDevicePrimaryCtxRetain");
  check(api[R_HOOK].set_current(ctx), "cuCtxSetCurrent");
  CUdeviceptr *p = malloc(2 * (size_t)burst * sizeof *p);
  if (!p)
    return 1;
  /* Bursts: a warm-up burst through each route (the hooks' burst sets the
   * peak), then 2 x burst held: the first half stays below the peak, the
   * second raises it at every allocation. */
  for (int r = 0; r < NROUTES; r++) {
    for (long i = 0; i < burst; i++)
      check(api[r].alloc(&p[i], REQ_BYTES), "cuMemAlloc_v2");
    for (long i = 0; i < burst; i++)
      check(api[r].free(p[i]), "cuMemFree_v2");
  }
  for (int r = 0; r < NROUTES; r++) {
    uint64_t *held = slot_of(base, &l, M_HELD, r);
    uint64_t *rising = slot_of(base, &l, M_RISING, r);
    for (long i = 0; i < 2 * burst; i++) {
      uint64_t t0 = bench_now_ns();
      CUresult rc = api[r].alloc(&p[i], REQ_BYTES);
      uint64_t t = bench_now_ns() - t0;
      check(rc, "cuMemAlloc_v2");
      if (i < burst)
        held[i] = t;
      else
        rising[i - burst] = t;
    }
    for (long i = 0; i < 2 * burst; i++)
      check(api[r].free(p[i]), "cuMemFree_v2");
  }
  free(p);
  /* The library is what it says: its peak is known, or not at all. */
  uint64_t peak = my_peak();
  uint64_t want = 2 * (uint64_t)burst * REQ_BYTES;
  if (tracking ? peak < want : peak != 0) {
    fprintf(stderr,
            "bench-peak: the %s library's peak is %" PRIu64 " bytes (%s)\n",
            tracking ? "tracking" : "non-tracking", peak,
            tracking ? "want at least the bursts'" : "want none");
    return 1;
  }
  /* Pairs, alternating blocks; then batches. */
  for (int r = 0; r < NROUTES; r++)
    for (long i = 0; i < iters / 10; i++) {
      CUdeviceptr q;
      check(api[r].alloc(&q, REQ_BYTES), "cuMemAlloc_v2");
      check(api[r].free(q), "cuMemFree_v2");
    }
  size_t n = l.per[M_PAIR];
  for (size_t done = 0; done < n; done += BLOCK)
    for (int r = 0; r < NROUTES; r++) {
      uint64_t *s = slot_of(base, &l, M_PAIR, r);
      for (size_t i = done; i < done + BLOCK; i++) {
        CUdeviceptr q;
        uint64_t t0 = bench_now_ns();
        CUresult rc = api[r].alloc(&q, REQ_BYTES);
        CUresult rc2 = rc ? rc : api[r].free(q);
        s[i] = bench_now_ns() - t0;
        check(rc2, "cuMemAlloc_v2+cuMemFree_v2");
      }
    }
  for (size_t k = 0; k < l.per[M_PAIR_BATCH]; k++)
    for (int r = 0; r < NROUTES; r++) {
      uint64_t t0 = bench_now_ns();
      for (int i = 0; i < BATCH; i++) {
        CUdeviceptr q;
        check(api[r].alloc(&q, REQ_BYTES), "cuMemAlloc_v2");
        check(api[r].free(q), "cuMemFree_v2");
      }
      slot_of(base, &l, M_PAIR_BATCH, r)[k] = (bench_now_ns() - t0) / BATCH;
    }
  munmap(base, bytes);
  return 0;
}

/* The libraries: BENCH_PRELOAD / BENCH_PRELOAD_NOUSAGE, or where `make
 * bench` puts them relative to this binary ($(B)/bench/bench-peak). */
static void lib_path(const char *env, const char *rel, char *buf, size_t len) {
  const char *s = getenv(env);
  if (s && *s) {
    snprintf(buf, len, "%s", s);
    return;
  }
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  char *slash = strrchr(exe, '/');
  if (slash)
    *slash = 0;
  snprintf(buf, len, "%s/%s", exe, rel);
}

static int run_child(const char *lib, int fd, long index, bool tracking) {
  char fds[24], idx[24];
  snprintf(fds, sizeof fds, "%d", fd);
  snprintf(idx, sizeof idx, "%ld", index);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0)
    bench_die("fork", -errno);
  if (pid == 0) {
    setenv("LD_PRELOAD", lib, 1);
    setenv("COGPU_MEM", "8G", 1);
    execl("/proc/self/exe", "bench-peak", "--child", fds, idx,
          tracking ? "tracking" : "none", (char *)NULL);
    _exit(127);
  }
  int ws;
  if (waitpid(pid, &ws, 0) < 0)
    bench_die("waitpid", -errno);
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    fprintf(stderr, "bench-peak: child with %s failed (status %#x)\n", lib, ws);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  long iters = bench_env_long("BENCH_ITERS", 20000);
  long burst = bench_env_long("BENCH_BURST", 256);
  if (argc == 5 && strcmp(argv[1], "--child") == 0)
    return child(atoi(argv[2]), atol(argv[3]), iters, burst,
                 strcmp(argv[4], "tracking") == 0);
  alarm(280); /* last resort; run.sh bounds it too */
  long rounds = bench_env_long("BENCH_ROUNDS", 20);
  char lib[2][4200];
  lib_path("BENCH_PRELOAD", "../libcogpu-preload.so", lib[1], sizeof lib[1]);
  lib_path("BENCH_PRELOAD_NOUSAGE", "libcogpu-preload-nousage.so", lib[0],
           sizeof lib[0]);
  for (int v = 0; v < 2; v++)
    if (access(lib[v], R_OK) != 0) {
      fprintf(stderr, "bench-peak: no %s (make bench)\n", lib[v]);
      return 1;
    }
  layout_t l = layout(iters, burst);
  size_t child_bytes = l.child_words * sizeof(uint64_t);
  long nchild = 2 * rounds;
  int fd = memfd_create("bench-peak", 0); /* inherited by the children */
  if (fd < 0 || ftruncate(fd, (off_t)(child_bytes * (size_t)nchild)) != 0)
    bench_die("memfd", -errno);
  /* Child 2k+v ran library v (0: without tracking, 1: with). */
  for (long k = 0; k < rounds; k++)
    for (int j = 0; j < 2; j++) {
      int v = (int)((k + j) % 2); /* ABBA: neither always goes first */
      if (run_child(lib[v], fd, 2 * k + v, v == 1))
        return 1;
    }
  uint64_t *all =
      mmap(NULL, child_bytes * (size_t)nchild, PROT_READ, MAP_SHARED, fd, 0);
  if (all == MAP_FAILED)
    bench_die("mmap", -errno);
  uint64_t clock_ns = bench_clock_overhead_ns();
  for (int m = 0; m < NMEAS; m++) {
    size_t per = l.per[m];
    int64_t added_med[2] = {0, 0}, added_p25[2] = {0, 0}, added_p75[2] = {0, 0};
    bench_stats_t pooled[2];
    for (int v = 0; v < 2; v++) {
      uint64_t *pool = malloc((size_t)rounds * per * sizeof *pool);
      int64_t *added = malloc((size_t)rounds * sizeof *added);
      uint64_t *tmp = malloc(per * sizeof *tmp);
      if (!pool || !added || !tmp)
        bench_die("malloc", -ENOMEM);
      for (long k = 0; k < rounds; k++) {
        uint64_t *c = all + (size_t)(2 * k + v) * l.child_words;
        memcpy(tmp, slot_of(c, &l, m, R_HOOK), per * sizeof *tmp);
        memcpy(pool + (size_t)k * per, tmp, per * sizeof *tmp);
        uint64_t hook = bench_stats(tmp, per).median;
        memcpy(tmp, slot_of(c, &l, m, R_DRIVER), per * sizeof *tmp);
        uint64_t drv = bench_stats(tmp, per).median;
        added[k] = (int64_t)hook - (int64_t)drv;
      }
      /* Median and quartiles of the children's added medians. */
      for (long a = 1; a < rounds; a++)
        for (long b = a; b > 0 && added[b - 1] > added[b]; b--) {
          int64_t x = added[b];
          added[b] = added[b - 1];
          added[b - 1] = x;
        }
      added_med[v] = added[(rounds - 1) / 2];
      added_p25[v] = added[(rounds - 1) / 4];
      added_p75[v] = added[(3 * (rounds - 1)) / 4];
      pooled[v] = bench_stats(pool, (size_t)rounds * per);
      free(pool);
      free(added);
      free(tmp);
    }
    for (int v = 0; v < 2; v++) {
      char extra[128] = "";
      if (v == 1)
        snprintf(extra, sizeof extra, ",\"tracking_added_ns\":%" PRId64,
                 added_med[1] - added_med[0]);
      bench_emit(meas_name[m], 1, &pooled[v],
                 "\"tracking\":%s,\"children\":%ld,\"bytes\":%llu,"
                 "\"added_median_ns\":%" PRId64 ",\"added_p25_ns\":%" PRId64
                 ",\"added_p75_ns\":%" PRId64 ",\"clock_ns\":%" PRIu64 "%s",
                 v ? "true" : "false", rounds, REQ_BYTES, added_med[v],
                 added_p25[v], added_p75[v],
                 m == M_PAIR_BATCH ? (uint64_t)0 : clock_ns, extra);
    }
  }
  return 0;
}
