/*
 * cmd-status.c: `cogpu status`: the node's GPUs, clients, queues and
 * policy, as a table or as JSON (--json), once or repeatedly (--watch).
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static const char *job_state(int state) {
  static const char *const names[] = {"running", "suspending", "suspended",
                                      "resuming", "exiting"};
  return state >= 0 && state <= COGPU_JOB_EXITING ? names[state] : "running";
}

static void status_json_clients(FILE *f, const cogpu_gpu_info_t *g) {
  fputc('[', f);
  for (size_t i = 0; i < g->nclients; i++) {
    const cogpu_client_info_t *c = &g->clients[i];
    int first = 1;
    fputs(i ? ",{" : "{", f);
    json_key(f, &first, "pid");
    fprintf(f, "%d", c->pid);
    json_key(f, &first, "user");
    json_str(f, c->user);
    json_key(f, &first, "uid");
    fprintf(f, "%u", c->uid);
    json_key(f, &first, "command");
    json_str(f, c->command);
    json_key(f, &first, "job_id");
    json_str(f, c->job_id);
    json_key(f, &first, "reserved_bytes");
    fprintf(f, "%llu", (unsigned long long)c->reserved_bytes);
    json_key(f, &first, "priority");
    fprintf(f, "%d", c->priority);
    json_key(f, &first, "exclusive");
    fputs(c->exclusive ? "true" : "false", f);
    json_key(f, &first, "state");
    json_str(f, job_state(c->state));
    json_key(f, &first, "suspended_bytes");
    fprintf(f, "%llu", (unsigned long long)c->suspended_bytes);
    json_key(f, &first, "suspended_seconds");
    fprintf(f, "%.3f", c->suspended_seconds);
    json_key(f, &first, "suspensions");
    fprintf(f, "%u", c->suspensions);
    json_key(f, &first, "used_bytes");
    fprintf(f, "%llu", (unsigned long long)c->used_bytes);
    json_key(f, &first, "peak_bytes");
    fprintf(f, "%llu", (unsigned long long)c->peak_bytes);
    json_key(f, &first, "escaped_bytes");
    fprintf(f, "%llu", (unsigned long long)c->escaped_bytes);
    json_key(f, &first, "escaped_pid");
    fprintf(f, "%d", c->escaped_pid);
    fputc('}', f);
  }
  fputc(']', f);
}

static void status_json_waiting(FILE *f, const cogpu_gpu_info_t *g) {
  fputc('[', f);
  for (size_t i = 0; i < g->nwaiting; i++) {
    const cogpu_waiter_info_t *w = &g->waiting[i];
    int first = 1;
    fputs(i ? ",{" : "{", f);
    json_key(f, &first, "pid");
    fprintf(f, "%d", w->pid);
    json_key(f, &first, "user");
    json_str(f, w->user);
    json_key(f, &first, "command");
    json_str(f, w->command);
    json_key(f, &first, "job_id");
    json_str(f, w->job_id);
    json_key(f, &first, "gpu");
    if (w->gpu == COGPU_GPU_AUTO)
      json_str(f, "auto");
    else
      fprintf(f, "%d", w->gpu);
    json_key(f, &first, "requested_bytes");
    fprintf(f, "%llu", (unsigned long long)w->requested_bytes);
    json_key(f, &first, "exclusive");
    fputs(w->exclusive ? "true" : "false", f);
    json_key(f, &first, "priority");
    fprintf(f, "%d", w->priority);
    json_key(f, &first, "waiting_seconds");
    fprintf(f, "%.3f", w->waiting_seconds);
    json_key(f, &first, "position");
    fprintf(f, "%d", w->position);
    fputc('}', f);
  }
  fputc(']', f);
}

static void status_json(FILE *f, const cogpu_status_t *st) {
  int first = 1;
  fputc('{', f);
  json_key(f, &first, "policy");
  json_str(f, st->policy);
  json_key(f, &first, "state");
  json_str(f, st->state_path);
  json_key(f, &first, "layout_version");
  fprintf(f, "%u", st->layout_version);
  if (st->suspension[0]) { /* node mode */
    json_key(f, &first, "suspension");
    json_str(f, st->suspension);
    static const char *const keys[] = {"suspended_bytes", "suspend_max_bytes",
                                       "host_available_bytes",
                                       "host_margin_bytes"};
    const uint64_t vals[] = {st->suspended_bytes, st->suspend_max_bytes,
                             st->host_available_bytes, st->host_margin_bytes};
    for (size_t k = 0; k < COGPU_ARRAY_SIZE(keys); k++) {
      json_key(f, &first, keys[k]);
      fprintf(f, "%llu", (unsigned long long)vals[k]);
    }
    json_key(f, &first, "checkpoint_bytes");
    fprintf(f, "%llu", (unsigned long long)st->counters.checkpoint_bytes);
    json_key(f, &first, "checkpoint_seconds");
    fprintf(f, "%.6f", st->counters.checkpoint_seconds);
  }
  json_key(f, &first, "gpus");
  fputc('[', f);
  for (size_t i = 0; i < st->ngpus; i++) {
    const cogpu_gpu_info_t *g = &st->gpus[i];
    int gf = 1;
    fputs(i ? ",{" : "{", f);
    json_key(f, &gf, "index");
    fprintf(f, "%d", g->index);
    json_key(f, &gf, "uuid");
    json_str(f, g->uuid);
    json_key(f, &gf, "name");
    json_str(f, g->name);
    static const char *const keys[] = {
        "total_bytes",    "margin_bytes",    "foreign_bytes", "capacity_bytes",
        "reserved_bytes", "suspended_bytes", "used_bytes"};
    const uint64_t vals[] = {g->total_bytes,    g->margin_bytes,
                             g->foreign_bytes,  g->capacity_bytes,
                             g->reserved_bytes, g->suspended_bytes,
                             g->used_bytes};
    for (size_t k = 0; k < COGPU_ARRAY_SIZE(keys); k++) {
      json_key(f, &gf, keys[k]);
      fprintf(f, "%llu", (unsigned long long)vals[k]);
    }
    json_key(f, &gf, "max_clients");
    fprintf(f, "%d", g->max_clients);
    json_key(f, &gf, "exclusive");
    fputs(g->exclusive ? "true" : "false", f);
    json_key(f, &gf, "clients");
    status_json_clients(f, g);
    json_key(f, &gf, "waiting");
    status_json_waiting(f, g);
    fputc('}', f);
  }
  fputs("]}\n", f);
}

