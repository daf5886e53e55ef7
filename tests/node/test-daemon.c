/*
 * test-daemon.c: the node daemon's life: clients across kill -9 and
 * restarts of cogpud under load, a client's own timeout while the daemon
 * does not answer, death of clients, an idle daemon, clients in another
 * PID namespace, and one daemon per socket and daemon_dir (a second one
 * refused, a removed socket not taken for "no daemon"), and a daemon out of
 * descriptors (it sleeps, and serves again). Each test runs against
 * a daemon of its own (the runner's in node mode, one it starts otherwise).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ledger-helpers.h"
#include "node/node.h"
#include "node/proto.h"

/* Every test here runs against a node daemon it starts itself when the
 * runner gives none: once per build. */
TEST_FILE_ONCE()

/* Reserves bytes on gpu at once, or fails the test. */
static void nd_reserve(cogpu_t *h, int gpu, uint64_t bytes) {
  cogpu_request_t r = {.gpu = gpu,
                       .bytes = bytes,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
}

static void nd_begin(void) {
  setenv("COGPU_NODE_MODE", "daemon", 1);
  th_setenv("COGPU_MARGIN", "0");
  if (th_daemon_pid() <= 0)
    th_daemon_start();
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Waits until file `path` exists (a helper's "ready"). */
static void wait_file(const char *path, int ms) {
  for (int t = 0; access(path, F_OK) != 0; t += 5) {
    if (t > th_ms(ms))
      th_fail(__FILE__, __LINE__, "%s did not appear", path);
    th_sleep_ms(5);
  }
}

/* A client that holds 1 GiB, then reserves and releases 256 MiB again and
 * again for ms milliseconds; every call must succeed, and at the end it
 * must still hold exactly its 1 GiB. Exit 0 when all of that held. As
 * the user argv[0] names (lt_user_ids: a user of the node, issue 26). */
HELPER_IMPL(nd_churner) {
  lt_become(argv[0]);
  argv++;
  argc--;
  int ms = atoi(argv[0]);
  cogpu_t *h;
  if (cogpu_attach(NULL, &h) != 0) {
    fprintf(stderr, "churner: attach: %s\n", cogpu_last_error());
    return 10;
  }
  cogpu_request_t base = {.gpu = 0,
                          .bytes = GiB,
                          .priority = COGPU_PRIORITY_DEFAULT,
                          .timeout_ms = 20000};
  if (cogpu_reserve(h, &base, NULL) != 0) {
    fprintf(stderr, "churner: base: %s\n", cogpu_last_error());
    return 11;
  }
  th_write_file(argv[1], "ready");
  uint64_t end = now_ms() + (uint64_t)ms;
  long rounds = 0;
  /* Until the test says stop (argv[2], a file), or for ms at most. */
  const char *stop = argc > 2 ? argv[2] : NULL;
  while (now_ms() < end && (!stop || access(stop, F_OK) != 0)) {
    cogpu_request_t r = base;
    r.bytes = 256 * MiB;
    int rc = cogpu_reserve(h, &r, NULL);
    if (rc == 0)
      rc = cogpu_release(h, 0, 256 * MiB);
    if (rc != 0) {
      fprintf(stderr, "churner: round %ld: %d %s\n", rounds, rc,
              cogpu_last_error());
      return 12;
    }
    rounds++;
  }
  uint64_t held = 0;
  if (cogpu_held(h, 0, &held) != 0 || held != GiB) {
    fprintf(stderr, "churner: holds %llu after %ld rounds: %s\n",
            (unsigned long long)held, rounds, cogpu_last_error());
    return 13;
  }
  fprintf(stderr, "churner: %ld rounds\n", rounds);
  cogpu_detach(h);
  return 0;
}

/* Asks for `gib` GiB with a bound of `ms`: exit 0 when granted. As the
 * user argv[0] names. */
HELPER_IMPL(nd_waiter) {
  (void)argc;
  lt_become(argv[0]);
  argv++;
  cogpu_t *h;
  if (cogpu_attach(NULL, &h) != 0)
    return 10;
  th_write_file(argv[2], "ready");
  cogpu_request_t r = {.gpu = 0,
                       .bytes = (uint64_t)atoi(argv[0]) * GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = atoi(argv[1])};
  int rc = cogpu_reserve(h, &r, NULL);
  if (rc != 0) {
    fprintf(stderr, "waiter: %d %s\n", rc, cogpu_last_error());
    return rc == -ETIMEDOUT ? 3 : 12;
  }
  uint64_t held = 0;
  if (cogpu_held(h, 0, &held) != 0 || held != r.bytes)
    return 13;
  cogpu_detach(h);
  return 0;
}

static uint64_t reserved_now(void) {
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(NULL, &st));
  uint64_t r = st->gpus[0].reserved_bytes;
  cogpu_status_free(st);
  return r;
}

/* The node ends empty (bounded wait). */
static void wait_empty(int ms) {
  for (int t = 0; reserved_now() != 0; t += 20) {
    ASSERT_LT(t, th_ms(ms));
    th_sleep_ms(20);
  }
}

/* kill -9 of cogpud, twice, and a graceful restart, while 6 clients churn
 * and one waits for memory that only frees when they are done: no call
 * fails, every reservation is where it was, the waiter keeps its place
 * and is served, and the node ends empty. */
TEST_IMPL_T(daemon_kill9_under_load, 90) {
  nd_begin();
  enum { N = 6 };
  pid_t c[N];
  char ready[N][4200];
  /* The churners churn until the restarts are done: a fixed 3 s ended
   * before the first check on a loaded machine (TSan). */
  char stop[PATH_MAX];
  snprintf(stop, sizeof stop, "%s", th_path("stop"));
  /* The clients are two users of the node (issue 26): each re-registers
   * as itself after every restart. */
  char ids[2][32];
  snprintf(ids[0], sizeof ids[0], "%s", lt_user_ids(1));
  snprintf(ids[1], sizeof ids[1], "%s", lt_user_ids(2));
  const char *udir = lt_user_dir();
  for (int i = 0; i < N; i++) {
    snprintf(ready[i], sizeof ready[i], "%s/r%d", udir, i);
    c[i] = th_spawn_helper(
        "nd_churner",
        (const char *const[]){ids[i % 2], "60000", ready[i], stop, NULL});
  }
  for (int i = 0; i < N; i++)
    wait_file(ready[i], 10000);
  /* 16 GiB: 6 held, up to 1.5 churning; 10 GiB must wait for them. */
  char wready[4200];
  snprintf(wready, sizeof wready, "%s/w", udir);
  pid_t w = th_spawn_helper(
      "nd_waiter", (const char *const[]){ids[0], "10", "30000", wready, NULL});
  wait_file(wready, 10000);
  th_sleep_ms(300);
  ASSERT_GE(reserved_now(), 6 * GiB);
  th_daemon_stop(SIGKILL);
  th_sleep_ms(200);
  th_daemon_start();
  ASSERT_GE(reserved_now(), 6 * GiB); /* nothing was lost */
  th_sleep_ms(400);
  th_daemon_stop(SIGKILL);
  th_daemon_start();
  th_sleep_ms(400);
  th_daemon_stop(SIGTERM); /* systemctl restart */
  th_daemon_start();
  th_write_file(stop, "");
  for (int i = 0; i < N; i++)
    ASSERT_EQ(th_exit_code(th_wait(c[i], th_ms(30000))), 0);
  ASSERT_EQ(th_exit_code(th_wait(w, th_ms(30000))), 0);
  wait_empty(5000);
}

/* cogpud killed after it queued a request and before it said so (fault
 * point "queued"): the client never learnt its queue entry, and asks the
 * next daemon anew. The entry the old daemon left is the same request:
 * the client gets it, granted once. Before, the new request had an entry
 * of its own, the old one was granted too when memory freed (the
 * recovery keeps entries for their clients), and the process held twice
 * what it asked for (the waiter's own check: exit 13). */
TEST_IMPL(daemon_killed_before_queued_grants_once) {
  nd_begin();
  th_daemon_stop(SIGTERM);
  setenv("COGPU_FAULT", "queued:1", 1);
  th_daemon_start();
  unsetenv("COGPU_FAULT");
  cogpu_t *a = lt_attach(0);
  nd_reserve(a, 0, 15 * GiB);
  char wready[4200];
  snprintf(wready, sizeof wready, "%s/w", lt_user_dir());
  pid_t w = th_spawn_helper(
      "nd_waiter",
      (const char *const[]){lt_user_ids(1), "2", "60000", wready, NULL});
  th_daemon_stop(0); /* the fault point kills it: wait for that */
  th_daemon_start();
  /* The client asks again (its daemon_wait) and waits; 15 GiB freed: 14
   * free would grant both entries. */
  for (int t = 0;; t += 10) {
    cogpu_status_t *st;
    ASSERT_OK(cogpu_status(NULL, &st));
    size_t n = st->gpus[0].nwaiting;
    cogpu_status_free(st);
    if (n >= 1)
      break;
    ASSERT_LT(t, th_ms(30000));
    th_sleep_ms(10);
  }
  ASSERT_OK(cogpu_release(a, 0, 15 * GiB));
  ASSERT_EQ(th_exit_code(th_wait(w, th_ms(30000))), 0);
  cogpu_detach(a);
  wait_empty(5000);
}

/* A job started by `cogpu run --mem` keeps its reservation across a
 * restart of the daemon, and gives it back when it ends. */
TEST_IMPL(daemon_restart_keeps_cogpu_run_job) {
  nd_begin();
  char ready[4200], cmd[4300];
  snprintf(ready, sizeof ready, "%s/ready", lt_user_dir());
  snprintf(cmd, sizeof cmd, "touch %s; sleep 2", ready);
  const char *ids = lt_user_ids(1); /* a user's job (issue 26) */
  pid_t p = fork();
  if (p == 0) {
    lt_become(ids);
    execlp("cogpu", "cogpu", "run", "--mem", "4G", "--", "sh", "-c", cmd,
           (char *)NULL);
    _exit(127);
  }
  wait_file(ready, 10000);
  ASSERT_UEQ(reserved_now(), 4 * GiB);
  th_daemon_stop(SIGKILL);
  th_daemon_start();
  ASSERT_UEQ(reserved_now(), 4 * GiB);
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(20000))), 0);
  wait_empty(5000);
}

