/*
 * cudaprog.c: a CUDA driver program for the preload tests. It reaches the
 * driver by one of the routes real programs use, then runs a list of
 * actions, checking data it writes to device memory.
 *
 *   cudaprog ROUTE ACTION...
 *   ROUTE:  direct    calls the exported symbols it links against
 *           dlsym     dlopen("libcuda.so.1") + dlsym
 *           runtime   like the CUDA runtime: dlsym only cuGetProcAddress_v2,
 *                     ask it for cuGetProcAddress itself, then resolve
 *                     everything through that, for CUDA 12.8, with the
 *                     per-thread default stream
 *           legacy    like an old runtime: cuGetProcAddress (v1), CUDA 11.4
 *   ACTION: init ctx ctxcreate ctxdestroy alloc:SIZE free freeall
 *           pitch:W:H managed:SIZE async:SIZE asyncfree trim
 *           vmm:SIZE vmmfree array:W:H arrayfree mipmap:W:H:LEVELS
 *           array8x4:W:H poolon:DEV:SIZE primaryrelease primaryreset
 *           bg:ACTION (in a thread of its own) join
 *           (the driver frees what the context held)
 *           mipmapfree info total freeunknown exporttable hold:MS
 *           waitfile:PATH (prints "waiting", then waits until PATH exists:
 *           a test's cue, never a timed window)
 *           cycle:SIZE:PATH (allocates and frees SIZE, again and again,
 *           until PATH exists; prints "cycled 250" after 250 rounds, at
 *           least 1.25 s)
 *           graph:SIZE (build a graph that allocates and frees SIZE on the
 *           context's device, instantiate and launch it) graphtrim
 *           graphdestroy verify (the data each alloc wrote is intact)
 *           closeconn (closes the process's Unix sockets: its connections
 *           to cogpud; prints "closed N") sockreuse sockcheck (a socket
 *           pair of its own on the lowest free descriptors, and what
 *           reached it: "sockcheck N bytes open|closed")
 * Exit: 0 done, 2 an allocation got CUDA_ERROR_OUT_OF_MEMORY, 3 other
 * error, 4 wrong data read back. Each action prints a line on stdout.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda-abi.h"

#define MAXP 256

static struct api_s {
  CUresult (*init)(unsigned);
  CUresult (*primary)(CUcontext *, CUdevice);
  CUresult (*set_current)(CUcontext);
  CUresult (*ctx_create_v2)(CUcontext *, unsigned, CUdevice);
  CUresult (*ctx_create_v4)(CUcontext *, void *, unsigned, CUdevice);
  CUresult (*ctx_destroy)(CUcontext);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free)(CUdeviceptr);
  CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
  CUresult (*managed)(CUdeviceptr *, size_t, unsigned);
  CUresult (*async)(CUdeviceptr *, size_t, CUstream);
  CUresult (*async_free)(CUdeviceptr, CUstream);
  CUresult (*pool_of)(CUmemoryPool *, CUdevice);
  CUresult (*trim)(CUmemoryPool, size_t);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t,
                     const CUmemAllocationProp *, unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*array)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
  CUresult (*array_destroy)(CUarray);
  CUresult (*mipmap)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *,
                     unsigned);
  CUresult (*mipmap_destroy)(CUmipmappedArray);
  CUresult (*info)(size_t *, size_t *);
  CUresult (*total)(size_t *, CUdevice);
  CUresult (*memset8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t);
  CUresult (*export_table)(const void **, const CUuuid *);
  CUresult (*graph_create)(CUgraph *, unsigned);
  CUresult (*graph_alloc)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                          CUDA_MEM_ALLOC_NODE_PARAMS *);
  CUresult (*graph_free)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                         CUdeviceptr);
  CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*graph_destroy)(CUgraph);
  CUresult (*graph_launch)(CUgraphExec, CUstream);
  CUresult (*graph_exec_destroy)(CUgraphExec);
  CUresult (*graph_trim)(CUdevice);
  CUresult (*pool_create)(CUmemoryPool *, const CUmemPoolProps *);
  CUresult (*from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
  CUresult (*primary_release)(CUdevice);
  CUresult (*primary_reset)(CUdevice);
} api;

/* The direct route links against these (the test double in tests). */
__typeof__(*((struct api_s *)0)->init) cuInit;
__typeof__(*((struct api_s *)0)->primary) cuDevicePrimaryCtxRetain;
__typeof__(*((struct api_s *)0)->set_current) cuCtxSetCurrent;
__typeof__(*((struct api_s *)0)->ctx_create_v2) cuCtxCreate_v2;
__typeof__(*((struct api_s *)0)->ctx_destroy) cuCtxDestroy_v2;
__typeof__(*((struct api_s *)0)->alloc) cuMemAlloc_v2;
__typeof__(*((struct api_s *)0)->free) cuMemFree_v2;
__typeof__(*((struct api_s *)0)->pitch) cuMemAllocPitch_v2;
__typeof__(*((struct api_s *)0)->managed) cuMemAllocManaged;
__typeof__(*((struct api_s *)0)->async) cuMemAllocAsync;
__typeof__(*((struct api_s *)0)->async_free) cuMemFreeAsync;
__typeof__(*((struct api_s *)0)->pool_of) cuDeviceGetMemPool;
__typeof__(*((struct api_s *)0)->trim) cuMemPoolTrimTo;
__typeof__(*((struct api_s *)0)->create) cuMemCreate;
__typeof__(*((struct api_s *)0)->release) cuMemRelease;
__typeof__(*((struct api_s *)0)->array) cuArrayCreate_v2;
__typeof__(*((struct api_s *)0)->array_destroy) cuArrayDestroy;
__typeof__(*((struct api_s *)0)->mipmap) cuMipmappedArrayCreate;
__typeof__(*((struct api_s *)0)->mipmap_destroy) cuMipmappedArrayDestroy;
__typeof__(*((struct api_s *)0)->info) cuMemGetInfo_v2;
__typeof__(*((struct api_s *)0)->total) cuDeviceTotalMem_v2;
__typeof__(*((struct api_s *)0)->memset8) cuMemsetD8_v2;
__typeof__(*((struct api_s *)0)->dtoh) cuMemcpyDtoH_v2;
__typeof__(*((struct api_s *)0)->export_table) cuGetExportTable;
__typeof__(*((struct api_s *)0)->graph_create) cuGraphCreate;
__typeof__(*((struct api_s *)0)->graph_alloc) cuGraphAddMemAllocNode;
__typeof__(*((struct api_s *)0)->graph_free) cuGraphAddMemFreeNode;
__typeof__(*((struct api_s *)0)->graph_instantiate) cuGraphInstantiateWithFlags;
__typeof__(*((struct api_s *)0)->graph_destroy) cuGraphDestroy;
__typeof__(*((struct api_s *)0)->graph_launch) cuGraphLaunch;
__typeof__(*((struct api_s *)0)->graph_exec_destroy) cuGraphExecDestroy;
__typeof__(*((struct api_s *)0)->graph_trim) cuDeviceGraphMemTrim;
__typeof__(*((struct api_s *)0)->pool_create) cuMemPoolCreate;
__typeof__(*((struct api_s *)0)->from_pool) cuMemAllocFromPoolAsync;
__typeof__(*((struct api_s *)0)->primary_release) cuDevicePrimaryCtxRelease_v2;
__typeof__(*((struct api_s *)0)->primary_reset) cuDevicePrimaryCtxReset_v2;

