/*
 * preload-int.h: internals of libcogpu-preload.so, the library that makes
 * unmodified CUDA programs account their GPU memory in the node ledger.
 *
 * driver.c   finds the real libcuda.so.1 and its entry points (hooks.def)
 * glibc-sym.c  finds glibc's own dlsym, dlopen and dlclose on any platform
 * entry.c    the routes into the hooks: dlsym and cuGetProcAddress
 * account.c  per-process accounting against the job's reservation
 * hooks-*.c  the hooks themselves
 */
#ifndef COGPU_PRELOAD_INT_H
#define COGPU_PRELOAD_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "cogpu.h"
#include "cuda/cuda-abi.h"
#include "internal.h"

#define PRELOAD_EXPORT __attribute__((visibility("default")))
/* Code that sanitizer runtimes reach while they start up (they look up
 * functions through our dlsym before their shadow memory exists): in a
 * sanitizer build of the tests it must not be instrumented. */
#define PRELOAD_EARLY                                                          \
  __attribute__((no_sanitize("address", "undefined", "thread")))

enum preload_fn {
#define HOOK(n) PL_##n,
#define NEED(n) PL_##n,
#include "preload/hooks.def"
#undef HOOK
#undef NEED
  PL__COUNT
};

/* Signatures of every entry point in hooks.def. */
typedef CUresult cuInit_ft(unsigned int);
typedef CUresult cuGetProcAddress_ft(const char *, void **, int, cuuint64_t);
typedef CUresult cuGetProcAddress_v2_ft(const char *, void **, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult *);
typedef CUresult cuMemAlloc_ft(CUdeviceptr_v1 *, unsigned int);
typedef CUresult cuMemAlloc_v2_ft(CUdeviceptr *, size_t);
typedef CUresult cuMemAllocPitch_v2_ft(CUdeviceptr *, size_t *, size_t, size_t,
                                       unsigned int);
typedef CUresult cuMemAllocManaged_ft(CUdeviceptr *, size_t, unsigned int);
typedef CUresult cuMemFree_ft(CUdeviceptr_v1);
typedef CUresult cuMemFree_v2_ft(CUdeviceptr);
typedef CUresult cuMemGetInfo_ft(unsigned int *, unsigned int *);
typedef CUresult cuMemGetInfo_v2_ft(size_t *, size_t *);
typedef CUresult cuMemAllocAsync_ft(CUdeviceptr *, size_t, CUstream);
typedef CUresult cuMemAllocAsync_ptsz_ft(CUdeviceptr *, size_t, CUstream);
typedef CUresult cuMemAllocFromPoolAsync_ft(CUdeviceptr *, size_t, CUmemoryPool,
                                            CUstream);
typedef CUresult cuMemAllocFromPoolAsync_ptsz_ft(CUdeviceptr *, size_t,
                                                 CUmemoryPool, CUstream);
typedef CUresult cuMemFreeAsync_ft(CUdeviceptr, CUstream);
typedef CUresult cuMemFreeAsync_ptsz_ft(CUdeviceptr, CUstream);
typedef CUresult cuMemPoolTrimTo_ft(CUmemoryPool, size_t);
typedef CUresult cuMemPoolCreate_ft(CUmemoryPool *, const CUmemPoolProps *);
typedef CUresult cuMemCreate_ft(CUmemGenericAllocationHandle *, size_t,
                                const CUmemAllocationProp *,
                                unsigned long long);
typedef CUresult cuMemRelease_ft(CUmemGenericAllocationHandle);
typedef CUresult cuIpcGetMemHandle_ft(CUipcMemHandle *, CUdeviceptr);
typedef CUresult cuIpcOpenMemHandle_ft(CUdeviceptr *, CUipcMemHandle,
                                       unsigned int);
typedef CUresult cuIpcOpenMemHandle_v2_ft(CUdeviceptr *, CUipcMemHandle,
                                          unsigned int);
typedef CUresult cuMemExportToShareableHandle_ft(void *,
                                                 CUmemGenericAllocationHandle,
                                                 int, unsigned long long);
