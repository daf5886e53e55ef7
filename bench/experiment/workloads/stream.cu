// stream.cu: a memory-bound streaming kernel (triad a = b + s * c) over
// three arrays that together fill the footprint. Usage and exit codes:
// common.cuh.
#include "common.cuh"

__global__ void triad(float *a, const float *b, const float *c, float s,
                      size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    a[i] = b[i] + s * c[i];
}

int main(int argc, char **argv) {
  wl_args a = wl_parse(argc, argv);
  size_t bytes = (size_t)(a.mem_gib * (1ull << 30));
  size_t n = bytes / 3 / sizeof(float);
  float *v[3] = {NULL, NULL, NULL};
  int sms = 0;
  WL_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long iters = 0;
  for (int p = 0; p < a.phases; p++) {
    if (!v[0])
      for (int k = 0; k < 3; k++)
        v[k] = (float *)wl_alloc(n * sizeof(float));
    double t0 = wl_now();
    while (wl_now() - t0 < a.gpu_seconds) {
      for (int i = 0; i < 10; i++, iters++)
        triad<<<sms * 8, 256>>>(v[0], v[1], v[2], 1.0001f, n);
      WL_CHECK(cudaGetLastError());
      WL_CHECK(cudaDeviceSynchronize());
    }
    if (a.release)
      for (int k = 0; k < 3; k++) {
        WL_CHECK(cudaFree(v[k]));
        v[k] = NULL;
      }
    printf("phase %d: %ld triads of %zu floats\n", p, iters, n);
    fflush(stdout);
    wl_cpu_phase(a.cpu_seconds);
  }
  printf("peak_bytes=%zu\n", 3 * n * sizeof(float));
  return 0;
}
