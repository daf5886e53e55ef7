/*
 * cmd-sim.c: `cogpu sim`, the cluster simulator's command line
 * (docs/simulation.md): reads a trace and a cluster, replays the trace
 * under each policy asked for (src/sim), writes the results.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sim/sim-int.h"

static const char sim_usage[] =
    "usage: cogpu sim --trace FILE --format alibaba|philly|pollux|sacct|cogpu\n"
    "         (--cluster NODES.csv | --nodes N --gpus-per-node G --gpu-mem "
    "SIZE\n"
    "          [--host-mem SIZE])\n"
    "         --policy P [--policy Q ...] --out DIR [--seed S] [--strict]\n"
    "         [--time-unit DURATION] [--gpu-model-mem MODEL=SIZE,...]\n"
    "         [--node-policy fifo|mmu|priority-fifo|priority-mmu]\n"
    "         [--margin PCT] [--shares N] [--crash-after DURATION]\n"
    "         [--max-crashes N] [--time-scale X]\n"
    "         [--suspend-rate GIBPS] [--resume-rate GIBPS]\n"
    "         [--remote-slowdown X] [--remote-links N] [--sample DURATION]\n"
    "         [--sched-delay DURATION]\n"
    "         [--jobs] [--quiet]\n"
    "\n"
    "Policies: exclusive, shares, cogpu[:firstfit|bestfit|fgd],\n"
    "cogpu+suspend[:...], gqueue, rqueue, rqueue-links, colocate, latency.\n"
    "\n"
    "       cogpu sim --fgd PLACEMENT[,...]|all --trace FILE --format alibaba\n"
    "         --cluster NODES.csv --out DIR [--seed S] [--seeds N] [--upto "
    "PCT]\n"
    "FGD's arrivals-only experiment (its Fig. 9): placements random,\n"
    "dotprod, clustering, packing, bestfit, fgd; GPU allocation and\n"
    "fragmentation (amount and ratio) as arrivals grow. See\n"
    "docs/simulation.md.\n";

enum {
  O_TRACE = 1000,
  O_FORMAT,
  O_CLUSTER,
  O_NODES,
  O_GPN,
  O_GPUMEM,
  O_HOSTMEM,
  O_POLICY,
  O_OUT,
  O_SEED,
  O_STRICT,
  O_TUNIT,
  O_MODELMEM,
  O_NODEPOL,
  O_MARGIN,
  O_SHARES,
  O_CRASH,
  O_SRATE,
  O_RRATE,
  O_SLOW,
  O_LINKS,
  O_SAMPLE,
  O_SDELAY,
  O_JOBS,
  O_QUIET,
  O_MAXCRASH,
  O_FGD,
  O_SEEDS,
  O_UPTO,
  O_TSCALE,
  O_HELP
};

static int bad(const char *fmt, ...) COGPU_PRINTF(1, 2);
static int bad(const char *fmt, ...) {
  char msg[640], shown[4 * 640];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* An argument may hold control characters: shown escaped. */
  cli_err("sim: %s", cli_safe(msg, shown, sizeof shown));
  fputs(sim_usage, stderr);
  return CLI_EXIT_USAGE;
}

static bool num_u64(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-' || v > max)
    return false;
  *out = v;
  return true;
}

static bool num_pos(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v > 0) || isinf(v))
    return false;
  *out = v;
  return true;
}

static int write_jobs(const char *dir, const char *policy, const sim_trace_t *t,
                      const sim_outcome_t *o) {
  char path[4096], name[128];
  snprintf(name, sizeof name, "%s", policy);
  for (char *p = name; *p; p++)
    if (*p == '+' || *p == ':' || *p == '/')
      *p = '-';
  snprintf(path, sizeof path, "%s/%s-jobs.csv", dir, name);
  FILE *f = fopen(path, "we");
  if (!f) {
    cli_err("sim: %s: %s", path, strerror(errno));
    return CLI_EXIT_FAIL;
  }
  fprintf(f, "line,submit_s,start_s,end_s,gpus,node,crashes,suspensions,"
             "remote,not_run,given_up\n");
  for (size_t i = 0; i < t->n; i++) {
    const sim_job_t *j = &t->jobs[i];
    fprintf(f, "%u,%.3f,%.3f,%.3f,%u,%u,%u,%u,%u,%u,%u\n", j->line,
            (double)j->submit / 1000.0,
            o[i].start < 0 ? -1.0 : (double)o[i].start / 1000.0,
            o[i].end < 0 ? -1.0 : (double)o[i].end / 1000.0, j->ngpus,
            o[i].node, o[i].crashes, o[i].suspensions, o[i].remote, o[i].failed,
            o[i].given_up);
  }
  if (fclose(f) != 0) {
    cli_err("sim: %s: write failed", path);
    return CLI_EXIT_FAIL;
  }
  return 0;
}

