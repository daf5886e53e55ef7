/*
 * spank-cogpu.c: the Slurm SPANK plug-in (spank_cogpu.so).
 *
 * A job asks for GPU memory with --gpu-mem=SIZE. On the submitting side the
 * option is checked (a bad size, or one larger than any single GPU of the
 * cluster, refuses the job with our message); job_submit.lua or
 * cli_filter.lua turns it into the `gres/cogpumem` request by which
 * slurmctld packs jobs onto nodes.
 *
 * On each node, every step's slurmstepd attaches to the node ledger once
 * (slurm_spank_user_init, as the job's user) and either reserves SIZE there
 * for the job, or, when an earlier step of the same job already holds the
 * job's reservation (the batch step running `srun`), joins it: a job's
 * GPU memory is counted once per node however many steps and tasks use it.
 * Each task then runs with the preload library and the job's token, so its
 * CUDA allocations draw on that reservation (see docs/slurm.md).
 *
 * Nothing a user does may change the node's state: a reservation that
 * fails (memory that is not there, a wait that runs out) fails the job's
 * tasks with cogpu's message, in slurm_spank_task_init, never the step's
 * launch (slurm_spank_user_init), which slurmd would report as a launch
 * failure and slurmctld answer by draining the node.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "api/api.h"
#include "cogpu.h"
#include "internal.h"

SPANK_PLUGIN(cogpu, 1);

/* cogpu's count-only GRES. Slurm 23.02 and later name their own GPU memory
 * TRES `gres/gpumem` (filled from NVML when AccountingStorageTRES has
 * gres/gpu), so cogpu's GRES, first named `gpumem`, now has a name no
 * Slurm version uses. The old name is still read, with a warning, until
 * cogpu 0.3. */
#define GRES_NAME "cogpumem"
#define GRES_OLD_NAME "gpumem"
/* The node feature that tells submitting hosts the node's largest GPU
 * (`cogpu slurm-conf` prints it): cogpu_gpu_80281M. */
#define FEATURE_PREFIX "cogpu_gpu_"

enum { OPT_MEM = 1, OPT_PRIORITY, OPT_WAIT, OPT_NO_PRELOAD };

typedef struct job_opts_s {
  uint64_t mem;    /* per node, bytes; 0: the job did not ask */
  long priority;   /* -1000..1000 */
  int64_t wait_ms; /* with wait_given; COGPU_WAIT_FOREVER for inf */
  bool wait_given;
  bool priority_given;
  bool no_preload; /* keep the reservation, do not interpose */
  char preload[PATH_MAX];
  /* plugstack.conf whole_gpu_wait=: how long a whole-GPU job waits for
   * --gpu-mem jobs to leave its GPUs before it runs unguarded. */
  int64_t whole_wait_ms;
  /* plugstack.conf dcgm_job_map_dir=: where to keep DCGM exporter's HPC
   * job mapping (empty: none). */
  char dcgm_dir[PATH_MAX];
} job_opts_t;

static job_opts_t opts = {.whole_wait_ms = COGPU_WAIT_FOREVER};
static cogpu_t *holder; /* this step's ledger handle (slurmstepd) */
static bool step_seen;  /* slurm_spank_user_init ran for this step */
/* The job's user: slurmstepd is root, and in node mode the daemon books
 * the job for this user, so that its tasks (running as the user) may join
 * it and nobody else may. */
static uint32_t job_uid = (uint32_t)-1;
static char token[32];
static int job_gpu = -1;
static char job_uuid[96];      /* job_gpu's UUID, for CUDA_VISIBLE_DEVICES */
static char gpu_uuids[16][96]; /* the node's GPUs, by ledger index */
/* Slurm gave the step GPUs (`gpu` or `shard` GRES): it sets the tasks'
 * CUDA_VISIBLE_DEVICES itself. */
static bool slurm_gave_gpus;
/* What the step waited for before it started. slurmstepd's messages go
 * to slurmd's log only, so the first task prints this on its stderr: the
 * user's terminal, or the batch job's output. */
static char notice[512];
/* Why this step's tasks fail (its reservation could not be made, or an
 * option was refused on the node): each task reports it on its stderr and
 * exits 1, so the job fails and the node is untouched. */
static char failure[512];
static bool failure_recorded; /* in the job's AdminComment */
static pid_t stepd_pid;       /* slurmstepd, the tasks' parent */
/* The end-of-job report goes to the stderr of the step's first task on this
 * node (the batch job's output file, or srun's terminal): slurmstepd opens
 * it through /proc when the task starts (for appending: a batch job's
 * output file is then written at its end, never overwritten) and writes
 * there when the step's last task has ended. */
static int report_fd = -1;
static int report_status = -1; /* the first task's wait status */
static unsigned report_tasks;  /* tasks started and not yet ended */

static double secs_since(uint64_t t0_ns) {
  return (double)(cogpu__now_ns() - t0_ns) / 1e9;
}

/* The step's tasks will fail with this message (slurmd's log gets it now). */
static void step_fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static void step_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(failure, sizeof failure, fmt, ap);
  va_end(ap);
  slurm_info("%s", failure); /* slurmd's log; the tasks tell the user */
}

static int opt_cb(int val, const char *arg, int remote);

static struct spank_option options[] = {
    {"gpu-mem", "SIZE",
     "GPU memory the job uses on each node, e.g. 12G (cogpu: packs jobs by "
     "it, and makes larger requests wait instead of running the GPU out of "
     "memory)",
     1, OPT_MEM, opt_cb},
    {"gpu-priority", "N",
     "with --gpu-mem: priority of the job's GPU memory requests, -1000..1000 "
     "(higher first under the node's priority policies)",
     1, OPT_PRIORITY, opt_cb},
    {"gpu-wait", "DURATION",
     "with --gpu-mem: how long a task may wait for GPU memory (e.g. 30s, 10m, "
     "inf); without it, allocations past --gpu-mem that do not fit now get "
     "out-of-memory",
     1, OPT_WAIT, opt_cb},
    {"gpu-no-preload", NULL,
     "with --gpu-mem: reserve the memory on the node but do not interpose "
     "the job's CUDA calls",
     0, OPT_NO_PRELOAD, opt_cb},
    SPANK_OPTIONS_TABLE_END};

/* --- Submission: what the cluster's GPUs can hold ------------------------ */

/* The count of GRES `name` in a node's GRES list ("gpu:2,cogpumem:160G"
 * or with "(S:0)" suffixes); false if the node has none. */
static bool gres_count(const char *list, const char *name, uint64_t *n) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", list ? list : "");
  size_t len = strlen(name);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    if (strncmp(tok, name, len) != 0 || tok[len] != ':')
      continue;
    /* A suffix ("(S:0-1)", "(CNT:...)") has colons of its own. */
    tok[strcspn(tok, "(")] = 0;
    char *count = strrchr(tok, ':') + 1; /* past a type, if any */
    return cogpu__parse_size(name, count, n) == 0;
  }
  return false;
}

