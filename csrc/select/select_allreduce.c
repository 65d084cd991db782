/*
 * select_allreduce.c -- the one all-reduce selector: which algorithm runs for a call of
 * B bytes per rank on n ranks over H hosts (at most L ranks on one).
 *
 *   1. HVD_LITE_ALLREDUCE_ALGO forced (config.allReduceAlgorithm): that one, at
 *      every size. One the layout cannot run is refused at init, saying why
 *      (cannot_run: shm without one shared segment on one host, hier without
 *      one on each of several hosts, hier_p2p without several hosts of one
 *      size).
 *   2. One host whose ranks share a segment (comm->shm, segment.c): the shared-memory
 *      path up to SHM_ALLREDUCE_MAX bytes, 1 MiB (measured, algorithms.h: the model
 *      has no shared-memory term), and at every size where its single-copy form
 *      runs (shm->cma); otherwise, above it, 3 and 4 as without the segment.
 *   3. B <= config.smallAllReduceBytes: the latency path (allreduce_small.c).
 *      Its default is the crossover measured on one host (128 KiB at 2 ranks,
 *      2 KiB beyond) and 0 across hosts (config.c).
 *   4. Otherwise the cheapest by the alpha-beta-gamma model below among ring,
 *      rd, rab and the two hierarchical all-reduces where they can run: hier
 *      (shared memory within each host, allreduce_hier.c) where ranks of
 *      several hosts share a segment on each (comm->shm with more than one
 *      host), hier_p2p (messages within each host, allreduce_hier_p2p.c) on
 *      more than one host of the same size with more than one rank each
 *      (comm->hier_p2p). Both may be candidates; without the shared-memory
 *      path (HVD_LITE_SHM=0, or the simulation) only hier_p2p is. A tie goes
 *      to the earlier of ring, rab, rd, hier, hier_p2p.
 *   5. The fail-safe rule, on more than one host, for the ring: the one
 *      candidate whose latency term grows with the ranks (2(n-1) steps, each
 *      across hosts on the slowest link), where the others take 2 log2 n at
 *      most (rab; hier_p2p fewer, rd log2 n) and stay within a bounded factor of
 *      the best schedule at mid and large sizes. The model's error is in its
 *      latencies: one number per link class for what MPI's eager and
 *      rendezvous protocols make a step function of the size, measured at a
 *      few sizes or taken from defaults written for another network. So the
 *      ring is priced with each step at the largest latency across hosts the
 *      model knows (hvdl_select_alpha_inter_max), not at its messages' own;
 *      and from FAILSAFE_RING_RANKS (16) ranks it is a candidate only when the
 *      terms across hosts were measured at init or given by a model file, and
 *      only when that worst case times FAILSAFE_RING_MARGIN (1.25) still beats
 *      the best other prediction. Why: on a cluster the defaults did not
 *      describe (docs/scale.md, 8 hosts of 8 behind a backbone, no model file)
 *      the defaults' one 2 us latency made the ring the cheapest prediction at
 *      64 ranks and 4 MiB, and it ran 6.8x SMPI's best, its 126 steps each
 *      paying 58 us; Rabenseifner and hier_p2p ran 1.0x and 0.88x. A wrong
 *      choice of a bounded algorithm costs a fraction; a wrong ring costs
 *      multiples that grow with n. Predict (hvdl_select_predict, what the
 *      tests and the simulation print) stays the nominal model.
 *   6. hier_p2p's step across hosts, for lanes up to 8 KiB on more than 2 hosts:
 *      the direct exchange instead of rd where the model prices it lower and its
 *      bytes through a NIC cost at most its latency (hier_across, direct_cost).
 *
 * The model. A message of s bytes over a link of class c costs alpha[c](s) +
 * s * beta[c] (across hosts alpha is a step function of s, below; within a host
 * one number); reducing s bytes costs s * gamma. Ranks are assumed placed by
 * host (L consecutive ranks share one), so a pairwise step with mask m < L
 * stays within a host; a step across hosts has all L ranks of a host sending
 * through its one NIC at once, so it pays L * s * beta. With B bytes per rank,
 * p the largest power of two <= n:
 *
 *   ring  2(n-1) alpha + (n-1)/n * B * (beta + max(beta, gamma)), the link the
 *         slowest on the ring (across hosts when H > 1), alpha at its message
 *         (B/n, at most a segment); its reduce-scatter overlaps reducing with
 *         receiving, segment by segment
 *   rd    sum over m = 1 .. p/2 of  alpha + B * beta * contention + B * gamma
 *   rab   sum over m of  2 alpha + 2 * B/2m * beta * contention + B/2m * gamma
 *   (rd, rab: n > p adds 2 (alpha + B beta) + B gamma, within a host; across
 *   when L = 1)
 *   hier  within a host, priced as a ring reduce-scatter and all-gather there;
 *         across, m lanes of B/m (m: the fewest ranks on a host) at once, each
 *         what a lane's own selector runs (these rules on H ranks, one a host,
 *         with beta across times m: a host's m lanes share its NIC, and comm.c
 *         gives the lanes that model), at that price (hier_lane_algorithm)
 *   hier_p2p  with `lanes` lanes (hier_lanes: L, fewer for small B): within a
 *         host one step in which each lane's holder receives its lane, B/lanes,
 *         from the other L-1 ranks at once and reduces them, priced as the
 *         holder's receiving (alpha + (L-1) * B/lanes * beta, as if it took the
 *         messages one after the other); across the H hosts, rd or rab (below)
 *         on B/lanes bytes with `lanes` ranks of a host sending at once (every
 *         step across, the fold's too); within a host again, the same step
 *         without gamma. Across: rd for lanes up to 8 KiB, rab above (a
 *         crossover measured in the simulation), and up to 8 KiB the direct
 *         exchange instead of rd by rule 6 (hier_across)
 *
 * The broadcast's selector (select_broadcast.c) and the all-gather's and
 * reduce-scatter's (select_gather.c) use the same terms and layout.
 *
 * The terms come from config.c (defaults, or HVD_LITE_COST_MODEL_FILE), and
 * where the ranks span hosts from a measurement at init (select_measure.c): a
 * ping-pong of 7 sizes between rank 0 and a rank on another host gives the terms
 * across hosts, the latency as a step function of the size (alpha[INTER] below
 * the first step; each step from its bytes up), and one between rank 0 and
 * another rank of its host (where it has one) those within. A model file's terms
 * override the measurement class by class; HVD_LITE_COST_MODEL_MEASURE=0 skips
 * it; gamma is always config.c's. Every rank must choose the same algorithm, so
 * at init rank 0's terms, forced algorithms (all-reduce, broadcast, all-gather,
 * reduce-scatter) and crossover are agreed by all (one broadcast, and a second
 * of rank 0's measured model, or of its unchanged one where the measurement
 * failed), and so is the layout: the hosts of topology.c (emulated ones
 * included) by small all-reduces, and whether a shared segment exists by
 * segment.c's own agreement. The one host split made here also gives hier_p2p its
 * groups (hvdl_hier_p2p_init). A lane of the shared-memory hierarchical path
 * (comm->cross) has one rank per host and chooses its own algorithm here, like
 * any communicator, on its parent's model (comm.c: it measures nothing).
 */
