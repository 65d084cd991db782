/*
 * reducescatter_ring.c -- the pipelined ring reduce-scatter (variable block sizes).
 *
 * The ring. n ranks; rank r receives only from left = r-1 and sends only to
 * right = r+1 (mod n), through the segment pipeline of transport.h.
 *
 * The blocks. The whole buffer (in sendbuff on every rank) is cut into n
 * blocks, block k of counts[k] elements; rank k owns block k and ends with its
 * reduction in recvbuff.
 *
 * The schedule at rank r: n steps. At step t >= 1 rank r receives from the left
 * the partial of block k(t) = r - t - 1 (mod n), combines it with its own
 * contribution, and forwards the result, which is the right neighbour's block
 * of step t+1:
 *
 *   t = 0          send            block r-1 of sendbuff (its own contribution)
 *   t = 1 .. n-2   recvReduceSend  stage = received op sendbuff[k]; forward stage
 *   t = n-1        recvReduce      k = r: recvbuff = received op sendbuff[r];
 *                                  Avg divides by n here
 *
 * So block k leaves rank k+1 as that rank's raw contribution and is combined
 * at k+2, k+3, ..., k in ring order, the received partial on the left of op:
 *
 *   result[k] = ((x[k+1] op x[k+2]) op ...) op x[k]
 *
 * The order is fixed by the ring, never by timing, so reruns give the same
 * bits, in-place and out-of-place agree, and it is the order in which the ring
 * all-reduce (allreduce_ring.c) reduces its chunk k: with counts equal to allreduce_ring.c's chunks
 * the results are bitwise those of hvdl_allreduce_ring.
 *
 * The partials being forwarded live in two scratch blocks ("stage", by step
 * parity): step t writes stage[t & 1] while the sends of step t-1 still read
 * stage[(t-1) & 1]; the pipe waits for the sends of step t-2 before step t.
 *
 * Cost per rank: n-1 receiving steps; sends and receives the whole buffer
 * except one block ((n-1)/n of it for equal blocks), and reduces as much.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/base.h"
#include "transport/transport.h"

#define REDUCESCATTER_TAG 0x4853 /* "HS" */

hvdlResult_t hvdl_reducescatterv(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op) {
  const int n = comm->size, r = comm->rank;
  const size_t esize = hvdl_type_size(dt);
  const char *send = sendbuff;
  size_t max_count = 0;
  for (int k = 0; k < n; k++)
    if (counts[k] > max_count) max_count = counts[k];
  if (max_count == 0) return hvdlSuccess;
  if (n == 1) {
    if (recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, counts[0] * esize);
    return hvdlSuccess; /* Avg: a division by 1 */
  }

  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->stage, &s->stage_bytes, 2 * max_count * esize));
  char *stage[2] = {s->stage, s->stage + max_count * esize};
  struct hvdl_pipe p;
  HVDL_CHECK(hvdl_pipe_init(&p, comm, REDUCESCATTER_TAG, max_count, dt, op));

  int k = (r - 1 + n) % n;
  HVDL_CHECK(hvdl_pipe_send(&p, send + hvdl_before(counts, k) * esize, counts[k]));
  for (int t = 1; t < n - 1; t++) {
    k = ((r - t - 1) % n + n) % n;
    HVDL_CHECK(hvdl_pipe_recv_reduce_send(&p, send + hvdl_before(counts, k) * esize, stage[t & 1],
                                          counts[k]));
  }
  HVDL_CHECK(hvdl_pipe_recv_reduce(&p, send + hvdl_before(counts, r) * esize, recvbuff, counts[r]));
  return hvdl_pipe_finish(&p);
}
