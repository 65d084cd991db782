/*
 * select.c -- the one all-reduce selector: which algorithm runs for a call of
 * B bytes per rank on n ranks over H hosts (at most L ranks on one).
 *
 *   1. HVD_LITE_ALLREDUCE_ALGO forced (config.allReduceAlgorithm): that one, at
 *      every size. One the layout cannot run (shm without one shared segment on
 *      one host, hier without one across several) is refused at init.
 *   2. One host whose ranks share a segment (comm->shm, shm.c): the shared-memory
 *      path, at every size. The model has no shared-memory term: this is the
 *      shared-memory unit's choice, kept until a measurement says otherwise.
 *   3. B <= config.smallAllReduceBytes: the latency path (allreduce_small.c).
 *      Its default is the crossover measured on one host (128 KiB at 2 ranks,
 *      2 KiB beyond) and 0 across hosts (config.c).
 *   4. Otherwise the cheapest by the alpha-beta-gamma model below among ring,
 *      rd, rab and, where ranks of several hosts share a segment on each
 *      (comm->shm with more than one host), hier; a tie goes to the earlier of
 *      ring, rab, rd, hier.
 *
 * The model. A message of s bytes over a link of class c costs alpha[c] +
 * s * beta[c]; reducing s bytes costs s * gamma. Ranks are assumed placed by
 * host (L consecutive ranks share one), so a pairwise step with mask m < L
 * stays within a host; a step across hosts has all L ranks of a host sending
 * through its one NIC at once, so it pays L * s * beta. With B bytes per rank,
 * p the largest power of two <= n:
 *
 *   ring  2(n-1) alpha + (n-1)/n * B * (beta + max(beta, gamma)), the link the
 *         slowest on the ring (across hosts when H > 1); its reduce-scatter
 *         overlaps reducing with receiving, segment by segment
 *   rd    sum over m = 1 .. p/2 of  alpha + B * beta * contention + B * gamma
 *   rab   sum over m of  2 alpha + 2 * B/2m * beta * contention + B/2m * gamma
 *   (rd, rab: n > p adds 2 (alpha + B beta) + B gamma, within a host)
 *   hier  within a host, priced as a ring reduce-scatter and all-gather there;
 *         L all-reduces of B/L across hosts at once (ring: each NIC carries L
 *         of them)
 *
 * The broadcast's selector (the end of this file) uses the same terms: chain,
 * tree or scatter forced by HVD_LITE_BROADCAST_ALGO, else the cheaper of chain
 * and tree.
 *
 * The terms come from config.c (defaults, or HVD_LITE_COST_MODEL_FILE). Every
 * rank must choose the same algorithm, so at init rank 0's terms, forced
 * algorithms (all-reduce and broadcast) and crossover are agreed by all (one
 * broadcast), and so is the layout: the hosts of topology.c (emulated ones
 * included) by two small all-reduces, and whether a shared segment exists by
 * shm.c's own agreement. A lane of the hierarchical path (comm->cross) has one
 * rank per host and chooses its own algorithm here, like any communicator.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "pipe.h"
#include "shm.h"
#include "topology.h"

typedef hvdlResult_t (*allreduce_fn)(hvdlComm_t, const void *, void *, size_t, hvdlDataType_t,
                                     hvdlRedOp_t);

/* The message-passing algorithms; comm.c runs shm and hier itself. */
static allreduce_fn algorithm(hvdlAlgorithm_t a) {
  switch (a) {
    case hvdlAlgoRing: return hvdl_allreduce_ring;
    case hvdlAlgoRecursiveDoubling: return hvdl_allreduce_rd;
    case hvdlAlgoRabenseifner: return hvdl_allreduce_rab;
    case hvdlAlgoLatency: return hvdl_allreduce_small;
    default: return NULL;
  }
}

/* Why the forced algorithm cannot run on comm's layout, or NULL when it can. */
static const char *cannot_run(const hvdlComm_t comm, int algo) {
  const struct hvdl_shm *s = comm->shm;
  if (comm->size == 1) return NULL; /* nothing runs: the call is a copy */
  if (algo == hvdlAlgoShm && !s)
    return comm->config.disableShm ? "the shared-memory path is off (HVD_LITE_SHM=0)"
                                   : "no two ranks share a host's segment";
  if (algo == hvdlAlgoShm && s->hosts > 1)
    return "the ranks are on more than one host (use hier)";
  if (algo == hvdlAlgoHierarchical && !s)
    return comm->config.disableShm ? "it works through the shared-memory path, which is off "
                                     "(HVD_LITE_SHM=0)"
                                   : "no two ranks share a host's segment";
  if (algo == hvdlAlgoHierarchical && s->hosts == 1)
    return "every rank is on one host (use shm)";
  return NULL;
}

/* What rank 0 tells every rank at init, so that all choose alike. */
struct agreed {
  double terms[5];              /* the cost model: alpha intra, inter; beta intra, inter; gamma */
  unsigned long long small;     /* config.smallAllReduceBytes */
  int algo;                     /* config.allReduceAlgorithm */
  int bcast;                    /* config.broadcastAlgorithm */
  int res;                      /* rank 0's result reading the model */
  char msg[HVDL_ERRMSG_LEN];    /* and its message */
};

