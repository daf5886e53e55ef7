/*
 * engine.c: the event-driven replay (docs/simulation.md, "Method").
 *
 * Virtual time is integer milliseconds. Events (a job's next timeline
 * point or its end, a node's deadlock-guard check, the end of a suspension
 * or a resume, a crash under `shares`) sit in a binary heap ordered by
 * (time, sequence number), so that ties break in the order they were made:
 * the same inputs give the same run. Arrivals are read from the sorted
 * trace beside the heap.
 *
 * The cluster queue holds jobs in order of (re)submission. After the
 * events of one instant, the scheduler scans it and starts every job that
 * can start now, in order: a greedy backfill without reservations (a big
 * job at the head never holds back a small one behind it). A scan that
 * follows only arrivals tries only the new jobs, since nothing else
 * changed; after a release it scans the whole queue, skipping a job when
 * one no bigger, of no lower priority, already failed in this scan.
 *
 * Each node decides as cogpu does, through the ledger's core (core.h):
 * bookings with cogpu__core_fits/_granted/_released on cogpu__core_gpu_t,
 * its queue (growths of memory timelines, first reservations of jobs that
 * preempt, resumes) served with cogpu__core_order and cogpu__core_serve
 * over plain arrays, and the deadlock guard timed with
 * cogpu__core_guard_due and choosing with cogpu__core_victim_before. The
 * cluster places a job only on GPUs whose node has nobody waiting (the
 * ledger's fast path: with waiters, a new request joins the queue), so a
 * placement is always an immediate grant.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cogpu.h"
#include "internal.h"
#include "sim/engine-int.h"

enum {
  EV_STEP = 0,  /* a: job; its next timeline point or its end */
  EV_GUARD,     /* a: node */
  EV_SUSP_DONE, /* a: job */
  EV_RESUME_DONE,
  EV_CRASH, /* a: job (shares: out of memory) */
  EV_SCAN   /* the cluster scheduler's pass, --sched-delay after its cause */
};

#define MS_TO_NS(ms) ((uint64_t)(ms)*1000000ull)

/* --- the heap ------------------------------------------------------------ */

static bool ev_less(const sim_ev_t *a, const sim_ev_t *b) {
  return a->t != b->t ? a->t < b->t : a->seq < b->seq;
}

static int ev_push(sim_run_t *r, int64_t t, uint32_t type, uint32_t a,
                   uint32_t epoch) {
  /* Each step adds at most about 10^18 ms (10^15 of work at a slowdown of
   * up to 1000) to a time below SIM_MAX_NOW: no sum can overflow. Jobs
   * whose run times add up past it end the run with an error (the main
   * loop), not a wrapped clock. */
  if (t > SIM_MAX_NOW) {
    r->too_late = true;
    t = SIM_MAX_NOW;
  }
  if (r->nh == r->caph) {
    size_t nc = r->caph ? r->caph * 2 : 1024;
    sim_ev_t *nv = realloc(r->heap, nc * sizeof *nv);
    if (!nv)
      return -ENOMEM;
    r->heap = nv;
    r->caph = nc;
  }
  sim_ev_t e = {.t = t, .seq = r->seq++, .type = type, .a = a, .epoch = epoch};
  size_t i = r->nh++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!ev_less(&e, &r->heap[p]))
      break;
    r->heap[i] = r->heap[p];
    i = p;
  }
  r->heap[i] = e;
  return 0;
}

static sim_ev_t ev_pop(sim_run_t *r) {
  sim_ev_t top = r->heap[0];
  sim_ev_t last = r->heap[--r->nh];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= r->nh)
      break;
    if (c + 1 < r->nh && ev_less(&r->heap[c + 1], &r->heap[c]))
      c++;
    if (!ev_less(&r->heap[c], &last))
      break;
    r->heap[i] = r->heap[c];
    i = c;
  }
  if (r->nh)
    r->heap[i] = last;
  return top;
}

/* --- needs and keys ---------------------------------------------------- */

static const sim_job_t *job(const sim_run_t *r, uint32_t j) {
  return &r->t->jobs[j];
}

/* The bytes per GPU job j asks for first on GPU g: its timeline's first
 * point, its memory, its share of g (alibaba), or all of g. */
uint64_t cogpu__sim_need_bytes(const sim_run_t *r, uint32_t j, uint32_t g) {
  const sim_job_t *jb = job(r, j);
  if (jb->tl_n)
    return r->t->tl[jb->tl_off];
  if (jb->milli)
    return (jb->milli * r->cap[g] + 999) / 1000;
  return jb->mem ? jb->mem : r->cap[g];
}

/* Whether j wants g to itself under cogpu: no memory figure at all. */
static bool wants_whole(const sim_run_t *r, uint32_t j) {
  const sim_job_t *jb = job(r, j);
  return !jb->tl_n && !jb->milli && !jb->mem;
}

/* Under shares, a job that asks for a whole GPU gets it to itself (it
 * would ask Slurm for a GPU, not a shard): only jobs asking for a part
 * of a GPU, or for bytes, share by count. */
static bool shares_whole(const sim_run_t *r, uint32_t j) {
  return r->p->kind == SIM_SHARES &&
         (job(r, j)->milli == 1000 || wants_whole(r, j));
}

/* What the index compares: a necessary condition for j to fit on a GPU
 * (exact for shares of a GPU and for bytes). */
uint64_t cogpu__sim_need_key(const sim_run_t *r, uint32_t j) {
  const sim_job_t *jb = job(r, j);
  if (shares_whole(r, j))
    return r->o->shares;
  if (r->p->kind != SIM_COGPU)
    return 1;
  if (wants_whole(r, j))
    return r->t->frac ? 1000 : 1;
  if (r->t->frac)
    return jb->milli ? jb->milli : 1000;
  uint64_t b = jb->tl_n ? r->t->tl[jb->tl_off] : jb->mem;
  return b ? b : 1;
}

uint64_t cogpu__sim_gpu_key(const sim_run_t *r, uint32_t g) {
  uint32_t n = r->c->gpu_node[g];
  if (r->nq[n].n)
    return 0; /* somebody waits on this node: no placement there now */
  const cogpu__core_gpu_t *gp = &r->gpu[g];
  switch (r->p->kind) {
  case SIM_EXCLUSIVE:
    return gp->nclients == 0 && gp->excl == 0;
  case SIM_SHARES:
    return gp->nclients < r->o->shares ? r->o->shares - gp->nclients : 0;
  default: {
    uint64_t f = cogpu__core_free(gp);
    if (gp->excl)
      return 0;
    if (r->t->frac)
      return r->cap[g] ? f * 1000 / r->cap[g] : 0;
    return f;
  }
  }
}

static void gpu_changed(sim_run_t *r, uint32_t g) {
  cogpu__sim_index_set(r, g, cogpu__sim_gpu_key(r, g));
  if (r->p->on_gpu)
    r->p->on_gpu(r, g);
}

static void node_changed(sim_run_t *r, uint32_t n) {
  const sim_node_t *nd = &r->c->nodes[n];
  for (uint32_t k = 0; k < nd->ngpus; k++)
    gpu_changed(r, nd->gpu0 + k);
}

/* Can j be granted its first reservation on g now (the node's own
 * decision, cogpu__core_fits)? */
bool cogpu__sim_gpu_ok(const sim_run_t *r, uint32_t j, uint32_t g) {
  uint32_t n = r->c->gpu_node[g];
  if (r->nq[n].n)
    return false;
  if (!cogpu__sim_spec_ok(r->t, &r->t->jobs[j],
                          r->model_bit[r->c->nodes[n].model]))
    return false; /* not a GPU model its gpu_spec names */
  const cogpu__core_gpu_t *gp = &r->gpu[g];
  uint64_t holder = (uint64_t)j + 1;
  switch (r->p->kind) {
  case SIM_EXCLUSIVE:
    return cogpu__core_fits(&r->rules, gp, holder, 0, 0, true);
  case SIM_SHARES:
    /* Count only: max_clients is the number of shares, memory is not
     * looked at (cap is unbounded). */
    return cogpu__core_fits(&r->rules, gp, holder, 0,
                            shares_whole(r, j) ? 0 : 1, shares_whole(r, j));
  default:
    if (wants_whole(r, j))
      return cogpu__core_fits(&r->rules, gp, holder, 0, 0, true);
    return cogpu__core_fits(&r->rules, gp, holder, 0,
                            cogpu__sim_need_bytes(r, j, g), false);
  }
}

bool cogpu__sim_node_free(const sim_run_t *r, uint32_t n) {
  return r->nbusy[n] == 0 && r->nq[n].n == 0;
}