/* --out DIR and its missing parents, as mkdir -p; said before the run,
 * not after it. */
static int mkdir_p_out(const char *dir) {
  if (cogpu__mkdirs(dir, 0777) != 0) {
    cli_err("sim: %s", cogpu_last_error());
    return -1;
  }
  return 0;
}

/* FGD's experiment: each placement, each seed (seed, seed + 1, ...);
 * DIR/fgd.csv has every point, DIR/fgd.md the means at 100 % and at the
 * last point: allocation, fragmentation (of all GPUs) and its ratio (to
 * the idle GPU), as the artifact's three curves. */
static int run_fgd(const char *list, const sim_trace_t *t,
                   const sim_cluster_t *c, const sim_opts_t *o, const char *out,
                   uint64_t seeds, double upto) {
  static const char *const all[] = {"random",  "dotprod", "clustering",
                                    "packing", "bestfit", "fgd"};
  const char *names[6];
  char buf[256];
  size_t n = 0;
  if (!strcmp(list, "all")) {
    for (size_t i = 0; i < 6; i++)
      names[n++] = all[i];
  } else {
    snprintf(buf, sizeof buf, "%s", list);
    for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok && n < 6;
         tok = strtok_r(NULL, ",", &sv))
      names[n++] = tok;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/fgd.csv", out);
  FILE *csv = fopen(path, "we");
  snprintf(path, sizeof path, "%s/fgd.md", out);
  FILE *md = fopen(path, "we");
  if (!csv || !md) {
    cli_err("sim: %s: %s", out, strerror(errno));
    if (csv)
      fclose(csv);
    if (md)
      fclose(md);
    return CLI_EXIT_FAIL;
  }
  fprintf(csv, "placement,seed,arrived_pct,alloc_pct,frag_pct,"
               "frag_ratio_pct\n");
  fprintf(md,
          "# FGD's experiment (arrivals only, up to %.0f %%)\n\n"
          "At arrived workload (%%), mean over %llu seed(s) from %llu: GPU "
          "allocation ratio (%%), fragmentation (%% of the GPUs) and "
          "fragmentation ratio (%% of the idle GPU).\n\n| placement | at "
          "100 %% | at %.0f %% | failed pods (mean) | frag at 100 %% | frag "
          "at %.0f %% | frag ratio at 100 %% | frag ratio at %.0f %% "
          "|\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
          upto, (unsigned long long)seeds, (unsigned long long)o->seed, upto,
          upto, upto);
  int ret = 0;
  for (size_t p = 0; p < n && !ret; p++) {
    double a100 = 0, aend = 0, fails = 0, f100 = 0, fend = 0, r100 = 0,
           rend = 0;
    for (uint64_t k = 0; k < seeds; k++) {
      sim_opts_t so = *o;
      so.seed = o->seed + k;
      sim_fgd_point_t *pts = NULL;
      size_t np = 0, failed = 0;
      int rc = cogpu__sim_fgd(t, c, names[p], &so, upto, &pts, &np, &failed);
      if (rc) {
        ret = cli_fail("sim --fgd", rc);
        break;
      }
      for (size_t i = 0; i < np; i++) {
        fprintf(csv, "%s,%llu,%.0f,%.4f,%.4f,%.4f\n", names[p],
                (unsigned long long)so.seed, pts[i].arrived, pts[i].alloc,
                pts[i].frag, pts[i].frag_ratio);
        if (pts[i].arrived == 100) {
          a100 += pts[i].alloc;
          f100 += pts[i].frag;
          r100 += pts[i].frag_ratio;
        }
        if (i + 1 == np) {
          aend += pts[i].alloc;
          fend += pts[i].frag;
          rend += pts[i].frag_ratio;
        }
      }
      fails += (double)failed;
      free(pts);
    }
    if (!ret)
      fprintf(md, "| %s | %.2f | %.2f | %.0f | %.2f | %.2f | %.2f | %.2f |\n",
              names[p], a100 / (double)seeds, aend / (double)seeds,
              fails / (double)seeds, f100 / (double)seeds, fend / (double)seeds,
              r100 / (double)seeds, rend / (double)seeds);
    if (!o->quiet)
      fprintf(stderr,
              "cogpu: sim: fgd %s: %.2f %% at 100 %%, %.2f %% at "
              "%.0f %%\n",
              names[p], a100 / (double)seeds, aend / (double)seeds, upto);
  }
  if (fclose(csv) != 0 || fclose(md) != 0) {
    cli_err("sim: %s: write failed", out);
    ret = CLI_EXIT_FAIL;
  }
  return ret;
}

