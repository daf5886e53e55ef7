/*
 * metrics.c: the node's metrics in the Prometheus text exposition format
 * (0.0.4), rendered from one status snapshot, for `cogpu metrics` and
 * `cogpu exporter`. Rendering happens after the snapshot was taken, so no
 * lock of the ledger (nor the daemon's loop) is held while it runs.
 *
 * Names follow Prometheus' conventions: the cogpu_ prefix, base units
 * (_bytes, _seconds), _total for counters, ratios from 0 to 1. Every family
 * has its HELP and TYPE before its samples, and a series appears once.
 * docs/metrics.md lists them all.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Length of the well-formed UTF-8 sequence at s, or 0 if it is not one
 * (overlong forms, surrogates and code points past U+10FFFF are not). It
 * lives here, not in main.c, so that the scrape benchmark can link this
 * file without the command's main. */
size_t cli_utf8_len(const unsigned char *s) {
  size_t n = s[0] < 0x80                   ? 1
             : s[0] >= 0xf0 && s[0] < 0xf5 ? 4
             : s[0] >= 0xe0 && s[0] < 0xf0 ? 3
             : s[0] >= 0xc2 && s[0] < 0xe0 ? 2
                                           : 0;
  uint32_t cp = n == 1 ? s[0] : s[0] & (0x7f >> n);
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

/* A label value: backslash, double quote and newline escaped as the format
 * requires; bytes that are not UTF-8 and other control characters (which a
 * command line may hold) become U+FFFD, so the output is always valid
 * UTF-8 and one line per sample. Into dst, which has room for 3 bytes per
 * byte of s and a NUL; returns the length written. */
static size_t label_esc(char *dst, const char *s) {
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  char *d = dst;
  while (*p) {
    size_t n = cli_utf8_len(p);
    if (n == 0 || (n == 1 && *p < 0x20 && *p != '\n') || *p == 0x7f) {
      memcpy(d, "\xef\xbf\xbd", 3);
      d += 3;
      p += n ? n : 1;
    } else if (*p == '\\' || *p == '"' || *p == '\n') {
      *d++ = '\\';
      *d++ = *p == '\n' ? 'n' : (char)*p;
      p++;
    } else {
      memcpy(d, p, n);
      d += n;
      p += n;
    }
  }
  *d = 0;
  return (size_t)(d - dst);
}

/* The values are the snapshot's fields, each at most 128 bytes. */
static void label_value(FILE *f, const char *s) {
  size_t n = strlen(s ? s : "");
  char stack[3 * 128 + 1];
  char *b = n <= 128 ? stack : malloc(3 * n + 1);
  if (!b)
    return;
  fwrite(b, 1, label_esc(b, s), f);
  if (b != stack)
    free(b);
}

static void family(FILE *f, const char *name, const char *type,
                   const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gpu_labels(FILE *f, const cogpu_gpu_info_t *g) {
  fprintf(f, "{gpu=\"%d\",uuid=\"", g->index);
  label_value(f, g->uuid);
  fputs("\"}", f);
}

/* One per-GPU gauge: the value of each GPU. */
typedef double (*gpu_fn)(const cogpu_gpu_info_t *g);

static void gpu_gauge(FILE *f, const cogpu_status_t *st, const char *name,
                      const char *help, gpu_fn fn, bool integer) {
  family(f, name, "gauge", help);
  for (size_t i = 0; i < st->ngpus; i++) {
    fputs(name, f);
    gpu_labels(f, &st->gpus[i]);
    double v = fn(&st->gpus[i]);
    if (integer)
      fprintf(f, " %.0f\n", v);
    else
      fprintf(f, " %.9g\n", v);
  }
}

static double g_total(const cogpu_gpu_info_t *g) {
  return (double)g->total_bytes;
}
static double g_margin(const cogpu_gpu_info_t *g) {
  return (double)g->margin_bytes;
}
static double g_capacity(const cogpu_gpu_info_t *g) {
  return (double)g->capacity_bytes;
}
static double g_reserved(const cogpu_gpu_info_t *g) {
  return (double)g->reserved_bytes;
}
static double g_used(const cogpu_gpu_info_t *g) {
  return (double)g->used_bytes;
}
static double g_foreign(const cogpu_gpu_info_t *g) {
  return (double)g->foreign_bytes;
}
static double g_suspended(const cogpu_gpu_info_t *g) {
  return (double)g->suspended_bytes;
}
static double g_ratio(const cogpu_gpu_info_t *g) {
  if (g->total_bytes == 0)
    return 0;
  double r = (double)g->reserved_bytes / (double)g->total_bytes;
  return r > 1 ? 1 : r;
}
static double g_clients(const cogpu_gpu_info_t *g) {
  return (double)g->nclients;
}
static double g_queue(const cogpu_gpu_info_t *g) {
  return (double)g->nwaiting;
}
static double g_queue_bytes(const cogpu_gpu_info_t *g) {
  double sum = 0;
  for (size_t i = 0; i < g->nwaiting; i++)
    sum += (double)g->waiting[i].requested_bytes;
  return sum;
}
static double g_oldest(const cogpu_gpu_info_t *g) {
  double most = 0;
  for (size_t i = 0; i < g->nwaiting; i++)
    if (g->waiting[i].waiting_seconds > most)
      most = g->waiting[i].waiting_seconds;
  return most;
}
static double g_exclusive(const cogpu_gpu_info_t *g) {
  return g->exclusive;
}

/* --- per job ---------------------------------------------------------------
 * A series per job and GPU, labelled by the job's process (pid), job id,
 * user and command. Two entries with the same labels (a process attached
 * twice) are summed, so that no series repeats. At most max_jobs series
 * per metric and GPU, the largest reservations first; what is left out is
 * summed per GPU in cogpu_gpu_unlisted_*. */

typedef struct job_s {
  const cogpu_client_info_t *c;
  uint64_t reserved, used, peak, suspended, escaped;
  size_t gpu;
  char *labels; /* its label set, escaped once for its four series */
} job_t;

static int by_labels(const void *a, const void *b) {
  const job_t *x = a, *y = b;
  if (x->gpu != y->gpu)
    return x->gpu < y->gpu ? -1 : 1;
  if (x->c->pid != y->c->pid)
    return x->c->pid < y->c->pid ? -1 : 1;
  int r = strcmp(x->c->job_id, y->c->job_id);
  if (r == 0)
    r = strcmp(x->c->user, y->c->user);
  return r ? r : strcmp(x->c->command, y->c->command);
}

static int by_size(const void *a, const void *b) {
  const job_t *x = a, *y = b;
  if (x->gpu != y->gpu)
    return x->gpu < y->gpu ? -1 : 1;
  uint64_t sx = x->reserved + x->suspended, sy = y->reserved + y->suspended;
  if (sx != sy)
    return sx > sy ? -1 : 1;
  return x->c->pid < y->c->pid ? -1 : x->c->pid > y->c->pid;
}

/* A job's label set, escaped, in a string of its own (NULL: no memory).
 * Rendered once, not once per series: escaping every byte of 2,000 jobs'
 * command lines four times was most of a scrape's rendering. */
static char *job_labels(const cogpu_status_t *st, const job_t *j) {
  const cogpu_client_info_t *c = j->c;
  size_t cap =
      64 + 3 * (strlen(c->job_id) + strlen(c->user) + strlen(c->command));
  char *b = malloc(cap);
  if (!b)
    return NULL;
  int k = snprintf(b, cap, "{gpu=\"%d\",pid=\"%d\",job=\"",
                   st->gpus[j->gpu].index, c->pid);
  size_t n = (size_t)k;
  n += label_esc(b + n, c->job_id);
  memcpy(b + n, "\",user=\"", 8);
  n += 8;
  n += label_esc(b + n, c->user);
  memcpy(b + n, "\",command=\"", 11);
  n += 11;
  n += label_esc(b + n, c->command);
  memcpy(b + n, "\"}", 3);
  return b;
}

static void job_gauge(FILE *f, const job_t *jobs, size_t n, const char *name,
                      const char *help, size_t field) {
  family(f, name, "gauge", help);
  for (size_t i = 0; i < n; i++) {
    fputs(name, f);
    fputs(jobs[i].labels, f);
    fprintf(f, " %llu\n",
            (unsigned long long)*(const uint64_t *)((const char *)&jobs[i] +
                                                    field));
  }
}

/* The listed jobs (at most max per GPU) at the front of *out; returns how
 * many, and per GPU what the others add up to. */
static size_t collect_jobs(const cogpu_status_t *st, long max, job_t **out,
                           size_t *listed_n, uint64_t *unl_n,
                           uint64_t *unl_reserved, uint64_t *unl_used) {
  size_t total = 0;
  for (size_t g = 0; g < st->ngpus; g++)
    total += st->gpus[g].nclients;
  job_t *j = calloc(total + 1, sizeof *j);
  if (!j)
    return (size_t)-1;
  size_t n = 0;
  for (size_t g = 0; g < st->ngpus; g++)
    for (size_t i = 0; i < st->gpus[g].nclients; i++) {
      const cogpu_client_info_t *c = &st->gpus[g].clients[i];
      j[n++] = (job_t){.c = c,
                       .gpu = g,
                       .reserved = c->reserved_bytes,
                       .used = c->used_bytes,
                       .peak = c->peak_bytes,
                       .suspended = c->suspended_bytes,
                       .escaped = c->escaped_bytes};
    }
  qsort(j, n, sizeof *j, by_labels);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m > 0 && by_labels(&j[m - 1], &j[i]) == 0) {
      j[m - 1].reserved += j[i].reserved;
      j[m - 1].used += j[i].used;
      j[m - 1].peak += j[i].peak;
      j[m - 1].suspended += j[i].suspended;
      j[m - 1].escaped += j[i].escaped;
    } else {
      j[m++] = j[i];
    }
  }
  qsort(j, m, sizeof *j, by_size);
  /* Keep the first max of each GPU, moving them to the front. */
  size_t keep = 0, per = 0;
  for (size_t i = 0; i < m; i++) {
    per = i > 0 && j[i].gpu == j[i - 1].gpu ? per + 1 : 0;
    if (max < 0 || per < (size_t)max) {
      j[keep++] = j[i];
    } else {
      unl_n[j[i].gpu]++;
      unl_reserved[j[i].gpu] += j[i].reserved;
      unl_used[j[i].gpu] += j[i].used;
    }
  }
  for (size_t i = 0; i < keep; i++)
    if (!(j[i].labels = job_labels(st, &j[i]))) {
      while (i > 0)
        free(j[--i].labels);
      free(j);
      return (size_t)-1;
    }
  *out = j;
  *listed_n = keep;
  return keep;
}

