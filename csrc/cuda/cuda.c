/*
 * cuda.c -- device memory through the CUDA runtime (cuda.h): where a pointer
 * lives, the kernels' launches, and the staged form of a collective.
 *
 * The staged form, for chunks 0 .. K-1 of a call (two pinned slots, A and B):
 *
 *   host thread:  queue down(0)->A | queue down(1)->B, wait A, step(0), queue up(0)<-A |
 *                 queue down(2)->A, wait B, step(1), queue up(1)<-B | ...
 *   stream:       down(0) down(1) up(0) down(2) up(1) ...
 *
 * Chunk k+1's copy down runs on the device while the host runs chunk k's step
 * (the MPI traffic). A slot is written by the next copy down only after the
 * copy up that read it (both are on the one stream, in that order), and the
 * host waits for a slot's event, recorded after its copy down, before its step
 * touches it; a step that writes a slot without a copy down (send NULL) waits
 * the same event, which the stream passes after the slot's last copy up. The
 * call ends with the last copy up queued and an event recorded behind it; the
 * next call on the communicator waits for that event before it reuses a slot,
 * whatever its stream.
 *
 * Without HVDL_CUDA (setup.py builds CUDA only with HVD_LITE_CUDA=1), every
 * function but the queries says that the build has no CUDA.
 */
#include "cuda/cuda.h"

#include <stdlib.h>
#include <string.h>

size_t hvdl_cuda_chunk_bytes(size_t unit) { return HVDL_CUDA_STAGE_BYTES / unit * unit; }

#ifdef HVDL_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>

/* cuda_kernels.cu */
int hvdl_cuda_kernel_reduce(void *dst, const void *a, const void *b, size_t n, int dt, int op,
                            void *stream);
int hvdl_cuda_kernel_divide(void *buf, size_t n, int dt, uint64_t divisor, void *stream);
int hvdl_cuda_kernel_scale(void *dst, const void *src, size_t n, int dt, double factor,
                           void *stream);

/* A communicator's staging: two pinned chunks and their events. */
struct hvdl_cuda_stage {
  void *slot[2];
  size_t bytes;
  cudaEvent_t ready[2]; /* recorded after a slot's copy down (or its turn, without one) */
  cudaEvent_t done;     /* recorded after the last call's last copy up */
  int pending;          /* done has been recorded */
  int device;           /* the device whose streams its events are recorded on */
};

static hvdlResult_t cuda_fail(hvdlComm_t comm, cudaError_t err, const char *what) {
  (void)cudaGetLastError(); /* clear a sticky launch error for the next call */
  return hvdl_fail(comm, hvdlUnhandledCudaError, "%s: %s (CUDA error %d)", what,
                   cudaGetErrorString(err), (int)err);
}

#define CUDA_CHECK(comm, call, what)                         \
  do {                                                       \
    cudaError_t e_ = (call);                                 \
    if (e_ != cudaSuccess) return cuda_fail(comm, e_, what); \
  } while (0)

int hvdl_cuda_built(void) { return 1; }

/* Waiting for an event: wait.c's loop (spin, then sleeps) polling cudaEventQuery,
 * bounded like every data wait, so a device that never finishes a copy gives an
 * error after HVD_LITE_DATA_TIMEOUT_SECONDS instead of holding the call for good
 * (cudaEventSynchronize would). An event makes no partial progress: the loop asks
 * for progress only once the timeout has passed, and none has been made then. */
struct event_wait {
  cudaEvent_t ev;
  const char *what;
  int timed_out;
};

static hvdlResult_t event_test(hvdlComm_t comm, void *arg, int *done) {
  const struct event_wait *w = arg;
  const cudaError_t e = cudaEventQuery(w->ev);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError(); /* not an error; leave nothing for the next check */
    *done = 0;
    return hvdlSuccess;
  }
  if (e != cudaSuccess) return cuda_fail(comm, e, w->what);
  *done = 1;
  return hvdlSuccess;
}

static uint64_t event_progress(hvdlComm_t comm, void *arg) {
  (void)comm;
  ((struct event_wait *)arg)->timed_out = 1;
  return 0;
}

static hvdlResult_t wait_event(hvdlComm_t comm, cudaEvent_t ev, const char *what) {
  struct event_wait w = {ev, what, 0};
  const struct hvdl_poll p = {event_test, event_progress, &w, 0};
  const hvdlResult_t res = hvdl_wait_data(comm, &p);
  if (res == hvdlSuccess || !w.timed_out) return res; /* done, a CUDA error, or comm->watch's */
  return hvdl_fail(comm, hvdlUnhandledCudaError,
                   "%s: the device did not finish it in %g s (HVD_LITE_DATA_TIMEOUT_SECONDS)", what,
                   comm->data_timeout);
}

