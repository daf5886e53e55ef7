/*
 * test-slurm.c: the Slurm integration, end to end. Each test starts a
 * private one-node cluster (munged, slurmctld, slurmd from Debian's
 * packages) on loopback under its temporary directory, with cogpu's SPANK
 * plug-in and cli_filter loaded and the fake GPU of the test tree, drives
 * it with srun/sbatch/salloc, and stops it whatever happens (a watchdog
 * stops it if the test is killed), checking nothing is left running.
 *
 * Skipped where Slurm is not installed, when not root (slurmd must be), and
 * in sanitizer builds: the plug-in is uninstrumented, and Slurm's
 * daemons must not inherit the sanitizer runtime the runner preloads.
 */
#include <dirent.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "ledger-helpers.h"
#include "task.h"

/* Each test's cluster is its own (its directory, munge socket and key,
 * free ports, users): two run at once. More would only share the CPUs. */
TEST_FILE_GROUP("slurm", 2)

#define GiB (1024ull * 1024 * 1024)
#define MiB (1024ull * 1024)
#define OUT_MAX 65536

static char root[PATH_MAX];    /* the source tree */
static char cluster[PATH_MAX]; /* the cluster's directory */
static char conf_env[PATH_MAX + 32];
static bool started;
/* Turn --gpu-mem into the GRES in slurmctld (job_submit.lua) rather than
 * on the client (cli_filter.lua). */
static bool server_side;

static const char *script(void) {
  static char p[PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/tests/slurm/cluster.sh", root);
  return p;
}

static const char *prog(void) {
  static char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/tests/cudaprog", th_build_dir());
  return p;
}

/* A Slurm test that cannot run here: skipped, unless the run requires the
 * Slurm tests (COGPU_TEST_REQUIRE_SLURM=1, set by .ci/run, whose set-up
 * installs everything they need): then it fails, saying why. */
#define SLURM_SKIP(...)                                                        \
  do {                                                                         \
    const char *req_ = getenv("COGPU_TEST_REQUIRE_SLURM");                     \
    if (req_ && !strcmp(req_, "1"))                                            \
      th_fail(__FILE__, __LINE__,                                              \
              "the Slurm tests are required (COGPU_TEST_REQUIRE_SLURM=1) "     \
              "but cannot run: " __VA_ARGS__);                                 \
    SKIP(__VA_ARGS__);                                                         \
  } while (0)

static void find_root(void) {
  snprintf(root, sizeof root, "%s", th_build_dir());
  char *slash = strrchr(root, '/');
  if (slash)
    *slash = 0;
  if (access(script(), X_OK) != 0 &&
      (!getcwd(root, sizeof root) || access(script(), X_OK) != 0))
    SLURM_SKIP("tests/slurm/cluster.sh not found");
}

static void require(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  SKIP("Slurm tests run in the plain build (uninstrumented plug-in)");
#endif
  if (geteuid() != 0)
    SLURM_SKIP("starting slurmd needs root");
  if (access("/usr/sbin/slurmctld", X_OK) || access("/usr/sbin/slurmd", X_OK) ||
      access("/usr/sbin/munged", X_OK) || access("/usr/bin/srun", X_OK))
    SLURM_SKIP("Slurm or munge not installed (scripts/setup.sh installs them)");
  char p[PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/spank_cogpu.so", th_build_dir());
  if (access(p, R_OK))
    SLURM_SKIP("spank_cogpu.so not built (needs libslurm-dev)");
  find_root();
}

/* The jobs run as unprivileged users, as on a real cluster: slurmstepd
 * then runs the plug-in's slurm_spank_user_init and the tasks with the
 * user's credentials. USER1 submits; USER2 is the other user of
 * cross-user checks. Each test makes its own (cogpu-sPID-1 and -2),
 * removed at its end, so tests with clusters of their own run at once. */
static char user1[32], user2[32];
#define USER1 user1
#define USER2 user2
static const char *run_as = USER1; /* sh()'s user; NULL: root */

static int run_cmd(const char *user, const char *cmd, char *out, size_t outlen,
                   int timeout_ms) {
  static char err[OUT_MAX];
  char uid[16] = "", gid[16] = "";
  if (user) {
    struct passwd *pw = getpwnam(user);
    if (!pw)
      th_fail(__FILE__, __LINE__, "no user %s", user);
    snprintf(uid, sizeof uid, "%u", (unsigned)pw->pw_uid);
    snprintf(gid, sizeof gid, "%u", (unsigned)pw->pw_gid);
  }
  const char *as_user[] = {"setpriv",       "--reuid", uid,  "--regid", gid,
                           "--init-groups", "sh",      "-c", cmd,       NULL};
  const char *as_root[] = {"sh", "-c", cmd, NULL};
  const char *env[] = {conf_env, user ? "HOME=/tmp" : NULL, NULL};
  int rc = th_run(user ? as_user : as_root, env, out, outlen, err, sizeof err,
                  timeout_ms);
  if (out && outlen) {
    size_t n = strlen(out);
    snprintf(out + n, outlen - n, "%s", err);
  }
  return rc;
}

/* A shell command as the test's job user (root where run_as is NULL). */
static int sh(const char *cmd, char *out, size_t outlen, int timeout_ms) {
  return run_cmd(run_as, cmd, out, outlen, timeout_ms);
}

/* A shell command as root (the admin, or another program on the node). */
static int sh_root(const char *cmd, char *out, size_t outlen, int timeout_ms) {
  return run_cmd(NULL, cmd, out, outlen, timeout_ms);
}

static void users_make(void) {
  snprintf(user1, sizeof user1, "cogpu-s%d-1", (int)getpid());
  snprintf(user2, sizeof user2, "cogpu-s%d-2", (int)getpid());
  const char *const names[] = {USER1, USER2};
  char out[4096], cmd[256];
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(names); i++) {
    snprintf(cmd, sizeof cmd,
             "id -u %s >/dev/null 2>&1 || useradd -M -N -s /bin/sh "
             "-d /nonexistent %s",
             names[i], names[i]);
    if (sh_root(cmd, out, sizeof out, th_ms(20000)))
      th_fail(__FILE__, __LINE__, "cannot make user %s:\n%s", names[i], out);
  }
}

static void users_remove(void) {
  char out[4096];
  if (!user1[0])
    return; /* never made */
  char cmd[128];
  snprintf(cmd, sizeof cmd, "userdel %s; userdel %s; true", USER1, USER2);
  sh_root(cmd, out, sizeof out, th_ms(20000));
}

static void stop_cluster(void) {
  if (!started)
    return;
  started = false;
  char out[OUT_MAX];
  const char *stop[] = {script(), "stop", cluster, NULL};
  th_run(stop, NULL, out, sizeof out, out, sizeof out, th_ms(60000));
  const char *check[] = {script(), "check", cluster, NULL};
  int left =
      th_run(check, NULL, out, sizeof out, out, sizeof out, th_ms(10000));
  if (run_as)
    users_remove();
  if (left)
    th_fail(__FILE__, __LINE__, "cluster left processes behind:\n%s", out);
}

/* Start the cluster with a node of `gpumem` and fake GPUs `gpus`
 * (FAKE_NVML_GPUS: sizes, comma-separated). */
static void start_cluster_gpus(const char *gpumem, const char *gpus) {
  require();
  char spank[PATH_MAX + 32], filter[PATH_MAX + 48], fakes[PATH_MAX + 16],
      owner[32];
  snprintf(cluster, sizeof cluster, "%s/cluster", th_tmpdir());
  snprintf(conf_env, sizeof conf_env, "SLURM_CONF=%s/slurm.conf", cluster);
  snprintf(spank, sizeof spank, "%s/spank_cogpu.so", th_build_dir());
  snprintf(filter, sizeof filter, "%s/contrib/slurm/cli_filter.lua", root);
  snprintf(fakes, sizeof fakes, "%s/tests/fakes", th_build_dir());
  snprintf(owner, sizeof owner, "%d", (int)getpid());
  setenv("COGPU_SPANK", spank, 1);
  if (server_side) {
    snprintf(filter, sizeof filter, "%s/contrib/slurm/job_submit.lua", root);
    setenv("COGPU_JOB_SUBMIT", filter, 1);
  } else {
    setenv("COGPU_CLI_FILTER", filter, 1);
  }
  setenv("COGPU_CLUSTER_OWNER", owner, 1);
  th_setenv("FAKE_NVML_GPUS", gpus);
  setenv("LD_LIBRARY_PATH", fakes, 1);
  th_setenv("COGPU_MARGIN", "0");
  setenv("COGPU_CONTEXT_BYTES", "300M", 1);
  setenv("FAKE_CUDA_CTX_BYTES", "300M", 1);
  setenv("COGPU_LOG", "warn", 1);
  char out[OUT_MAX];
  /* Node mode, with the test's own cogpud (the node's state in the test's
   * directory), as docs/slurm.md recommends for shared nodes; a test of
   * single-user mode runs its jobs as root (run_as NULL). */
  if (run_as) {
    setenv("COGPU_NODE_MODE", "daemon", 1);
    if (th_daemon_pid() <= 0)
      th_daemon_start();
    users_make();
    /* The jobs' users write their output here, and their tasks use the
     * fake GPU, whose state file the first process makes: made now, by
     * root, and opened to them (inside the test's private directory). */
    char fake[PATH_MAX + 64];
    snprintf(fake, sizeof fake, "%s direct init >/dev/null && chmod 0666 %s",
             prog(), getenv("FAKE_CUDA_STATE"));
    if (chmod(th_tmpdir(), 01777) != 0 ||
        sh_root(fake, out, sizeof out, th_ms(20000)) != 0)
      th_fail(__FILE__, __LINE__, "cannot open the test to its users:\n%s",
              out);
  }
  const char *argv[] = {script(), "start", cluster, gpumem, NULL};
  started = true;
  atexit(stop_cluster); /* th_fail exits; a killed test has the watchdog */
  if (th_run(argv, NULL, out, sizeof out, out, sizeof out, th_ms(60000)))
    th_fail(__FILE__, __LINE__, "the cluster did not start:\n%s", out);
}

static void start_cluster(const char *gpumem) {
  start_cluster_gpus(gpumem, gpumem);
}

/* The job's reservation on GPU 0 as cogpu status shows it, by Slurm id. */
static uint64_t job_reserved(const char *job_id, char *user, size_t len) {
  cogpu_status_t *st = lt_status();
  uint64_t got = 0;
  for (size_t c = 0; c < st->gpus[0].nclients; c++)
    if (!strcmp(st->gpus[0].clients[c].job_id, job_id)) {
      got += st->gpus[0].clients[c].reserved_bytes;
      if (user)
        snprintf(user, len, "%s", st->gpus[0].clients[c].user);
    }
  cogpu_status_free(st);
  return got;
}

/* Wait (bounded) until the job reserves `want` (its step may start a
 * moment after Slurm shows it running). */
static void wait_job_reserved(const char *job_id, uint64_t want, int ms) {
  uint64_t got = 0;
  for (int i = 0; i < th_ms(ms) / 50; i++) {
    if ((got = job_reserved(job_id, NULL, 0)) == want)
      return;
    th_sleep_ms(50);
  }
  th_fail(__FILE__, __LINE__, "job %s reserves %llu, expected %llu", job_id,
          (unsigned long long)got, (unsigned long long)want);
}

/* Wait (bounded) until `cmd`'s output contains `want`; returns the output.
 * It runs as root: it only looks (Slurm's queue, the cluster's logs). */
static const char *wait_output(const char *cmd, const char *want, int ms) {
  static char out[OUT_MAX];
  for (int i = 0; i < th_ms(ms) / 100; i++) {
    sh_root(cmd, out, sizeof out, th_ms(20000));
    if (strstr(out, want))
      return out;
    th_sleep_ms(100);
  }
  th_fail(__FILE__, __LINE__, "'%s' never showed '%s'; last:\n%s", cmd, want,
          out);
}

static void wait_jobs_done(int ms) {
  /* Marked: a bare "0\n" is also the end of "10\n". */
  wait_output("echo jobs=$(squeue -h -o '%i %T' | wc -l)", "jobs=0\n", ms);
}

static const char *file(const char *name) {
  static char buf[OUT_MAX];
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/%s", th_tmpdir(), name);
  FILE *f = fopen(p, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f)
    fclose(f);
  buf[n] = 0;
  return buf;
}

/* What a task sees: the preload library and the job's token. */
static void expect_under_cogpu(const char *out, const char *mem) {
  ASSERT_CONTAINS(out, "libcogpu-preload.so");
  ASSERT_CONTAINS(out, "COGPU_JOB_TOKEN=");
  ASSERT_CONTAINS(out, mem);
}

/* A script printing what cogpu set in a task's environment. */
static const char *task_env(void) {
  static char p[PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/taskenv.sh", th_tmpdir());
  th_write_file(p, "env | grep -E '^(LD_PRELOAD|COGPU_[A-Z_]+)='\n");
  return p;
}

TEST_IMPL_ONCE_T(slurm_gpu_mem_in_srun_sbatch_salloc, 240) {
  start_cluster("80G");
  char out[OUT_MAX], cmd[PATH_MAX * 2];
  /* srun */
  snprintf(cmd, sizeof cmd, "srun --gpu-mem=2G sh %s", task_env());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  expect_under_cogpu(out, "COGPU_MEM=2147483648");
  /* sbatch --gpu-mem, and the job asked Slurm for the GRES. */
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/batch.out --gpu-mem=3G --wrap 'sh %s' && "
           "scontrol show job -d | grep -o 'gres.cogpumem:[^ ]*'",
           th_tmpdir(), th_tmpdir(), task_env());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "gres:cogpumem:3G");
  wait_jobs_done(60000);
  expect_under_cogpu(file("batch.out"), "COGPU_MEM=3221225472");
  /* #SBATCH --gpu-mem in the script */
  snprintf(cmd, sizeof cmd,
           "printf '#!/bin/sh\\n#SBATCH --gpu-mem=4G\\n#SBATCH -o %s/s.out\\n"
           "sh %s\\n' > %s/job.sh && sbatch -D %s %s/job.sh",
           th_tmpdir(), task_env(), th_tmpdir(), th_tmpdir(), th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  wait_jobs_done(60000);
  expect_under_cogpu(file("s.out"), "COGPU_MEM=4294967296");
  /* salloc, with a step inside the allocation */
  snprintf(cmd, sizeof cmd,
           "salloc --gpu-mem=5G sh -c 'scontrol show job -d $SLURM_JOB_ID | "
           "grep -o \"gres.cogpumem:[^ ]*\"; srun sh %s'",
           task_env());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "gres:cogpumem:5G");
  expect_under_cogpu(out, "COGPU_MEM=5368709120");
  stop_cluster(); /* tests end with _exit: no atexit */
}

