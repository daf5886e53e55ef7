/*
 * log.c: the one logging function. Each message becomes exactly one
 * write(2) of one line to stderr, "cogpu[pid]: level: text\n", formatted in
 * a stack buffer: no malloc and no stdio, so it is safe inside interposed
 * allocation calls, in signal-free corners after fork, and while a lock is
 * held. The level comes from COGPU_LOG, read on first use.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"

/* One line, prefix included; longer messages are cut and end in "...". */
#define LOG_LINE_MAX 1024
/* Warnings after this many are dropped (one line says so), so a loop that
 * fails forever cannot flood a job's stderr. */
#define LOG_MAX_WARNINGS 100
#define LOG_UNREAD (-1)

static const char *const log_names[] = {"off", "error", "warn", "info",
                                        "debug"};

static atomic_int log_level_cur = LOG_UNREAD;
static atomic_uint log_warnings;
/* Set while this thread formats or writes a line: a log call made from
 * inside (e.g. by an interposed write) is dropped instead of recursing. */
static __thread bool log_busy;

static void log_emit(int level, const char *fmt, va_list ap) COGPU_PRINTF(2, 0);

/* Writes all of buf, retrying on EINTR and short writes (a pipe may take a
 * line in pieces when nearly full). */
static void log_write_all(const char *buf, size_t len) {
  while (len > 0) {
    ssize_t w = write(STDERR_FILENO, buf, len);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return;
    }
    buf += w;
    len -= (size_t)w;
  }
}

/* Formats the line into a stack buffer and writes it. */
static void log_emit(int level, const char *fmt, va_list ap) {
  char line[LOG_LINE_MAX];
  int p = snprintf(line, sizeof line, "cogpu[%d]: %s: ", (int)getpid(),
                   log_names[level]);
  if (p < 0)
    return;
  size_t room = sizeof line - (size_t)p - 1; /* keep one byte for '\n' */
  int n = vsnprintf(line + p, room + 1, fmt, ap);
  if (n < 0)
    n = 0;
  size_t len;
  if ((size_t)n > room) {
    /* Cut: vsnprintf stored room bytes; end with "..." and the newline. */
    len = sizeof line - 1;
    line[len - 3] = line[len - 2] = line[len - 1] = '.';
  } else {
    len = (size_t)p + (size_t)n;
    if (len > (size_t)p && line[len - 1] == '\n')
      len--; /* the caller's own newline: do not double it */
  }
  line[len++] = '\n';
  log_write_all(line, len);
}

static void log_emitf(int level, const char *fmt, ...) COGPU_PRINTF(2, 3);
static void log_emitf(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_emit(level, fmt, ap);
  va_end(ap);
}

/* Reads COGPU_LOG. The first thread to publish its result reports a bad
 * value; others use what was published, so the warning appears once. */
static int log_init_level(void) {
  const char *s = secure_getenv("COGPU_LOG");
  int level = COGPU_LOG_WARN;
  bool bad = false;
  if (s && *s) {
    bad = true;
    for (int i = 0; i < (int)COGPU_ARRAY_SIZE(log_names); i++)
      if (strcasecmp(s, log_names[i]) == 0) {
        level = i;
        bad = false;
      }
  }
  int expected = LOG_UNREAD;
  if (!atomic_compare_exchange_strong(&log_level_cur, &expected, level))
    return expected;
  if (bad)
    cogpu__log(COGPU_LOG_WARN,
               "invalid COGPU_LOG '%.64s'; accepted: off|error|warn|info|debug;"
               " using warn",
               s);
  return level;
}

int cogpu__log_level(void) {
  int level = atomic_load_explicit(&log_level_cur, memory_order_relaxed);
  return level == LOG_UNREAD ? log_init_level() : level;
}

/* A level outside off..debug (e.g. -1) makes the next message read
 * COGPU_LOG again; tests use that after changing the environment. */
void cogpu__log_set_level(int level) {
  if (level < COGPU_LOG_OFF || level > COGPU_LOG_DEBUG)
    level = LOG_UNREAD;
  atomic_store(&log_level_cur, level);
}

/* Counts a warning; false once the cap is passed. The line that reaches
 * the cap is followed by one saying that the rest are suppressed. */
static bool log_warning_allowed(bool *last) {
  unsigned n =
      atomic_fetch_add_explicit(&log_warnings, 1, memory_order_relaxed);
  *last = n + 1 == LOG_MAX_WARNINGS;
  return n < LOG_MAX_WARNINGS;
}

void cogpu__log(int level, const char *fmt, ...) {
  if (level <= COGPU_LOG_OFF || level > COGPU_LOG_DEBUG)
    return;
  if (level > cogpu__log_level() || log_busy)
    return;
  bool last = false;
  if (level == COGPU_LOG_WARN && !log_warning_allowed(&last))
    return;
  int saved = errno; /* callers log between a failure and its errno check */
  log_busy = true;
  va_list ap;
  va_start(ap, fmt);
  log_emit(level, fmt, ap);
  va_end(ap);
  if (last)
    log_emitf(COGPU_LOG_WARN, "%d warnings; further warnings are suppressed",
              LOG_MAX_WARNINGS);
  log_busy = false;
  errno = saved;
}

_Noreturn void cogpu__assert_fail(const char *file, int line, const char *cond,
                                  const char *why) {
  /* Whatever the log level: a broken invariant is never silent. */
  char buf[768];
  int n = snprintf(
      buf, sizeof buf, "cogpu[%d]: error: assertion failed at %s:%d: %s%s%s\n",
      (int)getpid(), file, line, cond, why && *why ? ": " : "", why ? why : "");
  if (n > 0)
    (void)!write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
  abort();
}
