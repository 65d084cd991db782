/*
 * wire.c -- writing and reading a round's bytes (request.h): descriptors as a fixed
 * part, the dimensions, then the name and the error as length-prefixed strings;
 * responses as a kind word and that kind's fields. Both ends run the same build,
 * so fields travel in the host's byte order. The readers accept exactly what the
 * writers write: every length is checked against the bytes left before it is
 * used, and every value against its range.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request/request.h"

/* ---- growable byte buffer ------------------------------------------------ */

int hvdl_buf_put(struct hvdl_buf *b, const void *src, size_t n) {
  if (n > SIZE_MAX / 4 - b->len) return -1;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, src, n);
  b->len += n;
  return 0;
}

int hvdl_buf_put_u32(struct hvdl_buf *b, uint32_t v) { return hvdl_buf_put(b, &v, sizeof v); }

int hvdl_buf_put_str(struct hvdl_buf *b, const char *s) {
  uint32_t n = (uint32_t)strlen(s);
  return hvdl_buf_put_u32(b, n) || hvdl_buf_put(b, s, n);
}

/* ---- descriptors and responses, written ---------------------------------- */

struct wire_fixed {
  int32_t coll, dtype, op, ndim, root, device;
  double prescale, postscale;
};

int hvdl_desc_put(struct hvdl_buf *b, const struct hvdl_desc *d) {
  struct wire_fixed f = {d->coll, d->dtype,  d->op,       d->ndim,
                         d->root, d->device, d->prescale, d->postscale};
  return hvdl_buf_put(b, &f, sizeof f) ||
         hvdl_buf_put(b, d->dims, sizeof(int64_t) * (size_t)d->ndim) ||
         hvdl_buf_put_str(b, d->name) || hvdl_buf_put_str(b, d->error);
}

size_t hvdl_desc_size(const struct hvdl_desc *d) {
  return sizeof(struct wire_fixed) + sizeof(int64_t) * (size_t)d->ndim + 8 + strlen(d->name) +
         strlen(d->error);
}

int hvdl_resp_put_ready(struct hvdl_buf *b, int id, const struct hvdl_desc *d) {
  return hvdl_buf_put_u32(b, HVDL_RESP_READY) || hvdl_buf_put_u32(b, (uint32_t)id) ||
         hvdl_desc_put(b, d);
}

int hvdl_resp_put_error(struct hvdl_buf *b, const char *name, const char *msg) {
  return hvdl_buf_put_u32(b, HVDL_RESP_ERROR) || hvdl_buf_put_str(b, name) ||
         hvdl_buf_put_str(b, msg);
}

int hvdl_resp_put_evict(struct hvdl_buf *b, int id) {
  return hvdl_buf_put_u32(b, HVDL_RESP_EVICT) || hvdl_buf_put_u32(b, (uint32_t)id);
}

int hvdl_resp_put_shutdown(struct hvdl_buf *b, const char *msg) {
  return hvdl_buf_put_u32(b, HVDL_RESP_SHUTDOWN) || hvdl_buf_put_str(b, msg);
}

/* ---- reading ------------------------------------------------------------- */

void hvdl_reader_init(struct hvdl_reader *r, const void *p, size_t len) {
  r->begin = r->p = (const char *)p;
  r->end = r->begin + len;
  r->why[0] = '\0';
}

hvdlResult_t hvdl_reader_fail(hvdlComm_t comm, const struct hvdl_reader *r, const char *what,
                              int rank) {
  return hvdl_fail(comm, hvdlInternalError,
                   "negotiation: malformed %s from rank %d (byte %zu of %zu): %s", what, rank,
                   (size_t)(r->p - r->begin), (size_t)(r->end - r->begin), r->why);
}

/* Fails the read that started at `start`: p goes back there, `why` says what was wrong. */
__attribute__((format(printf, 3, 4))) static int bad(struct hvdl_reader *r, const char *start,
                                                     const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
  r->p = start;
  return -1;
}

