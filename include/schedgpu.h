/*
 * schedgpu.h: the three-call API of the published schedGPU co-scheduler,
 * mapped onto cogpu's ledger, for programs written against it.
 *
 * Return values are CUDA runtime error numbers, as in the original:
 *   0   success
 *   600 (cudaErrorNotReady)         non-blocking and memory not available now
 *   2   (cudaErrorMemoryAllocation) timed out, or larger than the GPU
 *   101 (cudaErrorInvalidDevice)    no such GPU
 *   1   (cudaErrorInvalidValue)     bad argument (negative timeout, 0 bytes,
 *                                   freeing more than was reserved)
 *   3   (cudaErrorInitializationError) the node ledger cannot be used
 *                                   (cogpu_last_error() says why)
 * The process-wide attachment is made by schedGPUInit, or implicitly by the
 * first preCudaMalloc (timeout: none, priority 0).
 */
#ifndef SCHEDGPU_H
#define SCHEDGPU_H

#include <stdbool.h>
#include <stddef.h>

#include "cogpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Attach with a default wait bound (seconds; 0 waits without bound) and a
 * priority for every later request. Calling it again changes both. */
COGPU_API int schedGPUInit(int timeout_seconds, int priority);

/* Reserve `bytes` on *device before allocating them; *device < 0 picks the
 * GPU with most free memory that fits and writes its index back. With block
 * false, return 600 at once when the memory is not available. */
COGPU_API int preCudaMalloc(int *device, size_t bytes, bool block);

/* Give back `bytes` reserved on `device` after freeing them. */
COGPU_API int postCudaFree(int device, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif /* SCHEDGPU_H */
