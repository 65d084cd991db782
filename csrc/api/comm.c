/*
 * comm.c -- communicators: made from an MPI communicator (its private
 * duplicate, the host layout, the shared segment, the selectors' agreement and
 * refusals, the lanes across hosts), shrunk (hvdlCommShrink), renewed after a
 * failure, destroyed or aborted, and their queries. The collectives' entry
 * points are collectives.c's.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "cuda/cuda.h"
#include "select/select.h"
#include "transport/shm/shm.h"

/* Frees comm's memory; `collective` also frees what every rank frees together
 * (the shared segment, the cross-host communicator). */
static void free_comm(hvdlComm_t comm, int collective) {
  if (comm->cross) {
    if (collective)
      hvdlCommDestroy(comm->cross);
    else
      hvdlCommAbort(comm->cross);
  }
  if (comm->shm) hvdl_cma_free(comm->shm); /* its stand-in, before the segment goes */
  hvdl_shm_free(comm, collective);
  hvdl_cuda_free(comm);
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

/* The other collectives' forced algorithms that this layout cannot run, refused alike on
 * every rank (the layout and the knobs are agreed by hvdl_select_init), saying why. */
static hvdlResult_t refuse_forced(hvdlComm_t comm) {
  const hvdlConfig_t *c = &comm->config;
  const int fewest = comm->fewest_local;
  char gather_buf[160], bcast_buf[160], scatter_buf[160], alltoall_buf[160];
  const struct {
    const char *variable, *algo, *why;
  } forced[] = {
      {"HVD_LITE_ALLGATHER_ALGO", hvdl_allgather_algo_name(c->allGatherAlgorithm),
       hvdl_select_allgather_cannot_run(comm, (hvdlAllGatherAlgorithm_t)c->allGatherAlgorithm,
                                        fewest, gather_buf, sizeof gather_buf)},
      {"HVD_LITE_BROADCAST_ALGO", hvdl_bcast_algo_name(c->broadcastAlgorithm),
       hvdl_select_broadcast_cannot_run(comm, (hvdlBroadcastAlgorithm_t)c->broadcastAlgorithm,
                                        fewest, bcast_buf, sizeof bcast_buf)},
      {"HVD_LITE_REDUCESCATTER_ALGO", hvdl_reducescatter_algo_name(c->reduceScatterAlgorithm),
       hvdl_select_reducescatter_cannot_run(comm,
                                            (hvdlReduceScatterAlgorithm_t)c->reduceScatterAlgorithm,
                                            fewest, scatter_buf, sizeof scatter_buf)},
      {"HVD_LITE_ALLTOALL_ALGO", hvdl_alltoall_algo_name(c->allToAllAlgorithm),
       hvdl_select_alltoall_cannot_run(comm, (hvdlAllToAllAlgorithm_t)c->allToAllAlgorithm, fewest,
                                       alltoall_buf, sizeof alltoall_buf)},
  };
  for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++)
    if (forced[i].why)
      return hvdl_fail(comm, hvdlInvalidArgument,
                       "%s=%s cannot run on this communicator of %d ranks: %s", forced[i].variable,
                       forced[i].algo, comm->size, forced[i].why);
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
  comm->ft = hvdl_ft_enabled();
  MPI_Comm_rank(comm->mpi, &comm->rank);
  MPI_Comm_size(comm->mpi, &comm->size);
  int host_ranks = 1, host_cpus = 1; /* a lane across hosts has one rank on each */
  hvdlResult_t res =
      one_per_host ? hvdlSuccess : hvdl_host_cpus(comm->mpi, &host_ranks, &host_cpus);
  if (res != hvdlSuccess) hvdl_fail(comm, res, "%s", hvdlGetLastError(NULL));
  hvdl_note_host_cpus(host_ranks, host_cpus);
  if (res == hvdlSuccess) res = hvdl_shm_init(comm);
  if (res == hvdlSuccess) res = hvdl_shm_cma_init(comm);
  /* The selector sees what the shared-memory unit made possible. */
  if (res == hvdlSuccess) res = hvdl_select_init(comm, one_per_host);
  if (res == hvdlSuccess) res = refuse_forced(comm);
  if (res == hvdlSuccess && comm->config.smallAllReduceBytes == HVDL_SMALL_BYTES_AUTO)
    comm->config.smallAllReduceBytes = hvdl_small_bytes_default(comm->size, comm->hosts);
  if (res == hvdlSuccess && comm->shm && comm->shm->hosts > 1) {
    MPI_Comm lane = MPI_COMM_NULL;
    hvdlConfig_t across = *cfg;
    across.disableShm = 1; /* one rank per host: nothing to share */
    if (across.allReduceAlgorithm == hvdlAlgoHierarchical ||
        across.allReduceAlgorithm == hvdlAlgoHierP2p) /* the lanes: the selector's choice */
      across.allReduceAlgorithm = hvdlAlgoAuto;
    if (across.allGatherAlgorithm == hvdlAllGatherHierP2p) /* a lane only all-reduces */
      across.allGatherAlgorithm = hvdlAllGatherAuto;
    if (across.broadcastAlgorithm == hvdlBcastHierP2p) across.broadcastAlgorithm = hvdlBcastAuto;
    if (across.reduceScatterAlgorithm == hvdlReduceScatterHierP2p)
      across.reduceScatterAlgorithm = hvdlReduceScatterAuto;
    if (across.allToAllAlgorithm == hvdlAllToAllHierP2p ||
        across.allToAllAlgorithm == hvdlAllToAllHierPairs)
      across.allToAllAlgorithm = hvdlAllToAllAuto;
    res = split_lanes(comm, comm->mpi, &lane);
    if (res == hvdlSuccess && lane != MPI_COMM_NULL) {
      res = new_comm(&comm->cross, lane, &across, 1);
      /* the lane's ranks share this communicator's agreed model, measured terms included, with
       * each host's NIC shared by its lanes, which all-reduce at once (allreduce_hier.c): so
       * the lane's selector weighs its algorithms as hier_p2p's lanes are weighed, and
       * select_allreduce.c prices hier with the same choice (hier_lanes_cost) */
      if (res == hvdlSuccess) {
        comm->cross->model = comm->model;
        comm->cross->model.beta[HVDL_LINK_INTER] *= comm->shm->lanes;
      }
      if (res == hvdlSuccess) comm->cross->ft_top = comm; /* a dead rank anywhere fails it */
      MPI_Comm_free(&lane);
      if (res == hvdlSuccess) res = name_ranks(comm, comm->cross);
    }
  }
  if (res != hvdlSuccess) {
    /* a lane's failure left its message (already "hvdlCommInitMpi: ...") in the thread's */
    if (comm->last_error[0]) hvdl_fail(NULL, res, "hvdlCommInitMpi: %s", comm->last_error);
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
    return hvdl_fail(NULL, hvdlInvalidUsage, "hvdlCommInitMpi: MPI is %s; initialise MPI first",
                     finalized ? "already finalized" : "not initialised");
  if (mpi_comm == MPI_COMM_NULL)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlCommInitMpi: the MPI communicator is MPI_COMM_NULL");

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
  /* After a rank's death (failed.c) nothing collective can complete: as hvdlCommAbort. */
  const int collective = !finalized && !hvdl_failed_any(comm);
  /* Freed last: the lane across hosts, freed with comm, checks this communicator for dead
   * ranks (its ft_top), and MPI_COMM_NULL there is an error that aborts the process. */
  MPI_Comm mpi = comm->mpi;
  free_comm(comm, collective);
  if (!finalized) MPI_Comm_free(&mpi);
  return hvdlSuccess;
}

hvdlResult_t hvdlCommAbort(hvdlComm_t comm) {
  if (!comm) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommAbort: comm is NULL");
  /* MPI_Comm_free is local in practice but formally collective; after a failure
   * the peers may be gone, so the handle is dropped rather than freed (the shared window too). */
  free_comm(comm, 0);
  return hvdlSuccess;
}

/* The shrink's tag for MPI_Comm_create_group ("HS"). */
#define SHRINK_TAG 0x4853

/* Checks hvdlCommShrink's arguments; *me_out: 1 if this rank is in the list. */
static hvdlResult_t shrink_args(hvdlComm_t comm, const int *list, int count, hvdlComm_t *newcomm,
                                int flags, unsigned char *excluded, int *me_out) {
  if (!comm || !newcomm)
    return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommShrink: %s is NULL",
                     comm ? "newcomm" : "comm");
  if (flags != HVDL_SHRINK_DEFAULT && flags != HVDL_SHRINK_ABORT)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlCommShrink: shrinkFlags %d is not HVDL_SHRINK_DEFAULT (0) or "
                     "HVDL_SHRINK_ABORT (1)",
                     flags);
  if (count < 0 || count > comm->size || (count > 0 && !list))
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlCommShrink: excludeRanksCount %d with excludeRanksList %s: expected "
                     "0 .. %d ranks",
                     count, list ? "given" : "NULL", comm->size - 1);
  for (int i = 0; i < count; i++) {
    if (list[i] < 0 || list[i] >= comm->size)
      return hvdl_fail(NULL, hvdlInvalidArgument,
                       "hvdlCommShrink: excludeRanksList[%d] = %d is not a rank of this "
                       "communicator of %d",
                       i, list[i], comm->size);
    if (excluded[list[i]])
      return hvdl_fail(NULL, hvdlInvalidArgument,
                       "hvdlCommShrink: rank %d is in excludeRanksList twice", list[i]);
    excluded[list[i]] = 1;
  }
  if (count == comm->size)
    return hvdl_fail(
        NULL, hvdlInvalidArgument,
        "hvdlCommShrink: excludeRanksList names all %d ranks: at least one must be left", count);
  *me_out = excluded[comm->rank];
  if (*me_out && flags == HVDL_SHRINK_DEFAULT)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlCommShrink: rank %d is in excludeRanksList: with HVDL_SHRINK_DEFAULT "
                     "an excluded rank does not call it",
                     comm->rank);
  if (flags == HVDL_SHRINK_ABORT && !comm->ft)
    return hvdl_fail(NULL, hvdlInvalidUsage,
                     "hvdlCommShrink: HVDL_SHRINK_ABORT needs an MPI with ULFM, started with it "
                     "(Open MPI 5: mpirun --with-ft ulfm)");
  return hvdlSuccess;
}

