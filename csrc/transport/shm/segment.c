/*
 * segment.c -- the shared-memory path: the ranks of a communicator on one host
 * reduce through a segment they all map, instead of sending messages.
 *
 * The segment. At communicator init the ranks of each host (topology.c's local
 * communicator) map one file of /dev/shm (POSIX shared memory, the same under
 * every MPI; an MPI-3 shared window would do, but Open MPI 5 wheels print a UCX
 * error on stderr for every window they make). Each local rank q owns, page
 * aligned:
 *
 *   counter   the last step q has published (a 64-bit atomic, alone on its line)
 *   heartbeat bumped while q waits for other hosts (allreduce_hier.c): progress
 *   in[0..1]  its input areas              (area bytes each: HVD_LITE_SHM_BYTES)
 *   out[0..1] its reduced-slice areas
 *
 * Steps. Every operation is a sequence of steps, the same on every local rank.
 * In step k a rank writes its own areas of parity k & 1 (and reads others'),
 * then publishes k (a release store of its counter) and waits until every local
 * rank's counter is >= k (acquire loads; the one wait of wait.c: spin, then
 * sleep, bounded by the data timeout, alarms through comm->watch). What a rank
 * writes in step k is read by the others before they publish k+1; the same
 * areas are written again at step k+2, after their writer has seen every rank
 * publish k+1. So two areas of each kind are enough and each step costs one
 * counter update and one wait.
 *
 * The reduction (hvdl_shm_reduce): chunks of C = area / size-of-element
 * elements, chunk i cut into L near-equal slices (L local ranks; slice q is
 * local rank q's). P chunks take P+1 steps; at step t (rank r):
 *
 *   t < P   copy chunk t of sendbuff into in[k], but for slice r: only r
 *           reads that, and it reads it from sendbuff
 *   t > 0   reduce slice r of chunk t-1 over the L inputs into out[k-1]
 *           [Avg: then / divisor]
 *   publish k, wait for every rank's k
 *   t > 0   copy chunk t-1 (its part in [lo, hi)) from the slices' owners' out[k-1]
 *
 * A small buffer (at most SHM_GATHER_BYTES, and one area) takes one step
 * instead of two: copy into in[k], publish, wait, and every rank reduces all L
 * inputs itself, in the same order.
 *
 * The order. An element is reduced left to right over the L inputs starting at
 * one of them (struct hvdl_shm_fold): at local rank 0 (x0 op x1 op ... : the
 * latency path's order), or in the ring's order, x(c+1) op x(c+2) op ... op
 * x(c) for the elements of allreduce_ring.c's chunk c. On one host the all-reduce takes
 * the latency path's order at or below config.smallAllReduceBytes and the
 * ring's above, so its results have the bits those paths give, and hvdlReduce,
 * which runs those paths' reductions to the root (reduce_ring.c), still gives
 * exactly hvdlAllReduce's bits.
 *
 * Bitwise identity. Every element of the result is either computed once, by the
 * owner of its slice, and then copied verbatim by every rank, or (small
 * buffers) computed by every rank with the same operations on the same bytes in
 * the same order. Nothing depends on timing or on where a chunk boundary falls,
 * so ranks, in-place and out-of-place calls and reruns all agree.
 *
 * Cost per rank, for B bytes on L local ranks: B (L-1) / L copied in, a slice of B / L
 * reduced over the L inputs (B read), B copied out; 1 + B / area steps (small
 * buffers: 1 step, and all of B reduced over the L inputs). Nothing goes
 * through MPI.
 *
 * Failures. A step's wait is the data phases' wait: a local rank that stops
 * publishing is named ("no message from rank R") after the data timeout
 * without progress (no local rank's step or heartbeat moved: a rank busy across
 * hosts is not silent), and another rank's alarm ends the wait. After a failure
 * (hvdl_comm_renew) the ranks of a host agree on the highest step any of them
 * reached and go on from there. Fault points: stall, send and recv, each before
 * a publish.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "kernels/kernels.h"
#include "transport/shm/shm.h"

/* A rank's head page: the step counter (bytes 0-7), the heartbeat (64-71), the round
 * counter (128-135) and its single-copy collectives' buffers and state (192-223),
 * a cache line each, the regions that hold those buffers (256-335, single_copy.c), then
 * its two round slots (SHM_ROUND_WORDS words each); its four areas follow, page
 * aligned. */
