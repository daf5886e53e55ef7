/*
 * hooks-mem.c: every way a CUDA program takes device memory, charged to
 * the device it came from before the driver is asked, and credited back to
 * that same device when freed. A free of memory cogpu never saw is passed
 * to the driver untouched; only the driver's own results are returned.
 */
#include "api/api.h"
#include "preload/preload-int.h"

/* Charge, allocate, track; undo the charge if the driver fails. */
#define ALLOC_ON(dev, bytes, kind, key_expr, call)                             \
  do {                                                                         \
    CUresult rc_ = cogpu__pl_charge((dev), (bytes));                           \
    if (rc_ != CUDA_SUCCESS)                                                   \
      return rc_;                                                              \
    pl_retry_t retry_ = {.charged = (bytes)};                                  \
    do                                                                         \
      rc_ = (call);                                                            \
    while (cogpu__pl_retry((dev), rc_, &retry_));                              \
    if (rc_ == CUDA_SUCCESS)                                                   \
      cogpu__pl_track((kind), (uint64_t)(key_expr), (dev), (bytes));           \
    else                                                                       \
      cogpu__pl_uncharge((dev), (bytes));                                      \
    return rc_;                                                                \
  } while (0)

static CUresult not_loaded(void) {
  return CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
  cuMemAlloc_v2_ft *real = REAL(cuMemAlloc_v2);
  if (!real)
    return not_loaded();
  CUdevice dev = cogpu__pl_current_device();
  if (!dptr)
    return real(dptr, bytes);
  ALLOC_ON(dev, bytes, PL_KIND_MEM, *dptr, real(dptr, bytes));
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes) {
  cuMemAlloc_ft *real = REAL(cuMemAlloc);
  if (!real)
    return not_loaded();
  CUdevice dev = cogpu__pl_current_device();
  if (!dptr)
    return real(dptr, bytes);
  ALLOC_ON(dev, bytes, PL_KIND_MEM, *dptr, real(dptr, bytes));
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes,
                           unsigned int flags) {
  cuMemAllocManaged_ft *real = REAL(cuMemAllocManaged);
  if (!real)
    return not_loaded();
  /* Managed memory lives on the current device until it migrates; the
   * driver cannot checkpoint it (its job is never suspended). */
  cogpu__pl_mark(COGPU_MARK_MANAGED);
  CUdevice dev = cogpu__pl_current_device();
  if (!dptr)
    return real(dptr, bytes, flags);
  ALLOC_ON(dev, bytes, PL_KIND_MEM, *dptr, real(dptr, bytes, flags));
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                            size_t height, unsigned int elem) {
  cuMemAllocPitch_v2_ft *real = REAL(cuMemAllocPitch_v2);
  if (!real)
    return not_loaded();
  CUdevice dev = cogpu__pl_current_device();
  if (!dptr || !pitch)
    return real(dptr, pitch, width, height, elem);
  /* The driver picks the pitch: charge a generous estimate, then the
   * real pitch x height. */
  uint64_t guess = ((width + 511) / 512 * 512) * height;
  CUresult rc = cogpu__pl_charge(dev, guess);
  if (rc != CUDA_SUCCESS)
    return rc;
  pl_retry_t retry = {.charged = guess};
  do
    rc = real(dptr, pitch, width, height, elem);
  while (cogpu__pl_retry(dev, rc, &retry));
  if (rc != CUDA_SUCCESS) {
    cogpu__pl_uncharge(dev, guess);
    return rc;
  }
  uint64_t bytes = (uint64_t)*pitch * height;
  cogpu__pl_adjust(dev, (int64_t)bytes - (int64_t)guess);
  cogpu__pl_track(PL_KIND_MEM, *dptr, dev, bytes);
  return rc;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  cuMemFree_v2_ft *real = REAL(cuMemFree_v2);
  if (!real)
    return not_loaded();
  pl_taken_t t = cogpu__pl_take(PL_KIND_MEM, p);
  return cogpu__pl_settle(&t, real(p));
}

