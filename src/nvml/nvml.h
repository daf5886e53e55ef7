/*
 * nvml.h: cogpu's one boundary to NVML. libnvidia-ml.so.1 is loaded at run
 * time with dlopen (found the way the system loader finds it, so
 * LD_LIBRARY_PATH works); cogpu builds and runs its tests on machines with no
 * NVIDIA software. NVML is used instead of CUDA so that discovering GPUs never
 * creates a CUDA context.
 */
#ifndef COGPU_NVML_H
#define COGPU_NVML_H

#include <stddef.h>
#include <stdint.h>

#define COGPU_NVML_MAX_GPUS 16

typedef struct cogpu__gpu_desc_s {
  unsigned index; /* NVML index */
  char uuid[96];  /* "GPU-..." */
  char name[96];  /* "NVIDIA H100 80GB HBM3" */
  uint64_t total; /* bytes of device memory */
} cogpu__gpu_desc_t;

typedef struct cogpu__gpu_proc_s {
  unsigned pid;  /* as NVML reports it (the host's PID namespace) */
  uint64_t used; /* bytes; 0 when NVML does not know */
} cogpu__gpu_proc_t;

/* Load and initialise NVML once per process (thread-safe; later calls are
 * free). Returns 0 or COGPU_ENVML with a message saying what failed (library
 * not found: dlerror text; init failed: NVML's error string). */
int cogpu__nvml_open(void);

/* Discover up to `max` GPUs into gpus[], in NVML index order; *n gets the
 * count. Returns 0, COGPU_ENVML or COGPU_ENOGPU (no device). */
int cogpu__nvml_discover(cogpu__gpu_desc_t *gpus, size_t max, size_t *n);

/* Device memory the driver has free now on the GPU with this NVML index
 * (total - used, as NVML counts them). Returns 0 or COGPU_ENVML. */
int cogpu__nvml_mem_free(unsigned index, uint64_t *free_bytes);

/* Processes holding memory on the GPU with this NVML index: compute and
 * graphics processes, merged by pid (a pid listed by both is counted once,
 * with the larger figure). Up to `max` into procs[]; *n gets the count.
 * Returns 0 or COGPU_ENVML. */
int cogpu__nvml_processes(unsigned index, cogpu__gpu_proc_t *procs, size_t max,
                          size_t *n);

/* Processes that used the GPU's compute or memory in the samples NVML
 * took since since_us (CPU time, microseconds since the epoch), up to
 * `max` pids; *n gets the count. NVML samples every few tens of ms to a
 * second, depending on the GPU: work shorter than that can be missed.
 * -ENOTSUP when NVML cannot say. */
int cogpu__nvml_busy_pids(unsigned index, uint64_t since_us, unsigned *pids,
                          size_t max, size_t *n);

#endif /* COGPU_NVML_H */
