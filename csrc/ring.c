/*
 * ring.c -- the pipelined ring all-reduce: reduce-scatter, then all-gather.
 *
 * The ring. n ranks; rank r sends only to right = r+1 and receives only from
 * left = r-1 (mod n), on the communicator's private MPI communicator.
 *
 * The chunks. The count elements are cut into n chunks as evenly as possible
 * (chunk k has count/n elements, plus one for the first count%n chunks; some
 * are empty when count < n). Rank c owns chunk c: it finishes its reduction.
 *
 * The schedule at rank r: one initial send, then 2(n-1) receive steps. At step
 * t rank r receives chunk k(t) = r - t - 2 (mod n) from the left, and forwards
 * what it made of it to the right, where it is chunk k(t+1) of the next step:
 *
 *   start          send chunk r-1 of sendbuff (its own contribution)
 *   t = 0 .. n-3   recvReduceSend   recvbuff[k] = received op sendbuff[k]; forward it
 *   t = n-2        recvReduceSend   k = r: that reduction is the final one (Avg
 *                                   divides here); forward the final chunk
 *   t = n-1..2n-4  recvCopySend     the final chunk k lands in recvbuff; forward it
 *   t = 2n-3       recv             the last final chunk (r+1) lands in recvbuff
 *
 * So chunk k leaves rank k+1 as that rank's raw contribution, is combined at
 * k+2, k+3, ... in ring order (received value on the left of op), completed at
 * its owner k, then carried once round the ring and stored verbatim by every
 * other rank. Every rank therefore holds the owner's bytes: results are
 * bitwise identical across ranks, and the same for in-place and out-of-place
 * calls and for reruns, since nothing depends on timing.
 *
 * The pipeline. Each chunk travels as segments of config.segmentBytes (larger
 * if a chunk would need more than RING_MAX_SEGMENTS of them). A step
 * keeps up to RING_WINDOW receives posted (into scratch segments during the
 * reduce-scatter, straight into recvbuff during the all-gather) and forwards
 * each segment the moment it is processed, so segment j moves on to the next
 * rank while segment j+1 arrives and segment j+2 is on the wire: sending,
 * receiving and reducing overlap, and the pipeline runs on across steps
 * without draining.
 *
 * Buffer safety. A forwarded send reads recvbuff. Step t writes only chunk
 * k(t), which differs from the chunk forwarded at step t-1, so before step t
 * starts only the sends of step t-2 must have completed. Sends are kept in
 * two generations (t & 1); the initial send counts as step -1.
 *
 * Cost per rank: 2(n-1) steps, 2(n-1)/n * bytes sent and received, (n-1)/n *
 * bytes reduced (docs/algorithms.md).
 */
#include <string.h>

#include "internal.h"
#include "reduce.h"

#define RING_WINDOW 4
#define RING_TAG 0x4856 /* "HV" */
/* At most this many segments per chunk: a chunk too big for that many
 * config.segmentBytes segments uses larger ones. It bounds the requests in
 * flight: every segment of a step's chunk is sent at once. Open MPI's ob1 orders
 * messages with a 16-bit sequence number, and ~65,536 unmatched messages between
 * two ranks scramble their order (seen with 64-byte segments of a 4 MiB buffer);
 * and with 1024 allowed, a step of exactly 128 segments in flight ran at half
 * speed (64 MiB at 2 ranks with 256 KiB segments: 20 ms, against 11.5 ms with at
 * most 64; docs/benchmarks.md, section 12). */
#define RING_MAX_SEGMENTS 64
/* Longest sleep between polls while waiting for a segment (wait.c). */
#define RING_MAX_SLEEP_US 50.0

struct ring {
  hvdlComm_t comm;
  const char *send;
  char *recv;
  size_t count, esize, seg; /* seg: elements per segment */
  hvdlDataType_t dt;
  hvdlRedOp_t op;
  int n, rank, left, right;
  char *tmp;                /* RING_WINDOW segments */
  MPI_Request *sreq[2];     /* sends of the two most recent steps */
  int nsreq[2];
};

static void chunk_range(const struct ring *g, int k, size_t *off, size_t *len) {
  size_t base = g->count / (size_t)g->n, rem = g->count % (size_t)g->n, uk = (size_t)k;
  *off = uk * base + (uk < rem ? uk : rem);
  *len = base + (uk < rem ? 1 : 0);
}

static size_t num_segments(const struct ring *g, size_t len) { return (len + g->seg - 1) / g->seg; }

/* Waits for the sends of generation `gen`, making their memory free again. */
static hvdlResult_t wait_sends(struct ring *g, int gen) {
  if (g->nsreq[gen] > 0)
    HVDL_CHECK(hvdl_wait_all(g->comm, g->nsreq[gen], g->sreq[gen], RING_MAX_SLEEP_US));
  g->nsreq[gen] = 0;
  return hvdlSuccess;
}

