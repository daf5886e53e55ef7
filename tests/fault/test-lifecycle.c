/*
 * test-lifecycle.c: lifecycle edges of the ledger (issue 11): a waiter
 * whose job ends, a queue entry reused under a sleeper, grants racing the
 * exit destructor, derived counters gone wrong, a deleted state file, a
 * stopped lock holder and sweeps that keep system calls out of the lock. After
 * each, the ledger must be consistent and usable.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/api.h"
#include "internal.h"
#include "ledger-helpers.h"
#include "ledger/ledger-int.h"

static cogpu_request_t req(int gpu, uint64_t bytes, int64_t timeout_ms) {
  return (cogpu_request_t){.gpu = gpu,
                           .bytes = bytes,
                           .priority = COGPU_PRIORITY_DEFAULT,
                           .timeout_ms = timeout_ms};
}

typedef struct waiting_s {
  cogpu_t *h;
  cogpu_request_t r;
  _Atomic int rc; /* 1 while the request is out; read by the test */
  int gpu;
  pthread_t t;
} waiting_t;

static void *waiting_run(void *arg) {
  waiting_t *w = arg;
  w->rc = cogpu_reserve(w->h, &w->r, &w->gpu);
  return NULL;
}

static void waiting_start(waiting_t *w, cogpu_t *h, cogpu_request_t r) {
  w->h = h;
  w->r = r;
  w->rc = 1;
  ASSERT_EQ(pthread_create(&w->t, NULL, waiting_run, w), 0);
}

/* A second process of job's job (it joins with the job's token). */
static cogpu_t *attach_member(cogpu_t *job) {
  char tok[32];
  ASSERT_OK(cogpu_job_token(job, tok, sizeof tok));
  cogpu_attach_opts_t m = {.join = tok, .command = "member"};
  cogpu_t *member;
  ASSERT_OK(cogpu_attach(&m, &member));
  return member;
}

/* Item 1: a process of a job waits to grow when the job's own process
 * leaves. Its request waits on, for its own slot; what it claimed of the
 * job stays counted, as its own; it is served when memory frees, and what
 * it gives back of its former claims leaves its own reservation. */
TEST_IMPL(lifecycle_member_waits_after_its_job_ends) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_SWEEP_INTERVAL", "100ms");
  cogpu_attach_opts_t o = {.command = "job"};
  cogpu_t *job, *member, *other;
  ASSERT_OK(cogpu_attach(&o, &job));
  cogpu_request_t r = req(0, 4 * GiB, 0);
  ASSERT_OK(cogpu_reserve(job, &r, NULL));
  cogpu_attach_opts_t oo = {.command = "other"};
  ASSERT_OK(cogpu_attach(&oo, &other));
  r = req(0, 12 * GiB, 0);
  ASSERT_OK(cogpu_reserve(other, &r, NULL));
  member = attach_member(job);
  uint64_t got;
  ASSERT_OK(cogpu__claim(member, 0, 3 * GiB, &got));
  ASSERT_UEQ(got, 3 * GiB);
  waiting_t w;
  waiting_start(&w, member, req(0, 2 * GiB, COGPU_WAIT_FOREVER));
  lt_wait_nwaiting(0, 1, 5000);
  ASSERT_OK(cogpu_detach(job));
  /* The member's 3G stay counted, as its own; its request still waits. */
  th_sleep_ms(300);
  ASSERT_EQ(w.rc, 1);
  ASSERT_EQ(lt_nwaiting(0), 1);
  ASSERT_UEQ(lt_reserved_by(0, "member"), 3 * GiB);
  lt_check_invariants();
  ASSERT_OK(cogpu_release(other, 0, 12 * GiB));
  ASSERT_EQ(pthread_join(w.t, NULL), 0);
  ASSERT_OK(w.rc);
  ASSERT_UEQ(lt_reserved_by(0, "member"), 5 * GiB);
  /* Its former claims are its own now: given back, they leave it. */
  ASSERT_OK(cogpu__unclaim(member, 0, 3 * GiB));
  ASSERT_UEQ(lt_reserved_by(0, "member"), 2 * GiB);
  ASSERT_OK(cogpu_release(member, 0, COGPU_ALL));
  lt_check_invariants();
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  cogpu_status_free(st);
  cogpu_detach(member);
  cogpu_detach(other);
}

