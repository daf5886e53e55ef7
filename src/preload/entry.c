/*
 * entry.c: the routes by which applications reach CUDA entry points, each
 * led to the hooks:
 *  - direct calls to exported symbols: our exports win (LD_PRELOAD);
 *  - dlopen("libcuda.so.1") + dlsym: our dlsym returns the hook when the
 *    lookup would have returned the real driver's hooked function;
 *  - cuGetProcAddress(_v2), used by the CUDA runtime for nearly everything:
 *    the real driver resolves the symbol for the requested version and
 *    flags, and the variant it picked is swapped for our hook of the same
 *    variant. A request for cuGetProcAddress itself thus gets the hook.
 * Everything else (cuGetExportTable included) passes through untouched.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#include "preload/preload-int.h"

/* A hooked name whose lookup returned the real driver's function gets the
 * hook. Names we do not hook never load the driver. */
PRELOAD_EARLY static void *entry_swap(const char *name, void *p) {
  if (!p || !name || name[0] != 'c' || name[1] != 'u' ||
      !cogpu__pl_hook_by_name(name))
    return p;
  void *h = cogpu__pl_real_dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h)
    return p;
  cogpu__pl_real_dlclose(h);
  return cogpu__pl_redirect(p);
}

/* RTLD_NEXT is passed on as it is: glibc then searches after this
 * library instead of after the caller. Every interposer loaded before us
 * (cogpu run appends us to LD_PRELOAD; sanitizer runtimes come first) gets
 * exactly what it would get without us; only a library loaded after us
 * that looks up a function it defines itself could be handed its own. An
 * emulation of the caller's view would have to call into the loader while
 * sanitizer runtimes start up, when their wrappers cannot run. */
PRELOAD_EXPORT void *dlsym(void *handle, const char *name);
PRELOAD_EXPORT PRELOAD_EARLY void *dlsym(void *handle, const char *name) {
  return entry_swap(name, cogpu__pl_real_dlsym(handle, name));
}

static void entry_unknown(const char *symbol) {
  static _Atomic int said;
  if (!atomic_exchange(&said, 1))
    cogpu__log(COGPU_LOG_INFO,
               "cuGetProcAddress(%s) gave an entry point cogpu does not "
               "recognise: passed through unaccounted",
               symbol);
}

static void *entry_proc(const char *symbol, void *p) {
  void *q = cogpu__pl_redirect(p);
  if (q == p && !cogpu__pl_is_hook(p) && cogpu__pl_hook_by_name(symbol))
    entry_unknown(symbol);
  return q;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  cuGetProcAddress_v2_ft *real = REAL(cuGetProcAddress_v2);
  if (!real)
    return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real(symbol, pfn, cudaVersion, flags, status);
  if (rc == CUDA_SUCCESS && pfn && *pfn)
    *pfn = entry_proc(symbol, *pfn);
  return rc;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                          cuuint64_t flags) {
  cuGetProcAddress_ft *real = REAL(cuGetProcAddress);
  if (!real)
    return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real(symbol, pfn, cudaVersion, flags);
  if (rc == CUDA_SUCCESS && pfn && *pfn)
    *pfn = entry_proc(symbol, *pfn);
  return rc;
}

CUresult cuInit(unsigned int flags) {
  cuInit_ft *real = REAL(cuInit);
  CUresult rc = real ? real(flags) : CUDA_ERROR_NOT_INITIALIZED;
  static _Atomic int said;
  if (rc != CUDA_SUCCESS && !atomic_exchange(&said, 1))
    cogpu__log(COGPU_LOG_WARN,
               "cuInit failed with CUDA error %d: this is the driver's own "
               "answer, passed on unchanged",
               rc);
  return rc;
}
