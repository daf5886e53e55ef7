/*
 * cmd-doctor.c: `cogpu doctor`, which checks what cogpu needs on a node and
 * says how to fix what is wrong: the configuration, NVML, the CUDA driver
 * (and whether the preload library will recognise the entry points that
 * cuGetProcAddress hands out) and the node state.
 */
#include <dlfcn.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cuda/cuda-abi.h"
#include "ledger/admin.h"
#include "node/node.h"
#include "nvml/nvml.h"

typedef struct doctor_s {
  int problems;
} doctor_t;

static void doc_ok(const char *what, const char *detail) {
  printf("ok       %s: %s\n", what, detail);
}

static void doc_bad(doctor_t *d, const char *what, const char *detail,
                    const char *fix) {
  d->problems++;
  printf("PROBLEM  %s: %s\n         fix: %s\n", what, detail, fix);
}

/* The config file that applies. cogpu__config_load accepts a missing
 * default file (/etc/cogpu.conf), so loading alone does not say one was
 * read: a node whose settings an admin believes are in effect would then be
 * told "ok" for a file that is not there. */
static void doctor_config(const cogpu__config_t *cfg) {
  const cogpu__optval_t *c = &cfg->v[COGPU_OPT_CONFIG];
  char line[600];
  if (!c->s[0]) {
    doc_ok("config", "none (COGPU_CONFIG is empty: defaults and COGPU_* "
                     "variables apply)");
    return;
  }
  if (access(c->s, F_OK) != 0) {
    snprintf(line, sizeof line,
             "none (%s does not exist: defaults and COGPU_* variables "
             "apply)",
             c->s);
    doc_ok("config", line);
    return;
  }
  doc_ok("config", c->s);
}

static bool doctor_nvml(doctor_t *d, cogpu__gpu_desc_t *gpus, size_t *n) {
  int rc = cogpu__nvml_open();
  if (rc == 0)
    rc = cogpu__nvml_discover(gpus, COGPU_NVML_MAX_GPUS, n);
  if (rc) {
    doc_bad(d, "NVML", cogpu_last_error(),
            "install the NVIDIA driver, or make libnvidia-ml.so.1 findable "
            "(ldconfig or LD_LIBRARY_PATH)");
    return false;
  }
  char buf[256], sz[32];
  for (size_t i = 0; i < *n; i++) {
    snprintf(buf, sizeof buf, "GPU %u %s, %s, %s", gpus[i].index, gpus[i].name,
             cogpu__fmt_size(gpus[i].total, sz, sizeof sz), gpus[i].uuid);
    doc_ok("NVML", buf);
  }
  return true;
}

static void doctor_state(doctor_t *d, const cogpu__config_t *cfg,
                         const cogpu__gpu_desc_t *gpus, size_t n, bool nvml) {
  char why[512], line[2048];
  bool exists;
  int live = 0;
  if (cogpu__ledger_live(cfg, &exists, &live) != 0) {
    doc_bad(d, "state", cogpu_last_error(),
            "check the permissions of the state directory (state_dir)");
    return;
  }
  if (!exists) {
    /* A check only looks: the first cogpu user creates the state. */
    doc_ok("state", "not created yet; the first cogpu user creates it");
    return;
  }
  if (cogpu__ledger_check(cfg, why, sizeof why)) {
    doc_bad(d, "state", why,
            live ? "stop the processes using it, then `cogpu reset`"
                 : "`cogpu reset` (or any cogpu user replaces it)");
    return;
  }
  cogpu_status_t *st;
  int rc = cogpu_status(NULL, &st);
  if (rc) {
    doc_bad(d, "state", cogpu_last_error(),
            "see the message; `cogpu reset --force` starts afresh");
    return;
  }
  snprintf(line, sizeof line,
           "%s, policy %s, %zu GPU(s), %d process(es) "
           "attached",
           st->state_path, st->policy, st->ngpus, live);
  doc_ok("state", line);
  bool same = !nvml || n == st->ngpus;
  for (size_t i = 0; same && nvml && i < n; i++)
    same = strcmp(gpus[i].uuid, st->gpus[i].uuid) == 0 &&
           gpus[i].total == st->gpus[i].total_bytes;
  if (!same)
    doc_bad(d, "state", "the GPUs in the state differ from NVML's",
            "`cogpu reset` when no job runs, so the state is rebuilt");
  const char *pol = cfg->v[COGPU_OPT_POLICY].s;
  if (strcmp(pol, st->policy) != 0) {
    snprintf(line, sizeof line,
             "configured policy %s (%s) but the state "
             "uses %s",
             pol, cfg->v[COGPU_OPT_POLICY].where, st->policy);
    doc_bad(d, "policy", line, "`cogpu reset` when no job runs");
  }
  cogpu_status_free(st);
}

