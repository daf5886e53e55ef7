/*
 * test-fake-ckpt.c: the process checkpoint API of the fake libcuda.so.1
 * (tests/fakes/cuda/checkpoint.c) and the fake NVML's per-process
 * utilisation, driven the way cogpu's node daemon will drive them: this
 * test process is the caller (dlopen, cuInit, then cuCheckpointProcess* on
 * a pid), and the targets are forked children, real processes with CUDA
 * state of their own that the test commands over pipes ("kids"). Callers
 * that must die mid-operation, or run as another user, are forked children
 * too.
 *
 * Every wait on a kid is bounded; a kid dies with the test (parent-death
 * signal), since a kid wedged by a failed restore never returns from its
 * CUDA call.
 */
#include <dlfcn.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../fakes/cuda/fake-cuda-state.h"
#include "../fakes/cuda/fake-cuda.h"
#include "ledger-helpers.h"
#include "nvml/nvml.h"
#include "task.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * 1024 * 1024)
#define NOBODY 65534u

static void *lib;

static void *sym(const char *name) {
  void *p = dlsym(lib, name);
  if (!p)
    th_fail(__FILE__, __LINE__, "libcuda.so.1 lacks %s", name);
  return p;
}

/* An entry point of the fake, typed as fake-cuda.h declares it. */
#define F(name) ((__typeof__(&name))sym(#name))
#define CU_OK(call) ASSERT_EQ(call, CUDA_SUCCESS)

/* Loads the fake with its state in the test's directory, and makes this
 * process a caller (cuInit; no context: it holds no GPU memory). */
static void ck_open(const char *gpus) {
  setenv("FAKE_CUDA_STATE", th_path("fake-cuda"), 1);
  th_setenv("FAKE_NVML_GPUS", gpus);
  setenv("FAKE_CUDA_CTX_BYTES", "100M", 1);
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    th_fail(__FILE__, __LINE__, "dlopen libcuda.so.1: %s", dlerror());
  ASSERT(dlsym(lib, "fake_cuda_ckpt_state")); /* the fake, not a driver */
  CU_OK(F(cuInit)(0));
}

static uint64_t used(int nvml) {
  unsigned long long u;
  ASSERT_EQ(F(fake_cuda_stats)(nvml, &u, NULL, NULL), 0);
  return u;
}

