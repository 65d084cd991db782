/*
 * select_alltoall.c -- the all-to-all's selector: which algorithm runs an all-to-all of n
 * blocks of b bytes each (every block the same size, on every rank) on n ranks over H
 * hosts (at most L ranks on one), from the cost model and layout select_allreduce.c agreed
 * at init (comm->model, hosts, local_size), and HVD_LITE_ALLTOALL_ALGO
 * (config.allToAllAlgorithm, rank 0's, agreed there too): that one at every size when
 * forced, else the cheaper of pairwise and Bruck's by the model below (a tie: pairwise), or
 * a two-level algorithm where it beats both by HIER_P2P_MARGIN: hier_pairs where every rank
 * carries at most one host (H-1 <= L), hier_p2p elsewhere (the rule: TWO_LEVEL below).
 * Both need hier_p2p's grid (hosts of the same size; refused at init when forced without
 * one, hvdl_select_alltoall_cannot_run). Blocks of different sizes (the engine's alltoall
 * with uneven splits) always go pairwise: the other schedules pack blocks of one size.
 */
#include "algorithms/algorithms.h"
#include "base/base.h"
#include "select/select.h"

/* The model. Ranks placed by host; a(s) = alpha + s * beta of the link's class, across
 * hosts with `share` ranks of a host sending through its NIC at once (s * beta * share):
 *
 *   pairwise  every rank posts its n-1 messages at once, all in flight together: one pays
 *             a whole latency, each other costs the rank alpha_intra of its own time
 *             (posting and completing a message: HVDL_MESSAGE_SHARE of a message
 *             within a host); the bytes at the busiest link, (n-L) L b through a host's NIC or
 *             (L-1) b within the host:
 *               (n-2) share alpha_intra + max(alpha_inter(b) + (n-L) L b beta_inter,
 *                                       alpha_intra + (L-1) b beta_intra)
 *             (one host: the second term alone; 2 ranks: one message, as Bruck's one step)
 *   bruck     steps m = 1, 2, 4, ... < n of a(c_m b), c_m the slots with bit m set; a step
 *             crosses hosts when H > 1 (rank r+m is on another host for m of a host's L
 *             ranks, for all of them from m = L), min(m, L) of a host's ranks at once
 *   hier_p2p  (H > 1 hosts of L > 1 ranks with hier_p2p's grid) two steps, each priced as
 *             pairwise's messages in flight together: within the host L-1 messages of H b,
 *               (L-2) share alpha_intra + alpha_intra + (L-1) H b beta_intra,
 *             then across H-1 messages of L b, a host's L ranks sending through its NIC,
 *               (H-2) share alpha_intra + alpha_inter(L b) + (H-1) L L b beta_inter
 *   hier_pairs (the same layouts) three steps, m = ceil((H-1)/L) the most hosts a rank
 *             carries: the gather within the host, L-1 messages of (1 + m L) b,
 *               (L-2) share alpha_intra + alpha_intra + (L-1) (1 + m L) b beta_intra,
 *             across m messages of L L b, a host's NIC carrying H-1 of them,
 *               (m-1) share alpha_intra + alpha_inter(L L b) + (H-1) L L b beta_inter,
 *             and the spread within the host, L-1 messages of m L b,
 *               (L-2) share alpha_intra + alpha_intra + (L-1) m L b beta_intra
 *
 * So Bruck's ceil(log2 n) latencies beat pairwise's n-1 message costs for small blocks on
 * many ranks, and its (n/2) log2(n) blocks lose to pairwise's n-1 for large ones. Neither
 * charges the local copies (Bruck's rotation, packing and reversal), which the simulation
 * does not charge either and which matter only where its blocks are small. */

/* hier_p2p's fail-safe margin: a candidate only where its prediction times this still beats
 * pairwise's and Bruck's. What it saves is messages (n-1 cut to L+H-2), which the model
 * prices from one simulation (HVDL_MESSAGE_SHARE); what it adds is certain: every block
 * carried twice, once within the host, in messages H or L times pairwise's, which a network
 * may serve at another rate. In the simulation (64 ranks, 8 hosts of 8, 4 KiB blocks) the
 * model put it 2 % under pairwise, and it ran 11 % over; with 64 B blocks it ran as fast as
 * pairwise, and at 256 ranks a third of SMPI's best with 1 KiB blocks, 2.2x Bruck's speed
 * with 16 B (docs/scale.md, "All-to-all"). */
#define HIER_P2P_MARGIN 1.25

/* TWO_LEVEL, the rule between the two-level algorithms: hier_pairs is the candidate where
 * every rank carries at most one host (H-1 <= L), whatever hier_p2p's prediction; hier_p2p
 * elsewhere. Where a rank carries one host, hier_pairs sends the bytes hier_p2p sends across
 * in one message a rank instead of H-1, which the model prices as a saving of a share each
 * and in the simulation was more: at 8 hosts of 8 it ran faster than hier_p2p at 4 KiB and
 * 256 KiB on all five simulated platforms of that layout (14.4 against 17.8 us and 198
 * against 236 at 100 Gb/s), where the model put it 8-11 % over. Where a rank carries several
 * hosts its messages across are fewer and m times larger than with one, and it ran slower:
 * 20.0 against hier_p2p's 17.0 us at 32 hosts of 8, 38.6 against pairwise's 34.5 at 16 hosts
 * of 4 (docs/scale.md, "All-to-all"). */

static double step(const hvdlComm_t comm, int across, int share, double s) {
  return hvdl_select_step(&comm->model, across, share, s);
}