#include <stdio.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/base.h"
#include "select/select.h"
#include "transport/shm/shm.h"

static hvdlResult_t hier_p2p_allreduce(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                       size_t count, hvdlDataType_t dt, hvdlRedOp_t op);

/* The fail-safe rule (5 above). From FAILSAFE_RING_RANKS ranks across hosts the ring
 * runs only on terms measured or given, and only where its worst case beats the best
 * other prediction by FAILSAFE_RING_MARGIN. At 16 ranks its 30 steps are 3.75x
 * Rabenseifner's 8, so a latency 4x off (SMPI's default network model takes it from x2
 * to x11.6 between small and large messages) can reverse the order; and the model's
 * times have been up to 1.4x off the simulation's (docs/scale.md), most of that in the
 * latencies the ring pays 2(n-1) times. */
#define FAILSAFE_RING_RANKS  16
#define FAILSAFE_RING_MARGIN 1.25

/* The message-passing algorithms; collectives.c runs shm and hier itself. */
static hvdl_allreduce_fn algorithm(hvdlAlgorithm_t a) {
  switch (a) {
    case hvdlAlgoRing: return hvdl_allreduce_ring;
    case hvdlAlgoRecursiveDoubling: return hvdl_allreduce_rd;
    case hvdlAlgoRabenseifner: return hvdl_allreduce_rab;
    case hvdlAlgoTree: return hvdl_allreduce_tree;
    case hvdlAlgoLatency: return hvdl_allreduce_small;
    case hvdlAlgoHierP2p: return hier_p2p_allreduce;
    default: return NULL;
  }
}