static void node_counters(FILE *f, const cogpu_status_t *st) {
  const cogpu_counters_t *c = &st->counters;
  static const char *const results[COGPU_ADMIT_NRESULTS] = {
      "immediate", "waited", "timeout", "refused", "deadlock", "cancelled"};
  family(f, "cogpu_admissions_total", "counter",
         "Requests for GPU memory by how they ended: immediate (granted "
         "without queueing), waited (granted after queueing), timeout, "
         "refused (not available, not to wait), deadlock (failed by the "
         "deadlock guard), cancelled (gave up or died while queued).");
  for (int i = 0; i < COGPU_ADMIT_NRESULTS; i++)
    fprintf(f, "cogpu_admissions_total{result=\"%s\"} %llu\n", results[i],
            (unsigned long long)c->admissions[i]);
  family(f, "cogpu_wait_seconds", "histogram",
         "Time requests granted after queueing spent in the queue.");
  uint64_t cum = 0;
  for (int b = 0; b < COGPU_WAIT_BUCKETS; b++) {
    cum += c->wait_count[b];
    if (c->wait_le_ms[b] == UINT64_MAX)
      fprintf(f, "cogpu_wait_seconds_bucket{le=\"+Inf\"} %llu\n",
              (unsigned long long)cum);
    else
      fprintf(f, "cogpu_wait_seconds_bucket{le=\"%.9g\"} %llu\n",
              (double)c->wait_le_ms[b] / 1000.0, (unsigned long long)cum);
  }
  fprintf(f, "cogpu_wait_seconds_sum %.9g\n", c->wait_sum_seconds);
  fprintf(f, "cogpu_wait_seconds_count %llu\n", (unsigned long long)cum);
  family(f, "cogpu_deadlock_guard_total", "counter",
         "Deadlocks the guard broke (every job holding memory on a GPU "
         "waited for more there), by action: failed a request, or "
         "suspended a job.");
  fprintf(f, "cogpu_deadlock_guard_total{action=\"failed\"} %llu\n",
          (unsigned long long)c->admissions[COGPU_ADMIT_DEADLOCK]);
  fprintf(f, "cogpu_deadlock_guard_total{action=\"suspended\"} %llu\n",
          (unsigned long long)c->deadlock_suspensions);
  family(f, "cogpu_suspensions_total", "counter",
         "Jobs whose GPU memory was moved to host memory.");
  fprintf(f, "cogpu_suspensions_total %llu\n",
          (unsigned long long)c->suspensions);
  family(f, "cogpu_suspension_failures_total", "counter",
         "Suspensions the driver failed (the job stayed on its GPU).");
  fprintf(f, "cogpu_suspension_failures_total %llu\n",
          (unsigned long long)c->suspend_failures);
  family(f, "cogpu_resumes_total", "counter",
         "Suspended jobs brought back to their GPU.");
  fprintf(f, "cogpu_resumes_total %llu\n", (unsigned long long)c->resumes);
  family(f, "cogpu_resume_failures_total", "counter",
         "Resumes the driver failed.");
  fprintf(f, "cogpu_resume_failures_total %llu\n",
          (unsigned long long)c->resume_failures);
  family(f, "cogpu_checkpoint_bytes_total", "counter",
         "GPU memory the checkpoint copies of suspensions and resumes "
         "moved, out and back.");
  fprintf(f, "cogpu_checkpoint_bytes_total %llu\n",
          (unsigned long long)c->checkpoint_bytes);
  family(f, "cogpu_checkpoint_seconds_total", "counter",
         "Time those copies took: bytes over seconds is the node's "
         "checkpoint bandwidth as it happened.");
  fprintf(f, "cogpu_checkpoint_seconds_total %.9g\n", c->checkpoint_seconds);
  family(f, "cogpu_suspended_bytes", "gauge",
         "GPU memory of suspended jobs, now in host memory (node total).");
  fprintf(f, "cogpu_suspended_bytes %llu\n",
          (unsigned long long)st->suspended_bytes);
}