/* Escaped copies of a client's or waiter's strings (cli_safe), sized for
 * the worst case: every byte shown as a four-character escape. */
typedef struct status_text_s {
  char user[4 * 32], command[4 * 128], job[4 * 64];
} status_text_t;

static void status_text(status_text_t *t, const char *user, const char *command,
                        const char *job) {
  cli_safe(user, t->user, sizeof t->user);
  cli_safe(command, t->command, sizeof t->command);
  cli_safe(job[0] ? job : "-", t->job, sizeof t->job);
}

/* Job ids, commands, user and GPU names are shown through cli_safe: a job
 * id with a newline or a terminal escape must not forge lines or drive the
 * terminal of whoever runs cogpu status. */
static void status_table_gpu(FILE *f, const cogpu_gpu_info_t *g) {
  char t[32], c[32], r[32], fo[32], m[32], name[4 * 96], uuid[4 * 96];
  status_text_t tx;
  fprintf(f, "GPU %d  %s  %s%s\n", g->index,
          cli_safe(g->name, name, sizeof name),
          cli_safe(g->uuid, uuid, sizeof uuid),
          g->exclusive ? "  [exclusive]" : "");
  char u[32];
  fprintf(f,
          "  total %s  margin %s  foreign %s  capacity %s  reserved %s  "
          "used %s\n",
          cogpu__fmt_size(g->total_bytes, t, sizeof t),
          cogpu__fmt_size(g->margin_bytes, m, sizeof m),
          cogpu__fmt_size(g->foreign_bytes, fo, sizeof fo),
          cogpu__fmt_size(g->capacity_bytes, c, sizeof c),
          cogpu__fmt_size(g->reserved_bytes, r, sizeof r),
          cogpu__fmt_size(g->used_bytes, u, sizeof u));
  if (g->suspended_bytes)
    fprintf(f, "  suspended %s (in host memory)\n",
            cogpu__fmt_size(g->suspended_bytes, r, sizeof r));
  if (g->nclients)
    fprintf(f, "  %-8s %-10s %12s %12s %12s %5s %-10s %s\n", "PID", "USER",
            "RESERVED", "USED", "PEAK", "PRIO", "JOB", "COMMAND");
  for (size_t i = 0; i < g->nclients; i++) {
    const cogpu_client_info_t *cl = &g->clients[i];
    status_text(&tx, cl->user, cl->command, cl->job_id);
    char state[96] = "";
    if (cl->state == COGPU_JOB_SUSPENDED)
      snprintf(state, sizeof state, " [suspended: %s in host memory, %.0f s]",
               cogpu__fmt_size(cl->suspended_bytes, c, sizeof c),
               cl->suspended_seconds);
    else if (cl->state == COGPU_JOB_EXITING)
      snprintf(state, sizeof state,
               " [exiting: booked until the process has gone]");
    else if (cl->state != COGPU_JOB_RUNNING)
      snprintf(state, sizeof state, " [%s]", job_state(cl->state));
    char esc[96] = "";
    if (cl->escaped_bytes)
      snprintf(esc, sizeof esc,
               " [escaped: %s held by pid %d outside the preload library]",
               cogpu__fmt_size(cl->escaped_bytes, c, sizeof c),
               cl->escaped_pid);
    char us[32], pk[32];
    fprintf(f, "  %-8d %-10s %12s %12s %12s %5d %-10s %s%s%s%s\n", cl->pid,
            tx.user, cogpu__fmt_size(cl->reserved_bytes, r, sizeof r),
            cogpu__fmt_size(cl->used_bytes, us, sizeof us),
            cogpu__fmt_size(cl->peak_bytes, pk, sizeof pk), cl->priority,
            tx.job, tx.command, cl->exclusive ? " [exclusive]" : "", state,
            esc);
  }
  if (g->nwaiting)
    fprintf(f, "  waiting:\n  %-4s %-8s %-10s %12s %5s %8s %s\n", "POS", "PID",
            "USER", "REQUESTED", "PRIO", "AGE", "COMMAND");
  for (size_t i = 0; i < g->nwaiting; i++) {
    const cogpu_waiter_info_t *w = &g->waiting[i];
    status_text(&tx, w->user, w->command, w->job_id);
    fprintf(f, "  %-4d %-8d %-10s %12s %5d %7.1fs %s%s\n", w->position, w->pid,
            tx.user,
            w->exclusive ? "exclusive"
                         : cogpu__fmt_size(w->requested_bytes, r, sizeof r),
            w->priority, w->waiting_seconds, tx.command,
            w->gpu == COGPU_GPU_AUTO ? " [any GPU]" : "");
  }
}

