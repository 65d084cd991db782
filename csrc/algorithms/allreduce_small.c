/*
 * allreduce_small.c -- the latency path for small all-reduces.
 *
 * Below config.smallAllReduceBytes a ring's 2(n-1) dependent steps cost more
 * in per-message latency than the data costs to move. Instead every rank
 * gathers every rank's input (one MPI_Iallgather, a single latency-optimised
 * exchange) and reduces the n inputs itself in rank order:
 *
 *   recvbuff = ((x0 op x1) op x2) ... op x(n-1)      [Avg: then / n]
 *
 * Every rank runs the same operations on the same bytes in the same order, so
 * the results are bitwise identical, as on the ring.
 *
 * Cost per rank: 1 collective step (MPI's allgather: log2(n) rounds in most
 * MPIs), (n-1) * bytes received, (n-1) * bytes reduced. The crossover with the
 * ring was measured with `python -m hvd_lite.bench allreduce` (docs/benchmarks-history.md).
 */
#include "algorithms/algorithms.h"
#include "base/base.h"
#include "kernels/kernels.h"

void hvdl_small_fold(void *recvbuff, const char *gather, size_t count, int n, hvdlDataType_t dt,
                     hvdlRedOp_t op) {
  const size_t bytes = count * hvdl_type_size(dt);
  hvdl_reduce(recvbuff, gather, gather + bytes, count, dt, op);
  for (int i = 2; i < n; i++)
    hvdl_reduce(recvbuff, recvbuff, gather + (size_t)i * bytes, count, dt, op);
  if (op == hvdlAvg) hvdl_divide(recvbuff, count, dt, (uint64_t)n);
}

hvdlResult_t hvdl_allreduce_small(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                  size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  const size_t bytes = count * hvdl_type_size(dt);
  const int n = comm->size;
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->gather, &s->gather_bytes, (size_t)n * bytes));

  if (hvdl_fault_hit(comm->faults, HVDL_FAULT_SEND))
    return hvdl_fail(comm, hvdlSystemError, "injected fault (HVD_LITE_FAULT): a send failed");
  MPI_Request req;
  HVDL_MPI(comm, MPI_Iallgather(sendbuff, (int)bytes, MPI_BYTE, s->gather, (int)bytes, MPI_BYTE,
                                comm->mpi, &req));
  hvdlResult_t res = hvdl_wait_all(comm, 1, &req);
  if (res != hvdlSuccess) {
    /* The abandoned all-gather may still write into its buffer: it is left to it. */
    s->gather = NULL;
    s->gather_bytes = 0;
    return res;
  }
  hvdl_small_fold(recvbuff, s->gather, count, n, dt, op);
  return hvdlSuccess;
}
