/*
 * allreduce_rd.c -- recursive doubling: log2(p) exchanges of the whole buffer,
 * for small messages on many ranks.
 *
 * The schedule at rank r (the fold, virtual ranks v and the combining rule are
 * transport.h's; p = largest power of two <= n, rem = n - p):
 *
 *   fold in     r < 2rem, even: send the input to r+1, then wait for the result
 *               r < 2rem, odd:  recvbuff = x(r-1) op x(r)
 *   m = 1, 2, 4, ..., p/2:
 *               exchange the whole partial with virtual rank v ^ m (the buffer
 *               it sends is the one it holds; the partner's lands in scratch)
 *               recvbuff = lower op higher               (transport.h's rule)
 *   Avg         recvbuff /= n
 *   fold out    r < 2rem, odd: send recvbuff to r-1, which receives it there
 *
 * Example, n = 4: step m=1: ranks 0,1 both compute x0 op x1, ranks 2,3 x2 op x3;
 * step m=2: all four compute (x0 op x1) op (x2 op x3). With n = 6 (p = 4, rem =
 * 2) the leaves are (x0 op x1), (x2 op x3), x4, x5.
 *
 * Why every rank ends with the same bytes. After the step with mask m, every
 * rank of an aligned group of 2m virtual ranks holds the combination of that
 * group's contributions as the same expression tree: by induction, both halves
 * hold identical bytes for their own group (true of single ranks), and the two
 * partners of a step both compute lower-half op higher-half from them. After the
 * last step all p ranks hold identical bytes; Avg divides identical bytes the
 * same way; the folded-out ranks receive them verbatim. Nothing depends on
 * timing, so reruns and in-place calls give the same bits. The tree -- a
 * balanced binary tree over the ranks in order -- is also the one
 * allreduce_rab.c builds, so the two give identical results.
 *
 * Cost per rank (B bytes, rem = 0): log2(n) steps, log2(n) * B sent and
 * received, log2(n) * B reduced. rem > 0 adds two steps of B for the paired
 * ranks. Its first steps (small m) pair neighbours, which share a host when
 * ranks are placed by host, so the steps that cross hosts come last.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/transport.h"

#define RD_TAG 0x4844 /* "HD" */

hvdlResult_t hvdl_allreduce_rd_group(hvdlComm_t comm, const struct hvdl_group *g,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op) {
  const int r = g->rank;
  const size_t bytes = count * hvdl_type_size(dt);
  struct hvdl_scratch *s = &comm->scratch;
  struct hvdl_fold f;
  hvdl_fold_plan(g->size, r, &f);
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes, bytes));
  const void *cur = sendbuff; /* what this rank holds: its input until the first combine */

  if (f.vrank < 0) { /* an even rank of a pair: hand over the input, take back the result */
    const int odd = hvdl_group_peer(g, r + 1);
    HVDL_CHECK(hvdl_pair_exchange(comm, odd, RD_TAG, sendbuff, bytes, NULL, 0));
    return hvdl_pair_exchange(comm, odd, RD_TAG, NULL, 0, recvbuff, bytes);
  }
  if (r < 2 * f.rem) {
    HVDL_CHECK(
        hvdl_pair_exchange(comm, hvdl_group_peer(g, r - 1), RD_TAG, NULL, 0, s->work, bytes));
    hvdl_pair_combine(recvbuff, cur, s->work, 0, count, dt, op);
    cur = recvbuff;
  }
  for (int m = 1; m < f.p; m *= 2) {
    const int peer = hvdl_group_peer(g, hvdl_fold_rank(&f, f.vrank ^ m));
    HVDL_CHECK(hvdl_pair_exchange(comm, peer, RD_TAG, cur, bytes, s->work, bytes));
    hvdl_pair_combine(recvbuff, cur, s->work, (f.vrank & m) == 0, count, dt, op);
    cur = recvbuff;
  }
  if (cur != recvbuff) hvdl_copy(recvbuff, cur, bytes); /* a group of one */
  if (op == hvdlAvg) hvdl_divide(recvbuff, count, dt, g->divisor);
  if (r < 2 * f.rem)
    HVDL_CHECK(
        hvdl_pair_exchange(comm, hvdl_group_peer(g, r - 1), RD_TAG, recvbuff, bytes, NULL, 0));
  return hvdlSuccess;
}

hvdlResult_t hvdl_allreduce_rd(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                               hvdlDataType_t dt, hvdlRedOp_t op) {
  const struct hvdl_group all = hvdl_group_all(comm);
  return hvdl_allreduce_rd_group(comm, &all, sendbuff, recvbuff, count, dt, op);
}
