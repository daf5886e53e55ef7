/*
 * fake-cuda.h: what the fake libcuda.so.1 (tests/fakes/cuda) exports: the
 * CUDA driver entry points it implements, with their real signatures and
 * exported names, and its test hooks (fake_cuda_*). Tests include it for
 * the types and declarations, and reach the functions with dlsym on a
 * dlopen'd libcuda.so.1; they never link against the fake.
 *
 * Types that src/cuda/cuda-abi.h does not declare are declared here
 * with a fake_ prefix (same layout as cuda.h), so that the two never clash.
 */
#ifndef COGPU_FAKE_CUDA_H
#define COGPU_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda-abi.h"

#define FAKE_API __attribute__((visibility("default")))

/* --- Types missing from cuda-abi.h ---------------------------------------- */

/* The legacy (CUDA 2.x, "v1") API's 32-bit device pointer. */
typedef unsigned int fake_CUdeviceptr_v1;
typedef struct CUmod_st *fake_CUmodule;
/* Passed through, never read: incomplete here. */
struct CUexecAffinityParam_st;
struct CUctxCreateParams_st;

typedef CUmemPoolProps fake_CUmemPoolProps;
typedef CUmemAccessDesc fake_CUmemAccessDesc;

typedef struct fake_CUipcMemHandle_st {
  char reserved[64];
} fake_CUipcMemHandle;

/* --- Test hooks ----------------------------------------------------------- */

/* Device memory of the GPU with this NVML index, from the shared state
 * (all processes): bytes in use, the highest use, and the number of
 * allocations refused for lack of memory. Processes found dead are
 * reclaimed first. Any pointer may be NULL. Returns 0, or -1 if the state
 * file cannot be used or the index is out of range. */
FAKE_API int fake_cuda_stats(int nvml_index, unsigned long long *used,
                             unsigned long long *peak,
                             unsigned long long *ooms);
/* Sets every GPU's peak to its current use. */
FAKE_API void fake_cuda_reset_peak(void);
/* cuLaunchKernel calls made by this process (since it started or forked). */
FAKE_API unsigned long long fake_cuda_launch_count(void);
/* What cuGetExportTable hands out, whatever table is asked for. */
FAKE_API extern const unsigned long long fake_cuda_export_table[8];

/* Checkpoints (checkpoint.c has the model). The fake's own state of live
 * process `pid`: FAKE_CKPT_RUNNING, _LOCKED, _CHECKPOINTED, _FAILED (stuck
 * for good, whatever cuCheckpointProcessGetState says of it) or _LOCKING
 * (a Lock waiting for its calls and work), as fake-cuda-state.h defines
 * them; -1 if pid has no live fake-CUDA process. A caller that died
 * mid-operation is settled first. No permission check. */
FAKE_API int fake_cuda_ckpt_state(int pid);
/* Bytes of GPU `nvml_index` that `pid` holds checkpointed in host memory;
 * 0 if none, or if pid has no live fake-CUDA process. */
FAKE_API unsigned long long fake_cuda_ckpt_bytes(int pid, int nvml_index);
/* Processes left stuck for good by a checkpoint call (a Restore without
 * enough memory, a Checkpoint of a process using managed memory, IPC or
 * shareable handles) since the state file was made: tests assert that
 * cogpu never causes one. */
FAKE_API unsigned long long fake_cuda_ckpt_wedged(void);

/* --- Initialisation, versions, errors ------------------------------------- */

FAKE_API CUresult cuInit(unsigned int Flags);
FAKE_API CUresult cuDriverGetVersion(int *driverVersion);
FAKE_API CUresult cuGetErrorString(CUresult error, const char **pStr);
FAKE_API CUresult cuGetErrorName(CUresult error, const char **pStr);
FAKE_API CUresult cuGetExportTable(const void **ppExportTable,
                                   const CUuuid *pExportTableId);
FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn,
                                   int cudaVersion, cuuint64_t flags);
FAKE_API CUresult cuGetProcAddress_v2(
    const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
    CUdriverProcAddressQueryResult *symbolStatus);

