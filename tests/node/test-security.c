/*
 * test-security.c: the attacks of issue 10 against cogpud, each as a test
 * (docs/security.md). They start a daemon of their own when the suite is
 * not in node mode, so they run in both passes, and run clients as real
 * other users: the test process is root, helpers drop to uid 65533 ("user
 * A") or 65534 (nobody, "user B") with setresuid, and the CLI runs under
 * setpriv. Without root they are skipped.
 *
 *  - the daemon's state and lock cannot be opened by users; its socket and
 *    `cogpu status` work for them (sec_state_not_writable_by_users)
 *  - a job token is useless to another user; a user cannot act on another
 *    user's registration (sec_token_theft_refused)
 *  - per-user limits on clients and waiters leave the node usable by others
 *    (sec_user_max_clients, sec_user_max_waiters)
 *  - node settings never come from a client's environment
 *    (sec_client_env_cannot_set_node_settings)
 *  - planted files and unsafe directories are refused, never written into
 *    or waited on forever (sec_planted_*)
 *  - priorities above priority_cap need admin rights (sec_priority_cap)
 *  - malformed and random messages end only their own connection
 *    (sec_malformed_messages, sec_random_messages_flood), and the message
 *    handler keeps its invariants on random input (sec_handler_random).
 *
 * And those of issue 23:
 *  - every descriptor a message brings is used or closed, by the daemon
 *    and by clients (sec_passed_descriptors_closed,
 *    sec_client_passed_descriptors_closed)
 *  - a user's connections are capped, others are still served, and the
 *    daemon does not spin refusing them (sec_user_max_connections)
 *  - a forged usage page is taken as at most the GPU's total, and no sum
 *    wraps (sec_forged_usage_page).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/api.h"
#include "fuzz-harness.h"
#include "internal.h"
#include "ledger-helpers.h"
#include "ledger/ledger-int.h"
#include "node/proto.h"
#include "task.h"

/* Every test here runs against a node daemon it starts itself when the
 * runner gives none: once per build. */
TEST_FILE_ONCE()

#define GIB (1024ull * 1024 * 1024)
#define MIB (1024ull * 1024)
#define UID_A 65533u
#define UID_B 65534u /* nobody */

/* --- set-up ---------------------------------------------------------------
 */

/* Root, a daemon of this test's own, and a test directory other users can
 * pass through (to reach the socket) plus one they can write to (pub/). */
/* Waits (bounded) until a daemon this test started has its socket. */
static void wait_socket(const char *sock) {
  for (int t = 0; access(sock, F_OK) != 0; t += 10) {
    ASSERT_LT(t, th_ms(10000));
    th_sleep_ms(10);
  }
}

static void sec_begin(void) {
  if (geteuid() != 0)
    SKIP("needs root: runs clients as other users (setresuid, setpriv)");
  ASSERT(chmod(th_tmpdir(), 0711) == 0);
  ASSERT(mkdir(th_path("pub"), 0777) == 0);
  ASSERT(chmod(th_path("pub"), 0777) == 0);
  setenv("COGPU_NODE_MODE", "daemon", 1);
  if (!th_node_mode())
    th_daemon_start();
}

/* Restarts the daemon with a configuration file holding `conf`. */
static void sec_daemon_config(const char *conf) {
  char path[4096];
  snprintf(path, sizeof path, "%s", th_path("cogpud.conf"));
  th_write_file(path, conf);
  th_daemon_stop(SIGTERM);
  setenv("COGPU_CONFIG", path, 1);
  th_daemon_start();
  /* The clients read no configuration of the daemon's. */
  setenv("COGPU_CONFIG", "", 1);
}

/* th_path() into a buffer of its own (th_path's are reused after 8 calls). */
static const char *tp(const char *name) {
  char *p = strdup(th_path(name));
  ASSERT(p);
  return p;
}

static char *slurp(const char *path) {
  static char buf[8][1 << 15];
  static int next;
  char *b = buf[next++ % 8];
  b[0] = 0;
  FILE *f = fopen(path, "re");
  if (f) {
    size_t n = fread(b, 1, sizeof buf[0] - 1, f);
    b[n] = 0;
    fclose(f);
  }
  return b;
}

/* Waits until the file at path contains needle (bounded). */
static const char *wait_for(const char *path, const char *needle, int ms) {
  for (int t = 0; t < th_ms(ms); t += 10) {
    const char *s = slurp(path);
    if (strstr(s, needle))
      return s;
    th_sleep_ms(10);
  }
  th_fail(__FILE__, __LINE__, "'%s' never appeared in %s: %s", needle, path,
          slurp(path));
}

/* --- a client of another user ------------------------------------------------
 * sec_user UID[/GID] LOG OP...: drops to UID (with supplementary group GID)
 * and runs the ops, appending "OP rc=N msg" to LOG for each:
 *   attach[=TOKEN]   attach a new handle (joining the job TOKEN)
 *   prio=N, job=ID   for the following attaches
 *   reserve=GPU,MIB[,TIMEOUT_MS]   on the last handle (default: no wait)
 *   release=GPU,MIB  on the last handle
 *   token=FILE       write the last handle's job token to FILE
 *   hold             wait for SIGTERM (at most 60 s), then detach all
 */

static void drop_to(const char *spec) {
  unsigned uid = 0, gid = 0;
  int n = sscanf(spec, "%u/%u", &uid, &gid);
  gid_t groups[1] = {gid};
  if (setgroups(n == 2 ? 1 : 0, groups) != 0 || setresgid(uid, uid, uid) ||
      setresuid(uid, uid, uid)) {
    fprintf(stderr, "cannot become uid %u: %s\n", uid, strerror(errno));
    exit(3);
  }
}

static volatile sig_atomic_t got_term;
static void on_term(int sig) {
  (void)sig;
  got_term = 1;
}

HELPER_IMPL(sec_user) {
  if (argc < 2)
    return 2;
  FILE *log = fopen(argv[1], "ae");
  if (!log)
    return 2;
  setvbuf(log, NULL, _IOLBF, 0);
  signal(SIGTERM, on_term);
  drop_to(argv[0]);
  cogpu_t *h[64];
  int nh = 0, prio = 0;
  char job[64] = "";
  for (int i = 2; i < argc; i++) {
    const char *op = argv[i];
    int rc = 0;
    unsigned g = 0;
    unsigned long long mib = 0;
    long long to = 0;
    if (strncmp(op, "attach", 6) == 0) {
      cogpu_attach_opts_t o = {.priority = prio, .job_id = job[0] ? job : NULL};
      if (op[6] == '=')
        o.join = op + 7;
      cogpu_t *x = NULL;
      rc = cogpu_attach(&o, &x);
      if (rc == 0 && nh < 64)
        h[nh++] = x;
    } else if (sscanf(op, "prio=%d", &prio) == 1) {
    } else if (strncmp(op, "job=", 4) == 0) {
      snprintf(job, sizeof job, "%s", op + 4);
    } else if (sscanf(op, "reserve=%u,%llu,%lld", &g, &mib, &to) >= 2) {
      cogpu_request_t q = {
          .gpu = (int)g,
          .bytes = mib * MIB,
          .priority = COGPU_PRIORITY_DEFAULT,
          .timeout_ms = strchr(strchr(op, ',') + 1, ',') ? to : COGPU_NOWAIT};
      rc = nh ? cogpu_reserve(h[nh - 1], &q, NULL) : -EINVAL;
    } else if (sscanf(op, "release=%u,%llu", &g, &mib) == 2) {
      rc = nh ? cogpu_release(h[nh - 1], (int)g, mib * MIB) : -EINVAL;
    } else if (strncmp(op, "token=", 6) == 0) {
      char tok[64];
      rc = nh ? cogpu_job_token(h[nh - 1], tok, sizeof tok) : -EINVAL;
      if (rc == 0) {
        FILE *f = fopen(op + 6, "we");
        rc = f ? 0 : -errno;
        if (f) {
          fprintf(f, "%s", tok);
          fclose(f);
        }
      }
    } else if (strcmp(op, "join") == 0) {
      /* Another process of the last handle's job (its token). */
      char tok[64];
      cogpu_attach_opts_t o = {.priority = prio, .join = tok};
      cogpu_t *x = NULL;
      rc = nh ? cogpu_job_token(h[nh - 1], tok, sizeof tok) : -EINVAL;
      if (rc == 0)
        rc = cogpu_attach(&o, &x);
      if (rc == 0 && nh < 64)
        h[nh++] = x;
    } else if (sscanf(op, "usage=%u,%llu", &g, &mib) == 2) {
      /* Forges the last handle's usage page (the daemon maps it): used
       * and peak bytes (not MiB) on GPU g. */
      cogpu__usage_t *u = nh ? cogpu__usage_page(h[nh - 1]) : NULL;
      rc = u && g < COGPU_USAGE_GPUS ? 0 : -EINVAL;
      if (rc == 0) {
        atomic_store(&u->used[g], (uint64_t)mib);
        atomic_store(&u->peak[g], (uint64_t)mib);
      }
    } else if (strcmp(op, "hold") == 0) {
      fprintf(log, "holding\n");
      for (int t = 0; t < 6000 && !got_term; t++)
        th_sleep_ms(10);
    } else {
      fprintf(log, "%s bad op\n", op);
      return 2;
    }
    fprintf(log, "%s rc=%d %s\n", op, rc, rc ? cogpu_last_error() : "");
  }
  for (int i = 0; i < nh; i++)
    cogpu_detach(h[i]);
  fprintf(log, "done\n");
  fclose(log);
  return 0;
}

