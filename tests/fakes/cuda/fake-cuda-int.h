/*
 * fake-cuda-int.h: what the files of the fake libcuda.so.1 share among
 * themselves (hidden, not exported): the per-process lock, devices,
 * contexts, the table of this process's allocations and handles, and the
 * shared state's accounting (state.c).
 *
 * One mutex (fake_lock) guards all per-process data; the shared state is
 * updated with atomics. Entry points take the lock themselves; functions
 * documented "locked" expect the caller to hold it.
 */
#ifndef COGPU_FAKE_CUDA_INT_H
#define COGPU_FAKE_CUDA_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "fake-cuda-state.h"
#include "fake-cuda.h"

#define FAKE_GRANULE (2ULL << 20) /* pool and VMM granularity */

/* --- Entry ---------------------------------------------------------------- */

/* Fault injection (FAKE_CUDA_FAIL): counts this call of `entry` and says
 * what it must fail with (CUDA_ERROR_UNKNOWN, or CUDA_ERROR_OUT_OF_MEMORY
 * for a "/oom" rule), or CUDA_SUCCESS; first sleeps what FAKE_CUDA_SLOW
 * asks of the entry. */
CUresult fake_fail_now(const char *entry);
/* Whether cuInit succeeded in this process. */
bool fake_ready(void);

/* The entry gate (checkpoint.c): while another process holds this one
 * locked, checkpointed or failed, a call waits in fake_gate_enter until it
 * is RUNNING again; a call past the gate counts as in flight, which a Lock
 * waits for, until fake_gate_leave (run on every return by the cleanup
 * attribute). `entry` is set when the call counted itself. */
typedef struct {
  fake_cuda_proc_state_t *entry; /* NULL: nothing to undo */
} fake_gate_t;
fake_gate_t fake_gate_enter(void);
void fake_gate_leave(fake_gate_t *gate);

/* First statement of every entry point (the checkpoint calls excepted):
 * the gate, then fault injection, so a call that waited counts when it
 * runs. A declaration, not a do-while block: the gate's cleanup runs when
 * the function returns. */
#define FAKE_ENTER()                                                           \
  __attribute__((cleanup(fake_gate_leave))) fake_gate_t fake_gate_ =           \
      fake_gate_enter();                                                       \
  CUresult fake_fail_ = fake_fail_now(__func__);                               \
  if (fake_fail_)                                                              \
  return fake_fail_
/* ... of every entry point that needs cuInit first. */
#define FAKE_ENTER_INIT()                                                      \
  FAKE_ENTER();                                                                \
  if (!fake_ready())                                                           \
  return CUDA_ERROR_NOT_INITIALIZED

void fake_lock(void);
void fake_unlock(void);

/* --- Devices (set by cuInit) ---------------------------------------------- */

/* Whether dev is a valid ordinal; its NVML index into *nvml. */
bool fake_device(CUdevice dev, unsigned *nvml);
/* Whether u is the UUID of one of the fake GPUs; its NVML index into
 * *nvml. */
bool fake_uuid_nvml(const CUuuid *u, unsigned *nvml);

/* --- Contexts ------------------------------------------------------------- */

struct CUctx_st {
  int ordinal;
  unsigned nvml;
  bool primary;
  unsigned refs;         /* primary: retain count (0 inactive); others: 1 */
  struct CUctx_st *next; /* list of live non-primary contexts */
};

/* Locked: the calling thread's current context if it is alive, else NULL. */
CUcontext fake_current(void);
/* Locked: the context behind a stream into *ctx (the stream's own, or the
 * current one for the NULL, legacy and per-thread streams).
 * CUDA_ERROR_INVALID_HANDLE for an unknown stream, CUDA_ERROR_INVALID_CONTEXT
 * if the context is not alive. */
CUresult fake_stream_ctx(CUstream stream, CUcontext *ctx);

/* --- This process's objects ----------------------------------------------- */

/* Every allocation and handle the process holds, for frees, validation and
 * clean-up when a context goes. */

typedef enum {
  FAKE_MEM_DEVICE = 1 << 0,  /* cuMemAlloc*, cuMemAllocPitch */
  FAKE_MEM_MANAGED = 1 << 1, /* cuMemAllocManaged: counted as device */
  FAKE_MEM_HOST = 1 << 2,    /* page-locked host memory: not counted */
  FAKE_MEM_POOL = 1 << 3,    /* from a pool: the pool is charged */
  FAKE_MEM_ARRAY = 1 << 4,
  FAKE_MEM_MIPMAP = 1 << 5,
  FAKE_MEM_VMM = 1 << 6, /* cuMemCreate handle */
  FAKE_MEM_VA = 1 << 7,  /* cuMemAddressReserve range */
  FAKE_OBJ_STREAM = 1 << 8
} fake_kind_t;