/* Why the forced algorithm cannot run on comm's layout, or NULL when it can;
 * fewest: the fewest ranks on one host. why_buf holds a composed reason. */
static const char *cannot_run(const hvdlComm_t comm, int algo, int fewest, char *why_buf,
                              size_t why_len) {
  const struct hvdl_shm *s = comm->shm;
  if (comm->size == 1) return NULL; /* nothing runs: the call is a copy */
  if (algo == hvdlAlgoShm && !s)
    return comm->config.disableShm ? "the shared-memory path is off (HVD_LITE_SHM=0)"
                                   : "no two ranks share a host's segment";
  if (algo == hvdlAlgoShm && s->hosts > 1)
    return "the ranks are on more than one host (use hier or hier_p2p)";
  if (algo == hvdlAlgoHierarchical && !s)
    return comm->config.disableShm ? "it works through the shared-memory path, which is off "
                                     "(HVD_LITE_SHM=0; hier_p2p needs none)"
                                   : "no two ranks share a host's segment (hier_p2p needs none)";
  if (algo == hvdlAlgoHierarchical && s->hosts == 1) return "every rank is on one host (use shm)";
  if (algo == hvdlAlgoHierP2p)
    return hvdl_select_hier_p2p_cannot_run(comm, fewest, why_buf, why_len);
  return NULL;
}

const char *hvdl_select_hier_p2p_cannot_run(hvdlComm_t comm, int fewest, char *why_buf,
                                            size_t why_len) {
  if (comm->size == 1) return NULL;
  if (comm->hosts <= 1) {
    snprintf(why_buf, why_len,
             "all %d ranks are on one host (hosts from MPI_COMM_TYPE_SHARED, "
             "or HVD_LITE_RANKS_PER_HOST)",
             comm->size);
    return why_buf;
  }
  if (fewest != comm->local_size) {
    snprintf(why_buf, why_len,
             "the %d hosts have different numbers of ranks (%d to %d); it "
             "needs the same on each",
             comm->hosts, fewest, comm->local_size);
    return why_buf;
  }
  if (!comm->hier_p2p) return "this is a lane of the shared-memory hierarchical path";
  return NULL;
}

/* What rank 0 tells every rank at init, so that all choose alike. */
struct agreed {
  struct hvdl_cost_model model; /* rank 0's: the defaults, its model file's terms */
  int measure; /* measure the terms across hosts (1) and within (2): rank 0's knob, no file's */
  unsigned long long small;  /* config.smallAllReduceBytes */
  int algo;                  /* config.allReduceAlgorithm */
  int bcast;                 /* config.broadcastAlgorithm */
  int gather, scatter;       /* config.allGatherAlgorithm, reduceScatterAlgorithm */
  int alltoall;              /* config.allToAllAlgorithm */
  int adasum;                /* config.adasumHierarchical */
  int res;                   /* rank 0's result reading the model */
  char msg[HVDL_ERRMSG_LEN]; /* and its message */
};

