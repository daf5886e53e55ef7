/*
 * entry.c: the routes by which applications reach CUDA entry points, each
 * led to the hooks:
 *  - direct calls to exported symbols: our exports win (LD_PRELOAD);
 *  - dlopen("libcuda.so.1") + dlsym: our dlsym returns the hook when the
 *    lookup would have returned the real driver's hooked function;
 *    RTLD_NEXT and RTLD_DEFAULT lookups go to glibc's dlsym by a tail jump,
 *    so that glibc sees the real caller and answers as it would without
 *    us (an interposer before us finds our hook next, one after us the
 *    driver);
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

/* A lookup on a handle (dlopen("libcuda.so.1")): glibc's answer, with the
 * driver's hooked functions swapped for our hooks. */
void *cogpu__pl_dlsym_handle(void *handle, const char *name);
PRELOAD_EARLY __attribute__((used)) void *
cogpu__pl_dlsym_handle(void *handle, const char *name) {
  return entry_swap(name, cogpu__pl_real_dlsym(handle, name));
}

/* glibc's dlsym finds "next" and "default" relative to its caller, read
 * from its return address. Our dlsym must not stand between them: it jumps
 * to glibc's with the caller's return address still on the stack, so
 * RTLD_NEXT from an interposer loaded before us finds our hook, from one
 * loaded after us the driver, from a sanitizer runtime what it would find
 * without us; RTLD_DEFAULT finds the first definition in the global scope,
 * which is ours or an earlier interposer's. Nothing here calls into the
 * loader, which sanitizer runtimes cannot bear while they start up. C
 * cannot promise a tail call, hence a few instructions of assembly;
 * elsewhere than x86-64, every lookup goes through glibc from here (and
 * RTLD_NEXT is then relative to this library: a library loaded after us
 * that looks up a function it defines itself is handed its own). */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        ".p2align 4\n"
        "dlsym:\n"
#ifdef __CET__
        "  endbr64\n"
#endif
        "  cmpq $-1, %rdi\n" /* RTLD_NEXT */
        "  je 1f\n"
        "  testq %rdi, %rdi\n" /* RTLD_DEFAULT */
        "  jne cogpu__pl_dlsym_handle\n"
        "1:\n"
        "  movq cogpu__pl_glibc_dlsym(%rip), %rax\n"
        "  testq %rax, %rax\n"
        "  jz 2f\n"
        "  jmp *%rax\n"
        "2:\n" /* first use: find glibc's, keeping the arguments */
        "  pushq %rdi\n"
        "  pushq %rsi\n"
        "  subq $8, %rsp\n"
        "  call cogpu__pl_glibc_dlsym_resolve\n"
        "  addq $8, %rsp\n"
        "  popq %rsi\n"
        "  popq %rdi\n"
        "  jmp *%rax\n"
        ".size dlsym, .-dlsym\n");
#else
PRELOAD_EXPORT void *dlsym(void *handle, const char *name);
PRELOAD_EXPORT PRELOAD_EARLY void *dlsym(void *handle, const char *name) {
  return cogpu__pl_dlsym_handle(handle, name);
}
#endif

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
