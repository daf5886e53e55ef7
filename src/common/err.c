/*
 * err.c: error codes and messages. Names and descriptions for the COGPU_E*
 * codes come from COGPU_ERRNO_MAP in cogpu.h; negated errnos are named from
 * errno.def (glibc's strerrorname_np and strerrordesc_np need 2.32, and
 * cogpu supports 2.28). Each thread keeps the message of its last failure, set
 * by cogpu__seterr, so a return code can be explained without a handle.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Name (want_name) or description of errno e, or NULL if unknown. Constant
 * strings only: no locale, no buffer, so it is thread-safe, unlike
 * strerror. */
static const char *err_errno_text(int e, bool want_name) {
  switch (e) {
#define ERRNO(name, desc)                                                      \
  case name:                                                                   \
    return want_name ? #name : desc;
#include "errno.def"
#undef ERRNO
  default:
    return NULL;
  }
}

/* Long enough for a file path, a key and the accepted form of a value. */
#define ERR_MSG_MAX 1024

#ifdef COGPU_SMALL_TLS
/* The preload library's copy: its thread-local storage is carried by every
 * thread of every program under cogpu run, CUDA or not, so the message
 * buffer is allocated only for a thread that fails, and freed when it
 * ends (the library is never unloaded: -z nodelete). */
#include <pthread.h>
#include <stdlib.h>

static pthread_key_t err_key;
static pthread_once_t err_once = PTHREAD_ONCE_INIT;
static bool err_key_ok;

static void err_key_make(void) {
  err_key_ok = pthread_key_create(&err_key, free) == 0;
}

static char *err_buf(bool make) {
  pthread_once(&err_once, err_key_make);
  char *b = err_key_ok ? pthread_getspecific(err_key) : NULL;
  if (!b && make && err_key_ok && (b = calloc(1, ERR_MSG_MAX)) &&
      pthread_setspecific(err_key, b) != 0) {
    free(b);
    b = NULL;
  }
  return b;
}
#else
/* libcogpu and the Slurm plug-in keep the default TLS model, so that they
 * can be dlopened (and dlclosed: no key destructor left behind). */
static __thread char err_msg[ERR_MSG_MAX];

static char *err_buf(bool make) {
  (void)make;
  return err_msg;
}
#endif

COGPU_API const char *cogpu_err_name(int rc) {
  if (rc == 0)
    return "OK";
  switch (rc) {
#define ERR_NAME_CASE(name, val, msg)                                          \
  case COGPU_##name:                                                           \
    return #name;
    COGPU_ERRNO_MAP(ERR_NAME_CASE)
#undef ERR_NAME_CASE
  default:
    break;
  }
  /* Positive values are not cogpu return codes; they are refused rather than
   * read as errnos so that a forgotten minus sign shows up. */
  if (rc < 0 && rc > -4096) {
    const char *n = err_errno_text(-rc, true);
    if (n)
      return n;
  }
  return "EUNKNOWN";
}

COGPU_API const char *cogpu_strerror(int rc) {
  if (rc == 0)
    return "success";
  switch (rc) {
#define ERR_MSG_CASE(name, val, msg)                                           \
  case COGPU_##name:                                                           \
    return msg;
    COGPU_ERRNO_MAP(ERR_MSG_CASE)
#undef ERR_MSG_CASE
  default:
    break;
  }
  if (rc < 0 && rc > -4096) {
    const char *d = err_errno_text(-rc, false);
    if (d)
      return d;
  }
  return "unknown error";
}

COGPU_API const char *cogpu_last_error(void) {
  const char *b = err_buf(false);
  return b ? b : "";
}

int cogpu__seterr(int rc, const char *fmt, ...) {
  /* Format into a local buffer first: callers may pass cogpu_last_error()
   * as an argument to wrap an inner message, and the destination must not
   * overlap a source. */
  char tmp[ERR_MSG_MAX];
  int saved = errno;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0)
    tmp[0] = 0;
  char *b = err_buf(true);
  if (b)
    memcpy(b, tmp, ERR_MSG_MAX);
  errno = saved;
  return rc;
}

void cogpu__clearerr(void) {
  char *b = err_buf(false);
  if (b)
    b[0] = 0;
}
