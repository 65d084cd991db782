/*
 * broadcast_chain.c -- the pipelined chain broadcast.
 *
 * The chain. The ranks in ring order starting at the root: root, root+1, ...,
 * root-1 (mod n). Rank r sits at position p = r - root (mod n); it receives
 * from its left neighbour and sends to its right one (transport.h), except that the
 * root only sends and the last rank (root-1) only receives.
 *
 * The schedule. The buffer travels as segments of config.segmentBytes (larger
 * if it would need more than PIPE_MAX_SEGMENTS of them; on 2 ranks, where no
 * rank forwards, as one message: hvdl_pipe_init_copy), all in one pipe step:
 *
 *   p = 0           send          every segment of sendbuff; meanwhile the root
 *                                 copies sendbuff into recvbuff unless in-place
 *   p = 1 .. n-2    recvCopySend  segment j lands in recvbuff and goes right at
 *                                 once, while segment j+1 arrives
 *   p = n-1         recv          segment j lands in recvbuff
 *
 * Segment j reaches position p at pipeline stage j + p: with S segments the
 * broadcast takes S + n - 2 segment times, and in the steady state every link
 * of the chain carries a segment at once. The bytes are the root's, verbatim.
 *
 * Cost per rank: 1 step of S + n - 2 segment stages; every rank but the last
 * sends the buffer once, every rank but the root receives it once.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/base.h"
#include "transport/transport.h"

#define BROADCAST_TAG 0x4842 /* "HB" */

hvdlResult_t hvdl_broadcast_chain(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                  size_t count, hvdlDataType_t dt, int root) {
  const int n = comm->size;
  const int pos = (comm->rank - root + n) % n;
  struct hvdl_pipe p;
  HVDL_CHECK(hvdl_pipe_init_copy(&p, comm, BROADCAST_TAG, count, dt));
  if (pos == 0) {
    HVDL_CHECK(hvdl_pipe_send(&p, sendbuff, count));
    if (recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, count * hvdl_type_size(dt));
  } else if (pos < n - 1) {
    HVDL_CHECK(hvdl_pipe_recv_copy_send(&p, recvbuff, count));
  } else {
    HVDL_CHECK(hvdl_pipe_recv(&p, recvbuff, count));
  }
  return hvdl_pipe_finish(&p);
}
