/*
 * broadcast_tree.c -- the tree broadcasts: a binomial tree (small messages,
 * many ranks) and scatter + all-gather (van de Geijn; large messages).
 *
 * Both number the ranks from the root: rank r is relative rank v = r - root
 * (mod n), and relative rank v is rank v + root (mod n). lowbit(v) is v's
 * lowest set bit; the root's subtree is all n ranks.
 *
 * The binomial tree (hvdl_broadcast_tree). Relative rank v > 0 receives the
 * whole buffer from its parent v - lowbit(v), then sends it to its children
 * v + m for m = lowbit(v)/2, lowbit(v)/4, ..., 1 with v + m < n, one after the
 * other (the root: m from the largest power of two < n down to 1). Example,
 * n = 6, root 0:
 *
 *   step 1   0 -> 4
 *   step 2   0 -> 2, 4 -> 5
 *   step 3   0 -> 1, 2 -> 3
 *
 * ceil(log2 n) steps; a rank with c children sends the buffer c times (the
 * root ceil(log2 n) times), every other rank receives it once. With ranks placed
 * by host (consecutive ranks share one) and the root first on its host, the
 * large masks go first and cross hosts, so every host receives the buffer
 * through its NIC once, then spreads it on the loopback.
 *
 * Scatter + all-gather (hvdl_broadcast_scatter). The buffer is cut into n
 * blocks as allreduce_ring.c cuts its chunks (count/n elements, the first count mod n one
 * longer); block k is rank k's.
 *
 *   scatter     down the same binomial tree, relative rank v receives from its
 *               parent only the blocks of its subtree, ranks v .. v+lowbit(v)-1
 *               (fewer at the end), and sends each child c its subtree's
 *               blocks, ranks c .. c+lowbit(c)-1. The ranks of a subtree are
 *               consecutive from the root on, so their blocks are one run of
 *               the buffer or, where the run passes rank n-1, two.
 *   all-gather  the ring all-gather of allgather_ring.c, in place: every rank
 *               contributes its own block, which it now holds.
 *
 * The root sends (n-1)/n of the buffer in the scatter (the others the blocks of
 * their subtrees, a rank with lowbit(v) = m at most (m-1)/n of it), then every
 * rank sends and receives (n-1)/n of it in the ring: ceil(log2 n) + n - 1
 * steps, about 2B sent per rank instead of the tree's up to log2(n) * B at the
 * root. The ring's n-1 steps each pay a message's latency, so this is for large
 * buffers.
 *
 * Both move the root's bytes verbatim (nothing is computed); only the root
 * reads sendbuff. The exchanges are pair_exchange.c's: bounded waits with the watch hook
 * and the data timeout, fault points send, recv and stall, and everything
 * posted abandoned on failure.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/base.h"
#include "transport/transport.h"

#define TREE_TAG    0x4854 /* "HT" */
#define SCATTER_TAG 0x4853 /* "HS" */

static int lowbit(int v) { return v & -v; }

/* The first mask a rank sends to: lowbit(v)/2, or for the root the largest
 * power of two below n. */
static int first_child_mask(int v, int n) {
  if (v > 0) return lowbit(v) / 2;
  int m = 1;
  while (m < n - m) m *= 2; /* m < n <= 2m */
  return m;
}

hvdlResult_t hvdl_broadcast_tree(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, int root) {
  const int n = comm->size, v = (comm->rank - root + n) % n;
  const size_t bytes = count * hvdl_type_size(dt);
  const void *have = recvbuff;
  if (v == 0) {
    have = sendbuff;
  } else {
    const int parent = (v - lowbit(v) + root) % n;
    HVDL_CHECK(hvdl_pair_exchange(comm, parent, TREE_TAG, NULL, 0, recvbuff, bytes));
  }
  for (int m = first_child_mask(v, n); m >= 1; m /= 2)
    if (v + m < n)
      HVDL_CHECK(hvdl_pair_exchange(comm, (v + m + root) % n, TREE_TAG, have, bytes, NULL, 0));
  if (v == 0 && recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, bytes);
  return hvdlSuccess;
}

/* Sends (to != 0) or receives the blocks of the relative ranks v .. v+span-1 to
 * or from peer: one run of the buffer, or two where it passes rank n-1. */
static hvdlResult_t move_blocks(hvdlComm_t comm, int to, int peer, char *buf, size_t count,
                                size_t esize, int root, int v, int span) {
  const int n = comm->size;
  int first = (v + root) % n, left = span;
  while (left > 0) {
    const int run = first + left <= n ? left : n - first;
    const size_t at = hvdl_block_start(count, n, first) * esize;
    const size_t len = hvdl_block_start(count, n, first + run) * esize - at;
    if (len > 0)
      HVDL_CHECK(hvdl_pair_exchange(comm, peer, SCATTER_TAG, to ? buf + at : NULL, to ? len : 0,
                                    to ? NULL : buf + at, to ? 0 : len));
    left -= run;
    first = 0;
  }
  return hvdlSuccess;
}

hvdlResult_t hvdl_broadcast_scatter(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                    size_t count, hvdlDataType_t dt, int root) {
  const int n = comm->size, r = comm->rank, v = (r - root + n) % n;
  const size_t esize = hvdl_type_size(dt);
  struct hvdl_scratch *s = &comm->scratch;
  char *buf = recvbuff;
  if (v == 0) {
    if (recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, count * esize);
  } else {
    const int span = lowbit(v) < n - v ? lowbit(v) : n - v;
    HVDL_CHECK(move_blocks(comm, 0, (v - lowbit(v) + root) % n, buf, count, esize, root, v, span));
  }
  for (int m = first_child_mask(v, n); m >= 1; m /= 2)
    if (v + m < n) {
      const int span = m < n - (v + m) ? m : n - (v + m);
      HVDL_CHECK(move_blocks(comm, 1, (v + m + root) % n, buf, count, esize, root, v + m, span));
    }
  HVDL_CHECK(hvdl_reserve(comm, &s->counts, &s->counts_bytes, (size_t)n * sizeof(size_t)));
  size_t *counts = (size_t *)(void *)s->counts;
  for (int k = 0; k < n; k++) counts[k] = hvdl_block_len(count, n, k);
  return hvdl_allgatherv(comm, buf + hvdl_block_start(count, n, r) * esize, buf, counts, dt);
}
