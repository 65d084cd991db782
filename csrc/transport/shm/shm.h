/*
 * shm.h -- the shared-memory unit: the segment that the ranks of a communicator
 * on one host share (a POSIX shared-memory file), and the verbs that the one-host
 * all-reduce (segment.c) and the hierarchical all-reduce (allreduce_hier.c) are made
 * of. The schedule and why every rank gets the same bytes: segment.c's opening
 * comment and docs/algorithms.md.
 */
#ifndef HVDL_SHM_H_
#define HVDL_SHM_H_

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* One rank's view of its host's segment, and the layout of hosts. */
struct hvdl_shm {
  MPI_Comm local; /* the ranks of this host, in rank order */
  char *base;     /* the segment's mapping (NULL when this rank is alone on its host) */
  size_t bytes;
  int local_rank, local_size;
  int hosts;           /* hosts of the communicator */
  int lanes;           /* the fewest ranks on any host: local ranks 0 .. lanes-1 carry a
                         * slice each across hosts (allreduce_hier.c) */
  int *ranks;          /* the communicator's rank of each local rank (for messages) */
  size_t area;         /* bytes of each of a rank's four areas: the chunk */
  char **seg;          /* each local rank's segment: counter line, in[0], in[1], out[0], out[1] */
  int cma;             /* every local rank can read and write every other's own memory
                         * (process_vm_readv/writev): large all-reduces take the single-copy form,
                         * all-gathers the single-copy all-gather (single_copy.c) */
  int *pids;           /* each local rank's process id, for process_vm_readv/writev */
  char *scratch;       /* local_size areas of this rank's own, each page-aligned and a
                         * page longer: peers' chunks read in (and, in place with 3 ranks
                         * or more, its own), at their source's offset in its page, and
                         * writes staged (hvdl_cma_scratch, hvdl_cma_write) */
  const char **inputs; /* local_size pointers: the inputs a fold reads */
  struct hvdl_mem_map *maps;  /* HVDL_MEM_MAPS views of each local rank's hvdlMemAlloc regions
                              * (peer_memory.c), with s->cma; NULL otherwise */
  uint64_t map_uses;          /* a clock for the views' last use */
  char *stand_in;             /* this rank's stand-in for its plain buffers (hvdl_cma_stand_in): an
                         * hvdlMemAlloc region made on first use, or NULL */
  int stand_in_off;           /* its region could not be made: the kernel's copies from now on */
  struct hvdl_stand_in_memo { /* whether the last buffers asked are worth the stand-in */
    const void *send, *recv;
    size_t bytes;
    int small;
  } stand_in_memo;
  _Atomic int views;          /* views mapped now (statistics: read by other threads) */
  _Atomic uint64_t stand_ins; /* calls that took this rank's stand-in (statistics, likewise):
                               * each rank decides alone, by its own buffers' pages */
  uint64_t step;              /* steps this rank has published */
  uint64_t round;             /* negotiation rounds this rank has posted through the segment */
};

/* ---- memory the peers reach directly (peer_memory.c) ---- */

/* The hvdlMemAlloc region holding a posted buffer, as a single-copy call posts it
 * (single_copy.c): serial 0 when the buffer is not inside one. */
struct hvdl_mem_post {
  uint64_t serial, fd, base, size, inode; /* inode: the file's, checked when a peer maps it */
};

/* One rank's view of a peer's region: view NULL where it could not be mapped. */
struct hvdl_mem_map {
  uint64_t serial;
  size_t size;
  char *view;
  uint64_t used;
};
#define HVDL_MEM_MAPS 8 /* views kept of each peer's regions */

/* The region of this process's hvdlMemAlloc memory that holds all of [p, p + bytes). */
void hvdl_mem_post(const void *p, size_t bytes, struct hvdl_mem_post *out);

/* How many bytes of [p, p + bytes) of this process lie on small pages, not huge
 * ones (PAGEMAP_SCAN; 0 where the kernel cannot say). */
size_t hvdl_mem_small(const void *p, size_t bytes);

/* Where [addr, addr + bytes) of local rank q's memory, inside its posted region p,
 * is in this process (mapping the region on first use), or NULL: then copy
 * through the kernel (hvdl_cma_read's process_vm_readv, hvdl_cma_write's writev). */
char *hvdl_mem_reach(struct hvdl_shm *s, int q, const struct hvdl_mem_post *p, uint64_t addr,
                     size_t bytes);

/* How many views of the peers' regions this rank holds (tests). */
int hvdl_mem_views(const struct hvdl_shm *s);

/* Unmaps every view of the peers' regions and frees s->maps. */
void hvdl_mem_unmap(struct hvdl_shm *s);

/* Sets up comm->shm, collectively over comm->mpi: NULL when the path is off
 * (config.disableShm), comm has one rank, or no host has two of its ranks.
 * A segment that cannot be made on some host (a full /dev/shm) is no error: every rank then
 * leaves comm->shm NULL (the agreement is collective) and the selector (select_allreduce.c)
 * picks a message-passing algorithm. */
hvdlResult_t hvdl_shm_init(hvdlComm_t comm);