/* The size in a node's cogpu_gpu_SIZE feature; false if it has none. */
static bool feature_size(const char *features, uint64_t *n) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", features ? features : "");
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save))
    if (strncmp(tok, FEATURE_PREFIX, strlen(FEATURE_PREFIX)) == 0)
      return cogpu__parse_size("feature", tok + strlen(FEATURE_PREFIX), n) == 0;
  return false;
}

/* The largest single GPU of any node, as far as the controller knows: a
 * node's cogpu_gpu_SIZE feature, else its whole GRES count (a node with one
 * GPU, or one configured before the feature existed). 0 when nothing can
 * be read. *old: some node still declares the GRES by its old name. */
static uint64_t cluster_largest_gpu(bool *old) {
  node_info_msg_t *nodes = NULL;
  uint64_t best = 0;
  *old = false;
  if (slurm_load_node((time_t)0, &nodes, SHOW_ALL) != SLURM_SUCCESS || !nodes)
    return 0;
  for (uint32_t i = 0; i < nodes->record_count; i++) {
    const node_info_t *nd = &nodes->node_array[i];
    uint64_t n = 0;
    if (!gres_count(nd->gres, GRES_NAME, &n)) {
      if (!gres_count(nd->gres, GRES_OLD_NAME, &n))
        continue;
      *old = true;
    }
    uint64_t gpu = 0;
    if (feature_size(nd->features, &gpu) && gpu < n)
      n = gpu;
    best = n > best ? n : best;
  }
  slurm_free_node_info_msg(nodes);
  return best;
}

/* --- Options ------------------------------------------------------------- */

/* A bad option value. Where the job is submitted, it is refused with our
 * message. On the node (remote: a value that did not come through a
 * checking client) it fails the step's tasks, never the step's launch. */
static int opt_error(int remote, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int opt_error(int remote, const char *fmt, ...) {
  char msg[sizeof failure];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!remote) {
    slurm_error("%s", msg);
    return -1;
  }
  step_fail("%s", msg);
  return 0;
}

static int opt_mem(const char *arg, int remote) {
  if (!arg || cogpu__parse_size("--gpu-mem", arg, &opts.mem) != 0) {
    opts.mem = 0;
    return opt_error(remote,
                     "cogpu: invalid --gpu-mem '%s': expected a size such as "
                     "512M, 12G or 1T (binary units, no fractions)",
                     arg ? arg : "");
  }
  if (opts.mem == 0)
    return opt_error(remote, "cogpu: --gpu-mem must be more than 0");
  if (remote)
    return 0; /* the node's own GPUs decide, when the step reserves */
  bool old = false;
  uint64_t max = cluster_largest_gpu(&old);
  if (old)
    slurm_info("cogpu: warning: this cluster declares GPU memory as GRES `%s`, "
               "which Slurm 23.02 and later use for their own TRES; cogpu's "
               "GRES is now `%s` (the old name works until cogpu 0.3: "
               "tell the cluster's admins, docs/slurm.md)",
               GRES_OLD_NAME, GRES_NAME);
  if (max && opts.mem > max) {
    slurm_error("cogpu: --gpu-mem=%s is more GPU memory than any single GPU "
                "has (largest: %llu MiB); a job's --gpu-mem must fit on one "
                "GPU",
                arg, (unsigned long long)(max >> 20));
    return -1;
  }
  return 0;
}

static int opt_cb(int val, const char *arg, int remote) {
  switch (val) {
  case OPT_MEM:
    return opt_mem(arg, remote);
  case OPT_PRIORITY:
    if (!arg || cogpu__parse_int("--gpu-priority", arg, -1000, 1000,
                                 &opts.priority) != 0)
      return opt_error(remote,
                       "cogpu: invalid --gpu-priority '%s': expected an "
                       "integer from -1000 to 1000",
                       arg ? arg : "");
    opts.priority_given = true;
    return 0;
  case OPT_WAIT:
    if (!arg || cogpu__parse_duration_ms("--gpu-wait", arg, &opts.wait_ms) != 0)
      return opt_error(remote,
                       "cogpu: invalid --gpu-wait '%s': expected a duration "
                       "such as 0, 30s, 10m, 2h or inf",
                       arg ? arg : "");
    opts.wait_given = true;
    return 0;
  case OPT_NO_PRELOAD:
    opts.no_preload = true;
    return 0;
  }
  return -1;
}

/* Arguments on the plug-in's plugstack.conf line; a typo is an error, not
 * a setting silently ignored. The admin's: a node whose line is wrong
 * fails every step's launch, as Slurm does for a broken plug-in. */
static int parse_args(int ac, char **av) {
  for (int i = 0; i < ac; i++) {
    if (strncmp(av[i], "preload=", 8) == 0 && av[i][8]) {
      snprintf(opts.preload, sizeof opts.preload, "%s", av[i] + 8);
      continue;
    }
    if (strncmp(av[i], "whole_gpu_wait=", 15) == 0) {
      if (cogpu__parse_duration_ms("whole_gpu_wait", av[i] + 15,
                                   &opts.whole_wait_ms) != 0) {
        slurm_error("cogpu: plugstack.conf: %s", cogpu_last_error());
        return -1;
      }
      continue;
    }
    if (strncmp(av[i], "dcgm_job_map_dir=", 17) == 0) {
      if (av[i][17] != '/') {
        slurm_error("cogpu: plugstack.conf: dcgm_job_map_dir must be an "
                    "absolute path, not '%s'",
                    av[i] + 17);
        return -1;
      }
      snprintf(opts.dcgm_dir, sizeof opts.dcgm_dir, "%s", av[i] + 17);
      continue;
    }
    slurm_error("cogpu: unknown argument '%s' in plugstack.conf (accepted: "
                "preload=PATH, whole_gpu_wait=DURATION, "
                "dcgm_job_map_dir=DIR)",
                av[i]);
    return -1;
  }
  return 0;
}

/* The preload library: `preload=PATH` in plugstack.conf, else the one
 * installed beside this plug-in. */
static void find_preload(void) {
  if (opts.preload[0])
    return;
  Dl_info info;
  if (dladdr((void *)find_preload, &info) && info.dli_fname) {
    snprintf(opts.preload, sizeof opts.preload, "%s", info.dli_fname);
    char *slash = strrchr(opts.preload, '/');
    size_t room =
        sizeof opts.preload - (size_t)(slash ? slash - opts.preload : 0);
    if (slash && room > 22)
      snprintf(slash, room, "/libcogpu-preload.so");
  }
}

int slurm_spank_init(spank_t sp, int ac, char **av) {
  for (struct spank_option *o = options; o->name; o++)
    if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
      slurm_error("cogpu: cannot register --%s", o->name);
      return -1;
    }
  if (parse_args(ac, av) != 0)
    return -1;
  if (spank_remote(sp))
    find_preload();
  return 0;
}

/* After the options, where the job is submitted: the options that qualify
 * --gpu-mem mean nothing without it, and a job that gave one expected it
 * to apply. (Inside a job, srun sees the job's --gpu-mem too.) */
