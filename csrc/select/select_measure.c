/*
 * select_measure.c -- the cost model's terms, measured when a communicator spanning
 * hosts is made (hvdl_select_init), so that no model file is needed to choose well on
 * an unknown network.
 *
 * Who: rank 0 with inter_peer, the lowest rank on another host than rank 0's (the
 * host layout of topology.c, emulated hosts included), for the terms across hosts;
 * then rank 0 with intra_peer, the lowest other rank on its own host (where it has
 * one), for those within. Every other rank takes no part and goes on to the
 * broadcast of rank 0's result (select_allreduce.c).
 *
 * What: a ping-pong of each size in MEASURE_SIZES, MEASURE_WARMUP round trips then
 * MEASURE_REPS timed ones, rank 0 sending first; a size's one-way time is half its
 * quickest timed round trip (the least disturbed: init shares the machine with
 * nothing of ours, but with other jobs and the MPI's own progress). That is
 * 7 x 6 round trips a series, about 8 MiB each way: a few milliseconds on a
 * 10 Gb/s network; hvdlCommInitMpi took 4.8 ms of simulated time at 64 ranks on
 * 100 Gb/s links (docs/scale.md). Where the fit (below) is implausible, up to
 * MEASURE_SERIES series run, each size keeping its quickest trip of them all: on a
 * loaded machine every trip of one size in one series can lose its core (7 of 60
 * measurements failed at one series, 2 ranks on 2 cores beside 6 busy loops); rank
 * 0 tells the peer after each series whether another follows.
 *
 * The fit: beta, the time per byte, from the two largest sizes (their latency is
 * the same step of MPI's protocols, the rendezvous one, on the MPIs and the
 * simulation we know); then each size's latency alpha_i = t_i - s_i beta. MPI
 * sends small messages eagerly and large ones after a handshake (rendezvous), and
 * SMPI's network model multiplies a message's latency by a factor that grows
 * with its size (about 2 below 1.4 KiB, 11.6 from 64 KiB), so one alpha cannot fit
 * both ends: alpha[HVDL_LINK_INTER] is the smallest size's, and every other size
 * starts a step (step_bytes, step_alpha: from s_i bytes up, alpha_i), which the
 * selectors read through hvdl_select_alpha_inter. A message between two measured
 * sizes takes the smaller one's latency; the fail-safe rule of select_allreduce.c
 * guards the one algorithm that guess could mislead much (the ring). Within a host
 * the model keeps one latency, the smallest size's, and beta as across.
 *
 * Bounded: every wait polls with a deadline (MEASURE_TIMEOUT_S for the whole
 * measurement on each side). A timeout, an MPI error or a fit still implausible (a
 * time not positive and finite, a term outside the model file's [0, 1]) gives
 * up on that class: the requests are abandoned (hvdl_abandon), and rank 0 keeps
 * its terms for it, the defaults or its file's, which every rank then receives,
 * with why in the model's measure_error (Comm.cost_model() shows it). The tag is the
 * measurement's own, so a message a timed-out side
 * leaves behind can match no collective's receive.
 */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "select/select.h"

#define MEASURE_TAG       0x484D /* "HM" */
#define MEASURE_WARMUP    1
#define MEASURE_REPS      5
#define MEASURE_TIMEOUT_S 10.0
#define MEASURE_SERIES    3
static const size_t MEASURE_SIZES[] = {8, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20};
#define MEASURE_NSIZES (sizeof MEASURE_SIZES / sizeof MEASURE_SIZES[0])

/* Waits for the requests until done (1), or until the deadline or an MPI error (0:
 * they are abandoned by wait.c's hvdl_abandon, the first `receives` of them, the
 * receives, cancelled, the sends parked on the communicator). */
