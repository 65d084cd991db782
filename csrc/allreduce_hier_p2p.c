/*
 * allreduce_hier_p2p.c -- the hierarchical all-reduce over point-to-point
 * messages, for ranks on several hosts: within each host, across hosts, within
 * each host again.
 *
 * The layout (hvdl_hier_p2p_init, at communicator creation). H hosts of L
 * ranks each, from select.c's one host split (topology.c's hvdl_local_comm:
 * MPI_COMM_TYPE_SHARED, or hosts of k consecutive ranks with
 * HVD_LITE_RANKS_PER_HOST=k). The local group is this rank's host, in rank
 * order; the cross group is the ranks with this rank's local rank, one per
 * host, in rank order. Hosts of different sizes are refused (select.c builds no
 * groups, the algorithm is then no candidate, and forcing it fails at init): a
 * host's blocks below depend on its L, and the ranks that carry block b across
 * hosts must hold the same range on every host.
 *
 * The schedule at local rank j, B bytes, P = the largest power of two <= L,
 * the buffer cut into `lanes` blocks (allreduce_rab.c's cut; lanes a power of
 * two <= P, chosen by select.c: P, or fewer when a lane would be small):
 *
 *   1. within the host    Rabenseifner's reduce-scatter over the local group
 *                         (hvdl_rab_reduce_scatter, with pair.h's fold when L
 *                         is not a power of two): log2(P/lanes) steps that
 *                         hand the whole partial to the partner with bit m
 *                         clear (a binomial reduce), then recursive halving
 *                         among the ranks left; each of these ends holding the
 *                         host's partial of one lane, each element reduced
 *                         once in the fixed order; the others hold nothing
 *   2. across hosts       the ranks that hold the same lane -- the same local
 *                         rank on every host, since every host has the same L
 *                         -- all-reduce it in place over the cross group, with
 *                         recursive doubling or Rabenseifner (select.c's
 *                         choice for H ranks and B/lanes bytes); the lanes in
 *                         parallel. Avg divides by the number of ranks here, once
 *   3. within the host    phase 1 undone (hvdl_rab_all_gather): recursive
 *                         doubling of the lanes, then the whole result back to
 *                         the ranks that handed theirs over, and the fold's
 *
 * Bitwise identity. Each element's host partial is computed once, by the
 * holder of its lane, in the local group's balanced tree (pair.h's combining
 * rule; the same tree for any number of lanes); the cross all-reduce of a lane
 * gives its holders on all hosts the same bytes (rd's and rab's own guarantee,
 * allreduce_rd.c, allreduce_rab.c), divided alike; phase 3 only copies them. So every rank ends with the same
 * bytes, in place or not and on every rerun. The order (each host's ranks
 * first, then the hosts) differs from the flat algorithms', so a float sum may
 * differ from theirs in its last bits.
 *
 * Waits, errors and faults are pair.c's (hvdl_pair_exchange on the
 * communicator's own MPI communicator): the watch hook, the data timeout, the
 * injected faults and the abandoning of requests after a failure hold in every
 * phase. The local and cross peers are distinct ranks, and every exchange ends
 * before the next starts, so the phases' messages cannot be confused.
 *
 * Cost per rank (B bytes, L and H powers of two, lanes = L): log2(L) steps
 * within the host each way, (L-1)/L * B sent and received in each; across
 * hosts log2(H) steps of B/L (rd) or 2 log2(H) steps carrying 2(H-1)/H * B/L
 * (rab), with the host's L ranks sending through its NIC at once. With rab
 * across, these are exactly flat Rabenseifner's messages, ordered host-first;
 * rd across takes log2(H) steps instead of 2 log2(H) and sends log2(H) * B
 * per NIC. Fewer lanes turn the first halving steps within the host into
 * steps of B. A folded L adds two steps of B within the host; a folded H two
 * steps of B/lanes across.
 */
#include <stdlib.h>

#include "pair.h"

struct hvdl_hier_p2p {
  struct hvdl_group local, cross;
  int ranks[];            /* the local group's ranks, then the cross group's */
};