#define HEAD             ((size_t)4096)
#define ROUND_SLOTS      ((size_t)384)
#define ROUND_SLOT_BYTES (((size_t)SHM_ROUND_WORDS * 8 + 63) & ~(size_t)63)
_Static_assert(ROUND_SLOTS + 2 * ROUND_SLOT_BYTES <= HEAD, "the round slots fit the head page");

static _Atomic uint64_t *counter(const struct hvdl_shm *s, int q) {
  return (_Atomic uint64_t *)(void *)s->seg[q];
}

static _Atomic uint64_t *heartbeat(const struct hvdl_shm *s, int q) {
  return (_Atomic uint64_t *)(void *)(s->seg[q] + 64);
}

void hvdl_shm_beat(const struct hvdl_shm *s) {
  if (s->local_size > 1) /* else there is no segment, and nobody to tell */
    atomic_fetch_add_explicit(heartbeat(s, s->local_rank), 1, memory_order_relaxed);
}

static char *in_area(const struct hvdl_shm *s, int q, uint64_t k) {
  return s->seg[q] + HEAD + (size_t)(k & 1u) * s->area;
}

char *hvdl_shm_in_area(const struct hvdl_shm *s, int q, uint64_t k) { return in_area(s, q, k); }

static char *out_area(const struct hvdl_shm *s, int q, uint64_t k) {
  return s->seg[q] + HEAD + (size_t)(2u + (k & 1u)) * s->area;
}

/* ---- steps ---------------------------------------------------------------- */

struct arrival {
  const struct hvdl_shm *s;
  uint64_t k;
};

static hvdlResult_t all_arrived(hvdlComm_t comm, void *arg, int *done) {
  (void)comm;
  const struct arrival *a = arg;
  for (int q = 0; q < a->s->local_size; q++)
    if (atomic_load_explicit(counter(a->s, q), memory_order_acquire) < a->k) {
      *done = 0;
      return hvdlSuccess;
    }
  *done = 1;
  return hvdlSuccess;
}

/* Progress: the local ranks' steps and heartbeats, summed; the wait names the
 * first local rank that has not published step k. */
static uint64_t progress(hvdlComm_t comm, void *arg) {
  const struct arrival *a = arg;
  uint64_t sum = 0;
  for (int q = a->s->local_size - 1; q >= 0; q--) {
    const uint64_t step = atomic_load_explicit(counter(a->s, q), memory_order_acquire);
    if (step < a->k) comm->wait_peer = a->s->ranks[q];
    sum += step + atomic_load_explicit(heartbeat(a->s, q), memory_order_relaxed);
  }
  return sum;
}

hvdlResult_t hvdl_shm_step(hvdlComm_t comm, struct hvdl_shm *s) {
  /* before publishing: the others wait for this rank, as for a lost message */
  HVDL_CHECK(hvdl_fault(comm, HVDL_FAULT_SEND, HVDL_FAULT_NO_PEER));
  HVDL_CHECK(hvdl_fault(comm, HVDL_FAULT_RECV, HVDL_FAULT_NO_PEER));
  const uint64_t k = ++s->step;
  atomic_store_explicit(counter(s, s->local_rank), k, memory_order_release);
  struct arrival a = {s, k};
  int done = 0;
  all_arrived(comm, &a, &done);
  if (done) return hvdlSuccess;
  const struct hvdl_poll p = {all_arrived, progress, &a, progress(comm, &a)};
  return hvdl_wait_data(comm, &p);
}

