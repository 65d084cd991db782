/*
 * collectives.c -- the public collective entry points (hvdl.h). Each fills one
 * call (struct call, NCCL's ncclInfo), then: check_args, the one checker
 * (hvdlInvalidArgument or hvdlInvalidUsage before any traffic: the communicator,
 * type, count, root, buffers, then where the memory is and the op, each where the
 * collective has it); a zero count and a communicator of one rank end there; then
 * dispatch by memory kind: host buffers go to the collective's host path, device
 * buffers (hvdlAllReduce and hvdlBroadcast) to cuda.c's staged form, whose steps
 * are the same host path on pinned chunks; the host path selects the algorithm
 * (select/) and runs it (hvdlAdasum, host memory only, has one: allreduce_adasum.c). It calls the algorithms, the selectors, cuda.c and base/;
 * none of them calls it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "cuda/cuda.h"
#include "select/select.h"
#include "transport/shm/shm.h"

/* ---- one call ------------------------------------------------------------ */

/* What a collective is, for check_args. */
enum {
  TAKES_OP = 1,       /* a reduction: op checked */
  TAKES_ROOT = 2,     /* root checked */
  ROOT_SENDS = 4,     /* only the root reads sendbuff (broadcast) */
  ROOT_RECEIVES = 8,  /* only the root writes recvbuff (reduce) */
  SEND_PER_RANK = 16, /* sendbuff holds count for each rank (reduce-scatter, all-to-all) */
  RECV_PER_RANK = 32, /* recvbuff holds count for each rank (all-gather, all-to-all) */
  TAKES_DEVICE = 64,  /* device buffers go through cuda.c's staged form */
  TAKES_ADASUM = 128  /* hvdlAdasum (hvdlAllReduce only: it combines whole vectors) */
};

struct call;
/* A collective's host path: select its algorithm for count elements per rank's block
 * of send / recv (host memory) and run it. */
typedef hvdlResult_t (*host_path)(const struct call *c, const void *send, void *recv, size_t count);

/* One call, as its entry point fills it; check_args fills the rest. */
struct call {
  const char *fn;
  hvdlComm_t comm;
  const void *send;
  void *recv;
  size_t count; /* the count argument: one rank's block */
  hvdlDataType_t dt;
  hvdlRedOp_t op;
  int root;
  hvdlStream_t stream;
  int what; /* TAKES_OP | ... */
  host_path host;
  /* check_args: */
  size_t sendbytes, recvbytes; /* 0 for a buffer this rank does not use */
  int device;                  /* the buffers' CUDA device, or -1: host memory */
};

/* ---- the checks ----------------------------------------------------------- */

/* n copies of count, in the communicator's scratch: the blocks of the
 * fixed-size allgather and reduce-scatter. */
static hvdlResult_t equal_counts(hvdlComm_t comm, size_t count, size_t **out) {
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->counts, &s->counts_bytes, (size_t)comm->size * sizeof(size_t)));
  size_t *counts = (size_t *)(void *)s->counts;
  for (int k = 0; k < comm->size; k++) counts[k] = count;
  *out = counts;
  return hvdlSuccess;
}

/* The checks every collective makes before sending anything: the communicator,
 * the data type, the stream. */
static hvdlResult_t check_call(hvdlComm_t comm, const char *fn, hvdlDataType_t dt,
                               hvdlStream_t stream) {
  if (!comm) return hvdl_fail(NULL, hvdlInvalidArgument, "%s: comm is NULL", fn);
  if (comm->broken)
    return hvdl_fail(comm, hvdlInvalidUsage,
                     "%s: the communicator failed earlier and cannot be used; destroy or abort it",
                     fn);
  if (!hvdl_type_valid(dt))
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: invalid datatype %d (valid: 0..%d, %d..%d)",
                     fn, (int)dt, hvdlNumTypes - 1, hvdlExtTypesBegin, hvdlExtTypesEnd - 1);
  if (stream != NULL && !hvdl_cuda_built())
    return hvdl_fail(comm, hvdlInvalidUsage,
                     "%s: stream must be NULL: this hvd_lite was built without CUDA "
                     "(build_info()['cuda'] is False) and takes host memory only",
                     fn);
  return hvdlSuccess;
}

/* Where the buffers are: *device = their CUDA device, or -1 for host memory. Both
 * on one device or both on the host; a stream only with device buffers. */
