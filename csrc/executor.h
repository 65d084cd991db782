/*
 * executor.h -- running a round's ready list on the data communicator: fusion of
 * small allreduces, every other collective one call each, then completion of
 * each request. executor.c calls the public C API (collectives.c), cuda.c (requests of
 * device memory), reduce.c, request.c,
 * alarm.c, wire.c (names), outpool.c and timeline.c; the engine's loop calls it.
 */
#ifndef HVDL_EXECUTOR_H_
#define HVDL_EXECUTOR_H_

#include <stdatomic.h>

#include "request.h"

struct hvdl_timeline;
struct hvdl_alarm;

struct hvdl_executor {
  hvdlComm_t data;               /* the collectives' communicator */
  size_t fusion_threshold;       /* HVD_LITE_FUSION_THRESHOLD, bytes; 0 disables fusion */
  struct hvdl_requests *requests; /* whose waiters it wakes while it runs */
  struct hvdl_outpool *outpool;  /* outputs of allgather/alltoall */
  struct hvdl_timeline *timeline; /* rank 0's, or NULL */
  struct hvdl_alarm *alarm;      /* how a step's failure reaches the other ranks */
  uint64_t step;                 /* steps run so far: one per collective call, the same on every rank */
  char *fusion;                  /* the fusion buffer */
  size_t fusion_bytes;
  int fusion_shared;             /* fusion is hvdlMemAlloc's (ranks sharing a host), not malloc's */
  char *device_fusion;           /* the pinned host buffer of fused device groups (exec_device.c) */
  size_t device_fusion_bytes;
  int device_fusion_device;      /* the CUDA device current when it was made (and is freed) */
  struct hvdl_request **pinned;  /* requests of failed steps, pinned until the next settle */
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

#endif /* HVDL_EXECUTOR_H_ */
