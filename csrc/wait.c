/*
 * wait.c -- the one way the core waits for MPI requests: poll with MPI_Testall,
 * spin for a while, then sleep between polls, the sleeps doubling up to a cap
 * (and a longer one once the wait has lasted long). Each caller passes its
 * limits (struct hvdl_wait_limits, internal.h); the engine's pause between
 * rounds that made no progress takes its sleeps from hvdl_wait_next_sleep too.
 * It calls base.c and MPI; the algorithms, the executor, the negotiation and
 * the engine loop call it.
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
 * the yield (docs/benchmarks-history.md, section 10). Waits for other ranks to
 * arrive (negotiation rounds) spin briefly and sleep sooner.
 */
#include <sched.h>
#include <time.h>

#include "internal.h"

/* The data phases: spin 1 ms yielding, then sleeps from 1 us up to 50 us. */
static const struct hvdl_wait_limits in_collective = {
    .spin = 1e-3, .yield = 1, .first_sleep = 1e-6, .max_sleep = 50e-6};

void hvdl_sleep(double seconds) {
  if (seconds <= 0) return;
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

double hvdl_wait_next_sleep(const struct hvdl_wait_limits *w, double sleep, double waited) {
  if (sleep <= 0) return w->first_sleep;
  const double cap = w->long_after > 0 && waited >= w->long_after ? w->long_sleep : w->max_sleep;
  return sleep * 2 < cap ? sleep * 2 : cap;
}

hvdlResult_t hvdl_wait_requests(hvdlComm_t comm, int n, MPI_Request *reqs,
                                const struct hvdl_wait_limits *w) {
  const double start = hvdl_now();
  double sleep = 0;
  for (;;) {
    int done = 0;
    HVDL_MPI(comm, MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return hvdlSuccess;
    if (comm->on_wait) comm->on_wait(comm->on_wait_arg);
    const double waited = hvdl_now() - start;
    if (waited < w->spin) {
      if (w->yield) sched_yield(); /* a busy-waiting engine lets this process's training thread run */
      continue;
    }
    sleep = hvdl_wait_next_sleep(w, sleep, waited);
    hvdl_sleep(sleep);
  }
}

hvdlResult_t hvdl_wait_all(hvdlComm_t comm, int n, MPI_Request *reqs) {
  return hvdl_wait_requests(comm, n, reqs, &in_collective);
}
