/*
 * allreduce_shm.c -- the all-reduce of ranks that are all on one host, through
 * the shared-memory unit (shm.c): one of its three forms by size.
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
 * straight from the other ranks' own buffers with process_vm_readv (Linux's
 * cross-memory attach, as Open MPI's smsc/cma does for large messages). Lane q
 * (hvdl_shm_lane: count cut into L near-equal lanes) is local rank q's. Rank r:
 *
 *   step 1   before: write the addresses of its sendbuff and recvbuff in its
 *            head page (posted), and 0 chunks of its lane reduced (lane_done)
 *   then     for each chunk of its lane (an area's worth): read that chunk of
 *            every peer's sendbuff into its scratch, fold the L inputs (its own
 *            from sendbuff) into its recvbuff, publish the chunk as reduced
 *            (a release store of lane_done); then read every other lane's
 *            chunks from their owners' recvbuffs as their owners publish them
 *   step 2   nobody reads its buffers any more: it may return
 *
 * In place, a rank writes its own lane, which no peer reads, and overwrites
 * chunk j of another lane only after that lane's owner has published j, which
 * it does after reading this rank's input of it. With 3 or more ranks an
 * in-place rank copies its own chunk to scratch first, since the fold writes
 * its destination before the third input is read. Per rank: (L-1) B / L read
 * from the peers into a scratch area that stays in the cache, a lane reduced,
 * (L-1) B / L read from the peers for the result: one copy of B, where the
 * areas take two; 2 steps whatever B. A rank copies the other lanes only once
 * its own is done: copying each chunk as soon as it is published made ResNet-50's
 * step faster but the same buffer reduced again and again (in the cache) 1.1-1.3x
 * slower (docs/benchmarks.md, "The single-copy form").
 *
 * Where it runs (hvdl_shm_cma_init): every rank of the host writes a token in
 * its own memory and reads every other's back; only if every read succeeds is
 * s->cma set, on every rank. A read that fails during a call is an error on
 * that rank, which reaches the others like any failure of a step (shm.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* process_vm_readv (setup.py defines it; the simulation's build does not) */
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "reduce.h"
#include "shm.h"

/* The sendbuff and recvbuff addresses of local rank q's single-copy all-reduce. */
static uint64_t *posted(const struct hvdl_shm *s, int q) {
  return (uint64_t *)(void *)(s->seg[q] + 192);
}

/* Copies bytes at addr in local rank q's own memory to `to`. */
static hvdlResult_t read_peer(hvdlComm_t comm, const struct hvdl_shm *s, int q, void *to,
                              uint64_t addr, size_t bytes) {
  char *d = to;
  /* An injected fault (the recv point, HVD_LITE_FAULT) reads from address 0: the kernel's own
   * failure follows. */
  if (comm->faults && hvdl_fault_hit(comm->faults, HVDL_FAULT_RECV)) addr = 0;
  while (bytes > 0) {
    struct iovec here = {d, bytes}, there = {(void *)(uintptr_t)addr, bytes};
    const ssize_t got = process_vm_readv(s->pids[q], &here, 1, &there, 1, 0);
    if (got <= 0)
      return hvdl_fail(comm, hvdlSystemError,
                       "shared-memory path: reading %zu bytes of rank %d's buffer (process %d) "
                       "failed: %s",
                       bytes, s->ranks[q], s->pids[q], got < 0 ? strerror(errno) : "nothing read");
    d += got;
    addr += (uint64_t)got;
    bytes -= (size_t)got;
  }
  return hvdlSuccess;
}

/* How many chunks of its lane local rank q has reduced in the current call. */
static _Atomic uint64_t *lane_done(const struct hvdl_shm *s, int q) {
  return (_Atomic uint64_t *)(void *)(s->seg[q] + 208);
}

/* A call's copying of the other lanes: s->copied[q] chunks of lane q so far. */
struct lanes {
  struct hvdl_shm *s;
  size_t count, chunk, esize;
  char *recv;
  uint64_t left; /* chunks of other lanes not copied yet */
};

