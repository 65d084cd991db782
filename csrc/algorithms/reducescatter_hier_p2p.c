/*
 * reducescatter_hier_p2p.c -- the two-level reduce-scatter over point-to-point
 * messages, for ranks on several hosts of the same size: allgather_hier_p2p.c's
 * schedule mirrored. Within each host the ranks' inputs are reduced for what leaves
 * the host and for each rank's own block; across hosts each host's partial of a
 * remote host's blocks goes once, to one rank of it; within the host again the
 * partials of each block go to its owner, which combines the hosts' partials.
 *
 * The blocks are reducescatter_ring.c's: sendbuff holds n blocks on every rank,
 * block k of counts[k] elements; rank k ends with block k reduced over every rank
 * in recvbuff. The layout is allgather_hier_p2p.c's (hier_p2p's grid, H hosts of L
 * ranks, rank (g, i) local rank i of host g; host-block g the L blocks of host g's
 * ranks, sent as one message a run of consecutive ranks) and so is D(j), the offsets
 * d in 1 .. H-1 with (d - 1) mod L = j. x_i is local rank i's input; P_g[.] is host
 * g's partial, the reduction of its L ranks' inputs in local rank order,
 * ((x_0 op x_1) op x_2) ... op x_(L-1).
 *
 * The schedule at rank (h, j):
 *
 *   1. within    one step: from each other local rank i, its input of host-blocks
 *                h+d (d in D(j)) and of block (h, j); to each, this rank's input of
 *                host-blocks h+d (d in D(i)) and of block (h, i) (the receives
 *                posted first, into scratch, packed). Then P_h of those host-blocks
 *                and of block (h, j), in local rank order
 *   2. across    one step: P_h[host-block h+d] to rank (h+d, j), and
 *                P_(h-d)[host-block h] from rank (h-d, j), for d in D(j), all at once
 *   3. within    one step: to each other local rank i, block (h, i) of each
 *                P_(h-d)[host-block h] received in 2; from local rank i, block
 *                (h, j) of P_(h-d) for d in D(i). Then block (h, j) =
 *                the hosts' partials P_0 .. P_(H-1) combined in transport.h's tree
 *                (the fold's pairs, then aligned groups, lower op higher); Avg
 *                divides by n
 *
 * Bitwise identity. Every element of block (h, j) is the same expression of the
 * inputs whatever the timing, the call (in place or not) or the rank that computes a
 * part of it: each host's partial in local rank order, computed once, by one rank,
 * then the H partials in the tree over the hosts in order. With ranks placed by host
 * that is hier_p2p's all-reduce's order (allreduce_hier_p2p.c: its host partial in
 * local rank order, then rd's or rab's tree over the hosts), so this reduce-scatter
 * followed by any all-gather gives, element by element, the bytes of
 * HVD_LITE_ALLREDUCE_ALGO=hier_p2p (tested). It differs from the flat reduce-scatters'
 * orders, so a float sum may differ from theirs in its last bits.
 *
 * In place (recvbuff is block r of sendbuff): sendbuff is read only by the sends and
 * copies of phase 1, which end before recvbuff is written, at the very end.
 *
 * Waits, errors and faults are pair_exchange.c's (hvdl_pair_exchange_set) in every
 * phase, each with its own tag.
 *
 * Cost per rank (B bytes of input, equal blocks, k = ceil((H-1)/L)): three steps
 * whatever H and L. Within the host a rank receives and reduces (L-1) times its share,
 * up to k host-blocks of B/H and a block of B/n, and sends as much; across, up to k
 * host-blocks each way, a host's NIC carrying (H-1)/H * B each way, the least a
 * reduce-scatter can; within again up to (L-1) k blocks out and H-1 in, and H-1
 * combinations of a block. Scratch (comm->scratch.stage): L+1 packed shares, the
 * host-blocks received across and H blocks; the message list in comm->scratch.work.
 */
#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/transport.h"

#define RS_HIER_WITHIN_TAG 0x485C /* "H\": phase 1 */
#define RS_HIER_ACROSS_TAG 0x485D /* phase 2 */
#define RS_HIER_SPREAD_TAG 0x485E /* phase 3 */

struct layout {
  const struct hvdl_host_grid *g;
  const size_t *counts;
  size_t esize;
  struct hvdl_msg *msgs;
  int nm;
};

