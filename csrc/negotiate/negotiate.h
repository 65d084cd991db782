/*
 * negotiate.h -- the negotiation layer's contract: the response cache
 * (response_cache.c), rank 0's coordinator (coordinator.c) and one round
 * (negotiate.c). Each file's part follows.
 */
#ifndef HVDL_NEGOTIATE_NEGOTIATE_H_
#define HVDL_NEGOTIATE_NEGOTIATE_H_

#include "request/request.h"

/* ---- response_cache.c ---------------------------------------------------------------------- */

/*
 * The response cache: descriptors already negotiated, by id, found
 * by name through a hash index. Identical on every rank, because it changes only
 * as the coordinator's broadcast responses say. response_cache.c calls only base/; the
 * negotiation and the coordinator use it.
 */

struct hvdl_cache_entry {
  int valid;
  uint64_t hash; /* hvdl_name_hash(desc.name) */
  struct hvdl_desc desc;
  double pending_since; /* stall inspector, rank 0: first round seen pending somewhere */
  int warned;
};

struct hvdl_cache {
  hvdlComm_t comm; /* where failures are recorded */
  size_t capacity; /* HVD_LITE_CACHE_CAPACITY; 0 disables the cache */
  struct hvdl_cache_entry *entries;
  int count, cap; /* ids in use are below count */
  int *slots;     /* open-addressing index by name hash: ids, -1 empty */
  int slot_cap, slot_used;
};

/* The id of the valid entry named `name` (hash = hvdl_name_hash(name)), or -1. */
int hvdl_cache_find(const struct hvdl_cache *c, const char *name, uint64_t hash);
/* Entry `id` becomes d (growing the cache as needed). */
hvdlResult_t hvdl_cache_set(struct hvdl_cache *c, int id, const struct hvdl_desc *d);
void hvdl_cache_free(struct hvdl_cache *c);

/* ---- coordinator.c ------------------------------------------------------------------------- */

/*
 * Rank 0's part of a negotiation round: the table of names
 * some ranks have announced, their validation (a mismatch becomes an error
 * response naming both values), cache ids for the ready ones, and the stall
 * inspector. coordinator.c calls response_cache.c, wire.c and errors.c; negotiate.c calls
 * it on rank 0.
 */

/* One name announced by some ranks. */
struct hvdl_table_entry {
  struct hvdl_desc *descs; /* one per rank */
  unsigned char *have;     /* which ranks announced it */
  int nhave;
  double first_seen;
  int warned;
};

struct hvdl_coordinator {
  hvdlComm_t comm; /* where failures are recorded */
  int size;
  struct hvdl_cache *cache; /* the negotiation's cache, which this assigns ids in */
  double stall_check_s;     /* HVD_LITE_STALL_CHECK_TIME_SECONDS; 0 disables the warning */
  double stall_shutdown_s;  /* HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS; 0 = wait forever */
  int log_level;
  struct hvdl_table_entry *table;
  int table_count, table_cap;
  char pending_shutdown[HVDL_ERRMSG_LEN]; /* a stall shutdown to broadcast in the next response */
};

/* Files the descriptors gathered from every rank (rank r's at gathered + displs[r],
 * counts[r] bytes) and writes the response: READY for names every rank that has
 * not joined announced and that agree, ERROR for those that do not, EVICT for
 * cache entries whose metadata changed or that make room, SHUTDOWN for a stall.
 * `all` holds every rank's header and bit vector (`words` each; `cache_n` entries).
 * The cache is left as it is: it changes as the response is applied, on every
 * rank alike. A malformed descriptor is hvdlInternalError naming the rank that
 * sent it, running out of memory hvdlSystemError; either way *resp must not be sent. */
hvdlResult_t hvdl_coordinate(struct hvdl_coordinator *co, const char *gathered, const int *counts,
                             const int *displs, const uint64_t *all, int words, int cache_n,
                             int anyone_leaving, const unsigned char *joined,
                             struct hvdl_buf *resp);
/* Warns about (HVD_LITE_STALL_CHECK_TIME_SECONDS) names pending on some ranks only,
 * and queues a shutdown response past HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS. */
void hvdl_stall_inspect(struct hvdl_coordinator *co, const uint64_t *all, int words, int cache_n);
void hvdl_coordinator_free(struct hvdl_coordinator *co);

/* ---- negotiate.c --------------------------------------------------------------------------- */

/*
 * One negotiation round: which requests are ready on every rank,
 * in what order, and which are in error (negotiate.c has the protocol). It calls
 * response_cache.c, coordinator.c (rank 0), wire.c, request.c, wait.c and errors.c; the
 * engine's loop calls it.
 */

#include <stdatomic.h>

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
  hvdlComm_t data; /* where failures are recorded */
  MPI_Comm ctrl;   /* the rounds' communicator */
  int rank, size;
  struct hvdl_requests *requests; /* completed (errors, JOIN) or marked dead here */
  struct hvdl_alarm *alarm; /* data alarms are settled here, and the data communicator renewed */
  struct hvdl_cache cache;
  struct hvdl_coordinator coord; /* rank 0 */
  struct hvdl_join join;
  long round_no;
  char *gathered; /* rank 0: the slow path's gathered descriptors */
  size_t gathered_bytes;
  char *vectors; /* every rank's header and bit vector, then this rank's */
  size_t vectors_bytes;
  char *scratch; /* finish_round's, kept between rounds */
  size_t scratch_bytes;
  struct hvdl_negotiate_stats stats;
  uint64_t tune_out; /* rank 0: the autotune word its next round sends (request.h) */
  uint64_t tune_in;  /* rank 0's autotune word in the last round finished */
  struct {           /* the round posted by hvdl_round_post, until hvdl_round_finish */
    MPI_Request req; /* its MPI_Iallgather; none when it goes through shared memory */
    int shm;         /* it goes through the host's segment (shm.h, the round) */
    int words, cache_n;
    double at; /* when it was posted */
  } posted;
  double quiet_since; /* when the first of the last rounds that readied none of this
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
hvdlResult_t hvdl_round_finish(struct hvdl_negotiator *g, struct hvdl_request **pending,
                               int npending, int leaving, struct hvdl_request ***ready,
                               int *ready_cap, int *nready, int *finished);
void hvdl_negotiator_free(struct hvdl_negotiator *g);

#endif /* HVDL_NEGOTIATE_NEGOTIATE_H_ */
