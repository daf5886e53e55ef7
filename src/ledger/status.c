/*
 * status.c: a consistent snapshot of the node for `cogpu status` and
 * monitoring: per GPU its figures, clients and waiters in service order.
 * Dead clients are reclaimed and foreign memory refreshed first, so the
 * snapshot never shows what is already gone.
 */
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger-int.h"

/* Is slot s listed under GPU g: it holds memory there, uses it
 * exclusively, or has its footprint there suspended? */
static bool listed(struct cogpu_s *h, uint32_t g, uint32_t s) {
  const ledger_slot_t *sl = &h->st->slots[s];
  return sl->state == SLOT_ACTIVE &&
         (sl->held[g] || h->st->hdr.gpus[g].excl_slot == s + 1 ||
          (sl->susp == SUSP_SUSPENDED && sl->susp_gpu == g) ||
          (sl->escaped && sl->escaped_gpu == g));
}

static size_t count_listed(struct cogpu_s *h, uint32_t g) {
  size_t n = 0;
  LEDGER_FOR_SLOTS(h->st, s)
  n += listed(h, g, s);
  return n;
}

static void status_clients(struct cogpu_s *h, uint32_t g, size_t max,
                           cogpu_gpu_info_t *gi, uint64_t *used,
                           uint64_t *peak) {
  ledger_gpu_t *gp = &h->st->hdr.gpus[g];
  memset(used, 0, LEDGER_MAX_SLOTS * sizeof *used);
  memset(peak, 0, LEDGER_MAX_SLOTS * sizeof *peak);
  cogpu__ledger_usage_by_job(h, g, used, peak);
  uint64_t now = cogpu__now_ns();
  LEDGER_FOR_SLOTS(h->st, s) {
    ledger_slot_t *sl = &h->st->slots[s];
    bool excl = gp->excl_slot == s + 1;
    bool parked = sl->susp == SUSP_SUSPENDED && sl->susp_gpu == g;
    if (!listed(h, g, s) || gi->nclients == max)
      continue;
    cogpu_client_info_t *c = &gi->clients[gi->nclients++];
    c->pid = sl->pid;
    c->uid = sl->uid;
    snprintf(c->command, sizeof c->command, "%s", sl->command);
    snprintf(c->job_id, sizeof c->job_id, "%s", sl->job_id);
    c->priority = sl->priority;
    c->reserved_bytes = sl->held[g];
    c->exclusive = excl;
    c->own = s == h->res_slot;
    c->state = sl->leaving != LEDGER_LEAVING_NO && sl->susp == SUSP_NONE
                   ? COGPU_JOB_EXITING
                   : (int)sl->susp;
    c->suspensions = (unsigned)sl->susp_count;
    c->used_bytes = used[s];
    c->peak_bytes = peak[s];
    if (sl->escaped && sl->escaped_gpu == g) {
      c->escaped_bytes = sl->escaped;
      c->escaped_pid = (int)sl->escaped_pid;
    }
    /* Each job's is at most the GPU's total (usage.c), and so is the
     * sum: forged usage pages made it wrap (issue 23). */
    gi->used_bytes = used[s] >= gp->total - gi->used_bytes
                         ? gp->total
                         : gi->used_bytes + used[s];
    if (parked) {
      c->suspended_bytes = sl->parked;
      c->suspended_seconds = (double)(now - sl->susp_since_ns) / 1e9;
      gi->suspended_bytes += sl->parked;
    }
  }
}

static void status_waiters(struct cogpu_s *h, uint32_t g, const uint32_t *order,
                           size_t n, cogpu_gpu_info_t *gi) {
  uint64_t now = cogpu__now_ns();
  for (size_t i = 0; i < n; i++) {
    ledger_waiter_t *wt = &h->st->waiters[order[i]];
    if (wt->gpu != COGPU_GPU_AUTO && wt->gpu != (int64_t)g)
      continue;
    /* A resume is listed as its job (suspended), with the footprint it
     * waits for, and its place. */
    /* An "any GPU" waiter is listed where it could ever be served. */
    if (wt->gpu == COGPU_GPU_AUTO && !wt->exclusive &&
        wt->bytes > cogpu__ledger_capacity(&h->st->hdr.gpus[g]))
      continue;
    ledger_slot_t *sl = &h->st->slots[wt->slot];
    cogpu_waiter_info_t *w = &gi->waiting[gi->nwaiting++];
    w->pid = sl->pid;
    w->uid = sl->uid;
    snprintf(w->command, sizeof w->command, "%s", sl->command);
    snprintf(w->job_id, sizeof w->job_id, "%s", sl->job_id);
    w->gpu = (int)wt->gpu;
    w->requested_bytes = wt->resume ? sl->parked : wt->bytes;
    w->priority = (int)wt->priority;
    w->exclusive = wt->exclusive;
    w->waiting_seconds = (double)(now - wt->since_ns) / 1e9;
    w->position = (int)gi->nwaiting;
    w->own = wt->owner == h->slot;
  }
}

