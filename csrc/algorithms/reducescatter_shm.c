/*
 * reducescatter_shm.c -- the reduce-scatter of ranks that are all on one host
 * (HVD_LITE_REDUCESCATTER_ALGO=shm): each rank reads its block straight from the
 * other ranks' own send buffers (the shared-memory unit's single copy, single_copy.c).
 *
 * sendbuff holds n blocks in rank order, block k of counts[k] elements; rank k
 * ends with block k reduced over every rank in its recvbuff (in place: recvbuff
 * is block k of its sendbuff). Rank r:
 *
 *   step 1   single_copy.c's open: every rank is in the call, its sendbuff posted
 *   then     for each chunk of block r (an area's worth): read that chunk of
 *            every peer's sendbuff into its scratch (process_vm_readv), or find
 *            it in its view of the peer's hvdlMemAlloc region, and fold the n
 *            inputs (its own from sendbuff) into recvbuff
 *   step 2   single_copy.c's close: nobody reads another's buffers any more
 *
 * The fold is the ring's order (reducescatter_ring.c): x[r+1] op x[r+2] op ... op
 * x[r], so the bits are the ring's, whichever algorithm the selector takes.
 * Only rank r reads block r of the others' buffers, and nobody writes into them:
 * in place is safe with no step between. In place with 3 ranks or more, rank r
 * copies its own chunk to scratch first, since the fold writes its destination
 * before it reads its own input last. Per rank: (n-1) B / n read, n-1 folds of
 * B / n (as the ring), 2 steps whatever the size, where the ring takes n-1 steps of B / n through
 * MPI's messages (docs/benchmarks-history.md, "The single-copy reduce-scatter").
 */
#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/shm/shm.h"

hvdlResult_t hvdl_reducescatterv_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                     const size_t *counts, hvdlDataType_t dt, hvdlRedOp_t op) {
  struct hvdl_shm *s = comm->shm;
  const size_t esize = hvdl_type_size(dt), chunk = s->area / esize;
  const int L = s->local_size, me = s->local_rank; /* local rank q is rank q */
  const size_t off = hvdl_before(counts, me), total = hvdl_before(counts, L);
  if (total == 0) return hvdlSuccess; /* alike on every rank */
  const size_t mine = counts[me];
  const char *send = sendbuff;
  char *recv = recvbuff;
  uint64_t k;
  hvdlResult_t res = hvdl_cma_open(comm, sendbuff, recvbuff, &k);
  if (res != hvdlSuccess) return res;
  for (size_t g = 0; g < mine && res == hvdlSuccess; g += chunk) {
    if (hvdl_cma_peer_failed(s, k)) break; /* close's step then fails (alarm, data timeout) */
    const size_t n = mine - g < chunk ? mine - g : chunk;
    const char *own = send + (off + g) * esize;
    for (int q = 0; q < L && res == hvdlSuccess; q++) {
      if (q != me) {
        res = hvdl_cma_read(comm, q, hvdl_cma_sendbuff(s, q) + (off + g) * esize, n * esize,
                            &s->inputs[q]);
      } else if (own == recv + g * esize && L > 2) {
        char *to = hvdl_cma_scratch(s, q, (uintptr_t)own);
        hvdl_copy(to, own, n * esize);
        s->inputs[q] = to;
      } else {
        s->inputs[q] = own;
      }
    }
    if (res != hvdlSuccess) break;
    char *d = recv + g * esize;
    const int first = (me + 1) % L;
    if (L == 1) {
      if (d != own) hvdl_copy(d, own, n * esize);
    } else {
      hvdl_reduce(d, s->inputs[first], s->inputs[(first + 1) % L], n, dt, op);
      for (int i = 2; i < L; i++) hvdl_reduce(d, d, s->inputs[(first + i) % L], n, dt, op);
    }
    if (op == hvdlAvg) hvdl_divide(d, n, dt, (uint64_t)L);
  }
  return hvdl_cma_close(comm, k, res);
}