static void step_setup(spank_t sp);

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  if (spank_remote(sp)) {
    step_setup(sp); /* slurmstepd, still root: see "The node" below */
    return 0;
  }
  if (opts.mem)
    return 0;
  const char *lone = opts.wait_given       ? "--gpu-wait"
                     : opts.priority_given ? "--gpu-priority"
                     : opts.no_preload     ? "--gpu-no-preload"
                                           : NULL;
  if (!lone)
    return 0;
  slurm_error("cogpu: %s needs --gpu-mem: it qualifies the GPU memory the "
              "job reserves on each node (e.g. --gpu-mem=12G %s...)",
              lone, lone);
  return -1;
}

/* --- The node: the step's reservation ------------------------------------
 * slurmstepd books the step in slurm_spank_init_post_opt, where it is still
 * root (spank(8): slurm_spank_user_init runs with the job user's
 * credentials). In node mode the daemon identifies its clients by the
 * kernel's credentials of the connection, so only a root slurmstepd may
 * book the job for its user (COGPU_ATTACH_FOR_UID): the reservation is the
 * user's (they see it, suspend it, and their tasks join it), and no user
 * can make one in another's name. In single-user mode there is no daemon
 * to trust, and each user's ledger is their own: the step books in
 * slurm_spank_user_init, as the user, in the user's ledger.
 *
 * What the step books is the job's `cogpumem` allocation on this node, as
 * slurmctld recorded it, never a figure the job's environment carries
 * alone: --gpu-mem reaches slurmstepd through an environment variable
 * that anyone can set, and --export=NONE drops it. A --gpu-mem larger than
 * the allocation fails the step; an allocation without --gpu-mem (the
 * variable was dropped, or the job asked for the GRES itself) is used as
 * the job's --gpu-mem. */

/* The count of GRES `name` in one of slurmctld's per-node allocation
 * strings: "cogpumem(CNT:3221225472)", or a node list's form
 * ("gpu:2(IDX:0-1),cogpumem:3G"). */
static bool alloc_count(const char *list, const char *name, uint64_t *n) {
  size_t len = strlen(name);
  for (const char *p = list; p && (p = strstr(p, name)); p += len) {
    if ((p != list && p[-1] != ',') || strncmp(p + len, "(CNT:", 5) != 0)
      continue;
    char num[64];
    const char *c = p + len + 5;
    snprintf(num, sizeof num, "%.*s", (int)strcspn(c, ")"), c);
    return cogpu__parse_size(name, num, n) == 0;
  }
  return gres_count(list, name, n);
}

/* The job's `cogpumem` (or old `gpumem`) allocation on node `node`, from
 * slurmctld: the node's entry of the job's GRES details, else the job's
 * per-node request. 0 when it has none; -1 when slurmctld cannot say. */
static int job_allocation(uint32_t id, const char *node, uint64_t *bytes) {
  job_info_msg_t *ji = NULL;
  *bytes = 0;
  if (slurm_load_job(&ji, id, SHOW_DETAIL) != SLURM_SUCCESS || !ji ||
      ji->record_count < 1) {
    if (ji)
      slurm_free_job_info_msg(ji);
    return -1;
  }
  const slurm_job_info_t *j = &ji->job_array[0];
  int idx = 0;
  if (j->nodes && node[0]) {
    hostlist_t hl = slurm_hostlist_create(j->nodes);
    if (hl) {
      idx = slurm_hostlist_find(hl, node);
      slurm_hostlist_destroy(hl);
    }
  }
  bool found = false;
  if (idx >= 0 && (uint32_t)idx < j->gres_detail_cnt && j->gres_detail_str)
    found = alloc_count(j->gres_detail_str[idx], GRES_NAME, bytes) ||
            alloc_count(j->gres_detail_str[idx], GRES_OLD_NAME, bytes);
  if (!found && j->tres_per_node) {
    /* "gres:cogpumem:3G" or "gres/cogpumem:3G", comma-separated. */
    char buf[1024], *save = NULL;
    snprintf(buf, sizeof buf, "%s", j->tres_per_node);
    for (char *t = strtok_r(buf, ",", &save); t && !found;
         t = strtok_r(NULL, ",", &save)) {
      if (strncmp(t, "gres:", 5) == 0 || strncmp(t, "gres/", 5) == 0)
        t += 5;
      found = gres_count(t, GRES_NAME, bytes) ||
              gres_count(t, GRES_OLD_NAME, bytes);
    }
  }
  slurm_free_job_info_msg(ji);
  return 0;
}

/* Asked once a second while the step waits for its memory at start: is
 * the job over (cancelled, out of time, failed)? slurmstepd gets no signal
 * for it while its tasks do not exist yet, so without asking, a cancelled
 * job would stay COMPLETING until the memory came. */
static bool job_over(void *arg) {
  uint32_t id = *(const uint32_t *)arg;
  job_info_msg_t *ji = NULL;
  bool over = false;
  if (slurm_load_job(&ji, id, SHOW_ALL) == SLURM_SUCCESS && ji &&
      ji->record_count > 0) {
    uint32_t st = ji->job_array[0].job_state;
    over = (st & JOB_STATE_BASE) != JOB_RUNNING || (st & JOB_COMPLETING);
  } else if (slurm_get_errno() == ESLURM_INVALID_JOB_ID) {
    over = true;
  }
  if (ji)
    slurm_free_job_info_msg(ji);
  return over;
}

/* The GPU where the joined job holds memory. */
static int joined_gpu(void) {
  int n = cogpu_gpu_count(holder);
  for (int g = 0; g < n; g++) {
    uint64_t held = 0;
    if (cogpu_held(holder, g, &held) == 0 && held)
      return g;
  }
  return -1;
}

/* The ledger index of the n-th GPU Slurm gave the step (its `gpu` or
 * `shard` GRES); -1 if cogpu does not know it, NO_GPU past the last one. */
#define NO_GPU (-2)
static int slurm_gpu(const char *gpus, int n) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", gpus);
  char *save = NULL, *tok = strtok_r(buf, ",", &save);
  for (int i = 0; tok && i < n; i++)
    tok = strtok_r(NULL, ",", &save);
  int gpu = NO_GPU;
  if (tok && cogpu_gpu_lookup(holder, tok, &gpu) != 0) {
    slurm_info("cogpu: GPU '%s' from Slurm is not in the node ledger: %s", tok,
               cogpu_last_error());
    gpu = -1;
  }
  return gpu;
}

/* Join the job's reservation if an earlier step holds it on this node,
 * else take it (on the GPU Slurm gave the job, if it gave one): once per
 * step, in slurmstepd. On failure, the step's tasks fail (step_fail). */
