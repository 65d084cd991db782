/*
 * engine.h -- the background engine: the queue of submitted requests, the
 * thread that runs rounds (negotiate.c) and executions (executor.c), and the
 * communicators. engine.c calls those parts and request.c, autotune.c,
 * timeline.c, config and comm.c; only the Python binding calls it. docs/design.md, "The engine", has
 * the picture.
 */
#ifndef HVDL_ENGINE_H_
#define HVDL_ENGINE_H_

#include <pthread.h>
#include <stdint.h>

#include "alarm.h"
#include "autotune.h"
#include "internal.h"
#include "outpool.h"
#include "request.h"

struct hvdl_negotiator;
struct hvdl_executor;
struct hvdl_timeline;

struct hvdl_engine {
  struct hvdl_engine_config cfg;
  hvdlComm_t data;               /* collectives */
  MPI_Comm ctrl;                 /* negotiation rounds */
  int rank, size;

  pthread_t thread;
  int thread_started;
  struct hvdl_requests requests; /* in flight; its mu also guards the queue state below */
  pthread_cond_t work_cv;        /* the engine thread sleeps here */
  /* the queue, under requests.mu */
  int nnew;                      /* submitted since the engine last looked */
  int hold;                      /* > 0: a group is being submitted; start no round yet */
  double first_new;              /* when the first request since the last round was submitted */
  int batching;                  /* the engine lets a burst of submissions gather */
  int at_once;                   /* a new request will be waited on at once: no batching */
  int stop_requested;

  /* the parts (engine thread only, but for the outpool, which is thread-safe) */
  struct hvdl_negotiator *negotiator;
  struct hvdl_executor *executor;
  struct hvdl_timeline *timeline; /* rank 0's, or NULL */
  struct hvdl_outpool outpool;   /* outputs of allgather/alltoall, recycled */
  double last_round;
  struct hvdl_alarm alarm;       /* failures to and from the other ranks (engine thread) */
  int in_data;                   /* the engine thread is executing a ready list */
  struct hvdl_faults faults;     /* injected faults (any thread arms them) */
  struct hvdl_autotune tuner;    /* HVD_LITE_AUTOTUNE; applies rank 0's choice after every round */

  /* Whose turn it is to run the loop's work, the engine thread's or a waiting caller's
   * (turn.c: hvdl_turn_run_for), and what a caller handed back; under requests.mu. */
  int turn;                      /* enum hvdl_turn */
  int handed;                    /* enum hvdl_handed */
  int caller_expected;           /* a synchronous submission's caller is coming to run the round */
  double caller_deadline;        /* ... unless it has not come by then */
  int over;                      /* the loop has ended: a failure, or this rank's last round */
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
  uint64_t rounds;               /* negotiation rounds run */
  uint64_t slow_rounds;          /* rounds that gathered descriptors at the coordinator */
  uint64_t shm_rounds;           /* rounds whose all-gather went through the host's segment */
  uint64_t announced;            /* descriptors this rank announced (names not in the cache) */
  uint64_t cached_ready;         /* requests made ready by their cache bit alone, no name sent */
  uint64_t caller_turns;         /* rounds run by a waiting caller (the fast path) */
  uint64_t device_steps;         /* steps on CUDA memory: a request alone or a fused group */
  double step_seconds;           /* time spent running collectives (fusion copies included) */
  int shm_views;                 /* the peers' hvdlMemAlloc regions the data communicator maps
                                  * (fusion buffers, hvd.empty arrays, stand-ins) */
  uint64_t shm_stand_ins;        /* single-copy all-reduces on the data communicator that took
                                  * this rank's stand-in for plain buffers (shm_cma.c) */
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

#endif /* HVDL_ENGINE_H_ */