/* Starts sec_user; ops end with NULL. */
static pid_t user_run(const char *who, const char *log, ...) {
  const char *args[40] = {who, log};
  int n = 2;
  va_list ap;
  va_start(ap, log);
  for (const char *a; n < 39 && (a = va_arg(ap, const char *));)
    args[n++] = a;
  va_end(ap);
  args[n] = NULL;
  return th_spawn_helper("sec_user", args);
}

static void user_end(pid_t pid) {
  kill(pid, SIGTERM);
  ASSERT_EQ(th_exit_code(th_wait(pid, th_ms(10000))), 0);
}

/* Runs the CLI as `who` ("0" is root) with setpriv. */
static int cli_as(const char *who, const char *const args[], char *out,
                  size_t outlen, char *err, size_t errlen) {
  static const char *const env[] = {"COGPU_LOG=warn", NULL};
  const char *argv[32];
  int n = 0;
  char ru[32], rg[32], gr[32];
  unsigned uid = 0, gid = 0;
  int k = sscanf(who, "%u/%u", &uid, &gid);
  if (uid != 0) {
    snprintf(ru, sizeof ru, "--reuid=%u", uid);
    snprintf(rg, sizeof rg, "--regid=%u", uid);
    argv[n++] = "setpriv";
    argv[n++] = ru;
    argv[n++] = rg;
    if (k == 2) {
      snprintf(gr, sizeof gr, "--groups=%u", gid);
      argv[n++] = gr;
    } else {
      argv[n++] = "--clear-groups";
    }
  }
  argv[n++] = "cogpu";
  for (int i = 0; args[i] && n < 31; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  return th_run(argv, env, out, outlen, err, errlen, th_ms(20000));
}

/* --- what the daemon says ----------------------------------------------------
 */

/* Bytes held on GPU 0 by clients of uid (-1: all), and their count. */
static uint64_t held_by(int uid, size_t *nclients, int *prio) {
  cogpu_status_t *st = NULL;
  ASSERT_OK(cogpu_status(NULL, &st));
  uint64_t sum = 0;
  size_t n = 0;
  ASSERT(st->ngpus >= 1);
  for (size_t i = 0; i < st->gpus[0].nclients; i++) {
    const cogpu_client_info_t *c = &st->gpus[0].clients[i];
    if (uid < 0 || c->uid == (unsigned)uid) {
      sum += c->reserved_bytes;
      n++;
      if (prio)
        *prio = c->priority;
    }
  }
  if (nclients)
    *nclients = n;
  cogpu_status_free(st);
  return sum;
}

static size_t waiting_now(void) {
  cogpu_status_t *st = NULL;
  ASSERT_OK(cogpu_status(NULL, &st));
  size_t n = 0;
  for (size_t g = 0; g < st->ngpus; g++)
    n += st->gpus[g].nwaiting;
  cogpu_status_free(st);
  return n;
}

/* The daemon lives and serves: a fresh client attaches and reserves. */
static void daemon_serves(void) {
  if (th_daemon_pid() > 0)
    ASSERT_EQ(kill(th_daemon_pid(), 0), 0);
  cogpu_t *h = NULL;
  ASSERT_OK(cogpu_attach(NULL, &h));
  cogpu_request_t q = {.gpu = 0,
                       .bytes = 64 * MIB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  ASSERT_OK(cogpu_reserve(h, &q, NULL));
  ASSERT_OK(cogpu_release(h, 0, 64 * MIB));
  ASSERT_OK(cogpu_detach(h));
}

/* A's 4 GiB job, held by a helper; returns its pid. */
static pid_t user_a_holds_4g(const char *tokfile) {
  char tok[4200];
  snprintf(tok, sizeof tok, "token=%s", tokfile);
  pid_t a = user_run("65533", th_path("a.log"), "job=JOB-A", "attach",
                     "reserve=0,4096", tok, "hold", NULL);
  wait_for(th_path("a.log"), "token=", 10000);
  ASSERT_CONTAINS(slurp(th_path("a.log")), "reserve=0,4096 rc=0");
  ASSERT_UEQ(held_by(UID_A, NULL, NULL), 4 * GIB);
  return a;
}

/* --- 1. the state ------------------------------------------------------------
 */

HELPER_IMPL(sec_open_as) {
  /* UID PATH...: every path must be refused for reading and writing. */
  if (argc < 1)
    return 2;
  drop_to(argv[0]);
  for (int i = 1; i < argc; i++) {
    int fd = open(argv[i], O_RDWR | O_CLOEXEC);
    int fr = open(argv[i], O_RDONLY | O_CLOEXEC);
    if (fd >= 0 || fr >= 0) {
      fprintf(stderr, "uid %s opened %s (%s)\n", argv[0], argv[i],
              fd >= 0 ? "read-write" : "read-only");
      return 1;
    }
  }
  return 0;
}

TEST_IMPL(sec_state_not_writable_by_users) {
  sec_begin();
  char state[4096], lock[4096];
  snprintf(state, sizeof state, "%s/state", getenv("COGPU_DAEMON_DIR"));
  snprintf(lock, sizeof lock, "%s/state.lock", getenv("COGPU_DAEMON_DIR"));
  struct stat sb;
  ASSERT_EQ(stat(state, &sb), 0);
  ASSERT_EQ(sb.st_uid, 0);
  ASSERT_EQ(sb.st_mode & 07777, 0600);
  ASSERT_EQ(stat(getenv("COGPU_DAEMON_DIR"), &sb), 0);
  ASSERT_EQ(sb.st_uid, 0);
  ASSERT_EQ(sb.st_mode & 0022, 0);
  if (stat(lock, &sb) == 0)
    ASSERT_EQ(sb.st_mode & 0077, 0);
  pid_t p = th_spawn_helper("sec_open_as",
                            (const char *const[]){"65534", state, lock, NULL});
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 0);
  /* Users reach the daemon: nobody's status works, and shows A's job. */
  pid_t a = user_a_holds_4g(th_path("pub/a.tok"));
  static char out[1 << 15], err[1 << 13];
  int rc = cli_as("65534", (const char *const[]){"status", NULL}, out,
                  sizeof out, err, sizeof err);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "nobody's cogpu status: exit %d: %s", rc, err);
  ASSERT_CONTAINS(out, "JOB-A");
  ASSERT_CONTAINS(out, "4.0 GiB");
  /* Read-only: nobody may not reset the node. */
  rc = cli_as("65534", (const char *const[]){"reset", "--force", NULL}, out,
              sizeof out, err, sizeof err);
  ASSERT_NE(rc, 0);
  ASSERT_CONTAINS(err, "admin");
  ASSERT_UEQ(held_by(UID_A, NULL, NULL), 4 * GIB);
  user_end(a);
}

/* --- 2. token theft ----------------------------------------------------------
 */

TEST_IMPL(sec_token_theft_refused) {
  sec_begin();
  pid_t a = user_a_holds_4g(th_path("pub/a.tok"));
  const char *tok = slurp(th_path("pub/a.tok"));
  ASSERT(tok[0]);
  char join[128], cmd[256];
  snprintf(join, sizeof join, "attach=%s", tok);
  /* B joins with A's token: refused, with a message. B's own attachment
   * cannot release what A holds either. */
  pid_t b =
      user_run("65534", th_path("b.log"), join, "attach", "release=0,4096",
               "reserve=0,1024", "release=0,2048", NULL);
  ASSERT_EQ(th_exit_code(th_wait(b, th_ms(10000))), 0);
  const char *bl = slurp(th_path("b.log"));
  snprintf(cmd, sizeof cmd, "%s rc=%d", join, -EPERM);
  ASSERT_CONTAINS(bl, cmd);
  ASSERT_CONTAINS(bl, "belongs to another user");
  ASSERT_CONTAINS(bl, "reserve=0,1024 rc=0");
  ASSERT_UEQ(held_by(UID_A, NULL, NULL), 4 * GIB);
  ASSERT_UEQ(held_by(UID_B, NULL, NULL), 0);
  /* The preload library's route: a CUDA program of B's with A's token in
   * COGPU_JOB_TOKEN. It is refused the job, with the daemon's message. */
  static char out[1 << 14], err[1 << 14];
  char pre[8192], tokenv[256], fake[4200];
  const char *rt = th_sanitizer_runtime();
  snprintf(pre, sizeof pre, "LD_PRELOAD=%s%s%s/libcogpu-preload.so", rt,
           rt[0] ? ":" : "", th_build_dir());
  snprintf(tokenv, sizeof tokenv, "COGPU_JOB_TOKEN=%s", tok);
  snprintf(fake, sizeof fake, "FAKE_CUDA_STATE=%s", th_path("pub/fake-cuda"));
  snprintf(cmd, sizeof cmd, "%s/tests/cudaprog", th_build_dir());
  th_run((const char *const[]){"setpriv", "--reuid=65534", "--regid=65534",
                               "--clear-groups", "env", pre, tokenv, fake,
                               "COGPU_MEM=1G", cmd, "direct", "init", "ctx",
                               "alloc:256M", NULL},
         NULL, out, sizeof out, err, sizeof err, th_ms(20000));
  ASSERT_CONTAINS(err, "belongs to another user");
  ASSERT_UEQ(held_by(UID_A, NULL, NULL), 4 * GIB);
  /* Root (an admin) may join: the token names a live job. */
  cogpu_t *h = NULL;
  cogpu_attach_opts_t o = {.join = tok};
  ASSERT_OK(cogpu_attach(&o, &h));
  cogpu_detach(h);
  ASSERT_UEQ(held_by(UID_A, NULL, NULL), 4 * GIB);
  user_end(a);
  ASSERT_UEQ(held_by(-1, NULL, NULL), 0);
}

