/*
 * test-scripts.c: the set-up script (scripts/setup.sh), run against stub
 * commands (dpkg, apt-get, make, id, sudo) that record what they were
 * asked, so that nothing is installed or built: as root on a machine
 * without sudo, and as a user with sudo.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "task.h"

static void stub(const char *name, const char *body) {
  char path[PATH_MAX + 64], text[1024];
  snprintf(path, sizeof path, "%s/bin/%s", th_tmpdir(), name);
  snprintf(text, sizeof text, "#!/bin/sh\n%s\n", body);
  th_write_file(path, text);
  ASSERT_EQ(chmod(path, 0755), 0);
}

/* A PATH of stubs only (so that a sudo installed here cannot be found),
 * plus the few real tools the script needs. uid is what `id -u` says;
 * with_sudo adds a sudo stub; packages_missing makes dpkg say so. */
static void stubs(const char *uid, bool with_sudo, bool packages_missing) {
  char dir[PATH_MAX + 8], cmd[256];
  snprintf(dir, sizeof dir, "%s/bin", th_tmpdir());
  ASSERT_EQ(mkdir(dir, 0755), 0);
  static const char *const real[] = {"dirname", "env"};
  for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
    char link[PATH_MAX + 64], target[64];
    snprintf(link, sizeof link, "%s/%s", dir, real[i]);
    snprintf(target, sizeof target, "/usr/bin/%s", real[i]);
    if (access(target, X_OK) != 0)
      snprintf(target, sizeof target, "/bin/%s", real[i]);
    ASSERT_EQ(symlink(target, link), 0);
  }
  snprintf(cmd, sizeof cmd,
           "if [ \"$1\" = -u ]; then echo %s; else echo uid=%s; fi", uid, uid);
  stub("id", cmd);
  stub("dpkg", packages_missing ? "exit 1" : "exit 0");
  stub("nproc", "echo 1");
  stub("make", "echo \"make $*\" >> \"$LOG\"");
  stub("apt-get", "echo \"apt-get $*\" >> \"$LOG\"");
  if (with_sudo)
    stub("sudo", "echo \"sudo $*\" >> \"$LOG\"; exec \"$@\"");
}

/* Runs scripts/setup.sh with the stubs; returns its exit code, its output
 * in out and what the stubs recorded in log. */
static int run_setup(const char *prefix, char *out, size_t outlen, char *log,
                     size_t loglen) {
  char script[PATH_MAX + 64], path[PATH_MAX + 16], logenv[PATH_MAX + 16],
      pre[PATH_MAX + 16], err[4096];
  snprintf(script, sizeof script, "%s/../scripts/setup.sh", th_build_dir());
  snprintf(path, sizeof path, "PATH=%s/bin", th_tmpdir());
  snprintf(logenv, sizeof logenv, "LOG=%s", th_path("log"));
  snprintf(pre, sizeof pre, "PREFIX=%s", prefix);
  th_write_file(th_path("log"), "");
  const char *argv[] = {"/bin/sh", script, NULL};
  /* No sanitizer runtime in the shell and its stub commands: a TSan
   * runtime preloaded into dash faults (the setup script is not ours to
   * check for races). */
  const char *env[] = {path, logenv, pre, "DESTDIR=", "LD_PRELOAD=", NULL};
  int rc = th_run(argv, env, out, outlen, err, sizeof err, th_ms(20000));
  snprintf(out + strlen(out), outlen - strlen(out), "%s", err);
  FILE *f = fopen(th_path("log"), "r");
  size_t n = f ? fread(log, 1, loglen - 1, f) : 0;
  log[n] = 0;
  if (f)
    fclose(f);
  return rc;
}

/* The README's command, as root on a fresh machine without sudo. */
TEST_IMPL(setup_as_root_without_sudo) {
  char out[8192], log[8192];
  stubs("0", false, true);
  int rc = run_setup(th_path("prefix"), out, sizeof out, log, sizeof log);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "setup.sh exit %d:\n%s", rc, out);
  ASSERT_CONTAINS(log, "apt-get update");
  ASSERT_CONTAINS(log, "apt-get install");
  ASSERT_CONTAINS(log, "make install PREFIX=");
  ASSERT(strncmp(log, "sudo ", 5) != 0 && !strstr(log, "\nsudo "));
}

/* As a user with sudo: packages are installed through sudo (before, the
 * script stopped: "run as root"), the build runs as the user, and the
 * install uses sudo only where the user cannot write. */
TEST_IMPL(setup_as_user_with_sudo) {
  char out[8192], log[8192];
  stubs("1000", true, true);
  int rc = run_setup(th_path("prefix"), out, sizeof out, log, sizeof log);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "setup.sh exit %d:\n%s", rc, out);
  ASSERT_CONTAINS(log, "sudo apt-get update");
  ASSERT_CONTAINS(log, "sudo env DEBIAN_FRONTEND=noninteractive apt-get");
  ASSERT_CONTAINS(log, "\nmake -j1\n");
  /* The prefix is writable here, so no sudo for the install. */
  ASSERT_CONTAINS(log, "\nmake install PREFIX=");
  ASSERT(!strstr(log, "sudo make"));
}

/* As a user without sudo, with packages missing: a message, not a hang. */
TEST_IMPL(setup_as_user_without_sudo_says_so) {
  char out[8192], log[8192];
  stubs("1000", false, true);
  int rc = run_setup(th_path("prefix"), out, sizeof out, log, sizeof log);
  ASSERT_NE(rc, 0);
  ASSERT_CONTAINS(out, "sudo is not installed");
  ASSERT(!strstr(log, "make"));
}

/* A program linked against the build tree's libcogpu.so starts (with the
 * build tree on its run path): the loader asks for the soname,
 * libcogpu.so.0, which the build tree has as well as the install. */
TEST_IMPL(build_tree_library_links_and_runs) {
  char cmd[4 * PATH_MAX], out[4096], err[8192];
  const char *b = th_build_dir();
  if (system("command -v cc >/dev/null 2>&1") != 0)
    SKIP("no C compiler (cc) to link a program with");
  th_write_file(th_path("t.c"),
                "#include <cogpu.h>\n#include <stdio.h>\n"
                "int main(void) {\n"
                "  printf(\"%s\\n\", cogpu_err_name(COGPU_ESTATE));\n"
                "  return 0;\n}\n");
  snprintf(cmd, sizeof cmd,
           "env -u LD_PRELOAD cc -I%s/../include %s -o %s -L%s -lcogpu "
           "-Wl,-rpath,%s && %s",
           b, th_path("t.c"), th_path("t"), b, b, th_path("t"));
  const char *argv[] = {"sh", "-c", cmd, NULL};
  int rc = th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(30000));
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "exit %d:\n%s%s", rc, out, err);
  ASSERT_STREQ(out, "ESTATE\n");
}
