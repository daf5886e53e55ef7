/*
 * memory.c: the fake libcuda.so.1's memory calls. Device memory is host
 * memory: each allocation is its own anonymous NORESERVE mapping (so a
 * multi-GiB fake allocation costs nothing until touched), and the copy and
 * set calls are memcpy and memset on it, so test programs can compute and
 * check results. What an allocation costs is charged to its GPU in the
 * shared state (state.c):
 *
 *   cuMemAlloc*, cuMemAllocManaged   the bytes asked for
 *   cuMemAllocPitch                  pitch (width rounded up to 512) x height
 *   cuMemAllocHost, cuMemHostAlloc   nothing (host memory)
 *   memory pools                     what the pool reserves: 2 MiB granules,
 *                                    kept when freed until cuMemPoolTrimTo
 *   cuMemCreate                      its size (cuMemMap costs nothing)
 *   arrays                           width x height x depth x channels x
 *                                    bytes per channel; mipmaps: all levels
 *
 * Allocations made in a context (not pool or VMM ones) go with it.
 *
 * cuMemAllocManaged, cuIpcGetMemHandle and cuMemExportToShareableHandle
 * mark the process as one a checkpoint cannot handle (checkpoint.c).
 */
#include <limits.h>

#include "fake-cuda-int.h"

/* --- Common --------------------------------------------------------------- */

static uint64_t round_up(uint64_t v, uint64_t to) {
  return (v + to - 1) / to * to;
}

/* Locked. Maps `length` bytes, charges `charge` to GPU nvml and records
 * the mapping as an object of `kind` (owned by ctx, from pool). */
static CUresult new_mapping(CUcontext ctx, unsigned nvml, uint64_t length,
                            uint64_t charge, fake_kind_t kind,
                            CUmemoryPool pool, bool low32, CUdeviceptr *out) {
  void *p = fake_map(length, low32);
  if (!p) {
    fprintf(stderr, "fake-cuda: cannot map %llu bytes: %s\n",
            (unsigned long long)length, strerror(errno));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult r = charge ? fake_state_charge(nvml, charge) : CUDA_SUCCESS;
  fake_obj_t o = {.key = (uint64_t)(uintptr_t)p,
                  .bytes = kind == FAKE_MEM_POOL ? length : charge,
                  .length = length,
                  .kind = kind,
                  .nvml = nvml,
                  .ctx = ctx,
                  .pool = pool};
  if (r == CUDA_SUCCESS && !fake_obj_add(&o)) {
    fake_state_refund(nvml, charge);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r != CUDA_SUCCESS)
    munmap(p, (size_t)length);
  else
    *out = o.key;
  return r;
}

/* An allocation in the current context. */
static CUresult mem_alloc(CUdeviceptr *out, uint64_t bytes, fake_kind_t kind,
                          bool low32) {
  if (!out || bytes == 0)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = fake_current();
  if (c)
    r = new_mapping(c, c->nvml, bytes, kind == FAKE_MEM_HOST ? 0 : bytes, kind,
                    NULL, low32, out);
  fake_unlock();
  return r;
}

/* Frees an object of one of `kinds` at key; needs a current context unless
 * `anywhere`. */
static CUresult mem_free(uint64_t key, unsigned kinds, bool anywhere) {
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  fake_obj_t *o = NULL;
  if (!anywhere && !fake_current())
    r = CUDA_ERROR_INVALID_CONTEXT;
  else if (!(o = fake_obj_find(key, kinds)))
    r = CUDA_ERROR_INVALID_VALUE;
  else
    fake_obj_release(o);
  fake_unlock();
  return r;
}

/* --- Allocation ----------------------------------------------------------- */

FAKE_API CUresult cuMemAlloc(fake_CUdeviceptr_v1 *dptr, unsigned int bytesize) {
  FAKE_ENTER_INIT();
  CUdeviceptr p = 0;
  if (!dptr)
    return CUDA_ERROR_INVALID_VALUE;
  /* The legacy API's pointers have 32 bits: map below 4 GiB. */
  CUresult r = mem_alloc(&p, bytesize, FAKE_MEM_DEVICE, true);
  if (r == CUDA_SUCCESS)
    *dptr = (fake_CUdeviceptr_v1)p;
  return r;
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  FAKE_ENTER_INIT();
  return mem_alloc(dptr, bytesize, FAKE_MEM_DEVICE, false);
}

FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch,
                                     size_t WidthInBytes, size_t Height,
                                     unsigned int ElementSizeBytes) {
  FAKE_ENTER_INIT();
  uint64_t pitch = round_up(WidthInBytes, 512), bytes;
  if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
      WidthInBytes > SIZE_MAX - 512 ||
      (ElementSizeBytes != 4 && ElementSizeBytes != 8 &&
       ElementSizeBytes != 16) ||
      __builtin_mul_overflow(pitch, (uint64_t)Height, &bytes))
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = mem_alloc(dptr, bytes, FAKE_MEM_DEVICE, false);
  if (r == CUDA_SUCCESS)
    *pPitch = (size_t)pitch;
  return r;
}