hvdlResult_t hvdl_select_init(hvdlComm_t comm, int one_per_host) {
  struct agreed a;
  memset(&a, 0, sizeof a);
  if (comm->rank == 0) {
    a.res = hvdl_config_cost_model(&a.model);
    if (a.res == hvdlSuccess) a.res = hvdl_config_cost_model_measure(&a.measure);
    if (a.res != hvdlSuccess) snprintf(a.msg, sizeof a.msg, "%s", hvdlGetLastError(NULL));
    if (a.measure) /* a model file's terms override the measurement, class by class */
      a.measure = (a.model.inter_source != HVDL_MODEL_FILE ? 1 : 0) |
                  (a.model.intra_source != HVDL_MODEL_FILE ? 2 : 0);
    a.small = comm->config.smallAllReduceBytes;
    a.algo = comm->config.allReduceAlgorithm;
    a.bcast = comm->config.broadcastAlgorithm;
    a.gather = comm->config.allGatherAlgorithm;
    a.scatter = comm->config.reduceScatterAlgorithm;
    a.alltoall = comm->config.allToAllAlgorithm;
    a.adasum = comm->config.adasumHierarchical;
  }
  /* Rank 0's model file, algorithms, crossover and Adasum's form are everyone's: a choice made differently on
   * two ranks would pair them in different algorithms. */
  HVDL_MPI(comm, MPI_Bcast(&a, (int)sizeof a, MPI_BYTE, 0, comm->mpi));
  if (a.res != hvdlSuccess)
    return hvdl_fail(comm, (hvdlResult_t)a.res, "%s%s",
                     comm->rank == 0 ? "" : "on rank 0: ", a.msg);
  if (comm->size == 1) { /* one rank runs anything, a copy (as the all-reduce): no segment there */
    if (a.bcast == hvdlBcastShm) a.bcast = hvdlBcastChain;
    if (a.gather == hvdlAllGatherShm) a.gather = hvdlAllGatherRing;
    if (a.scatter == hvdlReduceScatterShm) a.scatter = hvdlReduceScatterRing;
  }
  comm->config.smallAllReduceBytes = (size_t)a.small;
  comm->config.allReduceAlgorithm = a.algo;
  comm->config.broadcastAlgorithm = a.bcast;
  comm->config.allGatherAlgorithm = a.gather;
  comm->config.reduceScatterAlgorithm = a.scatter;
  comm->config.allToAllAlgorithm = a.alltoall;
  comm->config.adasumHierarchical = a.adasum;
  comm->model = a.model;
  /* The host layout: how many hosts, the most and the fewest ranks on one, and the
   * lowest rank on another host than rank 0's (the measurement's peer); with
   * several hosts of one size, hier_p2p's groups from the same host split. */
  MPI_Comm local = MPI_COMM_NULL;
  int local_rank = 0, local_size = 1, first = comm->rank;
  hvdlResult_t res = hvdlSuccess;
  if (!one_per_host) {
    res = hvdl_local_comm(comm->mpi, &local);
    if (res != hvdlSuccess) return hvdl_fail(comm, res, "%s", hvdlGetLastError(NULL));
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_size(local, &local_size);
    const int err = MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, local);
    if (err != MPI_SUCCESS)
      res = hvdl_fail_mpi(comm, err, "MPI_Allreduce of the host's first rank");
  }
  /* sizes: the most ranks on a host, minus the fewest, minus the lowest rank off rank 0's
   * host, minus the lowest but rank 0 on it (comm->size: none) */
  int leaders = local_rank == 0;
  int sizes[4] = {local_size, -local_size, first == 0 ? -comm->size : -comm->rank,
                  first == 0 && comm->rank != 0 ? -comm->rank : -comm->size};
  int err = res == hvdlSuccess
                ? MPI_Allreduce(MPI_IN_PLACE, &leaders, 1, MPI_INT, MPI_SUM, comm->mpi)
                : MPI_SUCCESS;
  if (res == hvdlSuccess && err == MPI_SUCCESS)
    err = MPI_Allreduce(MPI_IN_PLACE, sizes, 4, MPI_INT, MPI_MAX, comm->mpi);
  if (err != MPI_SUCCESS) res = hvdl_fail_mpi(comm, err, "MPI_Allreduce of the host layout");
  comm->hosts = leaders;
  comm->local_size = sizes[0];
  const int fewest = -sizes[1], inter_peer = -sizes[2], intra_peer = -sizes[3];
  if (res == hvdlSuccess && local != MPI_COMM_NULL && leaders > 1 && fewest == sizes[0])
    res = hvdl_hier_p2p_init(comm, local, &comm->hier_p2p);
  if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
  HVDL_CHECK(res);
  /* The terms measured (select_measure.c) where the ranks span hosts: across hosts, and
   * within rank 0's where it has another rank, each unless rank 0's knob is off or its
   * model file gives that class; rank 0's result is everyone's, its defaults or file's
   * terms where a measurement failed. A lane across hosts (one_per_host) takes its
   * parent's model instead (comm.c). */
  if (a.measure && !one_per_host && comm->hosts > 1) {
    struct hvdl_cost_model m = comm->model;
    hvdl_select_measure(comm, (a.measure & 1) && inter_peer < comm->size ? inter_peer : -1,
                        (a.measure & 2) && intra_peer < comm->size ? intra_peer : -1, &m);
    HVDL_MPI(comm, MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, 0, comm->mpi));
    comm->model = m;
  }
  /* Every rank sees the same layout and comm->shm (segment.c agrees on it), so every rank
   * refuses alike; the other collectives' forced algorithms are refused by their own
   * selectors, which comm.c asks next (they call this unit's model, not the other way). */
  comm->fewest_local = fewest;
  char buf[160];
  const char *why =
      a.algo == hvdlAlgoAuto ? NULL : cannot_run(comm, a.algo, fewest, buf, sizeof buf);
  if (why)
    return hvdl_fail(comm, hvdlInvalidArgument,
                     "HVD_LITE_ALLREDUCE_ALGO=%s cannot run on this communicator of %d ranks: %s",
                     hvdl_algo_name(a.algo), comm->size, why);
  return hvdlSuccess;
}