/* The client's own clock bounds its wait, whatever the daemon does: with
 * cogpud stopped (SIGSTOP), a request bounded by 400 ms returns
 * -ETIMEDOUT in about that time. */
TEST_IMPL(daemon_stopped_client_timeout_honoured) {
  nd_begin();
  cogpu_t *a = lt_attach(0);
  nd_reserve(a, 0, 15 * GiB);
  cogpu_t *b = lt_attach(0);
  cogpu_request_t r = {.gpu = 0,
                       .bytes = 2 * GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = 400};
  kill(th_daemon_pid(), SIGSTOP);
  uint64_t t0 = now_ms();
  int rc = cogpu_reserve(b, &r, NULL);
  uint64_t took = now_ms() - t0;
  kill(th_daemon_pid(), SIGCONT);
  ASSERT_EQ(rc, -ETIMEDOUT);
  ASSERT_GE(took, 390);
  ASSERT_LE(took, (uint64_t)th_ms(1500));
  /* The cancelled request left nothing behind. */
  ASSERT_UEQ(reserved_now(), 15 * GiB);
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(NULL, &st));
  ASSERT_EQ(st->gpus[0].nwaiting, 0);
  cogpu_status_free(st);
  cogpu_detach(b);
  cogpu_detach(a);
}

/* A client killed outright gives its memory back at once (its connection
 * closes), and its waiting request goes with it. */
TEST_IMPL(daemon_client_death_frees_at_once) {
  nd_begin();
  char ready[4200];
  snprintf(ready, sizeof ready, "%s/ready", lt_user_dir());
  pid_t p = th_spawn_helper(
      "nd_churner",
      (const char *const[]){lt_user_ids(1), "60000", ready, NULL});
  wait_file(ready, 10000);
  ASSERT_GE(reserved_now(), GiB);
  /* The client is the user's, as the daemon sees it (SO_PEERCRED). */
  if (geteuid() == 0) {
    unsigned uid, gid;
    lt_test_user(1, &uid, &gid);
    cogpu_status_t *st;
    ASSERT_OK(cogpu_status(NULL, &st));
    bool found = false;
    for (size_t i = 0; i < st->gpus[0].nclients; i++)
      found |=
          st->gpus[0].clients[i].pid == p && st->gpus[0].clients[i].uid == uid;
    cogpu_status_free(st);
    ASSERT(found);
  }
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  uint64_t t0 = now_ms();
  while (reserved_now() != 0) {
    ASSERT_LT(now_ms() - t0, (uint64_t)th_ms(1000));
    th_sleep_ms(2);
  }
}

/* With clients attached and nothing changing, the daemon sleeps: no CPU
 * time in two seconds (it has no timer while nobody waits). A tick or two
 * is the machine's noise (a loaded host, TSan's runtime), not a wake-up
 * loop, which would cost hundreds. */
TEST_IMPL(daemon_idle_uses_no_cpu) {
  nd_begin();
  cogpu_t *h[8];
  for (int i = 0; i < 8; i++) {
    h[i] = lt_attach(0);
    nd_reserve(h[i], 0, GiB);
  }
  th_sleep_ms(200);
  uint64_t before = lt_cpu_ticks(th_daemon_pid());
  th_sleep_ms(2000);
  uint64_t after = lt_cpu_ticks(th_daemon_pid());
  ASSERT_LE(after - before, 2);
  for (int i = 0; i < 8; i++)
    cogpu_detach(h[i]);
}

/* A client in a PID namespace of its own (a container) is listed by its
 * PID on the host, which is what NVML reports for its GPU memory. */
TEST_IMPL(daemon_pid_namespace_client_host_pid) {
  if (geteuid() != 0)
    SKIP("needs root for a PID namespace (unshare)");
  nd_begin();
  const char *ready = th_path("ready");
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "touch %s; exec sleep 3", ready);
  pid_t p = fork();
  if (p == 0) {
    /* LeakSanitizer cannot stop the world of a PID namespace's init. */
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    execlp("unshare", "unshare", "--pid", "--fork", "cogpu", "run", "--mem",
           "2G", "--", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  wait_file(ready, 10000);
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(NULL, &st));
  ASSERT_EQ(st->gpus[0].nclients, 1);
  int pid = st->gpus[0].clients[0].pid;
  cogpu_status_free(st);
  /* In its namespace cogpu run is PID 1; on the host it is a child of the
   * unshare process this test started. */
  ASSERT_NE(pid, 1);
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  FILE *f = fopen(path, "r");
  ASSERT(f);
  bool found = false;
  while (fgets(buf, sizeof buf, f))
    if (strncmp(buf, "NSpid:", 6) == 0)
      found = strstr(buf, "\t1\n") || strstr(buf, " 1\n");
  fclose(f);
  ASSERT(found); /* the same process: PID 1 inside */
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(20000))), 0);
}

/* --- one daemon per socket and daemon_dir ------------------------------- */

/* Runs a cogpud of the test's environment with extra arguments (NULL-ended)
 * and returns its exit code, its stderr in err. It must end of itself: a
 * daemon that serves fails the test at th_run's bound. */
static int nd_cogpud(const char *const args[], char *err, size_t len) {
  char bin[4200];
  snprintf(bin, sizeof bin, "%s/cogpud", th_build_dir());
  const char *argv[8] = {bin};
  for (int i = 0; args[i] && i < 6; i++)
    argv[i + 1] = args[i];
  static char out[4096];
  return th_run(argv, (const char *const[]){"COGPU_NODE_MODE=", NULL}, out,
                sizeof out, err, len, th_ms(10000));
}