/* Lane q's elements [*a, *b) and how many chunks they make. */
static uint64_t lane_chunks(const struct lanes *w, int q, size_t *a, size_t *b) {
  hvdl_shm_lane(w->count, w->s->local_size, q, a, b);
  return (*b - *a + w->chunk - 1) / w->chunk;
}

/* Copies every chunk that the other lanes' owners have reduced since the last look. */
static hvdlResult_t copy_reduced(hvdlComm_t comm, struct lanes *w) {
  struct hvdl_shm *s = w->s;
  w->left = 0;
  for (int q = 0; q < s->local_size; q++) {
    if (q == s->local_rank) continue;
    size_t a, b;
    const uint64_t all = lane_chunks(w, q, &a, &b);
    const uint64_t done = atomic_load_explicit(lane_done(s, q), memory_order_acquire);
    if (done > s->copied[q]) {
      const size_t lo = a + (size_t)s->copied[q] * w->chunk;
      const size_t hi = done >= all ? b : a + (size_t)done * w->chunk;
      HVDL_CHECK(read_peer(comm, s, q, w->recv + lo * w->esize, posted(s, q)[1] + lo * w->esize,
                           (hi - lo) * w->esize));
      s->copied[q] = done;
    }
    w->left += all - s->copied[q];
  }
  return hvdlSuccess;
}

static hvdlResult_t lanes_ready(hvdlComm_t comm, void *arg, int *done) {
  (void)comm;
  struct lanes *w = arg;
  *done = 0;
  for (int q = 0; q < w->s->local_size && !*done; q++)
    *done = q != w->s->local_rank &&
            atomic_load_explicit(lane_done(w->s, q), memory_order_acquire) > w->s->copied[q];
  return hvdlSuccess;
}

/* Progress: the chunks the other lanes' owners have reduced; names one not done. */
static uint64_t lanes_progress(hvdlComm_t comm, void *arg) {
  struct lanes *w = arg;
  uint64_t sum = 0;
  for (int q = w->s->local_size - 1; q >= 0; q--) {
    if (q == w->s->local_rank) continue;
    size_t a, b;
    const uint64_t done = atomic_load_explicit(lane_done(w->s, q), memory_order_relaxed);
    if (done < lane_chunks(w, q, &a, &b)) comm->wait_peer = w->s->ranks[q];
    sum += done;
  }
  return sum;
}

static hvdlResult_t reduce_cma(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                               size_t count, const struct hvdl_shm_fold *f) {
  struct hvdl_shm *s = comm->shm;
  const size_t esize = hvdl_type_size(f->dt), chunk = s->area / esize;
  const int L = s->local_size, me = s->local_rank;
  const char *send = sendbuff;
  char *recv = recvbuff;
  posted(s, me)[0] = (uintptr_t)sendbuff;
  posted(s, me)[1] = (uintptr_t)recvbuff;
  atomic_store_explicit(lane_done(s, me), 0, memory_order_relaxed); /* published by the step */
  memset(s->copied, 0, sizeof *s->copied * (size_t)L);
  HVDL_CHECK(hvdl_shm_step(comm, s)); /* every rank is in the call, its buffers posted */
  struct lanes w = {s, count, chunk, esize, recv, 0};
  size_t a, b;
  hvdl_shm_lane(count, L, me, &a, &b);
  uint64_t mine = 0;
  for (size_t g = a; g < b; g += chunk) {
    const size_t n = b - g < chunk ? b - g : chunk;
    for (int q = 0; q < L; q++) {
      char *to = s->scratch + (size_t)q * s->area;
      if (q != me) {
        HVDL_CHECK(read_peer(comm, s, q, to, posted(s, q)[0] + g * esize, n * esize));
      } else if (send == recv && L > 2) { /* the fold writes recv before it has read it all */
        memcpy(to, send + g * esize, n * esize);
      } else {
        to = (char *)send + g * esize;
      }
      s->inputs[q] = to;
    }
    hvdl_shm_fold_inputs(s, s->inputs, recv + g * esize, g, n, count, f);
    /* This chunk is reduced, and this rank has read the peers' inputs of it. */
    atomic_store_explicit(lane_done(s, me), ++mine, memory_order_release);
  }
  HVDL_CHECK(copy_reduced(comm, &w));
  while (w.left > 0) {
    const struct hvdl_poll p = {lanes_ready, lanes_progress, &w, lanes_progress(comm, &w)};
    HVDL_CHECK(hvdl_wait_data(comm, &p));
    HVDL_CHECK(copy_reduced(comm, &w));
  }
  return hvdl_shm_step(comm, s); /* no rank reads this one's recvbuff any more */
}

