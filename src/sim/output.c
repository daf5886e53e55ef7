/*
 * output.c: what `cogpu sim` writes: DIR/results.json (every figure of
 * every policy), DIR/<policy>.csv (the time series), DIR/summary.md (a
 * table across policies) and, when gnuplot is installed, DIR/alloc.png and
 * DIR/queue.png (DIR/plot.gp makes them again).
 * Nothing written depends on the machine, the clock or addresses: the
 * same inputs give the same bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "sim/sim-int.h"

/* A policy's name as a file name: '+' and ':' become '-'. */
static void file_name(const char *policy, char *buf, size_t len) {
  snprintf(buf, len, "%s", policy);
  for (char *p = buf; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
          (*p >= '0' && *p <= '9') || *p == '_' || *p == '.'))
      *p = '-';
}

static void jstr(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      fprintf(f, "\\u%04x", *s);
    else
      fputc(*s, f);
  }
  fputc('"', f);
}

static FILE *open_in(const char *dir, const char *name, char *path,
                     size_t len) {
  snprintf(path, len, "%s/%s", dir, name);
  FILE *f = fopen(path, "we");
  if (!f)
    cogpu__seterr(-errno, "%s: %s", path, strerror(errno));
  return f;
}

static int close_ok(FILE *f, const char *path) {
  int bad = ferror(f);
  if (fclose(f) != 0 || bad)
    return cogpu__seterr(-EIO, "%s: write failed", path);
  return 0;
}

static int write_json(const char *dir, const sim_report_t *rep) {
  char path[4096];
  FILE *f = open_in(dir, "results.json", path, sizeof path);
  if (!f)
    return -errno;
  const sim_trace_t *t = rep->trace;
  fprintf(f, "{\"trace\":");
  jstr(f, rep->trace_path);
  fprintf(f, ",\"format\":");
  jstr(f, rep->format);
  fprintf(f, ",\"cluster\":");
  jstr(f, rep->cluster_desc);
  fprintf(f, ",\"nodes\":%u,\"gpus\":%u,\"seed\":%llu,", rep->cluster->nnodes,
          rep->cluster->ngpus, (unsigned long long)rep->opts->seed);
  fprintf(f,
          "\"rows\":%zu,\"jobs\":%zu,\"skipped\":%zu,\"skipped_by_reason\":{",
          t->rows, t->n, t->skipped);
  int first = 1;
  for (int i = 0; i < SIM_SKIP__COUNT; i++) {
    if (!t->skip[i])
      continue;
    fprintf(f, "%s", first ? "" : ",");
    first = 0;
    jstr(f, cogpu__sim_skip_name(i));
    fprintf(f, ":%zu", t->skip[i]);
  }
  fprintf(f, "},\"policies\":[");
  for (size_t i = 0; i < rep->npol; i++) {
    const sim_result_t *r = &rep->res[i];
    fprintf(f, "%s\n {\"policy\":", i ? "," : "");
    jstr(f, r->policy);
    fprintf(f,
            ",\"jobs\":%zu,\"gpu_jobs\":%zu,\"done\":%zu,\"unplaceable\":%zu,"
            "\"crashes\":%zu,\"guard_failures\":%zu,\"suspensions\":%zu,"
            "\"suspended_bytes\":%llu,\"suspended_peak_bytes\":%llu,"
            "\"remote_jobs\":%zu,\"abandoned\":%zu,",
            r->jobs, r->gpu_jobs, r->done, r->unplaceable, r->crashes,
            r->guard_failures, r->suspensions,
            (unsigned long long)r->suspended_bytes,
            (unsigned long long)r->suspended_peak_bytes, r->remote_jobs,
            r->abandoned);
    fprintf(f,
            "\"wait_s\":{\"mean\":%.3f,\"p50\":%.3f,\"p95\":%.3f,\"p99\":%.3f},"
            "\"jct_s\":{\"mean\":%.3f,\"p50\":%.3f,\"p95\":%.3f,\"p99\":%.3f},",
            r->wait_mean, r->wait_p50, r->wait_p95, r->wait_p99, r->jct_mean,
            r->jct_p50, r->jct_p95, r->jct_p99);
    fprintf(f,
            "\"makespan_s\":%.3f,\"gpu_alloc_ratio\":%.6f,\"mem_ratio\":%.6f,"
            "\"idle_gpus\":%.3f,\"frag_ratio\":%.6f,\"queue_mean\":%.3f,"
            "\"events\":%zu}",
            r->makespan, r->alloc_ratio, r->mem_ratio, r->idle_gpus,
            r->frag_ratio, r->queue_mean, r->events);
  }
  fprintf(f, "\n]}\n");
  return close_ok(f, path);
}