/* Node mode: the daemon answers, and its GPUs are NVML's. */
static void doctor_daemon(doctor_t *d, const cogpu__config_t *cfg,
                          const cogpu__gpu_desc_t *gpus, size_t n, bool nvml) {
  char line[2048];
  const char *sock = cfg->v[COGPU_OPT_SOCKET].s;
  snprintf(line, sizeof line,
           "node (the node daemon cogpud keeps the ledger; socket %s)", sock);
  doc_ok("mode", line);
  struct stat sb;
  if (stat(sock, &sb) != 0 && cogpu__node_daemon_alive(cfg)) {
    /* Said at once: asking for status would wait daemon_wait for
     * nothing. */
    snprintf(line, sizeof line,
             "cogpud runs (its lock is held) but its socket %s is gone: "
             "clients wait for it, then fail",
             sock);
    doc_bad(d, "daemon", line,
            "restart it: `systemctl restart cogpud.socket cogpud.service` "
            "(or stop the cogpud that runs and start it again)");
    return;
  }
  cogpu_status_t *st;
  if (cogpu_status(NULL, &st) != 0) {
    doc_bad(d, "daemon", cogpu_last_error(),
            "start it: `systemctl start cogpud.socket` (or `cogpud` in the "
            "foreground); `journalctl -u cogpud` says why it stopped");
    return;
  }
  int clients = 0;
  for (size_t g = 0; g < st->ngpus; g++)
    clients += (int)st->gpus[g].nclients;
  snprintf(line, sizeof line,
           "cogpud answers at %s, policy %s, %zu GPU(s), %d job(s) holding "
           "memory",
           sock, st->policy, st->ngpus, clients);
  doc_ok("daemon", line);
  /* Not a problem: suspension is a last resort, and a node without it
   * still never over-commits (the deadlock guard fails a request). */
  snprintf(line, sizeof line, "%s", st->suspension);
  doc_ok("suspension", line);
  bool same = !nvml || n == st->ngpus;
  for (size_t i = 0; same && nvml && i < n; i++)
    same = strcmp(gpus[i].uuid, st->gpus[i].uuid) == 0 &&
           gpus[i].total == st->gpus[i].total_bytes;
  if (!same)
    doc_bad(d, "daemon", "the daemon's GPUs differ from NVML's",
            "an admin runs `cogpu reset` when no job runs");
  const cogpu__optval_t *pol = &cfg->v[COGPU_OPT_POLICY];
  if (pol->source == COGPU_SRC_ENV) {
    snprintf(line, sizeof line,
             "policy %s from %s is not used: node settings come from "
             "cogpud's configuration only",
             pol->s, pol->where);
    doc_ok("note", line);
  }
  cogpu_status_free(st);
}

/* --- The CUDA driver ------------------------------------------------------ */

/* The entry points the preload library replaces. */
static const char *const hooked[] = {
#define HOOK(n) #n,
#define NEED(n)
#include "preload/hooks.def"
#undef HOOK
#undef NEED
};
#define NHOOKED (sizeof hooked / sizeof hooked[0])

typedef CUresult gpa2_ft(const char *, void **, int, cuuint64_t,
                         CUdriverProcAddressQueryResult *);
typedef CUresult gpa1_ft(const char *, void **, int, cuuint64_t);

typedef struct probe_s {
  void *lib;
  gpa2_ft *gpa2;
  gpa1_ft *gpa1;
} probe_t;

/* The name a program asks cuGetProcAddress for: "cuMemAlloc_v2" and
 * "cuGraphLaunch_ptsz" are "cuMemAlloc" and "cuGraphLaunch". */
static void base_of(const char *variant, char *base, size_t len) {
  snprintf(base, len, "%s", variant);
  size_t n = strlen(base);
  if (n > 5 &&
      (!strcmp(base + n - 5, "_ptsz") || !strcmp(base + n - 5, "_ptds")))
    base[n -= 5] = 0;
  char *v = strrchr(base, '_');
  if (v && v[1] == 'v' && v[2] && strspn(v + 2, "0123456789") == strlen(v + 2))
    *v = 0;
}

/* What cuGetProcAddress gives for base at `version`, or NULL. */
static void *probe_get(const probe_t *p, const char *base, int version,
                       bool per_thread) {
  cuuint64_t flags =
      per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
  void *fn = NULL;
  CUresult rc = p->gpa2 ? p->gpa2(base, &fn, version, flags, NULL)
                        : p->gpa1(base, &fn, version, flags);
  return rc == CUDA_SUCCESS ? fn : NULL;
}

/* Is fn the driver's exported function for one of base's hooked variants
 * (the only addresses the preload library recognises)? */
static bool probe_known(const probe_t *p, const char *base, void *fn) {
  char b[64];
  for (size_t i = 0; i < NHOOKED; i++) {
    base_of(hooked[i], b, sizeof b);
    if (!strcmp(b, base) && dlsym(p->lib, hooked[i]) == fn)
      return true;
  }
  return false;
}

