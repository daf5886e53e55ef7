/*
 * hooks-graph.c: memory that CUDA graphs allocate. Allocation nodes
 * (cuGraphAddMemAllocNode, or cuMemAllocAsync captured from a stream) take
 * their memory from the device's graph allocator when the graph is launched
 * or uploaded, and the allocator keeps it for later launches until it is
 * trimmed. So what the allocator holds is what counts. It is read after
 * each launch, upload, trim and executable-graph destruction, as a pool's
 * footprint is. A launch cannot be made to wait for memory, since the
 * driver takes it during the launch, so it is charged after the fact: if
 * the GPU has no room, the job is over its reservation until it trims.
 */
#include "preload/preload-int.h"

static CUresult not_loaded(void) {
  return CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult synced(CUresult rc) {
  cogpu__pl_graph_sync();
  return rc;
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
  cuGraphLaunch_ft *real = REAL(cuGraphLaunch);
  return real ? synced(real(exec, s)) : not_loaded();
}

CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) {
  cuGraphLaunch_ptsz_ft *real = REAL(cuGraphLaunch_ptsz);
  return real ? synced(real(exec, s)) : not_loaded();
}

CUresult cuGraphUpload(CUgraphExec exec, CUstream s) {
  cuGraphUpload_ft *real = REAL(cuGraphUpload);
  return real ? synced(real(exec, s)) : not_loaded();
}

CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream s) {
  cuGraphUpload_ptsz_ft *real = REAL(cuGraphUpload_ptsz);
  return real ? synced(real(exec, s)) : not_loaded();
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  cuGraphExecDestroy_ft *real = REAL(cuGraphExecDestroy);
  return real ? synced(real(exec)) : not_loaded();
}

CUresult cuDeviceGraphMemTrim(CUdevice dev) {
  cuDeviceGraphMemTrim_ft *real = REAL(cuDeviceGraphMemTrim);
  return real ? synced(real(dev)) : not_loaded();
}