/* --- metrics as time passes ----------------------------------------------- */

static void sample(sim_run_t *r, int64_t t) {
  sim_series_t *s = r->series;
  double frag = cogpu__sim_frag(r);
  r->frag_sum += frag;
  r->frag_n++;
  if (!s)
    return;
  if (s->n == s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 256;
    sim_sample_t *nv = realloc(s->v, nc * sizeof *nv);
    if (!nv)
      return; /* the series is cut short; the totals are not */
    s->v = nv;
    s->cap = nc;
  }
  s->v[s->n++] = (sim_sample_t){
      .t = t,
      .alloc_gpus = (uint32_t)r->alloc_gpus,
      .idle_gpus = (uint32_t)(r->c->ngpus - r->alloc_gpus),
      .queued = (uint32_t)r->qlen,
      .mem_ratio = r->total_bytes ? (double)r->used_bytes / r->total_bytes : 0,
      .frag = frag,
      .suspended = r->susp_now};
}

/* Time moves from r->last to t: integrate, and take the samples due. */
static void advance(sim_run_t *r, int64_t t) {
  if (t <= r->last)
    return;
  while (r->sample > 0 && r->next_sample <= t) {
    sample(r, r->next_sample);
    r->next_sample += r->sample;
  }
  double dt = (double)(t - r->last);
  r->i_alloc += (double)r->alloc_gpus * dt;
  r->i_mem += r->total_bytes ? (double)r->used_bytes / r->total_bytes * dt : 0;
  r->i_queue += (double)r->qlen * dt;
  r->last = t;
}

/* --- bookings: every change of a GPU goes through the core ------------- */

static void book(sim_run_t *r, uint32_t j, uint32_t k, uint64_t bytes,
                 bool excl) {
  uint32_t g = r->jg[r->goff[j] + k];
  uint32_t n = r->c->gpu_node[g];
  uint64_t holder = (uint64_t)j + 1, *held = &r->jh[r->goff[j] + k];
  cogpu__core_gpu_t was = r->gpu[g];
  r->gpu[g] = cogpu__core_granted(&was, holder, *held, bytes, excl);
  if (was.nclients == 0 && r->gpu[g].nclients > 0) {
    r->alloc_gpus++;
    if (r->nbusy[n]++ == 0 && r->nq[n].n == 0)
      r->idle_node_gpus -= r->c->nodes[n].ngpus;
  }
  *held += bytes;
  r->booked += bytes;
  if (r->p->kind == SIM_COGPU) {
    /* Under cogpu a job uses what it booked. */
    r->used[g] += bytes;
    r->used_bytes += bytes;
  }
  gpu_changed(r, g);
}

static void unbook(sim_run_t *r, uint32_t j, uint32_t k, uint64_t bytes,
                   bool end_excl) {
  uint32_t g = r->jg[r->goff[j] + k];
  uint32_t n = r->c->gpu_node[g];
  uint64_t holder = (uint64_t)j + 1, *held = &r->jh[r->goff[j] + k];
  if (bytes > *held)
    bytes = *held;
  cogpu__core_gpu_t was = r->gpu[g];
  r->gpu[g] = cogpu__core_released(&was, holder, *held, bytes, end_excl);
  if (was.nclients > 0 && r->gpu[g].nclients == 0) {
    r->alloc_gpus--;
    if (--r->nbusy[n] == 0 && r->nq[n].n == 0)
      r->idle_node_gpus += r->c->nodes[n].ngpus;
  }
  *held -= bytes;
  r->booked -= bytes;
  if (r->p->kind == SIM_COGPU) {
    r->used[g] -= bytes;
    r->used_bytes -= bytes;
  }
  r->js[j].released_at = r->now;
  r->freed = true;
  gpu_changed(r, g);
}

static void use(sim_run_t *r, uint32_t j, uint64_t from, uint64_t to) {
  sim_js_t *s = &r->js[j];
  for (uint32_t k = 0; k < s->nslot; k++) {
    uint32_t g = r->jg[r->goff[j] + k];
    r->used[g] = r->used[g] - from + to;
    r->used_bytes = r->used_bytes - from + to;
  }
}

/* The job's holder lists: who holds what on a GPU (victims). */
static void holder_add(sim_run_t *r, uint32_t j, uint32_t k) {
  uint64_t sl = r->goff[j] + k;
  uint32_t g = r->jg[sl];
  if (r->inlist[sl])
    return;
  r->inlist[sl] = 1;
  r->hprev[sl] = SIM_NONE;
  r->hnext[sl] = r->hhead[g];
  if (r->hhead[g] != SIM_NONE)
    r->hprev[r->hhead[g]] = (uint32_t)sl;
  r->hhead[g] = (uint32_t)sl;
}

static void holder_del(sim_run_t *r, uint32_t j, uint32_t k) {
  uint64_t sl = r->goff[j] + k;
  uint32_t g = r->jg[sl];
  if (!r->inlist[sl])
    return;
  r->inlist[sl] = 0;
  if (r->hprev[sl] != SIM_NONE)
    r->hnext[r->hprev[sl]] = r->hnext[sl];
  else
    r->hhead[g] = r->hnext[sl];
  if (r->hnext[sl] != SIM_NONE)
    r->hprev[r->hnext[sl]] = r->hprev[sl];
}

/* The job a slot belongs to (slots are laid out job after job). */
uint32_t cogpu__sim_slot_job(const sim_run_t *r, uint64_t sl) {
  size_t lo = 0, hi = r->t->n; /* the last job whose goff <= sl */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->goff[mid] <= sl)
      lo = mid;
    else
      hi = mid;
  }
  return (uint32_t)lo;
}

/* --- the cluster queue --------------------------------------------------- */

static uint32_t prio_class(int32_t p) {
  return p < 0 ? 0 : p > 3 ? 3 : (uint32_t)p;
}

/* Where j stands in the scan's skipping (scan below): its priority class,
 * its GPUs (up to 64) and its need; false for a job the scan never skips
 * (*need is then meaningless). */
static bool scan_class(const sim_run_t *r, uint32_t j, uint32_t *p, uint32_t *k,
                       double *need) {
  const sim_job_t *jb = job(r, j);
  *k = jb->ngpus > 64 ? 64 : jb->ngpus;
  /* Without suspension priority does not matter: class 0 holds all. A
   * policy's own rank replaces it (its failures dominate as priorities'
   * do: only a higher class may preempt). */
  *p = r->p->rank ? r->p->rank(r, j) : r->p->suspend ? prio_class(jb->prio) : 0;
  *need = (double)cogpu__sim_need_key(r, j);
  /* A job that wants whole GPUs of any size (bytes, no figure) has a need
   * of 1 in the index but fits only idle GPUs: its failure says nothing
   * of smaller jobs, and a smaller job's failure nothing of it. */
  bool whole = r->p->kind == SIM_COGPU && !r->t->frac && wants_whole(r, j);
  if (whole)
    *need = INFINITY;
  /* Nor does that of a job held to some GPU models (gpu_spec). */
  return !(whole || (jb->spec && jb->ngpus));
}

#define CLASS_APART (SIM_NCLASS - 1)

static uint32_t class_of(const sim_run_t *r, uint32_t j, double *need) {
  uint32_t p, k;
  if (!scan_class(r, j, &p, &k, need))
    return CLASS_APART;
  return p * 65 + k;
}

/* Each scan class's queued jobs are a treap keyed by their place in the
 * queue (qseq), each subtree knowing the smallest need in it, so that the
 * scan finds the next job of a class that no failure rules out in
 * O(log n), instead of stepping over the ruled-out ones one by one: an
 * overloaded queue under a policy that frees memory often (suspensions,
 * resumes) is scanned from its head at each, and most of its jobs are
 * ruled out by the first failures. The priorities are a hash of the job's
 * number: the shape, never the outcome, depends on them. */
static uint32_t t_prio(uint32_t j) {
  uint32_t x = j * 0x9e3779b1u;
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  return x ^ (x >> 12);
}

static void t_update(sim_run_t *r, uint32_t t) {
  sim_js_t *s = &r->js[t];
  double m = s->cneed;
  if (s->tl != SIM_NONE && r->js[s->tl].tmin < m)
    m = r->js[s->tl].tmin;
  if (s->tr != SIM_NONE && r->js[s->tr].tmin < m)
    m = r->js[s->tr].tmin;
  s->tmin = m;
}

