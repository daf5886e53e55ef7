/*
 * ledger-helpers.h: shared pieces of the ledger tests: attaching, status
 * queries, invariant checks and the `hold` helper process (reserve, hold,
 * release) used by the multi-process and fault tests.
 */
#ifndef COGPU_LEDGER_HELPERS_H
#define COGPU_LEDGER_HELPERS_H

#include "task.h"

#define GiB (1024ull * 1024 * 1024)
#define MiB (1024ull * 1024)

/* Exit codes of the hold helper. */
#define HOLD_OK 0
#define HOLD_TIMEDOUT 10
#define HOLD_AGAIN 11
#define HOLD_OTHER 12

cogpu_t *lt_attach(int priority);
cogpu_status_t *lt_status(void);
/* Waiters listed on GPU g. */
size_t lt_nwaiting(int g);
/* Wait (bounded) until GPU g lists exactly n waiters. */
void lt_wait_nwaiting(int g, size_t n, int timeout_ms);
/* Wait (bounded) until GPU g lists n clients. */
void lt_wait_nclients(int g, size_t n, int timeout_ms);
/* Waits (bounded) until n clients of GPU g each hold at least `bytes`,
 * then creates the file `go`: jobs wait for it (cudaprog's waitfile)
 * before they grow further, so that they hold and then grow at once
 * however slowly a loaded machine starts them (a fixed hold let one
 * finish growing before the other began, and growth in order lets the
 * younger wait while the older grows). */
void lt_go_when_held(int g, size_t n, uint64_t bytes, const char *go);
/* Bytes reserved on GPU g by the client whose command is `cmd`, or 0. */
uint64_t lt_reserved_by(int g, const char *cmd);
/* Every GPU: the clients' reservations add up to reserved_bytes, which is
 * at most the capacity. */
void lt_check_invariants(void);
/* Peak device memory and out-of-memory errors of GPU 0 of the fake CUDA
 * driver (tests/fakes/cuda), across the processes sharing its state. */
void lt_fake_cuda_stats(unsigned long long *peak, unsigned long long *ooms);
/* What the fake driver has handed out on GPU 0 now. */
unsigned long long lt_fake_cuda_used(void);
/* What the fake driver has handed out on GPU g (NVML index) now. */
unsigned long long lt_fake_gpu_used(int g);
/* Sets the fake GPUs' peaks to their use now. */
void lt_fake_reset_peak(void);
/* Processes the fake driver left wedged by a checkpoint or restore it could
 * not do (a restore without room, a checkpoint of managed memory). */
unsigned long long lt_fake_wedged(void);

/* Jobs as real users run them (issue 26): an unprivileged user of the
 * node made for this test (`cogpu-tPID-N`, N = 1 or 2: the job's user and
 * another user), removed when the test process exits (and, if a killed
 * test left one, by a later test). Needs root; *uid and *gid are set. */
void lt_test_user(int n, unsigned *uid, unsigned *gid);
/* argv to run `argv` as test user n (setpriv), in buf of room for max
 * pointers; argv itself when not root (the test runs as its own user). The
 * test's files must be reachable: its tmpdir is made 0711. */
const char *const *lt_as_user(int n, const char *const *argv, const char **buf,
                              size_t max);
/* For helpers (re-executed test binaries) and forked children that are to
 * run as test user n: "UID:GID" to hand them, for lt_become ("-" when the
 * test does not run as root: they run as its own user). */
const char *lt_user_ids(int n);
/* Becomes the user `ids` names (lt_user_ids; nothing for "-"): no
 * supplementary groups, then gid, then uid. Exits 120 if it cannot. */
void lt_become(const char *ids);
/* A directory of the test's where its users may write (their "ready"
 * files): th_tmpdir()/users, mode 1777; the tmpdir itself is made 0711. */
const char *lt_user_dir(void);

/* Start a hold helper: attaches with command `name` and `prio`, reserves
 * `bytes` on `gpu` (-1 auto; bytes 0 = exclusive) waiting at most
 * timeout_ms (-1 forever), holds for hold_ms (-1: until killed), releases,
 * and exits with a HOLD_* code. */
pid_t lt_hold(const char *name, int gpu, uint64_t bytes, int prio,
              int64_t timeout_ms, int hold_ms);

/* fork(), as PID `pid` (root): 0 in the child, pid in the parent, -1 if
 * that PID could not be had. The child must only exec or _exit (clone3's
 * child runs no fork handlers). */
pid_t lt_fork_as_pid(pid_t pid);

/* The path of tests/cudaprog in the build directory. */
const char *lt_cudaprog(void);
/* Starts argv (NULL-ended, argv[0] from PATH) with stdout and stderr in
 * th_path(tag). */
pid_t lt_spawn_logged(const char *tag, const char *const argv[]);
/* What th_path(tag) holds (the first 64 KiB; a static buffer). */
char *lt_slurp(const char *tag);

/* CPU time (user + system, clock ticks) process pid has used. */
uint64_t lt_cpu_ticks(pid_t pid);
/* pid's state letter in /proc/PID/stat (R, S, T...), 0 when it is gone. */
char lt_proc_state(pid_t pid);
/* Is pid (stopped or sleeping) inside nanosleep or clock_nanosleep
 * (/proc/PID/syscall: a process of ours)? A fault point's stall is. */
bool lt_in_sleep_call(pid_t pid);
/* How many descriptors process pid has open. */
int lt_fd_count(pid_t pid);

#endif
