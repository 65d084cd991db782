/*
 * pipe.h -- the segment pipeline that every ring and chain collective shares
 * (ring.c, allgather.c, reducescatter.c, broadcast.c, and through
 * reduce-scatter reduce_root.c).
 *
 * A pipe is this rank's place in a ring: it receives only from `left` and
 * sends only to `right`. An algorithm is a sequence of steps; each step moves
 * one piece (a contiguous run of elements, possibly empty) with one verb:
 *
 *   send               post the piece to the right
 *   recv               receive the piece from the left into dst
 *   recvCopySend       receive into dst, forwarding each segment as it lands
 *   recvReduce         dst = received op src            (the last reduction:
 *                      Avg divides by the number of ranks here)
 *   recvReduceSend     dst = received op src, forwarding each segment
 *   recvReduceCopySend dst = received op src, the last reduction (Avg divides
 *                      here), forwarding each segment (the ring all-reduce)
 *
 * Both neighbours must call matching verbs on pieces of the same length: what
 * one rank's step sends is what its right neighbour's next receiving step
 * receives. A piece travels as segments of `seg` elements; a receiving step
 * keeps PIPE_RECV_WINDOW receives posted (into scratch segments when it
 * reduces, straight into dst otherwise) and forwards each segment the moment it
 * is processed, so receiving, reducing and sending overlap and the pipeline
 * runs on from one step into the next without draining. What a step sends goes
 * through the pipe's send queue, at most PIPE_SEND_WINDOW sends in flight; the
 * pipe's waits post the rest, so every verb returns without waiting for its
 * own sends.
 *
 * Buffer safety, the caller's side: a step's sends read their memory (src for
 * send, dst for the forwarding verbs) until the step after next begins,
 * because a step first waits until every send of the step two before it has
 * been posted and has completed (two generations, as in ring.c). So a step
 * must not write memory that the previous step is still sending from;
 * hvdl_pipe_finish waits for all.
 */
#ifndef HVDL_PIPE_H_
#define HVDL_PIPE_H_

#include <stddef.h>

#include "internal.h"

/* Receives posted ahead by a receiving step (into scratch segments when it reduces). */
#define PIPE_RECV_WINDOW 4
/* Sends in flight: a pipe posts at most this many; the rest of what its steps send
 * wait in its queue, in order, and are posted as earlier ones complete. Measured on
 * a loaded 2-core machine (docs/benchmarks.md, "Sends in flight"), the ring
 * all-reduce of 64 MiB at 2 ranks, against 64 segments all posted at once: posting
 * every segment took 1.10-1.15x at 128 segments and 1.26-1.54x at 256; a window of
 * 32, 1.04x and 1.06x (1.21x and 1.39x in the most loaded set); 8 starved the
 * pipeline (1.23-1.26x); 64 was no better than 32. */
#define PIPE_SEND_WINDOW 32
/* The segment policy, one for every collective: segments of config.segmentBytes
 * (HVD_LITE_SEGMENT_BYTES), and larger ones for a piece that would need more than
 * PIPE_MAX_SEGMENTS of them. With the send window this no longer bounds what is in
 * flight; it bounds the send queue's scratch (2 x 64 entries) and the per-message
 * costs of a long piece. */
#define PIPE_MAX_SEGMENTS 64
/* The largest message a pipe sends (its byte count must fit an int). */
#define PIPE_MAX_MESSAGE_BYTES ((size_t)1 << 30)

/* A segment waiting in a pipe's send queue. */
struct hvdl_pipe_send {
  const char *buf;
  size_t elems;
};

struct hvdl_pipe {
  hvdlComm_t comm;
  int left, right, tag;
  size_t esize, seg;        /* bytes per element, elements per segment */
  hvdlDataType_t dt;
  hvdlRedOp_t op;
  unsigned step;            /* steps taken; the generation is step & 1 */
  char *tmp;                /* PIPE_RECV_WINDOW receive segments for the reducing verbs */
  /* req: the receive slots, then the send slots; a free or completed slot is
   * MPI_REQUEST_NULL. sseq: the queue number of the send in each send slot. */
  MPI_Request req[PIPE_RECV_WINDOW + PIPE_SEND_WINDOW];
  uint64_t sseq[PIPE_SEND_WINDOW];
  int nsend;                /* sends in flight */
  /* The send queue: segments numbered in the order they go; queue[n % qcap] holds
   * segment n for qpost <= n < qtail (not posted yet). */
  struct hvdl_pipe_send *queue;
  size_t qcap;
  uint64_t qpost, qtail;
  uint64_t step_end[2];     /* qtail at the end of the latest step of each generation */
  uint64_t completed;       /* requests seen completing (the waits' progress) */
};

/* Sets up a pipe on comm's ring for pieces of at most max_piece elements,
 * using comm's scratch (segments and request arrays; no other collective may
 * run on comm until hvdl_pipe_finish). op is only used by the reducing verbs. */
hvdlResult_t hvdl_pipe_init(struct hvdl_pipe *p, hvdlComm_t comm, int tag, size_t max_piece,
                            hvdlDataType_t dt, hvdlRedOp_t op);

/* The same for a pipe that only copies (send, recv, recvCopySend; the reducing
 * verbs fail on it). On 2 ranks nothing is forwarded, so nothing would overlap
 * with a segment's transfer: each piece goes as one message (up to
 * PIPE_MAX_MESSAGE_BYTES), which saves a rendezvous per segment. */
hvdlResult_t hvdl_pipe_init_copy(struct hvdl_pipe *p, hvdlComm_t comm, int tag, size_t max_piece,
                                 hvdlDataType_t dt);

hvdlResult_t hvdl_pipe_send(struct hvdl_pipe *p, const void *src, size_t count);
hvdlResult_t hvdl_pipe_recv(struct hvdl_pipe *p, void *dst, size_t count);
hvdlResult_t hvdl_pipe_recv_copy_send(struct hvdl_pipe *p, void *dst, size_t count);
hvdlResult_t hvdl_pipe_recv_reduce(struct hvdl_pipe *p, const void *src, void *dst, size_t count);
hvdlResult_t hvdl_pipe_recv_reduce_send(struct hvdl_pipe *p, const void *src, void *dst,
                                        size_t count);
hvdlResult_t hvdl_pipe_recv_reduce_copy_send(struct hvdl_pipe *p, const void *src, void *dst,
                                             size_t count);

/* Waits for every send still in flight. */
hvdlResult_t hvdl_pipe_finish(struct hvdl_pipe *p);

#endif /* HVDL_PIPE_H_ */
