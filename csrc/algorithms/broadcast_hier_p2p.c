/*
 * broadcast_hier_p2p.c -- the two-level broadcast over point-to-point messages,
 * for ranks on several hosts of the same size: a k-nomial tree among one rank a
 * host (the root's local rank on every host, its "leaders"), and a k-nomial tree
 * within each host from its leader, each leader fanning out within its host while
 * it forwards across hosts.
 *
 * The layout is hier_p2p's grid (allreduce_hier_p2p.c, comm->hier_p2p; hosts of
 * different sizes have none, and the selector then neither considers this nor lets
 * it be forced): H hosts of L ranks, rank (g, i) local rank i of host g. With the
 * root at (g0, i0), rank (g, i) is node hv = g - g0 (mod H) of the tree across when
 * i = i0, and node lv = i - i0 (mod L) of its host's tree.
 *
 * The k-nomial tree of radix k over N nodes (MVAPICH2's knomial). Write v in base
 * k; e(v) is the position of its lowest nonzero digit (for the root, v = 0, the
 * number of digits N needs, c = ceil(log_k N)). Node v > 0 receives the buffer from
 * v less that digit; it sends to v + d k^e for e = e(v)-1, ..., 1, 0 (a level each,
 * the largest first) and d = 1 .. k-1, those below N: the k-1 sends of a level at
 * once, the levels one after another. Example, N = 8, k = 4 (c = 2):
 *
 *   level 1   0 -> 4
 *   level 2   0 -> 1, 2, 3    4 -> 5, 6, 7
 *
 * The schedule at rank (g, i), B bytes, radices kx across and kl within:
 *
 *   leader, hv > 0   receive from leader hv's parent across
 *   other            receive from lv's parent within the host
 *   then, levels t = 0, 1, ...: one set of messages at once, the sends of its
 *   level t across (a leader's) and of its level t within (every rank's, from its
 *   place in its host's tree; a leader is that tree's root), waited for together
 *
 * Every host receives the buffer through its NIC once (kx-1 sends of B a level
 * leave a leader's NIC together); a leader's first sends within the host go out
 * with its first sends across. Only the root reads sendbuff; every other rank
 * receives the root's bytes, verbatim, once, into recvbuff, before it sends from
 * there. A rank receives one message, so one tag serves.
 *
 * Cost: ceil(log_kx H) levels across, each alpha + (kx-1) B beta of the leader's
 * NIC, then ceil(log_kl L) levels within, each alpha + (kl-1) B beta of the host's
 * memory, on the path to the farthest rank; radix 2 is the binomial tree of each
 * level, and the selector picks the radices (2, 4 or 8, so that no rank sends more
 * than 7 messages at once) by the model. Waits, errors and faults are pair_exchange.c's.
 */
#include "algorithms/algorithms.h"
#include "transport/transport.h"

#define BCAST_HIER_TAG 0x485B /* "H[" */

/* The k-nomial tree's c: the digits N nodes need in base k (0 for one node). */
static int knomial_levels(int nodes, int k) {
  int c = 0;
  for (long long span = 1; span < nodes; span *= k) c++;
  return c;
}

/* e(v) and k^e(v): the lowest nonzero digit's position and weight (the root: c, k^c). */
static int lowest_digit(int v, int k, int c, long long *weight) {
  int e = 0;
  long long w = 1;
  while (e < c && (v / w) % k == 0) e++, w *= k;
  *weight = w;
  return e;
}

struct tree {
  int nodes, k, v, e; /* levels with sends: e(v) */
};

static struct tree tree_of(int nodes, int k, int v) {
  long long w;
  const int c = knomial_levels(nodes, k);
  return (struct tree){nodes, k, v, lowest_digit(v, k, c, &w)};
}

static int parent_of(const struct tree *t) {
  long long w;
  const int c = knomial_levels(t->nodes, t->k);
  lowest_digit(t->v, t->k, c, &w);
  return (int)(t->v - ((t->v / w) % t->k) * w);
}

/* Adds the sends of level `level` (0: the largest) of node t->v to msgs; peer(x) maps node x. */
static int add_level(const struct tree *t, int level, int (*peer)(const void *, int),
                     const void *arg, const void *buf, size_t bytes, struct hvdl_msg *msgs) {
  if (level >= t->e) return 0;
  long long w = 1;
  for (int e = 0; e < t->e - 1 - level; e++) w *= t->k;
  int nm = 0;
  for (int d = 1; d < t->k; d++) {
    const long long child = t->v + d * w;
    if (child < t->nodes)
      msgs[nm++] = (struct hvdl_msg){peer(arg, (int)child), 0, (char *)buf, bytes};
  }
  return nm;
}

struct frame {
  const struct hvdl_host_grid *g;
  int g0, i0, h, j;
};

static int leader_rank(const void *arg, int hv) { /* node hv across: leader of host g0 + hv */
  const struct frame *f = arg;
  return f->g->ranks[(size_t)((f->g0 + hv) % f->g->hosts) * f->g->per_host + f->i0];
}

static int local_rank(const void *arg, int lv) { /* node lv within this host */
  const struct frame *f = arg;
  return f->g->ranks[(size_t)f->h * f->g->per_host + (f->i0 + lv) % f->g->per_host];
}

hvdlResult_t hvdl_broadcast_hier_p2p(hvdlComm_t comm, int across, int within, const void *sendbuff,
                                     void *recvbuff, size_t count, hvdlDataType_t dt, int root) {
  if (!comm->hier_p2p)
    return hvdl_fail(comm, hvdlInternalError,
                     "hier_p2p broadcast without its grid (hosts of different sizes?)");
  if (across < 2 || across > 8 || within < 2 || within > 8)
    return hvdl_fail(comm, hvdlInternalError, "hier_p2p broadcast: radices %d and %d (2 to 8)",
                     across, within);
  const struct hvdl_host_grid *g = hvdl_hier_p2p_grid(comm->hier_p2p);
  const int H = g->hosts, L = g->per_host;
  const struct frame f = {g, g->slot[root] / L, g->slot[root] % L, g->host, g->local};
  const int hv = (f.h - f.g0 + H) % H, lv = (f.j - f.i0 + L) % L, leader = lv == 0;
  const size_t bytes = count * hvdl_type_size(dt);
  const struct tree tx = tree_of(H, across, leader ? hv : 0), tl = tree_of(L, within, lv);
  const void *have = recvbuff;
  if (comm->rank == root) {
    have = sendbuff;
  } else {
    const int from = leader ? leader_rank(&f, parent_of(&tx)) : local_rank(&f, parent_of(&tl));
    HVDL_CHECK(hvdl_pair_exchange(comm, from, BCAST_HIER_TAG, NULL, 0, recvbuff, bytes));
  }
  struct hvdl_msg msgs[14];
  MPI_Request reqs[14];
  const int levels = (leader && tx.e > tl.e) ? tx.e : tl.e;
  for (int t = 0; t < levels; t++) {
    int nm = leader ? add_level(&tx, t, leader_rank, &f, have, bytes, msgs) : 0;
    nm += add_level(&tl, t, local_rank, &f, have, bytes, msgs + nm);
    HVDL_CHECK(hvdl_pair_exchange_set(comm, BCAST_HIER_TAG, nm, msgs, reqs));
  }
  if (comm->rank == root && recvbuff != sendbuff) hvdl_copy(recvbuff, sendbuff, bytes);
  return hvdlSuccess;
}
