/*
 * collectives.c -- the public collective entry points (hvdl.h): validation
 * (hvdlInvalidArgument before any traffic), then dispatch to an algorithm file;
 * device buffers go through cuda.c's staged form, whose steps are the host
 * algorithms. It calls the algorithms, cuda.c, config.c and errors.c; none of them
 * calls it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "algorithms/algorithms.h"
#include "base/base.h"
#include "cuda/cuda.h"
#include "select/select.h"
#include "transport/shm/shm.h"

/* ---- collectives --------------------------------------------------------- */

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
                     "(build_info()['cuda'] is False) and takes host memory only", fn);
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
                     "one device, or both in host memory", fn, sw, rw);
  }
  *device = sendbuff ? ds : dr;
  if (stream != NULL && *device < 0)
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: a stream was given but the buffers are in host memory; pass NULL "
                     "for host buffers", fn);
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

/* A reduction's op, and a type reductions apply to. */
static hvdlResult_t check_op(hvdlComm_t comm, const char *fn, hvdlRedOp_t op, hvdlDataType_t dt) {
  if ((unsigned)op >= hvdlNumOps)
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: invalid op %d (valid: 0..%d)", fn, (int)op,
                     hvdlNumOps - 1);
  if (!hvdl_type_reducible(dt))
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: %s data has no reduction ops (it moves with hvdlBroadcast, "
                     "hvdlAllGather and hvdlAllToAll)", fn, hvdl_type_name(dt));
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
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: sendbuff and recvbuff overlap without %s",
                     fn, rule);
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

/* Runs the selector's choice: the paths through the shared segment here, the
 * message-passing ones through select_allreduce.c. */
static hvdlResult_t run_allreduce(hvdlComm_t comm, hvdlAlgorithm_t algo, const void *sendbuff,
                                  void *recvbuff, size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  if (algo == hvdlAlgoShm) return hvdl_allreduce_shm(comm, sendbuff, recvbuff, count, dt, op);
  if (algo == hvdlAlgoHierarchical)
    return hvdl_allreduce_hier(comm, sendbuff, recvbuff, count, dt, op, hvdl_allreduce_selected);
  return hvdl_allreduce_run(comm, algo, sendbuff, recvbuff, count, dt, op);
}

/* A communicator of one rank: the result is the input (bytes of it), on the host or,
 * queued on the stream, on the device. */
static hvdlResult_t copy_alone(hvdlComm_t comm, int device, void *recvbuff, const void *sendbuff,
                               size_t bytes, hvdlStream_t stream) {
  if (device >= 0) return hvdl_cuda_copy(comm, recvbuff, sendbuff, bytes, stream);
  if (sendbuff != recvbuff) hvdl_copy(recvbuff, sendbuff, bytes);
  return hvdlSuccess;
}

/* A staged call's step arguments (cuda.c runs the steps on pinned host chunks). */
struct staged_call {
  hvdlDataType_t dt;
  hvdlRedOp_t op;
  int root;
};

static hvdlResult_t allreduce_chunk(hvdlComm_t comm, void *host, size_t bytes, size_t offset,
                                    void *arg) {
  const struct staged_call *c = arg;
  return run_allreduce(comm, hvdl_select_allreduce(comm, bytes), host, host,
                       bytes / hvdl_type_size(c->dt), c->dt, c->op);
}

static hvdlResult_t broadcast_chunk(hvdlComm_t comm, void *host, size_t bytes, size_t offset,
                                    void *arg) {
  const struct staged_call *c = arg;
  return hvdl_broadcast_run(comm, hvdl_select_broadcast(comm, bytes), host, host,
                            bytes / hvdl_type_size(c->dt), c->dt, c->root);
}