static void hold_reservation(uint32_t id, const char *job_id, const char *cmd,
                             const char *cvd) {
  cogpu_attach_opts_t ao = {
      .priority = (int)opts.priority, .job_id = job_id, .command = cmd};
  int rc = cogpu__attach_as(&ao, job_uid, &holder);
  if (rc == 0 && cogpu__find_job(holder, job_id, token, sizeof token) == 0) {
    cogpu_detach(holder);
    ao.join = token;
    rc = cogpu__attach_as(&ao, job_uid, &holder);
    /* The tasks join through the step, so that its report is its own. */
    if (rc == 0)
      rc = cogpu__step_token(holder, token, sizeof token);
    if (rc == 0) {
      job_gpu = joined_gpu();
      return;
    }
  }
  if (rc) {
    holder = NULL;
    step_fail("cogpu: job %s: cannot use the node's GPU ledger: %s", job_id,
              cogpu_last_error());
    return;
  }
  /* A fresh look at the node first: the ledger re-reads the memory of
   * processes outside cogpu (NVML) only when a request does not fit, so a
   * request made on old figures could be granted memory such processes
   * took since. It also names the GPUs, for CUDA_VISIBLE_DEVICES. */
  cogpu_status_t *st = NULL;
  if (cogpu_status(holder, &st) == 0) {
    for (size_t g = 0; g < st->ngpus && g < COGPU_ARRAY_SIZE(gpu_uuids); g++)
      snprintf(gpu_uuids[g], sizeof gpu_uuids[g], "%s", st->gpus[g].uuid);
    cogpu_status_free(st);
  }
  int gpu = slurm_gpu(cvd, 0);
  cogpu_request_t req = {.gpu = gpu >= 0 ? gpu : COGPU_GPU_AUTO,
                         .bytes = opts.mem,
                         .priority = COGPU_PRIORITY_DEFAULT,
                         .timeout_ms = opts.wait_given ? opts.wait_ms
                                                       : COGPU_WAIT_FOREVER};
  /* Slurm packed the node, so this normally fits at once; say why a job
   * that has started waits (foreign memory, jobs that grew past their
   * declaration, GPUs given whole to other jobs). */
  int64_t bound = req.timeout_ms;
  req.timeout_ms = COGPU_NOWAIT;
  rc = cogpu_reserve(holder, &req, &job_gpu);
  if (rc == -EAGAIN || rc == -EBUSY) {
    slurm_info("cogpu: job %s: waiting for %llu MiB of GPU memory", job_id,
               (unsigned long long)(opts.mem >> 20));
    uint64_t t0 = cogpu__now_ns();
    req.timeout_ms = bound;
    cogpu__abort_t ab = {.stop = job_over, .arg = &id, .every_ms = 1000};
    rc = cogpu__reserve_abortable(holder, &req, &job_gpu, &ab);
    if (rc == -ECANCELED)
      cogpu__seterr(rc, "the job ended while its step waited");
    snprintf(notice, sizeof notice,
             "cogpu: job %s waited %.1f s for %llu MiB of GPU memory", job_id,
             secs_since(t0), (unsigned long long)(opts.mem >> 20));
  }
  if (rc == 0)
    rc = cogpu_job_token(holder, token, sizeof token);
  if (rc) {
    step_fail("cogpu: job %s: cannot reserve %llu MiB of GPU memory on this "
              "node: %s",
              job_id, (unsigned long long)(opts.mem >> 20), cogpu_last_error());
    cogpu_detach(holder);
    holder = NULL;
    job_gpu = -1;
  }
}

static void note_gpu_uuid(void) {
  cogpu_status_t *st;
  if (job_gpu >= 0 && job_gpu < (int)COGPU_ARRAY_SIZE(gpu_uuids) &&
      gpu_uuids[job_gpu][0]) {
    snprintf(job_uuid, sizeof job_uuid, "%s", gpu_uuids[job_gpu]);
  } else if (job_gpu >= 0 && cogpu_status(holder, &st) == 0) {
    if ((size_t)job_gpu < st->ngpus)
      snprintf(job_uuid, sizeof job_uuid, "%s", st->gpus[job_gpu].uuid);
    cogpu_status_free(st);
  }
}

/* A job that Slurm gave whole GPUs (`gpu` GRES without --gpu-mem) takes
 * them exclusively in the ledger for the step, so that no --gpu-mem job is
 * placed there. If --gpu-mem jobs hold memory there, the step says so and
 * waits for them to leave, for at most whole_gpu_wait. Never fails the
 * job: without the ledger, or after that wait, it runs as it would
 * without cogpu; its memory on a GPU it could not take then counts as
 * foreign (the ledger hides only what a client accounts for). */
static void guard_whole_gpus(const char *job_id, const char *cmd,
                             const char *cvd) {
  cogpu_attach_opts_t ao = {.job_id = job_id, .command = cmd};
  if (cogpu__attach_as(&ao, job_uid, &holder) != 0) {
    holder = NULL;
    slurm_verbose("cogpu: GPUs of job %s not guarded: %s", job_id,
                  cogpu_last_error());
    return;
  }
  if (cogpu__find_job(holder, job_id, token, sizeof token) == 0)
    return; /* an earlier step (the batch step) guards them */
  int gpu;
  for (int i = 0; (gpu = slurm_gpu(cvd, i)) != NO_GPU; i++) {
    cogpu_request_t req = {.gpu = gpu,
                           .priority = COGPU_PRIORITY_DEFAULT,
                           .timeout_ms = COGPU_NOWAIT,
                           .flags = COGPU_REQ_EXCLUSIVE};
    if (gpu < 0)
      continue;
    int rc = cogpu_reserve(holder, &req, NULL);
    if (rc == -EAGAIN && opts.whole_wait_ms != 0) {
      slurm_info("cogpu: job %s: waiting for --gpu-mem jobs to leave GPU %d",
                 job_id, gpu);
      uint64_t t0 = cogpu__now_ns();
      req.timeout_ms = opts.whole_wait_ms;
      rc = cogpu_reserve(holder, &req, NULL);
      snprintf(notice, sizeof notice,
               "cogpu: job %s waited %.1f s for --gpu-mem jobs to leave GPU "
               "%d%s",
               job_id, secs_since(t0), gpu,
               rc ? "; it runs without exclusive use (whole_gpu_wait)" : "");
    }
    if (rc != 0)
      slurm_info("cogpu: GPU %d of job %s not guarded: %s", gpu, job_id,
                 cogpu_last_error());
  }
}

/* The GPUs Slurm gave the step, as device indices: SLURM_STEP_GPUS (a
 * step) or SLURM_JOB_GPUS (the batch step); empty if none. Not
 * CUDA_VISIBLE_DEVICES: a user's own value travels with the job's
 * environment, and under ConstrainDevices Slurm renumbers it from 0. */
static void slurm_gpus(spank_t sp, char *buf, size_t len) {
  if (spank_getenv(sp, "SLURM_STEP_GPUS", buf, (int)len) != ESPANK_SUCCESS &&
      spank_getenv(sp, "SLURM_JOB_GPUS", buf, (int)len) != ESPANK_SUCCESS)
    buf[0] = 0;
}

/* What the step books, when it books in slurm_spank_user_init (single-user
 * mode). */
static struct {
  bool pending;
  uint32_t id;
  char job_id[32], cmd[128], cvd[1024];
} later;

