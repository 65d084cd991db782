/*
 * alltoall_hier_p2p.c -- the two-level all-to-all (HVD_LITE_ALLTOALL_ALGO=hier_p2p), for
 * blocks all of one size (b bytes) on ranks spread over hosts of the same size: one step
 * within each host, one across hosts in lanes, so that a rank posts (L-1) + (H-1)
 * messages each way where pairwise (alltoall_pairwise.c) posts n-1, and a host's NIC
 * carries H-1 messages each way per lane rather than L (n-L).
 *
 * The layout is hier_p2p's (allreduce_hier_p2p.c, comm->hier_p2p; hosts of different
 * sizes have none, and the selector then neither considers this nor lets it be forced):
 * H hosts numbered by their lowest ranks, L ranks each, rank (g, i) local rank i of host g.
 * Lane i is the H ranks (g, i). The schedule at rank (h, j), its send blocks S[q] (q a
 * rank), its receive blocks R[q]:
 *
 *   own        R[(h, j)] = S[(h, j)] unless in place
 *   1. within  to each other local rank i, the H blocks S[(g, i)], g = 0 .. H-1, packed in
 *              host order (what lane i carries for this rank); from each, its H blocks
 *              bound for lane j. Of those, the one for (h, j) is R[(h, i)]
 *   2. across  to (g, j) for each other host g, the L blocks of host h's ranks bound for it
 *              (what step 1 brought in, and this rank's own), packed in local-rank order;
 *              from (g, j) the L blocks of host g's ranks for this rank: R[(g, i)],
 *              i = 0 .. L-1
 *
 * The block from (g, i) to (h, j) goes (g, i) -> (g, j) within host g, then (g, j) ->
 * (h, j) along lane j: every block crosses at most one host boundary and one hop within a
 * host, and is copied verbatim, so the result is pairwise's to the bit.
 *
 * Cost per rank: two steps. Within: L-1 messages of H b each way; across: H-1 messages of
 * L b each way, a host's NIC carrying L (H-1) of them, the (n-L) L b bytes pairwise's
 * carry. So it trades H-1 times pairwise's bytes within the host for n-1 messages cut to
 * L+H-2: it suits small blocks on many hosts. Copies: the packing for step 1 (n blocks),
 * the packing for step 2 ((H-1) L blocks) and the unpacking of both (n blocks). Scratch
 * (comm->scratch.work): the message list, and three areas of n blocks (packed for
 * step 1, received in step 1, packed for and received in step 2).
 *
 * Exchanges, waits, errors and faults are pair_exchange.c's (hvdl_pair_exchange_set): the
 * watch hook, the data timeout, the injected faults and the abandoning of requests after a
 * failure hold in both steps; each step has its own tag.
 */
#include "algorithms/algorithms.h"
#include "transport/transport.h"

#define A2A_HIER_WITHIN_TAG 0x485F /* step 1 */
#define A2A_HIER_ACROSS_TAG 0x4860 /* step 2 */

hvdlResult_t hvdl_alltoall_hier_p2p(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                    size_t block) {
  const int r = comm->rank, n = comm->size;
  const size_t b = block;
  const char *send = sendbuff;
  char *recv = recvbuff;
  if (b == 0) return hvdlSuccess;
  if (send != recv) hvdl_copy(recv + (size_t)r * b, send + (size_t)r * b, b);
  if (n == 1) return hvdlSuccess;
  if (!comm->hier_p2p)
    return hvdl_fail(comm, hvdlInternalError,
                     "hier_p2p all-to-all without its grid (hosts of different sizes?)");
  const struct hvdl_host_grid *g = hvdl_hier_p2p_grid(comm->hier_p2p);
  const int H = g->hosts, L = g->per_host, h = g->host, j = g->local;

  /* scratch: the messages and their requests, then the three areas of n blocks */
  const int most = (L > H ? L : H) * 2;
  const size_t head = (size_t)most * (sizeof(struct hvdl_msg) + sizeof(MPI_Request));
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes, head + 3 * (size_t)n * b));
  struct hvdl_msg *msgs = (struct hvdl_msg *)(void *)s->work;
  MPI_Request *reqs = (MPI_Request *)(void *)(msgs + most);
  char *lanes = s->work + head;      /* [i][g]: S[(g, i)], the H blocks lane i carries */
  char *in = lanes + (size_t)n * b;  /* [i][g]: from local rank i (not j), its block for (g, j) */
  char *across = in + (size_t)n * b; /* [g][i]: to host g, then from host g */
  const size_t lane = (size_t)H * b, host = (size_t)L * b;

  /* 1. within the host: lane i's blocks to local rank i, lane j's from it. Taken from the
   * input before any receive is posted, so in place is safe. */
  for (int i = 0; i < L; i++)
    for (int k = 0; k < H; k++)
      hvdl_copy(lanes + (size_t)i * lane + (size_t)k * b,
                send + (size_t)hvdl_grid_rank(g, k, i) * b, b);
  int nm = 0;
  for (int i = 0; i < L; i++) {
    if (i == j) continue;
    const int peer = hvdl_grid_rank(g, h, i);
    msgs[nm++] = (struct hvdl_msg){peer, 1, in + (size_t)i * lane, lane};
    msgs[nm++] = (struct hvdl_msg){peer, 0, lanes + (size_t)i * lane, lane};
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, A2A_HIER_WITHIN_TAG, nm, msgs, reqs));
  for (int i = 0; i < L; i++) /* from this host's ranks: R[(h, i)] */
    if (i != j)
      hvdl_copy(recv + (size_t)hvdl_grid_rank(g, h, i) * b, in + (size_t)i * lane + (size_t)h * b,
                b);

  /* 2. across, lane j: host h's blocks for (k, j) out (packed in `across`), host k's for
   * this rank in (into `lanes`, free since step 1 ended) */
  nm = 0;
  for (int d = 1; d < H; d++) {
    const int k = (h + d) % H, from = (h - d + H) % H;
    char *out = across + (size_t)k * host;
    /* this rank's own blocks for lane j are still in `lanes`, the others' came into `in` */
    for (int i = 0; i < L; i++)
      hvdl_copy(out + (size_t)i * b, (i == j ? lanes : in) + (size_t)i * lane + (size_t)k * b, b);
    msgs[nm++] =
        (struct hvdl_msg){hvdl_grid_rank(g, from, j), 1, lanes + (size_t)from * host, host};
    msgs[nm++] = (struct hvdl_msg){hvdl_grid_rank(g, k, j), 0, out, host};
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, A2A_HIER_ACROSS_TAG, nm, msgs, reqs));
  for (int k = 0; k < H; k++) /* from host k's ranks: R[(k, i)] */
    if (k != h)
      for (int i = 0; i < L; i++)
        hvdl_copy(recv + (size_t)hvdl_grid_rank(g, k, i) * b,
                  lanes + (size_t)k * host + (size_t)i * b, b);
  return hvdlSuccess;
}