/* Each rank's group in comm's numbering: member i of sub is ranks[i] of comm. */
static hvdlResult_t translate(hvdlComm_t comm, MPI_Comm sub, int n, int *ranks) {
  MPI_Group gs, gc;
  int err = MPI_Comm_group(sub, &gs);
  if (err == MPI_SUCCESS) err = MPI_Comm_group(comm->mpi, &gc);
  if (err != MPI_SUCCESS) return hvdl_fail_mpi(comm, err, "MPI_Comm_group in hvdl_hier_p2p_init");
  int *in = malloc(sizeof(int) * (size_t)n);
  if (!in) err = MPI_ERR_NO_MEM;
  for (int i = 0; in && i < n; i++) in[i] = i;
  if (in) err = MPI_Group_translate_ranks(gs, n, in, gc, ranks);
  free(in);
  MPI_Group_free(&gs);
  MPI_Group_free(&gc);
  if (err != MPI_SUCCESS)
    return hvdl_fail_mpi(comm, err, "MPI_Group_translate_ranks in hvdl_hier_p2p_init");
  return hvdlSuccess;
}

static hvdlResult_t build(hvdlComm_t comm, MPI_Comm local, MPI_Comm cross,
                          struct hvdl_hier_p2p **out) {
  int lr, ls, cr, cs;
  MPI_Comm_rank(local, &lr);
  MPI_Comm_size(local, &ls);
  MPI_Comm_rank(cross, &cr);
  MPI_Comm_size(cross, &cs);
  struct hvdl_hier_p2p *h = calloc(1, sizeof *h + sizeof(int) * (size_t)(ls + cs));
  if (!h) return hvdl_fail(comm, hvdlSystemError, "hvdl_hier_p2p_init: out of memory");
  hvdlResult_t res = translate(comm, local, ls, h->ranks);
  if (res == hvdlSuccess) res = translate(comm, cross, cs, h->ranks + ls);
  if (res != hvdlSuccess) {
    free(h);
    return res;
  }
  h->local = (struct hvdl_group){.size = ls, .rank = lr, .ranks = h->ranks, .divisor = (uint64_t)ls};
  h->cross = (struct hvdl_group){.size = cs, .rank = cr, .ranks = h->ranks + ls,
                                 .divisor = (uint64_t)comm->size};
  *out = h;
  return hvdlSuccess;
}

hvdlResult_t hvdl_hier_p2p_init(hvdlComm_t comm, MPI_Comm local, struct hvdl_hier_p2p **out) {
  MPI_Comm cross = MPI_COMM_NULL;
  *out = NULL;
  int lr;
  MPI_Comm_rank(local, &lr);
  const int err = MPI_Comm_split(comm->mpi, lr, comm->rank, &cross);
  hvdlResult_t res = err == MPI_SUCCESS
                         ? build(comm, local, cross, out)
                         : hvdl_fail_mpi(comm, err, "MPI_Comm_split in hvdl_hier_p2p_init");
  if (cross != MPI_COMM_NULL) MPI_Comm_free(&cross);
  return res;
}

hvdlResult_t hvdl_allreduce_hier_p2p(hvdlComm_t comm, int lanes, hvdlAlgorithm_t across,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op) {
  const struct hvdl_hier_p2p *h = comm->hier_p2p;
  if (!h)
    return hvdl_fail(comm, hvdlInternalError,
                     "hier_p2p all-reduce without its groups (hosts of different sizes?)");
  struct hvdl_halving half = {.blocks = lanes};
  HVDL_CHECK(hvdl_rab_reduce_scatter(comm, &h->local, sendbuff, recvbuff, count, dt, op, &half));
  if (half.holds) {
    const size_t b0 = hvdl_rab_block(count, half.blocks, half.lo[half.steps]);
    const size_t b1 = hvdl_rab_block(count, half.blocks, half.hi[half.steps]);
    char *lane = (char *)recvbuff + b0 * hvdl_type_size(dt);
    if (b1 > b0)
      HVDL_CHECK(across == hvdlAlgoRabenseifner
                     ? hvdl_allreduce_rab_group(comm, &h->cross, lane, lane, b1 - b0, dt, op)
                     : hvdl_allreduce_rd_group(comm, &h->cross, lane, lane, b1 - b0, dt, op));
  }
  return hvdl_rab_all_gather(comm, &h->local, recvbuff, count, dt, &half);
}
