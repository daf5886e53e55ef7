/*
 * counters.c: the node's counters for monitoring (cogpu metrics):
 * admissions by result, a histogram of queue waits, suspensions and
 * their copies.
 *
 * They live in the ledger header, so they count every process's decisions
 * in single-user mode and the daemon's in node mode alike, and each is a
 * logged store in the transaction that makes the decision it counts: a
 * transaction rolled back after its holder died is not counted, and a
 * decision is never counted twice.
 */
#include "ledger-int.h"

/* Fixed buckets, from a fast reply to a batch queue's hour: waits for GPU
 * memory range from a release's few milliseconds to a training job's end. */
const uint64_t cogpu__ledger_wait_le_ms[COGPU_WAIT_BUCKETS] = {
    1,     5,     10,    50,     100,    500,     1000,      5000,
    10000, 30000, 60000, 300000, 900000, 3600000, UINT64_MAX};

void cogpu__ledger_count_wait(struct cogpu_s *h, uint64_t waited_ns) {
  ledger_counters_t *c = &h->st->hdr.counters;
  size_t b = 0;
  /* A bound is inclusive (Prometheus' "le"): 1 ms exactly is in 1 ms. The
   * last bucket (+Inf) is never compared. */
  while (b + 1 < COGPU_WAIT_BUCKETS &&
         waited_ns > cogpu__ledger_wait_le_ms[b] * 1000000u)
    b++;
  cogpu__ledger_count(h, &c->wait_bucket[b]);
  cogpu__ledger_tx_set(h, &c->wait_sum_us, c->wait_sum_us + waited_ns / 1000u);
  cogpu__ledger_count_admit(h, COGPU_ADMIT_WAITED);
}

void cogpu__ledger_count_copy(struct cogpu_s *h, uint64_t bytes,
                              uint64_t took_ns) {
  ledger_counters_t *c = &h->st->hdr.counters;
  cogpu__ledger_tx_set(h, &c->copy_bytes, c->copy_bytes + bytes);
  cogpu__ledger_tx_set(h, &c->copy_us, c->copy_us + took_ns / 1000u);
  cogpu__ledger_tx_commit(h);
}

void cogpu__ledger_counters_fill(struct cogpu_s *h, cogpu_counters_t *out) {
  const ledger_counters_t *c = &h->st->hdr.counters;
  for (int i = 0; i < COGPU_ADMIT_NRESULTS; i++)
    out->admissions[i] = c->admit[i];
  for (int b = 0; b < COGPU_WAIT_BUCKETS; b++) {
    out->wait_le_ms[b] = cogpu__ledger_wait_le_ms[b];
    out->wait_count[b] = c->wait_bucket[b];
  }
  out->wait_sum_seconds = (double)c->wait_sum_us / 1e6;
  out->suspensions = c->suspensions;
  out->suspend_failures = c->suspend_failures;
  out->resumes = c->resumes;
  out->resume_failures = c->resume_failures;
  out->deadlock_suspensions = c->deadlock_suspensions;
  out->checkpoint_bytes = c->copy_bytes;
  out->checkpoint_seconds = (double)c->copy_us / 1e6;
}
