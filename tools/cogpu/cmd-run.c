/*
 * cmd-run.c: `cogpu run`: reserve, run the command on the reserved GPU,
 * release when it ends. cogpu stays the command's parent so that the
 * reservation lives exactly as long as the command: it forwards signals
 * sent to it and exits with the command's status (re-raising a fatal
 * signal), and if cogpu itself is killed the reservation is reclaimed.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "cli.h"
#include "history/history.h"
#include "node/node.h"

typedef struct run_opts_s {
  uint64_t mem;
  bool mem_auto;
  const char *mem_from; /* mem_auto from the option: where it was set */
  const char *gpu;
  long priority;
  int64_t timeout_ms;
  bool exclusive;
  bool no_preload;
  const char *job_id;
  char **cmd;
  bool placed; /* run_place chose the GPU: first, not alone (run_env) */
} run_opts_t;

static int run_usage(const char *msg, const char *arg) {
  cli_err("run: %s%s%s", msg, arg ? " " : "", arg ? arg : "");
  fputs("usage: cogpu run [--mem SIZE|auto] [--gpu auto|INDEX|UUID] "
        "[--priority N]"
        " [--timeout DURATION] [--exclusive] [--job-id ID] [--no-preload] -- "
        "COMMAND "
        "[ARGS]\n",
        stderr);
  return CLI_EXIT_USAGE;
}

static int run_parse(int argc, char **argv, const cogpu__config_t *cfg,
                     run_opts_t *o) {
  static const struct option longopts[] = {
      {"mem", required_argument, NULL, 'm'},
      {"gpu", required_argument, NULL, 'g'},
      {"priority", required_argument, NULL, 'p'},
      {"timeout", required_argument, NULL, 't'},
      {"exclusive", no_argument, NULL, 'x'},
      {"job-id", required_argument, NULL, 'j'},
      {"no-preload", no_argument, NULL, 'n'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  /* mem=auto (config file or COGPU_MEM) makes learned reservations the
   * default; --mem overrides it. A size there is the preload library's
   * alone (a process's reservation at its first context): cogpu run
   * reserves only what --mem says. */
  bool mem_auto = cfg->v[COGPU_OPT_MEM].i != 0;
  *o = (run_opts_t){.gpu = "auto",
                    .mem_auto = mem_auto,
                    .mem_from = mem_auto ? cfg->v[COGPU_OPT_MEM].where : NULL,
                    .timeout_ms = cfg->v[COGPU_OPT_TIMEOUT].i,
                    .job_id = getenv("SLURM_JOB_ID")};
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
    int rc = 0;
    if (c == 'm' && strcmp(optarg, "auto") == 0) {
      o->mem_auto = true;
      o->mem_from = NULL;
    } else if (c == 'm') {
      o->mem_auto = false;
      rc = cogpu__parse_size("--mem", optarg, &o->mem);
      if (rc == 0 && o->mem == 0)
        return run_usage("--mem must be more than 0 bytes", NULL);
    } else if (c == 'g')
      o->gpu = optarg;
    else if (c == 'p')
      rc = cogpu__parse_int("--priority", optarg, -1000, 1000, &o->priority);
    else if (c == 't')
      rc = cogpu__parse_duration_ms("--timeout", optarg, &o->timeout_ms);
    else if (c == 'x')
      o->exclusive = true;
    else if (c == 'n')
      o->no_preload = true;
    else if (c == 'j')
      o->job_id = optarg;
    else if (c == 'h')
      return run_usage("help", NULL);
    else
      return run_usage("unknown or incomplete option", argv[optind - 1]);
    if (rc) {
      cli_err("run: %s", cogpu_last_error());
      return CLI_EXIT_USAGE;
    }
  }
  if (optind >= argc)
    return run_usage("no command given", NULL);
  o->cmd = argv + optind;
  return 0;
}

/* --mem auto, or mem=auto without --mem: reserve what this command needed
 * before (docs/history.md, "Learned reservations"), and grow on demand
 * beyond it; with no history, on demand. Says which, on stderr. */
static void run_mem_auto(const cogpu__config_t *cfg, run_opts_t *o,
                         const char *cmdline) {
  uint64_t bytes = 0, peak = 0;
  unsigned runs = 0;
  char b[32], p[32], how[400];
  /* Which one asked: a default set by the site or the user is named with
   * where it was set, so that nobody wonders where a reservation came
   * from. */
  if (o->mem_from)
    snprintf(how, sizeof how, "mem=auto (from %s)", o->mem_from);
  else
    snprintf(how, sizeof how, "--mem auto");
  if (cli_history_suggest(cfg, cmdline, &bytes, &runs, &peak) != 0) {
    cli_err("run: %s: no history to learn from (%s): running on demand", how,
            cogpu_last_error());
  } else if (!runs) {
    cli_err("run: %s: no earlier run of this command on this node: "
            "running on demand",
            how);
  } else {
    o->mem = bytes;
    cli_err("run: %s: reserving %s (peak %s over the last %u run%s, +%lld %%)",
            how, cogpu__fmt_size(bytes, b, sizeof b),
            cogpu__fmt_size(peak, p, sizeof p), runs, runs == 1 ? "" : "s",
            (long long)cfg->v[COGPU_OPT_AUTO_MARGIN].i);
  }
}

void cli_cmdline(char **cmd, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; cmd[i] && n + 1 < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? " " : "", cmd[i]);
}

