/*
 * allreduce_shm.c -- the all-reduce of ranks that are all on one host, through
 * the shared-memory unit (segment.c): one of its three forms by size.
 *
 *   B <= SHM_GATHER_BYTES     the one-step form (hvdl_shm_reduce_one_step)
 *   B > SHM_CMA_MIN, s->cma   the single-copy form, below
 *   otherwise                 through the segment's areas (hvdl_shm_reduce)
 *
 * Each reduces in the order of the path the selector would otherwise take:
 * local-rank order at or below config.smallAllReduceBytes (the latency path's),
 * the ring's above; so every form gives the bits of the ring or the latency path.
 *
 * The single-copy form. No area holds the data: each rank reads what it needs
 * straight from the other ranks' own buffers with process_vm_readv and writes
 * its result straight into theirs with process_vm_writev (Linux's cross-memory
 * attach, as Open MPI's smsc/cma uses for large messages); or, for a buffer in
 * hvdlMemAlloc's memory, through its view of the peer's region with plain loads
 * and stores (single_copy.c's hvdl_cma_read and hvdl_cma_write). Lane q
 * (hvdl_block_start: count cut into L near-equal lanes) is local rank q's. Rank r:
 *
 *   before   with a stand-in (below): copy every lane but r of sendbuff into it
 *   step 1   single_copy.c's open: every rank is in the call, the addresses of
 *            its sendbuff and recvbuff (or of its stand-in, for both) posted in
 *            its head page
 *   then     for each chunk of its lane (an area's worth): read that chunk of
 *            every peer's sendbuff into its scratch (or find it in its view),
 *            fold the L inputs (its own from sendbuff) into its recvbuff, and
 *            write the reduced chunk, still in its cache, into every peer's
 *            recvbuff
 *   step 2   single_copy.c's close: every rank's recvbuff is whole, and nobody
 *            touches another's buffers any more: it may return
 *   after    with a stand-in, if the call succeeded: copy every lane but r out
 *            of it into recvbuff
 *
 * A stand-in (single_copy.c's hvdl_cma_stand_in) is a region of rank r's own that
 * it posts in place of plain buffers up to config.shmStandInBytes with enough
 * small pages: the peers then reach it through their views, and rank r pays
 * (L-1) B / L copied in and out locally instead of their copies through the
 * kernel. Its own lane it still reads from sendbuff and folds into recvbuff.
 *
 * Only rank r reads or writes lane r of another rank's buffers, and it writes a
 * chunk there only after it has read that chunk: so in place is safe with no
 * step between (each rank's own lane of its own buffers is its alone). With 3
 * or more ranks an in-place rank copies its own chunk to scratch first, since
 * the fold writes its destination before the third input is read. Per rank:
 * (L-1) B / L read from the peers into a scratch area that stays in the cache
 * (none with views: the fold reads the view), a lane reduced, (L-1) B / L
 * written to the peers from the cache: one copy of B, where the areas take two;
 * 2 steps whatever B. Pulling the result from its owner's recvbuff instead (its
 * lines then still in the owner's core's cache) made ResNet-50's step 1.25x
 * slower and a 4-16 MiB all-reduce 1.2-1.5x
 * (docs/benchmarks-history.md, "The single-copy form").
 *
 * The protocol every single-copy collective shares (the posted addresses, the
 * two steps, the probe at init, the failure rule and its drain) is single_copy.c's.
 */
#include <string.h>

#include "algorithms/algorithms.h"
#include "kernels/kernels.h"
#include "transport/shm/shm.h"

/* Copies the elements of every lane but [a, b) (this rank's) from `from` to `to`. */
static void other_lanes(char *to, const char *from, size_t a, size_t b, size_t count,
                        size_t esize) {
  hvdl_copy(to, from, a * esize);
  hvdl_copy(to + b * esize, from + b * esize, (count - b) * esize);
}

static hvdlResult_t reduce_cma(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                               const struct hvdl_shm_fold *f) {
  struct hvdl_shm *s = comm->shm;
  const size_t esize = hvdl_type_size(f->dt), chunk = s->area / esize;
  const int L = s->local_size, me = s->local_rank;
  const char *send = sendbuff;
  char *recv = recvbuff;
  size_t a, b;
  a = hvdl_block_start(count, L, me);
  b = hvdl_block_start(count, L, me + 1);
  /* The peers read and write only the other lanes: only those pass through a stand-in. */
  char *stand_in = hvdl_cma_stand_in(comm, sendbuff, recvbuff, count * esize);
  if (stand_in) other_lanes(stand_in, send, a, b, count, esize);
  uint64_t k;
  hvdlResult_t res = stand_in ? hvdl_cma_open(comm, stand_in, stand_in, &k)
                              : hvdl_cma_open(comm, sendbuff, recvbuff, &k);
  if (res != hvdlSuccess) {
    if (stand_in) hvdl_cma_free(s); /* a late peer may still write into it */
    return res;
  }
  for (size_t g = a; g < b && res == hvdlSuccess; g += chunk) {
    if (hvdl_cma_peer_failed(s, k)) break; /* close's step then fails (alarm, data timeout) */
    const size_t n = b - g < chunk ? b - g : chunk;
    for (int q = 0; q < L && res == hvdlSuccess; q++) {
      if (q != me) {
        res = hvdl_cma_read(comm, q, hvdl_cma_sendbuff(s, q) + g * esize, n * esize, &s->inputs[q]);
      } else if (send == recv && L > 2) { /* the fold writes recv before it has read it all */
        char *to = hvdl_cma_scratch(s, q, (uintptr_t)(send + g * esize));
        hvdl_copy(to, send + g * esize, n * esize);
        s->inputs[q] = to;
      } else {
        s->inputs[q] = send + g * esize;
      }
    }
    if (res != hvdlSuccess) break;
    hvdl_shm_fold_inputs(s, s->inputs, recv + g * esize, g, n, count, f);
    for (int q = 0; q < L && res == hvdlSuccess; q++)
      if (q != me)
        res = hvdl_cma_write(comm, q, recv + g * esize, hvdl_cma_recvbuff(s, q) + g * esize,
                             n * esize);
  }
  res = hvdl_cma_close(comm, k, res);
  if (stand_in && res == hvdlSuccess)
    other_lanes(recv, stand_in, a, b, count, esize);
  else if (stand_in)
    hvdl_cma_free(s); /* a late peer may still write into it: a new one next */
  return res;
}

hvdlResult_t hvdl_allreduce_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                                hvdlDataType_t dt, hvdlRedOp_t op) {
  struct hvdl_shm *s = comm->shm;
  const size_t bytes = count * hvdl_type_size(dt);
  const struct hvdl_shm_fold f = {dt, op, op == hvdlAvg ? (uint64_t)s->local_size : 0,
                                  bytes > comm->config.smallAllReduceBytes};
  if (bytes <= SHM_GATHER_BYTES && bytes <= s->area)
    return hvdl_shm_reduce_one_step(comm, sendbuff, recvbuff, count, &f);
  if (s->cma && bytes > SHM_CMA_MIN) return reduce_cma(comm, sendbuff, recvbuff, count, &f);
  return hvdl_shm_reduce(comm, sendbuff, recvbuff, count, &f, 0, count);
}
