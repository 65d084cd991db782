/*
 * select_gather.c -- the all-gather's and the reduce-scatter's selectors: which
 * algorithm runs for a call of B bytes in all (the all-gather's result, the
 * reduce-scatter's input) on n ranks over H hosts (at most L ranks on one),
 * from the cost model and layout select_allreduce.c agreed at init (comm->model, hosts,
 * local_size), and HVD_LITE_ALLGATHER_ALGO / HVD_LITE_REDUCESCATTER_ALGO
 * (config.allGatherAlgorithm, reduceScatterAlgorithm, rank 0's, agreed there
 * too): that one at every size when forced, else the cheapest by the model
 * below (a tie: the ring, then the order of the enums). The shared-memory
 * forms (shm: allgather_shm.c, reducescatter_shm.c) are not modelled. With every
 * rank on one host, the all-gather's auto takes shm up to SHM_ALLGATHER_MIN bytes
 * (base.h, measured) where that fits an area: its one step through the
 * segment, where the ring takes n-1 messages. Above, it takes shm's single copy
 * where each rank can write into the others' memory, 2 steps instead of n-1; else
 * the model's pick (docs/algorithms.md, "The shared-memory all-gather"). The
 * reduce-scatter's auto takes its single copy above SHM_REDUCESCATTER_MIN bytes
 * where each rank can read the others' memory, else the model's pick.
 */
#include "algorithms/algorithms.h"
#include "base/base.h"
#include "select/select.h"
#include "transport/shm/shm.h"

/* The model. select_allreduce.c's terms and assumptions: ranks placed by host, a step
 * with mask m crossing hosts when H > 1 and m >= L, all L ranks of a host then
 * sending through its NIC at once (L * s * beta); a(s) = alpha + s * beta of the
 * link's class. B bytes, p the largest power of two <= n, blocks of B/n (the
 * runs of virtual blocks taken as B/p each):
 *
 *   ring      n-1 steps of a(B/n) on the slowest link of the ring (across when
 *             H > 1); the reduce-scatter's reduce B/n per step, overlapped with
 *             receiving: max(beta, gamma) instead of beta
 *   rd        steps m = 1, 2, ..., p/2 of a(m B/p)
 *   rd_far    steps m = p/2, ..., 1 of a(B/2m), the first a(2B/p): two blocks
 *             each way, to and from two ranks (one block on 2 ranks)
 *   halving   steps m = 1, ..., p/2 of a(B/2m) + B/2m gamma, the last
 *             a(2B/p) + B/p gamma, as rd_far's first
 *   (n > p adds the fold: a(B/n) and a(B) for the all-gathers, a(B) + B gamma
 *   and a(B/n) for the reduce-scatter; within a host, across when L = 1)
 *   hier_p2p  (H hosts of L > 1 ranks, comm->hier_p2p; k = ceil((H-1)/L)) three
 *             steps, each priced as hier_p2p's all-reduce prices a step of messages
 *             at once (select_allreduce.c): one latency and the bytes of the busiest
 *             end. Within the host a rank's L-1 blocks, a_intra((L-1) B/n); across,
 *             alpha(B/H) + (H-1)/H B beta, every remote host-block of B/H through
 *             the NIC once; within again a_intra of the larger of what a rank sends,
 *             (L-1) k B/H, and what it receives, (H-1)/H (L-1)/L B; the
 *             reduce-scatter's mirror the same, with gamma on what it reduces:
 *             (L-1) times its share (k B/H + B/n) within first, H-1 blocks of
 *             B/n at the end
 */
static double step(const hvdlComm_t comm, int across, double s) {
  return hvdl_select_step(&comm->model, across, comm->local_size, s);
}

/* rd_far's first step and halving's last: two blocks of B/p out and in (one on
 * 2 ranks, where a rank holds its own). */
static double first_or_last(int p, double b) { return (p == 2 ? 1 : 2) * b / p; }

/* hier_p2p's three steps (the all-gather's, or with reduce its mirror's), or -1 where it
 * is no candidate: no grid, or one rank a host (nothing to share within one). */
