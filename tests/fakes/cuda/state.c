/*
 * state.c: the fake libcuda.so.1's device-memory accounting, in the state
 * file shared by all processes (layout in fake-cuda-state.h): mapping and
 * creating it, this process's entry, charging and refunding bytes with
 * atomic compare-and-swap loops, and reclaiming the usage of processes
 * found dead, the way a real driver frees an exited process's memory.
 * Also the test hooks fake_cuda_stats and fake_cuda_reset_peak.
 */
#include <limits.h>
#include <sched.h>
#include <sys/syscall.h>

#include "fake-cuda-int.h"

static fake_cuda_state_t *g_st; /* the mapping; kept across fork */
/* This process's entry in g_st->proc. Atomic: the entry gate of every call
 * reads it without the lock. */
static int g_slot = -1;

fake_cuda_state_t *fake_state_shared(void) {
  return __atomic_load_n(&g_st, __ATOMIC_ACQUIRE);
}

fake_cuda_proc_state_t *fake_state_self(void) {
  int slot = __atomic_load_n(&g_slot, __ATOMIC_ACQUIRE);
  return slot < 0 ? NULL : &g_st->proc[slot];
}

static void state_path(char *buf, size_t len) {
  const char *p = getenv("FAKE_CUDA_STATE");
  if (p && *p)
    snprintf(buf, len, "%s", p);
  else
    snprintf(buf, len, "/tmp/fake-cuda-%u.state", (unsigned)getuid());
}

/* Creates the file complete (header written) under a temporary name and
 * links it into place, so no process ever sees it half made. False only on
 * a failure other than losing the race to another creator. */
static bool state_create(const char *path) {
  char tmp[PATH_MAX + 32];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0)
    return false;
  /* Every user of the node may use the GPU, as with the real driver's
   * device nodes (/dev/nvidia*, 0666): jobs of ordinary users share the
   * fake GPU with root's daemon. */
  if (fchmod(fd, 0666) != 0) {
    close(fd);
    unlink(tmp);
    return false;
  }
  unsigned char hdr[16];
  uint64_t magic = FAKE_CUDA_STATE_MAGIC;
  uint32_t version = FAKE_CUDA_STATE_VERSION,
           size = (uint32_t)sizeof(fake_cuda_state_t);
  memcpy(hdr + offsetof(fake_cuda_state_t, magic), &magic, sizeof magic);
  memcpy(hdr + offsetof(fake_cuda_state_t, version), &version, sizeof version);
  memcpy(hdr + offsetof(fake_cuda_state_t, size), &size, sizeof size);
  bool ok = ftruncate(fd, (off_t)sizeof(fake_cuda_state_t)) == 0 &&
            pwrite(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr;
  if (ok && link(tmp, path) != 0 && errno != EEXIST)
    ok = false;
  unlink(tmp);
  close(fd);
  return ok;
}

