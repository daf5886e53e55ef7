/*
 * test-exit.c: processes that leave, against a node daemon and the fake
 * driver. The driver frees a process's memory when the process has gone;
 * its connection to cogpud closes before that (the kernel closes a dying
 * process's descriptors one by one, and a program may close them itself).
 * Memory the daemon gave back at the close went to a waiting job, and the
 * driver refused it: the daemon now keeps it booked until the process has
 * gone, and gives it back at once only to a client that says it detaches.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/api.h"
#include "internal.h"
#include "ledger-helpers.h"

TEST_FILE_ONCE()

/* A 16 GiB fake GPU with 300 MiB contexts, no margin, a fast tick. */
static void ex_begin(void) {
  if (th_sanitizer_runtime()[0])
    setenv("LD_PRELOAD", th_sanitizer_runtime(), 1);
  setenv("COGPU_NODE_MODE", "daemon", 1);
  setenv("COGPU_CONTEXT_BYTES", "300M", 1);
  setenv("FAKE_CUDA_CTX_BYTES", "300M", 1);
  setenv("COGPU_LOG", "info", 1);
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_SWEEP_INTERVAL", "100ms");
  if (th_daemon_pid() <= 0)
    th_daemon_start();
}

/* LD_PRELOAD=... naming the preload library (after a sanitizer's runtime),
 * for a program run under it without cogpu run. */
static const char *ex_preload(void) {
  static char pre[8400];
  const char *rt = getenv("LD_PRELOAD");
  snprintf(pre, sizeof pre, "LD_PRELOAD=%s%s%s/libcogpu-preload.so",
           rt ? rt : "", rt ? " " : "", th_build_dir());
  return pre;
}

/* Waits (bounded) until th_path(tag) holds `needle`. */
static void ex_wait_text(const char *tag, const char *needle, int ms) {
  for (int t = 0;; t += 20) {
    if (strstr(lt_slurp(tag), needle))
      return;
    if (t > th_ms(ms))
      th_fail(__FILE__, __LINE__, "no \"%s\" in %s:\n%s", needle, tag,
              lt_slurp(tag));
    th_sleep_ms(20);
  }
}

/* The state of pid's entry on GPU 0 (-1: not listed), and what it holds. */
static int ex_state(int pid, uint64_t *held) {
  cogpu_status_t *st = lt_status();
  int state = -1;
  for (size_t i = 0; i < st->gpus[0].nclients; i++)
    if (st->gpus[0].clients[i].pid == pid) {
      state = st->gpus[0].clients[i].state;
      *held = st->gpus[0].clients[i].reserved_bytes;
    }
  cogpu_status_free(st);
  return state;
}

static uint64_t ex_reserved(void) {
  cogpu_status_t *st = lt_status();
  uint64_t r = st->gpus[0].reserved_bytes;
  cogpu_status_free(st);
  return r;
}

/* Waits (bounded) until `path` exists. */
static void ex_wait_file(const char *path, int ms) {
  for (int t = 0; access(path, F_OK) != 0; t += 5) {
    if (t > th_ms(ms))
      th_fail(__FILE__, __LINE__, "%s did not appear", path);
    th_sleep_ms(5);
  }
}

/* The files of a helper's steps, in the user's directory. */
static const char *ex_file(const char *name) {
  static char buf[8][4200];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, sizeof buf[0], "%s/%s", lt_user_dir(), name);
  return p;
}

/* Waits (bounded) until pid's entry on GPU 0 is in `state`. */
static void ex_wait_state(int pid, int state, int ms) {
  uint64_t held = 0;
  for (int t = 0; ex_state(pid, &held) != state; t += 20) {
    if (t > th_ms(ms))
      th_fail(__FILE__, __LINE__, "pid %d not in state %d (%d)", pid, state,
              ex_state(pid, &held));
    th_sleep_ms(20);
  }
}

/* In a helper (as the user it became): attached, holding `bytes` on GPU 0
 * at once; NULL if either failed. */
static cogpu_t *ex_holding(uint64_t bytes) {
  cogpu_t *h;
  if (cogpu_attach(NULL, &h) != 0)
    return NULL;
  cogpu_request_t r = {.gpu = 0,
                       .bytes = bytes,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  if (cogpu_reserve(h, &r, NULL) != 0) {
    cogpu_detach(h);
    return NULL;
  }
  return h;
}

/* In a helper: the file `name` of its directory `dir` (its steps). */
static const char *ex_in(const char *dir, const char *name) {
  static char buf[8][4200];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, sizeof buf[0], "%s/%s", dir, name);
  return p;
}

