/*
 * select_broadcast.c -- the broadcast's selector: which algorithm runs for a
 * broadcast of B bytes on n ranks over H hosts (at most L ranks on one), from
 * the cost model and layout select_allreduce.c agreed at init (comm->model, hosts,
 * local_size), and HVD_LITE_BROADCAST_ALGO (config.broadcastAlgorithm, rank 0's,
 * agreed there too): that one at every size when forced; else, with every rank
 * on one host able to read the others' memory, the single copy (shm,
 * broadcast_shm.c; not modelled) above SHM_BROADCAST_MIN and up to
 * SHM_BROADCAST_MAX bytes (algorithms.h, measured); else the cheapest of chain,
 * tree and, on hosts of one size (comm->hier_p2p), hier_p2p by the model below.
 */
#include "algorithms/algorithms.h"
#include "base/base.h"
#include "select/select.h"
#include "transport/shm/shm.h"
#include "transport/transport.h"

/* The model. Ranks placed by host and the root first on its host; B bytes,
 * M the largest power of two < n, a link's cost a(s) = alpha + s * beta of its
 * class (a step with mask m crosses hosts when m >= L; only one rank of a host
 * sends across at a time, so no contention):
 *
 *   chain    S segments of s = B/S (one on 2 ranks): S + n - 2 stages
 *            (broadcast_chain.c), each the slowest hop's a(s)
 *   tree     the root's sends one after another: sum over m = M .. 1 of a_m(B)
 *   scatter  the root's sends of the scatter, sum over m of a_m(m/n B), then
 *            the ring all-gather's n-1 steps of B/n on the slowest link
 *   hier_p2p ceil(log_kx H) levels across of alpha(B) + (kx-1) B beta (the
 *            kx-1 sends of a level leave one NIC together), then ceil(log_kl L)
 *            levels within of alpha + (kl-1) B beta (a host's memory copies
 *            them, one after another); the radices kx, kl of 2, 4 and 8 each the
 *            cheapest (a tie: the smaller). The cap keeps a rank's sends at once
 *            to 7 whatever H and L: radix 2 is each level's binomial tree, and
 *            radix 8 with B small is where one latency for many copies pays,
 *            as in MVAPICH2's k-nomial broadcast
 *
 * auto takes the cheapest of chain, tree and hier_p2p (a tie: hier_p2p, then the chain). Scatter runs only
 * when forced: in the simulation (docs/scale.md, 64 ranks) its n-1 ring steps
 * each pay SMPI's latency of a 64 KiB message, 23 us across hosts against the
 * model's 10, and it lost to the tree at 4 MiB (2.26 ms against 1.45), as
 * SMPI's own scatter + ring all-gather did to its binomial tree. */
static double hop(const hvdlComm_t comm, int inter, double s) {
  return hvdl_select_step(&comm->model, inter && comm->hosts > 1, 1, s);
}

/* hier_p2p's radix for a k-nomial tree over `nodes` ranks (across hosts or within one),
 * and its time on B bytes (*cost). */
static int hier_radix(const hvdlComm_t comm, int across, int nodes, double b, double *cost) {
  int best = 2;
  *cost = -1;
  for (int k = 2; k <= 8; k *= 2) {
    int levels = 0;
    for (long long span = 1; span < nodes; span *= k) levels++;
    const double t = levels * (across ? hvdl_select_step(&comm->model, 1, k - 1, b)
                                      : hvdl_select_step(&comm->model, 0, 1, (k - 1) * b));
    if (*cost < 0 || t < *cost) best = k, *cost = t;
  }
  return best;
}

