/*
 * spank-cogpu.c: the Slurm SPANK plug-in (spank_cogpu.so).
 *
 * A job asks for GPU memory with --gpu-mem=SIZE. On the submitting side the
 * option is checked (a bad size, or one above every node's `gpumem` GRES,
 * refuses the job with our message); cli_filter.lua turns it into the
 * `gres/gpumem` request by which slurmctld packs jobs onto nodes.
 *
 * On each node, every step's slurmstepd attaches to the node ledger once
 * (slurm_spank_user_init, as the job's user) and either reserves SIZE there
 * for the job, or, when an earlier step of the same job already holds the
 * job's reservation (the batch step running `srun`), joins it: a job's
 * GPU memory is counted once per node however many steps and tasks use it.
 * Each task then runs with the preload library and the job's token, so its
 * CUDA allocations draw on that reservation (see docs/slurm.md).
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "cogpu.h"
#include "internal.h"
#include "ledger/ledger.h"

SPANK_PLUGIN(cogpu, 1);

enum { OPT_MEM = 1, OPT_PRIORITY, OPT_WAIT, OPT_NO_PRELOAD };

typedef struct job_opts_s {
  uint64_t mem;    /* per node, bytes; 0: the job did not ask */
  long priority;   /* -1000..1000 */
  int64_t wait_ms; /* with wait_given; COGPU_WAIT_FOREVER for inf */
  bool wait_given;
  bool no_preload; /* keep the reservation, do not interpose */
  char preload[PATH_MAX];
  /* plugstack.conf whole_gpu_wait=: how long a whole-GPU job waits for
   * --gpu-mem jobs to leave its GPUs before it runs unguarded. */
  int64_t whole_wait_ms;
} job_opts_t;

static job_opts_t opts = {.whole_wait_ms = COGPU_WAIT_FOREVER};
static cogpu_t *holder; /* this step's ledger handle (slurmstepd) */
/* The job's user: slurmstepd is root, and in node mode the daemon books
 * the job for this user, so that its tasks (running as the user) may join
 * it and nobody else may. */
static uint32_t job_uid = (uint32_t)-1;
static char token[32];
static int job_gpu = -1;
static char job_uuid[96]; /* job_gpu's UUID, for CUDA_VISIBLE_DEVICES */
/* What the step waited for before it started. slurmstepd's messages go
 * to slurmd's log only, so the first task prints this on its stderr: the
 * user's terminal, or the batch job's output. */
static char notice[512];

static double secs_since(uint64_t t0_ns) {
  return (double)(cogpu__now_ns() - t0_ns) / 1e9;
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

/* Largest `gpumem` GRES count of any node; 0 when it cannot be read. */
static uint64_t cluster_max_gpumem(void) {
  node_info_msg_t *nodes = NULL;
  uint64_t best = 0;
  if (slurm_load_node((time_t)0, &nodes, SHOW_ALL) != SLURM_SUCCESS || !nodes)
    return 0;
  for (uint32_t i = 0; i < nodes->record_count; i++) {
    const char *g = nodes->node_array[i].gres;
    const char *p = g ? strstr(g, "gpumem:") : NULL;
    uint64_t n = 0;
    char buf[64];
    if (!p)
      continue;
    snprintf(buf, sizeof buf, "%s", p + 7);
    buf[strcspn(buf, ",(")] = 0;
    if (cogpu__parse_size("gpumem", buf, &n) == 0 && n > best)
      best = n;
  }
  slurm_free_node_info_msg(nodes);
  return best;
}

static int opt_mem(const char *arg, int remote) {
  if (!arg || cogpu__parse_size("--gpu-mem", arg, &opts.mem) != 0) {
    slurm_error("cogpu: invalid --gpu-mem '%s': expected a size such as "
                "512M, 12G or 1T (binary units, no fractions)",
                arg ? arg : "");
    return -1;
  }
  if (opts.mem == 0) {
    slurm_error("cogpu: --gpu-mem must be more than 0");
    return -1;
  }
  uint64_t max = remote ? 0 : cluster_max_gpumem();
  if (max && opts.mem > max) {
    slurm_error("cogpu: --gpu-mem=%s is more GPU memory than any node has "
                "(largest: %llu MiB)",
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
                                 &opts.priority) != 0) {
      slurm_error("cogpu: invalid --gpu-priority '%s': expected an integer "
                  "from -1000 to 1000",
                  arg ? arg : "");
      return -1;
    }
    return 0;
  case OPT_WAIT:
    if (!arg ||
        cogpu__parse_duration_ms("--gpu-wait", arg, &opts.wait_ms) != 0) {
      slurm_error("cogpu: invalid --gpu-wait '%s': expected a duration such "
                  "as 0, 30s, 10m, 2h or inf",
                  arg ? arg : "");
      return -1;
    }
    opts.wait_given = true;
    return 0;
  case OPT_NO_PRELOAD:
    opts.no_preload = true;
    return 0;
  }
  return -1;
}