FAKE_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize,
                                    unsigned int flags) {
  FAKE_ENTER_INIT();
  /* CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST */
  if (flags != 1 && flags != 2)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = mem_alloc(dptr, bytesize, FAKE_MEM_MANAGED, false);
  if (r == CUDA_SUCCESS)
    fake_ckpt_mark(FAKE_CKPT_USED_MANAGED);
  return r;
}

FAKE_API CUresult cuMemFree(fake_CUdeviceptr_v1 dptr) {
  FAKE_ENTER_INIT();
  return mem_free(dptr, FAKE_MEM_DEVICE | FAKE_MEM_MANAGED | FAKE_MEM_POOL,
                  false);
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FAKE_ENTER_INIT();
  return mem_free(dptr, FAKE_MEM_DEVICE | FAKE_MEM_MANAGED | FAKE_MEM_POOL,
                  false);
}

/* The same functions under hidden names: a call through them stays in the
 * fake, where a call to the exported name would reach an interposer. */
extern __typeof__(cuMemAlloc_v2) fake_private_alloc
    __attribute__((alias("cuMemAlloc_v2"), visibility("hidden")));
extern __typeof__(cuMemFree_v2) fake_private_free
    __attribute__((alias("cuMemFree_v2"), visibility("hidden")));

static CUresult host_alloc(void **pp, size_t bytesize) {
  CUdeviceptr p = 0;
  if (!pp)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = mem_alloc(&p, bytesize, FAKE_MEM_HOST, false);
  if (r == CUDA_SUCCESS)
    *pp = (void *)(uintptr_t)p;
  return r;
}

FAKE_API CUresult cuMemAllocHost(void **pp, unsigned int bytesize) {
  FAKE_ENTER_INIT();
  return host_alloc(pp, bytesize);
}

FAKE_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
  FAKE_ENTER_INIT();
  return host_alloc(pp, bytesize);
}

FAKE_API CUresult cuMemHostAlloc(void **pp, size_t bytesize,
                                 unsigned int Flags) {
  FAKE_ENTER_INIT();
  (void)Flags;
  return host_alloc(pp, bytesize);
}

FAKE_API CUresult cuMemFreeHost(void *p) {
  FAKE_ENTER_INIT();
  return mem_free((uint64_t)(uintptr_t)p, FAKE_MEM_HOST, true);
}

/* free: what the GPU has left, all processes counted, as the driver says. */
static CUresult mem_info(uint64_t *free, uint64_t *total) {
  if (!free || !total)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUcontext c = fake_current();
  if (c) {
    unsigned g = fake_state_phys_self(c->nvml); /* where it is now */
    uint64_t t = fake_state_total(g), u = fake_state_used(g);
    *total = t;
    *free = u < t ? t - u : 0;
  }
  fake_unlock();
  return c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

FAKE_API CUresult cuMemGetInfo(unsigned int *free, unsigned int *total) {
  FAKE_ENTER_INIT();
  uint64_t f, t;
  if (!free || !total)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = mem_info(&f, &t);
  if (r == CUDA_SUCCESS) {
    *free = f > UINT_MAX ? UINT_MAX : (unsigned)f;
    *total = t > UINT_MAX ? UINT_MAX : (unsigned)t;
  }
  return r;
}

FAKE_API CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
  FAKE_ENTER_INIT();
  uint64_t f, t;
  if (!free || !total)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = mem_info(&f, &t);
  if (r == CUDA_SUCCESS) {
    *free = (size_t)f;
    *total = (size_t)t;
  }
  return r;
}

/* --- Copies and sets ------------------------------------------------------ */

/* Whether [p, p+n) lies in memory of this process's, with a context. */
static CUresult mem_check(uint64_t p, uint64_t n) {
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!fake_current())
    r = CUDA_ERROR_INVALID_CONTEXT;
  else if (!fake_obj_containing(p, n, FAKE_ADDRESSABLE))
    r = CUDA_ERROR_INVALID_VALUE;
  fake_unlock();
  return r;
}

