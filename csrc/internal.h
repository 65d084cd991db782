/*
 * internal.h -- what the parts of the C core below the engine share: the
 * communicator struct, the result-checking macros, base.c (errors, clock, type
 * names, scratch), wait.c, config.c and the algorithms' entry points.
 */
#ifndef HVDL_INTERNAL_H_
#define HVDL_INTERNAL_H_

#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include <time.h>

#include "hvdl.h"

#define HVDL_ERRMSG_LEN 512

/* Scratch that lives as long as the communicator, grown on demand and reused. */
struct hvdl_scratch {
  char *tmp;            /* pipe.c: PIPE_WINDOW receive segments of the reducing verbs */
  size_t tmp_bytes;
  char *gather;         /* latency path: n * small_bytes */
  size_t gather_bytes;
  char *sreq;           /* pipe.c: MPI_Request[2][cap], sends of the two most recent steps */
  size_t sreq_bytes;
  char *stage;          /* reduce-scatter: the partials being forwarded, two blocks (the
                         * ring), or the partial of the whole buffer (halving) */
  size_t stage_bytes;
  char *block;          /* reduce: a non-root rank's reduced block */
  size_t block_bytes;
  char *counts;         /* reduce, scatter broadcast: size_t[n], the blocks */
  size_t counts_bytes;
  char *work;           /* pairwise all-reduces (allreduce_rd.c, allreduce_rab.c) and the
                         * halving reduce-scatter: the partner's data */
  size_t work_bytes;
};

/* The all-reduce cost model (select.c): per link class, a message's latency
 * alpha (s) and the time per byte beta (s/B); gamma, the time per byte reduced.
 * Filled by config.c (defaults, HVD_LITE_COST_MODEL_FILE); rank 0's is everyone's. */
enum hvdl_link { HVDL_LINK_INTRA = 0, HVDL_LINK_INTER = 1 };
struct hvdl_cost_model {
  double alpha[2], beta[2], gamma;
};

/* Fault injection, a testing aid (docs/design.md, "Failures"): where a rank can be
 * made to fail. armed[p] = n > 0 fails the n-th next time point p is reached. */
enum hvdl_fault_point {
  HVDL_FAULT_ALLOC, HVDL_FAULT_SEND, HVDL_FAULT_RECV, HVDL_FAULT_NEGOTIATE, HVDL_FAULT_STALL,
  HVDL_FAULT_EXIT, HVDL_FAULT_ADAPTER, HVDL_FAULT_POINTS
};
struct hvdl_faults {
  atomic_int armed[HVDL_FAULT_POINTS];
};

