/*
 * exec_device.h -- the executor's steps on CUDA memory (requests whose descriptor says
 * device = HVDL_MEM_CUDA): an all-reduce alone, a fused group of them, a broadcast.
 * executor.c calls these; exec_device.c calls cuda.c, the public C API (collectives.c),
 * reduce.c (the host scaling of a fused group) and base.c, never the executor back.
 *
 * Every rank runs the same steps for the same ready list whatever memory its own
 * requests hold, so a joined rank's stand-in (host zeros, r->zeros) is run the way the
 * device ranks run theirs: alone, in cuda.c's staged chunks; fused, in the one host
 * all-reduce of the group.
 */
#ifndef HVDL_EXEC_DEVICE_H_
#define HVDL_EXEC_DEVICE_H_

#include "executor.h"

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

#endif /* HVDL_EXEC_DEVICE_H_ */
