/*
 * comm.c -- communicators and the public collective entry points: validation
 * (hvdlInvalidArgument before any traffic), then dispatch to an algorithm file.
 * It calls the algorithms, config.c and base.c; the algorithms never call it.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "shm.h"
#include "topology.h"


/* Frees comm's memory; `collective` also frees what every rank frees together
 * (the shared segment, the cross-host communicator). */
static void free_comm(hvdlComm_t comm, int collective) {
  if (comm->cross) {
    if (collective) hvdlCommDestroy(comm->cross);
    else hvdlCommAbort(comm->cross);
  }
  hvdl_shm_free(comm, collective);
  free(comm->rank_names);
  free(comm->parked);
  free(comm->scratch.tmp);
  free(comm->scratch.gather);
  free(comm->scratch.sreq);
  free(comm->scratch.stage);
  free(comm->scratch.block);
  free(comm->scratch.counts);
  free(comm->scratch.work);
  hvdl_hier_p2p_free(comm->hier_p2p);
  free(comm);
}

/* The communicator of this rank's lane across hosts (allreduce_hier.c), from
 * `from` (collective over it; MPI_COMM_NULL for a local rank without a lane). */
static hvdlResult_t split_lanes(hvdlComm_t comm, MPI_Comm from, MPI_Comm *out) {
  const struct hvdl_shm *s = comm->shm;
  const int color = s->local_rank < s->lanes ? s->local_rank : MPI_UNDEFINED;
  HVDL_MPI(comm, MPI_Comm_split(from, color, comm->rank, out));
  return hvdlSuccess;
}

/* sub->rank_names: the rank in comm of each of sub's ranks (collective over sub). */
static hvdlResult_t name_ranks(hvdlComm_t comm, hvdlComm_t sub) {
  sub->rank_names = malloc(sizeof(int) * (size_t)sub->size);
  if (!sub->rank_names) return hvdl_fail(comm, hvdlSystemError, "hvdlCommInitMpi: out of memory");
  HVDL_MPI(comm, MPI_Allgather(&comm->rank, 1, MPI_INT, sub->rank_names, 1, MPI_INT, sub->mpi));
  return hvdlSuccess;
}

/* one_per_host: mpi_comm has one rank on each host (a lane across hosts). */
static hvdlResult_t new_comm(hvdlComm_t *out, MPI_Comm mpi_comm, const hvdlConfig_t *cfg,
                             int one_per_host) {
  hvdlComm_t comm = calloc(1, sizeof *comm);
  if (!comm) return hvdl_fail(NULL, hvdlSystemError, "hvdlCommInitMpi: out of memory");
  comm->config = *cfg;
  int err = MPI_Comm_dup(mpi_comm, &comm->mpi);
  if (err != MPI_SUCCESS) {
    free_comm(comm, 0);
    return hvdl_fail_mpi(NULL, err, "MPI_Comm_dup in hvdlCommInitMpi");
  }
  /* Errors on our communicator come back as codes; they never abort the job. */
  MPI_Comm_set_errhandler(comm->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm->mpi, &comm->rank);
  MPI_Comm_size(comm->mpi, &comm->size);
  int host_ranks = 1, host_cpus = 1; /* a lane across hosts has one rank on each */
  hvdlResult_t res = one_per_host ? hvdlSuccess : hvdl_host_cpus(comm->mpi, &host_ranks, &host_cpus);
  if (res != hvdlSuccess) hvdl_fail(comm, res, "%s", hvdlGetLastError(NULL));
  hvdl_note_host_cpus(host_ranks, host_cpus);
  if (res == hvdlSuccess) res = hvdl_shm_init(comm);
  if (res == hvdlSuccess) res = hvdl_shm_cma_init(comm);
  /* The selector sees what the shared-memory unit made possible. */
  if (res == hvdlSuccess) res = hvdl_select_init(comm, one_per_host);
  if (res == hvdlSuccess && comm->config.smallAllReduceBytes == HVDL_SMALL_BYTES_AUTO)
    comm->config.smallAllReduceBytes = hvdl_small_bytes_default(comm->size, comm->hosts);
  if (res == hvdlSuccess && comm->shm && comm->shm->hosts > 1) {
    MPI_Comm lane = MPI_COMM_NULL;
    hvdlConfig_t across = *cfg;
    across.disableShm = 1; /* one rank per host: nothing to share */
    if (across.allReduceAlgorithm == hvdlAlgoHierarchical ||
        across.allReduceAlgorithm == hvdlAlgoHierP2p) /* the lanes: the selector's choice */
      across.allReduceAlgorithm = hvdlAlgoAuto;
    res = split_lanes(comm, comm->mpi, &lane);
    if (res == hvdlSuccess && lane != MPI_COMM_NULL) {
      res = new_comm(&comm->cross, lane, &across, 1);
      MPI_Comm_free(&lane);
      if (res == hvdlSuccess) res = name_ranks(comm, comm->cross);
    }
  }
  if (res != hvdlSuccess) {
    hvdl_fail(NULL, res, "hvdlCommInitMpi: %s", comm->last_error);
    free_comm(comm, 0);
    return res;
  }
  *out = comm;
  return hvdlSuccess;
}

