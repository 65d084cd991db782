/*
 * alltoall_hier_pairs.c -- the all-to-all by host pairs (HVD_LITE_ALLTOALL_ALGO=hier_pairs),
 * for blocks all of one size (b bytes) on ranks spread over hosts of the same size: each
 * pair of hosts exchanges its L*L blocks as one message each way, carried by one rank of
 * each host, so that a rank posts about ceil((H-1)/L) messages across hosts where pairwise
 * (alltoall_pairwise.c) posts n-L and hier_p2p (alltoall_hier_p2p.c) H-1.
 *
 * The layout is hier_p2p's (allreduce_hier_p2p.c, comm->hier_p2p): H hosts of L ranks,
 * rank (g, i) local rank i of host g. The carrier of host h for host g (g != h) is local
 * rank (d - 1) mod L of host h, d = (g - h) mod H: it sends host h's blocks for host g and
 * receives host g's for host h, so (h, carrier) and (g, carrier of g for h) are partners.
 * Local rank j carries the m_j hosts h + j + 1 + c L (mod H), c = 0 .. m_j - 1. The
 * schedule at rank (h, j), its send blocks S[q], its receive blocks R[q]:
 *
 *   own      R[(h, j)] = S[(h, j)] unless in place
 *   1.gather to each other local rank i: S[(h, i)], then for each host g that i carries the
 *            L blocks S[(g, k)], k = 0 .. L-1; from each, its block for this rank, R[(h, i)],
 *            and its L blocks for each host this rank carries
 *   2.across to each carried host g's partner: the L x L blocks [i][k] = rank (h, i)'s block
 *            for (g, k); from it host g's L x L blocks for host h, [i][k] = (g, i)'s for (h, k)
 *   3.spread to each other local rank k: for each carried host g, the L blocks [i][k] of g's
 *            message, R[(g, i)] at rank (h, k); from each local rank, the same for its hosts
 *
 * A block crosses at most one host boundary and two hops within hosts and is copied
 * verbatim, so the result is pairwise's to the bit.
 *
 * Cost per rank: three steps. Gather and spread: L-1 messages each way, of 1 + m L and m L
 * blocks; across: m_j messages of L*L blocks each way, a host's NIC carrying H-1 of them.
 * It carries pairwise's bytes across hosts, in the fewest and largest messages, and every
 * block bound for another host twice within a host (once on each side): (L-1)(1 + 2 m L)
 * blocks a rank within its host where pairwise moves L-1. It suits small blocks where every
 * rank carries at most one host (m = 1; docs/scale.md, "All-to-all"). Scratch
 * (comm->scratch.work): the message list, the gather's messages out and in, the across
 * messages out and in, the spread's out and in.
 *
 * Exchanges, waits, errors and faults are pair_exchange.c's (hvdl_pair_exchange_set): the
 * watch hook, the data timeout, the injected faults and the abandoning of requests after a
 * failure hold in every step; each step has its own tag.
 */
#include "algorithms/algorithms.h"
#include "transport/transport.h"

#define A2A_PAIRS_GATHER_TAG 0x4861 /* step 1 */
#define A2A_PAIRS_ACROSS_TAG 0x4862 /* step 2 */
#define A2A_PAIRS_SPREAD_TAG 0x4863 /* step 3 */

/* The local rank of host h that carries its blocks for host g, and host g's for it. */
static int carrier(int H, int L, int h, int g) { return ((g - h + H) % H - 1) % L; }

/* How many hosts local rank j carries for (the d = j + 1, j + 1 + L, ... below H). */
int hvdl_hier_pairs_carried(int H, int L, int j) { return j < H - 1 ? (H - 2 - j) / L + 1 : 0; }

/* The c-th host local rank j of host h carries for. */
static int carried_host(int H, int L, int h, int j, int c) { return (h + j + 1 + c * L) % H; }

