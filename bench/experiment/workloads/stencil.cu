// stencil.cu: an iterative 2D Jacobi stencil (5 points) over two float
// grids that together fill the footprint; compute- and bandwidth-bound.
// Usage and exit codes: common.cuh.
#include "common.cuh"
#include <math.h>

__global__ void jacobi(const float *in, float *out, size_t n) {
  size_t y = blockIdx.y * (size_t)blockDim.y + threadIdx.y;
  size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (x == 0 || y == 0 || x >= n - 1 || y >= n - 1)
    return;
  size_t i = y * n + x;
  out[i] = 0.25f * (in[i - 1] + in[i + 1] + in[i - n] + in[i + n]) + 1e-6f;
}

int main(int argc, char **argv) {
  wl_args a = wl_parse(argc, argv);
  size_t bytes = (size_t)(a.mem_gib * (1ull << 30));
  size_t n = (size_t)sqrt((double)(bytes / 2 / sizeof(float)));
  size_t grid = n * n * sizeof(float);
  float *g[2] = {NULL, NULL};
  if (!a.release)
    for (int k = 0; k < 2; k++)
      g[k] = (float *)wl_alloc(grid);
  dim3 block(32, 8), blocks((unsigned)((n + 31) / 32), (unsigned)((n + 7) / 8));
  long iters = 0;
  for (int p = 0; p < a.phases; p++) {
    if (a.release)
      for (int k = 0; k < 2; k++)
        g[k] = (float *)wl_alloc(grid);
    double t0 = wl_now();
    while (wl_now() - t0 < a.gpu_seconds) {
      for (int i = 0; i < 10; i++, iters++)
        jacobi<<<blocks, block>>>(g[iters & 1], g[(iters + 1) & 1], n);
      WL_CHECK(cudaGetLastError());
      WL_CHECK(cudaDeviceSynchronize());
    }
    if (a.release)
      for (int k = 0; k < 2; k++)
        WL_CHECK(cudaFree(g[k]));
    printf("phase %d: %ld sweeps of %zux%zu\n", p, iters, n, n);
    fflush(stdout);
    wl_cpu_phase(a.cpu_seconds);
  }
  printf("peak_bytes=%zu\n", 2 * grid);
  return 0;
}
