/*
 * wire.h -- the bytes a negotiation round sends: descriptors, responses and the
 * layout of each rank's header and bit vector. wire.c writes and reads them; it
 * calls only libc. The coordinator writes responses, the negotiation reads them.
 */
#ifndef HVDL_WIRE_H_
#define HVDL_WIRE_H_

#include <stddef.h>
#include <stdint.h>

#include "request.h"

/* A round's first message, per rank: HVDL_HDR_WORDS header words (flags below;
 * the byte size of its uncached descriptors in the high half of word 0), then a
 * bit vector with bit k set when a request matching cache entry k is pending. */
#define HVDL_HDR_WORDS 2
#define HVDL_FLAG_LEAVING 1ull
#define HVDL_FLAG_SLOW 2ull
#define HVDL_FLAG_JOINED 4ull
#define HVDL_FLAG_ALARMED 8ull /* sent a data alarm since the last settle (alarm.h) */

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

/* A growable byte buffer; the put functions return nonzero when out of memory. */
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

/* Readers: each returns the position after what it read. */
const char *hvdl_desc_get(const char *p, struct hvdl_desc *d);
const char *hvdl_get_u32(const char *p, uint32_t *v);
const char *hvdl_get_str(const char *p, char *out, size_t cap);

#endif /* HVDL_WIRE_H_ */
