/*
 * foreign.c: GPU memory held by processes cogpu does not know about.
 *
 * NVML lists the processes holding memory on each GPU. A process is a
 * client's when it is an attached client: the ledger counts its memory
 * allocation by allocation. A process that is not a client but descends
 * from one that accounts for memory on that GPU (one that holds or has
 * claimed memory there, uses it exclusively, or belongs to a job that
 * holds memory there) belongs to that client's job but escaped the preload
 * library (it dropped LD_PRELOAD, is static, or loads the driver
 * privately): its memory is counted nowhere else, so it reduces the GPU's
 * capacity as foreign memory does (nobody is granted it), and is named for
 * the job (the slot's `escaped`: `cogpu status`, metrics, the job's
 * report). An ancestor that accounts for nothing on the GPU does not make
 * a process its job's: a Slurm step refused exclusive use
 * (whole_gpu_wait) is a client holding nothing. Everything else is foreign
 * and reduces the GPU's capacity. NVML is slow (milliseconds), so it is
 * read outside the lock, at most once per foreign_refresh interval per
 * node: before a grant when the figure is older than that, when a request
 * does not fit, by waiters on their housekeeping tick, at attach and for
 * status, and at once when the driver refused what the ledger granted.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger-int.h"

#define FOREIGN_MAX_PROCS 1024
#define FOREIGN_MAX_DEPTH 64

static int proc_parent(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  /* The command name may contain spaces and parentheses: skip to the last
   * ')' and read "state ppid". */
  char *p = strrchr(buf, ')');
  int ppid = -1;
  if (!p || sscanf(p + 1, " %*c %d", &ppid) != 1)
    return -1;
  return ppid;
}

/* The index of pid among the clients, or -1. */
static long client_index(const int *pids, size_t n, int pid) {
  for (size_t i = 0; i < n; i++)
    if (pids[i] == pid)
      return (long)i;
  return -1;
}

/* Is pid a client (-1), a descendant of client i (its nearest client
 * ancestor) that escaped the preload library (i), or neither: foreign
 * (-2)? */
static long pid_class(const int *pids, size_t n, int pid) {
  for (int depth = 0; pid > 1 && depth < FOREIGN_MAX_DEPTH; depth++) {
    long i = client_index(pids, n, pid);
    if (i >= 0)
      return depth == 0 ? -1 : i;
    pid = proc_parent(pid);
  }
  return -2;
}

/* Snapshot of the live clients' PIDs and slots (read without the lock: a
 * stale entry only misjudges a process for one refresh). */
static size_t client_pids(struct cogpu_s *h, int *pids, uint32_t *slots) {
  size_t n = 0;
  LEDGER_FOR_SLOTS(h->st, s) {
    const ledger_slot_t *sl = &h->st->slots[s];
    if (__atomic_load_n(&sl->state, __ATOMIC_RELAXED) != SLOT_ACTIVE)
      continue;
    pids[n] = __atomic_load_n(&sl->pid, __ATOMIC_RELAXED);
    slots[n++] = s;
  }
  return n;
}

/* Claims the refresh for this process if the last one is old enough, so
 * that many waiters do not all query NVML at once. */
static bool foreign_claim(struct cogpu_s *h, bool force) {
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t last =
      atomic_load_explicit(&hd->foreign_at_ns, memory_order_relaxed);
  /* The coarse clock's test first (ledger-int.h, cogpu__ledger_foreign_fresh:
   * the reserve paths ask it inline before they come here). */
  if (!force && last) {
    if (cogpu__ledger_foreign_fresh(h))
      return false;
    /* What the inline test leaves to the precise clock: intervals under
     * 20 ms, and a figure the coarse clock calls stale. */
    uint64_t every = cogpu__ms_to_ns(hd->foreign_refresh_ms);
    uint64_t now = cogpu__now_ns();
    if (now < last || now - last < every)
      return false;
  }
  return atomic_compare_exchange_strong(&hd->foreign_at_ns, &last,
                                        cogpu__now_ns());
}

/* A process of a job that escaped the preload library, on GPU g. */
typedef struct escapee_s {
  uint32_t job, g;
  uint64_t bytes;
  int64_t pid;
} escapee_t;