uint64_t hvdl_shm_published(const struct hvdl_shm *s, int q) {
  return atomic_load_explicit(counter(s, q), memory_order_acquire);
}

/* ---- the negotiation's round ---------------------------------------------- */

static _Atomic uint64_t *round_counter(const struct hvdl_shm *s, int q) {
  return (_Atomic uint64_t *)(void *)(s->seg[q] + 128);
}

static uint64_t *round_slot(const struct hvdl_shm *s, int q, uint64_t k) {
  return (uint64_t *)(void *)(s->seg[q] + ROUND_SLOTS + (size_t)(k & 1u) * ROUND_SLOT_BYTES);
}

int hvdl_shm_round_fits(const struct hvdl_shm *s, int size, int words) {
  return s && s->hosts == 1 && s->local_size == size && size > 1 && words <= SHM_ROUND_WORDS;
}

void hvdl_shm_round_post(struct hvdl_shm *s, const uint64_t *mine, int words) {
  const uint64_t k = ++s->round;
  memcpy(round_slot(s, s->local_rank, k), mine, sizeof *mine * (size_t)words);
  atomic_store_explicit(round_counter(s, s->local_rank), k, memory_order_release);
}

static hvdlResult_t round_arrived(hvdlComm_t comm, void *arg, int *done) {
  (void)comm;
  *done = hvdl_shm_round_arrived(arg);
  return hvdlSuccess;
}

int hvdl_shm_round_arrived(const struct hvdl_shm *s) {
  for (int q = 0; q < s->local_size; q++)
    if (atomic_load_explicit(round_counter(s, q), memory_order_acquire) < s->round) return 0;
  return 1;
}

/* Progress: the rounds the local ranks have posted, summed. */
static uint64_t rounds_posted(hvdlComm_t comm, void *arg) {
  (void)comm;
  const struct hvdl_shm *s = arg;
  uint64_t sum = 0;
  for (int q = 0; q < s->local_size; q++)
    sum += atomic_load_explicit(round_counter(s, q), memory_order_relaxed);
  return sum;
}

hvdlResult_t hvdl_shm_round_wait(hvdlComm_t comm, const struct hvdl_wait_limits *limits) {
  struct hvdl_shm *s = comm->shm;
  const struct hvdl_poll p = {round_arrived, rounds_posted, s, rounds_posted(comm, s)};
  return hvdl_wait_until(comm, &p, limits);
}

void hvdl_shm_round_read(const struct hvdl_shm *s, uint64_t *all, int words) {
  for (int q = 0; q < s->local_size; q++)
    memcpy(all + (size_t)s->ranks[q] * (size_t)words, round_slot(s, q, s->round),
           sizeof *all * (size_t)words);
}

/* ---- the verbs ------------------------------------------------------------ */

void hvdl_shm_fold_inputs(const struct hvdl_shm *s, const char **in, void *dst, size_t g, size_t n,
                          size_t count, const struct hvdl_shm_fold *f) {
  const int L = s->local_size;
  const size_t esize = hvdl_type_size(f->dt);
  char *d = dst;
  while (n > 0) {
    size_t run = n, end;
    int first = 0;
    if (f->ring_order) {
      first = (hvdl_block_of(count, L, g, &end) + 1) % L;
      run = end - g < n ? end - g : n;
    }
    hvdl_reduce(d, in[first], in[(first + 1) % L], run, f->dt, f->op);
    for (int i = 2; i < L; i++) hvdl_reduce(d, d, in[(first + i) % L], run, f->dt, f->op);
    if (f->divisor) hvdl_divide(d, run, f->dt, f->divisor);
    for (int q = 0; q < L; q++) in[q] += run * esize;
    d += run * esize;
    g += run;
    n -= run;
  }
}

/* fold_inputs over the step-k input areas from byte offset off; this rank's own
 * input read from `mine` (its elements [g, g + n)) where that is not NULL. */
