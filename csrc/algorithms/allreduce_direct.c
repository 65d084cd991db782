/*
 * allreduce_direct.c -- the direct exchange over a group: one step in which every member
 * sends its whole buffer to every other member, then each reduces all of them itself. For
 * a few members and small buffers, where one round of messages costs less than recursive
 * doubling's log2(n) rounds one after another (and than its fold, for n not a power of
 * two). hier_p2p's step across hosts runs it on the lane holders (allreduce_hier_p2p.c),
 * where select_allreduce.c's model prefers it to rd; it is not an algorithm of its own.
 *
 * The schedule at group rank r of n, B bytes:
 *
 *   one step   the input to each other member, each other member's input into
 *              scratch slot i (the receives posted first), all waited for together;
 *              the rank's own input copied into slot r
 *   combine    recvbuff = the n slots in recursive doubling's tree (transport.h's
 *              hvdl_tree_combine: the fold's pairs, then aligned groups, lower op higher)
 *   Avg        recvbuff /= g->divisor
 *
 * Every member combines the same n inputs as the same expression, so every member ends
 * with the same bytes, in place or not and on every rerun; and the expression is the one
 * rd builds (allreduce_rd.c), so the bytes are rd's: which of the two ran does not show in
 * the result (hier_p2p's all-reduce keeps one order whatever its step across, and the
 * reduce-scatter that matches it, reducescatter_hier_p2p.c, stays matched).
 *
 * Cost per rank: one step of n-1 messages of B each way ((n-1) B sent and received, all in
 * flight at once), n-1 reductions of B. Scratch (comm->scratch.work): n slots of B, then
 * the slots' pointers, the message list and its requests.
 *
 * Waits, errors and faults are pair_exchange.c's (hvdl_pair_exchange_set): the watch hook,
 * the data timeout, the injected faults and the abandoning of requests after a failure.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/transport.h"

#define DIRECT_TAG 0x4864

hvdlResult_t hvdl_allreduce_direct_group(hvdlComm_t comm, const struct hvdl_group *g,
                                         const void *sendbuff, void *recvbuff, size_t count,
                                         hvdlDataType_t dt, hvdlRedOp_t op) {
  const int n = g->size, r = g->rank;
  const size_t bytes = count * hvdl_type_size(dt);
  if (n == 1 || bytes == 0) {
    if (recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, bytes);
    if (op == hvdlAvg) hvdl_divide(recvbuff, count, dt, g->divisor);
    return hvdlSuccess;
  }
  /* the slots first, each aligned for its type as the buffer is; the rest after them */
  const size_t slots = ((size_t)n * bytes + 63) & ~(size_t)63;
  const int nm = 2 * (n - 1);
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes,
                          slots + (size_t)n * sizeof(char *) +
                              (size_t)nm * (sizeof(struct hvdl_msg) + sizeof(MPI_Request))));
  char *slot = s->work;
  char **x = (char **)(void *)(s->work + slots);
  struct hvdl_msg *msgs = (struct hvdl_msg *)(void *)(x + n);
  MPI_Request *reqs = (MPI_Request *)(void *)(msgs + nm);
  int k = 0;
  for (int i = 0; i < n; i++)
    if (i != r)
      msgs[k++] = (struct hvdl_msg){hvdl_group_peer(g, i), 1, slot + (size_t)i * bytes, bytes};
  for (int i = 0; i < n; i++)
    if (i != r) msgs[k++] = (struct hvdl_msg){hvdl_group_peer(g, i), 0, (char *)sendbuff, bytes};
  HVDL_CHECK(hvdl_pair_exchange_set(comm, DIRECT_TAG, nm, msgs, reqs));
  hvdl_copy(slot + (size_t)r * bytes, sendbuff, bytes); /* in place: read before the tree */
  for (int i = 0; i < n; i++) x[i] = slot + (size_t)i * bytes;
  hvdl_tree_combine(recvbuff, x, n, count, dt, op);
  if (op == hvdlAvg) hvdl_divide(recvbuff, count, dt, g->divisor);
  return hvdlSuccess;
}