/* Counts each job's escaped memory on GPU g into foreign[g] where it is
 * more than the job's reservation leaves unused (lock held): a job run with
 * --no-preload, which declared its memory, is within its reservation and
 * counts nothing twice; an on-demand job whose process dropped LD_PRELOAD
 * reserved none of it, and all of it counts. Names the jobs (the slots'
 * escaped figures, written when changed). */
static void escaped_count(struct cogpu_s *h, const escapee_t *e, size_t n,
                          uint64_t *foreign) {
  uint32_t ng = h->st->hdr.ngpus;
  uint64_t *used =
      n ? calloc(2 * (size_t)LEDGER_MAX_SLOTS, sizeof *used) : NULL;
  uint64_t *sum = n ? calloc(LEDGER_MAX_SLOTS, sizeof *sum) : NULL;
  for (uint32_t g = 0; used && sum && g < ng; g++) {
    bool any = false;
    for (size_t k = 0; k < n; k++)
      if (e[k].g == g) {
        sum[e[k].job] += e[k].bytes;
        any = true;
      }
    if (!any)
      continue;
    memset(used, 0, 2 * (size_t)LEDGER_MAX_SLOTS * sizeof *used);
    cogpu__ledger_usage_by_job(h, g, used, used + LEDGER_MAX_SLOTS);
    for (size_t k = 0; k < n; k++) {
      uint32_t jb = e[k].job;
      if (e[k].g != g || !sum[jb])
        continue;
      uint64_t have = h->st->slots[jb].held[g];
      uint64_t real = used[jb] + sum[jb];
      foreign[g] += real > have ? real - have : 0;
      sum[jb] = 0; /* once per job and GPU */
    }
  }
  free(used);
  free(sum);
  LEDGER_FOR_SLOTS(h->st, s) {
    ledger_slot_t *sl = &h->st->slots[s];
    if (sl->state != SLOT_ACTIVE && !sl->escaped)
      continue;
    uint64_t tot = 0, big = 0, gpu = 0;
    int64_t pid = 0;
    for (size_t k = 0; k < n; k++)
      if (e[k].job == s) {
        tot += e[k].bytes;
        if (e[k].bytes >= big) {
          big = e[k].bytes;
          pid = e[k].pid;
          gpu = e[k].g;
        }
      }
    if (sl->state != SLOT_ACTIVE)
      tot = 0;
    if (sl->escaped == tot &&
        (tot == 0 || (sl->escaped_pid == pid && sl->escaped_gpu == gpu)))
      continue;
    if (tot && !sl->escaped)
      cogpu__log(COGPU_LOG_WARN,
                 "pid %lld holds GPU memory outside the preload library, in "
                 "the job of pid %d",
                 (long long)pid, sl->pid);
    sl->escaped = tot;
    sl->escaped_pid = tot ? pid : 0;
    sl->escaped_gpu = tot ? gpu : 0;
    if (tot > sl->escaped_max)
      sl->escaped_max = tot;
    if (!tot)
      cogpu__ledger_slot_unmark(h, s); /* a freed slot's last escaped bytes */
  }
}

/* Leaving slots (ledger_slot_t.leaving) whose process NVML lists on no GPU
 * (listed: by client index, NVML having answered for every GPU): the
 * driver holds nothing of theirs, though the process lives on (it made a
 * new image without the preload library, or closed the driver's
 * descriptors with ours). Marked for the daemon to free (lock held). */
static void leaving_gone(struct cogpu_s *h, const int *pids,
                         const uint32_t *slots, const bool *listed, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ledger_slot_t *sl = &h->st->slots[slots[i]];
    if (listed[i] || sl->state != SLOT_ACTIVE || sl->pid != pids[i] ||
        sl->leaving != LEDGER_LEAVING)
      continue;
    cogpu__ledger_tx_set(h, &sl->leaving, LEDGER_LEAVING_GONE);
    cogpu__ledger_tx_commit(h);
  }
}

