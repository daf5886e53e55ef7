/*
 * bench-suspend.c: what suspending a CUDA process through the driver's
 * checkpoint API costs, and what it does to the process, its GPU memory
 * and its host memory (issue 12; the first figures for docs/suspension.md).
 *
 * It is a bench program that runs against whatever libcuda.so.1 the loader
 * finds: the real driver on a GPU node, the fake one in tests. A driver
 * without the API (before 570) gives one "unsupported" line and exit 0.
 *
 * Modes:
 *   bench-suspend [--sizes 1,10,40] [--hold SECONDS]
 *       For each size (GiB), starts a target (this binary, --target) that
 *       allocates that much in 1 GiB pieces, fills each with its own
 *       pattern and keeps a heartbeat thread calling the driver. Then
 *       Lock, Checkpoint, hold, Restore, Unlock, and has the target verify
 *       every word at its old addresses. One JSON line per size with the
 *       time of each step, the device's used memory, the target's resident
 *       host memory and its cgroup's memory.current before, while
 *       suspended and after, and whether the heartbeat stopped while the
 *       target was locked.
 *   bench-suspend --pid PID [--hold SECONDS]
 *       Suspends a running process (a PyTorch job, say) for SECONDS and
 *       resumes it; one JSON line with the timings.
 *   bench-suspend --restore-without-memory [--sizes N]
 *       Checkpoints a target of N GiB, fills the device with another
 *       process's allocations, and tries to restore: the trap that the
 *       notes say wedges a process for good. Then frees the device, tries
 *       again, and reports every result code and state.
 * Output: JSON lines (bench.h). Needs rights over the targets (root, or
 * the same user as a parent process).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "bench.h"
#include "cuda/cuda-abi.h"

#define GIB (1ull << 30)
#define PIECE_WORDS (GIB / 4)
#define VERIFY_CHUNK (64ull << 20)

typedef struct {
  unsigned timeout_ms, reserved0;
  uint64_t reserved1[7];
} lock_args_t;
typedef struct {
  uint64_t reserved[8];
} plain_args_t;
typedef struct {
  void *pairs;
  unsigned count;
  char reserved[52 - sizeof(void *)];
  uint64_t reserved1;
} restore_args_t;

static struct {
  CUresult (*init)(unsigned);
  CUresult (*primary)(CUcontext *, CUdevice);
  CUresult (*set_current)(CUcontext);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free)(CUdeviceptr);
  CUresult (*memset32)(CUdeviceptr, unsigned, size_t);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t);
  CUresult (*sync)(void);
  CUresult (*get_state)(int, int *);
  CUresult (*lock)(int, lock_args_t *);
  CUresult (*checkpoint)(int, plain_args_t *);
  CUresult (*restore)(int, restore_args_t *);
  CUresult (*unlock)(int, plain_args_t *);
} cu;

static void *must_sym(void *lib, const char *name, bool required) {
  void *p = dlsym(lib, name);
  if (!p && required) {
    fprintf(stderr, "bench-suspend: libcuda.so.1 lacks %s\n", name);
    exit(2);
  }
  return p;
}

/* False when the driver has no checkpoint API. */
static bool load_cuda(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "bench-suspend: %s\n", dlerror());
    exit(2);
  }
  *(void **)&cu.init = must_sym(lib, "cuInit", true);
  *(void **)&cu.primary = must_sym(lib, "cuDevicePrimaryCtxRetain", true);
  *(void **)&cu.set_current = must_sym(lib, "cuCtxSetCurrent", true);
  *(void **)&cu.alloc = must_sym(lib, "cuMemAlloc_v2", true);
  *(void **)&cu.free = must_sym(lib, "cuMemFree_v2", true);
  *(void **)&cu.memset32 = must_sym(lib, "cuMemsetD32_v2", true);
  *(void **)&cu.dtoh = must_sym(lib, "cuMemcpyDtoH_v2", true);
  *(void **)&cu.sync = must_sym(lib, "cuCtxSynchronize", true);
  *(void **)&cu.get_state = must_sym(lib, "cuCheckpointProcessGetState", false);
  *(void **)&cu.lock = must_sym(lib, "cuCheckpointProcessLock", false);
  *(void **)&cu.checkpoint =
      must_sym(lib, "cuCheckpointProcessCheckpoint", false);
  *(void **)&cu.restore = must_sym(lib, "cuCheckpointProcessRestore", false);
  *(void **)&cu.unlock = must_sym(lib, "cuCheckpointProcessUnlock", false);
  return cu.get_state && cu.lock && cu.checkpoint && cu.restore && cu.unlock;
}

