/*
 * cmd-slurm.c: `cogpu slurm-conf`, the Slurm configuration lines that
 * declare this node's GPU memory as the count-only GRES `cogpumem`, and its
 * largest GPU as the node feature cogpu_gpu_SIZE, from which srun, sbatch
 * and salloc refuse a --gpu-mem no GPU could hold (see docs/slurm.md).
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Largest exact binary unit, floored to MiB: Slurm counts K/M/G/T in
 * powers of 1024, as cogpu does. */
static void gres_count(uint64_t bytes, char *buf, size_t len) {
  static const char units[] = "MGTP";
  uint64_t n = bytes >> 20;
  int u = 0;
  while (n && n % 1024 == 0 && units[u + 1]) {
    n /= 1024;
    u++;
  }
  snprintf(buf, len, "%llu%c", (unsigned long long)n, units[u]);
}

/* A node name as slurm.conf takes it: a host name (letters, digits, '-',
 * '_', '.'), or a host list such as gpu[01-08],big1. Anything else (a
 * space, '=', '#', a newline) would change or add configuration lines. */
static bool node_name_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 255 || s[0] == '-')
    return false;
  return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                   "0123456789-_.[],") == n;
}

static void print_conf(const cogpu_status_t *st, const char *node) {
  uint64_t sum = 0, largest = 0;
  char count[32], big[32];
  for (size_t i = 0; i < st->ngpus; i++) {
    const cogpu_gpu_info_t *g = &st->gpus[i];
    uint64_t usable = g->total_bytes - g->margin_bytes;
    sum += usable;
    largest = usable > largest ? usable : largest;
  }
  gres_count(sum, count, sizeof count);
  gres_count(largest, big, sizeof big);
  printf("# GPU memory of %s for Slurm: %zu GPU(s), their memory less "
         "cogpu's margin;\n# a job's --gpu-mem must fit on one GPU "
         "(largest here: %s).\n",
         node, st->ngpus, big);
  printf("# slurm.conf (GresTypes=cogpumem): merge into this node's existing "
         "NodeName= line,\n# adding to its other Gres and Features, "
         "comma-separated:\n");
  printf("NodeName=%s Gres=cogpumem:%s Features=cogpu_gpu_%s\n", node, count,
         big);
  printf("# gres.conf:\n");
  printf("NodeName=%s Name=cogpumem Count=%s Flags=CountOnly\n", node, count);
}

int cli_slurm_conf(int argc, char **argv) {
  static const struct option longopts[] = {
      {"node", required_argument, NULL, 'n'}, {NULL, 0, NULL, 0}};
  char host[256] = "";
  const char *node = NULL;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    if (c != 'n' || !*optarg) {
      cli_err("slurm-conf: %s %s", c == 'n' ? "empty" : "unknown option",
              argv[optind - 1]);
      return CLI_EXIT_USAGE;
    }
    node = optarg;
  }
  if (optind < argc) {
    cli_err("slurm-conf: unexpected argument '%s'", argv[optind]);
    return CLI_EXIT_USAGE;
  }
  if (!node) {
    gethostname(host, sizeof host - 1);
    host[strcspn(host, ".")] = 0;
    node = host;
  }
  if (!node_name_ok(node)) {
    char shown[4 * 256];
    cli_err("slurm-conf: invalid node name '%s': use letters, digits, '-', "
            "'_' and '.', or a Slurm host list such as gpu[01-08]%s",
            cli_safe(node, shown, sizeof shown),
            node == host ? " (give one with --node)" : "");
    return CLI_EXIT_USAGE;
  }
  cogpu_status_t *st;
  int rc = cogpu_status(NULL, &st);
  if (rc)
    return cli_fail("slurm-conf", rc);
  print_conf(st, node);
  cogpu_status_free(st);
  return 0;
}