/* Prints the one "waiting" line if the reservation has not been granted
 * within a moment, with the queue position as the node sees it. */
typedef struct notifier_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  cogpu_t *h;
  uint64_t bytes;
  bool exclusive;
} notifier_t;

static void notify_waiting(notifier_t *n) {
  cogpu_status_t *st;
  if (cogpu_status(n->h, &st) != 0)
    return;
  for (size_t g = 0; g < st->ngpus; g++)
    for (size_t i = 0; i < st->gpus[g].nwaiting; i++) {
      cogpu_waiter_info_t *w = &st->gpus[g].waiting[i];
      if (!w->own)
        continue;
      char need[32], fr[32], cap[32];
      cogpu_gpu_info_t *gi = &st->gpus[g];
      uint64_t free_b = gi->capacity_bytes > gi->reserved_bytes
                            ? gi->capacity_bytes - gi->reserved_bytes
                            : 0;
      cli_err("waiting for %s on %s%d: position %d of %zu in the queue "
              "(policy %s; %s free of %s)",
              n->exclusive ? "exclusive use"
                           : cogpu__fmt_size(n->bytes, need, sizeof need),
              w->gpu == COGPU_GPU_AUTO ? "any GPU; on GPU " : "GPU ", gi->index,
              w->position, gi->nwaiting, st->policy,
              cogpu__fmt_size(free_b, fr, sizeof fr),
              cogpu__fmt_size(gi->capacity_bytes, cap, sizeof cap));
      cogpu_status_free(st);
      return;
    }
  cogpu_status_free(st);
}

static void *notifier_main(void *arg) {
  notifier_t *n = arg;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += 200 * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&n->mu);
  while (!n->done)
    if (pthread_cond_timedwait(&n->cv, &n->mu, &ts) == ETIMEDOUT)
      break;
  bool done = n->done;
  pthread_mutex_unlock(&n->mu);
  if (!done)
    notify_waiting(n);
  return NULL;
}

/* An on-demand job (no --mem) on a node of several GPUs, with no GPU
 * named (neither --gpu nor CUDA_VISIBLE_DEVICES): its program would take
 * device 0, as every other such job, and leave the other GPUs idle. So it
 * is placed now, where most memory is free, with a stake of one CUDA
 * context (context_bytes), which the next job's placement sees. That GPU
 * becomes its device 0, the others stay visible after it (a program of
 * several GPUs keeps them all). Its first process's first context takes
 * the stake there, or gives it back if it is on another GPU (the preload
 * library, stake_gpu). No room anywhere: not placed (it waits, if at all,
 * at its first allocation, as before). */
