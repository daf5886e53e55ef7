/*
 * test-state.c: the node state file under bad conditions: corrupt,
 * truncated or foreign-version files, wrong owner or mode, other users,
 * concurrent creation, death during creation, PID reuse and PID
 * namespaces, and a file system without room for the state.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ledger-helpers.h"

static void make_state(void) {
  cogpu_t *h = lt_attach(0);
  cogpu_detach(h);
}

static int count_files(const char *prefix) {
  DIR *d = opendir(th_path("state"));
  ASSERT(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

static void patch(off_t off, const void *bytes, size_t len) {
  int fd = open(th_path("state/state"), O_WRONLY);
  ASSERT(fd >= 0);
  ASSERT_EQ(pwrite(fd, bytes, len, off), (ssize_t)len);
  close(fd);
}

static void attach_expect_rebuilt(void) {
  cogpu_t *h = NULL;
  ASSERT_OK(cogpu_attach(NULL, &h));
  ASSERT_EQ(count_files("state.bad."), 1);
  cogpu_request_t r = {.gpu = 0,
                       .bytes = GiB,
                       .timeout_ms = 0,
                       .priority = COGPU_PRIORITY_DEFAULT};
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  lt_check_invariants();
  cogpu_detach(h);
}

TEST_IMPL_SINGLE(state_garbage_unused_is_rebuilt) {
  make_state();
  patch(0, "garbage!", 8);
  attach_expect_rebuilt();
}

TEST_IMPL_SINGLE(state_truncated_unused_is_rebuilt) {
  make_state();
  ASSERT_EQ(truncate(th_path("state/state"), 100), 0);
  attach_expect_rebuilt();
}

TEST_IMPL_SINGLE(state_other_version_unused_is_rebuilt) {
  make_state();
  uint32_t v = 999;
  patch(8, &v, sizeof v);
  attach_expect_rebuilt();
}

TEST_IMPL_SINGLE(state_corrupt_header_unused_is_rebuilt) {
  make_state();
  uint32_t ngpus = 3; /* changes the checksummed part */
  patch(40, &ngpus, sizeof ngpus);
  attach_expect_rebuilt();
}

TEST_IMPL_SINGLE(state_bad_in_use_is_refused) {
  pid_t p = lt_hold("user", 0, GiB, 0, 0, -1);
  lt_wait_nclients(0, 1, 5000);
  uint32_t v = 999;
  patch(8, &v, sizeof v);
  cogpu_t *h = NULL;
  ASSERT_EQ(cogpu_attach(NULL, &h), COGPU_ESTATE);
  ASSERT_CONTAINS(cogpu_last_error(), "layout version 999");
  ASSERT_CONTAINS(cogpu_last_error(), "live processes");
  ASSERT_EQ(count_files("state.bad."), 0); /* left alone */
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  /* Once nobody uses it, it is set aside and replaced. */
  attach_expect_rebuilt();
}

TEST_IMPL_SINGLE(state_wrong_mode_is_refused) {
  make_state();
  ASSERT_EQ(chmod(th_path("state/state"), 0644), 0);
  cogpu_t *h = NULL;
  ASSERT_EQ(cogpu_attach(NULL, &h), -EPERM);
  ASSERT_CONTAINS(cogpu_last_error(), "mode 0644");
  ASSERT_CONTAINS(cogpu_last_error(), "state_mode is 0600");
}

TEST_IMPL_SINGLE(state_wrong_owner_is_refused) {
  if (geteuid() != 0)
    SKIP("needs root to chown");
  make_state();
  ASSERT_EQ(chown(th_path("state/state"), 4242, 4242), 0);
  cogpu_t *h = NULL;
  ASSERT_EQ(cogpu_attach(NULL, &h), -EPERM);
  ASSERT_CONTAINS(cogpu_last_error(), "belongs to uid 4242");
}

TEST_IMPL_SINGLE(state_symlink_is_refused) {
  make_state();
  ASSERT_EQ(rename(th_path("state/state"), th_path("elsewhere")), 0);
  ASSERT_EQ(symlink(th_path("elsewhere"), th_path("state/state")), 0);
  cogpu_t *h = NULL;
  ASSERT_NE(cogpu_attach(NULL, &h), 0);
  ASSERT_CONTAINS(cogpu_last_error(), "state file");
}

TEST_IMPL_SINGLE(state_dir_not_a_directory) {
  th_write_file(th_path("state"), "x");
  cogpu_t *h = NULL;
  ASSERT_EQ(cogpu_attach(NULL, &h), -ENOTDIR);
  ASSERT_CONTAINS(cogpu_last_error(), "not a directory");
}

/* Runs fn as an unprivileged user in a child; returns its exit code. */
static int as_user(uid_t uid, int (*fn)(void)) {
  pid_t p = fork();
  if (p == 0) {
    if (setgid(uid) != 0 || setuid(uid) != 0)
      _exit(90);
    _exit(fn());
  }
  return th_exit_code(th_wait(p, th_ms(10000)));
}