/* ---- the single-copy collectives (single_copy.c; allreduce_shm.c, allgather_shm.c) ---- */

/* Turns on the single-copy collectives (comm->shm->cma) where every rank of the
 * one host can read and write every other's memory; collective, after
 * hvdl_shm_init. Off (no error) where any rank cannot, with HVD_LITE_SHM_CMA=0,
 * or across hosts. */
hvdlResult_t hvdl_shm_cma_init(hvdlComm_t comm);

/* Why comm's ranks, with a segment on one host, have no single copy: NULL when they
 * have it; else a phrase for messages (HVD_LITE_SHM_CMA=0, or the peers out of reach).
 * The engine's info line and a refused forced `shm` all-gather both say it. */
const char *hvdl_cma_off_reason(const hvdlComm_t comm);

/* Where this rank's peers reach its sendbuff and recvbuff of `bytes` each in a
 * single-copy all-reduce: NULL where they are (both hvdlMemAlloc memory), or
 * where the kernel's copies serve (under half of their pages small, as
 * hvdl_mem_small says; above config.shmStandInBytes; no views, s->maps NULL; a
 * region that cannot be made, which turns the stand-in off for the
 * communicator); else this rank's stand-in, a region of its own that the peers
 * map, at recvbuff's place in a page, with room for `bytes`. The caller posts it
 * as both buffers, copies into it before the call what the peers read, and out
 * of it after a successful close what they wrote. */
uint64_t hvdl_cma_stand_ins(const struct hvdl_shm *s); /* s->stand_ins */
char *hvdl_cma_stand_in(hvdlComm_t comm, const void *sendbuff, const void *recvbuff, size_t bytes);

/* Frees this rank's stand-in: with the communicator (comm.c: segment.c is below this unit), and
 * after a failed call (allreduce_shm.c), whose late peers may still write into it; the next
 * call then makes a new region, which the peers map anew. */
void hvdl_cma_free(struct hvdl_shm *s);

/* Opens a single-copy call on every local rank: posts this rank's sendbuff and
 * recvbuff addresses, then ends the call's first step; *k is the call's number.
 * A failure ends the call (drained where a peer may have passed the step). */
hvdlResult_t hvdl_cma_open(hvdlComm_t comm, const void *sendbuff, void *recvbuff, uint64_t *k);

/* The sendbuff and recvbuff addresses local rank q posted for the open call. */
uint64_t hvdl_cma_sendbuff(const struct hvdl_shm *s, int q);
uint64_t hvdl_cma_recvbuff(const struct hvdl_shm *s, int q);

/* Where in this rank's scratch area q a chunk read from src goes: at src's offset in
 * its 4 KiB page, so that the kernel's or libc's copy (`rep movsb`) never has its
 * destination 1-31 bytes past its source modulo 4 KiB, where it crawls on AMD EPYC
 * (memory.c's hvdl_copy; docs/benchmarks-history.md, "A copy's distance"). Holds an area. */
char *hvdl_cma_scratch(const struct hvdl_shm *s, int q, uint64_t src);

/* Copies bytes from `here` in this process to addr in local rank q's own memory:
 * a plain copy where addr is inside a region q posted that this rank can map,
 * else process_vm_writev. A write whose distance would crawl goes through scratch
 * area q, so it moves at most an area and scratch area q is not the caller's to
 * keep across it. Fault point: send (the write then made at address 0). */
hvdlResult_t hvdl_cma_write(hvdlComm_t comm, int q, const void *here, uint64_t addr, size_t bytes);

/* Where the chunk [addr, addr + bytes) of local rank q's memory can be read: in
 * place through this rank's view of q's posted region, or else copied into
 * scratch area q at its source's place in a page (hvdl_cma_scratch) by
 * process_vm_readv. *at is valid until the next read from q. Fault point: recv
 * (the read then made at address 0). */
hvdlResult_t hvdl_cma_read(hvdlComm_t comm, int q, uint64_t addr, size_t bytes, const char **at);
/* As hvdl_cma_read, but into dst (at most an area's bytes): a plain copy from the view, or
 * process_vm_readv straight into dst (through scratch where that copy would crawl). */
hvdlResult_t hvdl_cma_read_into(hvdlComm_t comm, int q, uint64_t addr, size_t bytes, void *dst);

/* Whether a local rank failed call k: a collective's loop looks between chunks
 * and stops writing (its close then fails, by the alarm or the data timeout). */
int hvdl_cma_peer_failed(const struct hvdl_shm *s, uint64_t k);

/* Closes call k with this rank's result so far: on success it writes into no
 * peer any more and ends the second step (every rank's result is whole); on a
 * failure it returns only once no peer can still write into its buffers
 * (bounded by the data timeout). Returns the call's result. */
hvdlResult_t hvdl_cma_close(hvdlComm_t comm, uint64_t k, hvdlResult_t res);

/* Releases comm->shm: unmaps the segment; `collective` also frees the host's
 * communicator (every local rank calls it; not after a failure, hvdlCommAbort). */
void hvdl_shm_free(hvdlComm_t comm, int collective);