/* --- 3. slot and waiter exhaustion -------------------------------------------
 */

TEST_IMPL(sec_user_max_clients) {
  sec_begin();
  sec_daemon_config("user_max_clients = 8\n");
  /* B attaches 8 times from one process; the 9th is refused. */
  pid_t b = user_run("65534", th_path("b.log"), "attach", "attach", "attach",
                     "attach", "attach", "attach", "attach", "attach", "attach",
                     "hold", NULL);
  const char *bl = wait_for(th_path("b.log"), "holding", 10000);
  (void)bl;
  bl = slurp(th_path("b.log"));
  size_t ok = 0;
  for (const char *p = bl; (p = strstr(p, "attach rc=0")); p++)
    ok++;
  ASSERT_EQ(ok, 8);
  char want[64];
  snprintf(want, sizeof want, "attach rc=%d", -EAGAIN);
  ASSERT_CONTAINS(bl, want);
  ASSERT_CONTAINS(bl, "user_max_clients");
  size_t n = 0;
  held_by(UID_B, &n, NULL);
  (void)n;
  /* A still attaches and reserves; root's status works. */
  pid_t a =
      user_run("65533", th_path("a.log"), "attach", "reserve=0,1024", NULL);
  ASSERT_EQ(th_exit_code(th_wait(a, th_ms(10000))), 0);
  ASSERT_CONTAINS(slurp(th_path("a.log")), "reserve=0,1024 rc=0");
  static char out[1 << 15], err[1 << 13];
  ASSERT_EQ(cli_as("0", (const char *const[]){"status", NULL}, out, sizeof out,
                   err, sizeof err),
            0);
  daemon_serves();
  user_end(b);
}

TEST_IMPL(sec_user_max_waiters) {
  sec_begin();
  sec_daemon_config("user_max_waiters = 2\n");
  /* A fills GPU 0; B queues two requests; its third is refused. */
  pid_t a = user_run("65533", th_path("a.log"), "attach", "reserve=0,15360",
                     "hold", NULL);
  wait_for(th_path("a.log"), "reserve=0,15360 rc=0", 10000);
  pid_t w[2];
  for (int i = 0; i < 2; i++) {
    char log[32];
    snprintf(log, sizeof log, "w%d.log", i);
    w[i] =
        user_run("65534", th_path(log), "attach", "reserve=0,8192,30000", NULL);
    for (int t = 0; waiting_now() < (size_t)i + 1; t++) {
      ASSERT_LT(t, th_ms(1000));
      th_sleep_ms(10);
    }
  }
  pid_t b = user_run("65534", th_path("b.log"), "attach",
                     "reserve=0,8192,30000", NULL);
  ASSERT_EQ(th_exit_code(th_wait(b, th_ms(10000))), 0);
  char want[64];
  snprintf(want, sizeof want, "reserve=0,8192,30000 rc=%d", -EAGAIN);
  const char *bl = slurp(th_path("b.log"));
  ASSERT_CONTAINS(bl, want);
  ASSERT_CONTAINS(bl, "user_max_waiters");
  /* Another user still queues (and gives up at its own bound). */
  pid_t a2 = user_run("65533", th_path("a2.log"), "attach",
                      "reserve=0,8192,300", NULL);
  ASSERT_EQ(th_exit_code(th_wait(a2, th_ms(10000))), 0);
  snprintf(want, sizeof want, "reserve=0,8192,300 rc=%d", -ETIMEDOUT);
  ASSERT_CONTAINS(slurp(th_path("a2.log")), want);
  user_end(a);
  for (int i = 0; i < 2; i++)
    ASSERT_EQ(th_exit_code(th_wait(w[i], th_ms(10000))), 0);
  daemon_serves();
}

/* --- 4. node settings --------------------------------------------------------
 */

TEST_IMPL(sec_client_env_cannot_set_node_settings) {
  sec_begin();
  /* A client whose environment asks for another policy and a 100% margin
   * (which would leave nothing to reserve) gets the daemon's settings. */
  static char out[1 << 15], err[1 << 13];
  int rc =
      th_run((const char *const[]){"setpriv", "--reuid=65534", "--regid=65534",
                                   "--clear-groups", "env", "COGPU_POLICY=mmu",
                                   "COGPU_MARGIN=100%", "COGPU_MAX_CLIENTS=1",
                                   "cogpu", "run", "--mem", "8G", "--timeout",
                                   "0", "--", "cogpu", "status", NULL},
             NULL, out, sizeof out, err, sizeof err, th_ms(20000));
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "cogpu run: exit %d: %s", rc, err);
  ASSERT_CONTAINS(out, "policy fifo");
  ASSERT_CONTAINS(out, "margin 327.7 MiB");
  cogpu_status_t *st = NULL;
  ASSERT_OK(cogpu_status(NULL, &st));
  ASSERT_STREQ(st->policy, "fifo");
  ASSERT_UEQ(st->gpus[0].margin_bytes, st->gpus[0].total_bytes / 50);
  ASSERT_EQ(st->gpus[0].max_clients, 0);
  cogpu_status_free(st);
}

/* --- 5. planted files and unsafe directories ------------------------------
 */

/* Runs cogpud on dir (socket sock) and expects it to refuse, at once. */
static void daemon_refuses(const char *dir, const char *sock,
                           const char *needle) {
  static char out[1 << 12], err[1 << 14];
  char bin[4200];
  snprintf(bin, sizeof bin, "%s/cogpud", th_build_dir());
  int rc = th_run(
      (const char *const[]){bin, "--socket", sock, "--state-dir", dir, NULL},
      (const char *const[]){"COGPU_LOG=warn", NULL}, out, sizeof out, err,
      sizeof err, th_ms(10000));
  if (rc == 0 || !strstr(err, needle))
    th_fail(__FILE__, __LINE__,
            "cogpud on %s: exit %d, expected a refusal naming '%s': %s", dir,
            rc, needle, err);
}

static void make_dir(const char *path, mode_t mode, uid_t uid) {
  ASSERT_EQ(mkdir(path, mode), 0);
  ASSERT_EQ(chmod(path, mode), 0);
  ASSERT_EQ(chown(path, uid, uid), 0);
}

TEST_IMPL(sec_planted_unsafe_daemon_dir) {
  sec_begin();
  const char *sock = tp("p.sock");
  /* A directory others can write to (even with the sticky bit, like /tmp):
   * they could plant state.tmp.<pid>, state.lock, a state of their own. */
  make_dir(th_path("sticky"), 01777, 0);
  daemon_refuses(th_path("sticky"), sock, "writable");
  make_dir(th_path("groupw"), 0770, 0);
  daemon_refuses(th_path("groupw"), sock, "writable");
  /* A directory of another user's. */
  make_dir(th_path("theirs"), 0700, UID_B);
  daemon_refuses(th_path("theirs"), sock, "uid 65534");
  /* A symbolic link, even to a good directory. */
  make_dir(th_path("good"), 0755, 0);
  ASSERT_EQ(symlink(th_path("good"), th_path("link")), 0);
  daemon_refuses(th_path("link"), sock, "symbolic link");
  ASSERT_EQ(access(th_path("sticky/state"), F_OK), -1);
  ASSERT_EQ(access(th_path("good/state"), F_OK), -1);
}

