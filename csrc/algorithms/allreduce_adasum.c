/*
 * allreduce_adasum.c -- Adasum (hvdl.h's hvdlAdasum): the ranks' vectors combined
 * pairwise by
 *
 *     adasum(a, b) = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b
 *
 * (a coefficient is 1 where its squared norm is below sqrt(DBL_MIN): a zero vector is
 * left out), level by level of a binary tree over the ranks in rank order, by recursive
 * vector halving and distance doubling. The buffer may hold several tensors one after
 * another (the engine's fusion buffer): each has its own dot product and norms.
 *
 * The schedule, at group member r (the fold, virtual ranks v and p are transport.h's;
 * p = largest power of two <= n, rem = n - p):
 *
 *   fold in     r < 2rem, even: send the input to r+1, then wait for the result
 *               r < 2rem, odd:  x = adasum(x(r-1), x(r)), its dots over the whole
 *                               vectors, all here
 *   halving, m = 1, 2, ..., p/2, on the element range [lo, hi) still held (all of it
 *               at first): split it at mid = lo + (hi-lo)/2; the member with bit m of
 *               v clear keeps the lower half, its partner v ^ m the upper; send the
 *               other half, receive the partner's values of the kept one. The lower
 *               member's vector is a (it holds the lower ranks' combination), the
 *               partner's b. Each member sums a.b, |a|^2, |b|^2 per tensor over its
 *               kept range, and the 2m members of the aligned group v & ~(2m-1), which
 *               between them hold all of a and b, add their sums by recursive doubling
 *               (log2(2m) exchanges of 3 doubles a tensor); then kept = adasum(a, b)
 *   doubling, m = p/2, ..., 2, 1: send the range held, receive the partner's (the
 *               other half of the range held one step up) in place
 *   fold out    r < 2rem, odd: send the result to r-1
 *
 * At 4 ranks the result is adasum(adasum(x0, x1), adasum(x2, x3)); at 3,
 * adasum(adasum(x0, x1), x2). Horovod's Adasum takes a power of two only; the fold is
 * how this one takes any number.
 *
 * Why every rank ends with the same bytes. Each element of a level's result is computed
 * on exactly one member (the one whose kept range holds it), from coefficients that are
 * the same on every member of its group: the recursive doubling adds the same partial
 * sums, two at a time, on both partners of each exchange (IEEE addition is
 * commutative), so all of them end with the same bits. The doubling and the fold out
 * copy finished elements verbatim. The order of everything is fixed by the schedule,
 * never by timing.
 *
 * Cost per rank (B bytes, T tensors, rem = 0): log2(n) halving and log2(n) doubling
 * steps, (n-1)/n * B sent and received in each, as Rabenseifner's all-reduce
 * (allreduce_rab.c); two passes over the data held at each level (the dots and the
 * combination) where rab makes one; and log2(n)(log2(n)+1)/2 small exchanges of 24T bytes
 * for the sums.
 *
 * The hierarchical form (hvdl_allreduce_adasum with config.adasumHierarchical; hosts of
 * equal size, L ranks each), on the three phases of allreduce_hier.c (through the shared
 * segment) or, without one, of allreduce_hier_p2p.c (by messages): the host's sum of every
 * element, local rank j keeping lane j; lane j divided by L (the host's average) and
 * combined with the other hosts' lane j by the schedule above, where every sum is also added over
 * the host's L lanes (recursive doubling over the host's ranks, hier_p2p's local group), so
 * that each tensor's dot product and norms span all of it; every lane copied to every
 * local rank. Each lane carrier runs every step, an empty lane too. On one host the result
 * is the host's average; with one rank a host, flat Adasum.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/shm/shm.h"
#include "transport/transport.h"

#define ADASUM_TAG      0x4845 /* "HE": the vectors */
#define ADASUM_DOTS_TAG 0x4846 /* the sums of the dots */

/* The tensors of a buffer: n of them, counts[t] elements each, one after another. */
struct tensors {
  const size_t *counts;
  int n;
  hvdlDataType_t dt;
  size_t esize;
};

/* sums[3t .. 3t+2] = a.b, |a|^2, |b|^2 of tensor t over the elements [lo, hi) of the
 * buffer, where a and b hold elements lo .. hi-1. */
