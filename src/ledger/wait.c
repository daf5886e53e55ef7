/*
 * wait.c: futex sleeping and waking on words in the shared state. Waiters
 * never poll and never use signals (applications own their handlers); a
 * release wakes exactly the waiters it served.
 */
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ledger-int.h"

void cogpu__ledger_futex_wait(_Atomic uint32_t *word, uint32_t val,
                              int64_t timeout_ms) {
  struct timespec ts, *tp = NULL;
  if (timeout_ms >= 0) {
    ts.tv_sec = timeout_ms / 1000;
    ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
    tp = &ts;
  }
  /* Not FUTEX_PRIVATE: the word is shared between processes. EINTR,
   * EAGAIN (value changed) and ETIMEDOUT all mean "look again". */
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, tp, NULL, 0);
}

void cogpu__ledger_futex_wake(_Atomic uint32_t *word, int n) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
}
