/*
 * memory.c -- scratch memory grown on demand, and the bulk copy every collective's
 * data goes through (hvdl_copy).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

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
 * (tools/copy_distance.c; docs/benchmarks-history.md, "A copy's distance"). A page-aligned shared-memory
 * area copied into a NumPy buffer 16 bytes past a page is that case. Such copies go in pieces
 * that glibc copies with its vector loop (2 KiB: below its threshold for every vector width).
 * Overlapping buffers are moved as memmove moves them. */
#define HVDL_COPY_PIECE  2048
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
