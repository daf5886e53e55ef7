/*
 * test-experiment.c: the workload-mix experiment kit (bench/experiment,
 * issue 6) end to end on the fake driver: run.sh runs the fake mix (12
 * synthetic jobs, 2.3x over-subscribed on a fake 16 GiB GPU) one at a
 * time, all at once without cogpu, and under cogpu; results.json must
 * show out-of-memory failures only without cogpu, and cogpu finishing
 * sooner than one-at-a-time. The fake-growing mix (jobs that grow, no
 * --mem) against a private cogpud: failures without suspension, none
 * with it (issue 12).
 */
#include <glob.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "task.h"

/* The repository root: the parent of the build directory, or the current
 * directory (make check runs from the root). */
static const char *repo_root(void) {
  static char root[PATH_MAX];
  char probe[PATH_MAX + 64];
  snprintf(root, sizeof root, "%s", th_build_dir());
  char *slash = strrchr(root, '/');
  if (slash)
    *slash = 0;
  snprintf(probe, sizeof probe, "%s/bench/experiment/run.sh", root);
  if (access(probe, R_OK) == 0)
    return root;
  if (getcwd(root, sizeof root) && access("bench/experiment/run.sh", R_OK) == 0)
    return root;
  SKIP("bench/experiment/run.sh not found");
}

/* Summary of one scenario from results.json: name, makespan, jobs,
 * completed, failed, oom, suspensions (the daemon's; -1 without one). */
typedef struct {
  char name[64];
  double makespan;
  int jobs, completed, failed, oom, suspensions;
} scen_t;

static const char summarise[] =
    "import json,sys\n"
    "r=json.load(open(sys.argv[1]))\n"
    "for s in r['scenarios']:\n"
    "  su=s.get('suspensions')\n"
    "  print(s['name'],s['makespan_s'],s['jobs'],s['jobs_completed'],"
    "s['jobs_failed'],s['jobs_oom'],-1 if su is None else su)\n";

/* Is an executable named `name` on PATH? (Without starting a shell: in
 * sanitizer builds a shell would carry the preloaded runtime.) */
static bool on_path(const char *name) {
  const char *path = getenv("PATH");
  char dir[PATH_MAX], file[2 * PATH_MAX];
  while (path && *path) {
    size_t n = strcspn(path, ":");
    snprintf(dir, sizeof dir, "%.*s", (int)n, path);
    snprintf(file, sizeof file, "%s/%s", dir, name);
    if (access(file, X_OK) == 0)
      return true;
    path += n + (path[n] == ':');
  }
  return false;
}

/* Parses summarise's output (destroys it) into s; returns the count. */
static int parse_summary(char *out, scen_t *s, int max) {
  int n = 0;
  for (char *line = strtok(out, "\n"); line && n < max;
       line = strtok(NULL, "\n")) {
    scen_t *c = &s[n];
    if (sscanf(line, "%63s %lf %d %d %d %d %d", c->name, &c->makespan, &c->jobs,
               &c->completed, &c->failed, &c->oom, &c->suspensions) == 7)
      n++;
  }
  return n;
}

/* Says, on stderr, how each failed job of scenario scen ended: its
 * record's exit status and the end of its output (a failed run's only
 * trace where the kept folder is not at hand, as in CI). */
static void say_failed_jobs(const char *outdir, const char *scen) {
  char pat[PATH_MAX + 128];
  snprintf(pat, sizeof pat, "%s/%.63s/jobs/*.rec", outdir, scen);
  glob_t g;
  if (glob(pat, 0, NULL, &g) != 0)
    return;
  for (size_t i = 0; i < g.gl_pathc; i++) {
    char rec[512] = "", *t, *rc = NULL;
    FILE *f = fopen(g.gl_pathv[i], "re");
    if (!f)
      continue;
    if (!fgets(rec, sizeof rec, f))
      rec[0] = 0;
    fclose(f);
    rec[strcspn(rec, "\n")] = 0;
    for (t = strrchr(rec, '\t'); t; t = NULL)
      rc = t + 1;
    if (!rc || !strcmp(rc, "0"))
      continue;
    char logp[PATH_MAX + 64], tail[2048];
    snprintf(logp, sizeof logp, "%.*s.log", (int)(strlen(g.gl_pathv[i]) - 4),
             g.gl_pathv[i]);
    size_t n = 0;
    if ((f = fopen(logp, "re"))) {
      if (fseek(f, -(long)(sizeof tail - 1), SEEK_END) != 0)
        rewind(f);
      n = fread(tail, 1, sizeof tail - 1, f);
      fclose(f);
    }
    tail[n] = 0;
    fprintf(stderr, "%s: job record '%s', its output's end:\n%s\n", scen, rec,
            tail);
  }
  globfree(&g);
}

