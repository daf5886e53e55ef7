/*
 * foreign.c: GPU memory held by processes cogpu does not know about.
 *
 * NVML lists the processes holding memory on each GPU. A process is known
 * when it, or one of its ancestors, is an attached client (a job started by
 * `cogpu run` allocates in a child of the client). Everything else is
 * foreign and reduces the GPU's capacity. NVML is slow (milliseconds), so
 * it is read outside the lock, at most once per foreign_refresh interval per
 * node, and only off the fast path: when a request does not fit, by waiters
 * on their housekeeping tick, at attach and for status.
 */
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

static bool pid_is_client(const int *pids, size_t n, int pid) {
  for (size_t i = 0; i < n; i++)
    if (pids[i] == pid)
      return true;
  return false;
}

static bool pid_known(const int *pids, size_t n, int pid) {
  for (int depth = 0; pid > 1 && depth < FOREIGN_MAX_DEPTH; depth++) {
    if (pid_is_client(pids, n, pid))
      return true;
    pid = proc_parent(pid);
  }
  return false;
}

/* Snapshot of the live clients' PIDs (read without the lock: a stale entry
 * only makes a process look known for one refresh). */
static size_t client_pids(struct cogpu_s *h, int *pids) {
  size_t n = 0;
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++) {
    const ledger_slot_t *sl = &h->st->slots[s];
    if (__atomic_load_n(&sl->state, __ATOMIC_RELAXED) == SLOT_ACTIVE)
      pids[n++] = __atomic_load_n(&sl->pid, __ATOMIC_RELAXED);
  }
  return n;
}

/* Claims the refresh for this process if the last one is old enough, so
 * that many waiters do not all query NVML at once. */
static bool foreign_claim(struct cogpu_s *h, bool force) {
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t now = cogpu__now_ns();
  uint64_t last = atomic_load(&hd->foreign_at_ns);
  if (!force && last && now - last < cogpu__ms_to_ns(hd->foreign_refresh_ms))
    return false;
  return atomic_compare_exchange_strong(&hd->foreign_at_ns, &last, now);
}

void cogpu__ledger_foreign_refresh(struct cogpu_s *h, bool force) {
  if (!foreign_claim(h, force))
    return;
  /* On the heap, not thread-local: every thread of every program under the
   * preload library would carry 20 KiB for a refresh it rarely makes. */
  int *pids = malloc(LEDGER_MAX_SLOTS * sizeof *pids);
  cogpu__gpu_proc_t *procs = malloc(FOREIGN_MAX_PROCS * sizeof *procs);
  if (!pids || !procs) {
    free(pids);
    free(procs);
    return; /* keep the last known figures */
  }
  ledger_hdr_t *hd = &h->st->hdr;
  uint64_t foreign[LEDGER_MAX_GPUS];
  size_t np = client_pids(h, pids);
  for (uint32_t g = 0; g < hd->ngpus; g++) {
    size_t n = 0;
    foreign[g] = hd->gpus[g].foreign;
    if (cogpu__nvml_open() != 0 ||
        cogpu__nvml_processes(hd->gpus[g].index, procs, FOREIGN_MAX_PROCS,
                              &n) != 0) {
      cogpu__log(COGPU_LOG_DEBUG, "foreign memory not refreshed: %s",
                 cogpu_last_error());
      free(pids);
      free(procs);
      return; /* keep the last known figures */
    }
    foreign[g] = 0;
    for (size_t i = 0; i < n; i++)
      if (!pid_known(pids, np, (int)procs[i].pid))
        foreign[g] += procs[i].used;
  }
  free(pids);
  free(procs);
  if (cogpu__ledger_lock_bounded(h))
    return; /* a stopped holder: keep the last known figures */
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
}
