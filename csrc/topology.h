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
  int homogeneous; /* 1 when every host has the same number of ranks */
};

/* Fills *out for the calling rank (collective over comm: every rank calls it).
 * hvdlSystemError with MPI's text if MPI fails. */
hvdlResult_t hvdl_topology(MPI_Comm comm, struct hvdl_topology *out);

/* Makes *local, the communicator of the ranks of comm on this rank's host, in
 * rank order (collective over comm; the caller frees it). */
hvdlResult_t hvdl_local_comm(MPI_Comm comm, MPI_Comm *local);

/* *ranks, the ranks of comm on this rank's host (the real one: HVD_LITE_RANKS_PER_HOST
 * aside), and *cpus, how many CPUs they may run on between them: the union of their
 * affinity masks (Linux; elsewhere the online CPUs). Collective over comm. More ranks
 * than CPUs means an oversubscribed host (a launcher's --oversubscribe, taskset or a
 * container's cpuset), where every wait's spins must yield (wait.c). hvdlSystemError
 * with MPI's text if MPI fails. */
hvdlResult_t hvdl_host_cpus(MPI_Comm comm, int *ranks, int *cpus);

/* Makes *out, the communicator of ranks[0 .. n-1] of base, in that order. Only
 * the listed ranks call it (MPI_Comm_create_group). hvdlInvalidArgument, before
 * any MPI traffic, for a rank outside [0, size of base) or a caller that is not
 * in the list; hvdlSystemError if MPI fails. The caller frees *out. */
hvdlResult_t hvdl_comm_subset(MPI_Comm base, const long long *ranks, int n, MPI_Comm *out);

#endif /* HVDL_TOPOLOGY_H_ */