hvdlResult_t hvdlCommShrink(hvdlComm_t comm, const int *list, int count, hvdlComm_t *newcomm,
                            const hvdlConfig_t *config, int flags) {
  if (newcomm) *newcomm = NULL;
  unsigned char *excluded = comm ? calloc((size_t)comm->size, 1) : NULL;
  if (comm && !excluded) return hvdl_fail(NULL, hvdlSystemError, "hvdlCommShrink: out of memory");
  int me = 0;
  hvdlResult_t res = shrink_args(comm, list, count, newcomm, flags, excluded, &me);
  hvdlConfig_t cfg;
  if (res == hvdlSuccess) {
    cfg = config ? *config : comm->config;
    res = hvdl_config_check(&cfg);
  }
  MPI_Comm left = MPI_COMM_NULL;
  if (res == hvdlSuccess && flags == HVDL_SHRINK_ABORT) {
    /* every living rank: the survivors, then those of them not listed */
    MPI_Comm survivors = MPI_COMM_NULL;
    res = hvdl_failed_shrink(comm->mpi, &survivors);
    if (res == hvdlSuccess) {
      int err = MPI_Comm_split(survivors, me ? MPI_UNDEFINED : 0, comm->rank, &left);
      MPI_Comm_free(&survivors);
      if (err != MPI_SUCCESS) res = hvdl_fail_mpi(NULL, err, "MPI_Comm_split in hvdlCommShrink");
    }
  } else if (res == hvdlSuccess) { /* the ranks left only */
    MPI_Group all, kept;
    MPI_Comm_group(comm->mpi, &all);
    int *drop = malloc(sizeof(int) * (size_t)(count > 0 ? count : 1));
    if (!drop) {
      res = hvdl_fail(NULL, hvdlSystemError, "hvdlCommShrink: out of memory");
    } else {
      for (int i = 0; i < count; i++) drop[i] = list[i];
      MPI_Group_excl(all, count, drop, &kept);
      int err = MPI_Comm_create_group(comm->mpi, kept, SHRINK_TAG, &left);
      MPI_Group_free(&kept);
      if (err != MPI_SUCCESS)
        res = hvdl_fail_mpi(NULL, err, "MPI_Comm_create_group in hvdlCommShrink");
      free(drop);
    }
    MPI_Group_free(&all);
  }
  free(excluded);
  if (res != hvdlSuccess || left == MPI_COMM_NULL) return res; /* a living listed rank: NULL */
  res = new_comm(newcomm, left, &cfg, 0);
  MPI_Comm_free(&left); /* the new communicator runs on its own duplicate */
  return res;
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
