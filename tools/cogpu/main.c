/*
 * main.c: the `cogpu` command: dispatches to one file per subcommand.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "version.h" /* COGPU_COMMIT, written by the Makefile */

static const char usage[] =
    "usage: cogpu COMMAND [OPTIONS]\n"
    "\n"
    "  run [--mem SIZE] [--gpu auto|INDEX|UUID] [--priority N]\n"
    "      [--timeout DURATION] [--exclusive] [--job-id ID] [--no-preload]\n"
    "      -- COMMAND [ARGS]\n"
    "                 reserve GPU memory (waiting if needed), run COMMAND on\n"
    "                 that GPU, release when it ends; its CUDA allocations\n"
    "                 are accounted (preload library) unless --no-preload\n"
    "  status [--json] [--watch[=SECONDS]] [--count N]\n"
    "                 GPUs, clients, wait queues and the policy\n"
    "  metrics [--max-jobs N|all] [--no-jobs]\n"
    "                 the node's metrics in the Prometheus text format\n"
    "  exporter [--textfile PATH [--interval DURATION]]\n"
    "      [--listen [ADDR:]PORT] [--max-jobs N|all] [--no-jobs]\n"
    "                 keep them current: a file for node_exporter's\n"
    "                 textfile collector, and/or HTTP (GET /metrics)\n"
    "  doctor         check the configuration, NVML, the CUDA driver and the\n"
    "                 node state\n"
    "  suspend JOB|PID [--timeout DURATION]\n"
    "                 move a job's GPU memory to host memory (node daemon;\n"
    "                 the job's owner or an admin); it waits until resumed\n"
    "  resume JOB|PID [--timeout DURATION]\n"
    "                 bring a suspended job back once its GPU has room\n"
    "  reset [--force]\n"
    "                 remove the node state (admin); refuses while in use\n"
    "  config [--list|--explain]\n"
    "                 every option with its default / its value and source\n"
    "  slurm-conf [--node NAME]\n"
    "                 slurm.conf and gres.conf lines declaring this node's\n"
    "                 GPU memory as the GRES cogpumem (see docs/slurm.md)\n"
    "  sim --trace FILE --format FMT (--cluster CSV | --nodes N\n"
    "      --gpus-per-node G --gpu-mem SIZE) --policy P [--policy Q ...]\n"
    "      --out DIR [--seed S] [--strict]\n"
    "                 replay a cluster's job trace under scheduling policies\n"
    "                 (exclusive, shares, cogpu, cogpu+suspend, rqueue) and\n"
    "                 write results (docs/simulation.md)\n"
    "  history [--json] [--user USER] [--last N] [--since WHEN]\n"
    "  history --suggest [--json] -- COMMAND [ARGS]\n"
    "                 finished jobs on this node, or the reservation\n"
    "                 --mem auto would take for COMMAND (docs/history.md)\n"
    "  version        print the version and the commit it was built from\n"
    "  help [--commands]\n"
    "                 this text, or the subcommands' names, one a line\n"
    "\n"
    "SIZE: bytes or K/M/G/T (binary): 512M, 12G, 12GiB.\n"
    "DURATION: 0 (do not wait), 500ms, 30s, 5m, 2h, inf.\n";

void cli_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("cogpu: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int cli_fail(const char *what, int rc) {
  const char *msg = cogpu_last_error();
  cli_err("%s: %s", what, *msg ? msg : cogpu_strerror(rc));
  return CLI_EXIT_FAIL;
}

int cli_config_load(cogpu__config_t *cfg) {
  int rc = cogpu__config_load(cfg);
  if (rc)
    return cli_fail("configuration", rc);
  if (cfg->v[COGPU_OPT_LOG].source != COGPU_SRC_DEFAULT)
    cogpu__log_set_level((int)cfg->v[COGPU_OPT_LOG].i);
  return 0;
}

/* A control character: C0, DEL, or C1 (U+0080 to U+009F, "\xc2\x80" to
 * "\xc2\x9f" in UTF-8). A terminal acts on these. */
