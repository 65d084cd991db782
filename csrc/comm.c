/*
 * comm.c -- communicators, configuration, errors, and the public collective
 * entry points (validation, then dispatch to an algorithm).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"


/* ---- errors -------------------------------------------------------------- */

static _Thread_local char thread_error[HVDL_ERRMSG_LEN];

hvdlResult_t hvdl_fail(hvdlComm_t comm, hvdlResult_t res, const char *fmt, ...) {
  char *slot = comm ? comm->last_error : thread_error;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(slot, HVDL_ERRMSG_LEN, fmt, ap);
  va_end(ap);
  return res;
}

hvdlResult_t hvdl_fail_mpi(hvdlComm_t comm, int mpi_err, const char *what) {
  char text[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(mpi_err, text, &len) != MPI_SUCCESS) len = 0;
  text[len] = '\0';
  if (comm) comm->broken = 1;
  return hvdl_fail(comm, hvdlSystemError, "%s failed: %s (MPI error %d)", what, text, mpi_err);
}

const char *hvdlGetErrorString(hvdlResult_t result) {
  switch (result) {
    case hvdlSuccess: return "no error";
    case hvdlUnhandledCudaError: return "unhandled cuda error";
    case hvdlSystemError: return "unhandled system error (MPI or the operating system failed)";
    case hvdlInternalError: return "internal error (a bug in hvd_lite)";
    case hvdlInvalidArgument: return "invalid argument";
    case hvdlInvalidUsage: return "invalid usage";
    case hvdlRemoteError: return "remote process exited or there was a network error";
    case hvdlInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}

const char *hvdlGetLastError(hvdlComm_t comm) { return comm ? comm->last_error : thread_error; }

/* ---- names --------------------------------------------------------------- */

size_t hvdl_type_size(hvdlDataType_t t) {
  static const size_t sizes[hvdlNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return sizes[t];
}

const char *hvdl_type_name(hvdlDataType_t t) {
  static const char *names[hvdlNumTypes] = {"int8",    "uint8",   "int32",   "uint32",
                                            "int64",   "uint64",  "float16", "float32",
                                            "float64", "bfloat16"};
  return (unsigned)t < hvdlNumTypes ? names[t] : "unknown";
}

const char *hvdl_op_name(hvdlRedOp_t op) {
  static const char *names[hvdlNumOps] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < hvdlNumOps ? names[op] : "unknown";
}

hvdlResult_t hvdlGetVersion(int *version) {
  if (!version) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlGetVersion: version is NULL");
  *version = HVDL_VERSION_CODE;
  return hvdlSuccess;
}

/* ---- communicators ------------------------------------------------------- */

hvdlResult_t hvdl_reserve(hvdlComm_t comm, char **buf, size_t *cap, size_t bytes) {
  if (bytes <= *cap) return hvdlSuccess;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  void *p = NULL;
  if (posix_memalign(&p, 64, rounded) != 0)
    return hvdl_fail(comm, hvdlSystemError, "out of memory allocating %zu bytes of scratch",
                     rounded);
  free(*buf);
  *buf = p;
  *cap = rounded;
  return hvdlSuccess;
}

static void free_comm(hvdlComm_t comm) {
  free(comm->scratch.tmp);
  free(comm->scratch.gather);
  free(comm->scratch.sreq);
  free(comm);
}

hvdlResult_t hvdlCommInitMpi(hvdlComm_t *out, MPI_Comm mpi_comm, const hvdlConfig_t *config) {
  if (!out) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommInitMpi: comm is NULL");
  *out = NULL;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return hvdl_fail(NULL, hvdlInvalidUsage,
                     "hvdlCommInitMpi: MPI is %s; initialise MPI first",
                     finalized ? "already finalized" : "not initialised");
  if (mpi_comm == MPI_COMM_NULL)
    return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommInitMpi: the MPI communicator is MPI_COMM_NULL");

  hvdlConfig_t cfg;
  if (config) {
    cfg = *config;
  } else {
    HVDL_CHECK(hvdlConfigDefault(&cfg));
  }
  HVDL_CHECK(hvdl_config_check(&cfg));

  hvdlComm_t comm = calloc(1, sizeof *comm);
  if (!comm) return hvdl_fail(NULL, hvdlSystemError, "hvdlCommInitMpi: out of memory");
  comm->config = cfg;
  int err = MPI_Comm_dup(mpi_comm, &comm->mpi);
  if (err != MPI_SUCCESS) {
    free_comm(comm);
    return hvdl_fail_mpi(NULL, err, "MPI_Comm_dup in hvdlCommInitMpi");
  }
  /* Errors on our communicator come back as codes; they never abort the job. */
  MPI_Comm_set_errhandler(comm->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm->mpi, &comm->rank);
  MPI_Comm_size(comm->mpi, &comm->size);
  if (comm->config.smallAllReduceBytes == HVDL_SMALL_BYTES_AUTO)
    comm->config.smallAllReduceBytes = hvdl_small_bytes_default(comm->size);
  *out = comm;
  return hvdlSuccess;
}

hvdlResult_t hvdlCommDestroy(hvdlComm_t comm) {
  if (!comm) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommDestroy: comm is NULL");
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm->mpi);
  free_comm(comm);
  return hvdlSuccess;
}

hvdlResult_t hvdlCommAbort(hvdlComm_t comm) {
  if (!comm) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlCommAbort: comm is NULL");
  /* MPI_Comm_free is local in practice but formally collective; after a failure
   * the peers may be gone, so the handle is dropped rather than freed. */
  free_comm(comm);
  return hvdlSuccess;
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

/* ---- collectives --------------------------------------------------------- */

/* The checks every collective makes before sending anything. */
static hvdlResult_t check_call(hvdlComm_t comm, const char *fn, const void *sendbuff,
                               size_t sendbytes, const void *recvbuff, size_t recvbytes,
                               hvdlDataType_t dt, hvdlStream_t stream) {
  if (!comm) return hvdl_fail(NULL, hvdlInvalidArgument, "%s: comm is NULL", fn);
  if (comm->broken)
    return hvdl_fail(comm, hvdlInvalidUsage,
                     "%s: the communicator failed earlier and cannot be used; destroy or abort it",
                     fn);
  if ((unsigned)dt >= hvdlNumTypes)
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: invalid datatype %d (valid: 0..%d)", fn,
                     (int)dt, hvdlNumTypes - 1);
  if (stream != NULL)
    return hvdl_fail(comm, hvdlInvalidUsage,
                     "%s: stream must be NULL (this build supports host memory only)", fn);
  if ((sendbytes && !sendbuff) || (recvbytes && !recvbuff))
    return hvdl_fail(comm, hvdlInvalidArgument, "%s: %s is NULL with a non-zero count", fn,
                     sendbytes && !sendbuff ? "sendbuff" : "recvbuff");
  uintptr_t s = (uintptr_t)sendbuff, r = (uintptr_t)recvbuff;
  if (sendbytes && recvbytes && s != r && s < r + recvbytes && r < s + sendbytes)
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "%s: sendbuff and recvbuff overlap without being identical", fn);
  return hvdlSuccess;
}

hvdlResult_t hvdlAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           hvdlDataType_t datatype, hvdlRedOp_t op, hvdlComm_t comm,
                           hvdlStream_t stream) {
  size_t esize = (unsigned)datatype < hvdlNumTypes ? hvdl_type_size(datatype) : 1;
  if (count > SIZE_MAX / esize)
    return hvdl_fail(comm, hvdlInvalidArgument, "hvdlAllReduce: count %zu is too large", count);
  size_t bytes = count * esize;
  HVDL_CHECK(check_call(comm, "hvdlAllReduce", sendbuff, bytes, recvbuff, bytes, datatype, stream));
  if ((unsigned)op >= hvdlNumOps)
    return hvdl_fail(comm, hvdlInvalidArgument, "hvdlAllReduce: invalid op %d (valid: 0..%d)",
                     (int)op, hvdlNumOps - 1);
  if (count == 0) return hvdlSuccess;
  if (comm->size == 1) {
    if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, bytes);
    return hvdlSuccess;
  }
  if (bytes <= comm->config.smallAllReduceBytes)
    return hvdl_allreduce_small(comm, sendbuff, recvbuff, count, datatype, op);
  return hvdl_allreduce_ring(comm, sendbuff, recvbuff, count, datatype, op);
}
