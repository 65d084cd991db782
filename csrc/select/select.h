/*
 * select.h -- the selection layer's contract: which algorithm runs a call (the
 * forced one, shared memory on one host, the crossover or the cost model), and
 * the run of the choice.
 */
#ifndef HVDL_SELECT_SELECT_H_
#define HVDL_SELECT_SELECT_H_

#include "algorithms/algorithms.h"

/* select_allreduce.c: the one all-reduce selector. hvdl_select_init (collective, at
 * communicator creation, after the shared-memory unit's) learns the host layout
 * (one_per_host: every rank is on its own host, as on a lane across hosts),
 * agrees on rank 0's cost model, crossover and forced algorithm, and refuses a
 * forced one this layout cannot run; hvdl_select_allreduce picks the algorithm
 * for bytes per rank (the same on every rank). hvdl_allreduce_run runs one of
 * the message-passing algorithms (ring, rd, rab, small, hier_p2p); collectives.c runs
 * shm and hier itself. */
hvdlResult_t hvdl_select_init(hvdlComm_t comm, int one_per_host);
hvdlAlgorithm_t hvdl_select_allreduce(hvdlComm_t comm, size_t bytes);
hvdlResult_t hvdl_allreduce_run(hvdlComm_t comm, hvdlAlgorithm_t algo, const void *sendbuff,
                                void *recvbuff, size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
/* Why the hier_p2p layout (hosts of one size, comm->hier_p2p) is not there, or NULL
 * when it is: the reason a forced hier_p2p (all-reduce, all-gather, broadcast) is
 * refused at init. fewest: the fewest ranks on one host; why_buf holds a composed
 * reason. */
const char *hvdl_select_hier_p2p_cannot_run(hvdlComm_t comm, int fewest, char *why_buf,
                                            size_t why_len);
/* The model's time for algo at bytes per rank on comm (seconds), or a negative
 * value when algo is not a candidate there or not modelled (shm). */
double hvdl_select_predict(hvdlComm_t comm, hvdlAlgorithm_t algo, size_t bytes);
/* What hier_p2p runs across hosts for bytes per rank on comm, and on how many lanes:
 * hvdlAlgoRecursiveDoubling, hvdlAlgoRabenseifner, or hvdlAlgoLatency for the direct
 * exchange (allreduce_direct.c). */
hvdlAlgorithm_t hvdl_select_hier_p2p_across(hvdlComm_t comm, size_t bytes, int *lanes);
/* What each lane of hier (allreduce_hier.c) runs across hosts for bytes per rank on comm, as
 * its own selector on comm->cross will pick it (the same on every rank), or hvdlAlgoAuto
 * where hier cannot run. */
hvdlAlgorithm_t hvdl_select_hier_lane(hvdlComm_t comm, size_t bytes);
/* The latency of a message of s bytes across hosts: the step of the model's step
 * function that s reaches (base.h), else alpha[HVDL_LINK_INTER]. */
static inline double hvdl_select_alpha_inter(const struct hvdl_cost_model *c, double s) {
  double a = c->alpha[HVDL_LINK_INTER];
  for (int i = 0; i < c->steps && s >= c->step_bytes[i]; i++) a = c->step_alpha[i];
  return a;
}
/* The largest latency across hosts the model knows, at any size: what a message
 * costs at worst (select_allreduce.c's fail-safe rule). */
static inline double hvdl_select_alpha_inter_max(const struct hvdl_cost_model *c) {
  double a = c->alpha[HVDL_LINK_INTER];
  for (int i = 0; i < c->steps; i++)
    if (c->step_alpha[i] > a) a = c->step_alpha[i];
  return a;
}
/* What one more message in flight costs the rank that posts it (posting and completing
 * it), beyond the first: a quarter of a latency within a host. In the simulation (64 ranks,
 * 8 hosts of 8, 64 B blocks) the all-to-all's pairwise schedule, 63 messages at once, took
 * 18.9 us where one message across hosts takes about 4: 0.24 us a message, a quarter of
 * the measured 1 us within a host (docs/scale.md, "All-to-all"). A whole latency a message
 * made the model pick Bruck's 26.1 us there, and on one host of 4 ranks, where pairwise's
 * 3 messages overlap and Bruck's 2 steps wait for each other. The all-to-all's schedules
 * (select_alltoall.c) and hier_p2p's direct exchange across (select_allreduce.c) use it. */
#define HVDL_MESSAGE_SHARE 0.25

/* The model's one step cost, for every collective's prediction (select_allreduce.c,
 * select_gather.c, select_broadcast.c): a message of s bytes each way, within a host
 * (alpha + s beta of the intra-host link) or across (alpha(s) + s beta share of the
 * inter-host link: `share` ranks of a host sending through its NIC at once). Inline:
 * the three selectors share it without calling one another. */
static inline double hvdl_select_step(const struct hvdl_cost_model *c, int across, int share,
                                      double s) {
  if (!across) return c->alpha[HVDL_LINK_INTRA] + s * c->beta[HVDL_LINK_INTRA];
  return hvdl_select_alpha_inter(c, s) + s * c->beta[HVDL_LINK_INTER] * share;
}
/* The selector's message-passing choice for the call, run (an hvdl_allreduce_fn: the
 * hierarchical all-reduce's lanes across hosts). */
hvdlResult_t hvdl_allreduce_selected(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                     size_t count, hvdlDataType_t dt, hvdlRedOp_t op);

/* select_measure.c: the cost model's terms measured when a communicator spanning hosts
 * is made: rank 0 ping-pongs with inter_peer (a rank on another host; -1: none) for the
 * terms across hosts, then with intra_peer (another rank of its own host; -1: none) for
 * those within; other ranks return 0 at once. On rank 0, each class measured is written
 * into m (its *_source HVDL_MODEL_MEASURED, measure_s): bit 0 of the result across,
 * bit 1 within; a class whose measurement failed (a timeout, an MPI error, an
 * implausible fit) keeps m's terms. Rank 0 then broadcasts m (hvdl_select_init), so
 * every rank agrees. Never fails, never waits past its deadline. */
int hvdl_select_measure(hvdlComm_t comm, int inter_peer, int intra_peer, struct hvdl_cost_model *m);

/* select_gather.c: the choice for a call of `bytes` in all (the all-gather's
 * result, the reduce-scatter's input; the same on every rank), the model's time
 * for one (negative if not modelled), and the run. hvdlAllGather,
 * hvdlReduceScatter and the engine's calls go through these; the scatter
 * broadcast and the ring reduce run the rings above directly. */
hvdlAllGatherAlgorithm_t hvdl_select_allgather(hvdlComm_t comm, size_t bytes);
/* Why this communicator cannot run the all-gather algorithm algo (the reason,
 * for select_allreduce.c's refusal of a forced one at init), or NULL if it can;
 * fewest: the fewest ranks on one host; why_buf holds a composed reason. */
const char *hvdl_select_allgather_cannot_run(hvdlComm_t comm, hvdlAllGatherAlgorithm_t algo,
                                             int fewest, char *why_buf, size_t why_len);
const char *hvdl_select_reducescatter_cannot_run(hvdlComm_t comm, hvdlReduceScatterAlgorithm_t algo,
                                                 int fewest, char *why_buf, size_t why_len);
double hvdl_select_predict_allgather(hvdlComm_t comm, hvdlAllGatherAlgorithm_t algo, size_t bytes);
hvdlResult_t hvdl_allgather_run(hvdlComm_t comm, hvdlAllGatherAlgorithm_t algo,
                                const void *sendbuff, void *recvbuff, const size_t *counts,
                                hvdlDataType_t dt);
hvdlReduceScatterAlgorithm_t hvdl_select_reducescatter(hvdlComm_t comm, size_t bytes);
double hvdl_select_predict_reducescatter(hvdlComm_t comm, hvdlReduceScatterAlgorithm_t algo,
                                         size_t bytes);
hvdlResult_t hvdl_reducescatter_run(hvdlComm_t comm, hvdlReduceScatterAlgorithm_t algo,
                                    const void *sendbuff, void *recvbuff, const size_t *counts,
                                    hvdlDataType_t dt, hvdlRedOp_t op);

/* select_broadcast.c: the broadcast's choice for bytes (the same on every rank), the
 * model's time for one (negative if not a candidate), why this communicator cannot
 * run a forced one (NULL if it can; fewest and why_buf as for the all-gather), and the
 * run. */
hvdlBroadcastAlgorithm_t hvdl_select_broadcast(hvdlComm_t comm, size_t bytes);
const char *hvdl_select_broadcast_cannot_run(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo,
                                             int fewest, char *why_buf, size_t why_len);
double hvdl_select_predict_broadcast(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo, size_t bytes);
hvdlResult_t hvdl_broadcast_run(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo,
                                const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, int root);

/* select_alltoall.c: the all-to-all's choice for n blocks of `block` bytes, every block
 * the same size on every rank (the same on every rank), the model's time for one
 * (negative if not a candidate), and the run (in place when sendbuff == recvbuff).
 * hvdlAllToAll and the engine's alltoall with equal splits go through these; uneven
 * blocks go to hvdl_alltoallv (pairwise). */
hvdlAllToAllAlgorithm_t hvdl_select_alltoall(hvdlComm_t comm, size_t block);
/* Why a forced all-to-all algorithm cannot run on this layout (hier_p2p without its grid),
 * or NULL. */
const char *hvdl_select_alltoall_cannot_run(hvdlComm_t comm, hvdlAllToAllAlgorithm_t algo,
                                            int fewest, char *why_buf, size_t why_len);
double hvdl_select_predict_alltoall(hvdlComm_t comm, hvdlAllToAllAlgorithm_t algo, size_t block);
hvdlResult_t hvdl_alltoall_run(hvdlComm_t comm, hvdlAllToAllAlgorithm_t algo, const void *sendbuff,
                               void *recvbuff, size_t block);

#endif /* HVDL_SELECT_SELECT_H_ */
