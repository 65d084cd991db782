/*
 * engine.h -- the engine layer's contract (engine.c, engine_turn.c, autotune.c): the
 * queue and the engine thread, one turn of its work, and the autotuner. What follows
 * is each file's part, in the order they build on each other.
 */
#ifndef HVDL_ENGINE_ENGINE_H_
#define HVDL_ENGINE_ENGINE_H_

#include "request/request.h"

/* ---- autotune.c ---------------------------------------------------------------------------- */

/*
 * The autotuner (HVD_LITE_AUTOTUNE): rank 0 measures the engine's
 * throughput and searches for the fusion threshold, the ring segment size and the
 * batch and cycle times; its choice travels in its round header (request.h, the
 * autotune word) and every rank applies it after the same round (autotune.c has
 * the search). It calls wire.c and errors.c; the engine calls it after every round.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

/* The values of the tunable parameters. */
struct hvdl_tune_values {
  size_t fusion_threshold, segment_bytes;
  double batch_time_ms, cycle_time_ms;
};

/* A word every rank applied: after round `round`, these values (settled: the final choice). */
struct hvdl_tune_change {
  long round;
  struct hvdl_tune_values v;
  int settled;
};

/* Where the tuned values live. The thread that holds the engine's turn writes them,
 * the two times under *mu (other threads read those under it). */
struct hvdl_tune_targets {
  size_t *fusion_threshold, *segment_bytes;
  double *batch_time_ms, *cycle_time_ms;
  pthread_mutex_t *mu;
};

#define HVDL_TUNE_HISTORY 64

/* Samples of each of the two contenders in the confirmation (autotune.c). */
#define HVDL_TUNE_CONFIRM_PAIRS 3

struct hvdl_autotune {
  struct hvdl_tune_targets at;
  hvdlComm_t comm; /* where a malformed word is recorded */
  int rank, log_level;
  struct hvdl_tune_word applied; /* the last word applied (every idx -1: none yet) */
  struct hvdl_tune_change history[HVDL_TUNE_HISTORY]; /* the words applied, under *at.mu */
  int nchanges;        /* under *at.mu; past HVDL_TUNE_HISTORY only counted */
  _Atomic int samples; /* rank 0: samples scored so far (warm-up ones not counted) */

  /* Rank 0's search; owned by the turn holder. */
  int searching;
  int warmups, warmup_left, steps_per_sample, planned;
  int order[HVDL_TUNE_PARAMS], nparams; /* the tuned parameters, in the order they are tuned */
  int param, scan_from, k; /* the parameter being scanned, its value before, the one tried */
  struct hvdl_tune_word proposed, best, start;
  double best_score;
  int best_sample;
  /* the confirmation: the starting values and the pass's best, sampled in turn */
  int confirm_done; /* confirmation samples scored so far (-1: none planned) */
  double confirm_score[2][HVDL_TUNE_CONFIRM_PAIRS]; /* [0] the starting values, [1] the best */
  /* the sample being measured: steps counted from t0, bytes executed since */
  int started, steps;
  double t0, bytes;
  uint64_t *seen; /* hashes of the names ready since the last step began */
  size_t seen_cap, nseen;
  FILE *log; /* HVD_LITE_AUTOTUNE_LOG */
};

/* Sets the tuner up; on rank 0 with cfg->autotune, starts the search from the
 * targets' values (and opens the log). */
hvdlResult_t hvdl_autotune_init(struct hvdl_autotune *t, const struct hvdl_engine_config *cfg,
                                int rank, hvdlComm_t comm, const struct hvdl_tune_targets *at);
/* Every rank, after each round and before its ready list runs: applies rank 0's
 * autotune word of the round (`word`, checked: hvdlInternalError when malformed);
 * on rank 0 also measures the round's ready list and moves the search on. *next:
 * the word for this rank's next round (0 except on rank 0). */
hvdlResult_t hvdl_autotune_round(struct hvdl_autotune *t, uint64_t word, long round,
                                 struct hvdl_request *const *ready, int n, uint64_t *next);
