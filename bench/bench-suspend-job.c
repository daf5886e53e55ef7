/*
 * bench-suspend-job.c: suspend and resume of a job as a user does them,
 * end to end through cogpu's public interface, against the time the driver
 * itself needs (issue 12).
 *
 * For each footprint in BENCH_SUSPEND_GIB it starts a job under
 * `cogpu run` (tests/cudaprog holding N GiB, then verifying its data and
 * freeing it), and times BENCH_SUSPEND_REPS cycles of `cogpu suspend PID`
 * and `cogpu resume PID`, each from the fork of the command to its exit:
 * the CLI's start, the request to cogpud, the daemon's bookkeeping, its
 * suspender thread's driver calls, and the answer. After the cycles the
 * job must exit 0 with its data intact ("verify ok": same bytes at the
 * same addresses).
 *
 * The baseline, in the same run: what the driver alone takes. On the fake
 * driver that is the modelled copy, bytes / FAKE_CUDA_CKPT_GBPS, where
 * bytes is what left the device (NVML's used memory before and after the
 * suspension: allocations and context) and the bandwidth is the one the
 * caller, the daemon, runs with (read from its environment, else this
 * process's). "added_median_ns" is then cogpu's own cost. On a real GPU
 * there is no model (null): compare with bench-suspend, which calls the
 * driver directly. The daemon's own figure, as `cogpu suspend` prints it
 * (10 ms resolution), splits the rest between the daemon and the CLI; a
 * plain `cogpu status` gives the CLI's fixed cost (start, configuration,
 * one round trip).
 *
 * Needs node mode: a cogpud that can checkpoint the job (bench/run.sh
 * starts a private one on the fake driver). Knobs: BENCH_COGPU (the cogpu
 * binary, default "cogpu" on PATH), BENCH_CUDAPROG (tests/cudaprog,
 * required), BENCH_SUSPEND_GIB ("1,4,10"), BENCH_SUSPEND_REPS (5),
 * BENCH_SUSPEND_HOLD_MS (how long each job holds its memory; default
 * enough for the cycles at the modelled bandwidth, or at 2 GB/s without
 * one, plus slack), BENCH_DAEMON_PID (the daemon, for its bandwidth).
 * Output: JSON lines (bench.h): "suspend_job" and "resume_job" per
 * footprint, "cli_status" once.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include "bench.h"

#define GIB (1ull << 30)

extern char **environ;

static const char *cogpu_bin;
static cogpu_t *h;

/* --- NVML: the device's used memory (what the driver moved) ------------- */

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

/* Bytes used on GPU 0, or -1 without NVML. */
static long long gpu_used(void) {
  nvml_mem_t m;
  if (!nvml_mem || nvml_mem(nvml_dev, &m) != 0)
    return -1;
  return (long long)m.used;
}

/* --- the modelled bandwidth ------------------------------------------------
 */

/* FAKE_CUDA_CKPT_GBPS as the daemon sees it: the fake driver reads it in
 * the caller of the checkpoint API, so a value in this process alone
 * would model a copy that never happens. Falls back to this process's. */
static double model_gbps(void) {
  const char *pid = getenv("BENCH_DAEMON_PID");
  if (pid && *pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/environ", pid);
    FILE *f = fopen(path, "r");
    if (f) {
      static char buf[1 << 16];
      size_t n = fread(buf, 1, sizeof buf - 1, f);
      fclose(f);
      buf[n] = 0;
      for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        if (strncmp(buf + i, "FAKE_CUDA_CKPT_GBPS=", 20) == 0)
          return strtod(buf + i + 20, NULL);
      return 0; /* the daemon copies instantly */
    }
  }
  const char *s = getenv("FAKE_CUDA_CKPT_GBPS");
  return s ? strtod(s, NULL) : 0;
}

/* --- commands ------------------------------------------------------------- */

