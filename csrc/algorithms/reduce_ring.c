/*
 * reduce_ring.c -- reduce to one rank: the all-reduce's reduction, delivered
 * to the root only.
 *
 * hvdlReduce runs one of two paths, the one matching the algorithm the
 * all-reduce selector (select_allreduce.c) picks for the same call -- the latency path or
 * the ring; for any other, collectives.c runs that all-reduce instead -- and reduces
 * in the same order, so the root ends with exactly the bits hvdlAllReduce
 * would give:
 *
 * Latency path: one MPI_Igather of
 * every rank's input to the root, which reduces them in rank order,
 *
 *   recvbuff = ((x0 op x1) op x2) ... op x(n-1)      [Avg: then / n]
 *
 * as allreduce_small.c does on every rank (its fold, hvdl_small_fold).
 *
 * Ring path: the count elements are cut into n blocks as allreduce_ring.c cuts its
 * chunks (base.h's hvdl_block_start: count/n each, one more for the first count%n). Then
 *
 *   1. ring reduce-scatter (reducescatter_ring.c), n-1 receiving steps: rank k ends
 *      with block k reduced in ring order, x[k+1] op x[k+2] op ... op x[k],
 *      the order allreduce_ring.c uses for its chunk k. The root's block lands in
 *      recvbuff directly; the others' in scratch;
 *   2. gather, 1 step: every rank k != root sends its block to the root, which
 *      receives it into recvbuff at block k.
 *
 * In-place on the root (sendbuff == recvbuff) is safe: the reduce-scatter
 * writes only the root's own block (its in-place rule), and the gather
 * overwrites the other blocks only after the root's reduce-scatter has
 * finished reading them.
 *
 * Cost per rank (B bytes per rank, ring path): n steps; every rank sends
 * (n-1)/n * B in the reduce-scatter and its block, B/n, in the gather; the
 * root receives (n-1)/n * B twice; each rank reduces (n-1)/n * B.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/base.h"
#include "kernels/kernels.h"

#define GATHER_TAG 0x4852 /* "HR" */
/* The gather sends a block as messages of at most this many bytes (MPI counts are int). */
#define GATHER_MAX_MESSAGE ((size_t)1 << 30)

static hvdlResult_t reduce_small(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op, int root) {
  const size_t bytes = count * hvdl_type_size(dt);
  const int n = comm->size;
  struct hvdl_scratch *s = &comm->scratch;
  if (comm->rank == root)
    HVDL_CHECK(hvdl_reserve(comm, &s->gather, &s->gather_bytes, (size_t)n * bytes));

  MPI_Request req;
  HVDL_MPI(comm, MPI_Igather(sendbuff, (int)bytes, MPI_BYTE, s->gather, (int)bytes, MPI_BYTE, root,
                             comm->mpi, &req));
  HVDL_CHECK(hvdl_wait_all(comm, 1, &req));
  if (comm->rank != root) return hvdlSuccess;
  hvdl_small_fold(recvbuff, s->gather, count, n, dt, op);
  return hvdlSuccess;
}

/* Number of messages a block of `bytes` is sent as. */
static size_t messages(size_t bytes) {
  return (bytes + GATHER_MAX_MESSAGE - 1) / GATHER_MAX_MESSAGE;
}

/* Posts the sends (or receives) of one block to (or from) `peer`. */
static hvdlResult_t post_block(hvdlComm_t comm, int is_send, char *buf, size_t bytes, int peer,
                               MPI_Request *reqs, int *nreq) {
  for (size_t at = 0; at < bytes; at += GATHER_MAX_MESSAGE) {
    const int len = (int)(bytes - at < GATHER_MAX_MESSAGE ? bytes - at : GATHER_MAX_MESSAGE);
    if (is_send)
      HVDL_MPI(comm, MPI_Isend(buf + at, len, MPI_BYTE, peer, GATHER_TAG, comm->mpi, &reqs[*nreq]));
    else
      HVDL_MPI(comm, MPI_Irecv(buf + at, len, MPI_BYTE, peer, GATHER_TAG, comm->mpi, &reqs[*nreq]));
    ++*nreq;
  }
  return hvdlSuccess;
}

hvdlResult_t hvdl_reduce_root(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                              hvdlDataType_t dt, hvdlRedOp_t op, int root, int latency) {
  const size_t esize = hvdl_type_size(dt);
  if (latency) return reduce_small(comm, sendbuff, recvbuff, count, dt, op, root);

  const int n = comm->size, r = comm->rank;
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->counts, &s->counts_bytes, (size_t)n * sizeof(size_t)));
  size_t *counts = (size_t *)(void *)s->counts;
  for (int k = 0; k < n; k++) counts[k] = hvdl_block_len(count, n, k);

  char *mine;
  if (r == root) {
    mine = (char *)recvbuff + hvdl_block_start(count, n, r) * esize;
  } else {
    HVDL_CHECK(hvdl_reserve(comm, &s->block, &s->block_bytes, counts[r] * esize + 1));
    mine = s->block;
  }
  HVDL_CHECK(hvdl_reducescatterv(comm, sendbuff, mine, counts, dt, op));

  /* gather: requests go in the (now idle) request scratch. */
  size_t nmsg = 0;
  for (int k = 0; k < n; k++) nmsg += messages(counts[k] * esize);
  HVDL_CHECK(hvdl_reserve(comm, &s->sreq, &s->sreq_bytes, nmsg * sizeof(MPI_Request)));
  MPI_Request *reqs = (MPI_Request *)(void *)s->sreq;
  int nreq = 0;
  if (r == root) {
    for (int k = 0; k < n; k++)
      if (k != root)
        HVDL_CHECK(post_block(comm, 0, (char *)recvbuff + hvdl_block_start(count, n, k) * esize,
                              counts[k] * esize, k, reqs, &nreq));
  } else {
    HVDL_CHECK(post_block(comm, 1, mine, counts[r] * esize, root, reqs, &nreq));
  }
  if (nreq > 0) HVDL_CHECK(hvdl_wait_all(comm, nreq, reqs));
  return hvdlSuccess;
}