/* Item 1: a sleeper's queue entry is dropped under it (a repair, a
 * reclaim) and the same index is taken by another request. The sleeper
 * notices (the entry's ticket is not its own) and leaves with -ECANCELED;
 * it never takes, nor on its timeout cancels, the other request. */
TEST_IMPL_SINGLE(lifecycle_waiter_identity) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_SWEEP_INTERVAL", "100ms");
  cogpu_t *holder = lt_attach(0), *a = lt_attach(0), *b = lt_attach(0);
  cogpu_request_t r = req(0, 16 * GiB, 0);
  ASSERT_OK(cogpu_reserve(holder, &r, NULL));
  waiting_t wa, wb;
  waiting_start(&wa, a, req(0, GiB, 2000));
  lt_wait_nwaiting(0, 1, 5000);
  /* Drop a's entry, as a repair would, then b's request takes its index. */
  struct cogpu_s *lh = cogpu__ledger_of(holder);
  ledger_state_t *st = lh->st;
  cogpu__ledger_lock(lh);
  uint32_t idx = LEDGER_MAX_WAITERS;
  for (uint32_t w = 0; w < LEDGER_MAX_WAITERS; w++)
    if (st->waiters[w].state == W_WAITING)
      idx = w;
  ASSERT(idx < LEDGER_MAX_WAITERS);
  st->waiters[idx].state = W_FREE;
  st->hdr.nwaiting--;
  cogpu__ledger_unlock(lh);
  waiting_start(&wb, b, req(0, 2 * GiB, COGPU_WAIT_FOREVER));
  lt_wait_nwaiting(0, 1, 5000);
  ASSERT_EQ(st->waiters[idx].owner, cogpu__ledger_of(b)->slot);
  ASSERT_EQ(pthread_join(wa.t, NULL), 0);
  ASSERT_EQ(wa.rc, -ECANCELED);
  /* b's request is untouched, and served when memory frees. */
  ASSERT_EQ(lt_nwaiting(0), 1);
  ASSERT_OK(cogpu_release(holder, 0, 4 * GiB));
  ASSERT_EQ(pthread_join(wb.t, NULL), 0);
  ASSERT_OK(wb.rc);
  cogpu_status_t *s = lt_status();
  ASSERT_UEQ(s->gpus[0].reserved_bytes, 14 * GiB);
  cogpu_status_free(s);
  lt_check_invariants();
  cogpu_detach(a);
  cogpu_detach(b);
  cogpu_detach(holder);
}

/* Item 2: threads reserving while main returns. The exit destructor
 * detaches the handle; a thread that reserves after that is refused, and
 * nothing is ever granted into the freed slot. */
static void *exit_race_worker(void *arg) {
  cogpu_t *h = arg;
  for (;;) {
    cogpu_request_t r = req(0, GiB, COGPU_NOWAIT);
    int gpu;
    if (cogpu_reserve(h, &r, &gpu) == 0) {
      usleep(200);
      cogpu_release(h, gpu, COGPU_ALL);
    }
  }
  return NULL;
}

HELPER_IMPL(exit_race) {
  (void)argc;
  (void)argv;
  cogpu_t *h;
  if (cogpu_attach(NULL, &h) != 0)
    return 2;
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, exit_race_worker, h);
  th_sleep_ms(5 + rand() % 10);
  return 0; /* exit() runs the destructor while the workers reserve */
}

TEST_IMPL_T(lifecycle_grant_races_exit, 120) {
  for (int i = 0; i < 50; i++) {
    int st = th_wait(th_spawn_helper("exit_race", NULL), th_ms(10000));
    ASSERT(WIFEXITED(st) || WIFSIGNALED(st));
  }
  cogpu_status_t *s = lt_status();
  ASSERT_UEQ(s->gpus[0].reserved_bytes, 0);
  ASSERT_EQ(s->gpus[0].nclients, 0);
  cogpu_status_free(s);
  cogpu_t *h = lt_attach(0);
  s = lt_status();
  cogpu_request_t r = req(0, s->gpus[0].capacity_bytes, 0);
  cogpu_status_free(s);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  cogpu_detach(h);
}