static void cu_check(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "bench-suspend[%d]: %s failed: CUresult %d\n", getpid(),
            what, r);
    exit(1);
  }
}

/* Opens a result line: {"bench":..., "commit", "machine", "date"; the
 * caller adds its fields and the closing brace. */
static void bench_json_begin(const char *bench) {
  char commit[64], date[32];
  struct utsname u;
  bench_commit(commit, sizeof commit);
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  printf("{\"bench\":");
  bench_json_str(stdout, bench);
  printf(",\"commit\":");
  bench_json_str(stdout, commit);
  printf(",\"machine\":\"%s, %ld cpus\",\"date\":\"%s\"",
         uname(&u) == 0 ? u.nodename : "unknown", sysconf(_SC_NPROCESSORS_ONLN),
         date);
}

static double ms_since(uint64_t t0) {
  return (double)(bench_now_ns() - t0) / 1e6;
}

/* --- NVML: the device's used memory, as nvidia-smi shows it ------------- */

typedef struct {
  unsigned long long total, free, used;
} nvml_mem_t;
static int (*nvml_mem)(void *, nvml_mem_t *);
static void *nvml_dev;

static void load_nvml(void) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return;
  int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
  int (*get)(unsigned, void **) =
      (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void **)&nvml_mem = dlsym(lib, "nvmlDeviceGetMemoryInfo");
  if (!init || !get || !nvml_mem || init() != 0 || get(0, &nvml_dev) != 0)
    nvml_mem = NULL;
}

/* MiB used on GPU 0, or -1 without NVML. */
static long gpu_used_mib(void) {
  nvml_mem_t m;
  if (!nvml_mem || nvml_mem(nvml_dev, &m) != 0)
    return -1;
  return (long)(m.used >> 20);
}

/* --- the target's host memory ------------------------------------------ */

static long rss_mib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  if (!f)
    return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
      break;
  fclose(f);
  return kb < 0 ? -1 : kb >> 10;
}

/* A cgroup file's first number, in MiB, or -1. */
static long read_mib(const char *path) {
  FILE *g = fopen(path, "r");
  unsigned long long b;
  long v = -1;
  if (g && fscanf(g, "%llu", &b) == 1)
    v = (long)(b >> 20);
  if (g)
    fclose(g);
  return v;
}

/* What the target's memory cgroup is charged, in MiB, or -1: v1's
 * memory.usage_in_bytes when a v1 memory hierarchy holds it (hybrid hosts
 * keep the memory controller there), else v2's memory.current. */
static long cgroup_mib(pid_t pid) {
  char path[512], line[400];
  snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  long v1 = -1, v2 = -1;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *ctl = strchr(line, ':');
    char *cg = ctl ? strchr(ctl + 1, ':') : NULL;
    if (!cg)
      continue;
    *cg++ = 0;
    ctl++;
    if (strcmp(line, "0") == 0 && !*ctl) {
      snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", cg);
      v2 = read_mib(path);
    } else if (strstr(ctl, "memory")) {
      snprintf(path, sizeof path,
               "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", cg);
      v1 = read_mib(path);
    }
  }
  fclose(f);
  return v1 >= 0 ? v1 : v2;
}

/* --- the target ---------------------------------------------------------- */

static _Atomic uint64_t *beat; /* shared with the prober through a file */

static void *heartbeat(void *arg) {
  CUcontext ctx = arg;
  CUdeviceptr p;
  cu_check(cu.set_current(ctx), "cuCtxSetCurrent");
  cu_check(cu.alloc(&p, 4096), "cuMemAlloc_v2 (heartbeat)");
  for (;;) {
    /* Each beat is a driver call that must wait while the process is
     * locked or checkpointed. */
    if (cu.memset32(p, 7, 1024) != CUDA_SUCCESS || cu.sync() != CUDA_SUCCESS)
      break;
    atomic_fetch_add(beat, 1);
    usleep(2000);
  }
  return NULL;
}

static _Atomic uint64_t *map_beat(const char *path, bool create) {
  int fd = open(path, O_RDWR | (create ? O_CREAT : 0), 0600);
  if (fd < 0 || (create && ftruncate(fd, 4096) != 0)) {
    perror("bench-suspend: beat file");
    exit(1);
  }
  void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    perror("bench-suspend: mmap");
    exit(1);
  }
  return m;
}

/* Commands on stdin, one a line: "verify" (answers "ok" or "bad ..."),
 * "exit". Answers on stdout. */
