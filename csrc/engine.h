/*
 * engine.h -- the background engine: requests, handles and the engine's state,
 * shared by engine.c (thread, queue, lifetime), negotiate.c (rounds),
 * fusion.c (execution) and timeline.c. docs/design.md, "The engine", has the
 * picture.
 */
#ifndef HVDL_ENGINE_H_
#define HVDL_ENGINE_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "internal.h"

#define HVDL_MAX_DIMS 16
#define HVDL_MAX_NAME 512

enum hvdl_coll {
  HVDL_COLL_ALLREDUCE = 0,
  HVDL_COLL_ALLGATHER,
  HVDL_COLL_BROADCAST,
  HVDL_COLL_ALLTOALL,
  HVDL_COLL_REDUCESCATTER,
  HVDL_COLL_BARRIER,
  HVDL_COLL_JOIN,
  HVDL_NUM_COLLS
};

/* What every rank must agree on for one name; the coordinator compares these.
 * For ALLGATHER and ALLTOALL dims[0] is -1 here (it may differ per rank; the
 * execution exchanges it). `error` is a problem this rank found in its own
 * arguments: the coordinator turns it into an error on every rank. */
struct hvdl_desc {
  int32_t coll, dtype, op, ndim, root;
  double prescale, postscale;
  int64_t dims[HVDL_MAX_DIMS];
  char name[HVDL_MAX_NAME];
  char error[256];
};

enum hvdl_req_state { HVDL_REQ_PENDING = 0, HVDL_REQ_DONE = 1, HVDL_REQ_FAILED = 2 };

/* Where a request is in negotiation (engine thread only). */
enum hvdl_req_phase { HVDL_PHASE_NEW = 0, HVDL_PHASE_ANNOUNCED, HVDL_PHASE_CACHED };

/* One submitted collective. Shared by the submitter (a handle) and the engine;
 * freed when both have let go (refs). */
struct hvdl_request {
  struct hvdl_desc desc;
  const void *send;
  void *recv;                    /* NULL for ALLGATHER/ALLTOALL: the engine allocates `out` */
  size_t count, nbytes;          /* of send */
  int64_t dim0;                  /* this rank's first dimension (ALLGATHER, ALLTOALL) */
  int64_t *splits;               /* ALLTOALL: rows for each rank (size entries), or NULL */
  void *out;                     /* engine-allocated output, freed with the request */
  size_t out_bytes;
  size_t out_cap;                /* its allocated size */
  struct hvdl_outpool *out_pool; /* where `out` goes back to (NULL: free it) */
  int64_t out_dim0;              /* rows of `out` */
  int64_t *recv_splits;          /* ALLTOALL: rows received from each rank */
  int64_t value;                 /* JOIN: the last rank to join */
  void *zeros;                   /* a joined rank's stand-in input (engine-made requests) */
  _Atomic int state;             /* enum hvdl_req_state */
  _Atomic int refs;
  hvdlResult_t result;           /* set before state leaves PENDING */
  int waiters;                   /* threads sleeping on done_cv for this request (under mu) */
  uint64_t name_hash;            /* of desc.name: the in-flight check compares these first */
  char error[HVDL_ERRMSG_LEN];
  /* engine thread only */
  int phase;
  int cache_id;
  double t_submit, t_ready;
  struct hvdl_request *next;     /* in the engine's in-flight list (under mu) */
};

/* Response cache: identical on every rank, changed only by broadcast responses. */
struct hvdl_cache_entry {
  int valid;
  uint64_t hash;                 /* hvdl_name_hash(desc.name) */
  struct hvdl_desc desc;
  double pending_since;          /* stall inspector, rank 0: first round seen pending somewhere */
  int warned;
};

/* Coordinator's table of names announced by some ranks (rank 0 only). */
struct hvdl_table_entry {
  struct hvdl_desc *descs;       /* one per rank */
  unsigned char *have;           /* which ranks announced it */
  int nhave;
  double first_seen;
  int warned;
};

struct hvdl_timeline;

/* outpool.c: recycled engine-allocated outputs. */
#define HVDL_OUTPOOL_SLOTS 4
struct hvdl_outpool {
  pthread_mutex_t mu;
  void *buf[HVDL_OUTPOOL_SLOTS];
  size_t cap[HVDL_OUTPOOL_SLOTS];
};
void hvdl_outpool_init(struct hvdl_outpool *p);
/* A buffer of at least `bytes` (*cap: its real size): a recycled one or a new one. */
void *hvdl_outpool_get(struct hvdl_outpool *p, size_t bytes, size_t *cap);
/* Takes buf back (or frees it if the pool keeps bigger ones). */
void hvdl_outpool_put(struct hvdl_outpool *p, void *buf, size_t cap);
void hvdl_outpool_free(struct hvdl_outpool *p);