static int user_reserve(void) {
  cogpu_t *h;
  int rc = cogpu_attach(NULL, &h);
  if ((rc == -EACCES || rc == -EPERM) && strstr(cogpu_last_error(), "state"))
    return 10;
  if (rc) {
    fprintf(stderr, "attach as %u: %d %s\n", (unsigned)getuid(), rc,
            cogpu_last_error());
    return 11;
  }
  cogpu_request_t r = {.gpu = 0,
                       .bytes = GiB,
                       .timeout_ms = 0,
                       .priority = COGPU_PRIORITY_DEFAULT};
  if (cogpu_reserve(h, &r, NULL))
    return 12;
  /* Hold it while the test looks. */
  th_sleep_ms(500);
  return 0;
}

/* Single-user mode is one user's: a ledger other users can write is
 * refused, by its owner too, with a message that says to run the node
 * daemon; another user cannot use the default one. */
TEST_IMPL_SINGLE(state_shared_between_users_refused) {
  if (geteuid() != 0)
    SKIP("needs root to switch users");
  ASSERT_EQ(chmod(th_tmpdir(), 0755), 0);
  make_state();
  ASSERT_EQ(as_user(65534, user_reserve), 10);
  ASSERT_EQ(chmod(th_path("state"), 01777), 0);
  ASSERT_EQ(chmod(th_path("state/state"), 0666), 0);
  cogpu_t *h = NULL;
  ASSERT_EQ(cogpu_attach(NULL, &h), -EPERM);
  ASSERT_CONTAINS(cogpu_last_error(), "can be written by other users");
  ASSERT_CONTAINS(cogpu_last_error(), "cogpud");
  ASSERT_EQ(as_user(65534, user_reserve), 10);
}

TEST_IMPL_SINGLE(state_private_refuses_other_users) {
  if (geteuid() != 0)
    SKIP("needs root to switch users");
  ASSERT_EQ(chmod(th_tmpdir(), 0755), 0);
  setenv("COGPU_STATE_MODE", "0600", 1);
  make_state();
  ASSERT_EQ(as_user(65534, user_reserve), 10);
}

static int attach_and_exit(void) {
  cogpu_t *h;
  return cogpu_attach(NULL, &h) == 0 ? 0 : 1;
}

TEST_IMPL_SINGLE(state_concurrent_creation) {
  enum { N = 8 };
  pid_t p[N];
  for (int i = 0; i < N; i++) {
    p[i] = fork();
    if (p[i] == 0)
      _exit(attach_and_exit());
  }
  for (int i = 0; i < N; i++)
    ASSERT_EQ(th_exit_code(th_wait(p[i], th_ms(10000))), 0);
  ASSERT_EQ(count_files("state.bad."), 0);
  lt_check_invariants();
}

TEST_IMPL_SINGLE(state_creator_dies) {
  setenv("COGPU_FAULT", "create", 1);
  pid_t p = fork();
  if (p == 0)
    _exit(attach_and_exit());
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 128 + SIGKILL);
  unsetenv("COGPU_FAULT");
  /* Nothing half-written was published. */
  ASSERT(access(th_path("state/state"), F_OK) != 0);
  cogpu_t *h = lt_attach(0);
  cogpu_detach(h);
}

/* A dead client's PID taken by a new, live process must not keep its
 * reservation alive: liveness never looks at PIDs. */
TEST_IMPL_SINGLE(state_pid_reuse) {
  if (geteuid() != 0)
    SKIP("needs root to choose PIDs (ns_last_pid)");
  th_setenv("COGPU_MARGIN", "0");
  pid_t victim = lt_hold("victim", 0, 8 * GiB, 0, 0, -1);
  lt_wait_nclients(0, 1, 5000);
  kill(victim, SIGKILL);
  th_wait(victim, th_ms(5000));
  pid_t reuse = lt_fork_as_pid(victim);
  if (reuse == 0) {
    pause();
    _exit(0);
  }
  if (reuse != victim)
    th_fail(__FILE__, __LINE__, "could not get PID %d again", victim);
  /* PID `victim` is alive again, as another process. */
  ASSERT_EQ(kill(victim, 0), 0);
  cogpu_status_t *st = lt_status();
  ASSERT_EQ(st->gpus[0].nclients, 0);
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  cogpu_status_free(st);
  kill(reuse, SIGKILL);
  waitpid(reuse, NULL, 0);
}

/* Clients in their own PID namespaces (containers) are all PID 1 there;
 * each is tracked and reclaimed on its own. */
static pid_t in_new_pidns(uint64_t bytes, const char *name) {
  pid_t outer = fork();
  if (outer == 0) {
    if (unshare(CLONE_NEWPID) != 0)
      _exit(77);
    pid_t inner = fork();
    if (inner == 0) {
      if (getpid() != 1)
        _exit(91);
      cogpu_attach_opts_t o = {.command = name};
      cogpu_t *h;
      cogpu_request_t r = {.gpu = 0,
                           .bytes = bytes,
                           .timeout_ms = 0,
                           .priority = COGPU_PRIORITY_DEFAULT};
      if (cogpu_attach(&o, &h) || cogpu_reserve(h, &r, NULL))
        _exit(92);
      for (int i = 0; i < 600; i++)
        th_sleep_ms(100);
      _exit(0);
    }
    int st;
    waitpid(inner, &st, 0);
    _exit(th_exit_code(st));
  }
  return outer;
}