static CUresult copy_htod(CUdeviceptr dst, const void *src, size_t n) {
  CUresult r = mem_check(dst, n);
  if (r == CUDA_SUCCESS && !src)
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS)
    memcpy((void *)(uintptr_t)dst, src, n);
  return r;
}

static CUresult copy_dtoh(void *dst, CUdeviceptr src, size_t n) {
  CUresult r = mem_check(src, n);
  if (r == CUDA_SUCCESS && !dst)
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS)
    memcpy(dst, (const void *)(uintptr_t)src, n);
  return r;
}

static CUresult copy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  CUresult r = mem_check(dst, n);
  if (r == CUDA_SUCCESS)
    r = mem_check(src, n);
  if (r == CUDA_SUCCESS)
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  return r;
}

static CUresult set_d8(CUdeviceptr dst, unsigned char uc, size_t n) {
  CUresult r = mem_check(dst, n);
  if (r == CUDA_SUCCESS)
    memset((void *)(uintptr_t)dst, uc, n);
  return r;
}

static CUresult set_d32(CUdeviceptr dst, unsigned int ui, size_t n) {
  if (dst % 4 || n > SIZE_MAX / 4)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = mem_check(dst, (uint64_t)n * 4);
  uint32_t *p = (uint32_t *)(uintptr_t)dst;
  for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++)
    p[i] = ui;
  return r;
}

FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost,
                                  size_t ByteCount) {
  FAKE_ENTER_INIT();
  return copy_htod(dstDevice, srcHost, ByteCount);
}

FAKE_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice,
                                       const void *srcHost, size_t ByteCount) {
  FAKE_ENTER_INIT();
  return copy_htod(dstDevice, srcHost, ByteCount);
}

FAKE_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice,
                                  size_t ByteCount) {
  FAKE_ENTER_INIT();
  return copy_dtoh(dstHost, srcDevice, ByteCount);
}

FAKE_API CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice,
                                       size_t ByteCount) {
  FAKE_ENTER_INIT();
  return copy_dtoh(dstHost, srcDevice, ByteCount);
}

FAKE_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                  size_t ByteCount) {
  FAKE_ENTER_INIT();
  return copy_dtod(dstDevice, srcDevice, ByteCount);
}

FAKE_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice,
                                       CUdeviceptr srcDevice,
                                       size_t ByteCount) {
  FAKE_ENTER_INIT();
  return copy_dtod(dstDevice, srcDevice, ByteCount);
}

FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc,
                                size_t N) {
  FAKE_ENTER_INIT();
  return set_d8(dstDevice, uc, N);
}

FAKE_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc,
                                     size_t N) {
  FAKE_ENTER_INIT();
  return set_d8(dstDevice, uc, N);
}

FAKE_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui,
                                 size_t N) {
  FAKE_ENTER_INIT();
  return set_d32(dstDevice, ui, N);
}

FAKE_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui,
                                      size_t N) {
  FAKE_ENTER_INIT();
  return set_d32(dstDevice, ui, N);
}

/* --- Memory pools --------------------------------------------------------- */

/* A pool holds `reserved` bytes of its GPU (charged, in 2 MiB granules),
 * `used` of them by live allocations. An allocation that does not fit in
 * what is reserved grows the reservation; frees only lower `used`;
 * cuMemPoolTrimTo gives reserved memory back. (A real driver also trims at
 * synchronisation down to CU_MEMPOOL_ATTR_RELEASE_THRESHOLD; the fake does
 * not.) */

struct CUmemPoolHandle_st {
  int ordinal;
  unsigned nvml;
  bool is_default, destroyed;
  uint64_t reserved, used, reserved_high, used_high, threshold, max_size;
  struct CUmemPoolHandle_st *next; /* list of created pools */
};

static struct CUmemPoolHandle_st g_default_pool[FAKE_CUDA_MAX_GPUS];
static CUmemoryPool g_current_pool[FAKE_CUDA_MAX_GPUS]; /* NULL: default */
static CUmemoryPool g_pools; /* created ones, destroyed ones with users */

