/*
 * request.h -- the request layer's contract, shared by negotiation, execution and the
 * engine: a request's life (request.c), the bytes on the wire (wire.c), alarms between
 * ranks (failure_alarm.c), the outputs the engine recycles (output_pool.c) and the
 * timeline (timeline.c). Each file's part follows.
 */
#ifndef HVDL_REQUEST_REQUEST_H_
#define HVDL_REQUEST_REQUEST_H_

#include "base/base.h"

/* ---- output_pool.c ------------------------------------------------------------------------- */

/*
 * Recycled engine-allocated outputs (allgather, alltoall); see
 * output_pool.c. Thread-safe: the executor takes buffers, the Python side's release
 * of a request gives them back.
 */

#include <pthread.h>
#include <stddef.h>

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

/* ---- request.c ----------------------------------------------------------------------------- */

/*
 * One submitted collective and its life: what describes it
 * (struct hvdl_desc, compared across ranks), the request itself, and the set of
 * requests in flight with the lock and condition variable its waiters sleep on.
 *
 * A request is created (hvdl_request_new) by the binding, or by the negotiation
 * for a joined rank's stand-in (hvdl_request_stand_in), added to the in-flight set
 * at submit, alone or with its group (hvdl_requests_add_locked, hvdl_requests_add_all_locked),
 * completed or failed by the engine's parts
 * (hvdl_request_complete, hvdl_requests_fail_all), waited on by its submitter
 * (hvdl_request_poll, hvdl_request_wait, hvdl_request_wait_for) and freed when
 * both have let go (hvdl_request_release). request.c calls only base/ and
 * output_pool.c; it knows nothing of the engine above it.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

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
enum hvdl_req_phase {
  HVDL_PHASE_NEW = 0,
  HVDL_PHASE_ANNOUNCED,
  HVDL_PHASE_CACHED,
  HVDL_PHASE_FINISHED
};

struct hvdl_requests;

/* One submitted collective. Shared by the submitter (a handle) and the engine;
 * freed when both have let go (refs). */
struct hvdl_request {
  struct hvdl_desc desc;
  const void *send;
  void *recv;           /* NULL for ALLGATHER/ALLTOALL: the engine allocates `out` */
  size_t count, nbytes; /* of send */
  int device_id;        /* desc.device HVDL_MEM_CUDA: the CUDA device of send and recv */
  hvdlStream_t stream;  /* ... and the stream their work is ordered on */
  int64_t dim0;         /* this rank's first dimension (ALLGATHER, ALLTOALL) */
  int64_t *splits;      /* ALLTOALL: rows for each rank (size entries), or NULL */
  void *out;            /* engine-allocated output, freed with the request */
  size_t out_bytes;
  size_t out_cap;                /* its allocated size */
  struct hvdl_outpool *out_pool; /* where `out` goes back to (NULL: free it) */
  int64_t out_dim0;              /* rows of `out` */
  int64_t *recv_splits;          /* ALLTOALL: rows received from each rank */
  int64_t value;                 /* JOIN: the last rank to join */
  void *zeros;                   /* a joined rank's stand-in input (engine-made requests) */
  _Atomic int state;             /* enum hvdl_req_state */
  _Atomic int refs;
  _Atomic int
      pins; /* > 0: MPI may still touch its buffers (a failed step, until the next settle) */
  hvdlResult_t result; /* set before state leaves PENDING */
  int waiters;         /* threads sleeping on done_cv for this request (under mu) */
  uint64_t name_hash;  /* of desc.name: the in-flight check compares these first */
  char error[HVDL_ERRMSG_LEN];
  struct hvdl_requests *set; /* the in-flight set it was added to */
  /* engine thread only */
  int phase;
  int cache_id;
  double t_submit, t_ready;
  struct hvdl_request *next, *prev; /* in the in-flight list (under mu) */
  struct hvdl_request *same_bucket; /* the next in-flight request whose name hashes to the
                                     * same bucket (under mu) */
};

