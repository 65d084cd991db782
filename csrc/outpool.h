/*
 * outpool.h -- recycled engine-allocated outputs (allgather, alltoall); see
 * outpool.c. Thread-safe: the executor takes buffers, the Python side's release
 * of a request gives them back.
 */
#ifndef HVDL_OUTPOOL_H_
#define HVDL_OUTPOOL_H_

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

#endif /* HVDL_OUTPOOL_H_ */