/* Joins two treaps, every key of a below every key of b. */
static uint32_t t_merge(sim_run_t *r, uint32_t a, uint32_t b) {
  if (a == SIM_NONE)
    return b;
  if (b == SIM_NONE)
    return a;
  if (t_prio(a) > t_prio(b)) {
    r->js[a].tr = t_merge(r, r->js[a].tr, b);
    t_update(r, a);
    return a;
  }
  r->js[b].tl = t_merge(r, a, r->js[b].tl);
  t_update(r, b);
  return b;
}

static uint32_t t_remove(sim_run_t *r, uint32_t t, uint32_t j) {
  if (t == SIM_NONE)
    return SIM_NONE; /* not there: cannot happen (asserted by the count) */
  sim_js_t *s = &r->js[t];
  if (t == j)
    return t_merge(r, s->tl, s->tr);
  if (r->js[j].qseq < s->qseq)
    s->tl = t_remove(r, s->tl, j);
  else
    s->tr = t_remove(r, s->tr, j);
  t_update(r, t);
  return t;
}

/* The first job of t at or after place lo whose need is below bound. */
static uint32_t t_find(const sim_run_t *r, uint32_t t, uint64_t lo,
                       double bound) {
  while (t != SIM_NONE) {
    const sim_js_t *s = &r->js[t];
    if (!(s->tmin < bound))
      return SIM_NONE;
    if (s->qseq < lo) {
      t = s->tr;
      continue;
    }
    uint32_t x = t_find(r, s->tl, lo, bound);
    if (x != SIM_NONE)
      return x;
    if (s->cneed < bound)
      return t;
    t = s->tr;
  }
  return SIM_NONE;
}

static void c_append(sim_run_t *r, uint32_t j) {
  double need;
  uint32_t c = class_of(r, j, &need);
  sim_js_t *s = &r->js[j];
  s->ccls = (uint16_t)c;
  /* The class apart is never skipped: its jobs all count as below any
   * bound. */
  s->cneed = c == CLASS_APART ? -INFINITY : need;
  s->tl = s->tr = SIM_NONE;
  s->tmin = s->cneed;
  /* Its place is the queue's last: joined on the right. */
  r->croot[c] = t_merge(r, r->croot[c], j);
  r->ccount[c]++;
}

static void c_remove(sim_run_t *r, uint32_t j) {
  uint32_t c = r->js[j].ccls;
  cogpu__assert(r->ccount[c] > 0);
  r->croot[c] = t_remove(r, r->croot[c], j);
  r->ccount[c]--;
}

static void q_append(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  s->st = JS_QUEUED;
  s->queued_at = r->now;
  s->qnext = SIM_NONE;
  s->qprev = r->qtail;
  if (r->qtail != SIM_NONE)
    r->js[r->qtail].qnext = j;
  else
    r->qhead = j;
  r->qtail = j;
  r->qlen++;
  s->qseq = r->qseq++;
  c_append(r, j);
  if (r->new_from == SIM_NONE)
    r->new_from = j;
}

static void q_remove(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  if (r->new_from == j)
    r->new_from = s->qnext;
  if (s->qprev != SIM_NONE)
    r->js[s->qprev].qnext = s->qnext;
  else
    r->qhead = s->qnext;
  if (s->qnext != SIM_NONE)
    r->js[s->qnext].qprev = s->qprev;
  else
    r->qtail = s->qprev;
  r->qlen--;
  c_remove(r, j);
}

/* --- running ----------------------------------------------------------- */

/* Rounded to the ms both ways, so that a stretch of work and the wall
 * time it takes convert back exactly. */
static int64_t wall(const sim_js_t *s, int64_t work) {
  if (s->slow == 1.0 || work == 0)
    return work;
  int64_t w = llround((double)work * s->slow);
  return w > 0 ? w : 1;
}

/* Work done by now (a running stretch counts at its speed). */
static int64_t work_done(const sim_run_t *r, const sim_js_t *s) {
  if (s->st != JS_RUN)
    return s->done;
  int64_t el = r->now - s->seg;
  return s->done + (s->slow == 1.0 ? el : llround((double)el / s->slow));
}

/* Schedules j's next event from now: its next timeline point or its end. */
static int go(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  const sim_job_t *jb = job(r, j);
  s->st = JS_RUN;
  s->seg = r->now;
  int64_t target = jb->dur;
  if (jb->tl_n && s->tl_k + 1 < jb->tl_n) {
    int64_t at = (int64_t)(s->tl_k + 1) * jb->tl_step;
    if (at < target)
      target = at;
  }
  int64_t left = target - s->done;
  if (left < 0)
    left = 0;
  return ev_push(r, r->now + wall(s, left), EV_STEP, j, ++s->epoch);
}

static void pause_job(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  s->done = work_done(r, s);
  if (s->done > job(r, j)->dur)
    s->done = job(r, j)->dur;
  s->epoch++;
}

int cogpu__sim_set_slow(sim_run_t *r, uint32_t j, double slow) {
  sim_js_t *s = &r->js[j];
  if (s->slow == slow)
    return 0;
  if (s->st != JS_RUN) {
    s->slow = slow;
    return 0;
  }
  /* The work of the stretch so far at the old speed, the rest at the new
   * one: seed 002's step-wise model (parameters constant between two
   * changes of the system). */
  pause_job(r, j);
  s->slow = slow;
  return go(r, j);
}

/* --- node queues: served by the ledger's core ----------------------------- */

static uint32_t ent_new(sim_run_t *r) {
  if (r->free_ent != SIM_NONE) {
    uint32_t id = r->free_ent;
    r->free_ent = r->ent[id].job;
    return id;
  }
  if (r->nent == r->capent) {
    uint32_t nc = r->capent ? r->capent * 2 : 256;
    sim_ent_t *ne = realloc(r->ent, nc * sizeof *ne);
    if (!ne)
      return SIM_NONE;
    r->ent = ne;
    r->capent = nc;
  }
  return r->nent++;
}

static void ent_free(sim_run_t *r, uint32_t id) {
  r->ent[id].job = r->free_ent;
  r->free_ent = id;
}

static int nq_push(sim_run_t *r, uint32_t n, uint32_t id) {
  sim_nq_t *q = &r->nq[n];
  if (q->n == q->cap) {
    uint32_t nc = q->cap ? q->cap * 2 : 8;
    uint32_t *ni = realloc(q->ids, nc * sizeof *ni);
    if (!ni)
      return -ENOMEM;
    q->ids = ni;
    q->cap = nc;
  }
  bool was_empty = q->n == 0;
  q->ids[q->n++] = id;
  if (was_empty) {
    if (r->nbusy[n] == 0)
      r->idle_node_gpus -= r->c->nodes[n].ngpus;
    node_changed(r, n);
  }
  return 0;
}

typedef struct serve_ctx_s {
  sim_run_t *r;
  uint32_t node;
} serve_ctx_t;

static void op_entry(void *ctx, uint32_t id, cogpu__core_entry_t *out) {
  sim_run_t *r = ((serve_ctx_t *)ctx)->r;
  const sim_ent_t *e = &r->ent[id];
  *out = (cogpu__core_entry_t){.gpu = e->gpu,
                               .priority = job(r, e->job)->prio,
                               .ticket = e->ticket,
                               .since_ns = MS_TO_NS(e->since)};
}

static int op_kind(void *ctx, uint32_t id) {
  sim_run_t *r = ((serve_ctx_t *)ctx)->r;
  const sim_ent_t *e = &r->ent[id];
  return e->served ? COGPU_CORE_SKIP : e->kind;
}

static uint64_t op_free(void *ctx, uint32_t g) {
  serve_ctx_t *c = ctx;
  return cogpu__core_free(&c->r->gpu[c->r->c->nodes[c->node].gpu0 + g]);
}

static bool op_fits(void *ctx, uint32_t id, uint32_t g) {
  serve_ctx_t *c = ctx;
  sim_run_t *r = c->r;
  const sim_ent_t *e = &r->ent[id];
  uint32_t gg = r->c->nodes[c->node].gpu0 + g;
  return cogpu__core_fits(&r->rules, &r->gpu[gg], (uint64_t)e->job + 1,
                          r->jh[r->goff[e->job] + e->k], e->bytes, false);
}

static bool op_could_fit(void *ctx, uint32_t id, uint32_t g) {
  serve_ctx_t *c = ctx;
  sim_run_t *r = c->r;
  const sim_ent_t *e = &r->ent[id];
  return e->bytes <= r->cap[r->c->nodes[c->node].gpu0 + g];
}

static void op_serve(void *ctx, uint32_t id, uint32_t g) {
  serve_ctx_t *c = ctx;
  sim_run_t *r = c->r;
  sim_ent_t *e = &r->ent[id];
  (void)g;
  uint64_t sl = r->goff[e->job] + e->k;
  if (r->jh[sl] == 0)
    holder_add(r, e->job, e->k);
  book(r, e->job, e->k, e->bytes, false);
  e->served = 1;
}

