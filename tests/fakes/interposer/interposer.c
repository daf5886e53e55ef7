/*
 * interposer.c: a minimal third-party CUDA interposer, as profilers,
 * debugging shims and other sharers are written: it replaces
 * cuMemAlloc_v2, finds the next definition with dlsym(RTLD_NEXT), counts
 * the calls and passes them on. Loaded before or after the preload
 * library, it must get the next function in line, never its own: it
 * stops the program (exit 5) rather than recurse, and says at exit how
 * many calls it saw.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda/cuda-abi.h"

typedef CUresult alloc_ft(CUdeviceptr *, size_t);

static int calls;
static __thread int depth;

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *p,
                                                              size_t n);
__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *p,
                                                              size_t n) {
  alloc_ft *next = (alloc_ft *)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
  if (next == cuMemAlloc_v2 || depth > 0) {
    static const char msg[] = "interposer: handed its own cuMemAlloc_v2\n";
    if (write(2, msg, sizeof msg - 1) < 0)
      _exit(5);
    _exit(5);
  }
  if (!next)
    return 999; /* CUDA_ERROR_UNKNOWN */
  depth++;
  CUresult r = next(p, n);
  depth--;
  __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
  return r;
}

__attribute__((destructor)) static void interposer_done(void) {
  if (calls)
    fprintf(stderr, "interposer: %d cuMemAlloc_v2 calls\n", calls);
}
