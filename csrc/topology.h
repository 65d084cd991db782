/*
 * topology.h -- where a rank sits among its communicator's hosts, and the
 * communicator of a subset of ranks (the Engine's base when init is given a
 * list of ranks).
 */
#ifndef HVDL_TOPOLOGY_H_
#define HVDL_TOPOLOGY_H_

#include "hvdl.h"

/* This rank's place in a communicator: among all ranks, among the ranks of its
 * host (local), and among the ranks with its local rank, one per host (cross). */
struct hvdl_topology {
  int rank, size;
  int local_rank, local_size;
  int cross_rank, cross_size;
};

/* Makes *local, the ranks of comm on this rank's host, in rank order (collective
 * over comm): MPI_COMM_TYPE_SHARED, cut into hosts of k consecutive ranks when
 * HVD_LITE_RANKS_PER_HOST=k (a testing aid). The caller frees *local. */
hvdlResult_t hvdl_local_comm(MPI_Comm comm, MPI_Comm *local);

/* Fills *out for the calling rank (collective over comm: every rank calls it).
 * hvdlSystemError with MPI's text if MPI fails. */
hvdlResult_t hvdl_topology(MPI_Comm comm, struct hvdl_topology *out);

/* Makes *out, the communicator of ranks[0 .. n-1] of base, in that order. Only
 * the listed ranks call it (MPI_Comm_create_group). hvdlInvalidArgument, before
 * any MPI traffic, for a rank outside [0, size of base) or a caller that is not
 * in the list; hvdlSystemError if MPI fails. The caller frees *out. */
hvdlResult_t hvdl_comm_subset(MPI_Comm base, const long long *ranks, int n, MPI_Comm *out);

#endif /* HVDL_TOPOLOGY_H_ */
