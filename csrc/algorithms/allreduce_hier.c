/*
 * allreduce_hier.c -- the hierarchical all-reduce, for a communicator whose
 * ranks sit on several hosts (comm->shm says how many).
 *
 * The layout. H hosts, L_h ranks on host h, m = min L_h lanes. The buffer is
 * cut into m near-equal lanes (hvdl_block_start); local rank j < m of every host
 * carries lane j across hosts, on comm->cross: the ranks with local rank j, one
 * per host, in rank order. Local ranks j >= m (a host with more ranks than the
 * smallest) take part within their host only.
 *
 * The schedule, three phases:
 *
 *   1. within each host   hvdl_shm_reduce: the host's reduction of every element,
 *                         computed once, in local-rank order (Avg as Sum); local
 *                         rank j keeps lane j of it in recvbuff
 *   2. across hosts       local rank j all-reduces lane j in place with its peers
 *                         on comm->cross, with the caller's lane_allreduce: the
 *                         algorithm the selector picks for that communicator
 *                         (select/select_allreduce.c: one rank per host, so ring,
 *                         rd, rab or the latency path); the m lanes in parallel.
 *                         Avg divides by the number of ranks here. Its waits beat
 *                         the host's heartbeat (shm.h): the host's other ranks,
 *                         waiting for this one in phase 3, see it busy, not silent.
 *                         (hvdl_allreduce_hier_lanes: the caller's lane function,
 *                         which every carrier calls, an empty lane too: Adasum's
 *                         hierarchical form, allreduce_adasum.c.)
 *   3. within each host   hvdl_shm_share: every local rank copies every lane
 *
 * Bitwise identity. Every element's host partials are each computed once by one
 * rank in a fixed order (phase 1); the cross-host all-reduce of its lane gives
 * every host's lane carrier the same bytes (the chosen algorithm's own guarantee:
 * allreduce_ring.c, allreduce_rd.c, allreduce_rab.c, allreduce_small.c), divided alike;
 * phase 3 only copies.
 * So every rank of every host ends with the same bytes, in place or not and on
 * every rerun. The order differs from the one-host paths' (hosts are summed after
 * each host's ranks), so a float sum may differ from theirs in its last bits.
 *
 * Cost per rank, B bytes: phases 1 and 3 move B through shared memory (segment.c);
 * phase 2 all-reduces lane j (B / m bytes) over the network among H ranks, all m
 * carriers of a host at once; with the ring, 2(H-1) steps and 2(H-1)/H * B/m
 * bytes sent per lane carrier (docs/algorithms.md).
 */
#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/shm/shm.h"

/* The lane's waits: a heartbeat for the host's ranks waiting on this one, then the
 * caller's own hook (the engine: alarms), whose failure it reports as it is. */
struct lane_watch {
  hvdlComm_t comm;
  int failed;
};

static hvdlResult_t watch_lane(void *arg, double waited) {
  struct lane_watch *w = arg;
  hvdlComm_t comm = w->comm;
  hvdl_shm_beat(comm->shm);
  if (!comm->watch) return hvdlSuccess;
  hvdlResult_t res = comm->watch(comm->watch_arg, waited);
  w->failed = res != hvdlSuccess;
  return res;
}

hvdlResult_t hvdl_allreduce_hier_lanes(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                       size_t count, hvdlDataType_t dt, hvdlRedOp_t op,
                                       hvdl_lane_fn lane_fn, void *arg) {
  const struct hvdl_shm *s = comm->shm;
  const size_t esize = hvdl_type_size(dt);
  const hvdlRedOp_t across = op == hvdlAvg ? hvdlSum : op;
  const int carrier = s->local_rank < s->lanes;
  const size_t lo = carrier ? hvdl_block_start(count, s->lanes, s->local_rank) : 0;
  const size_t hi = carrier ? hvdl_block_start(count, s->lanes, s->local_rank + 1) : 0;

  const struct hvdl_shm_fold f = {dt, across, 0, 0};
  HVDL_CHECK(hvdl_shm_reduce(comm, sendbuff, recvbuff, count, &f, lo, hi));

  if (carrier) {
    hvdlComm_t x = comm->cross;
    struct lane_watch w = {comm, 0};
    x->watch = watch_lane;
    x->watch_arg = &w;
    x->data_timeout = comm->data_timeout;
    x->faults = comm->faults;
    char *lane = (char *)recvbuff + lo * esize;
    const size_t n = hi - lo;
    const struct hvdl_group all = hvdl_group_all(x);
    hvdlResult_t res = lane_fn(x, &all, lane, lo, n, dt, across, arg);
    x->watch = NULL;
    if (res != hvdlSuccess) {
      if (w.failed) { /* the caller's hook said why, on comm */
        comm->broken = 1;
        return res;
      }
      return hvdl_fail(comm, res, "lane %d across hosts: %s", s->local_rank, x->last_error);
    }
    if (op == hvdlAvg) hvdl_divide(lane, n, dt, (uint64_t)comm->size);
  }

  return hvdl_shm_share(comm, recvbuff, count, dt);
}

/* The selector's lane all-reduce, for lanes with elements. */
struct selected {
  hvdl_allreduce_fn fn;
};

static hvdlResult_t run_selected(hvdlComm_t cross, const struct hvdl_group *all, void *lane,
                                 size_t lo, size_t n, hvdlDataType_t dt, hvdlRedOp_t op,
                                 void *arg) {
  (void)all;
  (void)lo;
  const struct selected *s = arg;
  return n ? s->fn(cross, lane, lane, n, dt, op) : hvdlSuccess;
}

hvdlResult_t hvdl_allreduce_hier(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op,
                                 hvdl_allreduce_fn lane_allreduce) {
  struct selected s = {lane_allreduce};
  return hvdl_allreduce_hier_lanes(comm, sendbuff, recvbuff, count, dt, op, run_selected, &s);
}