/* In a helper: waits for the test's cue, the file `name` of `dir`. */
static void ex_cue(const char *dir, const char *name) {
  while (access(ex_in(dir, name), F_OK) != 0)
    usleep(2000);
}

/* A program holding 10 GiB (user 1, under the preload library alone, or
 * under `cogpu run`) loses its connection to cogpud and lives on holding
 * the memory, as a process does between the kernel's closing of its
 * socket and its driver's teardown at exit (long for a program that
 * leaves its cache to the teardown, as PyTorch does). Another user's job
 * waits for 10 GiB meanwhile. The memory stays booked while the process
 * lives (`cogpu status` says it is exiting), the waiting job is neither
 * granted it nor refused by the driver, and it is served once the process
 * has gone; nothing is left booked. */
static void exit_window(bool run) {
  ex_begin();
  lt_fake_reset_peak();
  unsigned long long peak0 = 0, ooms0 = 0;
  lt_fake_cuda_stats(&peak0, &ooms0);
  char close_at[4200], go_at[4200];
  snprintf(close_at, sizeof close_at, "waitfile:%s", th_path("a.close"));
  snprintf(go_at, sizeof go_at, "waitfile:%s", th_path("a.go"));
  /* No freeall: the memory is the driver's to free at exit. */
  const char *a_pre[] = {"env",       ex_preload(), lt_cudaprog(), "direct",
                         "init",      "ctx",        "alloc:10G",   close_at,
                         "closeconn", go_at,        NULL};
  const char *a_run[] = {"cogpu",  "run",       "--",  lt_cudaprog(),
                         "direct", "init",      "ctx", "alloc:10G",
                         close_at, "closeconn", go_at, NULL};
  const char *as[24];
  pid_t a = lt_spawn_logged("a", lt_as_user(1, run ? a_run : a_pre, as, 24));
  ex_wait_text("a", "waiting", 20000);
  const char *b_argv[] = {"cogpu",  "run",     "--",  lt_cudaprog(),
                          "direct", "init",    "ctx", "alloc:10G",
                          "verify", "freeall", NULL};
  const char *bs[24];
  pid_t b = lt_spawn_logged("b", lt_as_user(2, b_argv, bs, 24));
  lt_wait_nwaiting(0, 1, 20000);
  th_write_file(th_path("a.close"), "");
  ex_wait_text("a", "closed", 20000);
  /* The program's own pid (the one that held the memory). */
  int holder = 0;
  {
    cogpu_status_t *st = lt_status();
    for (size_t i = 0; i < st->gpus[0].nclients; i++)
      if (st->gpus[0].clients[i].reserved_bytes >= 10 * GiB)
        holder = st->gpus[0].clients[i].pid;
    cogpu_status_free(st);
  }
  ASSERT(holder > 0);
  uint64_t held = 0;
  if (!run) {
    /* Its own slot, whose connection closed: listed as exiting, holding
     * its memory, until the process has gone. */
    for (int t = 0; ex_state(holder, &held) != COGPU_JOB_EXITING; t += 20) {
      if (t > th_ms(15000))
        th_fail(__FILE__, __LINE__,
                "pid %d never listed as exiting (state %d)\n%s", holder,
                ex_state(holder, &held), lt_slurp("b"));
      th_sleep_ms(20);
    }
    ASSERT_ULE(10 * GiB, held);
    char out[16384], err[4096];
    const char *argv[] = {"cogpu", "status", NULL};
    ASSERT_EQ(
        th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(20000)), 0);
    ASSERT_CONTAINS(out, "exiting: booked until the process has gone");
  } else {
    /* cogpu run's job keeps its memory while the job runs (the program
     * is one of its processes): listed as running. */
    ASSERT_EQ(ex_state(holder, &held), COGPU_JOB_RUNNING);
  }
  /* Neither granted the memory nor refused by the driver. */
  ASSERT_EQ(lt_nwaiting(0), 1);
  unsigned long long peak = 0, ooms = 0;
  lt_fake_cuda_stats(&peak, &ooms);
  ASSERT_EQ(ooms, ooms0);
  th_write_file(th_path("a.go"), "");
  ASSERT_EQ(th_exit_code(th_wait(a, th_ms(20000))), 0);
  int code = th_exit_code(th_wait(b, th_ms(60000)));
  if (code != 0)
    th_fail(__FILE__, __LINE__, "b: exit %d\n%s", code, lt_slurp("b"));
  const char *out = lt_slurp("b");
  ASSERT_CONTAINS(out, "verify ok");
  ASSERT(!strstr(out, "the driver refused memory cogpu granted"));
  lt_fake_cuda_stats(&peak, &ooms);
  ASSERT_EQ(ooms, ooms0);
  ASSERT_ULE(peak, 16 * GiB);
  for (int t = 0; ex_reserved() != 0; t += 20) {
    ASSERT_LT(t, th_ms(15000));
    th_sleep_ms(20);
  }
  lt_check_invariants();
}

