/*
 * pair_exchange.c -- the fold onto a power of two, the combining rule, the tree over n
 * partials and the partner exchange of the pairwise all-reduces (transport.h describes
 * them).
 */
#include "kernels/kernels.h"
#include "transport/transport.h"

/* The largest message one exchange sends (its byte count must fit an int). */
#define PAIR_MAX_MESSAGE_BYTES ((size_t)1 << 30)

void hvdl_fold_plan(int n, int r, struct hvdl_fold *f) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  f->p = p;
  f->rem = n - p;
  if (r < 2 * f->rem)
    f->vrank = (r % 2) ? r / 2 : -1;
  else
    f->vrank = r - f->rem;
}

int hvdl_fold_rank(const struct hvdl_fold *f, int v) { return v < f->rem ? 2 * v + 1 : v + f->rem; }

struct hvdl_group hvdl_group_all(hvdlComm_t comm) {
  return (struct hvdl_group){
      .size = comm->size, .rank = comm->rank, .ranks = NULL, .divisor = (uint64_t)comm->size};
}

void hvdl_pair_combine(void *out, const void *mine, const void *theirs, int mine_is_lower,
                       size_t count, hvdlDataType_t dt, hvdlRedOp_t op) {
  if (mine_is_lower)
    hvdl_reduce(out, mine, theirs, count, dt, op);
  else
    hvdl_reduce(out, theirs, mine, count, dt, op);
}

void hvdl_tree_combine(char *out, char **x, int n, size_t count, hvdlDataType_t dt,
                       hvdlRedOp_t op) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  const int rem = n - p;
  for (int v = 0; v < p; v++) {
    if (v < rem) hvdl_reduce(x[2 * v], x[2 * v], x[2 * v + 1], count, dt, op);
    x[v] = v < rem ? x[2 * v] : x[v + rem];
  }
  for (int m = 1; m < p; m *= 2)
    for (int v = 0; v < p; v += 2 * m)
      hvdl_reduce(m * 2 == p ? out : x[v], x[v], x[v + m], count, dt, op);
  if (p == 1) hvdl_copy(out, x[0], count * hvdl_type_size(dt));
}

/* The data phases' limits (wait.c), with sleeps capped at 10 us instead of 50: the next
 * step cannot start before this one is seen to end, and a step that outlasts the spin
 * (large pieces across hosts) loses up to one sleep. 64 simulated ranks, 64 MiB,
 * Rabenseifner: 13.31 ms with 50 us, 13.19 ms with 10 us (docs/scale.md). */
static const struct hvdl_wait_limits pair_wait = {
    .spin = 1e-3, .yield = 1, .first_sleep = 1e-6, .max_sleep = 10e-6, .bounded = 1};

/* One message each way (either may be empty), waited for together. */
static hvdlResult_t exchange_once(hvdlComm_t comm, int peer, int tag, const char *send,
                                  size_t sendbytes, char *recv, size_t recvbytes) {
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  hvdlResult_t res = hvdlSuccess;
  int err = MPI_SUCCESS;
  if (recvbytes > 0) {
    res = hvdl_fault(comm, HVDL_FAULT_RECV, peer);
    if (res == hvdlSuccess)
      err = MPI_Irecv(recv, (int)recvbytes, MPI_BYTE, peer, tag, comm->mpi, &req[0]);
  }
  if (res == hvdlSuccess && err == MPI_SUCCESS && sendbytes > 0) {
    res = hvdl_fault(comm, HVDL_FAULT_SEND, peer);
    if (res == hvdlSuccess)
      err = MPI_Isend(send, (int)sendbytes, MPI_BYTE, peer, tag, comm->mpi, &req[1]);
  }
  if (res == hvdlSuccess && err != MPI_SUCCESS)
    res = hvdl_fail_mpi(comm, err, "MPI_Irecv/MPI_Isend in a pairwise exchange");
  if (res == hvdlSuccess) {
    comm->wait_peer = peer;
    res = hvdl_wait_requests(comm, 2, req, &pair_wait);
  }
  if (res != hvdlSuccess) {
    /* Nothing posted may land in (or read) a buffer after the failure is reported. */
    const double until = hvdl_now() + HVDL_ABANDON_GRACE;
    hvdl_abandon(comm, 1, &req[0], 1, until);
    hvdl_abandon(comm, 1, &req[1], 0, until);
  }
  return res;
}

hvdlResult_t hvdl_pair_exchange(hvdlComm_t comm, int peer, int tag, const void *send,
                                size_t sendbytes, void *recv, size_t recvbytes) {
  const char *s = send;
  char *d = recv;
  size_t sent = 0, got = 0;
  while (sent < sendbytes || got < recvbytes) {
    const size_t sn =
        sendbytes - sent < PAIR_MAX_MESSAGE_BYTES ? sendbytes - sent : PAIR_MAX_MESSAGE_BYTES;
    const size_t rn =
        recvbytes - got < PAIR_MAX_MESSAGE_BYTES ? recvbytes - got : PAIR_MAX_MESSAGE_BYTES;
    HVDL_CHECK(exchange_once(comm, peer, tag, sn ? s + sent : NULL, sn, rn ? d + got : NULL, rn));
    sent += sn;
    got += rn;
  }
  return hvdlSuccess;
}