/* Buckets of the in-flight names: a submission checks its name against one bucket's
 * few requests, not against everything in flight (which cost 10 us a submission with
 * 1,000 in flight: docs/benchmarks-history.md, "Submitting"). */
#define HVDL_NAME_BUCKETS 1024

/* The requests in flight, in submission order, and their waiters. mu also guards
 * the engine's queue state (engine.c); wake_due and wake_due_since belong to the
 * thread that completes requests. */
struct hvdl_requests {
  pthread_mutex_t mu;
  pthread_cond_t done_cv;                          /* waiters sleep here */
  struct hvdl_request *head, *tail;                /* under mu */
  struct hvdl_request *by_name[HVDL_NAME_BUCKETS]; /* under mu: chains of same_bucket */
  int nwaiting;    /* threads blocked in hvdl_request_wait_for (under mu) */
  double notify_s; /* HVD_LITE_NOTIFY_TIME: how long a completion may go unannounced */
  int wake_due;    /* completions whose waiters have not been woken yet */
  double wake_due_since;
  int dead; /* no more requests accepted (under mu) */
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

void hvdl_requests_init(struct hvdl_requests *q, double notify_s, void (*on_first_waiter)(void *),
                        void *hook_arg);
void hvdl_requests_destroy(struct hvdl_requests *q);
/* Under q->mu: appends r (taking the set's reference) unless the set is dead or a
 * request of the same name is in flight (then hvdlInvalidUsage / hvdlInvalidArgument
 * with the reason recorded in the thread's error slot). */
hvdlResult_t hvdl_requests_add_locked(struct hvdl_requests *q, struct hvdl_request *r);
/* Under q->mu: appends all n requests, in order, or none of them (the set is dead, a
 * name is in flight, or a name appears twice among them; the error says which). */
hvdlResult_t hvdl_requests_add_all_locked(struct hvdl_requests *q, struct hvdl_request **rs, int n);
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

/* ---- wire.c -------------------------------------------------------------------------------- */

/*
 * The bytes a negotiation round sends: descriptors, responses and the
 * layout of each rank's header and bit vector. wire.c writes them, and reads
 * them back checking every field against the message's end and its range, so
 * a malformed message from a peer is an error, never a read past the buffer. It
 * calls only libc and base/. The coordinator writes responses and reads the
 * gathered descriptors; the negotiation reads responses.
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A round's first message, per rank: HVDL_HDR_WORDS header words (word 0: flags
 * below, the byte size of its uncached descriptors in the high half; word 1: rank
 * 0's autotune word, below, 0 from every other rank), then a bit vector with bit k
 * set when a request matching cache entry k is pending. */
#define HVDL_HDR_WORDS    2
#define HVDL_FLAG_LEAVING 1ull
#define HVDL_FLAG_SLOW    2ull
#define HVDL_FLAG_JOINED  4ull
#define HVDL_FLAG_ALARMED 8ull /* sent a data alarm since the last settle (request.h) */

/* The autotune word (csrc/engine/autotune.c): the parameters every rank applies after the
 * round, before its ready list. Byte p (enum hvdl_tune_param) is 1 + the index of
 * parameter p's value in its grid, or 0 when rank 0 does not tune p (each rank keeps
 * its own); HVDL_TUNE_SETTLED marks the final choice; the other bits are 0. A word
 * of 0 says nothing: rank 0 is not tuning. */
#define HVDL_TUNE_WORD    1
#define HVDL_TUNE_SETTLED (1ull << 32)
struct hvdl_tune_word {
  int idx[HVDL_TUNE_PARAMS]; /* index in the parameter's grid; -1: not tuned */
  int settled;
};

/* The coordinator's response: a sequence of these, each followed by its fields. */
enum hvdl_resp_kind {
  HVDL_RESP_READY = 1,   /* u32 cache id (or -1), descriptor */
  HVDL_RESP_ERROR = 2,   /* str name, str message */
  HVDL_RESP_EVICT = 3,   /* u32 cache id */
  HVDL_RESP_SHUTDOWN = 4 /* str message */
};

/* Whether rank `rank`'s bit for cache entry `id` is set in the allgathered vectors. */
static inline int hvdl_bit_on(const uint64_t *all, int words, int rank, int id) {
  return (
      int)((all[(size_t)rank * (size_t)words + HVDL_HDR_WORDS + (size_t)(id / 64)] >> (id % 64)) &
           1u);
}

/* Scale factors are compared by their bits, as they travel: the same NaN on
 * every rank agrees; 0.0 and -0.0 do not. */
static inline int hvdl_same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---- writing ------------------------------------------------------------- */

/* A growable byte buffer; the put functions return nonzero when out of memory
 * (what was written before stays, so a caller that fails must drop the buffer). */
struct hvdl_buf {
  char *p;
  size_t len, cap;
};
int hvdl_buf_put(struct hvdl_buf *b, const void *src, size_t n);
int hvdl_buf_put_u32(struct hvdl_buf *b, uint32_t v);
int hvdl_buf_put_str(struct hvdl_buf *b, const char *s);
int hvdl_desc_put(struct hvdl_buf *b, const struct hvdl_desc *d);
/* The bytes hvdl_desc_put writes for d. */
size_t hvdl_desc_size(const struct hvdl_desc *d);

/* One response entry each; `id` -1 is "not cached" (READY only). */
int hvdl_resp_put_ready(struct hvdl_buf *b, int id, const struct hvdl_desc *d);
int hvdl_resp_put_error(struct hvdl_buf *b, const char *name, const char *msg);
int hvdl_resp_put_evict(struct hvdl_buf *b, int id);
int hvdl_resp_put_shutdown(struct hvdl_buf *b, const char *msg);

/* ---- reading --------------------------------------------------------------- */

/* A message from a peer being read. A get that succeeds returns 0 and moves p
 * past what it read; one that fails (the field runs past `end`, or a value is
 * out of its range) returns nonzero, leaves p at the start of the item it was
 * reading and says why. Nothing is read at or past `end`. */
struct hvdl_reader {
  const char *p, *begin, *end;
  char why[200];
};

void hvdl_reader_init(struct hvdl_reader *r, const void *p, size_t len);
static inline int hvdl_reader_done(const struct hvdl_reader *r) { return r->p == r->end; }
/* Records "negotiation: malformed <what> from rank <rank> (byte <at> of <len>): <why>"
 * on comm and returns hvdlInternalError (both ends run the same build, so only a
 * bug or corruption makes one). */
hvdlResult_t hvdl_reader_fail(hvdlComm_t comm, const struct hvdl_reader *r, const char *what,
                              int rank);

int hvdl_get_u32(struct hvdl_reader *r, uint32_t *v);
/* A string of fewer than `cap` bytes, without NUL bytes, into out (NUL-terminated). */
int hvdl_get_str(struct hvdl_reader *r, char *out, size_t cap, const char *what);
/* A descriptor as hvdl_desc_put writes it: coll, dtype and op within their enums,
 * 0 <= ndim <= HVDL_MAX_DIMS, dims >= 0 (dims[0] -1 for ALLGATHER and ALLTOALL),
 * at most 2^63 bytes, name and error within their fields. */
int hvdl_desc_get(struct hvdl_reader *r, struct hvdl_desc *d);

/* One response entry, read. */
struct hvdl_resp {
  uint32_t kind;             /* enum hvdl_resp_kind */
  int32_t id;                /* READY (-1: not cached), EVICT */
  struct hvdl_desc desc;     /* READY */
  char name[HVDL_MAX_NAME];  /* ERROR */
  char msg[HVDL_ERRMSG_LEN]; /* ERROR, SHUTDOWN */
};
/* The next entry of a response applied to a cache of `cache_count` entries: ids
 * are given densely, so a READY id is -1 or at most cache_count (the next new
 * one), and an EVICT id is below it. */
int hvdl_resp_get(struct hvdl_reader *r, int cache_count, struct hvdl_resp *out);

/* The autotune word: written, and read (8 bytes in host order) with `sizes` the
 * grids' lengths; an index past its grid or a reserved bit set is malformed. */
uint64_t hvdl_tune_put(const struct hvdl_tune_word *t);
int hvdl_tune_get(struct hvdl_reader *r, const int sizes[HVDL_TUNE_PARAMS],
                  struct hvdl_tune_word *out);

/* A collective's name in messages: "ALLREDUCE", "ALLGATHER", ... */
const char *hvdl_coll_name(int coll);

/* ---- failure_alarm.c ----------------------------------------------------------------------- */

/*
 * Alarms: how one rank's failure reaches the others (docs/design.md,
 * "Failures"). A rank whose part of a collective fails sends a data alarm to every
 * other rank; a rank whose engine fails sends an engine alarm. Both travel on the
 * control communicator, point to point, with tags of their own. failure_alarm.c calls
 * errors.c and MPI; the executor, the negotiation and the engine call it.
 */

#include <stdint.h>

#define HVDL_NO_STEP UINT64_MAX

/* What an alarm says: the step of the ready lists that failed (the engine counts
 * steps identically on every rank), the failing rank, its result code and message. */
struct hvdl_alarm_note {
  uint64_t step;
  int rank;
  int code;
  char msg[HVDL_ERRMSG_LEN];
};

struct hvdl_alarm {
  MPI_Comm comm;
  int rank, size;
  unsigned epoch; /* settles so far */
  /* data alarms of the current epoch (until the next settle) */
  int sent;                     /* this rank has sent its data alarm */
  unsigned char *got;           /* [size]: rank q's data alarm has been received */
  struct hvdl_alarm_note first; /* the earliest failed step known here (HVDL_NO_STEP: none) */
  /* engine alarms */
  int engine_sent;
  int engine_down; /* an engine alarm has been received */
  struct hvdl_alarm_note engine;
  /* buffers and requests of what this rank sent */
  char *out, *engine_out;
  MPI_Request *sreq, *engine_sreq;
};

hvdlResult_t hvdl_alarm_init(struct hvdl_alarm *a, MPI_Comm comm);
void hvdl_alarm_free(struct hvdl_alarm *a);

/* This rank failed step `step` (code, msg): record it and, once an epoch, tell
 * every other rank. */
void hvdl_alarm_raise(struct hvdl_alarm *a, uint64_t step, int code, const char *msg);
/* This rank's engine is failing: tell every other rank (once). */
void hvdl_alarm_raise_engine(struct hvdl_alarm *a, int code, const char *msg);
/* Receives the alarms that have arrived; returns 1 if any did. */
int hvdl_alarm_poll(struct hvdl_alarm *a);
/* Whether step `step` has failed somewhere (a data alarm for it or an earlier step). */
static inline int hvdl_alarm_failed(const struct hvdl_alarm *a, uint64_t step) {
  return a->first.step <= step;
}
/* Ends the epoch, on every rank in the same round: receives the data alarms still
 * owed by the ranks flagged in alarmed[], completes this rank's own, and forgets
 * them. */
hvdlResult_t hvdl_alarm_settle(struct hvdl_alarm *a, const unsigned char *alarmed);

/* ---- timeline.c ---------------------------------------------------------------------------- */

/*
 * Chrome-trace events written by rank 0 (timeline.c); every call
 * is a no-op when tl is NULL. Called by the engine and the executor.
 */

struct hvdl_timeline;

struct hvdl_timeline *hvdl_timeline_open(const char *path);
void hvdl_timeline_event(struct hvdl_timeline *tl, const char *tensor, const char *phase,
                         double t_begin, double t_end);
void hvdl_timeline_flush(struct hvdl_timeline *tl);
void hvdl_timeline_close(struct hvdl_timeline *tl);

#endif /* HVDL_REQUEST_REQUEST_H_ */