/* Asks for every hooked entry point as a runtime of this driver's version
 * and as an 11.4 one would, with both stream flavours; appends the names
 * whose answer is not recognised to `bad`. Returns how many were asked. */
static int probe_all(const probe_t *p, int version, char *bad, size_t len) {
  int asked = 0;
  const int versions[] = {version, 11040};
  char base[64], last[64] = "";
  for (size_t i = 0; i < NHOOKED; i++) {
    base_of(hooked[i], base, sizeof base);
    if (!strcmp(base, last))
      continue; /* variants of one name are listed together */
    snprintf(last, sizeof last, "%s", base);
    bool known = true;
    for (int k = 0; k < 4; k++) {
      void *fn = probe_get(p, base, versions[k / 2], k % 2);
      asked += fn != NULL;
      known = known && (!fn || probe_known(p, base, fn));
    }
    if (!known && strlen(bad) + strlen(base) + 3 < len)
      snprintf(bad + strlen(bad), len - strlen(bad), "%s%s", bad[0] ? ", " : "",
               base);
  }
  return asked;
}

static void doctor_entries(doctor_t *d, const probe_t *p, int version) {
  if (!p->gpa2 && !p->gpa1) {
    doc_ok("CUDA entry points", "no cuGetProcAddress: programs call the "
                                "exported functions, which cogpu replaces");
    return;
  }
  char bad[1024] = "", line[1200];
  int asked = probe_all(p, version, bad, sizeof bad);
  if (!bad[0]) {
    snprintf(line, sizeof line,
             "cuGetProcAddress gives the driver's exported functions (%d "
             "lookups): cogpu recognises all of them",
             asked);
    doc_ok("CUDA entry points", line);
    return;
  }
  snprintf(line, sizeof line,
           "cuGetProcAddress gives functions cogpu does not recognise "
           "for: %s",
           bad);
  doc_bad(d, "CUDA entry points", line,
          "none on this node: memory taken through them is not accounted "
          "(COGPU_LOG=info shows it in each program); report this driver "
          "version");
}

static void doctor_cuda(doctor_t *d) {
  probe_t p = {.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)};
  if (!p.lib) {
    doc_bad(d, "CUDA driver", dlerror(),
            "install the NVIDIA driver, or make libcuda.so.1 findable "
            "(ldconfig or LD_LIBRARY_PATH)");
    return;
  }
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(p.lib, "cuInit");
  CUresult (*get_version)(int *) =
      (CUresult(*)(int *))dlsym(p.lib, "cuDriverGetVersion");
  int version = 0;
  CUresult rc = init ? init(0) : CUDA_ERROR_NOT_FOUND;
  if (rc == CUDA_SUCCESS && get_version)
    rc = get_version(&version);
  char line[256];
  if (rc != CUDA_SUCCESS) {
    snprintf(line, sizeof line, "cuInit failed with CUDA error %d", rc);
    doc_bad(d, "CUDA driver", line,
            "check the driver with nvidia-smi, and the permissions of "
            "/dev/nvidia*");
    return;
  }
  snprintf(line, sizeof line, "libcuda.so.1, CUDA %d.%d", version / 1000,
           version % 1000 / 10);
  doc_ok("CUDA driver", line);
  p.gpa2 = (gpa2_ft *)dlsym(p.lib, "cuGetProcAddress_v2");
  p.gpa1 = p.gpa2 ? NULL : (gpa1_ft *)dlsym(p.lib, "cuGetProcAddress");
  doctor_entries(d, &p, version);
}

int cli_doctor(int argc, char **argv) {
  (void)argv;
  if (argc > 1) {
    cli_err("doctor: takes no arguments");
    return CLI_EXIT_USAGE;
  }
  doctor_t d = {0};
  cogpu__config_t cfg;
  if (cogpu__config_load(&cfg) != 0) {
    doc_bad(&d, "config", cogpu_last_error(),
            "correct the value in the file or environment variable named");
    printf("%d problem(s)\n", d.problems);
    return 1;
  }
  doctor_config(&cfg);
  cogpu__gpu_desc_t gpus[COGPU_NVML_MAX_GPUS];
  size_t n = 0;
  bool nvml = doctor_nvml(&d, gpus, &n);
  doctor_cuda(&d);
  if (cogpu__node_mode(&cfg) == 1) {
    doctor_daemon(&d, &cfg, gpus, n, nvml);
  } else {
    char line[1024];
    snprintf(line, sizeof line,
             "single-user (a ledger of this user's own in %s; other users' "
             "jobs are not coordinated with it: a shared node runs cogpud, "
             "see README)",
             cfg.v[COGPU_OPT_STATE_DIR].s);
    doc_ok("mode", line);
    doctor_state(&d, &cfg, gpus, n, nvml);
  }
  if (d.problems)
    printf("%d problem(s)\n", d.problems);
  else
    printf("all checks passed\n");
  return d.problems ? 1 : 0;
}