static hvdlResult_t check_memory(hvdlComm_t comm, const char *fn, const void *sendbuff,
                                 const void *recvbuff, hvdlStream_t stream, int *device) {
  const int ds = hvdl_cuda_device_of(sendbuff), dr = hvdl_cuda_device_of(recvbuff);
  if (sendbuff && recvbuff && ds != dr) {
    char sw[32] = "host", rw[32] = "host";
    if (ds >= 0) snprintf(sw, sizeof sw, "CUDA device %d", ds);
    if (dr >= 0) snprintf(rw, sizeof rw, "CUDA device %d", dr);
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: sendbuff is in %s memory and recvbuff in %s memory; both must be on "
                     "one device, or both in host memory",
                     fn, sw, rw);
  }
  *device = sendbuff ? ds : dr;
  if (stream != NULL && *device < 0)
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: a stream was given but the buffers are in host memory; pass NULL "
                     "for host buffers",
                     fn);
  return hvdlSuccess;
}

/* The collectives that take host memory only. */
static hvdlResult_t check_host(hvdlComm_t comm, const char *fn, const void *sendbuff,
                               const void *recvbuff, hvdlStream_t stream) {
  int device = -1;
  HVDL_CHECK(check_memory(comm, fn, sendbuff, recvbuff, stream, &device));
  if (device >= 0)
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: the buffers are in CUDA device %d memory, which this call does not "
                     "take yet (hvdlAllReduce and hvdlBroadcast do); copy them to the host",
                     fn, device);
  return hvdlSuccess;
}

/* *bytes = count * ranks elements of dt, refusing a product that would wrap. */
static hvdlResult_t check_bytes(hvdlComm_t comm, const char *fn, size_t count, size_t ranks,
                                hvdlDataType_t dt, size_t *bytes) {
  const size_t esize = hvdl_type_size(dt);
  if (count > SIZE_MAX / esize / ranks)
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: count %zu is too large", fn, count);
  *bytes = count * esize * ranks;
  return hvdlSuccess;
}

/* A reduction's op, a type reductions apply to, and for Adasum a collective and a type
 * that take it (what: the collective's TAKES_* flags). */
static hvdlResult_t check_op(hvdlComm_t comm, const char *fn, hvdlRedOp_t op, hvdlDataType_t dt,
                             int what) {
  if (!hvdl_op_valid(op))
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: invalid op %d (valid: 0..%d, %d..%d)", fn,
                     (int)op, hvdlNumOps - 1, hvdlExtOpsBegin, hvdlExtOpsEnd - 1);
  if (!hvdl_type_reducible(dt))
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: %s data has no reduction ops (it moves with hvdlBroadcast, "
                     "hvdlAllGather and hvdlAllToAll)",
                     fn, hvdl_type_name(dt));
  if (op == hvdlAdasum && !(what & TAKES_ADASUM))
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: hvdlAdasum is an all-reduce only (it combines the ranks' whole "
                     "vectors); use hvdlAllReduce",
                     fn);
  if (op == hvdlAdasum && !hvdl_type_floating(dt))
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: hvdlAdasum takes float16, bfloat16, float32 or float64 data, not %s", fn,
                     hvdl_type_name(dt));
  return hvdlSuccess;
}

static hvdlResult_t check_root(hvdlComm_t comm, const char *fn, int root) {
  if (root < 0 || root >= comm->size)
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: root %d is out of range (valid: 0..%d)", fn,
                     root, comm->size - 1);
  return hvdlSuccess;
}

/* The buffers: none NULL where it will be used, and no overlap unless they are
 * in the collective's in-place arrangement (`inplace`, described by `rule`).
 * sendbytes / recvbytes are 0 for a buffer this rank does not use. */
static hvdlResult_t check_buffers(hvdlComm_t comm, const char *fn, const void *sendbuff,
                                  size_t sendbytes, const void *recvbuff, size_t recvbytes,
                                  int inplace, const char *rule) {
  if ((sendbytes && !sendbuff) || (recvbytes && !recvbuff))
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: %s is NULL with a non-zero count", fn,
                     sendbytes && !sendbuff ? "sendbuff" : "recvbuff");
  uintptr_t s = (uintptr_t)sendbuff, r = (uintptr_t)recvbuff;
  if (sendbytes && recvbytes && !inplace && s < r + recvbytes && r < s + sendbytes)
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: sendbuff and recvbuff overlap without %s", fn,
                     rule);
  return hvdlSuccess;
}

/* A forced latency path (HVD_LITE_ALLREDUCE_ALGO=small) holds n times the buffer:
 * refused above HVDL_SMALL_BYTES_MAX per rank. */
