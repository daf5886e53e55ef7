/*
 * trace.c: the simulator's readers: five trace formats and the node list
 * (docs/simulation.md has every mapping table and the reasons below).
 *
 * A malformed row is never silently dropped: it is reported as FILE:LINE:
 * why (the first SIM_REPORT_MAX of them; the rest are counted), counted by
 * reason, and skipped, or fatal with --strict. Reading is one pass with
 * getline; memory is linear in the trace.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "internal.h"
#include "sim/sim-int.h"

#define SIM_REPORT_MAX 20

static const char *const format_names[SIM_FMT__COUNT] = {
    "alibaba", "philly", "pollux", "sacct", "cogpu"};

static const char *const skip_names[SIM_SKIP__COUNT] = {
    "wrong number of fields", "not a number", "out of range",
    "ends before it starts",  "never ran",    "unknown model or application",
    "not a job record"};

int cogpu__sim_format(const char *name) {
  for (int i = 0; i < SIM_FMT__COUNT; i++)
    if (strcmp(name, format_names[i]) == 0)
      return i;
  return -1;
}

const char *cogpu__sim_format_name(int f) {
  return f >= 0 && f < SIM_FMT__COUNT ? format_names[f] : "?";
}

const char *cogpu__sim_skip_name(int why) {
  return why >= 0 && why < SIM_SKIP__COUNT ? skip_names[why] : "?";
}

void cogpu__sim_opts_default(sim_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1;
  o->time_unit = 60000; /* philly: a tick is a minute (docs) */
  o->node_policy = COGPU_POLICY_FIFO;
  o->mmu_max_age = 60000;
  o->guard_delay = 200;
  o->margin_pct = 0;
  o->shares = 4;
  o->crash_after = 60000;
  o->max_crashes = 3;
  o->time_scale = 1.0;
  o->susp_gibps = 2.4;
  o->resume_gibps = 5.3;
  o->host_reserve_mib = 4096;
  o->remote_slowdown = 1.09;
  o->remote_links = 4;
}

/* --- Model memory ----------------------------------------------------------
 */

/* The alibaba node list's models. T4, A10, P100 and the V100s from their
 * public specifications (P100: the 16 GB part; the trace does not say).
 * G2 and G3 are undisclosed: G2's node shape (8 GPUs, 96 cores, 384 GiB)
 * is a V100-32GB server's, G3's (8 GPUs, 128 cores, 768 GiB) an A100-80GB
 * server's; both are guesses, overridable with --gpu-model-mem. */
static const struct {
  const char *name;
  uint64_t gib;
} model_table[] = {{"T4", 16},      {"A10", 24}, {"P100", 16}, {"V100M16", 16},
                   {"V100M32", 32}, {"G2", 32},  {"G3", 80}};

uint64_t cogpu__sim_model_mem(const sim_opts_t *o, const char *model) {
  for (uint32_t i = 0; o && i < o->nmodel_mem; i++)
    if (strcmp(o->model_mem[i].name, model) == 0)
      return o->model_mem[i].bytes;
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(model_table); i++)
    if (strcmp(model_table[i].name, model) == 0)
      return model_table[i].gib * SIM_GIB;
  return 0;
}

int cogpu__sim_parse_model_mem(sim_opts_t *o, const char *s) {
  char buf[256];
  if (strlen(s) >= sizeof buf)
    return cogpu__seterr(-EINVAL, "--gpu-model-mem: too long");
  strcpy(buf, s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq || eq == tok || (size_t)(eq - tok) >= sizeof o->model_mem[0].name)
      return cogpu__seterr(-EINVAL, "--gpu-model-mem: '%s' is not MODEL=SIZE",
                           tok);
    *eq = 0;
    uint64_t b;
    int rc = cogpu__parse_size("--gpu-model-mem", eq + 1, &b);
    if (rc)
      return rc;
    if (b == 0 || b > SIM_MAX_BYTES)
      return cogpu__seterr(-EINVAL, "--gpu-model-mem: %s is not 1 byte to 1P",
                           tok);
    if (o->nmodel_mem >= SIM_MAX_MODELS)
      return cogpu__seterr(-EINVAL, "--gpu-model-mem: too many models");
    sim_model_mem_t *m = &o->model_mem[o->nmodel_mem++];
    snprintf(m->name, sizeof m->name, "%s", tok);
    m->bytes = b;
  }
  return 0;
}

/* --- Reading rows ----------------------------------------------------------
 */

typedef struct rd_s {
  const char *path;
  FILE *f, *err;
  char *line;
  size_t cap;
  uint32_t lineno;
  sim_trace_t *t;
  const sim_opts_t *o;
  size_t reported;
  int fatal; /* --strict: the first bad row */
} rd_t;

#define MAX_FIELDS 32

static void rd_bad(rd_t *r, int why, const char *fmt, ...) COGPU_PRINTF(3, 4);
static void rd_bad(rd_t *r, int why, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (r->t) {
    if (r->t->skip[why]++ == 0)
      r->t->first_skip_line[why] = r->lineno;
    r->t->skipped++;
  }
  if (r->o && r->o->strict) {
    cogpu__seterr(-EINVAL, "%s:%u: %s (%s)", r->path, r->lineno, msg,
                  skip_names[why]);
    r->fatal = -EINVAL;
    return;
  }
  if (r->err && r->reported++ < SIM_REPORT_MAX)
    fprintf(r->err, "cogpu: %s:%u: %s (%s): skipped\n", r->path, r->lineno, msg,
            skip_names[why]);
}

/* Next line without its end; false at the end of the file. */
static bool rd_next(rd_t *r) {
  ssize_t n = getline(&r->line, &r->cap, r->f);
  if (n < 0)
    return false;
  r->lineno++;
  while (n > 0 && (r->line[n - 1] == '\n' || r->line[n - 1] == '\r'))
    r->line[--n] = 0;
  return true;
}

/* Splits line at sep in place; returns the number of fields (at most max;
 * more than max counts as max + 1). */
static int split(char *line, char sep, char **f, int max) {
  int n = 0;
  char *p = line;
  for (;;) {
    if (n == max)
      return max + 1;
    f[n++] = p;
    char *q = strchr(p, sep);
    if (!q)
      return n;
    *q = 0;
    p = q + 1;
  }
}

static int col(char **hdr, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(hdr[i], name) == 0)
      return i;
  return -1;
}