hvdlResult_t hvdlAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           hvdlDataType_t datatype, hvdlRedOp_t op, hvdlComm_t comm,
                           hvdlStream_t stream) {
  const char *fn = "hvdlAllReduce";
  size_t bytes = 0;
  HVDL_CHECK(check_call(comm, fn, datatype, stream));
  HVDL_CHECK(check_bytes(comm, fn, count, 1, datatype, &bytes));
  HVDL_CHECK(check_buffers(comm, fn, sendbuff, bytes, recvbuff, bytes, sendbuff == recvbuff,
                           "being identical"));
  HVDL_CHECK(check_op(comm, fn, op, datatype));
  int device = -1;
  HVDL_CHECK(check_memory(comm, fn, sendbuff, recvbuff, stream, &device));
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(comm, device, recvbuff, sendbuff, bytes, stream);
  /* Device buffers: the same algorithm on each staged chunk (the first is the largest). */
  const size_t esize = hvdl_type_size(datatype);
  const size_t first = device < 0 || bytes < HVDL_CUDA_STAGE_BYTES / esize * esize
                           ? bytes : HVDL_CUDA_STAGE_BYTES / esize * esize;
  HVDL_CHECK(check_latency_bytes(comm, fn, hvdl_select_allreduce(comm, first), first));
  if (device >= 0) {
    struct staged_call call = {datatype, op, 0};
    return hvdl_cuda_staged(comm, sendbuff, recvbuff, bytes, esize, stream, allreduce_chunk, &call);
  }
  return run_allreduce(comm, hvdl_select_allreduce(comm, bytes), sendbuff, recvbuff, count,
                       datatype, op);
}

hvdlResult_t hvdlBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           hvdlDataType_t datatype, int root, hvdlComm_t comm,
                           hvdlStream_t stream) {
  const char *fn = "hvdlBroadcast";
  size_t bytes = 0;
  HVDL_CHECK(check_call(comm, fn, datatype, stream));
  HVDL_CHECK(check_bytes(comm, fn, count, 1, datatype, &bytes));
  HVDL_CHECK(check_root(comm, fn, root));
  /* Only the root reads sendbuff. */
  const size_t sendbytes = comm->rank == root ? bytes : 0;
  HVDL_CHECK(check_buffers(comm, fn, sendbuff, sendbytes, recvbuff, bytes, sendbuff == recvbuff,
                           "being identical"));
  int device = -1;
  HVDL_CHECK(check_memory(comm, fn, sendbytes ? sendbuff : NULL, recvbuff, stream, &device));
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(comm, device, recvbuff, sendbuff, bytes, stream);
  if (device >= 0) {
    struct staged_call call = {datatype, hvdlSum, root};
    return hvdl_cuda_staged(comm, comm->rank == root ? sendbuff : NULL, recvbuff, bytes,
                            hvdl_type_size(datatype), stream, broadcast_chunk, &call);
  }
  return hvdl_broadcast_run(comm, hvdl_select_broadcast(comm, bytes), sendbuff, recvbuff, count,
                            datatype, root);
}

hvdlResult_t hvdlReduce(const void *sendbuff, void *recvbuff, size_t count,
                        hvdlDataType_t datatype, hvdlRedOp_t op, int root, hvdlComm_t comm,
                        hvdlStream_t stream) {
  const char *fn = "hvdlReduce";
  size_t bytes = 0;
  HVDL_CHECK(check_call(comm, fn, datatype, stream));
  HVDL_CHECK(check_bytes(comm, fn, count, 1, datatype, &bytes));
  HVDL_CHECK(check_root(comm, fn, root));
  /* Only the root writes recvbuff. */
  const size_t recvbytes = comm->rank == root ? bytes : 0;
  HVDL_CHECK(check_buffers(comm, fn, sendbuff, bytes, recvbuff, recvbytes, sendbuff == recvbuff,
                           "being identical"));
  HVDL_CHECK(check_host(comm, fn, sendbuff, recvbuff, stream));
  HVDL_CHECK(check_op(comm, fn, op, datatype));
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(comm, -1, recvbuff, sendbuff, bytes, NULL);
  const hvdlAlgorithm_t algo = hvdl_select_allreduce(comm, bytes);
  HVDL_CHECK(check_latency_bytes(comm, fn, algo, bytes));
  /* The shared-memory path reduces in the latency path's order up to the crossover and
   * in the ring's above (segment.c): reduce_ring.c's two paths give the same bits. */
  if (algo == hvdlAlgoLatency || algo == hvdlAlgoRing || algo == hvdlAlgoShm)
    return hvdl_reduce_root(comm, sendbuff, recvbuff, count, datatype, op, root,
                            algo == hvdlAlgoShm ? bytes <= comm->config.smallAllReduceBytes
                                                : algo == hvdlAlgoLatency);
  /* Any other algorithm: run that all-reduce (a rank other than the root into
   * scratch), so that the root gets hvdlAllReduce's bits. */
  void *into = recvbuff;
  if (comm->rank != root) {
    struct hvdl_scratch *s = &comm->scratch;
    HVDL_CHECK(hvdl_reserve(comm, &s->block, &s->block_bytes, bytes));
    into = s->block;
  }
  return run_allreduce(comm, algo, sendbuff, into, count, datatype, op);
}

