/*
 * allreduce_hier_p2p.c -- the hierarchical all-reduce over point-to-point
 * messages, for ranks on several hosts: within each host, across hosts, within
 * each host again.
 *
 * The layout (hvdl_hier_p2p_init, at communicator creation). H hosts of L
 * ranks each, from select_allreduce.c's one host split (topology.c's hvdl_local_comm:
 * MPI_COMM_TYPE_SHARED, or hosts of k consecutive ranks with
 * HVD_LITE_RANKS_PER_HOST=k). The local group is this rank's host, in rank
 * order; the cross group is the ranks with this rank's local rank, one per
 * host, in rank order. Hosts of different sizes are refused (select_allreduce.c builds no
 * groups, the algorithm is then no candidate, and forcing it fails at init): a
 * host's blocks below depend on its L, and the ranks that carry block b across
 * hosts must hold the same range on every host. The same init also makes the
 * grid (hvdl_hier_p2p_grid): every host's ranks, the hosts numbered by their
 * lowest ranks, for the two-level all-gather, reduce-scatter and broadcast
 * (allgather_hier_p2p.c, reducescatter_hier_p2p.c, broadcast_hier_p2p.c) on this
 * layout; one all-gather of an int per rank.
 *
 * The schedule at local rank j of a host of L (any L >= 1), B bytes, the
 * buffer cut into `lanes` blocks (base.h's even cut, hvdl_block_start; 1 <=
 * lanes <= L, chosen by select_allreduce.c: L, or fewer when a lane would be small).
 * Local rank k < lanes holds lane k:
 *
 *   1. within the host    one step: every rank sends each lane k but its own
 *                         to local rank k, all at once (the receives posted
 *                         first); holder j receives lane j from the other
 *                         L-1 and reduces it in local rank order,
 *                         ((x0 op x1) op x2) ... op x(L-1), into recvbuff
 *                         (in place, its own lane is copied aside first when
 *                         j >= 2, as the running result overwrites it)
 *   2. across hosts       the ranks that hold the same lane -- the same local
 *                         rank on every host, since every host has the same L
 *                         -- all-reduce it in place over the cross group, with
 *                         recursive doubling, Rabenseifner or the direct exchange
 *                         (allreduce_direct.c; select_allreduce.c's choice for H
 *                         ranks and B/lanes bytes); the lanes in parallel. Avg
 *                         divides by the number of ranks here, once
 *   3. within the host    one step, phase 1 mirrored: holder j sends its
 *                         finished lane to the other L-1, and every rank
 *                         receives each lane k but its own from local rank k
 *                         straight into recvbuff
 *
 * A rank's receives of phase 3 are posted only after its sends of phase 1 have
 * completed (each phase waits for all of its messages), so in place no receive
 * can write a block that a send is still reading. Both phases use their own
 * tag; a pair's messages of one phase are matched in the order posted.
 *
 * Bitwise identity. Each element's host partial is computed once, by the
 * holder of its lane, in local rank order (the same order for any number of
 * lanes); the cross all-reduce of a lane gives its holders on all hosts the
 * same bytes (rd's, rab's and the direct exchange's own guarantee, allreduce_rd.c,
 * allreduce_rab.c, allreduce_direct.c),
 * divided alike; phase 3 only copies them. So every rank ends with the same
 * bytes, in place or not and on every rerun. The order (each host's ranks in
 * turn, then the hosts in transport.h's tree, whichever of the three runs
 * across) differs from the flat algorithms', so a float sum may differ from
 * theirs in its last bits.
 *
 * Waits, errors and faults are pair_exchange.c's (hvdl_pair_exchange_set and, across,
 * hvdl_pair_exchange or, direct, the set again, on the communicator's own MPI
 * communicator): the watch
 * hook, the data timeout, the injected faults and the abandoning of requests
 * after a failure hold in every phase. The local and cross peers are distinct
 * ranks, and every phase ends before the next starts, so the phases' messages
 * cannot be confused.
 *
 * Cost per rank (B bytes, H hosts, lanes = L): one step within the host each
 * way, in which a holder receives (phase 1) or sends (phase 3) L-1 messages
 * of B/L, (L-1)/L * B in all, and every rank sends or receives L-1 of them;
 * across hosts log2(H) steps of B/L (rd), 2 log2(H) steps carrying
 * 2(H-1)/H * B/L (rab) or one step of H-1 messages of B/L (direct), with the
 * host's L ranks sending through its NIC at once; a folded H adds two steps of
 * B/lanes across to rd and rab. With rab across, the
 * steps across are flat Rabenseifner's; the log2(L) steps each way within the
 * host that Rabenseifner takes (its steps with mask < L) are one here. Fewer
 * lanes put L-1 messages of B/lanes on each of the `lanes` holders and leave
 * the other ranks sending and receiving `lanes` messages. Scratch: L blocks of
 * B/lanes on a holder.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/transport.h"

#define GATHER_TAG 0x4850 /* "HP": phase 1 */
#define SPREAD_TAG 0x4851 /* phase 3 */

