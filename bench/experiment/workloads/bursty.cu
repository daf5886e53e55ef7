// bursty.cu: short, compute-bound GPU bursts (dependent FMA chains over a
// buffer that fills the footprint) between long CPU phases: the GPU sits
// idle most of the time, which is where co-scheduling gains most. Usage
// and exit codes: common.cuh.
#include "common.cuh"

__global__ void burn(float *buf, size_t n, int rounds) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float x = buf[i];
    for (int r = 0; r < rounds; r++)
      x = fmaf(x, 0.999f, 0.001f);
    buf[i] = x;
  }
}

int main(int argc, char **argv) {
  wl_args a = wl_parse(argc, argv);
  size_t bytes = (size_t)(a.mem_gib * (1ull << 30));
  size_t n = bytes / sizeof(float);
  float *buf = NULL;
  int sms = 0;
  WL_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // The kernel touches a slice of the buffer; the rest is the footprint a
  // real application keeps resident (model, cache, inputs).
  size_t slice = n < (64u << 20) ? n : (64u << 20);
  for (int p = 0; p < a.phases; p++) {
    if (!buf)
      buf = (float *)wl_alloc(n * sizeof(float));
    double t0 = wl_now();
    long k = 0;
    while (wl_now() - t0 < a.gpu_seconds) {
      burn<<<sms * 4, 256>>>(buf + (k++ % (n / slice)) * slice, slice, 256);
      WL_CHECK(cudaGetLastError());
      WL_CHECK(cudaDeviceSynchronize());
    }
    if (a.release) {
      WL_CHECK(cudaFree(buf));
      buf = NULL;
    }
    printf("phase %d: %ld bursts\n", p, k);
    fflush(stdout);
    wl_cpu_phase(a.cpu_seconds);
  }
  printf("peak_bytes=%zu\n", n * sizeof(float));
  return 0;
}
