/*
 * topology.c -- a rank's host layout, and sub-communicators of listed ranks.
 *
 * Local ranks are the ranks that share memory with this one
 * (MPI_COMM_TYPE_SHARED, ordered by rank; HVD_LITE_RANKS_PER_HOST=k cuts them into
 * emulated hosts of k consecutive ranks, for tests); cross ranks are the ranks with the
 * same local rank, one per host, ordered by rank. Both communicators are made,
 * read and freed here: the engine keeps none of them.
 */
#include <stdlib.h>

#include "internal.h"
#include "topology.h"

/* MPI_Comm_create_group's tag for the subset communicator ("HV"). */
#define SUBSET_TAG 0x4856

hvdlResult_t hvdl_local_comm(MPI_Comm comm, MPI_Comm *local) {
  int rank, k, err;
  HVDL_CHECK(hvdl_config_ranks_per_host(&k));
  MPI_Comm_rank(comm, &rank);
  MPI_Comm shared;
  err = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
  if (err != MPI_SUCCESS) return hvdl_fail_mpi(NULL, err, "MPI_Comm_split_type");
  if (k == 0) {
    *local = shared;
    return hvdlSuccess;
  }
  /* Emulated hosts of k ranks, inside the real ones: memory is still shared. */
  err = MPI_Comm_split(shared, rank / k, rank, local);
  MPI_Comm_free(&shared);
  if (err != MPI_SUCCESS) return hvdl_fail_mpi(NULL, err, "MPI_Comm_split (HVD_LITE_RANKS_PER_HOST)");
  return hvdlSuccess;
}

hvdlResult_t hvdl_topology(MPI_Comm comm, struct hvdl_topology *out) {
  MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  int err;
  MPI_Comm_rank(comm, &out->rank);
  MPI_Comm_size(comm, &out->size);
  HVDL_CHECK(hvdl_local_comm(comm, &local));
  MPI_Comm_rank(local, &out->local_rank);
  MPI_Comm_size(local, &out->local_size);
  err = MPI_Comm_split(comm, out->local_rank, out->rank, &cross);
  if (err != MPI_SUCCESS) {
    MPI_Comm_free(&local);
    return hvdl_fail_mpi(NULL, err, "MPI_Comm_split");
  }
  MPI_Comm_rank(cross, &out->cross_rank);
  MPI_Comm_size(cross, &out->cross_size);
  MPI_Comm_free(&local);
  MPI_Comm_free(&cross);
  return hvdlSuccess;
}

hvdlResult_t hvdl_comm_subset(MPI_Comm base, const long long *ranks, int n, MPI_Comm *out) {
  int base_size, base_rank, member = 0, err;
  MPI_Comm_size(base, &base_size);
  MPI_Comm_rank(base, &base_rank);
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= base_size)
      return hvdl_fail(NULL, hvdlInvalidArgument,
                       "init(comm=[...]): rank %lld is out of range [0, %d)", ranks[i], base_size);
    member |= ranks[i] == base_rank;
  }
  if (!member)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "init(comm=[...]): this process (rank %d) is not in the list of ranks; "
                     "only the listed ranks may call init with it",
                     base_rank);
  int *list = malloc(sizeof(int) * (size_t)n);
  if (!list)
    return hvdl_fail(NULL, hvdlSystemError, "hvdl_comm_subset: out of memory for %d ranks", n);
  for (int i = 0; i < n; i++) list[i] = (int)ranks[i];
  MPI_Group base_group, group;
  MPI_Comm_group(base, &base_group);
  MPI_Group_incl(base_group, n, list, &group);
  err = MPI_Comm_create_group(base, group, SUBSET_TAG, out);
  MPI_Group_free(&group);
  MPI_Group_free(&base_group);
  free(list);
  if (err != MPI_SUCCESS) return hvdl_fail_mpi(NULL, err, "MPI_Comm_create_group");
  return hvdlSuccess;
}