static int target_main(long gib, const char *beat_path) {
  if (!load_cuda())
    return 2;
  CUcontext ctx;
  cu_check(cu.init(0), "cuInit");
  cu_check(cu.primary(&ctx, 0), "cuDevicePrimaryCtxRetain");
  cu_check(cu.set_current(ctx), "cuCtxSetCurrent");
  CUdeviceptr *ptr = calloc((size_t)gib, sizeof *ptr);
  for (long i = 0; i < gib; i++) {
    cu_check(cu.alloc(&ptr[i], GIB), "cuMemAlloc_v2");
    cu_check(cu.memset32(ptr[i], 0xC0DE0000u + (unsigned)i, PIECE_WORDS),
             "cuMemsetD32_v2");
  }
  cu_check(cu.sync(), "cuCtxSynchronize");
  beat = map_beat(beat_path, false);
  pthread_t t;
  pthread_create(&t, NULL, heartbeat, ctx);
  printf("ready\n");
  fflush(stdout);
  char line[64];
  uint32_t *buf = malloc(VERIFY_CHUNK);
  while (fgets(line, sizeof line, stdin)) {
    if (strncmp(line, "verify", 6) == 0) {
      long bad = -1;
      uint64_t t0 = bench_now_ns();
      for (long i = 0; i < gib && bad < 0; i++)
        for (uint64_t off = 0; off < GIB && bad < 0; off += VERIFY_CHUNK) {
          cu_check(cu.dtoh(buf, ptr[i] + off, VERIFY_CHUNK), "cuMemcpyDtoH");
          for (size_t w = 0; w < VERIFY_CHUNK / 4; w++)
            if (buf[w] != 0xC0DE0000u + (unsigned)i) {
              bad = i;
              break;
            }
        }
      if (bad < 0)
        printf("ok %.1f\n", ms_since(t0));
      else
        printf("bad piece %ld\n", bad);
      fflush(stdout);
    } else if (strncmp(line, "exit", 4) == 0) {
      break;
    }
  }
  _exit(0);
}

typedef struct {
  pid_t pid;
  FILE *in, *out;
} target_t;