struct hvdlComm {
  MPI_Comm mpi;         /* private duplicate of the caller's communicator */
  int rank;
  int size;
  int broken;           /* set after a failure mid-collective */
  hvdlConfig_t config;
  struct hvdl_scratch scratch;
  double phase_time[3];  /* last ring: start, end of reduce-scatter, end (for the timeline) */
  /* Called while wait.c polls, with the seconds the wait has lasted; a result other
   * than hvdlSuccess ends the wait with it (the engine: notifications, and alarms
   * from other ranks). */
  hvdlResult_t (*watch)(void *arg, double waited);
  void *watch_arg;
  double data_timeout;   /* a wait in which nothing completes for this long fails (0: never) */
  int wait_peer;         /* the rank the current wait is for, where the algorithm knows (-1) */
  int *rank_names;       /* for messages: each rank's number in the communicator this one
                          * serves (a lane's, allreduce_hier.c), or NULL: its own */
  struct hvdl_faults *faults; /* NULL unless faults are injected */
  struct hvdl_shm *shm;  /* shm.c: the segment shared with this host's ranks; NULL when there is
                          * none (HVD_LITE_SHM=0, or no host has two ranks) */
  hvdlComm_t cross;      /* allreduce_hier.c: this local rank's peers on the other hosts (a
                          * lane); NULL on one host and on local ranks that carry no lane */
  struct hvdl_cost_model model; /* select.c: agreed by every rank at init */
  int hosts, local_size;  /* select.c: hosts, and the most ranks on one of them (the host
                          * layout of topology.c, emulated hosts included) */
  struct hvdl_hier_p2p *hier_p2p; /* allreduce_hier_p2p.c: this rank's groups within and across
                          * hosts; NULL unless several hosts have the same number of ranks */
  struct hvdl_cuda_stage *cuda_stage; /* cuda.c: pinned chunks for device buffers, or NULL */
  MPI_Request *parked;   /* sends of failed collectives, released when the communicator is renewed */
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
#define HVDL_CHECK(call)                     \
  do {                                       \
    hvdlResult_t hvdl_res_ = (call);         \
    if (hvdl_res_ != hvdlSuccess) return hvdl_res_; \
  } while (0)

/* Runs an MPI call; on failure records the call's text and returns hvdlSystemError. */
#define HVDL_MPI(comm, call)                                 \
  do {                                                       \
    int hvdl_mpi_err_ = (call);                              \
    if (hvdl_mpi_err_ != MPI_SUCCESS)                        \
      return hvdl_fail_mpi((comm), hvdl_mpi_err_, #call);    \
  } while (0)

/* Everything the engine is tuned by; filled from HVD_LITE_* by config.c. */
struct hvdl_engine_config {
  hvdlConfig_t comm;          /* ring segment, latency-path crossover */
  size_t fusion_threshold;    /* HVD_LITE_FUSION_THRESHOLD, bytes; 0 disables fusion */
  double cycle_time_ms;       /* HVD_LITE_CYCLE_TIME: least time between two rounds */
  double batch_time_ms;       /* HVD_LITE_BATCH_TIME: how long a burst of submissions may pause */
  double notify_time_ms;      /* HVD_LITE_NOTIFY_TIME: how long a completion may go unannounced */
  double stall_check_s;       /* HVD_LITE_STALL_CHECK_TIME_SECONDS; 0 disables the warning */
  double stall_shutdown_s;    /* HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS; 0 = wait forever */
  size_t cache_capacity;      /* HVD_LITE_CACHE_CAPACITY: response cache entries; 0 disables */
  char timeline[4096];        /* HVD_LITE_TIMELINE: Chrome-trace file written by rank 0 */
  double data_timeout_s;      /* HVD_LITE_DATA_TIMEOUT_SECONDS; 0 = a data phase may wait forever */
  size_t fast_path_bytes;     /* HVD_LITE_FAST_PATH_BYTES: the most a waiting caller executes itself; 0: never */
  /* HVD_LITE_FAULT (a testing aid): point@rank#n, up to 16 of them */
  struct { int point, rank, n; } faults[16];
  int nfaults;
  int log_level;              /* HVD_LITE_LOG_LEVEL: enum hvdl_log_level */
  /* HVD_LITE_AUTOTUNE (csrc/autotune.c): rank 0 tunes the parameters below online */
  int autotune;
  unsigned autotune_fixed;    /* bit p (enum hvdl_tune_param): the user set it, so it stays as set */
  int autotune_warmup;        /* HVD_LITE_AUTOTUNE_WARMUP_SAMPLES: samples measured and dropped first */
  int autotune_steps;         /* HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE: training steps in a sample */
  char autotune_log[4096];    /* HVD_LITE_AUTOTUNE_LOG: rank 0's CSV of samples and the choice */
};

/* The parameters the autotuner may change, in the order it tunes them. */
enum hvdl_tune_param {
  HVDL_TUNE_FUSION, HVDL_TUNE_SEGMENT, HVDL_TUNE_BATCH, HVDL_TUNE_CYCLE, HVDL_TUNE_PARAMS
};

enum hvdl_log_level {
  HVDL_LOG_TRACE = 0, HVDL_LOG_DEBUG, HVDL_LOG_INFO, HVDL_LOG_WARNING, HVDL_LOG_ERROR, HVDL_LOG_FATAL
};

hvdlResult_t hvdl_engine_config_default(struct hvdl_engine_config *c);
/* At info level, the configuration on stderr (rank 0, at the engine's start). */
void hvdl_engine_config_print(const struct hvdl_engine_config *cfg, int nranks, const hvdlConfig_t *comm);
/* Parses one HVD_LITE_FAULT-style spec ("point@rank#n,...") into c->faults. */
hvdlResult_t hvdl_config_faults(struct hvdl_engine_config *c, const char *spec);
/* comm.c: replaces the communicator's MPI communicator with a duplicate of
 * `from` (collective over it), after a failed collective left messages and
 * requests behind on the old one. */
hvdlResult_t hvdl_comm_renew(hvdlComm_t comm, MPI_Comm from);
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
/* HVD_LITE_ALLREDUCE_ALGO's spelling of an algorithm, and back (-1 if none). */
const char *hvdl_algo_name(int algo);
int hvdl_algo_parse(const char *name);
/* The same for HVD_LITE_BROADCAST_ALGO's (an hvdlBroadcastAlgorithm_t). */
const char *hvdl_bcast_algo_name(int algo);
/* And HVD_LITE_ALLGATHER_ALGO's, HVD_LITE_REDUCESCATTER_ALGO's. */
const char *hvdl_allgather_algo_name(int algo);
const char *hvdl_reducescatter_algo_name(int algo);

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

/* base.c: 1 when an armed fault at point p fires now (f may be NULL); its name. */
int hvdl_fault_hit(struct hvdl_faults *f, enum hvdl_fault_point p);
/* The stall fault point, armed: this rank stops for three data timeouts (wait.c). */
void hvdl_fault_stall(hvdlComm_t comm);
const char *hvdl_fault_name(int p);

/* base.c: monotonic time in seconds; type and op names; scratch; the bulk copy. */
double hvdl_now(void);
/* memmove for the collectives' data, off the path where glibc's `rep movsb` crawls: a copy
 * between buffers apart whose destination lies 1-31 bytes past its source modulo 4 KiB goes in
 * pieces small enough for glibc's vector loop (base.c says why). */
void hvdl_copy(void *dst, const void *src, size_t n);
/* Whether a `rep movsb` from src to dst would be in that window. The kernel's copies for
 * process_vm_readv/writev are `rep movsb` too: shm_cma.c places and stages around it. */
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
/* The size and name of a valid type ("unknown" names any other number). */
size_t hvdl_type_size(hvdlDataType_t t);
const char *hvdl_type_name(hvdlDataType_t t);
const char *hvdl_op_name(hvdlRedOp_t op);

/* Grows a scratch allocation to at least `bytes` (64-byte aligned). */
hvdlResult_t hvdl_reserve(hvdlComm_t comm, char **buf, size_t *cap, size_t bytes);

/* Algorithms behind hvdlAllReduce; arguments already validated, count > 0. */
hvdlResult_t hvdl_allreduce_ring(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_small(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                  size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
/* Through the host's shared segment (shm.c), when comm->shm says one host; and the
 * hierarchical all-reduce (allreduce_hier.c), when it says several. */
hvdlResult_t hvdl_allreduce_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_hier(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_rd(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                               size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_rab(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                size_t count, hvdlDataType_t dt, hvdlRedOp_t op);
hvdlResult_t hvdl_allreduce_tree(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op);

/* allreduce_hier_p2p.c: the hierarchical all-reduce over point-to-point
 * messages (HVD_LITE_ALLREDUCE_ALGO=hier_p2p). hvdl_hier_p2p_init (collective
 * over comm, at communicator creation, called by select.c where every host has
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

/* select.c: the one all-reduce selector. hvdl_select_init (collective, at
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
/* The model's time for algo at bytes per rank on comm (seconds), or a negative
 * value when algo is not a candidate there or not modelled (shm). */
double hvdl_select_predict(hvdlComm_t comm, hvdlAlgorithm_t algo, size_t bytes);
/* The selector takes the shared-memory path on one host up to SHM_ALLREDUCE_MAX bytes per
 * rank. Shared memory beats the ring on a buffer that is in the cache (tools/shm_vs_ring.py,
 * 2 ranks: 0.68-0.81x its time from 64 KiB to 1 MiB) and loses from 2 MiB (1.04-1.64x); on
 * a buffer that is not (ResNet-50's fused step, whose buffers come from memory) it saves
 * less, as it copies more than the ring does through MPI's single copy. Measured through the
 * engine, builds alternating (docs/benchmarks.md, "Shared memory against the ring"): up to
 * 1 MiB the numpy API's 1 MiB all-reduce went from 1.15-1.28x MPI's time to 0.82-0.95x (8
 * rounds) and the fused step's median stayed at 1.04x the best MPI's (10 rounds); up to 2 MiB
 * the 2 MiB all-reduce went from 1.08-1.13x to 1.34-1.55x. */
#ifndef SHM_ALLREDUCE_MAX /* settable at build time (-DSHM_ALLREDUCE_MAX=...), to measure it again */
#define SHM_ALLREDUCE_MAX ((size_t)1 << 20)
#endif
/* Above SHM_CMA_MIN bytes per rank the shared-memory path takes its single-copy form
 * (allreduce_shm.c: reads the peers' own buffers, writes the result into them) where every
 * local rank can (hvdl_shm.cma); the selector then takes the path at every size on one host.
 * At 2 ranks (tools/shm_vs_ring.py, docs/benchmarks.md "The single-copy form"): at 32 KiB it
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
 * the ring in the same window (docs/benchmarks.md, "The single-copy all-gather"): the single
 * copy at 8 B - 1 KiB took 1.2-1.8x the ring's time under Open MPI, 1.0-1.2x under MPICH (its
 * two steps and a system call against one message); at 4 KiB 0.96-1.02x and 0.94-1.01x; at
 * 16 KiB 0.61-0.67x and 0.60x; above, 0.73-0.99x and 0.63-0.99x. The one step took about
 * 0.5-0.6x the ring's time at 8 B - 4 KiB ("The one-step all-gather"). */
#ifndef SHM_ALLGATHER_MIN /* settable at build time, to measure it again */
#define SHM_ALLGATHER_MIN ((size_t)4 << 10)
#endif

/* Above SHM_REDUCESCATTER_MIN bytes in all (the input) the reduce-scatter's selector takes
 * the single-copy reduce-scatter (reducescatter_shm.c) where it can run. At 2 ranks, C API,
 * Open MPI, against the ring forced in the same window, four runs (docs/benchmarks.md, "The
 * single-copy reduce-scatter"): 1.2-1.6x the ring's time at 1-2 KiB (two steps and a system
 * call against one message), 0.96-1.39x at 4 KiB, 0.62-0.95x at 8-64 KiB, 0.89-1.09x at
 * 128-512 KiB, 0.66-1.07x from 1 MiB to 16 MiB, and 0.90-1.30x at 32-64 MiB. */
#ifndef SHM_REDUCESCATTER_MIN /* settable at build time, to measure it again */
#define SHM_REDUCESCATTER_MIN ((size_t)4 << 10)
#endif

/* Above SHM_BROADCAST_MIN bytes and up to SHM_BROADCAST_MAX the broadcast's selector takes
 * the single-copy broadcast (broadcast_shm.c) where it can run. At 2 ranks, C API, Open MPI,
 * against the chain forced in the same window, four runs (docs/benchmarks.md, "The
 * single-copy broadcast"): 1.05-1.24x the chain's time at 1-2 KiB, 0.68-0.91x at 4-32 KiB,
 * 0.79-1.08x at 64-512 KiB, and 0.79-1.38x from 1 MiB to 64 MiB, where the chain's one
 * message is itself a single copy (Open MPI's smsc/cma) and the two take turns. */
#ifndef SHM_BROADCAST_MIN /* settable at build time, to measure it again */
#define SHM_BROADCAST_MIN ((size_t)2 << 10)
#endif
#ifndef SHM_BROADCAST_MAX
#define SHM_BROADCAST_MAX ((size_t)512 << 10)
#endif

/* Variable-size ring collectives (allgather.c, reducescatter.c). Rank k's block
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
                                         const size_t *counts, hvdlDataType_t dt,
                                         hvdlRedOp_t op);
/* The all-gather of ranks all on one host (allgather_shm.c): in one step through the
 * segment's areas up to SHM_ALLGATHER_MIN bytes in all where that fits an area, else the
 * single copy, which needs comm->shm->cma (the selector's to check). */
hvdlResult_t hvdl_allgatherv_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 const size_t *counts, hvdlDataType_t dt);
/* The reduce-scatter of ranks all on one host (reducescatter_shm.c): the single copy,
 * which needs comm->shm->cma (the selector's to check). */
hvdlResult_t hvdl_reducescatterv_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                     const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op);
/* select_gather.c: the choice for a call of `bytes` in all (the all-gather's
 * result, the reduce-scatter's input; the same on every rank), the model's time
 * for one (negative if not modelled), and the run. hvdlAllGather,
 * hvdlReduceScatter and the engine's calls go through these; the scatter
 * broadcast and the ring reduce run the rings above directly. */
hvdlAllGatherAlgorithm_t hvdl_select_allgather(hvdlComm_t comm, size_t bytes);
/* Why this communicator cannot run the all-gather algorithm algo (the reason,
 * for select.c's refusal of a forced one at init), or NULL if it can. */
const char *hvdl_select_allgather_cannot_run(hvdlComm_t comm, hvdlAllGatherAlgorithm_t algo);
const char *hvdl_select_reducescatter_cannot_run(hvdlComm_t comm,
                                                 hvdlReduceScatterAlgorithm_t algo);
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
/* The broadcast of ranks all on one host (broadcast_shm.c): the single copy, which
 * needs comm->shm->cma (the selector's to check). */
hvdlResult_t hvdl_broadcast_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                size_t count, hvdlDataType_t dt, int root);
/* select_bcast.c: the broadcast's choice for bytes (the same on every rank), the
 * model's time for one (negative if not a candidate), why this communicator cannot
 * run a forced one (NULL if it can), and the run. */
hvdlBroadcastAlgorithm_t hvdl_select_broadcast(hvdlComm_t comm, size_t bytes);
const char *hvdl_select_broadcast_cannot_run(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo);
double hvdl_select_predict_broadcast(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo, size_t bytes);
hvdlResult_t hvdl_broadcast_run(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo,
                                const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, int root);
hvdlResult_t hvdl_reduce_root(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                              size_t count, hvdlDataType_t dt, hvdlRedOp_t op, int root,
                              int latency);

/* All-to-all with byte counts and displacements per rank (alltoall.c); the
 * buffers must not overlap. */
hvdlResult_t hvdl_alltoallv(hvdlComm_t comm, const void *send, const int *scounts,
                            const int *sdispls, void *recv, const int *rcounts,
                            const int *rdispls);

#endif /* HVDL_INTERNAL_H_ */