/* After a failed collective, when every rank has left it (hvdl_comm_renew): the
 * ranks of each host agree on their step counters again (collective). */
hvdlResult_t hvdl_shm_renew(hvdlComm_t comm);

/* How hvdl_shm_reduce combines the local ranks' inputs. */
struct hvdl_shm_fold {
  hvdlDataType_t dt;
  hvdlRedOp_t op;
  uint64_t divisor; /* 0, or divide every result by this (Avg) */
  int ring_order;   /* 0: local-rank order, x0 op x1 op ... (the latency path's);
                      * 1: allreduce_ring.c's order, x(c+1) op x(c+2) op ... op x(c) for the
                      * elements of its chunk c (count cut into local_size chunks) */
};

/* Reduces count elements over the local ranks through the segment, chunk by
 * chunk: every element is reduced by one local rank, in f's order; each rank
 * then copies elements [lo, hi) of the result into recvbuff (only those). In
 * place when sendbuff == recvbuff. A rank alone on its host copies [lo, hi) of
 * sendbuff (divided). */
hvdlResult_t hvdl_shm_reduce(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                             const struct hvdl_shm_fold *f, size_t lo, size_t hi);

/* dst = elements [g, g + n) of the whole count-element buffer reduced over the L
 * local ranks' inputs, in[q] pointing at input q's element g: in_f op in_(f+1) op
 * ... op in_(f-1), left to right, f = 0 (local-rank order) or, in ring order,
 * f = c + 1 for the elements of ring chunk c. Advances in[]. dst may be one of
 * the inputs only where L == 2 (it is written before the third is read). */
void hvdl_shm_fold_inputs(const struct hvdl_shm *s, const char **in, void *dst, size_t g, size_t n,
                          size_t count, const struct hvdl_shm_fold *f);

/* Ends step s->step + 1: publishes it, then waits (bounded, alarms) until every
 * local rank has. */
hvdlResult_t hvdl_shm_step(hvdlComm_t comm, struct hvdl_shm *s);

/* Local rank q's input area for step k (one of its two, by k's parity): written
 * before step k is published, read by the others after it, and not written again
 * before step k + 2, which no rank passes before every rank is done with step k. */
char *hvdl_shm_in_area(const struct hvdl_shm *s, int q, uint64_t k);

/* The last step local rank q has published (an acquire load). */
uint64_t hvdl_shm_published(const struct hvdl_shm *s, int q);

/* At most this many bytes (and one area) use the one-step form (every rank reduces the whole buffer).
 * Not measured yet: one step saves a counter round trip (about a microsecond) and costs
 * (L-1) B / L more reduction per rank, which is about as long at some 10-20 KiB. */
#define SHM_GATHER_BYTES ((size_t)16 * 1024)

/* The one-step form of hvdl_shm_reduce for count elements of at most one area:
 * every rank copies its input into its area, publishes, and reduces all L inputs
 * itself, in f's order, into recvbuff. */
hvdlResult_t hvdl_shm_reduce_one_step(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                      size_t count, const struct hvdl_shm_fold *f);

/* Local rank j < lanes holds lane j (hvdl_block_start's cut into lanes) of buf; afterwards every local
 * rank holds all of buf: an all-gather through the segment. */
hvdlResult_t hvdl_shm_share(hvdlComm_t comm, void *buf, size_t count, hvdlDataType_t dt);

/* Tells the host's other ranks that this one is alive and busy elsewhere (waiting
 * for other hosts): their waits count it as progress. */
void hvdl_shm_beat(const struct hvdl_shm *s);

/* The negotiation's round (negotiate.c) through the segment, when every rank of the
 * communicator is on this host: each rank writes its words into a slot of its own
 * (of parity round & 1) and publishes the round's number; once every rank has, each
 * reads every slot. A rank posts round k+2, into the slot of round k, only after
 * every rank has posted k+1, which each does only after reading round k: two slots
 * are enough. At 2 ranks a small call takes about 1 us less than with the round's
 * MPI_Iallgather (docs/benchmarks.md, "Latency"). Not for rounds of more than
 * SHM_ROUND_WORDS words (a cache of more than 64 (SHM_ROUND_WORDS - 2) names: they go
 * through MPI). A build may set SHM_ROUND_WORDS=0 to send every round through MPI. */
#ifndef SHM_ROUND_WORDS
#define SHM_ROUND_WORDS 130
#endif
int hvdl_shm_round_fits(const struct hvdl_shm *s, int size, int words);
void hvdl_shm_round_post(struct hvdl_shm *s, const uint64_t *mine, int words);
int hvdl_shm_round_arrived(const struct hvdl_shm *s);
/* Waits for every local rank's round (comm->shm's), with these limits (wait.c). */
hvdlResult_t hvdl_shm_round_wait(hvdlComm_t comm, const struct hvdl_wait_limits *limits);
/* Every rank's words of the round just waited for, at all + its rank * words. */
void hvdl_shm_round_read(const struct hvdl_shm *s, uint64_t *all, int words);

#endif /* HVDL_SHM_H_ */