static uint64_t ooms(int nvml) {
  unsigned long long n;
  ASSERT_EQ(F(fake_cuda_stats)(nvml, NULL, NULL, &n), 0);
  return n;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void put_byte(int fd, char c) {
  ASSERT_EQ(write(fd, &c, 1), 1);
}

/* The next byte on fd within ms, or -1 (timeout or end of file). */
static int get_byte_within(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char c;
  if (poll(&p, 1, ms) != 1 || read(fd, &c, 1) != 1)
    return -1;
  return (unsigned char)c;
}

/* --- Checkpoint calls ----------------------------------------------------- */

static CUresult ck_lock(pid_t pid, unsigned timeout_ms) {
  CUcheckpointLockArgs a = {.timeoutMs = timeout_ms};
  return F(cuCheckpointProcessLock)(pid, &a);
}

static CUresult ck_checkpoint(pid_t pid) {
  return F(cuCheckpointProcessCheckpoint)(pid, NULL);
}

static CUresult ck_restore(pid_t pid) {
  CUcheckpointRestoreArgs a;
  memset(&a, 0, sizeof a);
  return F(cuCheckpointProcessRestore)(pid, &a);
}

static CUresult ck_unlock(pid_t pid) {
  return F(cuCheckpointProcessUnlock)(pid, NULL);
}

/* What cuCheckpointProcessGetState says. */
static int ck_state(pid_t pid) {
  CUprocessState s = (CUprocessState)-1;
  CU_OK(F(cuCheckpointProcessGetState)(pid, &s));
  return (int)s;
}

/* The fake's own state (hook). */
static int fake_state(pid_t pid) {
  return F(fake_cuda_ckpt_state)(pid);
}

/* Waits (bounded) until process pid has `n` CUDA calls in flight, read from
 * the state file as the fake NVML reads it. */
static void inflight_becomes(pid_t pid, uint32_t n) {
  const fake_cuda_state_t *st = fake_cuda_state_map_ro(th_path("fake-cuda"));
  ASSERT(st);
  const fake_cuda_proc_state_t *e = NULL;
  for (int i = 0; i < FAKE_CUDA_MAX_PROCS && !e; i++)
    if (__atomic_load_n(&st->proc[i].pid, __ATOMIC_ACQUIRE) == pid)
      e = &st->proc[i];
  ASSERT(e);
  for (int t = 0; __atomic_load_n(&e->inflight, __ATOMIC_ACQUIRE) != n;
       t += 5) {
    ASSERT_LT(t, th_ms(5000));
    th_sleep_ms(5);
  }
  munmap((void *)st, sizeof *st);
}

/* --- Kids: target processes ----------------------------------------------- */

typedef struct {
  int dev;               /* device of its context */
  uint64_t bytes;        /* allocated at start, a pattern at both ends */
  const char *kernel_ms; /* FAKE_CUDA_KERNEL_MS, or NULL */
  const char *slow;      /* FAKE_CUDA_SLOW, or NULL */
  uid_t uid;             /* 0: stays root; else the user it becomes */
  const char *visible;   /* CUDA_VISIBLE_DEVICES, or NULL: unset */
} kid_opts_t;

typedef struct {
  pid_t pid;
  int cmd, rep;     /* commands to it, its replies */
  CUdeviceptr dptr; /* its allocation */
} kid_t;

typedef struct {
  CUcontext ctx;
  int out;
} kid_thread_t;

#define PATTERN_LEN 4096

static void pattern(unsigned char *buf, CUdeviceptr d, int end) {
  for (int i = 0; i < PATTERN_LEN; i++)
    buf[i] = (unsigned char)(d >> 12) ^ (unsigned char)(i * 7 + end);
}

/* A CUDA call in a thread of its own: replies 'd' once it returns. */
static void *kid_thread(void *arg) {
  kid_thread_t *t = arg;
  size_t fr, tot;
  CU_OK(F(cuCtxSetCurrent)(t->ctx));
  CU_OK(F(cuMemGetInfo_v2)(&fr, &tot));
  put_byte(t->out, 'd');
  return NULL;
}

/* Writes the pattern at both ends of the allocation (the rest is never
 * touched: fake device memory costs nothing until then). */
static void kid_fill(CUdeviceptr d, uint64_t bytes) {
  unsigned char buf[PATTERN_LEN];
  pattern(buf, d, 0);
  CU_OK(F(cuMemcpyHtoD_v2)(d, buf, PATTERN_LEN));
  pattern(buf, d, 1);
  CU_OK(F(cuMemcpyHtoD_v2)(d + bytes - PATTERN_LEN, buf, PATTERN_LEN));
}

static bool kid_check(CUdeviceptr d, uint64_t bytes) {
  unsigned char want[PATTERN_LEN], got[PATTERN_LEN];
  pattern(want, d, 0);
  CU_OK(F(cuMemcpyDtoH_v2)(got, d, PATTERN_LEN));
  bool ok = memcmp(want, got, PATTERN_LEN) == 0;
  pattern(want, d, 1);
  CU_OK(F(cuMemcpyDtoH_v2)(got, d + bytes - PATTERN_LEN, PATTERN_LEN));
  return ok && memcmp(want, got, PATTERN_LEN) == 0;
}

/* Commands: c a CUDA call, A 256 MiB more allocated (kept), k a kernel
 * launch, s synchronise, v check the
 * data, T two threads each making a call, M managed memory, I an IPC
 * handle, S a shareable VMM handle, q exit. Each replies with one byte
 * once done ('d', or 'o'/'x' for v); T's threads reply for themselves. */
static void kid_main(const kid_opts_t *o, int in, int out) {
  if (o->uid) {
    ASSERT_EQ(setgroups(0, NULL), 0);
    ASSERT_EQ(setresgid(o->uid, o->uid, o->uid), 0);
    ASSERT_EQ(setresuid(o->uid, o->uid, o->uid), 0);
  }
  /* After the uid change, which clears it. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (o->kernel_ms)
    setenv("FAKE_CUDA_KERNEL_MS", o->kernel_ms, 1);
  else
    unsetenv("FAKE_CUDA_KERNEL_MS");
  if (o->slow)
    setenv("FAKE_CUDA_SLOW", o->slow, 1);
  if (o->visible)
    setenv("CUDA_VISIBLE_DEVICES", o->visible, 1);
  else
    unsetenv("CUDA_VISIBLE_DEVICES");
  CUcontext ctx;
  CUdeviceptr d = 0;
  fake_CUmodule mod;
  CUfunction fn;
  CU_OK(F(cuInit)(0));
  CU_OK(F(cuCtxCreate_v2)(&ctx, 0, o->dev));
  if (o->bytes) {
    CU_OK(F(cuMemAlloc_v2)(&d, o->bytes));
    kid_fill(d, o->bytes);
  }
  CU_OK(F(cuModuleLoadData)(&mod, "fatbin"));
  CU_OK(F(cuModuleGetFunction)(&fn, mod, "kernel"));
  put_byte(out, 'r');
  ASSERT_EQ(write(out, &d, sizeof d), (ssize_t)sizeof d);
  kid_thread_t th = {ctx, out};
  for (;;) {
    int c = get_byte_within(in, -1);
    size_t fr, tot;
    void *args[1] = {NULL};
    char reply = 'd';
    if (c < 0 || c == 'q')
      _exit(0);
    if (c == 'c') {
      CU_OK(F(cuMemGetInfo_v2)(&fr, &tot));
    } else if (c == 'A') {
      CUdeviceptr more;
      CU_OK(F(cuMemAlloc_v2)(&more, 256 * MIB));
    } else if (c == 'k') {
      CU_OK(F(cuLaunchKernel)(fn, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    } else if (c == 's') {
      CU_OK(F(cuCtxSynchronize)());
    } else if (c == 'v') {
      reply = kid_check(d, o->bytes) ? 'o' : 'x';
    } else if (c == 'T') {
      pthread_t t;
      for (int i = 0; i < 2; i++) {
        ASSERT_EQ(pthread_create(&t, NULL, kid_thread, &th), 0);
        pthread_detach(t);
      }
      continue;
    } else if (c == 'M') {
      CUdeviceptr m;
      CU_OK(F(cuMemAllocManaged)(&m, MIB, 1));
    } else if (c == 'I') {
      fake_CUipcMemHandle h;
      CU_OK(F(cuIpcGetMemHandle)(&h, d));
    } else if (c == 'S') {
      CUmemAllocationProp prop;
      CUmemGenericAllocationHandle h;
      int fd = -1;
      memset(&prop, 0, sizeof prop);
      prop.type = 1;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = o->dev;
      CU_OK(F(cuMemCreate)(&h, 2 * MIB, &prop, 0));
      CU_OK(F(cuMemExportToShareableHandle)(&fd, h, 1, 0));
      ASSERT(fd >= 0);
    } else {
      reply = '?';
    }
    put_byte(out, reply);
  }
}

static kid_t kid_start(const kid_opts_t *o) {
  int down[2], up[2];
  ASSERT_EQ(pipe(down), 0);
  ASSERT_EQ(pipe(up), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    kid_main(o, down[0], up[1]);
    _exit(0);
  }
  close(down[0]);
  close(up[1]);
  kid_t k = {.pid = pid, .cmd = down[1], .rep = up[0]};
  ASSERT_EQ(get_byte_within(k.rep, th_ms(10000)), 'r');
  ASSERT_EQ(read(k.rep, &k.dptr, sizeof k.dptr), (ssize_t)sizeof k.dptr);
  return k;
}

/* Sends a command; its reply within ms, or -1. */
static int kid_ask(kid_t *k, char c, int ms) {
  put_byte(k->cmd, c);
  return get_byte_within(k->rep, ms);
}

static void kid_end(kid_t *k) {
  put_byte(k->cmd, 'q');
  ASSERT_EQ(th_exit_code(th_wait(k->pid, th_ms(10000))), 0);
  close(k->cmd);
  close(k->rep);
}

static void kid_kill(kid_t *k) {
  kill(k->pid, SIGKILL);
  th_wait(k->pid, th_ms(10000));
  close(k->cmd);
  close(k->rep);
}

/* --- Callers that are other processes ------------------------------------- */

typedef struct {
  pid_t pid;
  int rep; /* what it says */
} caller_t;

/* Runs fn(arg, fd) in a forked child that has called cuInit; fn writes
 * progress bytes to fd. */
static caller_t caller_start(void (*fn)(void *, int), void *arg) {
  int up[2];
  ASSERT_EQ(pipe(up), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(up[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    CU_OK(F(cuInit)(0));
    fn(arg, up[1]);
    _exit(0);
  }
  close(up[1]);
  return (caller_t){pid, up[0]};
}

static void caller_kill(caller_t *c) {
  kill(c->pid, SIGKILL);
  th_wait(c->pid, th_ms(10000));
  close(c->rep);
}

/* Runs fn(arg) in a forked child; its exit code (0: every check held). */
static int in_child(void (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    fn(arg);
    fflush(NULL);
    _exit(0);
  }
  return th_exit_code(th_wait(pid, th_ms(20000)));
}

/* --- Lock ----------------------------------------------------------------- */

TEST_IMPL(fakeckpt_lock_blocks_calls) {
  ck_open("16G");
  kid_t k = kid_start(&(kid_opts_t){.bytes = 64 * MIB});
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_RUNNING);
  int tid = 0;
  CU_OK(F(cuCheckpointProcessGetRestoreThreadId)(k.pid, &tid));
  ASSERT_EQ(tid, k.pid); /* its main thread ran cuInit */

  CU_OK(ck_lock(k.pid, 0));
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_LOCKED);
  ASSERT_EQ(fake_state(k.pid), FAKE_CKPT_LOCKED);
  ASSERT_EQ(ck_lock(k.pid, 0), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(ck_restore(k.pid), CUDA_ERROR_ILLEGAL_STATE);

  /* Two threads and the main thread call; none returns, none spins. */
  uint64_t cpu0 = lt_cpu_ticks(k.pid);
  put_byte(k.cmd, 'T');
  put_byte(k.cmd, 'c');
  ASSERT_EQ(get_byte_within(k.rep, 500), -1);
  ASSERT_LE(lt_cpu_ticks(k.pid) - cpu0, 10);
  ASSERT_EQ(used(0), 64 * MIB + 100 * MIB); /* a lock moves nothing */

  CU_OK(ck_unlock(k.pid));
  for (int i = 0; i < 3; i++)
    ASSERT_EQ(get_byte_within(k.rep, th_ms(5000)), 'd');
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_RUNNING);
  ASSERT_EQ(ck_unlock(k.pid), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(kid_ask(&k, 'c', th_ms(5000)), 'd');
  ASSERT_EQ(kid_ask(&k, 'v', th_ms(5000)), 'o');
  kid_end(&k);
  ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), 0);
}

TEST_IMPL(fakeckpt_lock_timeout) {
  ck_open("16G");
  kid_t k = kid_start(&(kid_opts_t){.bytes = 64 * MIB, .kernel_ms = "1500"});
  /* A launch returns at once; the kernel keeps the process busy. */
  int64_t launched = now_ms();
  ASSERT_EQ(kid_ask(&k, 'k', th_ms(5000)), 'd');
  ASSERT_LT(now_ms() - launched, 1000);

  int64_t t0 = now_ms();
  ASSERT_EQ(ck_lock(k.pid, 100), CUDA_ERROR_NOT_READY);
  int64_t took = now_ms() - t0;
  ASSERT_GE(took, 100);
  ASSERT_LT(took, 1200);
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_RUNNING);
  ASSERT_EQ(fake_state(k.pid), FAKE_CKPT_RUNNING);
  ASSERT_EQ(kid_ask(&k, 'c', th_ms(5000)), 'd'); /* its calls go on */

  /* A synchronisation is a call in flight until the kernel is done; an
   * unbounded Lock waits for both. */
  put_byte(k.cmd, 's');
  inflight_becomes(k.pid, 1);
  CU_OK(ck_lock(k.pid, 0));
  ASSERT_GE(now_ms() - launched, 1500);
  ASSERT_EQ(get_byte_within(k.rep, th_ms(5000)), 'd');
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_LOCKED);
  CU_OK(ck_unlock(k.pid));

  /* A Lock bounded long enough succeeds once the work is done. */
  launched = now_ms();
  ASSERT_EQ(kid_ask(&k, 'k', th_ms(5000)), 'd');
  CU_OK(ck_lock(k.pid, (unsigned)th_ms(10000)));
  ASSERT_GE(now_ms() - launched, 1400);
  CU_OK(ck_unlock(k.pid));
  kid_end(&k);

  /* A slow call in flight, no work: Lock waits for the call alone, and
   * times out on it. */
  k = kid_start(&(kid_opts_t){.slow = "cuMemGetInfo_v2:600"});
  put_byte(k.cmd, 'c');
  inflight_becomes(k.pid, 1);
  ASSERT_EQ(ck_lock(k.pid, 50), CUDA_ERROR_NOT_READY);
  t0 = now_ms();
  CU_OK(ck_lock(k.pid, 0));
  ASSERT_GE(now_ms() - t0, 300);
  ASSERT_EQ(get_byte_within(k.rep, th_ms(5000)), 'd');
  put_byte(k.cmd, 'c'); /* the next one waits at entry */
  ASSERT_EQ(get_byte_within(k.rep, 800), -1);
  CU_OK(ck_unlock(k.pid));
  ASSERT_EQ(get_byte_within(k.rep, th_ms(5000)), 'd');
  kid_end(&k);
}

