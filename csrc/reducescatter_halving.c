/*
 * reducescatter_halving.c -- the reduce-scatter by recursive halving (variable
 * block sizes): log2(p) exchanges that halve the run of blocks each rank
 * reduces, neighbours first, then one swap that hands every rank its own block.
 *
 * The blocks are reducescatter.c's: sendbuff holds n blocks on every rank,
 * block k of counts[k] elements; rank k ends with block k reduced over every
 * rank in recvbuff. The fold, virtual ranks and the combining rule are pair.h's
 * (p = largest power of two <= n, rem = n - p). Virtual block v is the run of
 * the real blocks of the ranks folded into virtual rank v (2v and 2v+1 for
 * v < rem, v + rem above), so any run of virtual blocks is one run of elements.
 *
 * The schedule at rank r (v its virtual rank, rev(x) = x with its log2(p) low
 * bits reversed, w = rev(v): the virtual block rank r will have reduced):
 *
 *   fold in     r < 2rem, even: send all of sendbuff to r+1, then wait for
 *               block r
 *               r < 2rem, odd:  partial = x(r-1) op x(r), the whole buffer
 *   halving, m = 1, 2, ..., p/2 (a partner at distance m, neighbours first):
 *               the run of virtual blocks still held (all p at first) is
 *               split in two halves; keep the half that contains w (the one
 *               whose bit log2(p/2m) of the position is w's), send the other
 *               half to virtual rank v ^ m, receive its partial of the kept
 *               half into scratch; partial[kept] = lower op higher (pair.h)
 *   Avg         virtual block w is final: divide it by n
 *   swap        with virtual rank w (rev is its own inverse, so w holds block v):
 *               send it virtual block w's part for rank fold(w) (its odd or only
 *               real block), receive block r into recvbuff; w = v: a copy
 *   fold out    w < rem: send real block 2w (the even rank's) to rank 2w
 *
 * Why the halves contain w. The split at distance m decides bit log2(p/2m) of
 * the kept position from bit log2(m) of v, so after the last step the position
 * is v's bits reversed; it is rab's (allreduce_rab.c) halving, with the runs
 * measured in virtual blocks instead of equal cuts.
 *
 * The order of the reduction, and why it is bitwise reproducible. Every element
 * is combined exactly as allreduce_rab.c combines it: the fold's pairs as
 * x(2i) op x(2i+1), then at the step with mask m the partials of the aligned
 * groups of m virtual ranks, lower op higher: the balanced binary tree over the
 * ranks in rank order that allreduce_rd.c and allreduce_rab.c build. The tree
 * depends only on n, never on timing or on which rank computes a combination
 * (both operands of a combination are the same bytes wherever it is computed),
 * so reruns, in-place and out-of-place calls give the same bits, and Avg
 * divides those bytes by n as rab does. Hence this reduce-scatter followed by
 * any all-gather gives, element by element, the bytes of hvdlAllReduce's rd
 * and rab for the same inputs, whatever the block counts (the ring
 * reduce-scatter, reducescatter.c, reduces in ring order: the ring all-reduce's
 * bytes instead).
 *
 * Scratch: the partial and the partner's data, the whole buffer each (the
 * fold receives all of it, and with uneven counts a half of the blocks may
 * hold most of the elements); sendbuff is never written.
 *
 * Cost per rank (B bytes of input, equal blocks, rem = 0): log2(n) steps plus
 * the swap (one block; none for ranks with v = rev(v)); (n-1)/n * B sent and
 * received, as much reduced, the steps with small m carrying the most and
 * pairing neighbours, which share a host when ranks are placed by host. rem > 0
 * adds a step of B (reduced) and one of a block for the paired ranks.
 */
#include <string.h>

#include "pair.h"
#include "reduce.h"

#define RS_HALVING_TAG 0x4849 /* "HI" */

/* Elements before real block k. */
static size_t before(const size_t *counts, int k) {
  size_t off = 0;
  for (int i = 0; i < k; i++) off += counts[i];
  return off;
}

