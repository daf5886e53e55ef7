/*
 * cogpud: the node daemon (docs/security.md). Run by systemd (cogpud.socket
 * and cogpud.service, socket activation, sd_notify readiness and
 * watchdog), or in the foreground for tests and containers:
 *   cogpud [--config FILE] [--socket PATH] [--state-dir DIR] [--check]
 *          [--version]
 * Node settings come from its configuration file only (/etc/cogpu.conf, or
 * --config); a client's environment never changes them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon-int.h"
#include "version.h" /* COGPU_COMMIT, written by the Makefile */

static void usage(void) {
  fprintf(stderr,
          "usage: cogpud [--config FILE] [--socket PATH] [--state-dir DIR] "
          "[--check] [--version]\n"
          "  --config FILE    node configuration (default /etc/cogpu.conf)\n"
          "  --socket PATH    listen here (default: socket in the config)\n"
          "  --state-dir DIR  keep the node state here (daemon_dir)\n"
          "  --check          check the configuration and exit\n"
          "  --version        print the version and the commit, and exit\n");
}

int main(int argc, char **argv) {
  const char *sock = NULL, *dir = NULL;
  bool check = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--config") && i + 1 < argc) {
      setenv("COGPU_CONFIG", argv[++i], 1);
    } else if (!strcmp(a, "--socket") && i + 1 < argc) {
      sock = argv[++i];
    } else if (!strcmp(a, "--state-dir") && i + 1 < argc) {
      dir = argv[++i];
    } else if (!strcmp(a, "--version")) {
      printf("cogpud %s (commit %s)\n", COGPU_VERSION_STRING, COGPU_COMMIT);
      return 0;
    } else if (!strcmp(a, "--check")) {
      check = true;
    } else if (!strcmp(a, "--foreground")) {
      /* the only way it runs: systemd supervises it as a simple service */
    } else {
      usage();
      return 2;
    }
  }
  cogpu__config_t cfg;
  int rc = cogpu__config_load(&cfg);
  if (rc == 0 && sock)
    rc = cogpu__config_set(&cfg, COGPU_OPT_SOCKET, sock);
  if (rc == 0 && dir)
    rc = cogpu__config_set(&cfg, COGPU_OPT_DAEMON_DIR, dir);
  if (rc) {
    fprintf(stderr, "cogpud: %s\n", cogpu_last_error());
    return 2;
  }
  if (cfg.v[COGPU_OPT_LOG].source != COGPU_SRC_DEFAULT)
    cogpu__log_set_level((int)cfg.v[COGPU_OPT_LOG].i);
  if (check) {
    printf("cogpud: configuration is valid\n");
    return 0;
  }
  if (geteuid() != 0)
    cogpu__log(COGPU_LOG_WARN,
               "cogpud runs as uid %u, not root: it serves every user, but "
               "cannot suspend jobs or read other users' processes",
               (unsigned)geteuid());
  static cogpu__daemon_t d;
  rc = cogpu__daemon_init(&d, &cfg, false);
  if (rc == 0)
    rc = cogpu__daemon_run(&d);
  if (rc)
    fprintf(stderr, "cogpud: %s\n", cogpu_last_error());
  bool failed = d.failed;
  cogpu__daemon_fini(&d);
  return rc || failed ? 1 : 0;
}