/* A socket at path: listening (as a daemon of another kind would hold
 * it), or connected to whoever listens there. */
static int nd_socket(const char *path, bool listening) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  ASSERT(strlen(path) < sizeof sa.sun_path);
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  if (listening) {
    ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ASSERT_EQ(listen(fd, 16), 0);
  } else {
    ASSERT_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  }
  return fd;
}

static int nd_listen(const char *path) {
  return nd_socket(path, true);
}

static bool nd_is_socket(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode);
}

/* The test's daemon still serves: a client attaches and reserves. */
static void nd_still_serves(void) {
  ASSERT(nd_is_socket(getenv("COGPU_SOCKET")));
  cogpu_t *h = lt_attach(0);
  nd_reserve(h, 0, GiB);
  ASSERT_UEQ(reserved_now(), GiB);
  cogpu_detach(h);
  wait_empty(5000);
}

/* A cogpud started by hand beside the running one refuses to start, naming
 * the running one's pid and what it guards, and leaves it serving: on the
 * same socket and daemon_dir, on the same socket with another daemon_dir
 * (the socket's lock), with the same daemon_dir on another socket (the
 * state's lock). The issue: the second one used to unlink the first's
 * socket, bind its own and unlink that at its exit. */
TEST_IMPL(daemon_second_daemon_refused) {
  nd_begin();
  const char *sock = getenv("COGPU_SOCKET");
  const char *dir = getenv("COGPU_DAEMON_DIR");
  char pid[32], err[8192];
  snprintf(pid, sizeof pid, "pid %d", (int)th_daemon_pid());
  ASSERT_EQ(nd_cogpud((const char *const[]){NULL}, err, sizeof err), 1);
  ASSERT_CONTAINS(err, "another cogpud");
  ASSERT_CONTAINS(err, pid);
  ASSERT_CONTAINS(err, dir);
  nd_still_serves();
  char other_dir[4096], other_sock[4096];
  snprintf(other_dir, sizeof other_dir, "%s", th_path("other-dir"));
  snprintf(other_sock, sizeof other_sock, "%s", th_path("other.sock"));
  ASSERT_EQ(nd_cogpud((const char *const[]){"--state-dir", other_dir, NULL},
                      err, sizeof err),
            1);
  ASSERT_CONTAINS(err, pid);
  ASSERT_CONTAINS(err, sock);
  ASSERT_CONTAINS(err, "take that socket over");
  ASSERT_EQ(access(th_path("other-dir/state"), F_OK), -1);
  nd_still_serves();
  ASSERT_EQ(nd_cogpud((const char *const[]){"--socket", other_sock, NULL}, err,
                      sizeof err),
            1);
  ASSERT_CONTAINS(err, pid);
  ASSERT_CONTAINS(err, "write the same node state");
  ASSERT(!nd_is_socket(other_sock));
  nd_still_serves();
}

/* A socket that answers but whose lock is free (a cogpud of an older
 * version, or anything else listening there) is not taken over either. */
TEST_IMPL(daemon_refuses_answering_socket) {
  nd_begin();
  const char *path = th_path("foreign.sock");
  int fd = nd_listen(path);
  struct stat before, after;
  ASSERT_EQ(stat(path, &before), 0);
  char err[8192], dir[4096];
  snprintf(dir, sizeof dir, "%s", th_path("foreign-dir"));
  ASSERT_EQ(nd_cogpud((const char *const[]){"--socket", path, "--state-dir",
                                            dir, NULL},
                      err, sizeof err),
            1);
  ASSERT_CONTAINS(err, "something answers on");
  ASSERT_EQ(stat(path, &after), 0);
  ASSERT_UEQ(after.st_ino, before.st_ino);
  ASSERT_EQ(access(th_path("foreign-dir/state"), F_OK), -1);
  close(fd);
}

/* The kernel drops a daemon's locks however it dies: after kill -9 (the
 * socket and the lock files left behind) the next daemon starts, serves,
 * and its lock names it. */
TEST_IMPL(daemon_kill9_then_next_starts) {
  nd_begin();
  const char *sock = getenv("COGPU_SOCKET");
  char lock[4200];
  snprintf(lock, sizeof lock, "%s.lock", sock);
  long pid = 0;
  ASSERT(cogpu__node_lock_held(lock, &pid));
  ASSERT_EQ(pid, th_daemon_pid());
  th_daemon_stop(SIGKILL);
  ASSERT(nd_is_socket(sock));
  ASSERT_EQ(access(lock, F_OK), 0);
  ASSERT(!cogpu__node_lock_held(lock, &pid));
  th_daemon_start(); /* fails the test if it refuses */
  ASSERT(cogpu__node_lock_held(lock, &pid));
  ASSERT_EQ(pid, th_daemon_pid());
  nd_still_serves();
}

/* The lock beside the socket is readable by every user (0644), so anyone
 * can take a read lock on it: that neither keeps the next daemon out (a
 * fresh file replaces it) nor makes clients think a daemon lives. The
 * daemon_dir's lock is root's alone (0600). */
TEST_IMPL(daemon_read_lock_keeps_nobody_out) {
  nd_begin();
  char lock[4300], dlock[4300];
  snprintf(lock, sizeof lock, "%s.lock", getenv("COGPU_SOCKET"));
  snprintf(dlock, sizeof dlock, "%s/cogpud.lock", getenv("COGPU_DAEMON_DIR"));
  struct stat sb;
  ASSERT_EQ(stat(lock, &sb), 0);
  ASSERT_EQ(sb.st_mode & 07777, 0644);
  ASSERT_EQ(stat(dlock, &sb), 0);
  ASSERT_EQ(sb.st_mode & 07777, 0600);
  th_daemon_stop(SIGTERM);
  int fd = open(lock, O_RDONLY | O_CLOEXEC);
  ASSERT(fd >= 0);
  struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
  ASSERT_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
  long pid = 0;
  ASSERT(!cogpu__node_lock_held(lock, &pid));
  th_daemon_start(); /* fails the test if it refuses */
  ASSERT(cogpu__node_lock_held(lock, &pid));
  ASSERT_EQ(pid, th_daemon_pid());
  ASSERT_EQ(stat(lock, &sb), 0);
  ASSERT_EQ(sb.st_mode & 07777, 0644);
  nd_still_serves();
  close(fd);
}

/* A daemon that finds at its exit another socket where its own was (bound
 * after its own was removed) leaves it alone. */
TEST_IMPL(daemon_exit_keeps_anothers_socket) {
  nd_begin();
  const char *sock = getenv("COGPU_SOCKET");
  ASSERT_EQ(unlink(sock), 0);
  int fd = nd_listen(sock);
  struct stat before, after;
  ASSERT_EQ(stat(sock, &before), 0);
  th_daemon_stop(SIGTERM);
  ASSERT_EQ(stat(sock, &after), 0);
  ASSERT_UEQ(after.st_ino, before.st_ino);
  close(fd);
}

/* Attaches in the mode the environment says: exit 0 attached, 4 when the
 * daemon cannot be reached (-ECONNREFUSED), 5 otherwise. As uid argv[0]
 * if it is given (needs root). */
HELPER_IMPL(nd_attach_as) {
  if (argc > 0 && (setgroups(0, NULL) != 0 ||
                   setresgid((gid_t)atoi(argv[0]), (gid_t)atoi(argv[0]),
                             (gid_t)atoi(argv[0])) != 0 ||
                   setresuid((uid_t)atoi(argv[0]), (uid_t)atoi(argv[0]),
                             (uid_t)atoi(argv[0])) != 0))
    return 6;
  cogpu_t *h;
  int rc = cogpu_attach(NULL, &h);
  if (rc == 0) {
    cogpu_detach(h);
    return 0;
  }
  fprintf(stderr, "attach: %d %s\n", rc, cogpu_last_error());
  return rc == -ECONNREFUSED ? 4 : 5;
}

