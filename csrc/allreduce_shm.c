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
 * straight from the other ranks' own buffers with process_vm_readv and writes
 * its result straight into theirs with process_vm_writev (Linux's cross-memory
 * attach, as Open MPI's smsc/cma uses for large messages). Lane q
 * (hvdl_shm_lane: count cut into L near-equal lanes) is local rank q's. Rank r:
 *
 *   step 1   before: write the addresses of its sendbuff and recvbuff in its
 *            head page (posted)
 *   then     for each chunk of its lane (an area's worth): read that chunk of
 *            every peer's sendbuff into its scratch, fold the L inputs (its own
 *            from sendbuff) into its recvbuff, and write the reduced chunk, still
 *            in its cache, into every peer's recvbuff
 *   step 2   every rank's recvbuff is whole, and nobody touches another's
 *            buffers any more: it may return
 *
 * Only rank r reads or writes lane r of another rank's buffers, and it writes a
 * chunk there only after it has read that chunk: so in place is safe with no
 * step between (each rank's own lane of its own buffers is its alone). With 3
 * or more ranks an in-place rank copies its own chunk to scratch first, since
 * the fold writes its destination before the third input is read. Per rank:
 * (L-1) B / L read from the peers into a scratch area that stays in the cache,
 * a lane reduced, (L-1) B / L written to the peers from the cache: one copy of
 * B, where the areas take two; 2 steps whatever B. Pulling the result from its
 * owner's recvbuff instead (its lines then still in the owner's core's cache)
 * made ResNet-50's step 1.25x slower and a 4-16 MiB all-reduce 1.2-1.5x
 * (docs/benchmarks.md, "The single-copy form").
 *
 * Where it runs (hvdl_shm_cma_init): every rank of the host writes a token in
 * its own memory, reads every other's back and writes it into that rank's
 * memory; only if every read and write succeeds is s->cma set, on every rank. A
 * read or write that fails during a call is an error on that rank, which reaches
 * the others like any failure of a step (shm.c); a failed call returns only
 * once no peer can write into its buffers any more (drain, below).
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

/* Copies bytes between `here` in this process and addr in local rank q's own
 * memory: from q (process_vm_readv) or, with `write`, to q (process_vm_writev).
 * An injected fault (HVD_LITE_FAULT: the recv point for a read, send for a
 * write) uses address 0: the kernel's own failure follows. */
static hvdlResult_t peer_copy(hvdlComm_t comm, const struct hvdl_shm *s, int q, void *here,
                              uint64_t addr, size_t bytes, int write) {
  char *d = here;
  if (comm->faults && hvdl_fault_hit(comm->faults, write ? HVDL_FAULT_SEND : HVDL_FAULT_RECV))
    addr = 0;
  while (bytes > 0) {
    struct iovec mine = {d, bytes}, theirs = {(void *)(uintptr_t)addr, bytes};
    const ssize_t moved = write ? process_vm_writev(s->pids[q], &mine, 1, &theirs, 1, 0)
                                : process_vm_readv(s->pids[q], &mine, 1, &theirs, 1, 0);
    if (moved <= 0)
      return hvdl_fail(comm, hvdlSystemError,
                       "shared-memory path: %s %zu bytes %s rank %d's buffer (process %d) "
                       "failed: %s",
                       write ? "writing" : "reading", bytes, write ? "to" : "of", s->ranks[q],
                       s->pids[q], moved < 0 ? strerror(errno) : "nothing moved");
    d += moved;
    addr += (uint64_t)moved;
    bytes -= (size_t)moved;
  }
  return hvdlSuccess;
}

/* The single-copy call (its first step) after which local rank q writes into no
 * other rank's buffers, and the one in which it failed. */
static _Atomic uint64_t *quiet(const struct hvdl_shm *s, int q) {
  return (_Atomic uint64_t *)(void *)(s->seg[q] + 208);
}
static _Atomic uint64_t *failed(const struct hvdl_shm *s, int q) {
  return (_Atomic uint64_t *)(void *)(s->seg[q] + 216);
}

static int a_peer_failed(const struct hvdl_shm *s, uint64_t k) {
  for (int q = 0; q < s->local_size; q++)
    if (atomic_load_explicit(failed(s, q), memory_order_acquire) >= k) return 1;
  return 0;
}

/* Call k failed on this rank with res: it returns only once no peer can write
 * into its buffers any more, so that they may be freed. A peer that has not
 * published step k cannot have passed it: when it does, it sees this rank's
 * failure (both sides fence between their store and their load) and writes
 * nothing. One that has is waited for until it is quiet, which is soon: the lane
 * loop has no waits and looks for failures at every chunk. Bounded by the data
 * timeout (a peer stopped in its lane for that long is not waited for). Not
 * through hvdl_wait_data: the alarms that end a data wait (comm->watch) are the
 * peers' reports of this very failure, and this wait must outlast them. */
static hvdlResult_t drain(hvdlComm_t comm, struct hvdl_shm *s, uint64_t k, hvdlResult_t res) {
  atomic_store_explicit(quiet(s, s->local_rank), k, memory_order_release);
  atomic_store_explicit(failed(s, s->local_rank), k, memory_order_seq_cst);
  atomic_thread_fence(memory_order_seq_cst);
  const double until = comm->data_timeout > 0 ? hvdl_now() + comm->data_timeout : 0;
  for (int q = 0; q < s->local_size; q++)
    while (hvdl_shm_published(s, q) >= k &&
           atomic_load_explicit(quiet(s, q), memory_order_acquire) < k &&
           (until == 0 || hvdl_now() < until))
      hvdl_sleep(1e-5);
  return res;
}

static hvdlResult_t reduce_cma(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                               size_t count, const struct hvdl_shm_fold *f) {
  struct hvdl_shm *s = comm->shm;
  const size_t esize = hvdl_type_size(f->dt), chunk = s->area / esize;
  const int L = s->local_size, me = s->local_rank;
  const char *send = sendbuff;
  char *recv = recvbuff;
  const uint64_t k = s->step + 1; /* this call's first step: its number */
  posted(s, me)[0] = (uintptr_t)sendbuff;
  posted(s, me)[1] = (uintptr_t)recvbuff;
  hvdlResult_t res = hvdl_shm_step(comm, s); /* every rank is in the call, its buffers posted */
  if (res != hvdlSuccess) return s->step >= k ? drain(comm, s, k, res) : res;
  atomic_thread_fence(memory_order_seq_cst); /* step k published, then the failures read */
  size_t a, b;
  hvdl_shm_lane(count, L, me, &a, &b);
  for (size_t g = a; g < b && res == hvdlSuccess; g += chunk) {
    if (a_peer_failed(s, k)) break; /* step 2 then fails, by the alarm or the data timeout */
    const size_t n = b - g < chunk ? b - g : chunk;
    for (int q = 0; q < L && res == hvdlSuccess; q++) {
      char *to = s->scratch + (size_t)q * s->area;
      if (q != me) {
        res = peer_copy(comm, s, q, to, posted(s, q)[0] + g * esize, n * esize, 0);
      } else if (send == recv && L > 2) { /* the fold writes recv before it has read it all */
        memcpy(to, send + g * esize, n * esize);
      } else {
        to = (char *)send + g * esize;
      }
      s->inputs[q] = to;
    }
    if (res != hvdlSuccess) break;
    hvdl_shm_fold_inputs(s, s->inputs, recv + g * esize, g, n, count, f);
    for (int q = 0; q < L && res == hvdlSuccess; q++)
      if (q != me)
        res = peer_copy(comm, s, q, recv + g * esize, posted(s, q)[1] + g * esize, n * esize, 1);
  }
  if (res != hvdlSuccess) return drain(comm, s, k, res);
  atomic_store_explicit(quiet(s, me), k, memory_order_release);
  res = hvdl_shm_step(comm, s); /* every recvbuff is whole; no rank touches another's */
  return res == hvdlSuccess ? res : drain(comm, s, k, res);
}

/* Whether this rank can read and write every other local rank's own memory
 * with process_vm_readv/writev (collective over s->local): each rank posts its
 * process id and the address of its token (word 0) and of one word per local
 * rank after it; it reads every other rank's token, writes it back into that
 * rank's word for itself, and then checks that every other rank wrote its own
 * token into its words. A seccomp filter, Yama's ptrace scope above 1, separate
 * pid namespaces or different users make a read or write fail; the caller then
 * agrees on no single-copy form. With Yama's scope 1 a process may be read only
 * by its ancestors unless it names another: like Open MPI's CMA, this rank lets
 * any process of its user. */
static int cma_works(struct hvdl_shm *s) {
  FILE *yama = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (yama) {
    int scope = 0;
    if (fscanf(yama, "%d", &scope) == 1 && scope == 1)
      prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    fclose(yama);
  }
  struct token { int64_t pid; uint64_t addr, value; };
  const int ls = s->local_size, me = s->local_rank;
  struct token *all = calloc((size_t)ls, sizeof *all);
  uint64_t *mine = calloc((size_t)ls + 1, sizeof *mine);
  int ok = all && mine;
  if (MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->local) != MPI_SUCCESS) ok = 0;
  const struct token token = {(int64_t)getpid(), (uintptr_t)mine,
                              ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)s ^ 0x5bd1e995u};
  if (ok) {
    mine[0] = token.value;
    if (MPI_Allgather(&token, (int)sizeof token, MPI_BYTE, all, (int)sizeof token, MPI_BYTE,
                      s->local) != MPI_SUCCESS)
      ok = 0;
  }
  for (int q = 0; ok && q < ls; q++) {
    s->pids[q] = (int)all[q].pid;
    if (q == me) continue;
    uint64_t v = 0;
    struct iovec here = {&v, sizeof v}, there = {(void *)(uintptr_t)all[q].addr, sizeof v};
    ok = process_vm_readv((pid_t)all[q].pid, &here, 1, &there, 1, 0) == (ssize_t)sizeof v &&
         v == all[q].value;
    there.iov_base = (void *)(uintptr_t)(all[q].addr + sizeof v * (size_t)(1 + me));
    ok = ok && process_vm_writev((pid_t)all[q].pid, &here, 1, &there, 1, 0) == (ssize_t)sizeof v;
  }
  /* Every rank has written into every other's words (or failed to). */
  if (MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->local) != MPI_SUCCESS) ok = 0;
  for (int q = 0; ok && q < ls; q++) ok = q == me || mine[1 + q] == token.value;
  /* Nobody frees its words before every rank has checked its own. */
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
  int ok = s->pids && s->scratch;
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
