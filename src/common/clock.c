/*
 * clock.c: the monotonic clock every timeout and age is measured with.
 * CLOCK_MONOTONIC is shared by all processes of the node, so deadlines and
 * ages stored in the ledger compare across processes, and wall-clock jumps
 * (NTP, an administrator) do not shorten or stretch a wait.
 */
#include <time.h>

#include "internal.h"

uint64_t cogpu__now_ns(void) {
  struct timespec ts;
  /* Cannot fail with a valid clock id and pointer. */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