/* --- Checkpoint and restore ----------------------------------------------- */

static bool nvml_lists(unsigned index, pid_t pid) {
  cogpu__gpu_proc_t p[16];
  size_t n = 0;
  ASSERT_OK(cogpu__nvml_processes(index, p, 16, &n));
  for (size_t i = 0; i < n; i++)
    if (p[i].pid == (unsigned)pid)
      return true;
  return false;
}

static void uuid_of(int dev, CUuuid *u) {
  CU_OK(F(cuDeviceGetUuid_v2)(u, dev));
}

TEST_IMPL(fakeckpt_checkpoint_restore) {
  const uint64_t a_bytes = GIB + 100 * MIB, b_bytes = 512 * MIB + 100 * MIB;
  ck_open("16G,16G");
  kid_t a = kid_start(&(kid_opts_t){.dev = 0, .bytes = GIB});
  kid_t b = kid_start(&(kid_opts_t){.dev = 1, .bytes = 512 * MIB});
  ASSERT_UEQ(used(0), a_bytes);
  ASSERT_UEQ(used(1), b_bytes);
  ASSERT(nvml_lists(0, a.pid));

  /* Wrong states, bad arguments, no such process. */
  CUprocessState s;
  ASSERT_EQ(ck_checkpoint(a.pid), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(ck_unlock(a.pid), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(ck_restore(a.pid), CUDA_ERROR_ILLEGAL_STATE);
  CUcheckpointLockArgs la = {.reserved0 = 1};
  ASSERT_EQ(F(cuCheckpointProcessLock)(a.pid, &la), CUDA_ERROR_INVALID_VALUE);
  la = (CUcheckpointLockArgs){.reserved1 = {[6] = 1}};
  ASSERT_EQ(F(cuCheckpointProcessLock)(a.pid, &la), CUDA_ERROR_INVALID_VALUE);
  CUcheckpointCheckpointArgs ca = {.reserved = {[3] = 1}};
  ASSERT_EQ(F(cuCheckpointProcessCheckpoint)(a.pid, &ca),
            CUDA_ERROR_INVALID_VALUE);
  CUcheckpointRestoreArgs ra;
  memset(&ra, 0, sizeof ra);
  ra.gpuPairsCount = 1;
  ASSERT_EQ(F(cuCheckpointProcessRestore)(a.pid, &ra),
            CUDA_ERROR_INVALID_VALUE);
  memset(&ra, 0, sizeof ra);
  ra.reserved1 = 1;
  ASSERT_EQ(F(cuCheckpointProcessRestore)(a.pid, &ra),
            CUDA_ERROR_INVALID_VALUE);
  CUcheckpointUnlockArgs ua = {.reserved = {[7] = 1}};
  ASSERT_EQ(F(cuCheckpointProcessUnlock)(a.pid, &ua), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuCheckpointProcessGetState)(a.pid, NULL),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(F(cuCheckpointProcessGetState)(getppid(), &s),
            CUDA_ERROR_INVALID_VALUE); /* no fake CUDA there */
  ASSERT_EQ(F(cuCheckpointProcessGetState)(0, &s), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(ck_lock(getpid(), 0), CUDA_ERROR_INVALID_VALUE); /* itself */
  ASSERT_EQ(ck_state(getpid()), CU_PROCESS_STATE_RUNNING);
  ASSERT_EQ(fake_state(getppid()), -1);

  /* Checkpoint: the bytes, its context's included, leave the GPU after the
   * modelled copy (10 GB/s: over 110 ms), and NVML's list. */
  CU_OK(ck_lock(a.pid, 0));
  setenv("FAKE_CUDA_CKPT_GBPS", "10", 1);
  int64_t t0 = now_ms();
  CU_OK(ck_checkpoint(a.pid));
  ASSERT_GE(now_ms() - t0, 110);
  ASSERT_EQ(ck_state(a.pid), CU_PROCESS_STATE_CHECKPOINTED);
  ASSERT_UEQ(used(0), 0);
  ASSERT_UEQ(used(1), b_bytes);
  ASSERT_UEQ(F(fake_cuda_ckpt_bytes)(a.pid, 0), a_bytes);
  ASSERT_UEQ(F(fake_cuda_ckpt_bytes)(a.pid, 1), 0);
  ASSERT(!nvml_lists(0, a.pid));
  ASSERT(nvml_lists(1, b.pid));
  ASSERT_EQ(ck_lock(a.pid, 0), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(ck_checkpoint(a.pid), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(ck_unlock(a.pid), CUDA_ERROR_ILLEGAL_STATE);
  /* Its calls wait. */
  put_byte(a.cmd, 'v');
  ASSERT_EQ(get_byte_within(a.rep, 300), -1);

  /* GPU pairs (driver 580): every GPU the process sees named once as old
   * and once as new, each a fake GPU; refused, it stays checkpointed. */
  CUcheckpointGpuPair pairs[2];
  uuid_of(0, &pairs[0].oldUuid);
  uuid_of(1, &pairs[0].newUuid);
  memset(&ra, 0, sizeof ra);
  ra.gpuPairs = pairs;
  ra.gpuPairsCount = 1;
  ASSERT_EQ(F(cuCheckpointProcessRestore)(a.pid, &ra),
            CUDA_ERROR_INVALID_VALUE); /* GPU 1 not named */
  uuid_of(1, &pairs[0].oldUuid);
  ASSERT_EQ(F(cuCheckpointProcessRestore)(a.pid, &ra),
            CUDA_ERROR_INVALID_VALUE); /* GPU 0 missing */
  uuid_of(0, &pairs[0].oldUuid);
  uuid_of(1, &pairs[1].oldUuid);
  uuid_of(1, &pairs[1].newUuid);
  ra.gpuPairsCount = 2;
  ASSERT_EQ(F(cuCheckpointProcessRestore)(a.pid, &ra),
            CUDA_ERROR_INVALID_VALUE); /* GPU 1 named twice as new */
  memset(&pairs[0].oldUuid, 0x5a, sizeof pairs[0].oldUuid);
  ra.gpuPairsCount = 1;
  ASSERT_EQ(F(cuCheckpointProcessRestore)(a.pid, &ra),
            CUDA_ERROR_INVALID_VALUE); /* not a GPU */
  ASSERT_EQ(ck_state(a.pid), CU_PROCESS_STATE_CHECKPOINTED);
  ASSERT_UEQ(used(0), 0);
  ASSERT_UEQ(used(1), b_bytes);

  /* Restore: charged back, data intact at the same addresses. */
  uuid_of(0, &pairs[0].oldUuid);
  uuid_of(0, &pairs[0].newUuid);
  uuid_of(1, &pairs[1].oldUuid);
  uuid_of(1, &pairs[1].newUuid);
  ra.gpuPairsCount = 2;
  t0 = now_ms();
  CU_OK(F(cuCheckpointProcessRestore)(a.pid, &ra));
  ASSERT_GE(now_ms() - t0, 110);
  ASSERT_EQ(ck_state(a.pid), CU_PROCESS_STATE_LOCKED);
  ASSERT_UEQ(used(0), a_bytes);
  ASSERT_UEQ(F(fake_cuda_ckpt_bytes)(a.pid, 0), 0);
  ASSERT(nvml_lists(0, a.pid));
  ASSERT_EQ(get_byte_within(a.rep, 200), -1); /* still locked */
  CU_OK(ck_unlock(a.pid));
  ASSERT_EQ(get_byte_within(a.rep, th_ms(5000)), 'o');
  ASSERT_EQ(kid_ask(&a, 'c', th_ms(5000)), 'd');

  /* Again, without arguments. */
  unsetenv("FAKE_CUDA_CKPT_GBPS");
  CU_OK(F(cuCheckpointProcessLock)(a.pid, NULL));
  CU_OK(ck_checkpoint(a.pid));
  ASSERT_UEQ(used(0), 0);
  CU_OK(F(cuCheckpointProcessRestore)(a.pid, NULL));
  CU_OK(ck_unlock(a.pid));
  ASSERT_EQ(kid_ask(&a, 'v', th_ms(5000)), 'o');
  ASSERT_UEQ(used(0), a_bytes);

  /* Onto the other GPU (GPUs 0 and 1 swapped): its memory is charged
   * there, NVML lists it there, its data is intact at the same addresses,
   * and what it allocates next (on its device 0, as it still sees it) is
   * charged there too. */
  CU_OK(ck_lock(a.pid, 0));
  CU_OK(ck_checkpoint(a.pid));
  uuid_of(0, &pairs[0].oldUuid);
  uuid_of(1, &pairs[0].newUuid);
  uuid_of(1, &pairs[1].oldUuid);
  uuid_of(0, &pairs[1].newUuid);
  ra.gpuPairs = pairs;
  ra.gpuPairsCount = 2;
  CU_OK(F(cuCheckpointProcessRestore)(a.pid, &ra));
  CU_OK(ck_unlock(a.pid));
  ASSERT_UEQ(used(0), 0);
  ASSERT_UEQ(used(1), a_bytes + b_bytes);
  ASSERT(nvml_lists(1, a.pid));
  ASSERT(!nvml_lists(0, a.pid));
  ASSERT_EQ(kid_ask(&a, 'v', th_ms(5000)), 'o');
  ASSERT_EQ(kid_ask(&a, 'A', th_ms(5000)), 'd');
  ASSERT_UEQ(used(0), 0);
  ASSERT_UEQ(used(1), a_bytes + b_bytes + 256 * MIB);
  kid_end(&a);
  kid_end(&b);
  ASSERT_UEQ(used(1), 0); /* all of it left GPU 1 with them */
  ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), 0);
  ASSERT_UEQ(ooms(0), 0);
}

/* Restore onto a GPU mapping, where the driver refuses it (each time
 * CUDA_ERROR_INVALID_VALUE, nothing charged, the process still
 * checkpointed and restorable where it was): a process started with a
 * restricted CUDA_VISIBLE_DEVICES, even for an identity mapping; onto a
 * GPU of another chip (here: another size); a driver before CUDA 13.0,
 * whose struct had no such fields. */
TEST_IMPL(fakeckpt_restore_onto_gpus_refused) {
  const uint64_t a_bytes = GIB + 100 * MIB;
  ck_open("16G,16G,8G");
  kid_t a = kid_start(&(kid_opts_t){.dev = 0, .bytes = GIB, .visible = "0"});
  kid_t b = kid_start(&(kid_opts_t){.dev = 0, .bytes = GIB});
  CUcheckpointGpuPair id[3], swap2[3];
  for (int g = 0; g < 3; g++) {
    uuid_of(g, &id[g].oldUuid);
    uuid_of(g, &id[g].newUuid);
    uuid_of(g, &swap2[g].oldUuid);
    uuid_of(g == 0 ? 2 : g == 2 ? 0 : g, &swap2[g].newUuid);
  }
  CUcheckpointRestoreArgs ra;
  memset(&ra, 0, sizeof ra);
  ra.gpuPairsCount = 3;
  ra.gpuPairs = id;
  CU_OK(ck_lock(a.pid, 0));
  CU_OK(ck_checkpoint(a.pid));
  ASSERT_EQ(F(cuCheckpointProcessRestore)(a.pid, &ra),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(ck_state(a.pid), CU_PROCESS_STATE_CHECKPOINTED);
  CU_OK(ck_restore(a.pid));
  CU_OK(ck_unlock(a.pid));
  ASSERT_EQ(kid_ask(&a, 'v', th_ms(5000)), 'o');
  CU_OK(ck_lock(b.pid, 0));
  CU_OK(ck_checkpoint(b.pid));
  ra.gpuPairs = swap2;
  ASSERT_EQ(F(cuCheckpointProcessRestore)(b.pid, &ra),
            CUDA_ERROR_INVALID_VALUE); /* 16G onto 8G: another chip */
  ra.gpuPairs = id;
  setenv("FAKE_CUDA_DRIVER_VERSION", "12090", 1);
  ASSERT_EQ(F(cuCheckpointProcessRestore)(b.pid, &ra),
            CUDA_ERROR_INVALID_VALUE); /* no such fields before 13.0 */
  unsetenv("FAKE_CUDA_DRIVER_VERSION");
  ASSERT_EQ(ck_state(b.pid), CU_PROCESS_STATE_CHECKPOINTED);
  ASSERT_UEQ(used(2), 0);
  CU_OK(F(cuCheckpointProcessRestore)(b.pid, &ra)); /* identity: fine */
  CU_OK(ck_unlock(b.pid));
  ASSERT_EQ(kid_ask(&b, 'v', th_ms(5000)), 'o');
  ASSERT_UEQ(used(0), 2 * a_bytes);
  kid_end(&a);
  kid_end(&b);
  ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), 0);
}

TEST_IMPL(fakeckpt_restore_without_memory_wedges) {
  ck_open("16G");
  kid_t a = kid_start(&(kid_opts_t){.bytes = 4 * GIB});
  CU_OK(ck_lock(a.pid, 0));
  CU_OK(ck_checkpoint(a.pid));
  ASSERT_UEQ(used(0), 0);
  /* Another process takes the memory: 3.9G left, 4.1G needed. */
  kid_t b = kid_start(&(kid_opts_t){.bytes = 12 * GIB});
  ASSERT_UEQ(used(0), 12 * GIB + 100 * MIB);

  ASSERT_EQ(ck_restore(a.pid), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_UEQ(ooms(0), 1);
  ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), 1);
  ASSERT_EQ(fake_state(a.pid), FAKE_CKPT_FAILED);
  /* Driver 580 still says CHECKPOINTED (NVIDIA/cuda-checkpoint#44). */
  ASSERT_EQ(ck_state(a.pid), CU_PROCESS_STATE_CHECKPOINTED);
  ASSERT_UEQ(used(0), 12 * GIB + 100 * MIB); /* nothing charged */
  ASSERT_UEQ(F(fake_cuda_ckpt_bytes)(a.pid, 0), 4 * GIB + 100 * MIB);

  /* Memory back: too late, for good. */
  kid_kill(&b);
  ASSERT_UEQ(used(0), 0);
  ASSERT_EQ(ck_restore(a.pid), CUDA_ERROR_OPERATING_SYSTEM);
  ASSERT_EQ(ck_unlock(a.pid), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(ck_lock(a.pid, 0), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(ck_checkpoint(a.pid), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(ck_restore(a.pid), CUDA_ERROR_OPERATING_SYSTEM);
  put_byte(a.cmd, 'c');
  ASSERT_EQ(get_byte_within(a.rep, 300), -1); /* its calls never return */
  ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), 1);

  /* Only killing it helps; its host copy goes with it. */
  kid_kill(&a);
  ASSERT_UEQ(used(0), 0);
  ASSERT_EQ(fake_state(a.pid), -1);
  CUprocessState s;
  ASSERT_EQ(F(cuCheckpointProcessGetState)(a.pid, &s),
            CUDA_ERROR_INVALID_VALUE);
}

/* --- Who may, and what is supported --------------------------------------- */

typedef struct {
  pid_t root_kid, nobody_kid;
} perm_t;

static void nobody_caller(void *arg) {
  const perm_t *p = arg;
  CUprocessState s;
  ASSERT_EQ(setgroups(0, NULL), 0);
  ASSERT_EQ(setresgid(NOBODY, NOBODY, NOBODY), 0);
  ASSERT_EQ(setresuid(NOBODY, NOBODY, NOBODY), 0);
  CU_OK(F(cuInit)(0));
  ASSERT_EQ(F(cuCheckpointProcessGetState)(p->root_kid, &s),
            CUDA_ERROR_NOT_PERMITTED);
  ASSERT_EQ(ck_lock(p->root_kid, 0), CUDA_ERROR_NOT_PERMITTED);
  ASSERT_EQ(ck_unlock(p->root_kid), CUDA_ERROR_NOT_PERMITTED);
  /* Its own user's process. */
  CU_OK(ck_lock(p->nobody_kid, 0));
  ASSERT_EQ(ck_state(p->nobody_kid), CU_PROCESS_STATE_LOCKED);
  CU_OK(ck_checkpoint(p->nobody_kid));
  CU_OK(ck_restore(p->nobody_kid));
  CU_OK(ck_unlock(p->nobody_kid));
}

TEST_IMPL(fakeckpt_permission) {
  if (geteuid() != 0)
    SKIP("needs root: runs a caller and a target as another user");
  ck_open("16G");
  kid_t r = kid_start(&(kid_opts_t){.bytes = 64 * MIB});
  kid_t n = kid_start(&(kid_opts_t){.bytes = 64 * MIB, .uid = NOBODY});
  perm_t p = {r.pid, n.pid};
  ASSERT_EQ(in_child(nobody_caller, &p), 0);
  ASSERT_EQ(ck_state(r.pid), CU_PROCESS_STATE_RUNNING);
  /* Root may lock anyone's. */
  CU_OK(ck_lock(n.pid, 0));
  CU_OK(ck_unlock(n.pid));
  ASSERT_EQ(kid_ask(&n, 'v', th_ms(5000)), 'o');
  kid_end(&r);
  kid_end(&n);
}

static void not_initialised(void *arg) {
  pid_t pid = *(pid_t *)arg;
  CUprocessState s;
  /* A forked child has no CUDA state until its own cuInit. */
  ASSERT_EQ(F(cuCheckpointProcessGetState)(pid, &s),
            CUDA_ERROR_NOT_INITIALIZED);
  ASSERT_EQ(ck_lock(pid, 0), CUDA_ERROR_NOT_INITIALIZED);
}

static void injected_faults(void *arg) {
  pid_t pid = *(pid_t *)arg;
  /* Rules are read at a process's first call: set before its cuInit. */
  setenv("FAKE_CUDA_FAIL",
         "cuCheckpointProcessLock:1,cuCheckpointProcessRestore:1", 1);
  CU_OK(F(cuInit)(0));
  ASSERT_EQ(ck_lock(pid, 0), CUDA_ERROR_UNKNOWN);
  ASSERT_EQ(ck_state(pid), CU_PROCESS_STATE_RUNNING); /* no effect */
  CU_OK(ck_lock(pid, 0));
  CU_OK(ck_checkpoint(pid));
  ASSERT_EQ(ck_restore(pid), CUDA_ERROR_UNKNOWN);
  ASSERT_EQ(ck_state(pid), CU_PROCESS_STATE_CHECKPOINTED);
  CU_OK(ck_restore(pid));
  CU_OK(ck_unlock(pid));
}

TEST_IMPL(fakeckpt_unsupported_and_faults) {
  CUprocessState s;
  int tid, v = 0;
  void *pfn = NULL;
  CUdriverProcAddressQueryResult st;
  ck_open("16G");
  kid_t k = kid_start(&(kid_opts_t){.bytes = 64 * MIB});

  /* MIG, or a platform without it: every call says so, and does nothing. */
  setenv("FAKE_CUDA_CHECKPOINT", "unsupported", 1);
  ASSERT_EQ(F(cuCheckpointProcessGetState)(k.pid, &s),
            CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(F(cuCheckpointProcessGetRestoreThreadId)(k.pid, &tid),
            CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(ck_lock(k.pid, 0), CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(ck_checkpoint(k.pid), CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(ck_restore(k.pid), CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(ck_unlock(k.pid), CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(fake_state(k.pid), FAKE_CKPT_RUNNING);
  unsetenv("FAKE_CUDA_CHECKPOINT");

  /* A driver older than 570 has no such entry points. */
  CU_OK(F(cuGetProcAddress_v2)("cuCheckpointProcessLock", &pfn, 13000, 0, &st));
  ASSERT(pfn == sym("cuCheckpointProcessLock"));
  ASSERT_EQ(
      F(cuGetProcAddress_v2)("cuCheckpointProcessLock", &pfn, 12070, 0, &st),
      CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CU_OK(F(cuGetProcAddress_v2)("cuMemExportToShareableHandle", &pfn, 13000, 0,
                               &st));
  setenv("FAKE_CUDA_DRIVER_VERSION", "12040", 1);
  CU_OK(F(cuDriverGetVersion)(&v));
  ASSERT_EQ(v, 12040);
  ASSERT_EQ(
      F(cuGetProcAddress_v2)("cuCheckpointProcessLock", &pfn, 13000, 0, &st),
      CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  ASSERT_EQ(ck_lock(k.pid, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU_OK(F(cuGetProcAddress_v2)("cuMemAlloc", &pfn, 13000, 0, &st));
  ASSERT(pfn == sym("cuMemAlloc_v2"));
  unsetenv("FAKE_CUDA_DRIVER_VERSION");
  CU_OK(F(cuDriverGetVersion)(&v));
  ASSERT_EQ(v, 13000);

  ASSERT_EQ(in_child(not_initialised, &k.pid), 0);
  ASSERT_EQ(in_child(injected_faults, &k.pid), 0);
  ASSERT_EQ(kid_ask(&k, 'v', th_ms(5000)), 'o');
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_RUNNING);
  kid_end(&k);

  const char *name;
  CU_OK(F(cuGetErrorName)(CUDA_ERROR_ILLEGAL_STATE, &name));
  ASSERT_STREQ(name, "CUDA_ERROR_ILLEGAL_STATE");
  CU_OK(F(cuGetErrorName)(CUDA_ERROR_OPERATING_SYSTEM, &name));
  ASSERT_STREQ(name, "CUDA_ERROR_OPERATING_SYSTEM");
}

TEST_IMPL(fakeckpt_unsupported_features) {
  ck_open("16G");
  const char what[3] = {'M', 'I', 'S'};
  const uint64_t extra[3] = {MIB, 0, 2 * MIB}; /* what each call charges */
  kid_t k[3], plain = kid_start(&(kid_opts_t){.bytes = 64 * MIB});
  uint64_t total = 64 * MIB + 100 * MIB;
  for (int i = 0; i < 3; i++) {
    k[i] = kid_start(&(kid_opts_t){.bytes = 64 * MIB});
    ASSERT_EQ(kid_ask(&k[i], what[i], th_ms(5000)), 'd');
    total += 64 * MIB + 100 * MIB + extra[i];
  }
  ASSERT_UEQ(used(0), total);
  /* Managed memory, IPC, shareable handles: the checkpoint fails and the
   * process is left broken, holding its GPU memory. */
  for (int i = 0; i < 3; i++) {
    CU_OK(ck_lock(k[i].pid, 0));
    ASSERT_EQ(ck_checkpoint(k[i].pid), CUDA_ERROR_NOT_SUPPORTED);
    ASSERT_EQ(ck_state(k[i].pid), CU_PROCESS_STATE_FAILED);
    ASSERT_EQ(ck_unlock(k[i].pid), CUDA_ERROR_ILLEGAL_STATE);
    ASSERT_EQ(ck_restore(k[i].pid), CUDA_ERROR_OPERATING_SYSTEM);
    ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), (uint64_t)i + 1);
  }
  ASSERT_UEQ(used(0), total);
  ASSERT(nvml_lists(0, k[0].pid));
  put_byte(k[0].cmd, 'c');
  ASSERT_EQ(get_byte_within(k[0].rep, 300), -1);
  /* Others are not affected. */
  CU_OK(ck_lock(plain.pid, 0));
  CU_OK(ck_checkpoint(plain.pid));
  CU_OK(ck_restore(plain.pid));
  CU_OK(ck_unlock(plain.pid));
  for (int i = 0; i < 3; i++)
    kid_kill(&k[i]);
  ASSERT_UEQ(used(0), 64 * MIB + 100 * MIB);
  kid_end(&plain);
  ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), 3);
}

/* --- Deaths --------------------------------------------------------------- */

typedef struct {
  pid_t pid;
  CUresult r;
} restore_job_t;

static void *restore_thread(void *arg) {
  restore_job_t *j = arg;
  j->r = ck_restore(j->pid);
  return NULL;
}

/* used(0) reaches `want` within a few seconds (dead entries are reclaimed
 * when someone looks). */
static void used_becomes(uint64_t want) {
  for (int t = 0; used(0) != want && t < th_ms(5000); t += 10)
    th_sleep_ms(10);
  ASSERT_UEQ(used(0), want);
}

TEST_IMPL(fakeckpt_killed_target) {
  ck_open("16G");
  kid_t a = kid_start(&(kid_opts_t){.bytes = 2 * GIB});
  kid_t b = kid_start(&(kid_opts_t){.bytes = GIB});
  kid_t c = kid_start(&(kid_opts_t){.bytes = GIB});
  CU_OK(ck_lock(a.pid, 0));
  CU_OK(ck_checkpoint(a.pid));
  CU_OK(ck_lock(b.pid, 0));
  ASSERT_UEQ(used(0), 2 * (GIB + 100 * MIB));
  /* Killed while checkpointed, while locked: only what is on the GPU comes
   * back, once. */
  kid_kill(&a);
  ASSERT_UEQ(used(0), 2 * (GIB + 100 * MIB));
  kid_kill(&b);
  ASSERT_UEQ(used(0), GIB + 100 * MIB);
  ASSERT_EQ(fake_state(a.pid), -1);
  ASSERT_EQ(ck_lock(b.pid, 0), CUDA_ERROR_INVALID_VALUE);

  /* Killed during a restore (1 GB/s: over a second): the restore fails,
   * and what it had charged comes back once the target is reclaimed. */
  CU_OK(ck_lock(c.pid, 0));
  CU_OK(ck_checkpoint(c.pid));
  ASSERT_UEQ(used(0), 0);
  setenv("FAKE_CUDA_CKPT_GBPS", "1", 1);
  restore_job_t j = {c.pid, CUDA_SUCCESS};
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, restore_thread, &j), 0);
  th_sleep_ms(300);
  ASSERT_UEQ(used(0), GIB + 100 * MIB); /* charged from the start */
  kid_kill(&c);
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_EQ(j.r, CUDA_ERROR_INVALID_VALUE);
  used_becomes(0);
  ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), 0);
}

typedef struct {
  pid_t target;
  const char *gbps;
  int op; /* 'l' lock, 'c' checkpoint, 'r' restore */
} ck_job_t;

/* A caller that says 'g' just before its operation and 'd' after, then
 * waits to be killed. */
static void caller_op(void *arg, int out) {
  const ck_job_t *j = arg;
  if (j->gbps)
    setenv("FAKE_CUDA_CKPT_GBPS", j->gbps, 1);
  put_byte(out, 'g');
  if (j->op == 'l')
    CU_OK(ck_lock(j->target, 0));
  else if (j->op == 'c')
    CU_OK(ck_checkpoint(j->target));
  else
    CU_OK(ck_restore(j->target));
  put_byte(out, 'd');
  for (;;)
    pause();
}

TEST_IMPL(fakeckpt_killed_caller) {
  const uint64_t bytes = GIB + 100 * MIB;
  ck_open("16G");
  kid_t k = kid_start(&(kid_opts_t){.bytes = GIB, .kernel_ms = "3000"});

  /* Killed after its Lock: the target stays locked until someone unlocks
   * it (a daemon's restart must). */
  ck_job_t j = {k.pid, NULL, 'l'};
  caller_t c = caller_start(caller_op, &j);
  ASSERT_EQ(get_byte_within(c.rep, th_ms(5000)), 'g');
  ASSERT_EQ(get_byte_within(c.rep, th_ms(5000)), 'd');
  caller_kill(&c);
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_LOCKED);
  put_byte(k.cmd, 'c');
  ASSERT_EQ(get_byte_within(k.rep, 300), -1);
  CU_OK(ck_unlock(k.pid));
  ASSERT_EQ(get_byte_within(k.rep, th_ms(5000)), 'd');

  /* Killed during its Checkpoint (0.5 GB/s: over 2 s): nothing moved, the
   * target stays locked, another caller can go on. */
  CU_OK(ck_lock(k.pid, 0));
  j = (ck_job_t){k.pid, "0.5", 'c'};
  c = caller_start(caller_op, &j);
  ASSERT_EQ(get_byte_within(c.rep, th_ms(5000)), 'g');
  th_sleep_ms(300);
  ASSERT_EQ(ck_checkpoint(k.pid), CUDA_ERROR_ILLEGAL_STATE); /* one at once */
  caller_kill(&c);
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_LOCKED);
  ASSERT_UEQ(used(0), bytes);
  CU_OK(ck_checkpoint(k.pid));
  ASSERT_UEQ(used(0), 0);

  /* Killed during its Restore: the bytes were charged first, so the
   * restore completes, locked. */
  j = (ck_job_t){k.pid, "0.5", 'r'};
  c = caller_start(caller_op, &j);
  ASSERT_EQ(get_byte_within(c.rep, th_ms(5000)), 'g');
  th_sleep_ms(300);
  caller_kill(&c);
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_LOCKED);
  ASSERT_UEQ(used(0), bytes);
  ASSERT_UEQ(F(fake_cuda_ckpt_bytes)(k.pid, 0), 0);
  CU_OK(ck_unlock(k.pid));
  ASSERT_EQ(kid_ask(&k, 'v', th_ms(5000)), 'o');

  /* Killed while its Lock waits for a kernel: the target is not left
   * locked; its calls go on. */
  ASSERT_EQ(kid_ask(&k, 'k', th_ms(5000)), 'd');
  j = (ck_job_t){k.pid, NULL, 'l'};
  c = caller_start(caller_op, &j);
  ASSERT_EQ(get_byte_within(c.rep, th_ms(5000)), 'g');
  th_sleep_ms(300);
  ASSERT_EQ(fake_state(k.pid), FAKE_CKPT_LOCKING);
  ASSERT_EQ(ck_state(k.pid), CU_PROCESS_STATE_RUNNING);
  put_byte(k.cmd, 'c');
  ASSERT_EQ(get_byte_within(k.rep, 200), -1); /* waits while it is locking */
  caller_kill(&c);
  ASSERT_EQ(get_byte_within(k.rep, th_ms(5000)), 'd');
  ASSERT_EQ(fake_state(k.pid), FAKE_CKPT_RUNNING);
  kid_end(&k);
  ASSERT_UEQ(F(fake_cuda_ckpt_wedged)(), 0);
}

