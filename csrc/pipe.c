/*
 * pipe.c -- the segment pipeline shared by every ring and chain collective.
 * The verbs and the rules for calling them are in pipe.h.
 *
 * One receiving step at this rank, for a piece of nseg segments:
 *
 *   wait for the sends of the step before last (generation step & 1)
 *   post the receives of segments 0 .. PIPE_RECV_WINDOW-1
 *   for j = 0 .. nseg-1:
 *     wait for segment j (posting queued sends as slots free up)
 *     reduce it into dst (the reducing verbs; Avg divides in the last reduction:
 *     recvReduce, recvReduceCopySend)
 *     post the receive of segment j + PIPE_RECV_WINDOW into the slot just consumed
 *     forward dst's segment j to the right (the forwarding verbs): into the queue
 *
 * Sends. Every segment a step sends joins the pipe's queue, in order; at most
 * PIPE_SEND_WINDOW of them are posted (MPI_Isend) at a time, and each wait of
 * the pipe posts the next ones as earlier ones complete. A send step therefore
 * returns at once, and its segments go while the following receiving steps wait.
 */
#include <string.h>

#include "pipe.h"
#include "reduce.h"

enum { PIPE_REDUCE = 1, PIPE_FORWARD = 2, PIPE_DIVIDE = 4 };
enum { PIPE_SLOTS = PIPE_RECV_WINDOW + PIPE_SEND_WINDOW };

/* Common setup: segments of seg_bytes (more if a piece would need more than
 * PIPE_MAX_SEGMENTS); receive scratch only for a pipe that reduces. */
static hvdlResult_t pipe_setup(struct hvdl_pipe *p, hvdlComm_t comm, int tag, size_t max_piece,
                               hvdlDataType_t dt, hvdlRedOp_t op, size_t seg_bytes, int reduces) {
  memset(p, 0, sizeof *p);
  p->comm = comm;
  p->left = (comm->rank - 1 + comm->size) % comm->size;
  p->right = (comm->rank + 1) % comm->size;
  p->tag = tag;
  p->esize = hvdl_type_size(dt);
  p->dt = dt;
  p->op = op;
  p->seg = seg_bytes / p->esize;
  if (p->seg == 0) p->seg = 1;
  if (max_piece / p->seg >= PIPE_MAX_SEGMENTS)
    p->seg = (max_piece + PIPE_MAX_SEGMENTS - 1) / PIPE_MAX_SEGMENTS;
  const size_t max_seg = (max_piece + p->seg - 1) / p->seg + 1;
  for (int i = 0; i < PIPE_SLOTS; i++) p->req[i] = MPI_REQUEST_NULL;

  struct hvdl_scratch *s = &comm->scratch;
  if (reduces) {
    HVDL_CHECK(hvdl_reserve(comm, &s->tmp, &s->tmp_bytes, PIPE_RECV_WINDOW * p->seg * p->esize));
    p->tmp = s->tmp;
  }
  /* Queued are at most the sends of the two most recent steps. */
  p->qcap = 2 * max_seg;
  HVDL_CHECK(hvdl_reserve(comm, &s->sreq, &s->sreq_bytes, p->qcap * sizeof *p->queue));
  p->queue = (struct hvdl_pipe_send *)(void *)s->sreq;
  return hvdlSuccess;
}

hvdlResult_t hvdl_pipe_init(struct hvdl_pipe *p, hvdlComm_t comm, int tag, size_t max_piece,
                            hvdlDataType_t dt, hvdlRedOp_t op) {
  return pipe_setup(p, comm, tag, max_piece, dt, op, comm->config.segmentBytes, 1);
}

hvdlResult_t hvdl_pipe_init_copy(struct hvdl_pipe *p, hvdlComm_t comm, int tag, size_t max_piece,
                                 hvdlDataType_t dt) {
  /* 2 ranks, measured (docs/benchmarks-history.md): whole-piece messages took the
   * all-gather from 0.97-0.99x to 1.00-1.02x MPI's busbw at 4-64 MiB. */
  size_t seg_bytes = comm->config.segmentBytes;
  if (comm->size == 2) {
    const size_t esize = hvdl_type_size(dt);
    seg_bytes = max_piece <= PIPE_MAX_MESSAGE_BYTES / esize ? max_piece * esize
                                                            : PIPE_MAX_MESSAGE_BYTES;
  }
  return pipe_setup(p, comm, tag, max_piece, dt, hvdlSum, seg_bytes, 0);
}

static size_t seg_elems(const struct hvdl_pipe *p, size_t count, size_t j) {
  const size_t first = j * p->seg;
  return count - first < p->seg ? count - first : p->seg;
}

static MPI_Request *send_slots(struct hvdl_pipe *p) { return p->req + PIPE_RECV_WINDOW; }

/* A failed step abandons everything the pipe has posted (wait.c), so that no
 * message of it can land in a buffer after the failure is reported; queued
 * sends were never posted and are dropped. */
