// common.cuh: shared by the kit's CUDA workloads (issue 6). Each workload
// alternates CPU phases and GPU phases:
//   PROG --mem-gib G --gpu-seconds S --cpu-seconds C --phases N [--release]
// It allocates G GiB of device memory (its footprint), then N times runs
// kernels for S seconds and computes on the CPU for C seconds. With
// --release it frees its memory during CPU phases and allocates it again.
// Exit: 0 done, 2 out of device memory (cudaErrorMemoryAllocation),
// 3 any other CUDA error, 4 bad usage. Prints "peak_bytes=N": the device
// memory it allocated (the CUDA context, ~0.5 GiB, comes on top).
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wl_args {
  double mem_gib = 1, gpu_seconds = 5, cpu_seconds = 2;
  int phases = 3;
  bool release = false;
};

static double wl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void wl_usage(const char *prog) {
  fprintf(stderr,
          "usage: %s --mem-gib G --gpu-seconds S --cpu-seconds C "
          "--phases N [--release]\n",
          prog);
  exit(4);
}

static wl_args wl_parse(int argc, char **argv) {
  wl_args a;
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    if (!strcmp(k, "--release")) {
      a.release = true;
      continue;
    }
    if (i + 1 >= argc)
      wl_usage(argv[0]);
    double v = atof(argv[++i]);
    if (!strcmp(k, "--mem-gib"))
      a.mem_gib = v;
    else if (!strcmp(k, "--gpu-seconds"))
      a.gpu_seconds = v;
    else if (!strcmp(k, "--cpu-seconds"))
      a.cpu_seconds = v;
    else if (!strcmp(k, "--phases"))
      a.phases = (int)v;
    else
      wl_usage(argv[0]);
  }
  if (a.mem_gib <= 0 || a.phases < 1)
    wl_usage(argv[0]);
  return a;
}

#define WL_CHECK(call)                                                         \
  do {                                                                         \
    cudaError_t wl_e_ = (call);                                                \
    if (wl_e_ != cudaSuccess) {                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
              cudaGetErrorString(wl_e_));                                      \
      exit(wl_e_ == cudaErrorMemoryAllocation ? 2 : 3);                        \
    }                                                                          \
  } while (0)

// A CPU phase: real work on one core (not a sleep), for `seconds`.
static double wl_cpu_phase(double seconds) {
  double t0 = wl_now(), x = 1.0;
  while (wl_now() - t0 < seconds)
    for (int i = 0; i < 1000000; i++)
      x = x * 1.0000001 + 1e-9;
  return x;
}

static void *wl_alloc(size_t bytes) {
  void *p = NULL;
  WL_CHECK(cudaMalloc(&p, bytes));
  WL_CHECK(cudaMemset(p, 0, bytes));
  return p;
}
