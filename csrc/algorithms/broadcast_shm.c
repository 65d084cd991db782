/*
 * broadcast_shm.c -- the broadcast of ranks that are all on one host
 * (HVD_LITE_BROADCAST_ALGO=shm): every other rank reads the root's buffer
 * straight from the root's memory (the shared-memory unit's single copy,
 * single_copy.c).
 *
 * As every broadcast here, NCCL's rules: the root's sendbuff goes into every
 * rank's recvbuff (the root's own too, unless in place); the other ranks'
 * sendbuff is not read. Rank r:
 *
 *   step 1   single_copy.c's open: every rank is in the call, its sendbuff posted
 *   then     the root copies sendbuff into its recvbuff unless in place; every
 *            other rank, for each chunk (an area's worth), reads it from the
 *            root's sendbuff straight into its recvbuff (process_vm_readv, or a
 *            plain copy from its view of the root's hvdlMemAlloc region)
 *   step 2   single_copy.c's close: nobody reads the root's buffer any more
 *
 * Nobody writes into another's buffers and the root's is only read: no step
 * between. Per rank: B read once, in 2 steps whatever the number of ranks and
 * the size, where the chain takes S + n - 2 stages of messages and the tree
 * log2 n of B (docs/benchmarks-history.md, "The single-copy broadcast"). The ranks all
 * read the root's pages at once: their copies share its memory's bandwidth.
 */
#include "algorithms/algorithms.h"
#include "transport/shm/shm.h"

hvdlResult_t hvdl_broadcast_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, int root) {
  struct hvdl_shm *s = comm->shm;
  const size_t bytes = count * hvdl_type_size(dt);
  if (bytes == 0) return hvdlSuccess; /* alike on every rank */
  char *recv = recvbuff;
  uint64_t k;
  hvdlResult_t res = hvdl_cma_open(comm, comm->rank == root ? sendbuff : NULL, recvbuff, &k);
  if (res != hvdlSuccess) return res;
  if (comm->rank == root) {
    if (recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, bytes);
  } else {
    /* local rank q is rank q: every rank is on this host, in rank order */
    const uint64_t from = hvdl_cma_sendbuff(s, root);
    for (size_t g = 0; g < bytes && res == hvdlSuccess; g += s->area) {
      if (hvdl_cma_peer_failed(s, k)) break; /* close's step then fails (alarm, data timeout) */
      const size_t n = bytes - g < s->area ? bytes - g : s->area;
      res = hvdl_cma_read_into(comm, root, from + g, n, recv + g);
    }
  }
  return hvdl_cma_close(comm, k, res);
}