/* Locked. The default pool of a valid ordinal. */
static CUmemoryPool default_pool(CUdevice dev) {
  CUmemoryPool p = &g_default_pool[dev];
  if (!p->is_default) {
    unsigned nvml = 0;
    fake_device(dev, &nvml);
    *p = (struct CUmemPoolHandle_st){
        .ordinal = dev, .nvml = nvml, .is_default = true};
  }
  return p;
}

static CUmemoryPool current_pool(CUdevice dev) {
  return g_current_pool[dev] ? g_current_pool[dev] : default_pool(dev);
}

static bool pool_valid(CUmemoryPool pool) {
  if (!pool)
    return false;
  if (pool >= g_default_pool && pool < g_default_pool + FAKE_CUDA_MAX_GPUS)
    return pool->is_default;
  for (CUmemoryPool p = g_pools; p; p = p->next)
    if (p == pool)
      return !p->destroyed;
  return false;
}

/* Gives back what the pool reserves beyond `keep` bytes. */
static void pool_shrink(CUmemoryPool pool, uint64_t keep) {
  if (pool->reserved > keep) {
    fake_state_refund(pool->nvml, pool->reserved - keep);
    pool->reserved = keep;
  }
}

static void pool_unlink_free(CUmemoryPool pool) {
  CUmemoryPool *pp = &g_pools;
  while (*pp && *pp != pool)
    pp = &(*pp)->next;
  if (*pp)
    *pp = pool->next;
  free(pool);
}

void fake_pool_put(CUmemoryPool pool, uint64_t bytes) {
  pool->used -= bytes;
  if (pool->destroyed && pool->used == 0) {
    pool_shrink(pool, 0);
    pool_unlink_free(pool);
  }
}

void fake_pools_forget(void) {
  while (g_pools) {
    CUmemoryPool next = g_pools->next;
    free(g_pools);
    g_pools = next;
  }
  memset(g_default_pool, 0, sizeof g_default_pool);
  memset(g_current_pool, 0, sizeof g_current_pool);
}

/* Locked. `bytes` from `pool`. */
static CUresult pool_alloc(CUmemoryPool pool, uint64_t bytes,
                           CUdeviceptr *out) {
  if (bytes > UINT64_MAX / 2)
    return CUDA_ERROR_OUT_OF_MEMORY;
  if (pool->used + bytes > pool->reserved) {
    uint64_t grow = round_up(pool->used + bytes - pool->reserved, FAKE_GRANULE);
    if (pool->max_size && pool->reserved + grow > pool->max_size)
      return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fake_state_charge(pool->nvml, grow);
    if (r != CUDA_SUCCESS)
      return r;
    pool->reserved += grow;
    if (pool->reserved > pool->reserved_high)
      pool->reserved_high = pool->reserved;
  }
  CUresult r =
      new_mapping(NULL, pool->nvml, bytes, 0, FAKE_MEM_POOL, pool, false, out);
  if (r != CUDA_SUCCESS)
    return r;
  pool->used += bytes;
  if (pool->used > pool->used_high)
    pool->used_high = pool->used;
  return CUDA_SUCCESS;
}