int cogpu__ledger_foreign_refresh(struct cogpu_s *h, bool force) {
  if (!foreign_claim(h, force))
    return 0;
  /* On the heap, not thread-local: every thread of every program under the
   * preload library would carry them for a refresh it rarely makes. */
  int *pids = malloc(LEDGER_MAX_SLOTS * sizeof *pids);
  uint32_t *slots = malloc(LEDGER_MAX_SLOTS * sizeof *slots);
  cogpu__gpu_proc_t *procs = malloc(FOREIGN_MAX_PROCS * sizeof *procs);
  escapee_t *esc = malloc(FOREIGN_MAX_PROCS * sizeof *esc);
  bool *listed = calloc(LEDGER_MAX_SLOTS, sizeof *listed);
  size_t nesc = 0;
  int rc = 0;
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t foreign[LEDGER_MAX_GPUS];
  if (!pids || !slots || !procs || !esc || !listed)
    goto out; /* keep the last known figures */
  size_t np = client_pids(h, pids, slots);
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    size_t n = 0;
    if (cogpu__nvml_open() != 0 ||
        cogpu__nvml_processes(hd->gpus[g].index, procs, FOREIGN_MAX_PROCS,
                              &n) != 0) {
      cogpu__log(COGPU_LOG_DEBUG, "foreign memory not refreshed: %s",
                 cogpu_last_error());
      goto out; /* keep the last known figures */
    }
    foreign[g] = 0;
    for (size_t i = 0; i < n; i++) {
      long c = pid_class(pids, np, (int)procs[i].pid);
      if (c == -1) {
        listed[client_index(pids, np, (int)procs[i].pid)] = true;
        continue; /* a client's: counted allocation by allocation */
      }
      if (c == -2 || nesc == FOREIGN_MAX_PROCS) {
        foreign[g] += procs[i].used;
        continue;
      }
      esc[nesc++] = (escapee_t){.job = cogpu__ledger_job_of(h, slots[c]),
                                .g = g,
                                .bytes = procs[i].used,
                                .pid = (int64_t)procs[i].pid};
    }
  }
  rc = cogpu__ledger_lock_bounded(h);
  if (rc)
    goto out; /* a stopped holder: keep the last known figures */
  escaped_count(h, esc, nesc, foreign);
  leaving_gone(h, pids, slots, listed, np);
  bool grew = false;
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    if (hd->gpus[g].foreign == foreign[g])
      continue;
    grew |= foreign[g] < hd->gpus[g].foreign;
    cogpu__ledger_tx_set(h, &hd->gpus[g].foreign, foreign[g]);
    cogpu__ledger_tx_commit(h);
  }
  if (grew)
    cogpu__ledger_serve(h);
  cogpu__ledger_unlock(h);
out:
  free(pids);
  free(slots);
  free(procs);
  free(esc);
  free(listed);
  return rc;
}

int cogpu__ledger_recheck(struct cogpu_s *h, int gpu, uint64_t *over) {
  return cogpu__ledger_over(h, gpu, true, over);
}

int cogpu__ledger_over(struct cogpu_s *h, int gpu, bool refresh,
                       uint64_t *over) {
  *over = 0;
  if (!h || !h->st)
    return cogpu__seterr(-EINVAL, "not attached");
  if (gpu < 0 || (uint32_t)gpu >= h->st->hdr.ngpus)
    return cogpu__seterr(-ENODEV, "no GPU %d on this node", gpu);
  /* The refusal came before this call: a refresh started now sees what
   * the driver saw (one started earlier may not have). */
  if (refresh)
    cogpu__ledger_foreign_refresh(h, true);
  const ledger_gpu_t *g = &h->st->hdr.gpus[gpu];
  /* Read without the lock: a moment's view, as cogpu__ledger_room. */
  uint64_t want = __atomic_load_n(&g->reserved, __ATOMIC_RELAXED);
  uint64_t foreign = __atomic_load_n(&g->foreign, __ATOMIC_RELAXED);
  uint64_t total = __atomic_load_n(&g->total, __ATOMIC_RELAXED);
  uint64_t margin = __atomic_load_n(&g->margin, __ATOMIC_RELAXED);
  want = want + foreign < want ? UINT64_MAX : want + foreign;
  want = want + margin < want ? UINT64_MAX : want + margin;
  *over = want > total ? want - total : 0;
  return 0;
}
