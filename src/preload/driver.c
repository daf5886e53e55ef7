/*
 * driver.c: the real CUDA driver behind the hooks. libcuda.so.1 is found
 * the way the system loader finds it (so LD_LIBRARY_PATH works), loaded on
 * first need, and its entry points are resolved with glibc's own dlsym
 * (found by glibc-sym.c), never through our dlsym override.
 *
 * Two tables: the driver's own addresses (pl_real_fn, by handle), which is
 * how cuGetProcAddress answers are recognised; and what the hooks call
 * (pl_next_fn), the next definition after this library in the global
 * scope, so that an interposer loaded after us (a profiler, a shim) still
 * runs, as it would without us. The hook table refers to our own
 * definitions: the library is linked with -Bsymbolic-functions, so an
 * interposer loaded before us, which defines the same names, can never be
 * mistaken for our hook (it would be handed itself).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "preload/preload-int.h"

static const char *const pl_names[PL__COUNT] = {
#define HOOK(n) #n,
#define NEED(n) #n,
#include "preload/hooks.def"
#undef HOOK
#undef NEED
};

/* Our hooks, by entry point; NULL for NEED entries. */
static void *const pl_hooks[PL__COUNT] = {
#define HOOK(n) (void *)n,
#define NEED(n) NULL,
#include "preload/hooks.def"
#undef HOOK
#undef NEED
};

static void *pl_real_fn[PL__COUNT];
static void *pl_next_fn[PL__COUNT];
static void *pl_handle;
static pthread_once_t pl_once = PTHREAD_ONCE_INIT;
typedef void *dlsym_ft(void *, const char *);
/* glibc's dlsym, once found; entry.c's dlsym jumps to it directly. */
dlsym_ft *_Atomic cogpu__pl_glibc_dlsym;

PRELOAD_EARLY static void *pl_dlsym_none(void *handle, const char *name) {
  (void)handle;
  (void)name;
  return NULL;
}

/* Never NULL: a function that finds nothing when glibc's cannot be found. */
PRELOAD_EARLY void *cogpu__pl_glibc_dlsym_resolve(void) {
  dlsym_ft *fn =
      atomic_load_explicit(&cogpu__pl_glibc_dlsym, memory_order_acquire);
  if (!fn) {
    /* Found with dlvsym, which is not overridden, so this cannot recurse
     * (glibc-sym.c). */
    fn = (dlsym_ft *)cogpu__pl_glibc_sym("dlsym");
    if (!fn)
      fn = pl_dlsym_none;
    atomic_store_explicit(&cogpu__pl_glibc_dlsym, fn, memory_order_release);
  }
  return (void *)fn;
}

PRELOAD_EARLY void *cogpu__pl_real_dlsym(void *handle, const char *name) {
  return ((dlsym_ft *)cogpu__pl_glibc_dlsym_resolve())(handle, name);
}

/* glibc's own dlopen and dlclose: sanitizer runtimes wrap them, and their
 * wrappers cannot run while they start up, which is when they ask for
 * RTLD_NEXT lookups. */
typedef void *dlopen_ft(const char *, int);
typedef int dlclose_ft(void *);
static dlopen_ft *_Atomic pl_dlopen;
static dlclose_ft *_Atomic pl_dlclose;

static void *pl_glibc(const char *name) {
  return cogpu__pl_glibc_sym(name);
}

void *cogpu__pl_real_dlopen(const char *file, int flags) {
  dlopen_ft *fn = atomic_load(&pl_dlopen);
  if (!fn)
    atomic_store(&pl_dlopen, fn = (dlopen_ft *)pl_glibc("dlopen"));
  return fn ? fn(file, flags) : NULL;
}

int cogpu__pl_real_dlclose(void *h) {
  dlclose_ft *fn = atomic_load(&pl_dlclose);
  if (!fn)
    atomic_store(&pl_dlclose, fn = (dlclose_ft *)pl_glibc("dlclose"));
  return fn ? fn(h) : -1;
}

static void pl_load(void) {
  pl_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!pl_handle) {
    cogpu__log(COGPU_LOG_WARN,
               "cannot load the CUDA driver (libcuda.so.1): %s; CUDA calls "
               "will fail as they would without cogpu",
               dlerror());
    return;
  }
  /* RTLD_NEXT from here: the first definition after this library, the
   * driver's unless another interposer comes after us. */
  for (int i = 0; i < PL__COUNT; i++) {
    pl_real_fn[i] = cogpu__pl_real_dlsym(pl_handle, pl_names[i]);
    void *next = cogpu__pl_real_dlsym(RTLD_NEXT, pl_names[i]);
    pl_next_fn[i] = next && next != pl_hooks[i] ? next : pl_real_fn[i];
  }
}

void *cogpu__pl_driver(void) {
  pthread_once(&pl_once, pl_load);
  return pl_handle;
}

void *cogpu__pl_real(int fn) {
  pthread_once(&pl_once, pl_load);
  return fn >= 0 && fn < PL__COUNT ? pl_next_fn[fn] : NULL;
}

void *cogpu__pl_redirect(void *addr) {
  pthread_once(&pl_once, pl_load);
  for (int i = 0; addr && i < PL__COUNT; i++)
    if (pl_hooks[i] && pl_real_fn[i] == addr)
      return pl_hooks[i];
  return addr;
}

bool cogpu__pl_is_hook(const void *addr) {
  for (int i = 0; addr && i < PL__COUNT; i++)
    if (pl_hooks[i] == addr)
      return true;
  return false;
}

void *cogpu__pl_hook_by_name(const char *name) {
  for (int i = 0; name && i < PL__COUNT; i++)
    if (pl_hooks[i] && strcmp(pl_names[i], name) == 0)
      return pl_hooks[i];
  return NULL;
}
