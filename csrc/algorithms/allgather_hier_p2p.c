/*
 * allgather_hier_p2p.c -- the two-level all-gather over point-to-point messages,
 * for ranks on several hosts of the same size: within each host, across hosts
 * (each remote host's blocks brought in once, by one rank of the host), within
 * each host again.
 *
 * The blocks are allgather_ring.c's: recvbuff holds n blocks in rank order, block k
 * of counts[k] elements, rank k contributes block k. The layout is hier_p2p's
 * (allreduce_hier_p2p.c, comm->hier_p2p; hosts of different sizes have none, and
 * the selector then neither considers this nor lets it be forced): its grid, H hosts
 * numbered by their lowest ranks, L ranks each; rank (g, i) is local rank i of host
 * g. Host-block g is the L blocks of host g's ranks: one run of recvbuff where the
 * host's ranks are consecutive (ranks placed by host), else a run for each run of
 * consecutive ranks, each its own message.
 *
 * The schedule at rank (h, j); D(j) = the offsets d in 1 .. H-1 with
 * (d - 1) mod L = j, so that the offsets of the H-1 other hosts are dealt out
 * among the L local ranks, ceil((H-1)/L) at most to each:
 *
 *   own          recvbuff[own] = sendbuff unless in place
 *   1. within    one step: its block to each of the L-1 other ranks of host h,
 *                theirs from each (all at once, the receives posted first): host-
 *                block h is whole on every rank of the host
 *   2. across    one step: for every d in D(j), host-block h to rank (h+d, j), and
 *                host-block h-d from rank (h-d, j) (mod H), all at once
 *   3. within    one step: each host-block received in 2 to each of the L-1 other
 *                ranks of host h; from local rank i, the host-blocks h-d, d in D(i)
 *
 * Every host-block g != h reaches host h once, through its NIC, at local rank
 * (d-1) mod L for d = h - g, and goes on within the host from there; host h's own
 * leaves its NIC once for each other host. Each phase waits for all of its messages
 * (pair_exchange.c's set) before the next is posted; each phase has its own tag.
 *
 * Every block is its owner's bytes, copied verbatim, so every rank ends with the same
 * bytes whatever the order. Each place of recvbuff is written once, by one message
 * (or the own copy), and is sent from only after the phase that wrote it has ended,
 * so in place is safe with no scratch.
 *
 * Waits, errors and faults are pair_exchange.c's (hvdl_pair_exchange_set): the watch
 * hook, the data timeout, the injected faults and the abandoning of requests after a
 * failure hold in every phase.
 *
 * Cost per rank (B bytes of result, equal blocks, k = ceil((H-1)/L)): three steps,
 * whatever H and L. Within the host, phase 1 sends and receives L-1 blocks (L-1)/n * B;
 * phase 3 sends up to k host-blocks to each of L-1 peers (up to (L-1) k B/H) and
 * receives the rest of the result, (H-1-|D(j)|) B/H. Across, up to k host-blocks of B/H
 * each way; a host's NIC carries (H-1)/H * B in and out, the least an all-gather can,
 * with H-1 messages in flight at once in each direction. Messages posted at once per
 * rank: 2(L-1), 2k, and (L-1) k + H-1 at most (times L where hosts' ranks are not
 * consecutive). Scratch: the message list (comm->scratch.work), no data.
 */
#include "algorithms/algorithms.h"
#include "transport/transport.h"

#define AG_HIER_WITHIN_TAG 0x4858 /* "HX": phase 1 */
#define AG_HIER_ACROSS_TAG 0x4859 /* phase 2 */
#define AG_HIER_SPREAD_TAG 0x485A /* phase 3 */

struct place {
  const struct hvdl_host_grid *g;
  const size_t *counts;
  size_t esize;
  char *recv;
  struct hvdl_msg *msgs;
  int nm;
};

/* Host-block `host` to or from `peer`: a message for each run of consecutive ranks
 * of the host (one where ranks are placed by host, at most L). */
static void add_host_block(struct place *p, int host, int peer, int recv) {
  size_t at, len;
  for (int i = 0; i < p->g->per_host;) {
    i = hvdl_grid_run(p->g, p->counts, host, i, &at, &len);
    p->msgs[p->nm++] = (struct hvdl_msg){peer, recv, p->recv + at * p->esize, len * p->esize};
  }
}

hvdlResult_t hvdl_allgatherv_hier_p2p(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                      const size_t *counts, hvdlDataType_t dt) {
  const int r = comm->rank;
  const size_t esize = hvdl_type_size(dt), total = hvdl_before(counts, comm->size);
  char *own = (char *)recvbuff + hvdl_before(counts, r) * esize;
  if (total == 0) return hvdlSuccess;
  if (own != sendbuff && counts[r] > 0) hvdl_copy(own, sendbuff, counts[r] * esize);
  if (comm->size == 1) return hvdlSuccess;
  if (!comm->hier_p2p)
    return hvdl_fail(comm, hvdlInternalError,
                     "hier_p2p all-gather without its grid (hosts of different sizes?)");
  const struct hvdl_host_grid *g = hvdl_hier_p2p_grid(comm->hier_p2p);
  const int H = g->hosts, L = g->per_host, h = g->host, j = g->local;

  const int k = (H - 1 + L - 1) / L; /* the most offsets a local rank takes */
  const size_t most = (size_t)L * ((size_t)(L + 1) * k + H + 1) + 2 * (size_t)L;
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes,
                          most * (sizeof(struct hvdl_msg) + sizeof(MPI_Request))));
  struct place p = {g, counts, esize, recvbuff, (struct hvdl_msg *)(void *)s->work, 0};
  MPI_Request *reqs = (MPI_Request *)(void *)(p.msgs + most);

  /* 1. within the host: this rank's block to and from every other rank of it */
  for (int i = 0; i < L; i++) {
    if (i == j) continue;
    const int peer = hvdl_grid_rank(g, h, i);
    const size_t at = hvdl_before(counts, peer) * esize;
    p.msgs[p.nm++] = (struct hvdl_msg){peer, 1, (char *)recvbuff + at, counts[peer] * esize};
    p.msgs[p.nm++] = (struct hvdl_msg){peer, 0, own, counts[r] * esize};
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, AG_HIER_WITHIN_TAG, p.nm, p.msgs, reqs));

  /* 2. across: host-block h out to hosts h+d, host-blocks h-d in, for d in D(j) */
  p.nm = 0;
  for (int d = j + 1; d < H; d += L) {
    add_host_block(&p, (h - d + H) % H, hvdl_grid_rank(g, h - d, j), 1);
    add_host_block(&p, h, hvdl_grid_rank(g, h + d, j), 0);
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, AG_HIER_ACROSS_TAG, p.nm, p.msgs, reqs));

  /* 3. within the host: what each rank brought in, to the others */
  p.nm = 0;
  for (int i = 0; i < L; i++) {
    if (i == j) continue;
    const int peer = hvdl_grid_rank(g, h, i);
    for (int d = i + 1; d < H; d += L) add_host_block(&p, (h - d + H) % H, peer, 1);
    for (int d = j + 1; d < H; d += L) add_host_block(&p, (h - d + H) % H, peer, 0);
  }
  return hvdl_pair_exchange_set(comm, AG_HIER_SPREAD_TAG, p.nm, p.msgs, reqs);
}