hvdlResult_t hvdl_alltoall_hier_pairs(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                      size_t block) {
  const int r = comm->rank, n = comm->size;
  const size_t b = block;
  const char *send = sendbuff;
  char *recv = recvbuff;
  if (b == 0) return hvdlSuccess;
  if (n == 1) {
    if (send != recv) hvdl_copy(recv, send, b);
    return hvdlSuccess;
  }
  if (!comm->hier_p2p)
    return hvdl_fail(comm, hvdlInternalError,
                     "hier_pairs all-to-all without its grid (hosts of different sizes?)");
  const struct hvdl_host_grid *g = hvdl_hier_p2p_grid(comm->hier_p2p);
  const int H = g->hosts, L = g->per_host, h = g->host, j = g->local;
  const int mj = hvdl_hier_pairs_carried(H, L, j);
  const size_t square = (size_t)L * L * b; /* one host pair's blocks one way */

  /* the sizes of the six areas */
  size_t gather_out = 0, spread_in = 0;
  for (int i = 0; i < L; i++)
    if (i != j) {
      gather_out += (1 + (size_t)hvdl_hier_pairs_carried(H, L, i) * L) * b;
      spread_in += (size_t)hvdl_hier_pairs_carried(H, L, i) * L * b;
    }
  const size_t gather_one = (1 + (size_t)mj * L) * b; /* from each local rank */
  const size_t gather_in = (size_t)(L - 1) * gather_one, across = (size_t)mj * square;
  const size_t spread_one = (size_t)mj * L * b, spread_out = (size_t)(L - 1) * spread_one;
  const int most = 2 * (L > mj ? L : mj);
  const size_t head = (size_t)most * (sizeof(struct hvdl_msg) + sizeof(MPI_Request));
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes,
                          head + gather_out + gather_in + 2 * across + spread_out + spread_in));
  struct hvdl_msg *msgs = (struct hvdl_msg *)(void *)s->work;
  MPI_Request *reqs = (MPI_Request *)(void *)(msgs + most);
  char *g_out = s->work + head, *g_in = g_out + gather_out;
  char *a_out = g_in + gather_in, *a_in = a_out + across; /* [c][i][k] */
  char *s_out = a_in + across, *s_in = s_out + spread_out;

  /* 1. gather. Everything read from the input is copied out before any receive is posted
   * (the receives land in scratch, the result is written after), so in place is safe. */
  int nm = 0;
  char *out = g_out;
  for (int i = 0; i < L; i++) {
    if (i == j) continue;
    const int peer = hvdl_grid_rank(g, h, i), mi = hvdl_hier_pairs_carried(H, L, i);
    const size_t len = (1 + (size_t)mi * L) * b;
    hvdl_copy(out, send + (size_t)peer * b, b);
    for (int c = 0; c < mi; c++) {
      const int to = carried_host(H, L, h, i, c);
      for (int k = 0; k < L; k++)
        hvdl_copy(out + (1 + (size_t)c * L + k) * b, send + (size_t)hvdl_grid_rank(g, to, k) * b,
                  b);
    }
    msgs[nm++] =
        (struct hvdl_msg){peer, 1, g_in + (size_t)(i < j ? i : i - 1) * gather_one, gather_one};
    msgs[nm++] = (struct hvdl_msg){peer, 0, out, len};
    out += len;
  }
  for (int c = 0; c < mj; c++) { /* this rank's own row of each across message */
    const int to = carried_host(H, L, h, j, c);
    for (int k = 0; k < L; k++)
      hvdl_copy(a_out + (size_t)c * square + ((size_t)j * L + k) * b,
                send + (size_t)hvdl_grid_rank(g, to, k) * b, b);
  }
  if (send != recv) hvdl_copy(recv + (size_t)r * b, send + (size_t)r * b, b);
  HVDL_CHECK(hvdl_pair_exchange_set(comm, A2A_PAIRS_GATHER_TAG, nm, msgs, reqs));
  for (int i = 0; i < L; i++) {
    if (i == j) continue;
    const char *in = g_in + (size_t)(i < j ? i : i - 1) * gather_one;
    hvdl_copy(recv + (size_t)hvdl_grid_rank(g, h, i) * b, in, b);
    for (int c = 0; c < mj; c++)
      hvdl_copy(a_out + (size_t)c * square + (size_t)i * L * b, in + (1 + (size_t)c * L) * b,
                (size_t)L * b);
  }

  /* 2. across: one message each way with each carried host's partner */
  nm = 0;
  for (int c = 0; c < mj; c++) {
    const int to = carried_host(H, L, h, j, c);
    const int peer = hvdl_grid_rank(g, to, carrier(H, L, to, h));
    msgs[nm++] = (struct hvdl_msg){peer, 1, a_in + (size_t)c * square, square};
    msgs[nm++] = (struct hvdl_msg){peer, 0, a_out + (size_t)c * square, square};
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, A2A_PAIRS_ACROSS_TAG, nm, msgs, reqs));

  /* 3. spread: column k of each message that came across to local rank k; column j here */
  nm = 0;
  char *in = s_in;
  out = s_out;
  for (int k = 0; k < L; k++) {
    if (k == j) continue;
    const int peer = hvdl_grid_rank(g, h, k), mk = hvdl_hier_pairs_carried(H, L, k);
    if (mk > 0) {
      msgs[nm++] = (struct hvdl_msg){peer, 1, in, (size_t)mk * L * b};
      in += (size_t)mk * L * b;
    }
    if (mj > 0) {
      for (int c = 0; c < mj; c++)
        for (int i = 0; i < L; i++)
          hvdl_copy(out + ((size_t)c * L + i) * b,
                    a_in + (size_t)c * square + ((size_t)i * L + k) * b, b);
      msgs[nm++] = (struct hvdl_msg){peer, 0, out, spread_one};
      out += spread_one;
    }
  }
  for (int c = 0; c < mj; c++) {
    const int from = carried_host(H, L, h, j, c);
    for (int i = 0; i < L; i++)
      hvdl_copy(recv + (size_t)hvdl_grid_rank(g, from, i) * b,
                a_in + (size_t)c * square + ((size_t)i * L + j) * b, b);
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, A2A_PAIRS_SPREAD_TAG, nm, msgs, reqs));
  in = s_in;
  for (int k = 0; k < L; k++) {
    if (k == j) continue;
    for (int c = 0; c < hvdl_hier_pairs_carried(H, L, k); c++) {
      const int from = carried_host(H, L, h, k, c);
      for (int i = 0; i < L; i++, in += b)
        hvdl_copy(recv + (size_t)hvdl_grid_rank(g, from, i) * b, in, b);
    }
  }
  return hvdlSuccess;
}
