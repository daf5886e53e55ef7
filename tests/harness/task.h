/*
 * task.h: the cogpu test harness. Tests are `TEST_IMPL(name) { ... }` in
 * tests/<kind>/test-<module>.c; the runner runs each in its own process
 * with a timeout, a fresh temporary directory and a private node state.
 * Multi-process tests re-execute the same binary as a named helper
 * (`HELPER_IMPL(name)`), so no extra binaries are needed.
 */
#ifndef COGPU_TASK_H
#define COGPU_TASK_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "cogpu.h"

typedef void (*th_test_fn)(void);
typedef int (*th_helper_fn)(int argc, char **argv);

void th_register_test(const char *name, th_test_fn fn, const char *file,
                      int timeout_s);
void th_register_single(const char *name, th_test_fn fn, const char *file,
                        int timeout_s);
void th_register_helper(const char *name, th_helper_fn fn);
/* fn runs when the test process ends, passed or failed (not when killed
 * at its time limit): cleanup of what outlives the process, e.g. users. */
void th_on_end(void (*fn)(void));
void th_register_group(const char *file, const char *group, int most);
void th_register_file_once(const char *file);
_Noreturn void th_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define TEST_IMPL_T(name, timeout_s)                                           \
  static void test_##name(void);                                               \
  __attribute__((constructor)) static void th_reg_##name(void) {               \
    th_register_test(#name, test_##name, __FILE__, timeout_s);                 \
  }                                                                            \
  static void test_##name(void)
/* A test with the default timeout (30 s, times COGPU_TEST_TIMEOUT_MULTIPLIER).
 */
#define TEST_IMPL(name) TEST_IMPL_T(name, 30)

/* A test of the daemonless single-user mode only (the state file, its
 * lock and liveness, fault points in clients): not run in node mode. */
#define TEST_IMPL_SINGLE_T(name, timeout_s)                                    \
  static void test_##name(void);                                               \
  __attribute__((constructor)) static void th_reg_##name(void) {               \
    th_register_single(#name, test_##name, __FILE__, timeout_s);               \
  }                                                                            \
  static void test_##name(void)
#define TEST_IMPL_SINGLE(name) TEST_IMPL_SINGLE_T(name, 30)

/* A test that sets up the node it needs itself (its own node daemon, a
 * Slurm cluster): the node pass would run it again unchanged, so it runs
 * once, in the first (daemonless) pass. */
#define TEST_IMPL_ONCE_T(name, timeout_s) TEST_IMPL_SINGLE_T(name, timeout_s)

/* The runner runs tests in parallel (`run-tests -j N`). The tests of a file
 * that share something outside their own directory are in a group: at most
 * `most` tests of a group run at once (1: one at a time). Group "alone":
 * each of the file's tests runs with nothing beside it. */
#define TEST_FILE_GROUP(group, most)                                           \
  __attribute__((constructor)) static void th_greg_file(void) {                \
    th_register_group(__FILE__, group, most);                                  \
  }

/* Every test of the file sets up the node it needs itself (its own node
 * daemon when the runner gives none): the node pass would run them again
 * unchanged, so they run once per build, in the first (daemonless) pass. */
#define TEST_FILE_ONCE()                                                       \
  __attribute__((constructor)) static void th_oreg_file(void) {                \
    th_register_file_once(__FILE__);                                           \
  }

#define HELPER_IMPL(name)                                                      \
  static int helper_##name(int argc, char **argv);                             \
  __attribute__((constructor)) static void th_hreg_##name(void) {              \
    th_register_helper(#name, helper_##name);                                  \
  }                                                                            \
  static int helper_##name(int argc, char **argv)