static int write_csv(const char *dir, const sim_result_t *r,
                     const sim_series_t *s, uint32_t ngpus) {
  char name[128], path[4096];
  file_name(r->policy, name, sizeof name - 4);
  strcat(name, ".csv");
  FILE *f = open_in(dir, name, path, sizeof path);
  if (!f)
    return -errno;
  fprintf(f, "time_s,alloc_gpus,alloc_ratio,idle_gpus,queued,mem_ratio,"
             "frag_gpus,suspended_bytes\n");
  for (size_t i = 0; s && i < s->n; i++) {
    const sim_sample_t *v = &s->v[i];
    fprintf(f, "%.3f,%u,%.6f,%u,%u,%.6f,%.3f,%llu\n", (double)v->t / 1000.0,
            v->alloc_gpus, ngpus ? (double)v->alloc_gpus / ngpus : 0,
            v->idle_gpus, v->queued, v->mem_ratio, v->frag,
            (unsigned long long)v->suspended);
  }
  return close_ok(f, path);
}

/* Seconds as a short human figure. */
static void dur(double s, char *buf, size_t len) {
  if (s < 120)
    snprintf(buf, len, "%.0f s", s);
  else if (s < 7200)
    snprintf(buf, len, "%.1f min", s / 60);
  else if (s < 172800)
    snprintf(buf, len, "%.1f h", s / 3600);
  else
    snprintf(buf, len, "%.1f d", s / 86400);
}

static int write_md(const char *dir, const sim_report_t *rep) {
  char path[4096];
  FILE *f = open_in(dir, "summary.md", path, sizeof path);
  if (!f)
    return -errno;
  const sim_trace_t *t = rep->trace;
  fprintf(f, "# cogpu sim: %s (%s)\n\n", rep->trace_path, rep->format);
  fprintf(f,
          "Cluster: %s (%u nodes, %u GPUs). Trace: %zu rows, %zu jobs "
          "replayed, %zu rows skipped",
          rep->cluster_desc, rep->cluster->nnodes, rep->cluster->ngpus, t->rows,
          t->n, t->skipped);
  for (int i = 0, first = 1; i < SIM_SKIP__COUNT; i++)
    if (t->skip[i]) {
      fprintf(f, "%s%zu %s", first ? " (" : ", ", t->skip[i],
              cogpu__sim_skip_name(i));
      first = 0;
    }
  fprintf(f, "%s. Seed %llu.\n\n", t->skipped ? ")" : "",
          (unsigned long long)rep->opts->seed);
  fprintf(
      f,
      "| policy | wait mean | wait p50 | wait p95 | wait p99 | JCT "
      "mean | JCT p95 | makespan | GPU alloc | mem used | frag | idle "
      "GPUs | crashes | guard fails | given up | suspended | remote | not run "
      "|\n");
  fprintf(f, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
             "|---:|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < rep->npol; i++) {
    const sim_result_t *r = &rep->res[i];
    char w[6][32];
    dur(r->wait_mean, w[0], sizeof w[0]);
    dur(r->wait_p50, w[1], sizeof w[1]);
    dur(r->wait_p95, w[2], sizeof w[2]);
    dur(r->wait_p99, w[3], sizeof w[3]);
    dur(r->jct_mean, w[4], sizeof w[4]);
    dur(r->jct_p95, w[5], sizeof w[5]);
    char ms[32];
    dur(r->makespan, ms, sizeof ms);
    fprintf(f,
            "| %s | %s | %s | %s | %s | %s | %s | %s | %.1f %% | %.1f %% | "
            "%.1f %% | %.0f | %zu | %zu | %zu | %zu (%.1f GiB) | %zu | %zu "
            "|\n",
            r->policy, w[0], w[1], w[2], w[3], w[4], w[5], ms,
            100 * r->alloc_ratio, 100 * r->mem_ratio, 100 * r->frag_ratio,
            r->idle_gpus, r->crashes, r->guard_failures, r->abandoned,
            r->suspensions, (double)r->suspended_bytes / (double)SIM_GIB,
            r->remote_jobs, r->unplaceable);
  }
  fprintf(f,
          "\nWait and JCT (job completion time, submit to end) are over "
          "GPU jobs that ran to their end; GPU alloc, mem used, frag "
          "(FGD's expected fragmentation, as a share of the GPUs) and "
          "idle GPUs are time-weighted over the run; crashes are jobs "
          "killed by out-of-memory (or by the deadlock guard) and resubmitted; "
          "\"given up\" jobs crashed more than --max-crashes times; \"not "
          "run\" jobs "
          "could never run on this cluster. See docs/simulation.md.\n");
  return close_ok(f, path);
}