/* From `pool`, or from the current pool of the stream's device if NULL. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize,
                            CUmemoryPool pool, CUstream hStream) {
  CUcontext c;
  if (!dptr || bytesize == 0)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = fake_stream_ctx(hStream, &c);
  if (r == CUDA_SUCCESS && !pool)
    pool = current_pool(c->ordinal);
  else if (r == CUDA_SUCCESS && !pool_valid(pool))
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS)
    r = pool_alloc(pool, bytesize, dptr);
  fake_unlock();
  return r;
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream) {
  CUcontext c;
  fake_lock();
  CUresult r = fake_stream_ctx(hStream, &c);
  fake_obj_t *o = NULL;
  if (r == CUDA_SUCCESS && !(o = fake_obj_find(dptr, FAKE_MEM_POOL)))
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS)
    fake_obj_release(o);
  fake_unlock();
  return r;
}

FAKE_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize,
                                  CUstream hStream) {
  FAKE_ENTER_INIT();
  return alloc_async(dptr, bytesize, NULL, hStream);
}

FAKE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                       CUstream hStream) {
  FAKE_ENTER_INIT();
  return alloc_async(dptr, bytesize, NULL, hStream);
}

FAKE_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                          CUmemoryPool pool, CUstream hStream) {
  FAKE_ENTER_INIT();
  if (!pool)
    return CUDA_ERROR_INVALID_VALUE;
  return alloc_async(dptr, bytesize, pool, hStream);
}

FAKE_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr,
                                               size_t bytesize,
                                               CUmemoryPool pool,
                                               CUstream hStream) {
  FAKE_ENTER_INIT();
  if (!pool)
    return CUDA_ERROR_INVALID_VALUE;
  return alloc_async(dptr, bytesize, pool, hStream);
}

FAKE_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  FAKE_ENTER_INIT();
  return free_async(dptr, hStream);
}

FAKE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  FAKE_ENTER_INIT();
  return free_async(dptr, hStream);
}

FAKE_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out,
                                            CUdevice dev) {
  FAKE_ENTER_INIT();
  if (!pool_out)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(dev, NULL))
    return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  *pool_out = default_pool(dev);
  fake_unlock();
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
  FAKE_ENTER_INIT();
  if (!pool)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(dev, NULL))
    return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  *pool = current_pool(dev);
  fake_unlock();
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  FAKE_ENTER_INIT();
  if (!fake_device(dev, NULL))
    return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!pool_valid(pool) || pool->ordinal != dev)
    r = CUDA_ERROR_INVALID_VALUE;
  else
    g_current_pool[dev] = pool;
  fake_unlock();
  return r;
}

FAKE_API CUresult cuMemPoolCreate(CUmemoryPool *pool,
                                  const fake_CUmemPoolProps *poolProps) {
  unsigned nvml;
  FAKE_ENTER_INIT();
  if (!pool || !poolProps || poolProps->allocType != 1 ||
      poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(poolProps->location.id, &nvml))
    return CUDA_ERROR_INVALID_DEVICE;
  CUmemoryPool p = calloc(1, sizeof *p);
  if (!p)
    return CUDA_ERROR_OUT_OF_MEMORY;
  p->ordinal = poolProps->location.id;
  p->nvml = nvml;
  p->max_size = poolProps->maxSize;
  fake_lock();
  p->next = g_pools;
  g_pools = p;
  *pool = p;
  fake_unlock();
  return CUDA_SUCCESS;
}

/* Its reservation goes when its last allocation does. */
FAKE_API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  FAKE_ENTER_INIT();
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!pool_valid(pool) || pool->is_default) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else {
    if (g_current_pool[pool->ordinal] == pool)
      g_current_pool[pool->ordinal] = NULL;
    pool->destroyed = true;
    if (pool->used == 0) {
      pool_shrink(pool, 0);
      pool_unlink_free(pool);
    }
  }
  fake_unlock();
  return r;
}

/* Keeps at least minBytesToKeep, and all that live allocations use. */
FAKE_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  FAKE_ENTER_INIT();
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!pool_valid(pool)) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (pool->reserved > minBytesToKeep) {
    uint64_t keep = round_up(minBytesToKeep, FAKE_GRANULE);
    uint64_t in_use = round_up(pool->used, FAKE_GRANULE);
    pool_shrink(pool, keep > in_use ? keep : in_use);
  }
  fake_unlock();
  return r;
}

/* CUmemPool_attribute */
enum {
  POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
  POOL_REUSE_ALLOW_OPPORTUNISTIC = 2,
  POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
  POOL_RELEASE_THRESHOLD = 4,
  POOL_RESERVED_MEM_CURRENT = 5,
  POOL_RESERVED_MEM_HIGH = 6,
  POOL_USED_MEM_CURRENT = 7,
  POOL_USED_MEM_HIGH = 8
};

FAKE_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr,
                                        void *value) {
  FAKE_ENTER_INIT();
  if (!value)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!pool_valid(pool))
    r = CUDA_ERROR_INVALID_VALUE;
  else if (attr >= POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES &&
           attr <= POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES)
    *(int *)value = 1;
  else if (attr == POOL_RELEASE_THRESHOLD)
    *(cuuint64_t *)value = pool->threshold;
  else if (attr == POOL_RESERVED_MEM_CURRENT)
    *(cuuint64_t *)value = pool->reserved;
  else if (attr == POOL_RESERVED_MEM_HIGH)
    *(cuuint64_t *)value = pool->reserved_high;
  else if (attr == POOL_USED_MEM_CURRENT)
    *(cuuint64_t *)value = pool->used;
  else if (attr == POOL_USED_MEM_HIGH)
    *(cuuint64_t *)value = pool->used_high;
  else
    r = CUDA_ERROR_INVALID_VALUE;
  fake_unlock();
  return r;
}