int hvdl_cuda_device_count(void) {
  static int count = -1; /* the runtime's answer does not change within a process */
  if (count < 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    count = n;
  }
  return count;
}

/* The driver's calls the runtime does not offer, looked up once (no link to libcuda). */
static struct {
  int (*primary_state)(int dev, unsigned *flags, int *active); /* cuDevicePrimaryCtxGetState */
  int (*ctx_get)(void **ctx);                                  /* cuCtxGetCurrent */
  int (*ctx_set)(void *ctx);                                   /* cuCtxSetCurrent */
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void look_up_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  *(void **)&drv.primary_state = dlsym(lib, "cuDevicePrimaryCtxGetState");
  *(void **)&drv.ctx_get = dlsym(lib, "cuCtxGetCurrent");
  *(void **)&drv.ctx_set = dlsym(lib, "cuCtxSetCurrent");
}

/* 1 when some device's primary context is active (CuPy, PyTorch and the runtime API make
 * their memory there), or when that cannot be told: then p may be device memory. Asking the
 * runtime about a pointer would otherwise make a context (and take device memory) in a
 * process that only ever passes host buffers. */
static int any_context(void) {
  pthread_once(&drv_once, look_up_driver);
  if (!drv.primary_state) return 1;
  for (int d = 0; d < hvdl_cuda_device_count(); d++) { /* CUdevice d is ordinal d */
    unsigned flags = 0;
    int active = 0;
    if (drv.primary_state(d, &flags, &active) != 0 || active) return 1;
  }
  return 0;
}