/* Arguments on the plug-in's plugstack.conf line; a typo is an error, not
 * a setting silently ignored. */
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
    slurm_error("cogpu: unknown argument '%s' in plugstack.conf (accepted: "
                "preload=PATH, whole_gpu_wait=DURATION)",
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
 * step, in slurmstepd. */
static int hold_reservation(const char *job_id, const char *cmd,
                            const char *cvd) {
  cogpu_attach_opts_t ao = {
      .priority = (int)opts.priority, .job_id = job_id, .command = cmd};
  int rc = cogpu__attach_as(&ao, job_uid, &holder);
  if (rc == 0 &&
      cogpu__ledger_find_job(holder, job_id, token, sizeof token) == 0) {
    cogpu_detach(holder);
    ao.join = token;
    rc = cogpu__attach_as(&ao, job_uid, &holder);
    if (rc == 0) {
      job_gpu = joined_gpu();
      return 0;
    }
  }
  if (rc) {
    slurm_error("cogpu: job %s: cannot use the node's GPU ledger: %s", job_id,
                cogpu_last_error());
    return -1;
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
    rc = cogpu_reserve(holder, &req, &job_gpu);
    snprintf(notice, sizeof notice,
             "cogpu: job %s waited %.1f s for %llu MiB of GPU memory", job_id,
             secs_since(t0), (unsigned long long)(opts.mem >> 20));
  }
  if (rc == 0)
    rc = cogpu_job_token(holder, token, sizeof token);
  if (rc) {
    slurm_error("cogpu: job %s: cannot reserve %llu MiB of GPU memory: %s",
                job_id, (unsigned long long)(opts.mem >> 20),
                cogpu_last_error());
    cogpu_detach(holder);
    holder = NULL;
    return -1;
  }
  return 0;
}

static void note_gpu_uuid(void) {
  cogpu_status_t *st;
  if (job_gpu >= 0 && cogpu_status(holder, &st) == 0) {
    snprintf(job_uuid, sizeof job_uuid, "%s", st->gpus[job_gpu].uuid);
    cogpu_status_free(st);
  }
}

/* A job that Slurm gave whole GPUs (`gpu` GRES without --gpu-mem) takes
 * them exclusively in the ledger for the step, so that no --gpu-mem job is
 * placed there. If --gpu-mem jobs hold memory there, the step says so and
 * waits for them to leave, for at most whole_gpu_wait. Never fails the
 * job: without the ledger, or after that wait, it runs as it would
 * without cogpu. */
static void guard_whole_gpus(const char *job_id, const char *cmd,
                             const char *cvd) {
  cogpu_attach_opts_t ao = {.job_id = job_id, .command = cmd};
  if (cogpu__attach_as(&ao, job_uid, &holder) != 0) {
    slurm_verbose("cogpu: GPUs of job %s not guarded: %s", job_id,
                  cogpu_last_error());
    return;
  }
  if (cogpu__ledger_find_job(holder, job_id, token, sizeof token) == 0)
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

/* slurmstepd, once per step, as the job's user: options are known. */
int slurm_spank_user_init(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  uint32_t id = 0;
  char job_id[32], cmd[128] = "slurm job", cvd[1024] = "";
  int argc = 0;
  char **argv = NULL;
  if (holder)
    return 0; /* the callback ran already for this step */
  if (spank_get_item(sp, S_JOB_ID, &id) != ESPANK_SUCCESS) {
    slurm_error("cogpu: cannot read the job id");
    return -1;
  }
  snprintf(job_id, sizeof job_id, "%u", id);
  uid_t uid;
  if (spank_get_item(sp, S_JOB_UID, &uid) == ESPANK_SUCCESS)
    job_uid = (uint32_t)uid;
  if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) == ESPANK_SUCCESS &&
      argc > 0)
    snprintf(cmd, sizeof cmd, "%s", argv[0]);
  slurm_gpus(sp, cvd, sizeof cvd);
  if (!opts.mem) {
    if (cvd[0])
      guard_whole_gpus(job_id, cmd, cvd);
    return 0;
  }
  int rc = hold_reservation(job_id, cmd, cvd);
  if (rc == 0)
    note_gpu_uuid();
  return rc;
}

static int task_setenv(spank_t sp, const char *name, const char *value) {
  if (spank_setenv(sp, name, value, 1) != ESPANK_SUCCESS) {
    slurm_error("cogpu: cannot set %s for the task", name);
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

/* The GPU holding the job's reservation, unless Slurm chose GPUs itself
 * (a job that also asked for `gpu` GRES). Runs in the task: the holder's
 * handle belongs to slurmstepd there. */
static int task_gpu(spank_t sp) {
  char cvd[256], buf[32];
  if (job_gpu < 0)
    return 0;
  if (spank_getenv(sp, "CUDA_VISIBLE_DEVICES", cvd, sizeof cvd) ==
          ESPANK_ENV_NOEXIST &&
      job_uuid[0] && task_setenv(sp, "CUDA_VISIBLE_DEVICES", job_uuid))
    return -1;
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
  if (!opts.mem || !holder)
    return 0;
  spank_get_item(sp, S_JOB_ID, &jid);
  snprintf(id, sizeof id, "%u", jid);
  int rc = task_setenv(sp, "COGPU_JOB_TOKEN", token);
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
  (void)sp;
  (void)ac;
  (void)av;
  if (holder)
    cogpu_detach(holder);
  holder = NULL;
  return 0;
}