hvdlResult_t hvdl_select_init(hvdlComm_t comm, int one_per_host) {
  struct agreed a;
  memset(&a, 0, sizeof a);
  if (comm->rank == 0) {
    struct hvdl_cost_model m;
    a.res = hvdl_config_cost_model(&m);
    if (a.res != hvdlSuccess) snprintf(a.msg, sizeof a.msg, "%s", hvdlGetLastError(NULL));
    const double terms[5] = {m.alpha[0], m.alpha[1], m.beta[0], m.beta[1], m.gamma};
    memcpy(a.terms, terms, sizeof terms);
    a.small = comm->config.smallAllReduceBytes;
    a.algo = comm->config.allReduceAlgorithm;
    a.bcast = comm->config.broadcastAlgorithm;
  }
  /* Rank 0's model file, algorithm and crossover are everyone's: a choice made differently on
   * two ranks would pair them in different algorithms. */
  HVDL_MPI(comm, MPI_Bcast(&a, (int)sizeof a, MPI_BYTE, 0, comm->mpi));
  if (a.res != hvdlSuccess)
    return hvdl_fail(comm, (hvdlResult_t)a.res, "%s%s", comm->rank == 0 ? "" : "on rank 0: ", a.msg);
  comm->config.smallAllReduceBytes = (size_t)a.small;
  comm->config.allReduceAlgorithm = a.algo;
  comm->config.broadcastAlgorithm = a.bcast;
  comm->model = (struct hvdl_cost_model){.alpha = {a.terms[0], a.terms[1]},
                                         .beta = {a.terms[2], a.terms[3]}, .gamma = a.terms[4]};
  /* Every rank sees the same comm->shm (shm.c agrees on it), so every rank refuses alike. */
  const char *why = a.algo == hvdlAlgoAuto ? NULL : cannot_run(comm, a.algo);
  if (why)
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "HVD_LITE_ALLREDUCE_ALGO=%s cannot run on this communicator of %d ranks: %s",
                     hvdl_algo_name(a.algo), comm->size, why);
  /* The host layout: how many hosts, and the most ranks on one. */
  int local_rank = 0, local_size = 1;
  if (!one_per_host) {
    MPI_Comm local;
    HVDL_CHECK(hvdl_local_comm(comm->mpi, &local));
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
  }
  int leaders = local_rank == 0, most = local_size;
  HVDL_MPI(comm, MPI_Allreduce(MPI_IN_PLACE, &leaders, 1, MPI_INT, MPI_SUM, comm->mpi));
  HVDL_MPI(comm, MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT, MPI_MAX, comm->mpi));
  comm->hosts = leaders;
  comm->local_size = most;
  return hvdlSuccess;
}

/* A pairwise step with mask m, s bytes each way: within a host while m < L,
 * else across, with L ranks of a host sharing its NIC. */
static double pair_step(const hvdlComm_t comm, int m, double s) {
  const struct hvdl_cost_model *c = &comm->model;
  if (comm->hosts <= 1 || m < comm->local_size)
    return c->alpha[HVDL_LINK_INTRA] + s * c->beta[HVDL_LINK_INTRA];
  return c->alpha[HVDL_LINK_INTER] + s * c->beta[HVDL_LINK_INTER] * comm->local_size;
}

static double fold_cost(const hvdlComm_t comm, int p, double b) {
  const struct hvdl_cost_model *c = &comm->model;
  if (p == comm->size) return 0;
  return 2 * (c->alpha[HVDL_LINK_INTRA] + b * c->beta[HVDL_LINK_INTRA]) + b * c->gamma;
}

static double ring_cost(int n, double alpha, double beta, double gamma, double b) {
  const double moved = (double)(n - 1) / n * b;
  return 2.0 * (n - 1) * alpha + moved * (beta + (gamma > beta ? gamma : beta));
}

double hvdl_select_predict(hvdlComm_t comm, hvdlAlgorithm_t algo, size_t bytes) {
  const struct hvdl_cost_model *c = &comm->model;
  const int n = comm->size, L = comm->local_size, H = comm->hosts;
  const double b = (double)bytes;
  const int link = H > 1 ? HVDL_LINK_INTER : HVDL_LINK_INTRA;
  int p = 1;
  while (p <= n / 2) p *= 2;
  double t = 0;
  switch (algo) {
    case hvdlAlgoRing:
      return ring_cost(n, c->alpha[link], c->beta[link], c->gamma, b);
    case hvdlAlgoRecursiveDoubling:
      for (int m = 1; m < p; m *= 2) t += pair_step(comm, m, b) + b * c->gamma;
      return t + fold_cost(comm, p, b);
    case hvdlAlgoRabenseifner:
      for (int m = 1; m < p; m *= 2) t += 2 * pair_step(comm, m, b / (2.0 * m)) + b / (2.0 * m) * c->gamma;
      return t + fold_cost(comm, p, b);
    case hvdlAlgoHierarchical:
      if (!comm->shm || comm->shm->hosts <= 1) return -1;
      /* within: a ring reduce-scatter and all-gather; across: L rings of B/L at once */
      return ring_cost(L, c->alpha[HVDL_LINK_INTRA], c->beta[HVDL_LINK_INTRA], c->gamma, b) +
             ring_cost(H, c->alpha[HVDL_LINK_INTER], c->beta[HVDL_LINK_INTER] * L, c->gamma,
                       b / L);
    case hvdlAlgoLatency: {
      /* MPI's all-gather: about log2(n) rounds, (n-1) * B received; then (n-1) * B reduced */
      int rounds = 0;
      for (int m = 1; m < n; m *= 2) rounds++;
      return rounds * c->alpha[link] + (n - 1) * b * (c->beta[link] + c->gamma);
    }
    default:
      return -1;
  }
}

