/*
 * usage.c: what the processes of each job use, for status, the end-of-job
 * report and the job's history record (docs/history.md).
 *
 * A process's own figures (used and peak per GPU) are the preload
 * library's exact counts, published in its usage page. A job is a slot and
 * the member slots that joined it (cogpu run's command, a Slurm step's
 * tasks). Its used bytes are the sum of its live processes'; its peak is
 * the highest of: each process's own peak (those that ended are folded
 * into the job's slot when they leave), and the sum of its processes' used
 * bytes wherever it is looked at (snapshots, the report, the daemon's
 * samples). So the peak is exact for a job whose processes use the GPU one
 * at a time (a single program, or a script running them in turn); for
 * processes that allocate at the same moment it lies between the largest
 * process's peak and the true one.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ledger-int.h"

static uint64_t rd(const _Atomic uint64_t *p) {
  return atomic_load_explicit(p, memory_order_relaxed);
}

static uint64_t max_u(uint64_t a, uint64_t b) {
  return a > b ? a : b;
}

/* A process's figures are its own to write (its usage page, or its slot
 * in single-user mode), so each is taken as at most what its GPU holds,
 * and every sum stops there: two pages that claimed 2^63 bytes each added
 * up to a job, and a GPU, using 0 (issue 23). */
static uint64_t gpu_total(const struct cogpu_s *h, uint32_t g) {
  return h->st->hdr.gpus[g].total;
}

static uint64_t used_of(const struct cogpu_s *h, const ledger_slot_t *sl,
                        uint32_t g) {
  uint64_t v = rd(&sl->usage.used[g]);
  return v < gpu_total(h, g) ? v : gpu_total(h, g);
}

static uint64_t peak_of(const struct cogpu_s *h, const ledger_slot_t *sl,
                        uint32_t g) {
  uint64_t v = rd(&sl->usage.peak[g]);
  return v < gpu_total(h, g) ? v : gpu_total(h, g);
}

/* a + b, at most max. */
static uint64_t add_at(uint64_t a, uint64_t b, uint64_t max) {
  return a >= max || b >= max - a ? max : a + b;
}

static void sync_slot(struct cogpu_s *h, uint32_t s) {
  const ledger_usage_hooks_t *uh = cogpu__ledger_usage_hooks(h);
  if (uh && uh->sync)
    uh->sync(uh->ctx, h, s);
}

/* The job slot slot s belongs to (itself, or the live job it joined). */
static uint32_t job_of(struct cogpu_s *h, uint32_t s) {
  const ledger_slot_t *sl = &h->st->slots[s];
  if (sl->job == 0 || sl->job > LEDGER_MAX_SLOTS)
    return s;
  uint32_t j = (uint32_t)(sl->job - 1);
  const ledger_slot_t *js = &h->st->slots[j];
  if (js->state != SLOT_ACTIVE || atomic_load(&js->gen) != sl->job_gen)
    return s;
  return j;
}

uint32_t cogpu__ledger_job_of(struct cogpu_s *h, uint32_t s) {
  return job_of(h, s);
}

static void raise_job_peak(ledger_slot_t *js, uint32_t g, uint64_t v,
                           uint64_t at_ns) {
  if (v > js->job_peak[g]) {
    js->job_peak[g] = v;
    js->job_peak_ns = at_ns;
  }
}

static uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The step slot s's processes belong to for its report: the live step it
 * joined through, else its job (s itself for a job). */
static uint32_t step_of(struct cogpu_s *h, uint32_t s) {
  const ledger_slot_t *sl = &h->st->slots[s];
  if (sl->group == 0 || sl->group > LEDGER_MAX_SLOTS)
    return job_of(h, s);
  uint32_t g = (uint32_t)(sl->group - 1);
  const ledger_slot_t *gs = &h->st->slots[g];
  if (gs->state != SLOT_ACTIVE || atomic_load(&gs->gen) != sl->group_gen)
    return job_of(h, s);
  return g;
}

static void raise_step_peak(ledger_slot_t *gs, uint32_t g, uint64_t v,
                            uint64_t at_ns) {
  if (v > gs->group_peak[g]) {
    gs->group_peak[g] = v;
    gs->group_peak_ns = at_ns;
  }
}

