/*
 * api.c: the public API (cogpu.h, api.h) over the handle's backend. Each
 * call checks what it can without the backend (the handle, its fork state,
 * the arguments the public call promises to check), clears or sets the
 * last error as its documentation says, and hands the rest to h->be. Attach
 * picks the backend: the node daemon when cogpu__node_mode says so, the
 * ledger otherwise. The live handles are listed here, for the fork handler
 * and the exit destructor, which tell each handle's backend.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/api-int.h"
#include "ledger/ledger.h"
#include "node/node.h"

static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cogpu_handle_s *handles;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) {
  pthread_mutex_lock(&handles_mu);
}
static void fork_parent(void) {
  pthread_mutex_unlock(&handles_mu);
}

/* The child's handles are the parent's: each backend lets go of what the
 * child must not keep (the ledger's liveness lock, the daemon's
 * connection) without touching what the parent still holds. */
static void fork_child(void) {
  for (struct cogpu_handle_s *h = handles; h; h = h->next) {
    if (!h->forked)
      h->be->forked(h->b);
    h->forked = true;
  }
  pthread_mutex_unlock(&handles_mu);
}

static void fork_setup(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void handles_add(struct cogpu_handle_s *h) {
  pthread_mutex_lock(&handles_mu);
  h->next = handles;
  handles = h;
  pthread_mutex_unlock(&handles_mu);
}

static void handles_remove(struct cogpu_handle_s *h) {
  pthread_mutex_lock(&handles_mu);
  for (struct cogpu_handle_s **p = &handles; *p; p = &(*p)->next)
    if (*p == h) {
      *p = h->next;
      break;
    }
  pthread_mutex_unlock(&handles_mu);
}

/* Detach what is still attached at exit, so waiters are served now rather
 * than at their next housekeeping tick. (A process killed outright is
 * reclaimed by the others through its liveness lock.) */
__attribute__((destructor)) static void api_at_exit(void) {
  pthread_mutex_lock(&handles_mu);
  for (struct cogpu_handle_s *h = handles; h; h = h->next)
    if (!h->forked)
      h->be->at_exit(h->b);
  pthread_mutex_unlock(&handles_mu);
}

/* Names are looked up after the lock is released: NSS may be slow (LDAP).
 * Each uid once per snapshot: a node's clients belong to a few users, and
 * one lookup reads /etc/passwd (or asks LDAP) again, which with thousands
 * of clients and waiters was most of a snapshot's time. */
typedef struct name_cache_s {
  uint32_t uid[16];
  char name[16][sizeof(((cogpu_client_info_t *)0)->user)];
  size_t n, next;
} name_cache_t;

static void cached_name(name_cache_t *nc, uint32_t uid, char *buf, size_t len) {
  for (size_t i = 0; i < nc->n; i++)
    if (nc->uid[i] == uid) {
      snprintf(buf, len, "%s", nc->name[i]);
      return;
    }
  cogpu__user_name(uid, buf, len);
  size_t k = nc->n < 16 ? nc->n++ : nc->next++ % 16;
  nc->uid[k] = uid;
  snprintf(nc->name[k], sizeof nc->name[k], "%s", buf);
}

static void status_names(cogpu_status_t *st) {
  name_cache_t nc = {.n = 0};
  for (size_t g = 0; g < st->ngpus; g++) {
    cogpu_gpu_info_t *gi = &st->gpus[g];
    for (size_t i = 0; i < gi->nclients; i++)
      cached_name(&nc, gi->clients[i].uid, gi->clients[i].user,
                  sizeof gi->clients[i].user);
    for (size_t i = 0; i < gi->nwaiting; i++)
      cached_name(&nc, gi->waiting[i].uid, gi->waiting[i].user,
                  sizeof gi->waiting[i].user);
  }
}

static int bad_handle(void) {
  return cogpu__seterr(-EINVAL, "invalid cogpu handle");
}

int cogpu__attach_mode(void) {
  cogpu__config_t cfg;
  int rc = cogpu__config_load(&cfg);
  return rc ? rc : cogpu__node_mode(&cfg);
}

int cogpu__attach_as(const cogpu_attach_opts_t *opts, uint32_t for_uid,
                     cogpu_t **out) {
  cogpu__clearerr();
  if (!out)
    return cogpu__seterr(-EINVAL, "cogpu_attach: out is NULL");
  pthread_once(&fork_once, fork_setup);
  struct cogpu_handle_s *h = calloc(1, sizeof *h);
  if (!h)
    return cogpu__seterr(-ENOMEM, "out of memory");
  int rc = cogpu__config_load(&h->cfg);
  if (rc == 0 && h->cfg.v[COGPU_OPT_LOG].source != COGPU_SRC_DEFAULT)
    cogpu__log_set_level((int)h->cfg.v[COGPU_OPT_LOG].i);
  int node = rc == 0 ? cogpu__node_mode(&h->cfg) : 0;
  h->be = node == 1 ? &cogpu__node_backend : &cogpu__ledger_backend;
  if (rc == 0)
    rc = h->be->attach(&h->cfg, opts, for_uid, &h->b);
  if (rc) {
    free(h);
    return rc;
  }
  handles_add(h);
  *out = h;
  return 0;
}

int cogpu_attach(const cogpu_attach_opts_t *opts, cogpu_t **out) {
  return cogpu__attach_as(opts, (uint32_t)-1, out);
}

int cogpu_detach(cogpu_t *h) {
  cogpu__clearerr();
  if (!h)
    return bad_handle();
  handles_remove(h);
  h->be->detach(h->b);
  free(h);
  return 0;
}

/* Without a handle: the node's daemon in node mode, else an observer's
 * attachment to the ledger for the moment of the snapshot. */
int cogpu_status(cogpu_t *h, cogpu_status_t **out) {
  cogpu__clearerr();
  if (!out)
    return cogpu__seterr(-EINVAL, "cogpu_status: out is NULL");
  if (h && h->forked)
    return cogpu__seterr(-EINVAL, "this handle belongs to the parent process");
  int rc;
  if (h) {
    rc = h->be->status(h->b, &h->cfg, out);
  } else {
    cogpu__config_t cfg;
    rc = cogpu__config_load(&cfg);
    if (rc)
      return rc;
    const cogpu__backend_t *be = cogpu__node_mode(&cfg) == 1
                                     ? &cogpu__node_backend
                                     : &cogpu__ledger_backend;
    rc = be->status(NULL, &cfg, out);
  }
  if (rc == 0)
    status_names(*out);
  return rc;
}

int cogpu_reserve(cogpu_t *h, const cogpu_request_t *req, int *gpu_out) {
  if (!h || !req)
    return cogpu__seterr(-EINVAL, "cogpu_reserve: NULL handle or request");
  if (h->forked)
    return cogpu__seterr(-EINVAL, "this handle belongs to the parent process "
                                  "(fork): attach again in the child");
  return h->be->reserve(h->b, req, gpu_out, NULL);
}

/* In node mode the request keeps its place in the queue while the caller
 * is asked whether to go on; the ledger waits in slices (reserve.c). */
int cogpu__reserve_abortable(cogpu_t *h, const cogpu_request_t *req,
                             int *gpu_out, const cogpu__abort_t *ab) {
  if (!ab || !ab->stop || !req || req->timeout_ms == COGPU_NOWAIT)
    return cogpu_reserve(h, req, gpu_out);
  if (!h || h->forked)
    return cogpu_reserve(h, req, gpu_out); /* its refusal */
  return h->be->reserve(h->b, req, gpu_out, ab);
}

int cogpu_release(cogpu_t *h, int gpu, uint64_t bytes) {
  cogpu__clearerr();
  return h ? h->be->release(h->b, gpu, bytes) : bad_handle();
}

int cogpu_held(cogpu_t *h, int gpu, uint64_t *bytes) {
  return h ? h->be->held(h->b, gpu, bytes) : bad_handle();
}

int cogpu_gpu_count(cogpu_t *h) {
  return h ? h->be->gpu_count(h->b) : bad_handle();
}

int cogpu_gpu_lookup(cogpu_t *h, const char *spec, int *gpu) {
  return h ? h->be->gpu_lookup(h->b, spec, gpu) : bad_handle();
}

int cogpu_job_token(cogpu_t *h, char *buf, size_t len) {
  return h ? h->be->job_token(h->b, buf, len) : bad_handle();
}

int cogpu__step_token(cogpu_t *h, char *buf, size_t len) {
  return h ? h->be->step_token(h->b, buf, len) : bad_handle();
}

int cogpu__find_job(cogpu_t *h, const char *job_id, char *tok, size_t len) {
  return h ? h->be->find_job(h->b, job_id, tok, len) : bad_handle();
}

int cogpu__room(cogpu_t *h, int gpu, uint64_t *capacity, uint64_t *free_bytes) {
  return h ? h->be->room(h->b, gpu, capacity, free_bytes) : bad_handle();
}

uint64_t cogpu__job_spare(cogpu_t *h, int gpu) {
  return h ? h->be->job_spare(h->b, gpu) : 0;
}

uint64_t cogpu__left_ago_ms(cogpu_t *h) {
  return h ? h->be->left_ago_ms(h->b) : UINT64_MAX;
}

int cogpu__recheck(cogpu_t *h, int gpu, uint64_t *over) {
  *over = 0;
  return h ? h->be->recheck(h->b, gpu, over)
           : cogpu__seterr(-EINVAL, "not attached");
}

int cogpu__claim(cogpu_t *h, int gpu, uint64_t want, uint64_t *got) {
  return h ? h->be->claim(h->b, gpu, want, got) : bad_handle();
}

int cogpu__unclaim(cogpu_t *h, int gpu, uint64_t bytes) {
  return h ? h->be->unclaim(h->b, gpu, bytes) : bad_handle();
}

int cogpu__mark(cogpu_t *h, uint32_t flags) {
  return h ? h->be->mark(h->b, flags) : bad_handle();
}

cogpu__usage_t *cogpu__usage_page(cogpu_t *h) {
  return h && !h->forked ? h->be->usage_page(h->b) : NULL;
}

static int job_end(cogpu_t *h, int exit_status, bool step,
                   cogpu__job_report_t *out) {
  cogpu__clearerr();
  if (!h || !out)
    return cogpu__seterr(-EINVAL, "cogpu__job_end: no handle");
  return h->be->job_end(h->b, exit_status, step, out);
}

int cogpu__job_end(cogpu_t *h, int exit_status, cogpu__job_report_t *out) {
  return job_end(h, exit_status, false, out);
}

int cogpu__step_end(cogpu_t *h, int exit_status, cogpu__job_report_t *out) {
  return job_end(h, exit_status, true, out);
}

int cogpu__job_sample(cogpu_t *h, uint64_t *used, unsigned *ngpus,
                      uint64_t *at_ms) {
  cogpu__clearerr();
  if (!h || !used || !ngpus || !at_ms)
    return cogpu__seterr(-EINVAL, "cogpu__job_sample: bad argument");
  return h->be->job_sample(h->b, used, ngpus, at_ms);
}

struct cogpu_s *cogpu__ledger_of(cogpu_t *h) {
  return h && h->be == &cogpu__ledger_backend ? h->b : NULL;
}
