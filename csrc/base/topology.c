/*
 * topology.c -- a rank's host layout, and sub-communicators of listed ranks.
 *
 * Local ranks are the ranks that share memory with this one
 * (MPI_COMM_TYPE_SHARED, ordered by rank; HVD_LITE_RANKS_PER_HOST=k cuts them into
 * emulated hosts of k consecutive ranks, for tests); cross ranks are the ranks with the
 * same local rank, one per host, ordered by rank. Both communicators are made,
 * read and freed here: the engine keeps none of them. Also how many CPUs the ranks of
 * a real host may run on, together (hvdl_host_cpus), which tells wait.c whether the
 * host is oversubscribed.
 */
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

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
  if (err != MPI_SUCCESS)
    return hvdl_fail_mpi(NULL, err, "MPI_Comm_split (HVD_LITE_RANKS_PER_HOST)");
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
  int sizes[2] = {out->local_size, -out->local_size}; /* the largest and the smallest host */
  err = MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm);
  if (err != MPI_SUCCESS) return hvdl_fail_mpi(NULL, err, "MPI_Allreduce of the hosts' sizes");
  out->homogeneous = sizes[0] == -sizes[1];
  return hvdlSuccess;
}

/* CPUs as 64-bit words of a mask: 4096, more than any host we know of has. */
#define CPU_WORDS 64

/* The CPUs this process may run on (its affinity: taskset, a cpuset, a launcher's
 * binding), as bits of mask; where that is unknown, the online CPUs. */
static void my_cpus(uint64_t *mask) {
  memset(mask, 0, sizeof(uint64_t) * CPU_WORDS);
  int known = 0;
#ifdef __linux__
  cpu_set_t *set = CPU_ALLOC(64 * CPU_WORDS);
  const size_t size = CPU_ALLOC_SIZE(64 * CPU_WORDS);
  if (set && sched_getaffinity(0, size, set) == 0) {
    for (int c = 0; c < 64 * CPU_WORDS; c++)
      if (CPU_ISSET_S(c, size, set)) mask[c / 64] |= (uint64_t)1 << (c % 64);
    known = 1;
  }
  if (set) CPU_FREE(set);
#endif
  if (known) return;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 64 * CPU_WORDS) online = 64 * CPU_WORDS;
  for (long c = 0; c < online; c++) mask[c / 64] |= (uint64_t)1 << (c % 64);
}

hvdlResult_t hvdl_host_cpus(MPI_Comm comm, int *ranks, int *cpus) {
  MPI_Comm host;
  int rank, err = MPI_Comm_rank(comm, &rank);
  if (err == MPI_SUCCESS)
    err = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  if (err != MPI_SUCCESS) return hvdl_fail_mpi(NULL, err, "MPI_Comm_split_type (the host's CPUs)");
  uint64_t mask[CPU_WORDS];
  my_cpus(mask);
  err = MPI_Allreduce(MPI_IN_PLACE, mask, CPU_WORDS, MPI_UINT64_T, MPI_BOR, host);
  MPI_Comm_size(host, ranks);
  MPI_Comm_free(&host);
  if (err != MPI_SUCCESS) return hvdl_fail_mpi(NULL, err, "MPI_Allreduce of the host's CPUs");
  *cpus = 0;
  for (int w = 0; w < CPU_WORDS; w++) *cpus += __builtin_popcountll(mask[w]);
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