static void op_drop(void *ctx, uint32_t id) {
  (void)ctx;
  (void)id; /* every entry here can be served some day */
}

static const cogpu__core_ops_t serve_ops = {.entry = op_entry,
                                            .kind = op_kind,
                                            .free = op_free,
                                            .fits = op_fits,
                                            .could_fit = op_could_fit,
                                            .serve = op_serve,
                                            .drop = op_drop};

static int granted(sim_run_t *r, uint32_t j, const sim_ent_t *e);

/* Serves node n's queue as its ledger would: cogpu__core_order, then one
 * cogpu__core_serve pass; then tells the jobs whose entries were served. */
static int serve_node(sim_run_t *r, uint32_t n) {
  sim_nq_t *q = &r->nq[n];
  if (q->n == 0)
    return 0;
  uint32_t ids[256];
  uint32_t *order = q->n <= 256 ? ids : malloc(q->n * sizeof *order);
  if (!order)
    return -ENOMEM;
  memcpy(order, q->ids, q->n * sizeof *order);
  serve_ctx_t ctx = {r, n};
  cogpu__core_order(&r->rules, order, q->n, &serve_ops, &ctx);
  cogpu__core_serve(&r->rules, MS_TO_NS(r->now), r->c->nodes[n].ngpus, order,
                    q->n, &serve_ops, &ctx);
  if (order != ids)
    free(order);
  /* Take the served entries out (keeping the others' order), then act:
   * acting may queue new entries. */
  uint32_t kept = 0, nserved = 0;
  uint32_t served[256];
  uint32_t *sv = q->n <= 256 ? served : malloc(q->n * sizeof *sv);
  if (!sv)
    return -ENOMEM;
  for (uint32_t i = 0; i < q->n; i++) {
    uint32_t id = q->ids[i];
    if (r->ent[id].served)
      sv[nserved++] = id;
    else
      q->ids[kept++] = id;
  }
  q->n = kept;
  if (kept == 0 && nserved) {
    if (r->nbusy[n] == 0)
      r->idle_node_gpus += r->c->nodes[n].ngpus;
    node_changed(r, n);
  }
  int rc = 0;
  for (uint32_t i = 0; i < nserved && !rc; i++) {
    sim_ent_t e = r->ent[sv[i]];
    r->jent[r->goff[e.job] + e.k] = SIM_NONE;
    ent_free(r, sv[i]);
    rc = granted(r, e.job, &e);
  }
  if (sv != served)
    free(sv);
  return rc;
}

static int guard_schedule(sim_run_t *r, uint32_t n) {
  int64_t at = r->now + r->o->guard_delay;
  if (r->guard_at[n] >= at)
    return 0;
  r->guard_at[n] = at;
  return ev_push(r, at, EV_GUARD, n, 0);
}

/* Queues a request of `bytes` more for j's slot k on its node. */
static int request(sim_run_t *r, uint32_t j, uint32_t k, uint64_t bytes,
                   int kind) {
  uint32_t g = r->jg[r->goff[j] + k];
  uint32_t n = r->c->gpu_node[g];
  uint32_t id = ent_new(r);
  if (id == SIM_NONE)
    return -ENOMEM;
  r->ent[id] = (sim_ent_t){.job = j,
                           .k = k,
                           .gpu = g - r->c->nodes[n].gpu0,
                           .kind = (uint8_t)kind,
                           .bytes = bytes,
                           .ticket = ++r->ticket,
                           .since = r->now};
  r->jent[r->goff[j] + k] = id;
  r->js[j].nwait++;
  int rc = nq_push(r, n, id);
  if (!rc && kind == COGPU_CORE_REQUEST)
    rc = guard_schedule(r, n);
  return rc;
}

/* Places j on GPU g with its first reservation waiting in the node's
 * queue (a preemptor, whose victims are being suspended): it is ahead of
 * their resumes, as it would be in the ledger's queue. */
int cogpu__sim_enqueue_start(sim_run_t *r, uint32_t j, uint32_t g) {
  sim_js_t *s = &r->js[j];
  q_remove(r, j);
  r->jg[r->goff[j]] = g;
  s->nslot = 1;
  s->node = r->c->gpu_node[g];
  s->slow = 1.0;
  s->remote = 0;
  s->st = JS_NODEWAIT;
  int rc = request(r, j, 0, cogpu__sim_need_bytes(r, j, g), COGPU_CORE_REQUEST);
  return rc ? rc : serve_node(r, s->node);
}

/* --- job life ---------------------------------------------------------- */

static int end_job(sim_run_t *r, uint32_t j, bool finished);

/* A job's memory rises to `to` bytes per GPU (a timeline point). */
static int grow(sim_run_t *r, uint32_t j, uint64_t to) {
  sim_js_t *s = &r->js[j];
  uint64_t from = r->jh[r->goff[j]];
  if (r->p->kind != SIM_COGPU) {
    /* Nothing is booked by memory: the job just uses more (jh holds what
     * it uses; the core booked a share or exclusive use). */
    for (uint32_t k = 0; k < s->nslot; k++)
      r->jh[r->goff[j] + k] = to;
    use(r, j, from, to);
    for (uint32_t k = 0; k < s->nslot; k++) {
      uint32_t g = r->jg[r->goff[j] + k];
      if (r->used[g] > r->c->nodes[r->c->gpu_node[g]].gpu_total) {
        /* Out of memory: the job that asked for more dies. */
        r->res->crashes++;
        s->crashes++;
        return end_job(r, j, false);
      }
    }
    return go(r, j);
  }
  if (to <= from) {
    for (uint32_t k = 0; k < s->nslot; k++)
      unbook(r, j, k, from - to, false);
    for (uint32_t k = 0; k < s->nslot; k++) {
      int rc = serve_node(r, r->c->gpu_node[r->jg[r->goff[j] + k]]);
      if (rc)
        return rc;
    }
    return go(r, j);
  }
  uint64_t delta = to - from;
  for (uint32_t k = 0; k < s->nslot; k++) {
    uint32_t g = r->jg[r->goff[j] + k];
    uint32_t n = r->c->gpu_node[g];
    /* The ledger's fast path: with nobody waiting, grant where it fits. */
    if (r->nq[n].n == 0 &&
        cogpu__core_fits(&r->rules, &r->gpu[g], (uint64_t)j + 1,
                         r->jh[r->goff[j] + k], delta, false)) {
      book(r, j, k, delta, false);
      continue;
    }
    int rc = request(r, j, k, delta, COGPU_CORE_REQUEST);
    if (rc)
      return rc;
  }
  if (s->nwait == 0)
    return go(r, j);
  s->st = JS_BLOCKED;
  for (uint32_t k = 0; k < s->nslot; k++) {
    int rc = serve_node(r, r->c->gpu_node[r->jg[r->goff[j] + k]]);
    if (rc)
      return rc;
  }
  return 0;
}

/* Does one of j's GPUs hold more than it has (shares)? */
static bool overflowing(const sim_run_t *r, uint32_t j) {
  const sim_js_t *s = &r->js[j];
  for (uint32_t k = 0; k < s->nslot; k++) {
    uint32_t g = r->jg[r->goff[j] + k];
    if (r->used[g] > r->c->nodes[r->c->gpu_node[g]].gpu_total)
      return true;
  }
  return false;
}

/* Starts j's run on the GPUs in its slots (booked already). */
static int run_job(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  if (s->start < 0)
    s->start = r->now;
  s->ticket = ++r->ticket;
  if (r->p->kind == SIM_SHARES && s->nslot) {
    for (uint32_t k = 0; k < s->nslot; k++) {
      uint32_t g = r->jg[r->goff[j] + k];
      if (r->used[g] > r->c->nodes[r->c->gpu_node[g]].gpu_total) {
        /* Co-located jobs need more memory than the GPU has: the last one
         * to allocate dies of out-of-memory, after running a while. A
         * job that ends by then (a zero-length one included) ends: its
         * end comes no later than the crash, and wins the tie. */
        if (job(r, j)->dur <= r->o->crash_after)
          break;
        s->st = JS_RUN;
        s->seg = r->now;
        return ev_push(r, r->now + r->o->crash_after, EV_CRASH, j, ++s->epoch);
      }
    }
  }
  return go(r, j);
}

