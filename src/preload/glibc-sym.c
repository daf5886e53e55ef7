/*
 * glibc-sym.c: glibc's own dlsym, dlopen and dlclose, found with dlvsym
 * (which we do not override, so the lookup cannot come back through our
 * exported dlsym). dlvsym needs the symbol version, which depends on the
 * architecture and on the glibc release: GLIBC_2.34 wherever glibc is 2.34
 * or later (the dl functions moved into libc then), before that the
 * architecture's first version (GLIBC_2.2.5 on x86-64, GLIBC_2.17 on
 * aarch64 and ppc64le, ...). The known versions are tried first; then every
 * version glibc could have used, so that an architecture not listed works
 * too. If none is found, the library says so at load: the exported dlsym
 * would answer NULL to every lookup of the program.
 *
 * This code runs while sanitizer runtimes start up, so it calls nothing
 * they intercept (no string or stdio functions) and is not instrumented.
 */
#include <dlfcn.h>
#include <stddef.h>

#include "preload/preload-int.h"

/* The versions of the dl functions on the architectures glibc supports,
 * most common first. */
static const char *const glibcsym_known[] = {
    "GLIBC_2.34",  /* every architecture, glibc 2.34 and later */
    "GLIBC_2.2.5", /* x86-64 */
    "GLIBC_2.17",  /* aarch64, ppc64le */
    "GLIBC_2.27",  /* riscv64 */
    "GLIBC_2.2",   /* s390x, alpha, ia64, sh */
    "GLIBC_2.3",   /* ppc64 (big-endian) */
    "GLIBC_2.4",   /* arm */
    "GLIBC_2.0",   /* i386, 32-bit ppc, s390, sparc, mips */
    "GLIBC_2.1",   /* i386 (dlopen, dlclose) */
    "GLIBC_2.35",  /* or1k */
    "GLIBC_2.36",  /* loongarch64 */
};

/* Writes "GLIBC_2.<minor>" or "GLIBC_2.<minor>.<patch>" (patch > 0) into
 * buf; no libc call. */
PRELOAD_EARLY static void glibcsym_version(char *buf, int minor, int patch) {
  static const char prefix[] = "GLIBC_2.";
  size_t n = 0;
  for (; prefix[n]; n++)
    buf[n] = prefix[n];
  if (minor >= 10)
    buf[n++] = (char)('0' + minor / 10);
  buf[n++] = (char)('0' + minor % 10);
  if (patch > 0) {
    buf[n++] = '.';
    buf[n++] = (char)('0' + patch);
  }
  buf[n] = 0;
}

PRELOAD_EARLY void *cogpu__pl_glibc_sym(const char *name) {
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(glibcsym_known); i++) {
    void *p = dlvsym(RTLD_NEXT, name, glibcsym_known[i]);
    if (p)
      return p;
  }
  /* Every version glibc 2.x could have given them: 2.0 to 2.99, and the
   * patch versions of the early releases (2.0.1 to 2.3.9). */
  char v[16];
  for (int minor = 0; minor < 100; minor++) {
    for (int patch = 0; patch < (minor < 4 ? 10 : 1); patch++) {
      glibcsym_version(v, minor, patch);
      void *p = dlvsym(RTLD_NEXT, name, v);
      if (p)
        return p;
    }
  }
  return NULL;
}

/* Says at load, once, if the program's dlsym lookups would all fail. */
__attribute__((constructor)) static void glibcsym_check(void) {
  if (!cogpu__pl_glibc_sym("dlsym"))
    cogpu__log(COGPU_LOG_ERROR,
               "cannot find glibc's dlsym (dlvsym found no version of it): "
               "every dlsym lookup of this program will fail; run it without "
               "the preload library (cogpu run --no-preload) and report the "
               "platform");
}
