/*
 * negotiate.c -- one negotiation round: which requests are ready on every rank,
 * in what order, and which are in error.
 *
 * A round is collective over the engine's control communicator:
 *
 *   1. An all-gather of each rank's contribution (through the host's shared
 *      segment when every rank is on one host, shm.h; else MPI_Iallgather):
 *      two header words (flags: leaving, wants the slow path; the byte size of
 *      its uncached descriptors;
 *      rank 0's autotune word, which the engine applies after the round) and a
 *      bit vector with bit k set when a request matching cache entry k is
 *      pending here. Steady-state training takes only this step: no names.
 *   2. Slow path, when any rank asked for it: MPI_Igatherv of the uncached
 *      descriptors to rank 0 (the coordinator). It files them in its table by
 *      name; a name every rank has announced is validated (collective, dtype,
 *      shape, op, scale factors) and becomes READY with a cache id, or ERROR with
 *      a message naming both values. A name announced while cached means its
 *      metadata changed on some rank: EVICT. A stall shutdown is a SHUTDOWN.
 *      The response is MPI_Ibcast to everyone, and every rank (rank 0 too)
 *      applies it in order, so the caches stay identical.
 *   3. Ready list: the READY entries in response order, then the cached entries
 *      whose bit is set on every rank, by ascending id. Every rank computes the
 *      same list from the same bytes.
 *
 * Rank 0 also runs the stall inspector here, from the bit vectors and its table.
 * The bytes are wire.c's, the cache response_cache.c's, rank 0's part coordinator.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "negotiate/negotiate.h"
#include "request/request.h"
#include "transport/shm/shm.h"

static int desc_equal(const struct hvdl_desc *a, const struct hvdl_desc *b) {
  if (a->coll != b->coll || a->dtype != b->dtype || a->op != b->op || a->ndim != b->ndim ||
      a->root != b->root || a->device != b->device || !hvdl_same_bits(a->prescale, b->prescale) ||
      !hvdl_same_bits(a->postscale, b->postscale))
    return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return strcmp(a->name, b->name) == 0 && strcmp(a->error, b->error) == 0;
}

/* ---- waiting ------------------------------------------------------------- */

/* A round waits for ranks that may still be busy elsewhere: a short spin, then
 * sleeps growing to 100 us, and to 10 ms once it has waited 50 ms (a peer that is
 * late by that much is idle or busy elsewhere). With 1 ms, a peer 0.5 ms late was
 * answered up to 1 ms later (docs/benchmarks-history.md, section 9). */
static const struct hvdl_wait_limits round_wait = {.spin = 20e-6,
                                                   .first_sleep = 1e-6,
                                                   .max_sleep = 100e-6,
                                                   .long_after = 50e-3,
                                                   .long_sleep = 10e-3};

/* A round that follows rounds which readied nothing of this rank's pending work
 * goes on with their wait: it starts where they left off (no new spin, sleeps as
 * long as the time already waited allows), so a rank blocked on a late peer does
 * not restart the short sleeps at every idle round of the others (once a second:
 * 500 wake-ups of 100 us each time, most of a blocked rank's CPU). */
static hvdlResult_t wait_round(struct hvdl_negotiator *g, MPI_Request *req) {
  struct hvdl_wait_limits w = round_wait;
  if (g->quiet_since > 0) w.waited_before = hvdl_now() - g->quiet_since;
  if (!req) return hvdl_shm_round_wait(g->data, &w); /* the posted round, through the segment */
  return hvdl_wait_requests(g->data, 1, req, &w);
}

/* ---- the ready list ---------------------------------------------------------- */

struct ready_list {
  struct hvdl_request ***items;
  int *cap;
  int n;
};

static hvdlResult_t ready_push(struct hvdl_negotiator *g, struct ready_list *rl,
                               struct hvdl_request *r) {
  if (rl->n == *rl->cap) {
    int cap = *rl->cap ? *rl->cap * 2 : 64;
    struct hvdl_request **p = realloc(*rl->items, sizeof *p * (size_t)cap);
    if (!p) return hvdl_fail(g->data, hvdlSystemError, "negotiation: out of memory");
    *rl->items = p;
    *rl->cap = cap;
  }
  (*rl->items)[rl->n++] = r;
  r->phase = HVDL_PHASE_FINISHED;
  r->t_ready = hvdl_now();
  return hvdlSuccess;
}