static void partial_dots(const struct tensors *ts, const char *a, const char *b, size_t lo,
                         size_t hi, double *sums) {
  memset(sums, 0, 3 * (size_t)ts->n * sizeof *sums);
  size_t start = 0;
  for (int t = 0; t < ts->n && start < hi; t++) {
    const size_t end = start + ts->counts[t];
    const size_t x0 = start > lo ? start : lo, x1 = end < hi ? end : hi;
    if (x0 < x1)
      hvdl_dots(a + (x0 - lo) * ts->esize, b + (x0 - lo) * ts->esize, x1 - x0, ts->dt,
                sums + 3 * t);
    start = end;
  }
}

static double coefficient(double dot, double normsq) {
  return normsq >= sqrt(DBL_MIN) ? 1.0 - dot / normsq * 0.5 : 1.0;
}

/* out = adasum(a, b) over the elements [lo, hi), each tensor with its own sums. */
static void combine(const struct tensors *ts, char *out, const char *a, const char *b, size_t lo,
                    size_t hi, const double *sums) {
  size_t start = 0;
  for (int t = 0; t < ts->n && start < hi; t++) {
    const size_t end = start + ts->counts[t];
    const size_t x0 = start > lo ? start : lo, x1 = end < hi ? end : hi;
    if (x0 < x1) {
      const double *s = sums + 3 * t;
      const size_t at = (x0 - lo) * ts->esize;
      hvdl_scaled_add(out + at, a + at, coefficient(s[0], s[1]), b + at, coefficient(s[0], s[2]),
                      x1 - x0, ts->dt);
    }
    start = end;
  }
}

/* Where a member's sums are added besides its group's: in the hierarchical form, over the
 * ranks of its host, whose lanes hold the other parts of the same tensors. */
struct lanes_sum {
  hvdlComm_t comm;                /* the communicator the host's ranks exchange on */
  const struct hvdl_group *local; /* the host's ranks */
};

/* Adds the sums over the host's lanes by recursive doubling over the host's ranks
 * (allreduce_rd.c: the same bits on each of them, and on every host, which holds the same
 * sums by local rank); nothing without lanes. A failure is also reported on `comm`, the
 * member's communicator. */
static hvdlResult_t add_lanes(hvdlComm_t comm, const struct lanes_sum *lanes, double *sums,
                              size_t k) {
  if (!lanes || lanes->local->size == 1) return hvdlSuccess;
  const hvdlResult_t res =
      hvdl_allreduce_rd_group(lanes->comm, lanes->local, sums, sums, k, hvdlFloat64, hvdlSum);
  return res == hvdlSuccess ? res : hvdl_fail(comm, res, "%s", lanes->comm->last_error);
}

/* Adds the sums of the `width` members of this member's aligned group of virtual ranks
 * (a power of two), by recursive doubling: every member of the group ends with the same
 * bits. */
static hvdlResult_t add_sums(hvdlComm_t comm, const struct hvdl_group *g, const struct hvdl_fold *f,
                             int width, double *sums, double *theirs, size_t k) {
  for (int j = 1; j < width; j *= 2) {
    const int peer = hvdl_group_peer(g, hvdl_fold_rank(f, f->vrank ^ j));
    HVDL_CHECK(hvdl_pair_exchange(comm, peer, ADASUM_DOTS_TAG, sums, k * sizeof *sums, theirs,
                                  k * sizeof *theirs));
    for (size_t i = 0; i < k; i++) sums[i] += theirs[i];
  }
  return hvdlSuccess;
}

/* The halving and doubling of the p >= 2 virtual ranks, from `cur` (this member's input,
 * or its pair's combination in out) into out, with scratch `work` of the whole buffer's
 * bytes. */
