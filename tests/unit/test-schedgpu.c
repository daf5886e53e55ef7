/*
 * test-schedgpu.c: the schedGPU compatibility API and its return codes.
 */
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ledger-helpers.h"
#include "schedgpu.h"

TEST_IMPL(schedgpu_codes) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("FAKE_NVML_GPUS", "8G,16G");
  ASSERT_EQ(schedGPUInit(-1, 0), 1);
  ASSERT_EQ(schedGPUInit(1, 0), 0);
  int dev = -1;
  ASSERT_EQ(preCudaMalloc(&dev, 10 * GiB, true), 0);
  ASSERT_EQ(dev, 1); /* picked and written back */
  dev = 1;
  ASSERT_EQ(preCudaMalloc(&dev, 8 * GiB, false), 600);
  /* Another job holds 4G and does not wait: this wait is not a deadlock
   * (which the guard would fail, or the daemon break, before 1 s). */
  pid_t other = lt_hold("other", 1, 4 * GiB, 0, 0, -1);
  lt_wait_nclients(1, 2, 5000);
  uint64_t t0 = (uint64_t)time(NULL);
  ASSERT_EQ(preCudaMalloc(&dev, 8 * GiB, true), 2); /* 1 s timeout */
  ASSERT_LE((uint64_t)time(NULL) - t0, 3);
  kill(other, SIGKILL);
  th_wait(other, th_ms(5000));
  ASSERT_EQ(preCudaMalloc(&dev, 17 * GiB, true), 2); /* larger than GPU */
  dev = 7;
  ASSERT_EQ(preCudaMalloc(&dev, 1, true), 101);
  ASSERT_EQ(preCudaMalloc(NULL, 1, true), 1);
  dev = 0;
  ASSERT_EQ(preCudaMalloc(&dev, 0, true), 1);
  ASSERT_EQ(postCudaFree(1, 11 * GiB), 1); /* more than reserved */
  ASSERT_EQ(postCudaFree(9, 1), 101);
  ASSERT_EQ(postCudaFree(1, 10 * GiB), 0);
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[1].reserved_bytes, 0);
  cogpu_status_free(st);
}

TEST_IMPL(schedgpu_implicit_init) {
  int dev = 0;
  ASSERT_EQ(preCudaMalloc(&dev, 1 * GiB, false), 0);
  cogpu_status_t *st = lt_status();
  ASSERT_UEQ(st->gpus[0].reserved_bytes, 1 * GiB);
  cogpu_status_free(st);
  ASSERT_EQ(postCudaFree(0, 1 * GiB), 0);
}

TEST_IMPL(schedgpu_init_failure) {
  th_setenv("FAKE_NVML_FAIL", "init");
  ASSERT_EQ(schedGPUInit(0, 0), 3);
  ASSERT_CONTAINS(cogpu_last_error(), "nvmlInit");
}

TEST_IMPL(schedgpu_blocking_wakes) {
  th_setenv("COGPU_MARGIN", "0");
  pid_t p = lt_hold("holder", 0, 12 * GiB, 0, 0, -1);
  lt_wait_nclients(0, 1, 5000);
  ASSERT_EQ(schedGPUInit(0, 0), 0); /* 0: wait without bound */
  pid_t killer = fork();
  if (killer == 0) {
    th_sleep_ms(200);
    kill(p, SIGKILL);
    _exit(0);
  }
  int dev = 0;
  ASSERT_EQ(preCudaMalloc(&dev, 8 * GiB, true), 0);
  th_wait(killer, th_ms(5000));
  th_wait(p, th_ms(5000));
}