/* A joined rank's stand-in for an allreduce the others run (request.c). */
static hvdlResult_t push_stand_in(struct hvdl_negotiator *g, struct ready_list *rl,
                                  const struct hvdl_desc *d) {
  struct hvdl_request *r = hvdl_request_stand_in(d); /* the engine's only reference */
  if (!r) return hvdl_fail(g->data, hvdlSystemError, "join: out of memory for a stand-in");
  return ready_push(g, rl, r);
}

/* ---- applying a response (every rank) ------------------------------------ */

static struct hvdl_request *find_announced(struct hvdl_request **pending, int np,
                                           const char *name) {
  for (int i = 0; i < np; i++)
    if (pending[i]->phase == HVDL_PHASE_ANNOUNCED && strcmp(pending[i]->desc.name, name) == 0)
      return pending[i];
  return NULL;
}

/* Applies rank 0's response, entry by entry, each read whole and checked before
 * it is applied (every rank reads the same bytes, so a malformed entry stops
 * every rank at the same point, with the same cache). */
static hvdlResult_t apply_response(struct hvdl_negotiator *g, const char *p, size_t len,
                                   struct hvdl_request **pending, int np, int joined_here,
                                   struct ready_list *rl, int *shutdown) {
  struct hvdl_reader rd;
  struct hvdl_resp e;
  hvdl_reader_init(&rd, p, len);
  while (!hvdl_reader_done(&rd)) {
    if (hvdl_resp_get(&rd, g->cache.count, &e))
      return hvdl_reader_fail(g->data, &rd, "response", 0);
    switch (e.kind) {
      case HVDL_RESP_READY: {
        if (e.id >= 0) HVDL_CHECK(hvdl_cache_set(&g->cache, e.id, &e.desc));
        struct hvdl_request *r = find_announced(pending, np, e.desc.name);
        if (r)
          HVDL_CHECK(ready_push(g, rl, r));
        else if (joined_here && e.desc.coll == HVDL_COLL_ALLREDUCE)
          HVDL_CHECK(push_stand_in(g, rl, &e.desc));
        break;
      }
      case HVDL_RESP_ERROR: { /* the ranks' arguments disagree, or one rank's were bad: nothing
                                  was sent, so every rank fails it as an invalid argument */
        struct hvdl_request *r = find_announced(pending, np, e.name);
        if (r) {
          r->phase = HVDL_PHASE_FINISHED;
          hvdl_request_complete(r, hvdlInvalidArgument, e.msg);
        }
        break;
      }
      case HVDL_RESP_EVICT:
        g->cache.entries[e.id].valid = 0;
        for (int i = 0; i < np; i++)
          if (pending[i]->phase == HVDL_PHASE_CACHED && pending[i]->cache_id == e.id) {
            pending[i]->phase = HVDL_PHASE_NEW;
            pending[i]->cache_id = -1;
          }
        break;
      case HVDL_RESP_SHUTDOWN:
        hvdl_requests_mark_dead(g->requests, hvdlRemoteError, e.msg);
        *shutdown = 1;
        break;
    }
  }
  return hvdlSuccess;
}

/* ---- the slow path --------------------------------------------------------- */