TEST_IMPL_SINGLE(state_pid_namespaces) {
  th_setenv("COGPU_MARGIN", "0");
  pid_t a = in_new_pidns(4 * GiB, "ns-a");
  pid_t b = in_new_pidns(6 * GiB, "ns-b");
  for (int i = 0; i < th_ms(5000) / 10; i++) {
    int st;
    if (waitpid(a, &st, WNOHANG) == a && th_exit_code(st) == 77)
      SKIP("no permission to create PID namespaces");
    if (lt_reserved_by(0, "ns-a") && lt_reserved_by(0, "ns-b"))
      break;
    th_sleep_ms(10);
  }
  ASSERT_UEQ(lt_reserved_by(0, "ns-a"), 4 * GiB);
  ASSERT_UEQ(lt_reserved_by(0, "ns-b"), 6 * GiB);
  cogpu_status_t *st = lt_status();
  ASSERT_NE(st->gpus[0].clients[0].pid, st->gpus[0].clients[1].pid);
  cogpu_status_free(st);
  /* Killing a's namespace (its init, found by its host PID) reclaims a
   * only. */
  pid_t a_init = -1;
  st = lt_status();
  for (size_t i = 0; i < st->gpus[0].nclients; i++)
    if (strcmp(st->gpus[0].clients[i].command, "ns-a") == 0)
      a_init = st->gpus[0].clients[i].pid;
  cogpu_status_free(st);
  ASSERT_GT(a_init, 1);
  kill(a_init, SIGKILL);
  th_wait(a, th_ms(5000));
  for (int i = 0; i < th_ms(3000) / 10 && lt_reserved_by(0, "ns-a"); i++)
    th_sleep_ms(10);
  ASSERT_UEQ(lt_reserved_by(0, "ns-a"), 0);
  ASSERT_UEQ(lt_reserved_by(0, "ns-b"), 6 * GiB);
  lt_check_invariants();
  st = lt_status();
  kill(st->gpus[0].clients[0].pid, SIGKILL);
  cogpu_status_free(st);
  th_wait(b, th_ms(5000));
}

/* --- A file system without room for the state ---------------------------- */

/* Files in dir whose name starts with "state" (state, state.tmp.<pid>, ...),
 * state.lock aside. */
static int count_state_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    n += strncmp(e->d_name, "state", 5) == 0 &&
         strcmp(e->d_name, "state.lock") != 0;
  closedir(d);
  return n;
}

/* In a child: attach with the state in dir, which has no room for it. The
 * attach must fail with a message that says so, leaving no state file
 * (neither published nor temporary). Exits 0 if so. */
static int attach_without_room(const char *dir) {
  setenv("COGPU_STATE_DIR", dir, 1);
  cogpu_t *h = NULL;
  int rc = cogpu_attach(NULL, &h);
  if (rc == 0) {
    fprintf(stderr, "attach succeeded without room for the state\n");
    return 1;
  }
  const char *msg = cogpu_last_error();
  if (!strstr(msg, "cannot allocate the node state") ||
      !strstr(msg, "state_dir")) {
    fprintf(stderr, "unexpected message (%s): %s\n", cogpu_err_name(rc), msg);
    return 2;
  }
  int n = count_state_files(dir);
  if (n != 0) {
    fprintf(stderr, "%d state file(s) left in %s\n", n, dir);
    return 3;
  }
  return 0;
}

/* A tmpfs too small for the state (a small or full /dev/shm): before, the
 * file was only sized, and touching its pages killed the process with
 * SIGBUS. Needs root, for a private mount namespace with a tmpfs. */
TEST_IMPL_SINGLE(state_small_tmpfs_fails_cleanly) {
  const char *mnt = th_path("small");
  ASSERT_EQ(mkdir(mnt, 0755), 0);
  if (geteuid() != 0)
    SKIP("mounting a small tmpfs needs root (see "
         "state_file_size_limit_fails_cleanly)");
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, "size=64k") != 0) {
      fprintf(stderr, "skip: cannot mount a tmpfs: %s\n", strerror(errno));
      _exit(TH_SKIP);
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/cogpu", mnt);
    _exit(attach_without_room(dir));
  }
  int code = th_exit_code(th_wait(pid, th_ms(10000)));
  if (code == TH_SKIP)
    SKIP("cannot mount a tmpfs in a private mount namespace");
  ASSERT_EQ(code, 0);
}

/* The same without privileges: a file-size limit refuses the allocation. */
TEST_IMPL_SINGLE(state_file_size_limit_fails_cleanly) {
  const char *dir = th_path("limited");
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    struct rlimit rl = {64 * 1024, 64 * 1024};
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
      _exit(99);
    _exit(attach_without_room(dir));
  }
  ASSERT_EQ(th_exit_code(th_wait(pid, th_ms(10000))), 0);
}
