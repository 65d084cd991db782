/*
 * single_copy.c -- what the single-copy collectives of ranks on one host share
 * (allreduce_shm.c's large form, allgather_shm.c): no area of the segment holds
 * their data; each rank reads from and writes into the other ranks' own buffers
 * with process_vm_readv/writev (Linux's cross-memory attach, as Open MPI's
 * smsc/cma uses for large messages).
 *
 * A call, on every local rank:
 *
 *   open     write the addresses of its sendbuff and recvbuff in its head page
 *            (posted), then end the call's first step (segment.c): every rank is in
 *            the call and its buffers are posted. The call's number k is that
 *            step's.
 *   then     the collective's own reads and writes (hvdl_cma_read,
 *            hvdl_cma_write), which look for a peer's failure
 *            (hvdl_cma_peer_failed) between chunks
 *   close    say it writes into no peer any more (quiet = k), then end the
 *            second step: every rank's result is whole and nobody touches
 *            another's buffers; it may return
 *
 * Failures. A peer writes into this rank's buffers, so a failed call must not
 * return while a peer may still write (the caller may free them). Each rank's
 * head page has two more words: quiet, the call after which it writes into no
 * peer, and failed, the call in which it failed. A failing rank sets both,
 * fences, and drains (below). A peer that has not yet published step k sees the
 * failure when it does (both sides fence between their store and their load)
 * and writes nothing; a peer in its loop sees it at its next chunk and stops.
 *
 * Memory the peers reach (peer_memory.c). Beside each address, open posts the
 * hvdlMemAlloc region that holds it, if any. A read or write of a peer's buffer
 * inside a region that this rank can map is a plain copy through its view of the
 * region (hvdl_mem_reach), with the same fault points; any other goes through
 * the kernel. Either way the steps and the failure rule are the same.
 *
 * A stand-in for plain buffers (hvdl_cma_stand_in). A rank whose buffers are
 * not such memory may post instead a region of its own, its stand-in, as both:
 * before open it copies into it what the peers read (all but its own lane),
 * and after a successful close it copies out of it what they wrote there. Two
 * local copies then replace the peers' copies through the kernel, which pin
 * every small page they touch (docs/benchmarks-history.md, "A stand-in for plain
 * buffers"). Buffers with under half of their pages small (the kernel
 * pins a huge page, 512 small ones, in one step) and those above
 * config.shmStandInBytes go through the kernel. The peers see only a region,
 * and nothing they do differs. A failed call copies nothing out and gives its
 * stand-in up (hvdl_cma_free): a peer held up past the drain may still write
 * into it, and the next call makes another, which the peers map anew.
 *
 * Where it runs (hvdl_shm_cma_init): every rank of the host writes a token in
 * its own memory, reads every other's back and writes it into that rank's
 * memory; only if every read and write succeeds is s->cma set, on every rank. A
 * read or write that fails during a call is an error on that rank, which reaches
 * the others like any failure of a step (segment.c).
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

#include "transport/shm/shm.h"

#define CMA_PAGE 4096 /* the page of "a copy's distance" (hvdl_cma_scratch) */

/* Local rank q's posted sendbuff and recvbuff addresses (head page bytes 192-207),
 * quiet (208) and failed (216) words. */
static uint64_t *posted(const struct hvdl_shm *s, int q) {
  return (uint64_t *)(void *)(s->seg[q] + 192);
}
static _Atomic uint64_t *quiet(const struct hvdl_shm *s, int q) {
  return (_Atomic uint64_t *)(void *)(s->seg[q] + 208);
}
static _Atomic uint64_t *failed(const struct hvdl_shm *s, int q) {
  return (_Atomic uint64_t *)(void *)(s->seg[q] + 216);
}

/* The regions holding them (256-335): peer_memory.c's posts, serial 0 for none. */
static struct hvdl_mem_post *regions(const struct hvdl_shm *s, int q) {
  return (struct hvdl_mem_post *)(void *)(s->seg[q] + 256);
}

uint64_t hvdl_cma_sendbuff(const struct hvdl_shm *s, int q) { return posted(s, q)[0]; }
uint64_t hvdl_cma_recvbuff(const struct hvdl_shm *s, int q) { return posted(s, q)[1]; }

/* Scratch area q's start: page-aligned, a page longer than an area. */
static size_t scratch_stride(const struct hvdl_shm *s) {
  return ((s->area + CMA_PAGE - 1) & ~(size_t)(CMA_PAGE - 1)) + CMA_PAGE;
}

char *hvdl_cma_scratch(const struct hvdl_shm *s, int q, uint64_t src) {
  return s->scratch + (size_t)q * scratch_stride(s) + (size_t)(src & (CMA_PAGE - 1));
}

/* This rank's view of [addr, addr + bytes) of local rank q's memory, inside a
 * region q posted, or NULL. */
static char *reach(struct hvdl_shm *s, int q, uint64_t addr, size_t bytes) {
  const struct hvdl_mem_post *p = regions(s, q);
  char *v = hvdl_mem_reach(s, q, p, addr, bytes);
  return v ? v : hvdl_mem_reach(s, q, p + 1, addr, bytes);
}