int cli_sim(int argc, char **argv) {
  static const struct option longopts[] = {
      {"trace", required_argument, NULL, O_TRACE},
      {"format", required_argument, NULL, O_FORMAT},
      {"cluster", required_argument, NULL, O_CLUSTER},
      {"nodes", required_argument, NULL, O_NODES},
      {"gpus-per-node", required_argument, NULL, O_GPN},
      {"gpu-mem", required_argument, NULL, O_GPUMEM},
      {"host-mem", required_argument, NULL, O_HOSTMEM},
      {"policy", required_argument, NULL, O_POLICY},
      {"out", required_argument, NULL, O_OUT},
      {"seed", required_argument, NULL, O_SEED},
      {"strict", no_argument, NULL, O_STRICT},
      {"time-unit", required_argument, NULL, O_TUNIT},
      {"gpu-model-mem", required_argument, NULL, O_MODELMEM},
      {"node-policy", required_argument, NULL, O_NODEPOL},
      {"margin", required_argument, NULL, O_MARGIN},
      {"shares", required_argument, NULL, O_SHARES},
      {"crash-after", required_argument, NULL, O_CRASH},
      {"suspend-rate", required_argument, NULL, O_SRATE},
      {"resume-rate", required_argument, NULL, O_RRATE},
      {"remote-slowdown", required_argument, NULL, O_SLOW},
      {"remote-links", required_argument, NULL, O_LINKS},
      {"sample", required_argument, NULL, O_SAMPLE},
      {"sched-delay", required_argument, NULL, O_SDELAY},
      {"jobs", no_argument, NULL, O_JOBS},
      {"quiet", no_argument, NULL, O_QUIET},
      {"max-crashes", required_argument, NULL, O_MAXCRASH},
      {"fgd", required_argument, NULL, O_FGD},
      {"seeds", required_argument, NULL, O_SEEDS},
      {"upto", required_argument, NULL, O_UPTO},
      {"time-scale", required_argument, NULL, O_TSCALE},
      {"help", no_argument, NULL, O_HELP},
      {NULL, 0, NULL, 0}};
  sim_opts_t o;
  cogpu__sim_opts_default(&o);
  const char *trace = NULL, *cluster = NULL, *out = NULL, *fgd = NULL;
  uint64_t seeds = 1;
  double upto = 130;
  int format = -1;
  uint64_t nodes = 0, gpn = 0, gpumem = 0, hostmem = 512 * SIM_GIB;
  const char *pols[32];
  size_t npol = 0;
  bool jobs = false;
  int c;
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    uint64_t v;
    double d;
    int64_t ms;
    switch (c) {
    case O_TRACE:
      trace = optarg;
      break;
    case O_FORMAT:
      format = cogpu__sim_format(optarg);
      if (format < 0)
        return bad("unknown --format '%s'", optarg);
      break;
    case O_CLUSTER:
      cluster = optarg;
      break;
    case O_NODES:
      if (!num_u64(optarg, 10000000, &nodes) || nodes == 0)
        return bad("--nodes '%s' is not 1 to 10000000", optarg);
      break;
    case O_GPN:
      if (!num_u64(optarg, SIM_MAX_NODE_GPUS, &gpn) || gpn == 0)
        return bad("--gpus-per-node '%s' is not 1 to 16", optarg);
      break;
    case O_GPUMEM:
      if (cogpu__parse_size("--gpu-mem", optarg, &gpumem) || !gpumem ||
          gpumem > SIM_MAX_BYTES)
        return bad("--gpu-mem '%s' is not a size up to 1P (80G)", optarg);
      break;
    case O_HOSTMEM:
      if (cogpu__parse_size("--host-mem", optarg, &hostmem))
        return bad("--host-mem '%s' is not a size (1T)", optarg);
      break;
    case O_POLICY: {
      sim_policy_t p;
      if (cogpu__sim_policy(optarg, &p))
        return bad("%s", cogpu_last_error());
      if (npol == COGPU_ARRAY_SIZE(pols))
        return bad("too many --policy (%s)", optarg);
      pols[npol++] = optarg;
      break;
    }
    case O_OUT:
      out = optarg;
      break;
    case O_SEED:
      if (!num_u64(optarg, UINT64_MAX, &o.seed))
        return bad("--seed '%s' is not a number", optarg);
      break;
    case O_STRICT:
      o.strict = true;
      break;
    case O_TUNIT:
      if (cogpu__parse_duration_ms("--time-unit", optarg, &ms) || ms <= 0)
        return bad("--time-unit '%s' is not a duration (60s)", optarg);
      o.time_unit = ms;
      break;
    case O_MODELMEM:
      if (cogpu__sim_parse_model_mem(&o, optarg))
        return bad("%s", cogpu_last_error());
      break;
    case O_NODEPOL: {
      static const char *const names[] = {"fifo", "mmu", "priority-fifo",
                                          "priority-mmu"};
      int k = -1;
      for (int i = 0; i < 4; i++)
        if (!strcmp(optarg, names[i]))
          k = i;
      if (k < 0)
        return bad("--node-policy '%s': fifo, mmu, priority-fifo or "
                   "priority-mmu",
                   optarg);
      o.node_policy = (uint32_t)k;
      break;
    }
    case O_MARGIN:
      if (!num_u64(optarg, 99, &v))
        return bad("--margin '%s' is not a percentage 0..99", optarg);
      o.margin_pct = v;
      break;
    case O_SHARES:
      if (!num_u64(optarg, 1024, &v) || v == 0)
        return bad("--shares '%s' is not 1..1024", optarg);
      o.shares = (uint32_t)v;
      break;
    case O_CRASH:
      if (cogpu__parse_duration_ms("--crash-after", optarg, &ms) || ms < 0)
        return bad("--crash-after '%s' is not a duration", optarg);
      o.crash_after = ms;
      break;
    case O_SRATE:
    case O_RRATE:
      /* Bounded so that a copy's time stays a number of ms. */
      if (!num_pos(optarg, &d) || d < 0.001 || d > 1e6)
        return bad("a rate must be 0.001 to 1000000 GiB/s, not '%s'", optarg);
      *(c == O_SRATE ? &o.susp_gibps : &o.resume_gibps) = d;
      break;
    case O_SLOW:
      if (!num_pos(optarg, &d) || d < 1 || d > 1000)
        return bad("--remote-slowdown '%s' is not a factor 1 to 1000", optarg);
      o.remote_slowdown = d;
      break;
    case O_LINKS:
      if (!num_u64(optarg, 1024, &v))
        return bad("--remote-links '%s' is not 0..1024", optarg);
      o.remote_links = (uint32_t)v;
      break;
    case O_SAMPLE:
      if (cogpu__parse_duration_ms("--sample", optarg, &ms) || ms <= 0 ||
          ms > SIM_MAX_MS)
        return bad("--sample '%s' is not a duration (up to 10^12 s)", optarg);
      o.sample = ms;
      break;
    case O_SDELAY:
      if (cogpu__parse_duration_ms("--sched-delay", optarg, &ms) || ms < 0 ||
          ms > 3600000)
        return bad("--sched-delay '%s' is not a duration up to 1h", optarg);
      o.sched_delay = ms;
      break;
    case O_JOBS:
      jobs = true;
      break;
    case O_QUIET:
      o.quiet = true;
      break;
    case O_FGD:
      fgd = optarg;
      break;
    case O_SEEDS:
      if (!num_u64(optarg, 1000, &seeds) || seeds == 0)
        return bad("--seeds '%s' is not 1..1000", optarg);
      break;
    case O_UPTO:
      if (!num_pos(optarg, &upto) || upto > 1000)
        return bad("--upto '%s' is not a percentage", optarg);
      break;
    case O_MAXCRASH:
      if (!num_u64(optarg, 1000000, &v))
        return bad("--max-crashes '%s' is not a number", optarg);
      o.max_crashes = (uint32_t)v;
      break;
    case O_TSCALE:
      if (!num_pos(optarg, &d) || d < 0.001 || d > 1e9)
        return bad("--time-scale '%s' is not a factor 0.001 to 1e9", optarg);
      o.time_scale = d;
      break;
    case O_HELP:
      fputs(sim_usage, stdout);
      return 0;
    default:
      return bad("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return bad("unexpected argument '%s'", argv[optind]);
  if (!trace || format < 0 || !out)
    return bad("%s", "--trace, --format and --out are required");
  if (npol == 0 && !fgd)
    return bad("%s", "give at least one --policy");
  if (!!cluster == !!(nodes || gpn || gpumem))
    return bad("%s", "give either --cluster or --nodes, --gpus-per-node and "
                     "--gpu-mem");
  if (!cluster && (!nodes || !gpn || !gpumem))
    return bad("%s", "--nodes, --gpus-per-node and --gpu-mem go together");

  sim_cluster_t cl;
  char desc[4200];
  int rc;
  if (cluster) {
    rc = cogpu__sim_read_cluster(&cl, cluster, &o, stderr);
    snprintf(desc, sizeof desc, "%s", cluster);
  } else {
    rc = cogpu__sim_make_cluster(&cl, (uint32_t)nodes, (uint32_t)gpn, gpumem,
                                 hostmem);
    char sz[32];
    snprintf(desc, sizeof desc, "%llu nodes x %llu GPUs of %s",
             (unsigned long long)nodes, (unsigned long long)gpn,
             cogpu__fmt_size(gpumem, sz, sizeof sz));
  }
  if (rc)
    return cli_fail("sim: cluster", rc);
  sim_trace_t t;
  memset(&t, 0, sizeof t);
  rc = cogpu__sim_read_trace(&t, trace, format, &o, stderr);
  if (rc) {
    cogpu__sim_cluster_free(&cl);
    return cli_fail("sim: trace", rc);
  }
  if (t.skipped) {
    fprintf(stderr, "cogpu: sim: %s: %zu of %zu rows skipped:", trace,
            t.skipped, t.rows);
    for (int i = 0; i < SIM_SKIP__COUNT; i++)
      if (t.skip[i])
        fprintf(stderr, " %zu %s (first at line %u);", t.skip[i],
                cogpu__sim_skip_name(i), t.first_skip_line[i]);
    fputc('\n', stderr);
  }
  int ret = 0;
  if (fgd) {
    ret = mkdir_p_out(out) ? CLI_EXIT_FAIL
                           : run_fgd(fgd, &t, &cl, &o, out, seeds, upto);
    cogpu__sim_trace_free(&t);
    cogpu__sim_cluster_free(&cl);
    return ret;
  }
  sim_result_t *res = calloc(npol, sizeof *res);
  sim_series_t *ser = calloc(npol, sizeof *ser);
  sim_outcome_t *oc = jobs ? calloc(t.n ? t.n : 1, sizeof *oc) : NULL;
  if (!res || !ser || (jobs && !oc)) {
    cli_err("sim: out of memory");
    ret = CLI_EXIT_FAIL;
  }
  if (!ret && mkdir_p_out(out))
    ret = CLI_EXIT_FAIL;
  for (size_t i = 0; !ret && i < npol; i++) {
    sim_policy_t p;
    cogpu__sim_policy(pols[i], &p);
    rc = cogpu__sim_run(&t, &cl, &p, &o, &res[i], &ser[i], oc);
    if (rc) {
      ret = cli_fail("sim", rc);
      break;
    }
    if (!o.quiet)
      fprintf(stderr, "cogpu: sim: %s: %zu jobs in %.2f s (%.0f jobs/s)\n",
              pols[i], res[i].jobs, res[i].sim_seconds,
              res[i].sim_seconds > 0 ? (double)res[i].jobs / res[i].sim_seconds
                                     : 0.0);
    if (jobs)
      ret = write_jobs(out, pols[i], &t, oc);
  }
  if (!ret) {
    sim_report_t rep = {.trace_path = trace,
                        .format = cogpu__sim_format_name(format),
                        .cluster_desc = desc,
                        .trace = &t,
                        .cluster = &cl,
                        .opts = &o,
                        .npol = npol,
                        .res = res,
                        .series = ser};
    rc = cogpu__sim_write(out, &rep);
    if (rc)
      ret = cli_fail("sim: output", rc);
    else if (!o.quiet)
      fprintf(stderr, "cogpu: sim: results in %s/summary.md\n", out);
  }
  for (size_t i = 0; ser && i < npol; i++)
    free(ser[i].v);
  free(ser);
  free(res);
  free(oc);
  cogpu__sim_trace_free(&t);
  cogpu__sim_cluster_free(&cl);
  return ret;
}