static double hier_p2p(const hvdlComm_t comm, double b, int reduce) {
  const int n = comm->size, L = comm->local_size, H = comm->hosts, k = (H - 1 + L - 1) / L;
  if (!comm->hier_p2p || L <= 1) return -1;
  const struct hvdl_cost_model *c = &comm->model;
  const double host_block = b / H, gamma = reduce ? c->gamma : 0;
  /* what a rank receives in step 1 (and reduces), sends and receives in step 3 */
  const double in1 = (L - 1.0) * (reduce ? k * host_block + b / n : b / n);
  const double out3 = (L - 1.0) * k * (reduce ? b / n : host_block);
  const double in3 = reduce ? (H - 1.0) * b / n : (H - 1.0) / H * (L - 1.0) / L * b;
  return step(comm, 0, in1) + in1 * gamma + hvdl_select_alpha_inter(c, host_block) +
         (H - 1) * host_block * c->beta[HVDL_LINK_INTER] + step(comm, 0, out3 > in3 ? out3 : in3) +
         (reduce ? (H - 1.0) * b / n * gamma : 0);
}

static double ring(const hvdlComm_t comm, double b, int reduce) {
  const struct hvdl_cost_model *c = &comm->model;
  const int n = comm->size, k = comm->hosts > 1 ? HVDL_LINK_INTER : HVDL_LINK_INTRA;
  const double beta = c->beta[k], per_byte = reduce && c->gamma > beta ? c->gamma : beta;
  const double alpha = k == HVDL_LINK_INTER ? hvdl_select_alpha_inter(c, b / n) : c->alpha[k];
  return (n - 1) * (alpha + b / n * per_byte);
}

double hvdl_select_predict_allgather(hvdlComm_t comm, hvdlAllGatherAlgorithm_t algo, size_t bytes) {
  const int n = comm->size, L = comm->local_size, multi = comm->hosts > 1;
  const double b = (double)bytes;
  int p = 1;
  while (p <= n / 2) p *= 2;
  double t = 0;
  switch (algo) {
    case hvdlAllGatherRing: return ring(comm, b, 0);
    case hvdlAllGatherRd:
      for (int m = 1; m < p; m *= 2) t += step(comm, multi && m >= L, m * b / p);
      break;
    case hvdlAllGatherRdFar:
      t = step(comm, multi && p / 2 >= L, first_or_last(p, b));
      for (int m = p / 4; m >= 1; m /= 2) t += step(comm, multi && m >= L, b / (2.0 * m));
      break;
    case hvdlAllGatherHierP2p: return hier_p2p(comm, b, 0);
    default: return -1;
  }
  if (p < n) t += step(comm, multi && L <= 1, b / n) + step(comm, multi && L <= 1, b);
  return t;
}

double hvdl_select_predict_reducescatter(hvdlComm_t comm, hvdlReduceScatterAlgorithm_t algo,
                                         size_t bytes) {
  const int n = comm->size, L = comm->local_size, multi = comm->hosts > 1;
  const double b = (double)bytes, gamma = comm->model.gamma;
  int p = 1;
  while (p <= n / 2) p *= 2;
  double t = 0;
  switch (algo) {
    case hvdlReduceScatterRing: return ring(comm, b, 1);
    case hvdlReduceScatterHierP2p: return hier_p2p(comm, b, 1);
    case hvdlReduceScatterHalving:
      for (int m = 1; m < p / 2; m *= 2)
        t += step(comm, multi && m >= L, b / (2.0 * m)) + b / (2.0 * m) * gamma;
      t += step(comm, multi && p / 2 >= L, first_or_last(p, b)) + b / p * gamma;
      if (p < n)
        t += step(comm, multi && L <= 1, b) + b * gamma + step(comm, multi && L <= 1, b / n);
      return t;
    default: return -1;
  }
}

const char *hvdl_select_allgather_cannot_run(hvdlComm_t comm, hvdlAllGatherAlgorithm_t algo,
                                             int fewest, char *why_buf, size_t why_len) {
  if (algo == hvdlAllGatherHierP2p)
    return hvdl_select_hier_p2p_cannot_run(comm, fewest, why_buf, why_len);
  return algo == hvdlAllGatherShm ? hvdl_cma_off_reason(comm) : NULL;
}

const char *hvdl_select_reducescatter_cannot_run(hvdlComm_t comm, hvdlReduceScatterAlgorithm_t algo,
                                                 int fewest, char *why_buf, size_t why_len) {
  if (algo == hvdlReduceScatterHierP2p)
    return hvdl_select_hier_p2p_cannot_run(comm, fewest, why_buf, why_len);
  return algo == hvdlReduceScatterShm ? hvdl_cma_off_reason(comm) : NULL;
}