static void run_place(const cogpu__config_t *cfg, cogpu_t *h, int *gpu) {
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  if (cvd || cogpu_gpu_count(h) < 2)
    return;
  cogpu_request_t req = {.gpu = COGPU_GPU_AUTO,
                         .bytes = cfg->v[COGPU_OPT_CONTEXT_BYTES].u,
                         .priority = COGPU_PRIORITY_DEFAULT,
                         .timeout_ms = COGPU_NOWAIT};
  if (req.bytes == 0 || cogpu_reserve(h, &req, gpu) != 0)
    *gpu = COGPU_GPU_AUTO;
}

static int run_reserve(const cogpu__config_t *cfg, cogpu_t *h, run_opts_t *o,
                       int *gpu) {
  *gpu = COGPU_GPU_AUTO;
  if (strcmp(o->gpu, "auto") != 0) {
    int rc = cogpu_gpu_lookup(h, o->gpu, gpu);
    if (rc)
      return cli_fail("run: --gpu", rc);
  }
  if (o->mem == 0 && !o->exclusive) {
    if (*gpu == COGPU_GPU_AUTO) {
      run_place(cfg, h, gpu);
      o->placed = *gpu >= 0;
    }
    return 0;
  }
  cogpu_request_t req = {.gpu = *gpu,
                         .bytes = o->mem,
                         .priority = (int)o->priority,
                         .timeout_ms = o->timeout_ms,
                         .flags = o->exclusive ? COGPU_REQ_EXCLUSIVE : 0};
  notifier_t n = {PTHREAD_MUTEX_INITIALIZER,
                  PTHREAD_COND_INITIALIZER,
                  false,
                  h,
                  o->mem,
                  o->exclusive};
  pthread_t th;
  bool started = pthread_create(&th, NULL, notifier_main, &n) == 0;
  int rc = cogpu_reserve(h, &req, gpu);
  pthread_mutex_lock(&n.mu);
  n.done = true;
  pthread_cond_signal(&n.cv);
  pthread_mutex_unlock(&n.mu);
  if (started)
    pthread_join(th, NULL);
  if (rc == 0 && o->mem && o->exclusive) {
    req.flags = 0;
    req.gpu = *gpu;
    rc = cogpu_reserve(h, &req, gpu);
  }
  if (rc)
    return cli_fail("run: cannot reserve GPU memory", rc);
  return 0;
}

static const int run_fwd_signals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,
                                      SIGUSR1, SIGUSR2, SIGCONT, SIGWINCH};

/* The signals cogpu waits for while the command runs: the child's exit and
 * those it forwards. They are blocked and taken with sigwaitinfo, so no
 * handler runs asynchronously. A signal ignored when cogpu started (nohup)
 * is left ignored, in cogpu and in the command. */
static void run_sigset(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGCHLD);
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(run_fwd_signals); i++) {
    struct sigaction old;
    if (sigaction(run_fwd_signals[i], NULL, &old) == 0 &&
        old.sa_handler != SIG_IGN)
      sigaddset(set, run_fwd_signals[i]);
  }
}

/* The preload library: beside the cogpu binary (a build tree), or where
 * `make install` puts it. */
static bool run_find_preload(char *path, size_t len) {
  char exe[3001];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0)
    return false;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash)
    return false;
  *slash = 0;
  static const char *const rel[] = {"libcogpu-preload.so",
                                    "../lib/cogpu/libcogpu-preload.so"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(rel); i++) {
    if ((size_t)snprintf(path, len, "%.3000s/%s", exe, rel[i]) >= len)
      return false;
    if (access(path, R_OK) == 0)
      return true;
  }
  return false;
}

/* Transparent mode: the command's CUDA allocations are accounted by the
 * preload library, against this job's reservation (the job token), with
 * --mem as its starting share. Appended to LD_PRELOAD, so a sanitizer
 * runtime or another tool that must come first stays first. */
static void run_env_preload(cogpu_t *h, const run_opts_t *o) {
  char lib[4096], tok[32], buf[64];
  if (o->no_preload || !run_find_preload(lib, sizeof lib) ||
      cogpu_job_token(h, tok, sizeof tok) != 0)
    return;
  const char *old = getenv("LD_PRELOAD");
  char *pre = malloc(strlen(lib) + (old ? strlen(old) : 0) + 2);
  if (!pre)
    return;
  sprintf(pre, "%s%s%s", old && *old ? old : "", old && *old ? " " : "", lib);
  setenv("LD_PRELOAD", pre, 1);
  free(pre);
  setenv("COGPU_JOB_TOKEN", tok, 1);
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)o->mem);
  setenv("COGPU_MEM", buf, 1);
  snprintf(buf, sizeof buf, "%ld", o->priority);
  setenv("COGPU_PRIORITY", buf, 1);
  if (o->job_id)
    setenv("COGPU_JOB_ID", o->job_id, 1);
}