/* The word rank 0 sends now (0 when it is not tuning). */
uint64_t hvdl_autotune_word(const struct hvdl_autotune *t);
/* Any thread: the values in effect, whether the last word applied was the final
 * choice, the samples scored (rank 0), and the first `cap` changes applied;
 * returns the number of changes. */
int hvdl_autotune_state(struct hvdl_autotune *t, struct hvdl_tune_values *now, int *settled,
                        int *samples, struct hvdl_tune_change *changes, int cap);
void hvdl_autotune_free(struct hvdl_autotune *t);

/* ---- engine.c ------------------------------------------------------------------------------ */

/*
 * The background engine: the queue of submitted requests, the
 * thread that runs rounds (negotiate.c) and executions (executor.c), and the
 * communicators. engine.c calls those parts and request.c, autotune.c,
 * timeline.c, config and comm.c; only the Python binding calls it. docs/design.md, "The engine", has
 * the picture.
 */

#include <pthread.h>
#include <stdint.h>

struct hvdl_negotiator;
struct hvdl_executor;
struct hvdl_timeline;

struct hvdl_engine {
  struct hvdl_engine_config cfg;
  hvdlComm_t data; /* collectives */
  MPI_Comm ctrl;   /* negotiation rounds */
  int rank, size;

  pthread_t thread;
  int thread_started;
  struct hvdl_requests requests; /* in flight; its mu also guards the queue state below */
  pthread_cond_t work_cv;        /* the engine thread sleeps here */
  /* the queue, under requests.mu */
  int nnew;         /* submitted since the engine last looked */
  int hold;         /* > 0: a group is being submitted; start no round yet */
  double first_new; /* when the first request since the last round was submitted */
  int batching;     /* the engine lets a burst of submissions gather */
  int at_once;      /* a new request will be waited on at once: no batching */
  int stop_requested;

  /* the parts (engine thread only, but for the outpool, which is thread-safe) */
  struct hvdl_negotiator *negotiator;
  struct hvdl_executor *executor;
  struct hvdl_timeline *timeline; /* rank 0's, or NULL */
  struct hvdl_outpool outpool;    /* outputs of allgather/alltoall, recycled */
  double last_round;
  struct hvdl_alarm alarm;    /* failures to and from the other ranks (engine thread) */
  int in_data;                /* the engine thread is executing a ready list */
  struct hvdl_faults faults;  /* injected faults (any thread arms them) */
  struct hvdl_autotune tuner; /* HVD_LITE_AUTOTUNE; applies rank 0's choice after every round */

  /* Whose turn it is to run the loop's work, the engine thread's or a waiting caller's
   * (engine_turn.c: hvdl_turn_run_for), and what a caller handed back; under requests.mu. */
  int turn;               /* enum hvdl_turn */
  int handed;             /* enum hvdl_handed */
  int caller_expected;    /* a synchronous submission's caller is coming to run the round */
  double caller_deadline; /* ... unless it has not come by then */
  int over;               /* the loop has ended: a failure, or this rank's last round */
  /* The work of the turn in progress, owned by whoever has the turn. */
  struct hvdl_request **pending, **ready;
  int npending, pending_cap, nready, ready_cap;
  int leaving, had_new;
  _Atomic uint64_t caller_turns; /* turns run by a waiting caller (statistics) */
};

enum hvdl_turn { HVDL_TURN_FREE = 0, HVDL_TURN_ENGINE, HVDL_TURN_CALLER };
enum hvdl_handed { HVDL_HANDED_NONE = 0, HVDL_HANDED_ROUND, HVDL_HANDED_READY };

