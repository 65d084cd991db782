/*
 * execute.h -- the execution layer's contract: running a ready list (executor.c) and
 * its steps on CUDA memory (executor_device.c). Each file's part follows.
 */
#ifndef HVDL_EXECUTE_EXECUTE_H_
#define HVDL_EXECUTE_EXECUTE_H_

#include "request/request.h"

/* ---- executor.c ---------------------------------------------------------------------------- */

/*
 * Running a round's ready list on the data communicator: fusion of
 * small allreduces, every other collective one call each, then completion of
 * each request. executor.c calls the public C API (collectives.c), cuda.c (requests of
 * device memory), reduce.c, request.c,
 * failure_alarm.c, wire.c (names), output_pool.c and timeline.c; the engine's loop calls it.
 */

#include <stdatomic.h>

struct hvdl_timeline;
struct hvdl_alarm;

struct hvdl_executor {
  hvdlComm_t data;                /* the collectives' communicator */
  size_t fusion_threshold;        /* HVD_LITE_FUSION_THRESHOLD, bytes; 0 disables fusion */
  struct hvdl_requests *requests; /* whose waiters it wakes while it runs */
  struct hvdl_outpool *outpool;   /* outputs of allgather/alltoall */
  struct hvdl_timeline *timeline; /* rank 0's, or NULL */
  struct hvdl_alarm *alarm;       /* how a step's failure reaches the other ranks */
  uint64_t step; /* steps run so far: one per collective call, the same on every rank */
  char *fusion;  /* the fusion buffer */
  size_t fusion_bytes;
  int fusion_shared;   /* fusion is hvdlMemAlloc's (ranks sharing a host), not malloc's */
  char *device_fusion; /* the pinned host buffer of fused device groups (executor_device.c) */
  size_t device_fusion_bytes;
  int device_fusion_device;     /* the CUDA device current when it was made (and is freed) */
  struct hvdl_request **pinned; /* requests of failed steps, pinned until the next settle */
  int npinned, pinned_cap;
  unsigned pinned_epoch;         /* the alarm epoch they failed in */
  _Atomic uint64_t busy_ns;      /* time spent running steps, fusion copies included (statistics) */
  _Atomic uint64_t device_steps; /* steps run on CUDA memory (statistics) */
};

/* Runs ready[0..n) in order and completes each request. A step that fails on this
 * rank raises an alarm; a step that failed anywhere fails here with that rank's
 * message, and so do the later steps of the list (docs/design.md, "Failures").
 * Every such failure is the data communicator's to recover from (the next round
 * replaces it); this returns hvdlSuccess unless the engine itself must stop. */
hvdlResult_t hvdl_execute(struct hvdl_executor *x, struct hvdl_request **ready, int n);
/* Unpins the failed steps' requests once their epoch has been settled (every rank
 * has left those collectives), or unconditionally when `all` (the engine stops). */
void hvdl_executor_unpin(struct hvdl_executor *x, int all);
void hvdl_executor_free(struct hvdl_executor *x);

/* ---- executor_device.c --------------------------------------------------------------------- */

/*
 * The executor's steps on CUDA memory (requests whose descriptor says
 * device = HVDL_MEM_CUDA): an all-reduce alone, a fused group of them, a broadcast.
 * executor.c calls these; executor_device.c calls cuda.c, the public C API (collectives.c),
 * reduce.c (the host scaling of a fused group) and base/, never the executor back.
 *
 * Every rank runs the same steps for the same ready list whatever memory its own
 * requests hold, so a joined rank's stand-in (host zeros, r->zeros) is run the way the
 * device ranks run theirs: alone, in cuda.c's staged chunks; fused, in the one host
 * all-reduce of the group.
 */

/* r's all-reduce: its prescale, cuda.c's staged form and its postscale queued on its
 * stream, on its device (the thread's own given back after). Done when the last copy
 * up is queued: the result is ready where the stream reaches it, as NCCL's is. */
hvdlResult_t hvdl_exec_allreduce_device(struct hvdl_executor *x, struct hvdl_request *r,
                                        hvdlRedOp_t op, double post);

/* A fused group (group[0..m), `total` bytes, one dtype, op and scale factors; a member with
 * CUDA memory and data among them), in that member's device context, through
 * the executor's pinned host buffer: each member's copy down queued on its own stream,
 * a wait for them, the prescale on the host, one host all-reduce, the postscale, each
 * copy up queued on its stream, and a wait for those (the buffer is then free). The
 * host's scaling, so the same bits as a host group. */
hvdlResult_t hvdl_exec_fused_device(struct hvdl_executor *x, struct hvdl_request **group, int m,
                                    size_t total, hvdlRedOp_t op, double post);

/* Frees the executor's pinned buffer. */
void hvdl_exec_device_free(struct hvdl_executor *x);

/* A broadcast of CUDA memory, on r's device and stream (staged). */
hvdlResult_t hvdl_exec_broadcast_device(struct hvdl_executor *x, struct hvdl_request *r);

#endif /* HVDL_EXECUTE_EXECUTE_H_ */