static int status_fill_order(struct cogpu_s *h, cogpu_status_t *st,
                             uint32_t *order, uint64_t *used, uint64_t *peak) {
  ledger_hdr_t *hd = &h->st->hdr;
  snprintf(st->policy, sizeof st->policy, "%s",
           cogpu_policy_name((int)hd->policy));
  snprintf(st->state_path, sizeof st->state_path, "%s", h->path);
  st->layout_version = hd->version;
  st->ngpus = hd->ngpus;
  st->gpus = calloc(hd->ngpus ? hd->ngpus : 1, sizeof *st->gpus);
  if (!st->gpus)
    return -ENOMEM;
  cogpu__ledger_counters_fill(h, &st->counters);
  size_t n = cogpu__ledger_queue_order(h, order);
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    cogpu_gpu_info_t *gi = &st->gpus[g];
    ledger_gpu_t *gp = &hd->gpus[g];
    gi->index = (int)gp->index;
    snprintf(gi->uuid, sizeof gi->uuid, "%s", gp->uuid);
    snprintf(gi->name, sizeof gi->name, "%s", gp->name);
    gi->total_bytes = gp->total;
    gi->margin_bytes = gp->margin;
    gi->foreign_bytes = gp->foreign;
    gi->capacity_bytes = cogpu__ledger_capacity(gp);
    gi->reserved_bytes = gp->reserved;
    gi->max_clients = (int)hd->max_clients;
    gi->exclusive = gp->excl_slot != 0;
    size_t nc = count_listed(h, g);
    gi->clients = calloc(nc + 1, sizeof *gi->clients);
    gi->waiting = calloc(n + 1, sizeof *gi->waiting);
    if (!gi->clients || !gi->waiting)
      return -ENOMEM;
    status_clients(h, g, nc, gi, used, peak);
    status_waiters(h, g, order, n, gi);
  }
  return 0;
}

/* The queue order lives on the heap: as a thread-local it would be carried
 * by every thread of every program under the preload library. */
int cogpu__ledger_status_fill(struct cogpu_s *h, cogpu_status_t *st) {
  uint32_t *order = malloc(LEDGER_MAX_WAITERS * sizeof *order);
  uint64_t *used = malloc(2 * LEDGER_MAX_SLOTS * sizeof *used);
  int rc = order && used
               ? status_fill_order(h, st, order, used, used + LEDGER_MAX_SLOTS)
               : -ENOMEM;
  free(order);
  free(used);
  return rc;
}

/* b NULL: an observer's attachment of its own, for the snapshot. Users'
 * names are left to the caller (api.c), after every lock. */
int cogpu__ledger_status(struct cogpu_s *h, const cogpu__config_t *cfg,
                         cogpu_status_t **out) {
  struct cogpu_s *own = NULL;
  if (!h) {
    if (cfg->v[COGPU_OPT_LOG].source != COGPU_SRC_DEFAULT)
      cogpu__log_set_level((int)cfg->v[COGPU_OPT_LOG].i);
    int rc = cogpu__ledger_open(cfg, NULL, true, &own);
    if (rc)
      return rc;
    h = own;
  } else if (h->forked) {
    return cogpu__seterr(-EINVAL, "this handle belongs to the parent process");
  }
  cogpu_status_t *st = calloc(1, sizeof *st);
  int rc = st ? 0 : -ENOMEM;
  if (rc == 0) {
    cogpu__ledger_foreign_refresh(h, false);
    cogpu__ledger_shm_check_linked(h);
    ledger_sweep_t sw;
    cogpu__ledger_sweep_probe(h, &sw);
    rc = cogpu__ledger_lock_bounded(h);
    if (rc == 0) {
      if (cogpu__ledger_sweep_apply(h, &sw))
        cogpu__ledger_serve(h);
      rc = cogpu__ledger_status_fill(h, st);
      cogpu__ledger_unlock(h);
    }
  }
  char msg[512];
  snprintf(msg, sizeof msg, "%s",
           rc == -ENOMEM ? "cogpu_status: out of memory" : cogpu_last_error());
  if (own) {
    cogpu__ledger_close(own);
    cogpu__clearerr(); /* as cogpu_detach did */
  }
  if (rc) {
    cogpu_status_free(st);
    return cogpu__seterr(rc, "%s", msg);
  }
  *out = st;
  return 0;
}
