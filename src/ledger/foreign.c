/*
 * foreign.c: GPU memory held by processes cogpu does not know about.
 *
 * NVML lists the processes holding memory on each GPU. A process is known
 * when it is an attached client, or when one of its ancestors is a client
 * that accounts for memory on that GPU: one that holds or has claimed
 * memory there, uses the GPU exclusively, or belongs to a job that holds
 * memory there (a job started by `cogpu run` allocates in a child of the
 * client). An ancestor that accounts for nothing on the GPU does not hide
 * its descendants' memory there: a Slurm step that was refused exclusive
 * use (whole_gpu_wait) is a client holding nothing, and its tasks' memory
 * must count. Everything else is foreign and reduces the GPU's capacity. NVML
 * is slow (milliseconds), so it is read outside the lock, at most once per
 * foreign_refresh interval per node, and only off the fast path: when a request
 * does not fit, by waiters on their housekeeping tick, at attach and for
 * status.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger-int.h"

#define FOREIGN_MAX_PROCS 1024
#define FOREIGN_MAX_DEPTH 64
static_assert(LEDGER_MAX_GPUS <= 32, "a client's GPUs are a 32-bit mask");

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

/* Is pid a client, or a descendant of a client that accounts for memory
 * on the GPU of bit `gbit` (covers[i]: the GPUs client i accounts for)? */
static bool pid_known(const int *pids, const uint32_t *covers, size_t n,
                      int pid, uint32_t gbit) {
  for (int depth = 0; pid > 1 && depth < FOREIGN_MAX_DEPTH; depth++) {
    long i = client_index(pids, n, pid);
    if (i >= 0 && (depth == 0 || (covers[i] & gbit)))
      return true;
    pid = proc_parent(pid);
  }
  return false;
}

/* Does slot sl account for memory on GPU g: it holds or claimed some
 * there, uses it exclusively, or its job (a joined slot) holds some. */
static bool slot_covers(struct cogpu_s *h, uint32_t s, const ledger_slot_t *sl,
                        uint32_t g) {
  if (__atomic_load_n(&sl->held[g], __ATOMIC_RELAXED) ||
      __atomic_load_n(&sl->claim[g], __ATOMIC_RELAXED) ||
      __atomic_load_n(&h->st->hdr.gpus[g].excl_slot, __ATOMIC_RELAXED) == s + 1)
    return true;
  uint64_t job = __atomic_load_n(&sl->job, __ATOMIC_RELAXED);
  return job && job <= LEDGER_MAX_SLOTS && job != (uint64_t)s + 1 &&
         __atomic_load_n(&h->st->slots[job - 1].held[g], __ATOMIC_RELAXED);
}

/* Snapshot of the live clients' PIDs and of the GPUs each accounts for
 * (read without the lock: a stale entry only misjudges a process for one
 * refresh). */
static size_t client_pids(struct cogpu_s *h, int *pids, uint32_t *covers) {
  size_t n = 0;
  uint32_t ngpus = h->st->hdr.ngpus;
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++) {
    const ledger_slot_t *sl = &h->st->slots[s];
    if (__atomic_load_n(&sl->state, __ATOMIC_RELAXED) != SLOT_ACTIVE)
      continue;
    uint32_t mask = 0;
    for (uint32_t g = 0; g < ngpus && g < LEDGER_MAX_GPUS; g++)
      if (slot_covers(h, s, sl, g))
        mask |= 1u << g;
    pids[n] = __atomic_load_n(&sl->pid, __ATOMIC_RELAXED);
    covers[n++] = mask;
  }
  return n;
}

/* Claims the refresh for this process if the last one is old enough, so
 * that many waiters do not all query NVML at once. */
static bool foreign_claim(struct cogpu_s *h, bool force) {
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t now = cogpu__now_ns();
  uint64_t last = atomic_load(&hd->foreign_at_ns);
  if (!force && last && now >= last &&
      now - last < cogpu__ms_to_ns(hd->foreign_refresh_ms))
    return false;
  return atomic_compare_exchange_strong(&hd->foreign_at_ns, &last, now);
}

int cogpu__ledger_foreign_refresh(struct cogpu_s *h, bool force) {
  if (!foreign_claim(h, force))
    return 0;
  /* On the heap, not thread-local: every thread of every program under the
   * preload library would carry 20 KiB for a refresh it rarely makes. */
  int *pids = malloc(LEDGER_MAX_SLOTS * sizeof *pids);
  uint32_t *covers = malloc(LEDGER_MAX_SLOTS * sizeof *covers);
  cogpu__gpu_proc_t *procs = malloc(FOREIGN_MAX_PROCS * sizeof *procs);
  if (!pids || !covers || !procs) {
    free(pids);
    free(covers);
    free(procs);
    return 0; /* keep the last known figures */
  }
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t foreign[LEDGER_MAX_GPUS];
  size_t np = client_pids(h, pids, covers);
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    size_t n = 0;
    foreign[g] = hd->gpus[g].foreign;
    if (cogpu__nvml_open() != 0 ||
        cogpu__nvml_processes(hd->gpus[g].index, procs, FOREIGN_MAX_PROCS,
                              &n) != 0) {
      cogpu__log(COGPU_LOG_DEBUG, "foreign memory not refreshed: %s",
                 cogpu_last_error());
      free(pids);
      free(covers);
      free(procs);
      return 0; /* keep the last known figures */
    }
    foreign[g] = 0;
    for (size_t i = 0; i < n; i++)
      if (!pid_known(pids, covers, np, (int)procs[i].pid, 1u << g))
        foreign[g] += procs[i].used;
  }
  free(pids);
  free(covers);
  free(procs);
  int rc = cogpu__ledger_lock_bounded(h);
  if (rc)
    return rc; /* a stopped holder: keep the last known figures */
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
  return 0;
}

int cogpu__ledger_recheck(struct cogpu_s *h, int gpu, uint64_t *over) {
  if (h && h->node) {
    *over = 0;
    return cogpu__node_recheck(h->node, gpu, over);
  }
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