/* The same, with `prefix` before the reason an inner read gave. */
static int bad_in(struct hvdl_reader *r, const char *start, const char *prefix) {
  char inner[sizeof r->why];
  memcpy(inner, r->why, sizeof inner);
  return bad(r, start, "%s: %s", prefix, inner);
}

static size_t left(const struct hvdl_reader *r) { return (size_t)(r->end - r->p); }

int hvdl_get_u32(struct hvdl_reader *r, uint32_t *v) {
  if (left(r) < sizeof *v) return bad(r, r->p, "a 4-byte field with %zu bytes left", left(r));
  memcpy(v, r->p, sizeof *v);
  r->p += sizeof *v;
  return 0;
}

int hvdl_get_str(struct hvdl_reader *r, char *out, size_t cap, const char *what) {
  const char *start = r->p;
  uint32_t n;
  if (hvdl_get_u32(r, &n))
    return bad(r, start, "%s: its length with %zu bytes left", what, left(r));
  if (n >= cap) return bad(r, start, "%s: length %u, the limit is %zu", what, n, cap - 1);
  if (n > left(r)) return bad(r, start, "%s: length %u with %zu bytes left", what, n, left(r));
  if (memchr(r->p, '\0', n)) return bad(r, start, "%s: a NUL byte inside its %u bytes", what, n);
  memcpy(out, r->p, n);
  out[n] = '\0';
  r->p += n;
  return 0;
}

int hvdl_desc_get(struct hvdl_reader *r, struct hvdl_desc *d) {
  const char *start = r->p;
  struct wire_fixed f;
  if (left(r) < sizeof f)
    return bad(r, start, "descriptor: %zu bytes left, its fixed part takes %zu", left(r), sizeof f);
  memcpy(&f, r->p, sizeof f);
  if (f.coll < 0 || f.coll >= HVDL_NUM_COLLS)
    return bad(r, start, "descriptor: collective %d is not in 0..%d", f.coll, HVDL_NUM_COLLS - 1);
  if (!hvdl_type_valid(f.dtype))
    return bad(r, start, "descriptor: data type %d is not in 0..%d or %d..%d", f.dtype,
               hvdlNumTypes - 1, hvdlExtTypesBegin, hvdlExtTypesEnd - 1);
  if (!hvdl_op_valid(f.op))
    return bad(r, start, "descriptor: reduction op %d is not in 0..%d or %d..%d", f.op,
               hvdlNumOps - 1, hvdlExtOpsBegin, hvdlExtOpsEnd - 1);
  if (f.ndim < 0 || f.ndim > HVDL_MAX_DIMS)
    return bad(r, start, "descriptor: ndim %d is not in 0..%d", f.ndim, HVDL_MAX_DIMS);
  if (f.device != HVDL_MEM_HOST && f.device != HVDL_MEM_CUDA)
    return bad(r, start, "descriptor: memory kind %d is not %d (host) or %d (CUDA)", f.device,
               HVDL_MEM_HOST, HVDL_MEM_CUDA);
  r->p += sizeof f;
  const size_t dims_bytes = sizeof(int64_t) * (size_t)f.ndim;
  if (left(r) < dims_bytes)
    return bad(r, start, "descriptor: %d dimensions with %zu bytes left", f.ndim, left(r));
  memset(d, 0, sizeof *d);
  memcpy(d->dims, r->p, dims_bytes);
  r->p += dims_bytes;
  /* The first dimension of an allgather or alltoall may differ per rank: -1 here. */
  const int any_dim0 = f.coll == HVDL_COLL_ALLGATHER || f.coll == HVDL_COLL_ALLTOALL;
  uint64_t bytes = hvdl_type_size((hvdlDataType_t)f.dtype);
  for (int i = 0; i < f.ndim; i++) {
    const int64_t n = d->dims[i];
    if (n < 0 && !(n == -1 && i == 0 && any_dim0))
      return bad(r, start, "descriptor: dimension %d is %lld", i, (long long)n);
    const uint64_t m = n < 0 ? 1 : (uint64_t)n;
    if (m && bytes > (uint64_t)INT64_MAX / m)
      return bad(r, start, "descriptor: its shape is more than 2^63 bytes");
    bytes *= m;
  }
  if (hvdl_get_str(r, d->name, sizeof d->name, "name") ||
      hvdl_get_str(r, d->error, sizeof d->error, "error"))
    return bad_in(r, start, "descriptor");
  d->coll = f.coll;
  d->dtype = f.dtype;
  d->op = f.op;
  d->ndim = f.ndim;
  d->root = f.root;
  d->device = f.device;
  d->prescale = f.prescale;
  d->postscale = f.postscale;
  return 0;
}