static int wait_until(hvdlComm_t comm, MPI_Request *reqs, int n, int receives, double deadline) {
  for (;;) {
    int done = 0;
    if (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
    if (done) return 1;
    if (MPI_Wtime() > deadline) break;
    sched_yield(); /* the peer may be waiting for this core (an oversubscribed host) */
  }
  const double until = hvdl_now() + HVDL_ABANDON_GRACE;
  if (receives) hvdl_abandon(comm, receives, reqs, 1, until);
  if (n > receives) hvdl_abandon(comm, n - receives, reqs + receives, 0, until);
  return 0;
}

/* One round trip of s bytes with peer: rank 0 sends then receives, the peer
 * receives then sends back. 0 when it did not complete in time. */
static int round_trip(hvdlComm_t comm, int leader, int peer, char *buf, size_t s, double deadline) {
  MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  const int other = leader ? peer : 0;
  if (MPI_Irecv(buf, (int)s, MPI_BYTE, other, MEASURE_TAG, comm->mpi, &r[0]) != MPI_SUCCESS)
    return 0;
  if (leader) {
    if (MPI_Isend(buf + s, (int)s, MPI_BYTE, peer, MEASURE_TAG, comm->mpi, &r[1]) != MPI_SUCCESS)
      return wait_until(comm, r, 1, 1, -1.0), 0;
    return wait_until(comm, r, 2, 1, deadline);
  }
  if (!wait_until(comm, r, 1, 1, deadline)) return 0;
  if (MPI_Isend(buf, (int)s, MPI_BYTE, 0, MEASURE_TAG, comm->mpi, &r[1]) != MPI_SUCCESS) return 0;
  return wait_until(comm, &r[1], 1, 0, deadline);
}

/* The fit of the one-way times t[] (MEASURE_SIZES): beta and each size's latency
 * alpha[i]; 0 if implausible. */
static int fit(const double *t, double *alpha, double *beta_out) {
  const size_t k = MEASURE_NSIZES - 1;
  for (size_t i = 0; i < MEASURE_NSIZES; i++)
    if (!(t[i] > 0) || !isfinite(t[i])) return 0;
  double beta = (t[k] - t[k - 1]) / (double)(MEASURE_SIZES[k] - MEASURE_SIZES[k - 1]);
  if (!(beta > 0)) /* noise on a loaded machine: the line through the ends instead */
    beta = (t[k] - t[0]) / (double)(MEASURE_SIZES[k] - MEASURE_SIZES[0]);
  if (!(beta > 0) || beta > 1.0) return 0;
  for (size_t i = 0; i < MEASURE_NSIZES; i++) {
    alpha[i] = t[i] - (double)MEASURE_SIZES[i] * beta;
    /* noise can leave a large size's latency below zero: a latency is never less
     * than the smallest message's share of it */
    if (alpha[i] < 0.1 * t[0]) alpha[i] = 0.1 * t[0];
    if (alpha[i] > 1.0) return 0;
  }
  *beta_out = beta;
  return 1;
}

/* One series with peer: each size's quickest timed round trip, halved, merged into
 * t[] (rank 0's view; t[i] < 0: none yet) where it is quicker; 0 when a round trip
 * did not complete by the deadline. */
static int series(hvdlComm_t comm, int leader, int peer, char *buf, double deadline, double *t) {
  for (size_t i = 0; i < MEASURE_NSIZES; i++) {
    for (int rep = 0; rep < MEASURE_WARMUP + MEASURE_REPS; rep++) {
      const double t0 = MPI_Wtime();
      if (!round_trip(comm, leader, peer, buf, MEASURE_SIZES[i], deadline)) return 0;
      const double one_way = (MPI_Wtime() - t0) / 2;
      if (rep >= MEASURE_WARMUP && (t[i] < 0 || one_way < t[i])) t[i] = one_way;
    }
  }
  return 1;
}

/* Rank 0 tells peer whether another series follows (*again); the peer learns it.
 * 0 when that did not complete by the deadline. */
static int tell(hvdlComm_t comm, int leader, int peer, int *again, double deadline) {
  MPI_Request r = MPI_REQUEST_NULL;
  const int err = leader ? MPI_Isend(again, 1, MPI_INT, peer, MEASURE_TAG, comm->mpi, &r)
                         : MPI_Irecv(again, 1, MPI_INT, 0, MEASURE_TAG, comm->mpi, &r);
  return err == MPI_SUCCESS && wait_until(comm, &r, 1, leader ? 0 : 1, deadline);
}

/* One class of link with peer: series until rank 0's fit of their merged times is
 * plausible, at most MEASURE_SERIES (on a loaded machine a size's every round trip
 * of one series can be descheduled: its quickest of a later one is not). 1 on rank 0
 * with alpha[], *beta; 0 otherwise, and on rank 0 why, after `what`, in err. */
static int measure_class(hvdlComm_t comm, int leader, int peer, char *buf, double deadline,
                         const char *what, double *alpha, double *beta, char *err, size_t len) {
  double t[MEASURE_NSIZES];
  for (size_t i = 0; i < MEASURE_NSIZES; i++) t[i] = -1;
  for (int k = 1;; k++) {
    if (!series(comm, leader, peer, buf, deadline, t)) {
      if (leader)
        snprintf(err, len, "%s: a round trip with rank %d did not complete within %.0f s", what,
                 peer, MEASURE_TIMEOUT_S);
      return 0;
    }
    const int ok = leader && fit(t, alpha, beta);
    int again = leader && !ok && k < MEASURE_SERIES;
    if (!tell(comm, leader, peer, &again, deadline) && !leader) return 0;
    if (again) continue;
    if (leader && !ok) {
      int at = snprintf(err, len, "%s: no plausible fit after %d series (one-way s:", what, k);
      for (size_t i = 0; i < MEASURE_NSIZES && at >= 0 && (size_t)at < len; i++)
        at += snprintf(err + at, len - (size_t)at, " %zuB %.2g", MEASURE_SIZES[i], t[i]);
      if (at >= 0 && (size_t)at < len) snprintf(err + at, len - (size_t)at, ")");
    }
    return ok;
  }
}

int hvdl_select_measure(hvdlComm_t comm, int inter_peer, int intra_peer,
                        struct hvdl_cost_model *m) {
  const int leader = comm->rank == 0;
  if (!leader && comm->rank != inter_peer && comm->rank != intra_peer) return 0;
  const size_t most = MEASURE_SIZES[MEASURE_NSIZES - 1];
  char *buf = malloc(2 * most);
  if (!buf) return 0; /* a peer times out then: rank 0 reports failure */
  memset(buf, 0, 2 * most);
  const double start = MPI_Wtime(), deadline = start + MEASURE_TIMEOUT_S;
  const int peers[2] = {inter_peer, intra_peer};
  static const char *const what[2] = {"across hosts", "within a host"};
  static const int link[2] = {HVDL_LINK_INTER, HVDL_LINK_INTRA};
  double alpha[2][MEASURE_NSIZES], beta[2];
  int ok[2] = {0, 0}; /* across, within */
  for (int c = 0; c < 2; c++) {
    char *why = m->measure_error[link[c]];
    why[0] = '\0';
    if (peers[c] >= 0 && (leader || comm->rank == peers[c]))
      ok[c] = measure_class(comm, leader, peers[c], buf, deadline, what[c], alpha[c], &beta[c], why,
                            sizeof m->measure_error[0]);
  }
  free(buf);
  if (!leader) return 0;
  int done = 0;
  if (ok[0]) {
    m->alpha[HVDL_LINK_INTER] = alpha[0][0];
    m->beta[HVDL_LINK_INTER] = beta[0];
    m->steps = 0;
    for (size_t i = 1; i < MEASURE_NSIZES && m->steps < HVDL_ALPHA_STEPS; i++) {
      m->step_bytes[m->steps] = (double)MEASURE_SIZES[i];
      m->step_alpha[m->steps++] = alpha[0][i];
    }
    m->inter_source = HVDL_MODEL_MEASURED;
    done |= 1;
  }
  if (ok[1]) {
    m->alpha[HVDL_LINK_INTRA] = alpha[1][0];
    m->beta[HVDL_LINK_INTRA] = beta[1];
    m->intra_source = HVDL_MODEL_MEASURED;
    done |= 2;
  }
  m->measure_s = MPI_Wtime() - start;
  return done;
}
