/*
 * backend.c: the ledger as the public API's backend (single-user mode):
 * each operation of backend.def on the ledger's own handle. The table is
 * generated from backend.def, so an operation this file lacks does not
 * build.
 */
#include "ledger-int.h"

static int be_attach(const cogpu__config_t *cfg,
                     const cogpu_attach_opts_t *opts, uint32_t for_uid,
                     void **b) {
  (void)for_uid; /* the ledger is the caller's own */
  struct cogpu_s *h = NULL;
  int rc = cogpu__ledger_open(cfg, opts, false, &h);
  *b = h;
  return rc;
}
static void be_detach(void *b) {
  cogpu__ledger_close(b);
}
static void be_forked(void *b) {
  cogpu__ledger_forked(b);
}
static void be_at_exit(void *b) {
  cogpu__ledger_at_exit(b);
}
static void be_set_priority(void *b, int priority) {
  ((struct cogpu_s *)b)->priority = priority;
}
static int be_reserve(void *b, const cogpu_request_t *req, int *gpu_out,
                      const cogpu__abort_t *ab) {
  return ab ? cogpu__ledger_reserve_abortable(b, req, gpu_out, ab)
            : cogpu__ledger_reserve(b, req, gpu_out);
}
static int be_release(void *b, int gpu, uint64_t bytes) {
  return cogpu__ledger_release(b, gpu, bytes);
}
static int be_held(void *b, int gpu, uint64_t *bytes) {
  return cogpu__ledger_held(b, gpu, bytes);
}
static int be_gpu_count(void *b) {
  return cogpu__ledger_gpu_count(b);
}
static int be_gpu_lookup(void *b, const char *spec, int *gpu) {
  return cogpu__ledger_gpu_lookup(b, spec, gpu);
}
static int be_job_token(void *b, char *buf, size_t len) {
  return cogpu__ledger_job_token(b, buf, len);
}
static int be_step_token(void *b, char *buf, size_t len) {
  return cogpu__ledger_step_token(b, buf, len);
}
static int be_find_job(void *b, const char *job_id, char *tok, size_t len) {
  return cogpu__ledger_find_job(b, job_id, tok, len);
}
static int be_status(void *b, const cogpu__config_t *cfg,
                     cogpu_status_t **out) {
  return cogpu__ledger_status(b, cfg, out);
}
static int be_room(void *b, int gpu, uint64_t *capacity, uint64_t *free_bytes) {
  return cogpu__ledger_room(b, gpu, capacity, free_bytes);
}
static uint64_t be_job_spare(void *b, int gpu) {
  return cogpu__ledger_job_spare(b, gpu);
}
static uint64_t be_left_ago_ms(void *b) {
  return cogpu__ledger_left_ago_ms(b);
}
static int be_recheck(void *b, int gpu, uint64_t *over) {
  return cogpu__ledger_recheck(b, gpu, over);
}
static int be_claim(void *b, int gpu, uint64_t want, uint64_t *got) {
  return cogpu__ledger_claim(b, gpu, want, got);
}
static int be_unclaim(void *b, int gpu, uint64_t bytes) {
  return cogpu__ledger_unclaim(b, gpu, bytes);
}
static int be_mark(void *b, uint32_t flags) {
  return cogpu__ledger_mark(b, flags);
}
static cogpu__usage_t *be_usage_page(void *b) {
  return cogpu__ledger_usage_page(b);
}
static int be_job_end(void *b, int exit_status, bool step,
                      cogpu__job_report_t *out) {
  return cogpu__ledger_job_end(b, exit_status, step, out);
}
static int be_job_sample(void *b, uint64_t *used, unsigned *ngpus,
                         uint64_t *at_ms) {
  return cogpu__ledger_job_sample(b, used, ngpus, at_ms);
}

const cogpu__backend_t cogpu__ledger_backend = {
    .name = "ledger",
#define XX(type, name, params) .name = be_##name,
#include "backend.def"
#undef XX
};