CUresult cuMemFree(CUdeviceptr_v1 p) {
  cuMemFree_ft *real = REAL(cuMemFree);
  if (!real)
    return not_loaded();
  pl_taken_t t = cogpu__pl_take(PL_KIND_MEM, p);
  return cogpu__pl_settle(&t, real(p));
}

/* --- Stream-ordered allocation: what a pool reserves is what counts. --- */

static CUresult async_alloc(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                            CUdevice dev, CUresult (*call)(void *), void *ctx) {
  CUresult rc = cogpu__pl_charge(dev, bytes);
  if (rc != CUDA_SUCCESS)
    return rc;
  pl_retry_t retry = {.charged = bytes};
  do
    rc = call(ctx);
  while (cogpu__pl_retry(dev, rc, &retry));
  /* The request only reserved room; the pool's footprint is the charge. */
  cogpu__pl_adjust(dev, -(int64_t)bytes);
  if (rc == CUDA_SUCCESS && dptr && pool) {
    cogpu__pl_track(PL_KIND_POOL, *dptr, dev, cogpu__pl_pool_index(pool, dev));
    cogpu__pl_pool_sync(pool, dev);
  }
  return rc;
}

typedef struct async_args_s {
  void *fn;
  CUdeviceptr *dptr;
  size_t bytes;
  CUmemoryPool pool;
  CUstream stream;
} async_args_t;

static CUresult call_default_pool(void *a) {
  async_args_t *x = a;
  return ((cuMemAllocAsync_ft *)x->fn)(x->dptr, x->bytes, x->stream);
}

static CUresult call_from_pool(void *a) {
  async_args_t *x = a;
  return ((cuMemAllocFromPoolAsync_ft *)x->fn)(x->dptr, x->bytes, x->pool,
                                               x->stream);
}

static CUmemoryPool current_pool(CUdevice dev) {
  cuDeviceGetMemPool_ft *get = REAL(cuDeviceGetMemPool);
  CUmemoryPool pool = NULL;
  if (!get || dev < 0 || get(&pool, dev) != CUDA_SUCCESS)
    return NULL;
  return pool;
}

static CUresult alloc_async(void *real, CUdeviceptr *dptr, size_t bytes,
                            CUstream s) {
  if (!real)
    return not_loaded();
  CUdevice dev = cogpu__pl_current_device();
  async_args_t a = {real, dptr, bytes, NULL, s};
  if (!dptr)
    return call_default_pool(&a);
  return async_alloc(dptr, bytes, current_pool(dev), dev, call_default_pool,
                     &a);
}

static CUresult alloc_from_pool(void *real, CUdeviceptr *dptr, size_t bytes,
                                CUmemoryPool pool, CUstream s) {
  if (!real)
    return not_loaded();
  /* The pool's device, which need not be the current one. */
  CUdevice dev = cogpu__pl_pool_device(pool, cogpu__pl_current_device());
  async_args_t a = {real, dptr, bytes, pool, s};
  if (!dptr)
    return call_from_pool(&a);
  return async_alloc(dptr, bytes, pool, dev, call_from_pool, &a);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) {
  return alloc_async((void *)REAL(cuMemAllocAsync), dptr, bytes, s);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s) {
  return alloc_async((void *)REAL(cuMemAllocAsync_ptsz), dptr, bytes, s);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes,
                                 CUmemoryPool pool, CUstream s) {
  return alloc_from_pool((void *)REAL(cuMemAllocFromPoolAsync), dptr, bytes,
                         pool, s);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                      CUmemoryPool pool, CUstream s) {
  return alloc_from_pool((void *)REAL(cuMemAllocFromPoolAsync_ptsz), dptr,
                         bytes, pool, s);
}

CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  cuMemFreeAsync_ft *real = REAL(cuMemFreeAsync);
  if (!real)
    return not_loaded();
  pl_taken_t t = cogpu__pl_take(PL_KIND_MEM, p);
  return cogpu__pl_settle(&t, real(p, s));
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  cuMemFreeAsync_ptsz_ft *real = REAL(cuMemFreeAsync_ptsz);
  if (!real)
    return not_loaded();
  pl_taken_t t = cogpu__pl_take(PL_KIND_MEM, p);
  return cogpu__pl_settle(&t, real(p, s));
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  cuMemPoolTrimTo_ft *real = REAL(cuMemPoolTrimTo);
  if (!real)
    return not_loaded();
  CUresult rc = real(pool, keep);
  CUdevice dev = -1;
  uint64_t i = cogpu__pl_pool_index(pool, cogpu__pl_current_device());
  if (rc == CUDA_SUCCESS && cogpu__pl_pool_at(i, &dev))
    cogpu__pl_pool_sync(pool, dev);
  return rc;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
  cuMemPoolCreate_ft *real = REAL(cuMemPoolCreate);
  if (!real)
    return not_loaded();
  CUresult rc = real(pool, props);
  if (rc == CUDA_SUCCESS && pool && *pool && props &&
      props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
    cogpu__pl_pool_created(*pool, props->location.id);
  return rc;
}

/* --- Virtual memory management: the physical handle is what costs. --- */

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop,
                     unsigned long long flags) {
  cuMemCreate_ft *real = REAL(cuMemCreate);
  if (!real)
    return not_loaded();
  if (!handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(handle, size, prop, flags);
  CUdevice dev = prop->location.id;
  ALLOC_ON(dev, size, PL_KIND_HANDLE, *handle, real(handle, size, prop, flags));
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  cuMemRelease_ft *real = REAL(cuMemRelease);
  if (!real)
    return not_loaded();
  pl_taken_t t = cogpu__pl_take(PL_KIND_HANDLE, handle);
  return cogpu__pl_settle(&t, real(handle));
}

/* --- Sharing memory with other processes. ---
 * Not accounted here (the memory is the exporter's), but what the driver's
 * checkpoint cannot move: the process's job is then never suspended. Marked
 * before the driver is called, so no suspension starts once the handle
 * exists. */

CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr) {
  cuIpcGetMemHandle_ft *real = REAL(cuIpcGetMemHandle);
  if (!real)
    return not_loaded();
  cogpu__pl_mark(COGPU_MARK_IPC);
  return real(handle, dptr);
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *dptr, CUipcMemHandle handle,
                            unsigned int flags) {
  cuIpcOpenMemHandle_ft *real = REAL(cuIpcOpenMemHandle);
  if (!real)
    return not_loaded();
  cogpu__pl_mark(COGPU_MARK_IPC);
  return real(dptr, handle, flags);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle,
                               unsigned int flags) {
  cuIpcOpenMemHandle_v2_ft *real = REAL(cuIpcOpenMemHandle_v2);
  if (!real)
    return not_loaded();
  cogpu__pl_mark(COGPU_MARK_IPC);
  return real(dptr, handle, flags);
}

CUresult cuMemExportToShareableHandle(void *shareable,
                                      CUmemGenericAllocationHandle handle,
                                      int type, unsigned long long flags) {
  cuMemExportToShareableHandle_ft *real = REAL(cuMemExportToShareableHandle);
  if (!real)
    return not_loaded();
  cogpu__pl_mark(COGPU_MARK_VMM_EXPORT);
  return real(shareable, handle, type, flags);
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                        void *shareable, int type) {
  cuMemImportFromShareableHandle_ft *real =
      REAL(cuMemImportFromShareableHandle);
  if (!real)
    return not_loaded();
  cogpu__pl_mark(COGPU_MARK_VMM_EXPORT);
  return real(handle, shareable, type);
}

/* --- Arrays. --- */

/* Bytes per element, as num/den. The classic formats are per channel; the
 * later ones (0x50 and up) name their whole element (cuda-abi.h). A format
 * cogpu does not know is charged as the widest classic element, 16 bytes. */
