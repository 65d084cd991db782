/*
 * allgather_rd.c -- the all-gather by recursive doubling (variable block
 * sizes): log2(p) exchanges that double the blocks each rank holds, for small
 * and mid sizes on many ranks. Two orders of the same steps: nearest partner
 * first (rd), or farthest first on bit-reversed positions (rd_far).
 *
 * The blocks are allgather_ring.c's: recvbuff holds n blocks in rank order, block k
 * of counts[k] elements, rank k contributes block k. The fold and virtual ranks
 * are transport.h's (p = largest power of two <= n, rem = n - p). Virtual rank v
 * stands for the real blocks of the ranks folded into it (2v and 2v+1 for
 * v < rem, v + rem above), a run of whole blocks; so any run of virtual blocks
 * [a, b) is one run of elements of recvbuff, in place.
 *
 * The schedule at rank r (v its virtual rank, bits = log2 p, rev(x) = x with
 * its bits low bits reversed; the position w a rank holds is v for rd, rev(v)
 * for rd_far):
 *
 *   own         recvbuff[r] = sendbuff unless in place
 *   fold in     r < 2rem, even: send block r to r+1, then wait for the whole
 *               r < 2rem, odd:  receive block r-1 into recvbuff[r-1]
 *   j = 0, 1, ..., bits-1: the run held is the aligned group of 2^j virtual
 *               blocks containing w, [lo, lo + 2^j); the partner holds the
 *               other half of the group of 2^(j+1): [lo ^ 2^j, ... + 2^j). It
 *               is virtual rank v ^ 2^j (rd) or v ^ (p >> (j+1)) (rd_far, whose
 *               positions are rev's: rev(w ^ 2^j) = v ^ rev(2^j)). Send the run
 *               held, receive the partner's into place
 *   rd_far's j = 0 (no rank holds position rev(v) yet): receive virtual
 *               blocks w and w ^ 1 from their owners, send virtual block v to
 *               the two ranks that hold it after this step, rev(v) = w and
 *               rev(v ^ 1) = w ^ p/2 (none to or from itself)
 *   fold out    r < 2rem, odd: send the whole of recvbuff to r-1
 *
 * rd pairs neighbours first (masks 1, 2, 4, ...: MPICH's recursive doubling),
 * so with ranks placed by host its steps across hosts come last and carry the
 * most: half of the result at the last one, from every rank of a host through
 * its one NIC. rd_far pairs the farthest first (masks p/2, p/4, ...), so the
 * steps across hosts come first and carry one, two, four blocks; holding
 * position rev(v) instead of v is what keeps its runs contiguous (the group a
 * rank holds is aligned in position space), and its first step, two messages
 * each way, is what puts the blocks there.
 *
 * Every block is its owner's bytes, copied verbatim, so every rank ends with
 * the same bytes whatever the order; each step writes only runs nobody has
 * sent from yet.
 *
 * Cost per rank (B bytes of result, equal blocks, rem = 0): log2(n) steps
 * (rd_far's first with two messages each way); (n-1)/n * B received and sent.
 * rem > 0 adds two steps for the paired ranks: one block, then B.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "transport/transport.h"

#define AG_RD_TAG 0x4841 /* "HA" */

hvdlResult_t hvdl_allgatherv_rd(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                const size_t *counts, hvdlDataType_t dt, int far_first) {
  const int n = comm->size, r = comm->rank;
  const size_t esize = hvdl_type_size(dt), total = hvdl_before(counts, n);
  char *recv = recvbuff;
  char *own = recv + hvdl_before(counts, r) * esize;
  if (total == 0) return hvdlSuccess;
  if (own != sendbuff && counts[r] > 0) hvdl_copy(own, sendbuff, counts[r] * esize);
  if (n == 1) return hvdlSuccess;

  struct hvdl_fold f;
  hvdl_fold_plan(n, r, &f);
  if (f.vrank < 0) { /* an even rank of a pair: hand over the block, take back the whole */
    HVDL_CHECK(hvdl_pair_exchange(comm, r + 1, AG_RD_TAG, own, counts[r] * esize, NULL, 0));
    return hvdl_pair_exchange(comm, r + 1, AG_RD_TAG, NULL, 0, recv, total * esize);
  }
  if (r < 2 * f.rem)
    HVDL_CHECK(hvdl_pair_exchange(comm, r - 1, AG_RD_TAG, NULL, 0,
                                  recv + hvdl_before(counts, r - 1) * esize,
                                  counts[r - 1] * esize));
  const int v = f.vrank, w = far_first ? hvdl_bit_reverse(v, f.p) : v; /* the position held */
  int bit = 1, j = 0;
  if (far_first) { /* the first step straight from the owners: blocks w, w ^ 1 in, v out */
    struct hvdl_msg msg[4];
    MPI_Request reqs[4];
    int nm = 0;
    for (int k = 0; k < 2; k++) {
      const int block = w ^ k, holder = w ^ (k ? f.p / 2 : 0); /* rev(v ^ k) */
      if (block != v) {
        const size_t b0 = hvdl_vbefore(&f, counts, block), b1 = hvdl_vbefore(&f, counts, block + 1);
        msg[nm++] =
            (struct hvdl_msg){hvdl_fold_rank(&f, block), 1, recv + b0 * esize, (b1 - b0) * esize};
      }
      if (holder != v) {
        const size_t m0 = hvdl_vbefore(&f, counts, v), m1 = hvdl_vbefore(&f, counts, v + 1);
        msg[nm++] =
            (struct hvdl_msg){hvdl_fold_rank(&f, holder), 0, recv + m0 * esize, (m1 - m0) * esize};
      }
    }
    HVDL_CHECK(hvdl_pair_exchange_set(comm, AG_RD_TAG, nm, msg, reqs));
    bit = 2;
    j = 1;
  }
  for (; bit < f.p; bit *= 2, j++) {
    const int lo = w & ~(bit - 1), other = lo ^ bit;
    const int partner = far_first ? v ^ (f.p >> (j + 1)) : v ^ bit;
    const size_t m0 = hvdl_vbefore(&f, counts, lo), m1 = hvdl_vbefore(&f, counts, lo + bit);
    const size_t o0 = hvdl_vbefore(&f, counts, other), o1 = hvdl_vbefore(&f, counts, other + bit);
    HVDL_CHECK(hvdl_pair_exchange(comm, hvdl_fold_rank(&f, partner), AG_RD_TAG, recv + m0 * esize,
                                  (m1 - m0) * esize, recv + o0 * esize, (o1 - o0) * esize));
  }
  if (r < 2 * f.rem)
    HVDL_CHECK(hvdl_pair_exchange(comm, r - 1, AG_RD_TAG, recv, total * esize, NULL, 0));
  return hvdlSuccess;
}