/* With node_mode=auto, a daemon whose socket was removed (what the second
 * daemon of the issue did) still means node mode: clients wait for it
 * (daemon_wait) and fail, never make a private ledger, and `cogpu doctor`
 * says what is wrong at once. Once that daemon is gone, auto is single-user
 * mode again. */
TEST_IMPL(daemon_socket_gone_no_private_ledger) {
  nd_begin();
  setenv("COGPU_NODE_MODE", "auto", 1);
  setenv("COGPU_DAEMON_WAIT", "300ms", 1);
  const char *sock = getenv("COGPU_SOCKET");
  char state_dir[4200], ledger[4300];
  snprintf(state_dir, sizeof state_dir, "%s", getenv("COGPU_STATE_DIR"));
  snprintf(ledger, sizeof ledger, "%s/state", state_dir);
  ASSERT_EQ(unlink(sock), 0);
  cogpu_t *h;
  ASSERT_EQ(cogpu_attach(NULL, &h), -ECONNREFUSED);
  ASSERT_CONTAINS(cogpu_last_error(), "cannot reach the node daemon");
  cogpu_status_t *st;
  ASSERT_EQ(cogpu_status(NULL, &st), -ECONNREFUSED);
  static char out[1 << 16], err[1 << 14];
  int rc = th_run(
      (const char *const[]){"cogpu", "run", "--mem", "1G", "--", "true", NULL},
      NULL, out, sizeof out, err, sizeof err, th_ms(10000));
  ASSERT_NE(rc, 0);
  ASSERT_CONTAINS(err, "cannot reach the node daemon");
  rc = th_run((const char *const[]){"cogpu", "doctor", NULL}, NULL, out,
              sizeof out, err, sizeof err, th_ms(10000));
  ASSERT_NE(rc, 0);
  ASSERT_CONTAINS(out, "is gone");
  /* Another user, who cannot read daemon_dir, tells it by the lock beside
   * the socket (mode 0644). */
  if (geteuid() == 0) {
    ASSERT_EQ(chmod(th_tmpdir(), 0711), 0);
    ASSERT_EQ(chmod(getenv("COGPU_DAEMON_DIR"), 0700), 0);
    ASSERT_EQ(mkdir(th_path("nobody"), 0700), 0);
    ASSERT_EQ(chown(th_path("nobody"), 65534, 65534), 0);
    setenv("COGPU_STATE_DIR", th_path("nobody"), 1);
    pid_t p =
        th_spawn_helper("nd_attach_as", (const char *const[]){"65534", NULL});
    ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 4);
    ASSERT_EQ(access(th_path("nobody/state"), F_OK), -1);
  }
  ASSERT_EQ(access(ledger, F_OK), -1);
  /* The daemon's locks go with it: no daemon, single-user mode. */
  th_daemon_stop(SIGKILL);
  if (geteuid() == 0) {
    pid_t p =
        th_spawn_helper("nd_attach_as", (const char *const[]){"65534", NULL});
    ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 0);
    ASSERT_EQ(access(th_path("nobody/state"), F_OK), 0);
  }
  setenv("COGPU_STATE_DIR", state_dir, 1);
  ASSERT_OK(cogpu_attach(NULL, &h));
  ASSERT_EQ(access(ledger, F_OK), 0);
  cogpu_detach(h);
}

/* A socket-activated cogpud (LISTEN_FDS, as systemd starts it) takes the
 * locks too: beside a running daemon it refuses; alone it holds the
 * socket's lock, so a daemon started by hand on that socket refuses. */
TEST_IMPL(daemon_socket_activated_takes_locks) {
  nd_begin();
  char act[4200], errf[4200], bin[4200];
  snprintf(act, sizeof act, "%s", th_path("act.sock"));
  snprintf(errf, sizeof errf, "%s", th_path("act.err"));
  snprintf(bin, sizeof bin, "%s/cogpud", th_build_dir());
  for (int round = 0; round < 2; round++) {
    pid_t p = fork();
    if (p == 0) {
      int fd = nd_listen(act);
      /* dup2 onto itself would keep close-on-exec. */
      if (fd == 3 ? fcntl(fd, F_SETFD, 0) != 0 : dup2(fd, 3) != 3)
        _exit(120);
      int e = open(errf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (e < 0 || dup2(e, 2) != 2)
        _exit(121);
      char pid[32];
      snprintf(pid, sizeof pid, "%d", (int)getpid());
      setenv("LISTEN_PID", pid, 1);
      setenv("LISTEN_FDS", "1", 1);
      setenv("COGPU_SOCKET", act, 1);
      unsetenv("COGPU_NODE_MODE");
      execl(bin, "cogpud", (char *)NULL);
      _exit(127);
    }
    if (round == 0) {
      /* Beside the test's daemon: the same daemon_dir. */
      ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 1);
      FILE *f = fopen(errf, "r");
      ASSERT(f);
      char buf[4096] = "";
      size_t n = fread(buf, 1, sizeof buf - 1, f);
      buf[n] = 0;
      fclose(f);
      ASSERT_CONTAINS(buf, "write the same node state");
      ASSERT_EQ(unlink(act), 0);
      th_daemon_stop(SIGTERM);
      continue;
    }
    /* Alone: it serves, and holds the lock beside its socket. */
    char lock[4300];
    snprintf(lock, sizeof lock, "%s.lock", act);
    long pid = 0;
    for (int t = 0; !cogpu__node_lock_held(lock, &pid); t += 5) {
      ASSERT_LT(t, th_ms(10000));
      th_sleep_ms(5);
    }
    ASSERT_EQ(pid, p);
    /* It answers (so it also handles SIGTERM by now), within 10 s. */
    setenv("COGPU_DAEMON_WAIT", "10s", 1);
    char sock[4200];
    snprintf(sock, sizeof sock, "%s", getenv("COGPU_SOCKET"));
    setenv("COGPU_SOCKET", act, 1);
    cogpu_status_t *st;
    ASSERT_OK(cogpu_status(NULL, &st));
    cogpu_status_free(st);
    setenv("COGPU_SOCKET", sock, 1);
    char err[8192], dir[4096];
    snprintf(dir, sizeof dir, "%s", th_path("hand-dir"));
    ASSERT_EQ(nd_cogpud((const char *const[]){"--socket", act, "--state-dir",
                                              dir, NULL},
                        err, sizeof err),
              1);
    ASSERT_CONTAINS(err, "take that socket over");
    ASSERT(nd_is_socket(act));
    kill(p, SIGTERM);
    ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 0);
  }
}

/* --- out of descriptors ------------------------------------------------- */

static int nd_connect(const char *path) {
  return nd_socket(path, false);
}

static char *nd_slurp(const char *path) {
  static char buf[1 << 16];
  buf[0] = 0;
  FILE *f = fopen(path, "re");
  if (f) {
    buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
    fclose(f);
  }
  return buf;
}