/* A node-queue entry of j was served. */
static int granted(sim_run_t *r, uint32_t j, const sim_ent_t *e) {
  sim_js_t *s = &r->js[j];
  if (s->nwait == 0 || --s->nwait > 0)
    return 0;
  switch (s->st) {
  case JS_NODEWAIT:
    return run_job(r, j);
  case JS_BLOCKED:
    return go(r, j);
  case JS_SUSPENDED: {
    s->st = JS_RESUMING;
    uint64_t bytes = 0;
    for (uint32_t k = 0; k < s->nslot; k++)
      bytes += r->jh[r->goff[j] + k];
    int64_t ms =
        (int64_t)ceil((double)bytes / (r->o->resume_gibps * SIM_GIB) * 1000.0);
    (void)e;
    return ev_push(r, r->now + ms, EV_RESUME_DONE, j, ++s->epoch);
  }
  default:
    return 0;
  }
}

/* Places j on the slots the policy chose, and starts it. */
static int place(sim_run_t *r, uint32_t j, const sim_slot_t *sl) {
  sim_js_t *s = &r->js[j];
  s->nslot = sl->ngpus;
  s->remote = sl->nremote > 0;
  s->slow = s->remote ? r->o->remote_slowdown : 1.0;
  if (s->remote)
    r->res->remote_jobs++;
  s->node = sl->ngpus ? r->c->gpu_node[r->jg[r->goff[j]]] : 0;
  for (uint32_t k = 0; k < sl->ngpus; k++) {
    uint32_t g = r->jg[r->goff[j] + k];
    uint64_t bytes = cogpu__sim_need_bytes(r, j, g);
    holder_add(r, j, k);
    switch (r->p->kind) {
    case SIM_EXCLUSIVE:
      book(r, j, k, 0, true);
      break;
    case SIM_SHARES:
      /* A share: 1 unit of an unbounded GPU; or the GPU to itself. */
      book(r, j, k, shares_whole(r, j) ? 0 : 1, shares_whole(r, j));
      break;
    default:
      if (wants_whole(r, j)) {
        book(r, j, k, 0, true); /* no memory figure: the GPU to itself */
        r->used[g] += r->cap[g];
        r->used_bytes += r->cap[g];
      } else {
        book(r, j, k, bytes, false);
      }
      continue;
    }
    /* exclusive and shares: jh is what the job uses, not a booking. */
    r->jh[r->goff[j] + k] = bytes;
    r->used[g] += bytes;
    r->used_bytes += bytes;
  }
  if (r->p->on_start) {
    int rc = r->p->on_start(r, j);
    if (rc)
      return rc;
  }
  return run_job(r, j);
}

/* Gives back everything j holds and ends it: finished, or crashed (then
 * it is resubmitted at the tail of the cluster queue, from scratch). */
/* The waiting request of job slot sl leaves node n's queue; a node whose
 * queue empties may take new jobs again. */
static void leave_queue(sim_run_t *r, uint32_t sl, uint32_t n) {
  sim_nq_t *q = &r->nq[n];
  uint32_t id = r->jent[sl], w = 0;
  for (uint32_t i = 0; i < q->n; i++)
    if (q->ids[i] != id)
      q->ids[w++] = q->ids[i];
  q->n = w;
  ent_free(r, id);
  r->jent[sl] = SIM_NONE;
  if (q->n == 0) {
    if (r->nbusy[n] == 0)
      r->idle_node_gpus += r->c->nodes[n].ngpus;
    node_changed(r, n);
  }
}

static int end_job(sim_run_t *r, uint32_t j, bool finished) {
  sim_js_t *s = &r->js[j];
  uint32_t nodes[SIM_MAX_NODE_GPUS * 4];
  uint32_t nn = 0;
  for (uint32_t k = 0; k < s->nslot; k++) {
    uint64_t sl = r->goff[j] + k;
    uint32_t g = r->jg[sl];
    uint32_t n = r->c->gpu_node[g];
    if (r->jent[sl] != SIM_NONE)
      leave_queue(r, sl, n); /* a request still waiting */
    uint64_t uses = r->jh[sl];
    bool excl = r->gpu[g].excl == (uint64_t)j + 1;
    if (r->p->kind == SIM_COGPU) {
      if (excl && !uses) {
        r->used[g] -= r->cap[g];
        r->used_bytes -= r->cap[g];
      }
      if (uses || excl)
        unbook(r, j, k, uses, excl);
    } else {
      /* The core's booking: a share of 1, or exclusive use. */
      r->jh[sl] = r->p->kind == SIM_SHARES && !excl ? 1 : 0;
      unbook(r, j, k, r->jh[sl], excl);
      r->used[g] -= uses;
      r->used_bytes -= uses;
    }
    holder_del(r, j, k);
    r->jh[sl] = 0;
    bool seen = false;
    for (uint32_t i = 0; i < nn; i++)
      seen |= nodes[i] == n;
    if (!seen && nn < COGPU_ARRAY_SIZE(nodes))
      nodes[nn++] = n;
  }
  s->nwait = 0;
  s->epoch++;
  int prc = r->p->on_finish ? r->p->on_finish(r, j) : 0;
  s->nslot = 0; /* remote stays: the outcome says how it last ran */
  s->slow = 1.0;
  s->tl_k = 0;
  s->done = 0;
  s->grow_pending = 0;
  r->freed = true;
  if (finished) {
    s->st = JS_DONE;
    s->end = r->now;
    r->res->done++;
  } else if (s->crashes > r->o->max_crashes) {
    /* Its user gives up on it (Slurm's requeue limit does the same). */
    s->st = JS_FAILED;
    s->gave_up = 1;
    s->end = r->now;
    r->res->abandoned++;
  } else {
    q_append(r, j);
  }
  for (uint32_t i = 0; i < nn; i++) {
    int rc = serve_node(r, nodes[i]);
    if (rc)
      return rc;
  }
  return prc;
}

static int step(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  const sim_job_t *jb = job(r, j);
  s->done = work_done(r, s);
  if (s->done >= jb->dur)
    return end_job(r, j, true);
  if (jb->tl_n && s->tl_k + 1 < jb->tl_n &&
      s->done >= (int64_t)(s->tl_k + 1) * jb->tl_step) {
    s->tl_k++;
    s->epoch++;
    return grow(r, j, r->t->tl[jb->tl_off + s->tl_k]);
  }
  return go(r, j);
}

/* --- suspension (cogpu+suspend) ---------------------------------------- */

void cogpu__sim_suspend(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  if (s->st == JS_RUN)
    pause_job(r, j);
  else
    s->epoch++;
  if (s->st == JS_BLOCKED) {
    /* Its waiting growth leaves the queue; it asks again after resume. */
    for (uint32_t k = 0; k < s->nslot; k++) {
      uint64_t sl = r->goff[j] + k;
      if (r->jent[sl] == SIM_NONE)
        continue;
      leave_queue(r, sl, r->c->gpu_node[r->jg[sl]]);
    }
    s->nwait = 0;
    s->grow_pending = 1;
  }
  uint64_t bytes = 0;
  for (uint32_t k = 0; k < s->nslot; k++)
    bytes += r->jh[r->goff[j] + k];
  s->st = JS_SUSPENDING;
  s->susp++;
  r->res->suspensions++;
  r->res->suspended_bytes += bytes;
  r->susp_mib[s->node] += (bytes + (1 << 20) - 1) >> 20;
  int64_t ms =
      (int64_t)ceil((double)bytes / (r->o->susp_gibps * SIM_GIB) * 1000.0);
  ev_push(r, r->now + ms, EV_SUSP_DONE, j, s->epoch);
}

/* The copy is done: its memory leaves the GPU, its resume queues. */
static int suspended(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  s->st = JS_SUSPENDED;
  uint64_t total = 0;
  for (uint32_t k = 0; k < s->nslot; k++) {
    uint64_t sl = r->goff[j] + k;
    uint64_t b = r->jh[sl];
    total += b;
    unbook(r, j, k, b, false);
    holder_del(r, j, k);
    /* The resume re-books exactly what it parked. */
    int rc = request(r, j, k, b, COGPU_CORE_RESUME);
    if (rc)
      return rc;
  }
  r->susp_now += total;
  if (r->susp_now > r->res->suspended_peak_bytes)
    r->res->suspended_peak_bytes = r->susp_now;
  for (uint32_t k = 0; k < s->nslot; k++) {
    int rc = serve_node(r, r->c->gpu_node[r->jg[r->goff[j] + k]]);
    if (rc)
      return rc;
  }
  return 0;
}