/* --- Devices -------------------------------------------------------------- */

FAKE_API CUresult cuDeviceGetCount(int *count);
FAKE_API CUresult cuDeviceGet(CUdevice *device, int ordinal);
FAKE_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
FAKE_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
FAKE_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
FAKE_API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
FAKE_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
FAKE_API CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);

/* --- Contexts ------------------------------------------------------------- */

FAKE_API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags,
                              CUdevice dev);
FAKE_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags,
                                 CUdevice dev);
FAKE_API CUresult cuCtxCreate_v3(CUcontext *pctx,
                                 struct CUexecAffinityParam_st *paramsArray,
                                 int numParams, unsigned int flags,
                                 CUdevice dev);
FAKE_API CUresult cuCtxCreate_v4(CUcontext *pctx,
                                 struct CUctxCreateParams_st *ctxCreateParams,
                                 unsigned int flags, CUdevice dev);
FAKE_API CUresult cuCtxDestroy(CUcontext ctx);
FAKE_API CUresult cuCtxDestroy_v2(CUcontext ctx);
FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
FAKE_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
FAKE_API CUresult cuDevicePrimaryCtxReset(CUdevice dev);
FAKE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
FAKE_API CUresult cuCtxSetCurrent(CUcontext ctx);
FAKE_API CUresult cuCtxGetCurrent(CUcontext *pctx);
FAKE_API CUresult cuCtxGetDevice(CUdevice *device);
FAKE_API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
FAKE_API CUresult cuCtxPushCurrent(CUcontext ctx);
FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx);
FAKE_API CUresult cuCtxPopCurrent(CUcontext *pctx);
FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
FAKE_API CUresult cuCtxSynchronize(void);
FAKE_API CUresult cuCtxSynchronize_v2(CUcontext ctx);

/* --- Streams, modules, launches ------------------------------------------- */

FAKE_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
FAKE_API CUresult cuStreamDestroy(CUstream hStream);
FAKE_API CUresult cuStreamDestroy_v2(CUstream hStream);
FAKE_API CUresult cuStreamSynchronize(CUstream hStream);
FAKE_API CUresult cuStreamSynchronize_ptsz(CUstream hStream);
FAKE_API CUresult cuModuleLoadData(fake_CUmodule *module, const void *image);
FAKE_API CUresult cuModuleUnload(fake_CUmodule hmod);
FAKE_API CUresult cuModuleGetFunction(CUfunction *hfunc, fake_CUmodule hmod,
                                      const char *name);
FAKE_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                                 unsigned int gridDimY, unsigned int gridDimZ,
                                 unsigned int blockDimX, unsigned int blockDimY,
                                 unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, CUstream hStream,
                                 void **kernelParams, void **extra);
FAKE_API CUresult cuLaunchKernel_ptsz(
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
    void **kernelParams, void **extra);

/* --- Memory --------------------------------------------------------------- */

FAKE_API CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
FAKE_API CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
FAKE_API CUresult cuMemAlloc(fake_CUdeviceptr_v1 *dptr, unsigned int bytesize);
FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch,
                                     size_t WidthInBytes, size_t Height,
                                     unsigned int ElementSizeBytes);
FAKE_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize,
                                    unsigned int flags);
FAKE_API CUresult cuMemFree(fake_CUdeviceptr_v1 dptr);
FAKE_API CUresult cuMemFree_v2(CUdeviceptr dptr);
FAKE_API CUresult cuMemAllocHost(void **pp, unsigned int bytesize);
FAKE_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
FAKE_API CUresult cuMemHostAlloc(void **pp, size_t bytesize,
                                 unsigned int Flags);
FAKE_API CUresult cuMemFreeHost(void *p);

FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost,
                                  size_t ByteCount);
FAKE_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice,
                                       const void *srcHost, size_t ByteCount);
FAKE_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice,
                                  size_t ByteCount);
FAKE_API CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice,
                                       size_t ByteCount);
FAKE_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                  size_t ByteCount);
FAKE_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice,
                                       CUdeviceptr srcDevice, size_t ByteCount);
FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc,
                                size_t N);
FAKE_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc,
                                     size_t N);
FAKE_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui,
                                 size_t N);
FAKE_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui,
                                      size_t N);

/* Stream-ordered allocation and memory pools. */
FAKE_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize,
                                  CUstream hStream);
FAKE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                       CUstream hStream);
FAKE_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                          CUmemoryPool pool, CUstream hStream);
FAKE_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr,
                                               size_t bytesize,
                                               CUmemoryPool pool,
                                               CUstream hStream);
FAKE_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
FAKE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
FAKE_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out,
                                            CUdevice dev);
FAKE_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
FAKE_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
FAKE_API CUresult cuMemPoolCreate(CUmemoryPool *pool,
                                  const fake_CUmemPoolProps *poolProps);
FAKE_API CUresult cuMemPoolDestroy(CUmemoryPool pool);
FAKE_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
FAKE_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr,
                                        void *value);
FAKE_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr,
                                        void *value);

/* Virtual memory management. */
FAKE_API CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                const CUmemAllocationProp *prop,
                                                int option);
FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                              const CUmemAllocationProp *prop,
                              unsigned long long flags);
FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
FAKE_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size,
                                      size_t alignment, CUdeviceptr addr,
                                      unsigned long long flags);
FAKE_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
FAKE_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                           CUmemGenericAllocationHandle handle,
                           unsigned long long flags);
FAKE_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
FAKE_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                 const fake_CUmemAccessDesc *desc,
                                 size_t count);

/* Arrays. */
FAKE_API CUresult cuArrayCreate_v2(CUarray *pHandle,
                                   const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
FAKE_API CUresult cuArray3DCreate_v2(
    CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
FAKE_API CUresult cuArrayDestroy(CUarray hArray);
FAKE_API CUresult
cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                       const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                       unsigned int numMipmapLevels);
FAKE_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);

/* Graphs with memory nodes (graph.c). Only allocations freed within their
 * own graph are modelled. */
FAKE_API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
FAKE_API CUresult cuGraphDestroy(CUgraph hGraph);
FAKE_API CUresult cuGraphAddMemAllocNode(
    CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
    size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
FAKE_API CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode,
                                        CUgraph hGraph,
                                        const CUgraphNode *dependencies,
                                        size_t numDependencies,
                                        CUdeviceptr dptr);
FAKE_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec,
                                              CUgraph hGraph,
                                              unsigned long long flags);
FAKE_API CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream);
FAKE_API CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream);
FAKE_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
FAKE_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
FAKE_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
FAKE_API CUresult cuDeviceGraphMemTrim(CUdevice device);
FAKE_API CUresult cuDeviceGetGraphMemAttribute(CUdevice device, int attr,
                                               void *value);

/* Exports a VMM handle as a file descriptor (handleType 1, POSIX). */
FAKE_API CUresult cuMemExportToShareableHandle(
    void *shareableHandle, CUmemGenericAllocationHandle handle, int handleType,
    unsigned long long flags);

/* Inter-process handles: a handle can be made, not opened (fake device
 * memory is private to its process). */
FAKE_API CUresult cuIpcGetMemHandle(fake_CUipcMemHandle *pHandle,
                                    CUdeviceptr dptr);
FAKE_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr,
                                     fake_CUipcMemHandle handle,
                                     unsigned int Flags);
FAKE_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr,
                                        fake_CUipcMemHandle handle,
                                        unsigned int Flags);
FAKE_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);

/* Process checkpoints (checkpoint.c). The caller must have called cuInit;
 * the target is another process, by pid. Each args may be NULL. */
FAKE_API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid);
FAKE_API CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state);
FAKE_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
FAKE_API CUresult
cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args);
FAKE_API CUresult cuCheckpointProcessRestore(int pid,
                                             CUcheckpointRestoreArgs *args);
FAKE_API CUresult cuCheckpointProcessUnlock(int pid,
                                            CUcheckpointUnlockArgs *args);

#endif /* COGPU_FAKE_CUDA_H */
