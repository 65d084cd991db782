/*
 * failed.c -- ranks the MPI reports dead: ULFM, MPI's fault-tolerance extension.
 *
 * Under Open MPI started with `mpirun --with-ft ulfm` (the MPI_FT attribute of
 * MPI_COMM_WORLD is true), a rank's death does not end the job: the MPI tells the
 * survivors, and an operation with the dead rank fails with MPI_ERR_PROC_FAILED
 * instead of waiting for ever. Not every survivor learns at once: ULFM's detector
 * watches neighbours, and a rank that waits on shared memory, or on a live peer,
 * hears nothing. (A probe, 3 ranks, one SIGKILLed: one survivor knew 48 ms later,
 * the other not after 10 s of polling.) So the first rank to learn revokes the
 * communicator (MPIX_Comm_revoke), which every member sees within milliseconds
 * (4 ranks: every survivor knew 46-49 ms after the kill).
 *
 * wait.c calls hvdl_failed_check while a wait sleeps; it drives MPI's progress (one
 * MPI_Iprobe: a wait on shared memory makes no MPI call), then fails with
 * hvdlRemoteError naming the dead ranks, or saying that another rank revoked the
 * communicator. Both are the communicator's watch: `ft_top`'s MPI communicator,
 * the one a lane across hosts (allreduce_hier.c) serves, or its own.
 *
 * hvdl_failed_shrink and hvdl_failed_agree serve the Python layer's recovery: the survivors'
 * communicator (MPIX_Comm_shrink), and an answer every survivor shares even when a rank dies
 * while they ask (MPIX_Comm_agree).
 *
 * comm->ft is 0, and nothing here runs, where the MPI has no ULFM (MPICH: its
 * fault-tolerance path is not used, docs/elastic.md) or the job was started without it.
 */
#include <stdio.h>

#include "base/base.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> /* Open MPI's extensions: ULFM's MPIX_ functions where it has them */
#endif
#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
#define HVDL_HAVE_ULFM 1
#else
#define HVDL_HAVE_ULFM 0
#endif

int hvdl_ft_built(void) { return HVDL_HAVE_ULFM; }

int hvdl_ft_enabled(void) {
#if HVDL_HAVE_ULFM
  int *on = NULL, flag = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_FT, &on, &flag) != MPI_SUCCESS) return 0;
  return flag && on && *on;
#else
  return 0;
#endif
}

#if HVDL_HAVE_ULFM
static MPI_Comm watched(hvdlComm_t comm) { return comm->ft_top ? comm->ft_top->mpi : comm->mpi; }

/* The dead ranks of c that this process knows of, as "2, 5" (rank numbers of c); 0 if none. */
static int dead_ranks(MPI_Comm c, char *out, size_t cap) {
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  int n = 0;
  out[0] = '\0';
  if (MPIX_Comm_get_failed(c, &failed) != MPI_SUCCESS) return 0;
  MPI_Group_size(failed, &n);
  if (n > 0 && MPI_Comm_group(c, &all) == MPI_SUCCESS) {
    size_t used = 0;
    for (int i = 0; i < n && used + 16 < cap; i++) {
      int r = MPI_UNDEFINED;
      MPI_Group_translate_ranks(failed, 1, &i, all, &r);
      used += (size_t)snprintf(out + used, cap - used, i ? ", %d" : "%d", r);
    }
    MPI_Group_free(&all);
  }
  MPI_Group_free(&failed);
  return n;
}
#endif

hvdlResult_t hvdl_failed_check(hvdlComm_t comm) {
#if HVDL_HAVE_ULFM
  if (!comm->ft) return hvdlSuccess;
  MPI_Comm c = watched(comm);
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c, &flag,
             MPI_STATUS_IGNORE); /* progress; errors expected */
  char who[128];
  const int n = dead_ranks(c, who, sizeof who);
  if (n > 0) {
    MPIX_Comm_revoke(c); /* the others learn it from the revocation */
    comm->broken = 1;
    return hvdl_fail(comm, hvdlRemoteError,
                     "rank(s) %s died: the MPI reports %d rank(s) of this communicator failed "
                     "(ULFM)",
                     who, n);
  }
  int revoked = 0;
  if (MPIX_Comm_is_revoked(c, &revoked) == MPI_SUCCESS && revoked) {
    comm->broken = 1;
    return hvdl_fail(comm, hvdlRemoteError,
                     "another rank found a rank dead and revoked the communicator (ULFM)");
  }
#else
  (void)comm;
#endif
  return hvdlSuccess;
}

void hvdl_failed_revoke(hvdlComm_t comm) {
#if HVDL_HAVE_ULFM
  if (!comm || !comm->ft) return;
  MPI_Comm c = watched(comm);
  char who[16];
  if (dead_ranks(c, who, sizeof who) > 0) MPIX_Comm_revoke(c);
#else
  (void)comm;
#endif
}

int hvdl_failed_any(hvdlComm_t comm) {
#if HVDL_HAVE_ULFM
  if (!comm || !comm->ft) return 0;
  MPI_Comm c = watched(comm);
  char who[16];
  int revoked = 0, flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c, &flag, MPI_STATUS_IGNORE); /* progress */
  MPIX_Comm_is_revoked(c, &revoked);
  return revoked || dead_ranks(c, who, sizeof who) > 0;
#else
  (void)comm;
  return 0;
#endif
}

/* The refusal of a recovery step (what) in a job without ULFM. */
static hvdlResult_t without_ulfm(const char *what) {
#if HVDL_HAVE_ULFM
  return hvdl_fail(NULL, hvdlInvalidUsage,
                   "%s needs ULFM: Open MPI's mpirun --with-ft ulfm (hvd_lite.run does this for an "
                   "elastic job)",
                   what);
#else
  return hvdl_fail(NULL, hvdlInvalidUsage,
                   "%s needs ULFM, which this MPI build does not have (Open MPI 5 with mpirun "
                   "--with-ft ulfm has it)",
                   what);
#endif
}

hvdlResult_t hvdl_failed_shrink(MPI_Comm from, MPI_Comm *out) {
  *out = MPI_COMM_NULL;
#if HVDL_HAVE_ULFM
  if (!hvdl_ft_enabled()) return without_ulfm("shrinking after a failure");
  MPIX_Comm_revoke(from);
  int err = MPIX_Comm_shrink(from, out);
  if (err != MPI_SUCCESS) {
    *out = MPI_COMM_NULL;
    return hvdl_fail_mpi(NULL, err, "MPIX_Comm_shrink");
  }
  MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
  return hvdlSuccess;
#else
  (void)from;
  return without_ulfm("shrinking after a failure");
#endif
}

/* ULFM's uniform agreement: every survivor gets the same flag, or the same failure, even when
 * a rank dies during it (a barrier or an all-reduce may complete on some ranks and fail on
 * others). c's error handler returns errors for the call, whatever it was. */
hvdlResult_t hvdl_failed_agree(MPI_Comm c, int *flag) {
#if HVDL_HAVE_ULFM
  if (!hvdl_ft_enabled()) return without_ulfm("an agreement after a failure");
  MPI_Errhandler old = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(c, &old);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  const int err = MPIX_Comm_agree(c, flag);
  MPI_Comm_set_errhandler(c, old);
  MPI_Errhandler_free(&old);
  if (err != MPI_SUCCESS) return hvdl_fail_mpi(NULL, err, "MPIX_Comm_agree");
  return hvdlSuccess;
#else
  (void)c;
  (void)flag;
  return without_ulfm("an agreement after a failure");
#endif
}