static int resumed(sim_run_t *r, uint32_t j) {
  sim_js_t *s = &r->js[j];
  uint64_t total = 0;
  for (uint32_t k = 0; k < s->nslot; k++)
    total += r->jh[r->goff[j] + k];
  r->susp_now -= total;
  uint64_t mib = (total + (1 << 20) - 1) >> 20;
  r->susp_mib[s->node] -=
      mib > r->susp_mib[s->node] ? r->susp_mib[s->node] : mib;
  if (s->grow_pending) {
    /* Ask again for the growth it was waiting for when suspended. */
    s->grow_pending = 0;
    const sim_job_t *jb = job(r, j);
    s->st = JS_RUN;
    return grow(r, j, r->t->tl[jb->tl_off + s->tl_k]);
  }
  return go(r, j);
}

/* --- the deadlock guard -------------------------------------------------- */

/* Node n's check: on a GPU where every job holding memory waits there for
 * more (its request due by cogpu__core_guard_due, and it released nothing
 * within the delay), nobody will ever release; the guard suspends the
 * victim's job if the policy can, else fails the victim's request (the job
 * dies and is resubmitted). The victim is cogpu__core_victim_before's
 * first: the lowest priority, then the newest. */
static int guard(sim_run_t *r, uint32_t n) {
  if (r->guard_at[n] == r->now)
    r->guard_at[n] = INT64_MIN;
  const sim_node_t *nd = &r->c->nodes[n];
  sim_nq_t *q = &r->nq[n];
  uint64_t delay = MS_TO_NS(r->o->guard_delay), now = MS_TO_NS(r->now);
  bool pending = false;
  for (uint32_t g = 0; g < nd->ngpus; g++) {
    uint32_t gg = nd->gpu0 + g;
    if (r->gpu[gg].nclients == 0)
      continue;
    uint64_t stuck = 0;
    int64_t victim = -1;
    cogpu__core_entry_t ve = {0};
    for (uint32_t i = 0; i < q->n; i++) {
      const sim_ent_t *e = &r->ent[q->ids[i]];
      if (e->gpu != g || e->kind != COGPU_CORE_REQUEST)
        continue;
      const sim_js_t *s = &r->js[e->job];
      if (r->jh[r->goff[e->job] + e->k] == 0)
        continue; /* holds nothing here */
      pending = true;
      if (!cogpu__core_guard_due(MS_TO_NS(e->since), now, delay) ||
          !cogpu__core_guard_due(MS_TO_NS(s->released_at), now, delay))
        continue;
      stuck++;
      cogpu__core_entry_t ce;
      serve_ctx_t ctx = {r, n};
      op_entry(&ctx, q->ids[i], &ce);
      if (victim < 0 || cogpu__core_victim_before(&ce, &ve)) {
        victim = q->ids[i];
        ve = ce;
      }
    }
    if (victim < 0 || stuck < r->gpu[gg].nclients)
      continue;
    uint32_t vj = r->ent[victim].job;
    sim_js_t *vs = &r->js[vj];
    uint64_t bytes = 0;
    for (uint32_t k = 0; k < vs->nslot; k++)
      bytes += r->jh[r->goff[vj] + k];
    uint64_t room = nd->host_mib > r->o->host_reserve_mib
                        ? nd->host_mib - r->o->host_reserve_mib
                        : 0;
    if (r->p->suspend && vs->nslot &&
        r->c->gpu_node[r->jg[r->goff[vj] + vs->nslot - 1]] == n &&
        r->susp_mib[n] + (bytes >> 20) <= room) {
      cogpu__sim_suspend(r, vj);
      return 0; /* the node is looked at again when that is done */
    }
    r->res->guard_failures++;
    vs->crashes++;
    return end_job(r, vj, false);
  }
  if (pending)
    return guard_schedule(r, n);
  return 0;
}

/* --- whole nodes for jobs larger than a node --------------------------- */

bool cogpu__sim_whole_nodes(sim_run_t *r, uint32_t j, sim_slot_t *s) {
  uint32_t need = job(r, j)->ngpus;
  if (r->idle_node_gpus < need)
    return false;
  uint32_t got = 0;
  for (uint32_t n = 0; n < r->c->nnodes && got < need; n++) {
    if (!cogpu__sim_node_free(r, n))
      continue;
    const sim_node_t *nd = &r->c->nodes[n];
    bool ok = true;
    for (uint32_t k = 0; k < nd->ngpus && ok; k++)
      ok = cogpu__sim_gpu_ok(r, j, nd->gpu0 + k);
    for (uint32_t k = 0; ok && k < nd->ngpus && got < need; k++)
      s->gpus[got++] = nd->gpu0 + k;
  }
  s->ngpus = got;
  return got == need;
}

/* --- the scan of the cluster queue ------------------------------------- */

/* A job is skipped when one of no lower priority class and no more GPUs
 * failed in this scan with a need no larger: what fits nowhere for that
 * job fits nowhere for it either. */
static bool dominated(const sim_run_t *r, uint32_t p, uint32_t k, double need) {
  for (uint32_t q = p; q < 4; q++)
    if (r->fail_need[q][k] <= need)
      return true;
  return false;
}

static void failed_at(sim_run_t *r, uint32_t p, uint32_t k, double need) {
  for (uint32_t i = k; i <= 64; i++)
    if (r->fail_need[p][i] > need)
      r->fail_need[p][i] = need;
}

/* 1: started (or placed by a preemption); 0: not now. */
static int try_start(sim_run_t *r, uint32_t j) {
  sim_slot_t sl = {.gpus = r->jg + r->goff[j]};
  uint32_t p, k;
  double need;
  bool skippable = scan_class(r, j, &p, &k, &need);
  if (skippable && dominated(r, p, k, need))
    return 0;
  bool found = r->p->find(r, j, &sl);
  if (!found && r->p->fallback) {
    sl.ngpus = sl.nremote = 0;
    int fb = r->p->fallback(r, j, &sl);
    if (fb < 0)
      return fb;
    if (fb == 2)
      return 1; /* placed by the fallback itself (a preemption) */
    found = fb == 1;
  }
  if (!found) {
    if (skippable)
      failed_at(r, p, k, need);
    return 0;
  }
  q_remove(r, j);
  int rc = place(r, j, &sl);
  return rc ? rc : 1;
}

/* Is class a's next job a tried before class b's next job b? Queue order,
 * under a policy's rank the higher rank first (the class apart holds all
 * ranks: its job's own counts). */
static bool scan_before(const sim_run_t *r, uint32_t ca, uint32_t a,
                        uint32_t cb, uint32_t b) {
  if (r->p->rank) {
    uint32_t ra = ca == CLASS_APART ? r->p->rank(r, a) : ca / 65;
    uint32_t rb = cb == CLASS_APART ? r->p->rank(r, b) : cb / 65;
    if (ra != rb)
      return ra > rb;
  }
  return r->js[a].qseq < r->js[b].qseq;
}

/* The need below which a job of class c is not ruled out now (the class
 * apart: any). */
static double c_bound(const sim_run_t *r, uint32_t c) {
  if (c == CLASS_APART)
    return INFINITY;
  double b = INFINITY;
  for (uint32_t q = c / 65; q < 4; q++)
    if (r->fail_need[q][c % 65] < b)
      b = r->fail_need[q][c % 65];
  return b;
}

/* The reference for scan (sim_opts_t.scan_walk): every job from from_seq
 * on, in queue order (under a policy's rank, the higher rank's jobs
 * first), tried one by one; try_start skips those a failure rules out.
 * Jobs queued meanwhile are reached too, as the scan reaches them. */
static int scan_walk(sim_run_t *r, uint64_t from_seq) {
  for (int rank = r->p->rank ? 3 : 0; rank >= 0; rank--)
    for (uint32_t j = r->qhead; j != SIM_NONE;) {
      uint32_t next = r->js[j].qnext;
      if (r->js[j].qseq >= from_seq &&
          (!r->p->rank || r->p->rank(r, j) == (uint32_t)rank)) {
        int rc = try_start(r, j);
        if (rc < 0)
          return rc;
      }
      j = next;
    }
  return 0;
}

/* Tries the queue from `from` in order, as if it went job by job: a job
 * skipped (dominated) does nothing, so each class is walked on its own,
 * the one whose next job came first going first, visiting only the jobs
 * that no failure so far rules out (c_bound), and a class with none left
 * is dropped for the rest of the pass. */