static void fold(const struct hvdl_shm *s, uint64_t k, size_t off, void *dst, size_t g, size_t n,
                 size_t count, const struct hvdl_shm_fold *f, const char *mine) {
  for (int q = 0; q < s->local_size; q++)
    s->inputs[q] = q == s->local_rank && mine ? mine : in_area(s, q, k) + off;
  hvdl_shm_fold_inputs(s, s->inputs, dst, g, n, count, f);
}

hvdlResult_t hvdl_shm_reduce(hvdlComm_t comm, const void *sendbuff, void *recvbuff, size_t count,
                             const struct hvdl_shm_fold *f, size_t lo, size_t hi) {
  struct hvdl_shm *s = comm->shm;
  const size_t esize = hvdl_type_size(f->dt);
  const char *send = sendbuff;
  char *recv = recvbuff;
  if (s->local_size == 1) {
    if (hi > lo && send != recv) hvdl_copy(recv + lo * esize, send + lo * esize, (hi - lo) * esize);
    if (hi > lo && f->divisor) hvdl_divide(recv + lo * esize, hi - lo, f->dt, f->divisor);
    return hvdlSuccess;
  }
  const size_t chunk = s->area / esize, nchunks = (count + chunk - 1) / chunk;
  const int L = s->local_size, me = s->local_rank;
  for (size_t t = 0; t <= nchunks; t++) {
    const uint64_t k = s->step + 1;
    if (t < nchunks) { /* all but this rank's own slice, which only it reads (from send) */
      const size_t len = count - t * chunk < chunk ? count - t * chunk : chunk;
      const char *from = send + t * chunk * esize;
      size_t a, b;
      a = hvdl_block_start(len, L, me);
      b = hvdl_block_start(len, L, me + 1);
      hvdl_copy(in_area(s, me, k), from, a * esize);
      hvdl_copy(in_area(s, me, k) + b * esize, from + b * esize, (len - b) * esize);
    }
    size_t base = 0, len = 0;
    if (t > 0) {
      base = (t - 1) * chunk;
      len = count - base < chunk ? count - base : chunk;
      size_t a, b;
      a = hvdl_block_start(len, L, me);
      b = hvdl_block_start(len, L, me + 1);
      if (b > a)
        fold(s, k - 1, a * esize, out_area(s, me, k - 1) + a * esize, base + a, b - a, count, f,
             send + (base + a) * esize);
    }
    HVDL_CHECK(hvdl_shm_step(comm, s));
    if (t == 0) continue;
    for (int q = 0; q < L; q++) { /* slice q, clipped to [lo, hi) */
      size_t a, b;
      a = hvdl_block_start(len, L, q);
      b = hvdl_block_start(len, L, q + 1);
      a = base + a > lo ? base + a : lo;
      b = base + b < hi ? base + b : hi;
      if (b > a)
        hvdl_copy(recv + a * esize, out_area(s, q, k - 1) + (a - base) * esize, (b - a) * esize);
    }
  }
  return hvdlSuccess;
}

hvdlResult_t hvdl_shm_share(hvdlComm_t comm, void *buf, size_t count, hvdlDataType_t dt) {
  struct hvdl_shm *s = comm->shm;
  if (s->local_size == 1) return hvdlSuccess; /* then lanes == 1: this rank holds it all */
  const size_t esize = hvdl_type_size(dt), chunk = s->area / esize;
  const int me = s->local_rank;
  char *b = buf;
  for (size_t base = 0; base < count; base += chunk) {
    const size_t end = count - base < chunk ? count : base + chunk;
    const uint64_t k = s->step + 1;
    size_t lo, hi;
    if (me < s->lanes) {
      lo = hvdl_block_start(count, s->lanes, me);
      hi = hvdl_block_start(count, s->lanes, me + 1);
      lo = lo > base ? lo : base;
      hi = hi < end ? hi : end;
      if (hi > lo)
        hvdl_copy(in_area(s, me, k) + (lo - base) * esize, b + lo * esize, (hi - lo) * esize);
    }
    HVDL_CHECK(hvdl_shm_step(comm, s));
    for (int j = 0; j < s->lanes; j++) {
      if (j == me) continue;
      lo = hvdl_block_start(count, s->lanes, j);
      hi = hvdl_block_start(count, s->lanes, j + 1);
      lo = lo > base ? lo : base;
      hi = hi < end ? hi : end;
      if (hi > lo)
        hvdl_copy(b + lo * esize, in_area(s, j, k) + (lo - base) * esize, (hi - lo) * esize);
    }
  }
  return hvdlSuccess;
}