struct hvdl_hier_p2p {
  struct hvdl_group local, cross;
  struct hvdl_host_grid grid; /* every host's ranks, for the two-level collectives */
  struct hvdl_msg *msgs;      /* one phase's messages within the host: at most 2(L-1) */
  MPI_Request *reqs;          /* and their requests */
  int *grid_ranks;            /* grid.ranks, then grid.slot: n each */
  int ranks[];                /* the local group's ranks, then the cross group's */
};

const struct hvdl_group *hvdl_hier_p2p_local(const struct hvdl_hier_p2p *h) { return &h->local; }

const struct hvdl_host_grid *hvdl_hier_p2p_grid(const struct hvdl_hier_p2p *h) { return &h->grid; }

int hvdl_grid_rank(const struct hvdl_host_grid *g, int host, int i) {
  return g->ranks[(size_t)((host % g->hosts + g->hosts) % g->hosts) * g->per_host + i];
}

int hvdl_grid_run(const struct hvdl_host_grid *g, const size_t *counts, int host, int i, size_t *at,
                  size_t *len) {
  int end = i + 1;
  while (end < g->per_host && hvdl_grid_rank(g, host, end) == hvdl_grid_rank(g, host, end - 1) + 1)
    end++;
  *at = hvdl_before(counts, hvdl_grid_rank(g, host, i));
  *len = hvdl_before(counts, hvdl_grid_rank(g, host, end - 1) + 1) - *at;
  return end;
}

void hvdl_hier_p2p_free(struct hvdl_hier_p2p *h) {
  if (!h) return;
  free(h->msgs);
  free(h->reqs);
  free(h->grid_ranks);
  free(h);
}

/* The grid: every rank's host (numbered by the hosts' lowest ranks, in order) and
 * local rank (its place among its host's ranks, in rank order), from one all-gather
 * of each rank's host's lowest rank. Every host has L ranks (the caller's check). */
