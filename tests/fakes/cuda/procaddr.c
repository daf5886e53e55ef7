/*
 * procaddr.c: cuGetProcAddress and cuGetProcAddress_v2 of the fake
 * libcuda.so.1, resolving as the real driver does: the caller names a base
 * entry point ("cuMemAlloc") and the CUDA version it was built for; the
 * answer is the exported variant with the highest minimum version not above
 * it ("cuMemAlloc_v2" from 3.2 on), the per-thread-default-stream flavour
 * (_ptsz, _ptds) when the flags ask for it and one exists. The minimum
 * versions are those of cudaTypedefs.h's PFN_<name>_v<version> types.
 *
 * A driver knows only the entry points of its own version and earlier
 * (FAKE_CUDA_DRIVER_VERSION): later ones are not found, whatever the
 * caller's version.
 *
 * The address returned is that of the exported symbol, looked up with
 * dlsym in this library itself, so it equals what dlsym on a dlopen'd
 * libcuda.so.1 gives, and never an interposer's (LD_PRELOAD) definition.
 * With FAKE_CUDA_PRIVATE_ENTRIES set, cuMemAlloc_v2 and cuMemFree_v2 are
 * handed out as private functions that do the same: a driver is free to do
 * that, and then an interposer cannot tell what they are.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "fake-cuda-int.h"

typedef struct {
  const char *base, *variant;
  int version;     /* the lowest cudaVersion that gets this variant */
  bool per_thread; /* the per-thread default stream flavour */
} proc_entry_t;

