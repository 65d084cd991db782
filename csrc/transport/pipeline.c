/*
 * pipeline.c -- the segment pipeline shared by every ring and chain collective.
 * The verbs and the rules for calling them are in transport.h.
 *
 * One receiving step at this rank, for a piece of nseg segments:
 *
 *   wait for the sends of the step before last (generation step & 1)
 *   post the receives of segments 0 .. PIPE_WINDOW-1
 *   for j = 0 .. nseg-1:
 *     wait for segment j
 *     reduce it into dst (the reducing verbs; Avg divides in the last reduction:
     recvReduce, recvReduceCopySend)
 *     post the receive of segment j + PIPE_WINDOW into the slot just consumed
 *     forward dst's segment j to the right (the forwarding verbs)
 *
 * A send step posts the first PIPE_SEND_WINDOW of its piece's segments; the
 * rest wait in p->pend. While later steps wait for their receives, each poll
 * that finds the oldest send in flight complete posts the next pending one
 * (wait_recv), so at most PIPE_SEND_WINDOW of them are in flight; a step that
 * would wait for the pending sends' generation, a later send step and
 * hvdl_pipe_finish first post the rest the same way (drain). The receiver's
 * window paces the segments in flight.
 */
#include <string.h>

#include "kernels/kernels.h"
#include "transport/transport.h"

enum { PIPE_REDUCE = 1, PIPE_FORWARD = 2, PIPE_DIVIDE = 4 };

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

  struct hvdl_scratch *s = &comm->scratch;
  if (reduces) {
    HVDL_CHECK(hvdl_reserve(comm, &s->tmp, &s->tmp_bytes, PIPE_WINDOW * p->seg * p->esize));
    p->tmp = s->tmp;
  }
  HVDL_CHECK(hvdl_reserve(comm, &s->sreq, &s->sreq_bytes, 2 * max_seg * sizeof(MPI_Request)));
  p->sreq[0] = (MPI_Request *)(void *)s->sreq;
  p->sreq[1] = p->sreq[0] + max_seg;
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
    seg_bytes =
        max_piece <= PIPE_MAX_MESSAGE_BYTES / esize ? max_piece * esize : PIPE_MAX_MESSAGE_BYTES;
  }
  return pipe_setup(p, comm, tag, max_piece, dt, hvdlSum, seg_bytes, 0);
}

static size_t seg_elems(const struct hvdl_pipe *p, size_t count, size_t j) {
  const size_t first = j * p->seg;
  return count - first < p->seg ? count - first : p->seg;
}

/* A failed step abandons everything the pipe has posted (wait.c), so that no
 * message of it can land in a buffer after the failure is reported. */
static hvdlResult_t abandon(struct hvdl_pipe *p, MPI_Request *rreq, int nr, hvdlResult_t res) {
  const double until = hvdl_now() + HVDL_ABANDON_GRACE;
  if (rreq) hvdl_abandon(p->comm, nr, rreq, 1, until);
  for (int gen = 0; gen < 2; gen++) {
    hvdl_abandon(p->comm, p->nsreq[gen], p->sreq[gen], 0, until);
    p->nsreq[gen] = p->sdone[gen] = 0;
  }
  p->pend.src = NULL;
  return res;
}

static hvdlResult_t drain(struct hvdl_pipe *p);

static hvdlResult_t wait_sends(struct hvdl_pipe *p, int gen) {
  if (p->pend.src && p->pend.gen == gen) HVDL_CHECK(drain(p));
  if (p->nsreq[gen] > 0) {
    hvdlResult_t res = hvdl_wait_peer(p->comm, p->right, p->nsreq[gen], p->sreq[gen]);
    if (res != hvdlSuccess) return abandon(p, NULL, 0, res);
  }
  p->nsreq[gen] = p->sdone[gen] = 0;
  return hvdlSuccess;
}

/* Starts a step: its sends join generation step & 1, once the sends of the
 * step before last (the same generation) have completed. */
static hvdlResult_t begin_step(struct hvdl_pipe *p, int *gen) {
  *gen = (int)(p->step++ & 1u);
  return wait_sends(p, *gen);
}

/* The tag of the k-th piece a rank sends, which is the k-th piece its right
 * neighbour receives: a send step's pending segments go out while the next
 * step forwards, and the two pieces must not match each other's receives. */
static int piece_tag(const struct hvdl_pipe *p, unsigned k) {
  return (k & 1u) ? p->tag + PIPE_TAG_ODD : p->tag;
}

/* send: one segment to the right. */
static hvdlResult_t send_segment(struct hvdl_pipe *p, int gen, int tag, const char *buf,
                                 size_t elems) {
  HVDL_CHECK(hvdl_fault(p->comm, HVDL_FAULT_SEND, p->right));
  MPI_Request *req = &p->sreq[gen][p->nsreq[gen]];
  HVDL_MPI(p->comm,
           MPI_Isend(buf, (int)(elems * p->esize), MPI_BYTE, p->right, tag, p->comm->mpi, req));
  p->nsreq[gen]++;
  return hvdlSuccess;
}

/* Posts pending segments of the send step while fewer than PIPE_SEND_WINDOW of
 * its generation's sends are in flight, testing the oldest one when the window
 * is full. Never blocks. */
static hvdlResult_t post_pending(struct hvdl_pipe *p) {
  const int g = p->pend.gen;
  while (p->pend.src) {
    if (p->nsreq[g] - p->sdone[g] < PIPE_SEND_WINDOW) {
      const size_t j = p->pend.next++;
      HVDL_CHECK(send_segment(p, g, p->pend.tag, p->pend.src + j * p->seg * p->esize,
                              seg_elems(p, p->pend.count, j)));
      if (p->pend.next == p->pend.nseg) p->pend.src = NULL;
      continue;
    }
    int done = 0;
    HVDL_MPI(p->comm, MPI_Test(&p->sreq[g][p->sdone[g]], &done, MPI_STATUS_IGNORE));
    if (!done) break;
    p->sdone[g]++;
  }
  return hvdlSuccess;
}