static void book(uint32_t id, const char *job_id, const char *cmd,
                 const char *cvd) {
  if (!opts.mem) {
    if (cvd[0])
      guard_whole_gpus(job_id, cmd, cvd);
    return;
  }
  hold_reservation(id, job_id, cmd, cvd);
  if (holder)
    note_gpu_uuid();
}

/* slurmstepd, once per step, as root, options known (see "The node"). It
 * never fails: a failure here would be the step's launch failing, which
 * drains the node (see the top of the file); the tasks fail instead. */
static void step_setup(spank_t sp) {
  uint32_t id = 0, step = 0;
  char job_id[32], cmd[128] = "slurm job", cvd[1024] = "", node[128] = "";
  int argc = 0;
  char **argv = NULL;
  if (step_seen)
    return; /* the callback ran already for this step */
  step_seen = true;
  /* The extern step runs no task of the job's: nothing to book. */
  if (spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS &&
      step == SLURM_EXTERN_CONT)
    return;
  stepd_pid = getpid();
  slurm_gpus(sp, cvd, sizeof cvd);
  slurm_gave_gpus = cvd[0] != 0;
  if (spank_get_item(sp, S_JOB_ID, &id) != ESPANK_SUCCESS) {
    if (opts.mem)
      step_fail("cogpu: cannot read the job id");
    return;
  }
  snprintf(job_id, sizeof job_id, "%u", id);
  if (spank_getenv(sp, "SLURMD_NODENAME", node, sizeof node) != ESPANK_SUCCESS)
    gethostname(node, sizeof node - 1);
  uint64_t alloc = 0;
  if (job_allocation(id, node, &alloc) != 0) {
    if (opts.mem)
      step_fail("cogpu: job %s: cannot read the job's GPU memory allocation "
                "from slurmctld: %s",
                job_id, slurm_strerror(slurm_get_errno()));
    alloc = 0;
  } else if (opts.mem > alloc && !failure[0]) {
    step_fail("cogpu: job %s: --gpu-mem=%lluM is not covered by the job's "
              "GPU memory allocation on this node (gres/%s: %lluM): the "
              "option reached the node without going through the cluster's "
              "submission filter. Give --gpu-mem=SIZE to sbatch, srun or "
              "salloc (the cluster then allocates gres/%s), or ask for "
              "--gres=%s:SIZE",
              job_id, (unsigned long long)(opts.mem >> 20), GRES_NAME,
              (unsigned long long)(alloc >> 20), GRES_NAME, GRES_NAME);
  } else if (!opts.mem && alloc && !failure[0]) {
    /* The allocation is the job's --gpu-mem: its environment lost the
     * option (--export=NONE), or it asked for the GRES by hand. */
    opts.mem = alloc;
  }
  if (!opts.mem && !failure[0] && !slurm_gave_gpus)
    return; /* not cogpu's: no GPU memory, no whole GPUs */
  uid_t uid;
  if (spank_get_item(sp, S_JOB_UID, &uid) == ESPANK_SUCCESS)
    job_uid = (uint32_t)uid;
  if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) == ESPANK_SUCCESS &&
      argc > 0)
    snprintf(cmd, sizeof cmd, "%s", argv[0]);
  if (failure[0])
    return; /* refused on the node: the tasks say so */
  if (cogpu__attach_mode() == 0) {
    later.pending = true; /* single-user mode: the user's own ledger */
    later.id = id;
    snprintf(later.job_id, sizeof later.job_id, "%s", job_id);
    snprintf(later.cmd, sizeof later.cmd, "%s", cmd);
    snprintf(later.cvd, sizeof later.cvd, "%s", cvd);
    return;
  }
  book(id, job_id, cmd, cvd);
}

/* slurmstepd, once per step, as the job's user: books the step in
 * single-user mode (see "The node"). Never fails, as above. */
int slurm_spank_user_init(spank_t sp, int ac, char **av) {
  (void)sp;
  (void)ac;
  (void)av;
  if (later.pending) {
    later.pending = false;
    book(later.id, later.job_id, later.cmd, later.cvd);
  }
  return 0;
}

/* --- The step guard ------------------------------------------------------- */

/* If slurmstepd dies (kill -9, a crash), Slurm loses the step: its tasks
 * run on, outside Slurm's control and, for processes not under the preload
 * library, outside cogpu's accounts (their memory was the step's). So the
 * step's processes go with it: each task dies with its parent
 * (PR_SET_PDEATHSIG, task_init), and a small guard process, a child of
 * slurmstepd that does nothing else, kills the tasks' process groups
 * (which the processes they start share) when slurmstepd is gone. The
 * guard is stopped and reaped when the step's last task ends, before
 * Slurm's process tracking waits for the step's processes to go. */
#define GUARD_MAX_GROUPS 64
static pid_t guard_groups[GUARD_MAX_GROUPS];
static int guard_ngroups;
static pid_t guard_pid = -1;
static int guard_pidfd = -1; /* guard_pid without the risk of PID reuse */
static uint32_t tasks_left;

/* A cogpu step: one with --gpu-mem that holds its reservation, or a
 * whole-GPU step under the ledger's guard. */
static bool step_managed(void) {
  return holder != NULL && !failure[0];
}

static void guard_close_fds(int maxfd) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3u, ~0u, 0u) == 0)
    return;
#endif
  for (int fd = 3; fd < maxfd; fd++)
    close(fd);
}

/* The guard, in the forked child: async-signal-safe calls only (slurmstepd
 * has threads). It holds none of slurmstepd's files (sockets to srun and to
 * the node daemon, the ledger's liveness lock), so that slurmstepd's death
 * is seen wherever it matters. */
__attribute__((noreturn)) static void guard_run(pid_t parent, int maxfd) {
  sigset_t all, wake;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, NULL);
  prctl(PR_SET_PDEATHSIG, SIGUSR1);
  prctl(PR_SET_NAME, "cogpu-guard");
  guard_close_fds(maxfd);
  sigemptyset(&wake);
  sigaddset(&wake, SIGUSR1);
  sigaddset(&wake, SIGTERM);
  while (getppid() == parent) {
    int sig = sigwaitinfo(&wake, NULL);
    if (sig == SIGTERM)
      _exit(0); /* the step ended normally, or Slurm ends it */
    if (sig == SIGUSR1)
      break;
  }
  for (int i = 0; i < guard_ngroups; i++)
    kill(-guard_groups[i], SIGKILL);
  _exit(0);
}

static void guard_start(void) {
  struct rlimit rl;
  int maxfd = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 1u << 20
                  ? (int)rl.rlim_cur
                  : 1 << 20;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0)
    guard_run(parent, maxfd);
  if (pid < 0) {
    slurm_info("cogpu: no guard for the step's tasks (fork: %s)",
               strerror(errno));
    return;
  }
  guard_pid = pid;
#ifdef SYS_pidfd_open
  guard_pidfd = (int)syscall(SYS_pidfd_open, pid, 0u);
#endif
}

