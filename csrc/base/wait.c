/*
 * wait.c -- the one way the core waits for MPI requests: poll with MPI_Testall,
 * spin for a while, then sleep between polls, the sleeps doubling up to a cap
 * (and a longer one once the wait has lasted long). Each caller passes its
 * limits (struct hvdl_wait_limits, base.h); the engine's pause between
 * rounds that made no progress takes its sleeps from hvdl_wait_next_sleep too.
 * It calls base/ and MPI; the algorithms, the executor, the negotiation and
 * the engine loop call it. A wait ends early when the communicator's watch hook
 * says so (the engine: an alarm from another rank) or when nothing has completed
 * for comm->data_timeout; hvdl_abandon then cancels what its caller had posted.
 * The same loop waits for other conditions (hvdl_wait_until: the shared-memory
 * path's counters, segment.c), with the same limits and the same bound.
 *
 * Why not MPI_Wait: it busy-polls in Open MPI, so a rank waiting for a slow peer
 * burns a whole core, which on a small machine is a core taken from training.
 *
 * The data phases (hvdl_wait_all: the ring, the latency path, the other
 * collectives) spin long, because every rank is already inside the same
 * collective and over shared memory the receiver copies a large message inside
 * its MPI_Test calls: a sleeping receiver delays every segment (1 ms instead of
 * 50 us took the in-place ring from 0.85-0.9x to 0.96-0.97x MPI's busbw at
 * 4-16 MiB, docs/benchmarks-history.md). Their spin yields the core between
 * polls: with 2 ranks on 2 cores the engine shares its core with the training
 * thread, whose submissions took 5.3 ms of a ResNet-50 step against 1.9 ms with
 * the yield (docs/benchmarks-history.md, section 10); only the engine thread yields
 * (hvdl_wait_yield_in_spins: a caller running its own turn in the fast path is that
 * training thread, and its yields stalled 1-13 % of small synchronous calls for 4-40
 * ms on a machine loaded by other processes). Waits for other ranks to
 * arrive (negotiation rounds) spin briefly and sleep sooner.
 *
 * An oversubscribed host (more ranks than the CPUs they may run on, found when a
 * communicator is made: hvdl_note_host_cpus, from topology.c's hvdl_host_cpus) is the
 * exception: there the peer a rank waits for may be waiting for this rank's core, so
 * every thread's spins yield, as MPI's own waits do then. Without it, 4 ranks on 2
 * cores took about 1 ms for a 4-byte all-reduce, the length of a scheduler tick
 * (docs/benchmarks-history.md, "Small calls on an oversubscribed host").
 *
 * It also holds the transports' one fault point (hvdl_fault, HVD_LITE_FAULT, a testing
 * aid): the stall point, which makes a rank stop as a late peer would, and the failing
 * send or recv, which pair_exchange.c, pipeline.c and segment.c call before each message
 * or step.
 */
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "base/base.h"

/* The data phases: spin 1 ms yielding, then sleeps from 1 us up to 50 us. */
static const struct hvdl_wait_limits in_collective = {
    .spin = 1e-3, .yield = 1, .first_sleep = 1e-6, .max_sleep = 50e-6, .bounded = 1};

static _Thread_local int spin_yields;

void hvdl_wait_yield_in_spins(int on) { spin_yields = on; }

static _Atomic int oversubscribed;

void hvdl_note_host_cpus(int ranks, int cpus) {
  if (cpus > 0 && ranks > cpus) atomic_store_explicit(&oversubscribed, 1, memory_order_relaxed);
}

int hvdl_oversubscribed(void) {
  return atomic_load_explicit(&oversubscribed, memory_order_relaxed);
}

