/*
 * request.h -- one submitted collective and its life: what describes it
 * (struct hvdl_desc, compared across ranks), the request itself, and the set of
 * requests in flight with the lock and condition variable its waiters sleep on.
 *
 * A request is created (hvdl_request_new) by the binding, or by the negotiation
 * for a joined rank's stand-in (hvdl_request_stand_in), added to the in-flight set
 * at submit, alone or with its group (hvdl_requests_add_locked, hvdl_requests_add_all_locked),
 * completed or failed by the engine's parts
 * (hvdl_request_complete, hvdl_requests_fail_all), waited on by its submitter
 * (hvdl_request_poll, hvdl_request_wait, hvdl_request_wait_for) and freed when
 * both have let go (hvdl_request_release). request.c calls only base.c and
 * outpool.c; it knows nothing of the engine above it.
 */
#ifndef HVDL_REQUEST_H_
#define HVDL_REQUEST_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "internal.h"
#include "outpool.h"

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
  int32_t device; /* HVDL_MEM_HOST or HVDL_MEM_CUDA: where the data is. The ranks must agree:
                   * device data runs in cuda.c's chunks, host data in one call */
  double prescale, postscale;
  int64_t dims[HVDL_MAX_DIMS];
  char name[HVDL_MAX_NAME];
  char error[256];
};

/* hvdl_desc.device */
enum { HVDL_MEM_HOST = 0, HVDL_MEM_CUDA = 1 };

enum hvdl_req_state { HVDL_REQ_PENDING = 0, HVDL_REQ_DONE = 1, HVDL_REQ_FAILED = 2 };

/* Where a request is in negotiation (engine thread only). */
enum hvdl_req_phase { HVDL_PHASE_NEW = 0, HVDL_PHASE_ANNOUNCED, HVDL_PHASE_CACHED, HVDL_PHASE_FINISHED };

struct hvdl_requests;

/* One submitted collective. Shared by the submitter (a handle) and the engine;
 * freed when both have let go (refs). */
struct hvdl_request {
  struct hvdl_desc desc;
  const void *send;
  void *recv;                    /* NULL for ALLGATHER/ALLTOALL: the engine allocates `out` */
  size_t count, nbytes;          /* of send */
  int device_id;                 /* desc.device HVDL_MEM_CUDA: the CUDA device of send and recv */
  hvdlStream_t stream;           /* ... and the stream their work is ordered on */
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
  _Atomic int pins;              /* > 0: MPI may still touch its buffers (a failed step, until the next settle) */
  hvdlResult_t result;           /* set before state leaves PENDING */
  int waiters;                   /* threads sleeping on done_cv for this request (under mu) */
  uint64_t name_hash;            /* of desc.name: the in-flight check compares these first */
  char error[HVDL_ERRMSG_LEN];
  struct hvdl_requests *set;     /* the in-flight set it was added to */
  /* engine thread only */
  int phase;
  int cache_id;
  double t_submit, t_ready;
  struct hvdl_request *next, *prev; /* in the in-flight list (under mu) */
  struct hvdl_request *same_bucket;  /* the next in-flight request whose name hashes to the
                                     * same bucket (under mu) */
};

/* Buckets of the in-flight names: a submission checks its name against one bucket's
 * few requests, not against everything in flight (which cost 10 us a submission with
 * 1,000 in flight: docs/benchmarks.md, "Submitting"). */
#define HVDL_NAME_BUCKETS 1024

/* The requests in flight, in submission order, and their waiters. mu also guards
 * the engine's queue state (engine.c); wake_due and wake_due_since belong to the
 * thread that completes requests. */
struct hvdl_requests {
  pthread_mutex_t mu;
  pthread_cond_t done_cv;        /* waiters sleep here */
  struct hvdl_request *head, *tail; /* under mu */
  struct hvdl_request *by_name[HVDL_NAME_BUCKETS]; /* under mu: chains of same_bucket */
  int nwaiting;                  /* threads blocked in hvdl_request_wait_for (under mu) */
  double notify_s;               /* HVD_LITE_NOTIFY_TIME: how long a completion may go unannounced */
  int wake_due;                  /* completions whose waiters have not been woken yet */
  double wake_due_since;
  int dead;                      /* no more requests accepted (under mu) */
  hvdlResult_t dead_result;
  char dead_reason[HVDL_ERRMSG_LEN];
  /* Called under mu when a thread starts waiting and nobody else was (the engine
   * ends its submission batch then). */
  void (*on_first_waiter)(void *arg);
  void *hook_arg;
};

/* FNV-1a of a tensor name: the in-flight check and the cache index compare it first. */
static inline uint64_t hvdl_name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

/* A new request, pending, with one reference (its creator's); NULL when out of memory. */
struct hvdl_request *hvdl_request_new(void);
/* A joined rank's stand-in for the collective d the others run (an allreduce): zeros
 * in, scratch out, one reference; NULL when out of memory. */
struct hvdl_request *hvdl_request_stand_in(const struct hvdl_desc *d);

void hvdl_requests_init(struct hvdl_requests *q, double notify_s,
                        void (*on_first_waiter)(void *), void *hook_arg);
void hvdl_requests_destroy(struct hvdl_requests *q);
/* Under q->mu: appends r (taking the set's reference) unless the set is dead or a
 * request of the same name is in flight (then hvdlInvalidUsage / hvdlInvalidArgument
 * with the reason recorded in the thread's error slot). */
hvdlResult_t hvdl_requests_add_locked(struct hvdl_requests *q, struct hvdl_request *r);
/* Under q->mu: appends all n requests, in order, or none of them (the set is dead, a
 * name is in flight, or a name appears twice among them; the error says which). */
hvdlResult_t hvdl_requests_add_all_locked(struct hvdl_requests *q, struct hvdl_request **rs,
                                          int n);
/* Refuses new requests from now on, with this reason (the first one sticks). */
void hvdl_requests_mark_dead(struct hvdl_requests *q, hvdlResult_t res, const char *reason);
/* Marks the set dead and fails every request in it, waking every waiter. */
void hvdl_requests_fail_all(struct hvdl_requests *q, hvdlResult_t res, const char *reason);
/* Removes r from its set and completes it: hvdlSuccess, or an error with a message.
 * Its waiters are woken at once, or by the next hvdl_requests_notify when the
 * set has a notify time. Drops the set's reference. */
void hvdl_request_complete(struct hvdl_request *r, hvdlResult_t res, const char *msg);
/* Wakes the waiters of completed requests: with `flush`, now; otherwise only once
 * the oldest unannounced completion has waited notify_s. */
void hvdl_requests_notify(struct hvdl_requests *q, int flush);

int hvdl_request_poll(const struct hvdl_request *r);
/* Completed, and MPI touches its buffers no more: they may be let go. */
int hvdl_request_idle(const struct hvdl_request *r);
/* Waits at most `seconds` (r must have been added to a set); returns nonzero
 * once r has completed. */
int hvdl_request_wait_for(struct hvdl_request *r, double seconds);
void hvdl_request_wait(struct hvdl_request *r);
void hvdl_request_release(struct hvdl_request *r);

#endif /* HVDL_REQUEST_H_ */
