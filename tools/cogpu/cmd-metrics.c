/*
 * cmd-metrics.c: `cogpu metrics`: the node's metrics once, in the
 * Prometheus text format, on stdout (docs/metrics.md).
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

long cli_metrics_max_jobs(const char *s) {
  if (strcmp(s, "all") == 0)
    return -1;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < 0 || v > 1000000) {
    cli_err("--max-jobs: '%s' is not a count from 0 to 1000000, or 'all'", s);
    return -2;
  }
  return v;
}

int cli_metrics(int argc, char **argv) {
  static const struct option opts[] = {{"max-jobs", required_argument, 0, 'm'},
                                       {"no-jobs", no_argument, 0, 'n'},
                                       {0, 0, 0, 0}};
  cli_metrics_opts_t mo = {.max_jobs = 100, .status_seconds = -1};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    if (c == 'm') {
      mo.max_jobs = cli_metrics_max_jobs(optarg);
      if (mo.max_jobs < -1)
        return CLI_EXIT_USAGE;
    } else if (c == 'n') {
      mo.max_jobs = 0;
    } else {
      cli_err("usage: cogpu metrics [--max-jobs N|all] [--no-jobs]");
      return CLI_EXIT_USAGE;
    }
  }
  if (optind < argc) {
    cli_err("metrics: unexpected argument '%s'", argv[optind]);
    return CLI_EXIT_USAGE;
  }
  cogpu__config_t cfg;
  if (cli_config_load(&cfg))
    return CLI_EXIT_FAIL;
  cogpu_status_t *st = NULL;
  uint64_t t0 = cogpu__now_ns();
  int rc = cogpu_status(NULL, &st);
  if (rc)
    return cli_fail("cannot read the node's state", rc);
  mo.status_seconds = (double)(cogpu__now_ns() - t0) / 1e9;
  char *buf;
  size_t len;
  rc = cli_metrics_render(st, &mo, &buf, &len);
  cogpu_status_free(st);
  if (rc)
    return cli_fail("metrics", rc);
  bool ok = fwrite(buf, 1, len, stdout) == len && fflush(stdout) == 0;
  free(buf);
  if (!ok) {
    cli_err("metrics: cannot write to stdout: %s", strerror(errno));
    return CLI_EXIT_FAIL;
  }
  return 0;
}
