/*
 * allreduce_ring.c -- the pipelined ring all-reduce: reduce-scatter, then all-gather.
 *
 * The ring. n ranks; rank r sends only to right = r+1 and receives only from
 * left = r-1 (mod n), on the communicator's private MPI communicator.
 *
 * The chunks. The count elements are cut into n chunks as evenly as possible
 * (base.h's hvdl_block_start: chunk k has count/n elements, plus one for the
 * first count%n chunks; some are empty when count < n). Rank c owns chunk c: it finishes its reduction.
 *
 * The schedule at rank r: one initial send, then 2(n-1) receive steps. At step
 * t rank r receives chunk k(t) = r - t - 2 (mod n) from the left, and forwards
 * what it made of it to the right, where it is chunk k(t+1) of the next step:
 *
 *   start          send chunk r-1 of sendbuff (its own contribution)
 *   t = 0 .. n-3   recvReduceSend   recvbuff[k] = received op sendbuff[k]; forward it
 *   t = n-2        recvReduceCopySend  k = r: that reduction is the final one
 *                                   (Avg divides here); forward the final chunk
 *   t = n-1..2n-4  recvCopySend     the final chunk k lands in recvbuff; forward it
 *   t = 2n-3       recv             the last final chunk (r+1) lands in recvbuff
 *
 * So chunk k leaves rank k+1 as that rank's raw contribution, is combined at
 * k+2, k+3, ... in ring order (received value on the left of op), completed at
 * its owner k, then carried once round the ring and stored verbatim by every
 * other rank. Every rank therefore holds the owner's bytes: results are
 * bitwise identical across ranks, and the same for in-place and out-of-place
 * calls and for reruns, since nothing depends on timing.
 *
 * The pipeline. Each step is one verb of the segment pipeline (transport.h), the
 * same one every ring and chain collective uses: the chunk travels as
 * segments, up to PIPE_WINDOW receives stay posted (into scratch segments
 * during the reduce-scatter, straight into recvbuff during the all-gather),
 * and each segment is forwarded the moment it is processed, so sending,
 * receiving and reducing overlap and the pipeline runs on across steps without
 * draining. The segment size is the pipe's one policy (transport.h).
 *
 * Buffer safety. A forwarded send reads recvbuff. Step t writes only chunk
 * k(t), which differs from the chunk forwarded at step t-1, and the pipe waits
 * for the sends of step t-2 before step t starts (the initial send is the
 * pipe's step 0), which is all the schedule needs.
 *
 * Cost per rank: 2(n-1) steps, 2(n-1)/n * bytes sent and received, (n-1)/n *
 * bytes reduced (docs/algorithms.md).
 */
#include "algorithms/algorithms.h"
#include "base/base.h"
#include "transport/transport.h"

#define RING_TAG 0x4856 /* "HV" */

hvdlResult_t hvdl_allreduce_ring(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  const int n = comm->size, r = comm->rank;
  const size_t esize = hvdl_type_size(dt);
  const char *send = sendbuff;
  char *recv = recvbuff;
  size_t off, len;
  int k;
  struct hvdl_pipe p;
  HVDL_CHECK(hvdl_pipe_init(&p, comm, RING_TAG, count / (size_t)n + 1, dt, op));

  /* start: our own contribution to chunk r-1 goes right. */
  k = (r - 1 + n) % n;
  off = hvdl_block_start(count, n, k);
  len = hvdl_block_len(count, n, k);
  HVDL_CHECK(hvdl_pipe_send(&p, send + off * esize, len));

  comm->phase_time[0] = hvdl_now();
  for (int t = 0; t < 2 * (n - 1); t++) {
    if (t == n - 1) comm->phase_time[1] = hvdl_now();
    k = ((r - t - 2) % n + n) % n;
    off = hvdl_block_start(count, n, k);
    len = hvdl_block_len(count, n, k);
    const char *src = send + off * esize;
    char *dst = recv + off * esize;
    if (t < n - 2)
      HVDL_CHECK(hvdl_pipe_recv_reduce_send(&p, src, dst, len));
    else if (t == n - 2)
      HVDL_CHECK(hvdl_pipe_recv_reduce_copy_send(&p, src, dst, len));
    else if (t < 2 * n - 3)
      HVDL_CHECK(hvdl_pipe_recv_copy_send(&p, dst, len));
    else
      HVDL_CHECK(hvdl_pipe_recv(&p, dst, len));
  }
  HVDL_CHECK(hvdl_pipe_finish(&p));
  comm->phase_time[2] = hvdl_now();
  return hvdlSuccess;
}