static int nd_occurrences(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

/* With every descriptor it may open in use, cogpud stops accepting until
 * one is freed: it used to return from accept on EMFILE, and its listening
 * socket, still readable, woke the loop again at once, forever (86 % of a
 * CPU, no client served; issue 23). A daemon started with a low
 * RLIMIT_NOFILE gets more connections than it can take: it sleeps, says
 * so once, keeps serving the clients it has, and takes new ones once
 * connections close. */
TEST_IMPL_ONCE_T(daemon_descriptor_limit_no_spin, 60) {
  setenv("COGPU_NODE_MODE", "daemon", 1);
  th_daemon_stop(SIGTERM);
  const rlim_t limit = 64;
  char bin[4200], sock[4200], dir[4200], log[4200];
  snprintf(bin, sizeof bin, "%s/cogpud", th_build_dir());
  snprintf(sock, sizeof sock, "%s", th_path("lim.sock"));
  snprintf(dir, sizeof dir, "%s", th_path("lim-dir"));
  snprintf(log, sizeof log, "%s", th_path("lim.log"));
  pid_t d = fork();
  if (d == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    struct rlimit rl = {limit, limit};
    if (fd < 0 || dup2(fd, 2) != 2 || setrlimit(RLIMIT_NOFILE, &rl) != 0)
      _exit(120);
    unsetenv("COGPU_NODE_MODE");
    setenv("COGPU_LOG", "info", 1);
    execl(bin, "cogpud", "--socket", sock, "--state-dir", dir, (char *)NULL);
    _exit(127);
  }
  setenv("COGPU_SOCKET", sock, 1);
  setenv("COGPU_DAEMON_WAIT", "10s", 1);
  for (int t = 0; !strstr(nd_slurp(log), "cogpud ready"); t += 10) {
    ASSERT_LT(t, th_ms(10000));
    th_sleep_ms(10);
  }
  cogpu_t *h = lt_attach(0);
  /* More connections than it has descriptors left: the rest wait in the
   * listening socket's backlog. */
  int n = (int)limit - lt_fd_count(d) + 32;
  ASSERT_GT(n, 32);
  int *fds = calloc((size_t)n, sizeof *fds);
  ASSERT(fds);
  for (int i = 0; i < n; i++)
    fds[i] = nd_connect(sock);
  for (int t = 0; lt_fd_count(d) < (int)limit; t += 10) {
    ASSERT_LT(t, th_ms(10000));
    th_sleep_ms(10);
  }
  th_sleep_ms(200);
  /* It sleeps: a spin costs about 200 ticks in 2 s. */
  uint64_t t0 = lt_cpu_ticks(d);
  th_sleep_ms(2000);
  uint64_t spent = lt_cpu_ticks(d) - t0;
  ASSERT_LT(spent, 50);
  ASSERT_EQ(nd_occurrences(nd_slurp(log), "out of descriptors"), 1);
  /* Its clients are served meanwhile. */
  nd_reserve(h, 0, GiB);
  ASSERT_OK(cogpu_release(h, 0, GiB));
  /* Connections close: new clients are served again. */
  for (int i = 0; i < n; i++)
    close(fds[i]);
  free(fds);
  cogpu_t *h2 = lt_attach(0);
  nd_reserve(h2, 0, GiB);
  ASSERT_UEQ(reserved_now(), GiB);
  cogpu_detach(h2);
  cogpu_detach(h);
  ASSERT_CONTAINS(nd_slurp(log), "accepting connections again");
  kill(d, SIGTERM);
  ASSERT_EQ(th_exit_code(th_wait(d, th_ms(10000))), 0);
}

/* --- rolling upgrades (issue 28, item 5) ---------------------------------
 * A node is upgraded one process at a time: cogpud restarts from the new
 * package while jobs keep running on the old library. cogpud serves the
 * previous protocol version beside its own, and a client that cannot be
 * served says what to upgrade (proto.h, "Versions"). An old client is this
 * build speaking COGPU_PROTO_VERSION_MIN (its requests are laid out as
 * that release's were); an old daemon is simulated by a socket that does
 * what cogpud 0.1.0 did. */

/* One message of version v on a new connection, and the answer's header:
 * 1 answered (in *r), 0 closed without an answer; the descriptor passed
 * with it in *passed (-1 if none), when passed is not NULL. */
static int nd_raw_ask_fd(int type, uint16_t v, cogpu__msg_t *r, int *passed) {
  int fd = nd_connect(getenv("COGPU_SOCKET"));
  cogpu__msg_t m;
  cogpu__msg_init(&m, type, 7);
  m.version = v;
  ASSERT_EQ(send(fd, &m, sizeof m, MSG_NOSIGNAL), (ssize_t)sizeof m);
  struct pollfd p = {.fd = fd, .events = POLLIN};
  ASSERT_EQ(poll(&p, 1, th_ms(10000)), 1);
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = r, .iov_len = sizeof *r};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = cbuf,
                      .msg_controllen = sizeof cbuf};
  ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
  if (passed)
    *passed = -1;
  if (n > 0)
    cogpu__msg_fds(&mh, passed);
  close(fd);
  if (n <= 0)
    return 0;
  ASSERT_EQ(n, (ssize_t)sizeof *r);
  return 1;
}

static int nd_raw_ask(int type, uint16_t v, cogpu__msg_t *r) {
  return nd_raw_ask_fd(type, v, r, NULL);
}

/* The snapshot a STATUS of protocol v is answered with: its version and
 * size, after checking that it parses. */
static unsigned nd_snapshot_of(uint16_t v, size_t *size) {
  cogpu__msg_t r;
  int fd = -1;
  ASSERT_EQ(nd_raw_ask_fd(COGPU_M_STATUS, v, &r, &fd), 1);
  ASSERT_EQ(r.rc, 0);
  ASSERT(fd >= 0);
  struct stat sb;
  ASSERT_EQ(fstat(fd, &sb), 0);
  char *buf = malloc((size_t)sb.st_size);
  ASSERT(buf != NULL);
  ASSERT_EQ(pread(fd, buf, (size_t)sb.st_size, 0), sb.st_size);
  close(fd);
  cogpu_status_t *st = calloc(1, sizeof *st);
  ASSERT(st != NULL);
  ASSERT_OK(cogpu__snap_parse(buf, (size_t)sb.st_size, st));
  cogpu_status_free(st);
  unsigned ver = ((const cogpu__snap_hdr_v3_t *)(const void *)buf)->version;
  free(buf);
  *size = (size_t)sb.st_size;
  return ver;
}

/* A client of the previous protocol is served all the way (attach,
 * reserve, status, release), answered in its own layout; the current one
 * gets the daemon's release in its replies. */
TEST_IMPL(daemon_serves_previous_protocol) {
  nd_begin();
  cogpu__msg_t r;
  ASSERT_EQ(nd_raw_ask(COGPU_M_STATUS, COGPU_PROTO_VERSION_MIN, &r), 1);
  ASSERT_EQ(r.version, COGPU_PROTO_VERSION_MIN);
  ASSERT_EQ(r.rc, 0);
  char zero[sizeof r.u.reply.release] = {0};
  ASSERT(memcmp(r.u.reply.release, zero, sizeof zero) == 0);
  ASSERT_EQ(nd_raw_ask(COGPU_M_STATUS, COGPU_PROTO_VERSION, &r), 1);
  ASSERT_EQ(r.version, COGPU_PROTO_VERSION);
  ASSERT_STREQ(r.u.reply.release, COGPU_VERSION_STRING);
  /* The snapshot in the layout each reads: cogpu 0.1.0 refuses any other
   * size than version 3's (an idle node: a header and one GPU record). */
  size_t size = 0;
  ASSERT_UEQ(nd_snapshot_of(COGPU_PROTO_VERSION_MIN, &size),
             COGPU_SNAP_VERSION_V3);
  ASSERT_UEQ(size, sizeof(cogpu__snap_hdr_v3_t) + sizeof(cogpu__snap_gpu_t));
  ASSERT_UEQ(nd_snapshot_of(COGPU_PROTO_VERSION, &size), COGPU_SNAP_VERSION);
  ASSERT_UEQ(size, sizeof(cogpu__snap_hdr_t) + sizeof(cogpu__snap_gpu_t));

  cogpu__proto_client_version = COGPU_PROTO_VERSION_MIN;
  cogpu_t *h;
  ASSERT_OK(cogpu_attach(NULL, &h));
  nd_reserve(h, 0, GiB);
  uint64_t held = 0;
  ASSERT_OK(cogpu_held(h, 0, &held));
  ASSERT_UEQ(held, GiB);
  ASSERT_UEQ(reserved_now(), GiB); /* STATUS, on a query connection */
  ASSERT_OK(cogpu_release(h, 0, GiB));
  cogpu_detach(h);
  cogpu__proto_client_version = COGPU_PROTO_VERSION;
  wait_empty(5000);
}