static hvdlResult_t abandon(struct hvdl_pipe *p, hvdlResult_t res) {
  const double until = hvdl_now() + HVDL_ABANDON_GRACE;
  hvdl_abandon(p->comm, PIPE_RECV_WINDOW, p->req, 1, until);
  hvdl_abandon(p->comm, PIPE_SEND_WINDOW, send_slots(p), 0, until);
  p->nsend = 0;
  p->qpost = p->qtail;
  return res;
}

/* Injected faults (HVD_LITE_FAULT): a failing send or receive, or a rank that
 * stops sending for twice the data timeout. */
static hvdlResult_t fault(struct hvdl_pipe *p, enum hvdl_fault_point at) {
  hvdlComm_t c = p->comm;
  if (at == HVDL_FAULT_SEND && hvdl_fault_hit(c->faults, HVDL_FAULT_STALL))
    hvdl_sleep(c->data_timeout > 0 ? 2 * c->data_timeout : 1.0);
  if (hvdl_fault_hit(c->faults, at))
    return hvdl_fail(c, hvdlSystemError, "injected fault (HVD_LITE_FAULT): a %s to rank %d failed",
                     hvdl_fault_name(at), at == HVDL_FAULT_SEND ? p->right : p->left);
  return hvdlSuccess;
}

/* Posts queued sends while the window has room. */
static hvdlResult_t post_sends(struct hvdl_pipe *p) {
  MPI_Request *slots = send_slots(p);
  for (int i = 0; i < PIPE_SEND_WINDOW && p->nsend < PIPE_SEND_WINDOW && p->qpost < p->qtail;
       i++) {
    if (slots[i] != MPI_REQUEST_NULL) continue;
    if (p->comm->faults) HVDL_CHECK(fault(p, HVDL_FAULT_SEND));
    const struct hvdl_pipe_send *s = &p->queue[p->qpost % p->qcap];
    HVDL_MPI(p->comm, MPI_Isend(s->buf, (int)(s->elems * p->esize), MPI_BYTE, p->right, p->tag,
                                p->comm->mpi, &slots[i]));
    p->sseq[i] = p->qpost++;
    if (++p->nsend > p->comm->pipe_peak_sends) p->comm->pipe_peak_sends = p->nsend;
  }
  return hvdlSuccess;
}

/* Queues one segment for the right neighbour (posted at once if the window has room). */
static hvdlResult_t send_segment(struct hvdl_pipe *p, const char *buf, size_t elems) {
  p->queue[p->qtail % p->qcap] = (struct hvdl_pipe_send){buf, elems};
  p->qtail++;
  return post_sends(p);
}

/* One poll: completes what has completed (a completed slot reads MPI_REQUEST_NULL),
 * then refills the send window. */
static hvdlResult_t pump(struct hvdl_pipe *p) {
  int n = 0, idx[PIPE_SLOTS];
  HVDL_MPI(p->comm, MPI_Testsome(PIPE_SLOTS, p->req, &n, idx, MPI_STATUSES_IGNORE));
  if (n == MPI_UNDEFINED) n = 0;
  for (int i = 0; i < n; i++)
    if (idx[i] >= PIPE_RECV_WINDOW) p->nsend--;
  p->completed += (uint64_t)n;
  return post_sends(p);
}

/* What a wait waits for: receive slot `slot` (>= 0), or else every send queued
 * before number `upto`. */
struct pipe_goal {
  struct hvdl_pipe *p;
  int slot;
  uint64_t upto;
};

static int goal_met(const struct pipe_goal *g) {
  const struct hvdl_pipe *p = g->p;
  if (g->slot >= 0) return p->req[g->slot] == MPI_REQUEST_NULL;
  if (p->qpost < g->upto) return 0;
  for (int i = 0; i < PIPE_SEND_WINDOW; i++)
    if (p->req[PIPE_RECV_WINDOW + i] != MPI_REQUEST_NULL && p->sseq[i] < g->upto) return 0;
  return 1;
}

static hvdlResult_t goal_test(hvdlComm_t comm, void *arg, int *done) {
  (void)comm;
  struct pipe_goal *g = arg;
  *done = goal_met(g);
  if (*done) return hvdlSuccess;
  HVDL_CHECK(pump(g->p));
  *done = goal_met(g);
  return hvdlSuccess;
}

static uint64_t goal_progress(hvdlComm_t comm, void *arg) {
  (void)comm;
  return ((struct pipe_goal *)arg)->p->completed;
}

/* Waits for g with the data phases' limits (bounded, interruptible: wait.c), naming
 * the peer it waits for; on failure abandons everything the pipe has posted. */
static hvdlResult_t wait_goal(struct hvdl_pipe *p, int slot, uint64_t upto) {
  struct pipe_goal g = {p, slot, upto};
  const struct hvdl_poll poll = {goal_test, goal_progress, &g, p->completed};
  hvdlResult_t res = hvdl_wait_peer_poll(p->comm, slot >= 0 ? p->left : p->right, &poll);
  return res == hvdlSuccess ? res : abandon(p, res);
}