/* rd or rab among n ranks, B bytes each; a step with mask m < within stays in a
 * host (the fold's pairs too when within > 1), the others cross hosts with
 * `share` ranks of a host at once. */
enum pairwise { PW_RD, PW_RAB };
static double pairwise_cost(const struct hvdl_cost_model *c, enum pairwise kind, int n, int within,
                            int share, double b) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  double t = 0;
  for (int m = 1; m < p; m *= 2) {
    const int across = m >= within;
    const double piece = kind == PW_RD ? b : b / (2.0 * m);
    t += hvdl_select_step(c, across, share, piece) + piece * c->gamma;
    if (kind == PW_RAB) t += hvdl_select_step(c, across, share, piece);
  }
  if (p == n) return t;
  const int fold_across = within <= 1;
  return t + 2 * hvdl_select_step(c, fold_across, share, b) + b * c->gamma;
}

/* hier_p2p's lanes for B bytes: L, or fewer (B / HIER_LANE_BYTES, at least 1)
 * when a lane would carry less than HIER_LANE_BYTES. A message across hosts
 * costs about the same from 256 B to 4 KiB in the simulation (4.0-4.7 us an
 * exchange, SMPI's size-dependent factors; docs/scale.md), so lanes smaller than
 * that buy nothing across hosts, and every lane adds a message within the host
 * to each rank. At 64 simulated ranks (hosts of 8) on 1, 2, 4 and 8 lanes: 4 KiB
 * took 19.4, 18.1, 22.1 and 23.4 us; 16 KiB 34.0, 24.4, 23.9 and 25.1; 64 KiB
 * 70.0, 53.1, 43.3 and 36.6. */
#define HIER_LANE_BYTES 2048.0
static int hier_lanes(const hvdlComm_t comm, double b) {
  const double most = b / HIER_LANE_BYTES;
  if (most >= comm->local_size) return comm->local_size;
  return most >= 1 ? (int)most : 1;
}

/* What hier_p2p runs across the hosts on lanes of B/lanes bytes, and the model's
 * time for it: recursive doubling up to HIER_RD_LANE_BYTES a lane, Rabenseifner
 * above. The model's one latency across hosts (10 us in sim/model.conf, between
 * SMPI's 4 us for small messages and 23 us for large ones) put the crossover at
 * 35 KiB lanes; the simulation at 64 ranks has it between 8 and 16 KiB (rd
 * against rab across: 16 KiB per rank 27.6 against 42.0 us, 64 KiB 45.2 against
 * 54.9, 128 KiB 97.5 against 73.8, 256 KiB 157.6 against 121.1; docs/scale.md;
 * with hier_p2p's earlier halving steps within the host, the same for both). */
#define HIER_RD_LANE_BYTES 8192.0

/* The direct exchange across (allreduce_direct.c) for the lane holders, B/lanes bytes a
 * lane: one step in which each holder posts H-1 messages of the lane, a host's `lanes`
 * holders sending through its NIC at once, each message after the first costing its sender
 * HVDL_MESSAGE_SHARE of a latency within the host, then H-1 lanes reduced:
 *   alpha_inter(lane) + (H-1) lanes lane beta_inter + (H-2) share alpha_intra + (H-1) lane gamma
 * hier_across takes it instead of rd where the model prices it lower AND its bytes through
 * the NIC cost at most its latency ((H-1) lanes lane beta_inter <= alpha_inter(lane)): the
 * fail-safe rule. beta_inter is one message's, from a ping-pong at init, and a step of many
 * small messages through a NIC at once is where it has been wrong (SMPI serves small
 * messages below a link's rate; an oversubscribed backbone is not measured at all), so the
 * direct exchange is taken only where it saves latency and its bytes cannot cost much.
 * In the simulation (64 ranks, no model file, hier_p2p with rd against direct across), where
 * the rule takes it, at 4 KiB on 8 hosts of 8 (2 lanes): 6.40 against 7.81 us on the
 * 400 Gb/s fat tree, 14.4 against 18.1 at 100 Gb/s, 24.9 against 38.3 behind the backbone,
 * 30.0 against 30.1 behind the oversubscribed one. Where it refuses it, it lost: 16 hosts of
 * 4 at 25 Gb/s (56.5 against 54.5 at 4 KiB), 8 lanes at 16 KiB (27.0 against 23.9 at
 * 100 Gb/s, 78.5 against 51.1 oversubscribed), 32 hosts of 8 on the fat tree (11.5 against
 * 10.8 at 4 KiB), though the model alone put it under rd in the first three. It also refuses
 * two the direct exchange won (80.4 against 89.3 at 10 Gb/s, 4 KiB; 9.9 against 10.5 on the fat
 * tree, 16 KiB) (docs/scale.md, "The step across"). */
