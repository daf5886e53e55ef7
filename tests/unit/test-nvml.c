/*
 * test-nvml.c: src/nvml (through nvml.h) against the fake
 * libnvidia-ml.so.1 of tests/fakes/nvml.
 *
 * Every test body runs in a freshly executed copy of the runner (a helper):
 * the loader reads LD_LIBRARY_PATH only when a program starts, so only a
 * new program finds libnvidia-ml.so.1 the way the environment says, and
 * only a new process opens NVML afresh (nvml_open caches its outcome).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvml/nvml.h"
#include "task.h"

#define GIB (1ULL << 30)
#define MIB (1ULL << 20)

/* The test's temporary directory, in a helper (where th_tmpdir() is not
 * set: the runner sets it only in the test's own process). */
static const char *nvml_dir;

static const char *tpath(const char *name) {
  static char bufs[4][4096];
  static int next;
  char *b = bufs[next++ % 4];
  ASSERT(nvml_dir && nvml_dir[0] == '/');
  snprintf(b, sizeof bufs[0], "%s/%s", nvml_dir, name);
  return b;
}

static void nvml_run_helper(const char *name) {
  const char *args[] = {th_tmpdir(), NULL};
  pid_t pid = th_spawn_helper(name, args);
  int code = th_exit_code(th_wait(pid, th_ms(20000)));
  if (code == TH_SKIP)
    SKIP("%s: skipped by its helper", name);
  ASSERT_EQ(code, 0);
}

/* A test whose body runs in a helper of the same name. */
#define NVML_TEST(name)                                                        \
  static void nvml_body_##name(void);                                          \
  HELPER_IMPL(name) {                                                          \
    nvml_dir = argc > 0 ? argv[0] : NULL;                                      \
    nvml_body_##name();                                                        \
    return 0;                                                                  \
  }                                                                            \
  TEST_IMPL(name) {                                                            \
    nvml_run_helper(#name);                                                    \
  }                                                                            \
  static void nvml_body_##name(void)

/* Lines of the FAKE_NVML_CALLS file that start with `call`. */
static int calls(const char *call) {
  FILE *f = fopen(tpath("calls"), "r");
  char line[256];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    n += strncmp(line, call, strlen(call)) == 0;
  if (f)
    fclose(f);
  return n;
}

static void record_calls(void) {
  th_setenv("FAKE_NVML_CALLS", tpath("calls"));
}

static void set_procs(const char *text) {
  th_write_file(tpath("procs"), text);
  th_setenv("FAKE_NVML_PROCS", tpath("procs"));
}

static void check_gpu(const cogpu__gpu_desc_t *g, unsigned index,
                      const char *name, uint64_t total) {
  char uuid[64];
  snprintf(uuid, sizeof uuid, "GPU-fa4e0000-0000-4000-8000-%012x", index);
  ASSERT_EQ(g->index, index);
  ASSERT_STREQ(g->name, name);
  ASSERT_STREQ(g->uuid, uuid);
  ASSERT_UEQ(g->total, total);
}

/* --- Discovery ------------------------------------------------------------ */

NVML_TEST(nvml_discover_one) {
  cogpu__gpu_desc_t g[COGPU_NVML_MAX_GPUS];
  size_t n = 99;
  ASSERT_OK(cogpu__nvml_open());
  ASSERT_OK(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n));
  ASSERT_EQ(n, 1);
  check_gpu(&g[0], 0, "Fake GPU 16G", 16 * GIB);
}