/* Through the kernel: at address 0 where an injected fault hit. */
static hvdlResult_t kernel_copy(hvdlComm_t comm, int q, char *d, uint64_t addr, size_t bytes,
                                int write, int fault) {
  const struct hvdl_shm *s = comm->shm;
  if (write && hvdl_copy_crawls(addr, (uintptr_t)d)) { /* callers write at most an area */
    char *stage = hvdl_cma_scratch(s, q, addr);
    hvdl_copy(stage, d, bytes);
    d = stage;
  }
  if (fault) addr = 0;
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

/* Through this rank's view of the peer's region where it has one: hvdl_copy, which
 * avoids the crawling distances itself. Else through the kernel. An injected fault
 * (HVD_LITE_FAULT: the recv point for a read, send for a write) takes the kernel's
 * way at address 0: the kernel's own failure follows. There, a write into a peer's
 * buffer that lies 1-31 bytes further into its page than this rank's source
 * (the crawling window, hvdl_copy_crawls) goes from a copy in scratch area q at
 * the destination's place: the copy costs far less than the crawl (2 ranks, AMD
 * EPYC, tools/allreduce_loop.py --offset 0,16: a 1 MiB all-reduce 473-484 us a
 * call without it and the read placed as before, 194-224 with both; 174-187 at
 * 0,0; docs/benchmarks-history.md, "Buffers at their own place in a page"). */
hvdlResult_t hvdl_cma_write(hvdlComm_t comm, int q, const void *here, uint64_t addr, size_t bytes) {
  const int fault = hvdl_fault_hit(comm->faults, HVDL_FAULT_SEND);
  char *there = fault ? NULL : reach(comm->shm, q, addr, bytes);
  if (!there) return kernel_copy(comm, q, (char *)here, addr, bytes, 1, fault);
  hvdl_copy(there, here, bytes);
  return hvdlSuccess;
}

hvdlResult_t hvdl_cma_read(hvdlComm_t comm, int q, uint64_t addr, size_t bytes, const char **at) {
  const int fault = hvdl_fault_hit(comm->faults, HVDL_FAULT_RECV);
  char *there = fault ? NULL : reach(comm->shm, q, addr, bytes);
  if (there) {
    *at = there;
    return hvdlSuccess;
  }
  char *to = hvdl_cma_scratch(comm->shm, q, addr);
  *at = to;
  return kernel_copy(comm, q, to, addr, bytes, 0, fault);
}

hvdlResult_t hvdl_cma_read_into(hvdlComm_t comm, int q, uint64_t addr, size_t bytes, void *dst) {
  const int fault = hvdl_fault_hit(comm->faults, HVDL_FAULT_RECV);
  const char *there = fault ? NULL : reach(comm->shm, q, addr, bytes);
  if (there) {
    hvdl_copy(dst, there, bytes);
    return hvdlSuccess;
  }
  if (fault || !hvdl_copy_crawls((uintptr_t)dst, addr))
    return kernel_copy(comm, q, dst, addr, bytes, 0, fault);
  /* The kernel's copy would crawl: into scratch at the source's place in a page, then here. */
  char *to = hvdl_cma_scratch(comm->shm, q, addr);
  HVDL_CHECK(kernel_copy(comm, q, to, addr, bytes, 0, 0));
  hvdl_copy(dst, to, bytes);
  return hvdlSuccess;
}

/* Whether plain buffers are worth a stand-in: at least half of their pages
 * small (hvdl_mem_small), which the kernel would pin one by one; the rest it pins
 * 512 at a time. The answer for the last buffers asked is kept, since a loop
 * passes the same ones call after call and asking costs 2-5 us: a stale answer
 * (memory freed and made again at the same place) costs time, never bits. */
static int small_pages(struct hvdl_shm *s, const void *sendbuff, const void *recvbuff,
                       size_t bytes) {
  struct hvdl_stand_in_memo *m = &s->stand_in_memo;
  if (m->send != sendbuff || m->recv != recvbuff || m->bytes != bytes) {
    size_t small = hvdl_mem_small(sendbuff, bytes);
    small += sendbuff == recvbuff ? small : hvdl_mem_small(recvbuff, bytes);
    *m = (struct hvdl_stand_in_memo){sendbuff, recvbuff, bytes, small >= bytes};
  }
  return m->small;
}

char *hvdl_cma_stand_in(hvdlComm_t comm, const void *sendbuff, const void *recvbuff, size_t bytes) {
  struct hvdl_shm *s = comm->shm;
  const size_t most = comm->config.shmStandInBytes;
  if (!s->maps || s->stand_in_off || bytes > most) return NULL;
  struct hvdl_mem_post p[2];
  hvdl_mem_post(sendbuff, bytes, p);
  hvdl_mem_post(recvbuff, bytes, p + 1);
  if (p[0].serial && p[1].serial) return NULL; /* the peers reach both where they are */
  if (!small_pages(s, sendbuff, recvbuff, bytes)) return NULL;
  if (!s->stand_in) {
    /* Made once, at its largest and a page more: a memfd's pages cost memory only once
     * touched, and each peer maps it once. A failure is no error of this call. */
    char kept[HVDL_ERRMSG_LEN];
    snprintf(kept, sizeof kept, "%s", hvdlGetLastError(NULL));
    void *at;
    if (hvdlMemAlloc(&at, most + CMA_PAGE) != hvdlSuccess) {
      hvdl_fail(NULL, hvdlSuccess, "%s", kept);
      s->stand_in_off = 1;
      return NULL;
    }
    s->stand_in = at;
  }
  atomic_fetch_add_explicit(&s->stand_ins, 1, memory_order_relaxed);
  /* At recvbuff's place in a page: the copy out (and in, in place) then has no distance
   * at which the copy crawls (hvdl_copy). */
  return s->stand_in + ((uintptr_t)recvbuff & (CMA_PAGE - 1));
}

uint64_t hvdl_cma_stand_ins(const struct hvdl_shm *s) {
  return atomic_load_explicit(&s->stand_ins, memory_order_relaxed);
}

void hvdl_cma_free(struct hvdl_shm *s) {
  hvdlMemFree(s->stand_in);
  s->stand_in = NULL;
}

int hvdl_cma_peer_failed(const struct hvdl_shm *s, uint64_t k) {
  for (int q = 0; q < s->local_size; q++)
    if (atomic_load_explicit(failed(s, q), memory_order_acquire) >= k) return 1;
  return 0;
}

/* Call k failed on this rank with res: it returns only once no peer can write
 * into its buffers any more, so that they may be freed. A peer that has not
 * published step k cannot have passed it: when it does, it sees this rank's
 * failure and writes nothing. One that has is waited for until it is quiet,
 * which is soon: the collectives' loops have no waits and look for failures at
 * every chunk. Bounded by the data timeout (a peer stopped in its loop for that
 * long is not waited for). Not through hvdl_wait_data: the alarms that end a
 * data wait (comm->watch) are the peers' reports of this very failure, and this
 * wait must outlast them. */
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

hvdlResult_t hvdl_cma_open(hvdlComm_t comm, const void *sendbuff, void *recvbuff, uint64_t *k) {
  struct hvdl_shm *s = comm->shm;
  *k = s->step + 1;
  posted(s, s->local_rank)[0] = (uintptr_t)sendbuff;
  posted(s, s->local_rank)[1] = (uintptr_t)recvbuff;
  hvdl_mem_post(sendbuff, 1, regions(s, s->local_rank));
  hvdl_mem_post(recvbuff, 1, regions(s, s->local_rank) + 1);
  const hvdlResult_t res = hvdl_shm_step(comm, s);
  if (res != hvdlSuccess) return s->step >= *k ? drain(comm, s, *k, res) : res;
  atomic_thread_fence(memory_order_seq_cst); /* step k published, then the failures read */
  return hvdlSuccess;
}

hvdlResult_t hvdl_cma_close(hvdlComm_t comm, uint64_t k, hvdlResult_t res) {
  struct hvdl_shm *s = comm->shm;
  if (res != hvdlSuccess) return drain(comm, s, k, res);
  atomic_store_explicit(quiet(s, s->local_rank), k, memory_order_release);
  res = hvdl_shm_step(comm, s); /* every result is whole; no rank touches another's */
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
  struct token {
    int64_t pid;
    uint64_t addr, value;
  };
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

const char *hvdl_cma_off_reason(const hvdlComm_t comm) {
  if (comm->shm && comm->shm->cma) return NULL;
  if (!comm->shm)
    return comm->config.disableShm ? "it works through the shared-memory path, which is off "
                                     "(HVD_LITE_SHM=0)"
                                   : "no two ranks share a host's segment";
  if (comm->shm->hosts > 1) return "the ranks are on more than one host";
  if (comm->config.disableShmCma) return "its single copy is off (HVD_LITE_SHM_CMA=0)";
  return "the ranks cannot reach each other's memory (process_vm_readv/writev: a seccomp "
         "filter, Yama's ptrace scope, pid namespaces or users)";
}

hvdlResult_t hvdl_shm_cma_init(hvdlComm_t comm) {
  struct hvdl_shm *s = comm->shm;
  /* comm->shm and its hosts are alike on every rank (segment.c's agreement), and so
   * is disableShmCma (rank 0's): every rank of the one host probes, or none. */
  if (!s || s->hosts != 1 || comm->config.disableShmCma) return hvdlSuccess;
  const int ls = s->local_size;
  s->pids = calloc((size_t)ls, sizeof *s->pids);
  void *scratch = NULL;
  int ok = s->pids && posix_memalign(&scratch, CMA_PAGE, (size_t)ls * scratch_stride(s)) == 0;
  s->scratch = scratch;
  HVDL_MPI(comm, MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->local));
  s->cma = ok && cma_works(s);
  if (s->cma) s->maps = calloc((size_t)ls * HVDL_MEM_MAPS, sizeof *s->maps); /* NULL: no views */
  return hvdlSuccess;
}