static double direct_cost(const struct hvdl_cost_model *c, int hosts, int lanes, double lane,
                          int *bounded) {
  const double bytes = (double)lanes * (hosts - 1) * lane * c->beta[HVDL_LINK_INTER];
  const double alpha = hvdl_select_alpha_inter(c, lane);
  *bounded = bytes <= alpha;
  return alpha + bytes + (hosts - 2) * HVDL_MESSAGE_SHARE * c->alpha[HVDL_LINK_INTRA] +
         (hosts - 1) * lane * c->gamma;
}

static hvdlAlgorithm_t hier_across(const hvdlComm_t comm, int lanes, double b, double *cost) {
  const double lane = b / lanes;
  const int H = comm->hosts;
  if (lane > HIER_RD_LANE_BYTES) {
    if (cost) *cost = pairwise_cost(&comm->model, PW_RAB, H, 1, lanes, lane);
    return hvdlAlgoRabenseifner;
  }
  const double rd = pairwise_cost(&comm->model, PW_RD, H, 1, lanes, lane);
  int bounded = 0;
  const double direct = H > 2 ? direct_cost(&comm->model, H, lanes, lane, &bounded) : rd;
  const int take = bounded && direct < rd;
  if (cost) *cost = take ? direct : rd;
  return take ? hvdlAlgoLatency : hvdlAlgoRecursiveDoubling;
}

/* hier_p2p within a host, one way (phase 1 with gamma, phase 3 without): one
 * step, a holder receiving or sending L-1 messages of B/lanes. */
static double hier_within(const struct hvdl_cost_model *c, int L, int lanes, double b, int reduce) {
  const double moved = (L - 1) * b / lanes;
  return c->alpha[HVDL_LINK_INTRA] + moved * c->beta[HVDL_LINK_INTRA] +
         (reduce ? moved * c->gamma : 0);
}

hvdlAlgorithm_t hvdl_select_hier_p2p_across(hvdlComm_t comm, size_t bytes, int *lanes) {
  *lanes = hier_lanes(comm, (double)bytes);
  return hier_across(comm, *lanes, (double)bytes, NULL);
}

static hvdlResult_t hier_p2p_allreduce(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                       size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  int lanes;
  const hvdlAlgorithm_t across =
      hvdl_select_hier_p2p_across(comm, count * hvdl_type_size(dt), &lanes);
  return hvdl_allreduce_hier_p2p(comm, lanes, across, sendbuff, recvbuff, count, dt, op);
}

static double ring_cost(int n, double alpha, double beta, double gamma, double b) {
  const double moved = (double)(n - 1) / n * b;
  return 2.0 * (n - 1) * alpha + moved * (beta + (gamma > beta ? gamma : beta));
}

/* What the flat algorithms (ring, rd, rab, tree, small) are priced on: the model, and n
 * ranks placed by host, per_host a host on `hosts` hosts; segment is config.segmentBytes
 * (the ring's largest message). A communicator's own layout (flat_of), or a lane of the
 * shared-memory hierarchical all-reduce (hier_lane_algorithm): one rank a host. */
struct flat {
  const struct hvdl_cost_model *c;
  int n, per_host, hosts;
  size_t segment;
};

static struct flat flat_of(const hvdlComm_t comm) {
  return (struct flat){&comm->model, comm->size, comm->local_size, comm->hosts,
                       comm->config.segmentBytes};
}

/* The latency of one of the ring's steps on B bytes per rank: within a host alpha;
 * across, the step function's at the ring's message (a chunk of B/n, in segments of
 * f.segment at most), or at `worst` its largest step (the fail-safe rule). */
static double ring_alpha(struct flat f, double b, int worst) {
  if (f.hosts <= 1) return f.c->alpha[HVDL_LINK_INTRA];
  if (worst) return hvdl_select_alpha_inter_max(f.c);
  double piece = b / f.n;
  if (f.segment && piece > (double)f.segment) piece = (double)f.segment;
  return hvdl_select_alpha_inter(f.c, piece);
}