static void run_env(cogpu_t *h, int gpu, const run_opts_t *o) {
  run_env_preload(h, o);
  if (gpu < 0)
    return;
  cogpu_status_t *st;
  char buf[32];
  if (cogpu_status(h, &st) == 0) {
    /* Placed: its GPU first, the others after it, in the node's order. */
    char list[32 * 100] = "";
    size_t n = (size_t)snprintf(list, sizeof list, "%s", st->gpus[gpu].uuid);
    for (size_t g = 0; o->placed && g < st->ngpus && n < sizeof list; g++)
      if ((int)g != gpu)
        n += (size_t)snprintf(list + n, sizeof list - n, ",%s",
                              st->gpus[g].uuid);
    setenv("CUDA_VISIBLE_DEVICES", list, 1);
    cogpu_status_free(st);
  }
  if (o->placed) {
    snprintf(buf, sizeof buf, "%d", gpu);
    setenv("COGPU_STAKE_GPU", buf, 1);
  }
  snprintf(buf, sizeof buf, "%d", gpu);
  setenv("COGPU_GPU", buf, 1);
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)o->mem);
  setenv("COGPU_RESERVED_BYTES", buf, 1);
}

/* Single-user mode: the job's memory timeline for its record
 * (docs/history.md), sampled once a second while the command runs, in the
 * middle of each second of the job's life so that a late wake-up still
 * falls in its own second. Kept for every GPU: the record is of the GPU
 * where the job peaked, known only at the end. */
typedef struct run_sampler_s {
  cogpu_t *h;
  cogpu__hist_tl_t tl[COGPU_USAGE_GPUS];
  uint64_t next_ns; /* the next sample (monotonic) */
  bool failed;
} run_sampler_t;

static void run_sample(run_sampler_t *smp, uint64_t now) {
  uint64_t used[COGPU_USAGE_GPUS], at_ms = 0;
  unsigned ng = 0;
  if (cogpu__job_sample(smp->h, used, &ng, &at_ms) != 0) {
    /* The ledger's lock held by a stopped process, say: this second's
     * sample is missed (the timeline holds the one before), the job runs
     * on. Said once. */
    if (!smp->failed)
      cogpu__log(COGPU_LOG_INFO,
                 "run: a sample of the job's memory was missed: %s",
                 cogpu_last_error());
    smp->failed = true;
    smp->next_ns = now + 1000000000u;
    return;
  }
  for (unsigned g = 0; g < ng && g < COGPU_USAGE_GPUS; g++)
    cogpu__hist_tl_add(&smp->tl[g], at_ms, used[g]);
  uint64_t delay = 1000 - (at_ms + 500) % 1000;
  if (delay < 500)
    delay += 1000; /* this second has its sample */
  smp->next_ns = now + delay * 1000000u;
}

/* Waits for the command's end or a signal to forward (sigwaitinfo), or,
 * with a sampler, until its next sample is due. */
static int run_wait_signal(const sigset_t *set, siginfo_t *si,
                           run_sampler_t *smp) {
  if (!smp)
    return sigwaitinfo(set, si);
  for (;;) {
    uint64_t now = cogpu__now_ns();
    if (now >= smp->next_ns) {
      run_sample(smp, now);
      continue;
    }
    uint64_t left = smp->next_ns - now;
    struct timespec ts = {.tv_sec = (time_t)(left / 1000000000u),
                          .tv_nsec = (long)(left % 1000000000u)};
    int sig = sigtimedwait(set, si, &ts);
    if (sig >= 0 || errno != EAGAIN)
      return sig;
  }
}