static hvdlResult_t check_latency_bytes(hvdlComm_t comm, const char *fn, hvdlAlgorithm_t algo,
                                        size_t bytes) {
  if (algo == hvdlAlgoLatency && bytes > HVDL_SMALL_BYTES_MAX)
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: %zu bytes per rank is over the latency path's %zu "
                     "(HVD_LITE_ALLREDUCE_ALGO=small); use another algorithm",
                     fn, bytes, HVDL_SMALL_BYTES_MAX);
  return hvdlSuccess;
}

/* The one checker: every check a collective makes before sending anything, in one
 * order (the communicator, type and stream; the count; the root; the buffers; where
 * the memory is and the op, the op first for a reduction that takes device memory),
 * each where c->what has it. */
static hvdlResult_t check_args(struct call *c) {
  hvdlComm_t comm = c->comm;
  const int what = c->what;
  const size_t n = (size_t)(comm ? comm->size : 1);
  const int per_rank = what & (SEND_PER_RANK | RECV_PER_RANK);
  size_t total = 0;
  HVDL_CHECK(check_call(comm, c->fn, c->dt, c->stream));
  HVDL_CHECK(check_bytes(comm, c->fn, c->count, per_rank ? n : 1, c->dt, &total));
  if (what & TAKES_ROOT) HVDL_CHECK(check_root(comm, c->fn, c->root));
  const size_t block = per_rank ? total / n : total;
  c->sendbytes = what & SEND_PER_RANK ? total : block;
  c->recvbytes = what & RECV_PER_RANK ? total : block;
  if ((what & ROOT_SENDS) && comm->rank != c->root) c->sendbytes = 0;
  if ((what & ROOT_RECEIVES) && comm->rank != c->root) c->recvbytes = 0;
  const uintptr_t s = (uintptr_t)c->send, r = (uintptr_t)c->recv;
  const uintptr_t at = (size_t)comm->rank * block;
  if (per_rank == (SEND_PER_RANK | RECV_PER_RANK))
    HVDL_CHECK(check_buffers(comm, c->fn, c->send, c->sendbytes, c->recv, c->recvbytes, s == r,
                             "being identical"));
  else if (per_rank == RECV_PER_RANK)
    HVDL_CHECK(check_buffers(comm, c->fn, c->send, c->sendbytes, c->recv, c->recvbytes, s == r + at,
                             "being in place (sendbuff == recvbuff + rank * sendcount)"));
  else if (per_rank == SEND_PER_RANK)
    HVDL_CHECK(check_buffers(comm, c->fn, c->send, c->sendbytes, c->recv, c->recvbytes, r == s + at,
                             "being in place (recvbuff == sendbuff + rank * recvcount)"));
  else
    HVDL_CHECK(check_buffers(comm, c->fn, c->send, c->sendbytes, c->recv, c->recvbytes, s == r,
                             "being identical"));
  c->device = -1;
  /* A reduction that takes device memory (hvdlAllReduce) checks its op before probing where
   * the memory is; the host-only ones check the memory first. */
  const int op_first = (what & TAKES_OP) && (what & TAKES_DEVICE);
  if (op_first) HVDL_CHECK(check_op(comm, c->fn, c->op, c->dt, what));
  if (what & TAKES_DEVICE)
    HVDL_CHECK(check_memory(comm, c->fn, (what & ROOT_SENDS) && !c->sendbytes ? NULL : c->send,
                            c->recv, c->stream, &c->device));
  else
    HVDL_CHECK(check_host(comm, c->fn, c->send, c->recv, c->stream));
  if ((what & TAKES_OP) && !op_first) HVDL_CHECK(check_op(comm, c->fn, c->op, c->dt, what));
  if ((what & TAKES_OP) && c->op == hvdlAdasum && c->device >= 0)
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: hvdlAdasum takes host memory only (the buffers are in CUDA device %d "
                     "memory; its norms span the whole buffer, which the staged device path "
                     "cuts into chunks); copy them to the host",
                     c->fn, c->device);
  return hvdlSuccess;
}

/* ---- running -------------------------------------------------------------- */

/* Runs the selector's choice: the paths through the shared segment here, the
 * message-passing ones through select_allreduce.c. */
static hvdlResult_t run_allreduce(hvdlComm_t comm, hvdlAlgorithm_t algo, const void *sendbuff,
                                  void *recvbuff, size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  if (algo == hvdlAlgoShm) return hvdl_allreduce_shm(comm, sendbuff, recvbuff, count, dt, op);
  if (algo == hvdlAlgoHierarchical)
    return hvdl_allreduce_hier(comm, sendbuff, recvbuff, count, dt, op, hvdl_allreduce_selected);
  return hvdl_allreduce_run(comm, algo, sendbuff, recvbuff, count, dt, op);
}