/* The nominal model of a flat algorithm on B bytes per rank; -1 for the others. */
static double flat_predict(struct flat f, hvdlAlgorithm_t algo, double b) {
  const struct hvdl_cost_model *c = f.c;
  const int n = f.n, H = f.hosts;
  const int link = H > 1 ? HVDL_LINK_INTER : HVDL_LINK_INTRA;
  switch (algo) {
    case hvdlAlgoRing: return ring_cost(n, ring_alpha(f, b, 0), c->beta[link], c->gamma, b);
    case hvdlAlgoRecursiveDoubling:
    case hvdlAlgoRabenseifner:
      /* ranks placed by host: steps with mask < per_host stay within one */
      return pairwise_cost(c, algo == hvdlAlgoRabenseifner ? PW_RAB : PW_RD, n,
                           H > 1 ? f.per_host : n, f.per_host, b);
    case hvdlAlgoTree: {
      /* up and down the binomial tree: rank 0 receives, reduces and sends B per level, across
       * hosts at the latency of a message of B (the step function), as rd's steps are priced */
      int levels = 0;
      for (int m = 1; m < n; m *= 2) levels++;
      const double alpha = H > 1 ? hvdl_select_alpha_inter(c, b) : c->alpha[HVDL_LINK_INTRA];
      return levels * (2 * alpha + b * (2 * c->beta[link] + c->gamma));
    }
    case hvdlAlgoLatency: {
      /* MPI's all-gather: about log2(n) rounds, (n-1) * B received; then (n-1) * B reduced */
      int rounds = 0;
      for (int m = 1; m < n; m *= 2) rounds++;
      return rounds * c->alpha[link] + (n - 1) * b * (c->beta[link] + c->gamma);
    }
    default: return -1;
  }
}

/* A flat algorithm's time as the selector weighs it: the nominal model, but for the ring
 * across hosts the fail-safe rule (5 above): each step at the largest latency, and from
 * FAILSAFE_RING_RANKS ranks only on terms measured or given, by FAILSAFE_RING_MARGIN;
 * -1 where it is not a candidate. */
static double flat_weighed(struct flat f, hvdlAlgorithm_t algo, double b) {
  if (algo != hvdlAlgoRing || f.hosts <= 1) return flat_predict(f, algo, b);
  const int many = f.n >= FAILSAFE_RING_RANKS;
  if (many && f.c->inter_source == HVDL_MODEL_DEFAULT) return -1;
  return ring_cost(f.n, ring_alpha(f, b, 1), f.c->beta[HVDL_LINK_INTER], f.c->gamma, b) *
         (many ? FAILSAFE_RING_MARGIN : 1.0);
}

/* The cheapest of the flat algorithms a communicator of one rank a host (a lane of hier) can
 * run, weighed as the selector weighs them; a tie goes to the earlier of ring, rab, rd, tree. */
static hvdlAlgorithm_t cheapest_flat(struct flat f, double b) {
  static const hvdlAlgorithm_t order[] = {hvdlAlgoRing, hvdlAlgoRabenseifner,
                                          hvdlAlgoRecursiveDoubling, hvdlAlgoTree};
  hvdlAlgorithm_t best = hvdlAlgoRabenseifner;
  double best_t = -1;
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    const double t = flat_weighed(f, order[i], b);
    if (t >= 0 && (best_t < 0 || t < best_t)) {
      best = order[i];
      best_t = t;
    }
  }
  return best;
}

/* hier's step across hosts (allreduce_hier.c): each of the `lanes` lane holders of a host
 * all-reduces its lane, B/lanes, on comm->cross (one rank a host), with what that
 * communicator's selector runs there on its model, this one's with beta across times the
 * lanes, since a host's lanes cross its NIC at once (comm.c): the caller's forced algorithm
 * unless it is hier or hier_p2p, else the small path up to config.smallAllReduceBytes (the
 * same on every multi-host communicator, config.c), else the cheapest of ring, rab, rd and
 * tree weighed as above. Chosen and priced here, alike on every rank, not on comm->cross,
 * which only the lane holders have; the ring's nominal price takes this communicator's
 * segment size (autotune changes it alike on every rank, here and not on the lanes). */