/* A whole decimal number (optionally signed, or with a fraction if frac). */
static bool num_i64(const char *s, int64_t *out) {
  if (!*s)
    return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end)
    return false;
  *out = v;
  return true;
}

static bool num_dbl(const char *s, double *out) {
  if (!*s)
    return false;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || v != v)
    return false;
  *out = v;
  return true;
}

/* v units of `unit` ms, if that is 0 to SIM_MAX_MS (no overflow on the
 * way: a trace's numbers are not trusted). */
static bool to_ms(int64_t v, int64_t unit, int64_t *out) {
  int64_t x;
  if (v < 0 || unit <= 0 || __builtin_mul_overflow(v, unit, &x) ||
      x > SIM_MAX_MS)
    return false;
  *out = x;
  return true;
}

/* The same for a number of seconds read as a double (cogpu's JSON). */
static bool dbl_ms(double sec, double unit, int64_t *out) {
  double x = sec * unit;
  if (!(x >= 0) || x > (double)SIM_MAX_MS)
    return false;
  *out = (int64_t)x;
  return true;
}

static int rd_open(rd_t *r, const char *path, sim_trace_t *t,
                   const sim_opts_t *o, FILE *err) {
  memset(r, 0, sizeof *r);
  r->path = path;
  r->t = t;
  r->o = o;
  r->err = err;
  r->f = fopen(path, "re");
  if (!r->f)
    return cogpu__seterr(-errno, "%s: %s", path, strerror(errno));
  /* A device or a pipe (/dev/zero) would be read for ever: as with the
   * config files, only a regular file. */
  struct stat st;
  if (fstat(fileno(r->f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(r->f);
    r->f = NULL;
    return cogpu__seterr(-EINVAL, "%s: not a regular file", path);
  }
  return 0;
}

static int rd_close(rd_t *r, int rc) {
  if (r->f)
    fclose(r->f);
  free(r->line);
  if (rc == 0 && r->fatal)
    rc = r->fatal;
  if (rc == 0 && r->err && r->reported > SIM_REPORT_MAX)
    fprintf(r->err, "cogpu: %s: %zu more malformed rows not shown\n", r->path,
            r->reported - SIM_REPORT_MAX);
  return rc;
}

/* The header's fields, or -EINVAL naming the ones missing. */
static int rd_header(rd_t *r, char sep, char **hdr, int *nh,
                     const char *const *need, int *idx, int nneed) {
  if (!rd_next(r))
    return cogpu__seterr(-EINVAL, "%s: empty file (no header)", r->path);
  *nh = split(r->line, sep, hdr, MAX_FIELDS);
  if (*nh > MAX_FIELDS)
    return cogpu__seterr(-EINVAL, "%s:1: too many columns", r->path);
  for (int i = 0; i < nneed; i++) {
    idx[i] = col(hdr, *nh, need[i]);
    if (idx[i] < 0)
      return cogpu__seterr(-EINVAL, "%s:1: no column '%s' in the header",
                           r->path, need[i]);
  }
  return 0;
}

int cogpu__sim_trace_add(sim_trace_t *t, const sim_job_t *j,
                         const uint64_t *tl) {
  if (t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 1024;
    sim_job_t *nj = realloc(t->jobs, nc * sizeof *nj);
    if (!nj)
      return cogpu__seterr(-ENOMEM, "out of memory reading the trace");
    t->jobs = nj;
    t->cap = nc;
  }
  sim_job_t *d = &t->jobs[t->n++];
  *d = *j;
  if (j->tl_n) {
    if (t->ntl + j->tl_n > t->captl) {
      size_t nc = t->captl ? t->captl * 2 : 4096;
      while (nc < t->ntl + j->tl_n)
        nc *= 2;
      uint64_t *nt = realloc(t->tl, nc * sizeof *nt);
      if (!nt)
        return cogpu__seterr(-ENOMEM, "out of memory reading the trace");
      t->tl = nt;
      t->captl = nc;
    }
    memcpy(t->tl + t->ntl, tl, j->tl_n * sizeof *tl);
    d->tl_off = t->ntl;
    t->ntl += j->tl_n;
  }
  return 0;
}

static int cmp_submit(const void *a, const void *b) {
  const sim_job_t *x = a, *y = b;
  if (x->submit != y->submit)
    return x->submit < y->submit ? -1 : 1;
  /* Stable: the trace's own order (its line). */
  return x->line < y->line ? -1 : x->line > y->line;
}

void cogpu__sim_trace_sort(sim_trace_t *t) {
  if (t->n > 1)
    qsort(t->jobs, t->n, sizeof t->jobs[0], cmp_submit);
}

void cogpu__sim_trace_free(sim_trace_t *t) {
  free(t->jobs);
  free(t->tl);
  for (uint32_t i = 0; i < t->nspec; i++)
    free(t->spec_str[i]);
  free(t->spec_str);
  free(t->spec_mask);
  memset(t, 0, sizeof *t);
}

/* --- alibaba: openb_pod_list_*.csv ---------------------------------------- */

static int qos_prio(const char *q) {
  if (!strcmp(q, "Guaranteed"))
    return 3;
  if (!strcmp(q, "LS"))
    return 2;
  if (!strcmp(q, "Burstable"))
    return 1;
  return 0; /* BE, and anything else */
}

#define SIM_MAX_SPECS 4096

/* The id (1-based) of gpu_spec `spec` in t, added if new; its models
 * become a mask over t->spec_models. 0: it names no model (no
 * constraint, as in the artifact); -1: too many models or specs;
 * -ENOMEM. */
static int spec_id(sim_trace_t *t, const char *spec) {
  for (uint32_t i = 0; i < t->nspec; i++)
    if (strcmp(t->spec_str[i], spec) == 0)
      return (int)i + 1;
  char buf[512];
  if (strlen(spec) >= sizeof buf)
    return -1;
  strcpy(buf, spec);
  uint32_t mask = 0;
  for (char *sv = NULL, *m = strtok_r(buf, "|", &sv); m;
       m = strtok_r(NULL, "|", &sv)) {
    uint32_t k = 0;
    while (k < t->nspec_models && strcmp(t->spec_models[k], m) != 0)
      k++;
    if (k == t->nspec_models) {
      if (k == SIM_MAX_MODELS || strlen(m) >= sizeof t->spec_models[0])
        return -1;
      strcpy(t->spec_models[t->nspec_models++], m);
    }
    mask |= 1u << k;
  }
  if (!mask)
    return 0;
  if (t->nspec >= SIM_MAX_SPECS)
    return -1;
  /* Specs naming the same models differently ("A|B|B") stay apart: FGD's
   * typical pods key on the spec as written. */
  char **ns = realloc(t->spec_str, (t->nspec + 1) * sizeof *ns);
  if (ns)
    t->spec_str = ns;
  uint32_t *nm = ns ? realloc(t->spec_mask, (t->nspec + 1) * sizeof *nm) : NULL;
  if (nm)
    t->spec_mask = nm;
  char *str = nm ? strdup(spec) : NULL;
  if (!str)
    return -ENOMEM;
  t->spec_str[t->nspec] = str;
  t->spec_mask[t->nspec++] = mask;
  return (int)t->nspec;
}

void cogpu__sim_spec_bits(const sim_trace_t *t, const sim_cluster_t *c,
                          uint32_t *bits) {
  for (uint32_t m = 0; m < c->nmodels; m++) {
    bits[m] = 0;
    for (uint32_t k = 0; k < t->nspec_models; k++)
      if (strcmp(c->models[m], t->spec_models[k]) == 0)
        bits[m] = 1u << k;
  }
}

/* Times in the trace: seconds up to SIM_MAX_MS / 1000. */
static bool sec_ok(int64_t v) {
  return v >= 0 && v <= SIM_MAX_MS / 1000;
}

static int read_alibaba(rd_t *r) {
  static const char *const need[] = {"cpu_milli", "memory_mib", "num_gpu",
                                     "gpu_milli"};
  /* Optional: FGD's multi-GPU pod lists have only the four above (and the
   * name); its gpuspec lists add gpu_spec. */
  static const char *const opt[] = {"creation_time", "deletion_time",
                                    "scheduled_time", "qos", "gpu_spec"};
  enum { CPU, MEM, NGPU, MILLI, CREATE, DELETE, SCHED, QOS, SPEC, NCOL };
  char *hdr[MAX_FIELDS + 1], *f[MAX_FIELDS + 1];
  int idx[NCOL], nh;
  int rc = rd_header(r, ',', hdr, &nh, need, idx, 4);
  if (rc)
    return rc;
  for (int k = CREATE; k < NCOL; k++)
    idx[k] = col(hdr, nh, opt[k - CREATE]);
  int ntimes = (idx[CREATE] >= 0) + (idx[DELETE] >= 0) + (idx[SCHED] >= 0);
  if (ntimes != 0 && ntimes != 3)
    for (int k = CREATE; k <= SCHED; k++)
      if (idx[k] < 0)
        return cogpu__seterr(-EINVAL, "%s:1: no column '%s' in the header",
                             r->path, opt[k - CREATE]);
  r->t->frac = true;
  r->t->timeless = ntimes == 0;
  while (!r->fatal && rd_next(r)) {
    if (!*r->line)
      continue;
    r->t->rows++;
    int n = split(r->line, ',', f, MAX_FIELDS);
    if (n != nh) {
      rd_bad(r, SIM_SKIP_COLUMNS, "%d fields, the header has %d", n, nh);
      continue;
    }
    int64_t v[NCOL] = {0};
    bool ok = true;
    for (int k = 0; k <= SCHED && ok; k++) {
      if (idx[k] < 0)
        continue;
      if (k == SCHED && !*f[idx[k]]) {
        v[k] = -1; /* never scheduled (Pending) */
        continue;
      }
      if (!num_i64(f[idx[k]], &v[k])) {
        rd_bad(r, SIM_SKIP_NUMBER, "%s '%s'",
               k < CREATE ? need[k] : opt[k - CREATE], f[idx[k]]);
        ok = false;
      }
    }
    if (!ok)
      continue;
    if (v[CPU] < 0 || v[CPU] > UINT32_MAX || v[MEM] < 0 ||
        v[MEM] > (int64_t)1 << 40 || v[NGPU] < 0 || v[NGPU] > 1024 ||
        v[MILLI] < 0 || v[MILLI] > 1000 || (v[NGPU] > 0 && v[MILLI] == 0)) {
      rd_bad(r, SIM_SKIP_RANGE,
             "cpu_milli %lld, memory_mib %lld, num_gpu %lld, gpu_milli %lld",
             (long long)v[CPU], (long long)v[MEM], (long long)v[NGPU],
             (long long)v[MILLI]);
      continue;
    }
    if (!sec_ok(v[CREATE]) || !sec_ok(v[DELETE]) ||
        (v[SCHED] != -1 && !sec_ok(v[SCHED]))) {
      rd_bad(r, SIM_SKIP_RANGE,
             "creation_time %lld, deletion_time %lld, scheduled_time %lld "
             "(0 to %lld s)",
             (long long)v[CREATE], (long long)v[DELETE], (long long)v[SCHED],
             (long long)(SIM_MAX_MS / 1000));
      continue;
    }
    /* A pod runs from when it was bound (or, never bound, from its
     * creation: the demand it expressed) to its deletion. */
    int64_t from = v[SCHED] >= 0 ? v[SCHED] : v[CREATE];
    if (v[DELETE] < from || from < v[CREATE]) {
      rd_bad(r, SIM_SKIP_ORDER, "deletion_time %lld before %s %lld",
             (long long)v[DELETE],
             v[SCHED] >= 0 ? "scheduled_time" : "creation_time",
             (long long)from);
      continue;
    }
    int spec = 0;
    if (idx[SPEC] >= 0 && *f[idx[SPEC]]) {
      spec = spec_id(r->t, f[idx[SPEC]]);
      if (spec == -ENOMEM)
        return cogpu__seterr(-ENOMEM, "out of memory reading the trace");
      if (spec < 0) {
        rd_bad(r, SIM_SKIP_RANGE,
               "gpu_spec '%.64s': too long, or past %d models or %d "
               "distinct specs",
               f[idx[SPEC]], SIM_MAX_MODELS, SIM_MAX_SPECS);
        continue;
      }
    }
    sim_job_t j = {.submit = v[CREATE] * 1000, /* sec_ok: no overflow */
                   .dur = (v[DELETE] - from) * 1000,
                   .milli = (uint32_t)(v[NGPU] ? v[MILLI] : 0),
                   .ngpus = (uint32_t)v[NGPU],
                   .prio = idx[QOS] >= 0 ? qos_prio(f[idx[QOS]]) : 0,
                   .line = r->lineno,
                   .cpu_milli = (uint32_t)v[CPU],
                   .host_mib = (uint64_t)v[MEM],
                   .spec = (uint16_t)spec};
    rc = cogpu__sim_trace_add(r->t, &j, NULL);
    if (rc)
      return rc;
  }
  return 0;
}

/* --- philly: the Chronus artifact's trace_job_Philly_*.csv ---------------- */

/* Per-GPU memory of each model (the trace has none): our assumption of a
 * training run's footprint at common batch sizes, documented in
 * docs/simulation.md. */
static const struct {
  const char *name;
  uint64_t gib;
} philly_models[] = {{"alexnet", 4},
                     {"vgg16", 10},
                     {"resnet101", 10},
                     {"mobilenet_v2", 6},
                     {"inception_v3", 8}};

static int read_philly(rd_t *r) {
  static const char *const need[] = {"num_gpu", "submit_time", "duration",
                                     "model_name", "best_effort"};
  enum { NGPU, SUBMIT, DUR, MODEL, BEST, NNEED };
  char *hdr[MAX_FIELDS + 1], *f[MAX_FIELDS + 1];
  int idx[NNEED], nh;
  int rc = rd_header(r, ',', hdr, &nh, need, idx, NNEED);
  if (rc)
    return rc;
  while (!r->fatal && rd_next(r)) {
    if (!*r->line)
      continue;
    r->t->rows++;
    int n = split(r->line, ',', f, MAX_FIELDS);
    if (n != nh) {
      rd_bad(r, SIM_SKIP_COLUMNS, "%d fields, the header has %d", n, nh);
      continue;
    }
    int64_t g, s, d, be;
    if (!num_i64(f[idx[NGPU]], &g) || !num_i64(f[idx[SUBMIT]], &s) ||
        !num_i64(f[idx[DUR]], &d) || !num_i64(f[idx[BEST]], &be)) {
      rd_bad(r, SIM_SKIP_NUMBER,
             "num_gpu '%s', submit_time '%s', "
             "duration '%s', best_effort '%s'",
             f[idx[NGPU]], f[idx[SUBMIT]], f[idx[DUR]], f[idx[BEST]]);
      continue;
    }
    int64_t s_ms, d_ms;
    if (g < 0 || g > 1024 || !to_ms(s, r->o->time_unit, &s_ms) ||
        !to_ms(d, r->o->time_unit, &d_ms)) {
      rd_bad(r, SIM_SKIP_RANGE,
             "num_gpu %lld, submit_time %lld, duration %lld (times 0 to "
             "%lld ms)",
             (long long)g, (long long)s, (long long)d, (long long)SIM_MAX_MS);
      continue;
    }
    uint64_t mem = 0;
    for (size_t k = 0; k < COGPU_ARRAY_SIZE(philly_models); k++)
      if (!strcmp(philly_models[k].name, f[idx[MODEL]]))
        mem = philly_models[k].gib * SIM_GIB;
    if (!mem) {
      rd_bad(r, SIM_SKIP_UNKNOWN, "model_name '%s'", f[idx[MODEL]]);
      continue;
    }
    sim_job_t j = {.submit = s_ms,
                   .dur = d_ms,
                   .mem = mem,
                   .ngpus = (uint32_t)g,
                   .prio = be ? 0 : 1, /* SLO jobs before best effort */
                   .line = r->lineno};
    rc = cogpu__sim_trace_add(r->t, &j, NULL);
    if (rc)
      return rc;
  }
  return 0;
}

/* --- pollux: adaptdl's workload-N.csv ------------------------------------- */

/* The workloads have no durations: the GPU-hours of work each
 * application's job needs (split evenly over its replicas: perfect
 * scaling) and its memory per replica are our assumptions
 * (docs/simulation.md). */
static const struct {
  const char *name;
  double gpu_hours;
  uint64_t gib;
} pollux_apps[] = {{"cifar10", 0.5, 2},    {"ncf", 0.5, 2},
                   {"deepspeech2", 4, 10}, {"bert", 4, 12},
                   {"yolov3", 30, 12},     {"imagenet", 100, 12}};

static int read_pollux(rd_t *r) {
  static const char *const need[] = {"time", "application", "num_replicas"};
  enum { TIME, APP, NREP, NNEED };
  char *hdr[MAX_FIELDS + 1], *f[MAX_FIELDS + 1];
  int idx[NNEED], nh;
  int rc = rd_header(r, ',', hdr, &nh, need, idx, NNEED);
  if (rc)
    return rc;
  while (!r->fatal && rd_next(r)) {
    if (!*r->line)
      continue;
    r->t->rows++;
    int n = split(r->line, ',', f, MAX_FIELDS);
    if (n != nh) {
      rd_bad(r, SIM_SKIP_COLUMNS, "%d fields, the header has %d", n, nh);
      continue;
    }
    int64_t tm, nr;
    if (!num_i64(f[idx[TIME]], &tm) || !num_i64(f[idx[NREP]], &nr)) {
      rd_bad(r, SIM_SKIP_NUMBER, "time '%s', num_replicas '%s'", f[idx[TIME]],
             f[idx[NREP]]);
      continue;
    }
    int64_t tm_ms;
    if (!to_ms(tm, 1000, &tm_ms) || nr < 1 || nr > 1024) {
      rd_bad(r, SIM_SKIP_RANGE, "time %lld, num_replicas %lld", (long long)tm,
             (long long)nr);
      continue;
    }
    int a = -1;
    for (size_t k = 0; k < COGPU_ARRAY_SIZE(pollux_apps); k++)
      if (!strcmp(pollux_apps[k].name, f[idx[APP]]))
        a = (int)k;
    if (a < 0) {
      rd_bad(r, SIM_SKIP_UNKNOWN, "application '%s'", f[idx[APP]]);
      continue;
    }
    sim_job_t j = {
        .submit = tm_ms,
        .dur = (int64_t)(pollux_apps[a].gpu_hours * 3600e3 / (double)nr),
        .mem = pollux_apps[a].gib * SIM_GIB,
        .ngpus = (uint32_t)nr,
        .line = r->lineno};
    rc = cogpu__sim_trace_add(r->t, &j, NULL);
    if (rc)
      return rc;
  }
  return 0;
}

/* --- sacct: a `sacct -P` dump ------------------------------------------- */

/* 2024-05-01T12:00:00 as seconds (UTC: only differences matter). */
static bool sacct_time(const char *s, int64_t *out) {
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  const char *e = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
  if (!e || *e)
    return false;
  *out = (int64_t)timegm(&tm);
  return true;
}

/* The value of key (e.g. "gres/gpu") in a TRES list "cpu=4,gres/gpu=2",
 * or of its first typed variant ("gres/gpu:a100=2"); NULL if absent. */
static const char *tres_get(const char *tres, const char *key, char *buf,
                            size_t len) {
  size_t kl = strlen(key);
  const char *typed = NULL;
  for (const char *p = tres; p && *p;) {
    const char *next = strchr(p, ',');
    size_t n = next ? (size_t)(next - p) : strlen(p);
    if (n > kl && !strncmp(p, key, kl) && (p[kl] == '=' || p[kl] == ':')) {
      const char *eq = memchr(p, '=', n);
      if (eq) {
        size_t vl = n - (size_t)(eq + 1 - p);
        if (vl >= len)
          vl = len - 1;
        if (p[kl] == '=' || !typed) {
          memcpy(buf, eq + 1, vl);
          buf[vl] = 0;
          if (p[kl] == '=')
            return buf;
          typed = buf;
        }
      }
    }
    p = next ? next + 1 : NULL;
  }
  return typed;
}

/* The largest value of "key": N in cogpu's AdminComment JSON; false if
 * one is not a whole number of bytes up to SIM_MAX_BYTES (1e300 is not
 * 1, nor a huge number the largest). */
static bool json_max(const char *s, const char *key, uint64_t *out) {
  uint64_t best = 0;
  size_t kl = strlen(key);
  for (const char *p = strstr(s, key); p; p = strstr(p + kl, key)) {
    const char *q = p + kl;
    while (*q == ' ' || *q == ':')
      q++;
    char *end;
    errno = 0;
    uint64_t v = strtoull(q, &end, 10);
    if (errno || end == q || *q == '-' || v > SIM_MAX_BYTES ||
        (*end && !strchr(",}] ", *end)))
      return false;
    best = v > best ? v : best;
  }
  *out = best;
  return true;
}

static int read_sacct(rd_t *r) {
  static const char *const need[] = {"JobID", "Submit",    "Start",
                                     "End",   "AllocTRES", "ReqTRES"};
  enum { ID, SUBMIT, START, END, ALLOC, REQ, NNEED };
  char *hdr[MAX_FIELDS + 1], *f[MAX_FIELDS + 1];
  int idx[NNEED], nh;
  int rc = rd_header(r, '|', hdr, &nh, need, idx, NNEED);
  if (rc)
    return rc;
  int adm = col(hdr, nh, "AdminComment");
  while (!r->fatal && rd_next(r)) {
    if (!*r->line)
      continue;
    r->t->rows++;
    int n = split(r->line, '|', f, MAX_FIELDS);
    /* AdminComment is free text: if it is the last column, a '|' in it
     * makes more fields, which belong to it. */
    if (n > nh && adm == nh - 1 && n <= MAX_FIELDS) {
      for (int k = nh; k < n; k++)
        f[k][-1] = '|';
      n = nh;
    }
    if (n != nh) {
      rd_bad(r, SIM_SKIP_COLUMNS, "%d fields, the header has %d", n, nh);
      continue;
    }
    int64_t sub, st, en;
    if (!sacct_time(f[idx[SUBMIT]], &sub) || sub < 0 ||
        sub > SIM_MAX_MS / 1000) { /* before 1970 or past the limit */
      rd_bad(r, SIM_SKIP_NUMBER, "Submit '%s'", f[idx[SUBMIT]]);
      continue;
    }
    if (!sacct_time(f[idx[START]], &st) || !sacct_time(f[idx[END]], &en)) {
      rd_bad(r, SIM_SKIP_NEVER_RAN, "job %s: Start '%s', End '%s'", f[idx[ID]],
             f[idx[START]], f[idx[END]]);
      continue;
    }
    if (st > SIM_MAX_MS / 1000 || en > SIM_MAX_MS / 1000) {
      rd_bad(r, SIM_SKIP_RANGE, "job %s: Start '%s', End '%s' past %lld s",
             f[idx[ID]], f[idx[START]], f[idx[END]],
             (long long)(SIM_MAX_MS / 1000));
      continue;
    }
    if (en < st || st < sub) {
      rd_bad(r, SIM_SKIP_ORDER, "job %s: Submit %s, Start %s, End %s",
             f[idx[ID]], f[idx[SUBMIT]], f[idx[START]], f[idx[END]]);
      continue;
    }
    char buf[64];
    const char *g = tres_get(f[idx[ALLOC]], "gres/gpu", buf, sizeof buf);
    if (!g)
      g = tres_get(f[idx[REQ]], "gres/gpu", buf, sizeof buf);
    int64_t ng = 0;
    if (g && (!num_i64(g, &ng) || ng < 0 || ng > 1024)) {
      rd_bad(r, SIM_SKIP_NUMBER, "job %s: gres/gpu '%s'", f[idx[ID]], g);
      continue;
    }
    /* Memory per GPU: cogpu's record of the job (its peak, else what it
     * declared), else its --gpu-mem (gres/cogpumem, per node), else the
     * whole GPU. */
    uint64_t mem = 0, decl = 0;
    if (adm >= 0 && strstr(f[adm], "\"cogpu\"") &&
        (!json_max(f[adm], "\"peak_bytes\"", &mem) ||
         !json_max(f[adm], "\"declared_bytes\"", &decl))) {
      rd_bad(r, SIM_SKIP_RANGE,
             "job %s: peak_bytes or declared_bytes not a whole number up to "
             "%llu",
             f[idx[ID]], (unsigned long long)SIM_MAX_BYTES);
      continue;
    }
    if (!mem)
      mem = decl;
    char mb[64];
    const char *cm = tres_get(f[idx[ALLOC]], "gres/cogpumem", mb, sizeof mb);
    if (!cm)
      cm = tres_get(f[idx[REQ]], "gres/cogpumem", mb, sizeof mb);
    /* A --gpu-mem job asks for no gres/gpu: cogpu books it on one GPU of
     * its node. */
    if (ng == 0 && (mem || (cm && strcmp(cm, "0") != 0)))
      ng = 1;
    if (!mem && cm && ng > 0) {
      uint64_t b;
      /* A count-only GRES in MiB unless it carries a unit. */
      size_t l = strlen(mb);
      if (l && isdigit((unsigned char)mb[l - 1]) && l + 1 < sizeof mb)
        strcat(mb, "M");
      if (cogpu__parse_size("gres/cogpumem", mb, &b) != 0 ||
          b / (uint64_t)ng > SIM_MAX_BYTES) {
        rd_bad(r, SIM_SKIP_RANGE,
               "job %s: gres/cogpumem '%s' is not a size "
               "up to 1P per GPU",
               f[idx[ID]], cm);
        continue;
      }
      mem = b / (uint64_t)ng;
    }
    sim_job_t j = {.submit = sub * 1000,
                   .dur = (en - st) * 1000,
                   .mem = mem,
                   .ngpus = (uint32_t)ng,
                   .line = r->lineno};
    rc = cogpu__sim_trace_add(r->t, &j, NULL);
    if (rc)
      return rc;
  }
  /* sacct's times are absolute: the replay starts at the first submit. */
  int64_t first = INT64_MAX;
  for (size_t i = 0; i < r->t->n; i++)
    first = r->t->jobs[i].submit < first ? r->t->jobs[i].submit : first;
  for (size_t i = 0; i < r->t->n; i++)
    r->t->jobs[i].submit -= first;
  return 0;
}

/* --- cogpu: `cogpu history --json` ---------------------------------------- */

typedef struct js_s {
  const char *p, *end;
  uint32_t line;
} js_t;

static void js_ws(js_t *s) {
  while (s->p < s->end && isspace((unsigned char)*s->p)) {
    if (*s->p == '\n')
      s->line++;
    s->p++;
  }
}

/* Skips one JSON value of any kind; false if malformed. */
static bool js_skip(js_t *s, int depth) {
  js_ws(s);
  if (s->p >= s->end || depth > 32)
    return false;
  char c = *s->p;
  if (c == '"') {
    for (s->p++; s->p < s->end && *s->p != '"'; s->p++) {
      if (*s->p == '\\')
        s->p++;
      else if (*s->p == '\n')
        return false;
    }
    if (s->p >= s->end)
      return false;
    s->p++;
    return true;
  }
  if (c == '[' || c == '{') {
    char close = c == '[' ? ']' : '}';
    s->p++;
    js_ws(s);
    if (s->p < s->end && *s->p == close) {
      s->p++;
      return true;
    }
    for (;;) {
      if (c == '{') {
        if (!js_skip(s, depth + 1))
          return false;
        js_ws(s);
        if (s->p >= s->end || *s->p != ':')
          return false;
        s->p++;
      }
      if (!js_skip(s, depth + 1))
        return false;
      js_ws(s);
      if (s->p < s->end && *s->p == ',') {
        s->p++;
        continue;
      }
      if (s->p < s->end && *s->p == close) {
        s->p++;
        return true;
      }
      return false;
    }
  }
  const char *b = s->p;
  while (s->p < s->end && (isalnum((unsigned char)*s->p) || *s->p == '-' ||
                           *s->p == '+' || *s->p == '.'))
    s->p++;
  return s->p > b;
}

/* A number value; false (position unchanged past it) if not a number. */
static bool js_num(js_t *s, double *out) {
  js_ws(s);
  const char *b = s->p;
  if (!js_skip(s, 0))
    return false;
  char tmp[64];
  size_t n = (size_t)(s->p - b);
  if (n == 0 || n >= sizeof tmp)
    return false;
  memcpy(tmp, b, n);
  tmp[n] = 0;
  return num_dbl(tmp, out);
}

static int read_cogpu(rd_t *r) {
  /* The whole file: records span lines. */
  fseek(r->f, 0, SEEK_END);
  long sz = ftell(r->f);
  fseek(r->f, 0, SEEK_SET);
  if (sz < 0)
    return cogpu__seterr(-EIO, "%s: cannot size the file", r->path);
  char *buf = malloc((size_t)sz + 1);
  if (!buf)
    return cogpu__seterr(-ENOMEM, "out of memory reading %s", r->path);
  size_t got = fread(buf, 1, (size_t)sz, r->f);
  buf[got] = 0;
  js_t s = {buf, buf + got, 1};
  uint64_t *tl = NULL;
  size_t tlcap = 0;
  int rc = 0;
  js_ws(&s);
  if (s.p >= s.end || *s.p != '[') {
    free(buf);
    return cogpu__seterr(-EINVAL,
                         "%s:%u: not a JSON array (the output of "
                         "`cogpu history --json`)",
                         r->path, s.line);
  }
  s.p++;
  int64_t first = INT64_MAX;
  size_t first_job = r->t->n;
  for (;;) {
    js_ws(&s);
    if (s.p < s.end && *s.p == ']')
      break;
    r->lineno = s.line;
    r->t->rows++;
    if (s.p >= s.end || *s.p != '{') {
      rd_bad(r, SIM_SKIP_SYNTAX, "expected a record");
      rc = r->fatal ? r->fatal : -EINVAL;
      if (!r->fatal)
        cogpu__seterr(rc, "%s:%u: malformed JSON: cannot go on", r->path,
                      s.line);
      break;
    }
    const char *rec = s.p;
    js_t save = s;
    if (!js_skip(&s, 0)) {
      s = save;
      rd_bad(r, SIM_SKIP_SYNTAX, "malformed record");
      rc = r->fatal ? r->fatal : -EINVAL;
      if (!r->fatal)
        cogpu__seterr(rc, "%s:%u: malformed JSON: cannot go on", r->path,
                      s.line);
      break;
    }
    /* Second pass over the record's members. */
    js_t m = {rec + 1, s.p - 1, save.line};
    double start = -1, end = -1, wait = 0, run = -1, peak = 0, decl = 0,
           tli = 0;
    size_t ntl = 0;
    bool ok = true, tl_bad = false;
    for (;;) {
      js_ws(&m);
      if (m.p >= m.end)
        break;
      if (*m.p != '"') {
        ok = false;
        break;
      }
      const char *k = m.p + 1;
      js_skip(&m, 0);
      size_t kl = (size_t)(m.p - 1 - k);
      js_ws(&m);
      m.p++; /* ':' (checked by the first pass) */
      double *dst = NULL;
#define KEY(name) (kl == strlen(name) && !strncmp(k, name, kl))
      if (KEY("start_ms"))
        dst = &start;
      else if (KEY("end_ms"))
        dst = &end;
      else if (KEY("wait_seconds"))
        dst = &wait;
      else if (KEY("run_seconds"))
        dst = &run;
      else if (KEY("peak_bytes"))
        dst = &peak;
      else if (KEY("declared_bytes"))
        dst = &decl;
      else if (KEY("timeline_interval_seconds"))
        dst = &tli;
      if (dst) {
        if (!js_num(&m, dst))
          ok = false;
      } else if (KEY("timeline_bytes")) {
        js_ws(&m);
        if (m.p >= m.end || *m.p != '[') {
          tl_bad = true;
          js_skip(&m, 0);
        } else {
          m.p++;
          for (;;) {
            js_ws(&m);
            if (m.p < m.end && *m.p == ']') {
              m.p++;
              break;
            }
            double v;
            if (!js_num(&m, &v) || !(v >= 0) || v > (double)SIM_MAX_BYTES) {
              tl_bad = true;
              break;
            }
            if (ntl == tlcap) {
              tlcap = tlcap ? tlcap * 2 : 64;
              uint64_t *nt = realloc(tl, tlcap * sizeof *nt);
              if (!nt) {
                free(tl);
                free(buf);
                return cogpu__seterr(-ENOMEM, "out of memory");
              }
              tl = nt;
            }
            tl[ntl++] = (uint64_t)v;
            js_ws(&m);
            if (m.p < m.end && *m.p == ',')
              m.p++;
          }
        }
      } else {
        js_skip(&m, 0);
      }
#undef KEY
      js_ws(&m);
      if (m.p < m.end && *m.p == ',')
        m.p++;
    }
    js_ws(&s);
    if (s.p < s.end && *s.p == ',')
      s.p++;
    if (!ok || tl_bad) {
      rd_bad(r, SIM_SKIP_NUMBER, "a field that must be a number is not");
      if (r->fatal)
        break;
      continue;
    }
    if (start < 0 || run < 0 || wait < 0 || peak < 0 || decl < 0) {
      rd_bad(r, SIM_SKIP_RANGE,
             "start_ms, run_seconds or wait_seconds "
             "missing or negative");
      if (r->fatal)
        break;
      continue;
    }
    int64_t start_ms, wait_ms, run_ms, step_ms = 0;
    if (!dbl_ms(start, 1, &start_ms) || !dbl_ms(wait, 1000, &wait_ms) ||
        !dbl_ms(run, 1000, &run_ms) || !dbl_ms(tli, 1000, &step_ms) ||
        (ntl && step_ms > SIM_MAX_MS / (int64_t)ntl) ||
        peak > (double)SIM_MAX_BYTES || decl > (double)SIM_MAX_BYTES) {
      rd_bad(r, SIM_SKIP_RANGE,
             "times past %lld ms or bytes past %llu (start_ms %.17g, "
             "wait_seconds %.17g, run_seconds %.17g, peak_bytes %.17g)",
             (long long)SIM_MAX_MS, (unsigned long long)SIM_MAX_BYTES, start,
             wait, run, peak);
      if (r->fatal)
        break;
      continue;
    }
    if (end >= 0 && end < start) {
      rd_bad(r, SIM_SKIP_ORDER, "end_ms before start_ms");
      if (r->fatal)
        break;
      continue;
    }
    sim_job_t j = {.submit = start_ms - wait_ms,
                   .dur = run_ms,
                   .mem = peak > 0 ? (uint64_t)peak : (uint64_t)decl,
                   .ngpus = 1,
                   .line = r->lineno};
    if (ntl > 0 && tli > 0) {
      j.tl_n = (uint32_t)ntl;
      j.tl_step = step_ms;
      if (j.tl_step < 1)
        j.tl_step = 1;
    }
    first = j.submit < first ? j.submit : first;
    rc = cogpu__sim_trace_add(r->t, &j, tl);
    if (rc)
      break;
  }
  free(tl);
  free(buf);
  /* Real times (ms since the epoch): the replay starts at the first. */
  for (size_t i = first_job; i < r->t->n && first != INT64_MAX; i++)
    r->t->jobs[i].submit -= first;
  return rc;
}

int cogpu__sim_read_trace(sim_trace_t *t, const char *path, int format,
                          const sim_opts_t *o, FILE *err) {
  rd_t r;
  int rc = rd_open(&r, path, t, o, err);
  if (rc)
    return rc;
  switch (format) {
  case SIM_FMT_ALIBABA:
    rc = read_alibaba(&r);
    break;
  case SIM_FMT_PHILLY:
    rc = read_philly(&r);
    break;
  case SIM_FMT_POLLUX:
    rc = read_pollux(&r);
    break;
  case SIM_FMT_SACCT:
    rc = read_sacct(&r);
    break;
  case SIM_FMT_COGPU:
    rc = read_cogpu(&r);
    break;
  default:
    rc = cogpu__seterr(-EINVAL, "unknown trace format");
  }
  rc = rd_close(&r, rc);
  if (rc) {
    /* A failed read owns nothing afterwards: the caller gets an empty trace. */
    cogpu__sim_trace_free(t);
    return rc;
  }
  if (o && o->time_scale != 1.0)
    for (size_t i = 0; i < t->n; i++) {
      double x = (double)t->jobs[i].submit / o->time_scale;
      if (!(x >= 0 && x <= (double)SIM_MAX_MS)) {
        uint32_t line = t->jobs[i].line;
        cogpu__sim_trace_free(t);
        return cogpu__seterr(-EINVAL,
                             "%s:%u: --time-scale %g puts the arrival past "
                             "%lld ms",
                             path, line, o->time_scale, (long long)SIM_MAX_MS);
      }
      t->jobs[i].submit = (int64_t)x;
    }
  cogpu__sim_trace_sort(t);
  return 0;
}

/* --- The cluster --------------------------------------------------------- */

static int cluster_add_model(sim_cluster_t *c, const char *name, uint64_t mem) {
  for (uint32_t i = 0; i < c->nmodels; i++)
    if (!strcmp(c->models[i], name))
      return (int)i;
  if (c->nmodels == SIM_MAX_MODELS)
    return cogpu__seterr(-EINVAL, "more than %d GPU models", SIM_MAX_MODELS);
  snprintf(c->models[c->nmodels], sizeof c->models[0], "%s", name);
  c->model_mem[c->nmodels] = mem;
  return (int)c->nmodels++;
}

static int cluster_add_node(sim_cluster_t *c, size_t *cap,
                            const sim_node_t *n) {
  if (c->nnodes == *cap) {
    size_t nc = *cap ? *cap * 2 : 256;
    sim_node_t *nn = realloc(c->nodes, nc * sizeof *nn);
    if (!nn)
      return cogpu__seterr(-ENOMEM, "out of memory");
    c->nodes = nn;
    *cap = nc;
  }
  c->nodes[c->nnodes] = *n;
  c->nodes[c->nnodes].gpu0 = c->ngpus;
  c->ngpus += n->ngpus;
  c->nnodes++;
  if (n->ngpus > c->max_node_gpus)
    c->max_node_gpus = n->ngpus;
  if (n->gpu_total > c->max_gpu_total)
    c->max_gpu_total = n->gpu_total;
  return 0;
}

static int cluster_index(sim_cluster_t *c) {
  c->gpu_node = malloc((c->ngpus ? c->ngpus : 1) * sizeof *c->gpu_node);
  if (!c->gpu_node)
    return cogpu__seterr(-ENOMEM, "out of memory");
  for (uint32_t i = 0; i < c->nnodes; i++)
    for (uint32_t g = 0; g < c->nodes[i].ngpus; g++)
      c->gpu_node[c->nodes[i].gpu0 + g] = i;
  return 0;
}

int cogpu__sim_make_cluster(sim_cluster_t *c, uint32_t n, uint32_t g,
                            uint64_t mem, uint64_t host) {
  memset(c, 0, sizeof *c);
  if (n == 0 || g == 0 || g > SIM_MAX_NODE_GPUS || mem == 0)
    return cogpu__seterr(-EINVAL,
                         "a cluster needs nodes, 1 to %u GPUs per "
                         "node and GPU memory",
                         SIM_MAX_NODE_GPUS);
  c->nodes = calloc(n, sizeof *c->nodes);
  if (!c->nodes)
    return cogpu__seterr(-ENOMEM, "out of memory");
  size_t cap = n;
  int m = cluster_add_model(c, "gpu", mem);
  for (uint32_t i = 0; i < n; i++) {
    sim_node_t nd = {.ngpus = g,
                     .model = (uint32_t)m,
                     .gpu_total = mem,
                     .host_mib = host >> 20,
                     .cpu_milli = 64000};
    int rc = cluster_add_node(c, &cap, &nd);
    if (rc)
      return rc;
  }
  return cluster_index(c);
}

int cogpu__sim_read_cluster(sim_cluster_t *c, const char *path,
                            const sim_opts_t *o, FILE *err) {
  memset(c, 0, sizeof *c);
  rd_t r;
  int rc = rd_open(&r, path, NULL, o, err);
  if (rc)
    return rc;
  static const char *const need[] = {"cpu_milli", "memory_mib", "gpu", "model"};
  enum { CPU, MEM, GPU, MODEL, NNEED };
  char *hdr[MAX_FIELDS + 1], *f[MAX_FIELDS + 1];
  int idx[NNEED], nh;
  size_t cap = 0;
  rc = rd_header(&r, ',', hdr, &nh, need, idx, NNEED);
  int gm = rc ? -1 : col(hdr, nh, "gpu_mem");
  /* A node list is the cluster: any bad row is fatal, since skipping a
   * node would simulate another cluster. */
  while (!rc && rd_next(&r)) {
    if (!*r.line)
      continue;
    int n = split(r.line, ',', f, MAX_FIELDS);
    int64_t cpu, mem, g;
    if (n != nh) {
      rc = cogpu__seterr(-EINVAL, "%s:%u: %d fields, the header has %d", path,
                         r.lineno, n, nh);
      break;
    }
    if (!num_i64(f[idx[CPU]], &cpu) || !num_i64(f[idx[MEM]], &mem) ||
        !num_i64(f[idx[GPU]], &g) || cpu < 0 || cpu > UINT32_MAX || mem < 0 ||
        mem > (int64_t)1 << 40 || g < 0 || g > SIM_MAX_NODE_GPUS) {
      rc = cogpu__seterr(-EINVAL,
                         "%s:%u: cpu_milli, memory_mib or gpu is "
                         "not a number in range (gpu at most %u)",
                         path, r.lineno, SIM_MAX_NODE_GPUS);
      break;
    }
    uint64_t bytes = 0;
    if (gm >= 0 && *f[gm] &&
        (cogpu__parse_size("gpu_mem", f[gm], &bytes) != 0 ||
         bytes > SIM_MAX_BYTES)) {
      rc = cogpu__seterr(-EINVAL, "%s:%u: gpu_mem '%s' is not a size up to 1P",
                         path, r.lineno, f[gm]);
      break;
    }
    if (!bytes)
      bytes = cogpu__sim_model_mem(o, f[idx[MODEL]]);
    if (!bytes && g > 0) {
      rc = cogpu__seterr(-EINVAL,
                         "%s:%u: GPU model '%s' has no known memory: "
                         "give it with --gpu-model-mem %s=SIZE or a gpu_mem "
                         "column",
                         path, r.lineno, f[idx[MODEL]], f[idx[MODEL]]);
      break;
    }
    int m = cluster_add_model(c, f[idx[MODEL]], bytes);
    if (m < 0) {
      rc = m;
      break;
    }
    sim_node_t nd = {.ngpus = (uint32_t)g,
                     .model = (uint32_t)m,
                     .gpu_total = bytes,
                     .host_mib = (uint64_t)mem,
                     .cpu_milli = (uint32_t)cpu};
    rc = cluster_add_node(c, &cap, &nd);
  }
  rc = rd_close(&r, rc);
  if (!rc && c->ngpus == 0)
    rc = cogpu__seterr(-EINVAL, "%s: no GPUs in the node list", path);
  if (!rc)
    rc = cluster_index(c);
  if (rc)
    cogpu__sim_cluster_free(c);
  return rc;
}

void cogpu__sim_cluster_free(sim_cluster_t *c) {
  free(c->nodes);
  free(c->gpu_node);
  memset(c, 0, sizeof *c);
}