struct hvdl_engine {
  struct hvdl_engine_config cfg;
  hvdlComm_t data;               /* collectives: ring and latency path */
  MPI_Comm ctrl;                 /* negotiation rounds */
  int rank, size;

  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;        /* engine sleeps here */
  pthread_cond_t done_cv;        /* waiters sleep here */
  /* under mu */
  struct hvdl_request *inflight; /* submitted, not completed, in submission order */
  int nnew;                      /* submitted since the engine last looked */
  int hold;                      /* > 0: a group is being submitted; start no round yet */
  double first_new;              /* when the first request since the last round was submitted */
  int nwaiting;                  /* threads blocked in hvdl_request_wait */
  int batching;                  /* the engine lets a burst of submissions gather */
  int urgent;                    /* a new request will be waited on at once: no batching */
  /* engine thread only: completions whose waiters have not been woken yet */
  int wake_due;
  double wake_due_since;
  int stop_requested;
  int dead;                      /* no more requests accepted */
  hvdlResult_t dead_result;
  char dead_reason[HVDL_ERRMSG_LEN];

  /* engine thread only */
  struct hvdl_cache_entry *cache;
  int cache_count, cache_cap;
  int *cache_slots;              /* open-addressing index by name hash: cache ids, -1 empty */
  int cache_slot_cap, cache_slot_used;
  struct hvdl_table_entry *table; /* rank 0 */
  int table_count, table_cap;
  char *fusion;                  /* fusion buffer */
  size_t fusion_bytes;
  char *wire;                    /* scratch for rounds */
  size_t wire_bytes;
  char *wire2;
  size_t wire2_bytes;
  char pending_shutdown[HVDL_ERRMSG_LEN]; /* rank 0: stall shutdown to broadcast */
  int *join_round;               /* per rank: the round it joined in, or -1 */
  long round_no;
  double last_round;
  struct hvdl_timeline *timeline;
  struct hvdl_outpool outpool;   /* outputs of allgather/alltoall, recycled (thread-safe) */
};

/* FNV-1a of a tensor name: the in-flight check and the cache index compare it first. */
static inline uint64_t hvdl_name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

/* engine.c */
hvdlResult_t hvdl_engine_start(struct hvdl_engine **out, MPI_Comm base,
                               const struct hvdl_engine_config *cfg);
/* `urgent`: the caller waits on r at once (a synchronous call), so the engine
 * negotiates it without letting more submissions gather first. */
hvdlResult_t hvdl_engine_submit(struct hvdl_engine *e, struct hvdl_request *r, int urgent);
/* Holds (on) or releases (off) the start of new rounds, so that a group of
 * submissions enters the same round and can be fused. */
void hvdl_engine_hold(struct hvdl_engine *e, int on);
int hvdl_request_poll(const struct hvdl_request *r);
void hvdl_request_wait(struct hvdl_engine *e, struct hvdl_request *r);
/* Waits at most `seconds`; returns nonzero once r has completed. */
int hvdl_request_wait_for(struct hvdl_engine *e, struct hvdl_request *r, double seconds);
void hvdl_request_release(struct hvdl_request *r);
hvdlResult_t hvdl_engine_stop(struct hvdl_engine *e);
void hvdl_engine_free(struct hvdl_engine *e);
/* Refuses new requests from now on, with this reason (the first one sticks). */
void hvdl_engine_mark_dead(struct hvdl_engine *e, hvdlResult_t res, const char *reason);
/* Completes r (engine thread): result hvdlSuccess or an error with a message. */
void hvdl_engine_complete(struct hvdl_engine *e, struct hvdl_request *r, hvdlResult_t res,
                          const char *msg);
/* Wakes the waiters of completed requests (engine thread): all of them with `now`,
 * else only once the oldest completion has waited HVD_LITE_NOTIFY_TIME. */
void hvdl_engine_notify(struct hvdl_engine *e, int now);

/* negotiate.c: one round. Fills *ready (grown as needed; a joined rank adds
 * stand-ins for the others' allreduces) with what every rank executes now, in
 * the same order on every rank. Sets *finished when this engine must stop
 * taking part in rounds. */
hvdlResult_t hvdl_round(struct hvdl_engine *e, struct hvdl_request **pending, int npending,
                        int leaving, struct hvdl_request ***ready, int *ready_cap, int *nready,
                        int *finished);
void hvdl_negotiate_free(struct hvdl_engine *e);

/* fusion.c: runs the ready list on the data communicator. */
hvdlResult_t hvdl_execute(struct hvdl_engine *e, struct hvdl_request **ready, int n);

/* timeline.c: Chrome-trace events written by rank 0 (no-ops when tl is NULL). */
struct hvdl_timeline *hvdl_timeline_open(const char *path);
void hvdl_timeline_event(struct hvdl_timeline *tl, const char *tensor, const char *phase,
                         double t_begin, double t_end);
void hvdl_timeline_flush(struct hvdl_timeline *tl);
void hvdl_timeline_close(struct hvdl_timeline *tl);

#endif /* HVDL_ENGINE_H_ */