/* send: posts one segment to the right. */
static hvdlResult_t send_segment(struct ring *g, int gen, const char *buf, size_t elems) {
  MPI_Request *req = &g->sreq[gen][g->nsreq[gen]++];
  HVDL_MPI(g->comm, MPI_Isend(buf, (int)(elems * g->esize), MPI_BYTE, g->right, RING_TAG,
                              g->comm->mpi, req));
  return hvdlSuccess;
}

/* Posts the receive of segment j of the chunk at [off, off+len). */
static hvdlResult_t post_recv(struct ring *g, int reduce, size_t off, size_t len, size_t j,
                              MPI_Request *req) {
  size_t first = j * g->seg;
  size_t elems = len - first < g->seg ? len - first : g->seg;
  char *dst = reduce ? g->tmp + (j % RING_WINDOW) * g->seg * g->esize
                     : g->recv + (off + first) * g->esize;
  HVDL_MPI(g->comm, MPI_Irecv(dst, (int)(elems * g->esize), MPI_BYTE, g->left, RING_TAG,
                              g->comm->mpi, req));
  return hvdlSuccess;
}

/* One receive step (see the schedule above). */
static hvdlResult_t ring_step(struct ring *g, int t) {
  const int n = g->n;
  const int k = ((g->rank - t - 2) % n + n) % n;
  const int reduce = t <= n - 2;  /* reduce-scatter: combine with our contribution */
  const int final = t == n - 2;   /* this reduction completes chunk k */
  const int forward = t < 2 * n - 3;
  const int gen = t & 1;
  size_t off, len;
  MPI_Request rreq[RING_WINDOW];

  HVDL_CHECK(wait_sends(g, gen));
  chunk_range(g, k, &off, &len);
  const size_t nseg = num_segments(g, len);
  for (size_t j = 0; j < nseg && j < RING_WINDOW; j++)
    HVDL_CHECK(post_recv(g, reduce, off, len, j, &rreq[j]));

  for (size_t j = 0; j < nseg; j++) {
    const size_t slot = j % RING_WINDOW;
    const size_t first = j * g->seg;
    const size_t elems = len - first < g->seg ? len - first : g->seg;
    char *dst = g->recv + (off + first) * g->esize;

    HVDL_CHECK(hvdl_wait_all(g->comm, 1, &rreq[slot], RING_MAX_SLEEP_US));
    if (reduce) {
      hvdl_reduce(dst, g->tmp + slot * g->seg * g->esize, g->send + (off + first) * g->esize,
                  elems, g->dt, g->op);
      if (final && g->op == hvdlAvg) hvdl_divide(dst, elems, g->dt, (uint64_t)n);
    }
    /* The scratch slot is consumed: reuse it for segment j + window. */
    if (j + RING_WINDOW < nseg) HVDL_CHECK(post_recv(g, reduce, off, len, j + RING_WINDOW, &rreq[slot]));
    if (forward) HVDL_CHECK(send_segment(g, gen, dst, elems));
  }
  return hvdlSuccess;
}

hvdlResult_t hvdl_allreduce_ring(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  struct ring g;
  memset(&g, 0, sizeof g);
  g.comm = comm;
  g.send = sendbuff;
  g.recv = recvbuff;
  g.count = count;
  g.esize = hvdl_type_size(dt);
  g.dt = dt;
  g.op = op;
  g.n = comm->size;
  g.rank = comm->rank;
  g.left = (g.rank - 1 + g.n) % g.n;
  g.right = (g.rank + 1) % g.n;
  g.seg = comm->config.segmentBytes / g.esize;
  if (g.seg == 0) g.seg = 1;
  const size_t max_chunk = count / (size_t)g.n + 1;
  if (max_chunk / g.seg >= RING_MAX_SEGMENTS) g.seg = (max_chunk + RING_MAX_SEGMENTS - 1) / RING_MAX_SEGMENTS;

  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->tmp, &s->tmp_bytes, RING_WINDOW * g.seg * g.esize));
  size_t max_seg = num_segments(&g, max_chunk);
  HVDL_CHECK(hvdl_reserve(comm, &s->sreq, &s->sreq_bytes, 2 * max_seg * sizeof(MPI_Request)));
  g.tmp = s->tmp;
  g.sreq[0] = (MPI_Request *)(void *)s->sreq;
  g.sreq[1] = g.sreq[0] + max_seg;

  /* start: our own contribution to chunk r-1 goes right, as "step -1". */
  size_t off, len;
  chunk_range(&g, (g.rank - 1 + g.n) % g.n, &off, &len);
  for (size_t first = 0; first < len; first += g.seg)
    HVDL_CHECK(send_segment(&g, 1, g.send + (off + first) * g.esize,
                            len - first < g.seg ? len - first : g.seg));

  comm->phase_time[0] = hvdl_now();
  for (int t = 0; t < 2 * (g.n - 1); t++) {
    if (t == g.n - 1) comm->phase_time[1] = hvdl_now();
    HVDL_CHECK(ring_step(&g, t));
  }
  HVDL_CHECK(wait_sends(&g, 0));
  HVDL_CHECK(wait_sends(&g, 1));
  comm->phase_time[2] = hvdl_now();
  return hvdlSuccess;
}