TEST_IMPL_ONCE_T(slurm_bad_values_refused_at_submission, 240) {
  start_cluster("80G");
  static const struct {
    const char *opt, *msg;
  } bad[] = {
      {"--gpu-mem=banana", "cogpu: invalid --gpu-mem 'banana'"},
      {"--gpu-mem=1.5G", "cogpu: invalid --gpu-mem '1.5G'"},
      {"--gpu-mem=0", "cogpu: --gpu-mem must be more than 0"},
      {"--gpu-mem=81G",
       "more GPU memory than any single GPU has (largest: 81920 MiB)"},
      {"--gpu-mem=1G --gpu-priority=5000", "cogpu: invalid --gpu-priority"},
      {"--gpu-mem=1G --gpu-wait=soon", "cogpu: invalid --gpu-wait 'soon'"},
  };
  static const char *const cmds[] = {"srun", "sbatch --wrap true", "salloc"};
  char out[OUT_MAX], cmd[512];
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bad); i++)
    for (size_t c = 0; c < COGPU_ARRAY_SIZE(cmds); c++) {
      snprintf(cmd, sizeof cmd, "%s %s%s", cmds[c], bad[i].opt,
               c == 1 ? "" : " true");
      int rc = sh(cmd, out, sizeof out, th_ms(30000));
      if (rc == 0 || !strstr(out, bad[i].msg))
        th_fail(__FILE__, __LINE__, "'%s' exit %d, expected refusal '%s':\n%s",
                cmd, rc, bad[i].msg, out);
    }
  /* Nothing was submitted. */
  ASSERT_EQ(sh("squeue -h; scontrol show jobs", out, sizeof out, th_ms(20000)),
            0);
  ASSERT_CONTAINS(out, "No jobs in the system");
  /* A typo on the plug-in's plugstack.conf line is an error, not ignored
   * (srun reads plugstack.conf itself, at each run). */
  char conf[PATH_MAX + 32], line[PATH_MAX * 2];
  snprintf(conf, sizeof conf, "%s/plugstack.conf", cluster);
  snprintf(line, sizeof line, "required %s prelod=/x\n", getenv("COGPU_SPANK"));
  th_write_file(conf, line);
  ASSERT_NE(sh("srun --gpu-mem=1G true", out, sizeof out, th_ms(30000)), 0);
  ASSERT_CONTAINS(out, "cogpu: unknown argument 'prelod=/x' in plugstack.conf");
  /* A preload library that is not there fails the task, saying so. */
  snprintf(line, sizeof line, "required %s preload=/nonexistent/lib.so\n",
           getenv("COGPU_SPANK"));
  th_write_file(conf, line);
  ASSERT_NE(sh("srun --gpu-mem=1G true", out, sizeof out, th_ms(30000)), 0);
  ASSERT_CONTAINS(out, "/nonexistent/lib.so");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Three 30G jobs on an 80G node: two run at once, the third waits in
 * Slurm's queue; the running ones hold their reservations in cogpu. */
static void packs_jobs(void) {
  start_cluster("80G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  for (int i = 1; i <= 3; i++) {
    /* A gpumem count given by hand is replaced by --gpu-mem's. */
    /* Each holds until the test has looked (a cue: a hold of 4 s ran out
     * before the look on a loaded machine, and the third job ran). */
    snprintf(cmd, sizeof cmd,
             "sbatch -D %s -o %s/pack%d.out --gpu-mem=30G %s --wrap "
             "'%s direct init ctx alloc:20G waitfile:%s/pack.go'",
             th_tmpdir(), th_tmpdir(), i, i == 3 ? "--gres=cogpumem:1G" : "",
             prog(), th_tmpdir());
    ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  }
  wait_output("squeue -h -o '%i %t %r' | sort",
              "1 R None\n2 R None\n3 PD Resources\n", 30000);
  char user[64] = "";
  wait_job_reserved("1", 30 * GiB, 20000);
  wait_job_reserved("2", 30 * GiB, 20000);
  ASSERT_UEQ(job_reserved("1", user, sizeof user), 30 * GiB);
  ASSERT_STREQ(user, USER1); /* the job's user, booked by root */
  ASSERT_UEQ(job_reserved("3", NULL, 0), 0);
  /* cogpu status --json names the Slurm jobs too. */
  ASSERT_EQ(sh("cogpu status --json", out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "\"job_id\":\"1\"");
  ASSERT_CONTAINS(out, "\"job_id\":\"2\"");
  char go[PATH_MAX + 32];
  snprintf(go, sizeof go, "%s/pack.go", th_tmpdir());
  th_write_file(go, "");
  wait_jobs_done(60000);
  for (int i = 1; i <= 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "pack%d.out", i);
    const char *o = file(name);
    if (strstr(o, "error"))
      th_fail(__FILE__, __LINE__, "job %d failed:\n%s", i, o);
  }
  ASSERT_UEQ(job_reserved("3", NULL, 0), 0);
  lt_check_invariants();
  stop_cluster(); /* tests end with _exit: no atexit */
}

TEST_IMPL_ONCE_T(slurm_packs_jobs_by_gpu_memory, 240) {
  packs_jobs();
}

/* The same with the GRES set in slurmctld, which no client can skip. */
TEST_IMPL_ONCE_T(slurm_packs_jobs_by_gpu_memory_job_submit, 240) {
  server_side = true;
  packs_jobs();
}

static unsigned long long fake_peak(void) {
  unsigned long long peak, ooms;
  lt_fake_cuda_stats(&peak, &ooms);
  return peak;
}

/* A job that declared 10G and allocates more: with --gpu-wait=0 it gets
 * out-of-memory at once; with a bound, it waits until a neighbour is done. The
 * neighbour completes untouched, and the GPU is never over-committed. */
