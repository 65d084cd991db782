/*
 * fusion.c -- executing a round's ready list on the data communicator.
 *
 * Tensor fusion: requests smaller than HVD_LITE_FUSION_THRESHOLD with the same
 * dtype, op and scale factors are packed (prescale applied while copying) into
 * one buffer of at most the threshold, reduced with one all-reduce in place,
 * and unpacked (postscale applied while copying). A request at or above the
 * threshold goes alone and without a copy: the ring reads the caller's input and
 * writes the caller's output. Threshold 0 sends every request alone.
 *
 * The grouping is a function of the ready list alone, which is the same on
 * every rank, so every rank makes the same all-reduce calls in the same order.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "reduce.h"

static int same_key(const struct hvdl_request *a, const struct hvdl_request *b) {
  return a->desc.dtype == b->desc.dtype && a->desc.op == b->desc.op &&
         a->desc.prescale == b->desc.prescale && a->desc.postscale == b->desc.postscale;
}

/* Timeline events of the all-reduce just run (rank 0 only). */
static void note_allreduce(struct hvdl_engine *e, const struct hvdl_request *r, double t0,
                           double t1, size_t bytes) {
  if (!e->timeline) return;
  const double *ph = e->data->phase_time;
  if (bytes > e->data->config.smallAllReduceBytes && e->size > 1 && ph[0] >= t0) {
    hvdl_timeline_event(e->timeline, r->desc.name, "RING_REDUCE_SCATTER", ph[0], ph[1]);
    hvdl_timeline_event(e->timeline, r->desc.name, "RING_ALL_GATHER", ph[1], ph[2]);
  } else {
    hvdl_timeline_event(e->timeline, r->desc.name, "ALLREDUCE", t0, t1);
  }
}

static void note_queue(struct hvdl_engine *e, const struct hvdl_request *r, double start) {
  if (!e->timeline) return;
  hvdl_timeline_event(e->timeline, r->desc.name, "NEGOTIATE", r->t_submit, r->t_ready);
  hvdl_timeline_event(e->timeline, r->desc.name, "QUEUE", r->t_ready, start);
}

static hvdlResult_t run_one(struct hvdl_engine *e, struct hvdl_request *r) {
  const hvdlDataType_t dt = (hvdlDataType_t)r->desc.dtype;
  double t0 = hvdl_now();
  note_queue(e, r, t0);
  const void *src = r->send;
  if (r->desc.prescale != 1.0) {
    hvdl_scale(r->recv, r->send, r->count, dt, r->desc.prescale);
    src = r->recv;
  }
  hvdlResult_t res = hvdlAllReduce(src, r->recv, r->count, dt, (hvdlRedOp_t)r->desc.op, e->data, NULL);
  double t1 = hvdl_now();
  if (res == hvdlSuccess) {
    note_allreduce(e, r, t0, t1, r->nbytes);
    if (r->desc.postscale != 1.0) hvdl_scale(r->recv, r->recv, r->count, dt, r->desc.postscale);
  }
  hvdl_engine_complete(e, r, res, res == hvdlSuccess ? NULL : hvdlGetLastError(e->data));
  return res;
}

static hvdlResult_t run_fused(struct hvdl_engine *e, struct hvdl_request **group, int m,
                              size_t total) {
  const hvdlDataType_t dt = (hvdlDataType_t)group[0]->desc.dtype;
  const size_t es = hvdl_type_size(dt);
  hvdlResult_t res = hvdl_reserve(e->data, &e->fusion, &e->fusion_bytes, total);
  const double t0 = hvdl_now();
  size_t off = 0;
  for (int i = 0; i < m && res == hvdlSuccess; i++) {
    note_queue(e, group[i], t0);
    hvdl_scale(e->fusion + off, group[i]->send, group[i]->count, dt, group[i]->desc.prescale);
    off += group[i]->nbytes;
  }
  const double t1 = hvdl_now();
  if (res == hvdlSuccess)
    res = hvdlAllReduce(e->fusion, e->fusion, total / es, dt, (hvdlRedOp_t)group[0]->desc.op,
                        e->data, NULL);
  const double t2 = hvdl_now();
  off = 0;
  for (int i = 0; i < m && res == hvdlSuccess; i++) {
    hvdl_scale(group[i]->recv, e->fusion + off, group[i]->count, dt, group[i]->desc.postscale);
    off += group[i]->nbytes;
  }
  const double t3 = hvdl_now();
  for (int i = 0; i < m; i++) {
    if (res == hvdlSuccess && e->timeline) {
      hvdl_timeline_event(e->timeline, group[i]->desc.name, "MEMCPY_IN_FUSION_BUFFER", t0, t1);
      note_allreduce(e, group[i], t1, t2, total);
      hvdl_timeline_event(e->timeline, group[i]->desc.name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
    }
    hvdl_engine_complete(e, group[i], res, res == hvdlSuccess ? NULL : hvdlGetLastError(e->data));
  }
  return res;
}

hvdlResult_t hvdl_execute(struct hvdl_engine *e, struct hvdl_request **ready, int n) {
  const size_t threshold = e->cfg.fusion_threshold;
  hvdlResult_t res = hvdlSuccess;
  struct hvdl_request **group = malloc(sizeof *group * (size_t)n);
  char *taken = calloc((size_t)n, 1);
  if (!group || !taken) {
    res = hvdl_fail(e->data, hvdlSystemError, "fusion: out of memory");
    for (int i = 0; i < n; i++) hvdl_engine_complete(e, ready[i], res, hvdlGetLastError(e->data));
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (taken[i]) continue;
    struct hvdl_request *r = ready[i];
    taken[i] = 1;
    if (res != hvdlSuccess) { /* the communicator broke earlier in this list */
      hvdl_engine_complete(e, r, res, hvdlGetLastError(e->data));
      continue;
    }
    if (threshold == 0 || r->nbytes >= threshold) {
      res = run_one(e, r);
      continue;
    }
    int m = 0;
    size_t total = r->nbytes;
    group[m++] = r;
    for (int j = i + 1; j < n; j++) {
      struct hvdl_request *q = ready[j];
      if (taken[j] || !same_key(r, q) || q->nbytes >= threshold || total + q->nbytes > threshold)
        continue;
      taken[j] = 1;
      group[m++] = q;
      total += q->nbytes;
    }
    res = m == 1 ? run_one(e, r) : run_fused(e, group, m, total);
  }
  hvdl_timeline_flush(NULL);
out:
  free(group);
  free(taken);
  return res;
}