/* Item 9: derived counters written wrong in the state file (a bug, a
 * process that scribbled on it) do not keep an idle node at "0 B free":
 * the request that does not fit finds that the figures do not add up,
 * recounts them from the slots and is granted. */
TEST_IMPL_SINGLE(lifecycle_wrong_counters_recounted) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_MAX_CLIENTS", "2");
  cogpu_t *h = lt_attach(0);
  struct cogpu_s *lh = cogpu__ledger_of(h);
  ledger_state_t *st = lh->st;
  cogpu__ledger_lock(lh);
  st->hdr.gpus[0].reserved = 16 * GiB;
  st->hdr.gpus[0].nclients = 2;
  st->hdr.nwaiting = 3;
  cogpu__ledger_unlock(lh);
  cogpu_request_t r = req(0, 16 * GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  ASSERT_UEQ(st->hdr.gpus[0].reserved, 16 * GiB);
  ASSERT_UEQ(st->hdr.gpus[0].nclients, 1);
  ASSERT_UEQ(st->hdr.nwaiting, 0);
  ASSERT_OK(cogpu_release(h, 0, COGPU_ALL));
  /* A job's lent counter gone wrong: its member could claim nothing. */
  cogpu_attach_opts_t o = {.command = "job"};
  cogpu_t *job, *member;
  ASSERT_OK(cogpu_attach(&o, &job));
  r = req(0, 4 * GiB, 0);
  ASSERT_OK(cogpu_reserve(job, &r, NULL));
  member = attach_member(job);
  cogpu__ledger_lock(lh);
  st->slots[cogpu__ledger_of(job)->slot].lent[0] = 4 * GiB;
  cogpu__ledger_unlock(lh);
  /* Wrong: the member cannot claim, and growing does not fit either (the
   * node is full), so the request is checked and the job recounted. */
  r = req(0, 12 * GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  r = req(0, 1 * GiB, 0);
  ASSERT_EQ(cogpu_reserve(member, &r, NULL), -EAGAIN);
  uint64_t got;
  ASSERT_OK(cogpu__claim(member, 0, 4 * GiB, &got));
  ASSERT_UEQ(got, 4 * GiB);
  lt_check_invariants();
  cogpu_detach(member);
  cogpu_detach(job);
  cogpu_detach(h);
}

/* Item 7: the deadlock guard counts a job as waiting only when all of its
 * processes wait. Here one process of a job waits while another runs (and
 * then releases), and another job waits too: nobody is refused, and the
 * release serves the waiting process. */
TEST_IMPL(lifecycle_guard_waits_for_all_members) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_SWEEP_INTERVAL", "100ms");
  cogpu_attach_opts_t o = {.command = "job"};
  cogpu_t *job, *a, *b, *other;
  ASSERT_OK(cogpu_attach(&o, &job));
  cogpu_request_t r = req(0, 8 * GiB, 0);
  ASSERT_OK(cogpu_reserve(job, &r, NULL));
  cogpu_attach_opts_t oo = {.command = "other"};
  ASSERT_OK(cogpu_attach(&oo, &other));
  ASSERT_OK(cogpu_reserve(other, &r, NULL));
  char tok[32];
  ASSERT_OK(cogpu_job_token(job, tok, sizeof tok));
  cogpu_attach_opts_t m = {.join = tok, .command = "member"};
  ASSERT_OK(cogpu_attach(&m, &a));
  ASSERT_OK(cogpu_attach(&m, &b));
  uint64_t got;
  ASSERT_OK(cogpu__claim(a, 0, 4 * GiB, &got));
  ASSERT_OK(cogpu__claim(b, 0, 4 * GiB, &got));
  waiting_t wa, wo;
  waiting_start(&wa, a, req(0, 4 * GiB, COGPU_WAIT_FOREVER));
  lt_wait_nwaiting(0, 1, 5000);
  waiting_start(&wo, other, req(0, 4 * GiB, 2000));
  lt_wait_nwaiting(0, 2, 5000);
  /* Several housekeeping ticks: b runs, so the job does not wait. */
  th_sleep_ms(600);
  ASSERT_EQ(wa.rc, 1);
  ASSERT_EQ(wo.rc, 1);
  ASSERT_OK(cogpu_release(b, 0, 4 * GiB));
  ASSERT_EQ(pthread_join(wa.t, NULL), 0);
  ASSERT_OK(wa.rc);
  ASSERT_EQ(pthread_join(wo.t, NULL), 0);
  ASSERT_EQ(wo.rc, -ETIMEDOUT);
  lt_check_invariants();
  cogpu_detach(a);
  cogpu_detach(b);
  cogpu_detach(other);
  cogpu_detach(job);
}

