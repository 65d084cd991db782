/* TEMPORARY (branch ecoll only): MPI-based stand-ins until the ring versions land. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "reduce.h"

hvdlResult_t hvdlBroadcast(const void *sendbuff, void *recvbuff, size_t count, hvdlDataType_t dt,
                           int root, hvdlComm_t comm, hvdlStream_t stream) {
  (void)stream;
  size_t bytes = count * hvdl_type_size(dt);
  if (comm->rank == root && sendbuff != recvbuff) memcpy(recvbuff, sendbuff, bytes);
  HVDL_MPI(comm, MPI_Bcast(recvbuff, (int)bytes, MPI_BYTE, root, comm->mpi));
  return hvdlSuccess;
}

hvdlResult_t hvdl_allgatherv(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                             const size_t *counts, hvdlDataType_t dt) {
  int n = comm->size, *c = malloc(sizeof(int) * 2 * (size_t)n);
  size_t es = hvdl_type_size(dt), off = 0;
  for (int q = 0; q < n; q++) { c[q] = (int)(counts[q] * es); c[n + q] = (int)off; off += counts[q] * es; }
  int err = MPI_Allgatherv(sendbuff, c[comm->rank], MPI_BYTE, recvbuff, c, c + n, MPI_BYTE, comm->mpi);
  free(c);
  return err == MPI_SUCCESS ? hvdlSuccess : hvdl_fail_mpi(comm, err, "MPI_Allgatherv");
}

hvdlResult_t hvdl_reducescatterv(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op) {
  size_t total = 0, off = 0;
  for (int q = 0; q < comm->size; q++) { if (q < comm->rank) off += counts[q]; total += counts[q]; }
  size_t es = hvdl_type_size(dt);
  char *tmp = malloc(total * es + 1);
  hvdlResult_t res = hvdlAllReduce(sendbuff, tmp, total, dt, op, comm, NULL);
  if (res == hvdlSuccess) memcpy(recvbuff, tmp + off * es, counts[comm->rank] * es);
  free(tmp);
  return res;
}
