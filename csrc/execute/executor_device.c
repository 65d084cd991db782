/*
 * executor_device.c -- the executor's steps on CUDA memory (execute.h).
 */
#include <string.h>

#include "cuda/cuda.h"
#include "execute/execute.h"
#include "kernels/kernels.h"

/* Returns `call`, run on r's device, the calling thread's own context given back after (a
 * waiting caller's thread may run a round's steps: csrc/engine/engine_turn.c). */
#define ON_DEVICE(x, r, call)                                        \
  do {                                                               \
    struct hvdl_cuda_saved saved_;                                   \
    HVDL_CHECK(hvdl_cuda_enter((x)->data, (r)->device_id, &saved_)); \
    const hvdlResult_t res_ = (call);                                \
    hvdl_cuda_leave(&saved_);                                        \
    return res_;                                                     \
  } while (0)

static hvdlResult_t allreduce_here(struct hvdl_executor *x, struct hvdl_request *r, hvdlRedOp_t op,
                                   double post) {
  const hvdlDataType_t dt = (hvdlDataType_t)r->desc.dtype;
  const void *src = r->send;
  if (r->desc.prescale != 1.0) {
    HVDL_CHECK(
        hvdl_cuda_scale(x->data, r->recv, r->send, r->count, dt, r->desc.prescale, r->stream));
    src = r->recv;
  }
  HVDL_CHECK(hvdlAllReduce(src, r->recv, r->count, dt, op, x->data, r->stream));
  if (post != 1.0)
    HVDL_CHECK(hvdl_cuda_scale(x->data, r->recv, r->recv, r->count, dt, post, r->stream));
  return hvdlSuccess;
}

hvdlResult_t hvdl_exec_allreduce_device(struct hvdl_executor *x, struct hvdl_request *r,
                                        hvdlRedOp_t op, double post) {
  const hvdlDataType_t dt = (hvdlDataType_t)r->desc.dtype;
  if (r->nbytes == 0) return hvdlSuccess; /* the same shape on every rank: none sends */
  if (r->zeros) { /* a stand-in: the host algorithm on the staged form's chunks */
    const size_t es = hvdl_type_size(dt), chunk = hvdl_cuda_chunk_bytes(es);
    for (size_t off = 0; off < r->nbytes; off += chunk) {
      const size_t len = r->nbytes - off < chunk ? r->nbytes - off : chunk;
      HVDL_CHECK(hvdlAllReduce((const char *)r->send + off, (char *)r->recv + off, len / es, dt, op,
                               x->data, NULL));
    }
    return hvdlSuccess;
  }
  ON_DEVICE(x, r, allreduce_here(x, r, op, post));
}

hvdlResult_t hvdl_exec_broadcast_device(struct hvdl_executor *x, struct hvdl_request *r) {
  if (r->nbytes == 0) return hvdlSuccess; /* the same shape on every rank: none sends */
  ON_DEVICE(x, r,
            hvdlBroadcast(r->send, r->recv, r->count, (hvdlDataType_t)r->desc.dtype, r->desc.root,
                          x->data, r->stream));
}

/* Queues r's copy between its device memory and `host` (down: into host), on its stream
 * and device; a stand-in's host memory is copied at once. An empty member has nothing to copy
 * (nor a device: CuPy gives it address 0). */
static hvdlResult_t queue_copy(struct hvdl_executor *x, struct hvdl_request *r, char *host,
                               int down) {
  if (r->nbytes == 0) return hvdlSuccess;
  if (r->zeros) {
    if (down)
      hvdl_copy(host, r->send, r->nbytes);
    else
      hvdl_copy(r->recv, host, r->nbytes);
    return hvdlSuccess;
  }
  ON_DEVICE(x, r,
            down ? hvdl_cuda_copy(x->data, host, r->send, r->nbytes, r->stream)
                 : hvdl_cuda_copy(x->data, r->recv, host, r->nbytes, r->stream));
}

