/*
 * negotiate.h -- one negotiation round: which requests are ready on every rank,
 * in what order, and which are in error (negotiate.c has the protocol). It calls
 * cache.c, coordinator.c (rank 0), wire.c, request.c, wait.c and base.c; the
 * engine's loop calls it.
 */
#ifndef HVDL_NEGOTIATE_H_
#define HVDL_NEGOTIATE_H_

#include <stdatomic.h>

#include "cache.h"
#include "coordinator.h"

/* hvd_lite.join(): the round each rank joined in, -1 while it has not. */
struct hvdl_join {
  int *round;
};

/* What the rounds have done so far (read from any thread). */
struct hvdl_negotiate_stats {
  _Atomic uint64_t rounds;       /* rounds run */
  _Atomic uint64_t slow_rounds;  /* rounds that gathered descriptors at the coordinator */
  _Atomic uint64_t shm_rounds;   /* rounds whose all-gather went through the host's segment */
  _Atomic uint64_t announced;    /* descriptors this rank sent (names not in the cache) */
  _Atomic uint64_t cached_ready; /* requests made ready by their cache bit alone */
};

struct hvdl_negotiator {
  hvdlComm_t data;               /* where failures are recorded */
  MPI_Comm ctrl;                 /* the rounds' communicator */
  int rank, size;
  struct hvdl_requests *requests; /* completed (errors, JOIN) or marked dead here */
  struct hvdl_alarm *alarm;      /* data alarms are settled here, and the data communicator renewed */
  struct hvdl_cache cache;
  struct hvdl_coordinator coord; /* rank 0 */
  struct hvdl_join join;
  long round_no;
  char *gathered;                /* rank 0: the slow path's gathered descriptors */
  size_t gathered_bytes;
  char *vectors;                 /* every rank's header and bit vector, then this rank's */
  size_t vectors_bytes;
  char *scratch;                 /* finish_round's, kept between rounds */
  size_t scratch_bytes;
  struct hvdl_negotiate_stats stats;
  uint64_t tune_out;             /* rank 0: the autotune word its next round sends (wire.h) */
  uint64_t tune_in;              /* rank 0's autotune word in the last round finished */
  struct {                       /* the round posted by hvdl_round_post, until hvdl_round_finish */
    MPI_Request req;             /* its MPI_Iallgather; none when it goes through shared memory */
    int shm;                     /* it goes through the host's segment (shm.h, the round) */
    int words, cache_n;
    double at;                   /* when it was posted */
  } posted;
  double quiet_since;            /* when the first of the last rounds that readied none of this
                                    rank's pending work was posted; 0 after one that readied some */
};

hvdlResult_t hvdl_negotiator_init(struct hvdl_negotiator *g, hvdlComm_t data, MPI_Comm ctrl,
                                  struct hvdl_requests *requests, struct hvdl_alarm *alarm,
                                  const struct hvdl_engine_config *cfg);
/* One round over `pending` (the requests in flight, held by the caller). Fills
 * *ready (grown as needed; a joined rank adds stand-ins for the others'
 * allreduces) with what every rank executes now, in the same order on every rank.
 * Sets *finished when this rank must stop taking part in rounds. */
hvdlResult_t hvdl_round(struct hvdl_negotiator *g, struct hvdl_request **pending, int npending,
                        int leaving, struct hvdl_request ***ready, int *ready_cap, int *nready,
                        int *finished);
/* The same round in two halves, so that the thread that posts it need not be the one
 * that finishes it (engine.c's fast path): post sends this rank's contribution;
 * arrived tests whether every rank's has arrived; finish waits for them and does the
 * rest. Between post and finish nothing else may use the negotiator. */
hvdlResult_t hvdl_round_post(struct hvdl_negotiator *g, struct hvdl_request **pending, int npending,
                             int leaving);
hvdlResult_t hvdl_round_arrived(struct hvdl_negotiator *g, int *arrived);
hvdlResult_t hvdl_round_finish(struct hvdl_negotiator *g, struct hvdl_request **pending, int npending,
                               int leaving, struct hvdl_request ***ready, int *ready_cap, int *nready,
                               int *finished);
void hvdl_negotiator_free(struct hvdl_negotiator *g);

#endif /* HVDL_NEGOTIATE_H_ */