hvdlAllGatherAlgorithm_t hvdl_select_allgather(hvdlComm_t comm, size_t bytes) {
  if (comm->config.allGatherAlgorithm != hvdlAllGatherAuto)
    return (hvdlAllGatherAlgorithm_t)comm->config.allGatherAlgorithm;
  const struct hvdl_shm *sh = comm->shm;
  if (sh && sh->hosts == 1 && bytes <= SHM_ALLGATHER_MIN && bytes <= sh->area)
    return hvdlAllGatherShm; /* its one step through the segment */
  if (sh && sh->cma && bytes > SHM_ALLGATHER_MIN) return hvdlAllGatherShm; /* its single copy */
  hvdlAllGatherAlgorithm_t best = hvdlAllGatherRing;
  double best_t = hvdl_select_predict_allgather(comm, best, bytes);
  for (int a = hvdlAllGatherRd; a < hvdlNumAllGatherAlgos; a++) {
    const double t = hvdl_select_predict_allgather(comm, (hvdlAllGatherAlgorithm_t)a, bytes);
    if (t >= 0 && t < best_t) best = (hvdlAllGatherAlgorithm_t)a, best_t = t; /* shm: -1 */
  }
  return best;
}

hvdlReduceScatterAlgorithm_t hvdl_select_reducescatter(hvdlComm_t comm, size_t bytes) {
  if (comm->config.reduceScatterAlgorithm != hvdlReduceScatterAuto)
    return (hvdlReduceScatterAlgorithm_t)comm->config.reduceScatterAlgorithm;
  const struct hvdl_shm *sh = comm->shm;
  if (sh && sh->cma && bytes > SHM_REDUCESCATTER_MIN) return hvdlReduceScatterShm; /* single copy */
  hvdlReduceScatterAlgorithm_t best = hvdlReduceScatterRing;
  double best_t = hvdl_select_predict_reducescatter(comm, best, bytes);
  for (int a = hvdlReduceScatterHalving; a < hvdlNumReduceScatterAlgos; a++) {
    const double t =
        hvdl_select_predict_reducescatter(comm, (hvdlReduceScatterAlgorithm_t)a, bytes);
    if (t >= 0 && t < best_t) best = (hvdlReduceScatterAlgorithm_t)a, best_t = t; /* shm: -1 */
  }
  return best;
}

hvdlResult_t hvdl_allgather_run(hvdlComm_t comm, hvdlAllGatherAlgorithm_t algo,
                                const void *sendbuff, void *recvbuff, const size_t *counts,
                                hvdlDataType_t dt) {
  switch (algo) {
    case hvdlAllGatherRing: return hvdl_allgatherv(comm, sendbuff, recvbuff, counts, dt);
    case hvdlAllGatherRd: return hvdl_allgatherv_rd(comm, sendbuff, recvbuff, counts, dt, 0);
    case hvdlAllGatherRdFar: return hvdl_allgatherv_rd(comm, sendbuff, recvbuff, counts, dt, 1);
    case hvdlAllGatherShm: return hvdl_allgatherv_shm(comm, sendbuff, recvbuff, counts, dt);
    case hvdlAllGatherHierP2p:
      return hvdl_allgatherv_hier_p2p(comm, sendbuff, recvbuff, counts, dt);
    default:
      return hvdl_fail(comm, hvdlInternalError, "all-gather algorithm %d (%s) is not available",
                       (int)algo, hvdl_allgather_algo_name(algo));
  }
}

hvdlResult_t hvdl_reducescatter_run(hvdlComm_t comm, hvdlReduceScatterAlgorithm_t algo,
                                    const void *sendbuff, void *recvbuff, const size_t *counts,
                                    hvdlDataType_t dt, hvdlRedOp_t op) {
  switch (algo) {
    case hvdlReduceScatterRing:
      return hvdl_reducescatterv(comm, sendbuff, recvbuff, counts, dt, op);
    case hvdlReduceScatterHalving:
      return hvdl_reducescatterv_halving(comm, sendbuff, recvbuff, counts, dt, op);
    case hvdlReduceScatterShm:
      return hvdl_reducescatterv_shm(comm, sendbuff, recvbuff, counts, dt, op);
    case hvdlReduceScatterHierP2p:
      return hvdl_reducescatterv_hier_p2p(comm, sendbuff, recvbuff, counts, dt, op);
    default:
      return hvdl_fail(comm, hvdlInternalError, "reduce-scatter algorithm %d (%s) is not available",
                       (int)algo, hvdl_reducescatter_algo_name(algo));
  }
}
