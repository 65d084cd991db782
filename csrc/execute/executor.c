/*
 * executor.c -- executing a round's ready list on the data communicator
 * (execute.h).
 *
 * Tensor fusion: requests smaller than HVD_LITE_FUSION_THRESHOLD with the same
 * dtype, op and scale factors are packed (prescale applied while copying) into
 * one buffer of at most the threshold, reduced with one all-reduce in place,
 * and unpacked (postscale applied while copying). A request at or above the
 * threshold goes alone and without a copy: the ring reads the caller's input and
 * writes the caller's output. Threshold 0 sends every request alone. Requests of
 * CUDA memory (desc.device) fuse only with each other, and their steps, fused or
 * alone, are executor_device.c's.
 *
 * The grouping is a function of the ready list alone, which is the same on
 * every rank, so every rank makes the same all-reduce calls in the same order.
 *
 * The other collectives run one call each, in list order: allgather exchanges
 * the ranks' first dimensions, then gathers into an output the engine allocates;
 * alltoall exchanges the split counts, then runs the selector's choice where every block
 * is one size (select_alltoall.c: pairwise or Bruck's), else every block pairwise;
 * reducescatter
 * splits the rows as evenly as possible (the first ranks take the extra ones);
 * broadcast is hvdlBroadcast; a barrier needs nothing beyond its negotiation.
 *
 * Adasum requests fuse with each other alone (the key holds the op) and keep their own
 * norms in the fused buffer (run_fused_adasum); they are host memory only (the binding
 * refuses device memory for them).
 *
 * Average on integers is Horovod's: the sum, then the postscale factor divided by
 * the number of ranks, applied in float64 and truncated toward zero (hvdl_scale).
 * Floats keep hvdlAvg (the sum, then one division by the number of ranks).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "execute/execute.h"
#include "kernels/kernels.h"
#include "request/request.h"
#include "select/select.h"
#include "transport/shm/shm.h"

/* The op a request's reduction runs with, and *post its postscale factor. */
static hvdlRedOp_t reduction(const struct hvdl_executor *x, const struct hvdl_request *r,
                             double *post) {
  *post = r->desc.postscale;
  if (r->desc.op != hvdlAvg || hvdl_type_floating(r->desc.dtype)) return (hvdlRedOp_t)r->desc.op;
  *post = r->desc.postscale / (double)x->data->size;
  return hvdlSum;
}

static int same_key(const struct hvdl_request *a, const struct hvdl_request *b) {
  return b->desc.coll == HVDL_COLL_ALLREDUCE && a->desc.device == b->desc.device &&
         a->desc.dtype == b->desc.dtype && a->desc.op == b->desc.op &&
         a->desc.prescale == b->desc.prescale && a->desc.postscale == b->desc.postscale;
}

/* Timeline events of the all-reduce just run (rank 0 only). */
static void note_allreduce(struct hvdl_executor *x, const struct hvdl_request *r, double t0,
                           double t1, size_t bytes) {
  if (!x->timeline) return;
  const double *ph = x->data->phase_time;
  if (bytes > x->data->config.smallAllReduceBytes && x->data->size > 1 && ph[0] >= t0) {
    hvdl_timeline_event(x->timeline, r->desc.name, "RING_REDUCE_SCATTER", ph[0], ph[1]);
    hvdl_timeline_event(x->timeline, r->desc.name, "RING_ALL_GATHER", ph[1], ph[2]);
  } else {
    hvdl_timeline_event(x->timeline, r->desc.name, "ALLREDUCE", t0, t1);
  }
}

static void note_queue(struct hvdl_executor *x, const struct hvdl_request *r, double start) {
  if (!x->timeline) return;
  hvdl_timeline_event(x->timeline, r->desc.name, "NEGOTIATE", r->t_submit, r->t_ready);
  hvdl_timeline_event(x->timeline, r->desc.name, "QUEUE", r->t_ready, start);
}

