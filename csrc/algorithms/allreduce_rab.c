/*
 * allreduce_rab.c -- Rabenseifner's all-reduce: a reduce-scatter by recursive
 * halving, then an all-gather by recursive doubling, for mid sizes on many
 * ranks.
 *
 * The buffer is cut into p blocks as allreduce_ring.c cuts its chunks (base.h's
 * hvdl_block_start: count/p elements, one more for the first count%p); every range below is a run of
 * whole blocks. The fold, virtual ranks v and the combining rule are transport.h's
 * (p = largest power of two <= n, rem = n - p). At rank r:
 *
 *   fold in     r < 2rem, even: send the input to r+1, then wait for the result
 *               r < 2rem, odd:  recvbuff = x(r-1) op x(r)
 *   reduce-scatter, m = 1, 2, ..., p/2, on the range [lo, hi) still held
 *               (all p blocks at first): split it in two halves of equal block
 *               counts; the rank with bit m clear keeps the lower half, its
 *               partner v ^ m the upper; send the other half, receive the
 *               partner's partial of the kept one into scratch;
 *               recvbuff[kept] = lower op higher                  (transport.h)
 *   Avg         the one block left is final: divide it by n
 *   all-gather, m = p/2, ..., 2, 1 (the halving undone): send the range held,
 *               receive the partner's (the other half of the range held one
 *               step up) straight into recvbuff
 *   fold out    r < 2rem, odd: send recvbuff to r-1
 *
 * Which block a rank ends the reduce-scatter with is bit-reversed (its lowest
 * bit picks the half first); nothing depends on it, every range is tracked.
 *
 * Why every rank ends with the same bytes. Each block's reduction is
 * completed on exactly one rank (the one whose kept ranges contain it), every
 * combination of it on the way is lower op higher on the same partials, and
 * the all-gather and the fold out copy the finished block verbatim to every
 * other rank. The combination order is fixed by the schedule, never by
 * timing. Block by block it is the same balanced tree over the ranks in order
 * that allreduce_rd.c builds (step m joins the aligned groups of m virtual
 * ranks), so the two give identical results.
 *
 * Cost per rank (B bytes, rem = 0): 2 log2(n) steps; (n-1)/n * B sent and
 * received in each half, (n-1)/n * B reduced. The steps with small m carry
 * the most data (B/2, B/4, ...) and pair neighbours, which share a host when
 * ranks are placed by host; the steps across hosts carry B/2m. rem > 0 adds
 * two steps of B for the paired ranks.
 *
 * The two halves are also run on their own, over a host's ranks, by the
 * hierarchical all-reduce (allreduce_hier_p2p.c; transport.h's groups).
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/transport.h"

#define RAB_TAG 0x4842 /* "HB" */

hvdlResult_t hvdl_rab_reduce_scatter(hvdlComm_t comm, const struct hvdl_group *g,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op, struct hvdl_halving *h) {
  const int r = g->rank;
  const size_t esize = hvdl_type_size(dt), bytes = count * esize;
  struct hvdl_scratch *s = &comm->scratch;
  struct hvdl_fold *f = &h->f;
  hvdl_fold_plan(g->size, r, f);
  if (h->blocks <= 0 || h->blocks > f->p) h->blocks = f->p;
  const int whole = f->p / h->blocks; /* the steps with mask m < whole move whole buffers */
  h->steps = 0;
  h->holds = f->vrank >= 0;
  h->lo[0] = 0;
  h->hi[0] = h->blocks;
  char *out = recvbuff;
  const char *cur = sendbuff; /* what this rank holds: its input until the first combine */

  if (f->vrank < 0) /* an even rank of a pair: hand over the input */
    return hvdl_pair_exchange(comm, hvdl_group_peer(g, r + 1), RAB_TAG, sendbuff, bytes, NULL, 0);
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes, bytes));
  if (r < 2 * f->rem) {
    HVDL_CHECK(
        hvdl_pair_exchange(comm, hvdl_group_peer(g, r - 1), RAB_TAG, NULL, 0, s->work, bytes));
    hvdl_pair_combine(out, cur, s->work, 0, count, dt, op);
    cur = out;
  }
  /* lo[j], hi[j] is the block range held before step j. */
  int *lo = h->lo, *hi = h->hi, steps = 0;
  for (int m = 1; m < f->p; m *= 2, steps++) {
    const int peer = hvdl_group_peer(g, hvdl_fold_rank(f, f->vrank ^ m)),
              lower = (f->vrank & m) == 0;
    lo[steps + 1] = lo[steps];
    hi[steps + 1] = hi[steps];
    if (m < whole && !lower) { /* hand the whole partial to the lower partner, and stop */
      HVDL_CHECK(hvdl_pair_exchange(comm, peer, RAB_TAG, cur, bytes, NULL, 0));
      h->holds = 0;
      h->steps = steps + 1;
      return hvdlSuccess;
    }
    if (m < whole) {
      HVDL_CHECK(hvdl_pair_exchange(comm, peer, RAB_TAG, NULL, 0, s->work, bytes));
      hvdl_pair_combine(out, cur, s->work, 1, count, dt, op);
      cur = out;
      continue;
    }
    const int mid = (lo[steps] + hi[steps]) / 2;
    const int keep_lo = lower ? lo[steps] : mid, keep_hi = lower ? mid : hi[steps];
    const int send_lo = lower ? mid : lo[steps], send_hi = lower ? hi[steps] : mid;
    const size_t k0 = hvdl_block_start(count, h->blocks, keep_lo);
    const size_t k1 = hvdl_block_start(count, h->blocks, keep_hi);
    const size_t s0 = hvdl_block_start(count, h->blocks, send_lo);
    const size_t s1 = hvdl_block_start(count, h->blocks, send_hi);
    HVDL_CHECK(hvdl_pair_exchange(comm, peer, RAB_TAG, cur + s0 * esize, (s1 - s0) * esize, s->work,
                                  (k1 - k0) * esize));
    hvdl_pair_combine(out + k0 * esize, cur + k0 * esize, s->work, lower, k1 - k0, dt, op);
    cur = out;
    lo[steps + 1] = keep_lo;
    hi[steps + 1] = keep_hi;
  }
  h->steps = steps;
  if (cur != out) hvdl_copy(out, cur, bytes); /* a group of one */
  return hvdlSuccess;
}

