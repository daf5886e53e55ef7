/*
 * cuda-abi.h: the part of the CUDA driver API's ABI that cogpu touches,
 * declared here so that nothing in cogpu needs NVIDIA's headers to build.
 * Names and layouts follow the driver API (cuda.h, CUDA 12/13); only what
 * the preload library and the test double use is declared.
 */
#ifndef COGPU_CUDA_ABI_H
#define COGPU_CUDA_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1; /* the legacy (pre-3.2) 32-bit pointer */
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUfunc_st *CUfunction;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_ILLEGAL_STATE = 401,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_OPERATING_SYSTEM = 304,
  CUDA_ERROR_NOT_PERMITTED = 800,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999
};

typedef struct CUuuid_st {
  char bytes[16];
} CUuuid;

/* Passed by value: only its size matters here. */
typedef struct CUipcMemHandle_st {
  char reserved[64];
} CUipcMemHandle;

/* cuGetProcAddress flags and query results. */
enum {
  CU_GET_PROC_ADDRESS_DEFAULT = 0,
  CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1
};
typedef enum {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  int Format; /* CUarray_format */
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  size_t Depth;
  int Format; /* CUarray_format */
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* CUarray_format values and their bytes per channel. */
enum {
  CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
  CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
  CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
  CU_AD_FORMAT_SIGNED_INT8 = 0x08,
  CU_AD_FORMAT_SIGNED_INT16 = 0x09,
  CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
  CU_AD_FORMAT_HALF = 0x10,
  CU_AD_FORMAT_FLOAT = 0x20,
  CU_AD_FORMAT_UNORM_INT8X4 = 0xc2
};

/* Bytes per texel of the CUarray_format values from 0x50 up (cuda.h 12.x),
 * as num/den: unlike the classic formats above, each names its whole
 * element, channels included. Block-compressed formats store 4x4 texels in
 * 8 (BC1, BC4) or 16 bytes; planar YUV 4:2:0 and 4:2:2 formats store
 * subsampled chroma. false for a value this table does not know. */
static inline bool cu_format_element(int format, uint64_t *num, uint64_t *den) {
  static const struct {
    int format;
    unsigned char num, den;
  } t[] = {
      {0x50, 4, 1},                             /* UNORM_INT_101010_2 */
      {0x91, 1, 2}, {0x92, 1, 2},               /* BC1 */
      {0x93, 1, 1}, {0x94, 1, 1}, {0x95, 1, 1}, /* BC2, BC3 */
      {0x96, 1, 1}, {0x97, 1, 2}, {0x98, 1, 2}, /* BC3 sRGB, BC4 */
      {0x99, 1, 1}, {0x9a, 1, 1}, {0x9b, 1, 1}, /* BC5, BC6H */
      {0x9c, 1, 1}, {0x9d, 1, 1}, {0x9e, 1, 1}, /* BC6H, BC7 */
      {0x9f, 3, 1}, {0xa1, 3, 1},               /* P010, P016 */
      {0xa2, 2, 1}, {0xa3, 4, 1}, {0xa4, 4, 1}, /* NV16, P210, P216 */
      {0xa5, 2, 1}, {0xa6, 4, 1}, {0xa7, 4, 1}, /* YUY2, Y210, Y216 */
      {0xa8, 4, 1}, {0xa9, 4, 1},               /* AYUV, Y410 */
      {0xb0, 3, 2}, {0xb1, 8, 1},               /* NV12, Y416 */
      {0xb2, 3, 1}, {0xb3, 6, 1},               /* Y444 planar 8, 10 */
      {0xb4, 3, 1}, {0xb5, 6, 1},               /* YUV444 semi-planar */
      {0xc0, 1, 1}, {0xc1, 2, 1}, {0xc2, 4, 1}, /* UNORM_INT8X1..4 */
      {0xc3, 2, 1}, {0xc4, 4, 1}, {0xc5, 8, 1}, /* UNORM_INT16X1..4 */
      {0xc6, 1, 1}, {0xc7, 2, 1}, {0xc8, 4, 1}, /* SNORM_INT8X1..4 */
      {0xc9, 2, 1}, {0xca, 4, 1}, {0xcb, 8, 1}, /* SNORM_INT16X1..4 */
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (t[i].format == format) {
      *num = t[i].num;
      *den = t[i].den;
      return true;
    }
  return false;
}

typedef struct CUmemLocation_st {
  int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
  int id;
} CUmemLocation;

enum { CU_MEM_LOCATION_TYPE_DEVICE = 1 };

typedef struct CUmemAllocationProp_st {
  int type; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
  int requestedHandleTypes;
  CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

/* Pool properties and access descriptors (the test double's pools and
 * graph allocation nodes). */
typedef struct CUmemPoolProps_st {
  int allocType; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
  int handleTypes;
  CUmemLocation location; /* type CU_MEM_LOCATION_TYPE_DEVICE, id ordinal */
  void *win32SecurityAttributes;
  size_t maxSize; /* 0: no limit */
  unsigned short usage;
  unsigned char reserved[54];
} CUmemPoolProps;

typedef struct CUmemAccessDesc_st {
  CUmemLocation location;
  int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

/* Graphs: what the preload library sees of them is the device's graph
 * allocator (CUgraphMem_attribute), whose footprint is memory. */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
enum {
  CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
  CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2
};

typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
  CUmemPoolProps poolProps;
  const CUmemAccessDesc *accessDescs;
  size_t accessDescCount;
  size_t bytesize;
  CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* CUmemPool_attribute values used to read a pool's footprint. */
enum {
  CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
  CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7
};

/* The process checkpoint API (driver 570+, cuda.h from CUDA 12.8): the
 * node daemon suspends a job by locking its process, checkpointing its
 * device memory into host memory, and later restoring and unlocking it.
 * Every reserved field must be zero. */
typedef enum CUprocessState_enum {
  CU_PROCESS_STATE_RUNNING = 0,
  CU_PROCESS_STATE_LOCKED = 1,
  CU_PROCESS_STATE_CHECKPOINTED = 2,
  CU_PROCESS_STATE_FAILED = 3
} CUprocessState;

typedef struct CUcheckpointLockArgs_st {
  unsigned int timeoutMs; /* 0: no bound */
  unsigned int reserved0;
  cuuint64_t reserved1[7];
} CUcheckpointLockArgs;

typedef struct CUcheckpointCheckpointArgs_st {
  cuuint64_t reserved[8];
} CUcheckpointCheckpointArgs;

typedef struct CUcheckpointGpuPair_st {
  CUuuid oldUuid;
  CUuuid newUuid;
} CUcheckpointGpuPair;

typedef struct CUcheckpointRestoreArgs_st {
  CUcheckpointGpuPair *gpuPairs;
  unsigned int gpuPairsCount;
  char reserved[52 - sizeof(CUcheckpointGpuPair *)];
  cuuint64_t reserved1;
} CUcheckpointRestoreArgs;

typedef struct CUcheckpointUnlockArgs_st {
  cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;

#endif /* COGPU_CUDA_ABI_H */
