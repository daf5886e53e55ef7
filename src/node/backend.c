/*
 * backend.c: the node client as the public API's backend (node mode):
 * each operation of backend.def as a request to cogpud (client.c). The
 * table is generated from backend.def, so an operation this file lacks
 * does not build.
 */
#include <errno.h>

#include "node/node.h"

static int be_attach(const cogpu__config_t *cfg,
                     const cogpu_attach_opts_t *opts, uint32_t for_uid,
                     void **b) {
  cogpu__node_t *n = NULL;
  int rc = cogpu__node_attach(cfg, opts, for_uid, &n);
  *b = n;
  return rc;
}
static void be_detach(void *b) {
  cogpu__node_detach(b);
}
static void be_forked(void *b) {
  cogpu__node_forked(b);
}
/* Nothing to do at exit: the kernel closes the connection, and the daemon
 * frees the slot when it sees it closed. */
static void be_at_exit(void *b) {
  (void)b;
}
/* The daemon took the process's priority at attach. */
static void be_set_priority(void *b, int priority) {
  (void)b;
  (void)priority;
}
static int be_reserve(void *b, const cogpu_request_t *req, int *gpu_out,
                      const cogpu__abort_t *ab) {
  cogpu__clearerr();
  return cogpu__node_reserve(b, req, gpu_out, ab);
}
static int be_release(void *b, int gpu, uint64_t bytes) {
  return cogpu__node_release(b, gpu, bytes);
}
static int be_held(void *b, int gpu, uint64_t *bytes) {
  return cogpu__node_held(b, gpu, bytes);
}
static int be_gpu_count(void *b) {
  return cogpu__node_gpu_count(b);
}
static int be_gpu_lookup(void *b, const char *spec, int *gpu) {
  return cogpu__node_gpu_lookup(b, spec, gpu);
}
static int be_job_token(void *b, char *buf, size_t len) {
  return cogpu__node_job_token(b, buf, len);
}
static int be_step_token(void *b, char *buf, size_t len) {
  return cogpu__node_step_token(b, buf, len);
}
static int be_find_job(void *b, const char *job_id, char *tok, size_t len) {
  return cogpu__node_find_job(b, job_id, tok, len);
}
static int be_status(void *b, const cogpu__config_t *cfg,
                     cogpu_status_t **out) {
  return cogpu__node_status(cfg, b, out);
}
static int be_room(void *b, int gpu, uint64_t *capacity, uint64_t *free_bytes) {
  return cogpu__node_room(b, gpu, capacity, free_bytes);
}
static uint64_t be_job_spare(void *b, int gpu) {
  return cogpu__node_job_spare(b, gpu);
}
static uint64_t be_left_ago_ms(void *b) {
  return cogpu__node_left_ago_ms(b);
}
static int be_recheck(void *b, int gpu, uint64_t *over) {
  return cogpu__node_recheck(b, gpu, over);
}
static int be_claim(void *b, int gpu, uint64_t want, uint64_t *got) {
  return cogpu__node_claim(b, gpu, want, got);
}
static int be_unclaim(void *b, int gpu, uint64_t bytes) {
  return cogpu__node_unclaim(b, gpu, bytes);
}
static int be_mark(void *b, uint32_t flags) {
  return cogpu__node_mark(b, flags);
}
static cogpu__usage_t *be_usage_page(void *b) {
  return cogpu__node_usage_page(b);
}
static int be_job_end(void *b, int exit_status, bool step,
                      cogpu__job_report_t *out) {
  return cogpu__node_job_end(b, exit_status, step, out);
}
/* The daemon samples its jobs itself (record.c). */
static int be_job_sample(void *b, uint64_t *used, unsigned *ngpus,
                         uint64_t *at_ms) {
  (void)b;
  (void)used;
  (void)ngpus;
  (void)at_ms;
  return cogpu__seterr(-ENOTSUP, "the node daemon samples its jobs");
}

const cogpu__backend_t cogpu__node_backend = {
    .name = "node",
#define XX(type, name, params) .name = be_##name,
#include "backend.def"
#undef XX
};