TEST_IMPL_T(exit_memory_booked_until_process_gone, 90) {
  exit_window(false);
}

TEST_IMPL_T(exit_memory_of_cogpu_run_job_booked, 90) {
  exit_window(true);
}

/* A client that reserves memory with the API and detaches while its
 * process lives on (a service done with the GPU) says so: its memory is
 * given back at once, not kept until the process has gone. As user 1. */
HELPER_IMPL(ex_detacher) {
  (void)argc;
  lt_become(argv[0]);
  cogpu_t *h = ex_holding(4 * GiB);
  if (!h)
    return 10;
  th_write_file(ex_in(argv[1], "held"), "held");
  ex_cue(argv[1], "detach");
  cogpu_detach(h);
  th_write_file(ex_in(argv[1], "detached"), "detached");
  ex_cue(argv[1], "end");
  return 0;
}

TEST_IMPL(exit_detach_gives_back_at_once) {
  ex_begin();
  pid_t p = th_spawn_helper(
      "ex_detacher",
      (const char *const[]){lt_user_ids(1), lt_user_dir(), NULL});
  ex_wait_file(ex_file("held"), 15000);
  ASSERT_ULE(4 * GiB, ex_reserved());
  th_write_file(ex_file("detach"), "");
  ex_wait_file(ex_file("detached"), 15000);
  /* The process lives (it waits for `end`): nothing of it is booked. */
  for (int t = 0; ex_reserved() != 0; t += 20) {
    ASSERT_LT(t, th_ms(5000));
    th_sleep_ms(20);
  }
  ASSERT_EQ(kill(p, 0), 0);
  th_write_file(ex_file("end"), "");
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(15000))), 0);
  lt_check_invariants();
}

/* Holds 2 GiB with the API, then loses its connection: its third message
 * is cut short (COGPU_FAULT=client_send:3:fail), and the daemon ends a
 * connection that sends half a message. It goes on (its cue "go") and
 * reconnects to its registration: it holds its 2 GiB, and grows. As the
 * user argv[0] names; argv[1]: its directory. */
HELPER_IMPL(ex_lost_conn) {
  (void)argc;
  lt_become(argv[0]);
  cogpu_t *h = ex_holding(2 * GiB);
  if (!h)
    return 10;
  cogpu_request_t r = {.gpu = 0,
                       .bytes = GiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  int rc = cogpu_reserve(h, &r, NULL);
  if (rc != -EIO) {
    fprintf(stderr, "lost_conn: the cut message: %d %s\n", rc,
            cogpu_last_error());
    return 12;
  }
  th_write_file(ex_in(argv[1], "broken"), "broken");
  ex_cue(argv[1], "go");
  uint64_t held = 0;
  if ((rc = cogpu_held(h, 0, &held)) != 0 || held != 2 * GiB) {
    fprintf(stderr, "lost_conn: held %llu: %d %s\n", (unsigned long long)held,
            rc, cogpu_last_error());
    return 13;
  }
  if (cogpu_reserve(h, &r, NULL) != 0)
    return 14;
  th_write_file(ex_in(argv[1], "resumed"), "resumed");
  ex_cue(argv[1], "end");
  cogpu_detach(h);
  return 0;
}

/* A client whose connection the daemon ended (it sent half a message)
 * while it held memory: the memory stays booked, the client listed as
 * exiting, and when the client reconnects to its registration it is an
 * ordinary client again, holding what it held. */
TEST_IMPL(exit_lost_connection_reconnects) {
  ex_begin();
  /* The helper's own: this process reads it at its next call, unset. */
  setenv("COGPU_FAULT", "client_send:3:fail", 1);
  pid_t p = th_spawn_helper(
      "ex_lost_conn",
      (const char *const[]){lt_user_ids(1), lt_user_dir(), NULL});
  unsetenv("COGPU_FAULT");
  ex_wait_file(ex_file("broken"), 15000);
  ex_wait_state(p, COGPU_JOB_EXITING, 15000);
  ASSERT_UEQ(ex_reserved(), 2 * GiB);
  th_write_file(ex_file("go"), "");
  ex_wait_file(ex_file("resumed"), 15000);
  uint64_t held = 0;
  ASSERT_EQ(ex_state(p, &held), COGPU_JOB_RUNNING);
  ASSERT_UEQ(held, 3 * GiB);
  th_write_file(ex_file("end"), "");
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(15000))), 0);
  ASSERT_UEQ(ex_reserved(), 0);
  lt_check_invariants();
}