hvdlResult_t hvdlCommInitMpi(hvdlComm_t *out, MPI_Comm mpi_comm, const hvdlConfig_t *config) {
  if (!out) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommInitMpi: comm is NULL");
  *out = NULL;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return hvdl_fail(NULL, hvdlInvalidUsage,
                     "hvdlCommInitMpi: MPI is %s; initialise MPI first",
                     finalized ? "already finalized" : "not initialised");
  if (mpi_comm == MPI_COMM_NULL)
    return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommInitMpi: the MPI communicator is MPI_COMM_NULL");

  hvdlConfig_t cfg;
  if (config) {
    cfg = *config;
  } else {
    HVDL_CHECK(hvdlConfigDefault(&cfg));
  }
  HVDL_CHECK(hvdl_config_check(&cfg));
  return new_comm(out, mpi_comm, &cfg, 0);
}

hvdlResult_t hvdl_comm_renew(hvdlComm_t comm, MPI_Comm from) {
  MPI_Comm fresh;
  HVDL_MPI(comm, MPI_Comm_dup(from, &fresh)); /* not of the old one: it may hold a collective */
  MPI_Comm_set_errhandler(fresh, MPI_ERRORS_RETURN);
  /* The old communicator is dropped, not freed: messages abandoned on it may still
   * sit in a peer's queue, and a freed communicator's context id can be given to a
   * later one, whose receives would then match them. One handle per failure. */
  comm->mpi = fresh;
  comm->broken = 0;
  /* Every rank has left the failed collectives: nobody can match a parked send now.
   * One that is still moving its message gets a moment to finish (an unmatched one
   * never will: this is not waited for long). */
  const double until = hvdl_now() + 0.05;
  int done = 0;
  while (comm->nparked > 0 &&
         MPI_Testall(comm->nparked, comm->parked, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
         !done && hvdl_now() < until)
    hvdl_sleep(1e-4);
  for (int i = 0; i < comm->nparked; i++)
    if (comm->parked[i] != MPI_REQUEST_NULL) MPI_Request_free(&comm->parked[i]);
  comm->nparked = 0;
  /* The shared segment's counters and the lanes' communicators start afresh too. */
  HVDL_CHECK(hvdl_shm_renew(comm));
  if (comm->shm && comm->shm->hosts > 1) {
    MPI_Comm lane = MPI_COMM_NULL;
    HVDL_CHECK(split_lanes(comm, fresh, &lane));
    if (lane != MPI_COMM_NULL) {
      hvdlResult_t res = hvdl_comm_renew(comm->cross, lane);
      MPI_Comm_free(&lane);
      if (res != hvdlSuccess) return hvdl_fail(comm, res, "%s", comm->cross->last_error);
    }
  }
  return hvdlSuccess;
}

hvdlResult_t hvdlCommDestroy(hvdlComm_t comm) {
  if (!comm) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommDestroy: comm is NULL");
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm->mpi);
  free_comm(comm, !finalized);
  return hvdlSuccess;
}

hvdlResult_t hvdlCommAbort(hvdlComm_t comm) {
  if (!comm) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommAbort: comm is NULL");
  /* MPI_Comm_free is local in practice but formally collective; after a failure
   * the peers may be gone, so the handle is dropped rather than freed (the shared window too). */
  free_comm(comm, 0);
  return hvdlSuccess;
}

hvdlResult_t hvdlCommCount(const hvdlComm_t comm, int *count) {
  if (!comm || !count) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommCount: NULL argument");
  *count = comm->size;
  return hvdlSuccess;
}

hvdlResult_t hvdlCommUserRank(const hvdlComm_t comm, int *rank) {
  if (!comm || !rank)
    return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommUserRank: NULL argument");
  *rank = comm->rank;
  return hvdlSuccess;
}

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
  if (stream != NULL)
    return hvdl_fail(comm, hvdlInvalidUsage,
                     "%s: stream must be NULL (this build supports host memory only)", fn);
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
 * message-passing ones through select.c. */
static hvdlResult_t run_allreduce(hvdlComm_t comm, hvdlAlgorithm_t algo, const void *sendbuff,
                                  void *recvbuff, size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  if (algo == hvdlAlgoShm) return hvdl_allreduce_shm(comm, sendbuff, recvbuff, count, dt, op);
  if (algo == hvdlAlgoHierarchical)
    return hvdl_allreduce_hier(comm, sendbuff, recvbuff, count, dt, op);
  return hvdl_allreduce_run(comm, algo, sendbuff, recvbuff, count, dt, op);
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
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) {
    if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, bytes);
    return hvdlSuccess;
  }
  const hvdlAlgorithm_t algo = hvdl_select_allreduce(comm, bytes);
  HVDL_CHECK(check_latency_bytes(comm, fn, algo, bytes));
  return run_allreduce(comm, algo, sendbuff, recvbuff, count, datatype, op);
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
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) {
    if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, bytes);
    return hvdlSuccess;
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
  HVDL_CHECK(check_op(comm, fn, op, datatype));
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) {
    if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, bytes);
    return hvdlSuccess;
  }
  const hvdlAlgorithm_t algo = hvdl_select_allreduce(comm, bytes);
  HVDL_CHECK(check_latency_bytes(comm, fn, algo, bytes));
  /* The shared-memory path reduces in the latency path's order up to the crossover and
   * in the ring's above (shm.c): reduce_root.c's two paths give the same bits. */
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
  if (sendcount == 0) return hvdlSuccess;
  if (comm->size == 1) {
    if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, sendbytes);
    return hvdlSuccess;
  }
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
  HVDL_CHECK(check_op(comm, fn, op, datatype));
  if (recvcount == 0) return hvdlSuccess;
  if (comm->size == 1) {
    if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, recvbytes);
    return hvdlSuccess;
  }
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