/* A set's wait: every request posted (the receives first, in m's order, nrecv of
 * them). When nothing has moved for the data timeout it names the peer of the first
 * receive still pending, else of the first send (a rendezvous send waits for its
 * receiver), as a single exchange names its partner. */
struct set_wait {
  int n, posted, nrecv;
  const struct hvdl_msg *m;
  MPI_Request *reqs;
  size_t off;
};

/* The sends are tested before the receives: they usually complete first, and a receive
 * tested later in the poll has had longer to land (alltoall_pairwise.c's reason). */
static hvdlResult_t set_test(hvdlComm_t comm, void *arg, int *done) {
  struct set_wait *w = arg;
  int sends_done = 0;
  HVDL_MPI(comm,
           MPI_Testall(w->posted - w->nrecv, w->reqs + w->nrecv, &sends_done, MPI_STATUSES_IGNORE));
  HVDL_MPI(comm, MPI_Testall(w->nrecv, w->reqs, done, MPI_STATUSES_IGNORE));
  *done = *done && sends_done;
  return hvdlSuccess;
}

static uint64_t set_progress(hvdlComm_t comm, void *arg) {
  struct set_wait *w = arg;
  uint64_t done = 0;
  int k = 0;
  comm->wait_peer = -1;
  for (int pass = 1; pass >= 0; pass--) /* as posted: the receives, then the sends */
    for (int i = 0; i < w->n; i++) {
      if (w->m[i].recv != pass || w->m[i].bytes <= w->off) continue;
      int flag = 1;
      if (w->reqs[k] != MPI_REQUEST_NULL &&
          MPI_Test(&w->reqs[k], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        flag = 0;
      k++;
      if (!flag && comm->wait_peer < 0) comm->wait_peer = w->m[i].peer;
      done += (uint64_t)flag;
    }
  return done;
}

/* One round of a set: each message's bytes [off, off + 1 GiB), the receives
 * posted first; waited for together. */
static hvdlResult_t set_round(hvdlComm_t comm, int tag, int n, const struct hvdl_msg *m,
                              MPI_Request *reqs, size_t off) {
  hvdlResult_t res = hvdlSuccess;
  int err = MPI_SUCCESS, posted = 0, nrecv = 0;
  for (int pass = 1; pass >= 0; pass--) { /* the receives, then the sends */
    for (int i = 0; i < n && res == hvdlSuccess && err == MPI_SUCCESS; i++) {
      if (m[i].recv != pass || m[i].bytes <= off) continue;
      const size_t left = m[i].bytes - off;
      const int len = (int)(left < PAIR_MAX_MESSAGE_BYTES ? left : PAIR_MAX_MESSAGE_BYTES);
      MPI_Request *r = &reqs[posted++];
      *r = MPI_REQUEST_NULL;
      res = hvdl_fault(comm, pass ? HVDL_FAULT_RECV : HVDL_FAULT_SEND, m[i].peer);
      if (res == hvdlSuccess)
        err = pass ? MPI_Irecv(m[i].buf + off, len, MPI_BYTE, m[i].peer, tag, comm->mpi, r)
                   : MPI_Isend(m[i].buf + off, len, MPI_BYTE, m[i].peer, tag, comm->mpi, r);
    }
    if (pass) nrecv = posted;
  }
  if (res == hvdlSuccess && err != MPI_SUCCESS)
    res = hvdl_fail_mpi(comm, err, "MPI_Irecv/MPI_Isend in an exchange with several peers");
  if (res == hvdlSuccess) {
    struct set_wait w = {n, posted, nrecv, m, reqs, off};
    const struct hvdl_poll p = {set_test, set_progress, &w, 0};
    comm->wait_peer = -1;
    res = hvdl_wait_until(comm, &p, &pair_wait);
  }
  if (res != hvdlSuccess) {
    /* Nothing posted may land in (or read) a buffer after the failure is reported. */
    const double until = hvdl_now() + HVDL_ABANDON_GRACE;
    hvdl_abandon(comm, nrecv, reqs, 1, until);
    hvdl_abandon(comm, posted - nrecv, reqs + nrecv, 0, until);
  }
  return res;
}

hvdlResult_t hvdl_pair_exchange_set(hvdlComm_t comm, int tag, int n, const struct hvdl_msg *m,
                                    MPI_Request *reqs) {
  size_t most = 0;
  for (int i = 0; i < n; i++) most = m[i].bytes > most ? m[i].bytes : most;
  size_t off = 0;
  do {
    HVDL_CHECK(set_round(comm, tag, n, m, reqs, off));
    off += PAIR_MAX_MESSAGE_BYTES;
  } while (off < most);
  return hvdlSuccess;
}
