/*
 * alltoall_pairwise.c -- all-to-all: every rank sends block q of its buffer to rank q.
 *
 * Pairwise, all at once: for i = 1 .. n-1 rank r posts the receive from rank
 * r-i and the send to rank r+i (so the pairs are spread round the ring rather
 * than all aimed at rank 0 first), copies its own block locally, and waits for
 * everything with hvdl_wait_all (spinning: over shared memory the receiver copies
 * each block inside its own MPI_Test calls).
 *
 * One step; per rank (n-1)/n * B sent and received, B/n copied locally.
 *
 * hvdl_alltoall_pairwise is the same for n blocks of one size (hvdlAllToAll's); in place,
 * it first copies the input into scratch (comm->scratch.work), since a block's receive
 * may land where a send has yet to read.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/base.h"

#define ALLTOALL_TAG 0x4857

hvdlResult_t hvdl_alltoallv(hvdlComm_t comm, const void *send, const int *scounts,
                            const int *sdispls, void *recv, const int *rcounts,
                            const int *rdispls) {
  const int n = comm->size, me = comm->rank;
  MPI_Request *reqs = malloc(sizeof *reqs * (size_t)(2 * n)); /* sends, then receives */
  if (!reqs) return hvdl_fail(comm, hvdlSystemError, "alltoall: out of memory");
  for (int i = 0; i < 2 * n; i++) reqs[i] = MPI_REQUEST_NULL;
  MPI_Request *sreq = reqs, *rreq = reqs + n;
  int k = 0;
  hvdlResult_t res = hvdlSuccess;
  for (int i = 1; i < n && res == hvdlSuccess; i++) {
    const int from = (me - i + n) % n, to = (me + i) % n;
    if (hvdl_fault_hit(comm->faults, HVDL_FAULT_RECV) ||
        hvdl_fault_hit(comm->faults, HVDL_FAULT_SEND)) {
      res = hvdl_fail(comm, hvdlSystemError, "alltoall: injected fault (HVD_LITE_FAULT)");
      break;
    }
    int err = MPI_Irecv((char *)recv + rdispls[from], rcounts[from], MPI_BYTE, from, ALLTOALL_TAG,
                        comm->mpi, &rreq[k]);
    if (err == MPI_SUCCESS)
      err = MPI_Isend((const char *)send + sdispls[to], scounts[to], MPI_BYTE, to, ALLTOALL_TAG,
                      comm->mpi, &sreq[k]);
    k++;
    if (err != MPI_SUCCESS) res = hvdl_fail_mpi(comm, err, "alltoall: MPI_Isend/MPI_Irecv");
  }
  if (send != recv || sdispls[me] != rdispls[me])
    hvdl_copy((char *)recv + rdispls[me], (const char *)send + sdispls[me], (size_t)scounts[me]);
  if (res == hvdlSuccess) res = hvdl_wait_all(comm, 2 * n, reqs);
  if (res != hvdlSuccess) {
    const double until = hvdl_now() + HVDL_ABANDON_GRACE;
    hvdl_abandon(comm, k, rreq, 1, until);
    hvdl_abandon(comm, k, sreq, 0, until);
  }
  free(reqs);
  return res;
}

hvdlResult_t hvdl_alltoall_pairwise(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                    size_t block) {
  const int n = comm->size;
  int *ints = malloc(sizeof *ints * 2 * (size_t)n); /* the counts, then the displacements */
  if (!ints) return hvdl_fail(comm, hvdlSystemError, "alltoall: out of memory");
  for (int q = 0; q < n; q++) {
    ints[q] = (int)block;
    ints[n + q] = (int)(block * (size_t)q);
  }
  hvdlResult_t res = hvdlSuccess;
  const void *send = sendbuff;
  if (sendbuff == recvbuff && n > 1 && block > 0) {
    struct hvdl_scratch *s = &comm->scratch;
    res = hvdl_reserve(comm, &s->work, &s->work_bytes, block * (size_t)n);
    if (res == hvdlSuccess) hvdl_copy(s->work, sendbuff, block * (size_t)n);
    send = s->work;
  }
  if (res == hvdlSuccess)
    res = hvdl_alltoallv(comm, send, ints, ints + n, recvbuff, ints, ints + n);
  free(ints);
  return res;
}
