/*
 * wire.h -- the bytes a negotiation round sends: descriptors, responses and the
 * layout of each rank's header and bit vector. wire.c writes them, and reads
 * them back checking every field against the message's end and its range, so
 * a malformed message from a peer is an error, never a read past the buffer. It
 * calls only libc and base.c. The coordinator writes responses and reads the
 * gathered descriptors; the negotiation reads responses.
 */
#ifndef HVDL_WIRE_H_
#define HVDL_WIRE_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "request.h"

/* A round's first message, per rank: HVDL_HDR_WORDS header words (word 0: flags
 * below, the byte size of its uncached descriptors in the high half; word 1: rank
 * 0's autotune word, below, 0 from every other rank), then a bit vector with bit k
 * set when a request matching cache entry k is pending. */
#define HVDL_HDR_WORDS 2
#define HVDL_FLAG_LEAVING 1ull
#define HVDL_FLAG_SLOW 2ull
#define HVDL_FLAG_JOINED 4ull
#define HVDL_FLAG_ALARMED 8ull /* sent a data alarm since the last settle (alarm.h) */

/* The autotune word (csrc/autotune.c): the parameters every rank applies after the
 * round, before its ready list. Byte p (enum hvdl_tune_param) is 1 + the index of
 * parameter p's value in its grid, or 0 when rank 0 does not tune p (each rank keeps
 * its own); HVDL_TUNE_SETTLED marks the final choice; the other bits are 0. A word
 * of 0 says nothing: rank 0 is not tuning. */
#define HVDL_TUNE_WORD 1
#define HVDL_TUNE_SETTLED (1ull << 32)
struct hvdl_tune_word {
  int idx[HVDL_TUNE_PARAMS]; /* index in the parameter's grid; -1: not tuned */
  int settled;
};

/* The coordinator's response: a sequence of these, each followed by its fields. */
enum hvdl_resp_kind {
  HVDL_RESP_READY = 1,    /* u32 cache id (or -1), descriptor */
  HVDL_RESP_ERROR = 2,    /* str name, str message */
  HVDL_RESP_EVICT = 3,    /* u32 cache id */
  HVDL_RESP_SHUTDOWN = 4  /* str message */
};

/* Whether rank `rank`'s bit for cache entry `id` is set in the allgathered vectors. */
static inline int hvdl_bit_on(const uint64_t *all, int words, int rank, int id) {
  return (int)((all[(size_t)rank * (size_t)words + HVDL_HDR_WORDS + (size_t)(id / 64)] >> (id % 64)) &
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
hvdlResult_t hvdl_reader_fail(hvdlComm_t comm, const struct hvdl_reader *r, const char *what, int rank);

int hvdl_get_u32(struct hvdl_reader *r, uint32_t *v);
/* A string of fewer than `cap` bytes, without NUL bytes, into out (NUL-terminated). */
int hvdl_get_str(struct hvdl_reader *r, char *out, size_t cap, const char *what);
/* A descriptor as hvdl_desc_put writes it: coll, dtype and op within their enums,
 * 0 <= ndim <= HVDL_MAX_DIMS, dims >= 0 (dims[0] -1 for ALLGATHER and ALLTOALL),
 * at most 2^63 bytes, name and error within their fields. */
int hvdl_desc_get(struct hvdl_reader *r, struct hvdl_desc *d);

/* One response entry, read. */
struct hvdl_resp {
  uint32_t kind;              /* enum hvdl_resp_kind */
  int32_t id;                 /* READY (-1: not cached), EVICT */
  struct hvdl_desc desc;      /* READY */
  char name[HVDL_MAX_NAME];   /* ERROR */
  char msg[HVDL_ERRMSG_LEN];  /* ERROR, SHUTDOWN */
};
/* The next entry of a response applied to a cache of `cache_count` entries: ids
 * are given densely, so a READY id is -1 or at most cache_count (the next new
 * one), and an EVICT id is below it. */
int hvdl_resp_get(struct hvdl_reader *r, int cache_count, struct hvdl_resp *out);

/* The autotune word: written, and read (8 bytes in host order) with `sizes` the
 * grids' lengths; an index past its grid or a reserved bit set is malformed. */
uint64_t hvdl_tune_put(const struct hvdl_tune_word *t);
int hvdl_tune_get(struct hvdl_reader *r, const int sizes[HVDL_TUNE_PARAMS], struct hvdl_tune_word *out);

/* A collective's name in messages: "ALLREDUCE", "ALLGATHER", ... */
const char *hvdl_coll_name(int coll);

#endif /* HVDL_WIRE_H_ */
