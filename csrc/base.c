/*
 * base.c -- what every unit of the C core uses, below all of them: recording a
 * failure (hvdl_fail, hvdl_fail_mpi, the last error), the clock, the names and
 * sizes of types and ops, growing scratch memory, and the bulk copy. It calls only libc and MPI's error
 * strings; everything above calls it (declarations in internal.h).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* ---- fault injection (a testing aid) ------------------------------------ */

int hvdl_fault_hit(struct hvdl_faults *f, enum hvdl_fault_point p) {
  if (!f || atomic_load_explicit(&f->armed[p], memory_order_relaxed) <= 0) return 0;
  return atomic_fetch_sub(&f->armed[p], 1) == 1;
}

const char *hvdl_fault_name(int p) {
  static const char *names[HVDL_FAULT_POINTS] = {"alloc", "send", "recv", "negotiate", "stall",
                                                 "exit", "adapter"};
  return p >= 0 && p < HVDL_FAULT_POINTS ? names[p] : NULL;
}

/* ---- time -------------------------------------------------------------- */

double hvdl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hvdl_deadline(struct timespec *ts, double seconds_from_now) {
  clock_gettime(CLOCK_REALTIME, ts);
  double ns = (double)ts->tv_nsec + seconds_from_now * 1e9;
  ts->tv_sec += (time_t)(ns / 1e9);
  ts->tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
}

/* ---- names --------------------------------------------------------------- */

size_t hvdl_type_size(hvdlDataType_t t) {
  static const size_t sizes[HVDL_TYPE_SLOTS] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 2, 2, 1};
  return sizes[hvdl_type_slot(t)];
}

const char *hvdl_type_name(hvdlDataType_t t) {
  static const char *names[HVDL_TYPE_SLOTS] = {"int8",    "uint8",   "int32",    "uint32",
                                               "int64",   "uint64",  "float16",  "float32",
                                               "float64", "bfloat16", "int16",   "uint16",
                                               "bool"};
  const int slot = hvdl_type_slot(t);
  return slot >= 0 ? names[slot] : "unknown";
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

/* ---- scratch ------------------------------------------------------------- */

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


/* ---- the bulk copy -------------------------------------------------------- */

/* glibc (2.36, AVX2) copies more than 4 KiB with `rep movsb`, which on AMD EPYC (the 2-core
 * machine of 27 Nov 2026) ran 15-27x slower when the destination lay 1-31 bytes past the source
 * modulo 4 KiB: 24-43 us instead of 1.4-2.6 us for 64 KiB at the other distances from 0 to 72
 * (tools/copy_distance.c; docs/benchmarks.md, "A copy's distance"). A page-aligned shared-memory
 * area copied into a NumPy buffer 16 bytes past a page is that case. Such copies go in pieces
 * that glibc copies with its vector loop (2 KiB: below its threshold for every vector width).
 * Overlapping buffers are moved as memmove moves them. */
#define HVDL_COPY_PIECE 2048
#define HVDL_COPY_WINDOW 32 /* distances 1 .. this - 1 crawled; 32 .. 72 did not */

int hvdl_copy_crawls(uint64_t dst, uint64_t src) {
  const uint64_t ahead = (dst - src) & 4095;
  return ahead != 0 && ahead < HVDL_COPY_WINDOW;
}

void hvdl_copy(void *dst, const void *src, size_t n) {
  const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
  if (n == 0 || d == s) return;
  if (d < s + n && s < d + n) {
    memmove(dst, src, n);
    return;
  }
  if (n <= HVDL_COPY_PIECE || !hvdl_copy_crawls(d, s)) {
    memcpy(dst, src, n);
    return;
  }
  for (size_t done = 0; done < n; done += HVDL_COPY_PIECE)
    memcpy((char *)dst + done, (const char *)src + done,
           n - done < HVDL_COPY_PIECE ? n - done : HVDL_COPY_PIECE);
}
