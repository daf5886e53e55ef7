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
 *
 * An entry also carries its process's checkpoint state (checkpoint.c), which
 * other processes change through the cuCheckpointProcess* calls without the
 * owner's cooperation, as the real driver does:
 *
 *   RUNNING --Lock--> LOCKED --Checkpoint--> CHECKPOINTED
 *      ^                |  ^                       |
 *      +-----Unlock-----+  +--------Restore--------+
 *
 * with FAILED for good after a Restore that found too little memory, or a
 * Checkpoint of a process that used something the checkpoint cannot handle
 * (ckpt_unsupported). Outside RUNNING, each of the owner's CUDA calls waits
 * at entry (futex on ckpt_state, a shared futex: the word is in this file).
 * Invariants: a RUNNING or LOCKED entry holds no ckpt_bytes; a CHECKPOINTED
 * one holds nothing in used[]; the bytes of ckpt_bytes are host memory, so
 * reclaiming a dead entry gives back only used[].
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
#define FAKE_CUDA_STATE_VERSION 3u
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

/* ckpt_state: CUprocessState's four values, and LOCKING, the fake's own: a
 * Lock waits for the owner's calls and work to finish. The owner's new calls
 * already wait then, but cuCheckpointProcessGetState still says RUNNING, as
 * the Lock has not succeeded yet. */
enum {
  FAKE_CKPT_RUNNING = 0,
  FAKE_CKPT_LOCKED = 1,
  FAKE_CKPT_CHECKPOINTED = 2,
  FAKE_CKPT_FAILED = 3,
  FAKE_CKPT_LOCKING = 16
};

/* ckpt_unsupported: what the owner used that a checkpoint cannot handle. */
enum {
  FAKE_CKPT_USED_MANAGED = 1 << 0,  /* cuMemAllocManaged */
  FAKE_CKPT_USED_IPC = 1 << 1,      /* cuIpcGetMemHandle */
  FAKE_CKPT_USED_SHAREABLE = 1 << 2 /* cuMemExportToShareableHandle */
};

/* ckpt_wedge: how a FAILED entry got stuck, which decides what
 * cuCheckpointProcessGetState reports of it. */
enum {
  FAKE_CKPT_WEDGE_NONE = 0,
  FAKE_CKPT_WEDGE_RESTORE,   /* a Restore lacked memory: reads CHECKPOINTED */
  FAKE_CKPT_WEDGE_CHECKPOINT /* a Checkpoint of FAKE_CKPT_USED_*: FAILED */
};

/* ckpt_op: the operation the process ckpt_caller has under way. */
enum {
  FAKE_CKPT_OP_NONE = 0,
  FAKE_CKPT_OP_LOCK,
  FAKE_CKPT_OP_CHECKPOINT,
  FAKE_CKPT_OP_RESTORE,
  FAKE_CKPT_OP_UNLOCK
};

typedef struct {
  int32_t pid;    /* owner; 0 free, FAKE_CUDA_PID_REAPING being reclaimed */
  uint32_t uid;   /* owner's real uid when it joined (cuInit) */
  uint64_t start; /* owner's start time (/proc/PID/stat), 0 if unknown */
  uint64_t used[FAKE_CUDA_MAX_GPUS]; /* bytes the owner holds per GPU */

  /* Checkpoint (see the top of this file). */
  uint32_t
      ckpt_state;    /* FAKE_CKPT_*; futex word of the owner's waiting calls */
  uint32_t inflight; /* owner's calls past the entry gate; futex word of
                        a Lock waiting for them */
  int32_t ckpt_caller;        /* process with an operation under way on this
                                 entry, 0 none: one operation at a time */
  uint32_t ckpt_op;           /* that operation, FAKE_CKPT_OP_* */
  uint64_t ckpt_caller_start; /* its start time, against pid reuse */
  uint32_t ckpt_unsupported;  /* FAKE_CKPT_USED_* */
  int32_t restore_tid;        /* thread of the owner that ran cuInit */
  uint32_t ckpt_wedge;        /* FAKE_CKPT_WEDGE_* */
  uint32_t pad;
  uint64_t busy_until_ns; /* CLOCK_MONOTONIC: end of the owner's submitted
                             work (FAKE_CUDA_KERNEL_MS per launch) */
  uint64_t ckpt_bytes[FAKE_CUDA_MAX_GPUS]; /* checkpointed to host memory */
  /* CLOCK_REALTIME in microseconds (NVML's timestamps): the owner's latest
   * busy period on each GPU, for the fake NVML's utilisation samples. */
  uint64_t work_from_us[FAKE_CUDA_MAX_GPUS];
  uint64_t work_until_us[FAKE_CUDA_MAX_GPUS];
  /* Restore onto other GPUs (gpuPairs, checkpoint.c): where each GPU the
   * owner saw at cuInit now is, as NVML index + 1 (0: where it was). The
   * owner keeps its view (ordinals, UUIDs, the NVML indices it cached); its
   * charges, refunds, cuMemGetInfo and work go to the GPU it is on now. */
  uint8_t moved[FAKE_CUDA_MAX_GPUS];
  /* How many devices the owner could see at cuInit (CUDA_VISIBLE_DEVICES),
   * of how many fake GPUs: a restore with gpuPairs needs them all. */
  uint32_t sees, ngpus;
} fake_cuda_proc_state_t;

typedef struct {
  uint64_t magic;
  uint32_t version;
  uint32_t size;        /* sizeof(fake_cuda_state_t) */
  uint64_t ckpt_wedged; /* processes left FAILED by a checkpoint call */
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

/* Whether process `pid`, started at `want` (0: unknown), still runs. */
static inline bool fake_cuda_pid_alive(int pid, uint64_t want) {
  if (pid <= 0)
    return false;
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return false;
  bool zombie;
  uint64_t start = fake_cuda_proc_start(pid, &zombie);
  if (zombie)
    return false;
  /* Same pid, other start time: the pid was reused by a new process. */
  return !(start && want && start != want);
}

/* Whether the process owning entry `p` still runs. */
static inline bool fake_cuda_entry_alive(const fake_cuda_proc_state_t *p) {
  int pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
  return fake_cuda_pid_alive(pid, __atomic_load_n(&p->start, __ATOMIC_ACQUIRE));
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
