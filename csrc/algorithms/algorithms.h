/*
 * algorithms.h -- the algorithms layer's contract: each collective's algorithms,
 * one file per collective and schedule (allreduce_ring.c, broadcast_chain.c, ...).
 * Arguments are validated above (api/collectives.c); the selectors (select/) choose.
 */
#ifndef HVDL_ALGORITHMS_ALGORITHMS_H_
#define HVDL_ALGORITHMS_ALGORITHMS_H_

#include "base/base.h"
#include "transport/transport.h"

/* Algorithms behind hvdlAllReduce; arguments already validated, count > 0. */
hvdlResult_t hvdl_allreduce_ring(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_small(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                  size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
/* The latency path's fold (allreduce_small.c; reduce_ring.c's latency gather too): the n
 * inputs of count elements at gather, in rank order, into recvbuff,
 * ((x0 op x1) op x2) ... op x(n-1), Avg then divided by n. n >= 2. */
void hvdl_small_fold(void *recvbuff, const char *gather, size_t count, int n, hvdlDataType_t dt,
                     hvdlRedOp_t op);
/* Through the host's shared segment (segment.c), when comm->shm says one host; and the
 * hierarchical all-reduce (allreduce_hier.c), when it says several. */
hvdlResult_t hvdl_allreduce_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, hvdlRedOp_t op);
/* An all-reduce on a communicator: what the hierarchical all-reduce runs on each lane
 * across hosts (the selector's choice for the lane, passed down by its caller). */
typedef hvdlResult_t (*hvdl_allreduce_fn)(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                          size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_hier(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op,
                                 hvdl_allreduce_fn lane_allreduce);
/* A hierarchical all-reduce's phase across hosts, the caller's own: lane_fn(comm, cross, lane,
 * lo, n, dt, op, arg) reduces in place, over the group `cross` of comm (one rank per host), the
 * n elements from element lo of the buffer that this rank carries across hosts (op: Sum for
 * Avg, which is divided by the ranks afterwards). Every lane carrier calls it, with an empty
 * lane too. allreduce_hier.c calls it on comm->cross, allreduce_hier_p2p.c on its cross group. */
typedef hvdlResult_t (*hvdl_lane_fn)(hvdlComm_t comm, const struct hvdl_group *cross, void *lane,
                                     size_t lo, size_t n, hvdlDataType_t dt, hvdlRedOp_t op,
                                     void *arg);
hvdlResult_t hvdl_allreduce_hier_lanes(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                       size_t count, hvdlDataType_t dt, hvdlRedOp_t op,
                                       hvdl_lane_fn lane_fn, void *arg);
hvdlResult_t hvdl_allreduce_rd(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                               hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_rab(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_tree(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op);

/* allreduce_hier_p2p.c: the hierarchical all-reduce over point-to-point
 * messages (HVD_LITE_ALLREDUCE_ALGO=hier_p2p). hvdl_hier_p2p_init (collective
 * over comm, at communicator creation, called by select_allreduce.c where every host has
 * the same number of ranks) makes *out, this rank's groups, from `local` (this
 * rank's host, topology.c's hvdl_local_comm); freed with hvdl_hier_p2p_free. The
 * algorithm cuts the buffer into `lanes` lanes (1 to the ranks on a host) and
 * all-reduces each across hosts with `across` (rd or rab). */
struct hvdl_hier_p2p;
hvdlResult_t hvdl_hier_p2p_init(hvdlComm_t comm, MPI_Comm local, struct hvdl_hier_p2p **out);
void hvdl_hier_p2p_free(struct hvdl_hier_p2p *h);
hvdlResult_t hvdl_allreduce_hier_p2p(hvdlComm_t comm, int lanes, hvdlAlgorithm_t across,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op);
/* The same with L lanes (one per local rank) and the caller's phase across hosts. */
hvdlResult_t hvdl_allreduce_hier_p2p_lanes(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                           size_t count, hvdlDataType_t dt, hvdlRedOp_t op,
                                           hvdl_lane_fn lane_fn, void *arg);
/* This rank's host, as a group. */
const struct hvdl_group *hvdl_hier_p2p_local(const struct hvdl_hier_p2p *h);
/* Every host's ranks: H hosts numbered by their lowest ranks, in order, of L ranks each;
 * local rank i of host g (its i-th lowest) is ranks[g * L + i], and slot[r] = g * L + i
 * for that rank r; this rank is local rank `local` of host `host`. */
struct hvdl_host_grid {
  int hosts, per_host, host, local;
  const int *ranks, *slot;
};
const struct hvdl_host_grid *hvdl_hier_p2p_grid(const struct hvdl_hier_p2p *h);
/* The rank of local rank i of host `host` (taken mod H). */
int hvdl_grid_rank(const struct hvdl_host_grid *g, int host, int i);
/* The run of consecutive ranks of host `host` from its local rank i: its blocks' elements
 * [*at, *at + *len) of a buffer of blocks in rank order (counts[k] elements of rank k);
 * returns the local rank past the run. A host's ranks are one run when placed by host. */
int hvdl_grid_run(const struct hvdl_host_grid *g, const size_t *counts, int host, int i, size_t *at,
                  size_t *len);

/* Adasum (allreduce_adasum.c; hvdl.h's hvdlAdasum): the buffer holds ntensors tensors of
 * counts[t] elements one after another, each with its own dot product and norms; dt is
 * float16, bfloat16, float32 or float64; sendbuff may be recvbuff. hvdl_adasum_group
 * combines a group's members; hvdl_allreduce_adasum the communicator's ranks, or with
 * config.adasumHierarchical averages within each host and combines the hosts. */
hvdlResult_t hvdl_adasum_group(hvdlComm_t comm, const struct hvdl_group *g, const void *sendbuff,
                               void *recvbuff, const size_t *counts, int ntensors,
                               hvdlDataType_t dt);
hvdlResult_t hvdl_allreduce_adasum(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                   const size_t *counts, int ntensors, hvdlDataType_t dt);

/* The selector takes the shared-memory path on one host up to SHM_ALLREDUCE_MAX bytes per
 * rank. Shared memory beats the ring on a buffer that is in the cache (tools/shm_vs_ring.py,
 * 2 ranks: 0.68-0.81x its time from 64 KiB to 1 MiB) and loses from 2 MiB (1.04-1.64x); on
 * a buffer that is not (ResNet-50's fused step, whose buffers come from memory) it saves
 * less, as it copies more than the ring does through MPI's single copy. Measured through the
 * engine, builds alternating (docs/benchmarks-history.md, "Shared memory against the ring"): up to
 * 1 MiB the numpy API's 1 MiB all-reduce went from 1.15-1.28x MPI's time to 0.82-0.95x (8
 * rounds) and the fused step's median stayed at 1.04x the best MPI's (10 rounds); up to 2 MiB
 * the 2 MiB all-reduce went from 1.08-1.13x to 1.34-1.55x. */
#ifndef SHM_ALLREDUCE_MAX /* settable at build time (-DSHM_ALLREDUCE_MAX=...), to measure it again */
#define SHM_ALLREDUCE_MAX ((size_t)1 << 20)
#endif
/* Above SHM_CMA_MIN bytes per rank the shared-memory path takes its single-copy form
 * (allreduce_shm.c: reads the peers' own buffers, writes the result into them) where every
 * local rank can (hvdl_shm.cma); the selector then takes the path at every size on one host.
 * At 2 ranks (tools/shm_vs_ring.py, docs/benchmarks-history.md "The single-copy form"): at 32 KiB it
 * and the areas were alike (0.49-0.54x MPI's time, in the cache and from the L3); at 64 KiB -
 * 1 MiB in the cache it took 0.38-0.44x against the areas' 0.60-0.77x, from the L3 0.67-0.72x
 * against 0.59-0.76x (the areas ahead at 64-128 KiB); through the engine, with 32 KiB instead
 * of 1 MiB, ResNet-50's step went from 0.74-0.75x MPI's time to 0.68-0.72x and the numpy API's
 * 64 KiB - 1 MiB from 0.83-0.97x to 0.38-0.57x. */
#ifndef SHM_CMA_MIN /* settable at build time, to measure it again */
#define SHM_CMA_MIN ((size_t)32 << 10)
#endif
/* Above SHM_ALLGATHER_MIN bytes in all (the result) the all-gather's selector takes the
 * single-copy all-gather (allgather_shm.c) where it can run; up to it, with every rank on
 * one host, the one-step all-gather through the segment's areas. At 2 ranks, C API, against
 * the ring in the same window (docs/benchmarks-history.md, "The single-copy all-gather"): the single
 * copy at 8 B - 1 KiB took 1.2-1.8x the ring's time under Open MPI, 1.0-1.2x under MPICH (its
 * two steps and a system call against one message); at 4 KiB 0.96-1.02x and 0.94-1.01x; at
 * 16 KiB 0.61-0.67x and 0.60x; above, 0.73-0.99x and 0.63-0.99x. The one step took about
 * 0.5-0.6x the ring's time at 8 B - 4 KiB ("The one-step all-gather"). */
#ifndef SHM_ALLGATHER_MIN /* settable at build time, to measure it again */
#define SHM_ALLGATHER_MIN ((size_t)4 << 10)
#endif

/* Above SHM_REDUCESCATTER_MIN bytes in all (the input) the reduce-scatter's selector takes
 * the single-copy reduce-scatter (reducescatter_shm.c) where it can run. At 2 ranks, C API,
 * Open MPI, against the ring forced in the same window, four runs (docs/benchmarks-history.md, "The
 * single-copy reduce-scatter"): 1.2-1.6x the ring's time at 1-2 KiB (two steps and a system
 * call against one message), 0.96-1.39x at 4 KiB, 0.62-0.95x at 8-64 KiB, 0.89-1.09x at
 * 128-512 KiB, 0.66-1.07x from 1 MiB to 16 MiB, and 0.90-1.30x at 32-64 MiB. */
#ifndef SHM_REDUCESCATTER_MIN /* settable at build time, to measure it again */
#define SHM_REDUCESCATTER_MIN ((size_t)4 << 10)
#endif

/* Above SHM_BROADCAST_MIN bytes and up to SHM_BROADCAST_MAX the broadcast's selector takes
 * the single-copy broadcast (broadcast_shm.c) where it can run. At 2 ranks, C API, Open MPI,
 * against the chain forced in the same window, four runs (docs/benchmarks-history.md, "The
 * single-copy broadcast"): 1.05-1.24x the chain's time at 1-2 KiB, 0.68-0.91x at 4-32 KiB,
 * 0.79-1.08x at 64-512 KiB, and 0.79-1.38x from 1 MiB to 64 MiB, where the chain's one
 * message is itself a single copy (Open MPI's smsc/cma) and the two take turns. */
#ifndef SHM_BROADCAST_MIN /* settable at build time, to measure it again */
#define SHM_BROADCAST_MIN ((size_t)2 << 10)
#endif
#ifndef SHM_BROADCAST_MAX
#define SHM_BROADCAST_MAX ((size_t)512 << 10)
#endif

/* Variable-size ring collectives (allgather_ring.c, reducescatter_ring.c). Rank k's block
 * has counts[k] elements (any may be 0) and starts at element counts[0] + ... +
 * counts[k-1] of the whole buffer; every rank passes the same counts.
 * allgatherv: rank r contributes counts[r] elements from sendbuff; every rank
 * receives all blocks in recvbuff. In-place when sendbuff is rank r's block of
 * recvbuff.
 * reducescatterv: sendbuff holds the whole buffer on every rank; rank r receives
 * the reduction of block r in recvbuff (counts[r] elements; Avg divides by the
 * number of ranks). In-place when recvbuff is block r of sendbuff.
 * Any other overlap of the buffers is the caller's error. */
hvdlResult_t hvdl_allgatherv(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                             const size_t *counts, hvdlDataType_t dt);
hvdlResult_t hvdl_reducescatterv(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op);
/* The same calls by recursive doubling (allgather_rd.c; far_first: rd_far) and
 * recursive halving (reducescatter_halving.c). */
hvdlResult_t hvdl_allgatherv_rd(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                const size_t *counts, hvdlDataType_t dt, int far_first);
hvdlResult_t hvdl_reducescatterv_halving(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                         const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op);
/* The two-level all-gather and reduce-scatter over messages (allgather_hier_p2p.c,
 * reducescatter_hier_p2p.c), on comm->hier_p2p's grid (several hosts of the same size;
 * the selector's to check). */
hvdlResult_t hvdl_allgatherv_hier_p2p(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                      const size_t *counts, hvdlDataType_t dt);
hvdlResult_t hvdl_reducescatterv_hier_p2p(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                          const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op);
/* The all-gather of ranks all on one host (allgather_shm.c): in one step through the
 * segment's areas up to SHM_ALLGATHER_MIN bytes in all where that fits an area, else the
 * single copy, which needs comm->shm->cma (the selector's to check). */
hvdlResult_t hvdl_allgatherv_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 const size_t *counts, hvdlDataType_t dt);
/* The reduce-scatter of ranks all on one host (reducescatter_shm.c): the single copy,
 * which needs comm->shm->cma (the selector's to check). */
hvdlResult_t hvdl_reducescatterv_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                     const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op);

/* Algorithms behind hvdlBroadcast and hvdlReduce; arguments already validated,
 * count > 0, more than one rank. recvbuff of hvdl_reduce_root is used on root only;
 * `latency` picks the latency path's gather (as the all-reduce's latency path
 * would reduce), else the ring's reduce-scatter + gather (as the ring would). */
hvdlResult_t hvdl_broadcast_chain(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                  size_t count, hvdlDataType_t dt, int root);
hvdlResult_t hvdl_broadcast_tree(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, int root);
hvdlResult_t hvdl_broadcast_scatter(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                    size_t count, hvdlDataType_t dt, int root);
/* The two-level broadcast over messages (broadcast_hier_p2p.c), on comm->hier_p2p's grid
 * (several hosts of the same size; the selector's to check): k-nomial trees of radix
 * `across` (2 or more) among one rank a host and of radix `within` in each host. */
hvdlResult_t hvdl_broadcast_hier_p2p(hvdlComm_t comm, int across, int within, const void *sendbuff,
                                     void *recvbuff, size_t count, hvdlDataType_t dt, int root);
/* The broadcast of ranks all on one host (broadcast_shm.c): the single copy, which
 * needs comm->shm->cma (the selector's to check). */
hvdlResult_t hvdl_broadcast_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, int root);

hvdlResult_t hvdl_reduce_root(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                              hvdlDataType_t dt, hvdlRedOp_t op, int root, int latency);

/* All-to-all with byte counts and displacements per rank (alltoall_pairwise.c); the
 * buffers must not overlap. */
hvdlResult_t hvdl_alltoallv(hvdlComm_t comm, const void *send, const int *scounts,
                            const int *sdispls, void *recv, const int *rcounts, const int *rdispls);
/* All-to-all of n blocks of `block` bytes each way (block q of sendbuff to rank q, block q of
 * recvbuff from it; at most 2 GiB per rank, the caller's check), pairwise
 * (alltoall_pairwise.c), by Bruck's schedule (alltoall_bruck.c), in two levels over
 * hier_p2p's grid (alltoall_hier_p2p.c) or by host pairs over it (alltoall_hier_pairs.c).
 * In place when sendbuff == recvbuff; any other overlap is the caller's error. */
hvdlResult_t hvdl_alltoall_pairwise(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                    size_t block);
hvdlResult_t hvdl_alltoall_bruck(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t block);
hvdlResult_t hvdl_alltoall_hier_p2p(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                    size_t block);
hvdlResult_t hvdl_alltoall_hier_pairs(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                      size_t block);
/* How many hosts local rank j carries in hier_pairs on H hosts of L ranks (local rank 0 the
 * most: ceil((H-1)/L)). */
int hvdl_hier_pairs_carried(int H, int L, int j);

/* ---- allreduce_rab.c and allreduce_rd.c over a group (transport.h's struct hvdl_group),
 * for the hierarchical all-reduce over messages (allreduce_hier_p2p.c) ---- */

/* Recursive halving and doubling (allreduce_rab.c) in two halves, for the
 * hierarchical all-reduce. count is cut into `blocks` blocks (base.h's even cut, hvdl_block_start; a
 * power of two <= f.p, set by the caller; 0 or more than f.p: f.p). The steps
 * with mask m < f.p / blocks move whole buffers, a binomial reduce: the rank
 * with bit m set hands its partial to its partner and stops (holds = 0); the
 * others halve as rab does. hvdl_rab_reduce_scatter leaves a holding rank's
 * range of blocks, [lo[steps], hi[steps]), reduced over the group (Avg not
 * divided) in recvbuff; a rank folded out (f.vrank < 0) only hands its input
 * over. hvdl_rab_all_gather (the same plan) undoes every step, bringing every
 * block to every member. Between the two a caller may change the held range's
 * bytes (all holders of it alike). Every block's reduction is the same
 * balanced tree whatever `blocks` is. */
struct hvdl_halving {
  int blocks; /* in: how many blocks, out: as used */
  struct hvdl_fold f;
  int steps, holds;
  int lo[PAIR_MAX_STEPS + 1], hi[PAIR_MAX_STEPS + 1];
};
hvdlResult_t hvdl_rab_reduce_scatter(hvdlComm_t comm, const struct hvdl_group *g,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op, struct hvdl_halving *h);
hvdlResult_t hvdl_rab_all_gather(hvdlComm_t comm, const struct hvdl_group *g, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, const struct hvdl_halving *h);

/* rd and rab over a group (Avg divides by g->divisor). */
hvdlResult_t hvdl_allreduce_rd_group(hvdlComm_t comm, const struct hvdl_group *g,
                                     const void *sendbuff, void *recvbuff, size_t count,
                                     hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_rab_group(hvdlComm_t comm, const struct hvdl_group *g,
                                      const void *sendbuff, void *recvbuff, size_t count,
                                      hvdlDataType_t dt, hvdlRedOp_t op);
/* The direct exchange over a group (allreduce_direct.c): every member's input to every
 * other in one step, each member combining all of them in rd's tree (Avg divides by
 * g->divisor). hier_p2p's step across hosts where select_allreduce.c prefers it to rd. */
hvdlResult_t hvdl_allreduce_direct_group(hvdlComm_t comm, const struct hvdl_group *g,
                                         const void *sendbuff, void *recvbuff, size_t count,
                                         hvdlDataType_t dt, hvdlRedOp_t op);

#endif /* HVDL_ALGORITHMS_ALGORITHMS_H_ */
