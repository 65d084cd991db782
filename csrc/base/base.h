/*
 * base.h -- the base layer's contract, below every other: the communicator struct,
 * results and the checking macros (errors.c), fault points, the clock, types and
 * scratch memory, the bulk copy, the one way to wait (wait.c), every HVD_LITE_*
 * variable (config.c) and the host layout (topology.c).
 */
#ifndef HVDL_BASE_BASE_H_
#define HVDL_BASE_BASE_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "hvdl.h"

#define HVDL_ERRMSG_LEN 512

/* Scratch that lives as long as the communicator, grown on demand and reused. */
struct hvdl_scratch {
  char *tmp; /* pipeline.c: PIPE_WINDOW receive segments of the reducing verbs */
  size_t tmp_bytes;
  char *gather; /* latency path: n * small_bytes */
  size_t gather_bytes;
  char *sreq; /* pipeline.c: MPI_Request[2][cap], sends of the two most recent steps */
  size_t sreq_bytes;
  char *stage; /* reduce-scatter: the partials being forwarded, two blocks (the
                         * ring), or the partial of the whole buffer (halving); Adasum
                         * (allreduce_adasum.c): the partner's values */
  size_t stage_bytes;
  char *block; /* reduce: a non-root rank's reduced block */
  size_t block_bytes;
  char *counts; /* reduce, scatter broadcast: size_t[n], the blocks */
  size_t counts_bytes;
  char *work; /* pairwise all-reduces (allreduce_rd.c, allreduce_rab.c) and the
                         * halving reduce-scatter: the partner's data; the all-to-all:
                         * Bruck's packed blocks, pairwise's copy of an in-place input */
  size_t work_bytes;
};

/* The all-reduce cost model (select_allreduce.c): per link class, a message's latency
 * alpha (s) and the time per byte beta (s/B); gamma, the time per byte reduced.
 * Across hosts the latency may be a step function of the message's size (MPI's eager
 * and rendezvous protocols): from step_bytes[i] bytes up (ascending) it is
 * step_alpha[i], below step_bytes[0] alpha[HVDL_LINK_INTER]. Filled by config.c
 * (defaults, HVD_LITE_COST_MODEL_FILE) or measured at init (select_measure.c);
 * rank 0's is everyone's. inter_source and intra_source say where the terms across
 * hosts and within one came from (gamma is always config.c's). */
enum hvdl_link { HVDL_LINK_INTRA = 0, HVDL_LINK_INTER = 1 };
#define HVDL_ALPHA_STEPS 8
enum hvdl_model_source {
  HVDL_MODEL_DEFAULT = 0, /* config.c's defaults: a guess for an unknown network */
  HVDL_MODEL_FILE,        /* HVD_LITE_COST_MODEL_FILE named one of them */
  HVDL_MODEL_MEASURED     /* hvdlCommInitMpi's ping-pong between two hosts */
};
struct hvdl_cost_model {
  double alpha[2], beta[2], gamma;
  int steps; /* the steps of the latency across hosts in use, 0 .. HVDL_ALPHA_STEPS */
  double step_bytes[HVDL_ALPHA_STEPS], step_alpha[HVDL_ALPHA_STEPS];
  int inter_source, intra_source; /* enum hvdl_model_source of the terms across, within */
  double measure_s;               /* HVDL_MODEL_MEASURED: how long rank 0's measurement took (s) */
  char measure_error[2][192];     /* per class (hvdl_link): why its measurement failed, or "" */
};

/* Fault injection, a testing aid (docs/design.md, "Failures"): where a rank can be
 * made to fail. armed[p] = n > 0 fails the n-th next time point p is reached. */
enum hvdl_fault_point {
  HVDL_FAULT_ALLOC,
  HVDL_FAULT_SEND,
  HVDL_FAULT_RECV,
  HVDL_FAULT_NEGOTIATE,
  HVDL_FAULT_STALL,
  HVDL_FAULT_EXIT,
  HVDL_FAULT_ADAPTER,
  HVDL_FAULT_KILL,
  HVDL_FAULT_POINTS
};
struct hvdl_faults {
  atomic_int armed[HVDL_FAULT_POINTS];
};