hvdlAlgorithm_t hvdl_select_allreduce(hvdlComm_t comm, size_t bytes) {
  if (comm->config.allReduceAlgorithm != hvdlAlgoAuto)
    return (hvdlAlgorithm_t)comm->config.allReduceAlgorithm;
  if (comm->shm && comm->shm->hosts == 1) return hvdlAlgoShm;
  if (bytes <= comm->config.smallAllReduceBytes) return hvdlAlgoLatency;
  static const hvdlAlgorithm_t order[] = {hvdlAlgoRing, hvdlAlgoRabenseifner,
                                          hvdlAlgoRecursiveDoubling, hvdlAlgoHierarchical};
  hvdlAlgorithm_t best = hvdlAlgoRing;
  double best_t = -1;
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    const double t = hvdl_select_predict(comm, order[i], bytes);
    if (t >= 0 && (best_t < 0 || t < best_t)) {
      best = order[i];
      best_t = t;
    }
  }
  return best;
}

hvdlResult_t hvdl_allreduce_run(hvdlComm_t comm, hvdlAlgorithm_t algo, const void *sendbuff,
                                void *recvbuff, size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  const allreduce_fn fn = algorithm(algo);
  if (!fn)
    return hvdl_fail(comm, hvdlInternalError, "all-reduce algorithm %d (%s) is not available",
                     (int)algo, hvdl_algo_name(algo));
  return fn(comm, sendbuff, recvbuff, count, dt, op);
}

/* The broadcast. Ranks placed by host and the root first on its host; B bytes,
 * M the largest power of two < n, a link's cost a(s) = alpha + s * beta of its
 * class (a step with mask m crosses hosts when m >= L; only one rank of a host
 * sends across at a time, so no contention):
 *
 *   chain    S segments of s = B/S (one on 2 ranks): S + n - 2 stages
 *            (broadcast.c), each the slowest hop's a(s)
 *   tree     the root's sends one after another: sum over m = M .. 1 of a_m(B)
 *   scatter  the root's sends of the scatter, sum over m of a_m(m/n B), then
 *            the ring all-gather's n-1 steps of B/n on the slowest link
 *
 * auto takes the cheaper of chain and tree (a tie: the chain). Scatter runs only
 * when forced: in the simulation (docs/scale.md, 64 ranks) its n-1 ring steps
 * each pay SMPI's latency of a 64 KiB message, 23 us across hosts against the
 * model's 10, and it lost to the tree at 4 MiB (2.26 ms against 1.45), as
 * SMPI's own scatter + ring all-gather did to its binomial tree. */
static double hop(const hvdlComm_t comm, int inter, double s) {
  const struct hvdl_cost_model *c = &comm->model;
  const int k = inter && comm->hosts > 1 ? HVDL_LINK_INTER : HVDL_LINK_INTRA;
  return c->alpha[k] + s * c->beta[k];
}

double hvdl_select_predict_broadcast(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo,
                                     size_t bytes) {
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
    default:
      return -1;
  }
}

hvdlBroadcastAlgorithm_t hvdl_select_broadcast(hvdlComm_t comm, size_t bytes) {
  if (comm->config.broadcastAlgorithm != hvdlBcastAuto)
    return (hvdlBroadcastAlgorithm_t)comm->config.broadcastAlgorithm;
  const hvdlBroadcastAlgorithm_t best = hvdlBcastChain;
  const double best_t = hvdl_select_predict_broadcast(comm, best, bytes);
  const double tree_t = hvdl_select_predict_broadcast(comm, hvdlBcastTree, bytes);
  return tree_t < best_t ? hvdlBcastTree : best;
}

hvdlResult_t hvdl_broadcast_run(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo,
                                const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, int root) {
  switch (algo) {
    case hvdlBcastChain: return hvdl_broadcast_chain(comm, sendbuff, recvbuff, count, dt, root);
    case hvdlBcastTree: return hvdl_broadcast_tree(comm, sendbuff, recvbuff, count, dt, root);
    case hvdlBcastScatter: return hvdl_broadcast_scatter(comm, sendbuff, recvbuff, count, dt, root);
    default:
      return hvdl_fail(comm, hvdlInternalError, "broadcast algorithm %d (%s) is not available",
                       (int)algo, hvdl_bcast_algo_name(algo));
  }
}