TEST_IMPL_ONCE_T(slurm_under_declared_job_waits_or_ooms, 240) {
  start_cluster("80G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  /* The 40G job holds until told (a cue, not a hold of 6 s that a loaded
   * machine's first step outlasted). */
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/big.out --gpu-mem=40G --wrap "
           "'%s direct init ctx alloc:38G waitfile:%s/big.go'",
           th_tmpdir(), th_tmpdir(), prog(), th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_output("squeue -h -o '%i %t'", "1 R", 30000);
  wait_job_reserved("1", 40 * GiB, 20000);
  snprintf(cmd, sizeof cmd,
           "srun --gpu-mem=10G --gpu-wait=0 %s direct init ctx alloc:8G "
           "alloc:35G",
           prog());
  ASSERT_NE(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "alloc: error 2"); /* CUDA_ERROR_OUT_OF_MEMORY */
  /* With a bound it waits; the 40G job ends once it is seen waiting. */
  snprintf(cmd, sizeof cmd,
           "(srun --gpu-mem=10G --gpu-wait=2m %s direct init ctx alloc:8G "
           "alloc:35G; echo rc=$?) > %s/wait.out 2>&1 &",
           prog(), th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  char look[PATH_MAX + 32], go[PATH_MAX + 32];
  snprintf(look, sizeof look, "cat %s/wait.out", th_tmpdir());
  wait_output(look, "waiting for", 60000);
  snprintf(go, sizeof go, "%s/big.go", th_tmpdir());
  th_write_file(go, "");
  snprintf(out, sizeof out, "%s", wait_output(look, "rc=", 120000));
  ASSERT_CONTAINS(out, "rc=0");
  /* It waited, and could only grow once the 40G job had given its memory
   * back: the GPU was never over-committed (the fake driver's peak). Not
   * squeue's view of job 1, which may still say R a moment after its
   * process ended (Slurm's own lag, long under load). */
  ASSERT_CONTAINS(out, "waiting for");
  wait_jobs_done(60000);
  ASSERT(strstr(file("big.out"), "error") == NULL);
  ASSERT_ULE(fake_peak(), 80 * GiB);
  lt_check_invariants();
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* The highest reservation of Slurm job `job_id` until no job is left. */
static uint64_t peak_until_done(const char *job_id) {
  char out[OUT_MAX];
  uint64_t peak = 0;
  for (int i = 0; i < th_ms(60000) / 50; i++) {
    uint64_t r = job_reserved(job_id, NULL, 0);
    peak = r > peak ? r : peak;
    sh("squeue -h | wc -l", out, sizeof out, th_ms(20000));
    if (!strcmp(out, "0\n"))
      break;
  }
  return peak;
}

/* A batch job whose script runs a CUDA program itself and then in a step:
 * both draw on the job's one reservation. */
TEST_IMPL_ONCE_T(slurm_batch_and_steps_share_the_job_reservation, 240) {
  start_cluster("80G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/share.out --gpu-mem=8G --wrap "
           "'%s direct init ctx alloc:4G hold:1500 && "
           "srun %s direct init ctx alloc:6G hold:1500'",
           th_tmpdir(), th_tmpdir(), prog(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  ASSERT_UEQ(peak_until_done("1"), 8 * GiB);
  const char *o = file("share.out");
  if (strstr(o, "error"))
    th_fail(__FILE__, __LINE__, "job failed:\n%s", o);
  /* Steps that ask for none of cogpu's GRES (--gres=cogpumem:0, which the
   * cli_filter keeps) run at once, still within the job's reservation. */
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/conc.out -n2 --gpu-mem=8G --wrap '"
           "for s in a b; do srun -n1 --exact --mem=50M --gres=cogpumem:0 "
           "sh -c \"date +%%s.%%N; %s direct init ctx alloc:3G hold:3000; "
           "date +%%s.%%N\" >%s/step-$s.out 2>&1 & done; wait'",
           th_tmpdir(), th_tmpdir(), prog(), th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  ASSERT_UEQ(peak_until_done("2"), 8 * GiB);
  double a0 = 0, a1 = 0, b0 = 0, b1 = 0;
  if (sscanf(file("step-a.out"), "%lf alloc %*s ok %lf", &a0, &a1) != 2 ||
      sscanf(file("step-b.out"), "%lf alloc %*s ok %lf", &b0, &b1) != 2)
    th_fail(__FILE__, __LINE__, "steps:\n%s\n%s", file("step-a.out"),
            file("step-b.out"));
  ASSERT(a0 < b1 && b0 < a1); /* they overlapped */
  lt_check_invariants();
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Without --gpu-mem nothing changes: no preload, no reservation, no GRES. */
TEST_IMPL_ONCE_T(slurm_jobs_without_the_option_are_unaffected, 240) {
  start_cluster("80G");
  char out[OUT_MAX], cmd[PATH_MAX * 2];
  /* The counts are marked: srun adds lines of its own to the output when
   * Slurm is slow to free the previous step's allocation. */
  ASSERT_EQ(sh("srun sh -c 'echo count=$(env | grep -c -E "
               "\"^COGPU_JOB|cogpu-preload\")'",
               out, sizeof out, th_ms(60000)),
            0);
  ASSERT_CONTAINS(out, "count=0\n");
  /* A user's own CUDA_VISIBLE_DEVICES is not a GPU Slurm gave the job. */
  ASSERT_EQ(sh("CUDA_VISIBLE_DEVICES=0 srun sh -c 'echo count=$(cogpu status "
               "--json | grep -c .exclusive.:true)'",
               out, sizeof out, th_ms(60000)),
            0);
  ASSERT_CONTAINS(out, "count=0\n");
  snprintf(cmd, sizeof cmd,
           "srun %s direct init ctx alloc:1G hold:1500 & sleep 0.8; "
           "echo count=$(scontrol show job -d | grep -c cogpumem); wait",
           prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "count=0\n");
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  cogpu_status_free(st);
  /* --gpu-no-preload keeps the reservation but does not interpose. */
  /* Marked: srun adds lines of its own ("queued and waiting") when Slurm
   * is slow to free the previous step's allocation. */
  ASSERT_EQ(sh("srun --gpu-mem=1G --gpu-no-preload sh -c 'echo preload=$(env "
               "| grep -c cogpu-preload); echo reserved=$(cogpu status --json "
               "| grep -c reserved_bytes.:1073741824)'",
               out, sizeof out, th_ms(60000)),
            0);
  ASSERT_CONTAINS(out, "preload=0\n");
  ASSERT_CONTAINS(out, "reserved=1\n");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* The task's COGPU_GPU and CUDA_VISIBLE_DEVICES, as "gpu=N cvd=X". */
static const char *task_gpu(const char *srun_opts) {
  static char out[OUT_MAX];
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "srun %s sh -c 'echo gpu=$COGPU_GPU cvd=$CUDA_VISIBLE_DEVICES' "
           "2>/dev/null", /* stdout only: not the end-of-job line */
           srun_opts);
  if (sh(cmd, out, sizeof out, th_ms(60000)) != 0)
    th_fail(__FILE__, __LINE__, "%s:\n%s", cmd, out);
  return out;
}

/* A node with two GPUs that Slurm also schedules whole (`gpu` GRES): a
 * --gpu-mem job that Slurm gave a GPU reserves on that GPU, and a GPU that
 * Slurm gave whole to a job without --gpu-mem stays exclusive: cogpu
 * places --gpu-mem jobs elsewhere. */
TEST_IMPL_ONCE_T(slurm_coexists_with_whole_gpu_jobs, 240) {
  setenv("COGPU_CLUSTER_GPUS", "2", 1);
  start_cluster_gpus("160G", "80G,80G");
  char out[OUT_MAX], cmd[PATH_MAX * 2];
  /* 70G on GPU 0 (auto placement picks the first of two empty GPUs). */
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o /dev/null --gpu-mem=70G --wrap "
           "'sleep 600'",
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_output("squeue -h -o '%i %t'", "1 R", 30000);
  wait_job_reserved("1", 70 * GiB, 20000);
  /* Slurm gives this job GPU 0: its 5G go there, not to the emptier GPU. */
  ASSERT_CONTAINS(task_gpu("--gres=gpu:1 --gpu-mem=5G"), "gpu=0 cvd=0\n");
  /* A whole-GPU job without --gpu-mem (Slurm gives it GPU 0): it holds its
   * GPU exclusively in the ledger. */
  snprintf(cmd, sizeof cmd,
           "scancel 1 && sbatch -D %s -o /dev/null "
           "--gres=gpu:1 --wrap 'sleep 600'",
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_output("squeue -h -o '%i %t %b'", "3 R gres:gpu:1", 30000);
  cogpu_status_t *st = NULL;
  for (int i = 0; i < th_ms(20000) / 50; i++) {
    st = lt_status();
    if (st->gpus[0].exclusive)
      break;
    cogpu_status_free(st);
    st = NULL;
    th_sleep_ms(50);
  }
  ASSERT(st != NULL);
  ASSERT_STREQ(st->gpus[0].clients[0].job_id, "3");
  cogpu_status_free(st);
  /* A --gpu-mem job now goes to GPU 1, whatever it asks. */
  ASSERT_CONTAINS(task_gpu("--gpu-mem=5G"), "gpu=1 cvd=GPU-");
  ASSERT_EQ(sh("scancel 3", out, sizeof out, th_ms(60000)), 0);
  wait_jobs_done(60000);
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* A GPU that Slurm hands whole to a job while --gpu-mem jobs hold memory
 * there (a mixed node): the job says it waits for them to leave, for at
 * most plugstack.conf's whole_gpu_wait, then runs unguarded; without the
 * argument it waits until they are gone. */
TEST_IMPL_ONCE_T(slurm_whole_gpu_job_waits_for_gpu_mem_jobs, 240) {
  setenv("COGPU_CLUSTER_GPUS", "2", 1);
  start_cluster_gpus("160G", "80G,80G");
  char out[OUT_MAX], cmd[PATH_MAX * 2], conf[PATH_MAX + 32];
  char line[PATH_MAX * 2];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o /dev/null --gpu-mem=70G --wrap 'sleep 600'",
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_output("squeue -h -o '%i %t'", "1 R", 30000);
  wait_job_reserved("1", 70 * GiB, 20000);
  snprintf(conf, sizeof conf, "%s/plugstack.conf", cluster);
  snprintf(line, sizeof line, "required %s whole_gpu_wait=soon\n",
           getenv("COGPU_SPANK"));
  th_write_file(conf, line);
  ASSERT_NE(sh("srun --gres=gpu:1 true", out, sizeof out, th_ms(30000)), 0);
  ASSERT_CONTAINS(out, "whole_gpu_wait");
  /* Bounded: it waits 2 s, then runs anyway. */
  snprintf(line, sizeof line, "required %s whole_gpu_wait=2s\n",
           getenv("COGPU_SPANK"));
  th_write_file(conf, line);
  uint64_t t0 = cogpu__now_ns();
  ASSERT_EQ(sh("srun --gres=gpu:1 sh -c 'echo started'", out, sizeof out,
               th_ms(60000)),
            0);
  ASSERT_GE((int64_t)((cogpu__now_ns() - t0) / 1000000), 2000);
  /* slurmstepd's own messages go to slurmd's log; the task tells the
   * user. */
  /* How long it says it waited is the machine's business (>= 2 s, checked
   * above); what it says it did is the plug-in's. */
  ASSERT_CONTAINS(out, "s for --gpu-mem jobs to leave GPU 0; it runs "
                       "without exclusive use (whole_gpu_wait)");
  ASSERT_CONTAINS(out, "started");
  /* Unbounded (the default): it runs once the --gpu-mem job has ended. */
  snprintf(line, sizeof line, "required %s\n", getenv("COGPU_SPANK"));
  th_write_file(conf, line);
  snprintf(cmd, sizeof cmd,
           "srun --gres=gpu:1 sh -c 'echo started2' >%s/whole.out 2>&1 &",
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  char log[PATH_MAX + 64];
  snprintf(log, sizeof log,
           "grep -c 'waiting for --gpu-mem jobs' %s/slurmd.log", cluster);
  /* The bounded step's line, and this one: it waits (the line is printed
   * where it starts waiting), so it has not started. */
  wait_output(log, "2\n", 20000);
  ASSERT(!strstr(file("whole.out"), "started2"));
  ASSERT_EQ(sh("scancel 1", out, sizeof out, th_ms(60000)), 0);
  /* The step's own output and the plug-in's line come on two streams: one
   * may land first. */
  for (int i = 0; i < th_ms(30000) / 100 &&
                  !(strstr(file("whole.out"), "started2") &&
                    strstr(file("whole.out"), "to leave GPU 0\n"));
       i++)
    th_sleep_ms(100);
  ASSERT_CONTAINS(file("whole.out"), "started2");
  ASSERT_CONTAINS(file("whole.out"), "for --gpu-mem jobs to leave GPU 0\n");
  ASSERT(!strstr(file("whole.out"), "without exclusive use"));
  wait_jobs_done(60000);
  /* A --gpu-mem step whose memory is held outside Slurm (here by cogpu
   * jobs started on the node) waits for it, and says so. The two hold
   * until a request waits on the node (the step's): a fixed 3 s ran out
   * before a loaded machine started the step, which then never waited. */
  const char *t = th_tmpdir();
  /* The first to see the waiter tells the other (once one has gone, the
   * step may no longer wait). */
  snprintf(cmd, sizeof cmd,
           "for g in 0 1; do cogpu run --mem 70G --gpu $g -- sh -c "
           "'touch %s/held3.'$g'; until [ -e %s/seen3 ] || cogpu status | "
           "grep -q \"^  waiting:\"; do sleep 0.1; done; touch %s/seen3' & "
           "done; "
           "until [ -e %s/held3.0 ] && [ -e %s/held3.1 ]; do sleep 0.1; done; "
           "srun --gpu-mem=30G sh -c 'echo ran3'; wait",
           t, t, t, t, t);
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "for 30720 MiB of GPU memory\n");
  ASSERT_CONTAINS(out, "ran3");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* ------------------------------------------------------------------------ */
/* Issue 13: no user can drain a node, fake success or escape accounting    */
/* ------------------------------------------------------------------------ */

/* `scontrol show job ID` (state, exit code, AdminComment). */
static const char *show_job(const char *id) {
  static char out[OUT_MAX];
  char cmd[128];
  snprintf(cmd, sizeof cmd, "scontrol show job %s", id);
  sh(cmd, out, sizeof out, th_ms(20000));
  return out;
}

/* The node is in service: never drained by a job's failure. */
static void expect_node_in_service(void) {
  char out[OUT_MAX];
  ASSERT_EQ(sh("sinfo -h -N -o '%T|%E'", out, sizeof out, th_ms(60000)), 0);
  if (strstr(out, "drain") || strstr(out, "DRAIN") || strstr(out, "down"))
    th_fail(__FILE__, __LINE__, "the node is out of service:\n%s", out);
}

/* A batch job that failed because its memory could not be reserved on the
 * node: FAILED with exit code 1, cogpu's reason in its output and in its
 * AdminComment, and its script never ran. */
static void expect_batch_failed(const char *id, const char *outfile,
                                const char *why) {
  wait_jobs_done(60000);
  const char *job = show_job(id);
  ASSERT_CONTAINS(job, "JobState=FAILED");
  ASSERT_CONTAINS(job, "ExitCode=1:0");
  ASSERT_CONTAINS(job, "AdminComment=cogpu: job ");
  ASSERT_CONTAINS(job, why);
  const char *o = file(outfile);
  ASSERT_CONTAINS(o, why);
  ASSERT(!strstr(o, "script ran"));
}

/* Issue 13 item 1. A reservation that fails on the node, because the job
 * is bigger than any of the node's GPUs (the submit check only knows the
 * node's total here: no per-GPU feature) or because --gpu-wait runs out
 * while processes outside cogpu hold the GPUs, fails the job: srun exits
 * non-zero, a batch job ends FAILED 1:0, the user reads why in the job's
 * stderr and in `scontrol show job` (AdminComment), and the node stays in
 * service. (It used to fail in slurm_spank_user_init: slurmd reported a
 * launch failure, slurmctld drained the node and the job ended COMPLETED
 * 0:0; srun exited 0.) */
TEST_IMPL_ONCE_T(slurm_failed_reservation_fails_the_job, 240) {
  start_cluster_gpus("32G", "16G,16G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  /* Bigger than any GPU of the node. */
  const char *big = "cannot reserve 20480 MiB of GPU memory on this node";
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/big.out --gpu-mem=20G --wrap 'echo script ran'",
           th_tmpdir(), th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  expect_batch_failed("1", "big.out", big);
  expect_node_in_service();
  ASSERT_NE(
      sh("srun --gpu-mem=20G echo script ran", out, sizeof out, th_ms(60000)),
      0);
  ASSERT_CONTAINS(out, big);
  ASSERT(!strstr(out, "script ran"));
  /* srun returns when the step has failed; the job may still be
   * COMPLETING for a moment (seen in a loaded run): its final state. */
  wait_output("scontrol show job 2", "JobState=FAILED", 30000);
  expect_node_in_service();
  /* --gpu-wait runs out: processes outside cogpu hold most of each GPU. */
  snprintf(cmd, sizeof cmd,
           "CUDA_VISIBLE_DEVICES=0 %s direct init ctx alloc:14G hold:60000 "
           ">/dev/null 2>&1 & CUDA_VISIBLE_DEVICES=1 %s direct init ctx "
           "alloc:14G hold:60000 >/dev/null 2>&1 &",
           prog(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  /* The ledger has seen them (it reads NVML at most once a second). */
  for (int i = 0; i < th_ms(20000) / 100; i++) {
    cogpu_status_t *st = lt_status();
    bool seen = st->gpus[0].foreign_bytes >= 14 * GiB &&
                st->gpus[1].foreign_bytes >= 14 * GiB;
    cogpu_status_free(st);
    if (seen)
      break;
    th_sleep_ms(100);
  }
  /* The bound is what is left of 2 s when the request is made: 1999 ms
   * or 2000 ms, as the clock falls. */
  const char *late = "cannot reserve 5120 MiB of GPU memory on this node: "
                     "timed out after ";
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/wait.out --gpu-mem=5G --gpu-wait=2s --wrap "
           "'echo script ran'",
           th_tmpdir(), th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  expect_batch_failed("3", "wait.out", late);
  ASSERT_NE(sh("srun --gpu-mem=5G --gpu-wait=2s echo script ran", out,
               sizeof out, th_ms(60000)),
            0);
  ASSERT_CONTAINS(out, late);
  ASSERT(!strstr(out, "script ran"));
  expect_node_in_service();
  /* The node still runs jobs that fit. */
  ASSERT_EQ(sh("srun --gpu-mem=1G echo fits", out, sizeof out, th_ms(60000)),
            0);
  ASSERT_CONTAINS(out, "fits");
  sh("pkill -f 'alloc:14G hold:60000'", out, sizeof out, th_ms(10000));
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Issue 13 item 2. On a node of two 16G GPUs (32G of cogpumem), a job of
 * 20G could never run: the node's cogpu_gpu_16G feature (`cogpu
 * slurm-conf` prints it) tells srun, sbatch and salloc the size of its
 * largest GPU, and the job is refused at submission. */
TEST_IMPL_ONCE_T(slurm_gpu_mem_above_largest_gpu_refused, 240) {
  setenv("COGPU_CLUSTER_GPU_SIZE", "16G", 1);
  start_cluster_gpus("32G", "16G,16G");
  char out[OUT_MAX], cmd[256];
  static const char *const cmds[] = {"srun", "sbatch --wrap true", "salloc"};
  for (size_t c = 0; c < COGPU_ARRAY_SIZE(cmds); c++) {
    snprintf(cmd, sizeof cmd, "%s --gpu-mem=20G%s", cmds[c],
             c == 1 ? "" : " true");
    ASSERT_NE(sh(cmd, out, sizeof out, th_ms(30000)), 0);
    ASSERT_CONTAINS(out, "cogpu: --gpu-mem=20G is more GPU memory than any "
                         "single GPU has (largest: 16384 MiB)");
  }
  ASSERT_EQ(sh("squeue -h | wc -l", out, sizeof out, th_ms(60000)), 0);
  ASSERT_STREQ(out, "0\n");
  ASSERT_EQ(sh("srun --gpu-mem=16G echo fits", out, sizeof out, th_ms(60000)),
            0);
  ASSERT_CONTAINS(out, "fits");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Issue 13 item 3. A whole-GPU job that gave up waiting for exclusive use
 * (whole_gpu_wait) runs as it would without cogpu, and what it holds
 * counts as foreign memory, as the same process outside Slurm would: a
 * --gpu-mem job then cannot be given that memory. (Its slurmstepd, an
 * attached client holding nothing there, used to hide it.) */
TEST_IMPL_ONCE_T(slurm_unguarded_whole_gpu_job_counts, 240) {
  setenv("COGPU_CLUSTER_GPUS", "2", 1);
  start_cluster_gpus("160G", "80G,80G");
  char out[OUT_MAX], cmd[PATH_MAX * 2], conf[PATH_MAX + 32], line[PATH_MAX];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o /dev/null --gpu-mem=70G --wrap 'sleep 600'",
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_output("squeue -h -o '%i %t'", "1 R", 30000);
  wait_job_reserved("1", 70 * GiB, 20000);
  snprintf(conf, sizeof conf, "%s/plugstack.conf", cluster);
  snprintf(line, sizeof line, "required %s whole_gpu_wait=1s\n",
           getenv("COGPU_SPANK"));
  th_write_file(conf, line);
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/whole.out --gres=gpu:1 --wrap '%s direct init "
           "ctx alloc:8G hold:600000'",
           th_tmpdir(), th_tmpdir(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_output("squeue -h -o '%i %t'", "2 R", 30000);
  for (int i = 0; i < th_ms(20000) / 50 && lt_fake_cuda_used() < 8 * GiB; i++)
    th_sleep_ms(50);
  ASSERT_ULE(8 * GiB, lt_fake_cuda_used());
  uint64_t foreign = 0;
  for (int i = 0; i < th_ms(10000) / 100; i++) {
    cogpu_status_t *st = lt_status();
    foreign = st->gpus[0].foreign_bytes;
    cogpu_status_free(st);
    if (foreign >= 8 * GiB)
      break;
    th_sleep_ms(100);
  }
  ASSERT_CONTAINS(file("whole.out"), "it runs without exclusive use");
  if (foreign < 8 * GiB)
    th_fail(__FILE__, __LINE__,
            "the whole-GPU job's 8.3 GiB are counted nowhere: foreign %llu",
            (unsigned long long)foreign);
  /* GPU 0 has 80 - 70 - 8.3 GiB left: a 5G job goes to GPU 1. */
  ASSERT_CONTAINS(task_gpu("--gpu-mem=5G"), "gpu=1 cvd=GPU-");
  ASSERT_EQ(sh("scancel 1 2", out, sizeof out, th_ms(60000)), 0);
  wait_jobs_done(60000);
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* The UUID of ledger GPU g. */
static const char *gpu_uuid(int g) {
  static char uuid[96];
  cogpu_status_t *st = lt_status();
  snprintf(uuid, sizeof uuid, "%s", st->gpus[g].uuid);
  cogpu_status_free(st);
  return uuid;
}

/* Issue 13 item 4. A job that brings its own CUDA_VISIBLE_DEVICES (here
 * GPU 0, which has no room) reserves on GPU 1, and its tasks see exactly
 * GPU 1, where their allocations then land. (They used to keep the
 * inherited value: memory reserved on one GPU, allocated on another.) */
TEST_IMPL_ONCE_T(slurm_task_sees_exactly_the_reserved_gpu, 240) {
  start_cluster_gpus("32G", "16G,16G");
  char out[OUT_MAX], cmd[PATH_MAX * 2], want[160];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o /dev/null --gpu-mem=12G --wrap 'sleep 600'",
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_output("squeue -h -o '%i %t'", "1 R", 30000);
  wait_job_reserved("1", 12 * GiB, 20000);
  snprintf(want, sizeof want, "gpu=1 cvd=%s\n", gpu_uuid(1));
  ASSERT_STREQ(task_gpu("--gpu-mem=5G"), want); /* the control: no value */
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  ASSERT_STREQ(task_gpu("--gpu-mem=5G"), want);
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/cvd.out --gpu-mem=5G --wrap 'echo "
           "cvd=$CUDA_VISIBLE_DEVICES; %s direct init ctx alloc:4G hold:1500'",
           th_tmpdir(), th_tmpdir(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  unsetenv("CUDA_VISIBLE_DEVICES");
  wait_output("squeue -h -o '%i' | grep -c .", "1\n", 60000);
  const char *o = file("cvd.out");
  snprintf(want, sizeof want, "cvd=%s\n", gpu_uuid(1));
  ASSERT_CONTAINS(o, want);
  ASSERT(!strstr(o, "error"));
  /* It allocated where it reserved: GPU 0 never held more than the 12G
   * job's nothing (the fake driver's GPU 0 saw no allocation). */
  ASSERT_ULE(fake_peak(), 0);
  lt_check_invariants();
  ASSERT_EQ(sh("scancel 1", out, sizeof out, th_ms(60000)), 0);
  wait_jobs_done(60000);
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* The PID of the running cudaprog whose command line has `tag`, or 0. */
static pid_t prog_pid(const char *tag) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = 0;
  while (d && !found && (e = readdir(d))) {
    char path[300], cmd[1024];
    if (e->d_name[0] < '1' || e->d_name[0] > '9')
      continue;
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    FILE *f = fopen(path, "re");
    size_t n = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
    if (f)
      fclose(f);
    for (size_t i = 0; i < n; i++)
      cmd[i] = cmd[i] ? cmd[i] : ' ';
    cmd[n] = 0;
    if (!strncmp(cmd, prog(), strlen(prog())) && strstr(cmd, tag))
      found = (pid_t)atoi(e->d_name);
  }
  if (d)
    closedir(d);
  return found;
}

/* The nearest ancestor of pid named slurmstepd, or 0. */
static pid_t stepd_above(pid_t pid) {
  for (int depth = 0; pid > 1 && depth < 16; depth++) {
    char path[64], buf[512], comm[64];
    int ppid = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
      fclose(f);
    buf[n] = 0;
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (!open || !close || sscanf(close + 1, " %*c %d", &ppid) != 1)
      return 0;
    snprintf(comm, sizeof comm, "%.*s", (int)(close - open - 1), open + 1);
    if (depth > 0 && !strcmp(comm, "slurmstepd"))
      return pid;
    pid = ppid;
  }
  return 0;
}

/* kill -9 of the slurmstepd above the program tagged `tag` once it holds
 * memory; then its processes must be gone at once (2 s: the kernel's
 * PR_SET_PDEATHSIG, the guard's kill, and the fake driver noticing), with
 * nothing left on the GPU. */
static void kill_stepd_expect_gone(const char *tag) {
  pid_t stepd = 0;
  for (int i = 0; i < th_ms(20000) / 50 && !stepd; i++) {
    if (lt_fake_cuda_used() >= 3 * GiB)
      stepd = stepd_above(prog_pid(tag));
    if (!stepd)
      th_sleep_ms(50);
  }
  if (!stepd)
    th_fail(__FILE__, __LINE__, "the step of %s never held its memory", tag);
  ASSERT_EQ(kill(stepd, SIGKILL), 0);
  bool gone = false;
  for (int i = 0; i < th_ms(2000) / 20 && !gone; i++) {
    gone = !prog_pid(tag) && lt_fake_cuda_used() == 0;
    if (!gone)
      th_sleep_ms(20);
  }
  if (!gone) {
    char ps[OUT_MAX];
    sh("ps -eo pid,ppid,pgid,stat,comm,args | grep -v ' ps '", ps, sizeof ps,
       th_ms(10000));
    th_fail(__FILE__, __LINE__,
            "%s outlived its slurmstepd by 2 s (%llu bytes on the GPU):\n%s",
            tag, lt_fake_cuda_used(), ps);
  }
}

/* Issue 13 item 5, with proctrack/cgroup (what docs/slurm.md recommends;
 * this machine has the cgroup v1 freezer it needs). When a step's
 * slurmstepd is killed, Slurm loses the step: its processes would run on
 * with memory the ledger no longer counts for the step (a later job that
 * declared correctly then got the driver's out-of-memory). They go with
 * their step: a batch job's script and the program it started, an srun
 * task under --gpu-no-preload; then a job that needs the whole GPU runs. */
TEST_IMPL_ONCE_T(slurm_tasks_go_with_a_killed_slurmstepd, 240) {
  setenv("COGPU_CLUSTER_PROCTRACK", "cgroup", 1);
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 2];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o /dev/null --gpu-mem=8G --wrap '%s direct init "
           "ctx alloc:3G hold:120001; sleep 120'",
           th_tmpdir(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  kill_stepd_expect_gone("hold:120001");
  snprintf(cmd, sizeof cmd,
           "srun --gpu-mem=8G --gpu-no-preload %s direct init ctx alloc:3G "
           "hold:120002 >/dev/null 2>&1 &",
           prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  kill_stepd_expect_gone("hold:120002");
  /* Slurm itself does not know the steps are gone until they are
   * cancelled: until then their GRES stay allocated. */
  ASSERT_EQ(sh("scancel 1 2", out, sizeof out, th_ms(60000)), 0);
  wait_jobs_done(60000);
  snprintf(cmd, sizeof cmd,
           "srun --gpu-mem=15G %s direct init ctx alloc:14G hold:200", prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT(!strstr(out, "error"));
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Issue 13 item 6. A job's environment cannot move its tasks to another
 * ledger (COGPU_STATE_DIR, a COGPU_CONFIG that sets state_dir,
 * COGPU_NODE_MODE): the tasks use the node's, where the job's reservation
 * is, and see the job there. */
TEST_IMPL_ONCE_T(slurm_job_env_cannot_move_tasks, 240) {
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 4], conf[PATH_MAX + 32];
  snprintf(conf, sizeof conf, "%s/user.conf", th_tmpdir());
  char text[PATH_MAX + 64];
  snprintf(text, sizeof text, "state_dir = %s/elsewhere2\n", th_tmpdir());
  th_write_file(conf, text);
  static const char *const ways[] = {"COGPU_STATE_DIR=", "COGPU_CONFIG=",
                                     "COGPU_NODE_MODE=single COGPU_STATE_DIR="};
  static const char *const where[] = {"/elsewhere", "/user.conf", "/elsewhere"};
  for (size_t w = 0; w < COGPU_ARRAY_SIZE(ways); w++) {
    char env[PATH_MAX + 64];
    snprintf(env, sizeof env, "%s%s%s", ways[w], th_tmpdir(), where[w]);
    snprintf(cmd, sizeof cmd,
             "%s srun --gpu-mem=2G sh -c 'cogpu status --json; %s direct init "
             "ctx alloc:1G'",
             env, prog());
    int rc = sh(cmd, out, sizeof out, th_ms(60000));
    if (rc != 0 || !strstr(out, "\"job_id\":\""))
      th_fail(__FILE__, __LINE__,
              "with %s the task did not see its job's ledger (exit %d):\n%s",
              env, rc, out);
    ASSERT(!strstr(out, "error"));
    /* The same from a batch job. */
    snprintf(cmd, sizeof cmd,
             "%s sbatch -D %s -o %s/env%zu.out --gpu-mem=2G --wrap 'cogpu "
             "status --json'",
             env, th_tmpdir(), th_tmpdir(), w);
    ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
    wait_jobs_done(60000);
    char name[32];
    snprintf(name, sizeof name, "env%zu.out", w);
    ASSERT_CONTAINS(file(name), "\"job_id\":\"");
  }
  char p[PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/elsewhere", th_tmpdir());
  ASSERT(access(p, F_OK) != 0);
  snprintf(p, sizeof p, "%s/elsewhere2", th_tmpdir());
  ASSERT(access(p, F_OK) != 0);
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Issue 13 item 7. --gpu-wait, --gpu-priority and --gpu-no-preload qualify
 * --gpu-mem: without it they are refused at submission, not ignored. */
TEST_IMPL_ONCE_T(slurm_gpu_options_need_gpu_mem, 240) {
  start_cluster("16G");
  static const char *const opts[] = {"--gpu-wait=1m", "--gpu-priority=5",
                                     "--gpu-no-preload"};
  static const char *const cmds[] = {"srun", "sbatch --wrap true", "salloc"};
  char out[OUT_MAX], cmd[256], want[128];
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(opts); i++)
    for (size_t c = 0; c < COGPU_ARRAY_SIZE(cmds); c++) {
      snprintf(cmd, sizeof cmd, "%s %s%s", cmds[c], opts[i],
               c == 1 ? "" : " true");
      snprintf(want, sizeof want, "cogpu: %.*s needs --gpu-mem",
               (int)strcspn(opts[i], "="), opts[i]);
      int rc = sh(cmd, out, sizeof out, th_ms(30000));
      if (rc == 0 || !strstr(out, want))
        th_fail(__FILE__, __LINE__, "'%s' exit %d, expected '%s':\n%s", cmd, rc,
                want, out);
    }
  ASSERT_EQ(sh("squeue -h; scontrol show jobs", out, sizeof out, th_ms(20000)),
            0);
  ASSERT_CONTAINS(out, "No jobs in the system");
  /* With --gpu-mem, and in a step of a job that has it, they apply. */
  ASSERT_EQ(sh("srun --gpu-mem=1G --gpu-wait=1m --gpu-priority=5 "
               "--gpu-no-preload true",
               out, sizeof out, th_ms(60000)),
            0);
  ASSERT_EQ(sh("salloc --gpu-mem=1G srun --gpu-wait=1m sh -c 'echo "
               "$COGPU_TIMEOUT'",
               out, sizeof out, th_ms(60000)),
            0);
  ASSERT_CONTAINS(out, "60000ms");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Issue 13 item 8. A cluster still configured with the GRES's old name,
 * `gpumem` (which Slurm 23.02 and later use for their own TRES), keeps
 * working for one release: the job asks for gres/gpumem, reserves on the
 * node, and the user is told to have it renamed. */
TEST_IMPL_ONCE_T(slurm_old_gres_name_works_with_warning, 240) {
  setenv("COGPU_CLUSTER_GRES", "gpumem", 1);
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 2];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/old.out --gpu-mem=3G --wrap 'sh %s' && "
           "scontrol show job -d | grep -o 'gres.[a-z]*mem:[^ ]*'",
           th_tmpdir(), th_tmpdir(), task_env());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "gres:gpumem:3G");
  ASSERT_CONTAINS(out, "cogpu: warning: this cluster declares GPU memory as "
                       "GRES `gpumem`");
  wait_jobs_done(60000);
  expect_under_cogpu(file("old.out"), "COGPU_MEM=3221225472");
  /* A step's own count, given under the new name, is kept (under the
   * cluster's): steps that ask for none run at once. */
  snprintf(cmd, sizeof cmd,
           "salloc --gpu-mem=2G srun --gres=cogpumem:0 sh -c 'scontrol show "
           "step $SLURM_JOB_ID.$SLURM_STEP_ID | grep -o \"TresPerNode=[^ "
           "]*\"; echo ok'");
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "ok");
  ASSERT(!strstr(out, "mem:2G"));
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* The same, with the GRES set in slurmctld: its log tells the admin. */
TEST_IMPL_ONCE_T(slurm_old_gres_name_job_submit, 240) {
  setenv("COGPU_CLUSTER_GRES", "gpumem", 1);
  server_side = true;
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 2];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/old.out --gpu-mem=3G --wrap 'sh %s' && "
           "scontrol show job -d | grep -o 'gres.[a-z]*mem:[^ ]*'",
           th_tmpdir(), th_tmpdir(), task_env());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "gres:gpumem:3G");
  wait_jobs_done(60000);
  expect_under_cogpu(file("old.out"), "COGPU_MEM=3221225472");
  snprintf(cmd, sizeof cmd, "grep -c 'rename it .cogpumem.' %s/slurmctld.log",
           cluster);
  ASSERT_EQ(sh_root(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_STREQ(out, "1\n");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Issue 13 item 10. Two jobs that each hold memory and each wait for more
 * deadlock; the guard fails one of them. The warning names a process of
 * the failed job, so only that job's output may carry it (single-user
 * mode; in node mode the daemon logs it). */
TEST_IMPL_ONCE_T(slurm_deadlock_warning_names_own_job, 240) {
  /* The guard must fail a request here: with a daemon (node mode) it
   * would suspend a job instead (slurm_growing_jobs_suspended). */
  th_setenv("COGPU_SUSPEND", "no");
  run_as = NULL; /* single-user mode: one user's jobs, here root's */
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  /* Each job takes all of its 6G (context and 5844M), then asks for 8G
   * more when told: 4G are free. A asks first and waits; B, of higher
   * priority, asks once A waits, so that its process is the one to find
   * the deadlock. On cues, not times: a `sleep 1` and `sleep 3.5` before
   * the jobs let A take its 8G before B had started on a loaded machine. */
  for (int j = 0; j < 2; j++) {
    snprintf(cmd, sizeof cmd,
             "sbatch -D %s -o %s/dl%d.out --gpu-mem=6G --gpu-wait=2m "
             "--gpu-priority=%d --wrap '%s direct init ctx alloc:5844M "
             "waitfile:%s/dl%d.go alloc:8G'",
             th_tmpdir(), th_tmpdir(), j, j * 10, prog(), th_tmpdir(), j);
    ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  }
  char go[PATH_MAX + 32];
  for (int j = 0; j < 2; j++) {
    snprintf(cmd, sizeof cmd, "cat %s/dl%d.out", th_tmpdir(), j);
    wait_output(cmd, "alloc 6127878144 ok", 60000);
  }
  snprintf(go, sizeof go, "%s/dl0.go", th_tmpdir());
  th_write_file(go, "");
  snprintf(cmd, sizeof cmd, "cat %s/dl0.out", th_tmpdir());
  wait_output(cmd, "waiting for 8.0 GiB", 60000);
  snprintf(go, sizeof go, "%s/dl1.go", th_tmpdir());
  th_write_file(go, "");
  wait_jobs_done(60000);
  const char *a = file("dl0.out");
  ASSERT_CONTAINS(a, "alloc: error 2"); /* the victim */
  char a_out[OUT_MAX];
  snprintf(a_out, sizeof a_out, "%s", a);
  const char *b = file("dl1.out");
  if (strstr(b, "failing the request of pid"))
    th_fail(__FILE__, __LINE__,
            "job B's output names job A's process:\n--- B\n%s--- A\n%s", b,
            a_out);
  ASSERT(!strstr(b, "error"));
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Issue 13 item 10. `cogpu doctor` without a config file says there is
 * none, rather than "ok config: /etc/cogpu.conf". */
TEST_IMPL(slurm_doctor_names_a_missing_config_file) {
  if (access("/etc/cogpu.conf", F_OK) == 0)
    SKIP("/etc/cogpu.conf exists on this machine");
  char bin[PATH_MAX + 16], out[OUT_MAX], err[OUT_MAX];
  snprintf(bin, sizeof bin, "%s/cogpu", th_build_dir());
  const char *argv[] = {bin, "doctor", NULL};
  const char *env[] = {"COGPU_CONFIG=", NULL}; /* unset: the default file */
  th_run(argv, env, out, sizeof out, err, sizeof err, th_ms(20000));
  ASSERT(!strstr(out, "ok       config: /etc/cogpu.conf\n"));
  ASSERT_CONTAINS(out, "ok       config: none (/etc/cogpu.conf does not "
                       "exist: defaults and COGPU_* variables apply)");
}

/* .ci/run requires the Slurm tests (COGPU_TEST_REQUIRE_SLURM=1): a run
 * where they cannot start fails, naming why, instead of skipping. Here a
 * copy of the test runner outside the build tree finds no plug-in. (A test
 * of the harness: once, daemonless.) */
TEST_IMPL_SINGLE(slurm_required_tests_fail_instead_of_skipping) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  SKIP("Slurm tests run in the plain build (uninstrumented plug-in)");
#endif
  char dir[PATH_MAX + 32], cmd[PATH_MAX * 3], out[OUT_MAX];
  snprintf(dir, sizeof dir, "%s/b/tests", th_tmpdir());
  snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/tests/run-tests %s/", dir,
           th_build_dir(), dir);
  ASSERT_EQ(sh_root(cmd, out, sizeof out, th_ms(60000)), 0);
  snprintf(cmd, sizeof cmd,
           "env -u COGPU_TEST_REQUIRE_SLURM -u COGPU_TEST_NODE %s/run-tests "
           "slurm_packs_jobs_by_gpu_memory_job_submit 2>&1",
           dir);
  ASSERT_EQ(sh_root(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "# SKIP");
  snprintf(cmd, sizeof cmd,
           "env -u COGPU_TEST_NODE COGPU_TEST_REQUIRE_SLURM=1 %s/run-tests "
           "slurm_packs_jobs_by_gpu_memory_job_submit 2>&1",
           dir);
  ASSERT_NE(sh_root(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "not ok 1 - slurm_packs_jobs_by_gpu_memory_job_submit");
  ASSERT_CONTAINS(out, "spank_cogpu.so not built");
}

/* Under Slurm with the node daemon: two --gpu-mem jobs that grow past
 * their declaration deadlock (each holds 7G of 16G and wants 3.3G more);
 * one is suspended, and both complete with their data, none told
 * out-of-memory. */
TEST_IMPL_ONCE_T(slurm_growing_jobs_suspended, 240) {
  th_setenv("COGPU_SWEEP_INTERVAL", "100ms");
  th_setenv("COGPU_SUSPEND_HOST_MARGIN", "0");
  th_setenv("COGPU_SUSPEND_MAX", "1T");
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  /* Both hold their 6G before either grows (a cue, not a hold of 500 ms,
   * which a job started late on a loaded machine outlasts): each then
   * needs 4G more, with 3.4G free. */
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd,
             "sbatch -D %s -o %s/grow%d.out --gpu-mem=7G --wrap "
             "'%s direct init ctx alloc:6G waitfile:%s/grow.go alloc:4G "
             "hold:300 verify freeall'",
             th_tmpdir(), th_tmpdir(), i, prog(), th_tmpdir());
    ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  }
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "cat %s/grow%d.out", th_tmpdir(), i);
    wait_output(cmd, "alloc 6442450944 ok", 60000);
  }
  char go[PATH_MAX + 32];
  snprintf(go, sizeof go, "%s/grow.go", th_tmpdir());
  th_write_file(go, "");
  wait_jobs_done(120000);
  char both[2 * OUT_MAX];
  snprintf(both, sizeof both, "%s", file("grow0.out"));
  size_t n = strlen(both);
  snprintf(both + n, sizeof both - n, "%s", file("grow1.out"));
  ASSERT_CONTAINS(file("grow0.out"), "verify ok");
  ASSERT_CONTAINS(file("grow1.out"), "verify ok");
  ASSERT_CONTAINS(both, "suspended: this job");
  ASSERT(strstr(both, "error") == NULL);
  unsigned long long peak, ooms;
  lt_fake_cuda_stats(&peak, &ooms);
  ASSERT_EQ(ooms, 0);
  ASSERT_ULE(peak, 16 * GiB);
  ASSERT_EQ(lt_fake_wedged(), 0);
  lt_check_invariants();
  stop_cluster();
}

/* Issue 14. A job's end-of-job report: its exact peak (the fake driver's,
 * to the byte: the job ran alone) against its --gpu-mem, on the first
 * task's stderr (the batch job's output file, after the job's own output;
 * srun's terminal) and, as JSON, in the job's AdminComment. A batch job
 * that declared far more than it used gets a hint. */
TEST_IMPL_ONCE_T(slurm_end_of_job_report, 240) {
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 2];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/rep.out --gpu-mem=8G --wrap 'echo first; %s "
           "direct init ctx alloc:1G alloc:512M hold:200 freeall'",
           th_tmpdir(), th_tmpdir(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_jobs_done(60000);
  unsigned long long peak = fake_peak();
  ASSERT(peak > 1536ull << 20);
  const char *o = file("rep.out");
  ASSERT_CONTAINS(o, "first\n");
  ASSERT_CONTAINS(o, "cogpu: job 1 used at most ");
  ASSERT_CONTAINS(o, "(reserved 8.0 GiB, ");
  ASSERT_CONTAINS(o, "(--gpu-mem=2.0 GiB would have done)");
  ASSERT(strstr(o, "first\n") < strstr(o, "cogpu: job 1 used"));
  const char *job = show_job("1");
  char want[96];
  snprintf(want, sizeof want, "\"peak_bytes\":%llu,", peak);
  ASSERT_CONTAINS(job, "AdminComment={\"cogpu\":[{\"node\":");
  ASSERT_CONTAINS(job, want);
  ASSERT_CONTAINS(job, "\"declared_bytes\":8589934592,");
  ASSERT_CONTAINS(job, "JobState=COMPLETED");
  /* srun: on the terminal, after the program's own output. */
  snprintf(cmd, sizeof cmd,
           "srun --gpu-mem=4G %s direct init ctx alloc:1G freeall 2>&1",
           prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "cogpu: job 2 used at most ");
  ASSERT_CONTAINS(out, "(reserved 4.0 GiB, ");
  ASSERT_CONTAINS(show_job("2"), "\"peak_bytes\":");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* dcgm_job_map_dir: DCGM exporter's HPC job mapping lists the jobs on
 * each GPU while they run (two jobs sharing GPU 1, one on GPU 0), keeps a
 * job while another of its steps still runs there, and forgets each job
 * when it ends. A relative directory is refused on the plugstack line. */
static const char *map_file(const char *dir, int gpu) {
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%d", dir, gpu);
  static char buf[4096];
  buf[0] = 0;
  FILE *f = fopen(path, "re");
  if (f) {
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
  }
  return buf;
}

static void wait_map(const char *dir, int gpu, const char *want, int ms) {
  for (int i = 0; i < th_ms(ms) / 100; i++) {
    if (strcmp(map_file(dir, gpu), want) == 0)
      return;
    th_sleep_ms(100);
  }
  th_fail(__FILE__, __LINE__, "%s/%d holds '%s', want '%s'", dir, gpu,
          map_file(dir, gpu), want);
}

TEST_IMPL_ONCE_T(slurm_dcgm_job_map, 240) {
  start_cluster_gpus("32G", "16G,16G");
  char out[OUT_MAX], cmd[PATH_MAX * 2], conf[PATH_MAX + 32], line[PATH_MAX * 2],
      dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/dcgm-map", th_tmpdir());
  snprintf(conf, sizeof conf, "%s/plugstack.conf", cluster);
  snprintf(line, sizeof line, "required %s dcgm_job_map_dir=dcgm\n",
           getenv("COGPU_SPANK"));
  th_write_file(conf, line);
  ASSERT_NE(sh("srun --gpu-mem=1G true", out, sizeof out, th_ms(30000)), 0);
  ASSERT_CONTAINS(out, "dcgm_job_map_dir must be an absolute path");
  snprintf(line, sizeof line, "required %s dcgm_job_map_dir=%s\n",
           getenv("COGPU_SPANK"), dir);
  th_write_file(conf, line);
  /* The first job fills most of one GPU (whichever cogpu picks); the
   * next two can then only share the other. */
  const char *mem[] = {"12G", "6G", "6G"};
  char id[3][16], want[48], want2[48];
  int g0 = -1;
  for (int j = 0; j < 3; j++) {
    snprintf(cmd, sizeof cmd,
             "sbatch --parsable -D %s -o /dev/null --gpu-mem=%s --wrap "
             "'srun --overlap --gpu-mem=%s sleep 4 & sleep 600'",
             th_tmpdir(), mem[j], mem[j]);
    ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
    snprintf(id[j], sizeof id[j], "%.*s", (int)strcspn(out, ";\n"), out);
    snprintf(want, sizeof want, "%s\n", id[0]);
    for (int i = 0; j == 0 && g0 < 0 && i < th_ms(30000) / 100; i++) {
      g0 = strcmp(map_file(dir, 0), want) == 0   ? 0
           : strcmp(map_file(dir, 1), want) == 0 ? 1
                                                 : -1;
      th_sleep_ms(100);
    }
    ASSERT_GE(g0, 0);
  }
  int other = 1 - g0;
  snprintf(want, sizeof want, "%s\n%s\n", id[1], id[2]);
  snprintf(want2, sizeof want2, "%s\n%s\n", id[2], id[1]);
  bool both = false;
  for (int i = 0; !both && i < th_ms(30000) / 100; i++) {
    const char *m = map_file(dir, other);
    both = strcmp(m, want) == 0 || strcmp(m, want2) == 0;
    if (!both)
      th_sleep_ms(100);
  }
  if (!both)
    th_fail(__FILE__, __LINE__, "GPU %d's map holds '%s', want jobs %s, %s",
            other, map_file(dir, other), id[1], id[2]);
  snprintf(want, sizeof want, "%s\n", id[0]);
  wait_map(dir, g0, want, 1000);
  /* The srun steps end after 4 s (waited for in squeue, not for a time);
   * their batch steps still run: kept. */
  snprintf(cmd, sizeof cmd,
           "echo steps=$(squeue -h -s -o %%i | grep -c -E '^(%s|%s|%s)\\.0$')",
           id[0], id[1], id[2]);
  wait_output(cmd, "steps=0\n", 60000);
  wait_map(dir, g0, want, 1000);
  snprintf(cmd, sizeof cmd, "scancel %s", id[1]);
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  snprintf(want2, sizeof want2, "%s\n", id[2]);
  wait_map(dir, other, want2, 30000);
  snprintf(cmd, sizeof cmd, "scancel %s %s", id[0], id[2]);
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  wait_map(dir, 0, "", 30000);
  wait_map(dir, 1, "", 30000);
  wait_jobs_done(60000);
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* ------------------------------------------------------------------------ */
/* Issue 15: a real replay of a scaled-down trace, for the simulator        */
/* ------------------------------------------------------------------------ */

/* The public traces (../shared/traces beside the repository, or
 * COGPU_TEST_TRACES: the runner keeps COGPU_TEST_* only); NULL if
 * absent. */
static const char *traces_dir(void) {
  static char d[PATH_MAX + 32];
  const char *e = getenv("COGPU_TEST_TRACES");
  if (e && *e)
    snprintf(d, sizeof d, "%s", e);
  else
    snprintf(d, sizeof d, "%s/../shared/traces", root);
  char f[PATH_MAX * 2];
  snprintf(f, sizeof f, "%s/alibaba-clusterdata/openb_pod_list_default.csv", d);
  return access(f, R_OK) == 0 ? d : NULL;
}

/* A whole number from the environment, at least min; dflt if unset or
 * not one. */
static int env_int(const char *name, int dflt, int min) {
  const char *e = getenv(name);
  char *end;
  long v = e && *e ? strtol(e, &end, 10) : dflt;
  return e && *e && (*end || v < min || v > 100000) ? dflt : (int)v;
}

/* Replay a window of Alibaba's sharing pods (COGPU_TEST_REPLAY_JOBS, 100 by
 * default; `make sim-validate` runs 300), arrivals compressed, on one
 * 80 GiB GPU: every job is submitted at its time, runs its allocation and
 * completes; Slurm's record of each is in replay.psv for the comparison
 * with the simulator's prediction. */
TEST_IMPL_ONCE_T(slurm_replay_trace, 1800) {
  find_root();
  const char *tr = traces_dir();
  if (!tr)
    SKIP_UNLESS_REQUIRED("COGPU_TEST_REQUIRE_TRACES",
                         "no public traces (../shared/traces or "
                         "COGPU_TEST_TRACES): the replay reads them from "
                         "there");
  /* 100 jobs of 2 to 20 s from the 400th sharing pod on, arriving over
   * 100 s (about 170 s in all; two thirds of the jobs wait). The first
   * pods of the list are spread over four months before its dense part:
   * from the first pod, 97 of 100 jobs arrived in the last 3 s, an
   * 80-deep queue in which a few milliseconds' difference in one
   * release reorders every later start, and the median start error was
   * 1.3 to 2.4 s in real runs. From the 400th, the arrivals keep the
   * trace's own bursts, the deepest queue is about 40 jobs, and
   * bench/sim-validate/emulate.py put all of 50 emulated runs on target
   * (docs/simulation.md, "Against a real run").
   * COGPU_TEST_REPLAY_JOBS, _SKIP, _SPAN (seconds) and _MAXRUN (the
   * longest lifetime, the shortest a tenth of it) change them; make
   * sim-validate runs 300 jobs from the 100th pod over 400 s. */
  int jobs = env_int("COGPU_TEST_REPLAY_JOBS", 100, 1);
  int skip = env_int("COGPU_TEST_REPLAY_SKIP", 400, 0);
  int span = env_int("COGPU_TEST_REPLAY_SPAN", jobs, 1);
  int maxrun = env_int("COGPU_TEST_REPLAY_MAXRUN", 20, 1);
  setenv("COGPU_CLUSTER_CPUS", "64", 1);
  setenv("COGPU_CLUSTER_CONF_EXTRA", "MinJobAge=7200", 1);
  /* Backfill every second: with no time limits, it starts whatever fits
   * now, the greedy scan the simulator models (docs/simulation.md). */
  setenv("COGPU_CLUSTER_SCHED", "sched_interval=1,bf_interval=1", 1);
  start_cluster("80G");
  char cmd[PATH_MAX * 4], out[OUT_MAX];
  snprintf(cmd, sizeof cmd,
           "python3 %s/bench/sim-validate/make-trace.py --pods "
           "%s/alibaba-clusterdata/openb_pod_list_default.csv --jobs %d "
           "--skip %d --sharing-only --gpu-mem 16G --span %d --min-run %d "
           "--max-run %d --out %s/trace.csv",
           root, tr, jobs, skip, span, maxrun >= 10 ? maxrun / 10 : 1, maxrun,
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  snprintf(cmd, sizeof cmd,
           "python3 %s/bench/sim-validate/replay.py --trace %s/trace.csv "
           "--prog %s --out %s/replay.psv 2>&1",
           root, th_tmpdir(), prog(), th_tmpdir());
  int rc = sh(cmd, out, sizeof out, th_ms(jobs * 8000));
  if (rc)
    th_fail(__FILE__, __LINE__, "replay failed (%d):\n%s", rc, out);
  /* Every job is there, completed, with its peak in AdminComment. */
  snprintf(cmd, sizeof cmd,
           "grep -c '|COMPLETED|.*{\"cogpu\":\\[{\"node\":' %s/replay.psv",
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(10000)), 0);
  ASSERT_EQ(atoi(out), jobs);
  stop_cluster(); /* tests end with _exit: no atexit */
  run_as = NULL;  /* the users are gone; the analysis is anyone's */
  /* The simulator's prediction from Slurm's own record (a site replaying
   * its history), against what happened: makespan within 5 %, median
   * start-time error under 2 s (compare.py's targets). The cluster
   * schedules every second (sched_interval, bf_interval), and how long a
   * job that can start waits for the pass depends on the machine's load
   * (0.1 to 1.4 s on average in runs here): that one figure is measured
   * from the record (sched-lag.py: the jobs at the head of the queue)
   * and is the simulator's --sched-delay. Slurm's record is in whole
   * seconds, a second's noise on each link of a chain of jobs. */
  snprintf(cmd, sizeof cmd,
           "python3 %s/bench/sim-validate/sched-lag.py --real %s/replay.psv "
           "--gpu-mem 80G 2>&1",
           root, th_tmpdir());
  rc = sh(cmd, out, sizeof out, th_ms(60000));
  if (rc)
    th_fail(__FILE__, __LINE__, "sched-lag.py failed (%d):\n%s", rc, out);
  int lag_ms = atoi(out);
  ASSERT(lag_ms >= 0 && lag_ms < 10000);
  fprintf(stderr, "# scheduler lag measured from the record: %d ms\n", lag_ms);
  snprintf(cmd, sizeof cmd,
           "%s/cogpu sim --trace %s/replay.psv --format sacct --nodes 1 "
           "--gpus-per-node 1 --gpu-mem 80G --margin 0 --policy cogpu "
           "--sched-delay %dms --out %s/sim --jobs --quiet 2>&1",
           th_build_dir(), th_tmpdir(), lag_ms, th_tmpdir());
  rc = sh(cmd, out, sizeof out, th_ms(60000));
  if (rc)
    th_fail(__FILE__, __LINE__, "cogpu sim failed (%d):\n%s", rc, out);
  snprintf(cmd, sizeof cmd,
           "python3 %s/bench/sim-validate/compare.py --real %s/replay.psv "
           "--sim %s/sim/cogpu-jobs.csv 2>&1",
           root, th_tmpdir(), th_tmpdir());
  rc = sh(cmd, out, sizeof out, th_ms(60000));
  fprintf(stderr, "# %s", out);
  if (rc)
    th_fail(__FILE__, __LINE__, "prediction off target:\n%s", out);
}

/* --- Ordinary users (issue 22) ------------------------------------------- */

/* How many of `user`'s view of the node's waiters (cogpu status --json,
 * run as that user) belong to Slurm job `job`. */
static int waiters_of_job(const char *user, const char *job) {
  char cmd[512], out[OUT_MAX];
  snprintf(cmd, sizeof cmd,
           "cogpu status --json | python3 -c 'import json,sys; "
           "d=json.load(sys.stdin); print(sum(1 for g in d[\"gpus\"] for w "
           "in g[\"waiting\"] if w[\"job_id\"]==\"%s\" and "
           "w[\"user\"]==\"%s\"))'",
           job, USER1);
  if (run_cmd(user, cmd, out, sizeof out, th_ms(20000)) != 0)
    th_fail(__FILE__, __LINE__, "status as %s:\n%s", user, out);
  return atoi(out);
}

/* Every way an ordinary user runs jobs: srun, sbatch with a step, an
 * array, concurrent steps. The reservation is the user's (root's
 * slurmstepd booked it for them): they see it, and another user can
 * neither see it as theirs nor suspend it. */
TEST_IMPL_ONCE_T(slurm_jobs_of_ordinary_users, 240) {
  start_cluster("80G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  snprintf(cmd, sizeof cmd, "srun --gpu-mem=2G %s direct init ctx alloc:1G",
           prog());
  if (sh(cmd, out, sizeof out, th_ms(60000)) != 0 || strstr(out, "error"))
    th_fail(__FILE__, __LINE__, "srun as %s:\n%s", USER1, out);
  /* An array of three, each with a step of its own. */
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/arr-%%a.out -a 1-3 --gpu-mem=4G --wrap "
           "'%s direct init ctx alloc:3G hold:300 && srun %s direct init ctx "
           "alloc:2G'",
           th_tmpdir(), th_tmpdir(), prog(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  /* A job that stays while the users look at it. */
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/long.out --gpu-mem=6G --wrap '%s direct init "
           "ctx alloc:1G hold:600000'",
           th_tmpdir(), th_tmpdir(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  char id[32];
  snprintf(id, sizeof id, "%d", atoi(strrchr(out, ' ') + 1));
  wait_job_reserved(id, 6 * GiB, 30000);
  char user[64] = "";
  job_reserved(id, user, sizeof user);
  ASSERT_STREQ(user, USER1);
  /* Its user sees it as theirs; the other user's suspend is refused. */
  ASSERT_EQ(sh("cogpu status --json", out, sizeof out, th_ms(60000)), 0);
  char want[64];
  snprintf(want, sizeof want, "\"user\":\"%s\"", USER1);
  ASSERT_CONTAINS(out, want);
  snprintf(cmd, sizeof cmd, "cogpu suspend %s --timeout 5s", id);
  ASSERT_NE(run_cmd(USER2, cmd, out, sizeof out, th_ms(20000)), 0);
  ASSERT_EQ(job_reserved(id, NULL, 0), 6 * GiB);
  snprintf(cmd, sizeof cmd, "scancel %s", id);
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  wait_jobs_done(90000);
  for (int i = 1; i <= 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "arr-%d.out", i);
    const char *o = file(name);
    if (strstr(o, "error") || strstr(o, "only root"))
      th_fail(__FILE__, __LINE__, "array task %d:\n%s", i, o);
    ASSERT_CONTAINS(o, "alloc 3221225472 ok");
  }
  lt_check_invariants();
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* --gpu-mem set in the environment by hand reaches slurmstepd without the
 * cluster's filter, so the job has no cogpumem allocation: the step is
 * refused with the fix, and nothing is reserved. Four such jobs at once on
 * a 16G node would otherwise run 20G. */
TEST_IMPL_ONCE_T(slurm_gpu_mem_without_allocation_refused, 240) {
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  snprintf(cmd, sizeof cmd,
           "_SLURM_SPANK_OPTION_cogpu_gpu_mem=5G srun %s direct init ctx "
           "alloc:1G",
           prog());
  ASSERT_NE(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "is not covered by the job's GPU memory allocation");
  ASSERT_CONTAINS(out, "--gres=cogpumem:SIZE");
  for (int i = 0; i < 4; i++) {
    snprintf(cmd, sizeof cmd,
             "_SLURM_SPANK_OPTION_cogpu_gpu_mem=5G sbatch -D %s -o %s/e%d.out "
             "--wrap '%s direct init ctx alloc:4G'",
             th_tmpdir(), th_tmpdir(), i, prog());
    ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  }
  wait_jobs_done(60000);
  for (int i = 0; i < 4; i++) {
    char name[32];
    snprintf(name, sizeof name, "e%d.out", i);
    ASSERT_CONTAINS(file(name), "is not covered by the job's GPU memory");
  }
  ASSERT_UEQ(fake_peak(), 0);
  lt_check_invariants();
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* --export=NONE: the job's environment carries nothing of the submitting
 * shell, --gpu-mem's variable included; the allocation still books the
 * job, and its tasks run under cogpu. */
TEST_IMPL_ONCE_T(slurm_export_none_still_under_cogpu, 240) {
  start_cluster("80G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  snprintf(cmd, sizeof cmd,
           "sbatch --export=NONE -D %s -o %s/none.out --gpu-mem=3G --wrap "
           "'/bin/sh %s'",
           th_tmpdir(), th_tmpdir(), task_env());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_jobs_done(60000);
  expect_under_cogpu(file("none.out"), "COGPU_MEM=3221225472");
  snprintf(cmd, sizeof cmd, "srun --export=NONE --gpu-mem=2G /bin/sh %s",
           task_env());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(60000)), 0);
  expect_under_cogpu(out, "COGPU_MEM=2147483648");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* Root holds 14G of the 16G GPU outside Slurm, so that a job Slurm packed
 * there waits for its memory at start. */
static cogpu_t *hold_outside_slurm(void) {
  cogpu_t *h = lt_attach(0);
  cogpu_request_t req = {.gpu = 0,
                         .bytes = 14 * GiB,
                         .priority = COGPU_PRIORITY_DEFAULT,
                         .timeout_ms = COGPU_NOWAIT};
  ASSERT_OK(cogpu_reserve(h, &req, NULL));
  return h;
}

/* Waits (bounded) until job `id` waits at start, as its user sees it. */
static void wait_shown_waiting(const char *id) {
  for (int t = 0; waiters_of_job(USER1, id) != 1; t += 100) {
    if (t > th_ms(30000))
      th_fail(__FILE__, __LINE__, "job %s never shown waiting", id);
    th_sleep_ms(100);
  }
}

/* The waits of jobs ids[] must be gone within 2 s of what ended them. */
static void waits_end_within_2s(const char *const ids[], const char *why) {
  uint64_t t0 = cogpu__now_ns();
  for (;;) {
    int left = 0;
    for (int i = 0; ids[i]; i++)
      left += waiters_of_job(USER1, ids[i]);
    if (left == 0)
      return;
    if (cogpu__now_ns() - t0 > (uint64_t)th_ms(2000) * 1000000u)
      th_fail(__FILE__, __LINE__, "the waits outlived %s by 2 s", why);
    th_sleep_ms(50);
  }
}

/* A job whose step waits for its memory at start (memory held outside
 * Slurm) shows as waiting to its user, and scancel ends the wait at once,
 * for sbatch and srun alike. */
TEST_IMPL_ONCE_T(slurm_cancel_while_waiting_at_start, 240) {
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  cogpu_t *h = hold_outside_slurm();
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/w.out --gpu-mem=8G --wrap 'echo started'",
           th_tmpdir(), th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  snprintf(cmd, sizeof cmd,
           "srun --gpu-mem=8G echo started >%s/s.out 2>&1 </dev/null & "
           "echo $!",
           th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_shown_waiting("1");
  wait_shown_waiting("2");
  ASSERT_EQ(sh("scancel 1 2", out, sizeof out, th_ms(60000)), 0);
  waits_end_within_2s((const char *const[]){"1", "2", NULL}, "scancel");
  wait_jobs_done(30000);
  ASSERT(strstr(file("w.out"), "started") == NULL);
  ASSERT_OK(cogpu_detach(h));
  lt_check_invariants();
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* The same for a job that reaches its time limit while its step waits at
 * start: slurmctld ends it (TIMEOUT), and so does the wait, instead of the
 * job hanging in COMPLETING until memory appears. Slurm's limits are in
 * whole minutes, checked every 30 s: this test takes about a minute. */
TEST_IMPL_ONCE_T(slurm_time_limit_ends_wait_at_start, 240) {
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  cogpu_t *h = hold_outside_slurm();
  snprintf(cmd, sizeof cmd,
           "sbatch -t 1 -D %s -o %s/t.out --gpu-mem=8G --wrap 'echo started'",
           th_tmpdir(), th_tmpdir());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_shown_waiting("1");
  wait_output("scontrol show job 1 | grep -o 'JobState=[A-Z]*'",
              "JobState=TIMEOUT", 150000);
  waits_end_within_2s((const char *const[]){"1", NULL}, "the time limit");
  wait_jobs_done(30000);
  ASSERT(strstr(file("t.out"), "started") == NULL);
  ASSERT_OK(cogpu_detach(h));
  lt_check_invariants();
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* A job cancelled while it runs: Slurm changes no finished job, so its
 * figures cannot go into its AdminComment; they are in its output, in
 * slurmd's log, and in the node's job history, which its user can read. */
TEST_IMPL_ONCE_T(slurm_cancelled_job_keeps_its_figures, 240) {
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 2];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/can.out --gpu-mem=4G --wrap '%s direct init "
           "ctx alloc:1G hold:600000'",
           th_tmpdir(), th_tmpdir(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  for (int t = 0; fake_peak() < (1ull << 30) + 300 * MiB; t += 50) {
    if (t > th_ms(30000))
      th_fail(__FILE__, __LINE__, "the job never allocated");
    th_sleep_ms(50);
  }
  ASSERT_EQ(sh("scancel 1", out, sizeof out, th_ms(60000)), 0);
  wait_jobs_done(60000);
  ASSERT_CONTAINS(file("can.out"), "cogpu: job 1 used at most ");
  char log[PATH_MAX + 64];
  snprintf(log, sizeof log, "grep -h 'cogpu: job 1 ended before' %s/slurmd.log",
           cluster);
  const char *o = wait_output(log, "peak_bytes", 20000);
  char want[64];
  snprintf(want, sizeof want, "\"peak_bytes\":%llu,", fake_peak());
  ASSERT_CONTAINS(o, want);
  ASSERT_EQ(sh("cogpu history --json", out, sizeof out, th_ms(60000)), 0);
  ASSERT_CONTAINS(out, "\"job_id\":\"1\"");
  stop_cluster(); /* tests end with _exit: no atexit */
}

/* The peak_bytes of step `step` ("0", or the batch step's number) in a
 * job's AdminComment, or 0 if it has no entry for that step. */
static unsigned long long step_peak(const char *job, const char *step) {
  char key[64];
  snprintf(key, sizeof key, "\"step\":\"%s\",", step);
  const char *e = strstr(job, key),
             *p = e ? strstr(e, "\"peak_bytes\":") : NULL;
  unsigned long long v = 0;
  if (p && sscanf(p, "\"peak_bytes\":%llu", &v) != 1)
    v = 0;
  return v;
}

/* Issue 22, item 5. Each step's report is its own: a batch script that
 * used 3 GiB, then a step that used 1 GiB; two concurrent steps of 3 GiB
 * and 1 GiB. Each step's figure is its own tasks' peak (to the byte: it
 * is the fake driver's 1 GiB plus the context the step's process made),
 * not the job's so far; the job's record has the job's peak. */
TEST_IMPL_ONCE_T(slurm_each_step_reports_its_own_peak, 240) {
  start_cluster("16G");
  char out[OUT_MAX], cmd[PATH_MAX * 3];
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/steps.out --gpu-mem=8G --wrap '"
           "%s direct init ctx alloc:3G freeall && "
           "srun %s direct init ctx alloc:1G freeall'",
           th_tmpdir(), th_tmpdir(), prog(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_jobs_done(60000);
  const char *o = file("steps.out");
  if (strstr(o, "error"))
    th_fail(__FILE__, __LINE__, "job failed:\n%s", o);
  const char *job = show_job("1");
  /* The batch step's number is Slurm's SLURM_BATCH_SCRIPT. */
  unsigned long long s0 = step_peak(job, "0"),
                     sb = step_peak(job, "4294967291");
  /* The context is the same in both (one per process, same GPU). */
  if (!(s0 > GiB && s0 < 2 * GiB && sb > 3 * GiB && sb - s0 == 2 * GiB))
    th_fail(__FILE__, __LINE__, "step 0 %llu, batch %llu:\n%s", s0, sb, job);
  /* Its record: the job's peak. */
  ASSERT_EQ(sh("cogpu history --json", out, sizeof out, th_ms(60000)), 0);
  char want[64];
  snprintf(want, sizeof want, "\"peak_bytes\":%llu", sb);
  ASSERT_CONTAINS(out, want);
  /* Concurrent steps: each its own, while the other holds memory. */
  snprintf(cmd, sizeof cmd,
           "sbatch -D %s -o %s/conc.out -n2 --gpu-mem=8G --wrap '"
           "for s in 3G 1G; do srun -n1 --exact --mem=50M --gres=cogpumem:0 "
           "%s direct init ctx alloc:$s hold:2000 freeall & done; wait'",
           th_tmpdir(), th_tmpdir(), prog());
  ASSERT_EQ(sh(cmd, out, sizeof out, th_ms(30000)), 0);
  wait_jobs_done(60000);
  job = show_job("2");
  unsigned long long a = step_peak(job, "0"), b = step_peak(job, "1");
  unsigned long long lo = a < b ? a : b, hi = a < b ? b : a;
  if (!(lo > GiB && lo < 2 * GiB && hi - lo == 2 * GiB))
    th_fail(__FILE__, __LINE__, "steps %llu and %llu:\n%s", a, b, job);
  lt_check_invariants();
  stop_cluster(); /* tests end with _exit: no atexit */
}
