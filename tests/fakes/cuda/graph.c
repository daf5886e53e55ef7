/*
 * graph.c: graphs with memory nodes in the fake libcuda.so.1, enough to
 * show the preload library the driver's graph allocator at work.
 *
 * Each device has one graph allocator. Launching (or uploading) an
 * executable graph makes it hold at least what the graph allocates, charged
 * to the GPU; it keeps that memory for later launches until
 * cuDeviceGraphMemTrim gives it back, as the real allocator does. Only
 * allocations freed within their own graph are modelled (instantiating a
 * graph with any other is refused), so nothing is live once a launch has
 * returned: the fake runs graphs to completion at launch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake-cuda-int.h"

#define GRAPH_MAX_ALLOCS 64

typedef struct {
  uint64_t bytes;
  CUdeviceptr dptr;
  int ordinal;
  bool freed; /* by a free node of the same graph */
} graph_alloc_t;

struct CUgraph_st {
  graph_alloc_t alloc[GRAPH_MAX_ALLOCS];
  int nalloc;
};

struct CUgraphExec_st {
  uint64_t need[FAKE_CUDA_MAX_GPUS]; /* by ordinal */
};

/* Each device's graph allocator (locked). */
static struct { uint64_t reserved, high; } g_gpool[FAKE_CUDA_MAX_GPUS];

void fake_graphs_forget(void) {
  memset(g_gpool, 0, sizeof g_gpool);
}

FAKE_API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
  FAKE_ENTER_INIT();
  if (!phGraph || flags)
    return CUDA_ERROR_INVALID_VALUE;
  *phGraph = calloc(1, sizeof **phGraph);
  return *phGraph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_API CUresult cuGraphDestroy(CUgraph hGraph) {
  FAKE_ENTER_INIT();
  if (!hGraph)
    return CUDA_ERROR_INVALID_VALUE;
  free(hGraph);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuGraphAddMemAllocNode(
    CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
    size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
  FAKE_ENTER_INIT();
  (void)dependencies;
  (void)numDependencies;
  if (!phGraphNode || !hGraph || !nodeParams || !nodeParams->bytesize ||
      nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      hGraph->nalloc == GRAPH_MAX_ALLOCS)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  bool ok = fake_device(nodeParams->poolProps.location.id, NULL);
  uint64_t va = ok ? fake_new_handle() << 32 : 0;
  fake_unlock();
  if (!ok)
    return CUDA_ERROR_INVALID_DEVICE;
  graph_alloc_t *a = &hGraph->alloc[hGraph->nalloc];
  *a = (graph_alloc_t){.bytes = nodeParams->bytesize,
                       .dptr = va,
                       .ordinal = nodeParams->poolProps.location.id};
  nodeParams->dptr = va;
  *phGraphNode = (CUgraphNode)(uintptr_t)(++hGraph->nalloc);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode,
                                        CUgraph hGraph,
                                        const CUgraphNode *dependencies,
                                        size_t numDependencies,
                                        CUdeviceptr dptr) {
  FAKE_ENTER_INIT();
  (void)dependencies;
  (void)numDependencies;
  if (!phGraphNode || !hGraph)
    return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < hGraph->nalloc; i++) {
    graph_alloc_t *a = &hGraph->alloc[i];
    if (a->dptr == dptr && !a->freed) {
      a->freed = true;
      *phGraphNode = (CUgraphNode)(uintptr_t)(1000 + i);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec,
                                              CUgraph hGraph,
                                              unsigned long long flags) {
  FAKE_ENTER_INIT();
  (void)flags;
  if (!phGraphExec || !hGraph)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUgraphExec_st *e = calloc(1, sizeof *e);
  if (!e)
    return CUDA_ERROR_OUT_OF_MEMORY;
  for (int i = 0; i < hGraph->nalloc; i++) {
    const graph_alloc_t *a = &hGraph->alloc[i];
    if (!a->freed) {
      fprintf(stderr, "fake-cuda: graph allocations that outlive their "
                      "graph are not modelled\n");
      free(e);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    e->need[a->ordinal] += a->bytes;
  }
  *phGraphExec = e;
  return CUDA_SUCCESS;
}

/* Locked. Grow each device's allocator to what the graph needs; on
 * out-of-memory, undo what this run grew. */
static CUresult graph_run(struct CUgraphExec_st *e) {
  uint64_t grown[FAKE_CUDA_MAX_GPUS] = {0};
  CUresult rc = CUDA_SUCCESS;
  for (int d = 0; d < FAKE_CUDA_MAX_GPUS && rc == CUDA_SUCCESS; d++) {
    unsigned nvml;
    if (e->need[d] <= g_gpool[d].reserved || !fake_device(d, &nvml))
      continue;
    grown[d] = e->need[d] - g_gpool[d].reserved;
    rc = fake_state_charge(nvml, grown[d]);
    if (rc != CUDA_SUCCESS)
      grown[d] = 0;
    else
      g_gpool[d].reserved = e->need[d];
  }
  for (int d = 0; d < FAKE_CUDA_MAX_GPUS; d++) {
    unsigned nvml;
    if (rc != CUDA_SUCCESS && grown[d] && fake_device(d, &nvml)) {
      fake_state_refund(nvml, grown[d]);
      g_gpool[d].reserved -= grown[d];
    }
    if (g_gpool[d].reserved > g_gpool[d].high)
      g_gpool[d].high = g_gpool[d].reserved;
  }
  return rc;
}

/* An upload (`run` false) only makes the allocator hold the memory; a launch
 * also counts as one kernel's work. */
static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream,
                             bool run) {
  if (!hGraphExec)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUcontext ctx;
  CUresult rc = fake_stream_ctx(hStream, &ctx);
  if (rc == CUDA_SUCCESS)
    rc = graph_run(hGraphExec);
  if (rc == CUDA_SUCCESS && run)
    fake_work_launched(ctx->nvml);
  fake_unlock();
  return rc;
}

FAKE_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  FAKE_ENTER_INIT();
  return graph_launch(hGraphExec, hStream, true);
}

FAKE_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  FAKE_ENTER_INIT();
  return graph_launch(hGraphExec, hStream, true);
}

