/*
 * output_pool.c -- recycling the outputs the engine allocates (allgather, alltoall).
 *
 * Their size is known only once the ranks have exchanged their first dimensions,
 * so the engine allocates them. A large fresh malloc is fresh pages from the
 * kernel, and faulting them in cost more than moving the data (perf, alltoall at
 * 64 MiB on 2 ranks: 77 % of the engine's time in page faults and zeroing, 9 % in
 * the copy; docs/benchmarks-history.md). An output that Python lets go returns here and
 * serves a later call of the same size or up to twice smaller.
 */
#include <stdlib.h>

#include "request/request.h"

void hvdl_outpool_init(struct hvdl_outpool *p) {
  pthread_mutex_init(&p->mu, NULL);
  for (int i = 0; i < HVDL_OUTPOOL_SLOTS; i++) {
    p->buf[i] = NULL;
    p->cap[i] = 0;
  }
}

void *hvdl_outpool_get(struct hvdl_outpool *p, size_t bytes, size_t *cap) {
  void *buf = NULL;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < HVDL_OUTPOOL_SLOTS && !buf; i++) {
    if (p->buf[i] && p->cap[i] >= bytes && p->cap[i] / 2 <= bytes) {
      buf = p->buf[i];
      *cap = p->cap[i];
      p->buf[i] = NULL;
      p->cap[i] = 0;
    }
  }
  pthread_mutex_unlock(&p->mu);
  if (!buf) {
    buf = malloc(bytes ? bytes : 1);
    *cap = bytes ? bytes : 1;
  }
  return buf;
}

void hvdl_outpool_put(struct hvdl_outpool *p, void *buf, size_t cap) {
  pthread_mutex_lock(&p->mu);
  int slot = -1; /* a free slot, else the one keeping the smallest buffer */
  for (int i = 0; i < HVDL_OUTPOOL_SLOTS && slot < 0; i++)
    if (!p->buf[i]) slot = i;
  if (slot < 0) {
    slot = 0;
    for (int i = 1; i < HVDL_OUTPOOL_SLOTS; i++)
      if (p->cap[i] < p->cap[slot]) slot = i;
  }
  void *evicted = NULL;
  if (!p->buf[slot]) {
    p->buf[slot] = buf;
    p->cap[slot] = cap;
  } else if (p->cap[slot] < cap) {
    evicted = p->buf[slot];
    p->buf[slot] = buf;
    p->cap[slot] = cap;
  } else {
    evicted = buf;
  }
  pthread_mutex_unlock(&p->mu);
  free(evicted);
}

void hvdl_outpool_free(struct hvdl_outpool *p) {
  for (int i = 0; i < HVDL_OUTPOOL_SLOTS; i++) free(p->buf[i]);
  pthread_mutex_destroy(&p->mu);
}