struct hvdlComm {
  MPI_Comm mpi; /* private duplicate of the caller's communicator */
  int rank;
  int size;
  int broken; /* set after a failure mid-collective */
  hvdlConfig_t config;
  struct hvdl_scratch scratch;
  double phase_time[3]; /* last ring: start, end of reduce-scatter, end (for the timeline) */
  /* Called while wait.c polls, with the seconds the wait has lasted; a result other
   * than hvdlSuccess ends the wait with it (the engine: notifications, and alarms
   * from other ranks). */
  hvdlResult_t (*watch)(void *arg, double waited);
  void *watch_arg;
  double data_timeout;        /* a wait in which nothing completes for this long fails (0: never) */
  int wait_peer;              /* the rank the current wait is for, where the algorithm knows (-1) */
  int *rank_names;            /* for messages: each rank's number in the communicator this one
                          * serves (a lane's, allreduce_hier.c), or NULL: its own */
  struct hvdl_faults *faults; /* NULL unless faults are injected */
  struct hvdl_shm *shm; /* segment.c: the segment shared with this host's ranks; NULL when there is
                          * none (HVD_LITE_SHM=0, or no host has two ranks) */
  hvdlComm_t cross;     /* allreduce_hier.c: this local rank's peers on the other hosts (a
                          * lane); NULL on one host and on local ranks that carry no lane */
  struct hvdl_cost_model model; /* select_allreduce.c: agreed by every rank at init */
  int hosts, local_size; /* select_allreduce.c: hosts, and the most ranks on one of them (the host
                          * layout of topology.c, emulated hosts included) */
  int fewest_local;      /* select_allreduce.c: the fewest ranks on one host */
  struct hvdl_hier_p2p *hier_p2p;     /* allreduce_hier_p2p.c: this rank's groups within and across
                          * hosts; NULL unless several hosts have the same number of ranks */
  struct hvdl_cuda_stage *cuda_stage; /* cuda.c: pinned chunks for device buffers, or NULL */
  int ft;              /* failed.c: the MPI reports dead ranks (ULFM), and waits ask it */
  hvdlComm_t ft_top;   /* failed.c: the communicator whose failures this one's waits watch
                          (a lane's: the one it serves); NULL: this one */
  MPI_Request *parked; /* sends of failed collectives, released when the communicator is renewed */
  int nparked, parked_cap;
  char last_error[HVDL_ERRMSG_LEN];
};

/* Records a formatted message on comm (or the thread's own slot if comm is NULL)
 * and returns res, so that a failure site reads `return hvdl_fail(...)`. */