static bool use_v4;

typedef CUresult gpa2_t(const char *, void **, int, cuuint64_t,
                        CUdriverProcAddressQueryResult *);
typedef CUresult gpa1_t(const char *, void **, int, cuuint64_t);

static void *lib;
static gpa2_t *gpa2;
static gpa1_t *gpa1;
static int version;
static cuuint64_t ptds;

static void *by_name(const char *route, const char *exported,
                     const char *base) {
  void *p = NULL;
  if (!strcmp(route, "dlsym"))
    p = dlsym(lib, exported);
  else if (gpa2)
    gpa2(base, &p, version, ptds, NULL);
  else if (gpa1)
    gpa1(base, &p, version, ptds);
  return p;
}

#define BIND(field, exported, base)                                            \
  api.field = (__typeof__(api.field))by_name(route, exported, base)

static void bind_direct(void) {
  api.init = cuInit;
  api.primary = cuDevicePrimaryCtxRetain;
  api.set_current = cuCtxSetCurrent;
  api.ctx_create_v2 = cuCtxCreate_v2;
  api.ctx_destroy = cuCtxDestroy_v2;
  api.alloc = cuMemAlloc_v2;
  api.free = cuMemFree_v2;
  api.pitch = cuMemAllocPitch_v2;
  api.managed = cuMemAllocManaged;
  api.async = cuMemAllocAsync;
  api.async_free = cuMemFreeAsync;
  api.pool_of = cuDeviceGetMemPool;
  api.trim = cuMemPoolTrimTo;
  api.create = cuMemCreate;
  api.release = cuMemRelease;
  api.array = cuArrayCreate_v2;
  api.array_destroy = cuArrayDestroy;
  api.mipmap = cuMipmappedArrayCreate;
  api.mipmap_destroy = cuMipmappedArrayDestroy;
  api.info = cuMemGetInfo_v2;
  api.total = cuDeviceTotalMem_v2;
  api.memset8 = cuMemsetD8_v2;
  api.dtoh = cuMemcpyDtoH_v2;
  api.export_table = cuGetExportTable;
  api.graph_create = cuGraphCreate;
  api.graph_alloc = cuGraphAddMemAllocNode;
  api.graph_free = cuGraphAddMemFreeNode;
  api.graph_instantiate = cuGraphInstantiateWithFlags;
  api.graph_destroy = cuGraphDestroy;
  api.graph_launch = cuGraphLaunch;
  api.graph_exec_destroy = cuGraphExecDestroy;
  api.graph_trim = cuDeviceGraphMemTrim;
  api.pool_create = cuMemPoolCreate;
  api.from_pool = cuMemAllocFromPoolAsync;
  api.primary_release = cuDevicePrimaryCtxRelease_v2;
  api.primary_reset = cuDevicePrimaryCtxReset_v2;
}

