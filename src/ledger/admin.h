/*
 * admin.h: node-administration operations used by the `cogpu` tool (reset,
 * doctor). They work on a state that cannot be attached to (corrupt, foreign
 * version), so they never map it as a client.
 */
#ifndef COGPU_LEDGER_ADMIN_H
#define COGPU_LEDGER_ADMIN_H

#include <stdbool.h>

#include "internal.h"

/* Count the processes attached to the state at cfg's state_dir (clients and
 * observers). *exists is false when there is no state file. */
int cogpu__ledger_live(const cogpu__config_t *cfg, bool *exists, int *live);

/* Remove the node state so the next user creates a new one from the
 * current configuration and GPUs. Refuses (-EBUSY) while processes are
 * attached unless force; with force they keep the old, now unlisted state
 * until they exit. */
int cogpu__ledger_reset(const cogpu__config_t *cfg, bool force, int *live);

/* Check the state file without attaching: NULL if usable, else why not. */
const char *cogpu__ledger_check(const cogpu__config_t *cfg, char *why,
                                size_t len);

#endif /* COGPU_LEDGER_ADMIN_H */