double hvdl_select_predict_alltoall(hvdlComm_t comm, hvdlAllToAllAlgorithm_t algo, size_t block) {
  const struct hvdl_cost_model *c = &comm->model;
  const int n = comm->size, L = comm->local_size < n ? comm->local_size : n;
  const double b = (double)block;
  double t = 0;
  switch (algo) {
    case hvdlAllToAllPairwise: {
      if (n == 1) return 0;
      const double within = c->alpha[HVDL_LINK_INTRA] + (L - 1) * b * c->beta[HVDL_LINK_INTRA];
      const double across = comm->hosts > 1 ? hvdl_select_alpha_inter(c, b) +
                                                  (n - L) * b * c->beta[HVDL_LINK_INTER] * L
                                            : 0;
      return (n - 2) * HVDL_MESSAGE_SHARE * c->alpha[HVDL_LINK_INTRA] +
             (across > within ? across : within);
    }
    case hvdlAllToAllBruck:
      for (int m = 1; m < n; m *= 2) {
        int k = 0; /* the slots i < n with bit m set */
        for (int i = m; i < n; i += 2 * m) k += n - i < m ? n - i : m;
        t += step(comm, comm->hosts > 1, m < L ? m : L, k * b);
      }
      return t;
    case hvdlAllToAllHierP2p: {
      const int H = comm->hosts;
      if (!comm->hier_p2p || H <= 1 || L <= 1) return -1; /* one host or one rank a host */
      const double share = HVDL_MESSAGE_SHARE * c->alpha[HVDL_LINK_INTRA];
      const double within =
          (L - 2) * share + c->alpha[HVDL_LINK_INTRA] + (L - 1) * H * b * c->beta[HVDL_LINK_INTRA];
      const double across = (H - 2) * share + hvdl_select_alpha_inter(c, L * b) +
                            (double)(H - 1) * L * L * b * c->beta[HVDL_LINK_INTER];
      return within + across;
    }
    case hvdlAllToAllHierPairs: {
      const int H = comm->hosts;
      if (!comm->hier_p2p || H <= 1 || L <= 1) return -1; /* one host or one rank a host */
      const int m = hvdl_hier_pairs_carried(H, L, 0);     /* the most hosts a rank carries */
      const double share = HVDL_MESSAGE_SHARE * c->alpha[HVDL_LINK_INTRA];
      const double within = (L - 2) * share + c->alpha[HVDL_LINK_INTRA];
      const double gather = within + (L - 1) * (1.0 + (double)m * L) * b * c->beta[HVDL_LINK_INTRA];
      const double across = (m - 1) * share + hvdl_select_alpha_inter(c, (double)L * L * b) +
                            (double)(H - 1) * L * L * b * c->beta[HVDL_LINK_INTER];
      const double spread = within + (double)(L - 1) * m * L * b * c->beta[HVDL_LINK_INTRA];
      return gather + across + spread;
    }
    default: return -1;
  }
}

const char *hvdl_select_alltoall_cannot_run(hvdlComm_t comm, hvdlAllToAllAlgorithm_t algo,
                                            int fewest, char *why_buf, size_t why_len) {
  if (algo == hvdlAllToAllHierP2p || algo == hvdlAllToAllHierPairs)
    return hvdl_select_hier_p2p_cannot_run(comm, fewest, why_buf, why_len);
  return NULL;
}

hvdlAllToAllAlgorithm_t hvdl_select_alltoall(hvdlComm_t comm, size_t block) {
  if (comm->config.allToAllAlgorithm != hvdlAllToAllAuto)
    return (hvdlAllToAllAlgorithm_t)comm->config.allToAllAlgorithm;
  const double pairwise_t = hvdl_select_predict_alltoall(comm, hvdlAllToAllPairwise, block);
  const double bruck_t = hvdl_select_predict_alltoall(comm, hvdlAllToAllBruck, block);
  const double hier_t = hvdl_select_predict_alltoall(comm, hvdlAllToAllHierP2p, block);
  const double pairs_t = hvdl_select_predict_alltoall(comm, hvdlAllToAllHierPairs, block);
  const double best_t = bruck_t < pairwise_t ? bruck_t : pairwise_t;
  /* the two-level candidate: hier_pairs where every rank carries at most one host */
  const int by_pairs = pairs_t >= 0 && comm->hosts - 1 <= comm->local_size;
  const double two_level_t = by_pairs ? pairs_t : hier_t;
  if (two_level_t >= 0 && two_level_t * HIER_P2P_MARGIN < best_t)
    return by_pairs ? hvdlAllToAllHierPairs : hvdlAllToAllHierP2p;
  return bruck_t < pairwise_t ? hvdlAllToAllBruck : hvdlAllToAllPairwise;
}

hvdlResult_t hvdl_alltoall_run(hvdlComm_t comm, hvdlAllToAllAlgorithm_t algo, const void *sendbuff,
                               void *recvbuff, size_t block) {
  switch (algo) {
    case hvdlAllToAllPairwise: return hvdl_alltoall_pairwise(comm, sendbuff, recvbuff, block);
    case hvdlAllToAllBruck: return hvdl_alltoall_bruck(comm, sendbuff, recvbuff, block);
    case hvdlAllToAllHierP2p: return hvdl_alltoall_hier_p2p(comm, sendbuff, recvbuff, block);
    case hvdlAllToAllHierPairs: return hvdl_alltoall_hier_pairs(comm, sendbuff, recvbuff, block);
    default:
      return hvdl_fail(comm, hvdlInternalError, "all-to-all algorithm %d (%s) is not available",
                       (int)algo, hvdl_alltoall_algo_name(algo));
  }
}
