/*
 * fake-cuda-state.h: the layout of the fake libcuda.so.1's device-memory
 * state, a file mapped MAP_SHARED by every process using the fake (path in
 * FAKE_CUDA_STATE, else /tmp/fake-cuda-<uid>.state), so that processes share
 * the fake GPUs the way they share real ones. Included by the fake CUDA,
 * which writes it, and by the fake NVML, which reads it to list fake-CUDA
 * processes. GPUs are indexed by NVML index, never by CUDA ordinal.
 *
 * Every counter is updated with atomic operations, so no lock is shared
 * between processes. A process owns one entry of proc[], claimed by a CAS of
 * its pid on a zero pid; the entry of a process found dead is reclaimed (its
 * usage given back to the GPUs) by whoever notices.
 */
#ifndef COGPU_FAKE_CUDA_STATE_H
#define COGPU_FAKE_CUDA_STATE_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define FAKE_CUDA_STATE_MAGIC 0x4554415453414443ULL /* "CDASTATE" */
#define FAKE_CUDA_STATE_VERSION 1u
#define FAKE_CUDA_MAX_GPUS 64 /* as many as the fake NVML describes */
#define FAKE_CUDA_MAX_PROCS 256
/* The pid of an entry being reclaimed; 0 is a free entry. */
#define FAKE_CUDA_PID_REAPING (-1)

typedef struct {
  uint64_t total; /* bytes; written by every process's cuInit */
  uint64_t used;  /* bytes charged by all processes */
  uint64_t peak;  /* highest used since creation or fake_cuda_reset_peak */
  uint64_t ooms;  /* allocations refused for lack of memory */
} fake_cuda_gpu_state_t;

typedef struct {
  int32_t pid; /* owner; 0 free, FAKE_CUDA_PID_REAPING being reclaimed */
  uint32_t pad;
  uint64_t start; /* owner's start time (/proc/PID/stat), 0 if unknown */
  uint64_t used[FAKE_CUDA_MAX_GPUS]; /* bytes the owner holds per GPU */
} fake_cuda_proc_state_t;

typedef struct {
  uint64_t magic;
  uint32_t version;
  uint32_t size; /* sizeof(fake_cuda_state_t) */
  fake_cuda_gpu_state_t gpu[FAKE_CUDA_MAX_GPUS];
  fake_cuda_proc_state_t proc[FAKE_CUDA_MAX_PROCS];
} fake_cuda_state_t;

/* Start time of process `pid` in clock ticks since boot (field 22 of
 * /proc/PID/stat), or 0 if unknown; *zombie tells whether it has exited
 * but is not yet reaped (it holds no GPU memory any more then). */
static inline uint64_t fake_cuda_proc_start(int pid, bool *zombie) {
  char path[64], buf[1024];
  *zombie = false;
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return 0;
  buf[n] = 0;
  /* The command name (field 2) may hold anything: skip past its ')'. */
  char *s = strrchr(buf, ')');
  if (!s || s[1] != ' ')
    return 0;
  s += 2; /* field 3, the state */
  *zombie = *s == 'Z' || *s == 'X';
  for (int field = 3; field < 22; field++) {
    s = strchr(s, ' ');
    if (!s)
      return 0;
    s++;
  }
  return strtoull(s, NULL, 10);
}

/* Whether the process owning entry `p` still runs. */
static inline bool fake_cuda_entry_alive(const fake_cuda_proc_state_t *p) {
  int pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
  if (pid <= 0)
    return false;
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return false;
  bool zombie;
  uint64_t start = fake_cuda_proc_start(pid, &zombie);
  uint64_t want = __atomic_load_n(&p->start, __ATOMIC_ACQUIRE);
  if (zombie)
    return false;
  /* Same pid, other start time: the pid was reused by a new process. */
  return !(start && want && start != want);
}

/* Maps the state file at `path` read-only; NULL if it is missing or not a
 * state file. Unmap with munmap(st, sizeof *st). */
static inline const fake_cuda_state_t *
fake_cuda_state_map_ro(const char *path) {
  struct stat sb;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  void *m = MAP_FAILED;
  if (fstat(fd, &sb) == 0 && sb.st_size == (off_t)sizeof(fake_cuda_state_t))
    m = mmap(NULL, sizeof(fake_cuda_state_t), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED)
    return NULL;
  const fake_cuda_state_t *st = m;
  if (st->magic != FAKE_CUDA_STATE_MAGIC ||
      st->version != FAKE_CUDA_STATE_VERSION) {
    munmap(m, sizeof *st);
    return NULL;
  }
  return st;
}

#endif /* COGPU_FAKE_CUDA_STATE_H */