void hvdl_sleep(double seconds) {
  if (seconds <= 0) return;
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

/* The stall fault point (HVD_LITE_FAULT, a testing aid): the rank stops for
 * three data timeouts (a second without one). A waiting peer fails between one
 * and two timeouts after the last progress it saw (hvdl_wait_until reads
 * progress at marks a timeout apart), and the others' arrivals at the step are
 * progress: with twice the timeout, a peer whose first mark saw a late arrival
 * could be passed by the stalled rank just before its second mark, and the call
 * would succeed (seen at 4 ranks on 2 busy cores). */
void hvdl_fault_stall(hvdlComm_t comm) {
  if (hvdl_fault_hit(comm->faults, HVDL_FAULT_STALL))
    hvdl_sleep(comm->data_timeout > 0 ? 3 * comm->data_timeout : 1.0);
}

hvdlResult_t hvdl_fault_armed(hvdlComm_t comm, enum hvdl_fault_point at, int peer) {
  if (at == HVDL_FAULT_SEND) hvdl_fault_stall(comm);
  /* the kill point: the rank dies of SIGKILL before this send, mid-collective (elastic tests) */
  if (at == HVDL_FAULT_SEND && hvdl_fault_hit(comm->faults, HVDL_FAULT_KILL)) raise(SIGKILL);
  if (!hvdl_fault_hit(comm->faults, at)) return hvdlSuccess;
  const int send = at == HVDL_FAULT_SEND;
  if (peer == HVDL_FAULT_NO_PEER)
    return hvdl_fail(comm, hvdlSystemError,
                     "injected fault (HVD_LITE_FAULT): a shared-memory %s failed",
                     send ? "publish" : "wait");
  return hvdl_fail(comm, hvdlSystemError, "injected fault (HVD_LITE_FAULT): a %s %s rank %d failed",
                   hvdl_fault_name(at), send ? "to" : "from", peer);
}

/* A long wait (past long_after) sleeps up to long_sleep, or up to LATE_SHARE of the
 * time it has waited so far if that is more, never over LATE_SLEEP_MAX: a peer late
 * by t is answered at most t / 50 later, and a rank blocked for seconds wakes 20 times
 * a second. A rank blocked 10 s in synchronize on a peer that had not submitted took
 * 0.70-0.74 % of a core with long_sleep alone (10 ms), 0.31-0.36 % with this
 * (tools/cpu_while_waiting.py; docs/benchmarks-history.md, "A waiting rank's CPU"). */
#define LATE_SHARE     0.02
#define LATE_SLEEP_MAX 50e-3

double hvdl_wait_next_sleep(const struct hvdl_wait_limits *w, double sleep, double waited) {
  if (sleep <= 0) return w->first_sleep;
  double cap = w->max_sleep;
  if (w->long_after > 0 && waited >= w->long_after) {
    cap = waited * LATE_SHARE > w->long_sleep ? waited * LATE_SHARE : w->long_sleep;
    if (cap > LATE_SLEEP_MAX) cap = LATE_SLEEP_MAX;
  }
  return sleep * 2 < cap ? sleep * 2 : cap;
}

/* How many of the n requests are still pending (each one is tested). */
static int pending_count(int n, MPI_Request *reqs) {
  int left = 0;
  for (int i = 0; i < n; i++) {
    int done = 1;
    if (reqs[i] != MPI_REQUEST_NULL && MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      done = 0;
    left += !done;
  }
  return left;
}

/* Progress, not total time, is bounded: at every data_timeout mark the wait reads
 * its progress count, and fails if it has not grown since the last mark. The peer
 * is named as the communicator it serves numbers it (comm->rank_names). */
static hvdlResult_t no_progress(hvdlComm_t comm, double waited) {
  if (comm->wait_peer >= 0)
    return hvdl_fail(comm, hvdlRemoteError,
                     "no message from rank %d for %g s (HVD_LITE_DATA_TIMEOUT_SECONDS): it is not "
                     "taking part in the collective",
                     comm->rank_names ? comm->rank_names[comm->wait_peer] : comm->wait_peer,
                     waited);
  return hvdl_fail(comm, hvdlRemoteError,
                   "no progress for %g s (HVD_LITE_DATA_TIMEOUT_SECONDS) waiting for other ranks: "
                   "one of them is not taking part in the collective",
                   waited);
}

/* How often a sleeping wait asks the MPI for dead ranks, where it can tell (failed.c):
 * an MPI_Iprobe and a group query cost microseconds; the MPI's own detection takes tens
 * of milliseconds. */
#define FT_CHECK_EVERY 1e-3

/* A test that failed: where the MPI reports dead ranks (failed.c), they may be why, and
 * revoking tells every other rank. */
static hvdlResult_t tested(hvdlComm_t comm, hvdlResult_t res) {
  if (res != hvdlSuccess && comm->ft) hvdl_failed_revoke(comm);
  return res;
}

hvdlResult_t hvdl_wait_until(hvdlComm_t comm, const struct hvdl_poll *p,
                             const struct hvdl_wait_limits *w) {
  int done = 0;
  HVDL_CHECK(tested(
      comm, p->test(comm, p->arg, &done))); /* most waits end here, before reading the clock */
  if (done) return hvdlSuccess;
  const double start = hvdl_now() - w->waited_before;
  const double timeout = w->bounded ? comm->data_timeout : 0;
  double sleep = 0, mark = start + w->waited_before + timeout, ft_mark = 0;
  uint64_t seen = p->start;
  for (;;) {
    const double now = hvdl_now(), waited = now - start;
    if (comm->watch) HVDL_CHECK(comm->watch(comm->watch_arg, waited));
    if (waited < w->spin) {
      if ((w->yield && spin_yields) || hvdl_oversubscribed())
        sched_yield(); /* the engine lets its training thread run; oversubscribed, every rank */
    } else {
      if (timeout > 0 && now >= mark) {
        const uint64_t now_seen = p->progress(comm, p->arg);
        if (now_seen == seen) return no_progress(comm, timeout);
        seen = now_seen;
        mark = now + timeout;
      }
      if (comm->ft && now >= ft_mark) { /* dead ranks (ULFM), at most every FT_CHECK_EVERY */
        HVDL_CHECK(hvdl_failed_check(comm));
        ft_mark = now + FT_CHECK_EVERY;
      }
      sleep = hvdl_wait_next_sleep(w, sleep, waited);
      hvdl_sleep(sleep);
    }
    HVDL_CHECK(tested(comm, p->test(comm, p->arg, &done)));
    if (done) return hvdlSuccess;
  }
}

struct request_set {
  int n;
  MPI_Request *reqs;
};

static hvdlResult_t test_requests(hvdlComm_t comm, void *arg, int *done) {
  struct request_set *rs = arg;
  HVDL_MPI(comm, MPI_Testall(rs->n, rs->reqs, done, MPI_STATUSES_IGNORE));
  return hvdlSuccess;
}

/* Progress: the requests completed (none at the start). */
static uint64_t requests_done(hvdlComm_t comm, void *arg) {
  (void)comm;
  struct request_set *rs = arg;
  return (uint64_t)(rs->n - pending_count(rs->n, rs->reqs));
}

hvdlResult_t hvdl_wait_requests(hvdlComm_t comm, int n, MPI_Request *reqs,
                                const struct hvdl_wait_limits *w) {
  struct request_set rs = {n, reqs};
  const struct hvdl_poll p = {test_requests, requests_done, &rs, 0};
  return hvdl_wait_until(comm, &p, w);
}

void hvdl_abandon(hvdlComm_t comm, int n, MPI_Request *reqs, int receives, double until) {
  if (!receives) {
    for (int i = 0; i < n; i++) {
      if (reqs[i] == MPI_REQUEST_NULL) continue;
      if (comm->nparked == comm->parked_cap) {
        int cap = comm->parked_cap ? 2 * comm->parked_cap : 64;
        MPI_Request *p = realloc(comm->parked, sizeof *p * (size_t)cap);
        if (!p) { /* cannot keep it: released now, at the risk of a late match */
          MPI_Request_free(&reqs[i]);
          continue;
        }
        comm->parked = p;
        comm->parked_cap = cap;
      }
      comm->parked[comm->nparked++] = reqs[i];
      reqs[i] = MPI_REQUEST_NULL;
    }
    return;
  }
  for (int i = 0; i < n; i++)
    if (reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
  double sleep = 1e-6;
  for (;;) {
    int done = 0;
    if (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS || done ||
        hvdl_now() >= until)
      break;
    hvdl_sleep(sleep);
    sleep = sleep * 2 < 1e-3 ? sleep * 2 : 1e-3;
  }
  for (int i = 0; i < n; i++)
    if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[i]);
}

hvdlResult_t hvdl_wait_peer(hvdlComm_t comm, int peer, int n, MPI_Request *reqs) {
  comm->wait_peer = peer;
  return hvdl_wait_requests(comm, n, reqs, &in_collective);
}

hvdlResult_t hvdl_wait_all(hvdlComm_t comm, int n, MPI_Request *reqs) {
  return hvdl_wait_peer(comm, -1, n, reqs);
}

hvdlResult_t hvdl_wait_data(hvdlComm_t comm, const struct hvdl_poll *p) {
  comm->wait_peer = -1;
  return hvdl_wait_until(comm, p, &in_collective);
}