FAKE_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr,
                                        void *value) {
  FAKE_ENTER_INIT();
  if (!value)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!pool_valid(pool))
    r = CUDA_ERROR_INVALID_VALUE;
  else if (attr >= POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES &&
           attr <= POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES)
    r = CUDA_SUCCESS; /* accepted, without effect */
  else if (attr == POOL_RELEASE_THRESHOLD)
    pool->threshold = *(cuuint64_t *)value;
  /* The high watermarks can only be reset (to what is current). */
  else if (attr == POOL_RESERVED_MEM_HIGH && *(cuuint64_t *)value == 0)
    pool->reserved_high = pool->reserved;
  else if (attr == POOL_USED_MEM_HIGH && *(cuuint64_t *)value == 0)
    pool->used_high = pool->used;
  else
    r = CUDA_ERROR_INVALID_VALUE;
  fake_unlock();
  return r;
}

/* --- Virtual memory management -------------------------------------------- */

FAKE_API CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                const CUmemAllocationProp *prop,
                                                int option) {
  FAKE_ENTER_INIT();
  (void)option;
  if (!granularity || !prop)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = FAKE_GRANULE;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                              const CUmemAllocationProp *prop,
                              unsigned long long flags) {
  unsigned nvml;
  FAKE_ENTER_INIT();
  if (!handle || !prop || size == 0 || size % FAKE_GRANULE || flags ||
      prop->type != 1 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fake_device(prop->location.id, &nvml))
    return CUDA_ERROR_INVALID_DEVICE;
  fake_lock();
  fake_obj_t o = {.key = fake_new_handle(),
                  .bytes = size,
                  .kind = FAKE_MEM_VMM,
                  .nvml = nvml};
  CUresult r = fake_state_charge(nvml, size);
  if (r == CUDA_SUCCESS && !fake_obj_add(&o)) {
    fake_state_refund(nvml, size);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS)
    *handle = o.key;
  fake_unlock();
  return r;
}

FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_ENTER_INIT();
  return mem_free(handle, FAKE_MEM_VMM, true);
}