/* A version outside the daemon's two is refused with a reply every
 * version reads, and the client says what to upgrade: cogpud when the
 * client is newer, the program when it is older than cogpud serves. */
TEST_IMPL(daemon_refuses_other_protocol_clearly) {
  nd_begin();
  cogpu__msg_t r;
  ASSERT_EQ(nd_raw_ask(COGPU_M_ATTACH, COGPU_PROTO_VERSION + 1, &r), 1);
  ASSERT(cogpu__msg_is_refusal(&r, sizeof r));
  ASSERT_EQ(r.version, COGPU_PROTO_VERSION);
  ASSERT_UEQ(r.u.reply.a, COGPU_PROTO_VERSION_MIN);
  ASSERT_UEQ(r.u.reply.b, COGPU_PROTO_VERSION);
  ASSERT_STREQ(r.u.reply.msg, COGPU_VERSION_STRING);

  cogpu_t *h;
  cogpu__proto_client_version = COGPU_PROTO_VERSION + 1;
  ASSERT_EQ(cogpu_attach(NULL, &h), -EPROTONOSUPPORT);
  fprintf(stderr, "# %s\n", cogpu_last_error());
  ASSERT_CONTAINS(cogpu_last_error(), "cogpud is older than this program");
  ASSERT_CONTAINS(cogpu_last_error(), "Upgrade the cogpu package");
  cogpu_status_t *st;
  ASSERT_EQ(cogpu_status(NULL, &st), -EPROTONOSUPPORT);
  ASSERT_CONTAINS(cogpu_last_error(), "cogpud is older than this program");
  cogpu__proto_client_version = COGPU_PROTO_VERSION_MIN - 1;
  ASSERT_EQ(cogpu_attach(NULL, &h), -EPROTONOSUPPORT);
  fprintf(stderr, "# %s\n", cogpu_last_error());
  ASSERT_CONTAINS(cogpu_last_error(), "no longer accepts");
  ASSERT_CONTAINS(cogpu_last_error(), "upgrade this program");
  cogpu__proto_client_version = COGPU_PROTO_VERSION;
  /* Nothing else changed: the node serves. */
  ASSERT_OK(cogpu_attach(NULL, &h));
  nd_reserve(h, 0, GiB);
  cogpu_detach(h);
  wait_empty(5000);
}

/* What cogpud 0.1.0 (protocol 2) does: it answers a request of its own
 * version, and ends a connection of any other without a word. */
typedef struct {
  int lfd;
  int stop[2]; /* a pipe: closing its write end stops the thread */
  int conns;   /* connections served */
} nd_old_daemon_t;

static void *nd_old_daemon(void *arg) {
  nd_old_daemon_t *o = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = o->lfd, .events = POLLIN},
                          {.fd = o->stop[0], .events = POLLIN}};
    if (poll(p, 2, -1) < 0 || p[1].revents)
      return NULL;
    int fd = accept4(o->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      return NULL;
    o->conns++;
    cogpu__msg_t m;
    if (recv(fd, &m, sizeof m, 0) == (ssize_t)sizeof m && m.version == 2) {
      cogpu__msg_t r;
      memset(&r, 0, sizeof r);
      r.magic = COGPU_PROTO_MAGIC;
      r.version = 2;
      r.type = COGPU_M_REPLY;
      r.seq = m.seq;
      send(fd, &r, sizeof r, MSG_NOSIGNAL);
    }
    close(fd);
  }
}

/* A client newer than cogpud 0.1.0, which ends the connection without a
 * word, finds out that the daemon speaks protocol 2 and says to upgrade
 * it: it never runs on a ledger of its own. */
TEST_IMPL(daemon_client_names_old_daemon) {
  const char *sock = th_path("old.sock");
  nd_old_daemon_t o = {.lfd =
                           socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)};
  ASSERT(o.lfd >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
  ASSERT_EQ(bind(o.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  ASSERT_EQ(listen(o.lfd, 8), 0);
  ASSERT_EQ(pipe2(o.stop, O_CLOEXEC), 0);
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, nd_old_daemon, &o), 0);
  char saved[4200];
  snprintf(saved, sizeof saved, "%s", getenv("COGPU_SOCKET"));
  setenv("COGPU_SOCKET", sock, 1);
  setenv("COGPU_NODE_MODE", "daemon", 1);
  cogpu__proto_client_version = 3; /* the release after 0.1.0 */
  cogpu_t *h;
  ASSERT_EQ(cogpu_attach(NULL, &h), -EPROTONOSUPPORT);
  fprintf(stderr, "# %s\n", cogpu_last_error());
  ASSERT_CONTAINS(cogpu_last_error(),
                  "cogpud on this node speaks node protocol 2 (cogpu 0.1.0");
  ASSERT_CONTAINS(cogpu_last_error(), "Upgrade the cogpu package");
  cogpu_status_t *st;
  ASSERT_EQ(cogpu_status(NULL, &st), -EPROTONOSUPPORT);
  ASSERT_CONTAINS(cogpu_last_error(), "speaks node protocol 2");
  cogpu__proto_client_version = COGPU_PROTO_VERSION;
  close(o.stop[1]);
  pthread_join(t, NULL);
  close(o.stop[0]);
  close(o.lfd);
  /* Each: the request, then the same asked in 3 and in 2. */
  ASSERT_EQ(o.conns, 6);
  setenv("COGPU_SOCKET", saved, 1);
}

/* A job of the previous release holds a reservation; the package upgrade
 * restarts cogpud (SIGTERM and start, as systemctl restart does) into
 * this release: the job keeps its reservation, re-registers in its own
 * protocol, and reserves and releases as before. */
HELPER_IMPL(nd_old_job) {
  (void)argc;
  lt_become(argv[0]); /* a user's job (issue 26) */
  argv++;
  cogpu__proto_client_version = COGPU_PROTO_VERSION_MIN;
  cogpu_t *h;
  if (cogpu_attach(NULL, &h) != 0) {
    fprintf(stderr, "old job: attach: %s\n", cogpu_last_error());
    return 10;
  }
  cogpu_request_t r = {.gpu = 0,
                       .bytes = GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  if (cogpu_reserve(h, &r, NULL) != 0)
    return 11;
  th_write_file(argv[0], "ready");
  for (int t = 0; access(argv[1], F_OK) != 0; t += 10) {
    if (t > 30000)
      return 12;
    th_sleep_ms(10);
  }
  uint64_t held = 0;
  if (cogpu_held(h, 0, &held) != 0 || held != GiB)
    return 13;
  r.bytes = 256 * MiB;
  if (cogpu_reserve(h, &r, NULL) != 0 || cogpu_held(h, 0, &held) != 0 ||
      held != GiB + 256 * MiB || cogpu_release(h, 0, 256 * MiB) != 0) {
    fprintf(stderr, "old job: after the restart: %s\n", cogpu_last_error());
    return 14;
  }
  cogpu_detach(h);
  return 0;
}

TEST_IMPL(daemon_upgrade_keeps_old_job) {
  nd_begin();
  char ready[4200], go[4200];
  snprintf(ready, sizeof ready, "%s/ready", lt_user_dir());
  snprintf(go, sizeof go, "%s", th_path("go"));
  pid_t p = th_spawn_helper(
      "nd_old_job", (const char *const[]){lt_user_ids(1), ready, go, NULL});
  wait_file(ready, 10000);
  ASSERT_UEQ(reserved_now(), GiB);
  th_daemon_stop(SIGTERM);
  th_daemon_start();
  ASSERT_UEQ(reserved_now(), GiB);
  th_write_file(go, "go");
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(30000))), 0);
  wait_empty(5000);
}

