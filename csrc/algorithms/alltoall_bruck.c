/*
 * alltoall_bruck.c -- all-to-all by Bruck's schedule (HVD_LITE_ALLTOALL_ALGO=bruck), for
 * blocks all of one size (b bytes): ceil(log2 n) steps of one message each way, however
 * many ranks, where pairwise (alltoall_pairwise.c) sends n-1 messages each way. It pays
 * with bytes: each block travels once per bit set in the distance it goes, so it suits
 * small blocks on many ranks.
 *
 * Rank r works in recvbuff, n slots of b bytes (indices of ranks and slots mod n). Slot i
 * holds, at first, the block bound for rank r+i, and at the end the block from rank r-i:
 *
 *   step                  does                                             bytes out = in
 *   rotate                slot i = block r+i of sendbuff (in place: the         0
 *                         buffer turned round by r blocks)
 *   k = 0 .. K-1          pack the slots i with bit k set (runs of 2^k           c_k * b
 *   (K = ceil(log2 n))    slots), send them to rank r+2^k, receive as many
 *                         from rank r-2^k and unpack them into the same slots
 *   reverse               block q = slot r-q: the map is its own inverse, so    0
 *                         pairs of slots swap
 *
 * c_k is the number of i in [0, n) with bit k set, at most floor(n/2). Example, n = 5
 * (K = 3): step 0 moves slots 1 and 3 one rank on, step 1 slots 2 and 3 two ranks on,
 * step 2 slot 4 four ranks on; slot 0, the rank's own block, never moves.
 *
 * Why it is right: the block from rank s to rank d starts in slot i = d-s at s. It keeps
 * its slot; at step k it moves 2^k ranks on if bit k of i is set, so after the last step
 * it has moved i ranks, to rank d, where slot d-s is what reverse puts into block s. A
 * step's slots are the same on every rank (they depend on i alone), so what rank r-2^k
 * sends is what rank r unpacks. Blocks are copied verbatim, so the result is pairwise's
 * to the bit.
 *
 * Cost per rank: K steps; sent = received = (c_0 + ... + c_(K-1)) * b, n/2 * log2(n)
 * blocks for a power of two (192 blocks at 64 ranks, against pairwise's 63, but in 6
 * messages each way against 63); copies: the rotation (n blocks, up to n/2 more in place),
 * the packing and unpacking (2 c_k blocks a step) and the reversal (3 blocks a pair). The
 * scratch (comm->scratch.work) holds the two packed runs, 2 * floor(n/2) blocks, which
 * is room for the in-place rotation's min(r, n-r) blocks too.
 *
 * The exchanges are pair_exchange.c's (bounded waits with the watch hook and the data
 * timeout; fault points send, recv and stall; everything posted abandoned on failure).
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "transport/transport.h"

#define ALLTOALL_BRUCK_TAG 0x4858

/* Turns the n blocks of buf (b bytes each) round by `by` blocks: block i becomes block
 * i+by's (mod n). tmp holds min(by, n-by) blocks. */
static void rotate(char *buf, int n, int by, size_t b, char *tmp) {
  const size_t head = (size_t)by * b, tail = (size_t)(n - by) * b;
  if (by == 0) return;
  if (by <= n - by) {
    hvdl_copy(tmp, buf, head);
    memmove(buf, buf + head, tail);
    hvdl_copy(buf + tail, tmp, head);
  } else {
    hvdl_copy(tmp, buf + head, tail);
    memmove(buf + tail, buf, head);
    hvdl_copy(buf, tmp, tail);
  }
}

/* Copies the slots of slots[] (b bytes each) with bit m set into packed, one after
 * another (pack), or back from it (!pack); returns the bytes. */
static size_t pack_bit(char *slots, char *packed, int n, int m, size_t b, int pack) {
  size_t at = 0;
  for (int i = m; i < n; i += 2 * m) { /* a run of m slots, or what is left of n */
    const size_t run = (size_t)(n - i < m ? n - i : m) * b;
    if (pack)
      hvdl_copy(packed + at, slots + (size_t)i * b, run);
    else
      hvdl_copy(slots + (size_t)i * b, packed + at, run);
    at += run;
  }
  return at;
}

hvdlResult_t hvdl_alltoall_bruck(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 size_t block) {
  const int n = comm->size, r = comm->rank;
  const size_t b = block, half = (size_t)(n / 2) * block;
  char *recv = recvbuff;
  const char *send = sendbuff;
  if (b == 0) return hvdlSuccess;
  struct hvdl_scratch *s = &comm->scratch;
  HVDL_CHECK(hvdl_reserve(comm, &s->work, &s->work_bytes, 2 * half));
  char *out = s->work, *in = s->work + half;
  if (send == recv) {
    rotate(recv, n, r, b, out);
  } else {
    hvdl_copy(recv, send + (size_t)r * b, (size_t)(n - r) * b);
    hvdl_copy(recv + (size_t)(n - r) * b, send, (size_t)r * b);
  }
  for (int m = 1; m < n; m *= 2) {
    const size_t bytes = pack_bit(recv, out, n, m, b, 1);
    const struct hvdl_msg msg[2] = {{(r - m + n) % n, 1, in, bytes}, {(r + m) % n, 0, out, bytes}};
    MPI_Request reqs[2];
    HVDL_CHECK(hvdl_pair_exchange_set(comm, ALLTOALL_BRUCK_TAG, 2, msg, reqs));
    pack_bit(recv, in, n, m, b, 0);
  }
  for (int i = 0; i < n; i++) { /* reverse: slots i and r-i swap */
    const int q = (r - i + n) % n;
    if (i >= q) continue;
    hvdl_copy(out, recv + (size_t)i * b, b);
    hvdl_copy(recv + (size_t)i * b, recv + (size_t)q * b, b);
    hvdl_copy(recv + (size_t)q * b, out, b);
  }
  return hvdlSuccess;
}