/* A communicator of one rank: the result is the input (one block), on the host or,
 * queued on the stream, on the device. */
static hvdlResult_t copy_alone(const struct call *c) {
  const size_t bytes = c->count * hvdl_type_size(c->dt);
  if (c->device >= 0) return hvdl_cuda_copy(c->comm, c->recv, c->send, bytes, c->stream);
  if (c->send != c->recv) hvdl_copy(c->recv, c->send, bytes);
  return hvdlSuccess;
}

/* A staged chunk's step: the host path on the pinned chunk, in place. */
static hvdlResult_t staged_step(hvdlComm_t comm, void *host, size_t bytes, size_t offset,
                                void *arg) {
  (void)comm;
  (void)offset;
  const struct call *c = arg;
  return c->host(c, host, host, bytes / hvdl_type_size(c->dt));
}

/* The call on its memory kind: host buffers through its host path; device buffers
 * through cuda.c's staged form, whose steps are the host path on each chunk (the
 * first the largest; sendbuff only where this rank reads it). */
static hvdlResult_t dispatch(struct call *c) {
  if (c->device < 0) return c->host(c, c->send, c->recv, c->count);
  return hvdl_cuda_staged(c->comm, c->sendbytes ? c->send : NULL, c->recv, c->recvbytes,
                          hvdl_type_size(c->dt), c->stream, staged_step, c);
}

/* The bytes of the call's largest step: the call's, or on device buffers the first
 * staged chunk's. */
static size_t largest_step(const struct call *c) {
  const size_t bytes = c->count * hvdl_type_size(c->dt);
  const size_t chunk = hvdl_cuda_chunk_bytes(hvdl_type_size(c->dt));
  return c->device < 0 || bytes < chunk ? bytes : chunk;
}

/* ---- the host paths: select, then run -------------------------------------- */

static hvdlResult_t allreduce_host(const struct call *c, const void *send, void *recv,
                                   size_t count) {
  if (c->op == hvdlAdasum) return hvdl_allreduce_adasum(c->comm, send, recv, &count, 1, c->dt);
  const size_t bytes = count * hvdl_type_size(c->dt);
  return run_allreduce(c->comm, hvdl_select_allreduce(c->comm, bytes), send, recv, count, c->dt,
                       c->op);
}

static hvdlResult_t broadcast_host(const struct call *c, const void *send, void *recv,
                                   size_t count) {
  const size_t bytes = count * hvdl_type_size(c->dt);
  return hvdl_broadcast_run(c->comm, hvdl_select_broadcast(c->comm, bytes), send, recv, count,
                            c->dt, c->root);
}

static hvdlResult_t reduce_host(const struct call *c, const void *send, void *recv, size_t count) {
  hvdlComm_t comm = c->comm;
  const size_t bytes = count * hvdl_type_size(c->dt);
  const hvdlAlgorithm_t algo = hvdl_select_allreduce(comm, bytes);
  HVDL_CHECK(check_latency_bytes(comm, c->fn, algo, bytes));
  /* The shared-memory path reduces in the latency path's order up to the crossover and
   * in the ring's above (segment.c): reduce_ring.c's two paths give the same bits. */
  if (algo == hvdlAlgoLatency || algo == hvdlAlgoRing || algo == hvdlAlgoShm)
    return hvdl_reduce_root(
        comm, send, recv, count, c->dt, c->op, c->root,
        algo == hvdlAlgoShm ? bytes <= comm->config.smallAllReduceBytes : algo == hvdlAlgoLatency);
  /* Any other algorithm: run that all-reduce (a rank other than the root into
   * scratch), so that the root gets hvdlAllReduce's bits. */
  void *into = recv;
  if (comm->rank != c->root) {
    struct hvdl_scratch *s = &comm->scratch;
    HVDL_CHECK(hvdl_reserve(comm, &s->block, &s->block_bytes, bytes));
    into = s->block;
  }
  return run_allreduce(comm, algo, send, into, count, c->dt, c->op);
}

static hvdlResult_t allgather_host(const struct call *c, const void *send, void *recv,
                                   size_t count) {
  size_t *counts = NULL;
  HVDL_CHECK(equal_counts(c->comm, count, &counts));
  const size_t bytes = count * hvdl_type_size(c->dt) * (size_t)c->comm->size;
  return hvdl_allgather_run(c->comm, hvdl_select_allgather(c->comm, bytes), send, recv, counts,
                            c->dt);
}

