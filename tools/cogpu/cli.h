/*
 * cli.h: shared pieces of the `cogpu` command: subcommand entry points,
 * message helpers and the JSON writer.
 */
#ifndef COGPU_CLI_H
#define COGPU_CLI_H

#include <stdio.h>

#include "cogpu.h"
#include "internal.h"

/* Exit codes of cogpu itself (a command run by `cogpu run` keeps its own). */
#define CLI_EXIT_USAGE 2    /* bad flags or arguments */
#define CLI_EXIT_FAIL 125   /* cogpu could not do it (see message) */
#define CLI_EXIT_NOEXEC 126 /* the command cannot be executed */
#define CLI_EXIT_NOTFOUND 127

int cli_run(int argc, char **argv);
int cli_status(int argc, char **argv);
int cli_doctor(int argc, char **argv);
int cli_reset(int argc, char **argv);
int cli_config(int argc, char **argv);
int cli_slurm_conf(int argc, char **argv);
int cli_suspend(int argc, char **argv);
int cli_resume(int argc, char **argv);
int cli_metrics(int argc, char **argv);
int cli_exporter(int argc, char **argv);
int cli_history(int argc, char **argv);
int cli_sim(int argc, char **argv);
/* A command's argv joined by spaces into buf, as `cogpu run` records it
 * (truncated to len): the command line of a history record. */
void cli_cmdline(char **cmd, char *buf, size_t len);
/* --mem auto: what this user's command line (as cogpu run records it)
 * peaked at in its last runs on this node's GPU models, with auto_margin
 * on top (*bytes; 0 and *runs 0 when there is no such run). */
int cli_history_suggest(const cogpu__config_t *cfg, const char *cmdline,
                        uint64_t *bytes, unsigned *runs, uint64_t *peak);

/* Single-user mode: cogpu run records its own job in the user's history
 * (cmd-history.c), with the memory timeline it sampled on the job's GPU
 * (tl; NULL: none); says once why not if it cannot. */
struct cogpu__job_report_s;
struct cogpu__hist_tl_s;
void cli_history_record(const cogpu__config_t *cfg, cogpu_t *h,
                        const char *command, const char *job_id,
                        int exit_status, const struct cogpu__job_report_s *rep,
                        const struct cogpu__hist_tl_s *tl);

/* "cogpu: <message>" on stderr. */
void cli_err(const char *fmt, ...) COGPU_PRINTF(1, 2);
/* Report a failed library call with cogpu's message; returns CLI_EXIT_FAIL. */
int cli_fail(const char *what, int rc);
/* Load the configuration, reporting errors; returns 0 or CLI_EXIT_FAIL. */
int cli_config_load(cogpu__config_t *cfg);

/* s made safe for a terminal: control characters (newline, escape, DEL, the
 * C1 range) and bytes that are not UTF-8 become visible escapes ("\n",
 * "\x1b", "\u009b"), so that a job id or command cannot move the cursor,
 * forge lines or send escape sequences. Written into buf (cut to fit);
 * returns buf. */
const char *cli_safe(const char *s, char *buf, size_t len);

/* Length of the well-formed UTF-8 sequence at s, or 0 if it is not one. */
size_t cli_utf8_len(const unsigned char *s);

/* --- metrics.c: the Prometheus text format ------------------------------- */
typedef struct cli_metrics_opts_s {
  long max_jobs;         /* per-job series per GPU at most; -1: all */
  double status_seconds; /* how long the snapshot took; < 0: not shown */
} cli_metrics_opts_t;
/* Renders st (NULL: the node could not be read, cogpu_up 0) into a
 * malloc'd buffer. 0 or -ENOMEM. */
int cli_metrics_render(const cogpu_status_t *st, const cli_metrics_opts_t *o,
                       char **out, size_t *len);
/* Parses --max-jobs's value ("all" or a count); -1 and a message if bad. */
long cli_metrics_max_jobs(const char *s);

/* Minimal JSON writer: strings are escaped; `first` tracks commas. */
void json_str(FILE *f, const char *s);
void json_key(FILE *f, int *first, const char *key);

#endif /* COGPU_CLI_H */
