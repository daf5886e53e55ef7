/*
 * values.c: the public calls that need no handle and no backend, on plain
 * values: a status snapshot's release (whichever backend made it) and a
 * policy's name.
 */
#include <stdlib.h>

#include "cogpu.h"
#include "internal.h"

void cogpu_status_free(cogpu_status_t *st) {
  if (!st)
    return;
  for (size_t g = 0; st->gpus && g < st->ngpus; g++) {
    free(st->gpus[g].clients);
    free(st->gpus[g].waiting);
  }
  free(st->gpus);
  free(st);
}

const char *cogpu_policy_name(int policy) {
  static const char *names[] = {"fifo", "mmu", "priority-fifo", "priority-mmu"};
  if (policy < 0 || policy >= (int)COGPU_ARRAY_SIZE(names))
    return "unknown";
  return names[policy];
}