static hvdlResult_t build_grid(hvdlComm_t comm, struct hvdl_hier_p2p *h) {
  const int n = comm->size, L = h->local.size, H = n / L;
  int *first = malloc(sizeof(int) * (size_t)n), *index = malloc(sizeof(int) * (size_t)n);
  int *seen = calloc((size_t)n, sizeof(int));
  h->grid_ranks = malloc(2 * sizeof(int) * (size_t)n);
  hvdlResult_t res = hvdlSuccess;
  if (!first || !index || !seen || !h->grid_ranks)
    res = hvdl_fail(comm, hvdlSystemError, "hvdl_hier_p2p_init: out of memory");
  if (res == hvdlSuccess) {
    const int err = MPI_Allgather(&h->ranks[0], 1, MPI_INT, first, 1, MPI_INT, comm->mpi);
    if (err != MPI_SUCCESS) res = hvdl_fail_mpi(comm, err, "MPI_Allgather in hvdl_hier_p2p_init");
  }
  if (res == hvdlSuccess) {
    for (int r = 0; r < n; r++) index[r] = -1;
    int hosts = 0;
    for (int r = 0; r < n; r++) /* first[r] <= r: a host's number is known at its lowest rank */
      if (index[first[r]] < 0) index[first[r]] = hosts++;
    for (int r = 0; r < n && res == hvdlSuccess; r++) {
      const int g = index[first[r]], i = seen[g]++;
      if (g >= H || i >= L)
        res = hvdl_fail(comm, hvdlInternalError, "hvdl_hier_p2p_init: hosts of different sizes");
      else
        h->grid_ranks[g * L + i] = r, h->grid_ranks[n + r] = g * L + i;
    }
    h->grid = (struct hvdl_host_grid){.hosts = H,
                                      .per_host = L,
                                      .host = index[first[comm->rank]],
                                      .local = h->local.rank,
                                      .ranks = h->grid_ranks,
                                      .slot = h->grid_ranks + n};
  }
  free(first);
  free(index);
  free(seen);
  return res;
}

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
  if (h) {
    h->msgs = calloc(2 * (size_t)ls, sizeof *h->msgs);
    h->reqs = calloc(2 * (size_t)ls, sizeof *h->reqs);
  }
  if (!h || !h->msgs || !h->reqs) {
    hvdl_hier_p2p_free(h);
    return hvdl_fail(comm, hvdlSystemError, "hvdl_hier_p2p_init: out of memory");
  }
  hvdlResult_t res = translate(comm, local, ls, h->ranks);
  if (res == hvdlSuccess) res = translate(comm, cross, cs, h->ranks + ls);
  if (res != hvdlSuccess) {
    hvdl_hier_p2p_free(h);
    return res;
  }
  h->local =
      (struct hvdl_group){.size = ls, .rank = lr, .ranks = h->ranks, .divisor = (uint64_t)ls};
  h->cross = (struct hvdl_group){
      .size = cs, .rank = cr, .ranks = h->ranks + ls, .divisor = (uint64_t)comm->size};
  res = build_grid(comm, h);
  if (res != hvdlSuccess) {
    hvdl_hier_p2p_free(h);
    return res;
  }
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

/* Phase 1: every lane but its own to its holder; a holder reduces its lane,
 * in local rank order, into recvbuff. */
static hvdlResult_t gather_lanes(hvdlComm_t comm, struct hvdl_hier_p2p *h, int lanes,
                                 const char *in, char *out, size_t count, hvdlDataType_t dt,
                                 hvdlRedOp_t op) {
  const struct hvdl_group *g = &h->local;
  const int L = g->size, j = g->rank, holds = j < lanes;
  const size_t esize = hvdl_type_size(dt);
  const size_t b0 = holds ? hvdl_block_start(count, lanes, j) : 0;
  const size_t n = holds ? hvdl_block_start(count, lanes, j + 1) - b0 : 0, mine = n * esize;
  char *work = NULL;
  if (holds) {
    HVDL_CHECK(
        hvdl_reserve(comm, &comm->scratch.work, &comm->scratch.work_bytes, (size_t)L * mine));
    work = comm->scratch.work;
  }
  int nm = 0;
  for (int i = 0; holds && i < L; i++)
    if (i != j)
      h->msgs[nm++] = (struct hvdl_msg){hvdl_group_peer(g, i), 1, work + (size_t)i * mine, mine};
  for (int k = 0; k < lanes; k++) {
    if (k == j) continue;
    const size_t k0 = hvdl_block_start(count, lanes, k), k1 = hvdl_block_start(count, lanes, k + 1);
    h->msgs[nm++] =
        (struct hvdl_msg){hvdl_group_peer(g, k), 0, (char *)in + k0 * esize, (k1 - k0) * esize};
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, GATHER_TAG, nm, h->msgs, h->reqs));
  if (!holds || n == 0) return hvdlSuccess;
  const char *own = in + b0 * esize;
  char *acc = out + b0 * esize;
  if (L == 1) {
    if (acc != own) hvdl_copy(acc, own, mine);
    return hvdlSuccess;
  }
  if (own == acc && j >= 2) { /* in place: the running result would overwrite it */
    hvdl_copy(work + (size_t)j * mine, own, mine);
    own = work + (size_t)j * mine;
  }
  /* x(i): local rank i's lane; acc may alias either operand (elementwise). */
#define X(i) ((i) == j ? own : work + (size_t)(i) * mine)
  hvdl_reduce(acc, X(0), X(1), n, dt, op);
  for (int i = 2; i < L; i++) hvdl_reduce(acc, acc, X(i), n, dt, op);