static hvdlResult_t reducescatter_host(const struct call *c, const void *send, void *recv,
                                       size_t count) {
  size_t *counts = NULL;
  HVDL_CHECK(equal_counts(c->comm, count, &counts));
  const size_t bytes = count * hvdl_type_size(c->dt) * (size_t)c->comm->size;
  return hvdl_reducescatter_run(c->comm, hvdl_select_reducescatter(c->comm, bytes), send, recv,
                                counts, c->dt, c->op);
}

/* n blocks of count elements each way (the caller has refused more than 2 GiB per rank). */
static hvdlResult_t alltoall_host(const struct call *c, const void *send, void *recv,
                                  size_t count) {
  const size_t block = count * hvdl_type_size(c->dt);
  return hvdl_alltoall_run(c->comm, hvdl_select_alltoall(c->comm, block), send, recv, block);
}

/* ---- the entry points: check, then dispatch -------------------------------- */

hvdlResult_t hvdlAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           hvdlDataType_t datatype, hvdlRedOp_t op, hvdlComm_t comm,
                           hvdlStream_t stream) {
  struct call c = {
      "hvdlAllReduce", comm, sendbuff, recvbuff, count,
      datatype,        op,   0,        stream,   TAKES_OP | TAKES_DEVICE | TAKES_ADASUM,
      allreduce_host,  0,    0,        -1};
  HVDL_CHECK(check_args(&c));
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(&c);
  const size_t step = largest_step(&c);
  if (op != hvdlAdasum)
    HVDL_CHECK(check_latency_bytes(comm, c.fn, hvdl_select_allreduce(comm, step), step));
  return dispatch(&c);
}

hvdlResult_t hvdlBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           hvdlDataType_t datatype, int root, hvdlComm_t comm,
                           hvdlStream_t stream) {
  struct call c = {
      "hvdlBroadcast", comm,    sendbuff, recvbuff, count,
      datatype,        hvdlSum, root,     stream,   TAKES_ROOT | ROOT_SENDS | TAKES_DEVICE,
      broadcast_host,  0,       0,        -1};
  HVDL_CHECK(check_args(&c));
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(&c);
  return dispatch(&c);
}

hvdlResult_t hvdlReduce(const void *sendbuff, void *recvbuff, size_t count, hvdlDataType_t datatype,
                        hvdlRedOp_t op, int root, hvdlComm_t comm, hvdlStream_t stream) {
  struct call c = {"hvdlReduce", comm, sendbuff, recvbuff, count,
                   datatype,     op,   root,     stream,   TAKES_OP | TAKES_ROOT | ROOT_RECEIVES,
                   reduce_host,  0,    0,        -1};
  HVDL_CHECK(check_args(&c));
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(&c);
  return dispatch(&c);
}

hvdlResult_t hvdlAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           hvdlDataType_t datatype, hvdlComm_t comm, hvdlStream_t stream) {
  struct call c = {"hvdlAllGather", comm,    sendbuff, recvbuff, sendcount,
                   datatype,        hvdlSum, 0,        stream,   RECV_PER_RANK,
                   allgather_host,  0,       0,        -1};
  HVDL_CHECK(check_args(&c));
  if (sendcount == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(&c);
  return dispatch(&c);
}

hvdlResult_t hvdlReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               hvdlDataType_t datatype, hvdlRedOp_t op, hvdlComm_t comm,
                               hvdlStream_t stream) {
  struct call c = {"hvdlReduceScatter",
                   comm,
                   sendbuff,
                   recvbuff,
                   recvcount,
                   datatype,
                   op,
                   0,
                   stream,
                   TAKES_OP | SEND_PER_RANK,
                   reducescatter_host,
                   0,
                   0,
                   -1};
  HVDL_CHECK(check_args(&c));
  if (recvcount == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(&c);
  return dispatch(&c);
}

hvdlResult_t hvdlAllToAll(const void *sendbuff, void *recvbuff, size_t count,
                          hvdlDataType_t datatype, hvdlComm_t comm, hvdlStream_t stream) {
  struct call c = {"hvdlAllToAll", comm,    sendbuff, recvbuff, count,
                   datatype,       hvdlSum, 0,        stream,   SEND_PER_RANK | RECV_PER_RANK,
                   alltoall_host,  0,       0,        -1};
  HVDL_CHECK(check_args(&c));
  if (c.sendbytes / (size_t)comm->size > 0x7fffffff || c.sendbytes > 0x7fffffff)
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: more than 2 GiB per rank is not supported",
                     c.fn);
  if (count == 0) return hvdlSuccess;
  return dispatch(&c);
}