TEST_IMPL_T(experiment_fake_mix, 120) {
  if (!on_path("python3"))
    SKIP("python3 not found");
  const char *root = repo_root();
  char runsh[PATH_MAX + 64], outdir[PATH_MAX], json[PATH_MAX + 32];
  char benv[PATH_MAX + 8], preload[PATH_MAX + 32];
  snprintf(runsh, sizeof runsh, "%s/bench/experiment/run.sh", root);
  snprintf(outdir, sizeof outdir, "%s", th_path("out"));
  snprintf(json, sizeof json, "%s/results.json", outdir);
  snprintf(benv, sizeof benv, "B=%s", th_build_dir());
  /* The jobs (programs built here, under cogpu run, which appends the
   * preload library) get the sanitizer runtime preloaded first; bash,
   * python3 and other system tools do not. */
  snprintf(preload, sizeof preload, "COGPU_EXP_PRELOAD=%s",
           th_sanitizer_runtime());
  /* In two runs into one folder, as a GPU session with a per-command time
   * limit would: the results cover both. */
  const char *env[] = {benv, preload, "LD_PRELOAD=", "COGPU=", NULL};
  static char out[65536], err[65536];
  const char *parts[] = {"one-at-a-time,naive", "cogpu-fifo,cogpu-mmu-mem"};
  int rc;
  for (int i = 0; i < 2; i++) {
    const char *argv[] = {"bash", runsh,         "--mix",  "fake", "--out",
                          outdir, "--scenarios", parts[i], NULL};
    rc = th_run(argv, env, out, sizeof out, err, sizeof err, th_ms(50000));
    if (rc != 0)
      fprintf(stderr, "run.sh exit %d\n%s\n%s\n", rc, out, err);
    ASSERT_EQ(rc, 0);
  }
  /* The plot, with gnuplot (the set-up installs it). */
  if (strstr(err, "gnuplot failed") || strstr(err, "gnuplot timed out"))
    th_fail(__FILE__, __LINE__, "the plot: %s", err);
  if (on_path("gnuplot")) {
    char png[PATH_MAX + 32];
    unsigned char magic[8] = {0};
    snprintf(png, sizeof png, "%s/plot.png", outdir);
    FILE *f = fopen(png, "re");
    ASSERT(f);
    ASSERT_EQ(fread(magic, 1, 8, f), 8);
    fclose(f);
    ASSERT(!memcmp(magic, "\x89PNG\r\n\x1a\n", 8));
  }
  /* Another mix into the same folder is refused before anything runs. */
  const char *other[] = {"bash",  runsh,  "--mix", "small",
                         "--out", outdir, NULL};
  ASSERT_EQ(th_run(other, env, out, sizeof out, err, sizeof err, th_ms(20000)),
            2);
  ASSERT_CONTAINS(err, "holds results of the 'fake' mix");

  const char *pyargv[] = {"python3", "-c", summarise, json, NULL};
  const char *pyenv[] = {"LD_PRELOAD=", NULL};
  rc = th_run(pyargv, pyenv, out, sizeof out, err, sizeof err, th_ms(20000));
  if (rc != 0)
    fprintf(stderr, "summary exit %d: %s\n", rc, err);
  ASSERT_EQ(rc, 0);
  fprintf(stderr, "%s", out);

  scen_t s[16];
  int n = parse_summary(out, s, 16);
  ASSERT_EQ(n, 4);
  double one = 0;
  int seen_naive = 0, seen_cogpu = 0;
  for (int i = 0; i < n; i++) {
    ASSERT_EQ(s[i].jobs, 12);
    if (!strcmp(s[i].name, "one-at-a-time")) {
      ASSERT_EQ(s[i].completed, 12);
      one = s[i].makespan;
    }
  }
  ASSERT(one > 0);
  for (int i = 0; i < n; i++) {
    if (!strcmp(s[i].name, "naive")) {
      seen_naive = 1;
      ASSERT_GE(s[i].failed, 1);
      ASSERT_GE(s[i].oom, 1);
    } else if (!strncmp(s[i].name, "cogpu-", 6)) {
      seen_cogpu++;
      if (s[i].failed != 0)
        say_failed_jobs(outdir, s[i].name);
      if (s[i].failed != 0)
        th_fail(__FILE__, __LINE__, "%s: %d jobs failed", s[i].name,
                s[i].failed);
      /* Packing beats one at a time; under a sanitizer (TSan slows each
       * process several times, and cogpu's scenarios run more of them)
       * the clock says nothing, and only the outcomes count. */
      if (!th_sanitizer_runtime()[0] && !(s[i].makespan < one))
        th_fail(__FILE__, __LINE__, "%s: makespan %.2f s, one-at-a-time %.2f s",
                s[i].name, s[i].makespan, one);
    }
  }
  ASSERT(seen_naive);
  ASSERT_EQ(seen_cogpu, 2);

  /* The rest of the kit's output. */
  char md[PATH_MAX + 32], jobs[PATH_MAX + 32];
  snprintf(md, sizeof md, "%s/results.md", outdir);
  snprintf(jobs, sizeof jobs, "%s/jobs.tsv", outdir);
  ASSERT(access(md, R_OK) == 0);
  ASSERT(access(jobs, R_OK) == 0);
}