static bool is_control(const unsigned char *p, size_t n) {
  return (n == 1 && (p[0] < 0x20 || p[0] == 0x7f)) ||
         (n == 2 && p[0] == 0xc2 && p[1] < 0xa0);
}

const char *cli_safe(const char *s, char *buf, size_t len) {
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  size_t o = 0;
  if (len == 0)
    return "";
  while (*p) {
    size_t n = cli_utf8_len(p);
    char esc[8];
    const char *piece = (const char *)p;
    size_t plen = n;
    /* Invalid bytes and controls are shown as escapes, never sent. */
    if (n == 0 || is_control(p, n)) {
      if (*p == '\n' || *p == '\t' || *p == '\r')
        snprintf(esc, sizeof esc, "\\%c",
                 *p == '\n'   ? 'n'
                 : *p == '\t' ? 't'
                              : 'r');
      else if (n == 2)
        snprintf(esc, sizeof esc, "\\u%04x", (unsigned)p[1]);
      else
        snprintf(esc, sizeof esc, "\\x%02x", (unsigned)*p);
      piece = esc;
      plen = strlen(esc);
      n = n ? n : 1;
    }
    if (o + plen >= len)
      break;
    memcpy(buf + o, piece, plen);
    o += plen;
    p += n;
  }
  buf[o] = 0;
  return buf;
}

/* JSON strings must be valid UTF-8: a byte that is not part of a valid
 * sequence (a command line in another encoding) becomes U+FFFD. */
void json_str(FILE *f, const char *s) {
  fputc('"', f);
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  while (*p) {
    size_t n = cli_utf8_len(p);
    if (n == 0) {
      fputs("\\ufffd", f);
      p++;
    } else if (n > 1 && is_control(p, n)) {
      fprintf(f, "\\u%04x", p[1]); /* C1: valid, but escaped for terminals */
      p += n;
    } else if (n > 1) {
      fwrite(p, 1, n, f);
      p += n;
    } else {
      if (*p == '"' || *p == '\\')
        fprintf(f, "\\%c", *p);
      else if (*p < 0x20 || *p == 0x7f)
        fprintf(f, "\\u%04x", *p);
      else
        fputc(*p, f);
      p++;
    }
  }
  fputc('"', f);
}

void json_key(FILE *f, int *first, const char *key) {
  if (!*first)
    fputc(',', f);
  *first = 0;
  json_str(f, key);
  fputc(':', f);
}

/* Every subcommand, once: dispatch, `cogpu help --commands` (which the
 * bash completion and the man page's test read) and the usage's test. */
static const struct {
  const char *name;
  int (*fn)(int, char **);
} cmds[] = {{"run", cli_run},         {"status", cli_status},
            {"metrics", cli_metrics}, {"exporter", cli_exporter},
            {"doctor", cli_doctor},   {"suspend", cli_suspend},
            {"resume", cli_resume},   {"reset", cli_reset},
            {"config", cli_config},   {"slurm-conf", cli_slurm_conf},
            {"history", cli_history}, {"sim", cli_sim},
            {"version", NULL},        {"help", NULL}};

static int cli_help(int argc, char **argv) {
  if (argc == 1) {
    fputs(usage, stdout);
    return 0;
  }
  if (argc == 2 && !strcmp(argv[1], "--commands")) {
    for (size_t i = 0; i < COGPU_ARRAY_SIZE(cmds); i++)
      puts(cmds[i].name);
    return 0;
  }
  cli_err("help: usage: cogpu help [--commands]");
  return CLI_EXIT_USAGE;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return CLI_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(cmds); i++)
    if (cmds[i].fn && strcmp(cmd, cmds[i].name) == 0)
      return cmds[i].fn(argc - 1, argv + 1);
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("cogpu %s (commit %s)\n", COGPU_VERSION_STRING, COGPU_COMMIT);
    return 0;
  }
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h"))
    return cli_help(argc - 1, argv + 1);
  cli_err("unknown command '%s'", cmd);
  fputs(usage, stderr);
  return CLI_EXIT_USAGE;
}
