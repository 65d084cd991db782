/*
 * transport.h -- the message-passing transport's contract: the segment pipeline
 * and its verbs (pipeline.c), and the exchanges with partners (pair_exchange.c).
 * Each file's part follows.
 */
#ifndef HVDL_TRANSPORT_TRANSPORT_H_
#define HVDL_TRANSPORT_TRANSPORT_H_

#include "base/base.h"
#include "kernels/kernels.h"

/* ---- pipeline.c ---------------------------------------------------------------------------- */

/*
 * The segment pipeline that every ring and chain collective shares
 * (allreduce_ring.c, allgather_ring.c, reducescatter_ring.c, broadcast_chain.c, and through
 * reduce-scatter reduce_ring.c).
 *
 * A pipe is this rank's place in a ring: it receives only from `left` and
 * sends only to `right`. An algorithm is a sequence of steps; each step moves
 * one piece (a contiguous run of elements, possibly empty) with one verb:
 *
 *   send               post the piece to the right
 *   recv               receive the piece from the left into dst
 *   recvCopySend       receive into dst, forwarding each segment as it lands
 *   recvReduce         dst = received op src            (the last reduction:
 *                      Avg divides by the number of ranks here)
 *   recvReduceSend     dst = received op src, forwarding each segment
 *   recvReduceCopySend dst = received op src, the last reduction (Avg divides
 *                      here), forwarding each segment (the ring all-reduce)
 *
 * Both neighbours must call matching verbs on pieces of the same length: what
 * one rank's step sends is what its right neighbour's next receiving step
 * receives. A piece travels as segments of `seg` elements; a receiving step
 * keeps PIPE_WINDOW receives posted (into scratch segments when it reduces,
 * straight into dst otherwise) and forwards each segment the moment it is
 * processed, so receiving, reducing and sending overlap and the pipeline runs
 * on from one step into the next without draining.
 *
 * Buffer safety, the caller's side: a step's sends read their memory (src for
 * send, dst for the forwarding verbs) until the sends of the step after next
 * are posted, because a step first waits for the sends of the step two before
 * it (two generations, as in allreduce_ring.c). So a step must not write memory that
 * the previous step is still sending from; hvdl_pipe_finish waits for all.
 */

#include <stddef.h>

#define PIPE_WINDOW 4
/* Sends in flight: a send step (which has a whole piece to post) posts at most
 * PIPE_SEND_WINDOW of its segments at once and each further one when an earlier
 * one has completed, while the steps after it receive. The cause, measured
 * (docs/benchmarks-history.md, "The ring's 128-segment cliff"): every posted send puts a
 * small header into Open MPI's shared-memory mailbox for its peer (the sm BTL's
 * "fast box", 4 KiB per peer); posted all at once, 128 of them overflowed it and
 * the step ran at half speed (64 MiB at 2 ranks in 256 KiB segments with the cap
 * at 1024: 20-23 ms against 12-14 ms with this window, with a 64 KiB box, or with
 * no box, `--mca btl_sm_fbox_max 0`). A window of 64 was not enough (the next
 * step's forwarded segments share the box); 32 and 16 were. Forwarded segments
 * need no window of their own: a receiving step posts one per segment received.
 * A build may set it (-DPIPE_SEND_WINDOW=...) to measure. */
#ifndef PIPE_SEND_WINDOW
#define PIPE_SEND_WINDOW 32
#endif
/* Pieces alternate between two tags, tag and tag + PIPE_TAG_ODD, so that a send
 * step's pending segments and the next piece's forwarded ones, in flight together,
 * each match their own piece's receives (MPI keeps order only within a tag). The
 * collectives' tags are below 0x4900, so the odd ones stay below MPI's guaranteed
 * upper bound (32767) and apart from every even one. */
#define PIPE_TAG_ODD 0x2000
/* The segment policy, one for every collective: segments of config.segmentBytes
 * (HVD_LITE_SEGMENT_BYTES), and larger ones for a piece that would need more than
 * PIPE_MAX_SEGMENTS of them. With the send window nothing breaks past the cap; it
 * stays because each message has a fixed cost: at 2 ranks, 256 MiB in 256 KiB
 * segments (512 a step) took 1.2x the time of 4 MiB ones (32 a step)
 * (docs/benchmarks.md). It also keeps unmatched messages between two ranks far
 * below what Open MPI's ob1 can order (a 16-bit sequence number: ~65,536 of them
 * scrambled, seen with 64-byte segments of a 4 MiB buffer). A build may set it
 * (-DPIPE_MAX_SEGMENTS=1024) to measure. */