TEST_IMPL(sec_planted_state_files) {
  sec_begin();
  const char *sock = tp("p.sock");
  /* state is a symbolic link to a file of the attacker's: refused, and the
   * file is not written. */
  th_write_file(th_path("pub/victim"), "attacker\n");
  ASSERT_EQ(chown(th_path("pub/victim"), UID_B, UID_B), 0);
  make_dir(th_path("d1"), 0755, 0);
  ASSERT_EQ(symlink(th_path("pub/victim"), th_path("d1/state")), 0);
  daemon_refuses(th_path("d1"), sock, "symbolic link");
  ASSERT_STREQ(slurp(th_path("pub/victim")), "attacker\n");
  /* state is a file of another user's: refused, not written. */
  make_dir(th_path("d2"), 0755, 0);
  th_write_file(th_path("d2/state"), "attacker\n");
  ASSERT_EQ(chown(th_path("d2/state"), UID_B, UID_B), 0);
  daemon_refuses(th_path("d2"), sock, "belongs to uid 65534");
  ASSERT_STREQ(slurp(th_path("d2/state")), "attacker\n");
  /* A state.tmp.<pid> that exists (a hard link to the attacker's file) is
   * not where the daemon builds its state: it starts, and the attacker's
   * file is untouched. */
  make_dir(th_path("d3"), 0755, 0);
  th_write_file(th_path("pub/victim2"), "attacker\n");
  char script[8192];
  snprintf(script, sizeof script,
           "ln %s %s/state.tmp.$$ && exec %s/cogpud --socket %s --state-dir "
           "%s",
           th_path("pub/victim2"), th_path("d3"), th_build_dir(), sock,
           th_path("d3"));
  pid_t d = fork();
  if (d == 0) {
    unsetenv("LD_PRELOAD"); /* a TSan runtime preloaded into dash faults */
    execl("/bin/sh", "sh", "-c", script, (char *)NULL);
    _exit(127);
  }
  int st = 0, t;
  for (t = 0; t < th_ms(10000); t += 10) {
    if (waitpid(d, &st, WNOHANG) == d)
      th_fail(__FILE__, __LINE__,
              "cogpud exited (%d): the planted file "
              "stopped it",
              th_exit_code(st));
    if (access(sock, F_OK) == 0)
      break;
    th_sleep_ms(10);
  }
  ASSERT_LT(t, th_ms(10000));
  ASSERT_STREQ(slurp(th_path("pub/victim2")), "attacker\n");
  struct stat sb;
  ASSERT_EQ(stat(th_path("d3/state"), &sb), 0);
  ASSERT_EQ(sb.st_uid, 0);
  ASSERT_EQ(sb.st_mode & 07777, 0600);
  kill(d, SIGTERM);
  th_wait(d, th_ms(10000));
}

HELPER_IMPL(sec_flock_as) {
  /* UID LOCKFILE READYFILE: take the lock if it can be opened, and hold it
   * until killed. */
  if (argc != 3)
    return 2;
  drop_to(argv[0]);
  int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
    th_write_file(argv[2], "refused\n");
    return 0;
  }
  th_write_file(argv[2], "locked\n");
  th_sleep_ms(60000);
  return 0;
}

/* The daemon's directory may be traversable (its socket lives there, as
 * /run/cogpu/cogpu.sock does), but no user can take the daemon's state
 * lock: a lock held by a user would hang the daemon at its next reset. */
TEST_IMPL(sec_planted_lock_held_by_user) {
  sec_begin();
  char dir[4096], sock[4200], lock[4200];
  snprintf(dir, sizeof dir, "%s", th_path("run"));
  snprintf(sock, sizeof sock, "%s/cogpu.sock", dir);
  snprintf(lock, sizeof lock, "%s/state.lock", dir);
  make_dir(dir, 0755, 0);
  th_daemon_stop(SIGTERM);
  setenv("COGPU_SOCKET", sock, 1);
  setenv("COGPU_DAEMON_DIR", dir, 1);
  th_daemon_start();
  struct stat sb;
  ASSERT_EQ(stat(dir, &sb), 0);
  ASSERT_EQ(sb.st_mode & 0777, 0755);
  pid_t a = user_a_holds_4g(th_path("pub/a.tok"));
  pid_t l = th_spawn_helper(
      "sec_flock_as",
      (const char *const[]){"65534", lock, th_path("pub/lock.out"), NULL});
  const char *r = wait_for(th_path("pub/lock.out"), "ed\n", 10000);
  user_end(a);
  /* An admin's reset makes a new state: it must not wait on the user. */
  static char out[1 << 12], err[1 << 12];
  int rc = th_run((const char *const[]){"cogpu", "reset", NULL}, NULL, out,
                  sizeof out, err, sizeof err, th_ms(10000));
  kill(l, SIGKILL);
  th_wait(l, th_ms(10000));
  ASSERT_STREQ(r, "refused\n");
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "cogpu reset: exit %d: %s", rc, err);
  daemon_serves();
}

/* `cogpu reset` keeps the daemon's --state-dir (a reset reloads the
 * configuration file, not the command line). */
TEST_IMPL(sec_reset_keeps_state_dir) {
  sec_begin();
  th_daemon_stop(SIGTERM);
  char bin[4200];
  snprintf(bin, sizeof bin, "%s/cogpud", th_build_dir());
  const char *sock = tp("r.sock");
  const char *right = tp("right");
  setenv("COGPU_DAEMON_DIR", th_path("wrong"), 1);
  pid_t d = fork();
  if (d == 0) {
    execl(bin, "cogpud", "--socket", sock, "--state-dir", right, (char *)NULL);
    _exit(127);
  }
  wait_socket(sock);
  setenv("COGPU_SOCKET", sock, 1);
  static char out[1 << 12], err[1 << 12];
  int rc = th_run((const char *const[]){"cogpu", "reset", NULL}, NULL, out,
                  sizeof out, err, sizeof err, th_ms(10000));
  kill(d, SIGTERM);
  th_wait(d, th_ms(10000));
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "cogpu reset: exit %d: %s", rc, err);
  ASSERT_EQ(access(th_path("wrong/state"), F_OK), -1);
  ASSERT_EQ(access(th_path("right/state"), F_OK), 0);
}

/* --- 6. priority cap ---------------------------------------------------------
 */

static char sec_group[32];
static void group_cleanup(void) {
  if (sec_group[0]) {
    const char *argv[] = {"groupdel", sec_group, NULL};
    char o[256], e[256];
    th_run(argv, NULL, o, sizeof o, e, sizeof e, 10000);
    sec_group[0] = 0;
  }
}

/* The priority of the client of uid on GPU 0 (it reserves 1 GiB). */
static int prio_of(const char *who, const char *log) {
  pid_t p = user_run(who, th_path(log), "prio=1000", "attach", "reserve=0,1024",
                     "hold", NULL);
  wait_for(th_path(log), "holding", 10000);
  int prio = 0;
  unsigned uid = 0;
  sscanf(who, "%u", &uid);
  held_by((int)uid, NULL, &prio);
  user_end(p);
  return prio;
}

TEST_IMPL(sec_priority_cap) {
  sec_begin();
  /* A user's --priority 1000 is capped, with a warning. */
  static char out[1 << 15], err[1 << 13];
  int rc = cli_as("65534",
                  (const char *const[]){"run", "--priority", "1000", "--mem",
                                        "1G", "--", "true", NULL},
                  out, sizeof out, err, sizeof err);
  ASSERT_EQ(rc, 0);
  ASSERT_CONTAINS(err, "priority 1000 capped to 100");
  ASSERT_EQ(prio_of("65534", "b.log"), 100);
  /* Root may. */
  ASSERT_EQ(prio_of("0", "root.log"), 1000);
  /* So may a member of admin_group. */
  snprintf(sec_group, sizeof sec_group, "cogpusec%d", (int)getpid());
  atexit(group_cleanup);
  ASSERT_EQ(th_run((const char *const[]){"groupadd", sec_group, NULL}, NULL,
                   out, sizeof out, err, sizeof err, th_ms(10000)),
            0);
  struct group *gr = getgrnam(sec_group);
  ASSERT(gr);
  char conf[128], member[64];
  snprintf(conf, sizeof conf, "admin_group = %s\n", sec_group);
  snprintf(member, sizeof member, "65533/%u", (unsigned)gr->gr_gid);
  sec_daemon_config(conf);
  ASSERT_EQ(prio_of(member, "admin.log"), 1000);
  rc = cli_as(member,
              (const char *const[]){"run", "--priority", "1000", "--mem", "1G",
                                    "--", "true", NULL},
              out, sizeof out, err, sizeof err);
  ASSERT_EQ(rc, 0);
  ASSERT(!strstr(err, "capped"));
  ASSERT_EQ(prio_of("65533", "a.log"), 100);
  group_cleanup();
}

/* --- 7. malformed and random messages ----------------------------------------
 */

static int raw_connect(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", getenv("COGPU_SOCKET"));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  ASSERT_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

/* The next message from the daemon: its size, 0 when it closed the
 * connection; fails the test if nothing comes within 5 s. */
static ssize_t raw_recv(int fd, cogpu__msg_t *m) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  ASSERT_EQ(poll(&p, 1, th_ms(5000)), 1);
  ssize_t n = recv(fd, m, sizeof *m, 0);
  return n < 0 ? 0 : n;
}

/* Sends len bytes of m on a new connection; returns the reply's rc, or 1
 * when the daemon closed the connection without one. Either way the
 * connection must end. */