NVML_TEST(nvml_discover_three) {
  cogpu__gpu_desc_t g[COGPU_NVML_MAX_GPUS];
  size_t n = 0;
  th_setenv("FAKE_NVML_GPUS", "80G,40G,512M");
  ASSERT_OK(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n));
  ASSERT_EQ(n, 3);
  check_gpu(&g[0], 0, "Fake GPU 80G", 80 * GIB);
  check_gpu(&g[1], 1, "Fake GPU 40G", 40 * GIB);
  check_gpu(&g[2], 2, "Fake GPU 512M", 512 * MIB);

  /* No more than max are described. */
  memset(g, 0xab, sizeof g);
  ASSERT_OK(cogpu__nvml_discover(g, 2, &n));
  ASSERT_EQ(n, 2);
  check_gpu(&g[1], 1, "Fake GPU 40G", 40 * GIB);
  ASSERT_EQ(g[2].index, 0xababababu);

  /* Each call asks NVML again. */
  th_setenv("FAKE_NVML_GPUS", "1T");
  ASSERT_OK(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n));
  ASSERT_EQ(n, 1);
  check_gpu(&g[0], 0, "Fake GPU 1T", 1024 * GIB);
}

static void *open_thread(void *arg) {
  (void)arg;
  return (void *)(intptr_t)cogpu__nvml_open();
}

NVML_TEST(nvml_open_once) {
  pthread_t t[8];
  record_calls();
  for (int i = 0; i < 8; i++)
    ASSERT_EQ(pthread_create(&t[i], NULL, open_thread, NULL), 0);
  for (int i = 0; i < 8; i++) {
    void *rc;
    ASSERT_EQ(pthread_join(t[i], &rc), 0);
    ASSERT_EQ((intptr_t)rc, 0);
  }
  ASSERT_OK(cogpu__nvml_open());
  ASSERT_EQ(calls("nvmlInit"), 1);
}

/* --- Processes ------------------------------------------------------------ */

NVML_TEST(nvml_processes_listed) {
  cogpu__gpu_proc_t p[16];
  size_t n = 0;
  th_setenv("FAKE_NVML_GPUS", "16G,16G");
  record_calls();
  set_procs("# GPU PID BYTES [KIND]\n"
            "0 300 2G both\n"
            "0 100 1G\n"
            "\n"
            "  # pid 100 also draws, and NVML counts more there\n"
            "0 100 1536M graphics\n"
            "1 400 3G\n"
            "0 200 512M graphics\n"
            "0 500 NA\n");
  ASSERT_OK(cogpu__nvml_processes(0, p, 16, &n));
  ASSERT_EQ(n, 4);
  ASSERT_EQ(p[0].pid, 100);
  ASSERT_UEQ(p[0].used, 1536 * MIB);
  ASSERT_EQ(p[1].pid, 200);
  ASSERT_UEQ(p[1].used, 512 * MIB);
  ASSERT_EQ(p[2].pid, 300); /* listed by both queries, counted once */
  ASSERT_UEQ(p[2].used, 2 * GIB);
  ASSERT_EQ(p[3].pid, 500); /* NVML_VALUE_NOT_AVAILABLE reads as 0 */
  ASSERT_UEQ(p[3].used, 0);
  /* One compute and one graphics query: no retry for short lists. */
  ASSERT_EQ(calls("nvmlDeviceGetComputeRunningProcesses"), 1);
  ASSERT_EQ(calls("nvmlDeviceGetGraphicsRunningProcesses"), 1);

  ASSERT_OK(cogpu__nvml_processes(1, p, 16, &n));
  ASSERT_EQ(n, 1);
  ASSERT_EQ(p[0].pid, 400);
  ASSERT_UEQ(p[0].used, 3 * GIB);

  /* Every call reads NVML afresh. */
  set_procs("0 600 1M\n");
  ASSERT_OK(cogpu__nvml_processes(0, p, 16, &n));
  ASSERT_EQ(n, 1);
  ASSERT_EQ(p[0].pid, 600);
  ASSERT_OK(cogpu__nvml_processes(1, p, 16, &n));
  ASSERT_EQ(n, 0);
  unlink(tpath("procs"));
  ASSERT_OK(cogpu__nvml_processes(0, p, 16, &n));
  ASSERT_EQ(n, 0);
}

