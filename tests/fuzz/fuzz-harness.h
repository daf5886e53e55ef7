/*
 * fuzz-harness.h: drives cogpud's message handler as a function, with no
 * sockets (cogpu__daemon_init in fuzz mode): a few fake connections of a few
 * users receive 512-byte messages, and after each one the ledger's
 * invariants are checked. Used by the afl++ driver (tests/fuzz/
 * fuzz-daemon.c, `make fuzz`) and by the bounded random-message test of the
 * suite (tests/node/test-security.c).
 *
 * Input: N*512 bytes. Chunk i goes to connection (first byte of the chunk's
 * seq field) % FZ_CONNS. A chunk whose seq has its top bit set and whose type
 * is WAIT or RESUME gets the identity (slot, gen, secret) of a live slot
 * patched in, so that the fuzzer reaches what lies behind authentication.
 */
#ifndef COGPU_FUZZ_HARNESS_H
#define COGPU_FUZZ_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/proto.h"

#define FZ_CONNS 6

/* Sets up a daemon in fuzz mode with its state in dir (created). Needs the
 * fake NVML (FAKE_NVML_GPUS). Returns 0 or a negative code; *why gets the
 * daemon's message. */
int fz_init(const char *dir, const char **why);
/* Ends every connection (the daemon frees what they held), so that the next
 * input starts from an idle node. */
void fz_reset(void);
/* Feeds len bytes (whole 512-byte chunks; a tail is ignored). Returns 0, or
 * -1 with *why describing the first broken invariant. */
int fz_feed(const uint8_t *buf, size_t len, const char **why);
/* Everything the harness holds is freed and the daemon finished. */
void fz_fini(void);
/* Counts of what happened, for the tests' sanity checks. */
typedef struct fz_stats_s {
  uint64_t msgs, accepted, closed, attached, reserved_ok;
  uint64_t old_accepted; /* accepted in COGPU_PROTO_VERSION_MIN */
} fz_stats_t;
const fz_stats_t *fz_stats(void);
/* A valid-looking message of type t with random fields drawn from rnd (an
 * xorshift state), for seeds and the random test. */
void fz_make(cogpu__msg_t *m, int t, uint64_t *rnd);
/* Sets m's version from the connection its seq names: every other one
 * speaks the previous protocol version (proto.h), each keeps its own. */
void fz_version(cogpu__msg_t *m);

#endif /* COGPU_FUZZ_HARNESS_H */