static void status_table(FILE *f, const cogpu_status_t *st) {
  char policy[4 * 16], path[4 * 512];
  fprintf(f, "policy %s  state %s\n",
          cli_safe(st->policy, policy, sizeof policy),
          cli_safe(st->state_path, path, sizeof path));
  if (st->suspension[0]) {
    char why[4 * 128], a[32], b[32], c[32], m[32];
    fprintf(f,
            "suspension %s  suspended %s of at most %s  host memory "
            "available %s (margin %s)\n",
            cli_safe(st->suspension, why, sizeof why),
            cogpu__fmt_size(st->suspended_bytes, a, sizeof a),
            cogpu__fmt_size(st->suspend_max_bytes, b, sizeof b),
            cogpu__fmt_size(st->host_available_bytes, c, sizeof c),
            cogpu__fmt_size(st->host_margin_bytes, m, sizeof m));
    /* What parking has cost the node so far, and the bandwidth it saw:
     * what the next parking will cost. */
    const cogpu_counters_t *k = &st->counters;
    if (k->checkpoint_bytes && k->checkpoint_seconds > 0)
      fprintf(f, "checkpoint copies %s moved in %.1f s (%.2f GB/s)\n",
              cogpu__fmt_size(k->checkpoint_bytes, a, sizeof a),
              k->checkpoint_seconds,
              (double)k->checkpoint_bytes / k->checkpoint_seconds / 1e9);
  }
  for (size_t i = 0; i < st->ngpus; i++)
    status_table_gpu(f, &st->gpus[i]);
}

int cli_status(int argc, char **argv) {
  static const struct option longopts[] = {
      {"json", no_argument, NULL, 'j'},
      {"watch", optional_argument, NULL, 'w'},
      {"count", required_argument, NULL, 'c'},
      {NULL, 0, NULL, 0}};
  bool json = false, watch = false;
  int64_t every_ms = 1000;
  long count = -1;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    int rc = 0;
    if (c == 'j')
      json = true;
    else if (c == 'w') {
      watch = true;
      if (optarg)
        rc = cogpu__parse_duration_ms("--watch", optarg, &every_ms);
      if (rc == 0 && every_ms <= 0)
        rc = cogpu__seterr(-22, "--watch: the interval must be positive");
    } else if (c == 'c')
      rc = cogpu__parse_int("--count", optarg, 1, 1000000000, &count);
    else {
      cli_err("status: unknown option %s", argv[optind - 1]);
      return CLI_EXIT_USAGE;
    }
    if (rc) {
      cli_err("status: %s", cogpu_last_error());
      return CLI_EXIT_USAGE;
    }
  }
  if (optind < argc) {
    cli_err("status: unexpected argument '%s'", argv[optind]);
    return CLI_EXIT_USAGE;
  }
  if (!watch && count < 0)
    count = 1;
  bool tty = isatty(1);
  for (long n = 0; count < 0 || n < count; n++) {
    if (n > 0) {
      struct timespec ts = {every_ms / 1000, (every_ms % 1000) * 1000000L};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
      }
    }
    cogpu_status_t *st;
    int rc = cogpu_status(NULL, &st);
    if (rc)
      return cli_fail("status", rc);
    if (watch && tty && !json)
      fputs("\033[H\033[2J", stdout);
    if (json)
      status_json(stdout, st);
    else
      status_table(stdout, st);
    fflush(stdout);
    cogpu_status_free(st);
  }
  return 0;
}