#undef X
  return hvdlSuccess;
}

/* Phase 3: each holder's finished lane to every other rank of its host. */
static hvdlResult_t spread_lanes(hvdlComm_t comm, struct hvdl_hier_p2p *h, int lanes, char *out,
                                 size_t count, hvdlDataType_t dt) {
  const struct hvdl_group *g = &h->local;
  const int L = g->size, j = g->rank;
  const size_t esize = hvdl_type_size(dt);
  int nm = 0;
  for (int k = 0; k < lanes; k++) {
    if (k == j) continue;
    const size_t k0 = hvdl_block_start(count, lanes, k), k1 = hvdl_block_start(count, lanes, k + 1);
    h->msgs[nm++] =
        (struct hvdl_msg){hvdl_group_peer(g, k), 1, out + k0 * esize, (k1 - k0) * esize};
  }
  if (j < lanes) {
    const size_t b0 = hvdl_block_start(count, lanes, j), b1 = hvdl_block_start(count, lanes, j + 1);
    for (int i = 0; i < L; i++)
      if (i != j)
        h->msgs[nm++] =
            (struct hvdl_msg){hvdl_group_peer(g, i), 0, out + b0 * esize, (b1 - b0) * esize};
  }
  return hvdl_pair_exchange_set(comm, SPREAD_TAG, nm, h->msgs, h->reqs);
}

static hvdlResult_t run(hvdlComm_t comm, int lanes, const void *sendbuff, void *recvbuff,
                        size_t count, hvdlDataType_t dt, hvdlRedOp_t op, hvdl_lane_fn lane_fn,
                        void *arg) {
  struct hvdl_hier_p2p *h = comm->hier_p2p;
  if (!h)
    return hvdl_fail(comm, hvdlInternalError,
                     "hier_p2p all-reduce without its groups (hosts of different sizes?)");
  const int L = h->local.size, j = h->local.rank;
  if (lanes < 1 || lanes > L) lanes = L;
  HVDL_CHECK(gather_lanes(comm, h, lanes, sendbuff, recvbuff, count, dt, op));
  if (j < lanes) {
    const size_t b0 = hvdl_block_start(count, lanes, j), b1 = hvdl_block_start(count, lanes, j + 1);
    char *lane = (char *)recvbuff + b0 * hvdl_type_size(dt);
    HVDL_CHECK(lane_fn(comm, &h->cross, lane, b0, b1 - b0, dt, op, arg));
  }
  return spread_lanes(comm, h, lanes, recvbuff, count, dt);
}

/* Phase 2 of hvdl_allreduce_hier_p2p: rd, rab or the direct exchange (hvdlAlgoLatency)
 * over the cross group, for lanes with elements. */
static hvdlResult_t across_hosts(hvdlComm_t comm, const struct hvdl_group *cross, void *lane,
                                 size_t lo, size_t n, hvdlDataType_t dt, hvdlRedOp_t op,
                                 void *arg) {
  (void)lo;
  const hvdlAlgorithm_t algo = *(const hvdlAlgorithm_t *)arg;
  if (n == 0) return hvdlSuccess;
  if (algo == hvdlAlgoRabenseifner)
    return hvdl_allreduce_rab_group(comm, cross, lane, lane, n, dt, op);
  if (algo == hvdlAlgoLatency)
    return hvdl_allreduce_direct_group(comm, cross, lane, lane, n, dt, op);
  return hvdl_allreduce_rd_group(comm, cross, lane, lane, n, dt, op);
}

hvdlResult_t hvdl_allreduce_hier_p2p(hvdlComm_t comm, int lanes, hvdlAlgorithm_t across,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op) {
  return run(comm, lanes, sendbuff, recvbuff, count, dt, op, across_hosts, &across);
}

hvdlResult_t hvdl_allreduce_hier_p2p_lanes(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                           size_t count, hvdlDataType_t dt, hvdlRedOp_t op,
                                           hvdl_lane_fn lane_fn, void *arg) {
  return run(comm, 0, sendbuff, recvbuff, count, dt, op, lane_fn, arg);
}