static int raw_exchange(const void *m, size_t len) {
  int fd = raw_connect();
  ASSERT_EQ(send(fd, m, len, MSG_NOSIGNAL), (ssize_t)len);
  cogpu__msg_t r;
  int rc = 1;
  ssize_t n;
  while ((n = raw_recv(fd, &r)) > 0)
    if (r.type == COGPU_M_REPLY)
      rc = r.rc;
  close(fd);
  return rc;
}

/* A's registration as the daemon keeps it (root reads the daemon's state). */
static void a_identity(cogpu__m_resume_t *who) {
  char path[4200];
  snprintf(path, sizeof path, "%s/state", getenv("COGPU_DAEMON_DIR"));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ASSERT(fd >= 0);
  const ledger_state_t *st =
      mmap(NULL, sizeof *st, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT(st != MAP_FAILED);
  close(fd);
  bool found = false;
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS && !found; s++)
    if (st->slots[s].state == SLOT_ACTIVE && st->slots[s].uid == UID_A) {
      who->slot = s;
      who->gen = atomic_load(&st->slots[s].gen);
      who->secret[0] = st->slots[s].secret[0];
      who->secret[1] = st->slots[s].secret[1];
      found = true;
    }
  munmap((void *)st, sizeof *st);
  ASSERT(found);
}

/* After each case: the daemon lives, A's job is intact, and others are
 * served. */
static void still_fine(void) {
  ASSERT_UEQ(held_by(UID_A, NULL, NULL), 4 * GIB);
  daemon_serves();
}

HELPER_IMPL(sec_raw_as) {
  /* UID SLOT GEN S0 S1: as UID, WAIT and RESUME naming A's registration
   * with the right secret: refused (it is not UID's). */
  if (argc != 5)
    return 2;
  cogpu__m_resume_t who = {
      .slot = (uint32_t)strtoul(argv[1], NULL, 10),
      .gen = (uint32_t)strtoul(argv[2], NULL, 10),
      .secret = {strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10)}};
  drop_to(argv[0]);
  cogpu__msg_t m;
  cogpu__msg_init(&m, COGPU_M_RESUME, 1);
  m.u.resume = who;
  ASSERT_EQ(raw_exchange(&m, sizeof m), -EPERM);
  cogpu__msg_init(&m, COGPU_M_WAIT, 1);
  m.u.wait.who = who;
  m.u.wait.req = (cogpu__m_reserve_t){.gpu = 0, .bytes = GIB};
  ASSERT_EQ(raw_exchange(&m, sizeof m), -EPERM);
  /* Neither may a user reset the node or book for another user. */
  cogpu__msg_init(&m, COGPU_M_RESET, 1);
  m.u.reset.force = 1;
  ASSERT_EQ(raw_exchange(&m, sizeof m), -EPERM);
  cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
  m.u.attach.flags = COGPU_ATTACH_FOR_UID;
  m.u.attach.for_uid = UID_A;
  ASSERT_EQ(raw_exchange(&m, sizeof m), -EPERM);
  return 0;
}

TEST_IMPL(sec_malformed_messages) {
  sec_begin();
  pid_t a = user_a_holds_4g(th_path("pub/a.tok"));
  cogpu__msg_t m;
  char big[2 * COGPU_MSG_SIZE];
  cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
  /* Wrong sizes: the connection ends, nothing else. */
  ASSERT_EQ(raw_exchange(&m, 100), 1);
  still_fine();
  memset(big, 0, sizeof big);
  memcpy(big, &m, sizeof m);
  ASSERT_EQ(raw_exchange(big, sizeof big), 1);
  ASSERT_EQ(raw_exchange(&m, 0), 1);
  still_fine();
  /* Bad magic, version, type; unterminated strings. */
  cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
  m.magic ^= 1;
  ASSERT_EQ(raw_exchange(&m, sizeof m), 1);
  /* A version it does not serve: refused in a reply (proto.h), then
   * ended; one of its versions after another on one connection: ended. */
  cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
  m.version = 99;
  ASSERT_EQ(raw_exchange(&m, sizeof m), -EPROTONOSUPPORT);
  m.version = COGPU_PROTO_VERSION_MIN - 1;
  ASSERT_EQ(raw_exchange(&m, sizeof m), -EPROTONOSUPPORT);
  {
    int fd = raw_connect();
    cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
    m.version = COGPU_PROTO_VERSION_MIN;
    ASSERT_EQ(send(fd, &m, sizeof m, MSG_NOSIGNAL), (ssize_t)sizeof m);
    ASSERT_EQ(raw_recv(fd, &m), (ssize_t)sizeof m);
    ASSERT_EQ(m.rc, 0);
    ASSERT_EQ(m.version, COGPU_PROTO_VERSION_MIN);
    for (uint32_t g = m.u.reply.ngpus; g > 0; g--) {
      ASSERT_EQ(raw_recv(fd, &m), (ssize_t)sizeof m);
      ASSERT_EQ(m.type, COGPU_M_GPU);
      ASSERT_EQ(m.version, COGPU_PROTO_VERSION_MIN);
    }
    cogpu__msg_init(&m, COGPU_M_HELD, 2);
    m.version = COGPU_PROTO_VERSION_MIN;
    ASSERT_EQ(send(fd, &m, sizeof m, MSG_NOSIGNAL), (ssize_t)sizeof m);
    ASSERT_EQ(raw_recv(fd, &m), (ssize_t)sizeof m);
    ASSERT_EQ(m.rc, 0);
    cogpu__msg_init(&m, COGPU_M_HELD, 3); /* now the current version */
    ASSERT_EQ(send(fd, &m, sizeof m, MSG_NOSIGNAL), (ssize_t)sizeof m);
    ASSERT_EQ(raw_recv(fd, &m), 0);
    close(fd);
  }
  cogpu__msg_init(&m, 200, 1);
  ASSERT_EQ(raw_exchange(&m, sizeof m), 1);
  cogpu__msg_init(&m, COGPU_M_REPLY, 1); /* a client's reply: not a request */
  ASSERT_EQ(raw_exchange(&m, sizeof m), 1);
  still_fine();
  cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
  memset(m.u.attach.command, 'A', sizeof m.u.attach.command);
  ASSERT_EQ(raw_exchange(&m, sizeof m), 1);
  cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
  memset(m.u.attach.join, '1', sizeof m.u.attach.join);
  ASSERT_EQ(raw_exchange(&m, sizeof m), 1);
  cogpu__msg_init(&m, COGPU_M_FIND_JOB, 1);
  memset(m.u.find_job.job_id, 'J', sizeof m.u.find_job.job_id);
  ASSERT_EQ(raw_exchange(&m, sizeof m), 1);
  /* A request before ATTACH. */
  cogpu__msg_init(&m, COGPU_M_RESERVE, 1);
  m.u.reserve = (cogpu__m_reserve_t){.gpu = 0, .bytes = GIB};
  ASSERT_EQ(raw_exchange(&m, sizeof m), 1);
  still_fine();
  /* A forged secret: no such registration. */
  cogpu__m_resume_t who;
  a_identity(&who);
  cogpu__msg_init(&m, COGPU_M_WAIT, 1);
  m.u.wait.who = who;
  m.u.wait.who.secret[0] ^= 1;
  m.u.wait.req = (cogpu__m_reserve_t){.gpu = 0, .bytes = GIB};
  ASSERT_EQ(raw_exchange(&m, sizeof m), -ESRCH);
  cogpu__msg_init(&m, COGPU_M_RESUME, 1);
  m.u.resume = who;
  m.u.resume.secret[1] ^= 1;
  ASSERT_EQ(raw_exchange(&m, sizeof m), -ESRCH);
  still_fine();
  /* Another user's registration, even with its secret. */
  char s[4][32];
  snprintf(s[0], 32, "%u", who.slot);
  snprintf(s[1], 32, "%u", who.gen);
  snprintf(s[2], 32, "%llu", (unsigned long long)who.secret[0]);
  snprintf(s[3], 32, "%llu", (unsigned long long)who.secret[1]);
  pid_t b =
      th_spawn_helper("sec_raw_as", (const char *const[]){"65534", s[0], s[1],
                                                          s[2], s[3], NULL});
  ASSERT_EQ(th_exit_code(th_wait(b, th_ms(10000))), 0);
  still_fine();
  user_end(a);
}

/* Sums in the daemon's state add up (root maps it read-only). */
static void state_consistent(void) {
  char path[4200];
  snprintf(path, sizeof path, "%s/state", getenv("COGPU_DAEMON_DIR"));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ASSERT(fd >= 0);
  const ledger_state_t *st =
      mmap(NULL, sizeof *st, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT(st != MAP_FAILED);
  close(fd);
  for (uint32_t g = 0; g < st->hdr.ngpus; g++) {
    uint64_t sum = 0;
    for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++)
      sum += st->slots[s].state == SLOT_ACTIVE ? st->slots[s].held[g] : 0;
    ASSERT_UEQ(sum, st->hdr.gpus[g].reserved);
  }
  munmap((void *)st, sizeof *st);
}