/* An MPI call of the slow path: on failure, records it and leaves by `out`. */
#define SLOW_MPI(call)                               \
  do {                                               \
    int mpi_err_ = (call);                           \
    if (mpi_err_ != MPI_SUCCESS) {                   \
      res = hvdl_fail_mpi(g->data, mpi_err_, #call); \
      goto out;                                      \
    }                                                \
  } while (0)

static hvdlResult_t slow_path(struct hvdl_negotiator *g, const uint64_t *all, int words,
                              int cache_n, int anyone_leaving, const unsigned char *joined,
                              struct hvdl_request **pending, int np, struct ready_list *rl,
                              int *shutdown) {
  const int n = g->size;
  hvdlResult_t res = hvdlSuccess;
  struct hvdl_buf mine = {0}, resp = {0};
  MPI_Request req;
  int *counts = calloc((size_t)n * 2, sizeof(int));
  if (!counts) return hvdl_fail(g->data, hvdlSystemError, "negotiation: out of memory");
  int *displs = counts + n;
  /* Every rank reads the same headers, so a bad size fails every rank here alike. */
  size_t total = 0;
  for (int r = 0; r < n; r++) {
    const uint64_t bytes = all[(size_t)r * (size_t)words] >> 32;
    if (bytes > 0x7fffffffu) {
      res = hvdl_fail(g->data, hvdlInternalError,
                      "negotiation: malformed header from rank %d: %llu bytes of descriptors", r,
                      (unsigned long long)bytes);
      goto out;
    }
    counts[r] = (int)bytes;
    displs[r] = (int)total;
    total += bytes;
    if (total > 0x7fffffffu) {
      res =
          hvdl_fail(g->data, hvdlInvalidArgument,
                    "negotiation: ranks 0 to %d announce more than 2 GiB of new names at once", r);
      goto out;
    }
  }
  for (int i = 0; i < np; i++) {
    if (pending[i]->phase != HVDL_PHASE_NEW || pending[i]->desc.coll == HVDL_COLL_JOIN) continue;
    if (hvdl_desc_put(&mine, &pending[i]->desc)) {
      res = hvdl_fail(g->data, hvdlSystemError, "negotiation: out of memory");
      goto out;
    }
    pending[i]->phase = HVDL_PHASE_ANNOUNCED;
    atomic_fetch_add_explicit(&g->stats.announced, 1, memory_order_relaxed);
  }
  if (g->rank == 0) {
    res = hvdl_reserve(g->data, &g->gathered, &g->gathered_bytes, total + 1);
    if (res != hvdlSuccess) goto out;
  }
  SLOW_MPI(MPI_Igatherv(mine.p, (int)mine.len, MPI_BYTE, g->gathered, counts, displs, MPI_BYTE, 0,
                        g->ctrl, &req));
  if ((res = wait_round(g, &req)) != hvdlSuccess) goto out;
  /* Rank 0 writes the whole response, or fails before sending any of it. */
  if (g->rank == 0 &&
      (res = hvdl_coordinate(&g->coord, g->gathered, counts, displs, all, words, cache_n,
                             anyone_leaving, joined, &resp)) != hvdlSuccess)
    goto out;
  if (g->rank == 0 && resp.len > 0x7fffffffu) {
    res = hvdl_fail(
        g->data, hvdlInvalidArgument,
        "negotiation: the response is %zu bytes, over 2 GiB: too many new names at once", resp.len);
    goto out;
  }
  uint64_t len = resp.len;
  SLOW_MPI(MPI_Ibcast(&len, 1, MPI_UINT64_T, 0, g->ctrl, &req));
  if ((res = wait_round(g, &req)) != hvdlSuccess) goto out;
  if (len > 0x7fffffffu) {
    res = hvdl_fail(g->data, hvdlInternalError,
                    "negotiation: malformed response length from rank 0: %llu",
                    (unsigned long long)len);
    goto out;
  }
  if (len > 0) {
    if (g->rank != 0) {
      resp.p = malloc(len);
      if (!resp.p) {
        res = hvdl_fail(g->data, hvdlSystemError, "negotiation: out of memory");
        goto out;
      }
      resp.len = resp.cap = len;
    }
    SLOW_MPI(MPI_Ibcast(resp.p, (int)len, MPI_BYTE, 0, g->ctrl, &req));
    if ((res = wait_round(g, &req)) != hvdlSuccess) goto out;
    res = apply_response(g, resp.p, len, pending, np, joined[g->rank], rl, shutdown);
  }
out:
  free(mine.p);
  free(resp.p);
  free(counts);
  return res;
}

#undef SLOW_MPI

/* ---- the round ------------------------------------------------------------ */

/* JOIN: when every rank has joined, each JOIN request completes with the last
 * rank to join (the latest round; the highest rank among ties). */
static void finish_join(struct hvdl_negotiator *g, struct hvdl_request **pending, int np) {
  int last = 0;
  for (int r = 0; r < g->size; r++)
    if (g->join.round[r] >= g->join.round[last]) last = r;
  for (int r = 0; r < g->size; r++) g->join.round[r] = -1;
  for (int i = 0; i < np; i++)
    if (pending[i]->desc.coll == HVDL_COLL_JOIN && pending[i]->phase != HVDL_PHASE_FINISHED) {
      pending[i]->phase = HVDL_PHASE_FINISHED;
      pending[i]->value = last;
      hvdl_request_complete(pending[i], hvdlSuccess, NULL);
    }
}

hvdlResult_t hvdl_round_post(struct hvdl_negotiator *g, struct hvdl_request **pending, int np,
                             int leaving) {
  const int n = g->size, me = g->rank;
  if (hvdl_fault_hit(g->data->faults, HVDL_FAULT_NEGOTIATE))
    return hvdl_fail(g->data, hvdlSystemError,
                     "injected fault (HVD_LITE_FAULT) in a negotiation round");

  /* A new request matching a cache entry becomes a bit; the others are announced.
   * A JOIN request is neither: it sets this rank's "joined" flag. */
  size_t uncached = 0;
  int joined_here = 0;
  for (int i = 0; i < np; i++) {
    struct hvdl_request *r = pending[i];
    if (r->desc.coll == HVDL_COLL_JOIN) {
      joined_here = 1;
      continue;
    }
    if (r->phase != HVDL_PHASE_NEW) continue;
    int id = hvdl_cache_find(&g->cache, r->desc.name, r->name_hash);
    if (id >= 0 && desc_equal(&g->cache.entries[id].desc, &r->desc)) {
      r->phase = HVDL_PHASE_CACHED;
      r->cache_id = id;
    } else {
      uncached += hvdl_desc_size(&r->desc);
    }
  }
  if (uncached > 0x7fffffffu)
    return hvdl_fail(g->data, hvdlInvalidArgument, "negotiation: too many new names at once");

  const int cache_n = g->cache.count;
  const int words = HVDL_HDR_WORDS + (cache_n + 63) / 64;
  HVDL_CHECK(hvdl_reserve(g->data, &g->vectors, &g->vectors_bytes,
                          sizeof(uint64_t) * (size_t)words * (size_t)(n + 1)));
  uint64_t *all = (uint64_t *)(void *)g->vectors;
  uint64_t *mine = all + (size_t)n * (size_t)words;
  memset(mine, 0, sizeof(uint64_t) * (size_t)words);
  for (int i = 0; i < np; i++)
    if (pending[i]->phase == HVDL_PHASE_CACHED && pending[i]->cache_id < cache_n)
      mine[HVDL_HDR_WORDS + pending[i]->cache_id / 64] |= 1ull << (pending[i]->cache_id % 64);
  const int slow = uncached > 0 || (me == 0 && g->coord.pending_shutdown[0]);
  mine[0] = (leaving ? HVDL_FLAG_LEAVING : 0) | (slow ? HVDL_FLAG_SLOW : 0) |
            (joined_here ? HVDL_FLAG_JOINED : 0) | (g->alarm->sent ? HVDL_FLAG_ALARMED : 0) |
            ((uint64_t)uncached << 32);
  if (me == 0) mine[HVDL_TUNE_WORD] = g->tune_out;

  /* Through the segment or MPI: alike on every rank (same words, same layout). */
  g->posted.shm = hvdl_shm_round_fits(g->data->shm, n, words);
  if (g->posted.shm)
    hvdl_shm_round_post(g->data->shm, mine, words);
  else
    HVDL_MPI(g->data, MPI_Iallgather(mine, words, MPI_UINT64_T, all, words, MPI_UINT64_T, g->ctrl,
                                     &g->posted.req));
  g->posted.words = words;
  g->posted.at = hvdl_now();
  g->posted.cache_n = cache_n;
  return hvdlSuccess;
}

hvdlResult_t hvdl_round_arrived(struct hvdl_negotiator *g, int *arrived) {
  if (g->posted.shm)
    *arrived = hvdl_shm_round_arrived(g->data->shm);
  else
    HVDL_MPI(g->data, MPI_Test(&g->posted.req, arrived, MPI_STATUS_IGNORE));
  return hvdlSuccess;
}

static hvdlResult_t finish_round(struct hvdl_negotiator *g, struct hvdl_request **pending, int np,
                                 int leaving, struct hvdl_request ***ready, int *ready_cap,
                                 int *nready, int *finished) {
  const int n = g->size, me = g->rank;
  const int words = g->posted.words, cache_n = g->posted.cache_n;
  uint64_t *all = (uint64_t *)(void *)g->vectors;
  *nready = 0;
  *finished = 0;
  HVDL_CHECK(wait_round(g, g->posted.shm ? NULL : &g->posted.req));
  if (g->posted.shm) {
    hvdl_shm_round_read(g->data->shm, all, words);
    atomic_fetch_add_explicit(&g->stats.shm_rounds, 1, memory_order_relaxed);
  }

  int any_slow = 0, shutdown = 0, anyone_leaving = 0, njoined = 0, any_alarmed = 0;
  int newly_joined = 0;
  char leavers[256] = "";
  size_t nl = 0;
  /* The round's scratch, kept between rounds: cached requests by id, then two flags a rank. */
  const size_t by_id_bytes = sizeof(struct hvdl_request *) * ((size_t)cache_n + 1);
  HVDL_CHECK(hvdl_reserve(g->data, &g->scratch, &g->scratch_bytes, by_id_bytes + (size_t)n * 2));
  memset(g->scratch, 0, by_id_bytes + (size_t)n * 2);
  struct hvdl_request **by_id = (struct hvdl_request **)(void *)g->scratch;
  unsigned char *joined = (unsigned char *)g->scratch + by_id_bytes;
  unsigned char *alarmed = joined + n;
  g->round_no++;
  g->tune_in = all[HVDL_TUNE_WORD];
  atomic_fetch_add_explicit(&g->stats.rounds, 1, memory_order_relaxed);
  for (int r = 0; r < n; r++) {
    uint64_t h = all[(size_t)r * (size_t)words];
    any_slow |= (h & HVDL_FLAG_SLOW) != 0;
    anyone_leaving |= (h & HVDL_FLAG_LEAVING) != 0;
    joined[r] = (h & HVDL_FLAG_JOINED) != 0;
    alarmed[r] = (h & HVDL_FLAG_ALARMED) != 0;
    any_alarmed |= alarmed[r];
    njoined += joined[r];
    if (joined[r] && g->join.round[r] < 0) {
      g->join.round[r] = (int)g->round_no;
      newly_joined = 1;
    }
    if ((h & HVDL_FLAG_LEAVING) && r != me && nl + 16 < sizeof leavers)
      nl += (size_t)snprintf(leavers + nl, sizeof leavers - nl, nl ? ", %d" : "%d", r);
  }

  struct ready_list rl = {ready, ready_cap, 0};
  hvdlResult_t res = hvdlSuccess;
  if (any_alarmed) { /* a data phase failed since the last round: every rank starts afresh */
    res = hvdl_alarm_settle(g->alarm, alarmed);
    if (res == hvdlSuccess) res = hvdl_comm_renew(g->data, g->ctrl);
  }
  /* A rank that joins changes what the coordinator's table waits for: a name announced
   * by the others in an earlier round waits for it no more, so the table is looked at
   * again (every rank reads the same flags, so every rank takes the slow path). */
  if ((any_slow || newly_joined) && res == hvdlSuccess) {
    atomic_fetch_add_explicit(&g->stats.slow_rounds, 1, memory_order_relaxed);
    res = slow_path(g, all, words, cache_n, anyone_leaving, joined, pending, np, &rl, &shutdown);
  }
  if (res != hvdlSuccess || shutdown) {
    *finished = shutdown;
    *nready = rl.n;
    return res; /* a shutdown is the same response on every rank: nobody executes anything */
  }

  /* Cached entries ready everywhere, by ascending id, so in the same order on every
   * rank. With joined ranks, an allreduce needs only the others' bits (the joined
   * ranks run a stand-in in its place); anything else needs every rank, so it goes
   * back to the coordinator, which reports it. */
  for (int i = 0; i < np && res == hvdlSuccess; i++)
    if (pending[i]->phase == HVDL_PHASE_CACHED && pending[i]->cache_id < cache_n)
      by_id[pending[i]->cache_id] = pending[i];
  for (int id = 0; id < cache_n && res == hvdlSuccess && !anyone_leaving; id++) {
    if (!g->cache.entries[id].valid) continue;
    const int allreduce = g->cache.entries[id].desc.coll == HVDL_COLL_ALLREDUCE;
    int everywhere = 1, some = 0;
    for (int q = 0; q < n && everywhere; q++) {
      int on = hvdl_bit_on(all, words, q, id);
      some |= on;
      everywhere = on || (joined[q] && allreduce);
    }
    if (!everywhere || !some) continue;
    if (by_id[id]) {
      res = ready_push(g, &rl, by_id[id]);
      atomic_fetch_add_explicit(&g->stats.cached_ready, 1, memory_order_relaxed);
    } else if (joined[me])
      res = push_stand_in(g, &rl, &g->cache.entries[id].desc);
  }
  if (njoined > 0)
    for (int i = 0; i < np; i++)
      if (pending[i]->phase == HVDL_PHASE_CACHED && pending[i]->desc.coll != HVDL_COLL_ALLREDUCE) {
        pending[i]->phase = HVDL_PHASE_NEW;
        pending[i]->cache_id = -1;
      }
  if (res != hvdlSuccess) {
    *nready = rl.n;
    return res;
  }
  if (njoined == n) finish_join(g, pending, np);

  if (me == 0) hvdl_stall_inspect(&g->coord, all, words, cache_n);

  if (leaving) {
    *finished = 1;
  } else if (nl > 0) {
    char msg[HVDL_ERRMSG_LEN];
    snprintf(msg, sizeof msg,
             "hvd_lite has been shut down on rank %s (hvd_lite.shutdown(), the end of its script, "
             "or an exception there), so collectives that need it cannot complete",
             leavers);
    hvdl_requests_mark_dead(g->requests, hvdlRemoteError, msg);
    *finished = 1;
  }
  *nready = rl.n;
  return hvdlSuccess;
}

hvdlResult_t hvdl_round_finish(struct hvdl_negotiator *g, struct hvdl_request **pending, int np,
                               int leaving, struct hvdl_request ***ready, int *ready_cap,
                               int *nready, int *finished) {
  const double posted_at = g->posted.at;
  hvdlResult_t res = finish_round(g, pending, np, leaving, ready, ready_cap, nready, finished);
  if (res != hvdlSuccess || *nready > 0 || np == 0)
    g->quiet_since = 0;
  else if (g->quiet_since == 0)
    g->quiet_since = posted_at;
  return res;
}

hvdlResult_t hvdl_round(struct hvdl_negotiator *g, struct hvdl_request **pending, int np,
                        int leaving, struct hvdl_request ***ready, int *ready_cap, int *nready,
                        int *finished) {
  *nready = 0;
  *finished = 0;
  HVDL_CHECK(hvdl_round_post(g, pending, np, leaving));
  return hvdl_round_finish(g, pending, np, leaving, ready, ready_cap, nready, finished);
}

hvdlResult_t hvdl_negotiator_init(struct hvdl_negotiator *g, hvdlComm_t data, MPI_Comm ctrl,
                                  struct hvdl_requests *requests, struct hvdl_alarm *alarm,
                                  const struct hvdl_engine_config *cfg) {
  memset(g, 0, sizeof *g);
  g->alarm = alarm;
  g->data = data;
  g->ctrl = ctrl;
  g->rank = data->rank;
  g->size = data->size;
  g->requests = requests;
  g->cache.comm = data;
  g->cache.capacity = cfg->cache_capacity;
  g->coord.comm = data;
  g->coord.size = data->size;
  g->coord.cache = &g->cache;
  g->coord.stall_check_s = cfg->stall_check_s;
  g->coord.stall_shutdown_s = cfg->stall_shutdown_s;
  g->coord.log_level = cfg->log_level;
  g->join.round = malloc(sizeof *g->join.round * (size_t)g->size);
  if (!g->join.round) return hvdl_fail(NULL, hvdlSystemError, "hvd_lite engine: out of memory");
  for (int i = 0; i < g->size; i++) g->join.round[i] = -1;
  return hvdlSuccess;
}

void hvdl_negotiator_free(struct hvdl_negotiator *g) {
  hvdl_coordinator_free(&g->coord);
  hvdl_cache_free(&g->cache);
  free(g->join.round);
  free(g->gathered);
  free(g->vectors);
  free(g->scratch);
  g->join.round = NULL;
  g->gathered = g->vectors = g->scratch = NULL;
}
