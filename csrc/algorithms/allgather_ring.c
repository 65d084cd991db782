/*
 * allgather_ring.c -- the pipelined ring all-gather (variable block sizes).
 *
 * The ring. n ranks; rank r receives only from left = r-1 and sends only to
 * right = r+1 (mod n), through the segment pipeline of transport.h.
 *
 * The blocks. recvbuff holds n blocks in rank order, block k of counts[k]
 * elements; rank k contributes block k from its sendbuff.
 *
 * The schedule at rank r: n steps. Each block travels n-1 hops round the ring,
 * from its owner to the owner's left neighbour; at step t >= 1 rank r receives
 * block b(t) = r - t (mod n), which its left neighbour received at step t-1:
 *
 *   t = 0          send          its own block (from sendbuff); meanwhile it
 *                                copies that block into recvbuff unless in-place
 *   t = 1 .. n-2   recvCopySend  block r-t lands in recvbuff; forward it
 *   t = n-1        recv          block r+1 lands in recvbuff (it has gone round)
 *
 * On 2 ranks nothing is forwarded and each block goes as one message
 * (hvdl_pipe_init_copy); beyond, as segments, so that forwarding overlaps.
 *
 * Every block is stored verbatim from its owner's bytes. Each step writes a
 * block nothing else writes or sends from before, so only the number of sends
 * in flight needs bounding (the pipe's two generations).
 *
 * Cost per rank: n-1 receiving steps; sends and receives the whole result
 * except one block ((n-1)/n of it for equal blocks); nothing is reduced.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/base.h"
#include "transport/transport.h"

#define ALLGATHER_TAG 0x4847 /* "HG" */

hvdlResult_t hvdl_allgatherv(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                             const size_t *counts, hvdlDataType_t dt) {
  const int n = comm->size, r = comm->rank;
  const size_t esize = hvdl_type_size(dt);
  char *recv = recvbuff;
  char *own = recv + hvdl_before(counts, r) * esize;
  size_t max_count = 0;
  for (int k = 0; k < n; k++)
    if (counts[k] > max_count) max_count = counts[k];
  if (max_count == 0) return hvdlSuccess;

  struct hvdl_pipe p;
  if (n > 1) {
    HVDL_CHECK(hvdl_pipe_init_copy(&p, comm, ALLGATHER_TAG, max_count, dt));
    HVDL_CHECK(hvdl_pipe_send(&p, sendbuff, counts[r]));
  }
  if (own != sendbuff && counts[r] > 0) hvdl_copy(own, sendbuff, counts[r] * esize);
  if (n == 1) return hvdlSuccess;

  for (int t = 1; t < n; t++) {
    const int b = ((r - t) % n + n) % n;
    char *dst = recv + hvdl_before(counts, b) * esize;
    if (t < n - 1)
      HVDL_CHECK(hvdl_pipe_recv_copy_send(&p, dst, counts[b]));
    else
      HVDL_CHECK(hvdl_pipe_recv(&p, dst, counts[b]));
  }
  return hvdl_pipe_finish(&p);
}