int hvdl_resp_get(struct hvdl_reader *r, int cache_count, struct hvdl_resp *out) {
  const char *start = r->p;
  uint32_t id;
  if (hvdl_get_u32(r, &out->kind)) return bad_in(r, start, "response entry");
  switch (out->kind) {
    case HVDL_RESP_READY:
      if (hvdl_get_u32(r, &id)) return bad_in(r, start, "READY cache id");
      out->id = (int32_t)id;
      if (out->id < -1 || out->id > cache_count)
        return bad(r, start, "READY: cache id %d is neither -1 nor at most %d", out->id,
                   cache_count);
      if (hvdl_desc_get(r, &out->desc)) return bad_in(r, start, "READY");
      return 0;
    case HVDL_RESP_ERROR:
      if (hvdl_get_str(r, out->name, sizeof out->name, "name") ||
          hvdl_get_str(r, out->msg, sizeof out->msg, "message"))
        return bad_in(r, start, "ERROR");
      return 0;
    case HVDL_RESP_EVICT:
      if (hvdl_get_u32(r, &id)) return bad_in(r, start, "EVICT cache id");
      out->id = (int32_t)id;
      if (out->id < 0 || out->id >= cache_count)
        return bad(r, start, "EVICT: cache id %d is not in 0..%d", out->id, cache_count - 1);
      return 0;
    case HVDL_RESP_SHUTDOWN:
      if (hvdl_get_str(r, out->msg, sizeof out->msg, "message"))
        return bad_in(r, start, "SHUTDOWN");
      return 0;
    default: return bad(r, start, "unknown response kind %u", out->kind);
  }
}

uint64_t hvdl_tune_put(const struct hvdl_tune_word *t) {
  uint64_t w = t->settled ? HVDL_TUNE_SETTLED : 0;
  for (int p = 0; p < HVDL_TUNE_PARAMS; p++) w |= (uint64_t)(t->idx[p] + 1) << (8 * p);
  return w;
}

int hvdl_tune_get(struct hvdl_reader *r, const int sizes[HVDL_TUNE_PARAMS],
                  struct hvdl_tune_word *out) {
  const char *start = r->p;
  uint64_t w;
  if (left(r) < sizeof w)
    return bad(r, start, "autotune word: %zu bytes left, it takes 8", left(r));
  memcpy(&w, r->p, sizeof w);
  const uint64_t known = HVDL_TUNE_SETTLED | ((1ull << (8 * HVDL_TUNE_PARAMS)) - 1);
  if (w & ~known)
    return bad(r, start, "autotune word 0x%llx: reserved bits set", (unsigned long long)w);
  for (int p = 0; p < HVDL_TUNE_PARAMS; p++) {
    const int v = (int)((w >> (8 * p)) & 0xff);
    if (v > sizes[p])
      return bad(r, start, "autotune word 0x%llx: parameter %d has value %d of %d",
                 (unsigned long long)w, p, v - 1, sizes[p]);
    out->idx[p] = v - 1;
  }
  out->settled = (w & HVDL_TUNE_SETTLED) != 0;
  r->p += sizeof w;
  return 0;
}

const char *hvdl_coll_name(int coll) {
  static const char *names[HVDL_NUM_COLLS] = {"ALLREDUCE",     "ALLGATHER", "BROADCAST", "ALLTOALL",
                                              "REDUCESCATTER", "BARRIER",   "JOIN"};
  return coll >= 0 && coll < HVDL_NUM_COLLS ? names[coll] : "UNKNOWN";
}
