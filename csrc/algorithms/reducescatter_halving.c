/*
 * reducescatter_halving.c -- the reduce-scatter by recursive halving (variable
 * block sizes): log2(p) exchanges that halve the run of blocks each rank
 * reduces, neighbours first, the last one handing each block straight to its
 * owner.
 *
 * The blocks are reducescatter_ring.c's: sendbuff holds n blocks on every rank,
 * block k of counts[k] elements; rank k ends with block k reduced over every
 * rank in recvbuff. The fold, virtual ranks and the combining rule are transport.h's
 * (p = largest power of two <= n, rem = n - p). Virtual block v is the run of
 * the real blocks of the ranks folded into virtual rank v (2v and 2v+1 for
 * v < rem, v + rem above), so any run of virtual blocks is one run of elements.
 *
 * The schedule at rank r (v its virtual rank, rev(x) = x with its log2(p) low
 * bits reversed, w = rev(v): the position whose run rank r keeps):
 *
 *   fold in     r < 2rem, even: send all of sendbuff to r+1, then wait for
 *               block r
 *               r < 2rem, odd:  partial = x(r-1) op x(r), the whole buffer
 *   halving, m = 1, 2, ..., p/4 (a partner at distance m, neighbours first):
 *               the run of virtual blocks still held (all p at first) is
 *               split in two halves; keep the half that contains w, send the
 *               other half to virtual rank v ^ m, receive its partial of the
 *               kept half into scratch; partial[kept] = lower op higher
 *   last step, m = p/2: the run held is the pair w, w ^ 1. Send each to its
 *               owner (virtual rank w, w ^ 1; none to itself); receive the two
 *               partials of block v from its holders, virtual ranks w and
 *               w ^ p/2 (rev(v) = w, rev(v ^ 1) = w ^ p/2; this rank's own
 *               where it is one), and combine them lower op higher (the holder
 *               with bit p/2 clear holds the lower ranks' partial)
 *   Avg         divide block v by n
 *   fold out    r < 2rem, odd: send block r-1 (the run's first) to r-1
 *
 * Why the halves contain w. The split at distance m decides bit log2(p/2m) of
 * the kept position from bit log2(m) of v, so the position is v's bits
 * reversed; it is rab's (allreduce_rab.c) halving, with the runs measured in
 * virtual blocks instead of equal cuts. Rab's all-gather brings the blocks
 * back from there; here the last step sends them to their owners, which costs
 * a message more per rank (two out, two in) but no extra step.
 *
 * The order of the reduction, and why it is bitwise reproducible. Every element
 * is combined exactly as allreduce_rab.c combines it: the fold's pairs as
 * x(2i) op x(2i+1), then at the step with mask m the partials of the aligned
 * groups of m virtual ranks, lower op higher: the balanced binary tree over the
 * ranks in rank order that allreduce_rd.c and allreduce_rab.c build (the last
 * combination, of the two halves of p/2, is the owner's instead of a holder's:
 * the same operands in the same order). The tree depends only on n, never on
 * timing or on which rank computes a combination, so reruns, in-place and
 * out-of-place calls give the same bits, and Avg divides those bytes by n as
 * rab does. Hence this reduce-scatter followed by any all-gather gives, element
 * by element, the bytes of hvdlAllReduce's rd and rab for the same inputs,
 * whatever the block counts (the ring reduce-scatter, reducescatter_ring.c, reduces
 * in ring order: the ring all-reduce's bytes instead).
 *
 * Scratch: the partial (the whole buffer) and the partner's data (the whole
 * buffer for the fold; with uneven counts a half of the blocks may hold most of
 * the elements), at least two virtual blocks v for the last step; sendbuff is
 * never written.
 *
 * Cost per rank (B bytes of input, equal blocks, rem = 0): log2(n) steps;
 * (n-1)/n * B sent and received, as much reduced; the steps with small m carry
 * the most and pair neighbours, which share a host when ranks are placed by
 * host; the last step sends and receives two blocks, to and from two ranks.
 * rem > 0 adds a step of B (reduced) and one of a block for the paired ranks.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/transport.h"

#define RS_HALVING_TAG 0x4849 /* "HI" */

