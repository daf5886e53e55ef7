/*
 * test-preload-options.c: preload options whose values leave no room:
 * a grow_step larger than the GPU, and a limit below context_bytes. The
 * program (tests/preload/cudaprog.c, on the fake driver) runs under
 * `cogpu run`, as in test-preload.c.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"
#include "ledger-helpers.h"

static void options_env(void) {
  /* The sanitizer runtime must be the first library of every program. */
  if (th_sanitizer_runtime()[0])
    setenv("LD_PRELOAD", th_sanitizer_runtime(), 1);
  th_setenv("COGPU_MARGIN", "0");
  setenv("COGPU_CONTEXT_BYTES", "300M", 1);
  setenv("FAKE_CUDA_CTX_BYTES", "300M", 1);
  setenv("COGPU_LOG", "warn", 1);
}

/* Runs `cogpu run -- cudaprog direct ACTIONS...` with output in
 * th_path("out"); returns its exit code and the output in *out. */
static int run_prog(const char *const actions[], const char **out) {
  static char buf[65536];
  char prog[4096];
  const char *argv[24] = {"cogpu", "run", "--", prog, "direct"};
  size_t n = 5;
  snprintf(prog, sizeof prog, "%s/tests/cudaprog", th_build_dir());
  for (size_t i = 0; actions[i] && n < 23; i++)
    argv[n++] = actions[i];
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    int fd = open(th_path("out"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  int code = th_exit_code(th_wait(pid, th_ms(30000)));
  int fd = open(th_path("out"), O_RDONLY);
  ssize_t r = fd >= 0 ? read(fd, buf, sizeof buf - 1) : 0;
  if (fd >= 0)
    close(fd);
  buf[r > 0 ? r : 0] = 0;
  *out = buf;
  return code;
}

/* A grow_step larger than the GPU (16 GiB here) is cut to what is needed:
 * before, every growth asked for the whole step and failed. */
TEST_IMPL(preload_grow_step_larger_than_gpu) {
  options_env();
  setenv("COGPU_GROW_STEP", "100G", 1);
  const char *out;
  int code = run_prog(
      (const char *const[]){"init", "ctx", "alloc:1G", "free", NULL}, &out);
  if (code != 0)
    th_fail(__FILE__, __LINE__, "exit %d:\n%s", code, out);
  lt_check_invariants();
}

/* A limit below context_bytes leaves room for no context: the program gets
 * out-of-memory, as before, but now with a line that says why. */
TEST_IMPL(preload_limit_below_context_bytes_says_so) {
  options_env();
  setenv("COGPU_LIMIT", "256M", 1);
  const char *out;
  int code = run_prog((const char *const[]){"init", "ctx", NULL}, &out);
  ASSERT_NE(code, 0);
  ASSERT_CONTAINS(out, "limit (256.0 MiB) is below context_bytes (300.0 MiB)");
  /* A limit that a context fits names the limit when it refuses more. */
  setenv("COGPU_LIMIT", "1G", 1);
  code = run_prog(
      (const char *const[]){"init", "ctx", "alloc:512M", "alloc:512M", NULL},
      &out);
  ASSERT_EQ(code, 2);
  ASSERT_CONTAINS(out, "over its limit (1.0 GiB)");
  lt_check_invariants();
}

/* mem=auto under the preload library without cogpu run: there is no
 * history to learn from, so it is on demand, as mem=0 (not a size, nor a
 * bad value): cuMemGetInfo shows the GPU's capacity, where mem=4G shows
 * the 4 GiB reservation taken at the first context. */
TEST_IMPL(preload_mem_auto_is_on_demand) {
  options_env();
  char pre[8400];
  const char *rt = getenv("LD_PRELOAD");
  snprintf(pre, sizeof pre, "LD_PRELOAD=%s%s%s/libcogpu-preload.so",
           rt ? rt : "", rt ? " " : "", th_build_dir());
  const char *argv[] = {lt_cudaprog(), "direct", "init", "ctx",
                        "alloc:1G",    "info",   NULL};
  const char *sizes[] = {"COGPU_MEM=auto", "COGPU_MEM=4G"};
  const unsigned long long total[] = {16 * GiB, 4 * GiB};
  for (int i = 0; i < 2; i++) {
    const char *env[] = {pre, sizes[i], NULL};
    char out[4096], err[4096], want[128];
    int code =
        th_run(argv, env, out, sizeof out, err, sizeof err, th_ms(20000));
    if (code != 0)
      th_fail(__FILE__, __LINE__, "%s: exit %d: %s%s", sizes[i], code, out,
              err);
    snprintf(want, sizeof want, "free=%llu total=%llu",
             total[i] - 300 * MiB - GiB, total[i]);
    ASSERT_CONTAINS(out, want);
  }
  lt_check_invariants();
}