static hvdlResult_t halve_and_double(hvdlComm_t comm, const struct hvdl_group *g,
                                     const struct hvdl_fold *f, const struct tensors *ts,
                                     const char *cur, char *out, size_t count, char *work,
                                     double *sums, const struct lanes_sum *lanes) {
  const size_t es = ts->esize, k = 3 * (size_t)ts->n;
  size_t lo[PAIR_MAX_STEPS + 1], hi[PAIR_MAX_STEPS + 1];
  int steps = 0;
  lo[0] = 0;
  hi[0] = count;
  for (int m = 1; m < f->p; m *= 2, steps++) {
    const int peer = hvdl_group_peer(g, hvdl_fold_rank(f, f->vrank ^ m));
    const int lower = (f->vrank & m) == 0;
    const size_t mid = lo[steps] + (hi[steps] - lo[steps]) / 2;
    const size_t k0 = lower ? lo[steps] : mid, k1 = lower ? mid : hi[steps];
    const size_t g0 = lower ? mid : lo[steps], g1 = lower ? hi[steps] : mid;
    HVDL_CHECK(hvdl_pair_exchange(comm, peer, ADASUM_TAG, cur + g0 * es, (g1 - g0) * es, work,
                                  (k1 - k0) * es));
    const char *mine = cur + k0 * es;
    const char *a = lower ? mine : work, *b = lower ? work : mine;
    partial_dots(ts, a, b, k0, k1, sums);
    HVDL_CHECK(add_sums(comm, g, f, 2 * m, sums, sums + k, k));
    HVDL_CHECK(add_lanes(comm, lanes, sums, k));
    combine(ts, out + k0 * es, a, b, k0, k1, sums);
    cur = out;
    lo[steps + 1] = k0;
    hi[steps + 1] = k1;
  }
  for (int j = steps - 1; j >= 0; j--) { /* the halving undone, the last step first */
    const int peer = hvdl_group_peer(g, hvdl_fold_rank(f, f->vrank ^ (1 << j)));
    const size_t h0 = lo[j + 1], h1 = hi[j + 1];
    const size_t o0 = h0 == lo[j] ? h1 : lo[j], o1 = h0 == lo[j] ? hi[j] : h0;
    HVDL_CHECK(hvdl_pair_exchange(comm, peer, ADASUM_TAG, out + h0 * es, (h1 - h0) * es,
                                  out + o0 * es, (o1 - o0) * es));
  }
  return hvdlSuccess;
}

/* Adasum over g; with `lanes`, the buffer is one lane of the host's (of every tensor, the
 * part in it: counts may be 0) and every rank of the host runs the schedule, an empty lane
 * too, adding its sums over the host's lanes at every step. */
static hvdlResult_t adasum(hvdlComm_t comm, const struct hvdl_group *g, const void *sendbuff,
                           void *recvbuff, const size_t *counts, int ntensors, hvdlDataType_t dt,
                           const struct lanes_sum *lanes) {
  const struct tensors ts = {counts, ntensors, dt, hvdl_type_size(dt)};
  size_t count = 0;
  for (int t = 0; t < ntensors; t++) count += counts[t];
  const size_t bytes = count * ts.esize;
  char *out = recvbuff;
  const char *cur = sendbuff; /* what this member holds: its input until the first combination */
  if (g->size == 1 || (count == 0 && !lanes)) {
    if (sendbuff != recvbuff) hvdl_copy(out, sendbuff, bytes);
    return hvdlSuccess;
  }
  const int r = g->rank;
  struct hvdl_fold f;
  hvdl_fold_plan(g->size, r, &f);
  if (f.vrank < 0) { /* an even member of a pair: hand over the input, take back the result */
    HVDL_CHECK(
        hvdl_pair_exchange(comm, hvdl_group_peer(g, r + 1), ADASUM_TAG, cur, bytes, NULL, 0));
    return hvdl_pair_exchange(comm, hvdl_group_peer(g, r + 1), ADASUM_TAG, NULL, 0, out, bytes);
  }
  struct hvdl_scratch *s = &comm->scratch;
  /* The partner's values: in `stage`, as the sums over a host's lanes (the hierarchical form
   * on messages) run recursive doubling on this communicator, whose partner data is `work`. */
  HVDL_CHECK(hvdl_reserve(comm, &s->stage, &s->stage_bytes, bytes));
  double *sums = malloc(6 * (size_t)ntensors * sizeof *sums); /* this member's, and a peer's */
  if (!sums)
    return hvdl_fail(comm, hvdlSystemError, "Adasum: out of memory for %d tensors' sums", ntensors);
  hvdlResult_t res = hvdlSuccess;
  if (r < 2 * f.rem) { /* the odd member of a pair: combine the pair's vectors here */
    res = hvdl_pair_exchange(comm, hvdl_group_peer(g, r - 1), ADASUM_TAG, NULL, 0, s->stage, bytes);
    if (res == hvdlSuccess) {
      partial_dots(&ts, s->stage, cur, 0, count, sums);
      res = add_lanes(comm, lanes, sums, 3 * (size_t)ntensors);
    }
    if (res == hvdlSuccess) {
      combine(&ts, out, s->stage, cur, 0, count, sums);
      cur = out;
    }
  }
  if (res == hvdlSuccess)
    res = halve_and_double(comm, g, &f, &ts, cur, out, count, s->stage, sums, lanes);
  free(sums);
  if (res == hvdlSuccess && r < 2 * f.rem)
    res = hvdl_pair_exchange(comm, hvdl_group_peer(g, r - 1), ADASUM_TAG, out, bytes, NULL, 0);
  return res;
}

