/*
 * state.c: the fake libcuda.so.1's device-memory accounting, in the state
 * file shared by all processes (layout in fake-cuda-state.h): mapping and
 * creating it, this process's entry, charging and refunding bytes with
 * atomic compare-and-swap loops, and reclaiming the usage of processes
 * found dead, the way a real driver frees an exited process's memory.
 * Also the test hooks fake_cuda_stats and fake_cuda_reset_peak.
 */
#include <limits.h>

#include "fake-cuda-int.h"

static fake_cuda_state_t *g_st; /* the mapping; kept across fork */
static int g_slot = -1;         /* this process's entry in g_st->proc */

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
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return false;
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
  g_st = m;
  return CUDA_SUCCESS;
}

/* Gives back the usage of every entry whose process is gone; true if any
 * was found. Two processes may notice the same death: the CAS of the pid to
 * FAKE_CUDA_PID_REAPING picks the one that reclaims. */
static bool state_reap(void) {
  bool any = false;
  for (int i = 0; i < FAKE_CUDA_MAX_PROCS; i++) {
    fake_cuda_proc_state_t *p = &g_st->proc[i];
    int pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
    if (pid <= 0 || i == g_slot || fake_cuda_entry_alive(p))
      continue;
    if (!__atomic_compare_exchange_n(&p->pid, &pid, FAKE_CUDA_PID_REAPING,
                                     false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      continue;
    for (int g = 0; g < FAKE_CUDA_MAX_GPUS; g++) {
      uint64_t u = __atomic_exchange_n(&p->used[g], 0, __ATOMIC_ACQ_REL);
      if (u) {
        __atomic_sub_fetch(&g_st->gpu[g].used, u, __ATOMIC_ACQ_REL);
        any = true;
      }
    }
    __atomic_store_n(&p->start, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&p->pid, 0, __ATOMIC_RELEASE);
  }
  return any;
}

CUresult fake_state_join(void) {
  if (g_slot >= 0)
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
      g_slot = i;
      return CUDA_SUCCESS;
    }
  }
  fprintf(stderr, "fake-cuda: no free process entry (%d live processes)\n",
          FAKE_CUDA_MAX_PROCS);
  return CUDA_ERROR_UNKNOWN;
}

void fake_state_forget(void) {
  g_slot = -1;
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

CUresult fake_state_charge(unsigned nvml, uint64_t bytes) {
  if (g_slot < 0 || nvml >= FAKE_CUDA_MAX_GPUS)
    return CUDA_ERROR_UNKNOWN;
  fake_cuda_gpu_state_t *g = &g_st->gpu[nvml];
  bool reaped = false;
  uint64_t used = __atomic_load_n(&g->used, __ATOMIC_ACQUIRE), now;
  for (;;) {
    uint64_t total = __atomic_load_n(&g->total, __ATOMIC_ACQUIRE);
    if (bytes > total || used > total - bytes) {
      /* Memory of processes that died may come back first. */
      if (!reaped) {
        reaped = true;
        if (state_reap()) {
          used = __atomic_load_n(&g->used, __ATOMIC_ACQUIRE);
          continue;
        }
      }
      __atomic_add_fetch(&g->ooms, 1, __ATOMIC_ACQ_REL);
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
  __atomic_add_fetch(&g_st->proc[g_slot].used[nvml], bytes, __ATOMIC_ACQ_REL);
  return CUDA_SUCCESS;
}

void fake_state_refund(unsigned nvml, uint64_t bytes) {
  if (g_slot < 0 || nvml >= FAKE_CUDA_MAX_GPUS || bytes == 0)
    return;
  __atomic_sub_fetch(&g_st->proc[g_slot].used[nvml], bytes, __ATOMIC_ACQ_REL);
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