CUresult fake_state_open(void) {
  char path[PATH_MAX];
  struct stat sb;
  if (g_st)
    return CUDA_SUCCESS;
  state_path(path, sizeof path);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && state_create(path))
    fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "fake-cuda: cannot open %s: %s\n", path, strerror(errno));
    return CUDA_ERROR_UNKNOWN;
  }
  void *m = MAP_FAILED;
  if (fstat(fd, &sb) == 0 && sb.st_size == (off_t)sizeof(fake_cuda_state_t))
    m = mmap(NULL, sizeof(fake_cuda_state_t), PROT_READ | PROT_WRITE,
             MAP_SHARED, fd, 0);
  close(fd);
  if (m != MAP_FAILED &&
      (((fake_cuda_state_t *)m)->magic != FAKE_CUDA_STATE_MAGIC ||
       ((fake_cuda_state_t *)m)->version != FAKE_CUDA_STATE_VERSION)) {
    munmap(m, sizeof(fake_cuda_state_t));
    m = MAP_FAILED;
  }
  if (m == MAP_FAILED) {
    fprintf(stderr, "fake-cuda: %s is not a fake CUDA state file\n", path);
    return CUDA_ERROR_UNKNOWN;
  }
  __atomic_store_n(&g_st, (fake_cuda_state_t *)m, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

/* Clears what a reclaimed entry says of its checkpoint, for the next owner
 * (pid not yet given back). Its checkpointed bytes were host memory: nothing
 * goes back to the GPUs. */
static void reap_checkpoint(fake_cuda_proc_state_t *p) {
  for (int g = 0; g < FAKE_CUDA_MAX_GPUS; g++) {
    __atomic_store_n(&p->ckpt_bytes[g], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->work_from_us[g], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->work_until_us[g], 0, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&p->ckpt_state, FAKE_CKPT_RUNNING, __ATOMIC_RELAXED);
  __atomic_store_n(&p->inflight, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&p->ckpt_op, FAKE_CKPT_OP_NONE, __ATOMIC_RELAXED);
  __atomic_store_n(&p->ckpt_caller_start, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&p->ckpt_unsupported, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&p->ckpt_wedge, FAKE_CKPT_WEDGE_NONE, __ATOMIC_RELAXED);
  __atomic_store_n(&p->restore_tid, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&p->busy_until_ns, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&p->uid, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&p->ckpt_caller, 0, __ATOMIC_RELEASE);
}

/* Gives back the usage of every entry whose process is gone; true if any
 * was found. Two processes may notice the same death: the CAS of the pid to
 * FAKE_CUDA_PID_REAPING picks the one that reclaims. An entry that a live
 * caller of the checkpoint API is working on is left to that caller (it
 * moves the entry's bytes): the caller claims the entry, then checks the
 * pid; the reaper marks the pid, then checks for a claim (both seq_cst), so
 * one of them always sees the other and backs off. */
static bool state_reap(void) {
  bool any = false;
  int self = __atomic_load_n(&g_slot, __ATOMIC_ACQUIRE);
  for (int i = 0; i < FAKE_CUDA_MAX_PROCS; i++) {
    fake_cuda_proc_state_t *p = &g_st->proc[i];
    int pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
    if (pid == FAKE_CUDA_PID_REAPING) {
      /* Another process is giving this entry's memory back: the caller
       * must look again once it has, not refuse what is on its way back
       * (the real driver has no such moment: it frees at the death).
       * Bounded: a reaper killed in the middle leaves it so for good. */
      for (int k = 0;
           k < 100000 &&
           __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE) == FAKE_CUDA_PID_REAPING;
           k++)
        sched_yield();
      any = true;
      continue;
    }
    if (pid <= 0 || i == self || fake_cuda_entry_alive(p))
      continue;
    if (!__atomic_compare_exchange_n(&p->pid, &pid, FAKE_CUDA_PID_REAPING,
                                     false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
      continue;
    int caller = __atomic_load_n(&p->ckpt_caller, __ATOMIC_SEQ_CST);
    if (caller > 0 &&
        fake_cuda_pid_alive(
            caller, __atomic_load_n(&p->ckpt_caller_start, __ATOMIC_ACQUIRE))) {
      __atomic_store_n(&p->pid, pid, __ATOMIC_RELEASE);
      continue;
    }
    for (int g = 0; g < FAKE_CUDA_MAX_GPUS; g++) {
      uint64_t u = __atomic_exchange_n(&p->used[g], 0, __ATOMIC_ACQ_REL);
      if (u) {
        __atomic_sub_fetch(&g_st->gpu[g].used, u, __ATOMIC_ACQ_REL);
        any = true;
      }
    }
    reap_checkpoint(p);
    __atomic_store_n(&p->start, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&p->pid, 0, __ATOMIC_RELEASE);
  }
  return any;
}

CUresult fake_state_join(unsigned sees, unsigned ngpus) {
  if (__atomic_load_n(&g_slot, __ATOMIC_ACQUIRE) >= 0)
    return CUDA_SUCCESS;
  state_reap();
  int pid = (int)getpid();
  bool zombie;
  uint64_t start = fake_cuda_proc_start(pid, &zombie);
  for (int i = 0; i < FAKE_CUDA_MAX_PROCS; i++) {
    fake_cuda_proc_state_t *p = &g_st->proc[i];
    int expect = 0;
    if (__atomic_compare_exchange_n(&p->pid, &expect, pid, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      __atomic_store_n(&p->start, start, __ATOMIC_RELEASE);
      __atomic_store_n(&p->uid, (uint32_t)getuid(), __ATOMIC_RELEASE);
      __atomic_store_n(&p->restore_tid, (int32_t)syscall(SYS_gettid),
                       __ATOMIC_RELEASE);
      memset(p->moved, 0, sizeof p->moved);
      __atomic_store_n(&p->sees, sees, __ATOMIC_RELEASE);
      __atomic_store_n(&p->ngpus, ngpus, __ATOMIC_RELEASE);
      __atomic_store_n(&g_slot, i, __ATOMIC_RELEASE);
      return CUDA_SUCCESS;
    }
  }
  fprintf(stderr, "fake-cuda: no free process entry (%d live processes)\n",
          FAKE_CUDA_MAX_PROCS);
  return CUDA_ERROR_UNKNOWN;
}

void fake_state_forget(void) {
  __atomic_store_n(&g_slot, -1, __ATOMIC_RELEASE);
}

void fake_state_set_total(unsigned nvml, uint64_t total) {
  __atomic_store_n(&g_st->gpu[nvml].total, total, __ATOMIC_RELEASE);
}

uint64_t fake_state_total(unsigned nvml) {
  return __atomic_load_n(&g_st->gpu[nvml].total, __ATOMIC_ACQUIRE);
}

uint64_t fake_state_used(unsigned nvml) {
  return __atomic_load_n(&g_st->gpu[nvml].used, __ATOMIC_ACQUIRE);
}

unsigned fake_state_phys(const fake_cuda_proc_state_t *e, unsigned nvml) {
  if (!e || nvml >= FAKE_CUDA_MAX_GPUS)
    return nvml;
  unsigned m = __atomic_load_n(&e->moved[nvml], __ATOMIC_ACQUIRE);
  return m ? m - 1 : nvml;
}

unsigned fake_state_phys_self(unsigned nvml) {
  return fake_state_phys(fake_state_self(), nvml);
}

CUresult fake_state_charge(unsigned nvml, uint64_t bytes) {
  fake_cuda_proc_state_t *self = fake_state_self();
  if (!self)
    return CUDA_ERROR_UNKNOWN;
  return fake_state_charge_entry(self, fake_state_phys(self, nvml), bytes);
}

/* FAKE_CUDA_EXPLAIN=1: a refusal says on stderr who held the GPU's memory
 * and in what state each holder's process was, so that a test that saw
 * the driver refuse what cogpu granted can tell which window it was (a
 * diagnostic of the double; the real driver says nothing of the kind). */
static void explain_refusal(unsigned nvml, uint64_t bytes, uint64_t used,
                            uint64_t total) {
  const char *on = getenv("FAKE_CUDA_EXPLAIN");
  if (!on || strcmp(on, "1") != 0)
    return;
  char line[4096];
  int n = snprintf(line, sizeof line,
                   "fake-cuda[%d]: refused %llu bytes on GPU %u: %llu of "
                   "%llu used; holders:",
                   (int)getpid(), (unsigned long long)bytes, nvml,
                   (unsigned long long)used, (unsigned long long)total);
  for (int i = 0; i < FAKE_CUDA_MAX_PROCS && n > 0 && n < (int)sizeof line;
       i++) {
    const fake_cuda_proc_state_t *p = &g_st->proc[i];
    int pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
    uint64_t u = __atomic_load_n(&p->used[nvml], __ATOMIC_ACQUIRE);
    if (pid == 0 || u == 0)
      continue;
    bool zombie = false;
    uint64_t start = pid > 0 ? fake_cuda_proc_start(pid, &zombie) : 0;
    const char *state = pid < 0                    ? "being reaped"
                        : zombie                   ? "zombie"
                        : start == 0               ? "gone"
                        : fake_cuda_entry_alive(p) ? "alive"
                                                   : "another process";
    n += snprintf(line + n, sizeof line - (size_t)n, " pid %d %llu (%s)", pid,
                  (unsigned long long)u, state);
  }
  fprintf(stderr, "%s\n", line);
}

CUresult fake_state_charge_entry(fake_cuda_proc_state_t *e, unsigned nvml,
                                 uint64_t bytes) {
  if (nvml >= FAKE_CUDA_MAX_GPUS)
    return CUDA_ERROR_UNKNOWN;
  fake_cuda_gpu_state_t *g = &g_st->gpu[nvml];
  bool reaped = false;
  uint64_t used = __atomic_load_n(&g->used, __ATOMIC_ACQUIRE), now;
  for (;;) {
    uint64_t total = __atomic_load_n(&g->total, __ATOMIC_ACQUIRE);
    if (bytes > total || used > total - bytes) {
      /* Memory of processes that died may come back first: the real
       * driver never counts it, this double counts it until a reap. Read
       * again after the reap whoever did it: another process may have
       * reaped that memory since `used` was read (seen under load: a
       * refusal of what fitted, 1.5 GB of dead contexts in the figure). */
      if (!reaped) {
        reaped = true;
        state_reap();
        used = __atomic_load_n(&g->used, __ATOMIC_ACQUIRE);
        continue;
      }
      __atomic_add_fetch(&g->ooms, 1, __ATOMIC_ACQ_REL);
      explain_refusal(nvml, bytes, used, total);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    now = used + bytes;
    if (__atomic_compare_exchange_n(&g->used, &used, now, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      break;
  }
  uint64_t peak = __atomic_load_n(&g->peak, __ATOMIC_ACQUIRE);
  while (peak < now &&
         !__atomic_compare_exchange_n(&g->peak, &peak, now, false,
                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
  /* The GPU first, the entry second: a process killed in between leaves
   * the GPU's count too high, never below what entries hold. */
  __atomic_add_fetch(&e->used[nvml], bytes, __ATOMIC_ACQ_REL);
  return CUDA_SUCCESS;
}

void fake_state_refund(unsigned nvml, uint64_t bytes) {
  fake_cuda_proc_state_t *self = fake_state_self();
  if (!self || nvml >= FAKE_CUDA_MAX_GPUS || bytes == 0)
    return;
  nvml = fake_state_phys(self, nvml);
  __atomic_sub_fetch(&self->used[nvml], bytes, __ATOMIC_ACQ_REL);
  __atomic_sub_fetch(&g_st->gpu[nvml].used, bytes, __ATOMIC_ACQ_REL);
}

/* --- Test hooks ----------------------------------------------------------- */

FAKE_API int fake_cuda_stats(int nvml_index, unsigned long long *used,
                             unsigned long long *peak,
                             unsigned long long *ooms) {
  if (nvml_index < 0 || nvml_index >= FAKE_CUDA_MAX_GPUS)
    return -1;
  fake_lock();
  bool ok = fake_state_open() == CUDA_SUCCESS;
  if (ok) {
    state_reap();
    const fake_cuda_gpu_state_t *g = &g_st->gpu[nvml_index];
    if (used)
      *used = __atomic_load_n(&g->used, __ATOMIC_ACQUIRE);
    if (peak)
      *peak = __atomic_load_n(&g->peak, __ATOMIC_ACQUIRE);
    if (ooms)
      *ooms = __atomic_load_n(&g->ooms, __ATOMIC_ACQUIRE);
  }
  fake_unlock();
  return ok ? 0 : -1;
}

FAKE_API void fake_cuda_reset_peak(void) {
  fake_lock();
  if (fake_state_open() == CUDA_SUCCESS)
    for (int g = 0; g < FAKE_CUDA_MAX_GPUS; g++)
      __atomic_store_n(&g_st->gpu[g].peak,
                       __atomic_load_n(&g_st->gpu[g].used, __ATOMIC_ACQUIRE),
                       __ATOMIC_RELEASE);
  fake_unlock();
}