int hvdl_cuda_device_of(const void *p) {
  if (!p || hvdl_cuda_device_count() == 0 || !any_context()) return -1;
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) { /* an address CUDA never saw */
    (void)cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

hvdlResult_t hvdl_cuda_reduce(hvdlComm_t comm, void *dst, const void *a, const void *b, size_t n,
                              hvdlDataType_t dt, hvdlRedOp_t op, hvdlStream_t stream) {
  const int kop = op == hvdlAvg ? hvdlSum : (int)op;
  CUDA_CHECK(comm, (cudaError_t)hvdl_cuda_kernel_reduce(dst, a, b, n, (int)dt, kop, stream),
             "reduction kernel");
  return hvdlSuccess;
}

hvdlResult_t hvdl_cuda_divide(hvdlComm_t comm, void *buf, size_t n, hvdlDataType_t dt,
                              uint64_t divisor, hvdlStream_t stream) {
  CUDA_CHECK(comm, (cudaError_t)hvdl_cuda_kernel_divide(buf, n, (int)dt, divisor, stream),
             "division kernel");
  return hvdlSuccess;
}

hvdlResult_t hvdl_cuda_scale(hvdlComm_t comm, void *dst, const void *src, size_t n,
                             hvdlDataType_t dt, double factor, hvdlStream_t stream) {
  if (factor == 1.0) return hvdl_cuda_copy(comm, dst, src, n * hvdl_type_size(dt), stream);
  CUDA_CHECK(comm, (cudaError_t)hvdl_cuda_kernel_scale(dst, src, n, (int)dt, factor, stream),
             "scale kernel");
  return hvdlSuccess;
}

hvdlResult_t hvdl_cuda_enter(hvdlComm_t comm, int device, struct hvdl_cuda_saved *saved) {
  pthread_once(&drv_once, look_up_driver);
  saved->ctx = NULL;
  saved->known = drv.ctx_get && drv.ctx_set && drv.ctx_get(&saved->ctx) == 0;
  CUDA_CHECK(comm, cudaSetDevice(device), "cudaSetDevice");
  return hvdlSuccess;
}

void hvdl_cuda_leave(const struct hvdl_cuda_saved *saved) {
  void *now = NULL;
  if (!saved->known || (drv.ctx_get(&now) == 0 && now == saved->ctx)) return;
  (void)drv.ctx_set(saved->ctx); /* NULL too: the thread had none, and has none again */
}

hvdlResult_t hvdl_cuda_pinned_reserve(hvdlComm_t comm, char **buf, size_t *cap, size_t bytes) {
  if (bytes <= *cap && *buf) return hvdlSuccess;
  const size_t rounded = ((bytes ? bytes : 1) + 4095) & ~(size_t)4095;
  void *p = NULL;
  CUDA_CHECK(comm, cudaHostAlloc(&p, rounded, cudaHostAllocPortable),
             "cudaHostAlloc (a pinned fusion buffer)");
  hvdl_cuda_pinned_free(*buf);
  *buf = p;
  *cap = rounded;
  return hvdlSuccess;
}

void hvdl_cuda_pinned_free(char *buf) {
  if (buf && cudaFreeHost(buf) != cudaSuccess) (void)cudaGetLastError();
}

hvdlResult_t hvdl_cuda_wait_stream(hvdlComm_t comm, hvdlStream_t stream, const char *what) {
  cudaEvent_t ev;
  CUDA_CHECK(comm, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t e = cudaEventRecord(ev, (cudaStream_t)stream);
  const hvdlResult_t res =
      e == cudaSuccess ? wait_event(comm, ev, what) : cuda_fail(comm, e, "cudaEventRecord");
  (void)cudaEventDestroy(ev);
  return res;
}

hvdlResult_t hvdl_cuda_sync(hvdlComm_t comm, hvdlStream_t stream) {
  CUDA_CHECK(comm, cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
  return hvdlSuccess;
}

hvdlResult_t hvdl_cuda_copy(hvdlComm_t comm, void *dst, const void *src, size_t bytes,
                            hvdlStream_t stream) {
  if (dst == src || bytes == 0) return hvdlSuccess;
  CUDA_CHECK(comm, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream),
             "cudaMemcpyAsync");
  return hvdlSuccess;
}

/* Makes s's pinned chunks and events. */
static hvdlResult_t make_stage(hvdlComm_t comm, struct hvdl_cuda_stage *s) {
  s->bytes = HVDL_CUDA_STAGE_BYTES; /* hvdl_cuda_chunk_bytes assumes this */
  CUDA_CHECK(comm, cudaGetDevice(&s->device), "cudaGetDevice");
  for (int i = 0; i < 2; i++) {
    CUDA_CHECK(comm, cudaHostAlloc(&s->slot[i], s->bytes, cudaHostAllocPortable),
               "cudaHostAlloc (a pinned staging chunk)");
    CUDA_CHECK(comm, cudaEventCreateWithFlags(&s->ready[i], cudaEventDisableTiming),
               "cudaEventCreate");
  }
  CUDA_CHECK(comm, cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming), "cudaEventCreate");
  return hvdlSuccess;
}

/* comm's staging, made on its first staged call; a failure leaves none (the next call tries
 * again), not half of one. */
static hvdlResult_t stage_of(hvdlComm_t comm, struct hvdl_cuda_stage **out) {
  if (!comm->cuda_stage) {
    struct hvdl_cuda_stage *s = calloc(1, sizeof *s);
    if (!s) return hvdl_fail(comm, hvdlSystemError, "out of memory (staging)");
    comm->cuda_stage = s;
    const hvdlResult_t res = make_stage(comm, s);
    if (res != hvdlSuccess) {
      hvdl_cuda_free(comm); /* frees what was made and sets comm->cuda_stage to NULL */
      return res;
    }
  }
  *out = comm->cuda_stage;
  return hvdlSuccess;
}

/* Queues chunk k's copy down into its slot (when there is a send buffer) and the
 * slot's event. */
static hvdlResult_t queue_down(hvdlComm_t comm, struct hvdl_cuda_stage *s, const char *send,
                               size_t k, size_t chunk, size_t bytes, cudaStream_t st) {
  const size_t off = k * chunk, len = bytes - off < chunk ? bytes - off : chunk;
  if (send)
    CUDA_CHECK(comm, cudaMemcpyAsync(s->slot[k % 2], send + off, len, cudaMemcpyDeviceToHost, st),
               "cudaMemcpyAsync (device to pinned host)");
  CUDA_CHECK(comm, cudaEventRecord(s->ready[k % 2], st), "cudaEventRecord");
  return hvdlSuccess;
}

hvdlResult_t hvdl_cuda_staged(hvdlComm_t comm, const void *send, void *recv, size_t bytes,
                              size_t unit, hvdlStream_t stream, hvdl_stage_step step, void *arg) {
  struct hvdl_cuda_stage *s = NULL;
  HVDL_CHECK(stage_of(comm, &s));
  const int device = hvdl_cuda_device_of(send ? send : recv);
  if (device >= 0 && device != s->device) /* its events belong to s->device's context */
    return hvdl_fail(comm, hvdlInvalidUsage,
                     "a communicator stages the memory of one CUDA device, device %d (the current "
                     "one at its first device call); this buffer is on device %d: make it the "
                     "current device first, and use one device per process, as NCCL's "
                     "communicators have one each",
                     s->device, device);
  cudaStream_t st = (cudaStream_t)stream;
  if (s->pending) HVDL_CHECK(wait_event(comm, s->done, "the last call's copies up"));
  s->pending = 0;
  const size_t chunk = hvdl_cuda_chunk_bytes(unit);
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  hvdlResult_t res = queue_down(comm, s, send, 0, chunk, bytes, st);
  for (size_t k = 0; k < nchunks && res == hvdlSuccess; k++) {
    const size_t off = k * chunk, len = bytes - off < chunk ? bytes - off : chunk;
    if (k + 1 < nchunks) {
      res = queue_down(comm, s, send, k + 1, chunk, bytes, st);
      if (res != hvdlSuccess) break;
    }
    res = wait_event(comm, s->ready[k % 2], "a chunk's copy down");
    if (res != hvdlSuccess) break;
    res = step(comm, s->slot[k % 2], len, off, arg);
    if (res != hvdlSuccess || !recv) continue;
    const cudaError_t e =
        cudaMemcpyAsync((char *)recv + off, s->slot[k % 2], len, cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) res = cuda_fail(comm, e, "cudaMemcpyAsync (pinned host to device)");
  }
  /* The slots are free again once the stream passes this point, failure or not. */
  cudaError_t e = cudaEventRecord(s->done, st);
  if (e == cudaSuccess)
    s->pending = 1;
  else if (res == hvdlSuccess)
    res = cuda_fail(comm, e, "cudaEventRecord");
  else if (cudaStreamSynchronize(st) != cudaSuccess)
    (void)cudaGetLastError();
  return res;
}

void hvdl_cuda_free(hvdlComm_t comm) {
  struct hvdl_cuda_stage *s = comm->cuda_stage;
  if (!s) return;
  if (s->pending) (void)cudaEventSynchronize(s->done);
  for (int i = 0; i < 2; i++) {
    if (s->slot[i]) (void)cudaFreeHost(s->slot[i]);
    if (s->ready[i]) (void)cudaEventDestroy(s->ready[i]);
  }
  if (s->done) (void)cudaEventDestroy(s->done);
  (void)cudaGetLastError();
  free(s);
  comm->cuda_stage = NULL;
}

#else /* no CUDA in this build */

static hvdlResult_t no_cuda(hvdlComm_t comm) {
  return hvdl_fail(comm, hvdlInvalidUsage,
                   "this hvd_lite was built without CUDA (build_info()['cuda'] is False): "
                   "rebuild it where nvcc is on PATH, or with HVD_LITE_CUDA=1");
}

int hvdl_cuda_built(void) { return 0; }
int hvdl_cuda_device_count(void) { return 0; }

int hvdl_cuda_device_of(const void *p) {
  (void)p;
  return -1;
}

hvdlResult_t hvdl_cuda_reduce(hvdlComm_t comm, void *dst, const void *a, const void *b, size_t n,
                              hvdlDataType_t dt, hvdlRedOp_t op, hvdlStream_t stream) {
  return no_cuda(comm);
}

hvdlResult_t hvdl_cuda_divide(hvdlComm_t comm, void *buf, size_t n, hvdlDataType_t dt,
                              uint64_t divisor, hvdlStream_t stream) {
  return no_cuda(comm);
}

hvdlResult_t hvdl_cuda_scale(hvdlComm_t comm, void *dst, const void *src, size_t n,
                             hvdlDataType_t dt, double factor, hvdlStream_t stream) {
  return no_cuda(comm);
}

hvdlResult_t hvdl_cuda_enter(hvdlComm_t comm, int device, struct hvdl_cuda_saved *saved) {
  saved->ctx = NULL;
  saved->known = 0;
  return no_cuda(comm);
}

void hvdl_cuda_leave(const struct hvdl_cuda_saved *saved) { (void)saved; }

hvdlResult_t hvdl_cuda_pinned_reserve(hvdlComm_t comm, char **buf, size_t *cap, size_t bytes) {
  return no_cuda(comm);
}

void hvdl_cuda_pinned_free(char *buf) { (void)buf; }

hvdlResult_t hvdl_cuda_wait_stream(hvdlComm_t comm, hvdlStream_t stream, const char *what) {
  return no_cuda(comm);
}

hvdlResult_t hvdl_cuda_sync(hvdlComm_t comm, hvdlStream_t stream) { return no_cuda(comm); }

hvdlResult_t hvdl_cuda_copy(hvdlComm_t comm, void *dst, const void *src, size_t bytes,
                            hvdlStream_t stream) {
  return no_cuda(comm);
}

hvdlResult_t hvdl_cuda_staged(hvdlComm_t comm, const void *send, void *recv, size_t bytes,
                              size_t unit, hvdlStream_t stream, hvdl_stage_step step, void *arg) {
  return no_cuda(comm);
}

void hvdl_cuda_free(hvdlComm_t comm) { (void)comm; }

#endif