static const proc_entry_t g_procs[] = {
    {"cuInit", "cuInit", 2000, false},
    {"cuDriverGetVersion", "cuDriverGetVersion", 2020, false},
    {"cuGetErrorString", "cuGetErrorString", 6000, false},
    {"cuGetErrorName", "cuGetErrorName", 6000, false},
    {"cuGetExportTable", "cuGetExportTable", 3000, false},
    {"cuGetProcAddress", "cuGetProcAddress", 11030, false},
    {"cuGetProcAddress", "cuGetProcAddress_v2", 12000, false},
    /* Devices */
    {"cuDeviceGetCount", "cuDeviceGetCount", 2000, false},
    {"cuDeviceGet", "cuDeviceGet", 2000, false},
    {"cuDeviceGetName", "cuDeviceGetName", 2000, false},
    {"cuDeviceGetUuid", "cuDeviceGetUuid", 9020, false},
    {"cuDeviceGetUuid", "cuDeviceGetUuid_v2", 11040, false},
    {"cuDeviceTotalMem", "cuDeviceTotalMem", 2000, false},
    {"cuDeviceTotalMem", "cuDeviceTotalMem_v2", 3020, false},
    {"cuDeviceGetAttribute", "cuDeviceGetAttribute", 2000, false},
    /* Contexts */
    {"cuCtxCreate", "cuCtxCreate", 2000, false},
    {"cuCtxCreate", "cuCtxCreate_v2", 3020, false},
    {"cuCtxCreate", "cuCtxCreate_v3", 11040, false},
    {"cuCtxCreate", "cuCtxCreate_v4", 12050, false},
    {"cuCtxDestroy", "cuCtxDestroy", 2000, false},
    {"cuCtxDestroy", "cuCtxDestroy_v2", 4000, false},
    {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000, false},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease", 7000, false},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000, false},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset", 7000, false},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", 11000, false},
    {"cuCtxSetCurrent", "cuCtxSetCurrent", 4000, false},
    {"cuCtxGetCurrent", "cuCtxGetCurrent", 4000, false},
    {"cuCtxGetDevice", "cuCtxGetDevice", 2000, false},
    {"cuCtxGetDevice", "cuCtxGetDevice_v2", 13000, false},
    {"cuCtxPushCurrent", "cuCtxPushCurrent", 2000, false},
    {"cuCtxPushCurrent", "cuCtxPushCurrent_v2", 4000, false},
    {"cuCtxPopCurrent", "cuCtxPopCurrent", 2000, false},
    {"cuCtxPopCurrent", "cuCtxPopCurrent_v2", 4000, false},
    {"cuCtxSynchronize", "cuCtxSynchronize", 2000, false},
    {"cuCtxSynchronize", "cuCtxSynchronize_v2", 13000, false},
    /* Streams, modules, launches */
    {"cuStreamCreate", "cuStreamCreate", 2000, false},
    {"cuStreamDestroy", "cuStreamDestroy", 2000, false},
    {"cuStreamDestroy", "cuStreamDestroy_v2", 4000, false},
    {"cuStreamSynchronize", "cuStreamSynchronize", 2000, false},
    {"cuStreamSynchronize", "cuStreamSynchronize_ptsz", 7000, true},
    {"cuModuleLoadData", "cuModuleLoadData", 2000, false},
    {"cuModuleUnload", "cuModuleUnload", 2000, false},
    {"cuModuleGetFunction", "cuModuleGetFunction", 2000, false},
    {"cuLaunchKernel", "cuLaunchKernel", 4000, false},
    {"cuLaunchKernel", "cuLaunchKernel_ptsz", 7000, true},
    /* Memory */
    {"cuMemGetInfo", "cuMemGetInfo", 2000, false},
    {"cuMemGetInfo", "cuMemGetInfo_v2", 3020, false},
    {"cuMemAlloc", "cuMemAlloc", 2000, false},
    {"cuMemAlloc", "cuMemAlloc_v2", 3020, false},
    {"cuMemAllocPitch", "cuMemAllocPitch_v2", 3020, false},
    {"cuMemAllocManaged", "cuMemAllocManaged", 6000, false},
    {"cuMemFree", "cuMemFree", 2000, false},
    {"cuMemFree", "cuMemFree_v2", 3020, false},
    {"cuMemAllocHost", "cuMemAllocHost", 2000, false},
    {"cuMemAllocHost", "cuMemAllocHost_v2", 3020, false},
    {"cuMemHostAlloc", "cuMemHostAlloc", 2020, false},
    {"cuMemFreeHost", "cuMemFreeHost", 2000, false},
    {"cuMemcpyHtoD", "cuMemcpyHtoD_v2", 3020, false},
    {"cuMemcpyHtoD", "cuMemcpyHtoD_v2_ptds", 7000, true},
    {"cuMemcpyDtoH", "cuMemcpyDtoH_v2", 3020, false},
    {"cuMemcpyDtoH", "cuMemcpyDtoH_v2_ptds", 7000, true},
    {"cuMemcpyDtoD", "cuMemcpyDtoD_v2", 3020, false},
    {"cuMemcpyDtoD", "cuMemcpyDtoD_v2_ptds", 7000, true},
    {"cuMemsetD8", "cuMemsetD8_v2", 3020, false},
    {"cuMemsetD8", "cuMemsetD8_v2_ptds", 7000, true},
    {"cuMemsetD32", "cuMemsetD32_v2", 3020, false},
    {"cuMemsetD32", "cuMemsetD32_v2_ptds", 7000, true},
    {"cuMemAllocAsync", "cuMemAllocAsync", 11020, false},
    {"cuMemAllocAsync", "cuMemAllocAsync_ptsz", 11020, true},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 11020, false},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", 11020, true},
    {"cuMemFreeAsync", "cuMemFreeAsync", 11020, false},
    {"cuMemFreeAsync", "cuMemFreeAsync_ptsz", 11020, true},
    {"cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool", 11020, false},
    {"cuDeviceGetMemPool", "cuDeviceGetMemPool", 11020, false},
    {"cuDeviceSetMemPool", "cuDeviceSetMemPool", 11020, false},
    {"cuMemPoolCreate", "cuMemPoolCreate", 11020, false},
    {"cuMemPoolDestroy", "cuMemPoolDestroy", 11020, false},
    {"cuMemPoolTrimTo", "cuMemPoolTrimTo", 11020, false},
    {"cuMemPoolGetAttribute", "cuMemPoolGetAttribute", 11020, false},
    {"cuMemPoolSetAttribute", "cuMemPoolSetAttribute", 11020, false},
    {"cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity", 10020,
     false},
    {"cuMemCreate", "cuMemCreate", 10020, false},
    {"cuMemRelease", "cuMemRelease", 10020, false},
    {"cuMemAddressReserve", "cuMemAddressReserve", 10020, false},
    {"cuMemAddressFree", "cuMemAddressFree", 10020, false},
    {"cuMemMap", "cuMemMap", 10020, false},
    {"cuMemUnmap", "cuMemUnmap", 10020, false},
    {"cuMemSetAccess", "cuMemSetAccess", 10020, false},
    {"cuMemExportToShareableHandle", "cuMemExportToShareableHandle", 10020,
     false},
    {"cuArrayCreate", "cuArrayCreate_v2", 3020, false},
    {"cuArray3DCreate", "cuArray3DCreate_v2", 3020, false},
    {"cuArrayDestroy", "cuArrayDestroy", 2000, false},
    {"cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 5000, false},
    {"cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 5000, false},
    /* Graphs */
    {"cuGraphCreate", "cuGraphCreate", 10000, false},
    {"cuGraphDestroy", "cuGraphDestroy", 10000, false},
    {"cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode", 11040, false},
    {"cuGraphAddMemFreeNode", "cuGraphAddMemFreeNode", 11040, false},
    {"cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags", 11040,
     false},
    {"cuGraphUpload", "cuGraphUpload", 11010, false},
    {"cuGraphUpload", "cuGraphUpload_ptsz", 11010, true},
    {"cuGraphLaunch", "cuGraphLaunch", 10000, false},
    {"cuGraphLaunch", "cuGraphLaunch_ptsz", 10000, true},
    {"cuGraphExecDestroy", "cuGraphExecDestroy", 10000, false},
    {"cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim", 11040, false},
    {"cuDeviceGetGraphMemAttribute", "cuDeviceGetGraphMemAttribute", 11040,
     false},
    {"cuIpcGetMemHandle", "cuIpcGetMemHandle", 4010, false},
    {"cuIpcOpenMemHandle", "cuIpcOpenMemHandle", 4010, false},
    {"cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2", 11000, false},
    {"cuIpcCloseMemHandle", "cuIpcCloseMemHandle", 4010, false},
    /* Process checkpoints (driver 570, CUDA 12.8) */
    {"cuCheckpointProcessGetRestoreThreadId",
     "cuCheckpointProcessGetRestoreThreadId", 12080, false},
    {"cuCheckpointProcessGetState", "cuCheckpointProcessGetState", 12080,
     false},
    {"cuCheckpointProcessLock", "cuCheckpointProcessLock", 12080, false},
    {"cuCheckpointProcessCheckpoint", "cuCheckpointProcessCheckpoint", 12080,
     false},
    {"cuCheckpointProcessRestore", "cuCheckpointProcessRestore", 12080, false},
    {"cuCheckpointProcessUnlock", "cuCheckpointProcessUnlock", 12080, false},
};

/* Functions of their own (an alias would share the exported address),
 * calling the fake by names no interposer replaces. */
static CUresult private_alloc(CUdeviceptr *dptr, size_t bytes) {
  return fake_private_alloc(dptr, bytes);
}

static CUresult private_free(CUdeviceptr p) {
  return fake_private_free(p);
}

static void *private_entry(const char *variant) {
  if (!getenv("FAKE_CUDA_PRIVATE_ENTRIES"))
    return NULL;
  if (!strcmp(variant, "cuMemAlloc_v2"))
    return (void *)private_alloc;
  if (!strcmp(variant, "cuMemFree_v2"))
    return (void *)private_free;
  return NULL;
}

static void *g_self; /* this library, for dlsym */
static pthread_once_t g_self_once = PTHREAD_ONCE_INIT;

static void self_open(void) {
  Dl_info info;
  if (dladdr((void *)&self_open, &info) && info.dli_fname)
    g_self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
}

/* The entry for (symbol, version, per_thread); NULL with *status saying
 * why if there is none. */
static const proc_entry_t *resolve(const char *symbol, int version,
                                   bool per_thread,
                                   CUdriverProcAddressQueryResult *status) {
  const proc_entry_t *best = NULL;
  bool known = false, has_per_thread = false;
  int driver = fake_driver_version();
  for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++)
    if (strcmp(g_procs[i].base, symbol) == 0 && g_procs[i].version <= version &&
        g_procs[i].version <= driver)
      has_per_thread |= g_procs[i].per_thread;
  /* The per-thread flavour when asked for and available, else the legacy
   * one; then the highest version. */
  bool want = per_thread && has_per_thread;
  for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
    const proc_entry_t *e = &g_procs[i];
    if (strcmp(e->base, symbol) != 0 || e->version > driver)
      continue;
    known = true;
    if (e->version <= version && e->per_thread == want &&
        (!best || e->version > best->version))
      best = e;
  }
  *status = best    ? CU_GET_PROC_ADDRESS_SUCCESS
            : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                    : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return best;
}

static CUresult get_proc_address(const char *symbol, void **pfn,
                                 int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *symbolStatus) {
  CUdriverProcAddressQueryResult status;
  if (!symbol || !pfn ||
      (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
    return CUDA_ERROR_INVALID_VALUE;
  *pfn = NULL;
  const proc_entry_t *e = resolve(
      symbol, cudaVersion,
      (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, &status);
  if (e) {
    pthread_once(&g_self_once, self_open);
    *pfn = private_entry(e->variant);
    if (!*pfn)
      *pfn = g_self ? dlsym(g_self, e->variant) : NULL;
    if (!*pfn)
      status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  if (symbolStatus)
    *symbolStatus = status;
  return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn,
                                   int cudaVersion, cuuint64_t flags) {
  FAKE_ENTER();
  return get_proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

FAKE_API CUresult cuGetProcAddress_v2(
    const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
    CUdriverProcAddressQueryResult *symbolStatus) {
  FAKE_ENTER();
  return get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}