FAKE_API CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  FAKE_ENTER_INIT();
  return graph_launch(hGraphExec, hStream, false);
}

FAKE_API CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  FAKE_ENTER_INIT();
  return graph_launch(hGraphExec, hStream, false);
}

FAKE_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  FAKE_ENTER_INIT();
  if (!hGraphExec)
    return CUDA_ERROR_INVALID_VALUE;
  free(hGraphExec);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGraphMemTrim(CUdevice device) {
  FAKE_ENTER_INIT();
  unsigned nvml;
  fake_lock();
  bool ok = fake_device(device, &nvml);
  if (ok && g_gpool[device].reserved) {
    fake_state_refund(nvml, g_gpool[device].reserved);
    g_gpool[device].reserved = 0;
  }
  fake_unlock();
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FAKE_API CUresult cuDeviceGetGraphMemAttribute(CUdevice device, int attr,
                                               void *value) {
  FAKE_ENTER_INIT();
  if (!value)
    return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  bool ok = fake_device(device, NULL);
  uint64_t v = 0;
  if (ok && attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    v = g_gpool[device].reserved;
  else if (ok && (attr == 1 || attr == 3)) /* the high watermarks */
    v = g_gpool[device].high;
  else if (ok && attr != CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    ok = false;
  fake_unlock();
  if (!ok)
    return device < 0 || device >= FAKE_CUDA_MAX_GPUS
               ? CUDA_ERROR_INVALID_DEVICE
               : CUDA_ERROR_INVALID_VALUE;
  *(cuuint64_t *)value = v;
  return CUDA_SUCCESS;
}