typedef CUresult
cuMemImportFromShareableHandle_ft(CUmemGenericAllocationHandle *, void *, int);
typedef CUresult cuArrayCreate_v2_ft(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult cuArray3DCreate_v2_ft(CUarray *,
                                       const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult cuArrayDestroy_ft(CUarray);
typedef CUresult cuMipmappedArrayCreate_ft(CUmipmappedArray *,
                                           const CUDA_ARRAY3D_DESCRIPTOR *,
                                           unsigned int);
typedef CUresult cuMipmappedArrayDestroy_ft(CUmipmappedArray);
typedef CUresult cuCtxCreate_v2_ft(CUcontext *, unsigned int, CUdevice);
typedef CUresult cuCtxCreate_v3_ft(CUcontext *, void *, int, unsigned int,
                                   CUdevice);
typedef CUresult cuCtxCreate_v4_ft(CUcontext *, void *, unsigned int, CUdevice);
typedef CUresult cuCtxDestroy_v2_ft(CUcontext);
typedef CUresult cuDevicePrimaryCtxRetain_ft(CUcontext *, CUdevice);
typedef CUresult cuDevicePrimaryCtxRelease_ft(CUdevice);
typedef CUresult cuDevicePrimaryCtxRelease_v2_ft(CUdevice);
typedef CUresult cuDeviceTotalMem_v2_ft(size_t *, CUdevice);
typedef CUresult cuCtxGetDevice_ft(CUdevice *);
typedef CUresult cuCtxGetCurrent_ft(CUcontext *);
typedef CUresult cuDevicePrimaryCtxReset_ft(CUdevice);
typedef CUresult cuDevicePrimaryCtxReset_v2_ft(CUdevice);
typedef CUresult cuDeviceGetUuid_ft(CUuuid *, CUdevice);
typedef CUresult cuDeviceGetMemPool_ft(CUmemoryPool *, CUdevice);
typedef CUresult cuMemPoolGetAttribute_ft(CUmemoryPool, int, void *);
typedef CUresult cuGraphLaunch_ft(CUgraphExec, CUstream);
typedef CUresult cuGraphLaunch_ptsz_ft(CUgraphExec, CUstream);
typedef CUresult cuGraphUpload_ft(CUgraphExec, CUstream);
typedef CUresult cuGraphUpload_ptsz_ft(CUgraphExec, CUstream);
typedef CUresult cuGraphExecDestroy_ft(CUgraphExec);
typedef CUresult cuDeviceGraphMemTrim_ft(CUdevice);
typedef CUresult cuDeviceGetGraphMemAttribute_ft(CUdevice, int, void *);

/* The hooks, exported under the driver's names. */
#define HOOK(n) PRELOAD_EXPORT n##_ft n;
#define NEED(n)
#include "preload/hooks.def"
#undef HOOK
#undef NEED

/* --- driver.c ----------------------------------------------------------- */
/* What a hook calls: the next definition after this library (the real
 * driver's, or that of an interposer loaded after us), or NULL (no driver,
 * or no such symbol). */
void *cogpu__pl_real(int fn);
#define REAL(name) ((name##_ft *)cogpu__pl_real(PL_##name))
/* If addr is the real address of a hooked entry point, our hook for it;
 * otherwise addr. */
void *cogpu__pl_redirect(void *addr);
/* Is addr one of our hooks? */
bool cogpu__pl_is_hook(const void *addr);
/* Our hook for an exported name, or NULL. */
void *cogpu__pl_hook_by_name(const char *name);
/* dlsym as glibc implements it (never our override). RTLD_NEXT through
 * it is relative to this library. */
void *cogpu__pl_real_dlsym(void *handle, const char *name);
/* glibc's dlsym itself (never NULL; resolved on first use). */
void *cogpu__pl_glibc_dlsym_resolve(void);
/* glibc's dlopen and dlclose, never a sanitizer's wrapper. */
void *cogpu__pl_real_dlopen(const char *file, int flags);
int cogpu__pl_real_dlclose(void *h);
/* glibc's own function `name` (dlsym, dlopen, dlclose), found with dlvsym
 * under whichever version this architecture and glibc gave it
 * (glibc-sym.c), or NULL. */
void *cogpu__pl_glibc_sym(const char *name);
/* The handle of the real libcuda.so.1, or NULL. */
void *cogpu__pl_driver(void);

/* --- account.c ----------------------------------------------------------- */
typedef enum {
  PL_KIND_MEM = 1, /* plain, pitched, managed */
  PL_KIND_POOL,    /* stream-ordered; value holds the pool's index */
  PL_KIND_HANDLE,  /* VMM physical allocation */
  PL_KIND_ARRAY,
  PL_KIND_MIPMAP,
  PL_KIND_CTX
} pl_kind_t;

/* Charge `bytes` on CUDA device `dev` before allocating them: 0, or a
 * CUresult (CUDA_ERROR_OUT_OF_MEMORY) when the job may not have them. */
CUresult cogpu__pl_charge(CUdevice dev, uint64_t bytes);
/* Give back what an allocation held (after it was freed, or failed). */
void cogpu__pl_uncharge(CUdevice dev, uint64_t bytes);
/* After the driver answered `rc` to an allocation cogpu had charged on
 * `dev`: true (after a short sleep, or a wait in the node's queue) when
 * the caller should ask the driver again. Start each allocation with a
 * pl_retry_t zeroed but for the bytes it charged. */
typedef struct pl_retry_s {
  uint64_t charged; /* what the allocation charged */
  uint64_t deadline_ns;
  unsigned n;
  bool outside; /* waiting for memory held outside cogpu */
  bool again;   /* asked once more after a refusal the GPU did not explain */
} pl_retry_t;
bool cogpu__pl_retry(CUdevice dev, CUresult rc, pl_retry_t *r);
/* Adjust a charge after the fact (e.g. the real pitch), without waiting. */
void cogpu__pl_adjust(CUdevice dev, int64_t delta);
/* The retain count of dev's primary context as cogpu saw it (reset in a
 * forked child), or NULL for an ordinal out of range. */
_Atomic uint32_t *cogpu__pl_primary_refs(CUdevice dev);
/* The current context's device, or -1. */
CUdevice cogpu__pl_current_device(void);
/* Remember / forget an allocation: key, device, bytes. */
void cogpu__pl_track(pl_kind_t kind, uint64_t key, CUdevice dev,
                     uint64_t bytes);
/* A context cogpu saw made (created, or a primary one retained): memory
 * allocated while it is current is known to be its own. */
void cogpu__pl_context_known(CUcontext ctx);
/* The driver freed ctx and what it owned (cuCtxDestroy, the last primary
 * release, a primary reset): forget and credit that memory. */
void cogpu__pl_context_gone(CUcontext ctx);
/* Forget the allocation `key` in the table that holds `table`'s kind;
 * false if it was never tracked (then forward the free untouched). */
bool cogpu__pl_untrack(pl_kind_t table, uint64_t key, CUdevice *dev,
                       uint64_t *bytes, pl_kind_t *kind);
/* Frees take the entry out first (a racing free of the same key cannot
 * credit twice), let the driver free, then settle: credit the device, or
 * put the entry back if the driver refused. Untracked keys are the
 * driver's business alone. */
typedef struct pl_taken_s {
  bool known;
  uint64_t key;
  CUdevice dev;
  uint64_t val; /* bytes, or a pool's index */
  pl_kind_t kind;
} pl_taken_t;
pl_taken_t cogpu__pl_take(pl_kind_t table, uint64_t key);
CUresult cogpu__pl_settle(const pl_taken_t *t, CUresult rc);

/* Before a context is created on dev: attach, map the device, take the
 * mode's initial reservation (waiting for it). */
CUresult cogpu__pl_context_prepare(CUdevice dev);
/* The job's view of a device's memory, for cuMemGetInfo; false when the
 * device is not accounted (report the driver's figures). */
bool cogpu__pl_meminfo(CUdevice dev, uint64_t *free_b, uint64_t *total_b,
                       uint64_t real_free);
bool cogpu__pl_report_total(CUdevice dev, uint64_t *total);
/* Device memory counted for one CUDA context on dev: what the device's
 * first context measured (context_measure), else context_bytes. */
uint64_t cogpu__pl_context_bytes(CUdevice dev);
/* After the process's first context on dev was made with `charged`
 * counted for it: measure what it really holds on the GPU and count that
 * instead. Returns what is counted for it now. */
uint64_t cogpu__pl_context_settle(CUdevice dev, uint64_t charged);
/* Tell the ledger, once, that this process used a kind of memory the
 * driver cannot checkpoint (COGPU_MARK_*, backend.h). */
void cogpu__pl_mark(uint32_t flag);
/* Stream-ordered pools: account a pool's reserved footprint. */
void cogpu__pl_pool_sync(CUmemoryPool pool, CUdevice dev);
/* Charge what the devices' graph allocators hold now. */
void cogpu__pl_graph_sync(void);
uint64_t cogpu__pl_pool_index(CUmemoryPool pool, CUdevice dev);
/* A pool was created on dev (a handle may be reused after a destroy). */
void cogpu__pl_pool_created(CUmemoryPool pool, CUdevice dev);
/* The device a pool belongs to, if cogpu saw it created or asked the
 * driver for it; otherwise `fallback`. */
CUdevice cogpu__pl_pool_device(CUmemoryPool pool, CUdevice fallback);
CUmemoryPool cogpu__pl_pool_at(uint64_t index, CUdevice *dev);

#endif /* COGPU_PRELOAD_INT_H */