/* Elements of host-block `host`, and of its local ranks below i (block i's offset in it packed). */
static size_t host_block(const struct layout *y, int host, int i) {
  size_t s = 0;
  for (int q = 0; q < i; q++) s += y->counts[hvdl_grid_rank(y->g, host, q)];
  return s;
}

/* Host-block `host` of the input (sendbuff) to peer, a message a run of consecutive
 * ranks; or (packed != NULL) from peer into packed, the same runs one after another. */
static void add_host_block(struct layout *y, int host, int peer, const char *sendbuff,
                           char *packed) {
  size_t off = 0, at, len;
  for (int i = 0; i < y->g->per_host; off += len) {
    i = hvdl_grid_run(y->g, y->counts, host, i, &at, &len);
    char *buf = packed ? packed + off * y->esize : (char *)sendbuff + at * y->esize;
    y->msgs[y->nm++] = (struct hvdl_msg){peer, packed != NULL, buf, len * y->esize};
  }
}

/* The share local rank i gathers in phase 1, packed: host-blocks h+d (d in D(i)), then
 * block (h, i); its length in elements. */
static size_t share_len(const struct layout *y, int i) {
  const int H = y->g->hosts, L = y->g->per_host, h = y->g->host;
  size_t s = y->counts[hvdl_grid_rank(y->g, h, i)];
  for (int d = i + 1; d < H; d += L) s += host_block(y, h + d, L);
  return s;
}

/* Local rank i's input of its share (phase 1): to peer, or from peer into packed;
 * packed == NULL and peer < 0: copied from sendbuff into own. */
static void add_share(struct layout *y, int i, int peer, const char *sendbuff, char *packed) {
  const int H = y->g->hosts, L = y->g->per_host, h = y->g->host;
  size_t off = 0;
  for (int d = i + 1; d < H; d += L) {
    add_host_block(y, h + d, peer, sendbuff, packed ? packed + off * y->esize : NULL);
    off += host_block(y, h + d, L);
  }
  const int owner = hvdl_grid_rank(y->g, h, i);
  char *buf = packed ? packed + off * y->esize
                     : (char *)sendbuff + hvdl_before(y->counts, owner) * y->esize;
  y->msgs[y->nm++] = (struct hvdl_msg){peer, packed != NULL, buf, y->counts[owner] * y->esize};
}