/* Starts a step: once the sends of the step before last (the same generation)
 * have completed, this step's sends take that generation. */
static hvdlResult_t begin_step(struct hvdl_pipe *p, int *gen) {
  *gen = (int)(p->step++ & 1u);
  return wait_goal(p, -1, p->step_end[*gen]);
}

static void end_step(struct hvdl_pipe *p, int gen) { p->step_end[gen] = p->qtail; }

static hvdlResult_t post_recv(struct hvdl_pipe *p, unsigned what, char *dst, size_t count,
                              size_t j, int slot) {
  if (p->comm->faults) HVDL_CHECK(fault(p, HVDL_FAULT_RECV));
  char *into = (what & PIPE_REDUCE) ? p->tmp + (size_t)slot * p->seg * p->esize
                                    : dst + j * p->seg * p->esize;
  HVDL_MPI(p->comm, MPI_Irecv(into, (int)(seg_elems(p, count, j) * p->esize), MPI_BYTE, p->left,
                              p->tag, p->comm->mpi, &p->req[slot]));
  return hvdlSuccess;
}

/* One receiving step (the schedule above). */
static hvdlResult_t recv_step(struct hvdl_pipe *p, unsigned what, const char *src, char *dst,
                              size_t count) {
  int gen;
  if ((what & PIPE_REDUCE) && !p->tmp)
    return hvdl_fail(p->comm, hvdlInternalError,
                     "pipe (tag %d): a reducing verb on a pipe set up by hvdl_pipe_init_copy",
                     p->tag);
  HVDL_CHECK(begin_step(p, &gen));
  const size_t nseg = (count + p->seg - 1) / p->seg, win = PIPE_RECV_WINDOW;
  hvdlResult_t res = hvdlSuccess;
  for (size_t j = 0; j < nseg && j < win && res == hvdlSuccess; j++)
    res = post_recv(p, what, dst, count, j, (int)j);

  for (size_t j = 0; j < nseg && res == hvdlSuccess; j++) {
    const int slot = (int)(j % win);
    const size_t elems = seg_elems(p, count, j);
    const size_t at = j * p->seg * p->esize;

    res = wait_goal(p, slot, 0);
    if (res != hvdlSuccess) return res; /* abandoned */
    if (what & PIPE_REDUCE) {
      hvdl_reduce(dst + at, p->tmp + (size_t)slot * p->seg * p->esize, src + at, elems, p->dt,
                  p->op);
      if ((what & PIPE_DIVIDE) && p->op == hvdlAvg)
        hvdl_divide(dst + at, elems, p->dt, (uint64_t)p->comm->size);
    }
    if (j + win < nseg) res = post_recv(p, what, dst, count, j + win, slot);
    if (res == hvdlSuccess && (what & PIPE_FORWARD)) res = send_segment(p, dst + at, elems);
  }
  end_step(p, gen);
  return res == hvdlSuccess ? res : abandon(p, res);
}

hvdlResult_t hvdl_pipe_send(struct hvdl_pipe *p, const void *src, size_t count) {
  int gen;
  HVDL_CHECK(begin_step(p, &gen));
  const char *from = src;
  for (size_t j = 0; j * p->seg < count; j++) {
    hvdlResult_t res = send_segment(p, from + j * p->seg * p->esize, seg_elems(p, count, j));
    if (res != hvdlSuccess) return abandon(p, res);
  }
  end_step(p, gen);
  return hvdlSuccess;
}

hvdlResult_t hvdl_pipe_recv(struct hvdl_pipe *p, void *dst, size_t count) {
  return recv_step(p, 0, NULL, dst, count);
}

hvdlResult_t hvdl_pipe_recv_copy_send(struct hvdl_pipe *p, void *dst, size_t count) {
  return recv_step(p, PIPE_FORWARD, NULL, dst, count);
}

hvdlResult_t hvdl_pipe_recv_reduce(struct hvdl_pipe *p, const void *src, void *dst, size_t count) {
  return recv_step(p, PIPE_REDUCE | PIPE_DIVIDE, src, dst, count);
}

hvdlResult_t hvdl_pipe_recv_reduce_send(struct hvdl_pipe *p, const void *src, void *dst,
                                        size_t count) {
  return recv_step(p, PIPE_REDUCE | PIPE_FORWARD, src, dst, count);
}

hvdlResult_t hvdl_pipe_recv_reduce_copy_send(struct hvdl_pipe *p, const void *src, void *dst,
                                             size_t count) {
  return recv_step(p, PIPE_REDUCE | PIPE_DIVIDE | PIPE_FORWARD, src, dst, count);
}

hvdlResult_t hvdl_pipe_finish(struct hvdl_pipe *p) { return wait_goal(p, -1, p->qtail); }