/* Stop the guard and reap it (slurmstepd may have reaped it already, when
 * Slurm signalled the step's processes: then the pidfd says so, and no
 * other process that took its PID is signalled). */
static void guard_stop(void) {
  if (guard_pid <= 0)
    return;
  bool sent = false;
#ifdef SYS_pidfd_send_signal
  if (guard_pidfd >= 0)
    sent = syscall(SYS_pidfd_send_signal, guard_pidfd, SIGKILL, NULL, 0u) == 0;
  else
#endif
    sent = kill(guard_pid, SIGKILL) == 0;
  if (sent || errno != ESRCH)
    waitpid(guard_pid, NULL, 0);
  if (guard_pidfd >= 0)
    close(guard_pidfd);
  guard_pid = -1;
  guard_pidfd = -1;
}

/* slurmstepd: the first local task's stderr, for the end-of-job report. */
static void report_capture(spank_t sp) {
  pid_t pid = 0;
  int task = -1;
  if (report_fd >= 0 || !holder || !opts.mem || failure[0] || opts.no_preload ||
      spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task != 0 ||
      spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS)
    return;
  cogpu__config_t cfg;
  if (cogpu__config_load(&cfg) == 0 && !cfg.v[COGPU_OPT_JOB_REPORT].i)
    return; /* job_report=no on this node */
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/2", (int)pid);
  report_fd = open(path, O_WRONLY | O_APPEND | O_NOCTTY | O_CLOEXEC);
}

/* The job's figures in its AdminComment, as JSON that `sacct -o
 * AdminComment` and `scontrol show job` show: {"cogpu":[{...}, ...]}, one
 * entry per step and node, appended to those already there (a comment that
 * is not cogpu's is kept, with ours after it). Read, then written: two nodes
 * ending the same instant may lose one entry (Slurm offers no append). */
/* Steps of one job that end together on a node would each read the
 * comment and write it back with their entry, and all but one entry would
 * be lost: on a node they take turns, under an flock in the node's daemon
 * directory (root's, 0755, made by cogpud: a lock in a directory users
 * can write would let one of them hold every job's report back). At most
 * 5 s: an entry written without the lock is better than a step that hangs.
 * Returns the lock's descriptor, or -1. */
static int comment_lock(void) {
  cogpu__config_t cfg;
  struct stat sb;
  char path[PATH_MAX + 32];
  if (cogpu__config_load(&cfg) != 0)
    return -1;
  const char *dir = cfg.v[COGPU_OPT_DAEMON_DIR].s;
  if (!dir || !*dir || lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) ||
      sb.st_uid != 0 || (sb.st_mode & 022))
    return -1;
  snprintf(path, sizeof path, "%s/slurm-comment.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return -1;
  for (int i = 0; i < 500; i++) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
      return fd;
    if (errno != EWOULDBLOCK && errno != EINTR)
      break;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  slurm_info("cogpu: %s: not taken in 5 s: the AdminComment is written "
             "without it",
             path);
  close(fd);
  return -1;
}

static void report_admin_comment(uint32_t id, uint32_t step, const char *node,
                                 const cogpu__job_report_t *r) {
  char entry[512], *old = NULL, msg[4096];
  int n = snprintf(
      entry, sizeof entry,
      "{\"node\":\"%s\",\"step\":\"%u\",\"gpu\":%d,\"peak_bytes\":%llu,"
      "\"reserved_bytes\":%llu,\"declared_bytes\":%llu,\"peak_after_s\":%.1f,"
      "\"waited_s\":%.1f,\"run_s\":%.1f,\"suspensions\":%u,"
      "\"guard_failures\":%u}",
      node, step, r->gpu, (unsigned long long)r->peak,
      (unsigned long long)r->reserved, (unsigned long long)opts.mem,
      (double)r->peak_after_ms / 1e3, (double)r->waited_ms / 1e3,
      (double)r->run_ms / 1e3, r->suspensions, r->guard_failures);
  if (n < 0 || (size_t)n >= sizeof entry)
    return;
  int lock = comment_lock();
  job_info_msg_t *ji = NULL;
  if (slurm_load_job(&ji, id, SHOW_DETAIL) == SLURM_SUCCESS && ji &&
      ji->record_count > 0 && ji->job_array[0].admin_comment)
    old = strdup(ji->job_array[0].admin_comment);
  if (ji)
    slurm_free_job_info_msg(ji);
  const char *head = "{\"cogpu\":[", *tail = "]}";
  size_t ol = old ? strlen(old) : 0;
  if (old && ol > strlen(head) + 2 && strncmp(old, head, strlen(head)) == 0 &&
      strcmp(old + ol - 2, tail) == 0)
    snprintf(msg, sizeof msg, "%.*s,%s%s", (int)(ol - 2), old, entry, tail);
  else if (old && *old)
    snprintf(msg, sizeof msg, "%s %s%s%s", old, head, entry, tail);
  else
    snprintf(msg, sizeof msg, "%s%s%s", head, entry, tail);
  free(old);
  job_desc_msg_t d;
  slurm_init_job_desc_msg(&d);
  d.job_id = id;
  d.admin_comment = msg;
  int rc = slurm_update_job(&d);
  int err = slurm_get_errno();
  if (lock >= 0)
    close(lock); /* drops the flock */
  if (rc == SLURM_SUCCESS)
    return;
  if (err == ESLURM_JOB_FINISHED)
    /* Cancelled or out of time: slurmctld changes no finished job, so the
     * figures stay where they were written (the job's output) and go to
     * slurmd's log, and the node's job history has the job's record. */
    slurm_info("cogpu: job %u ended before its GPU memory figures could go "
               "into its AdminComment (Slurm changes no finished job): "
               "{\"cogpu\":[%s]}; `cogpu history` on %s has its record",
               id, entry, node);
  else
    slurm_info("cogpu: job %u: cannot record its GPU memory figures in its "
               "AdminComment: %s",
               id, slurm_strerror(err));
}

/* slurmstepd, when the step's last task on this node has ended: the job's
 * figures (its exact peak, from the preload library's counts) on the first
 * task's stderr, like seff's, and in the job's AdminComment. */
/* --- DCGM exporter's HPC job mapping ----------------------------------------
 * With dcgm_job_map_dir=DIR, DIR holds a file per GPU, named by the GPU's
 * index, listing the jobs that hold memory on it, one job id per line:
 * dcgm-exporter --hpc-job-mapping-dir=DIR then labels each GPU's metrics
 * with the jobs on it (several, when cogpu shares the GPU). slurmstepd
 * (root) adds its job when the step's first task starts and takes it out
 * when the step ends, unless another step of the job still holds memory
 * there. Steps of many jobs start and end at once: each change is made
 * under an flock of DIR/.lock and published by rename, so the exporter
 * never reads half a file. */
static bool dcgm_added;
static int dcgm_index = -1; /* job_gpu's NVML index, the file's name */