double hvdl_select_predict_broadcast(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo, size_t bytes) {
  const int n = comm->size, L = comm->local_size, H = comm->hosts;
  const double b = (double)bytes;
  const int inter = H > 1;
  int M = 1;
  while (M < n - M) M *= 2;
  double t = 0;
  switch (algo) {
    case hvdlBcastChain: {
      const size_t seg = comm->config.segmentBytes ? comm->config.segmentBytes : bytes;
      size_t S = n <= 2 ? 1 : (bytes + seg - 1) / seg;
      if (S > PIPE_MAX_SEGMENTS) S = PIPE_MAX_SEGMENTS;
      if (S < 1) S = 1;
      return (double)(S + (size_t)n - 2) * hop(comm, inter, b / (double)S);
    }
    case hvdlBcastTree:
      for (int m = M; m >= 1; m /= 2) t += hop(comm, m >= L, b);
      return t;
    case hvdlBcastScatter:
      for (int m = M; m >= 1; m /= 2) t += hop(comm, m >= L, b * m / n);
      return t + (n - 1) * hop(comm, inter, b / n);
    case hvdlBcastHierP2p: {
      if (!comm->hier_p2p) return -1;
      double across, within;
      hier_radix(comm, 1, H, b, &across);
      hier_radix(comm, 0, L, b, &within);
      return across + within;
    }
    default: return -1;
  }
}

const char *hvdl_select_broadcast_cannot_run(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo,
                                             int fewest, char *why_buf, size_t why_len) {
  if (algo == hvdlBcastHierP2p)
    return hvdl_select_hier_p2p_cannot_run(comm, fewest, why_buf, why_len);
  return algo == hvdlBcastShm ? hvdl_cma_off_reason(comm) : NULL;
}

hvdlBroadcastAlgorithm_t hvdl_select_broadcast(hvdlComm_t comm, size_t bytes) {
  if (comm->config.broadcastAlgorithm != hvdlBcastAuto)
    return (hvdlBroadcastAlgorithm_t)comm->config.broadcastAlgorithm;
  if (comm->shm && comm->shm->cma && bytes > SHM_BROADCAST_MIN && bytes <= SHM_BROADCAST_MAX)
    return hvdlBcastShm; /* its single copy */
  hvdlBroadcastAlgorithm_t best = hvdlBcastChain;
  double best_t = hvdl_select_predict_broadcast(comm, best, bytes);
  const double tree_t = hvdl_select_predict_broadcast(comm, hvdlBcastTree, bytes);
  if (tree_t < best_t) best = hvdlBcastTree, best_t = tree_t;
  /* A tie goes to hier_p2p: with radix 2 on both levels it is the binomial tree's
   * levels, its leaders sending within their host while they forward across; the
   * tolerance keeps the tie from turning on the last bits of two sums. */
  const double hier_t = hvdl_select_predict_broadcast(comm, hvdlBcastHierP2p, bytes);
  if (hier_t >= 0 && hier_t <= best_t * (1 + 1e-9)) best = hvdlBcastHierP2p;
  return best;
}

hvdlResult_t hvdl_broadcast_run(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo,
                                const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, int root) {
  switch (algo) {
    case hvdlBcastChain: return hvdl_broadcast_chain(comm, sendbuff, recvbuff, count, dt, root);
    case hvdlBcastTree: return hvdl_broadcast_tree(comm, sendbuff, recvbuff, count, dt, root);
    case hvdlBcastScatter: return hvdl_broadcast_scatter(comm, sendbuff, recvbuff, count, dt, root);
    case hvdlBcastShm: return hvdl_broadcast_shm(comm, sendbuff, recvbuff, count, dt, root);
    case hvdlBcastHierP2p: {
      const double b = (double)count * hvdl_type_size(dt);
      double t;
      const int across = hier_radix(comm, 1, comm->hosts, b, &t);
      const int within = hier_radix(comm, 0, comm->local_size, b, &t);
      return hvdl_broadcast_hier_p2p(comm, across, within, sendbuff, recvbuff, count, dt, root);
    }
    default:
      return hvdl_fail(comm, hvdlInternalError, "broadcast algorithm %d (%s) is not available",
                       (int)algo, hvdl_bcast_algo_name(algo));
  }
}
