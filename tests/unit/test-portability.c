/*
 * test-portability.c: what keeps cogpu running on glibc 2.28 and on every
 * architecture glibc supports: the errno names and messages cogpu carries
 * itself, the preload library's version-independent lookup of glibc's own
 * dl functions, and scripts/check-glibc.sh over the built binaries.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "task.h"

void *cogpu__pl_glibc_sym(const char *name);

/* Every errno glibc describes has a name and glibc's own (C locale)
 * description, without strerrorname_np or strerrordesc_np (glibc 2.32). */
TEST_IMPL(portability_errno_names) {
  int named = 0;
  for (int e = 1; e < 200; e++) {
    char unknown[64];
    snprintf(unknown, sizeof unknown, "Unknown error %d", e);
    const char *desc = strerror(e);
    if (strcmp(desc, unknown) == 0) {
      ASSERT_STREQ(cogpu_err_name(-e), "EUNKNOWN");
      continue;
    }
    named++;
    const char *name = cogpu_err_name(-e);
    if (strcmp(name, "EUNKNOWN") == 0 || name[0] != 'E')
      th_fail(__FILE__, __LINE__, "errno %d (%s) has no name: %s", e, desc,
              name);
    ASSERT_STREQ(cogpu_strerror(-e), desc);
  }
  ASSERT_GT(named, 120);
  ASSERT_STREQ(cogpu_err_name(-EHWPOISON), "EHWPOISON");
  ASSERT_STREQ(cogpu_err_name(-EWOULDBLOCK), "EAGAIN");
}

/* The function `name` found by cogpu__pl_glibc_sym is glibc's own (not a
 * sanitizer runtime's wrapper, which a sanitizer build's test binary would
 * call by that name). */
static void expect_glibc(const char *name) {
  void *p = cogpu__pl_glibc_sym(name);
  Dl_info info;
  if (!p || !dladdr(p, &info) || !info.dli_fname || !info.dli_sname)
    th_fail(__FILE__, __LINE__, "%s not found", name);
  if (!strstr(info.dli_fname, "/libc.so") && !strstr(info.dli_fname, "/libdl."))
    th_fail(__FILE__, __LINE__, "%s found in %s, not glibc", name,
            info.dli_fname);
  ASSERT_STREQ(info.dli_sname, name);
}

/* glibc's dlsym, dlopen and dlclose are found whatever version this
 * architecture gave them; a function under a version the known list lacks
 * (reallocarray is GLIBC_2.26 on x86-64) is found by the full search. */
TEST_IMPL(portability_glibc_dl_functions) {
  expect_glibc("dlsym");
  expect_glibc("dlopen");
  expect_glibc("dlclose");
  expect_glibc("reallocarray");
  ASSERT(cogpu__pl_glibc_sym("cogpu_no_such_function") == NULL);
}

/* The built command and libraries need nothing newer than glibc 2.28
 * (scripts/check-glibc.sh; CI runs it on the installed files too). */
TEST_IMPL(portability_binaries_run_on_glibc_2_28) {
  char cmd[4096], out[8192], err[8192];
  const char *b = th_build_dir();
  if (system("command -v objdump >/dev/null 2>&1") != 0)
    SKIP("objdump (binutils) is not installed");
  snprintf(cmd, sizeof cmd,
           "%s/../scripts/check-glibc.sh %s/cogpu %s/libcogpu.so "
           "%s/libcogpu-preload.so",
           b, b, b, b);
  const char *argv[] = {"sh", "-c", cmd, NULL};
  int rc = th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(20000));
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "check-glibc.sh failed (%d):\n%s%s", rc, out,
            err);
  ASSERT_CONTAINS(out, "check-glibc: ok (3 files");
}