static hvdlResult_t run_one(struct hvdl_executor *x, struct hvdl_request *r) {
  const hvdlDataType_t dt = (hvdlDataType_t)r->desc.dtype;
  double t0 = hvdl_now();
  note_queue(x, r, t0);
  const void *src = r->send;
  double post;
  const hvdlRedOp_t op = reduction(x, r, &post);
  hvdlResult_t res;
  if (r->desc.device == HVDL_MEM_CUDA) {
    res = hvdl_exec_allreduce_device(x, r, op, post);
    post = 1.0; /* applied */
  } else {
    if (r->desc.prescale != 1.0) {
      hvdl_scale(r->recv, r->send, r->count, dt, r->desc.prescale);
      src = r->recv;
    }
    res = hvdlAllReduce(src, r->recv, r->count, dt, op, x->data, NULL);
  }
  double t1 = hvdl_now();
  if (res == hvdlSuccess) {
    note_allreduce(x, r, t0, t1, r->nbytes);
    if (post != 1.0) hvdl_scale(r->recv, r->recv, r->count, dt, post);
    hvdl_request_complete(r, res, NULL);
  }
  return res;
}

static void free_fusion(struct hvdl_executor *x) {
  if (x->fusion_shared)
    hvdlMemFree(x->fusion);
  else
    free(x->fusion);
  x->fusion = NULL;
  x->fusion_bytes = 0;
  x->fusion_shared = 0;
}

/* A fused group runs through the pinned buffer (executor_device.c) when one of its members holds
 * CUDA memory with data; a joined rank's stand-ins, and empty device members (no device), take
 * the host buffer: the same one host all-reduce of the group either way, on every rank. */
static int fused_on_device(struct hvdl_request **group, int m) {
  if (group[0]->desc.device != HVDL_MEM_CUDA) return 0;
  for (int i = 0; i < m; i++)
    if (!group[i]->zeros && group[i]->nbytes > 0) return 1;
  return 0;
}

/* The fusion buffer holds at least `total` bytes. Where the ranks of a host run the
 * single-copy forms it is memory they reach directly (hvdlMemAlloc): the single-copy
 * all-reduce then reads and writes the peers' fusion buffers with plain copies, not
 * the kernel's (peer_memory.c; docs/benchmarks-history.md, "Memory the peers reach"). It is made
 * the fusion threshold's size at once (pages are only used once touched), so that a
 * growing total does not leave the peers' views of old buffers behind; malloc's
 * where that memory cannot be had. */
static hvdlResult_t reserve_fusion(struct hvdl_executor *x, size_t total) {
  if (total <= x->fusion_bytes) return hvdlSuccess;
  const size_t want = total > x->fusion_threshold ? total : x->fusion_threshold;
  const size_t bytes = (want + 63) & ~(size_t)63;
  void *p = NULL;
  if (x->data->shm && !hvdl_cma_off_reason(x->data) && hvdlMemAlloc(&p, bytes) == hvdlSuccess) {
    free_fusion(x);
    x->fusion = p;
    x->fusion_bytes = bytes;
    x->fusion_shared = 1;
    return hvdlSuccess;
  }
  if (x->fusion_shared) free_fusion(x);
  return hvdl_reserve(x->data, &x->fusion, &x->fusion_bytes, total);
}

/* Adasum of a fused group: each member's dot products and norms are its own, so the algorithm
 * takes the members' counts (a size of 1 leaves the buffer as it is, as hvdlAllReduce would). */
static hvdlResult_t run_fused_adasum(struct hvdl_executor *x, struct hvdl_request **group, int m) {
  size_t *counts = malloc((size_t)m * sizeof *counts);
  if (!counts) return hvdl_fail(x->data, hvdlSystemError, "Adasum: out of memory for %d counts", m);
  for (int i = 0; i < m; i++) counts[i] = group[i]->count;
  const hvdlResult_t res = hvdl_allreduce_adasum(x->data, x->fusion, x->fusion, counts, m,
                                                 (hvdlDataType_t)group[0]->desc.dtype);
  free(counts);
  return res;
}