/* A holder that runs but is slow to let go (a loaded machine: 7 s busy
 * holding the lock) is waited for, not taken for a stopped one: the bound
 * failed jobs that were only slow to be served (issue 26's loaded runs,
 * "alive but does not run (stopped?)"). */
TEST_IMPL_SINGLE_T(lifecycle_busy_lock_holder_waited_for, 90) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  setenv("COGPU_FAULT", "lock_held:1:busy", 1);
  pid_t p = lt_hold("busy", 0, GiB, 0, 0, 0);
  unsetenv("COGPU_FAULT");
  /* Its first pass of the lock spins for 7 s: a fifth of a second of CPU
   * time says it is in there (it uses next to none otherwise). */
  for (int t = 0; lt_cpu_ticks(p) < 20; t += 10) {
    if (t > th_ms(20000))
      th_fail(__FILE__, __LINE__, "the holder never spun in the lock");
    th_sleep_ms(10);
  }
  cogpu_request_t r = req(0, GiB, COGPU_NOWAIT);
  uint64_t t0 = cogpu__now_ns();
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), 0);
  fprintf(stderr, "# waited %llu ms, holder used %llu ticks\n",
          (unsigned long long)((cogpu__now_ns() - t0) / 1000000),
          (unsigned long long)lt_cpu_ticks(p));
  ASSERT_EQ(cogpu_release(h, 0, GiB), 0);
  kill(p, SIGTERM);
  th_wait(p, th_ms(20000));
  cogpu_detach(h);
}

/* Item 3: a lock holder stopped (SIGSTOP, Ctrl-Z, a cgroup freezer) does
 * not stall the node's users for ever: a reservation and `cogpu status`
 * give up after a bound, with a message naming the holder; once it runs
 * again, all is well. */
TEST_IMPL_SINGLE_T(lifecycle_stopped_lock_holder, 90) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  /* Stopped inside its 2 s stall, holding the lock: seen, not hoped for
   * (a fixed 500 ms wait missed the stall on a loaded machine). A holder
   * stopped outside it is let go and another one started. */
  pid_t p = -1;
  for (int tries = 0;; tries++) {
    if (tries == 8)
      th_fail(__FILE__, __LINE__, "no holder was stopped inside its stall");
    setenv("COGPU_FAULT", "lock_held:1:stall", 1);
    p = lt_hold("stopped", 0, GiB, 0, 0, 0);
    unsetenv("COGPU_FAULT");
    for (int t = 0; !lt_in_sleep_call(p) && lt_proc_state(p) != 'Z'; t += 5) {
      if (t > th_ms(20000))
        th_fail(__FILE__, __LINE__, "the holder never stalled");
      th_sleep_ms(5);
    }
    ASSERT_EQ(kill(p, SIGSTOP), 0);
    for (int t = 0; lt_proc_state(p) != 'T' && lt_proc_state(p) != 'Z';
         t += 5) {
      if (t > th_ms(20000))
        th_fail(__FILE__, __LINE__, "the holder never stopped");
      th_sleep_ms(5);
    }
    /* Stopped, asleep in the stall, and the lock taken (by it: the test's
     * own handle holds nothing). */
    if (lt_proc_state(p) == 'T' && lt_in_sleep_call(p) &&
        atomic_load(&cogpu__ledger_of(h)->st->hdr.lock) != 0)
      break;
    kill(p, SIGCONT);
    th_wait(p, th_ms(20000));
  }
  char pid[32];
  snprintf(pid, sizeof pid, "pid %d", (int)p);
  cogpu_request_t r = req(0, GiB, COGPU_NOWAIT);
  uint64_t t0 = cogpu__now_ns();
  ASSERT_EQ(cogpu_reserve(h, &r, NULL), -EBUSY);
  ASSERT_CONTAINS(cogpu_last_error(), pid);
  ASSERT_LT((cogpu__now_ns() - t0) / 1000000, th_ms(8000));
  char cli[4096], out[4096], err[4096];
  snprintf(cli, sizeof cli, "%s/cogpu", th_build_dir());
  const char *argv[] = {cli, "status", NULL};
  ASSERT_NE(th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(15000)),
            0);
  ASSERT_CONTAINS(err, pid);
  ASSERT_EQ(kill(p, SIGCONT), 0);
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), HOLD_OK);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  lt_check_invariants();
  cogpu_detach(h);
}