#ifndef PIPE_MAX_SEGMENTS
#define PIPE_MAX_SEGMENTS 64
#endif
/* The largest message a pipe sends (its byte count must fit an int). */
#define PIPE_MAX_MESSAGE_BYTES ((size_t)1 << 30)

struct hvdl_pipe {
  hvdlComm_t comm;
  int left, right, tag;
  size_t esize, seg; /* bytes per element, elements per segment */
  hvdlDataType_t dt;
  hvdlRedOp_t op;
  unsigned step;           /* steps taken; the generation is step & 1 */
  unsigned sent, received; /* pieces sent and received: their parity picks the tag */
  char *tmp;               /* PIPE_WINDOW receive segments for the reducing verbs */
  MPI_Request *sreq[2];    /* sends of the two most recent steps */
  int nsreq[2];
  int sdone[2]; /* of those, the first sdone are known to have completed */
  struct {      /* a send step's segments not yet posted (the window) */
    const char *src;
    size_t count, next, nseg;
    int gen, tag;
  } pend;
};

/* Sets up a pipe on comm's ring for pieces of at most max_piece elements,
 * using comm's scratch (segments and request arrays; no other collective may
 * run on comm until hvdl_pipe_finish). op is only used by the reducing verbs. */
hvdlResult_t hvdl_pipe_init(struct hvdl_pipe *p, hvdlComm_t comm, int tag, size_t max_piece,
                            hvdlDataType_t dt, hvdlRedOp_t op);

/* The same for a pipe that only copies (send, recv, recvCopySend; the reducing
 * verbs fail on it). On 2 ranks nothing is forwarded, so nothing would overlap
 * with a segment's transfer: each piece goes as one message (up to
 * PIPE_MAX_MESSAGE_BYTES), which saves a rendezvous per segment. */
hvdlResult_t hvdl_pipe_init_copy(struct hvdl_pipe *p, hvdlComm_t comm, int tag, size_t max_piece,
                                 hvdlDataType_t dt);

hvdlResult_t hvdl_pipe_send(struct hvdl_pipe *p, const void *src, size_t count);
hvdlResult_t hvdl_pipe_recv(struct hvdl_pipe *p, void *dst, size_t count);
hvdlResult_t hvdl_pipe_recv_copy_send(struct hvdl_pipe *p, void *dst, size_t count);
hvdlResult_t hvdl_pipe_recv_reduce(struct hvdl_pipe *p, const void *src, void *dst, size_t count);
hvdlResult_t hvdl_pipe_recv_reduce_send(struct hvdl_pipe *p, const void *src, void *dst,
                                        size_t count);
hvdlResult_t hvdl_pipe_recv_reduce_copy_send(struct hvdl_pipe *p, const void *src, void *dst,
                                             size_t count);

/* Waits for every send still in flight. */
hvdlResult_t hvdl_pipe_finish(struct hvdl_pipe *p);

/* ---- pair_exchange.c ----------------------------------------------------------------------- */

/*
 * What the pairwise all-reduces share (allreduce_rd.c,
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

#include <stddef.h>
#include <stdint.h>

/* The most steps a power-of-two schedule can take (masks 1 .. 2^62). */
#define PAIR_MAX_STEPS 63

struct hvdl_fold {
  int p, rem; /* the power of two, and n - p */
  int vrank;  /* this rank's virtual rank, or -1 for an even rank < 2rem (it sits out) */
};

/* The fold of n >= 2 ranks, seen from rank r. */
void hvdl_fold_plan(int n, int r, struct hvdl_fold *f);

/* The group member of virtual rank v. */
int hvdl_fold_rank(const struct hvdl_fold *f, int v);

/* Elements before virtual block v of the fold (v = p: all of them; base.h's
 * hvdl_before of the per-rank counts): the v-form all-gather's and reduce-scatter's offsets. */
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

/* out = a op b with a the lower ranks' partial when `mine_is_lower`, else
 * out = b op a (mine = a); out may alias either operand. */
void hvdl_pair_combine(void *out, const void *mine, const void *theirs, int mine_is_lower,
                       size_t count, hvdlDataType_t dt, hvdlRedOp_t op);

/* out = the tree over x[0 .. n-1], in order: the fold's pairs (x[2v] op x[2v+1] for
 * v < n - p), then aligned groups, lower op higher -- the expression recursive doubling
 * builds over n ranks' inputs, for a rank that holds all n (reducescatter_hier_p2p.c's
 * hosts' partials, allreduce_direct.c's). The x[] buffers are scratch, overwritten, and
 * x[] itself is reordered. n >= 1. */
void hvdl_tree_combine(char *out, char **x, int n, size_t count, hvdlDataType_t dt, hvdlRedOp_t op);

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

#endif /* HVDL_TRANSPORT_TRANSPORT_H_ */
