/*
 * allreduce_tree.c -- the binomial-tree all-reduce ("tree"): a reduce up a
 * binomial tree to rank 0, then broadcast_tree.c's binomial broadcast of the
 * result back down the same tree.
 *
 * The reduce at rank r (lowbit(r) is r's lowest set bit; rank 0's subtree is
 * all n ranks, rank r's the ranks r .. r + lowbit(r) - 1 below n):
 *
 *   acc = x(r)
 *   m = 1, 2, 4, ... while m < lowbit(r) (rank 0: while m < n):
 *     r + m < n: receive the partial of the subtree of r + m (ranks r+m ..
 *                r+2m-1) from rank r + m; acc = acc op partial
 *   r > 0:       send acc to its parent r - lowbit(r)
 *   rank 0:      acc is the result [Avg: divided by n]
 *   every rank:  the binomial broadcast of rank 0's result (hvdl_broadcast_tree)
 *
 * Example, n = 6: step 1: 1 -> 0, 3 -> 2, 5 -> 4; step 2: 2 -> 0; step 3: 4 -> 0;
 * rank 0 holds ((x0 op x1) op (x2 op x3)) op (x4 op x5), then broadcasts it
 * (0 -> 4; 0 -> 2, 4 -> 5; 0 -> 1, 2 -> 3).
 *
 * Why every rank ends with the same bytes. The result is computed once, at
 * rank 0, in an order fixed by n alone (each subtree's partial is its ranks'
 * contributions combined lower op higher, transport.h's rule), and the broadcast
 * moves it verbatim: ranks, reruns and in-place calls agree. The expression
 * is not rd's or rab's balanced tree when n is not a power of two, so its
 * floats may differ from theirs in the last bits.
 *
 * Cost per rank (B bytes): 2 ceil(log2 n) steps of B at rank 0, which receives
 * and reduces ceil(log2 n) buffers and sends as many; a leaf sends B once and
 * receives it once. rd takes log2 n steps of B, so the model never prefers the
 * tree (select_allreduce.c): it is here to be forced (HVD_LITE_ALLREDUCE_ALGO=tree), for
 * comparison (python -m hvd_lite.bench model, the simulation). The exchanges
 * are pair_exchange.c's: bounded waits, fault points, everything posted abandoned on
 * failure.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/base.h"
#include "kernels/kernels.h"
#include "transport/transport.h"

#define TREE_AR_TAG 0x4855 /* "HU" */

hvdlResult_t hvdl_allreduce_tree(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  const int n = comm->size, r = comm->rank;
  const size_t bytes = count * hvdl_type_size(dt);
  const int low = r ? (r & -r) : n; /* the subtree's width (rank 0: all of it) */
  const void *acc = sendbuff;       /* this subtree's partial: the input until a child's arrives */
  struct hvdl_scratch *s = &comm->scratch;
  for (int m = 1; m < low && r + m < n; m *= 2) {
    HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes, bytes));
    HVDL_CHECK(hvdl_pair_exchange(comm, r + m, TREE_AR_TAG, NULL, 0, s->work, bytes));
    hvdl_pair_combine(recvbuff, acc, s->work, 1, count, dt, op);
    acc = recvbuff;
  }
  if (r > 0) {
    HVDL_CHECK(hvdl_pair_exchange(comm, r - low, TREE_AR_TAG, acc, bytes, NULL, 0));
  } else {
    if (acc != recvbuff) hvdl_copy(recvbuff, acc, bytes); /* one rank */
    if (op == hvdlAvg) hvdl_divide(recvbuff, count, dt, hvdl_group_all(comm).divisor);
  }
  return hvdl_broadcast_tree(comm, recvbuff, recvbuff, count, dt, 0);
}
