/*
 * allgather_shm.c -- the all-gather of ranks that are all on one host
 * (HVD_LITE_ALLGATHER_ALGO=shm), in one of two forms by the result's size.
 *
 * Small (at most SHM_ALLGATHER_MIN bytes in all, and one area): one step through
 * the segment. Each rank copies its block into its input area for the step,
 * publishes the step, then copies every peer's block out of the peer's area
 * into its recvbuff. The areas alternate by the step's parity, so the next
 * call's writes go to the other area, and the one after waits at its step for
 * every rank to be past this one (shm.h). One step and 2 copies of each block
 * per reader, where the ring takes n-1 messages and the single copy below two
 * steps and a system call per peer.
 *
 * Larger: the single copy (needs the peers' memory within reach, single_copy.c).
 *
 * recvbuff holds n blocks in rank order, block k of counts[k] elements; rank k
 * contributes block k from its sendbuff (in place: sendbuff is block k of its
 * recvbuff). With the shared-memory unit's single-copy protocol (single_copy.c),
 * rank r:
 *
 *   step 1   single_copy.c's open: every rank is in the call, its recvbuff posted
 *   then     for each chunk of its block (an area's worth): write the chunk,
 *            still in its cache, into block r of every peer's recvbuff with
 *            process_vm_writev, the next peer up first (so that the ranks do
 *            not all write to the same one at once); then copy its block into
 *            its own recvbuff unless in place
 *   step 2   single_copy.c's close: every recvbuff is whole, nobody writes any more
 *
 * Each block is written only by its owner, into a place nothing else writes:
 * no step between. Every block is its owner's bytes, verbatim. Per rank: its
 * block written to each of the n-1 peers, one copy each, and 2 steps whatever
 * the size, where the ring takes n-1 steps (through MPI's messages: Open MPI's
 * also single-copy for large ones, MPICH's through its own shared buffers). At
 * 2 ranks: docs/benchmarks-history.md, "The single-copy all-gather".
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "transport/shm/shm.h"

/* The small form (above): every block fits the areas; the same choice on every rank. */
static hvdlResult_t one_step(hvdlComm_t comm, struct hvdl_shm *s, const void *sendbuff,
                             void *recvbuff, const size_t *counts, size_t esize) {
  const uint64_t k = s->step + 1;
  const size_t mine = counts[comm->rank] * esize;
  if (mine) hvdl_copy(hvdl_shm_in_area(s, s->local_rank, k), sendbuff, mine);
  HVDL_CHECK(hvdl_shm_step(comm, s));
  char *out = recvbuff;
  for (int q = 0; q < comm->size; q++) {
    const size_t b = counts[q] * esize;
    /* local rank q is rank q: every rank is on this host, in rank order */
    const char *from = q == comm->rank ? (const char *)sendbuff : hvdl_shm_in_area(s, q, k);
    if (b && from != out) hvdl_copy(out, from, b);
    out += b;
  }
  return hvdlSuccess;
}

hvdlResult_t hvdl_allgatherv_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 const size_t *counts, hvdlDataType_t dt) {
  struct hvdl_shm *s = comm->shm;
  const size_t esize = hvdl_type_size(dt);
  const int L = s->local_size, me = s->local_rank;
  const size_t total = hvdl_before(counts, comm->size),
               off = hvdl_before(counts, comm->rank) * esize;
  if (total == 0) return hvdlSuccess; /* alike on every rank */
  if (total * esize <= SHM_ALLGATHER_MIN && total * esize <= s->area)
    return one_step(comm, s, sendbuff, recvbuff, counts, esize);
  const size_t mine = counts[comm->rank] * esize;
  const char *send = sendbuff;
  char *own = (char *)recvbuff + off;
  uint64_t k;
  hvdlResult_t res = hvdl_cma_open(comm, sendbuff, recvbuff, &k);
  if (res != hvdlSuccess) return res;
  for (size_t g = 0; g < mine && res == hvdlSuccess; g += s->area) {
    if (hvdl_cma_peer_failed(s, k)) break; /* close's step then fails (alarm, data timeout) */
    const size_t n = mine - g < s->area ? mine - g : s->area;
    for (int j = 1; j < L && res == hvdlSuccess; j++) {
      const int q = (me + j) % L;
      res = hvdl_cma_write(comm, q, send + g, hvdl_cma_recvbuff(s, q) + off + g, n);
    }
  }
  if (res == hvdlSuccess && own != send && mine > 0) hvdl_copy(own, send, mine);
  return hvdl_cma_close(comm, k, res);
}