/* pids 1000.. holding 1 MiB, 2 MiB, ...; listed in reverse order. */
static void set_many_procs(int count) {
  size_t cap = (size_t)count * 32 + 1, len = 0;
  char *text = malloc(cap);
  ASSERT(text);
  text[0] = 0;
  for (int i = count - 1; i >= 0; i--)
    len +=
        (size_t)snprintf(text + len, cap - len, "0 %d %dM\n", 1000 + i, i + 1);
  set_procs(text);
  free(text);
}

NVML_TEST(nvml_processes_many) {
  static cogpu__gpu_proc_t p[512];
  size_t n = 0;
  record_calls();
  set_many_procs(300);
  ASSERT_OK(cogpu__nvml_processes(0, p, 512, &n));
  ASSERT_EQ(n, 300);
  for (int i = 0; i < 300; i++) {
    ASSERT_EQ(p[i].pid, 1000 + i);
    ASSERT_UEQ(p[i].used, (uint64_t)(i + 1) * MIB);
  }
  /* The first offer was too small: NVML said how many, and was asked
   * again. */
  ASSERT_EQ(calls("nvmlDeviceGetComputeRunningProcesses"), 2);

  /* A short array gets the first entries, by pid. */
  ASSERT_OK(cogpu__nvml_processes(0, p, 10, &n));
  ASSERT_EQ(n, 10);
  ASSERT_EQ(p[9].pid, 1009);
}

NVML_TEST(nvml_processes_too_many) {
  static cogpu__gpu_proc_t p[16];
  size_t n = 99;
  set_many_procs(5000);
  ASSERT_EQ(cogpu__nvml_processes(0, p, 16, &n), COGPU_ENVML);
  ASSERT_EQ(n, 0);
  ASSERT_CONTAINS(cogpu_last_error(), "4096");
}

NVML_TEST(nvml_processes_failure) {
  cogpu__gpu_proc_t p[16];
  cogpu__gpu_desc_t g[COGPU_NVML_MAX_GPUS];
  size_t n = 99;
  set_procs("0 100 1G\n");
  th_setenv("FAKE_NVML_FAIL", "procs");
  ASSERT_EQ(cogpu__nvml_processes(0, p, 16, &n), COGPU_ENVML);
  ASSERT_EQ(n, 0);
  ASSERT_CONTAINS(cogpu_last_error(), "nvmlDeviceGetComputeRunningProcesses");
  ASSERT_CONTAINS(cogpu_last_error(), "Unknown Error");
  /* Discovery does not need the process queries. */
  ASSERT_OK(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n));
  ASSERT_EQ(n, 1);
  /* Nor is the failure remembered. */
  th_setenv("FAKE_NVML_FAIL", NULL);
  ASSERT_OK(cogpu__nvml_processes(0, p, 16, &n));
  ASSERT_EQ(n, 1);
}

NVML_TEST(nvml_processes_bad_index) {
  cogpu__gpu_proc_t p[16];
  size_t n = 99;
  ASSERT_EQ(cogpu__nvml_processes(7, p, 16, &n), COGPU_ENVML);
  ASSERT_EQ(n, 0);
  ASSERT_CONTAINS(cogpu_last_error(), "GPU 7");
}

/* --- Failures ------------------------------------------------------------- */

NVML_TEST(nvml_init_failure) {
  cogpu__gpu_desc_t g[COGPU_NVML_MAX_GPUS];
  size_t n = 99;
  record_calls();
  th_setenv("FAKE_NVML_FAIL", "init");
  ASSERT_EQ(cogpu__nvml_open(), COGPU_ENVML);
  ASSERT_CONTAINS(cogpu_last_error(), "nvmlInit");
  ASSERT_CONTAINS(cogpu_last_error(), "Driver Not Loaded");
  ASSERT_EQ(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n), COGPU_ENVML);
  ASSERT_EQ(n, 0);
  ASSERT_CONTAINS(cogpu_last_error(), "nvmlInit");
  /* The outcome is settled once per process. */
  th_setenv("FAKE_NVML_FAIL", NULL);
  ASSERT_EQ(cogpu__nvml_open(), COGPU_ENVML);
  ASSERT_EQ(calls("nvmlInit"), 1);
}