#define ASSERT(c)                                                              \
  do {                                                                         \
    if (!(c))                                                                  \
      th_fail(__FILE__, __LINE__, "assertion failed: %s", #c);                 \
  } while (0)

#define ASSERT_CMP_(a, op, b, T, fmt)                                          \
  do {                                                                         \
    T th_a_ = (T)(a), th_b_ = (T)(b);                                          \
    if (!(th_a_ op th_b_))                                                     \
      th_fail(__FILE__, __LINE__, "%s %s %s: %" fmt " vs %" fmt, #a, #op, #b,  \
              th_a_, th_b_);                                                   \
  } while (0)
#define ASSERT_EQ(a, b) ASSERT_CMP_(a, ==, b, int64_t, PRId64)
#define ASSERT_NE(a, b) ASSERT_CMP_(a, !=, b, int64_t, PRId64)
#define ASSERT_LT(a, b) ASSERT_CMP_(a, <, b, int64_t, PRId64)
#define ASSERT_LE(a, b) ASSERT_CMP_(a, <=, b, int64_t, PRId64)
#define ASSERT_GT(a, b) ASSERT_CMP_(a, >, b, int64_t, PRId64)
#define ASSERT_GE(a, b) ASSERT_CMP_(a, >=, b, int64_t, PRId64)
#define ASSERT_UEQ(a, b) ASSERT_CMP_(a, ==, b, uint64_t, PRIu64)
#define ASSERT_ULE(a, b) ASSERT_CMP_(a, <=, b, uint64_t, PRIu64)
#define ASSERT_STREQ(a, b)                                                     \
  do {                                                                         \
    const char *th_sa_ = (a), *th_sb_ = (b);                                   \
    if (strcmp(th_sa_, th_sb_) != 0)                                           \
      th_fail(__FILE__, __LINE__, "%s == %s: \"%s\" vs \"%s\"", #a, #b,        \
              th_sa_, th_sb_);                                                 \
  } while (0)
#define ASSERT_CONTAINS(hay, needle)                                           \
  do {                                                                         \
    const char *th_h_ = (hay), *th_n_ = (needle);                              \
    if (!th_h_ || !strstr(th_h_, th_n_))                                       \
      th_fail(__FILE__, __LINE__, "\"%s\" not found in: %s", th_n_,            \
              th_h_ ? th_h_ : "(null)");                                       \
  } while (0)
/* rc must be 0; prints cogpu's message otherwise. */
#define ASSERT_OK(rc)                                                          \
  do {                                                                         \
    int th_rc_ = (rc);                                                         \
    if (th_rc_ != 0)                                                           \
      th_fail(__FILE__, __LINE__, "%s = %d (%s): %s", #rc, th_rc_,             \
              cogpu_err_name(th_rc_), cogpu_last_error());                     \
  } while (0)

/* Exit code that marks a test as skipped. */
#define TH_SKIP 77
#define SKIP(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "skip: " __VA_ARGS__);                                     \
    fputc('\n', stderr);                                                       \
    exit(TH_SKIP);                                                             \
  } while (0)

/* SKIP, unless the run requires what is missing (the environment
 * variable `require` is "1", as .ci/run sets where its set-up provides
 * it): then the test fails, so that a green run cannot lack it. */
#define SKIP_UNLESS_REQUIRED(require, ...)                                     \
  do {                                                                         \
    const char *th_req_ = getenv(require);                                     \
    if (th_req_ && !strcmp(th_req_, "1"))                                      \
      th_fail(__FILE__, __LINE__,                                              \
              "required (" require "=1) but missing: " __VA_ARGS__);           \
    SKIP(__VA_ARGS__);                                                         \
  } while (0)

/* The test's private temporary directory (removed after the test). */
const char *th_tmpdir(void);
/* Path of a file inside th_tmpdir(); returns a static buffer per call slot
 * (up to 8 live at once). */
const char *th_path(const char *name);
/* Directory holding the built binaries (cogpu, fakes). */
const char *th_build_dir(void);
/* The sanitizer runtime (libasan/libtsan) this test binary carries, or ""
 * in the plain build: programs a test starts get it preloaded first. */
const char *th_sanitizer_runtime(void);
/* Write `text` to the file at `path` (created or truncated). */
void th_write_file(const char *path, const char *text);

/* Start this binary as helper `name` with the given arguments (NULL-ended),
 * inheriting the environment. Returns the pid. */
pid_t th_spawn_helper(const char *name, const char *const args[]);
/* Wait for pid at most timeout_ms; on timeout kill it (SIGKILL) and fail the
 * test. Returns the raw wait status. */
int th_wait(pid_t pid, int timeout_ms);
/* Exit code of a child that exited normally, or 128+signal. */
int th_exit_code(int wstatus);

/* Apply "K=V" entries to this process's environment ("K=" unsets K). */
void th_apply_env(const char *const env[]);

/* Run argv (argv[0] found in PATH or given as a path) with extra environment
 * entries ("K=V", NULL-ended; "K=" with nothing after unsets K), capturing
 * stdout and stderr (each NUL-terminated, truncated to its buffer). Fails
 * the test if it runs longer than timeout_ms. Returns the exit code
 * (128+signal if killed). */
int th_run(const char *const argv[], const char *const env[], char *out,
           size_t outlen, char *err, size_t errlen, int timeout_ms);

/* Node mode (COGPU_TEST_NODE=1): each test runs against a private cogpud
 * that the runner starts; these restart or stop it (a signal). */
bool th_node_mode(void);
pid_t th_daemon_pid(void);
void th_daemon_start(void);
void th_daemon_stop(int sig);
/* Stop the daemon, forget its state, start it again (node settings). */
void th_daemon_restart_fresh(void);
/* setenv (v NULL: unsetenv); in node mode a node setting (policy, margin,
 * the fake NVML's GPUs...) restarts the daemon so that it applies. */
void th_setenv(const char *k, const char *v);

/* Milliseconds scaled by COGPU_TEST_TIMEOUT_MULTIPLIER (for slow sanitizer
 * builds). */
int th_ms(int ms);
/* Sleep for ms milliseconds. */
void th_sleep_ms(int ms);

#endif /* COGPU_TASK_H */
