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
#include <link.h>
#include <stdatomic.h>
#include <string.h>

#include "preload/preload-int.h"

/* A hooked name whose lookup returned the real driver's function gets the
 * hook. Names we do not hook never load the driver. */
static void *entry_swap(const char *name, void *p) {
  if (!p || !name || name[0] != 'c' || name[1] != 'u' ||
      !cogpu__pl_hook_by_name(name))
    return p;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h)
    return p;
  dlclose(h);
  return cogpu__pl_redirect(p);
}

/* Set once the process has finished loading (our constructor ran): before
 * that, lookups come from runtimes starting up (sanitizers wrap functions
 * with dlsym(RTLD_NEXT, ...)), which must not meet anything but glibc. */
static _Atomic int entry_ready;

__attribute__((constructor(65535))) static void entry_init(void) {
  atomic_store(&entry_ready, 1);
}

/* Symbol defined by the object of link map l itself, not its deps. */
static void *entry_defined_in(struct link_map *l, const char *name) {
  if (!l->l_name || !l->l_name[0])
    return NULL;
  void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
  if (!h)
    return NULL;
  void *p = cogpu__pl_real_dlsym(h, name);
  dlclose(h);
  Dl_info info;
  struct link_map *def = NULL;
  if (p && dladdr1(p, &info, (void **)&def, RTLD_DL_LINKMAP) && def == l)
    return p;
  return NULL;
}

/* RTLD_NEXT must search after the object that called dlsym, not after us
 * (glibc would take us for the caller): walk the link map from the
 * caller's object and take the first later object that defines it. */
static void *entry_dlsym_next(const char *name, const void *caller) {
  Dl_info info;
  struct link_map *from = NULL;
  if (!dladdr1(caller, &info, (void **)&from, RTLD_DL_LINKMAP) || !from)
    return NULL;
  for (struct link_map *l = from->l_next; l; l = l->l_next) {
    void *p = entry_defined_in(l, name);
    if (p)
      return p;
  }
  return NULL;
}

PRELOAD_EXPORT void *dlsym(void *handle, const char *name);
PRELOAD_EXPORT void *dlsym(void *handle, const char *name) {
  if (!atomic_load_explicit(&entry_ready, memory_order_acquire))
    return cogpu__pl_real_dlsym(handle, name);
  void *p = handle == RTLD_NEXT
                ? entry_dlsym_next(name, __builtin_return_address(0))
                : cogpu__pl_real_dlsym(handle, name);
  return entry_swap(name, p);
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
  return real ? real(flags) : CUDA_ERROR_NOT_INITIALIZED;
}