NVML_TEST(nvml_count_failure) {
  cogpu__gpu_desc_t g[COGPU_NVML_MAX_GPUS];
  size_t n = 99;
  th_setenv("FAKE_NVML_FAIL", "count");
  ASSERT_OK(cogpu__nvml_open());
  ASSERT_EQ(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n), COGPU_ENVML);
  ASSERT_EQ(n, 0);
  ASSERT_CONTAINS(cogpu_last_error(), "nvmlDeviceGetCount");
}

NVML_TEST(nvml_zero_devices) {
  cogpu__gpu_desc_t g[COGPU_NVML_MAX_GPUS];
  size_t n = 99;
  th_setenv("FAKE_NVML_FAIL", "zero");
  ASSERT_EQ(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n), COGPU_ENOGPU);
  ASSERT_EQ(n, 0);
  th_setenv("FAKE_NVML_FAIL", NULL);
  th_setenv("FAKE_NVML_GPUS", "");
  ASSERT_EQ(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n), COGPU_ENOGPU);
}

/* Runs with LD_LIBRARY_PATH naming an empty directory. */
HELPER_IMPL(nvml_missing_library) {
  cogpu__gpu_desc_t g[COGPU_NVML_MAX_GPUS];
  size_t n = 99;
  (void)argc;
  (void)argv;
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    dlclose(lib);
    SKIP("this system has a libnvidia-ml.so.1 on the loader path");
  }
  ASSERT_EQ(cogpu__nvml_open(), COGPU_ENVML);
  ASSERT_CONTAINS(cogpu_last_error(), "libnvidia-ml.so.1");
  ASSERT_EQ(cogpu__nvml_discover(g, COGPU_NVML_MAX_GPUS, &n), COGPU_ENVML);
  ASSERT_EQ(n, 0);
  ASSERT_CONTAINS(cogpu_last_error(), "libnvidia-ml.so.1");
  return 0;
}

TEST_IMPL(nvml_missing_library) {
  ASSERT_EQ(mkdir(th_path("empty"), 0700), 0);
  setenv("LD_LIBRARY_PATH", th_path("empty"), 1);
  nvml_run_helper("nvml_missing_library");
}

/* --- The fake's calling conventions --------------------------------------- */

typedef int (*fake_procs_fn)(void *dev, unsigned *count, void *infos);

NVML_TEST(nvml_fake_conventions) {
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/fakes/libnvidia-ml.so.1",
           th_build_dir());
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ASSERT(lib);
  int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
  int (*handle)(unsigned, void **) =
      (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  fake_procs_fn procs =
      (fake_procs_fn)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
  ASSERT(init && handle && procs);
  void *dev = NULL;
  unsigned count = 0;
  ASSERT_EQ(handle(0, &dev), 1); /* NVML_ERROR_UNINITIALIZED */
  ASSERT_EQ(init(), 0);
  ASSERT_EQ(handle(0, &dev), 0);
  set_procs("0 10 1M\n0 11 2M\n0 12 3M\n");
  ASSERT_EQ(procs(dev, &count, NULL), 7); /* INSUFFICIENT_SIZE, needs 3 */
  ASSERT_EQ(count, 3);
  struct {
    unsigned pid;
    unsigned long long used;
    unsigned gi, ci;
  } e[4];
  count = 2;
  ASSERT_EQ(procs(dev, &count, e), 7);
  ASSERT_EQ(count, 3);
  count = 4;
  ASSERT_EQ(procs(dev, &count, e), 0);
  ASSERT_EQ(count, 3);
  ASSERT_EQ(e[2].pid, 12);
  ASSERT_UEQ(e[2].used, 3 * MIB);
  unlink(tpath("procs"));
  count = 0;
  ASSERT_EQ(procs(dev, &count, NULL), 0);
  ASSERT_EQ(count, 0);
}