static int scan(sim_run_t *r) {
  if (r->p->fcfs) {
    /* First come, first served: the head starts or everyone waits. After
     * arrivals alone a waiting head still cannot start, but a scan from
     * the head costs one try, so there is no shortcut to keep. */
    r->freed = false;
    r->new_from = SIM_NONE;
    for (int p = 0; p < 4; p++) /* nothing failed yet: nothing skipped */
      for (int k = 0; k <= 64; k++)
        r->fail_need[p][k] = INFINITY;
    for (uint32_t j = r->qhead; j != SIM_NONE;) {
      uint32_t next = r->js[j].qnext;
      int rc = try_start(r, j);
      if (rc <= 0)
        return rc;
      j = next;
    }
    return 0;
  }
  uint32_t from = r->freed ? r->qhead : r->new_from;
  r->freed = false;
  r->new_from = SIM_NONE;
  for (int p = 0; p < 4; p++)
    for (int k = 0; k <= 64; k++)
      r->fail_need[p][k] = INFINITY;
  if (from == SIM_NONE)
    return 0;
  uint64_t from_seq = r->js[from].qseq;
  if (r->o->scan_walk)
    return scan_walk(r, from_seq);
  uint32_t cur[SIM_NCLASS], act[SIM_NCLASS], nact = 0;
  for (uint32_t c = 0; c < SIM_NCLASS; c++) {
    if (!r->ccount[c])
      continue;
    uint32_t j = t_find(r, r->croot[c], from_seq, INFINITY);
    if (j == SIM_NONE)
      continue;
    cur[c] = j;
    act[nact++] = c;
  }
  while (nact) {
    /* The active class whose next job is first in the queue (with a
     * policy's rank, of the highest rank first). */
    uint32_t bi = 0;
    for (uint32_t i = 1; i < nact; i++)
      if (scan_before(r, act[i], cur[act[i]], act[bi], cur[act[bi]]))
        bi = i;
    uint32_t c = act[bi], j = cur[c];
    /* A failure since it was found may rule it out (it would do nothing);
     * one that has left the queue (a try placed it) is not tried. */
    if (r->js[j].st == JS_QUEUED && r->js[j].ccls == c &&
        r->js[j].cneed < c_bound(r, c)) {
      int rc = try_start(r, j);
      if (rc < 0)
        return rc;
    }
    /* The next of its class after it (a job queued meanwhile comes after
     * every one queued before: it is found too, as in a walk). */
    uint32_t nj = t_find(r, r->croot[c], r->js[j].qseq + 1, c_bound(r, c));
    if (nj == SIM_NONE)
      act[bi] = act[--nact];
    else
      cur[c] = nj;
  }
  return 0;
}

/* Can j ever run on this cluster under this policy? */
static bool placeable(const sim_run_t *r, uint32_t j) {
  const sim_job_t *jb = job(r, j);
  if (jb->ngpus > r->c->ngpus)
    return false;
  if (jb->spec && jb->ngpus) {
    /* Enough GPUs of the models its gpu_spec names. */
    uint64_t have = 0;
    for (uint32_t n = 0; n < r->c->nnodes; n++)
      if (cogpu__sim_spec_ok(r->t, jb, r->model_bit[r->c->nodes[n].model]))
        have += r->c->nodes[n].ngpus;
    if (have < jb->ngpus)
      return false;
  }
  uint64_t peak = jb->mem;
  for (uint32_t i = 0; i < jb->tl_n; i++)
    if (r->t->tl[jb->tl_off + i] > peak)
      peak = r->t->tl[jb->tl_off + i];
  if (jb->milli || wants_whole(r, j) || jb->ngpus == 0)
    return true;
  /* A GPU of this cluster large enough (shares count that too: a job
   * bigger than any GPU dies every time). */
  uint64_t cap = r->c->max_gpu_total;
  if (r->p->kind == SIM_COGPU)
    cap = cap - cap * r->o->margin_pct / 100;
  return peak <= cap;
}

static void arrive(sim_run_t *r, uint32_t j) {
  r->res->jobs++;
  const sim_job_t *jb = job(r, j);
  if (jb->ngpus)
    r->res->gpu_jobs++;
  if (!placeable(r, j)) {
    r->js[j].st = JS_FAILED;
    r->res->unplaceable++;
    return;
  }
  if (jb->ngpus == 0) {
    r->js[j].start = r->now;
    r->js[j].nslot = 0;
    go(r, j);
    return;
  }
  q_append(r, j);
}

/* --- the run ------------------------------------------------------------ */

static int setup(sim_run_t *r) {
  const sim_trace_t *t = r->t;
  const sim_cluster_t *c = r->c;
  size_t n = t->n, ng = c->ngpus;
  r->rules = (cogpu__core_rules_t){
      .policy = r->o->node_policy,
      .max_clients = r->p->kind == SIM_SHARES ? r->o->shares : 0,
      .mmu_max_age_ns =
          r->o->mmu_max_age < 0 ? UINT64_MAX : MS_TO_NS(r->o->mmu_max_age)};
  r->gpu = calloc(ng, sizeof *r->gpu);
  r->used = calloc(ng, sizeof *r->used);
  r->cap = calloc(ng, sizeof *r->cap);
  r->hhead = malloc(ng * sizeof *r->hhead);
  r->js = calloc(n ? n : 1, sizeof *r->js);
  r->goff = malloc((n + 1) * sizeof *r->goff);
  r->nq = calloc(c->nnodes, sizeof *r->nq);
  r->nbusy = calloc(c->nnodes, sizeof *r->nbusy);
  r->susp_mib = calloc(c->nnodes, sizeof *r->susp_mib);
  r->links = calloc(c->nnodes, sizeof *r->links);
  r->guard_at = malloc(c->nnodes * sizeof *r->guard_at);
  if (!r->gpu || !r->used || !r->cap || !r->hhead || !r->js || !r->goff ||
      !r->nq || !r->nbusy || !r->susp_mib || !r->links || !r->guard_at)
    return -ENOMEM;
  uint64_t slots = 0;
  for (size_t j = 0; j < n; j++) {
    r->goff[j] = slots;
    slots += t->jobs[j].ngpus;
  }
  r->goff[n] = slots;
  cogpu__sim_spec_bits(t, c, r->model_bit);
  size_t ns = slots ? slots : 1;
  r->jg = malloc(ns * sizeof *r->jg);
  r->jh = calloc(ns, sizeof *r->jh);
  r->hnext = malloc(ns * sizeof *r->hnext);
  r->hprev = malloc(ns * sizeof *r->hprev);
  r->jent = malloc(ns * sizeof *r->jent);
  r->inlist = calloc(ns, 1);
  if (!r->jg || !r->jh || !r->hnext || !r->hprev || !r->jent || !r->inlist)
    return -ENOMEM;
  for (size_t i = 0; i < ns; i++)
    r->jent[i] = SIM_NONE;
  for (uint32_t i = 0; i < c->nnodes; i++)
    r->guard_at[i] = INT64_MIN;
  for (size_t g = 0; g < ng; g++) {
    uint64_t tot = c->nodes[c->gpu_node[g]].gpu_total;
    r->cap[g] = r->p->kind == SIM_SHARES ? UINT64_MAX / 4
                                         : tot - tot * r->o->margin_pct / 100;
    r->gpu[g].capacity = r->cap[g];
    r->hhead[g] = SIM_NONE;
    r->total_bytes += tot;
  }
  if (r->p->kind == SIM_SHARES)
    for (size_t g = 0; g < ng; g++)
      r->cap[g] = c->nodes[c->gpu_node[g]].gpu_total;
  for (size_t j = 0; j < n; j++) {
    r->js[j].start = r->js[j].end = -1;
    r->js[j].slow = 1.0;
    r->js[j].qnext = r->js[j].qprev = SIM_NONE;
    r->js[j].released_at = INT64_MIN / 2;
  }
  r->idle_node_gpus = ng;
  r->qhead = r->qtail = r->new_from = SIM_NONE;
  for (uint32_t x = 0; x < SIM_NCLASS; x++)
    r->croot[x] = SIM_NONE;
  r->free_ent = SIM_NONE;
  int rc = cogpu__sim_index_init(r);
  if (rc)
    return rc;
  for (uint32_t g = 0; g < ng; g++)
    gpu_changed(r, g);
  rc = cogpu__sim_fgd_init(r);
  if (rc)
    return rc;
  return r->p->init ? r->p->init(r) : 0;
}