/* --- NVML: per-process utilisation ---------------------------------------- */

/* nvml.h's nvmlProcessUtilizationSample_t. */
typedef struct {
  unsigned int pid;
  unsigned long long timeStamp;
  unsigned int smUtil, memUtil, encUtil, decUtil;
} util_sample_t;

typedef int (*util_fn)(void *, util_sample_t *, unsigned *, unsigned long long);

static unsigned long long now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (unsigned long long)ts.tv_sec * 1000000ull +
         (unsigned long long)ts.tv_nsec / 1000;
}

enum { NVML_OK = 0, NVML_UNKNOWN = 999, NVML_NOT_FOUND = 6, NVML_SIZE = 7 };

TEST_IMPL(fakeckpt_process_utilization) {
  ck_open("16G,16G");
  kid_t busy = kid_start(&(kid_opts_t){.dev = 0, .kernel_ms = "400"});
  kid_t idle = kid_start(&(kid_opts_t){.dev = 0, .bytes = 64 * MIB});
  kid_t quick = kid_start(&(kid_opts_t){.dev = 1});
  void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT(nv);
  int (*init)(void) = (int (*)(void))dlsym(nv, "nvmlInit_v2");
  int (*handle)(unsigned, void **) =
      (int (*)(unsigned, void **))dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
  util_fn util = (util_fn)dlsym(nv, "nvmlDeviceGetProcessUtilization");
  ASSERT(init && handle && util);
  ASSERT_EQ(init(), NVML_OK);
  void *d0, *d1;
  ASSERT_EQ(handle(0, &d0), NVML_OK);
  ASSERT_EQ(handle(1, &d1), NVML_OK);
  ASSERT_EQ(sizeof(util_sample_t), 32);

  unsigned n = 0;
  util_sample_t s[4];
  ASSERT_EQ(util(d0, NULL, &n, 0), NVML_NOT_FOUND); /* no work yet */
  unsigned long long t0 = now_us();
  ASSERT_EQ(kid_ask(&busy, 'k', th_ms(5000)), 'd');
  ASSERT_EQ(kid_ask(&quick, 'k', th_ms(5000)), 'd'); /* an instant kernel */

  /* The size query, then the samples: only the process with work. */
  n = 0;
  ASSERT_EQ(util(d0, NULL, &n, 0), NVML_SIZE);
  ASSERT_EQ(n, 1);
  n = 0;
  ASSERT_EQ(util(d0, s, &n, 0), NVML_SIZE);
  ASSERT_EQ(n, 1);
  n = 4;
  ASSERT_EQ(util(d0, s, &n, 0), NVML_OK);
  ASSERT_EQ(n, 1);
  ASSERT_EQ(s[0].pid, (unsigned)busy.pid);
  ASSERT_GT(s[0].smUtil, 0);
  ASSERT_LE(s[0].smUtil, 100);
  ASSERT_UEQ(s[0].encUtil, 0);
  ASSERT(s[0].timeStamp >= t0 && s[0].timeStamp <= now_us());
  n = 4;
  ASSERT_EQ(util(d1, s, &n, t0), NVML_OK);
  ASSERT_EQ(n, 1);
  ASSERT_EQ(s[0].pid, (unsigned)quick.pid);
  ASSERT_GE(s[0].smUtil, 1);
  /* Nothing after the end of the work. */
  n = 4;
  ASSERT_EQ(util(d1, s, &n, now_us()), NVML_NOT_FOUND);
  n = 4;
  ASSERT_EQ(util(d0, s, &n, now_us() + 2000000), NVML_NOT_FOUND);
  th_sleep_ms(500); /* the kernel is done */
  unsigned long long after = now_us();
  n = 4;
  ASSERT_EQ(util(d0, s, &n, after), NVML_NOT_FOUND);
  n = 4;
  ASSERT_EQ(util(d0, s, &n, t0), NVML_OK);
  ASSERT_EQ(n, 1);
  ASSERT(s[0].timeStamp < after); /* when its work ended */

  th_setenv("FAKE_NVML_FAIL", "util");
  ASSERT_EQ(util(d0, s, &n, 0), NVML_UNKNOWN);
  th_setenv("FAKE_NVML_FAIL", NULL);
  kid_end(&busy);
  kid_end(&idle);
  kid_end(&quick);
}