hvdlResult_t hvdlAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           hvdlDataType_t datatype, hvdlComm_t comm, hvdlStream_t stream) {
  const char *fn = "hvdlAllGather";
  size_t sendbytes = 0, recvbytes = 0;
  HVDL_CHECK(check_call(comm, fn, datatype, stream));
  HVDL_CHECK(check_bytes(comm, fn, sendcount, (size_t)comm->size, datatype, &recvbytes));
  sendbytes = recvbytes / (size_t)comm->size;
  const int inplace = (uintptr_t)sendbuff == (uintptr_t)recvbuff + (size_t)comm->rank * sendbytes;
  HVDL_CHECK(check_buffers(comm, fn, sendbuff, sendbytes, recvbuff, recvbytes, inplace,
                           "being in place (sendbuff == recvbuff + rank * sendcount)"));
  HVDL_CHECK(check_host(comm, fn, sendbuff, recvbuff, stream));
  if (sendcount == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(comm, -1, recvbuff, sendbuff, sendbytes, NULL);
  size_t *counts = NULL;
  HVDL_CHECK(equal_counts(comm, sendcount, &counts));
  return hvdl_allgather_run(comm, hvdl_select_allgather(comm, recvbytes), sendbuff, recvbuff,
                            counts, datatype);
}

hvdlResult_t hvdlReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               hvdlDataType_t datatype, hvdlRedOp_t op, hvdlComm_t comm,
                               hvdlStream_t stream) {
  const char *fn = "hvdlReduceScatter";
  size_t sendbytes = 0, recvbytes = 0;
  HVDL_CHECK(check_call(comm, fn, datatype, stream));
  HVDL_CHECK(check_bytes(comm, fn, recvcount, (size_t)comm->size, datatype, &sendbytes));
  recvbytes = sendbytes / (size_t)comm->size;
  const int inplace = (uintptr_t)recvbuff == (uintptr_t)sendbuff + (size_t)comm->rank * recvbytes;
  HVDL_CHECK(check_buffers(comm, fn, sendbuff, sendbytes, recvbuff, recvbytes, inplace,
                           "being in place (recvbuff == sendbuff + rank * recvcount)"));
  HVDL_CHECK(check_host(comm, fn, sendbuff, recvbuff, stream));
  HVDL_CHECK(check_op(comm, fn, op, datatype));
  if (recvcount == 0) return hvdlSuccess;
  if (comm->size == 1) return copy_alone(comm, -1, recvbuff, sendbuff, recvbytes, NULL);
  size_t *counts = NULL;
  HVDL_CHECK(equal_counts(comm, recvcount, &counts));
  return hvdl_reducescatter_run(comm, hvdl_select_reducescatter(comm, sendbytes), sendbuff,
                                recvbuff, counts, datatype, op);
}

hvdlResult_t hvdlAllToAll(const void *sendbuff, void *recvbuff, size_t count,
                          hvdlDataType_t datatype, hvdlComm_t comm, hvdlStream_t stream) {
  const char *fn = "hvdlAllToAll";
  size_t bytes = 0;
  HVDL_CHECK(check_call(comm, fn, datatype, stream));
  HVDL_CHECK(check_bytes(comm, fn, count, (size_t)comm->size, datatype, &bytes));
  HVDL_CHECK(check_buffers(comm, fn, sendbuff, bytes, recvbuff, bytes, 0, "(no in-place form)"));
  HVDL_CHECK(check_host(comm, fn, sendbuff, recvbuff, stream));
  const size_t block = bytes / (size_t)comm->size;
  if (block > 0x7fffffff || bytes > 0x7fffffff)
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: more than 2 GiB per rank is not supported", fn);
  if (count == 0) return hvdlSuccess;
  int *ints = malloc(sizeof *ints * 2 * (size_t)comm->size);
  if (!ints) return hvdl_fail(comm, hvdlSystemError, "%s: out of memory", fn);
  for (int q = 0; q < comm->size; q++) {
    ints[q] = (int)block;
    ints[comm->size + q] = (int)(block * (size_t)q);
  }
  hvdlResult_t res =
      hvdl_alltoallv(comm, sendbuff, ints, ints + comm->size, recvbuff, ints, ints + comm->size);
  free(ints);
  return res;
}