/* --- the status snapshot's codec (proto.h, snap.c) ----------------------
 * Every field of the lists, set to a value of its own, comes back from
 * build and parse; a snapshot whose framing or checked fields are wrong is
 * refused. The fill and the check walk the same lists as the codec, so a
 * field added there is covered here without a line of its own. */

/* A value of its own for each field: k counts them. */
#define SF(kind, ...) SF_##kind(__VA_ARGS__)
#define SF_NUM(type, name, status) s->status = (type)(++*k);
#define SF_STR(size, name, status)                                             \
  snprintf(s->status, sizeof s->status, "%s-%d", #name, ++*k);
#define SF_ARR(type, n, name, status)                                          \
  for (int i_ = 0; i_ < (n); i_++)                                             \
    s->status[i_] = (type)(++*k);
#define SF_BOUNDS(type, n, name, status)                                       \
  for (int i_ = 0; i_ < (n); i_++)                                             \
    s->status[i_] = i_ == (n)-1 ? UINT64_MAX : (type)(++*k);
#define SF_USEC(type, name, status) s->status = ++*k + 0.25;
#define SF_OWN(type, name, status) s->status = true;
#define SF_ENUM(type, name, status, max) s->status = (max);
#define SF_FRAME(type, name)
#define SF_PAD(type, name)

/* Each field of d as in s (the fill above) or the test fails. */
#define SC(kind, ...) SC_##kind(__VA_ARGS__)
#define SC_NUM(type, name, status)                                             \
  if ((type)d->status != (type)s->status)                                      \
    th_fail(__FILE__, __LINE__, "snapshot field %s lost", #name);
#define SC_STR(size, name, status)                                             \
  if (strcmp(d->status, s->status) != 0)                                       \
    th_fail(__FILE__, __LINE__, "snapshot field %s lost", #name);
#define SC_ARR(type, n, name, status)                                          \
  for (int i_ = 0; i_ < (n); i_++)                                             \
    if (d->status[i_] != s->status[i_])                                        \
      th_fail(__FILE__, __LINE__, "snapshot field %s[%d] lost", #name, i_);
#define SC_BOUNDS SC_ARR
#define SC_USEC(type, name, status)                                            \
  if (d->status < s->status - 1e-6 || d->status > s->status + 1e-6)            \
    th_fail(__FILE__, __LINE__, "snapshot field %s lost", #name);
#define SC_OWN(type, name, status) SC_NUM(bool, name, status)
#define SC_ENUM(type, name, status, max) SC_NUM(int, name, status)
#define SC_FRAME(type, name)
#define SC_PAD(type, name)

static void sn_fill_hdr(cogpu_status_t *s, int *k) {
  COGPU_SNAP_HDR(SF)
}
static void sn_fill_gpu(cogpu_gpu_info_t *s, int *k) {
  COGPU_SNAP_GPU(SF)
}
static void sn_fill_client(cogpu_client_info_t *s, int *k) {
  COGPU_SNAP_CLIENT(SF)
}
static void sn_fill_waiter(cogpu_waiter_info_t *s, int *k) {
  COGPU_SNAP_WAITER(SF)
}
static void sn_check_hdr(const cogpu_status_t *d, const cogpu_status_t *s) {
  COGPU_SNAP_HDR(SC)
}
static void sn_check_gpu(const cogpu_gpu_info_t *d, const cogpu_gpu_info_t *s) {
  COGPU_SNAP_GPU(SC)
}
static void sn_check_client(const cogpu_client_info_t *d,
                            const cogpu_client_info_t *s) {
  COGPU_SNAP_CLIENT(SC)
}
static void sn_check_waiter(const cogpu_waiter_info_t *d,
                            const cogpu_waiter_info_t *s) {
  COGPU_SNAP_WAITER(SC)
}

/* Parses size bytes of p into a fresh status: parse's code. */
static int sn_parse(const char *p, size_t size) {
  cogpu_status_t *st = calloc(1, sizeof *st);
  ASSERT(st != NULL);
  int rc = cogpu__snap_parse(p, size, st);
  cogpu_status_free(st);
  return rc;
}

TEST_IMPL(daemon_snapshot_codec) {
  /* Two GPUs: the first with two clients and a waiter, the second with
   * one client and two waiters, so that records are regrouped by GPU. */
  static const size_t nc[2] = {2, 1}, nw[2] = {1, 2};
  cogpu_gpu_info_t gpus[2];
  cogpu_client_info_t clients[3];
  cogpu_waiter_info_t waiters[3];
  cogpu_status_t s;
  memset(&s, 0, sizeof s);
  memset(gpus, 0, sizeof gpus);
  memset(clients, 0, sizeof clients);
  memset(waiters, 0, sizeof waiters);
  int k = 0;
  sn_fill_hdr(&s, &k);
  s.ngpus = 2;
  s.gpus = gpus;
  for (int g = 0, c = 0, w = 0; g < 2; g++) {
    sn_fill_gpu(&gpus[g], &k);
    gpus[g].clients = &clients[c];
    gpus[g].nclients = nc[g];
    for (size_t i = 0; i < nc[g]; i++)
      sn_fill_client(&clients[c++], &k);
    gpus[g].waiting = &waiters[w];
    gpus[g].nwaiting = nw[g];
    for (size_t i = 0; i < nw[g]; i++)
      sn_fill_waiter(&waiters[w++], &k);
  }
  char *buf = NULL;
  size_t size = 0;
  /* Version 3 (for clients of protocol 2, cogpu 0.1.0): its fields come
   * back, the checkpoint counters it lacks read as 0. */
  ASSERT_EQ(cogpu__snap_build(&s, 5, &buf, &size), -EINVAL);
  ASSERT_OK(cogpu__snap_build(&s, COGPU_SNAP_VERSION_V3, &buf, &size));
  ASSERT_UEQ(size, 1048 + 2 * 264 + 3 * 280 + 3 * 240);
  cogpu_status_t *d = calloc(1, sizeof *d);
  ASSERT(d != NULL);
  ASSERT_OK(cogpu__snap_parse(buf, size, d));
  {
    cogpu_status_t v3 = s;
    v3.counters.checkpoint_bytes = 0;
    v3.counters.checkpoint_seconds = 0;
    sn_check_hdr(d, &v3);
    sn_check_gpu(&d->gpus[1], &gpus[1]);
    sn_check_waiter(&d->gpus[1].waiting[1], &gpus[1].waiting[1]);
  }
  cogpu_status_free(d);
  free(buf);
  /* Version 4, which clients of protocol 3 read. */
  ASSERT_OK(cogpu__snap_build(&s, COGPU_SNAP_VERSION, &buf, &size));
  ASSERT_UEQ(size, 1064 + 2 * 264 + 3 * 280 + 3 * 240);
  d = calloc(1, sizeof *d);
  ASSERT(d != NULL);
  ASSERT_OK(cogpu__snap_parse(buf, size, d));
  sn_check_hdr(d, &s);
  ASSERT_UEQ(d->ngpus, 2);
  for (int g = 0; g < 2; g++) {
    sn_check_gpu(&d->gpus[g], &gpus[g]);
    ASSERT_UEQ(d->gpus[g].nclients, nc[g]);
    ASSERT_UEQ(d->gpus[g].nwaiting, nw[g]);
    for (size_t i = 0; i < nc[g]; i++)
      sn_check_client(&d->gpus[g].clients[i], &gpus[g].clients[i]);
    for (size_t i = 0; i < nw[g]; i++)
      sn_check_waiter(&d->gpus[g].waiting[i], &gpus[g].waiting[i]);
  }
  cogpu_status_free(d);

  /* Refused: a size other than the counts say, either way; a record of a
   * GPU the snapshot does not have; bounds that do not rise, or do not
   * end at +Inf; another version. An enumeration out of range reads as
   * its first value. */
  ASSERT_EQ(sn_parse(buf, size - 1), -EPROTO);
  ASSERT_EQ(sn_parse(buf, sizeof(cogpu__snap_hdr_t) - 1), -EPROTO);
  char *bad = malloc(size + 8);
  ASSERT(bad != NULL);
  memcpy(bad, buf, size);
  memset(bad + size, 0, 8);
  ASSERT_EQ(sn_parse(bad, size + 8), -EPROTO);
  cogpu__snap_hdr_t *h = (void *)bad;
  cogpu__snap_client_t *c0 =
      (void *)(bad + sizeof *h + 2 * sizeof(cogpu__snap_gpu_t));
  cogpu__snap_waiter_t *w0 = (void *)(c0 + 3);
  h->nclients = 4;
  ASSERT_EQ(sn_parse(bad, size), -EPROTO);
  h->nclients = 3;
  c0[1].gpu = 2;
  ASSERT_EQ(sn_parse(bad, size), -EPROTO);
  c0[1].gpu = 0;
  w0[2].gpu = UINT32_MAX;
  ASSERT_EQ(sn_parse(bad, size), -EPROTO);
  w0[2].gpu = 1;
  h->wait_le_ms[3] = h->wait_le_ms[2];
  ASSERT_EQ(sn_parse(bad, size), -EPROTO);
  h->wait_le_ms[3] = h->wait_le_ms[2] + 1;
  h->wait_le_ms[COGPU_WAIT_BUCKETS - 1] = UINT64_MAX - 1;
  ASSERT_EQ(sn_parse(bad, size), -EPROTO);
  h->wait_le_ms[COGPU_WAIT_BUCKETS - 1] = UINT64_MAX;
  h->version = COGPU_SNAP_VERSION + 1;
  ASSERT_EQ(sn_parse(bad, size), -EPROTO);
  h->version = COGPU_SNAP_VERSION;
  h->ngpus = 1000;
  ASSERT_EQ(sn_parse(bad, size), -EPROTO);
  h->ngpus = 2;
  ASSERT_OK(sn_parse(bad, size)); /* every change undone */
  /* A state this build knows is read; one it does not (a newer daemon's)
   * reads as running, as a client of the previous protocol reads
   * "exiting". */
  c0[0].state = COGPU_JOB_EXITING;
  d = calloc(1, sizeof *d);
  ASSERT(d != NULL);
  ASSERT_OK(cogpu__snap_parse(bad, size, d));
  ASSERT_EQ(d->gpus[0].clients[0].state, COGPU_JOB_EXITING);
  cogpu_status_free(d);
  c0[0].state = COGPU_JOB_EXITING + 1;
  d = calloc(1, sizeof *d);
  ASSERT(d != NULL);
  ASSERT_OK(cogpu__snap_parse(bad, size, d));
  ASSERT_EQ(d->gpus[0].clients[0].state, COGPU_JOB_RUNNING);
  cogpu_status_free(d);
  free(bad);
  free(buf);
}

/* --- fault points of the daemon and the node client (issue 23) ----------
 * Each makes one operation fail once (COGPU_FAULT=NAME:N:fail): the one
 * asking gets a clear error or is served late, cogpud lives on, and the
 * next request is served. Clients run as an unprivileged user. */

/* cogpud again, with COGPU_FAULT=spec (its own only). */
static void nd_daemon_with_fault(const char *spec) {
  setenv("COGPU_NODE_MODE", "daemon", 1);
  th_daemon_stop(SIGTERM);
  char *log = getenv("COGPU_LOG") ? strdup(getenv("COGPU_LOG")) : NULL;
  setenv("COGPU_FAULT", spec, 1);
  setenv("COGPU_LOG", "info", 1); /* what it says of the failure */
  th_daemon_start();
  unsetenv("COGPU_FAULT");
  if (log)
    setenv("COGPU_LOG", log, 1);
  else
    unsetenv("COGPU_LOG");
  free(log);
}

/* `cogpu status` as test user 1, with COGPU_FAULT=fault (NULL: none) in its
 * environment: its exit code; its output in th_path("st"). */
static int nd_status_as_user(const char *fault) {
  static const char *as[64];
  const char *argv[] = {"cogpu", "status", NULL};
  if (fault)
    setenv("COGPU_FAULT", fault, 1);
  pid_t p = lt_spawn_logged("st", lt_as_user(1, argv, as, 64));
  unsetenv("COGPU_FAULT");
  return th_exit_code(th_wait(p, th_ms(20000)));
}

/* Waits (bounded) until cogpud's log says what; fails the test if not. */
static void nd_log_says(const char *what) {
  for (int t = 0; !strstr(lt_slurp("cogpud.log"), what); t += 10) {
    if (t > th_ms(10000))
      th_fail(__FILE__, __LINE__, "cogpud never said '%s': %s", what,
              lt_slurp("cogpud.log"));
    th_sleep_ms(10);
  }
}

/* cogpud runs out of descriptors at accept (EMFILE): it stops polling its
 * socket instead of spinning, says so, and takes the waiting connection
 * when it tries again: the client is served, late. */
TEST_IMPL(daemon_fault_accept_emfile) {
  nd_daemon_with_fault("accept:1:fail");
  pid_t dp = th_daemon_pid();
  /* The first connection (the start's own, or this status) is refused. */
  ASSERT_EQ(nd_status_as_user(NULL), 0);
  nd_log_says("out of descriptors (Too many open files");
  nd_log_says("accepting connections again");
  ASSERT_EQ(nd_status_as_user(NULL), 0);
  ASSERT_CONTAINS(lt_slurp("st"), "GPU");
  ASSERT_EQ(th_daemon_pid(), dp);
  ASSERT_EQ(kill(dp, 0), 0);
}

/* A status the daemon cannot build (out of memory) or pass (a short write
 * to its memfd) fails with the daemon's reason, and the next is served. */
static void nd_status_fault(const char *spec, const char *says) {
  nd_daemon_with_fault(spec);
  pid_t dp = th_daemon_pid();
  /* The daemon's start may ask for a status itself: the first failure is
   * within a few. */
  int code = 0;
  for (int i = 0; i < 5 && (code = nd_status_as_user(NULL)) == 0; i++) {
  }
  if (code == 0)
    th_fail(__FILE__, __LINE__, "no status failed (%s)", spec);
  ASSERT_CONTAINS(lt_slurp("st"), says);
  nd_log_says(says);
  ASSERT_EQ(nd_status_as_user(NULL), 0);
  ASSERT_EQ(th_daemon_pid(), dp);
  ASSERT_EQ(kill(dp, 0), 0);
}

TEST_IMPL(daemon_fault_snapshot_alloc) {
  nd_status_fault("snapshot_alloc:1:fail",
                  "out of memory for the status snapshot: Cannot allocate "
                  "memory");
}

TEST_IMPL(daemon_fault_snapshot_short_write) {
  nd_status_fault("snapshot_write:1:fail",
                  "cannot pass the status snapshot: Input/output error");
}

/* The node client's own failures: no socket (EMFILE), a request written
 * short, no memory for the snapshot. Each is a clear error of that client
 * alone; cogpud, which got half a message in the second, ends that
 * connection and serves the next. */
TEST_IMPL(daemon_client_faults) {
  nd_begin();
  pid_t dp = th_daemon_pid();
  ASSERT(dp > 0);
  ASSERT_EQ(nd_status_as_user(NULL), 0);
  static const char *const cases[][2] = {
      {"client_socket:1:fail", "socket: Too many open files"},
      {"client_send:1:fail",
       "a short write to the node daemon (256 of 512 bytes)"},
      {"client_alloc:1:fail", "out of memory for the node's status snapshot"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ASSERT_NE(nd_status_as_user(cases[i][0]), 0);
    ASSERT_CONTAINS(lt_slurp("st"), cases[i][1]);
    ASSERT_EQ(nd_status_as_user(NULL), 0);
  }
  ASSERT_EQ(th_daemon_pid(), dp);
  ASSERT_EQ(kill(dp, 0), 0);
}
