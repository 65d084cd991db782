/*
 * cuda.h -- device memory: where a pointer lives, the reduction kernels on the
 * device (cuda_kernels.cu), and the staged form of a collective on device
 * buffers, which runs a host step over the data chunk by chunk through pinned
 * host memory, on the caller's stream.
 *
 * cuda.c holds the CUDA runtime calls when setup.py builds CUDA (HVDL_CUDA);
 * without it the same functions say that the build has no CUDA. collectives.c, the
 * executor (the engine's device requests) and the binding call them; cuda.c calls
 * base/ alone.
 */
#ifndef HVDL_CUDA_H_
#define HVDL_CUDA_H_

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Device types, DLPack's numbers (kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged). */
#define HVDL_DEVICE_CPU          1
#define HVDL_DEVICE_CUDA         2
#define HVDL_DEVICE_CUDA_HOST    3
#define HVDL_DEVICE_CUDA_MANAGED 13

/* Bytes of each of the two pinned host chunks a communicator stages through. */
#define HVDL_CUDA_STAGE_BYTES ((size_t)4 << 20)

/* 1 when this build has CUDA. */
int hvdl_cuda_built(void);

/* The number of CUDA devices this process sees (0 without CUDA, a driver or a device). */
int hvdl_cuda_device_count(void);

/* The CUDA device p's memory is on, or -1 for host memory (pinned host memory
 * included, and every pointer when the build has no CUDA or sees no device).
 * Managed memory counts as device memory. */
int hvdl_cuda_device_of(const void *p);

/* dst = a op b, elementwise, on device memory, queued on `stream` (op Avg: Sum).
 * hvdlUnhandledCudaError with CUDA's message when the launch fails;
 * hvdlInvalidUsage without CUDA. */
hvdlResult_t hvdl_cuda_reduce(hvdlComm_t comm, void *dst, const void *a, const void *b, size_t n,
                              hvdlDataType_t dt, hvdlRedOp_t op, hvdlStream_t stream);
/* buf = buf / divisor on device memory (Avg's division), queued on `stream`. */
hvdlResult_t hvdl_cuda_divide(hvdlComm_t comm, void *buf, size_t n, hvdlDataType_t dt,
                              uint64_t divisor, hvdlStream_t stream);
/* dst = src * factor on device memory, with reduce.c's hvdl_scale rules (integers in
 * float64, truncated toward zero and clamped; float16/bfloat16 in float32), queued on
 * `stream`; factor 1 is a copy (none when dst == src). */
hvdlResult_t hvdl_cuda_scale(hvdlComm_t comm, void *dst, const void *src, size_t n,
                             hvdlDataType_t dt, double factor, hvdlStream_t stream);
/* The calling thread's CUDA context before hvdl_cuda_enter. */
struct hvdl_cuda_saved {
  void *ctx; /* the driver's CUcontext, or NULL: none */
  int known; /* 0: the driver's calls were not found, and nothing is given back */
};
/* Makes `device` the calling thread's current CUDA device (its primary context), *saved the
 * context the thread had. A device request's step runs on the engine's thread, or on a waiting
 * caller's, and hvdl_cuda_leave gives that thread back its own context after it, or none where
 * it had none: asking the runtime for the "current device" would answer 0 there, and setting
 * device 0 back would make a context on GPU 0 in every rank. */
hvdlResult_t hvdl_cuda_enter(hvdlComm_t comm, int device, struct hvdl_cuda_saved *saved);
void hvdl_cuda_leave(const struct hvdl_cuda_saved *saved);
/* The bytes of each chunk hvdl_cuda_staged takes for a call of `unit`-byte units: a
 * rank that runs the same collective on host memory (a joined rank's stand-in) calls
 * the host algorithm on chunks of this size, so that its steps match the others'. */
size_t hvdl_cuda_chunk_bytes(size_t unit);
/* *buf holds at least `bytes` of pinned host memory (*cap its size): kept when it does,
 * else replaced (the old one freed). */
hvdlResult_t hvdl_cuda_pinned_reserve(hvdlComm_t comm, char **buf, size_t *cap, size_t bytes);
void hvdl_cuda_pinned_free(char *buf);
/* Waits, bounded like every data wait (HVD_LITE_DATA_TIMEOUT_SECONDS), until `stream` has
 * run what is queued on it now: an event recorded there, polled. */
hvdlResult_t hvdl_cuda_wait_stream(hvdlComm_t comm, hvdlStream_t stream, const char *what);
/* Waits until `stream` has run everything queued on it. */
hvdlResult_t hvdl_cuda_sync(hvdlComm_t comm, hvdlStream_t stream);
/* dst = src (bytes), device memory or pinned host memory either side, queued on `stream`. */
hvdlResult_t hvdl_cuda_copy(hvdlComm_t comm, void *dst, const void *src, size_t bytes,
                            hvdlStream_t stream);

/* One chunk's work on host memory: `host` holds `bytes` (a whole number of the
 * call's units) at `offset` of the call's buffer; the step leaves its result there. */
typedef hvdlResult_t (*hvdl_stage_step)(hvdlComm_t comm, void *host, size_t bytes, size_t offset,
                                        void *arg);

/* The staged form of a collective on device memory, all of one device per communicator
 * (the current one at its first staged call: a buffer on another is refused, naming
 * both). For each chunk of `bytes` (HVDL_CUDA_STAGE_BYTES rounded down to whole
 * `unit`s), in order: copies it
 * from `send` into a pinned host chunk (none when send is NULL), runs `step` on
 * it, and copies the result into `recv` (none when recv is NULL). The copies are
 * queued on `stream`, after the work the caller queued there: the next chunk's
 * copy down overlaps this chunk's step, and the call returns once the last
 * chunk's copy up is queued (the result is ready where the stream reaches it).
 * Every rank must call it with the same bytes and unit, so that their chunks
 * (and the steps' collectives) match. */
hvdlResult_t hvdl_cuda_staged(hvdlComm_t comm, const void *send, void *recv, size_t bytes,
                              size_t unit, hvdlStream_t stream, hvdl_stage_step step, void *arg);

/* Frees comm's pinned chunks and events (after waiting for its last copies). */
void hvdl_cuda_free(hvdlComm_t comm);

#endif /* HVDL_CUDA_H_ */