static void teardown(sim_run_t *r) {
  if (r->p && r->p->fini)
    r->p->fini(r);
  cogpu__sim_fgd_free(r);
  cogpu__sim_index_free(r);
  for (uint32_t i = 0; r->nq && i < r->c->nnodes; i++)
    free(r->nq[i].ids);
  free(r->nq);
  free(r->gpu);
  free(r->used);
  free(r->cap);
  free(r->hhead);
  free(r->js);
  free(r->goff);
  free(r->jg);
  free(r->jh);
  free(r->hnext);
  free(r->hprev);
  free(r->jent);
  free(r->inlist);
  free(r->nbusy);
  free(r->susp_mib);
  free(r->links);
  free(r->guard_at);
  free(r->heap);
  free(r->ent);
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v. */
static double pct(const double *v, size_t n, double p) {
  if (n == 0)
    return 0;
  size_t k = (size_t)ceil(p / 100.0 * (double)n);
  if (k < 1)
    k = 1;
  if (k > n)
    k = n;
  return v[k - 1];
}

static int finish_results(sim_run_t *r, sim_outcome_t *out) {
  sim_result_t *res = r->res;
  size_t n = r->t->n, m = 0;
  double *w = malloc((n ? n : 1) * sizeof *w);
  double *c = malloc((n ? n : 1) * sizeof *c);
  if (!w || !c) {
    free(w);
    free(c);
    return -ENOMEM;
  }
  int64_t first = n ? r->t->jobs[0].submit : 0, last = first;
  double sw = 0, sc = 0;
  for (size_t j = 0; j < n; j++) {
    const sim_js_t *s = &r->js[j];
    if (out)
      out[j] = (sim_outcome_t){.start = s->start,
                               .end = s->end,
                               .node = s->node,
                               .crashes = s->crashes,
                               .suspensions = s->susp,
                               .remote = s->remote,
                               .failed = s->st == JS_FAILED && !s->gave_up,
                               .given_up = s->gave_up};
    if (s->end > last)
      last = s->end;
    /* Wait and completion time of GPU jobs that ran to their end. */
    if (s->st != JS_DONE || job(r, (uint32_t)j)->ngpus == 0)
      continue;
    w[m] = (double)(s->start - r->t->jobs[j].submit) / 1000.0;
    c[m] = (double)(s->end - r->t->jobs[j].submit) / 1000.0;
    sw += w[m];
    sc += c[m];
    m++;
  }
  qsort(w, m, sizeof *w, cmp_dbl);
  qsort(c, m, sizeof *c, cmp_dbl);
  res->wait_mean = m ? sw / (double)m : 0;
  res->wait_p50 = pct(w, m, 50);
  res->wait_p95 = pct(w, m, 95);
  res->wait_p99 = pct(w, m, 99);
  res->jct_mean = m ? sc / (double)m : 0;
  res->jct_p50 = pct(c, m, 50);
  res->jct_p95 = pct(c, m, 95);
  res->jct_p99 = pct(c, m, 99);
  free(w);
  free(c);
  double span = (double)(r->last - first);
  res->makespan = (double)(last - first) / 1000.0;
  if (span > 0) {
    res->alloc_ratio = r->i_alloc / span / (double)r->c->ngpus;
    res->idle_gpus = (double)r->c->ngpus - r->i_alloc / span;
    res->mem_ratio = r->i_mem / span;
    res->queue_mean = r->i_queue / span;
  }
  res->frag_ratio =
      r->frag_n ? r->frag_sum / (double)r->frag_n / (double)r->c->ngpus : 0;
  return 0;
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int cogpu__sim_run(const sim_trace_t *t, const sim_cluster_t *c,
                   const sim_policy_t *p, const sim_opts_t *o,
                   sim_result_t *res, sim_series_t *series,
                   sim_outcome_t *out) {
  sim_run_t r;
  memset(&r, 0, sizeof r);
  memset(res, 0, sizeof *res);
  snprintf(res->policy, sizeof res->policy, "%s", p->name);
  if (t->timeless)
    return cogpu__seterr(-EINVAL,
                         "the trace has no times (creation_time, "
                         "deletion_time): only FGD's experiment (--fgd) can "
                         "use it");
  r.t = t;
  r.c = c;
  r.p = p;
  r.o = o;
  r.res = res;
  r.series = series;
  r.rng = o->seed;
  double w0 = wall_now(), shown = w0;
  int rc = setup(&r);
  if (rc) {
    teardown(&r);
    return rc == -ENOMEM ? cogpu__seterr(rc, "out of memory for the run") : rc;
  }
  int64_t t0 = t->n ? t->jobs[0].submit : 0;
  r.now = r.last = t0;
  /* Samples: a fixed interval, from the trace's span (about 1,000), so
   * that the series is comparable across policies. */
  int64_t span = t->n ? t->jobs[t->n - 1].submit - t0 : 0;
  int64_t maxdur = 0;
  for (size_t j = 0; j < t->n; j++)
    maxdur = t->jobs[j].dur > maxdur ? t->jobs[j].dur : maxdur;
  r.sample = o->sample > 0 ? o->sample : (span + maxdur) / 1000;
  if (r.sample < 1000)
    r.sample = 1000;
  /* At most about a million samples, whatever --sample asks: the series'
   * memory stays bounded (the readers bound span and maxdur, so the sum
   * cannot overflow). */
  if (r.sample < (span + maxdur) / 1000000 + 1)
    r.sample = (span + maxdur) / 1000000 + 1;
  r.next_sample = t0;
  while (rc == 0) {
    bool arr = r.next_arrival < t->n;
    bool ev = r.nh > 0;
    if (!arr && !ev)
      break;
    int64_t at = arr ? t->jobs[r.next_arrival].submit : INT64_MAX;
    if (ev && r.heap[0].t < at)
      at = r.heap[0].t;
    advance(&r, at);
    r.now = at;
    if (r.too_late) {
      rc = cogpu__seterr(-EOVERFLOW,
                         "the simulated time would pass %lld ms (the jobs' "
                         "run times add up past what a run counts)",
                         (long long)SIM_MAX_NOW);
      break;
    }
    bool scan_now = false; /* a delayed scan is due at this instant */
    /* Everything that happens at this instant, then one scan. */
    while (rc == 0 && r.next_arrival < t->n &&
           t->jobs[r.next_arrival].submit == at)
      arrive(&r, (uint32_t)r.next_arrival++);
    while (rc == 0 && r.nh > 0 && r.heap[0].t == at) {
      sim_ev_t e = ev_pop(&r);
      res->events++;
      switch (e.type) {
      case EV_STEP:
        if (e.epoch == r.js[e.a].epoch && r.js[e.a].st == JS_RUN)
          rc = step(&r, e.a);
        break;
      case EV_GUARD:
        rc = guard(&r, e.a);
        break;
      case EV_SUSP_DONE:
        if (e.epoch == r.js[e.a].epoch && r.js[e.a].st == JS_SUSPENDING)
          rc = suspended(&r, e.a);
        break;
      case EV_RESUME_DONE:
        if (e.epoch == r.js[e.a].epoch && r.js[e.a].st == JS_RESUMING)
          rc = resumed(&r, e.a);
        break;
      case EV_CRASH:
        if (e.epoch == r.js[e.a].epoch && r.js[e.a].st == JS_RUN) {
          if (!overflowing(&r, e.a)) {
            /* The overflow cleared meanwhile (a co-located job ended):
             * it runs on, its work so far kept. */
            r.js[e.a].done = work_done(&r, &r.js[e.a]);
            rc = go(&r, e.a);
            break;
          }
          res->crashes++;
          r.js[e.a].crashes++;
          rc = end_job(&r, e.a, false);
        }
        break;
      case EV_SCAN:
        r.scan_due = false;
        scan_now = true;
        break;
      }
    }
    /* A real scheduler sees what lets a job start (an arrival, a release)
     * some time later: Slurm at its next scheduling pass (sched_interval,
     * bf_interval). With --sched-delay the pass comes that long after the
     * first such event since the last one; everything until then is in
     * it. */
    bool want = r.freed || r.new_from != SIM_NONE;
    if (rc == 0 && want && (o->sched_delay <= 0 || scan_now)) {
      rc = scan(&r);
    } else if (rc == 0 && want && !r.scan_due) {
      rc = ev_push(&r, r.now + o->sched_delay, EV_SCAN, 0, 0);
      r.scan_due = true;
    }
    if (!o->quiet && (res->events & 0xffff) == 0) {
      double wn = wall_now();
      if (wn - shown >= 1.0) {
        shown = wn;
        fprintf(stderr,
                "cogpu sim: %s: %zu of %zu jobs arrived, %zu done, "
                "%zu queued\n",
                p->name, r.next_arrival, t->n, res->done, r.qlen);
      }
    }
  }
  if (rc == 0) {
    if (r.sample > 0)
      sample(&r, r.now);
    /* Jobs still queued when nothing more can happen could never start
     * (their memory fits no GPU left to them): counted, not dropped. */
    for (uint32_t j = r.qhead; j != SIM_NONE; j = r.js[j].qnext)
      res->unplaceable++;
    rc = finish_results(&r, out);
  }
  res->sim_seconds = wall_now() - w0;
  teardown(&r);
  if (rc == -ENOMEM)
    return cogpu__seterr(rc, "out of memory during the run");
  return rc;
}