/* Elements before virtual block v (v = p: all of them). */
static size_t vbefore(const struct hvdl_fold *f, const size_t *counts, int v) {
  return before(counts, v < f->rem ? 2 * v : v + f->rem);
}

hvdlResult_t hvdl_reducescatterv_halving(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                         const size_t *counts, hvdlDataType_t dt,
                                         hvdlRedOp_t op) {
  const int n = comm->size, r = comm->rank;
  const size_t esize = hvdl_type_size(dt), total = before(counts, n), bytes = total * esize;
  char *out = recvbuff;
  if (total == 0) return hvdlSuccess;
  if (n == 1) {
    if (recvbuff != sendbuff) memcpy(recvbuff, sendbuff, bytes);
    return hvdlSuccess; /* Avg: a division by 1 */
  }
  struct hvdl_fold f;
  hvdl_fold_plan(n, r, &f);
  if (f.vrank < 0) { /* an even rank of a pair: hand over the input, take back block r */
    const int holder = hvdl_fold_rank(&f, hvdl_bit_reverse(r / 2, f.p));
    HVDL_CHECK(hvdl_pair_exchange(comm, r + 1, RS_HALVING_TAG, sendbuff, bytes, NULL, 0));
    return hvdl_pair_exchange(comm, holder, RS_HALVING_TAG, NULL, 0, recvbuff, counts[r] * esize);
  }
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->stage, &s->stage_bytes, bytes));
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes, bytes));
  char *partial = s->stage;
  const char *cur = sendbuff; /* what this rank holds: its input until the first combine */
  if (r < 2 * f.rem) {
    HVDL_CHECK(hvdl_pair_exchange(comm, r - 1, RS_HALVING_TAG, NULL, 0, s->work, bytes));
    hvdl_pair_combine(partial, cur, s->work, 0, total, dt, op);
    cur = partial;
  }
  const int v = f.vrank, w = hvdl_bit_reverse(v, f.p);
  int lo = 0, hi = f.p; /* the run of virtual blocks held */
  for (int m = 1; m < f.p; m *= 2) {
    const int mid = (lo + hi) / 2, lower = (v & m) == 0;
    const int keep_lo = w < mid ? lo : mid, keep_hi = w < mid ? mid : hi;
    const int give_lo = w < mid ? mid : lo, give_hi = w < mid ? hi : mid;
    const size_t k0 = vbefore(&f, counts, keep_lo), k1 = vbefore(&f, counts, keep_hi);
    const size_t g0 = vbefore(&f, counts, give_lo), g1 = vbefore(&f, counts, give_hi);
    HVDL_CHECK(hvdl_pair_exchange(comm, hvdl_fold_rank(&f, v ^ m), RS_HALVING_TAG,
                                  cur + g0 * esize, (g1 - g0) * esize, s->work, (k1 - k0) * esize));
    hvdl_pair_combine(partial + k0 * esize, cur + k0 * esize, s->work, lower, k1 - k0, dt, op);
    cur = partial;
    lo = keep_lo;
    hi = keep_hi;
  }
  /* Virtual block w is reduced in partial: its real blocks are w's owners'. */
  const size_t w0 = vbefore(&f, counts, w), w1 = vbefore(&f, counts, w + 1);
  if (op == hvdlAvg) hvdl_divide(partial + w0 * esize, w1 - w0, dt, (uint64_t)n);
  const int owner = hvdl_fold_rank(&f, w); /* the odd or only rank of virtual block w */
  const size_t o0 = before(counts, owner);
  if (w == v) {
    memcpy(out, partial + o0 * esize, counts[r] * esize);
  } else {
    HVDL_CHECK(hvdl_pair_exchange(comm, owner, RS_HALVING_TAG, partial + o0 * esize,
                                  counts[owner] * esize, out, counts[r] * esize));
  }
  if (w < f.rem) /* the even rank of virtual block w's pair: its block is the run's first */
    HVDL_CHECK(hvdl_pair_exchange(comm, 2 * w, RS_HALVING_TAG, partial + w0 * esize,
                                  counts[2 * w] * esize, NULL, 0));
  return hvdlSuccess;
}