static hvdlAlgorithm_t hier_lane_algorithm(const hvdlComm_t comm, double b, double *cost) {
  const int lanes = comm->shm->lanes > 0 ? comm->shm->lanes : 1;
  struct hvdl_cost_model m = comm->model;
  m.beta[HVDL_LINK_INTER] *= lanes;
  const struct flat f = {&m, comm->shm->hosts, 1, comm->shm->hosts, comm->config.segmentBytes};
  const double lane = b / lanes;
  const int forced = comm->config.allReduceAlgorithm;
  hvdlAlgorithm_t pick;
  if (forced != hvdlAlgoAuto && forced != hvdlAlgoHierarchical && forced != hvdlAlgoHierP2p)
    pick = (hvdlAlgorithm_t)forced;
  else if (lane <= (double)comm->config.smallAllReduceBytes)
    pick = hvdlAlgoLatency;
  else
    pick = cheapest_flat(f, lane);
  if (cost) *cost = flat_predict(f, pick, lane);
  return pick;
}

hvdlAlgorithm_t hvdl_select_hier_lane(hvdlComm_t comm, size_t bytes) {
  if (!comm->shm || comm->shm->hosts <= 1) return hvdlAlgoAuto;
  return hier_lane_algorithm(comm, (double)bytes, NULL);
}

double hvdl_select_predict(hvdlComm_t comm, hvdlAlgorithm_t algo, size_t bytes) {
  const struct hvdl_cost_model *c = &comm->model;
  const int L = comm->local_size;
  const double b = (double)bytes;
  switch (algo) {
    case hvdlAlgoHierarchical:
      if (!comm->shm || comm->shm->hosts <= 1) return -1;
      /* within: a ring reduce-scatter and all-gather; across: the lanes at once */
      {
        double across;
        hier_lane_algorithm(comm, b, &across);
        return ring_cost(L, c->alpha[HVDL_LINK_INTRA], c->beta[HVDL_LINK_INTRA], c->gamma, b) +
               across;
      }
    case hvdlAlgoHierP2p: {
      if (!comm->hier_p2p || L <= 1) return -1;
      const int lanes = hier_lanes(comm, b);
      double across;
      hier_across(comm, lanes, b, &across);
      return hier_within(c, L, lanes, b, 1) + across + hier_within(c, L, lanes, b, 0);
    }
    default: return flat_predict(flat_of(comm), algo, b);
  }
}

hvdlAlgorithm_t hvdl_select_allreduce(hvdlComm_t comm, size_t bytes) {
  if (comm->config.allReduceAlgorithm != hvdlAlgoAuto)
    return (hvdlAlgorithm_t)comm->config.allReduceAlgorithm;
  if (comm->shm && comm->shm->hosts == 1 && (bytes <= SHM_ALLREDUCE_MAX || comm->shm->cma))
    return hvdlAlgoShm;
  if (bytes <= comm->config.smallAllReduceBytes) return hvdlAlgoLatency;
  static const hvdlAlgorithm_t order[] = {
      hvdlAlgoRing,         hvdlAlgoRabenseifner, hvdlAlgoRecursiveDoubling,
      hvdlAlgoHierarchical, hvdlAlgoHierP2p,      hvdlAlgoTree};
  hvdlAlgorithm_t best = hvdlAlgoRing;
  double best_t = -1;
  const struct flat f = flat_of(comm);
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    const hvdlAlgorithm_t a = order[i];
    const double t = a == hvdlAlgoHierarchical || a == hvdlAlgoHierP2p
                         ? hvdl_select_predict(comm, a, bytes)
                         : flat_weighed(f, a, (double)bytes);
    if (t >= 0 && (best_t < 0 || t < best_t)) {
      best = a;
      best_t = t;
    }
  }
  return best;
}

hvdlResult_t hvdl_allreduce_run(hvdlComm_t comm, hvdlAlgorithm_t algo, const void *sendbuff,
                                void *recvbuff, size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  const hvdl_allreduce_fn fn = algorithm(algo);
  if (!fn)
    return hvdl_fail(comm, hvdlInternalError, "all-reduce algorithm %d (%s) is not available",
                     (int)algo, hvdl_algo_name(algo));
  return fn(comm, sendbuff, recvbuff, count, dt, op);
}

hvdlResult_t hvdl_allreduce_selected(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                     size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  return hvdl_allreduce_run(comm, hvdl_select_allreduce(comm, count * hvdl_type_size(dt)), sendbuff,
                            recvbuff, count, dt, op);
}
