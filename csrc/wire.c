/*
 * wire.c -- writing and reading a round's bytes (wire.h): descriptors as a fixed
 * part, the dimensions, then the name and the error as length-prefixed strings.
 * Both ends run the same build, so fields travel in the host's byte order.
 */
#include <stdlib.h>
#include <string.h>

#include "wire.h"

/* ---- growable byte buffer ------------------------------------------------ */

int hvdl_buf_put(struct hvdl_buf *b, const void *src, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
  return 0;
}

int hvdl_buf_put_u32(struct hvdl_buf *b, uint32_t v) { return hvdl_buf_put(b, &v, sizeof v); }

int hvdl_buf_put_str(struct hvdl_buf *b, const char *s) {
  uint32_t n = (uint32_t)strlen(s);
  return hvdl_buf_put_u32(b, n) || hvdl_buf_put(b, s, n);
}

/* ---- descriptors on the wire --------------------------------------------- */

struct wire_fixed {
  int32_t coll, dtype, op, ndim, root, pad;
  double prescale, postscale;
};

int hvdl_desc_put(struct hvdl_buf *b, const struct hvdl_desc *d) {
  struct wire_fixed f = {d->coll, d->dtype, d->op, d->ndim, d->root, 0, d->prescale, d->postscale};
  return hvdl_buf_put(b, &f, sizeof f) || hvdl_buf_put(b, d->dims, sizeof(int64_t) * (size_t)d->ndim) ||
         hvdl_buf_put_str(b, d->name) || hvdl_buf_put_str(b, d->error);
}

size_t hvdl_desc_size(const struct hvdl_desc *d) {
  return sizeof(struct wire_fixed) + sizeof(int64_t) * (size_t)d->ndim + 8 + strlen(d->name) +
         strlen(d->error);
}

const char *hvdl_desc_get(const char *p, struct hvdl_desc *d) {
  struct wire_fixed f;
  memcpy(&f, p, sizeof f);
  p += sizeof f;
  memset(d, 0, sizeof *d);
  d->coll = f.coll;
  d->dtype = f.dtype;
  d->op = f.op;
  d->ndim = f.ndim;
  d->root = f.root;
  d->prescale = f.prescale;
  d->postscale = f.postscale;
  memcpy(d->dims, p, sizeof(int64_t) * (size_t)f.ndim);
  p += sizeof(int64_t) * (size_t)f.ndim;
  uint32_t n;
  memcpy(&n, p, 4);
  p += 4;
  memcpy(d->name, p, n < HVDL_MAX_NAME ? n : HVDL_MAX_NAME - 1);
  p += n;
  memcpy(&n, p, 4);
  p += 4;
  memcpy(d->error, p, n < sizeof d->error ? n : sizeof d->error - 1);
  return p + n;
}

const char *hvdl_get_u32(const char *p, uint32_t *v) {
  memcpy(v, p, 4);
  return p + 4;
}

const char *hvdl_get_str(const char *p, char *out, size_t cap) {
  uint32_t n;
  p = hvdl_get_u32(p, &n);
  size_t k = n < cap ? n : cap - 1;
  memcpy(out, p, k);
  out[k] = '\0';
  return p + n;
}