FAKE_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size,
                                      size_t alignment, CUdeviceptr addr,
                                      unsigned long long flags) {
  FAKE_ENTER_INIT();
  (void)addr; /* a hint */
  (void)flags;
  if (alignment == 0)
    alignment = FAKE_GRANULE;
  if (!ptr || size == 0 || size % FAKE_GRANULE ||
      (alignment & (alignment - 1)) || size > SIZE_MAX / 2 - alignment)
    return CUDA_ERROR_INVALID_VALUE;
  /* A fresh inaccessible range, aligned by trimming a larger one. */
  char *m = mmap(NULL, size + alignment, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    return CUDA_ERROR_OUT_OF_MEMORY;
  char *p = (char *)round_up((uintptr_t)m, alignment);
  if (p > m)
    munmap(m, (size_t)(p - m));
  if (m + size + alignment > p + size)
    munmap(p + size, (size_t)(m + size + alignment - (p + size)));
  fake_lock();
  fake_obj_t o = {
      .key = (uint64_t)(uintptr_t)p, .length = size, .kind = FAKE_MEM_VA};
  bool ok = fake_obj_add(&o);
  fake_unlock();
  if (!ok) {
    munmap(p, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *ptr = o.key;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER_INIT();
  fake_lock();
  fake_obj_t *o = fake_obj_find(ptr, FAKE_MEM_VA);
  bool ok = o && o->length == size;
  if (ok)
    fake_obj_release(o);
  fake_unlock();
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Locked. Whether [ptr, ptr+size) is granule-aligned in a reserved range. */
static bool va_range(CUdeviceptr ptr, size_t size) {
  return size && ptr % FAKE_GRANULE == 0 && size % FAKE_GRANULE == 0 &&
         fake_obj_containing(ptr, size, FAKE_MEM_VA);
}

/* Mapped memory is private to the mapping: two mappings of one handle do
 * not share data. */
FAKE_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                           CUmemGenericAllocationHandle handle,
                           unsigned long long flags) {
  FAKE_ENTER_INIT();
  fake_lock();
  fake_obj_t *h = fake_obj_find(handle, FAKE_MEM_VMM);
  bool ok = !flags && va_range(ptr, size) && h && offset <= h->bytes &&
            size <= h->bytes - offset &&
            mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) == 0;
  fake_unlock();
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER_INIT();
  fake_lock();
  bool ok = va_range(ptr, size);
  if (ok) {
    madvise((void *)(uintptr_t)ptr, size, MADV_DONTNEED);
    mprotect((void *)(uintptr_t)ptr, size, PROT_NONE);
  }
  fake_unlock();
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A POSIX file descriptor (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) to a
 * memfd of its own: importing it is not modelled, and the fake does not
 * check that the handle was created exportable (requestedHandleTypes). */
FAKE_API CUresult cuMemExportToShareableHandle(
    void *shareableHandle, CUmemGenericAllocationHandle handle, int handleType,
    unsigned long long flags) {
  FAKE_ENTER_INIT();
  if (!shareableHandle || flags)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  bool ok = fake_obj_find(handle, FAKE_MEM_VMM) != NULL;
  fake_unlock();
  if (!ok)
    return CUDA_ERROR_INVALID_VALUE;
  if (handleType != 1)
    return CUDA_ERROR_NOT_SUPPORTED;
  int fd = memfd_create("fake-cuda-vmm", MFD_CLOEXEC);
  if (fd < 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *(int *)shareableHandle = fd;
  fake_ckpt_mark(FAKE_CKPT_USED_SHAREABLE);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                 const fake_CUmemAccessDesc *desc,
                                 size_t count) {
  FAKE_ENTER_INIT();
  if (!desc || count == 0)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  bool ok = va_range(ptr, size);
  fake_unlock();
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* --- Arrays --------------------------------------------------------------- */

/* Bytes per element of a CUarray_format with `channels` channels, as
 * num/den (block-compressed and 4:2:x YUV formats take fractions of a byte
 * per texel); false if the format or the channel count is not valid. The
 * classic formats (up to CU_AD_FORMAT_FLOAT) are per channel; the later
 * ones (0x50 and up) name their whole element, channels included. */
static bool format_size(int format, unsigned channels, uint64_t *num,
                        uint64_t *den) {
  *den = 1;
  switch (format) {
  case CU_AD_FORMAT_UNSIGNED_INT8:
  case CU_AD_FORMAT_SIGNED_INT8:
    *num = 1;
    break;
  case CU_AD_FORMAT_UNSIGNED_INT16:
  case CU_AD_FORMAT_SIGNED_INT16:
  case CU_AD_FORMAT_HALF:
    *num = 2;
    break;
  case CU_AD_FORMAT_UNSIGNED_INT32:
  case CU_AD_FORMAT_SIGNED_INT32:
  case CU_AD_FORMAT_FLOAT:
    *num = 4;
    break;
  default:
    return cu_format_element(format, num, den);
  }
  if (channels != 1 && channels != 2 && channels != 4)
    return false;
  *num *= channels;
  return true;
}

/* Bytes of a w x h x d array (0 extents count as 1, except the width). */
static CUresult array_bytes(uint64_t w, uint64_t h, uint64_t d, int format,
                            unsigned channels, uint64_t *out) {
  uint64_t num, den, v;
  if (!format_size(format, channels, &num, &den) || w == 0 ||
      __builtin_mul_overflow(w, h ? h : 1, &v) ||
      __builtin_mul_overflow(v, d ? d : 1, &v) ||
      __builtin_mul_overflow(v, num, &v))
    return CUDA_ERROR_INVALID_VALUE;
  *out = (v + den - 1) / den;
  return CUDA_SUCCESS;
}

/* An array object charged `bytes` in the current context. */
static CUresult array_new(uint64_t bytes, fake_kind_t kind, uint64_t *handle) {
  fake_lock();
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = fake_current();
  if (c)
    r = fake_state_charge(c->nvml, bytes);
  if (r == CUDA_SUCCESS) {
    fake_obj_t o = {.key = fake_new_handle(),
                    .bytes = bytes,
                    .kind = kind,
                    .nvml = c->nvml,
                    .ctx = c};
    if (fake_obj_add(&o)) {
      *handle = o.key;
    } else {
      fake_state_refund(c->nvml, bytes);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  fake_unlock();
  return r;
}

FAKE_API CUresult cuArrayCreate_v2(
    CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray) {
  FAKE_ENTER_INIT();
  uint64_t bytes, h;
  if (!pHandle || !pAllocateArray)
    return CUDA_ERROR_INVALID_VALUE;
  const CUDA_ARRAY_DESCRIPTOR *a = pAllocateArray;
  CUresult r =
      array_bytes(a->Width, a->Height, 1, a->Format, a->NumChannels, &bytes);
  if (r == CUDA_SUCCESS)
    r = array_new(bytes, FAKE_MEM_ARRAY, &h);
  if (r == CUDA_SUCCESS)
    *pHandle = (CUarray)(uintptr_t)h;
  return r;
}

FAKE_API CUresult cuArray3DCreate_v2(
    CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray) {
  FAKE_ENTER_INIT();
  uint64_t bytes, h;
  if (!pHandle || !pAllocateArray)
    return CUDA_ERROR_INVALID_VALUE;
  const CUDA_ARRAY3D_DESCRIPTOR *a = pAllocateArray;
  CUresult r = array_bytes(a->Width, a->Height, a->Depth, a->Format,
                           a->NumChannels, &bytes);
  if (r == CUDA_SUCCESS)
    r = array_new(bytes, FAKE_MEM_ARRAY, &h);
  if (r == CUDA_SUCCESS)
    *pHandle = (CUarray)(uintptr_t)h;
  return r;
}

FAKE_API CUresult cuArrayDestroy(CUarray hArray) {
  FAKE_ENTER_INIT();
  CUresult r = mem_free((uint64_t)(uintptr_t)hArray, FAKE_MEM_ARRAY, true);
  return r == CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_HANDLE;
}

/* Every level halves each extent, down to 1. */
FAKE_API CUresult
cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                       const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                       unsigned int numMipmapLevels) {
  FAKE_ENTER_INIT();
  uint64_t total = 0, h;
  if (!pHandle || !pMipmappedArrayDesc || numMipmapLevels == 0)
    return CUDA_ERROR_INVALID_VALUE;
  const CUDA_ARRAY3D_DESCRIPTOR *a = pMipmappedArrayDesc;
  uint64_t w = a->Width, ht = a->Height ? a->Height : 1,
           d = a->Depth ? a->Depth : 1;
  CUresult r = CUDA_SUCCESS;
  for (unsigned l = 0; r == CUDA_SUCCESS && l < numMipmapLevels; l++) {
    uint64_t level;
    r = array_bytes(w, ht, d, a->Format, a->NumChannels, &level);
    if (r == CUDA_SUCCESS && __builtin_add_overflow(total, level, &total))
      r = CUDA_ERROR_INVALID_VALUE;
    w = w > 1 ? w / 2 : 1;
    ht = ht > 1 ? ht / 2 : 1;
    d = d > 1 ? d / 2 : 1;
  }
  if (r == CUDA_SUCCESS)
    r = array_new(total, FAKE_MEM_MIPMAP, &h);
  if (r == CUDA_SUCCESS)
    *pHandle = (CUmipmappedArray)(uintptr_t)h;
  return r;
}

FAKE_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  FAKE_ENTER_INIT();
  CUresult r =
      mem_free((uint64_t)(uintptr_t)hMipmappedArray, FAKE_MEM_MIPMAP, true);
  return r == CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_HANDLE;
}

/* --- Inter-process handles ------------------------------------------------ */

/* A handle can be made (for the base of a cuMemAlloc allocation), so a
 * process can be an IPC exporter; opening one is not supported, since fake
 * device memory is private to its process. */
FAKE_API CUresult cuIpcGetMemHandle(fake_CUipcMemHandle *pHandle,
                                    CUdeviceptr dptr) {
  FAKE_ENTER_INIT();
  if (!pHandle)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  if (!fake_current())
    r = CUDA_ERROR_INVALID_CONTEXT;
  else if (!fake_obj_find(dptr, FAKE_MEM_DEVICE))
    r = CUDA_ERROR_INVALID_VALUE;
  fake_unlock();
  if (r != CUDA_SUCCESS)
    return r;
  const uint64_t tag = 0xfa4e19cULL;
  const int32_t pid = (int32_t)getpid();
  memset(pHandle, 0, sizeof *pHandle);
  memcpy(pHandle->reserved, &tag, sizeof tag);
  memcpy(pHandle->reserved + 8, &pid, sizeof pid);
  memcpy(pHandle->reserved + 16, &dptr, sizeof dptr);
  fake_ckpt_mark(FAKE_CKPT_USED_IPC);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr,
                                     fake_CUipcMemHandle handle,
                                     unsigned int Flags) {
  FAKE_ENTER_INIT();
  (void)pdptr;
  (void)handle;
  (void)Flags;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr,
                                        fake_CUipcMemHandle handle,
                                        unsigned int Flags) {
  FAKE_ENTER_INIT();
  (void)pdptr;
  (void)handle;
  (void)Flags;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FAKE_ENTER_INIT();
  (void)dptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}
