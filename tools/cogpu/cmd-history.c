/*
 * cmd-history.c: `cogpu history`: finished jobs on this node, newest
 * first (docs/history.md). In node mode the daemon answers, with the
 * records the asking user may see (root and admin_group: everyone's;
 * others: their own); in single-user mode the user's own database. Also
 * the single-user half of recording: `cogpu run` writes its own job's
 * record there when the job ends.
 */
#include <errno.h>
#include <getopt.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "cli.h"
#include "history/history.h"
#include "node/node.h"

static int hist_usage(const char *msg, const char *arg) {
  cli_err("history: %s%s%s", msg, arg ? " " : "", arg ? arg : "");
  fputs("usage: cogpu history [--json] [--user USER] [--last N] "
        "[--since DURATION|YYYY-MM-DD[THH:MM[:SS]]|@UNIXTIME]\n"
        "       cogpu history --suggest [--json] -- CMD [ARGS]\n",
        stderr);
  return CLI_EXIT_USAGE;
}

/* --since: a duration ago (2h, 7d), a local date and time, or @seconds. */
static int parse_since(const char *s, int64_t *out) {
  time_t now = time(NULL);
  char extra;
  long long at;
  if (s[0] == '@') {
    if (sscanf(s + 1, "%lld%c", &at, &extra) != 1 || at < 0)
      return -1;
    *out = at;
    return 0;
  }
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  const char *end = strptime(s, "%Y-%m-%d", &tm);
  if (end && (*end == 'T' || *end == ' ')) {
    const char *e2 = strptime(end + 1, "%H:%M:%S", &tm);
    if (!e2)
      e2 = strptime(end + 1, "%H:%M", &tm);
    end = e2;
  }
  if (end && *end == 0) {
    tm.tm_isdst = -1;
    time_t t = mktime(&tm);
    if (t == (time_t)-1)
      return -1;
    *out = t;
    return 0;
  }
  int64_t ms;
  if (cogpu__parse_duration_ms("since", s, &ms) != 0 || ms < 0)
    return -1;
  *out = (int64_t)now - ms / 1000;
  return *out < 0 ? (*out = 0, 0) : 0;
}

static void fmt_time(int64_t ms, char *buf, size_t len) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