/* Item 3: a sweep probes liveness (a system call per client) without the
 * ledger lock, then re-validates what it found by generation under it. 12
 * clients killed at once are all reclaimed by the next status, and no
 * probe was made while the lock was held. */
TEST_IMPL_SINGLE(lifecycle_sweep_probes_outside_lock) {
  th_setenv("COGPU_MARGIN", "0");
  enum { N = 12 };
  pid_t p[N];
  for (int i = 0; i < N; i++)
    p[i] = lt_hold("swept", 0, GiB, 0, 0, -1);
  lt_wait_nclients(0, N, 5000);
  cogpu_t *h = lt_attach(0); /* a live client the sweep must keep */
  cogpu_request_t r = req(0, GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  for (int i = 0; i < N; i++) {
    kill(p[i], SIGKILL);
    th_wait(p[i], th_ms(5000));
  }
  atomic_store(&cogpu__ledger_probes_locked, 0);
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(h, &st));
  ASSERT_UEQ(st->gpus[0].nclients, 1);
  ASSERT_UEQ(st->gpus[0].reserved_bytes, GiB);
  cogpu_status_free(st);
  ASSERT_UEQ(atomic_load(&cogpu__ledger_probes_locked), 0);
  lt_check_invariants();
  cogpu_detach(h);
}

static void remove_state_dir(void) {
  /* What systemd-logind's RemoveIPC=yes does at the end of the user's last
   * session: every file and directory of the user in /dev/shm goes. */
  const char *dir = getenv("COGPU_STATE_DIR");
  ASSERT(dir && *dir);
  /* rm itself, not through a shell: a TSan runtime preloaded into dash
   * faults. */
  const char *argv[] = {"rm", "-rf", dir, NULL};
  const char *env[] = {"LD_PRELOAD=", NULL};
  char out[256], err[1024];
  ASSERT_EQ(th_run(argv, env, out, sizeof out, err, sizeof err, th_ms(10000)),
            0);
}

/* Item 4: the state is deleted under an attached process. At its next
 * status (or slow request, or tick) it re-publishes the still-mapped file
 * by reference, and a newcomer shares it instead of booking the GPUs in a
 * second ledger. */
TEST_IMPL_SINGLE(lifecycle_deleted_state_republished) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = req(0, 4 * GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  remove_state_dir();
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(h, &st)); /* notices, re-publishes */
  cogpu_status_free(st);
  pid_t p = lt_hold("newcomer", 0, GiB, 0, 0, -1);
  lt_wait_nclients(0, 2, 5000);
  ASSERT_UEQ(lt_reserved_by(0, "newcomer"), GiB);
  ASSERT_OK(cogpu_status(h, &st));
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 5 * GiB);
  cogpu_status_free(st);
  lt_check_invariants();
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  cogpu_detach(h);
}

/* Item 4: a newcomer came before anyone noticed: two states exist; the
 * attached process says so and does not re-publish its own. */
TEST_IMPL_SINGLE(lifecycle_deleted_state_replaced) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_request_t r = req(0, 4 * GiB, 0);
  ASSERT_OK(cogpu_reserve(h, &r, NULL));
  remove_state_dir();
  cogpu_t *n = lt_attach(0); /* a new state */
  cogpu_status_t *st;
  ASSERT_OK(cogpu_status(h, &st));
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 4 * GiB);
  cogpu_status_free(st);
  char ref[1024];
  snprintf(ref, sizeof ref, "%s/state.unlinked", getenv("COGPU_STATE_DIR"));
  ASSERT_NE(access(ref, F_OK), 0);
  ASSERT_OK(cogpu_status(n, &st));
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 0);
  cogpu_status_free(st);
  cogpu_detach(n);
  cogpu_detach(h);
}