static int bind_route(const char *route) {
  lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "cudaprog: %s\n", dlerror());
    return 3;
  }
  if (!strcmp(route, "runtime")) {
    /* Everything, cuGetProcAddress included, through cuGetProcAddress. */
    gpa2_t *first = (gpa2_t *)dlsym(lib, "cuGetProcAddress_v2");
    version = 12080;
    ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (!first || first("cuGetProcAddress", (void **)&gpa2, version, 0, NULL) !=
                      CUDA_SUCCESS)
      return 3;
    use_v4 = true;
  } else if (!strcmp(route, "legacy")) {
    gpa1 = (gpa1_t *)dlsym(lib, "cuGetProcAddress");
    version = 11040;
    if (!gpa1)
      return 3;
  } else if (!strcmp(route, "direct")) {
    bind_direct();
    return 0;
  } else if (strcmp(route, "dlsym")) {
    fprintf(stderr, "cudaprog: unknown route %s\n", route);
    return 3;
  }
  BIND(init, "cuInit", "cuInit");
  BIND(primary, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
  BIND(set_current, "cuCtxSetCurrent", "cuCtxSetCurrent");
  BIND(ctx_create_v2, "cuCtxCreate_v2", "cuCtxCreate");
  if (use_v4) /* "cuCtxCreate" at 12.8 is cuCtxCreate_v4 */
    api.ctx_create_v4 =
        (__typeof__(api.ctx_create_v4))(void *)api.ctx_create_v2;
  BIND(ctx_destroy, "cuCtxDestroy_v2", "cuCtxDestroy");
  BIND(alloc, "cuMemAlloc_v2", "cuMemAlloc");
  BIND(free, "cuMemFree_v2", "cuMemFree");
  BIND(pitch, "cuMemAllocPitch_v2", "cuMemAllocPitch");
  BIND(managed, "cuMemAllocManaged", "cuMemAllocManaged");
  BIND(async, "cuMemAllocAsync", "cuMemAllocAsync");
  BIND(async_free, "cuMemFreeAsync", "cuMemFreeAsync");
  BIND(pool_of, "cuDeviceGetMemPool", "cuDeviceGetMemPool");
  BIND(trim, "cuMemPoolTrimTo", "cuMemPoolTrimTo");
  BIND(create, "cuMemCreate", "cuMemCreate");
  BIND(release, "cuMemRelease", "cuMemRelease");
  BIND(array, "cuArrayCreate_v2", "cuArrayCreate");
  BIND(array_destroy, "cuArrayDestroy", "cuArrayDestroy");
  BIND(mipmap, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate");
  BIND(mipmap_destroy, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy");
  BIND(info, "cuMemGetInfo_v2", "cuMemGetInfo");
  BIND(total, "cuDeviceTotalMem_v2", "cuDeviceTotalMem");
  BIND(memset8, "cuMemsetD8_v2", "cuMemsetD8");
  BIND(dtoh, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
  BIND(export_table, "cuGetExportTable", "cuGetExportTable");
  BIND(graph_create, "cuGraphCreate", "cuGraphCreate");
  BIND(graph_alloc, "cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode");
  BIND(graph_free, "cuGraphAddMemFreeNode", "cuGraphAddMemFreeNode");
  BIND(graph_instantiate, "cuGraphInstantiateWithFlags",
       "cuGraphInstantiateWithFlags");
  BIND(graph_destroy, "cuGraphDestroy", "cuGraphDestroy");
  BIND(graph_launch, "cuGraphLaunch", "cuGraphLaunch");
  BIND(graph_exec_destroy, "cuGraphExecDestroy", "cuGraphExecDestroy");
  BIND(graph_trim, "cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim");
  BIND(pool_create, "cuMemPoolCreate", "cuMemPoolCreate");
  BIND(from_pool, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync");
  BIND(primary_release, "cuDevicePrimaryCtxRelease_v2",
       "cuDevicePrimaryCtxRelease");
  BIND(primary_reset, "cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset");
  return 0;
}

static unsigned long long size_arg(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  switch (*end) {
  case 'G':
    return v << 30;
  case 'M':
    return v << 20;
  case 'K':
    return v << 10;
  default:
    return v;
  }
}

static CUdeviceptr ptrs[MAXP];
static int nptrs;
static CUdeviceptr asyncs[MAXP];
static int nasync;
static CUmemGenericAllocationHandle handles[MAXP];
static int nhandles;
static CUarray arrays[MAXP];
static int narrays;
static CUmipmappedArray mipmaps[MAXP];
static int nmipmaps;
static CUcontext created;
static CUcontext current; /* made current in every thread */

static int result(const char *what, CUresult rc) {
  if (rc == CUDA_SUCCESS)
    return 0;
  printf("%s: error %d\n", what, rc);
  return rc == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 3;
}

/* Writes a byte pattern over the allocation and reads a sample back. */
static int check_data(CUdeviceptr p, size_t bytes, unsigned char v) {
  if (!api.memset8 || !api.dtoh || bytes == 0)
    return 0;
  size_t n = bytes < 4096 ? bytes : 4096;
  unsigned char buf[4096];
  if (api.memset8(p, v, n) != CUDA_SUCCESS ||
      api.dtoh(buf, p, n) != CUDA_SUCCESS)
    return 3;
  for (size_t i = 0; i < n; i++)
    if (buf[i] != v)
      return 4;
  return 0;
}

static size_t ptr_bytes[MAXP]; /* of ptrs[] made by alloc, else 0 */

static int act_alloc(const char *arg) {
  size_t bytes = size_arg(arg);
  CUdeviceptr p = 0;
  int rc = result("alloc", api.alloc(&p, bytes));
  if (rc == 0 && nptrs < MAXP) {
    ptr_bytes[nptrs] = bytes;
    ptrs[nptrs++] = p;
    rc = check_data(p, bytes, (unsigned char)(nptrs * 7));
    printf("alloc %zu ok\n", bytes);
  }
  return rc;
}

/* cycle:SIZE:PATH: allocates SIZE and frees it again, over and over,
 * until PATH exists: a job at its plateau that allocates and frees (as
 * one without a caching allocator does), asking for memory again and
 * again but never holding more than before. */
static int act_cycle(const char *arg) {
  const char *path = strchr(arg, ':');
  if (!path)
    return 3;
  path++;
  size_t bytes = size_arg(arg);
  unsigned long n = 0;
  struct timespec ts = {0, 5 * 1000 * 1000};
  while (access(path, F_OK) != 0) {
    CUdeviceptr p = 0;
    int rc = result("alloc", api.alloc(&p, bytes));
    if (rc)
      return rc;
    if ((rc = result("free", api.free(p))) != 0)
      return rc;
    /* A cue for the test: 250 cycles, each with a sleep of at least
     * 5 ms, put what came before at least 1.25 s back. */
    if (++n == 250) {
      printf("cycled 250\n");
      fflush(stdout);
    }
    nanosleep(&ts, NULL);
  }
  printf("cycled %lu times\n", n);
  return 0;
}

/* Reads back the pattern each alloc wrote (its first 4 KiB): data kept
 * across a suspension, at the same addresses. */
static int act_verify(void) {
  unsigned char buf[4096];
  for (int i = 0; i < nptrs; i++) {
    size_t n = ptr_bytes[i] < 4096 ? ptr_bytes[i] : 4096;
    if (n == 0 || !api.dtoh)
      continue;
    if (api.dtoh(buf, ptrs[i], n) != CUDA_SUCCESS)
      return 3;
    for (size_t k = 0; k < n; k++)
      if (buf[k] != (unsigned char)((i + 1) * 7)) {
        printf("verify: allocation %d changed\n", i);
        return 4;
      }
  }
  printf("verify ok\n");
  return 0;
}

static int act_async(const char *arg) {
  CUdeviceptr p = 0;
  int rc = result("async", api.async(&p, size_arg(arg), NULL));
  if (rc == 0 && nasync < MAXP)
    asyncs[nasync++] = p;
  return rc;
}

static int act_vmm(const char *arg) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = 1;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  int rc = result("vmm", api.create(&h, size_arg(arg), &prop, 0));
  if (rc == 0 && nhandles < MAXP)
    handles[nhandles++] = h;
  return rc;
}

static int act_array(const char *arg) {
  CUDA_ARRAY_DESCRIPTOR d = {0};
  d.Width = strtoul(arg, NULL, 10);
  d.Height = strtoul(strchr(arg, ':') ? strchr(arg, ':') + 1 : "1", NULL, 10);
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 4;
  CUarray a = NULL;
  int rc = result("array", api.array(&a, &d));
  if (rc == 0 && narrays < MAXP)
    arrays[narrays++] = a;
  return rc;
}

/* poolon:DEV:SIZE: a pool created on device DEV (not the current one),
 * and SIZE allocated from it. */
static int act_pool_on(const char *arg) {
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = 1;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = atoi(arg);
  CUmemoryPool pool = NULL;
  CUdeviceptr p = 0;
  int rc = result("poolcreate", api.pool_create(&pool, &props));
  if (rc == 0)
    rc =
        result("frompool",
               api.from_pool(
                   &p, size_arg(strchr(arg, ':') ? strchr(arg, ':') + 1 : "1M"),
                   pool, NULL));
  return rc;
}

/* array8x4:W:H: an array of four 8-bit channels in one element
 * (CU_AD_FORMAT_UNORM_INT8X4), W x H x 4 bytes. */
static int act_array8x4(const char *arg) {
  CUDA_ARRAY_DESCRIPTOR d = {0};
  d.Width = strtoul(arg, NULL, 10);
  d.Height = strtoul(strchr(arg, ':') ? strchr(arg, ':') + 1 : "1", NULL, 10);
  d.Format = CU_AD_FORMAT_UNORM_INT8X4;
  d.NumChannels = 4;
  CUarray a = NULL;
  int rc = result("array8x4", api.array(&a, &d));
  if (rc == 0 && narrays < MAXP)
    arrays[narrays++] = a;
  return rc;
}

static int act_mipmap(const char *arg) {
  unsigned w = 0, h = 0, l = 0;
  sscanf(arg, "%u:%u:%u", &w, &h, &l);
  CUDA_ARRAY3D_DESCRIPTOR d = {0};
  d.Width = w;
  d.Height = h;
  d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d.NumChannels = 1;
  CUmipmappedArray m = NULL;
  int rc = result("mipmap", api.mipmap(&m, &d, l));
  if (rc == 0 && nmipmaps < MAXP)
    mipmaps[nmipmaps++] = m;
  return rc;
}

static int ctx_device;

static int act_ctx(bool create) {
  CUcontext c = NULL;
  int rc;
  if (!create)
    rc = result("ctx", api.primary(&c, ctx_device));
  else if (use_v4)
    rc = result("ctxcreate", api.ctx_create_v4(&c, NULL, 0, 0));
  else
    rc = result("ctxcreate", api.ctx_create_v2(&c, 0, 0));
  if (rc == 0 && create)
    created = c;
  if (rc == 0)
    rc = result("setcurrent", api.set_current(c));
  if (rc == 0)
    current = c;
  return rc;
}

static int act_info(bool total) {
  size_t f = 0, t = 0;
  int rc = total ? result("total", api.total(&t, 0))
                 : result("info", api.info(&f, &t));
  if (rc == 0)
    printf(total ? "total=%zu\n" : "free=%zu total=%zu\n", total ? t : f, t);
  return rc;
}

static int act_export_table(void) {
  const void *table = NULL;
  CUuuid id = {{0}};
  int rc = result("exporttable", api.export_table(&table, &id));
  void *marker = dlsym(lib, "fake_cuda_export_table");
  printf("exporttable %s\n", table == marker ? "same" : "different");
  return rc;
}

/* A graph that allocates SIZE on the context's device and frees it again,
 * instantiated and launched once. */
static CUgraphExec graph_exec;
static int act_graph(const char *arg) {
  CUgraph g = NULL;
  CUgraphNode a = NULL, f = NULL;
  CUDA_MEM_ALLOC_NODE_PARAMS p = {0};
  p.poolProps.allocType = 1;
  p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.poolProps.location.id = ctx_device;
  p.bytesize = size_arg(arg);
  int rc = result("graphcreate", api.graph_create(&g, 0));
  if (rc == 0)
    rc = result("graphalloc", api.graph_alloc(&a, g, NULL, 0, &p));
  if (rc == 0)
    rc = result("graphfree", api.graph_free(&f, g, &a, 1, p.dptr));
  if (rc == 0)
    rc = result("instantiate", api.graph_instantiate(&graph_exec, g, 0));
  if (g)
    api.graph_destroy(g);
  if (rc == 0)
    rc = result("graph", api.graph_launch(graph_exec, NULL));
  if (rc == 0)
    printf("graph launched\n");
  return rc;
}

static int act_simple(const char *a) {
  if (!strcmp(a, "graphtrim"))
    return result("graphtrim", api.graph_trim(ctx_device));
  if (!strcmp(a, "graphdestroy") && graph_exec) {
    CUgraphExec e = graph_exec;
    graph_exec = NULL;
    return result("graphdestroy", api.graph_exec_destroy(e));
  }
  if (!strcmp(a, "free") && nptrs)
    return result("free", api.free(ptrs[--nptrs]));
  if (!strcmp(a, "freeall")) {
    while (nptrs)
      if (result("free", api.free(ptrs[--nptrs])))
        return 3;
    return 0;
  }
  if (!strcmp(a, "asyncfree") && nasync)
    return result("asyncfree", api.async_free(asyncs[--nasync], NULL));
  if (!strcmp(a, "trim")) {
    CUmemoryPool pool = NULL;
    int rc = result("pool", api.pool_of(&pool, 0));
    return rc ? rc : result("trim", api.trim(pool, 0));
  }
  if (!strcmp(a, "vmmfree") && nhandles)
    return result("vmmfree", api.release(handles[--nhandles]));
  if (!strcmp(a, "arrayfree") && narrays)
    return result("arrayfree", api.array_destroy(arrays[--narrays]));
  if (!strcmp(a, "mipmapfree") && nmipmaps)
    return result("mipmapfree", api.mipmap_destroy(mipmaps[--nmipmaps]));
  if (!strcmp(a, "ctxdestroy") && created) {
    CUcontext c = created;
    created = NULL;
    return result("ctxdestroy", api.ctx_destroy(c));
  }
  if (!strcmp(a, "primaryrelease"))
    return result("primaryrelease", api.primary_release(ctx_device));
  if (!strcmp(a, "primaryreset"))
    return result("primaryreset", api.primary_reset(ctx_device));
  if (!strcmp(a, "freeunknown")) {
    CUresult r = api.free((CUdeviceptr)0xdead0000ull);
    printf("freeunknown=%d\n", r);
    return 0;
  }
  fprintf(stderr, "cudaprog: unknown action %s\n", a);
  return 3;
}

/* threads:N:SIZE:ITERS: N threads allocate and free SIZE, ITERS times. */
static size_t thr_bytes;
static int thr_iters;
static void *thr_main(void *arg) {
  (void)arg;
  if (api.set_current(current) != CUDA_SUCCESS)
    return (void *)1;
  for (int i = 0; i < thr_iters; i++) {
    CUdeviceptr p = 0;
    if (api.alloc(&p, thr_bytes) != CUDA_SUCCESS || api.free(p) != CUDA_SUCCESS)
      return (void *)1;
  }
  return NULL;
}

static int act_threads(const char *arg) {
  unsigned n = 0, iters = 0;
  char size[32] = "";
  if (sscanf(arg, "%u:%31[^:]:%u", &n, size, &iters) != 3 || n > 64)
    return 3;
  thr_bytes = size_arg(size);
  thr_iters = (int)iters;
  pthread_t t[64];
  for (unsigned i = 0; i < n; i++)
    pthread_create(&t[i], NULL, thr_main, NULL);
  int bad = 0;
  for (unsigned i = 0; i < n; i++) {
    void *r;
    pthread_join(t[i], &r);
    bad += r != NULL;
  }
  printf("threads %u x %u: %d failed\n", n, iters, bad);
  return bad ? 3 : 0;
}

/* fork:SIZE[:MS]: a child that creates its own context and allocates, as a
 * process of the same job, holding it MS ms; the parent waits for it. */
static int act_fork(const char *arg) {
  pid_t pid = fork();
  if (pid == 0) {
    CUcontext c = NULL;
    CUdeviceptr p = 0;
    const char *ms = strchr(arg, ':');
    api.init(0); /* a child initialises on its own */
    CUresult r1 = api.primary(&c, 0), r2 = api.set_current(c),
             r3 = api.alloc(&p, size_arg(arg));
    if (ms) {
      long n = strtol(ms + 1, NULL, 10);
      struct timespec ts = {n / 1000, (n % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    CUresult r4 = api.free(p);
    if (r1 || r2 || r3 || r4)
      fprintf(stderr, "fork child: %d %d %d %d\n", r1, r2, r3, r4);
    _exit(r1 || r2 || r3 || r4 ? 3 : 0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  printf("fork child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 3;
}

static int act(const char *a);

/* bg:ACTION runs ACTION in a thread of its own (with the context current);
 * join waits for it and takes its result. */
static pthread_t bg_thread;
static bool bg_running;
static void *bg_main(void *arg) {
  if (api.set_current(current) != CUDA_SUCCESS)
    return (void *)3;
  return (void *)(intptr_t)act((const char *)arg);
}

/* closeconn: closes every Unix socket of the process, the preload
 * library's connections to cogpud among them, as a program that closes
 * the descriptors it does not know of (daemonising) does, and as the
 * kernel does at exit before the driver has freed the process's memory.
 * The device memory stays the process's. */
static int act_closeconn(void) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir)
    return 3;
  int fds[256], n = 0;
  for (struct dirent *e; (e = readdir(dir)) && n < 256;) {
    int fd = atoi(e->d_name), dom = 0;
    socklen_t len = sizeof dom;
    if (e->d_name[0] != '.' && fd != dirfd(dir) &&
        getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &len) == 0 &&
        dom == AF_UNIX)
      fds[n++] = fd;
  }
  closedir(dir);
  for (int i = 0; i < n; i++)
    close(fds[i]);
  printf("closed %d\n", n);
  return 0;
}

/* sockreuse: a socket pair of the program's own, which takes the lowest
 * free descriptors (after closeconn, the number the library's connection
 * had). sockcheck: what reached the pair's other end (the library's
 * messages, if it wrote into the program's socket), and whether the
 * program's end is still open: prints "sockcheck N bytes open|closed". */
static int sock_pair[2] = {-1, -1};
static int act_sock(bool check) {
  if (!check) {
    int rc = socketpair(AF_UNIX, SOCK_STREAM, 0, sock_pair);
    printf("sockreuse fd=%d\n", rc == 0 ? sock_pair[0] : -1);
    return rc == 0 ? 0 : 3;
  }
  char buf[4096];
  ssize_t total = 0, k;
  while ((k = recv(sock_pair[1], buf, sizeof buf, MSG_DONTWAIT)) > 0)
    total += k;
  bool open = fcntl(sock_pair[0], F_GETFD) != -1 && k != 0;
  printf("sockcheck %zd bytes %s\n", total, open ? "open" : "closed");
  return 0;
}

static int act(const char *a) {
  if (!strncmp(a, "bg:", 3)) {
    bg_running =
        pthread_create(&bg_thread, NULL, bg_main, (void *)(a + 3)) == 0;
    return bg_running ? 0 : 3;
  }
  if (!strcmp(a, "join")) {
    void *r = NULL;
    if (bg_running)
      pthread_join(bg_thread, &r);
    bg_running = false;
    printf("joined %d\n", (int)(intptr_t)r);
    return (int)(intptr_t)r;
  }
  const char *arg = strchr(a, ':') ? strchr(a, ':') + 1 : "";
  if (!strcmp(a, "init"))
    return result("init", api.init(0));
  if (!strncmp(a, "ctxon:", 6)) {
    ctx_device = atoi(arg); /* the primary context of another device */
    return act_ctx(false);
  }
  if (!strcmp(a, "ctx") || !strcmp(a, "ctxcreate"))
    return act_ctx(!strcmp(a, "ctxcreate"));
  if (!strncmp(a, "alloc:", 6))
    return act_alloc(arg);
  if (!strncmp(a, "pitch:", 6)) {
    CUdeviceptr p = 0;
    size_t pitch = 0;
    int rc = result("pitch", api.pitch(&p, &pitch, strtoul(arg, NULL, 10),
                                       size_arg(strchr(arg, ':') + 1), 4));
    if (rc == 0 && nptrs < MAXP)
      ptrs[nptrs++] = p;
    printf("pitch=%zu\n", pitch);
    return rc;
  }
  if (!strncmp(a, "managed:", 8)) {
    CUdeviceptr p = 0;
    int rc = result("managed", api.managed(&p, size_arg(arg), 1));
    if (rc == 0 && nptrs < MAXP)
      ptrs[nptrs++] = p;
    return rc;
  }
  if (!strncmp(a, "async:", 6))
    return act_async(arg);
  if (!strncmp(a, "vmm:", 4))
    return act_vmm(arg);
  if (!strncmp(a, "array:", 6))
    return act_array(arg);
  if (!strncmp(a, "array8x4:", 9))
    return act_array8x4(arg);
  if (!strncmp(a, "poolon:", 7))
    return act_pool_on(arg);
  if (!strncmp(a, "mipmap:", 7))
    return act_mipmap(arg);
  if (!strcmp(a, "info") || !strcmp(a, "total"))
    return act_info(!strcmp(a, "total"));
  if (!strcmp(a, "verify"))
    return act_verify();
  if (!strcmp(a, "rtldnext")) {
    /* Interposers find the next definition with RTLD_NEXT: through our
     * dlsym it must still be the one after the caller (libc's). */
    void *p = dlsym(RTLD_NEXT, "getpid");
    printf("rtldnext %s\n", p == (void *)getpid ? "same" : "different");
    return 0;
  }
  if (!strcmp(a, "exporttable"))
    return act_export_table();
  if (!strcmp(a, "closeconn"))
    return act_closeconn();
  if (!strcmp(a, "sockreuse") || !strcmp(a, "sockcheck"))
    return act_sock(!strcmp(a, "sockcheck"));
  if (!strncmp(a, "threads:", 8))
    return act_threads(arg);
  if (!strncmp(a, "fork:", 5))
    return act_fork(arg);
  if (!strncmp(a, "graph:", 6))
    return act_graph(arg);
  if (!strncmp(a, "cycle:", 6))
    return act_cycle(arg);
  if (!strncmp(a, "waitfile:", 9)) {
    printf("waiting\n");
    fflush(stdout);
    struct timespec ts = {0, 2 * 1000 * 1000};
    while (access(arg, F_OK) != 0)
      nanosleep(&ts, NULL);
    return 0;
  }
  if (!strncmp(a, "hold:", 5)) {
    long ms = strtol(arg, NULL, 10);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return 0;
  }
  return act_simple(a);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cudaprog ROUTE ACTION...\n");
    return 3;
  }
  int rc = bind_route(argv[1]);
  for (int i = 2; rc == 0 && i < argc; i++) {
    rc = act(argv[i]);
    fflush(stdout);
  }
  return rc;
}