hvdlResult_t hvdl_reducescatterv_halving(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                         const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op) {
  const int n = comm->size, r = comm->rank;
  const size_t esize = hvdl_type_size(dt), total = hvdl_before(counts, n), bytes = total * esize;
  char *out = recvbuff;
  if (total == 0) return hvdlSuccess;
  if (n == 1) {
    if (recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, bytes);
    return hvdlSuccess; /* Avg: a division by 1 */
  }
  struct hvdl_fold f;
  hvdl_fold_plan(n, r, &f);
  if (f.vrank < 0) { /* an even rank of a pair: hand over the input, take back block r */
    HVDL_CHECK(hvdl_pair_exchange(comm, r + 1, RS_HALVING_TAG, sendbuff, bytes, NULL, 0));
    return hvdl_pair_exchange(comm, r + 1, RS_HALVING_TAG, NULL, 0, recvbuff, counts[r] * esize);
  }
  const int v = f.vrank, w = hvdl_bit_reverse(v, f.p), half = f.p / 2;
  const size_t v0 = hvdl_vbefore(&f, counts, v), vn = hvdl_vbefore(&f, counts, v + 1) - v0;
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->stage, &s->stage_bytes, bytes));
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes,
                          (bytes > 2 * vn * esize ? bytes : 2 * vn * esize)));
  char *partial = s->stage;
  const char *cur = sendbuff; /* what this rank holds: its input until the first combine */
  if (r < 2 * f.rem) {
    HVDL_CHECK(hvdl_pair_exchange(comm, r - 1, RS_HALVING_TAG, NULL, 0, s->work, bytes));
    hvdl_pair_combine(partial, cur, s->work, 0, total, dt, op);
    cur = partial;
  }
  int lo = 0, hi = f.p; /* the run of virtual blocks held */
  for (int m = 1; m < half; m *= 2) {
    const int mid = (lo + hi) / 2, lower = (v & m) == 0;
    const int keep_lo = w < mid ? lo : mid, keep_hi = w < mid ? mid : hi;
    const int give_lo = w < mid ? mid : lo, give_hi = w < mid ? hi : mid;
    const size_t k0 = hvdl_vbefore(&f, counts, keep_lo), k1 = hvdl_vbefore(&f, counts, keep_hi);
    const size_t g0 = hvdl_vbefore(&f, counts, give_lo), g1 = hvdl_vbefore(&f, counts, give_hi);
    HVDL_CHECK(hvdl_pair_exchange(comm, hvdl_fold_rank(&f, v ^ m), RS_HALVING_TAG, cur + g0 * esize,
                                  (g1 - g0) * esize, s->work, (k1 - k0) * esize));
    hvdl_pair_combine(partial + k0 * esize, cur + k0 * esize, s->work, lower, k1 - k0, dt, op);
    cur = partial;
    lo = keep_lo;
    hi = keep_hi;
  }
  /* The last step: the run held is the pair of virtual blocks w, w ^ 1; each goes
   * straight to its owner, and block v comes from its two holders, w and w ^ half
   * (partners in this step: the one with bit `half` clear holds the lower ranks'). */
  struct hvdl_msg msg[4];
  MPI_Request reqs[4];
  int nm = 0;
  const char *from_holder[2];
  char *got = s->work;
  for (int k = 0; k < 2; k++) {
    const int block = w ^ k, holder = w ^ (k ? half : 0);
    const size_t b0 = hvdl_vbefore(&f, counts, block), b1 = hvdl_vbefore(&f, counts, block + 1);
    if (block != v)
      msg[nm++] = (struct hvdl_msg){hvdl_fold_rank(&f, block), 0, (char *)cur + b0 * esize,
                                    (b1 - b0) * esize};
    if (holder == v) {
      from_holder[k] = cur + v0 * esize;
    } else {
      from_holder[k] = got + k * vn * esize;
      msg[nm++] =
          (struct hvdl_msg){hvdl_fold_rank(&f, holder), 1, got + k * vn * esize, vn * esize};
    }
  }
  HVDL_CHECK(hvdl_pair_exchange_set(comm, RS_HALVING_TAG, nm, msg, reqs));
  /* Virtual block v: lower op higher, then Avg's division; the even rank of a
   * pair gets its part (the run's first block). */
  const int w_is_lower = (w & half) == 0;
  char *result = r < 2 * f.rem ? got : out; /* got: both received partials are read first */
  hvdl_pair_combine(result, from_holder[0], from_holder[1], w_is_lower, vn, dt, op);
  if (op == hvdlAvg) hvdl_divide(result, vn, dt, (uint64_t)n);
  if (r < 2 * f.rem) {
    hvdl_copy(out, result + counts[r - 1] * esize, counts[r] * esize);
    HVDL_CHECK(
        hvdl_pair_exchange(comm, r - 1, RS_HALVING_TAG, result, counts[r - 1] * esize, NULL, 0));
  }
  return hvdlSuccess;
}
