/*
 * errors.c -- recording a failure (hvdl_fail, hvdl_fail_mpi), the last error and the
 * result codes' text, the version, and the fault points (a testing aid). It calls only
 * libc and MPI's error strings; every unit above calls it.
 */
#include <stdarg.h>
#include <stdio.h>

#include "base/base.h"

/* ---- errors ------------------------------------------------------------- */

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

hvdlResult_t hvdlGetVersion(int *version) {
  if (!version) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlGetVersion: version is NULL");
  *version = HVDL_VERSION_CODE;
  return hvdlSuccess;
}

/* ---- fault injection (a testing aid) ------------------------------------ */

int hvdl_fault_hit(struct hvdl_faults *f, enum hvdl_fault_point p) {
  if (!f || atomic_load_explicit(&f->armed[p], memory_order_relaxed) <= 0) return 0;
  return atomic_fetch_sub(&f->armed[p], 1) == 1;
}

const char *hvdl_fault_name(int p) {
  static const char *names[HVDL_FAULT_POINTS] = {"alloc", "send", "recv",    "negotiate",
                                                 "stall", "exit", "adapter", "kill"};
  return p >= 0 && p < HVDL_FAULT_POINTS ? names[p] : NULL;
}
