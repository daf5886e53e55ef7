/*
 * cmd-admin.c: `cogpu reset`, `cogpu doctor` and `cogpu config`: the
 * administrator's commands.
 */
#include <errno.h>
#include <getopt.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "ledger/admin.h"
#include "nvml/nvml.h"

int cli_reset(int argc, char **argv) {
  bool force = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--force") == 0 || strcmp(argv[i], "-f") == 0)
      force = true;
    else {
      cli_err("reset: unknown argument '%s' (usage: cogpu reset [--force])",
              argv[i]);
      return CLI_EXIT_USAGE;
    }
  }
  cogpu__config_t cfg;
  int rc = cli_config_load(&cfg);
  if (rc)
    return rc;
  int live = 0;
  rc = cogpu__ledger_reset(&cfg, force, &live);
  if (rc)
    return cli_fail("reset", rc);
  if (live)
    cli_err("reset: %d process(es) still attached keep the old state", live);
  printf("node state under %s reset\n", cfg.v[COGPU_OPT_STATE_DIR].s);
  return 0;
}

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
    doc_ok("state", "not created yet; the first cogpu user creates it");
  } else if (cogpu__ledger_check(cfg, why, sizeof why)) {
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
  doc_ok("config", cfg.v[COGPU_OPT_CONFIG].s[0] ? cfg.v[COGPU_OPT_CONFIG].s
                                                : "(no config file)");
  cogpu__gpu_desc_t gpus[COGPU_NVML_MAX_GPUS];
  size_t n = 0;
  bool nvml = doctor_nvml(&d, gpus, &n);
  doctor_state(&d, &cfg, gpus, n, nvml);
  if (d.problems)
    printf("%d problem(s)\n", d.problems);
  else
    printf("all checks passed\n");
  return d.problems ? 1 : 0;
}

static void config_print_list(void) {
  printf("%-16s %-24s %-10s %s\n", "KEY", "ENVIRONMENT", "DEFAULT",
         "ACCEPTED / MEANING");
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    const cogpu__opt_desc_t *o = &cogpu__opt_table[i];
    char env[64];
    snprintf(env, sizeof env, "COGPU_%s", o->name);
    printf("%-16s %-24s %-10s %s\n%-53s %s\n", o->key, env,
           o->def[0] ? o->def : "\"\"", o->form, "", o->help);
  }
}

int cli_config(int argc, char **argv) {
  bool list = argc < 2 || strcmp(argv[1], "--list") == 0;
  if (argc > 2 || (!list && strcmp(argv[1], "--explain") != 0)) {
    cli_err("config: usage: cogpu config [--list|--explain]");
    return CLI_EXIT_USAGE;
  }
  if (list) {
    config_print_list();
    return 0;
  }
  cogpu__config_t cfg;
  int rc = cli_config_load(&cfg);
  if (rc)
    return rc;
  for (int i = 0; i < COGPU_OPT__COUNT; i++)
    printf("%-16s = %-24s (%s)\n", cogpu__opt_table[i].key, cfg.v[i].s,
           cfg.v[i].where);
  return 0;
}