static void format_size(int format, unsigned channels, uint64_t *num,
                        uint64_t *den) {
  *den = 1;
  switch (format) {
  case CU_AD_FORMAT_UNSIGNED_INT8:
  case CU_AD_FORMAT_SIGNED_INT8:
    *num = 1 * (uint64_t)(channels ? channels : 1);
    return;
  case CU_AD_FORMAT_UNSIGNED_INT16:
  case CU_AD_FORMAT_SIGNED_INT16:
  case CU_AD_FORMAT_HALF:
    *num = 2 * (uint64_t)(channels ? channels : 1);
    return;
  case CU_AD_FORMAT_UNSIGNED_INT32:
  case CU_AD_FORMAT_SIGNED_INT32:
  case CU_AD_FORMAT_FLOAT:
    *num = 4 * (uint64_t)(channels ? channels : 1);
    return;
  default:
    if (!cu_format_element(format, num, den))
      *num = 16;
  }
}

static uint64_t dim(size_t v) {
  return v ? v : 1;
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, int format,
                            unsigned channels) {
  uint64_t num, den;
  format_size(format, channels, &num, &den);
  return (dim(w) * dim(h) * dim(d) * num + den - 1) / den;
}

CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc) {
  cuArrayCreate_v2_ft *real = REAL(cuArrayCreate_v2);
  if (!real)
    return not_loaded();
  if (!arr || !desc)
    return real(arr, desc);
  CUdevice dev = cogpu__pl_current_device();
  uint64_t bytes = array_bytes(desc->Width, desc->Height, 1, desc->Format,
                               desc->NumChannels);
  ALLOC_ON(dev, bytes, PL_KIND_ARRAY, (uintptr_t)*arr, real(arr, desc));
}

CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
  cuArray3DCreate_v2_ft *real = REAL(cuArray3DCreate_v2);
  if (!real)
    return not_loaded();
  if (!arr || !desc)
    return real(arr, desc);
  CUdevice dev = cogpu__pl_current_device();
  uint64_t bytes = array_bytes(desc->Width, desc->Height, desc->Depth,
                               desc->Format, desc->NumChannels);
  ALLOC_ON(dev, bytes, PL_KIND_ARRAY, (uintptr_t)*arr, real(arr, desc));
}

CUresult cuArrayDestroy(CUarray arr) {
  cuArrayDestroy_ft *real = REAL(cuArrayDestroy);
  if (!real)
    return not_loaded();
  pl_taken_t t = cogpu__pl_take(PL_KIND_ARRAY, (uintptr_t)arr);
  return cogpu__pl_settle(&t, real(arr));
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr,
                                const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                unsigned int levels) {
  cuMipmappedArrayCreate_ft *real = REAL(cuMipmappedArrayCreate);
  if (!real)
    return not_loaded();
  if (!arr || !desc)
    return real(arr, desc, levels);
  CUdevice dev = cogpu__pl_current_device();
  uint64_t bytes = 0;
  size_t w = desc->Width, h = desc->Height, d = desc->Depth;
  for (unsigned l = 0; l < (levels ? levels : 1); l++) {
    bytes += array_bytes(w, h, d, desc->Format, desc->NumChannels);
    w = w > 1 ? w / 2 : w;
    h = h > 1 ? h / 2 : h;
    d = d > 1 ? d / 2 : d;
  }
  ALLOC_ON(dev, bytes, PL_KIND_MIPMAP, (uintptr_t)*arr,
           real(arr, desc, levels));
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr) {
  cuMipmappedArrayDestroy_ft *real = REAL(cuMipmappedArrayDestroy);
  if (!real)
    return not_loaded();
  pl_taken_t t = cogpu__pl_take(PL_KIND_MIPMAP, (uintptr_t)arr);
  return cogpu__pl_settle(&t, real(arr));
}