hvdlResult_t hvdl_adasum_group(hvdlComm_t comm, const struct hvdl_group *g, const void *sendbuff,
                               void *recvbuff, const size_t *counts, int ntensors,
                               hvdlDataType_t dt) {
  return adasum(comm, g, sendbuff, recvbuff, counts, ntensors, dt, NULL);
}

/* The hierarchical form's phase across hosts (allreduce_hier.c's lane function): the host's
 * average of this rank's lane, combined with the other hosts' by Adasum, each tensor's sums
 * over its parts in all the host's lanes. */
struct lane_job {
  const size_t *counts; /* the tensors, over the whole buffer */
  int ntensors;
  size_t *lane_counts; /* their parts in this rank's lane */
  uint64_t local_size;
  struct lanes_sum sum;
};

static hvdlResult_t adasum_lane(hvdlComm_t comm, const struct hvdl_group *cross, void *lane,
                                size_t lo, size_t n, hvdlDataType_t dt, hvdlRedOp_t op, void *arg) {
  (void)op; /* Sum: the host's sum, averaged here */
  struct lane_job *job = arg;
  size_t start = 0;
  for (int t = 0; t < job->ntensors; t++) {
    const size_t end = start + job->counts[t];
    const size_t x0 = start > lo ? start : lo, x1 = end < lo + n ? end : lo + n;
    job->lane_counts[t] = x1 > x0 ? x1 - x0 : 0;
    start = end;
  }
  hvdl_divide(lane, n, dt, job->local_size);
  return adasum(comm, cross, lane, lane, job->lane_counts, job->ntensors, dt, &job->sum);
}

/* The average over all ranks (one host), a copy for one rank. */
static hvdlResult_t average(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                            hvdlDataType_t dt) {
  if (comm->size > 1) return hvdl_allreduce_rab(comm, sendbuff, recvbuff, count, dt, hvdlAvg);
  if (sendbuff != recvbuff) hvdl_copy(recvbuff, sendbuff, count * hvdl_type_size(dt));
  return hvdlSuccess;
}

hvdlResult_t hvdl_allreduce_adasum(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                   const size_t *counts, int ntensors, hvdlDataType_t dt) {
  if (!comm->config.adasumHierarchical) {
    const struct hvdl_group all = hvdl_group_all(comm);
    return adasum(comm, &all, sendbuff, recvbuff, counts, ntensors, dt, NULL);
  }
  size_t count = 0;
  for (int t = 0; t < ntensors; t++) count += counts[t];
  if (comm->hosts <= 1) return average(comm, sendbuff, recvbuff, count, dt); /* one host */
  if (comm->local_size == 1) { /* hosts of one rank: each host's average is its rank's input */
    const struct hvdl_group all = hvdl_group_all(comm);
    return adasum(comm, &all, sendbuff, recvbuff, counts, ntensors, dt, NULL);
  }
  if (!comm->hier_p2p || (comm->shm && comm->shm->lanes != comm->local_size))
    return hvdl_fail(comm, hvdlInvalidUsage,
                     "Adasum's hierarchical form (HVD_LITE_ADASUM_HIERARCHICAL=1) needs every host "
                     "to run the same number of ranks (%d ranks on %d hosts here); unset it to "
                     "combine every rank with Adasum",
                     comm->size, comm->hosts);
  struct lane_job job = {counts,
                         ntensors,
                         malloc((size_t)ntensors * sizeof(size_t)),
                         (uint64_t)comm->local_size,
                         {comm, hvdl_hier_p2p_local(comm->hier_p2p)}};
  if (!job.lane_counts)
    return hvdl_fail(comm, hvdlSystemError, "Adasum: out of memory for %d tensors", ntensors);
  /* Within each host through the shared segment where there is one, else by messages. */
  const hvdlResult_t res = comm->shm
                               ? hvdl_allreduce_hier_lanes(comm, sendbuff, recvbuff, count, dt,
                                                           hvdlSum, adasum_lane, &job)
                               : hvdl_allreduce_hier_p2p_lanes(comm, sendbuff, recvbuff, count, dt,
                                                               hvdlSum, adasum_lane, &job);
  free(job.lane_counts);
  return res;
}