static void dcgm_map_change(const char *job, bool add) {
  char lock[PATH_MAX + 16], path[PATH_MAX + 16], tmp[PATH_MAX + 32];
  snprintf(lock, sizeof lock, "%s/.lock", opts.dcgm_dir);
  snprintf(path, sizeof path, "%s/%d", opts.dcgm_dir, dcgm_index);
  snprintf(tmp, sizeof tmp, "%s/.%d.%d", opts.dcgm_dir, dcgm_index,
           (int)getpid());
  if (mkdir(opts.dcgm_dir, 0755) != 0 && errno != EEXIST) {
    slurm_info("cogpu: dcgm_job_map_dir %s: %s", opts.dcgm_dir,
               strerror(errno));
    return;
  }
  int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (lfd < 0 || flock(lfd, LOCK_EX) != 0) {
    slurm_info("cogpu: %s: %s", lock, strerror(errno));
    if (lfd >= 0)
      close(lfd);
    return;
  }
  /* Another step of the job still on the GPU keeps the line. */
  bool keep = false;
  cogpu_status_t *st = NULL;
  if (!add && holder && job_gpu >= 0 && cogpu_status(holder, &st) == 0) {
    if ((size_t)job_gpu < st->ngpus) {
      const cogpu_gpu_info_t *gi = &st->gpus[job_gpu];
      for (size_t c = 0; c < gi->nclients && !keep; c++)
        keep = strcmp(gi->clients[c].job_id, job) == 0 &&
               gi->clients[c].pid != getpid();
    }
    cogpu_status_free(st);
  }
  char line[128];
  bool present = false;
  FILE *in = fopen(path, "re");
  FILE *out = keep ? NULL : fopen(tmp, "we");
  while (in && fgets(line, sizeof line, in)) {
    line[strcspn(line, "\n")] = 0;
    bool mine = strcmp(line, job) == 0;
    present |= mine;
    if (out && line[0] && (!mine || add))
      fprintf(out, "%s\n", line);
  }
  if (out && add && !present)
    fprintf(out, "%s\n", job);
  if (in)
    fclose(in);
  if (out) {
    bool ok = fflush(out) == 0 && fchmod(fileno(out), 0644) == 0;
    ok = fclose(out) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
      slurm_info("cogpu: %s: %s", path, strerror(errno));
      unlink(tmp);
    }
  }
  close(lfd); /* drops the flock */
}

static void dcgm_map_add(spank_t sp) {
  if (!opts.dcgm_dir[0] || dcgm_added || !holder || job_gpu < 0 || failure[0])
    return;
  uint32_t id = 0;
  if (spank_get_item(sp, S_JOB_ID, &id) != ESPANK_SUCCESS)
    return;
  cogpu_status_t *st = NULL;
  if (cogpu_status(holder, &st) != 0)
    return;
  if ((size_t)job_gpu < st->ngpus)
    dcgm_index = st->gpus[job_gpu].index;
  cogpu_status_free(st);
  if (dcgm_index < 0)
    return;
  char job[16];
  snprintf(job, sizeof job, "%u", id);
  dcgm_map_change(job, true);
  dcgm_added = true;
}

static void dcgm_map_remove(spank_t sp) {
  uint32_t id = 0;
  if (!dcgm_added || spank_get_item(sp, S_JOB_ID, &id) != ESPANK_SUCCESS)
    return;
  char job[16];
  snprintf(job, sizeof job, "%u", id);
  dcgm_map_change(job, false);
  dcgm_added = false;
}

static void report_step(spank_t sp) {
  /* Without the preload library nothing counted the tasks' memory: no
   * figure is better than a false 0. */
  if (!holder || !opts.mem || failure[0] || opts.no_preload)
    return;
  uint32_t id = 0, step = 0, nnodes = 1;
  char node[128] = "", job[96], line[1024];
  spank_get_item(sp, S_JOB_ID, &id);
  spank_get_item(sp, S_JOB_STEPID, &step);
  spank_get_item(sp, S_JOB_NNODES, &nnodes);
  if (spank_getenv(sp, "SLURMD_NODENAME", node, sizeof node) != ESPANK_SUCCESS)
    gethostname(node, sizeof node - 1);
  /* The step's own figures: its tasks joined through its token. */
  cogpu__job_report_t r;
  if (cogpu__step_end(holder, report_status, &r) != 0)
    return;
  if (nnodes > 1)
    snprintf(job, sizeof job, "job %u on %s", id, node);
  else
    snprintf(job, sizeof job, "job %u", id);
  size_t n = cogpu__job_report_line(&r, job, "--gpu-mem=", opts.mem, line,
                                    sizeof line);
  if (report_fd >= 0 && n && write(report_fd, line, n) < 0)
    slurm_info("cogpu: job %u: cannot write its report: %s", id,
               strerror(errno));
  if (r.gpu >= 0)
    report_admin_comment(id, step, node, &r);
}

/* slurmstepd (root), after each task's fork, before the tasks run: note
 * the task's process group; after the last one, start the guard. If the
 * reservation failed, record why in the job's AdminComment (once), so that
 * `scontrol show job` and `sacct -o AdminComment` show it. */
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  if (failure[0] && !failure_recorded) {
    uint32_t id = 0;
    failure_recorded = true;
    if (spank_get_item(sp, S_JOB_ID, &id) == ESPANK_SUCCESS) {
      job_desc_msg_t d;
      char node[128] = "";
      char msg[sizeof failure + 160];
      if (spank_getenv(sp, "SLURMD_NODENAME", node, sizeof node) !=
          ESPANK_SUCCESS)
        gethostname(node, sizeof node - 1);
      snprintf(msg, sizeof msg, "%s (node %s)", failure, node);
      slurm_init_job_desc_msg(&d);
      d.job_id = id;
      d.admin_comment = msg;
      if (slurm_update_job(&d) != SLURM_SUCCESS)
        slurm_info("cogpu: job %u: cannot record the failure in the job's "
                   "AdminComment: %s",
                   id, slurm_strerror(slurm_get_errno()));
    }
  }
  report_capture(sp);
  report_tasks++;
  dcgm_map_add(sp);
  if (!step_managed())
    return 0;
  pid_t pid = 0;
  int task = 0;
  uint32_t ntasks = 0;
  if (spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS)
    return 0;
  pid_t group = getpgid(pid);
  bool known = group <= 1;
  for (int i = 0; i < guard_ngroups && !known; i++)
    known = guard_groups[i] == group;
  if (!known && guard_ngroups < GUARD_MAX_GROUPS)
    guard_groups[guard_ngroups++] = group;
  tasks_left = ntasks;
  if ((uint32_t)task + 1 == ntasks && guard_pid < 0)
    guard_start();
  return 0;
}

/* slurmstepd (root), as each task ends: after the last, the guard goes. */
int slurm_spank_task_exit(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  int task = -1, status = 0;
  if (spank_get_item(sp, S_TASK_ID, &task) == ESPANK_SUCCESS && task == 0 &&
      spank_get_item(sp, S_TASK_EXIT_STATUS, &status) == ESPANK_SUCCESS)
    report_status = status;
  if (tasks_left > 0 && --tasks_left == 0)
    guard_stop();
  if (report_tasks > 0 && --report_tasks == 0) {
    report_step(sp);
    if (report_fd >= 0)
      close(report_fd);
    report_fd = -1;
  }
  return 0;
}