hvdlResult_t hvdl_shm_reduce_one_step(hvdlComm_t comm, const void *sendbuff, void *recvbuff,
                                      size_t count, const struct hvdl_shm_fold *f) {
  struct hvdl_shm *s = comm->shm;
  const uint64_t k = s->step + 1;
  hvdl_copy(in_area(s, s->local_rank, k), sendbuff, count * hvdl_type_size(f->dt));
  HVDL_CHECK(hvdl_shm_step(comm, s));
  fold(s, k, 0, recvbuff, 0, count, count, f, NULL);
  return hvdlSuccess;
}

/* ---- the segment's life --------------------------------------------------- */

/* Maps the host's segment (collective over s->local): local rank 0 creates a file in
 * /dev/shm with its pages reserved (so a full /dev/shm is an error now, not a SIGBUS
 * later) and tells the others its name; every rank maps it; once all have, the name
 * is removed, so the memory goes when the last rank unmaps it, whatever happens to
 * the processes. A failure is recorded in the thread's slot, not on comm: it only
 * means no shared-memory path. */
static hvdlResult_t make_segment(hvdlComm_t comm, struct hvdl_shm *s) {
  const size_t part = (HEAD + 4 * s->area + 4095) & ~(size_t)4095; /* whole pages: first touch */
  const size_t bytes = part * (size_t)s->local_size;
  struct {
    char name[56];
    int err;
  } made = {{0}, 0};
  int fd = -1;
  if (s->local_rank == 0) {
    snprintf(made.name, sizeof made.name, "/dev/shm/hvd_lite.%ld.%p", (long)getpid(), (void *)s);
    fd = open(made.name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    made.err = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
  }
  HVDL_MPI(NULL, MPI_Bcast(&made, (int)sizeof made, MPI_BYTE, 0, s->local));
  int err = made.err;
  if (!err && s->local_rank != 0) {
    fd = open(made.name, O_RDWR | O_CLOEXEC);
    if (fd < 0) err = errno;
  }
  void *base = MAP_FAILED;
  if (!err) {
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) err = errno;
  }
  const int created = s->local_rank == 0 && fd >= 0;
  if (fd >= 0) close(fd);
  const int mpi_err = MPI_Barrier(s->local); /* everyone has mapped it, or failed to */
  if (created) unlink(made.name);
  if (mpi_err != MPI_SUCCESS) err = EIO;
  if (err) {
    if (base != MAP_FAILED) munmap(base, bytes);
    return hvdl_fail(NULL, hvdlSystemError, "shared-memory segment %s (%zu bytes): %s", made.name,
                     bytes, strerror(err));
  }
  s->base = base;
  s->bytes = bytes;
  for (int q = 0; q < s->local_size; q++) s->seg[q] = s->base + (size_t)q * part;
  memset(s->seg[s->local_rank], 0, part); /* counter 0; the pages land near their owner */
  HVDL_MPI(NULL, MPI_Allgather(&comm->rank, 1, MPI_INT, s->ranks, 1, MPI_INT, s->local));
  return hvdlSuccess;
}

static void shm_release(struct hvdl_shm *s) {
  if (!s) return;
  hvdl_mem_unmap(s);
  if (s->base) munmap(s->base, s->bytes);
  free(s->seg);
  free(s->ranks);
  free(s->pids);
  free(s->scratch);
  free(s->inputs);
  free(s);
}