/* Posts every pending segment, waiting for the oldest send in flight whenever
 * the window is full (the right neighbour is receiving them). */
static hvdlResult_t drain(struct hvdl_pipe *p) {
  while (p->pend.src) {
    hvdlResult_t res = post_pending(p);
    const int g = p->pend.gen;
    if (res == hvdlSuccess && p->pend.src)
      res = hvdl_wait_peer(p->comm, p->right, 1, &p->sreq[g][p->sdone[g]]);
    if (res != hvdlSuccess) return abandon(p, NULL, 0, res);
  }
  return hvdlSuccess;
}

/* Waiting for one receive while a send step's segments are pending: each poll
 * also moves the window on, so that the neighbours never wait for each other's
 * pending sends. Progress (for the data timeout): the window's sends completed and
 * posted; the receive ends the wait. */
struct recv_wait {
  struct hvdl_pipe *p;
  MPI_Request *req;
};

static hvdlResult_t test_recv(hvdlComm_t comm, void *arg, int *done) {
  struct recv_wait *w = arg;
  if (w->p->pend.src) HVDL_CHECK(post_pending(w->p));
  HVDL_MPI(comm, MPI_Test(w->req, done, MPI_STATUS_IGNORE));
  return hvdlSuccess;
}

static uint64_t window_progress(const struct hvdl_pipe *p) {
  return (uint64_t)p->sdone[0] + (uint64_t)p->sdone[1] + p->pend.next;
}

static uint64_t recv_progress(hvdlComm_t comm, void *arg) {
  const struct recv_wait *w = arg;
  comm->wait_peer = w->p->left;
  return window_progress(w->p);
}

static hvdlResult_t wait_recv(struct hvdl_pipe *p, MPI_Request *req) {
  if (!p->pend.src) return hvdl_wait_peer(p->comm, p->left, 1, req);
  struct recv_wait w = {p, req};
  const struct hvdl_poll poll = {test_recv, recv_progress, &w, window_progress(p)};
  return hvdl_wait_data(p->comm, &poll);
}

static hvdlResult_t post_recv(struct hvdl_pipe *p, unsigned what, int tag, char *dst, size_t count,
                              size_t j, MPI_Request *req) {
  HVDL_CHECK(hvdl_fault(p->comm, HVDL_FAULT_RECV, p->left));
  char *into = (what & PIPE_REDUCE) ? p->tmp + (j % PIPE_WINDOW) * p->seg * p->esize
                                    : dst + j * p->seg * p->esize;
  HVDL_MPI(p->comm, MPI_Irecv(into, (int)(seg_elems(p, count, j) * p->esize), MPI_BYTE, p->left,
                              tag, p->comm->mpi, req));
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
  const int rtag = piece_tag(p, p->received++);
  const int stag = (what & PIPE_FORWARD) ? piece_tag(p, p->sent++) : 0;
  const size_t nseg = (count + p->seg - 1) / p->seg;
  MPI_Request rreq[PIPE_WINDOW];
  hvdlResult_t res = hvdlSuccess;
  for (size_t j = 0; j < PIPE_WINDOW; j++) rreq[j] = MPI_REQUEST_NULL;
  for (size_t j = 0; j < nseg && j < PIPE_WINDOW && res == hvdlSuccess; j++)
    res = post_recv(p, what, rtag, dst, count, j, &rreq[j]);

  for (size_t j = 0; j < nseg && res == hvdlSuccess; j++) {
    const size_t slot = j % PIPE_WINDOW;
    const size_t elems = seg_elems(p, count, j);
    const size_t at = j * p->seg * p->esize;

    res = wait_recv(p, &rreq[slot]);
    if (res != hvdlSuccess) break;
    if (what & PIPE_REDUCE) {
      hvdl_reduce(dst + at, p->tmp + slot * p->seg * p->esize, src + at, elems, p->dt, p->op);
      if ((what & PIPE_DIVIDE) && p->op == hvdlAvg)
        hvdl_divide(dst + at, elems, p->dt, (uint64_t)p->comm->size);
    }
    if (j + PIPE_WINDOW < nseg)
      res = post_recv(p, what, rtag, dst, count, j + PIPE_WINDOW, &rreq[slot]);
    if (res == hvdlSuccess && (what & PIPE_FORWARD))
      res = send_segment(p, gen, stag, dst + at, elems);
  }
  return res == hvdlSuccess ? res : abandon(p, rreq, PIPE_WINDOW, res);
}

hvdlResult_t hvdl_pipe_send(struct hvdl_pipe *p, const void *src, size_t count) {
  int gen;
  if (p->pend.src) HVDL_CHECK(drain(p));
  HVDL_CHECK(begin_step(p, &gen));
  const int tag = piece_tag(p, p->sent++);
  if (count == 0) return hvdlSuccess;
  p->pend.tag = tag;
  p->pend.src = src;
  p->pend.count = count;
  p->pend.next = 0;
  p->pend.nseg = (count + p->seg - 1) / p->seg;
  p->pend.gen = gen;
  hvdlResult_t res = post_pending(p);
  return res == hvdlSuccess ? res : abandon(p, NULL, 0, res);
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

hvdlResult_t hvdl_pipe_finish(struct hvdl_pipe *p) {
  if (p->pend.src) HVDL_CHECK(drain(p));
  HVDL_CHECK(wait_sends(p, 0));
  HVDL_CHECK(wait_sends(p, 1));
  return hvdlSuccess;
}