/* What the engine has done so far; hvdl_engine_get_stats may be called from any thread. */
struct hvdl_engine_stats {
  uint64_t rounds;        /* negotiation rounds run */
  uint64_t slow_rounds;   /* rounds that gathered descriptors at the coordinator */
  uint64_t shm_rounds;    /* rounds whose all-gather went through the host's segment */
  uint64_t announced;     /* descriptors this rank announced (names not in the cache) */
  uint64_t cached_ready;  /* requests made ready by their cache bit alone, no name sent */
  uint64_t caller_turns;  /* rounds run by a waiting caller (the fast path) */
  uint64_t device_steps;  /* steps on CUDA memory: a request alone or a fused group */
  double step_seconds;    /* time spent running collectives (fusion copies included) */
  int shm_views;          /* the peers' hvdlMemAlloc regions the data communicator maps
                                  * (fusion buffers, hvd.empty arrays, stand-ins) */
  uint64_t shm_stand_ins; /* single-copy all-reduces on the data communicator that took
                                  * this rank's stand-in for plain buffers (single_copy.c) */
};

hvdlResult_t hvdl_engine_start(struct hvdl_engine **out, MPI_Comm base,
                               const struct hvdl_engine_config *cfg);
/* `at_once`: the caller waits on r at once (a synchronous call), so the engine
 * negotiates it without letting more submissions gather first. */
hvdlResult_t hvdl_engine_submit(struct hvdl_engine *e, struct hvdl_request *r, int at_once);
/* Submits n requests as one group: all of them, in order and in the same round, or none
 * (the engine refuses one: it is shutting down or dead, or a name is in flight or repeated). */
hvdlResult_t hvdl_engine_submit_group(struct hvdl_engine *e, struct hvdl_request **rs, int n,
                                      int at_once);
/* Holds (on) or releases (off) the start of new rounds, so that a group of
 * submissions enters the same round and can be fused. */
void hvdl_engine_hold(struct hvdl_engine *e, int on);
void hvdl_engine_get_stats(struct hvdl_engine *e, struct hvdl_engine_stats *out);
/* Fault injection (a testing aid): fail the n-th next time `point` is reached
 * (0 disarms); hvdl_engine_fault_hit counts one arrival at `point` (the adapter's). */
void hvdl_engine_inject_fault(struct hvdl_engine *e, int point, int n);
int hvdl_engine_fault_hit(struct hvdl_engine *e, int point);
/* Asks the engine to stop and waits for its thread to end. */
hvdlResult_t hvdl_engine_stop(struct hvdl_engine *e);
/* Asks the engine to stop and waits at most `seconds` for its thread to end (its last
 * round tells the other ranks; seconds < 0: without a bound); nonzero once it has ended.
 * Call again to wait longer. */
int hvdl_engine_stop_for(struct hvdl_engine *e, double seconds);
void hvdl_engine_free(struct hvdl_engine *e);

/* ---- engine_turn.c ------------------------------------------------------------------------- */

/*
 * One turn of the engine's work, by the engine thread or by a waiting
 * caller (engine_turn.c).
 */

/* Under requests.mu: the requests in flight become this turn's pending list, each
 * held for the turn; -1 when out of memory. */
int hvdl_turn_take_locked(struct hvdl_engine *e);
/* The posted round's second half (unless res already failed), then the pins of
 * failed steps settled or kept. */
hvdlResult_t hvdl_turn_finish_round(struct hvdl_engine *e, hvdlResult_t res, int *finished);
hvdlResult_t hvdl_turn_execute(struct hvdl_engine *e);
/* The pending list let go; a failure stops the engine (and tells the others).
 * Nonzero when the loop must end. Waiters are woken by the caller, after the turn
 * is given back. */
int hvdl_turn_end(struct hvdl_engine *e, hvdlResult_t res, int finished);
/* Under requests.mu: the turn given back, with what a caller hands to the engine thread. */
void hvdl_turn_give_back_locked(struct hvdl_engine *e, int handed, int over);

/* The fast path of a synchronous call, from the thread that waits for r: when the
 * engine thread is idle, this thread runs the next round itself and, if the ready
 * list is small (HVD_LITE_FAST_PATH_BYTES), executes it, sparing the two thread
 * hand-offs of the engine thread's path. A round whose peers have not all arrived
 * within a short spin, or a larger ready list, goes to the engine thread, posted
 * as it is. At most one round; nonzero when r has completed. */
int hvdl_turn_run_for(struct hvdl_engine *e, struct hvdl_request *r);

#endif /* HVDL_ENGINE_ENGINE_H_ */