HELPER_IMPL(sec_flood_as) {
  /* UID N: N messages over 4 connections: random bytes, random bytes with
   * a valid header, and valid-looking requests with random fields. */
  if (argc != 2)
    return 2;
  drop_to(argv[0]);
  long n = strtol(argv[1], NULL, 10);
  uint64_t rnd = 0x2545f4914f6cdd1dull;
  int fds[4] = {-1, -1, -1, -1};
  for (long i = 0; i < n; i++) {
    cogpu__msg_t m;
    uint64_t r = rnd ^= rnd << 13, k = (rnd ^= rnd >> 7) % 4;
    rnd ^= rnd << 17;
    unsigned char *p = (unsigned char *)&m;
    for (size_t j = 0; j < sizeof m;
         j++, rnd = rnd * 6364136223846793005ull + 1)
      p[j] = (unsigned char)(rnd >> 56);
    if (r % 3 == 1) {
      m.magic = COGPU_PROTO_MAGIC;
      m.version = (r >> 16) % 2 ? COGPU_PROTO_VERSION : COGPU_PROTO_VERSION_MIN;
      m.type = (uint16_t)(1 + (r >> 8) % COGPU_M_RESET);
    } else if (r % 3 == 2) {
      fz_make(&m, (int)(1 + (r >> 8) % COGPU_M_RESET), &rnd);
    }
    if (fds[k] < 0)
      fds[k] = raw_connect();
    if (send(fds[k], &m, sizeof m, MSG_NOSIGNAL) != (ssize_t)sizeof m) {
      /* The daemon ended it (the last message was bad): a new one. */
      close(fds[k]);
      fds[k] = raw_connect();
      ASSERT_EQ(send(fds[k], &m, sizeof m, MSG_NOSIGNAL), (ssize_t)sizeof m);
    }
    /* Replies are read as they come; a closed connection is replaced. */
    cogpu__msg_t rep;
    for (;;) {
      ssize_t got = recv(fds[k], &rep, sizeof rep, MSG_DONTWAIT);
      if (got > 0)
        continue;
      if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(fds[k]);
        fds[k] = -1;
      }
      break;
    }
  }
  return 0;
}

TEST_IMPL_T(sec_random_messages_flood, 120) {
  sec_begin();
  pid_t a = user_a_holds_4g(th_path("pub/a.tok"));
  pid_t f[3];
  for (int i = 0; i < 3; i++)
    f[i] = th_spawn_helper("sec_flood_as",
                           (const char *const[]){"65534", "3400", NULL});
  for (int i = 0; i < 3; i++)
    ASSERT_EQ(th_exit_code(th_wait(f[i], th_ms(90000))), 0);
  still_fine();
  state_consistent();
  user_end(a);
  th_sleep_ms(100);
  ASSERT_UEQ(held_by(-1, NULL, NULL), 0);
  state_consistent();
}

/* The handler itself, as a function, on random input: no crash (ASan
 * build: no memory error, no leak), invariants after every message. */
TEST_IMPL_T(sec_handler_random, 120) {
  const char *why;
  ASSERT_OK(fz_init(th_path("fz"), &why));
  uint64_t rnd = 0x853c49e6748fea9bull;
  uint8_t buf[COGPU_MSG_SIZE];
  int64_t t0 = (int64_t)(cogpu__now_ns() / 1000000);
  long i;
  for (i = 0; i < 15000; i++) {
    cogpu__msg_t *m = (cogpu__msg_t *)buf;
    rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = rnd >> 11;
    if (r % 8 == 0) {
      for (size_t j = 0; j < sizeof buf; j++)
        buf[j] = (uint8_t)((rnd = rnd * 6364136223846793005ull + 1) >> 56);
    } else {
      int t =
          r % 61 == 0 ? COGPU_M_RESET : (int)(1 + (r >> 8) % COGPU_M_STATUS);
      fz_make(m, t, &rnd);
      if (r % 5 == 0) /* one field off */
        buf[16 + (r >> 20) % (sizeof buf - 16)] ^=
            (uint8_t)(1u << (r >> 40) % 8);
    }
    if (fz_feed(buf, sizeof buf, &why) != 0)
      th_fail(__FILE__, __LINE__, "message %ld: %s", i, why);
    if (r % 997 == 0)
      fz_reset();
    /* A bound on time, once every kind of outcome has been reached often
     * enough: a loaded machine (TSan beside other tests) runs fewer
     * messages a second, never fewer kinds. */
    const fz_stats_t *c = fz_stats();
    bool covered = c->attached > 100 && c->reserved_ok > 20 &&
                   c->closed > 100 && c->old_accepted > 100;
    if (covered && (int64_t)(cogpu__now_ns() / 1000000) - t0 > th_ms(10000))
      break;
  }
  const fz_stats_t *s = fz_stats();
  fprintf(stderr,
          "# %llu messages, %llu accepted, %llu closed, %llu attaches, "
          "%llu reserves\n",
          (unsigned long long)s->msgs, (unsigned long long)s->accepted,
          (unsigned long long)s->closed, (unsigned long long)s->attached,
          (unsigned long long)s->reserved_ok);
  ASSERT_GT(s->attached, 100);
  ASSERT_GT(s->reserved_ok, 20);
  ASSERT_GT(s->closed, 100);
  ASSERT_GT(s->old_accepted, 100); /* the previous version is served */
  fz_fini();
}

/* A reset that cannot make a new state (here: the directory became
 * writable by others) stops the daemon with a message, not a crash. */
TEST_IMPL(sec_failed_reset_stops_cleanly) {
  sec_begin();
  th_daemon_stop(SIGTERM);
  char bin[4200];
  snprintf(bin, sizeof bin, "%s/cogpud", th_build_dir());
  const char *sock = tp("f.sock"), *dir = tp("fdir"), *log = tp("f.log");
  pid_t d = fork();
  if (d == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    dup2(fd, 2);
    execl(bin, "cogpud", "--socket", sock, "--state-dir", dir, (char *)NULL);
    _exit(127);
  }
  wait_socket(sock);
  setenv("COGPU_SOCKET", sock, 1);
  cogpu_t *h = NULL;
  ASSERT_OK(cogpu_attach(NULL, &h)); /* a connection the reset ends */
  ASSERT_EQ(chmod(dir, 0775), 0);
  static char out[1 << 12], err[1 << 12];
  int rc = th_run((const char *const[]){"cogpu", "reset", "--force", NULL},
                  NULL, out, sizeof out, err, sizeof err, th_ms(10000));
  ASSERT_NE(rc, 0);
  ASSERT_CONTAINS(err, "writable by other users");
  int code = th_exit_code(th_wait(d, th_ms(10000)));
  if (code != 1)
    th_fail(__FILE__, __LINE__, "cogpud exited %d: %s", code, slurp(log));
  ASSERT_CONTAINS(slurp(log), "a reset could not make a new node state");
  cogpu_detach(h);
}

/* --- 8. descriptors passed with messages (issue 23) ----------------------
 */

/* Sends len bytes of m on fd with nfds descriptors (of /dev/null, ours
 * closed after) in one SCM_RIGHTS header. */