hvdlResult_t hvdl_fail(hvdlComm_t comm, hvdlResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Converts an MPI error code into hvdlSystemError with MPI's own text. */
hvdlResult_t hvdl_fail_mpi(hvdlComm_t comm, int mpi_err, const char *what);

/* Propagates a failing result code. */
#define HVDL_CHECK(call)                            \
  do {                                              \
    hvdlResult_t hvdl_res_ = (call);                \
    if (hvdl_res_ != hvdlSuccess) return hvdl_res_; \
  } while (0)

/* Runs an MPI call; on failure records the call's text and returns hvdlSystemError. */
#define HVDL_MPI(comm, call)                                                              \
  do {                                                                                    \
    int hvdl_mpi_err_ = (call);                                                           \
    if (hvdl_mpi_err_ != MPI_SUCCESS) return hvdl_fail_mpi((comm), hvdl_mpi_err_, #call); \
  } while (0)

/* Everything the engine is tuned by; filled from HVD_LITE_* by config.c. */
struct hvdl_engine_config {
  hvdlConfig_t comm;       /* ring segment, latency-path crossover */
  size_t fusion_threshold; /* HVD_LITE_FUSION_THRESHOLD, bytes; 0 disables fusion */
  double cycle_time_ms;    /* HVD_LITE_CYCLE_TIME: least time between two rounds */
  double batch_time_ms;    /* HVD_LITE_BATCH_TIME: how long a burst of submissions may pause */
  double notify_time_ms;   /* HVD_LITE_NOTIFY_TIME: how long a completion may go unannounced */
  double stall_check_s;    /* HVD_LITE_STALL_CHECK_TIME_SECONDS; 0 disables the warning */
  double stall_shutdown_s; /* HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS; 0 = wait forever */
  size_t cache_capacity;   /* HVD_LITE_CACHE_CAPACITY: response cache entries; 0 disables */
  char timeline[4096];     /* HVD_LITE_TIMELINE: Chrome-trace file written by rank 0 */
  double data_timeout_s;   /* HVD_LITE_DATA_TIMEOUT_SECONDS; 0 = a data phase may wait forever */
  size_t
      fast_path_bytes; /* HVD_LITE_FAST_PATH_BYTES: the most a waiting caller executes itself; 0: never */
  /* HVD_LITE_FAULT (a testing aid): point@rank#n, up to 16 of them */
  struct {
    int point, rank, n;
  } faults[16];
  int nfaults;
  int log_level; /* HVD_LITE_LOG_LEVEL: enum hvdl_log_level */
  /* HVD_LITE_AUTOTUNE (csrc/engine/autotune.c): rank 0 tunes the parameters below online */
  int autotune;
  unsigned autotune_fixed; /* bit p (enum hvdl_tune_param): the user set it, so it stays as set */
  int autotune_warmup; /* HVD_LITE_AUTOTUNE_WARMUP_SAMPLES: samples measured and dropped first */
  int autotune_steps;  /* HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE: training steps in a sample */
  char autotune_log[4096]; /* HVD_LITE_AUTOTUNE_LOG: rank 0's CSV of samples and the choice */
};

/* The parameters the autotuner may change, in the order it tunes them. */
enum hvdl_tune_param {
  HVDL_TUNE_FUSION,
  HVDL_TUNE_SEGMENT,
  HVDL_TUNE_BATCH,
  HVDL_TUNE_CYCLE,
  HVDL_TUNE_PARAMS
};

enum hvdl_log_level {
  HVDL_LOG_TRACE = 0,
  HVDL_LOG_DEBUG,
  HVDL_LOG_INFO,
  HVDL_LOG_WARNING,
  HVDL_LOG_ERROR,
  HVDL_LOG_FATAL
};

hvdlResult_t hvdl_engine_config_default(struct hvdl_engine_config *c);
/* At info level, the configuration on stderr (rank 0, at the engine's start). */
void hvdl_engine_config_print(const struct hvdl_engine_config *cfg, int nranks,
                              const hvdlConfig_t *comm);
/* Parses one HVD_LITE_FAULT-style spec ("point@rank#n,...") into c->faults. */
hvdlResult_t hvdl_config_faults(struct hvdl_engine_config *c, const char *spec);
hvdlResult_t hvdl_config_check(const hvdlConfig_t *c);
/* The shared-memory path's chunk when hvdlConfig_t.shmBytes is 0. */
size_t hvdl_shm_bytes_default(void);
/* HVD_LITE_RANKS_PER_HOST (a testing aid): k > 0 splits each host's ranks into
 * hosts of k consecutive ranks (topology.c); 0 when unset. */
hvdlResult_t hvdl_config_ranks_per_host(int *k);
/* The most bytes per rank the latency path takes (HVD_LITE_SMALL_ALLREDUCE_BYTES's
 * maximum; its all-gather holds n times as much). */
#define HVDL_SMALL_BYTES_MAX ((size_t)1 << 26)
/* The latency-path crossover for this many ranks on this many hosts. */
size_t hvdl_small_bytes_default(int nranks, int hosts);
/* The cost model: the defaults, then HVD_LITE_COST_MODEL_FILE's values over them. */
hvdlResult_t hvdl_config_cost_model(struct hvdl_cost_model *m);
/* HVD_LITE_COST_MODEL_MEASURE: 1 (the default) measures the model's terms at communicator
 * creation when the ranks span hosts, each class (across hosts, within one) that no model
 * file gives; 0 skips it. */
hvdlResult_t hvdl_config_cost_model_measure(int *on);
/* HVD_LITE_ALLREDUCE_ALGO's spelling of an algorithm, and back (-1 if none). */
const char *hvdl_algo_name(int algo);
int hvdl_algo_parse(const char *name);
/* The same for HVD_LITE_BROADCAST_ALGO's (an hvdlBroadcastAlgorithm_t). */
const char *hvdl_bcast_algo_name(int algo);
/* And HVD_LITE_ALLGATHER_ALGO's, HVD_LITE_REDUCESCATTER_ALGO's. */
const char *hvdl_allgather_algo_name(int algo);
const char *hvdl_reducescatter_algo_name(int algo);
/* And HVD_LITE_ALLTOALL_ALGO's (an hvdlAllToAllAlgorithm_t). */
const char *hvdl_alltoall_algo_name(int algo);

/* wait.c: how a waiter polls MPI requests. It spins for `spin` seconds (with
 * sched_yield between polls if `yield` and the thread yields in spins: see
 * hvdl_wait_yield_in_spins), then sleeps between polls, from
 * `first_sleep` doubling up to `max_sleep`, or up to `long_sleep` once it has
 * waited `long_after` (0: never), and past that up to 2 % of the time waited
 * (at most 50 ms); `waited_before` counts as time waited already (no spin then). A `bounded` wait fails when nothing completes
 * for comm->data_timeout (the data phases: every rank is inside the collective). */
struct hvdl_wait_limits {
  double spin;
  int yield;
  double first_sleep, max_sleep;
  double long_after, long_sleep;
  int bounded;
  double waited_before; /* a wait that goes on with an earlier one: counted as waited already */
};
/* Whether the calling thread's spins yield the core (limits with `yield`): only the
 * engine thread's do (engine.c), which shares a core with its process's training
 * thread. A thread waiting in a synchronous call is that training thread; its yield
 * would give the core to another process, and on a loaded machine sched_yield
 * returns a time slice later (ms). Off by default. */
void hvdl_wait_yield_in_spins(int on);
/* Whether this host runs more ranks than the CPUs they may run on: then every waiting
 * thread's spins yield, since the peer it waits for may be waiting for its core (as MPI's
 * own waits do then). Each communicator made tells it its host's ranks and CPUs
 * (hvdl_host_cpus); once one had more ranks than CPUs it stays set for the process. */
void hvdl_note_host_cpus(int ranks, int cpus);
int hvdl_oversubscribed(void);
/* A condition to wait for. test sets *done (an error it returns ends the wait);
 * progress is a count that grows whenever the wait moves on (requests completed, a
 * peer's step or heartbeat), start its value when the wait begins; progress may
 * set comm->wait_peer to the peer the wait is for. */
struct hvdl_poll {
  hvdlResult_t (*test)(hvdlComm_t comm, void *arg, int *done);
  uint64_t (*progress)(hvdlComm_t comm, void *arg);
  void *arg;
  uint64_t start;
};
/* Polls p until it is done, with comm->watch between polls and the limits' sleeps;
 * hvdlRemoteError when its progress has not grown for comm->data_timeout (bounded
 * limits), or what test or comm->watch returned. hvdl_wait_data: with the data
 * phases' limits. */
hvdlResult_t hvdl_wait_until(hvdlComm_t comm, const struct hvdl_poll *p,
                             const struct hvdl_wait_limits *limits);
hvdlResult_t hvdl_wait_data(hvdlComm_t comm, const struct hvdl_poll *p);
/* Polls until all n requests are done (comm->watch between polls); returns
 * hvdlSystemError on an MPI error, hvdlRemoteError when nothing completes for
 * comm->data_timeout, or what comm->watch returned. On failure the requests are
 * left as they are: a caller that owns point-to-point requests abandons them. */
hvdlResult_t hvdl_wait_requests(hvdlComm_t comm, int n, MPI_Request *reqs,
                                const struct hvdl_wait_limits *limits);
/* The same with the data phases' limits (every rank is inside the collective);
 * hvdl_wait_peer when every request is with one peer (named if it stays silent). */
hvdlResult_t hvdl_wait_all(hvdlComm_t comm, int n, MPI_Request *reqs);
hvdlResult_t hvdl_wait_peer(hvdlComm_t comm, int peer, int n, MPI_Request *reqs);
/* Releases the point-to-point requests of a failed collective. Receives
 * (`receives`) are cancelled, then given until `until` (hvdl_now() time;
 * HVDL_ABANDON_GRACE from the failure) to finish (a matched message finishes),
 * then freed. Sends cannot be cancelled, and a late peer may still match one and
 * read its buffer, so they are parked on the communicator until hvdl_comm_renew,
 * when every rank has left the failed collective. Never for collective requests:
 * MPI forbids cancelling them; they are left to the old communicator. */
#define HVDL_ABANDON_GRACE 1.0
void hvdl_abandon(hvdlComm_t comm, int n, MPI_Request *reqs, int receives, double until);
/* The sleep after `sleep` (0: before the first one), `waited` seconds into a wait. */
double hvdl_wait_next_sleep(const struct hvdl_wait_limits *limits, double sleep, double waited);
void hvdl_sleep(double seconds);

/* failed.c: ranks the MPI reports dead (ULFM). hvdl_ft_built: 1 when hvd_lite was built
 * against an MPI with ULFM (Open MPI's extension); hvdl_ft_enabled: 1 when this MPI has
 * ULFM and the job was started with it (Open MPI: mpirun --with-ft ulfm). Where
 * comm->ft: hvdl_failed_check drives MPI's progress and fails with hvdlRemoteError
 * naming the dead ranks (revoking the watched communicator, so that every rank learns
 * it) or saying another rank revoked it; hvdl_failed_any says whether either holds;
 * hvdl_failed_revoke revokes it if the MPI knows of a dead rank (wait.c, after a failed
 * test: an MPI error may be a dead peer's).
 * hvdl_failed_shrink: from revoked, and the survivors' communicator in *out
 * (MPIX_Comm_shrink: collective over every living rank of from; errors return).
 * hvdl_failed_agree: *flag becomes the AND of every living rank's flag over c, or every
 * one of them fails alike (MPIX_Comm_agree: a rank found dead meanwhile; errors return). */
int hvdl_ft_built(void);
int hvdl_ft_enabled(void);
hvdlResult_t hvdl_failed_check(hvdlComm_t comm);
int hvdl_failed_any(hvdlComm_t comm);
void hvdl_failed_revoke(hvdlComm_t comm);
hvdlResult_t hvdl_failed_shrink(MPI_Comm from, MPI_Comm *out);
hvdlResult_t hvdl_failed_agree(MPI_Comm c, int *flag);

/* errors.c: 1 when an armed fault at point p fires now (f may be NULL); its name. */
int hvdl_fault_hit(struct hvdl_faults *f, enum hvdl_fault_point p);
/* The stall fault point, armed: this rank stops for three data timeouts (wait.c). */
void hvdl_fault_stall(hvdlComm_t comm);
/* wait.c: the transports' one fault point (HVD_LITE_FAULT), called before each message
 * (pair_exchange.c, pipeline.c) or shared-memory step (segment.c) with at SEND or RECV:
 * hvdlSuccess at once where comm->faults is NULL; before a send, the stall point first
 * (hvdl_fault_stall); then, where `at` fires, the failure recorded on comm,
 * hvdlSystemError "injected fault (HVD_LITE_FAULT): a send to rank <peer> failed" ("a recv
 * from rank <peer>"), or with peer HVDL_FAULT_NO_PEER (the segment's step, which waits for
 * every local rank) "... a shared-memory publish failed" ("wait"). The single copy
 * (single_copy.c) takes hvdl_fault_hit alone: its fault makes the kernel's copy fail. */
#define HVDL_FAULT_NO_PEER (-1)
hvdlResult_t hvdl_fault_armed(hvdlComm_t comm, enum hvdl_fault_point at, int peer);
/* Inline, so that a communicator without faults (every one outside tests) pays one load on the
 * transports' per-segment path, not a call. */
static inline hvdlResult_t hvdl_fault(hvdlComm_t comm, enum hvdl_fault_point at, int peer) {
  return comm->faults ? hvdl_fault_armed(comm, at, peer) : hvdlSuccess;
}
const char *hvdl_fault_name(int p);

/* clock.c: monotonic time in seconds; types.c: type and op names; memory.c: scratch and the bulk copy. */
double hvdl_now(void);
/* memmove for the collectives' data, off the path where glibc's `rep movsb` crawls: a copy
 * between buffers apart whose destination lies 1-31 bytes past its source modulo 4 KiB goes in
 * pieces small enough for glibc's vector loop (memory.c says why). */
void hvdl_copy(void *dst, const void *src, size_t n);
/* Whether a `rep movsb` from src to dst would be in that window. The kernel's copies for
 * process_vm_readv/writev are `rep movsb` too: single_copy.c places and stages around it. */
int hvdl_copy_crawls(uint64_t dst, uint64_t src);
/* The CLOCK_REALTIME moment `seconds_from_now` ahead, for pthread_cond_timedwait. */
void hvdl_deadline(struct timespec *ts, double seconds_from_now);

/* Types by a dense index, for tables: NCCL's keep their numbers (0 .. 9) and
 * hvd_lite's follow them (int16 10, uint16 11, bool 12); -1 for a number that is
 * no type. */
#define HVDL_TYPE_SLOTS (hvdlNumTypes + hvdlExtTypesEnd - hvdlExtTypesBegin)
static inline int hvdl_type_slot(int t) {
  if (t >= 0 && t < hvdlNumTypes) return t;
  if (t >= hvdlExtTypesBegin && t < hvdlExtTypesEnd) return hvdlNumTypes + t - hvdlExtTypesBegin;
  return -1;
}
/* 1 when t is a data type; 1 when reduction ops apply to it (every type but bool). */
static inline int hvdl_type_valid(int t) { return hvdl_type_slot(t) >= 0; }
static inline int hvdl_type_reducible(int t) { return hvdl_type_valid(t) && t != hvdlBool; }
/* 1 for the floating-point types (the ones Adasum takes). */
static inline int hvdl_type_floating(int t) {
  return t == hvdlFloat16 || t == hvdlBfloat16 || t == hvdlFloat32 || t == hvdlFloat64;
}
/* The size and name of a valid type ("unknown" names any other number). */
size_t hvdl_type_size(hvdlDataType_t t);
const char *hvdl_type_name(hvdlDataType_t t);
/* 1 when op is a reduction op: NCCL's (0 .. hvdlNumOps-1) or hvd_lite's (hvdlAdasum). */
static inline int hvdl_op_valid(int op) {
  return (op >= 0 && op < hvdlNumOps) || (op >= hvdlExtOpsBegin && op < hvdlExtOpsEnd);
}
/* The name of a valid op ("unknown" names any other number). */
const char *hvdl_op_name(hvdlRedOp_t op);

/* Elements before block k of per-rank counts (counts[0] + ... + counts[k-1]): where
 * block k starts in a buffer of per-rank blocks. */
static inline size_t hvdl_before(const size_t *counts, int k) {
  size_t off = 0;
  for (int i = 0; i < k; i++) off += counts[i];
  return off;
}

/* The even cut of count elements into n blocks, the one every split of a buffer uses (the
 * rings, the halvings, the shared-memory lanes, the tree's scatter, the ring reduce): block k
 * holds count / n elements, one more for the first count % n, and starts at element
 * k * (count / n) + min(k, count % n); block n "starts" at count, so block k is
 * [hvdl_block_start(k), hvdl_block_start(k + 1)). hvdl_block_of inverts it: the block
 * holding element g < count, and in *end the element after that block. */
static inline size_t hvdl_block_start(size_t count, int n, int k) {
  const size_t base = count / (size_t)n, rem = count % (size_t)n, uk = (size_t)k;
  return uk * base + (uk < rem ? uk : rem);
}
static inline size_t hvdl_block_len(size_t count, int n, int k) {
  return count / (size_t)n + ((size_t)k < count % (size_t)n ? 1 : 0);
}
static inline int hvdl_block_of(size_t count, int n, size_t g, size_t *end) {
  const size_t base = count / (size_t)n, rem = count % (size_t)n, wide = rem * (base + 1);
  const size_t c = g < wide ? g / (base + 1) : rem + (g - wide) / base;
  *end = c < rem ? (c + 1) * (base + 1) : wide + (c + 1 - rem) * base;
  return (int)c;
}

/* Grows a scratch allocation to at least `bytes` (64-byte aligned). */
hvdlResult_t hvdl_reserve(hvdlComm_t comm, char **buf, size_t *cap, size_t bytes);

/* ---- topology.c: the host layout ------------------------------------------ */

/* This rank's place in a communicator: among all ranks, among the ranks of its
 * host (local), and among the ranks with its local rank, one per host (cross). */
struct hvdl_topology {
  int rank, size;
  int local_rank, local_size;
  int cross_rank, cross_size;
  int homogeneous; /* 1 when every host has the same number of ranks */
};

/* Fills *out for the calling rank (collective over comm: every rank calls it).
 * hvdlSystemError with MPI's text if MPI fails. */
hvdlResult_t hvdl_topology(MPI_Comm comm, struct hvdl_topology *out);

/* Makes *local, the communicator of the ranks of comm on this rank's host, in
 * rank order (collective over comm; the caller frees it). */
hvdlResult_t hvdl_local_comm(MPI_Comm comm, MPI_Comm *local);

/* *ranks, the ranks of comm on this rank's host (the real one: HVD_LITE_RANKS_PER_HOST
 * aside), and *cpus, how many CPUs they may run on between them: the union of their
 * affinity masks (Linux; elsewhere the online CPUs). Collective over comm. More ranks
 * than CPUs means an oversubscribed host (a launcher's --oversubscribe, taskset or a
 * container's cpuset), where every wait's spins must yield (wait.c). hvdlSystemError
 * with MPI's text if MPI fails. */
hvdlResult_t hvdl_host_cpus(MPI_Comm comm, int *ranks, int *cpus);

/* Makes *out, the communicator of ranks[0 .. n-1] of base, in that order. Only
 * the listed ranks call it (MPI_Comm_create_group). hvdlInvalidArgument, before
 * any MPI traffic, for a rank outside [0, size of base) or a caller that is not
 * in the list; hvdlSystemError if MPI fails. The caller frees *out. */
hvdlResult_t hvdl_comm_subset(MPI_Comm base, const long long *ranks, int n, MPI_Comm *out);

#endif /* HVDL_BASE_BASE_H_ */