int cli_metrics_render(const cogpu_status_t *st, const cli_metrics_opts_t *o,
                       char **out, size_t *len) {
  char *buf = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&buf, &size);
  if (!f)
    return -ENOMEM;
  family(f, "cogpu_build_info", "gauge",
         "Always 1; the version of cogpu that rendered these metrics.");
  fprintf(f, "cogpu_build_info{version=\"%s\"} 1\n", COGPU_VERSION_STRING);
  family(f, "cogpu_up", "gauge",
         "1 if the node's state could be read for this scrape, else 0.");
  fprintf(f, "cogpu_up %d\n", st != NULL);
  if (o->status_seconds >= 0) {
    family(f, "cogpu_status_duration_seconds", "gauge",
           "Time taken to read the node's state for this scrape.");
    fprintf(f, "cogpu_status_duration_seconds %.9g\n", o->status_seconds);
  }
  int rc = 0;
  if (st) {
    family(f, "cogpu_policy_info", "gauge",
           "Always 1; the node's waiting policy.");
    fputs("cogpu_policy_info{policy=\"", f);
    label_value(f, st->policy);
    fputs("\"} 1\n", f);
    family(f, "cogpu_gpu_info", "gauge", "Always 1; each GPU's name.");
    for (size_t i = 0; i < st->ngpus; i++) {
      fprintf(f, "cogpu_gpu_info{gpu=\"%d\",uuid=\"", st->gpus[i].index);
      label_value(f, st->gpus[i].uuid);
      fputs("\",name=\"", f);
      label_value(f, st->gpus[i].name);
      fputs("\"} 1\n", f);
    }
    static const struct {
      const char *name, *help;
      gpu_fn fn;
      bool integer;
    } gg[] = {
        {"cogpu_gpu_total_bytes", "GPU memory of the device.", g_total, 1},
        {"cogpu_gpu_margin_bytes", "GPU memory kept free (margin).", g_margin,
         1},
        {"cogpu_gpu_foreign_bytes",
         "GPU memory held by processes cogpu does not know.", g_foreign, 1},
        {"cogpu_gpu_capacity_bytes",
         "GPU memory cogpu may grant: total less margin and foreign.",
         g_capacity, 1},
        {"cogpu_gpu_reserved_bytes", "GPU memory reserved by jobs.", g_reserved,
         1},
        {"cogpu_gpu_used_bytes",
         "GPU memory jobs hold now, as the preload library counted it.", g_used,
         1},
        {"cogpu_gpu_suspended_bytes",
         "GPU memory of jobs suspended from this GPU, now in host memory.",
         g_suspended, 1},
        {"cogpu_gpu_reserved_ratio", "Reserved bytes over total bytes (0-1).",
         g_ratio, 0},
        {"cogpu_gpu_clients", "Jobs listed on the GPU.", g_clients, 1},
        {"cogpu_gpu_exclusive", "1 while one job uses the GPU exclusively.",
         g_exclusive, 1},
        {"cogpu_gpu_queue_length",
         "Requests waiting that could be served on this GPU (a request for "
         "any GPU counts on each GPU it fits).",
         g_queue, 1},
        {"cogpu_gpu_queue_bytes", "GPU memory the waiting requests ask for.",
         g_queue_bytes, 1},
        {"cogpu_gpu_oldest_wait_seconds",
         "How long the oldest waiting request has waited (0: none).", g_oldest,
         0},
    };
    for (size_t i = 0; i < COGPU_ARRAY_SIZE(gg); i++)
      gpu_gauge(f, st, gg[i].name, gg[i].help, gg[i].fn, gg[i].integer);
    job_t *jobs = NULL;
    size_t n = 0, ng = st->ngpus ? st->ngpus : 1;
    uint64_t *unl = calloc(3 * ng, sizeof *unl);
    if (!unl || collect_jobs(st, o->max_jobs, &jobs, &n, unl, unl + ng,
                             unl + 2 * ng) == (size_t)-1) {
      rc = -ENOMEM;
    } else {
      job_gauge(f, jobs, n, "cogpu_job_reserved_bytes",
                "GPU memory a job has reserved on the GPU.",
                offsetof(job_t, reserved));
      job_gauge(f, jobs, n, "cogpu_job_used_bytes",
                "GPU memory a job's processes hold on the GPU now (preload "
                "library's count).",
                offsetof(job_t, used));
      job_gauge(f, jobs, n, "cogpu_job_peak_bytes",
                "The most GPU memory a job's processes held at once.",
                offsetof(job_t, peak));
      job_gauge(f, jobs, n, "cogpu_job_suspended_bytes",
                "GPU memory of a suspended job, now in host memory.",
                offsetof(job_t, suspended));
      job_gauge(f, jobs, n, "cogpu_job_escaped_bytes",
                "GPU memory held by a job's processes outside the preload "
                "library (NVML's figure; counted as foreign).",
                offsetof(job_t, escaped));
      static const char *const unl_names[3][2] = {
          {"cogpu_gpu_unlisted_jobs",
           "Jobs on the GPU left out of the cogpu_job_* series (--max-jobs)."},
          {"cogpu_gpu_unlisted_reserved_bytes",
           "GPU memory reserved by the jobs left out of the per-job series."},
          {"cogpu_gpu_unlisted_used_bytes",
           "GPU memory used by the jobs left out of the per-job series."}};
      for (int k = 0; k < 3; k++) {
        family(f, unl_names[k][0], "gauge", unl_names[k][1]);
        for (size_t g = 0; g < st->ngpus; g++) {
          fputs(unl_names[k][0], f);
          gpu_labels(f, &st->gpus[g]);
          fprintf(f, " %llu\n", (unsigned long long)unl[k * ng + g]);
        }
      }
    }
    for (size_t i = 0; jobs && i < n; i++)
      free(jobs[i].labels);
    free(jobs);
    free(unl);
    node_counters(f, st);
  }
  if (fclose(f) != 0 && rc == 0)
    rc = -ENOMEM;
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  *len = size;
  return 0;
}