/* --- The tasks ------------------------------------------------------------ */

static int task_setenv(spank_t sp, const char *name, const char *value) {
  if (spank_setenv(sp, name, value, 1) != ESPANK_SUCCESS) {
    slurm_error("cogpu: cannot set %s for the task", name);
    return -1;
  }
  return 0;
}

/* COGPU_ variables a user may set for their own tasks: they shape how the
 * task's own process behaves, never which ledger it uses, how its memory
 * is counted or what the job reserved. */
static const char *const user_vars[] = {
    "COGPU_LOG",       "COGPU_LIMIT",       "COGPU_REPORT_TOTAL",
    "COGPU_GROW_STEP", "COGPU_DRIVER_WAIT", "COGPU_DAEMON_WAIT"};

static bool user_var(const char *entry) {
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(user_vars); i++) {
    size_t n = strlen(user_vars[i]);
    if (strncmp(entry, user_vars[i], n) == 0 && entry[n] == '=')
      return true;
  }
  return false;
}

/* A task's cogpu settings are the node's: every COGPU_ variable the job
 * brought (COGPU_STATE_DIR, COGPU_CONFIG, COGPU_NODE_MODE, ...), except the
 * user's own few above, is replaced by slurmstepd's, which is slurmd's
 * environment: normally none, so that /etc/cogpu.conf on the node applies
 * to the task as it did to the step's reservation. Otherwise a job could
 * take its tasks to a ledger of its choosing, away from the reservation
 * and from every other job's accounts. The plug-in then sets the job's
 * own (COGPU_JOB_TOKEN, COGPU_MEM, ...). Runs in the task: this process's
 * environment is still slurmstepd's. */
static int task_env_node(spank_t sp) {
  char **env = NULL, names[128][64];
  size_t n = 0;
  if (spank_get_item(sp, S_JOB_ENV, &env) == ESPANK_SUCCESS && env)
    for (size_t i = 0; env[i] && n < COGPU_ARRAY_SIZE(names); i++) {
      size_t len = strcspn(env[i], "=");
      if (strncmp(env[i], "COGPU_", 6) == 0 && !user_var(env[i]) &&
          len < sizeof names[0])
        snprintf(names[n++], sizeof names[0], "%.*s", (int)len, env[i]);
    }
  for (size_t i = 0; i < n; i++)
    if (spank_unsetenv(sp, names[i]) != ESPANK_SUCCESS) {
      slurm_error("cogpu: cannot unset %s for the task", names[i]);
      return -1;
    }
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    char var[64];
    snprintf(var, sizeof var, "COGPU_%s", cogpu__opt_table[i].name);
    const char *v = getenv(var);
    char entry[80];
    snprintf(entry, sizeof entry, "%s=", var);
    if (v && !user_var(entry) && task_setenv(sp, var, v))
      return -1;
  }
  return 0;
}

/* LD_PRELOAD with the preload library appended (a sanitizer runtime or
 * another tool that must come first stays first). */
static int task_preload(spank_t sp) {
  char old[4096] = "", val[8192];
  if (opts.no_preload || !opts.preload[0])
    return 0;
  if (access(opts.preload, R_OK) != 0) {
    slurm_error("cogpu: preload library %s: %s", opts.preload, strerror(errno));
    return -1;
  }
  if (spank_getenv(sp, "LD_PRELOAD", old, sizeof old) != ESPANK_SUCCESS)
    old[0] = 0;
  snprintf(val, sizeof val, "%s%s%s", old, old[0] ? " " : "", opts.preload);
  return task_setenv(sp, "LD_PRELOAD", val);
}

/* The GPU holding the job's reservation. The task sees exactly that GPU
 * (CUDA_VISIBLE_DEVICES is its UUID, whatever the job's environment had),
 * unless Slurm gave the step GPUs (`gpu` or `shard` GRES): Slurm then sets
 * CUDA_VISIBLE_DEVICES itself, and the reservation is on the first of
 * them, the task's device 0. Runs in the task: the holder's handle belongs
 * to slurmstepd there. */
static int task_gpu(spank_t sp) {
  char buf[32];
  if (job_gpu < 0)
    return 0;
  if (!slurm_gave_gpus) {
    if (!job_uuid[0]) {
      slurm_error("cogpu: the UUID of GPU %d, which holds the job's memory, "
                  "is unknown: cannot show the task that GPU alone",
                  job_gpu);
      return -1;
    }
    if (task_setenv(sp, "CUDA_VISIBLE_DEVICES", job_uuid))
      return -1;
  }
  snprintf(buf, sizeof buf, "%d", job_gpu);
  return task_setenv(sp, "COGPU_GPU", buf);
}

/* In each task, before it runs the user's program. */
int slurm_spank_task_init(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  char buf[32], id[32];
  uint32_t jid = 0, task = 0;
  if (notice[0] &&
      spank_get_item(sp, S_TASK_GLOBAL_ID, &task) == ESPANK_SUCCESS &&
      task == 0)
    fprintf(stderr, "%s\n", notice);
  if (failure[0]) {
    slurm_error("%s", failure);
    return -1; /* the task exits 1: the job fails, the node is untouched */
  }
  if (step_managed()) {
    /* The task goes with its step (see "The step guard"). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != stepd_pid) {
      slurm_error("cogpu: the step's slurmstepd is gone");
      return -1;
    }
  }
  if (!opts.mem || !holder)
    return 0;
  spank_get_item(sp, S_JOB_ID, &jid);
  snprintf(id, sizeof id, "%u", jid);
  int rc = task_env_node(sp);
  rc = rc ? rc : task_setenv(sp, "COGPU_JOB_TOKEN", token);
  rc = rc ? rc : task_setenv(sp, "COGPU_JOB_ID", id);
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)opts.mem);
  rc = rc ? rc : task_setenv(sp, "COGPU_MEM", buf);
  snprintf(buf, sizeof buf, "%ld", opts.priority);
  rc = rc ? rc : task_setenv(sp, "COGPU_PRIORITY", buf);
  if (opts.wait_given) {
    if (opts.wait_ms == COGPU_WAIT_FOREVER)
      snprintf(buf, sizeof buf, "inf");
    else
      snprintf(buf, sizeof buf, "%lldms", (long long)opts.wait_ms);
    rc = rc ? rc : task_setenv(sp, "COGPU_GROW_WAIT", "yes");
    rc = rc ? rc : task_setenv(sp, "COGPU_TIMEOUT", buf);
  }
  rc = rc ? rc : task_gpu(sp);
  return rc ? rc : task_preload(sp);
}

/* The step is over: its reservation (or its share of the job's) ends. */
int slurm_spank_exit(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  guard_stop();
  dcgm_map_remove(sp);
  if (holder)
    cogpu_detach(holder);
  holder = NULL;
  return 0;
}