static int run_exec(char **cmd, run_sampler_t *smp) {
  sigset_t set, old;
  /* An inherited SIGCHLD=SIG_IGN would reap the child behind our back. */
  signal(SIGCHLD, SIG_DFL);
  run_sigset(&set);
  sigprocmask(SIG_BLOCK, &set, &old);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    cli_err("run: fork: %s", strerror(errno));
    sigprocmask(SIG_SETMASK, &old, NULL);
    return -1;
  }
  if (pid == 0) {
    /* The reservation dies with cogpu: so must the command, or it would
     * go on using memory the ledger has given to others. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(CLI_EXIT_FAIL);
    sigprocmask(SIG_SETMASK, &old, NULL);
    execvp(cmd[0], cmd);
    int e = errno;
    cli_err("run: cannot run '%s': %s", cmd[0], strerror(e));
    _exit(e == ENOENT ? CLI_EXIT_NOTFOUND : CLI_EXIT_NOEXEC);
  }
  int st = 0;
  if (smp)
    smp->next_ns = cogpu__now_ns() + 500000000u;
  while (waitpid(pid, &st, WNOHANG) != pid) {
    siginfo_t si;
    int sig = run_wait_signal(&set, &si, smp);
    /* Signals from the terminal reach the command directly (it shares our
     * process group): forwarding them would deliver them twice. */
    if (sig > 0 && sig != SIGCHLD && si.si_code != SI_KERNEL)
      kill(pid, sig);
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  return st;
}

/* Exit as the command did: same code, or the same fatal signal. */
static int run_exit_like(int st) {
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  int sig = WTERMSIG(st);
  signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, NULL);
  raise(sig);
  return 128 + sig;
}

/* The end-of-job line (cogpu__job_report_line). */
static void run_report(const run_opts_t *o, const cogpu__job_report_t *r) {
  char job[96], safe[200], line[512];
  if (o->job_id && *o->job_id)
    snprintf(job, sizeof job, "job %s", cli_safe(o->job_id, safe, sizeof safe));
  else
    snprintf(job, sizeof job, "job %d", (int)getpid());
  cogpu__job_report_line(r, job, "--mem ", o->mem, line, sizeof line);
  fputs(line, stderr);
}

int cli_run(int argc, char **argv) {
  cogpu__config_t cfg;
  int rc = cli_config_load(&cfg);
  if (rc)
    return rc;
  run_opts_t o;
  rc = run_parse(argc, argv, &cfg, &o);
  if (rc)
    return rc;
  char cmdline[128];
  cli_cmdline(o.cmd, cmdline, sizeof cmdline);
  if (o.mem_auto)
    run_mem_auto(&cfg, &o, cmdline);
  cogpu_attach_opts_t ao = {
      .priority = (int)o.priority, .job_id = o.job_id, .command = cmdline};
  cogpu_t *h;
  rc = cogpu_attach(&ao, &h);
  if (rc)
    return cli_fail("run: cannot attach to the node ledger", rc);
  int gpu;
  rc = run_reserve(&cfg, h, &o, &gpu);
  if (rc) {
    cogpu_detach(h);
    return rc;
  }
  run_env(h, gpu, &o);
  /* Node mode: the daemon samples the job and writes its record when this
   * slot is freed; single-user mode: here. */
  char path[512];
  bool record = cogpu__node_mode(&cfg) == 0 &&
                cogpu__hist_path(&cfg, false, path, sizeof path) == 1;
  run_sampler_t *smp = record ? calloc(1, sizeof *smp) : NULL;
  if (smp)
    smp->h = h;
  int st = run_exec(o.cmd, smp);
  cogpu__job_report_t rep;
  if (cogpu__job_end(h, st, &rep) == 0) {
    if (cfg.v[COGPU_OPT_JOB_REPORT].i)
      run_report(&o, &rep);
    if (cogpu__node_mode(&cfg) == 0)
      cli_history_record(&cfg, h, cmdline, o.job_id, st, &rep,
                         smp && rep.gpu >= 0 && rep.gpu < COGPU_USAGE_GPUS
                             ? &smp->tl[rep.gpu]
                             : NULL);
  }
  free(smp);
  cogpu_detach(h);
  if (st == -1)
    return CLI_EXIT_FAIL;
  return run_exit_like(st);
}
