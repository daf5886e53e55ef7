/*
 * cmd-suspend.c: `cogpu suspend JOB|PID` and `cogpu resume JOB|PID`: park a
 * job's GPU memory in host memory (the driver's checkpoint API, done by the
 * node daemon) and bring it back. A number names a process of the job (any
 * of them); anything else is a job id (as `cogpu status` shows it). Only
 * the job's owner, root and the daemon's admin group may.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "node/node.h"

static int usage_err(const char *cmd, const char *what) {
  cli_err("%s: %s (usage: cogpu %s JOB|PID [--timeout DURATION])", cmd, what,
          cmd);
  return CLI_EXIT_USAGE;
}

static int suspend_cmd(int argc, char **argv, bool resume) {
  const char *cmd = resume ? "resume" : "suspend";
  const char *target = NULL;
  int64_t timeout_ms = -1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--timeout") == 0 || strcmp(argv[i], "-t") == 0) {
      if (i + 1 == argc)
        return usage_err(cmd, "--timeout needs a duration");
      if (cogpu__parse_duration_ms("--timeout", argv[++i], &timeout_ms) != 0) {
        cli_err("%s: %s", cmd, cogpu_last_error());
        return CLI_EXIT_USAGE;
      }
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return usage_err(cmd, "unknown option");
    } else if (target) {
      return usage_err(cmd, "one job at a time");
    } else {
      target = argv[i];
    }
  }
  if (!target || !*target)
    return usage_err(cmd, "which job?");
  int pid = 0;
  char *end;
  errno = 0;
  long v = strtol(target, &end, 10);
  if (*end == 0 && errno == 0) {
    if (v <= 0 || v > 0x3fffffff)
      return usage_err(cmd, "not a process id");
    pid = (int)v;
  }
  cogpu__config_t cfg;
  int rc = cli_config_load(&cfg);
  if (rc)
    return rc;
  int node = cogpu__node_mode(&cfg);
  if (node < 0)
    return cli_fail(cmd, node);
  if (node == 0) {
    cli_err("%s: suspending jobs needs the node daemon (cogpud): it alone "
            "may checkpoint other processes (docs/suspension.md)",
            cmd);
    return CLI_EXIT_FAIL;
  }
  uint64_t bytes = 0, ms = 0, took = 0;
  /* A daemon that has just started may still be initialising CUDA (cuInit
   * takes seconds on real nodes): ask again for a little while. */
  for (int tries = 0;; tries++) {
    rc = cogpu__node_suspend(&cfg, pid, pid ? NULL : target, resume, timeout_ms,
                             &bytes, &ms, &took);
    if (rc != -EAGAIN || tries == 50)
      break;
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (rc)
    return cli_fail(cmd, rc);
  char sz[32], safe[96];
  if (resume)
    printf("resumed %s (%s back on the GPU in %.2f s) after %.1f s "
           "suspended\n",
           cli_safe(target, safe, sizeof safe),
           cogpu__fmt_size(bytes, sz, sizeof sz), (double)took / 1000.0,
           (double)ms / 1000.0);
  else
    printf("suspended %s: %s moved to host memory in %.2f s\n",
           cli_safe(target, safe, sizeof safe),
           cogpu__fmt_size(bytes, sz, sizeof sz), (double)ms / 1000.0);
  return 0;
}

int cli_suspend(int argc, char **argv) {
  return suspend_cmd(argc, argv, false);
}

int cli_resume(int argc, char **argv) {
  return suspend_cmd(argc, argv, true);
}
