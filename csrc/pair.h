/*
 * pair.h -- what the pairwise all-reduces share (allreduce_rd.c,
 * allreduce_rab.c): the fold of n ranks onto a power of two, the order in
 * which two partial results are combined, and one exchange with a partner
 * (the tree broadcasts of broadcast_tree.c use that too), or with several
 * peers at once (allreduce_hier_p2p.c, the all-gather of allgather_rd.c and the
 * reduce-scatter of reducescatter_halving.c).
 *
 * The fold (MPICH's). p is the largest power of two <= n and rem = n - p.
 * Ranks 0 .. 2rem-1 are paired, (0,1), (2,3), ...: the even rank of a pair
 * sends its input to the odd one, which combines the two (even on the left),
 * and sits out until the odd rank sends it the final result. The p ranks left
 * are numbered 0 .. p-1 in rank order ("virtual ranks"): v = r/2 for an odd
 * r < 2rem, v = r - rem above. Virtual order is rank order, so a lower virtual
 * rank always holds lower ranks' contributions.
 *
 * The combining rule. At the step with mask m (a power of two) virtual rank v
 * works with v ^ m; the partner with bit m clear holds the contributions of the
 * lower ranks, and every combination is lower op higher:
 *
 *   (v & m) == 0:  mine op theirs        otherwise:  theirs op mine
 *
 * So both partners of a step compute the same operation on the same bytes in
 * the same order, whichever of them does it.
 *
 * Groups. The schedules run over a group of the communicator's ranks (all of
 * them for rd and rab; a host's ranks, or one rank per host, for the
 * hierarchical all-reduce, allreduce_hier_p2p.c): n, r, v above are numbers
 * within the group, and member i is rank ranks[i] of comm->mpi.
 */
#ifndef HVDL_PAIR_H_
#define HVDL_PAIR_H_

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* The most steps a power-of-two schedule can take (masks 1 .. 2^62). */
#define PAIR_MAX_STEPS 63

struct hvdl_fold {
  int p, rem;  /* the power of two, and n - p */
  int vrank;   /* this rank's virtual rank, or -1 for an even rank < 2rem (it sits out) */
};

/* The fold of n >= 2 ranks, seen from rank r. */
void hvdl_fold_plan(int n, int r, struct hvdl_fold *f);

/* The group member of virtual rank v. */
int hvdl_fold_rank(const struct hvdl_fold *f, int v);

/* Elements before block k of per-rank counts, and before virtual block v of the
 * fold (v = p: all of them): the v-form all-gather's and reduce-scatter's offsets. */
static inline size_t hvdl_before(const size_t *counts, int k) {
  size_t off = 0;
  for (int i = 0; i < k; i++) off += counts[i];
  return off;
}
static inline size_t hvdl_vbefore(const struct hvdl_fold *f, const size_t *counts, int v) {
  return hvdl_before(counts, v < f->rem ? 2 * v : v + f->rem);
}

/* x with its log2(p) low bits reversed (p a power of two): the position rank x
 * holds in allgather_rd.c's rd_far and ends with in reducescatter_halving.c. */
static inline int hvdl_bit_reverse(int x, int p) {
  int y = 0;
  for (int m = 1; m < p; m *= 2) y = (y << 1) | ((x & m) != 0);
  return y;
}

/* A group of the communicator's ranks: `size` members, this rank is member
 * `rank`, member i is rank ranks[i] of comm->mpi (ranks NULL: rank i). Avg
 * divides by `divisor`. */
struct hvdl_group {
  int size, rank;
  const int *ranks;
  uint64_t divisor;
};

/* The whole communicator as a group. */
struct hvdl_group hvdl_group_all(hvdlComm_t comm);

/* The communicator rank of member i. */
static inline int hvdl_group_peer(const struct hvdl_group *g, int i) {
  return g->ranks ? g->ranks[i] : i;
}

/* Recursive halving and doubling (allreduce_rab.c) in two halves, for the
 * hierarchical all-reduce. count is cut into `blocks` blocks (ring.c's cut; a
 * power of two <= f.p, set by the caller; 0 or more than f.p: f.p). The steps
 * with mask m < f.p / blocks move whole buffers, a binomial reduce: the rank
 * with bit m set hands its partial to its partner and stops (holds = 0); the
 * others halve as rab does. hvdl_rab_reduce_scatter leaves a holding rank's
 * range of blocks, [lo[steps], hi[steps]), reduced over the group (Avg not
 * divided) in recvbuff; a rank folded out (f.vrank < 0) only hands its input
 * over. hvdl_rab_all_gather (the same plan) undoes every step, bringing every
 * block to every member. Between the two a caller may change the held range's
 * bytes (all holders of it alike). Every block's reduction is the same
 * balanced tree whatever `blocks` is. */
struct hvdl_halving {
  int blocks;  /* in: how many blocks, out: as used */
  struct hvdl_fold f;
  int steps, holds;
  int lo[PAIR_MAX_STEPS + 1], hi[PAIR_MAX_STEPS + 1];
};
hvdlResult_t hvdl_rab_reduce_scatter(hvdlComm_t comm, const struct hvdl_group *g,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op, struct hvdl_halving *h);
hvdlResult_t hvdl_rab_all_gather(hvdlComm_t comm, const struct hvdl_group *g, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, const struct hvdl_halving *h);
/* Element offset of block k of p blocks of count. */
size_t hvdl_rab_block(size_t count, int p, int k);

/* rd and rab over a group (Avg divides by g->divisor). */
hvdlResult_t hvdl_allreduce_rd_group(hvdlComm_t comm, const struct hvdl_group *g,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_rab_group(hvdlComm_t comm, const struct hvdl_group *g,
                                      const void *sendbuff, void *recvbuff, size_t count,
                                      hvdlDataType_t dt, hvdlRedOp_t op);

/* out = a op b with a the lower ranks' partial when `mine_is_lower`, else
 * out = b op a (mine = a); out may alias either operand. */
void hvdl_pair_combine(void *out, const void *mine, const void *theirs, int mine_is_lower,
                       size_t count, hvdlDataType_t dt, hvdlRedOp_t op);

/* Sends sendbytes from send to peer and receives recvbytes from peer into recv
 * (either may be 0: nothing is posted for it), on comm's communicator with tag,
 * in messages of at most 1 GiB, and waits for both (wait.c, with the data phases'
 * limits but shorter sleeps; the watch hook and the data timeout apply). On failure everything posted is
 * abandoned (hvdl_abandon) before the result is returned. Fault injection
 * points: send, recv, stall (HVD_LITE_FAULT). */
hvdlResult_t hvdl_pair_exchange(hvdlComm_t comm, int peer, int tag, const void *send,
                                size_t sendbytes, void *recv, size_t recvbytes);

/* One message of a set (hvdl_pair_exchange_set): `bytes` from buf sent to
 * rank `peer` of comm->mpi, or (recv) received from it into buf. */
struct hvdl_msg {
  int peer, recv;
  char *buf;
  size_t bytes;
};

/* Posts every message of m (n of them; the receives first, in order, then the
 * sends; an empty one posts nothing) on comm's communicator with tag, in
 * messages of at most 1 GiB, and waits for all of them as hvdl_pair_exchange
 * does, with the same fault injection points and the same abandoning on
 * failure. reqs has room for n requests. */
hvdlResult_t hvdl_pair_exchange_set(hvdlComm_t comm, int tag, int n, const struct hvdl_msg *m,
                                    MPI_Request *reqs);

#endif /* HVDL_PAIR_H_ */