hvdlResult_t hvdl_rab_all_gather(hvdlComm_t comm, const struct hvdl_group *g, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, const struct hvdl_halving *h) {
  const int r = g->rank;
  const size_t esize = hvdl_type_size(dt), bytes = count * esize;
  const struct hvdl_fold *f = &h->f;
  const int *lo = h->lo, *hi = h->hi, whole = f->p / h->blocks;
  char *out = recvbuff;
  if (f->vrank < 0) /* an even rank of a pair: take back the result */
    return hvdl_pair_exchange(comm, hvdl_group_peer(g, r + 1), RAB_TAG, NULL, 0, recvbuff, bytes);
  /* Undo the steps, the last one first. */
  for (int j = h->steps - 1; j >= 0; j--) {
    const int m = 1 << j;
    const int peer = hvdl_group_peer(g, hvdl_fold_rank(f, f->vrank ^ m));
    if (m < whole) { /* whole buffers: the rank that handed its partial over gets the result */
      const int gets = j == h->steps - 1 && !h->holds;
      HVDL_CHECK(hvdl_pair_exchange(comm, peer, RAB_TAG, gets ? NULL : out, gets ? 0 : bytes,
                                    gets ? out : NULL, gets ? bytes : 0));
      continue;
    }
    const size_t h0 = hvdl_block_start(count, h->blocks, lo[j + 1]);
    const size_t h1 = hvdl_block_start(count, h->blocks, hi[j + 1]);
    /* The partner holds the half of [lo[j], hi[j]) that this rank gave away. */
    const int other_lo = lo[j + 1] == lo[j] ? hi[j + 1] : lo[j];
    const int other_hi = lo[j + 1] == lo[j] ? hi[j] : lo[j + 1];
    const size_t o0 = hvdl_block_start(count, h->blocks, other_lo);
    const size_t o1 = hvdl_block_start(count, h->blocks, other_hi);
    HVDL_CHECK(hvdl_pair_exchange(comm, peer, RAB_TAG, out + h0 * esize, (h1 - h0) * esize,
                                  out + o0 * esize, (o1 - o0) * esize));
  }
  if (r < 2 * f->rem)
    HVDL_CHECK(hvdl_pair_exchange(comm, hvdl_group_peer(g, r - 1), RAB_TAG, out, bytes, NULL, 0));
  return hvdlSuccess;
}

hvdlResult_t hvdl_allreduce_rab_group(hvdlComm_t comm, const struct hvdl_group *g,
                                      const void *sendbuff, void *recvbuff, size_t count,
                                      hvdlDataType_t dt, hvdlRedOp_t op) {
  struct hvdl_halving h = {.blocks = 0}; /* p blocks: every step halves */
  HVDL_CHECK(hvdl_rab_reduce_scatter(comm, g, sendbuff, recvbuff, count, dt, op, &h));
  if (op == hvdlAvg && h.holds) { /* the one block left is final: divide it */
    const size_t b0 = hvdl_block_start(count, h.blocks, h.lo[h.steps]);
    const size_t b1 = hvdl_block_start(count, h.blocks, h.hi[h.steps]);
    hvdl_divide((char *)recvbuff + b0 * hvdl_type_size(dt), b1 - b0, dt, g->divisor);
  }
  return hvdl_rab_all_gather(comm, g, recvbuff, count, dt, &h);
}

hvdlResult_t hvdl_allreduce_rab(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, hvdlRedOp_t op) {
  const struct hvdl_group all = hvdl_group_all(comm);
  return hvdl_allreduce_rab_group(comm, &all, sendbuff, recvbuff, count, dt, op);
}