/* Runs argv with stdout and stderr into out (NUL-terminated); returns the
 * exit code (128+signal if killed), and its wall time in *ns, from the
 * spawn to the reaped exit. */
static int run_cmd(const char *const argv[], char *out, size_t len,
                   uint64_t *ns) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    bench_die("pipe2", -errno);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_adddup2(&fa, p[1], 2);
  uint64_t t0 = bench_now_ns();
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(p[1]);
  if (rc != 0) {
    close(p[0]);
    bench_die(argv[0], -rc);
  }
  size_t n = 0;
  for (;;) {
    ssize_t r = read(p[0], out + n, len - 1 - n);
    if (r > 0 && n + (size_t)r < len - 1) {
      n += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR)
      continue;
    if (r > 0) { /* full: keep draining so the child never blocks */
      char sink[4096];
      n += (size_t)r;
      while (read(p[0], sink, sizeof sink) > 0)
        ;
    }
    break;
  }
  out[n] = 0;
  close(p[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  *ns = bench_now_ns() - t0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* --- the job -------------------------------------------------------------- */

typedef struct {
  pid_t pid;
  char log[256];
} job_t;

static void job_start(job_t *j, const char *cudaprog, long gib, long hold_ms) {
  snprintf(j->log, sizeof j->log, "%s/bench-suspend-job.XXXXXX",
           getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  int fd = mkstemp(j->log);
  if (fd < 0)
    bench_die("mkstemp", -errno);
  char alloc[32], hold[32];
  snprintf(alloc, sizeof alloc, "alloc:%ldG", gib);
  snprintf(hold, sizeof hold, "hold:%ld", hold_ms);
  const char *argv[] = {cogpu_bin, "run", "--", cudaprog, "direct",  "init",
                        "ctx",     alloc, hold, "verify", "freeall", NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, 1);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  int rc =
      posix_spawnp(&j->pid, argv[0], &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fd);
  if (rc != 0)
    bench_die("spawning the job", -rc);
}

static bool job_log_has(const job_t *j, const char *what) {
  static char buf[65536];
  int fd = open(j->log, O_RDONLY);
  ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : 0;
  if (fd >= 0)
    close(fd);
  buf[n > 0 ? n : 0] = 0;
  return strstr(buf, what) != NULL;
}

__attribute__((format(printf, 2, 3))) static void
job_fail(job_t *j, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "bench-suspend-job: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n--- the job's output (%s):\n", j->log);
  FILE *f = fopen(j->log, "r");
  char line[512];
  while (f && fgets(line, sizeof line, f))
    fputs(line, stderr);
  if (f)
    fclose(f);
  if (j->pid > 0) { /* never kill(-1): the job may be gone already */
    kill(j->pid, SIGKILL);
    waitpid(j->pid, NULL, 0);
  }
  exit(1);
}

/* The job's client on GPU 0 in a fresh status: its state and bytes. */
static bool job_status(pid_t pid, int *state, uint64_t *reserved,
                       uint64_t *suspended) {
  cogpu_status_t *st;
  int rc = cogpu_status(h, &st);
  if (rc)
    bench_die("cogpu_status", rc);
  bool found = false;
  for (size_t g = 0; g < st->ngpus && !found; g++)
    for (size_t i = 0; i < st->gpus[g].nclients; i++) {
      const cogpu_client_info_t *c = &st->gpus[g].clients[i];
      if (c->pid == (int)pid) {
        *state = c->state;
        *reserved = c->reserved_bytes;
        *suspended = c->suspended_bytes;
        found = true;
        break;
      }
    }
  cogpu_status_free(st);
  return found;
}

/* Waits (bounded) until the job holds its memory: it has printed its
 * "alloc" line, which comes after the driver's allocation. */
static void job_wait_ready(job_t *j) {
  for (int t = 0; !job_log_has(j, "alloc "); t += 10) {
    if (waitpid(j->pid, NULL, WNOHANG) == j->pid) {
      j->pid = -1;
      job_fail(j, "the job ended before holding its memory");
    }
    if (t > 30000)
      job_fail(j, "the job did not allocate in 30 s");
    usleep(10000);
  }
}

static void job_finish(job_t *j, long hold_ms) {
  int st = 0;
  for (long t = 0;; t += 20) {
    pid_t r = waitpid(j->pid, &st, WNOHANG);
    if (r == j->pid)
      break;
    if (t > hold_ms + 60000)
      job_fail(j, "the job did not end");
    usleep(20000);
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !job_log_has(j, "verify ok")) {
    j->pid = -1; /* reaped */
    job_fail(j, "the job ended badly (wait status %d)", st);
  }
  unlink(j->log);
}

/* --- one footprint -------------------------------------------------------- */

/* The daemon's figure in `cogpu suspend`'s line ("... in 0.52 s"), ms. */
static double daemon_ms(const char *out) {
  const char *p = strstr(out, " in ");
  double s;
  return p && sscanf(p, " in %lf s", &s) == 1 ? s * 1000 : -1;
}

static void emit(const char *bench, uint64_t *v, size_t n, long gib,
                 uint64_t footprint, long long moved, double gbps,
                 double dms_median) {
  bench_stats_t st = bench_stats(v, n);
  char model[160] = "\"model_ns\":null,\"added_median_ns\":null,"
                    "\"added_p99_ns\":null";
  if (gbps > 0 && moved > 0) {
    /* bytes / (GB/s) = ns, as the fake driver computes it. */
    double m = (double)moved / gbps;
    snprintf(model, sizeof model,
             "\"model_ns\":%.0f,\"added_median_ns\":%.0f,"
             "\"added_p99_ns\":%.0f",
             m, (double)st.median - m, (double)st.p99 - m);
  }
  char dms[32] = "null"; /* `cogpu resume` prints no such figure */
  if (dms_median >= 0)
    snprintf(dms, sizeof dms, "%.0f", dms_median);
  bench_emit(bench, 1, &st,
             "\"mode\":\"node\",\"gib\":%ld,\"footprint_bytes\":%" PRIu64
             ",\"moved_bytes\":%lld,\"gbps\":%g,%s,\"daemon_median_ms\":%s,"
             "\"verify\":\"ok\"",
             gib, footprint, moved, gbps, model, dms);
}

static double median_of(double *v, size_t n) {
  for (size_t i = 1; i < n; i++) /* insertion sort: n is small */
    for (size_t k = i; k > 0 && v[k - 1] > v[k]; k--) {
      double t = v[k];
      v[k] = v[k - 1];
      v[k - 1] = t;
    }
  return n ? v[n / 2] : -1;
}

static void one_size(const char *cudaprog, long gib, long reps, double gbps) {
  /* The job must still hold its memory when the last cycle ends: the
   * cycles at the modelled bandwidth (2 GB/s when unknown), a second each
   * for cogpu, and slack for a busy machine. Waiting out the rest is the
   * price of driving an unmodified program. */
  double bw = gbps > 0 ? gbps : 2;
  long hold_ms =
      (long)((double)reps *
             (2.0 * (double)gib * (double)GIB / (bw * 1e6) + 1000.0)) +
      3000;
  hold_ms = bench_env_exact("BENCH_SUSPEND_HOLD_MS", hold_ms);
  job_t j;
  job_start(&j, cudaprog, gib, hold_ms);
  job_wait_ready(&j);
  char pid[16], out[4096];
  snprintf(pid, sizeof pid, "%d", (int)j.pid);
  const char *susp[] = {cogpu_bin, "suspend", pid, NULL};
  const char *res[] = {cogpu_bin, "resume", pid, NULL};
  uint64_t *ts = calloc((size_t)reps, sizeof *ts);
  uint64_t *tr = calloc((size_t)reps, sizeof *tr);
  double *dms = calloc((size_t)reps, sizeof *dms);
  long long moved = -1;
  uint64_t footprint = 0;
  for (long r = 0; r < reps; r++) {
    int state;
    uint64_t reserved, suspended;
    long long before = gpu_used();
    if (run_cmd(susp, out, sizeof out, &ts[r]) != 0 ||
        !strstr(out, "suspended "))
      job_fail(&j, "cogpu suspend failed: %s", out);
    dms[r] = daemon_ms(out);
    long long after = gpu_used();
    if (before >= 0 && after >= 0 && (moved < 0 || before - after < moved))
      moved = before - after; /* the smallest: nothing else moved */
    if (!job_status(j.pid, &state, &reserved, &suspended) ||
        state != COGPU_JOB_SUSPENDED || reserved != 0)
      job_fail(&j, "the job is not suspended after `cogpu suspend`");
    footprint = suspended;
    if (run_cmd(res, out, sizeof out, &tr[r]) != 0 || !strstr(out, "resumed "))
      job_fail(&j, "cogpu resume failed: %s", out);
    if (!job_status(j.pid, &state, &reserved, &suspended) ||
        state != COGPU_JOB_RUNNING || reserved != footprint)
      job_fail(&j, "the job is not running after `cogpu resume`");
  }
  job_finish(&j, hold_ms);
  emit("suspend_job", ts, (size_t)reps, gib, footprint, moved, gbps,
       median_of(dms, (size_t)reps));
  emit("resume_job", tr, (size_t)reps, gib, footprint, moved, gbps, -1);
  free(ts);
  free(tr);
  free(dms);
}

int main(void) {
  const char *cudaprog = getenv("BENCH_CUDAPROG");
  if (!cudaprog || !*cudaprog) {
    fprintf(stderr, "bench-suspend-job: BENCH_CUDAPROG must name "
                    "tests/cudaprog (bench/run.sh sets it)\n");
    return 2;
  }
  cogpu_bin = getenv("BENCH_COGPU");
  if (!cogpu_bin || !*cogpu_bin)
    cogpu_bin = "cogpu";
  const char *sizes = getenv("BENCH_SUSPEND_GIB");
  if (!sizes || !*sizes)
    sizes = "1,4,10";
  long reps = bench_env_long("BENCH_SUSPEND_REPS", 5);
  int rc = cogpu_attach(NULL, &h);
  if (rc)
    bench_die("cogpu_attach", rc);
  /* Suspension exists only in node mode; a daemonless result would be a
   * list of refusals. */
  if (strcmp(bench_ledger_mode(), "node") != 0) {
    fprintf(stderr, "bench-suspend-job: needs node mode (a cogpud and "
                    "COGPU_NODE_MODE=daemon)\n");
    return 2;
  }
  bench_check_mode(h);
  load_nvml();
  double gbps = model_gbps();

  /* The CLI's fixed cost: start, configuration, one round trip. */
  uint64_t floor[21];
  char out[16384];
  const char *status[] = {cogpu_bin, "status", NULL};
  for (int i = 0; i < 21; i++)
    if (run_cmd(status, out, sizeof out, &floor[i]) != 0)
      bench_die("cogpu status", -EIO);
  bench_stats_t fst = bench_stats(floor, 21);
  bench_emit("cli_status", 1, &fst, "\"mode\":\"node\"");

  char *list = strdup(sizes), *save = NULL;
  for (char *s = strtok_r(list, ",", &save); s;
       s = strtok_r(NULL, ",", &save)) {
    char *end;
    long gib = strtol(s, &end, 10);
    if (*end || gib <= 0) {
      fprintf(stderr,
              "bench-suspend-job: BENCH_SUSPEND_GIB: '%s' is not a "
              "number of GiB\n",
              s);
      return 2;
    }
    one_size(cudaprog, gib, reps, gbps);
  }
  free(list);
  cogpu_detach(h);
  return 0;
}