static void start_target(target_t *t, long gib, const char *beat_path) {
  int to[2], from[2];
  if (pipe(to) || pipe(from))
    bench_die("pipe", -errno);
  t->pid = fork();
  if (t->pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    char n[32];
    snprintf(n, sizeof n, "%ld", gib);
    execl("/proc/self/exe", "bench-suspend", "--target", n, beat_path,
          (char *)NULL);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  t->in = fdopen(to[1], "w");
  t->out = fdopen(from[0], "r");
  char line[64];
  if (!fgets(line, sizeof line, t->out) || strncmp(line, "ready", 5) != 0) {
    fprintf(stderr, "bench-suspend: the %ld GiB target did not start\n", gib);
    exit(1);
  }
}

static void stop_target(target_t *t) {
  fprintf(t->in, "exit\n");
  fflush(t->in);
  int st;
  waitpid(t->pid, &st, 0);
  fclose(t->in);
  fclose(t->out);
}

static int state_of(pid_t pid) {
  int s = -1;
  CUresult r = cu.get_state((int)pid, &s);
  return r == CUDA_SUCCESS ? s : -100 - r;
}

/* --- suspend and resume ----------------------------------------------------
 */

typedef struct {
  double lock_ms, checkpoint_ms, restore_ms, unlock_ms, get_state_ms;
  int lock_rc, checkpoint_rc, restore_rc, unlock_rc;
  int state_locked, state_suspended, state_after;
  long gpu_before, gpu_suspended, gpu_after;
  long rss_before, rss_suspended, rss_after;
  long cg_before, cg_suspended, cg_after;
} cycle_t;

static void cycle(pid_t pid, double hold_s, cycle_t *c, _Atomic uint64_t *hb,
                  uint64_t *beats_locked) {
  lock_args_t la = {.timeout_ms = 10000};
  plain_args_t pa = {0};
  restore_args_t ra = {0};
  c->gpu_before = gpu_used_mib();
  c->rss_before = rss_mib(pid);
  c->cg_before = cgroup_mib(pid);
  uint64_t t = bench_now_ns();
  c->lock_rc = cu.lock((int)pid, &la);
  c->lock_ms = ms_since(t);
  t = bench_now_ns();
  c->state_locked = state_of(pid);
  c->get_state_ms = ms_since(t);
  uint64_t b0 = hb ? atomic_load(hb) : 0;
  t = bench_now_ns();
  c->checkpoint_rc = cu.checkpoint((int)pid, &pa);
  c->checkpoint_ms = ms_since(t);
  c->state_suspended = state_of(pid);
  c->gpu_suspended = gpu_used_mib();
  c->rss_suspended = rss_mib(pid);
  c->cg_suspended = cgroup_mib(pid);
  usleep((useconds_t)(hold_s * 1e6));
  t = bench_now_ns();
  c->restore_rc = cu.restore((int)pid, &ra);
  c->restore_ms = ms_since(t);
  if (hb)
    *beats_locked = atomic_load(hb) - b0;
  t = bench_now_ns();
  c->unlock_rc = cu.unlock((int)pid, &pa);
  c->unlock_ms = ms_since(t);
  c->state_after = state_of(pid);
  c->gpu_after = gpu_used_mib();
  c->rss_after = rss_mib(pid);
  c->cg_after = cgroup_mib(pid);
}

static void print_cycle(const char *mode, long gib, const cycle_t *c) {
  printf("\"lock_ms\":%.2f,\"checkpoint_ms\":%.2f,\"restore_ms\":%.2f,"
         "\"unlock_ms\":%.2f,\"get_state_ms\":%.2f,"
         "\"rc\":[%d,%d,%d,%d],\"states\":[%d,%d,%d],"
         "\"gpu_used_mib\":[%ld,%ld,%ld],\"rss_mib\":[%ld,%ld,%ld],"
         "\"cgroup_mib\":[%ld,%ld,%ld]",
         c->lock_ms, c->checkpoint_ms, c->restore_ms, c->unlock_ms,
         c->get_state_ms, c->lock_rc, c->checkpoint_rc, c->restore_rc,
         c->unlock_rc, c->state_locked, c->state_suspended, c->state_after,
         c->gpu_before, c->gpu_suspended, c->gpu_after, c->rss_before,
         c->rss_suspended, c->rss_after, c->cg_before, c->cg_suspended,
         c->cg_after);
  (void)mode;
  (void)gib;
}

static int sizes_main(const char *sizes, double hold_s) {
  char beat_path[] = "/tmp/bench-suspend-beat.XXXXXX";
  int fd = mkstemp(beat_path);
  if (fd < 0)
    bench_die("mkstemp", -errno);
  close(fd);
  _Atomic uint64_t *hb = map_beat(beat_path, true);
  char *list = strdup(sizes), *save = NULL;
  for (char *s = strtok_r(list, ",", &save); s;
       s = strtok_r(NULL, ",", &save)) {
    long gib = atol(s);
    if (gib <= 0)
      continue;
    target_t t;
    uint64_t t0 = bench_now_ns();
    start_target(&t, gib, beat_path);
    double start_ms = ms_since(t0);
    usleep(200000);
    uint64_t before = atomic_load(hb);
    usleep(100000);
    uint64_t running_beats = atomic_load(hb) - before;
    cycle_t c;
    uint64_t locked_beats = 0;
    cycle(t.pid, hold_s, &c, hb, &locked_beats);
    usleep(100000);
    uint64_t after0 = atomic_load(hb);
    usleep(100000);
    uint64_t after_beats = atomic_load(hb) - after0;
    fprintf(t.in, "verify\n");
    fflush(t.in);
    char answer[64] = "";
    if (!fgets(answer, sizeof answer, t.out))
      strcpy(answer, "no answer");
    answer[strcspn(answer, "\n")] = 0;
    stop_target(&t);
    bench_json_begin("bench-suspend");
    printf(",\"mode\":\"sizes\",\"gib\":%ld,\"target_start_ms\":%.1f,"
           "\"hold_s\":%.1f,",
           gib, start_ms, hold_s);
    print_cycle("sizes", gib, &c);
    printf(",\"beats_per_100ms_running\":%" PRIu64
           ",\"beats_while_suspended\":%" PRIu64
           ",\"beats_per_100ms_after\":%" PRIu64 ",\"verify\":\"%s\"}\n",
           running_beats, locked_beats, after_beats, answer);
    fflush(stdout);
  }
  unlink(beat_path);
  free(list);
  return 0;
}

static int pid_main(pid_t pid, double hold_s) {
  cycle_t c;
  cycle(pid, hold_s, &c, NULL, NULL);
  bench_json_begin("bench-suspend");
  printf(",\"mode\":\"pid\",\"pid\":%d,\"hold_s\":%.1f,", (int)pid, hold_s);
  print_cycle("pid", 0, &c);
  printf("}\n");
  return c.restore_rc || c.unlock_rc;
}

/* The trap: restore with the device full. Reports every step's code. */
static int oom_restore_main(long gib) {
  char beat_path[] = "/tmp/bench-suspend-beat.XXXXXX";
  int fd = mkstemp(beat_path);
  if (fd < 0)
    bench_die("mkstemp", -errno);
  close(fd);
  map_beat(beat_path, true);
  target_t t;
  start_target(&t, gib, beat_path);
  lock_args_t la = {.timeout_ms = 10000};
  plain_args_t pa = {0};
  restore_args_t ra = {0};
  int rc_lock = cu.lock((int)t.pid, &la);
  int rc_ckpt = cu.checkpoint((int)t.pid, &pa);
  /* Fill the device from this process (it has called cuInit). */
  CUcontext ctx;
  cu_check(cu.primary(&ctx, 0), "cuDevicePrimaryCtxRetain");
  cu_check(cu.set_current(ctx), "cuCtxSetCurrent");
  CUdeviceptr hog[4096];
  int nhog = 0;
  while (nhog < 4096 && cu.alloc(&hog[nhog], 256ull << 20) == CUDA_SUCCESS)
    nhog++;
  long gpu_full = gpu_used_mib();
  uint64_t t0 = bench_now_ns();
  int rc_restore1 = cu.restore((int)t.pid, &ra);
  double restore1_ms = ms_since(t0);
  int state1 = state_of(t.pid);
  for (int i = 0; i < nhog; i++)
    cu.free(hog[i]);
  int rc_restore2 = cu.restore((int)t.pid, &ra);
  int state2 = state_of(t.pid);
  int rc_unlock = cu.unlock((int)t.pid, &pa);
  int state3 = state_of(t.pid);
  char answer[64] = "not asked";
  if (rc_unlock == CUDA_SUCCESS) {
    fprintf(t.in, "verify\n");
    fflush(t.in);
    if (!fgets(answer, sizeof answer, t.out))
      strcpy(answer, "no answer");
    answer[strcspn(answer, "\n")] = 0;
  }
  kill(t.pid, SIGKILL);
  int st;
  waitpid(t.pid, &st, 0);
  unlink(beat_path);
  bench_json_begin("bench-suspend");
  printf(",\"mode\":\"restore_without_memory\",\"gib\":%ld,\"hog_mib\":%d,"
         "\"gpu_used_full_mib\":%ld,\"rc_lock\":%d,\"rc_checkpoint\":%d,"
         "\"rc_restore_full\":%d,\"restore_full_ms\":%.1f,\"state_after_"
         "failed_restore\":%d,\"rc_restore_after_free\":%d,"
         "\"state_after_second_restore\":%d,\"rc_unlock\":%d,"
         "\"state_final\":%d,\"verify\":\"%s\",\"gpu_used_after_kill_mib\":"
         "%ld}\n",
         gib, nhog * 256, gpu_full, rc_lock, rc_ckpt, rc_restore1, restore1_ms,
         state1, rc_restore2, state2, rc_unlock, state3, answer,
         gpu_used_mib());
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--target") == 0)
    return target_main(atol(argv[2]), argv[3]);
  const char *sizes = "1";
  double hold_s = 1.0;
  pid_t pid = 0;
  bool oom = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc)
      sizes = argv[++i];
    else if (strcmp(argv[i], "--hold") == 0 && i + 1 < argc)
      hold_s = atof(argv[++i]);
    else if (strcmp(argv[i], "--pid") == 0 && i + 1 < argc)
      pid = (pid_t)atol(argv[++i]);
    else if (strcmp(argv[i], "--restore-without-memory") == 0)
      oom = true;
    else {
      fprintf(stderr, "usage: bench-suspend [--sizes GIB,...] [--hold S] "
                      "[--pid PID] [--restore-without-memory]\n");
      return 2;
    }
  }
  uint64_t t0 = bench_now_ns();
  bool api = load_cuda();
  cu_check(cu.init(0), "cuInit");
  double init_ms = ms_since(t0);
  load_nvml();
  if (!api) {
    bench_json_begin("bench-suspend");
    printf(",\"mode\":\"unsupported\",\"init_ms\":%.1f}\n", init_ms);
    return 0;
  }
  bench_json_begin("bench-suspend");
  printf(",\"mode\":\"init\",\"init_ms\":%.1f}\n", init_ms);
  fflush(stdout);
  if (pid)
    return pid_main(pid, hold_s);
  if (oom)
    return oom_restore_main(atol(sizes));
  return sizes_main(sizes, hold_s);
}
