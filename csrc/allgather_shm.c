/*
 * allgather_shm.c -- the single-copy all-gather of ranks that are all on one host
 * (HVD_LITE_ALLGATHER_ALGO=shm; auto there where the peers can be reached).
 *
 * recvbuff holds n blocks in rank order, block k of counts[k] elements; rank k
 * contributes block k from its sendbuff (in place: sendbuff is block k of its
 * recvbuff). With the shared-memory unit's single-copy protocol (shm_cma.c),
 * rank r:
 *
 *   step 1   shm_cma.c's open: every rank is in the call, its recvbuff posted
 *   then     for each chunk of its block (an area's worth): write the chunk,
 *            still in its cache, into block r of every peer's recvbuff with
 *            process_vm_writev, the next peer up first (so that the ranks do
 *            not all write to the same one at once); then copy its block into
 *            its own recvbuff unless in place
 *   step 2   shm_cma.c's close: every recvbuff is whole, nobody writes any more
 *
 * Each block is written only by its owner, into a place nothing else writes:
 * no step between. Every block is its owner's bytes, verbatim. Per rank: its
 * block written to each of the n-1 peers, one copy each, and 2 steps whatever
 * the size, where the ring takes n-1 steps (through MPI's messages: Open MPI's
 * also single-copy for large ones, MPICH's through its own shared buffers). At
 * 2 ranks: docs/benchmarks.md, "The single-copy all-gather".
 */
#include <string.h>

#include "shm.h"

hvdlResult_t hvdl_allgatherv_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                 const size_t *counts, hvdlDataType_t dt) {
  struct hvdl_shm *s = comm->shm;
  const size_t esize = hvdl_type_size(dt);
  const int L = s->local_size, me = s->local_rank;
  size_t total = 0, off = 0;
  for (int q = 0; q < comm->size; q++) {
    if (q == comm->rank) off = total * esize;
    total += counts[q];
  }
  if (total == 0) return hvdlSuccess; /* alike on every rank */
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
      res = hvdl_cma_copy(comm, q, (char *)send + g, hvdl_cma_recvbuff(s, q) + off + g, n, 1);
    }
  }
  if (res == hvdlSuccess && own != send && mine > 0) memcpy(own, send, mine);
  return hvdl_cma_close(comm, k, res);
}