static void send_fds(int fd, const void *m, size_t len, int nfds) {
  int fds[16];
  union {
    char buf[CMSG_SPACE(sizeof fds)];
    struct cmsghdr align;
  } cb;
  ASSERT(nfds >= 0 && nfds <= 16);
  memset(&cb, 0, sizeof cb);
  struct iovec iov = {.iov_base = (void *)m, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  for (int i = 0; i < nfds; i++)
    ASSERT((fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0);
  if (nfds) {
    mh.msg_control = cb.buf;
    mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
  }
  ASSERT_EQ(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)len);
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
}

/* Sends m (len bytes, with nfds descriptors) on fd and reads until the
 * reply to it or the connection's end: the reply's rc, or 1 when the
 * daemon closed the connection without one. */
static int fd_exchange(int fd, const cogpu__msg_t *m, size_t len, int nfds) {
  send_fds(fd, m, len, nfds);
  cogpu__msg_t r;
  while (raw_recv(fd, &r) > 0)
    if (r.type == COGPU_M_REPLY && r.seq == m->seq)
      return r.rc;
  return 1;
}

/* One round of messages carrying descriptors (none when `many` is 0, the
 * warm-up): each kind the daemon receives. Returns how many answers were
 * not the expected ones (checked after the descriptors are counted). */
static int fd_round(int many) {
  cogpu__msg_t m;
  int wrong = 0, fd;
  /* A request that takes none, with several: a violation. */
  fd = raw_connect();
  cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
  wrong += fd_exchange(fd, &m, sizeof m, 2 * many) != (many ? 1 : 0);
  close(fd);
  /* More than the daemon has room for (MSG_CTRUNC). */
  fd = raw_connect();
  cogpu__msg_init(&m, COGPU_M_STATUS, 1);
  wrong += fd_exchange(fd, &m, sizeof m, 8 * many) != (many ? 1 : 0);
  close(fd);
  /* An empty message (recvmsg returns 0) with descriptors. */
  fd = raw_connect();
  send_fds(fd, &m, 0, 2 * many);
  wrong += raw_recv(fd, &m) != 0;
  close(fd);
  /* The usage page, twice in one message, on a main connection. */
  fd = raw_connect();
  cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
  wrong += fd_exchange(fd, &m, sizeof m, 0) != 0;
  cogpu__msg_init(&m, COGPU_M_USAGE, 2);
  m.u.usage.size = (uint32_t)sizeof(cogpu__usage_t);
  /* Without one the daemon refuses the page, and keeps the connection. */
  wrong += fd_exchange(fd, &m, sizeof m, 2 * many) != (many ? 1 : -EINVAL);
  close(fd);
  /* One descriptor where none is expected: the daemon answers and closes
   * it. */
  fd = raw_connect();
  cogpu__msg_init(&m, COGPU_M_STATUS, 1);
  wrong += fd_exchange(fd, &m, sizeof m, many ? 1 : 0) != 0;
  close(fd);
  return wrong;
}

/* Waits (bounded) until the daemon has at most `want` descriptors open:
 * its count then. */
static int daemon_fds_settle(pid_t dp, int want) {
  int n = lt_fd_count(dp);
  for (int t = 0; n > want && t < th_ms(2000); t += 10) {
    th_sleep_ms(10);
    n = lt_fd_count(dp);
  }
  return n;
}

/* Every descriptor a message brings is used (one, where the protocol
 * takes one) or closed: two in one SCM_RIGHTS header fitted the daemon's
 * control buffer, were installed, and were never closed (issue 23: 200
 * messages took cogpud from 12 to 412 descriptors). */
TEST_IMPL(sec_passed_descriptors_closed) {
  setenv("COGPU_NODE_MODE", "daemon", 1);
  if (!th_node_mode())
    th_daemon_start();
  pid_t dp = th_daemon_pid();
  ASSERT(dp > 0);
  ASSERT_EQ(fd_round(0), 0);
  daemon_serves();
  th_sleep_ms(100);
  int before = lt_fd_count(dp), wrong = 0;
  for (int i = 0; i < 25; i++)
    wrong += fd_round(1);
  int after = daemon_fds_settle(dp, before);
  if (after > before)
    th_fail(__FILE__, __LINE__,
            "cogpud had %d descriptors open, %d after 125 messages carrying "
            "275 descriptors",
            before, after);
  ASSERT_EQ(wrong, 0);
  daemon_serves();
}

/* Sends m (len bytes) with one descriptor of /dev/null in each of two
 * SCM_RIGHTS headers: the kernel delivers them as one list of two. */
static void send_two_headers(int fd, const void *m, size_t len) {
  union {
    char buf[2 * CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } cb;
  memset(&cb, 0, sizeof cb);
  struct iovec iov = {.iov_base = (void *)m, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = cb.buf,
                      .msg_controllen = sizeof cb.buf};
  int fds[2];
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  for (int i = 0; i < 2; i++, cm = CMSG_NXTHDR(&mh, cm)) {
    ASSERT((fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fds[i], sizeof(int));
  }
  ASSERT_EQ(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)len);
  close(fds[0]);
  close(fds[1]);
}

HELPER_IMPL(sec_socket_layer_as) {
  /* UID: as UID, every combination of a message's size (empty, short,
   * whole, oversized), its descriptors (0 to 3: the daemon's control
   * buffer holds two, so three arrive cut short, MSG_CTRUNC) and its
   * connection (a query's STATUS, a main connection's USAGE, which takes
   * one descriptor), and two descriptors in two headers. Exits with the
   * number of answers that were not the expected ones. */
  if (argc != 1)
    return 2;
  drop_to(argv[0]);
  static const size_t lens[] = {0, 100, COGPU_MSG_SIZE, 2 * COGPU_MSG_SIZE};
  char buf[2 * COGPU_MSG_SIZE];
  int wrong = 0;
  for (int kind = 0; kind < 2; kind++)
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
      for (int nfds = 0; nfds <= 3; nfds++) {
        cogpu__msg_t m;
        int fd = raw_connect();
        if (kind == 1) {
          cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
          if (fd_exchange(fd, &m, sizeof m, 0) != 0) {
            fprintf(stderr, "# attach refused\n");
            wrong++;
          }
          cogpu__msg_init(&m, COGPU_M_USAGE, 2);
          m.u.usage.size = (uint32_t)sizeof(cogpu__usage_t);
        } else {
          cogpu__msg_init(&m, COGPU_M_STATUS, 1);
        }
        memset(buf, 0, sizeof buf);
        memcpy(buf, &m, sizeof m);
        /* Ended, unless the message is whole with at most one descriptor:
         * then STATUS is answered (its descriptor closed), and USAGE is
         * refused (none, or /dev/null: not a sealed memfd) on a
         * connection that lives on. */
        int want = 1;
        if (lens[l] == COGPU_MSG_SIZE && nfds <= 1)
          want = kind == 0 ? 0 : -EINVAL;
        send_fds(fd, buf, lens[l], nfds);
        cogpu__msg_t r;
        int got = 1;
        while (raw_recv(fd, &r) > 0)
          if (r.type == COGPU_M_REPLY && r.seq == m.seq) {
            got = r.rc;
            break;
          }
        if (got != want) {
          fprintf(stderr, "# %s of %zu bytes with %d descriptors: %d, not %d\n",
                  kind ? "USAGE" : "STATUS", lens[l], nfds, got, want);
          wrong++;
        }
        close(fd);
      }
  for (int kind = 0; kind < 2; kind++) {
    cogpu__msg_t m, r;
    int fd = raw_connect();
    cogpu__msg_init(&m, COGPU_M_STATUS, 1);
    if (kind == 1) {
      cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
      wrong += fd_exchange(fd, &m, sizeof m, 0) != 0;
      cogpu__msg_init(&m, COGPU_M_USAGE, 2);
      m.u.usage.size = (uint32_t)sizeof(cogpu__usage_t);
    }
    send_two_headers(fd, &m, sizeof m);
    int got = 1;
    while (raw_recv(fd, &r) > 0)
      if (r.type == COGPU_M_REPLY && r.seq == m.seq)
        got = r.rc;
    if (got != 1) {
      fprintf(stderr, "# two headers: %d, not ended\n", got);
      wrong++;
    }
    close(fd);
  }
  return wrong;
}

/* The socket layer, from an unprivileged user: messages empty, short,
 * whole and oversized, with 0 to 3 descriptors (3: more than the daemon's
 * control buffer holds, MSG_CTRUNC) in one or two headers. The daemon
 * answers or ends each as the protocol says, lives on, holds no
 * descriptor more than before (/proc/PID/fd), and serves a normal client. */
TEST_IMPL(sec_socket_layer_matrix) {
  sec_begin();
  pid_t dp = th_daemon_pid();
  ASSERT(dp > 0);
  /* Twice: the first pass also lets the daemon open what it opens once
   * after its start (its history file, by the writer thread), which a
   * count taken before it could miss; the second is counted. */
  int before = 0;
  for (int pass = 0; pass < 2; pass++) {
    daemon_serves();
    before = lt_fd_count(dp);
    pid_t h = th_spawn_helper("sec_socket_layer_as",
                              (const char *const[]){"65534", NULL});
    ASSERT_EQ(th_exit_code(th_wait(h, th_ms(30000))), 0);
  }
  int after = daemon_fds_settle(dp, before);
  if (after > before)
    th_fail(__FILE__, __LINE__,
            "cogpud had %d descriptors open, %d after the messages", before,
            after);
  ASSERT_EQ(kill(dp, 0), 0);
  ASSERT_EQ(th_daemon_pid(), dp);
  daemon_serves();
}

/* The client side: a reply that brings more than the one descriptor it
 * takes (a status snapshot) is a protocol error, and none is kept. A fake
 * daemon, a child of the test, answers each query with nfds descriptors. */
TEST_IMPL_ONCE_T(sec_client_passed_descriptors_closed, 30) {
  static const int nfds[] = {2, 8, 2, 8};
  const int rounds = (int)(sizeof nfds / sizeof nfds[0]);
  setenv("COGPU_NODE_MODE", "daemon", 1);
  setenv("COGPU_SOCKET", th_path("fake.sock"), 1);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", getenv("COGPU_SOCKET"));
  int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT(lfd >= 0);
  ASSERT_EQ(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  ASSERT_EQ(listen(lfd, 16), 0);
  pid_t srv = fork();
  ASSERT(srv >= 0);
  if (srv == 0) {
    for (int i = 0; i < rounds; i++) {
      int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
      cogpu__msg_t m, r;
      if (c < 0 || recv(c, &m, sizeof m, 0) != (ssize_t)sizeof m)
        _exit(1);
      cogpu__msg_init(&r, COGPU_M_REPLY, m.seq);
      send_fds(c, &r, sizeof r, nfds[i]);
      /* Kept open until the client has read it and gone. */
      recv(c, &m, sizeof m, 0);
      close(c);
    }
    _exit(0);
  }
  close(lfd);
  int before = lt_fd_count(getpid());
  for (int i = 0; i < rounds; i++) {
    cogpu_status_t *st = NULL;
    int rc = cogpu_status(NULL, &st);
    if (rc == 0)
      cogpu_status_free(st);
    ASSERT_EQ(rc, -EPROTO);
  }
  ASSERT_EQ(th_exit_code(th_wait(srv, th_ms(10000))), 0);
  ASSERT_EQ(lt_fd_count(getpid()), before);
}

/* --- 9. connections per user (issue 23) ------------------------------------
 */

/* How often needle occurs in text. */
static int occurrences(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

HELPER_IMPL(sec_conns_as) {
  /* UID N STATUSFILE: as UID, opens N connections to the daemon and
   * sends nothing; writes "open=X closed=Y" to STATUSFILE each time the
   * count of those the daemon closed changes, until SIGTERM (60 s at
   * most). */
  if (argc != 3)
    return 2;
  signal(SIGTERM, on_term);
  drop_to(argv[0]);
  int n = atoi(argv[1]);
  int *fds = calloc((size_t)n, sizeof *fds);
  bool *gone = calloc((size_t)n, sizeof *gone);
  if (!fds || !gone || n <= 0)
    return 2;
  for (int i = 0; i < n; i++)
    fds[i] = raw_connect();
  int closed = -1;
  for (int t = 0; t < 6000 && !got_term; t++) {
    int now = 0;
    for (int i = 0; i < n; i++) {
      struct pollfd p = {.fd = fds[i], .events = POLLIN};
      char c;
      if (!gone[i] && poll(&p, 1, 0) == 1 &&
          recv(fds[i], &c, 1, MSG_DONTWAIT) <= 0)
        gone[i] = true;
      now += gone[i];
    }
    if (now != closed) {
      char line[64];
      snprintf(line, sizeof line, "open=%d closed=%d\n", n - now, now);
      th_write_file(argv[2], line);
      closed = now;
    }
    th_sleep_ms(10);
  }
  for (int i = 0; i < n; i++)
    close(fds[i]);
  free(fds);
  free(gone);
  return 0;
}

/* Every connection costs the daemon a descriptor, and a wait takes one of
 * its own, so a user's connections are capped, not only their slots and
 * waits: user_max_clients + user_max_waiters + 64 (for queries and
 * connections that have not attached yet). B holds 80 connections that
 * never attach; the daemon keeps 67 and closes the others, saying so once,
 * and goes on serving A, root and waits. */
TEST_IMPL_T(sec_user_max_connections, 60) {
  sec_begin();
  setenv("COGPU_LOG", "info", 1);
  sec_daemon_config("user_max_clients = 2\nuser_max_waiters = 1\n");
  setenv("COGPU_LOG", "error", 1);
  pid_t dp = th_daemon_pid();
  const char *log = tp("cogpud.log");
  int said = occurrences(slurp(log), "connections to the daemon");
  const char *bconns = tp("pub/b.conns");
  pid_t b = th_spawn_helper("sec_conns_as",
                            (const char *const[]){"65534", "80", bconns, NULL});
  wait_for(bconns, "open=67 closed=13\n", 10000);
  /* B at its cap: its next process is refused too. */
  pid_t b2 = user_run("65534", th_path("b2.log"), "attach", NULL);
  ASSERT_EQ(th_exit_code(th_wait(b2, th_ms(10000))), 0);
  ASSERT(!strstr(slurp(th_path("b2.log")), "attach rc=0"));
  th_sleep_ms(200);
  ASSERT_STREQ(slurp(bconns), "open=67 closed=13\n");
  /* Said once, for all 14 refusals. */
  ASSERT_EQ(occurrences(slurp(log), "connections to the daemon"), said + 1);
  ASSERT_CONTAINS(slurp(log), "user 65534");
  /* Others are served: root holds most of GPU 0, A waits for it and gets
   * it when root lets go. */
  cogpu_t *h = NULL;
  ASSERT_OK(cogpu_attach(NULL, &h));
  cogpu_request_t q = {.gpu = 0,
                       .bytes = 15 * GIB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  ASSERT_OK(cogpu_reserve(h, &q, NULL));
  pid_t a = user_run("65533", th_path("a.log"), "attach",
                     "reserve=0,4096,20000", NULL);
  for (int t = 0; waiting_now() < 1; t += 10) {
    ASSERT_LT(t, th_ms(10000));
    th_sleep_ms(10);
  }
  ASSERT_OK(cogpu_release(h, 0, 15 * GIB));
  ASSERT_EQ(th_exit_code(th_wait(a, th_ms(10000))), 0);
  ASSERT_CONTAINS(slurp(th_path("a.log")), "reserve=0,4096,20000 rc=0");
  ASSERT_OK(cogpu_detach(h));
  daemon_serves();
  /* Refusing is no spin: the daemon sleeps while B holds its connections
   * (a busy loop costs about 200 ticks in 2 s). */
  uint64_t t0 = lt_cpu_ticks(dp);
  th_sleep_ms(2000);
  ASSERT_LT(lt_cpu_ticks(dp) - t0, 50);
  /* Once B's connections close, B is served again. */
  kill(b, SIGTERM);
  ASSERT_EQ(th_exit_code(th_wait(b, th_ms(10000))), 0);
  th_sleep_ms(100);
  pid_t b3 =
      user_run("65534", th_path("b3.log"), "attach", "reserve=0,1024", NULL);
  ASSERT_EQ(th_exit_code(th_wait(b3, th_ms(10000))), 0);
  ASSERT_CONTAINS(slurp(th_path("b3.log")), "reserve=0,1024 rc=0");
}

/* --- 10. forged usage pages (issue 23) ---------------------------------------
 */

/* Every "KEY": N in text is at most max; how many there were. */
static int json_all_at_most(const char *text, const char *key, uint64_t max) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  int n = 0;
  for (const char *p = text; (p = strstr(p, k)); p += strlen(k), n++) {
    unsigned long long v = strtoull(p + strlen(k), NULL, 10);
    if (v > max)
      th_fail(__FILE__, __LINE__, "%s %llu above %llu in: %s", key, v,
              (unsigned long long)max, text);
  }
  return n;
}

/* A process's usage page is its own to write: one that claims 2^63 bytes
 * (twice in one job, so that the job's sum wraps to 0, and once more in a
 * job of its own, so that the GPU's does) is taken as at most what the GPU
 * holds, and every sum stops there: status and metrics never read a wrapped
 * "used 0 B". */
TEST_IMPL(sec_forged_usage_page) {
  sec_begin();
  const char *big = "usage=0,9223372036854775808";
  pid_t b = user_run("65534", th_path("b.log"), "attach", "reserve=0,1024", big,
                     "join", big, "attach", "reserve=0,1024",
                     "usage=0,18446744073709551615", "hold", NULL);
  wait_for(th_path("b.log"), "holding", 10000);
  const char *bl = slurp(th_path("b.log"));
  ASSERT(!strstr(bl, "rc=-"));
  cogpu_status_t *st = NULL;
  ASSERT_OK(cogpu_status(NULL, &st));
  const cogpu_gpu_info_t *g = &st->gpus[0];
  uint64_t total = g->total_bytes;
  ASSERT_EQ(g->nclients, 2);
  for (size_t i = 0; i < g->nclients; i++) {
    ASSERT_UEQ(g->clients[i].used_bytes, total);
    ASSERT_UEQ(g->clients[i].peak_bytes, total);
  }
  ASSERT_UEQ(g->used_bytes, total);
  cogpu_status_free(st);
  static char out[1 << 15], err[1 << 13];
  ASSERT_EQ(cli_as("0", (const char *const[]){"status", "--json", NULL}, out,
                   sizeof out, err, sizeof err),
            0);
  ASSERT_GE(json_all_at_most(out, "used_bytes", total), 3);
  ASSERT_GE(json_all_at_most(out, "peak_bytes", total), 2);
  char want[96];
  snprintf(want, sizeof want, "\"used_bytes\":%llu", (unsigned long long)total);
  ASSERT_CONTAINS(out, want);
  ASSERT_EQ(cli_as("0", (const char *const[]){"metrics", NULL}, out, sizeof out,
                   err, sizeof err),
            0);
  snprintf(want, sizeof want, "} %llu\n", (unsigned long long)total);
  const char *used = strstr(out, "\ncogpu_gpu_used_bytes{");
  ASSERT(used);
  ASSERT(strncmp(strchr(used, '}'), want, strlen(want)) == 0);
  user_end(b);
  /* The jobs' records (written by the daemon's history thread; the
   * joined process, left alone when the job's first one detached, may
   * have one of its own): their peaks are the GPU's total too. */
  for (int t = 0;; t += 20) {
    ASSERT_EQ(cli_as("0", (const char *const[]){"history", "--json", NULL}, out,
                     sizeof out, err, sizeof err),
              0);
    if (occurrences(out, "\"peak_bytes\":") >= 2)
      break;
    ASSERT_LT(t, th_ms(10000));
    th_sleep_ms(20);
  }
  int records = json_all_at_most(out, "peak_bytes", total);
  snprintf(want, sizeof want, "\"peak_bytes\":%llu", (unsigned long long)total);
  ASSERT_EQ(occurrences(out, want), records);
}