/* Holds 4 GiB with the API (no device memory: the driver does not list
 * it), closes its connection without a word and lives on until its cue
 * ("end"). As the user argv[0] names; argv[1]: its directory. */
HELPER_IMPL(ex_silent) {
  (void)argc;
  lt_become(argv[0]);
  if (!ex_holding(4 * GiB))
    return 10;
  /* Its Unix sockets, the connection among them (descriptors 3 on: the
   * harness's own are files and pipes). */
  for (int fd = 3; fd < 1024; fd++) {
    int dom = 0;
    socklen_t len = sizeof dom;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &len) == 0 &&
        dom == AF_UNIX)
      close(fd);
  }
  th_write_file(ex_in(argv[1], "closed"), "closed");
  ex_cue(argv[1], "end");
  return 0;
}

/* A process that closed its connection holding memory the driver does not
 * list it for (it reserved and never allocated, or it closed the driver's
 * descriptors too) and lives on: its memory is not kept for its whole
 * life. NVML, read when a request waits, lists it on no GPU, and the
 * waiting job is served while the process still runs. */
TEST_IMPL_T(exit_unlisted_by_nvml_freed, 60) {
  ex_begin();
  pid_t p = th_spawn_helper(
      "ex_silent", (const char *const[]){lt_user_ids(1), lt_user_dir(), NULL});
  ex_wait_file(ex_file("closed"), 15000);
  ex_wait_state(p, COGPU_JOB_EXITING, 15000);
  /* Another user's job asks for what only that memory leaves room for. */
  const char *argv[] = {"cogpu",  "run",     "--",  lt_cudaprog(),
                        "direct", "init",    "ctx", "alloc:13G",
                        "verify", "freeall", NULL};
  const char *as[24];
  pid_t b = lt_spawn_logged("b", lt_as_user(2, argv, as, 24));
  int code = th_exit_code(th_wait(b, th_ms(40000)));
  if (code != 0)
    th_fail(__FILE__, __LINE__, "b: exit %d\n%s", code, lt_slurp("b"));
  ASSERT_CONTAINS(lt_slurp("b"), "verify ok");
  ASSERT_EQ(kill(p, 0), 0); /* served while the process lived */
  th_write_file(ex_file("end"), "");
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(15000))), 0);
  lt_check_invariants();
}

/* A program closes the library's connection under it (it closes sockets it
 * does not know of) and gets the descriptor's number for a socket of its
 * own, then allocates more. The library neither writes into the program's
 * socket nor closes it: it sees the descriptor is another file, connects
 * again to its registration (kept, as the slot held memory) and goes on
 * accounted. */
TEST_IMPL_T(exit_program_reuses_connection_number, 60) {
  ex_begin();
  const char *argv[] = {"env",       ex_preload(), lt_cudaprog(), "direct",
                        "init",      "ctx",        "alloc:1G",    "closeconn",
                        "sockreuse", "alloc:1G",   "sockcheck",   "verify",
                        "freeall",   NULL};
  const char *as[24];
  pid_t p = lt_spawn_logged("a", lt_as_user(1, argv, as, 24));
  int code = th_exit_code(th_wait(p, th_ms(30000)));
  const char *out = lt_slurp("a");
  if (code != 0)
    th_fail(__FILE__, __LINE__, "exit %d\n%s", code, out);
  ASSERT_CONTAINS(out, "sockcheck 0 bytes open");
  ASSERT_CONTAINS(out, "verify ok");
  ASSERT_CONTAINS(out, "reconnected to the node daemon");
  for (int t = 0; ex_reserved() != 0; t += 20) {
    ASSERT_LT(t, th_ms(15000));
    th_sleep_ms(20);
  }
  lt_check_invariants();
}