/* Whether this rank can read every other local rank's own memory with
 * process_vm_readv (collective over s->local): each rank posts its process id
 * and the address of a token, reads every other rank's token back and compares
 * it. A seccomp filter, Yama's ptrace scope above 1, separate pid namespaces or
 * different users make a read fail; the caller then agrees on no single-copy
 * form. With Yama's scope 1 a process may be read only by its ancestors unless
 * it names a reader: like Open MPI's CMA, this rank lets any process of its user. */
static int cma_works(struct hvdl_shm *s) {
  FILE *yama = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (yama) {
    int scope = 0;
    if (fscanf(yama, "%d", &scope) == 1 && scope == 1)
      prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    fclose(yama);
  }
  struct token { int64_t pid; uint64_t addr, value; };
  const int ls = s->local_size;
  struct token *all = calloc((size_t)ls, sizeof *all);
  uint64_t *mine = malloc(sizeof *mine);
  int ok = all && mine;
  if (MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->local) != MPI_SUCCESS) ok = 0;
  struct token me = {(int64_t)getpid(), (uintptr_t)mine,
                     ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)s ^ 0x5bd1e995u};
  if (ok) {
    *mine = me.value;
    if (MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, s->local) !=
        MPI_SUCCESS)
      ok = 0;
  }
  for (int q = 0; ok && q < ls; q++) {
    s->pids[q] = (int)all[q].pid;
    if (q == s->local_rank) continue;
    uint64_t v = 0;
    struct iovec here = {&v, sizeof v}, there = {(void *)(uintptr_t)all[q].addr, sizeof v};
    ok = process_vm_readv((pid_t)all[q].pid, &here, 1, &there, 1, 0) == (ssize_t)sizeof v &&
         v == all[q].value;
  }
  /* Nobody frees its token before every rank has read it. */
  if (MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->local) != MPI_SUCCESS) ok = 0;
  free(all);
  free(mine);
  return ok;
}

hvdlResult_t hvdl_shm_cma_init(hvdlComm_t comm) {
  struct hvdl_shm *s = comm->shm;
  /* comm->shm and its hosts are alike on every rank (shm.c's agreement), and so
   * is disableShmCma (rank 0's): every rank of the one host probes, or none. */
  if (!s || s->hosts != 1 || comm->config.disableShmCma) return hvdlSuccess;
  const int ls = s->local_size;
  s->pids = calloc((size_t)ls, sizeof *s->pids);
  s->scratch = malloc((size_t)ls * s->area);
  s->copied = calloc((size_t)ls, sizeof *s->copied);
  int ok = s->pids && s->scratch && s->copied;
  HVDL_MPI(comm, MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->local));
  s->cma = ok && cma_works(s);
  return hvdlSuccess;
}

hvdlResult_t hvdl_allreduce_shm(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  struct hvdl_shm *s = comm->shm;
  const size_t bytes = count * hvdl_type_size(dt);
  const struct hvdl_shm_fold f = {dt, op, op == hvdlAvg ? (uint64_t)s->local_size : 0,
                                  bytes > comm->config.smallAllReduceBytes};
  if (bytes <= SHM_GATHER_BYTES && bytes <= s->area)
    return hvdl_shm_reduce_one_step(comm, sendbuff, recvbuff, count, &f);
  if (s->cma && bytes > SHM_CMA_MIN) return reduce_cma(comm, sendbuff, recvbuff, count, &f);
  return hvdl_shm_reduce(comm, sendbuff, recvbuff, count, &f, 0, count);
}