static hvdlResult_t run_fused(struct hvdl_executor *x, struct hvdl_request **group, int m,
                              size_t total) {
  const hvdlDataType_t dt = (hvdlDataType_t)group[0]->desc.dtype;
  const size_t es = hvdl_type_size(dt);
  double post;
  const hvdlRedOp_t op = reduction(x, group[0], &post); /* the same for the whole group */
  if (fused_on_device(group, m)) {
    const double t0 = hvdl_now();
    for (int i = 0; i < m; i++) note_queue(x, group[i], t0);
    const hvdlResult_t res = hvdl_exec_fused_device(x, group, m, total, op, post);
    const double t1 = hvdl_now();
    for (int i = 0; i < m && res == hvdlSuccess; i++) {
      note_allreduce(x, group[i], t0, t1, total);
      hvdl_request_complete(group[i], res, NULL);
    }
    return res;
  }
  hvdlResult_t res = hvdl_fault_hit(x->data->faults, HVDL_FAULT_ALLOC)
                         ? hvdl_fail(x->data, hvdlSystemError,
                                     "injected fault (HVD_LITE_FAULT): out of memory "
                                     "for a %zu-byte fusion buffer",
                                     total)
                         : reserve_fusion(x, total);
  const double t0 = hvdl_now();
  size_t off = 0;
  for (int i = 0; i < m && res == hvdlSuccess; i++) {
    note_queue(x, group[i], t0);
    hvdl_scale(x->fusion + off, group[i]->send, group[i]->count, dt, group[i]->desc.prescale);
    off += group[i]->nbytes;
  }
  const double t1 = hvdl_now();
  if (res == hvdlSuccess && op == hvdlAdasum)
    res = run_fused_adasum(x, group, m);
  else if (res == hvdlSuccess)
    res = hvdlAllReduce(x->fusion, x->fusion, total / es, dt, op, x->data, NULL);
  const double t2 = hvdl_now();
  off = 0;
  for (int i = 0; i < m && res == hvdlSuccess; i++) {
    hvdl_scale(group[i]->recv, x->fusion + off, group[i]->count, dt, post);
    off += group[i]->nbytes;
  }
  const double t3 = hvdl_now();
  for (int i = 0; i < m && res == hvdlSuccess; i++) {
    if (x->timeline) {
      hvdl_timeline_event(x->timeline, group[i]->desc.name, "MEMCPY_IN_FUSION_BUFFER", t0, t1);
      note_allreduce(x, group[i], t1, t2, total);
      hvdl_timeline_event(x->timeline, group[i]->desc.name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
    }
    hvdl_request_complete(group[i], res, NULL);
  }
  return res;
}

/* ---- the other collectives: one call each, no fusion ---------------------- */

static size_t row_elems(const struct hvdl_desc *d) {
  size_t k = 1;
  for (int i = 1; i < d->ndim; i++) k *= (size_t)d->dims[i];
  return k;
}

/* Allocates the request's output (rows x the other dims), recycled (output_pool.c). */
static hvdlResult_t alloc_out(struct hvdl_executor *x, struct hvdl_request *r, int64_t rows) {
  const size_t bytes =
      (size_t)rows * row_elems(&r->desc) * hvdl_type_size((hvdlDataType_t)r->desc.dtype);
  const int injected = hvdl_fault_hit(x->data->faults, HVDL_FAULT_ALLOC);
  r->out = injected ? NULL : hvdl_outpool_get(x->outpool, bytes, &r->out_cap);
  if (!r->out)
    return hvdl_fail(x->data, hvdlSystemError, "%sout of memory for a %zu-byte output",
                     injected ? "injected fault (HVD_LITE_FAULT): " : "", bytes);
  r->out_pool = x->outpool; /* the Python handle keeps the engine alive while it holds this */
  r->out_bytes = bytes;
  r->out_dim0 = rows;
  return hvdlSuccess;
}

/* Every rank's int64 value, into vals[size] (on the data communicator). After a
 * failure *vals is left to the abandoned collective, which may still write it. */
static hvdlResult_t gather_int64(struct hvdl_executor *x, int64_t *mine, int64_t **vals) {
  MPI_Request req;
  HVDL_MPI(x->data,
           MPI_Iallgather(mine, 1, MPI_INT64_T, *vals, 1, MPI_INT64_T, x->data->mpi, &req));
  hvdlResult_t res = hvdl_wait_all(x->data, 1, &req);
  if (res != hvdlSuccess) *vals = NULL;
  return res;
}

static hvdlResult_t run_allgather(struct hvdl_executor *x, struct hvdl_request *r) {
  const int n = x->data->size;
  const hvdlDataType_t dt = (hvdlDataType_t)r->desc.dtype;
  hvdlResult_t res = hvdlSuccess;
  int64_t *rows = calloc((size_t)n + 1, sizeof *rows); /* the others', then this rank's */
  size_t *counts = calloc((size_t)n, sizeof *counts);
  if (!rows || !counts) res = hvdl_fail(x->data, hvdlSystemError, "allgather: out of memory");
  if (res == hvdlSuccess) {
    rows[n] = r->dim0;
    res = gather_int64(x, rows + n, &rows);
  }
  int64_t total = 0;
  for (int q = 0; q < n && res == hvdlSuccess; q++) {
    counts[q] = (size_t)rows[q] * row_elems(&r->desc);
    total += rows[q];
  }
  if (res == hvdlSuccess) res = alloc_out(x, r, total);
  if (res == hvdlSuccess) {
    const size_t bytes = (size_t)total * row_elems(&r->desc) * hvdl_type_size(dt);
    res = hvdl_allgather_run(x->data, hvdl_select_allgather(x->data, bytes), r->send, r->out,
                             counts, dt);
  }
  free(rows);
  free(counts);
  return res;
}

/* The split counts go with this rank's `even` (its splits' one value where they are all
 * equal, else -1) to every rank, so every rank holds every rank's `even` and all decide
 * alike whether every block is one size, which the selector then runs (Bruck's or
 * pairwise); else every block pairwise with its own size. */
static hvdlResult_t run_alltoall(struct hvdl_executor *x, struct hvdl_request *r) {
  const int n = x->data->size;
  const size_t row_bytes = row_elems(&r->desc) * hvdl_type_size((hvdlDataType_t)r->desc.dtype);
  hvdlResult_t res = hvdlSuccess;
  int *ints = calloc((size_t)n * 4, sizeof *ints);
  int64_t *pairs = calloc((size_t)n * 4, sizeof *pairs); /* (split, even) to, then from, each */
  r->recv_splits = calloc((size_t)n, sizeof *r->recv_splits);
  if (!ints || !pairs || !r->recv_splits)
    res = hvdl_fail(x->data, hvdlSystemError, "alltoall: out of memory");
  int64_t even = r->splits[0];
  for (int q = 0; q < n && res == hvdlSuccess; q++) {
    if (r->splits[q] != even) even = -1;
    pairs[2 * q] = r->splits[q];
  }
  for (int q = 0; q < n && res == hvdlSuccess; q++) pairs[2 * q + 1] = even;
  MPI_Request req;
  if (res == hvdlSuccess) {
    int err =
        MPI_Ialltoall(pairs, 2, MPI_INT64_T, pairs + 2 * n, 2, MPI_INT64_T, x->data->mpi, &req);
    res = err == MPI_SUCCESS ? hvdl_wait_all(x->data, 1, &req)
                             : hvdl_fail_mpi(x->data, err, "MPI_Ialltoall");
    if (res != hvdlSuccess && err == MPI_SUCCESS) pairs = NULL; /* left to the abandoned exchange */
  }
  int *scounts = ints, *sdispls = ints + n, *rcounts = ints + 2 * n, *rdispls = ints + 3 * n;
  int64_t total = 0, common = res == hvdlSuccess ? pairs[2 * n + 1] : -1;
  size_t soff = 0, roff = 0;
  for (int q = 0; q < n && res == hvdlSuccess; q++) {
    r->recv_splits[q] = pairs[2 * n + 2 * q];
    if (pairs[2 * n + 2 * q + 1] != common) common = -1;
    size_t sb = (size_t)r->splits[q] * row_bytes, rb = (size_t)r->recv_splits[q] * row_bytes;
    if (sb > 0x7fffffff || rb > 0x7fffffff || soff + sb > 0x7fffffff || roff + rb > 0x7fffffff)
      res = hvdl_fail(x->data, hvdlInvalidArgument,
                      "alltoall: more than 2 GiB per rank is not supported");
    scounts[q] = (int)sb;
    sdispls[q] = (int)soff;
    rcounts[q] = (int)rb;
    rdispls[q] = (int)roff;
    soff += sb;
    roff += rb;
    total += r->recv_splits[q];
  }
  if (res == hvdlSuccess) res = alloc_out(x, r, total);
  if (res == hvdlSuccess && common >= 0) {
    const size_t block = (size_t)common * row_bytes;
    res = hvdl_alltoall_run(x->data, hvdl_select_alltoall(x->data, block), r->send, r->out, block);
  } else if (res == hvdlSuccess) {
    res = hvdl_alltoallv(x->data, r->send, scounts, sdispls, r->out, rcounts, rdispls);
  }
  free(ints);
  free(pairs);
  return res;
}

static hvdlResult_t run_reducescatter(struct hvdl_executor *x, struct hvdl_request *r) {
  const int n = x->data->size;
  const hvdlDataType_t dt = (hvdlDataType_t)r->desc.dtype;
  const int64_t rows = r->desc.dims[0];
  hvdlResult_t res = hvdlSuccess;
  size_t *counts = calloc((size_t)n, sizeof *counts);
  void *scaled = NULL;
  const void *src = r->send;
  double post;
  const hvdlRedOp_t op = reduction(x, r, &post);
  if (!counts) return hvdl_fail(x->data, hvdlSystemError, "reducescatter: out of memory");
  for (int q = 0; q < n; q++) /* as even as possible; the first ranks take the extra rows */
    counts[q] = hvdl_block_len((size_t)rows, n, q) * row_elems(&r->desc);
  if (r->desc.prescale != 1.0) {
    scaled = malloc(r->nbytes ? r->nbytes : 1);
    if (!scaled)
      res = hvdl_fail(x->data, hvdlSystemError, "reducescatter: out of memory");
    else
      hvdl_scale(scaled, r->send, r->count, dt, r->desc.prescale);
    src = scaled;
  }
  if (res == hvdlSuccess)
    res = hvdl_reducescatter_run(x->data, hvdl_select_reducescatter(x->data, r->nbytes), src,
                                 r->recv, counts, dt, op);
  if (res == hvdlSuccess && post != 1.0)
    hvdl_scale(r->recv, r->recv, counts[x->data->rank], dt, post);
  free(scaled);
  free(counts);
  return res;
}

static hvdlResult_t run_other(struct hvdl_executor *x, struct hvdl_request *r) {
  const double t0 = hvdl_now();
  note_queue(x, r, t0);
  hvdlResult_t res = hvdlSuccess;
  if (r->desc.device != HVDL_MEM_HOST && r->desc.coll != HVDL_COLL_BROADCAST)
    return hvdl_fail(x->data, hvdlInvalidUsage, "%s takes host memory only",
                     hvdl_coll_name(r->desc.coll)); /* the binding refuses it first */
  switch (r->desc.coll) {
    case HVDL_COLL_ALLGATHER: res = run_allgather(x, r); break;
    case HVDL_COLL_ALLTOALL: res = run_alltoall(x, r); break;
    case HVDL_COLL_REDUCESCATTER: res = run_reducescatter(x, r); break;
    case HVDL_COLL_BROADCAST:
      res = r->desc.device == HVDL_MEM_CUDA
                ? hvdl_exec_broadcast_device(x, r)
                : hvdlBroadcast(r->send, r->recv, r->count, (hvdlDataType_t)r->desc.dtype,
                                r->desc.root, x->data, NULL);
      break;
    case HVDL_COLL_BARRIER: break; /* the negotiation itself was the barrier */
    default: res = hvdl_fail(x->data, hvdlInternalError, "unknown collective %d", r->desc.coll);
  }
  if (res == hvdlSuccess) {
    if (x->timeline) hvdl_timeline_event(x->timeline, r->desc.name, "EXECUTE", t0, hvdl_now());
    hvdl_request_complete(r, res, NULL);
  }
  return res;
}

/* ---- failed steps ------------------------------------------------------- */

/* "ALLREDUCE 'a'" or "ALLREDUCE 'a' (fused with 3 more)". */
static void describe(char *out, size_t cap, struct hvdl_request **group, int m) {
  int k = snprintf(out, cap, "%s '%s'", hvdl_coll_name(group[0]->desc.coll), group[0]->desc.name);
  if (m > 1 && k > 0 && (size_t)k < cap)
    snprintf(out + k, cap - (size_t)k, " (fused with %d more)", m - 1);
}

static void pin(struct hvdl_executor *x, struct hvdl_request *r) {
  if (x->npinned == x->pinned_cap) {
    int cap = x->pinned_cap ? 2 * x->pinned_cap : 16;
    struct hvdl_request **p = realloc(x->pinned, sizeof *p * (size_t)cap);
    if (!p) return; /* not pinned: its buffers may go before a late peer is done */
    x->pinned = p;
    x->pinned_cap = cap;
  }
  atomic_fetch_add(&r->refs, 1);
  atomic_fetch_add(&r->pins, 1);
  x->pinned[x->npinned++] = r;
  x->pinned_epoch = x->alarm->epoch;
}

void hvdl_executor_unpin(struct hvdl_executor *x, int all) {
  if (x->npinned == 0 || (!all && x->alarm->epoch == x->pinned_epoch)) return;
  for (int i = 0; i < x->npinned; i++) {
    atomic_fetch_sub(&x->pinned[i]->pins, 1);
    hvdl_request_release(x->pinned[i]);
  }
  x->npinned = 0;
}

/* Step `step` (group[0..m)) did not succeed here, or failed elsewhere before it
 * ran: completes its requests with the message every rank gives for it. A failure
 * of this rank's own (res) is told to the others first. */
static void fail_step(struct hvdl_executor *x, struct hvdl_request **group, int m, uint64_t step,
                      hvdlResult_t res) {
  struct hvdl_alarm *a = x->alarm;
  char what[HVDL_MAX_NAME + 64], msg[HVDL_ERRMSG_LEN];
  describe(what, sizeof what, group, m);
  if (res != hvdlSuccess && !hvdl_alarm_failed(a, step)) { /* this rank's own failure */
    snprintf(msg, sizeof msg, "%s failed on rank %d: %s", what, x->data->rank,
             hvdlGetLastError(x->data));
    hvdl_alarm_raise(a, step, res, msg);
  }
  hvdlResult_t code = (hvdlResult_t)a->first.code;
  if (a->first.step == step) {
    snprintf(msg, sizeof msg, "%s", a->first.msg);
  } else {
    snprintf(msg, sizeof msg, "%s was not run: an earlier collective of the same round failed (%s)",
             what, a->first.msg);
    code = hvdlRemoteError;
  }
  /* Until every rank has left this collective, a late peer may still read or write
   * its buffers: they are pinned (request.h) until the next settle, and a fusion
   * buffer is left to it. */
  if (group[0]->desc.coll == HVDL_COLL_ALLREDUCE && m > 1 && res != hvdlSuccess) {
    if (fused_on_device(group, m)) {
      x->device_fusion = NULL;
      x->device_fusion_bytes = 0;
    } else {
      x->fusion = NULL;
      x->fusion_bytes = 0;
      x->fusion_shared = 0;
    }
  }
  for (int i = 0; i < m; i++) {
    if (res != hvdlSuccess) pin(x, group[i]);
    hvdl_request_complete(group[i], code, msg);
  }
}

/* One step: the request r, or the fused group starting at r. */
static hvdlResult_t run_step(struct hvdl_executor *x, struct hvdl_request **group, int m,
                             size_t total) {
  const uint64_t step = x->step++;
  if (hvdl_alarm_failed(x->alarm, step)) {
    fail_step(x, group, m, step, hvdlSuccess);
    return hvdlSuccess;
  }
  if (hvdl_fault_hit(x->data->faults, HVDL_FAULT_EXIT)) _exit(3); /* a crash mid-collective */
  const struct hvdl_request *r = group[0];
  if (r->desc.device == HVDL_MEM_CUDA && !r->zeros)
    atomic_fetch_add_explicit(&x->device_steps, 1, memory_order_relaxed);
  hvdlResult_t res = r->desc.coll != HVDL_COLL_ALLREDUCE ? run_other(x, group[0])
                     : m == 1                            ? run_one(x, group[0])
                                                         : run_fused(x, group, m, total);
  if (res != hvdlSuccess && x->alarm->engine_down) { /* another rank's engine has stopped */
    for (int i = 0; i < m; i++)
      hvdl_request_complete(group[i], hvdlRemoteError, x->alarm->engine.msg);
    return hvdl_fail(x->data, hvdlRemoteError, "%s", x->alarm->engine.msg);
  }
  if (res != hvdlSuccess) fail_step(x, group, m, step, res);
  return hvdlSuccess;
}

hvdlResult_t hvdl_execute(struct hvdl_executor *x, struct hvdl_request **ready, int n) {
  const size_t threshold = x->fusion_threshold;
  hvdlResult_t res = hvdlSuccess;
  struct hvdl_request **group = malloc(sizeof *group * (size_t)n);
  char *taken = calloc((size_t)n, 1);
  if (!group || !taken) {
    res = hvdl_fail(x->data, hvdlSystemError, "fusion: out of memory");
    for (int i = 0; i < n; i++) hvdl_request_complete(ready[i], res, hvdlGetLastError(x->data));
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (taken[i]) continue;
    hvdl_requests_notify(x->requests, 0);
    struct hvdl_request *r = ready[i];
    taken[i] = 1;
    int m = 0;
    size_t total = r->nbytes;
    group[m++] = r;
    const int fusable =
        r->desc.coll == HVDL_COLL_ALLREDUCE && threshold > 0 && r->nbytes < threshold;
    for (int j = i + 1; j < n && fusable; j++) {
      struct hvdl_request *q = ready[j];
      if (taken[j] || !same_key(r, q) || q->nbytes >= threshold || total + q->nbytes > threshold)
        continue;
      taken[j] = 1;
      group[m++] = q;
      total += q->nbytes;
    }
    const double t0 = hvdl_now();
    res = run_step(x, group, m, total);
    atomic_fetch_add_explicit(&x->busy_ns, (uint64_t)((hvdl_now() - t0) * 1e9),
                              memory_order_relaxed);
    if (res != hvdlSuccess) break; /* the engine stops: it fails what is left */
  }
  hvdl_timeline_flush(NULL);
out:
  free(group);
  free(taken);
  return res;
}

void hvdl_executor_free(struct hvdl_executor *x) {
  hvdl_executor_unpin(x, 1);
  free(x->pinned);
  x->pinned = NULL;
  free_fusion(x);
  hvdl_exec_device_free(x);
}