/* Waits for what group[0..m) queued on their streams (a stream once for a run of members
 * on it). */
static hvdlResult_t wait_streams(struct hvdl_executor *x, struct hvdl_request **group, int m,
                                 const char *what) {
  int waited = 0, last_device = -1;
  hvdlStream_t last = NULL;
  for (int i = 0; i < m; i++) {
    struct hvdl_request *r = group[i];
    if (r->zeros || r->nbytes == 0 || (waited && r->stream == last && r->device_id == last_device))
      continue;
    struct hvdl_cuda_saved saved;
    HVDL_CHECK(hvdl_cuda_enter(x->data, r->device_id, &saved));
    const hvdlResult_t res = hvdl_cuda_wait_stream(x->data, r->stream, what);
    hvdl_cuda_leave(&saved);
    HVDL_CHECK(res);
    waited = 1;
    last = r->stream;
    last_device = r->device_id;
  }
  return hvdlSuccess;
}

void hvdl_exec_device_free(struct hvdl_executor *x) {
  if (!x->device_fusion) return;
  struct hvdl_cuda_saved saved; /* freed in a context of its own device's, as it was made */
  const int entered = hvdl_cuda_enter(NULL, x->device_fusion_device, &saved) == hvdlSuccess;
  hvdl_cuda_pinned_free(x->device_fusion);
  if (entered) hvdl_cuda_leave(&saved);
  x->device_fusion = NULL;
  x->device_fusion_bytes = 0;
}

/* hvdl_exec_fused_device on `device`'s context, current. */
static hvdlResult_t fused_here(struct hvdl_executor *x, struct hvdl_request **group, int m,
                               size_t total, hvdlRedOp_t op, double post, int device) {
  const hvdlDataType_t dt = (hvdlDataType_t)group[0]->desc.dtype;
  const double pre = group[0]->desc.prescale; /* the same for the whole group */
  if (!x->device_fusion) x->device_fusion_device = device;
  HVDL_CHECK(hvdl_cuda_pinned_reserve(x->data, &x->device_fusion, &x->device_fusion_bytes, total));
  char *buf = x->device_fusion;
  size_t off = 0;
  for (int i = 0; i < m; off += group[i]->nbytes, i++)
    HVDL_CHECK(queue_copy(x, group[i], buf + off, 1));
  HVDL_CHECK(wait_streams(x, group, m, "a fused group's copies down"));
  if (pre != 1.0) hvdl_scale(buf, buf, total / hvdl_type_size(dt), dt, pre);
  HVDL_CHECK(hvdlAllReduce(buf, buf, total / hvdl_type_size(dt), dt, op, x->data, NULL));
  if (post != 1.0) hvdl_scale(buf, buf, total / hvdl_type_size(dt), dt, post);
  off = 0;
  for (int i = 0; i < m; off += group[i]->nbytes, i++)
    HVDL_CHECK(queue_copy(x, group[i], buf + off, 0));
  return wait_streams(x, group, m, "a fused group's copies up");
}

hvdlResult_t hvdl_exec_fused_device(struct hvdl_executor *x, struct hvdl_request **group, int m,
                                    size_t total, hvdlRedOp_t op, double post) {
  /* The whole step runs in the context of the first member with data (executor.c sends a group
   * here only when it has one): the pinned buffer's allocation and the host all-reduce (which
   * asks the runtime where its buffer is) then make no context on another device. */
  const struct hvdl_request *first = NULL;
  for (int i = 0; i < m && !first; i++)
    if (!group[i]->zeros && group[i]->nbytes > 0) first = group[i];
  if (!first) return hvdl_fail(x->data, hvdlInternalError, "a fused device group without data");
  struct hvdl_cuda_saved saved;
  HVDL_CHECK(hvdl_cuda_enter(x->data, first->device_id, &saved));
  const hvdlResult_t res = fused_here(x, group, m, total, op, post, first->device_id);
  hvdl_cuda_leave(&saved);
  return res;
}