/* Pointers the copy and set calls accept. */
#define FAKE_ADDRESSABLE                                                       \
  (FAKE_MEM_DEVICE | FAKE_MEM_MANAGED | FAKE_MEM_HOST | FAKE_MEM_POOL |        \
   FAKE_MEM_VA)

typedef struct {
  uint64_t key;    /* the pointer, or the handle's value */
  uint64_t bytes;  /* charged (to the GPU, or used in the pool) */
  uint64_t length; /* bytes mapped at key; 0 if nothing is */
  fake_kind_t kind;
  unsigned nvml;     /* the GPU charged */
  CUcontext ctx;     /* owning context (freed with it), or NULL */
  CUmemoryPool pool; /* FAKE_MEM_POOL: the pool */
} fake_obj_t;

/* Locked. Add a copy of *o; false when out of host memory. */
bool fake_obj_add(const fake_obj_t *o);
/* Locked. The object with this key and one of `kinds`, or NULL. */
fake_obj_t *fake_obj_find(uint64_t key, unsigned kinds);
/* Locked. The object of one of `kinds` mapping [ptr, ptr+len), or NULL. */
fake_obj_t *fake_obj_containing(uint64_t ptr, uint64_t len, unsigned kinds);
/* Locked. Refund, unmap and forget an object (pointer from find). */
void fake_obj_release(fake_obj_t *o);
/* Locked. A fresh value for an opaque handle. */
uint64_t fake_new_handle(void);

/* Anonymous memory standing in for device memory: NORESERVE, so untouched
 * fake memory costs nothing. NULL on failure. */
void *fake_map(uint64_t bytes, bool low32);

/* --- Pools (memory.c) ----------------------------------------------------- */

/* Locked. `bytes` allocated from `pool` came back. */
void fake_pool_put(CUmemoryPool pool, uint64_t bytes);
/* Locked, in a forked child: forget the parent's pools. */
void fake_pools_forget(void);

/* cuMemAlloc_v2 and cuMemFree_v2 by names an interposer cannot replace
 * (FAKE_CUDA_PRIVATE_ENTRIES). */
CUresult fake_private_alloc(CUdeviceptr *dptr, size_t bytesize);
CUresult fake_private_free(CUdeviceptr dptr);

/* --- Graphs (graph.c) ----------------------------------------------------- */

/* Locked, in a forked child: the graph allocator's memory is the parent's. */
void fake_graphs_forget(void);

/* --- Shared state (state.c) ----------------------------------------------- */

/* Locked. Map the state file (once per process; a forked child keeps the
 * mapping). CUDA_ERROR_UNKNOWN, with a message on stderr, if it cannot. */
CUresult fake_state_open(void);
/* Locked. Claim this process's entry (reclaiming those of dead processes);
 * CUDA_ERROR_UNKNOWN if the table is full. */
CUresult fake_state_join(unsigned sees, unsigned ngpus);
/* The GPU (NVML index) that device `nvml` of entry e's view is on now:
 * itself unless a restore moved it (gpuPairs). */
unsigned fake_state_phys(const fake_cuda_proc_state_t *e, unsigned nvml);
unsigned fake_state_phys_self(unsigned nvml);
/* In a forked child: the entry is the parent's. */
void fake_state_forget(void);
/* The mapping (NULL before fake_state_open), and this process's entry (NULL
 * before it joined); both readable without the lock. */
fake_cuda_state_t *fake_state_shared(void);
fake_cuda_proc_state_t *fake_state_self(void);
void fake_state_set_total(unsigned nvml, uint64_t total);
uint64_t fake_state_total(unsigned nvml);
uint64_t fake_state_used(unsigned nvml);
/* Charge `bytes` to a GPU for this process: CUDA_SUCCESS, or
 * CUDA_ERROR_OUT_OF_MEMORY (counted) if they do not fit. */
CUresult fake_state_charge(unsigned nvml, uint64_t bytes);
/* The same for entry `e` (a Restore charges its target's entry). */
CUresult fake_state_charge_entry(fake_cuda_proc_state_t *e, unsigned nvml,
                                 uint64_t bytes);
void fake_state_refund(unsigned nvml, uint64_t bytes);

/* --- Work and checkpoints (checkpoint.c) ---------------------------------- */

/* Locked. A kernel (or graph) launched on GPU `nvml`: the process is busy
 * for FAKE_CUDA_KERNEL_MS more, after its earlier work. */
void fake_work_launched(unsigned nvml);
/* Waits until this process's submitted work is done (synchronisation). */
void fake_work_wait(void);
/* This process used something a checkpoint cannot handle
 * (FAKE_CKPT_USED_*). */
void fake_ckpt_mark(uint32_t what);
/* The driver version cuDriverGetVersion reports (FAKE_CUDA_DRIVER_VERSION,
 * read at each call; default 13000). */
int fake_driver_version(void);

#endif /* COGPU_FAKE_CUDA_INT_H */