/* Every mix parses (id, type, peak_mib, priority, command), names each job
 * once, and is over-subscribed at least twice over its GPU, which is what
 * makes naive sharing fail and memory safety matter. */
static const char check_mixes[] =
    "import glob,os,sys\n"
    "bad=[]\n"
    "files=sorted(glob.glob(os.path.join(sys.argv[1],'*.mix')))\n"
    "for f in files:\n"
    "  total=None; ids=set(); peaks=0\n"
    "  for line in open(f):\n"
    "    t=line.split()\n"
    "    if line.startswith('# gpu_total_mib:'): total=int(t[2])\n"
    "    if not t or t[0].startswith('#'): continue\n"
    "    ok=len(t)>=5 and t[0] not in ids and t[2].isdigit()\n"
    "    ok=ok and t[3].lstrip('-').isdigit()\n"
    "    if not ok: bad.append(f+': '+line.strip()); continue\n"
    "    ids.add(t[0]); peaks+=int(t[2])\n"
    "  if not total or peaks<2*total: bad.append(f+': %d MiB of peaks on a '\n"
    "      '%s MiB GPU'%(peaks,total))\n"
    "print(len(files)); print('\\n'.join(bad))\n";

TEST_IMPL(experiment_mixes_oversubscribed) {
  if (!on_path("python3"))
    SKIP("python3 not found");
  char dir[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/bench/experiment/mixes", repo_root());
  const char *argv[] = {"python3", "-c", check_mixes, dir, NULL};
  const char *env[] = {"LD_PRELOAD=", NULL};
  static char out[16384], err[16384];
  ASSERT_EQ(th_run(argv, env, out, sizeof out, err, sizeof err, th_ms(20000)),
            0);
  int n = atoi(out);
  ASSERT_GE(n, 4); /* fake, quick, small, large */
  ASSERT_STREQ(strchr(out, '\n') + 1, "\n");
}

/* The kit's own workloads: the CUDA programs build with nvcc when it is
 * installed (they need a GPU to run, so here they only show their usage),
 * and the PyTorch scripts parse their arguments without torch. */
TEST_IMPL_T(experiment_workloads_build, 240) {
  const char *root = repo_root();
  bool nvcc = on_path("nvcc") || access("/usr/local/cuda/bin/nvcc", X_OK) == 0;
  const char *clean[] = {"LD_PRELOAD=", NULL};
  static char out[65536], err[65536];
  if (nvcc) {
    char dir[PATH_MAX + 16], bdir[PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/bench/experiment", root);
    snprintf(bdir, sizeof bdir, "B=%s", th_path("wl"));
    const char *make[] = {"make", "-s", "-C", dir, "workloads", bdir, NULL};
    int rc =
        th_run(make, clean, out, sizeof out, err, sizeof err, th_ms(200000));
    if (rc != 0)
      fprintf(stderr, "make workloads: exit %d\n%s\n%s\n", rc, out, err);
    ASSERT_EQ(rc, 0);
    const char *progs[] = {"stencil", "stream", "bursty"};
    for (int i = 0; i < 3; i++) {
      char bin[PATH_MAX + 32];
      snprintf(bin, sizeof bin, "%s/experiment/%s", th_path("wl"), progs[i]);
      const char *argv[] = {bin, "--phases", "0", NULL};
      ASSERT_EQ(
          th_run(argv, clean, out, sizeof out, err, sizeof err, th_ms(20000)),
          4);
      ASSERT_CONTAINS(err, "usage:");
    }
  }
  if (!on_path("python3")) {
    if (!nvcc)
      SKIP("neither nvcc nor python3 found");
    return;
  }
  const char *scripts[] = {"resnet.py", "transformer.py"};
  for (int i = 0; i < 2; i++) {
    char py[PATH_MAX + 64];
    snprintf(py, sizeof py, "%s/bench/experiment/workloads/%s", root,
             scripts[i]);
    const char *argv[] = {"python3", py, "--help", NULL};
    ASSERT_EQ(
        th_run(argv, clean, out, sizeof out, err, sizeof err, th_ms(20000)), 0);
    ASSERT_CONTAINS(out, "--footprint-gib");
  }
}

/* The growing mix against a private daemon, without and with suspension:
 * hold-and-wait fails jobs without it, and with it every job completes
 * (its data intact: cudaprog's verify) after at least one suspension.
 * The under-declared shape: eight declarations of 2 GiB fill the GPU
 * before any job grows, so the first growth is a deadlock whatever the
 * order (on demand, growth in order while the jobs ahead grow keeps the
 * mix from deadlocking at all, with or without suspension). Kept cheap:
 * instant checkpoint copies and a 100 ms housekeeping tick (the deadlock
 * guard acts on waiters a tick old). */
TEST_IMPL_T(experiment_fake_growing_suspend, 120) {
  if (!on_path("python3"))
    SKIP("python3 not found");
  const char *root = repo_root();
  char runsh[PATH_MAX + 64], outdir[PATH_MAX], json[PATH_MAX + 32];
  char benv[PATH_MAX + 8], preload[PATH_MAX + 32];
  snprintf(runsh, sizeof runsh, "%s/bench/experiment/run.sh", root);
  snprintf(outdir, sizeof outdir, "%s", th_path("out"));
  snprintf(json, sizeof json, "%s/results.json", outdir);
  snprintf(benv, sizeof benv, "B=%s", th_build_dir());
  snprintf(preload, sizeof preload, "COGPU_EXP_PRELOAD=%s",
           th_sanitizer_runtime());
  const char *env[] = {benv, preload, "LD_PRELOAD=", "COGPU=", "COGPUD=",
                       "FAKE_CUDA_CKPT_GBPS=0", "COGPU_SWEEP_INTERVAL=100ms",
                       /* The second daemon would learn the jobs' peaks
                        * from the first one's history and admit them so
                        * that no deadlock forms (susp_growing_jobs_learnt):
                        * this test is about breaking one. */
                       "COGPU_ADMIT_LEARNT=no", NULL};
  static char out[65536], err[65536];
  const char *argv[] = {
      "bash",        runsh,
      "--mix",       "fake-underdeclared",
      "--out",       outdir,
      "--scenarios", "cogpu-fifo-mem-nosuspend,cogpu-fifo-mem-suspend",
      NULL};
  int rc = th_run(argv, env, out, sizeof out, err, sizeof err, th_ms(90000));
  if (rc != 0)
    fprintf(stderr, "run.sh exit %d\n%s\n%s\n", rc, out, err);
  ASSERT_EQ(rc, 0);
  const char *pyargv[] = {"python3", "-c", summarise, json, NULL};
  const char *pyenv[] = {"LD_PRELOAD=", NULL};
  rc = th_run(pyargv, pyenv, out, sizeof out, err, sizeof err, th_ms(20000));
  if (rc != 0)
    fprintf(stderr, "summary exit %d: %s\n", rc, err);
  ASSERT_EQ(rc, 0);
  fprintf(stderr, "%s", out);
  scen_t s[4];
  ASSERT_EQ(parse_summary(out, s, 4), 2);
  ASSERT_STREQ(s[0].name, "cogpu-fifo-mem-nosuspend");
  ASSERT_EQ(s[0].jobs, 8);
  ASSERT_GE(s[0].oom, 1);
  ASSERT_EQ(s[0].suspensions, 0);
  ASSERT_STREQ(s[1].name, "cogpu-fifo-mem-suspend");
  ASSERT_EQ(s[1].jobs, 8);
  if (s[1].failed != 0)
    th_fail(__FILE__, __LINE__, "with suspension %d jobs failed", s[1].failed);
  ASSERT_GE(s[1].suspensions, 1);
}
