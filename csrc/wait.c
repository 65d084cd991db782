/*
 * wait.c -- waiting for MPI requests without stealing a core.
 *
 * MPI_Wait busy-polls in Open MPI: a rank waiting for a slow peer burns a whole
 * core, which on a small machine is a core taken from training. hvdl_wait_all
 * polls with MPI_Testall: it spins for SPIN_SECONDS, then sleeps between polls,
 * doubling the sleep up to max_sleep_us.
 *
 * It serves the data phases (the ring, the latency path), where every rank is
 * already inside the same collective, so the spin is long: over shared memory
 * the receiver copies a large message inside its MPI_Test calls, and a sleeping
 * receiver delays every segment (1 ms instead of 50 us took the in-place ring
 * from 0.85-0.9x to 0.96-0.97x MPI's busbw at 4-16 MiB, docs/benchmarks.md).
 * Waits for other ranks to arrive are negotiate.c's, which sleep sooner. The spin
 * yields the core between polls: with 2 ranks on 2 cores the engine shares its
 * core with the training thread, whose submissions took 5.3 ms of a ResNet-50
 * step against 1.9 ms with the yield (docs/benchmarks.md, section 10).
 */
#include <sched.h>
#include <time.h>

#include "internal.h"

#define SPIN_SECONDS 1e-3 /* see above */

double hvdl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

hvdlResult_t hvdl_wait_all(hvdlComm_t comm, int n, MPI_Request *reqs, double max_sleep_us) {
  int done = 0;
  const double spin_until = hvdl_now() + SPIN_SECONDS;
  double sleep_us = 1.0;
  for (;;) {
    HVDL_MPI(comm, MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return hvdlSuccess;
    if (comm->on_wait) comm->on_wait(comm->on_wait_arg);
    if (hvdl_now() < spin_until) {
      sched_yield(); /* a busy-waiting engine lets the training thread of this process run */
      continue;
    }
    struct timespec ts = {0, (long)(sleep_us * 1000.0)};
    nanosleep(&ts, NULL);
    sleep_us = sleep_us * 2.0 < max_sleep_us ? sleep_us * 2.0 : max_sleep_us;
  }
}
