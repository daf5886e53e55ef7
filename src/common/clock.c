/*
 * clock.c: the monotonic clock every timeout and age is measured with.
 * CLOCK_MONOTONIC is shared by all processes of the node, so deadlines and
 * ages stored in the ledger compare across processes, and wall-clock jumps
 * (NTP, an administrator) do not shorten or stretch a wait. Durations are
 * converted and added here with saturation: a bound of centuries is a very
 * long wait, not one that wraps around to the past.
 */
#include <time.h>

#include "internal.h"

uint64_t cogpu__now_ns(void) {
  struct timespec ts;
  /* Cannot fail with a valid clock id and pointer. */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t cogpu__coarse_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t cogpu__ms_to_ns(uint64_t ms) {
  return ms > UINT64_MAX / 1000000u ? UINT64_MAX : ms * 1000000u;
}

uint64_t cogpu__add_sat(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

uint64_t cogpu__deadline_ns(int64_t ms) {
  if (ms < 0)
    return UINT64_MAX;
  return cogpu__add_sat(cogpu__now_ns(), cogpu__ms_to_ns((uint64_t)ms));
}