hvdlResult_t hvdl_reducescatterv_hier_p2p(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                          const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op) {
  const int n = comm->size, r = comm->rank;
  const size_t esize = hvdl_type_size(dt), total = hvdl_before(counts, n);
  if (total == 0) return hvdlSuccess;
  if (n == 1) {
    if (recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, total * esize);
    return hvdlSuccess; /* Avg: a division by 1 */
  }
  if (!comm->hier_p2p)
    return hvdl_fail(comm, hvdlInternalError,
                     "hier_p2p reduce-scatter without its grid (hosts of different sizes?)");
  const struct hvdl_host_grid *g = hvdl_hier_p2p_grid(comm->hier_p2p);
  const int H = g->hosts, L = g->per_host, h = g->host, j = g->local;
  const int k = (H - 1 + L - 1) / L;
  struct layout y = {g, counts, esize, NULL, 0};
  struct {
    size_t share, received, mine; /* elements: this rank's share, host-blocks in, its block */
  } sz = {share_len(&y, j), 0, counts[r]};
  const size_t hb = host_block(&y, h, L), mine_at = host_block(&y, h, j);
  for (int d = j + 1; d < H; d += L) sz.received += hb;

  struct hvdl_scratch *s = &comm->scratch;
  const size_t most = (size_t)(L + 1) * ((size_t)k * L + 1) + (size_t)(H + 1) * L + 2 * k + H;
  HVDL_CHECK(hvdl_reserve(
      comm, &s->work, &s->work_bytes,
      (size_t)H * sizeof(char *) + most * (sizeof(struct hvdl_msg) + sizeof(MPI_Request))));
  HVDL_CHECK(
      hvdl_reserve(comm, &s->stage, &s->stage_bytes,
                   ((size_t)(L + 1) * sz.share + sz.received + (size_t)H * sz.mine) * esize + 1));
  char **parts = (char **)(void *)s->work; /* block (h, j) of P_g, by host g */
  y.msgs = (struct hvdl_msg *)(void *)(parts + H);
  MPI_Request *reqs = (MPI_Request *)(void *)(y.msgs + most);
  char *area = s->stage;                           /* L shares, by local rank */
  char *acc = area + (size_t)L * sz.share * esize; /* P_h of this rank's share */
  char *across = acc + sz.share * esize;           /* P_(h-d)[host-block h], d in D(j) */
  char *pieces = across + sz.received * esize;     /* block (h, j) of P_g, by host g */

  /* 1. within: every rank's input of this rank's share in, each peer's share out */
  for (int i = 0; i < L; i++) {
    if (i == j) continue;
    const int peer = hvdl_grid_rank(g, h, i);
    add_share(&y, j, peer, sendbuff, area + (size_t)i * sz.share * esize);
    add_share(&y, i, peer, sendbuff, NULL);
  }
  const int posted = y.nm;
  add_share(&y, j, -1, sendbuff, NULL); /* this rank's own input of its share, to pack */
  char *own = area + (size_t)j * sz.share * esize;
  for (int q = posted; q < y.nm; own += y.msgs[q].bytes, q++)
    if (y.msgs[q].bytes) hvdl_copy(own, y.msgs[q].buf, y.msgs[q].bytes);
  y.nm = posted;
  HVDL_CHECK(hvdl_pair_exchange_set(comm, RS_HIER_WITHIN_TAG, y.nm, y.msgs, reqs));
  if (L == 1) {
    hvdl_copy(acc, area, sz.share * esize);
  } else if (sz.share > 0) {
    hvdl_reduce(acc, area, area + sz.share * esize, sz.share, dt, op);
    for (int i = 2; i < L; i++)
      hvdl_reduce(acc, acc, area + (size_t)i * sz.share * esize, sz.share, dt, op);
  }

  /* 2. across: P_h of host-block h+d out to rank (h+d, j), P_(h-d) of host-block h in */
  y.nm = 0;
  size_t off = 0, got = 0;
  for (int d = j + 1; d < H; d += L) {
    const size_t len = host_block(&y, h + d, L);
    y.msgs[y.nm++] =
        (struct hvdl_msg){hvdl_grid_rank(g, h - d, j), 1, across + got * esize, hb * esize};
    y.msgs[y.nm++] =
        (struct hvdl_msg){hvdl_grid_rank(g, h + d, j), 0, acc + off * esize, len * esize};
    off += len;
    got += hb;
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, RS_HIER_ACROSS_TAG, y.nm, y.msgs, reqs));

  /* 3. within: block (h, i) of each partial received to local rank i; block (h, j) of
   * the partials its peers received in */
  y.nm = 0;
  for (int i = 0; i < L; i++) {
    if (i == j) continue;
    const int peer = hvdl_grid_rank(g, h, i);
    const size_t its = host_block(&y, h, i), len = counts[peer];
    for (int d = i + 1; d < H; d += L) {
      const int from = ((h - d) % H + H) % H;
      y.msgs[y.nm++] =
          (struct hvdl_msg){peer, 1, pieces + (size_t)from * sz.mine * esize, sz.mine * esize};
    }
    for (size_t q = 0, d = (size_t)j + 1; d < (size_t)H; d += (size_t)L, q++)
      y.msgs[y.nm++] = (struct hvdl_msg){peer, 0, across + (q * hb + its) * esize, len * esize};
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, RS_HIER_SPREAD_TAG, y.nm, y.msgs, reqs));

  /* Block (h, j): the hosts' partials in the tree over the hosts in order. */
  if (sz.mine == 0) return hvdlSuccess;
  for (int q = 0; q < H; q++) parts[q] = pieces + (size_t)q * sz.mine * esize;
  parts[h] = acc + (sz.share - sz.mine) * esize;
  for (size_t q = 0, d = (size_t)j + 1; d < (size_t)H; d += (size_t)L, q++)
    parts[((h - (int)d) % H + H) % H] = across + (q * hb + mine_at) * esize;
  hvdl_tree_combine(recvbuff, parts, H, sz.mine, dt, op);
  if (op == hvdlAvg) hvdl_divide(recvbuff, sz.mine, dt, (uint64_t)n);
  return hvdlSuccess;
}
