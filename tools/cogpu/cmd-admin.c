/*
 * cmd-admin.c: `cogpu reset` and `cogpu config`: the administrator's
 * commands (`cogpu doctor` is cmd-doctor.c).
 */
#include <errno.h>
#include <getopt.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "ledger/admin.h"
#include "node/node.h"
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
  /* In node mode the daemon owns the state: it resets it (admins only). */
  int node = cogpu__node_mode(&cfg);
  if (node < 0)
    return cli_fail("reset", node);
  if (node == 1) {
    rc = cogpu__node_reset(&cfg, force, &live);
    if (rc)
      return cli_fail("reset", rc);
    if (live)
      cli_err("reset: %d process(es) were disconnected", live);
    printf("node state of cogpud (%s) reset\n", cfg.v[COGPU_OPT_SOCKET].s);
    return 0;
  }
  rc = cogpu__ledger_reset(&cfg, force, &live);
  if (rc)
    return cli_fail("reset", rc);
  if (live)
    cli_err("reset: %d process(es) still attached keep the old state", live);
  printf("node state under %s reset\n", cfg.v[COGPU_OPT_STATE_DIR].s);
  return 0;
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
