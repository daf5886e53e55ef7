/*
 * fault.c: fault points for crash tests (sqlite's sqlite3FaultSim). Code
 * calls cogpu__fault(COGPU_FP_X) at places where a crash must be survivable;
 * COGPU_FAULT="NAME[:count[:stall|busy|fail]]" makes the process SIGKILL
 * itself at the count-th pass of point NAME (default 1), or sleep 2 s there
 * with "stall" so that a test can catch a slow holder, or keep the CPU busy
 * there for 7 s with "busy" (a holder that runs, slowly: longer than the
 * bounded lock's 5 s), or, with "fail", makes the
 * operation at a point that can fail (cogpu__fault_fails) fail there once. The
 * configuration is read once and the call costs one relaxed load and a branch
 * when COGPU_FAULT is unset.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define FAULT_UNREAD (-1LL)
#define FAULT_OFF 0LL /* cogpu__fault's inline test (internal.h) */
#define FAULT_STALL_MS 2000
#define FAULT_BUSY_MS 7000

/* Point names as COGPU_FAULT spells them, indexed by enum
 * cogpu__fault_point. */
static const char *const fault_names[COGPU_FP__COUNT] = {[COGPU_FP_NONE] =
                                                             "none",
#define X(id, name, where) [COGPU_FP_##id] = #name,
                                                         COGPU_FAULT_POINTS(X)
#undef X
};

/* The whole configuration in one word, so that it is published atomically
 * without a lock: bits 0-7 the point, bit 8 stall, bits 16- the count. */
atomic_llong cogpu__fault_conf = FAULT_UNREAD;
#define fault_conf cogpu__fault_conf
static atomic_llong fault_passes;

#define FAULT_STALL (1LL << 8)
#define FAULT_FAIL (1LL << 9)
#define FAULT_BUSY (1LL << 10)

static long long fault_pack(int point, long long mode, long count) {
  return (long long)point | mode | ((long long)count << 16);
}

static int fault_point_by_name(const char *s, size_t len) {
  for (int i = COGPU_FP_NONE + 1; i < COGPU_FP__COUNT; i++)
    if (strlen(fault_names[i]) == len &&
        strncasecmp(s, fault_names[i], len) == 0)
      return i;
  return -1;
}

/* Parses "NAME[:count[:stall|kill]]"; returns the packed form or -1. */
static long long fault_parse(const char *s) {
  size_t nlen = strcspn(s, ":");
  int point = fault_point_by_name(s, nlen);
  if (point < 0)
    return -1;
  long count = 1;
  long long mode = 0;
  const char *p = s + nlen;
  if (*p == ':') {
    char *end;
    errno = 0;
    count = strtol(p + 1, &end, 10);
    if (end == p + 1 || errno || count < 1 || count > INT32_MAX)
      return -1;
    p = end;
  }
  if (*p == ':') {
    if (strcasecmp(p + 1, "stall") == 0)
      mode = FAULT_STALL;
    else if (strcasecmp(p + 1, "busy") == 0)
      mode = FAULT_BUSY;
    else if (strcasecmp(p + 1, "fail") == 0)
      mode = FAULT_FAIL;
    else if (strcasecmp(p + 1, "kill") != 0)
      return -1;
    p += strlen(p);
  }
  return *p ? -1 : fault_pack(point, mode, count);
}

static long long fault_init(void) {
  const char *s = secure_getenv("COGPU_FAULT");
  long long conf = FAULT_OFF;
  if (s && *s) {
    conf = fault_parse(s);
    if (conf < 0) {
      char names[512] = "";
      for (int i = COGPU_FP_NONE + 1; i < COGPU_FP__COUNT; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                 i > COGPU_FP_NONE + 1 ? ", " : "", fault_names[i]);
      cogpu__log(COGPU_LOG_ERROR,
                 "invalid COGPU_FAULT '%.64s' (ignored); expected "
                 "POINT[:COUNT[:kill|stall|busy|fail]] with POINT one of %s",
                 s, names);
      conf = FAULT_OFF;
    }
  }
  long long expected = FAULT_UNREAD;
  if (!atomic_compare_exchange_strong(&fault_conf, &expected, conf))
    return expected; /* another thread published first: same result */
  return conf;
}

static void fault_stall(void) {
  struct timespec ts = {FAULT_STALL_MS / 1000, 0};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Runs on the CPU (state R) for FAULT_BUSY_MS. */
static void fault_busy(void) {
  uint64_t until = cogpu__now_ns() + cogpu__ms_to_ns(FAULT_BUSY_MS);
  while (cogpu__now_ns() < until) {
  }
}

/* Out of line, so that cogpu__fault itself stays a load and a branch.
 * True when the pass is to fail (mode "fail"). */
static __attribute__((noinline)) bool fault_hit(int point, long long conf) {
  if (conf == FAULT_UNREAD)
    conf = fault_init();
  if (conf == FAULT_OFF || (conf & 0xff) != point)
    return false;
  long long n = atomic_fetch_add(&fault_passes, 1) + 1;
  if (n != conf >> 16)
    return false;
  if (conf & FAULT_FAIL) {
    cogpu__log(COGPU_LOG_INFO, "fault point %s: failing", fault_names[point]);
    return true;
  }
  int saved = errno;
  if (conf & FAULT_STALL) {
    cogpu__log(COGPU_LOG_INFO, "fault point %s: stalling %d ms",
               fault_names[point], FAULT_STALL_MS);
    fault_stall();
  } else if (conf & FAULT_BUSY) {
    cogpu__log(COGPU_LOG_INFO, "fault point %s: busy %d ms", fault_names[point],
               FAULT_BUSY_MS);
    fault_busy();
  } else {
    kill(getpid(), SIGKILL);
  }
  errno = saved;
  return false;
}

void cogpu__fault_slow(int point, long long conf) {
  fault_hit(point, conf);
}

bool cogpu__fault_fails(int point) {
  long long conf = atomic_load_explicit(&fault_conf, memory_order_relaxed);
  if (__builtin_expect(conf == FAULT_OFF, 1))
    return false;
  return fault_hit(point, conf);
}