/* gnuplot when installed: DIR/alloc.png (GPU allocation ratio) and
 * DIR/queue.png (jobs queued), every policy on one plot, time in the unit
 * that suits the run. Without gnuplot nothing is said (the figures are in
 * the CSVs); a gnuplot that fails is said, once. Run without a shell, so
 * any --out path works. */
static void plot(const char *dir, const sim_report_t *rep) {
  double span = 0;
  for (size_t i = 0; i < rep->npol; i++)
    if (rep->res[i].makespan > span)
      span = rep->res[i].makespan;
  double div = 1;
  const char *unit = "s";
  if (span > 4 * 86400.0)
    div = 86400, unit = "d";
  else if (span > 4 * 3600.0)
    div = 3600, unit = "h";
  else if (span > 240)
    div = 60, unit = "min";
  char path[4096];
  FILE *f = open_in(dir, "plot.gp", path, sizeof path);
  if (!f)
    return;
  static const struct {
    const char *png, *label;
    int col;
  } figs[] = {{"alloc.png", "GPU allocation ratio", 3},
              {"queue.png", "jobs queued", 5}};
  fprintf(f,
          "set terminal pngcairo size 1000,600\n"
          "set datafile separator ','\n"
          "set key outside\n"
          "set xlabel 'time (%s)'\n",
          unit);
  for (size_t k = 0; k < COGPU_ARRAY_SIZE(figs); k++) {
    fprintf(f, "set ylabel '%s'\nset output '%s'\nplot ", figs[k].label,
            figs[k].png);
    for (size_t i = 0; i < rep->npol; i++) {
      char name[128];
      file_name(rep->res[i].policy, name, sizeof name);
      fprintf(f, "%s'%s.csv' using ($1/%g):%d with lines title '%s'",
              i ? ", " : "", name, div, figs[k].col, rep->res[i].policy);
    }
    fprintf(f, "\n");
  }
  if (close_ok(f, path) != 0)
    return;
  pid_t pid = fork();
  if (pid == 0) {
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0 || chdir(dir) != 0 || dup2(nul, 0) < 0 || dup2(nul, 1) < 0 ||
        dup2(nul, 2) < 0)
      _exit(126);
    execlp("gnuplot", "gnuplot", "plot.gp", (char *)NULL);
    _exit(errno == ENOENT ? 127 : 126);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid)
    return;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
    return; /* not installed */
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fprintf(stderr,
            "cogpu: sim: gnuplot %s/plot.gp failed (status %d): no PNGs, "
            "the figures are in the CSVs\n",
            dir, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

int cogpu__sim_write(const char *dir, const sim_report_t *rep) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return cogpu__seterr(-errno, "%s: %s", dir, strerror(errno));
  int rc = write_json(dir, rep);
  for (size_t i = 0; !rc && i < rep->npol; i++)
    rc = write_csv(dir, &rep->res[i], rep->series ? &rep->series[i] : NULL,
                   rep->cluster->ngpus);
  if (!rc)
    rc = write_md(dir, rep);
  if (!rc)
    plot(dir, rep);
  return rc;
}