hvdlResult_t hvdl_shm_init(hvdlComm_t comm) {
  comm->shm = NULL;
  if (comm->size == 1) return hvdlSuccess;
  /* Rank 0's HVD_LITE_SHM, HVD_LITE_SHM_CMA and HVD_LITE_SHM_BYTES are every rank's:
   * ranks that differed would run different collectives below, or lay out one segment
   * differently. */
  struct {
    int off, cma_off;
    unsigned long long bytes;
  } a = {comm->config.disableShm, comm->config.disableShmCma, comm->config.shmBytes};
  HVDL_MPI(comm, MPI_Bcast(&a, (int)sizeof a, MPI_BYTE, 0, comm->mpi));
  comm->config.disableShm = a.off;
  comm->config.disableShmCma = a.cma_off;
  comm->config.shmBytes = (size_t)a.bytes;
  if (comm->config.disableShm) return hvdlSuccess;
  MPI_Comm local;
  HVDL_CHECK(hvdl_local_comm(comm->mpi, &local));
  MPI_Comm_set_errhandler(local, MPI_ERRORS_RETURN);
  int lr, ls, first, hosts = 0;
  MPI_Comm_rank(local, &lr);
  MPI_Comm_size(local, &ls);
  first = lr == 0;
  int sizes[2] = {ls, -ls}; /* the most and the fewest ranks on a host */
  int err = MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm->mpi);
  if (err == MPI_SUCCESS) err = MPI_Allreduce(&first, &hosts, 1, MPI_INT, MPI_SUM, comm->mpi);
  if (err != MPI_SUCCESS || sizes[0] == 1) {
    MPI_Comm_free(&local);
    return err == MPI_SUCCESS ? hvdlSuccess
                              : hvdl_fail_mpi(comm, err, "MPI_Allreduce (host layout)");
  }
  struct hvdl_shm *s = calloc(1, sizeof *s);
  int ok = s != NULL;
  if (ok) {
    s->local = local;
    s->local_rank = lr;
    s->local_size = ls;
    s->hosts = hosts;
    s->lanes = -sizes[1];
    const size_t want = comm->config.shmBytes ? comm->config.shmBytes : hvdl_shm_bytes_default();
    s->area = (want + 63) & ~(size_t)63;
    s->seg = calloc((size_t)ls, sizeof *s->seg);
    s->ranks = calloc((size_t)ls, sizeof *s->ranks);
    ok = s->seg && s->ranks;
  }
  if (ok) {
    s->ranks[0] = comm->rank;
    ok = ls == 1 || make_segment(comm, s) == hvdlSuccess;
  }
  if (ok) {
    s->inputs = calloc((size_t)ls, sizeof *s->inputs);
    ok = s->inputs != NULL;
  }
  /* Every rank takes the path or none does: the selector must choose alike. */
  err = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm->mpi);
  if (err != MPI_SUCCESS || !ok) { /* the ring instead */
    shm_release(s);
    MPI_Comm_free(&local);
    return err == MPI_SUCCESS ? hvdlSuccess
                              : hvdl_fail_mpi(comm, err, "MPI_Allreduce (shm agreement)");
  }
  comm->shm = s;
  return hvdlSuccess;
}

void hvdl_shm_free(hvdlComm_t comm, int collective) {
  struct hvdl_shm *s = comm->shm;
  if (!s) return;
  comm->shm = NULL;
  if (collective) MPI_Comm_free(&s->local);
  shm_release(s);
}

hvdlResult_t hvdl_shm_renew(hvdlComm_t comm) {
  struct hvdl_shm *s = comm->shm;
  if (!s || s->local_size == 1) return hvdlSuccess;
  /* Every local rank has left the failed collective: none writes the segment now. */
  uint64_t top = s->step;
  HVDL_MPI(comm, MPI_Allreduce(MPI_IN_PLACE, &top, 1, MPI_UINT64_T, MPI_MAX, s->local));
  s->step = top;
  atomic_store_explicit(counter(s, s->local_rank), top, memory_order_release);
  return hvdlSuccess;
}