/* Slot m's processes counted in slot s's figures: the job's or the
 * step's. */
static bool counts_in(struct cogpu_s *h, uint32_t m, uint32_t s, bool step) {
  return step ? step_of(h, m) == s : job_of(h, m) == s;
}

/* The job (or step) of slot s on GPU g: its live processes' used bytes
 * and its peak, with *peak_ns when that peak was reached (0: unknown). */
static void set_usage(struct cogpu_s *h, uint32_t s, uint32_t g, bool step,
                      uint64_t *used, uint64_t *peak, uint64_t *peak_ns) {
  ledger_slot_t *js = &h->st->slots[s];
  sync_slot(h, s);
  uint64_t u = used_of(h, js, g);
  uint64_t folded = step ? js->group_peak[g] : js->job_peak[g];
  uint64_t p = peak_of(h, js, g), at = rd(&js->usage.peak_ns);
  if (folded > p) {
    p = folded;
    at = step ? js->group_peak_ns : js->job_peak_ns;
  }
  LEDGER_FOR_SLOTS(h->st, m) {
    if (m == s || h->st->slots[m].state != SLOT_ACTIVE ||
        !counts_in(h, m, s, step))
      continue;
    sync_slot(h, m);
    const ledger_slot_t *ms = &h->st->slots[m];
    u = add_at(u, used_of(h, ms, g), gpu_total(h, g));
    if (peak_of(h, ms, g) > p) {
      p = peak_of(h, ms, g);
      at = rd(&ms->usage.peak_ns);
    }
  }
  *used = u;
  if (u > p) {
    p = u;
    at = realtime_ns();
  }
  *peak = p;
  *peak_ns = at;
}

void cogpu__ledger_job_usage(struct cogpu_s *h, uint32_t s, uint32_t g,
                             uint64_t *used, uint64_t *peak) {
  uint64_t at;
  set_usage(h, s, g, false, used, peak, &at);
}

void cogpu__ledger_usage_by_job(struct cogpu_s *h, uint32_t g, uint64_t *used,
                                uint64_t *peak) {
  LEDGER_FOR_SLOTS(h->st, s) {
    const ledger_slot_t *sl = &h->st->slots[s];
    if (sl->state != SLOT_ACTIVE)
      continue;
    sync_slot(h, s);
    uint32_t j = job_of(h, s);
    used[j] = add_at(used[j], used_of(h, sl, g), gpu_total(h, g));
    peak[j] = max_u(peak[j], max_u(peak_of(h, sl, g), sl->job_peak[g]));
  }
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++)
    peak[s] = max_u(peak[s], used[s]);
}

/* The report of slot s's job (step false) or step (step true): a step's
 * peak, its time and run time are its own processes'; what the job
 * reserved, waited and was suspended is the job's (a step's processes
 * share the job's reservation). */
static void report(struct cogpu_s *h, uint32_t s, bool step,
                   cogpu__job_report_t *out) {
  ledger_slot_t *ss = &h->st->slots[s];
  ledger_slot_t *js = &h->st->slots[step ? job_of(h, s) : s];
  memset(out, 0, sizeof *out);
  out->gpu = -1;
  uint64_t best = 0, best_ns = 0;
  for (uint32_t g = 0; g < h->st->hdr.ngpus; g++) {
    uint64_t used, peak, at;
    set_usage(h, s, g, step, &used, &peak, &at);
    if (peak > best) {
      best = peak;
      best_ns = at;
      out->gpu = (int)g;
    }
  }
  if (out->gpu < 0 && js->held_max)
    out->gpu = (int)js->held_max_gpu;
  out->peak = best;
  out->reserved = out->gpu >= 0 && js->held_max_gpu == (uint64_t)out->gpu
                      ? js->held_max
                      : 0;
  uint64_t now = realtime_ns();
  out->run_ms = now > ss->attached_ns ? (now - ss->attached_ns) / 1000000u : 0;
  out->peak_after_ms =
      best_ns > ss->attached_ns ? (best_ns - ss->attached_ns) / 1000000u : 0;
  out->waited_ms = js->waited_ns / 1000000u;
  out->suspensions = (unsigned)js->susp_count;
  out->guard_failures = (unsigned)js->guard_fails;
  out->escaped = js->escaped_max;
}