static void fmt_exit(int32_t st, char *buf, size_t len) {
  if (st < 0)
    snprintf(buf, len, "?");
  else if (WIFEXITED(st))
    snprintf(buf, len, "%d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, len, "sig%d", WTERMSIG(st));
  else
    snprintf(buf, len, "?");
}

static void print_json(const cogpu__hist_rec_t *v, size_t n) {
  printf("[");
  for (size_t i = 0; i < n; i++) {
    const cogpu__hist_rec_t *r = &v[i];
    int first = 1;
    printf(i ? ",\n {" : "\n {");
    json_key(stdout, &first, "id");
    printf("%lld", (long long)r->id);
    json_key(stdout, &first, "user");
    json_str(stdout, r->user);
    json_key(stdout, &first, "uid");
    printf("%u", r->uid);
    json_key(stdout, &first, "command");
    json_str(stdout, r->command);
    json_key(stdout, &first, "job_id");
    json_str(stdout, r->job_id);
    json_key(stdout, &first, "gpu");
    printf("%d", r->gpu);
    json_key(stdout, &first, "gpu_uuid");
    json_str(stdout, r->gpu_uuid);
    json_key(stdout, &first, "gpu_name");
    json_str(stdout, r->gpu_name);
    json_key(stdout, &first, "start_ms");
    printf("%lld", (long long)r->start_ms);
    json_key(stdout, &first, "end_ms");
    printf("%lld", (long long)r->end_ms);
    json_key(stdout, &first, "declared_bytes");
    printf("%llu", (unsigned long long)r->declared);
    json_key(stdout, &first, "peak_bytes");
    printf("%llu", (unsigned long long)r->peak);
    json_key(stdout, &first, "time_to_peak_seconds");
    printf("%.3f", (double)r->peak_after_ms / 1e3);
    json_key(stdout, &first, "wait_seconds");
    printf("%.3f", (double)r->waited_ms / 1e3);
    json_key(stdout, &first, "run_seconds");
    printf("%.3f", (double)r->run_ms / 1e3);
    json_key(stdout, &first, "exit_status");
    if (r->exit_status < 0)
      printf("null");
    else
      printf("%d", r->exit_status);
    json_key(stdout, &first, "exit_code");
    if (r->exit_status >= 0 && WIFEXITED(r->exit_status))
      printf("%d", WEXITSTATUS(r->exit_status));
    else
      printf("null");
    json_key(stdout, &first, "signal");
    if (r->exit_status >= 0 && WIFSIGNALED(r->exit_status))
      printf("%d", WTERMSIG(r->exit_status));
    else
      printf("null");
    json_key(stdout, &first, "suspensions");
    printf("%u", r->suspensions);
    json_key(stdout, &first, "deadlock_guard_failures");
    printf("%u", r->guard_failures);
    json_key(stdout, &first, "timeline_interval_seconds");
    printf("%.3f", (double)r->tl_ms / 1e3);
    json_key(stdout, &first, "timeline_bytes");
    printf("[");
    for (uint32_t k = 0; k < r->tl_n && k < COGPU_HIST_TL_MAX; k++)
      printf("%s%llu", k ? "," : "", (unsigned long long)r->tl[k]);
    printf("]}");
  }
  printf("%s]\n", n ? "\n" : "");
}

static void print_table(const cogpu__hist_rec_t *v, size_t n) {
  printf("%-19s  %-10s %-10s %4s %9s %9s %7s %7s %8s %5s %4s %5s  %s\n",
         "ENDED", "USER", "JOB", "GPU", "DECLARED", "PEAK", "TO PEAK", "WAIT",
         "RUN", "EXIT", "SUSP", "GUARD", "COMMAND");
  for (size_t i = 0; i < n; i++) {
    const cogpu__hist_rec_t *r = &v[i];
    char end[32], dec[32], pk[32], ex[16], cmd[512], user[128], job[256];
    fmt_time(r->end_ms, end, sizeof end);
    fmt_exit(r->exit_status, ex, sizeof ex);
    printf("%-19s  %-10s %-10s %4d %9s %9s %6.0fs %6.0fs %7.0fs %5s %4u %5u  "
           "%s\n",
           end, cli_safe(r->user, user, sizeof user),
           cli_safe(r->job_id[0] ? r->job_id : "-", job, sizeof job), r->gpu,
           r->declared ? cogpu__fmt_size(r->declared, dec, sizeof dec) : "-",
           cogpu__fmt_size(r->peak, pk, sizeof pk),
           (double)r->peak_after_ms / 1e3, (double)r->waited_ms / 1e3,
           (double)r->run_ms / 1e3, ex, r->suspensions, r->guard_failures,
           cli_safe(r->command, cmd, sizeof cmd));
  }
}

/* Reads the daemon's answer: every count checked against the size. */
static int read_answer(int mfd, cogpu__hist_rec_t **out, size_t *n) {
  struct stat sb;
  cogpu__hist_hdr_t hh;
  if (fstat(mfd, &sb) != 0 || sb.st_size < (off_t)sizeof hh ||
      pread(mfd, &hh, sizeof hh, 0) != (ssize_t)sizeof hh ||
      hh.magic != COGPU_HIST_MAGIC || hh.version != COGPU_HIST_VERSION ||
      hh.rec_size != sizeof(cogpu__hist_rec_t) ||
      (uint64_t)sb.st_size !=
          sizeof hh + (uint64_t)hh.n * sizeof(cogpu__hist_rec_t))
    return cogpu__seterr(-EPROTO, "the node daemon's history is malformed");
  cogpu__hist_rec_t *v = malloc(hh.n ? hh.n * sizeof *v : 1);
  if (!v)
    return cogpu__seterr(-ENOMEM, "out of memory");
  size_t bytes = hh.n * sizeof *v;
  if (bytes && pread(mfd, v, bytes, sizeof hh) != (ssize_t)bytes) {
    free(v);
    return cogpu__seterr(-EPROTO, "the node daemon's history is cut short");
  }
  for (uint32_t i = 0; i < hh.n; i++) {
    v[i].user[sizeof v[i].user - 1] = 0;
    v[i].command[sizeof v[i].command - 1] = 0;
    v[i].job_id[sizeof v[i].job_id - 1] = 0;
    v[i].gpu_uuid[sizeof v[i].gpu_uuid - 1] = 0;
    v[i].gpu_name[sizeof v[i].gpu_name - 1] = 0;
    if (v[i].tl_n > COGPU_HIST_TL_MAX)
      v[i].tl_n = COGPU_HIST_TL_MAX;
  }
  *out = v;
  *n = hh.n;
  return 0;
}

/* The records the filter selects: from the daemon in node mode, else from
 * the user's own database (none yet: an empty history). */
static int hist_fetch(const cogpu__config_t *cfg, cogpu__hist_filter_t *f,
                      int64_t since_s, cogpu__hist_rec_t **out, size_t *nout) {
  cogpu__hist_rec_t *v = NULL;
  size_t n = 0;
  int rc;
  int mode = cogpu__node_mode(cfg);
  if (mode < 0)
    return mode;
  if (mode == 1) {
    int mfd = -1;
    rc = cogpu__node_history(cfg, f->has_uid, f->uid, since_s, f->last, &mfd);
    if (rc == 0) {
      rc = read_answer(mfd, &v, &n);
      close(mfd);
    }
  } else {
    char path[512];
    rc = cogpu__hist_path(cfg, false, path, sizeof path);
    if (rc == 0)
      rc = cogpu__seterr(-ENOENT, "no job history is kept (history_dir=none)");
    cogpu__hist_t *db = NULL;
    if (rc == 1)
      rc = cogpu__hist_open(path, false, &db);
    /* No database yet is an empty history, not an error. */
    if (rc == -ENOENT && access(path, F_OK) != 0 &&
        strcmp(cfg->v[COGPU_OPT_HISTORY_DIR].s, "none") != 0)
      rc = 0;
    else if (rc == 0)
      rc = cogpu__hist_query(db, f, &v, &n);
    cogpu__hist_close(db);
  }
  if (rc) {
    free(v);
    return rc;
  }
  *out = v;
  *nout = n;
  return 0;
}

/* How many of a command's most recent runs --mem auto looks at: enough to
 * ride over one run that stopped early, few enough to follow a program
 * whose needs changed. */
#define SUGGEST_RUNS 5

int cli_history_suggest(const cogpu__config_t *cfg, const char *cmdline,
                        uint64_t *bytes, unsigned *runs, uint64_t *peak) {
  *bytes = *peak = 0;
  *runs = 0;
  /* The node's GPU models: a run on another model (a node of a different
   * kind that shares this history) says nothing about this one. */
  char models[16][96];
  size_t nm = 0;
  cogpu_status_t *st = NULL;
  if (cogpu_status(NULL, &st) == 0) {
    for (size_t i = 0; i < st->ngpus && nm < 16; i++)
      snprintf(models[nm++], sizeof models[0], "%s", st->gpus[i].name);
    cogpu_status_free(st);
  }
  cogpu__hist_filter_t f = {.has_uid = true, .uid = (uint32_t)getuid()};
  cogpu__hist_rec_t *v = NULL;
  size_t n = 0;
  int rc = hist_fetch(cfg, &f, 0, &v, &n);
  if (rc)
    return rc;
  /* Newest first. */
  for (size_t i = 0; i < n && *runs < SUGGEST_RUNS; i++) {
    if (v[i].uid != (uint32_t)getuid() || strcmp(v[i].command, cmdline) != 0)
      continue;
    bool model = nm == 0;
    for (size_t k = 0; k < nm && !model; k++)
      model = strcmp(models[k], v[i].gpu_name) == 0;
    if (!model || v[i].peak == 0)
      continue;
    (*runs)++;
    if (v[i].peak > *peak)
      *peak = v[i].peak;
  }
  free(v);
  if (*runs) {
    uint64_t m = (uint64_t)cfg->v[COGPU_OPT_AUTO_MARGIN].i;
    uint64_t want = *peak + *peak / 100 * m + (*peak % 100) * m / 100;
    uint64_t unit = 64ull << 20;
    *bytes = (want + unit - 1) / unit * unit;
  }
  return 0;
}

static int hist_suggest_print(const cogpu__config_t *cfg, char **cmd,
                              bool json) {
  char cmdline[128];
  if (!cmd[0])
    return hist_usage("--suggest needs a command", NULL);
  cli_cmdline(cmd, cmdline, sizeof cmdline); /* as cogpu run records it */
  uint64_t bytes, peak;
  unsigned runs;
  int rc = cli_history_suggest(cfg, cmdline, &bytes, &runs, &peak);
  if (rc)
    return cli_fail("history", rc);
  char b[32], p[32];
  if (json) {
    printf("{\"command\":");
    json_str(stdout, cmdline);
    printf(",\"runs\":%u,\"peak_bytes\":%llu,\"suggested_bytes\":%llu}\n", runs,
           (unsigned long long)peak, (unsigned long long)bytes);
  } else if (runs)
    printf("%s\t(%llu bytes: peak %s over the last %u run%s, +%lld %%)\n",
           cogpu__fmt_size(bytes, b, sizeof b), (unsigned long long)bytes,
           cogpu__fmt_size(peak, p, sizeof p), runs, runs == 1 ? "" : "s",
           (long long)cfg->v[COGPU_OPT_AUTO_MARGIN].i);
  else
    printf("no history of this command: it would run on demand\n");
  return 0;
}

int cli_history(int argc, char **argv) {
  static const struct option longopts[] = {
      {"json", no_argument, NULL, 'J'},
      {"user", required_argument, NULL, 'u'},
      {"last", required_argument, NULL, 'n'},
      {"since", required_argument, NULL, 's'},
      {"suggest", no_argument, NULL, 'S'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  bool json = false, suggest = false;
  cogpu__hist_filter_t f = {.has_uid = false};
  int64_t since_s = 0;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
    long l;
    switch (c) {
    case 'J':
      json = true;
      break;
    case 'S':
      suggest = true;
      break;
    case 'u': {
      struct passwd pw, *res = NULL;
      char tmp[1024], extra;
      unsigned u;
      if (getpwnam_r(optarg, &pw, tmp, sizeof tmp, &res) == 0 && res) {
        f.uid = res->pw_uid;
      } else if (sscanf(optarg, "%u%c", &u, &extra) == 1) {
        f.uid = u;
      } else {
        cli_err("history: --user: no user named '%s'", optarg);
        return CLI_EXIT_USAGE;
      }
      f.has_uid = true;
      break;
    }
    case 'n':
      if (cogpu__parse_int("last", optarg, 1, 1000000000, &l) != 0)
        return hist_usage("--last takes a number from 1:", optarg);
      f.last = (uint32_t)l;
      break;
    case 's':
      if (parse_since(optarg, &since_s) != 0) {
        cli_err("history: --since '%s': give a duration ago (2h, 7d), a "
                "date and time (2026-11-24, 2026-11-24T13:00) or @UNIXTIME",
                optarg);
        return CLI_EXIT_USAGE;
      }
      break;
    case 'h':
      return hist_usage("help", NULL);
    default:
      return hist_usage("unknown or incomplete option", argv[optind - 1]);
    }
  }
  if (optind < argc && !suggest)
    return hist_usage("unexpected argument", argv[optind]);
  f.since_ms = since_s * 1000;
  cogpu__config_t cfg;
  int rc = cli_config_load(&cfg);
  if (rc)
    return rc;
  cogpu__hist_rec_t *v = NULL;
  size_t n = 0;
  if (suggest) {
    rc = hist_suggest_print(&cfg, argv + optind, json);
    return rc;
  }
  rc = hist_fetch(&cfg, &f, since_s, &v, &n);
  if (rc) {
    free(v);
    return cli_fail("history", rc);
  }
  if (json)
    print_json(v, n);
  else
    print_table(v, n);
  free(v);
  return 0;
}

void cli_history_record(const cogpu__config_t *cfg, cogpu_t *h,
                        const char *command, const char *job_id,
                        int exit_status, const cogpu__job_report_t *rep,
                        const cogpu__hist_tl_t *tl) {
  char path[512];
  int on = cogpu__hist_path(cfg, false, path, sizeof path);
  if (on <= 0 || rep->gpu < 0) {
    if (on < 0)
      cli_err("job history is off: %s", cogpu_last_error());
    return;
  }
  cogpu__hist_rec_t *r = calloc(1, sizeof *r);
  if (!r)
    return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  r->end_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  r->start_ms = r->end_ms - (int64_t)rep->run_ms;
  r->uid = (uint32_t)geteuid();
  struct passwd pw, *res = NULL;
  char tmp[1024];
  if (getpwuid_r(r->uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
    snprintf(r->user, sizeof r->user, "%s", res->pw_name);
  else
    snprintf(r->user, sizeof r->user, "%u", r->uid);
  snprintf(r->command, sizeof r->command, "%s", command);
  snprintf(r->job_id, sizeof r->job_id, "%s", job_id ? job_id : "");
  r->exit_status = exit_status;
  r->gpu = rep->gpu;
  cogpu_status_t *st = NULL;
  if (cogpu_status(h, &st) == 0 && (size_t)rep->gpu < st->ngpus) {
    snprintf(r->gpu_uuid, sizeof r->gpu_uuid, "%s", st->gpus[rep->gpu].uuid);
    snprintf(r->gpu_name, sizeof r->gpu_name, "%s", st->gpus[rep->gpu].name);
  }
  cogpu_status_free(st);
  r->declared = rep->reserved;
  r->peak = rep->peak;
  r->peak_after_ms = rep->peak_after_ms;
  r->waited_ms = rep->waited_ms;
  r->run_ms = rep->run_ms;
  r->suspensions = rep->suspensions;
  r->guard_failures = rep->guard_failures;
  /* The peak goes in at its time: samples a second apart can miss it,
   * and the timeline's highest point is the job's peak. */
  cogpu__hist_tl_t *t = malloc(sizeof *t);
  if (t) {
    if (tl)
      *t = *tl;
    else
      memset(t, 0, sizeof *t);
    cogpu__hist_tl_add(t, rep->peak_after_ms, rep->peak);
    cogpu__hist_tl_store(r, t);
    free(t);
  }
  cogpu__hist_t *db = NULL;
  int rc = cogpu__hist_open(path, true, &db);
  if (rc == 0)
    rc = cogpu__hist_add(db, r, cfg->v[COGPU_OPT_HISTORY_MAX_AGE].i,
                         cfg->v[COGPU_OPT_HISTORY_MAX_ROWS].i);
  if (rc)
    cli_err("job history is off: %s", cogpu_last_error());
  cogpu__hist_close(db);
  free(r);
}