void cogpu__ledger_job_report(struct cogpu_s *h, uint32_t s,
                              cogpu__job_report_t *out) {
  report(h, s, false, out);
}

void cogpu__ledger_step_report(struct cogpu_s *h, uint32_t s,
                               cogpu__job_report_t *out) {
  report(h, s, true, out);
}

void cogpu__ledger_usage_free(struct cogpu_s *h, uint32_t s) {
  ledger_slot_t *sl = &h->st->slots[s];
  sync_slot(h, s);
  uint32_t j = job_of(h, s);
  uint32_t ng = h->st->hdr.ngpus;
  if (j != s) {
    /* A process of a job leaves its peaks with the job, and with its
     * step (the job itself when it joined the job). */
    ledger_slot_t *js = &h->st->slots[j], *gs = &h->st->slots[step_of(h, s)];
    for (uint32_t g = 0; g < ng; g++) {
      raise_job_peak(js, g, peak_of(h, sl, g), rd(&sl->usage.peak_ns));
      raise_step_peak(gs, g, peak_of(h, sl, g), rd(&sl->usage.peak_ns));
    }
    return;
  }
  /* A process whose job ended before it (slot_orphan_members made it a
   * job of its own) was recorded with that job. */
  if (sl->job == (uint64_t)s + 1)
    return;
  /* The job ends: its live processes' peaks first (they are orphaned
   * after this, or die with it). */
  LEDGER_FOR_SLOTS(h->st, m) {
    if (m == s || h->st->slots[m].state != SLOT_ACTIVE || job_of(h, m) != s)
      continue;
    sync_slot(h, m);
    for (uint32_t g = 0; g < ng; g++)
      raise_job_peak(sl, g, peak_of(h, &h->st->slots[m], g),
                     rd(&h->st->slots[m].usage.peak_ns));
  }
  for (uint32_t g = 0; g < ng; g++)
    raise_job_peak(sl, g, peak_of(h, sl, g), rd(&sl->usage.peak_ns));
  const ledger_usage_hooks_t *uh = cogpu__ledger_usage_hooks(h);
  if (uh && uh->ended)
    uh->ended(uh->ctx, h, s);
}

cogpu__usage_t *cogpu__ledger_usage_page(struct cogpu_s *h) {
  if (!h || h->forked || atomic_load(&h->done))
    return NULL;
  return h->st ? &h->st->slots[h->slot].usage : NULL;
}

int cogpu__ledger_job_end(struct cogpu_s *h, int exit_status, bool step,
                          cogpu__job_report_t *out) {
  int rc = cogpu__ledger_lock_live(h);
  if (rc)
    return rc;
  /* Only the job's own process says how it ended (as the daemon). */
  ledger_slot_t *js = &h->st->slots[h->res_slot];
  if (!step || h->res_slot == h->slot)
    js->exit_status = exit_status >= 0 ? (uint64_t)exit_status + 1 : 0;
  report(h, step ? h->slot : h->res_slot, step, out);
  cogpu__ledger_unlock(h);
  return 0;
}

int cogpu__ledger_job_sample(struct cogpu_s *h, uint64_t *used, unsigned *ngpus,
                             uint64_t *at_ms) {
  int rc = cogpu__ledger_lock_live(h);
  if (rc)
    return rc;
  uint32_t s = h->res_slot, ng = h->st->hdr.ngpus;
  memset(used, 0, COGPU_USAGE_GPUS * sizeof *used);
  /* One pass for every GPU: the lock is the user's other processes' too. */
  LEDGER_FOR_SLOTS(h->st, m) {
    const ledger_slot_t *ms = &h->st->slots[m];
    if (ms->state != SLOT_ACTIVE || job_of(h, m) != s)
      continue;
    for (uint32_t g = 0; g < ng; g++)
      used[g] = add_at(used[g], used_of(h, ms, g), gpu_total(h, g));
  }
  uint64_t now = realtime_ns(), start = h->st->slots[s].attached_ns;
  cogpu__ledger_unlock(h);
  *ngpus = ng;
  *at_ms = now > start ? (now - start) / 1000000u : 0;
  return 0;
}
