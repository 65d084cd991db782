/*
 * negotiate.c -- one negotiation round: which requests are ready on every rank,
 * in what order, and which are in error.
 *
 * A round is collective over the engine's control communicator:
 *
 *   1. MPI_Iallgather of each rank's contribution: two header words (flags:
 *      leaving, wants the slow path; the byte size of its uncached descriptors)
 *      and a bit vector with bit k set when a request matching cache entry k
 *      is pending here. Steady-state training takes only this step: no names.
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
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

#define HDR_WORDS 2
#define FLAG_LEAVING 1ull
#define FLAG_SLOW 2ull
#define FLAG_JOINED 4ull
#define ROUND_SPIN_SECONDS 20e-6
/* Sleeps between polls grow to 100 us, and to 10 ms once a round has waited 50 ms
 * (a peer that is late by that much is idle or busy elsewhere). With 1 ms, a peer
 * 0.5 ms late was answered up to 1 ms later (docs/benchmarks.md, profiling). */
#define ROUND_MAX_SLEEP 100e-6
#define ROUND_LONG_WAIT 50e-3
#define ROUND_LONG_SLEEP 10e-3

enum { RESP_READY = 1, RESP_ERROR = 2, RESP_EVICT = 3, RESP_SHUTDOWN = 4 };
enum { PHASE_FINISHED = -1 };

/* ---- growable byte buffer ------------------------------------------------ */

struct buf {
  char *p;
  size_t len, cap;
};

static int buf_put(struct buf *b, const void *src, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
  return 0;
}

static int buf_put_u32(struct buf *b, uint32_t v) { return buf_put(b, &v, sizeof v); }

static int buf_put_str(struct buf *b, const char *s) {
  uint32_t n = (uint32_t)strlen(s);
  return buf_put_u32(b, n) || buf_put(b, s, n);
}

/* ---- descriptors on the wire --------------------------------------------- */

struct wire_fixed {
  int32_t coll, dtype, op, ndim, root, pad;
  double prescale, postscale;
};

static int desc_put(struct buf *b, const struct hvdl_desc *d) {
  struct wire_fixed f = {d->coll, d->dtype, d->op, d->ndim, d->root, 0, d->prescale, d->postscale};
  return buf_put(b, &f, sizeof f) || buf_put(b, d->dims, sizeof(int64_t) * (size_t)d->ndim) ||
         buf_put_str(b, d->name) || buf_put_str(b, d->error);
}

static size_t desc_size(const struct hvdl_desc *d) {
  return sizeof(struct wire_fixed) + sizeof(int64_t) * (size_t)d->ndim + 8 + strlen(d->name) +
         strlen(d->error);
}

static const char *desc_get(const char *p, struct hvdl_desc *d) {
  struct wire_fixed f;
  memcpy(&f, p, sizeof f);
  p += sizeof f;
  memset(d, 0, sizeof *d);
  d->coll = f.coll;
  d->dtype = f.dtype;
  d->op = f.op;
  d->ndim = f.ndim;
  d->root = f.root;
  d->prescale = f.prescale;
  d->postscale = f.postscale;
  memcpy(d->dims, p, sizeof(int64_t) * (size_t)f.ndim);
  p += sizeof(int64_t) * (size_t)f.ndim;
  uint32_t n;
  memcpy(&n, p, 4);
  p += 4;
  memcpy(d->name, p, n < HVDL_MAX_NAME ? n : HVDL_MAX_NAME - 1);
  p += n;
  memcpy(&n, p, 4);
  p += 4;
  memcpy(d->error, p, n < sizeof d->error ? n : sizeof d->error - 1);
  return p + n;
}

static const char *get_u32(const char *p, uint32_t *v) {
  memcpy(v, p, 4);
  return p + 4;
}

static const char *get_str(const char *p, char *out, size_t cap) {
  uint32_t n;
  p = get_u32(p, &n);
  size_t k = n < cap ? n : cap - 1;
  memcpy(out, p, k);
  out[k] = '\0';
  return p + n;
}

static int desc_equal(const struct hvdl_desc *a, const struct hvdl_desc *b) {
  if (a->coll != b->coll || a->dtype != b->dtype || a->op != b->op || a->ndim != b->ndim ||
      a->root != b->root || a->prescale != b->prescale || a->postscale != b->postscale)
    return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return strcmp(a->name, b->name) == 0 && strcmp(a->error, b->error) == 0;
}

static const char *coll_name(int c) {
  static const char *names[HVDL_NUM_COLLS] = {"ALLREDUCE", "ALLGATHER", "BROADCAST",
                                               "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN"};
  return c >= 0 && c < HVDL_NUM_COLLS ? names[c] : "UNKNOWN";
}

/* [17, 17]; a first dimension that may differ per rank (-1 here) shows as '*'. */
static void shape_str(const struct hvdl_desc *d, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int i = 0; i < d->ndim && n < cap; i++) {
    if (d->dims[i] < 0)
      n += (size_t)snprintf(out + n, cap - n, i ? ", *" : "*");
    else
      n += (size_t)snprintf(out + n, cap - n, i ? ", %lld" : "%lld", (long long)d->dims[i]);
  }
  if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Writes the first difference between two ranks' descriptors; 0 if none. */
static int mismatch(const struct hvdl_desc *a, int ra, const struct hvdl_desc *b, int rb,
                    char *msg, size_t cap) {
  char x[256], y[256];
  const char *what = NULL;
  if (a->coll != b->coll) {
    snprintf(msg, cap,
             "Mismatched collective operations: one rank sent %s, another sent %s "
             "(tensor '%s'; ranks %d and %d)",
             coll_name(a->coll), coll_name(b->coll), a->name, ra, rb);
    return 1;
  }
  if (a->dtype != b->dtype) {
    what = "data types";
    snprintf(x, sizeof x, "%s", hvdl_type_name((hvdlDataType_t)a->dtype));
    snprintf(y, sizeof y, "%s", hvdl_type_name((hvdlDataType_t)b->dtype));
  } else if (a->ndim != b->ndim || memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->ndim)) {
    what = "tensor shapes";
    shape_str(a, x, sizeof x);
    shape_str(b, y, sizeof y);
  } else if (a->root != b->root) {
    what = "root ranks";
    snprintf(x, sizeof x, "%d", a->root);
    snprintf(y, sizeof y, "%d", b->root);
  } else if (a->op != b->op) {
    what = "reduction ops";
    snprintf(x, sizeof x, "%s", hvdl_op_name((hvdlRedOp_t)a->op));
    snprintf(y, sizeof y, "%s", hvdl_op_name((hvdlRedOp_t)b->op));
  } else if (a->prescale != b->prescale) {
    what = "prescale factors";
    snprintf(x, sizeof x, "%g", a->prescale);
    snprintf(y, sizeof y, "%g", b->prescale);
  } else if (a->postscale != b->postscale) {
    what = "postscale factors";
    snprintf(x, sizeof x, "%g", a->postscale);
    snprintf(y, sizeof y, "%g", b->postscale);
  } else {
    return 0;
  }
  snprintf(msg, cap, "Mismatched %s %s: one rank sent %s, another sent %s (tensor '%s'; ranks %d and %d)",
           coll_name(a->coll), what, x, y, a->name, ra, rb);
  return 1;
}

/* ---- waiting ------------------------------------------------------------- */

/* Polls a round's requests: a short spin, then growing sleeps. */
static hvdlResult_t wait_round(struct hvdl_engine *e, int n, MPI_Request *reqs) {
  const double start = hvdl_now();
  double sleep = 1e-6;
  for (;;) {
    int done = 0;
    HVDL_MPI(e->data, MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return hvdlSuccess;
    const double waited = hvdl_now() - start;
    if (waited < ROUND_SPIN_SECONDS) continue;
    struct timespec ts = {0, (long)(sleep * 1e9)};
    nanosleep(&ts, NULL);
    const double cap = waited < ROUND_LONG_WAIT ? ROUND_MAX_SLEEP : ROUND_LONG_SLEEP;
    sleep = sleep * 2 < cap ? sleep * 2 : cap;
  }
}

/* ---- the response cache -------------------------------------------------- */

/* The cache index: open addressing on the name hash, linear probing. A slot keeps
 * the id it was given even after that entry is dropped or reused for another name
 * (lookups check the name), so the index is rebuilt from the valid entries when
 * half of its slots are taken. A step of N new requests costs N lookups, not N^2/2
 * name comparisons (50 us of a ResNet-50 step at 161 tensors). */
static int cache_find(const struct hvdl_engine *e, const char *name, uint64_t hash) {
  if (!e->cache_slot_cap) return -1;
  const size_t mask = (size_t)e->cache_slot_cap - 1;
  for (size_t s = hash & mask;; s = (s + 1) & mask) {
    const int id = e->cache_slots[s];
    if (id < 0) return -1;
    const struct hvdl_cache_entry *c = &e->cache[id];
    if (c->valid && c->hash == hash && strcmp(c->desc.name, name) == 0) return id;
  }
}

static void index_put(struct hvdl_engine *e, int id) {
  const size_t mask = (size_t)e->cache_slot_cap - 1;
  size_t s = e->cache[id].hash & mask;
  while (e->cache_slots[s] >= 0) s = (s + 1) & mask;
  e->cache_slots[s] = id;
  e->cache_slot_used++;
}

/* Makes room for one more slot, rebuilding the index from the valid entries when
 * it is half full. */
static hvdlResult_t index_reserve(struct hvdl_engine *e) {
  if (2 * (e->cache_slot_used + 1) <= e->cache_slot_cap) return hvdlSuccess;
  int valid = 0;
  for (int i = 0; i < e->cache_count; i++) valid += e->cache[i].valid;
  int cap = 64;
  while (cap < 4 * (valid + 1)) cap *= 2;
  int *slots = malloc(sizeof *slots * (size_t)cap);
  if (!slots) return hvdl_fail(e->data, hvdlSystemError, "response cache: out of memory");
  for (int i = 0; i < cap; i++) slots[i] = -1;
  free(e->cache_slots);
  e->cache_slots = slots;
  e->cache_slot_cap = cap;
  e->cache_slot_used = 0;
  for (int i = 0; i < e->cache_count; i++)
    if (e->cache[i].valid) index_put(e, i);
  return hvdlSuccess;
}

static hvdlResult_t cache_set(struct hvdl_engine *e, int id, const struct hvdl_desc *d) {
  if (id >= e->cache_cap) {
    int cap = e->cache_cap ? e->cache_cap * 2 : 64;
    while (cap <= id) cap *= 2;
    struct hvdl_cache_entry *c = realloc(e->cache, sizeof *c * (size_t)cap);
    if (!c) return hvdl_fail(e->data, hvdlSystemError, "response cache: out of memory");
    memset(c + e->cache_cap, 0, sizeof *c * (size_t)(cap - e->cache_cap));
    e->cache = c;
    e->cache_cap = cap;
  }
  HVDL_CHECK(index_reserve(e));
  if (id >= e->cache_count) e->cache_count = id + 1;
  struct hvdl_cache_entry *c = &e->cache[id];
  c->valid = 1;
  c->desc = *d;
  c->hash = hvdl_name_hash(d->name);
  index_put(e, id);
  c->pending_since = 0;
  c->warned = 0;
  return hvdlSuccess;
}

static int bit_on(const uint64_t *all, int words, int rank, int id) {
  return (int)((all[(size_t)rank * (size_t)words + HDR_WORDS + (size_t)(id / 64)] >> (id % 64)) & 1u);
}

/* Coordinator: a cache id for a newly ready name (evicting one pending nowhere if
 * the cache is full), or -1 for "do not cache". */
static int alloc_cache_id(struct hvdl_engine *e, const uint64_t *all, int words, int cache_n,
                          const unsigned char *fresh, struct buf *resp) {
  if (e->cfg.cache_capacity == 0) return -1;
  for (int i = 0; i < e->cache_count; i++)
    if (!e->cache[i].valid) return i;
  if ((size_t)e->cache_count < e->cfg.cache_capacity) return e->cache_count;
  for (int i = 0; i < cache_n; i++) {
    if (fresh[i]) continue;
    int anywhere = 0;
    for (int r = 0; r < e->size && !anywhere; r++) anywhere = bit_on(all, words, r, i);
    if (!anywhere) {
      e->cache[i].valid = 0;
      buf_put_u32(resp, RESP_EVICT);
      buf_put_u32(resp, (uint32_t)i);
      return i;
    }
  }
  return -1;
}

/* ---- the coordinator's table (rank 0) ------------------------------------ */

static void table_free_entry(struct hvdl_table_entry *t) {
  free(t->descs);
  free(t->have);
}

static void table_remove(struct hvdl_engine *e, int i) {
  table_free_entry(&e->table[i]);
  memmove(&e->table[i], &e->table[i + 1], sizeof *e->table * (size_t)(e->table_count - i - 1));
  e->table_count--;
}

/* The name an entry is filed under (the first rank that announced it). */
static const char *table_name(const struct hvdl_engine *e, const struct hvdl_table_entry *t) {
  for (int r = 0; r < e->size; r++)
    if (t->have[r]) return t->descs[r].name;
  return "";
}

static int table_lookup(const struct hvdl_engine *e, const char *name) {
  for (int i = 0; i < e->table_count; i++)
    if (strcmp(table_name(e, &e->table[i]), name) == 0) return i;
  return -1;
}

static hvdlResult_t table_add(struct hvdl_engine *e, int *index) {
  if (e->table_count == e->table_cap) {
    int cap = e->table_cap ? e->table_cap * 2 : 64;
    struct hvdl_table_entry *t = realloc(e->table, sizeof *t * (size_t)cap);
    if (!t) return hvdl_fail(e->data, hvdlSystemError, "coordinator table: out of memory");
    e->table = t;
    e->table_cap = cap;
  }
  struct hvdl_table_entry *t = &e->table[e->table_count];
  memset(t, 0, sizeof *t);
  t->descs = calloc((size_t)e->size, sizeof *t->descs);
  t->have = calloc((size_t)e->size, 1);
  if (!t->descs || !t->have) {
    table_free_entry(t);
    return hvdl_fail(e->data, hvdlSystemError, "coordinator table: out of memory");
  }
  t->first_seen = hvdl_now();
  *index = e->table_count++;
  return hvdlSuccess;
}

/* Rank 0: files the gathered descriptors and writes the response. */
static hvdlResult_t coordinate(struct hvdl_engine *e, const char *gathered, const int *counts,
                               const int *displs, const uint64_t *all, int words, int cache_n,
                               int anyone_leaving, const unsigned char *joined, struct buf *resp) {
  const int n = e->size;
  unsigned char *fresh = calloc((size_t)(e->cache_count + 1 > cache_n ? e->cache_count + 1 : cache_n) + 1, 1);
  if (!fresh) return hvdl_fail(e->data, hvdlSystemError, "coordinator: out of memory");
  size_t fresh_len = (size_t)(e->cache_count + 1 > cache_n ? e->cache_count + 1 : cache_n) + 1;
  struct hvdl_desc d;
  for (int r = 0; r < n; r++) {
    const char *p = gathered + displs[r], *end = p + counts[r];
    while (p < end) {
      p = desc_get(p, &d);
      int id = cache_find(e, d.name, hvdl_name_hash(d.name));
      if (id >= 0) { /* its metadata changed on rank r: every rank drops the entry */
        e->cache[id].valid = 0;
        buf_put_u32(resp, RESP_EVICT);
        buf_put_u32(resp, (uint32_t)id);
      }
      int t = table_lookup(e, d.name);
      if (t < 0) {
        hvdlResult_t res = table_add(e, &t);
        if (res != hvdlSuccess) {
          free(fresh);
          return res;
        }
      }
      struct hvdl_table_entry *te = &e->table[t];
      te->descs[r] = d;
      if (!te->have[r]) {
        te->have[r] = 1;
        te->nhave++;
      }
    }
  }
  for (int i = 0; i < e->table_count;) {
    struct hvdl_table_entry *te = &e->table[i];
    /* Ready when every rank that has not joined announced it. A rank that leaves
     * in this round executes nothing more: then nothing becomes ready. */
    int complete = te->nhave > 0, first = -1;
    for (int r = 0; r < n; r++) {
      complete &= te->have[r] || joined[r];
      if (te->have[r] && first < 0) first = r;
    }
    if (!complete || anyone_leaving) {
      i++;
      continue;
    }
    const struct hvdl_desc *ref = &te->descs[first];
    char msg[HVDL_ERRMSG_LEN];
    int bad = 0;
    for (int r = 0; r < n && !bad; r++)
      if (te->have[r] && te->descs[r].error[0]) {
        snprintf(msg, sizeof msg, "%s (on rank %d)", te->descs[r].error, r);
        bad = 1;
      }
    for (int r = first + 1; r < n && !bad; r++)
      if (te->have[r]) bad = mismatch(ref, first, &te->descs[r], r, msg, sizeof msg);
    if (!bad && ref->coll == HVDL_COLL_BROADCAST && (ref->root < 0 || ref->root >= n)) {
      snprintf(msg, sizeof msg, "BROADCAST root rank %d is out of range for %d ranks (tensor '%s')",
               ref->root, n, ref->name);
      bad = 1;
    }
    if (!bad && ref->coll != HVDL_COLL_ALLREDUCE && te->nhave < n) {
      char who[256];
      size_t k = 0;
      who[0] = '\0';
      for (int r = 0; r < n && k + 16 < sizeof who; r++)
        if (joined[r]) k += (size_t)snprintf(who + k, sizeof who - k, k ? ", %d" : "%d", r);
      snprintf(msg, sizeof msg,
               "%s '%s' cannot run while rank %s has joined (hvd_lite.join): only allreduce "
               "continues with joined ranks, which contribute zeros",
               coll_name(ref->coll), ref->name, who);
      bad = 1;
    }
    if (bad) {
      buf_put_u32(resp, RESP_ERROR);
      buf_put_str(resp, ref->name);
      buf_put_str(resp, msg);
    } else {
      int id = alloc_cache_id(e, all, words, cache_n, fresh, resp);
      if (id >= 0) {
        hvdlResult_t res = cache_set(e, id, ref);
        if (res != hvdlSuccess) {
          free(fresh);
          return res;
        }
        if ((size_t)id < fresh_len) fresh[id] = 1;
      }
      buf_put_u32(resp, RESP_READY);
      buf_put_u32(resp, (uint32_t)id);
      desc_put(resp, ref);
    }
    table_remove(e, i);
  }
  if (e->pending_shutdown[0]) {
    buf_put_u32(resp, RESP_SHUTDOWN);
    buf_put_str(resp, e->pending_shutdown);
    e->pending_shutdown[0] = '\0';
  }
  free(fresh);
  return hvdlSuccess;
}

/* ---- the ready list ---------------------------------------------------------- */

struct ready_list {
  struct hvdl_request ***items;
  int *cap;
  int n;
};

static hvdlResult_t ready_push(struct hvdl_engine *e, struct ready_list *rl, struct hvdl_request *r) {
  if (rl->n == *rl->cap) {
    int cap = *rl->cap ? *rl->cap * 2 : 64;
    struct hvdl_request **p = realloc(*rl->items, sizeof *p * (size_t)cap);
    if (!p) return hvdl_fail(e->data, hvdlSystemError, "negotiation: out of memory");
    *rl->items = p;
    *rl->cap = cap;
  }
  (*rl->items)[rl->n++] = r;
  r->phase = PHASE_FINISHED;
  r->t_ready = hvdl_now();
  return hvdlSuccess;
}

/* A joined rank's stand-in for an allreduce the others run: zeros in, scratch out. */
static hvdlResult_t push_stand_in(struct hvdl_engine *e, struct ready_list *rl,
                                  const struct hvdl_desc *d) {
  struct hvdl_request *r = calloc(1, sizeof *r);
  size_t count = 1;
  for (int i = 0; i < d->ndim; i++) count *= (size_t)d->dims[i];
  const size_t bytes = count * hvdl_type_size((hvdlDataType_t)d->dtype);
  if (r) {
    r->zeros = calloc(bytes ? bytes : 1, 1);
    r->out = malloc(bytes ? bytes : 1);
  }
  if (!r || !r->zeros || !r->out) {
    if (r) {
      free(r->zeros);
      free(r->out);
    }
    free(r);
    return hvdl_fail(e->data, hvdlSystemError, "join: out of memory for a stand-in");
  }
  r->desc = *d;
  r->send = r->zeros;
  r->recv = r->out;
  r->count = count;
  r->nbytes = bytes;
  atomic_init(&r->refs, 1); /* the engine's only */
  atomic_init(&r->state, HVDL_REQ_PENDING);
  r->t_submit = hvdl_now();
  return ready_push(e, rl, r);
}

/* ---- applying a response (every rank) ------------------------------------ */

static struct hvdl_request *find_announced(struct hvdl_request **pending, int np, const char *name) {
  for (int i = 0; i < np; i++)
    if (pending[i]->phase == HVDL_PHASE_ANNOUNCED && strcmp(pending[i]->desc.name, name) == 0)
      return pending[i];
  return NULL;
}

static hvdlResult_t apply_response(struct hvdl_engine *e, const char *p, size_t len,
                                   struct hvdl_request **pending, int np, int joined_here,
                                   struct ready_list *rl, int *shutdown) {
  const char *end = p + len;
  struct hvdl_desc d;
  char name[HVDL_MAX_NAME], msg[HVDL_ERRMSG_LEN];
  while (p < end) {
    uint32_t kind, id;
    p = get_u32(p, &kind);
    switch (kind) {
      case RESP_READY: {
        p = get_u32(p, &id);
        p = desc_get(p, &d);
        if ((int32_t)id >= 0) HVDL_CHECK(cache_set(e, (int)id, &d));
        struct hvdl_request *r = find_announced(pending, np, d.name);
        if (r)
          HVDL_CHECK(ready_push(e, rl, r));
        else if (joined_here && d.coll == HVDL_COLL_ALLREDUCE)
          HVDL_CHECK(push_stand_in(e, rl, &d));
        break;
      }
      case RESP_ERROR: {
        p = get_str(p, name, sizeof name);
        p = get_str(p, msg, sizeof msg);
        struct hvdl_request *r = find_announced(pending, np, name);
        if (r) {
          r->phase = PHASE_FINISHED;
          hvdl_engine_complete(e, r, hvdlInvalidUsage, msg);
        }
        break;
      }
      case RESP_EVICT:
        p = get_u32(p, &id);
        if ((int)id < e->cache_count) e->cache[id].valid = 0;
        for (int i = 0; i < np; i++)
          if (pending[i]->phase == HVDL_PHASE_CACHED && pending[i]->cache_id == (int)id) {
            pending[i]->phase = HVDL_PHASE_NEW;
            pending[i]->cache_id = -1;
          }
        break;
      case RESP_SHUTDOWN:
        p = get_str(p, msg, sizeof msg);
        hvdl_engine_mark_dead(e, hvdlRemoteError, msg);
        *shutdown = 1;
        break;
      default:
        return hvdl_fail(e->data, hvdlInternalError, "negotiation: unknown response kind %u", kind);
    }
  }
  return hvdlSuccess;
}

/* ---- the slow path --------------------------------------------------------- */

static hvdlResult_t slow_path(struct hvdl_engine *e, const uint64_t *all, int words, int cache_n,
                              int anyone_leaving, const unsigned char *joined,
                              struct hvdl_request **pending, int np, struct ready_list *rl,
                              int *shutdown) {
  const int n = e->size;
  hvdlResult_t res = hvdlSuccess;
  struct buf mine = {0}, resp = {0};
  int *counts = calloc((size_t)n * 2, sizeof(int));
  if (!counts) return hvdl_fail(e->data, hvdlSystemError, "negotiation: out of memory");
  int *displs = counts + n;
  for (int i = 0; i < np; i++) {
    if (pending[i]->phase != HVDL_PHASE_NEW || pending[i]->desc.coll == HVDL_COLL_JOIN) continue;
    if (desc_put(&mine, &pending[i]->desc)) {
      res = hvdl_fail(e->data, hvdlSystemError, "negotiation: out of memory");
      goto out;
    }
    pending[i]->phase = HVDL_PHASE_ANNOUNCED;
  }
  size_t total = 0;
  for (int r = 0; r < n; r++) {
    counts[r] = (int)(all[(size_t)r * (size_t)words] >> 32);
    displs[r] = (int)total;
    total += (size_t)counts[r];
  }
  if (e->rank == 0) {
    res = hvdl_reserve(e->data, &e->wire, &e->wire_bytes, total + 1);
    if (res != hvdlSuccess) goto out;
  }
  MPI_Request req;
  HVDL_MPI(e->data, MPI_Igatherv(mine.p, (int)mine.len, MPI_BYTE, e->wire, counts, displs,
                                 MPI_BYTE, 0, e->ctrl, &req));
  if ((res = wait_round(e, 1, &req)) != hvdlSuccess) goto out;
  if (e->rank == 0 &&
      (res = coordinate(e, e->wire, counts, displs, all, words, cache_n, anyone_leaving, joined,
                        &resp)) != hvdlSuccess)
    goto out;
  uint64_t len = resp.len;
  HVDL_MPI(e->data, MPI_Ibcast(&len, 1, MPI_UINT64_T, 0, e->ctrl, &req));
  if ((res = wait_round(e, 1, &req)) != hvdlSuccess) goto out;
  if (len > 0) {
    if (e->rank != 0) {
      resp.p = malloc(len);
      if (!resp.p) {
        res = hvdl_fail(e->data, hvdlSystemError, "negotiation: out of memory");
        goto out;
      }
      resp.len = resp.cap = len;
    }
    HVDL_MPI(e->data, MPI_Ibcast(resp.p, (int)len, MPI_BYTE, 0, e->ctrl, &req));
    if ((res = wait_round(e, 1, &req)) != hvdlSuccess) goto out;
    res = apply_response(e, resp.p, len, pending, np, joined[e->rank], rl, shutdown);
  }
out:
  free(mine.p);
  free(resp.p);
  free(counts);
  return res;
}

/* ---- the stall inspector (rank 0) ----------------------------------------- */

static size_t missing_ranks(const struct hvdl_engine *e, const uint64_t *all, int words, int id,
                            const unsigned char *have, char *out, size_t cap) {
  size_t k = 0;
  out[0] = '\0';
  for (int r = 0; r < e->size && k + 16 < cap; r++) {
    int present = have ? have[r] : bit_on(all, words, r, id);
    if (!present) k += (size_t)snprintf(out + k, cap - k, k ? ", %d" : "%d", r);
  }
  return k;
}

static void stall_note(struct hvdl_engine *e, const char *name, const char *missing, double age,
                       int *warned, struct buf *warn) {
  char line[HVDL_MAX_NAME + 128];
  if (e->cfg.stall_check_s > 0 && age > e->cfg.stall_check_s && !*warned) {
    snprintf(line, sizeof line, "\n  '%s' (%.0f s; missing ranks: %s)", name, age, missing);
    buf_put(warn, line, strlen(line));
    *warned = 1;
  }
  if (e->cfg.stall_shutdown_s > 0 && age > e->cfg.stall_shutdown_s && !e->pending_shutdown[0])
    snprintf(e->pending_shutdown, sizeof e->pending_shutdown,
             "hvd_lite stalled: '%s' was submitted by some ranks but not by ranks %s for %.0f s "
             "(HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS=%g); shutting down on every rank",
             name, missing, age, e->cfg.stall_shutdown_s);
}

static void stall_inspect(struct hvdl_engine *e, const uint64_t *all, int words, int cache_n) {
  if (e->cfg.stall_check_s <= 0 && e->cfg.stall_shutdown_s <= 0) return;
  const double now = hvdl_now();
  struct buf warn = {0};
  char missing[512];
  for (int id = 0; id < cache_n; id++) {
    struct hvdl_cache_entry *c = &e->cache[id];
    if (!c->valid) continue;
    int cnt = 0;
    for (int r = 0; r < e->size; r++) cnt += bit_on(all, words, r, id);
    if (cnt == 0 || cnt == e->size) {
      c->pending_since = 0;
      c->warned = 0;
      continue;
    }
    if (c->pending_since == 0) c->pending_since = now;
    missing_ranks(e, all, words, id, NULL, missing, sizeof missing);
    stall_note(e, c->desc.name, missing, now - c->pending_since, &c->warned, &warn);
  }
  for (int i = 0; i < e->table_count; i++) {
    struct hvdl_table_entry *t = &e->table[i];
    missing_ranks(e, all, words, 0, t->have, missing, sizeof missing);
    stall_note(e, table_name(e, t), missing, now - t->first_seen, &t->warned, &warn);
  }
  if (warn.len && e->cfg.log_level <= HVDL_LOG_WARNING) {
    fprintf(stderr,
            "hvd_lite: stall warning (rank 0): these collectives have been submitted by some "
            "ranks but not by others for more than %g s (HVD_LITE_STALL_CHECK_TIME_SECONDS):%.*s\n",
            e->cfg.stall_check_s, (int)warn.len, warn.p);
    fflush(stderr);
  }
  free(warn.p);
}

/* ---- the round ------------------------------------------------------------ */

static int by_cache_id(const void *a, const void *b) {
  const struct hvdl_request *x = *(struct hvdl_request *const *)a;
  const struct hvdl_request *y = *(struct hvdl_request *const *)b;
  return (x->cache_id > y->cache_id) - (x->cache_id < y->cache_id);
}

/* JOIN: when every rank has joined, each JOIN request completes with the last
 * rank to join (the latest round; the highest rank among ties). */
static void finish_join(struct hvdl_engine *e, struct hvdl_request **pending, int np) {
  int last = 0;
  for (int r = 0; r < e->size; r++)
    if (e->join_round[r] >= e->join_round[last]) last = r;
  for (int r = 0; r < e->size; r++) e->join_round[r] = -1;
  for (int i = 0; i < np; i++)
    if (pending[i]->desc.coll == HVDL_COLL_JOIN && pending[i]->phase != PHASE_FINISHED) {
      pending[i]->phase = PHASE_FINISHED;
      pending[i]->value = last;
      hvdl_engine_complete(e, pending[i], hvdlSuccess, NULL);
    }
}

hvdlResult_t hvdl_round(struct hvdl_engine *e, struct hvdl_request **pending, int np, int leaving,
                        struct hvdl_request ***ready, int *ready_cap, int *nready, int *finished) {
  const int n = e->size, me = e->rank;
  *nready = 0;
  *finished = 0;

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
    int id = cache_find(e, r->desc.name, r->name_hash);
    if (id >= 0 && desc_equal(&e->cache[id].desc, &r->desc)) {
      r->phase = HVDL_PHASE_CACHED;
      r->cache_id = id;
    } else {
      uncached += desc_size(&r->desc);
    }
  }
  if (uncached > 0x7fffffffu)
    return hvdl_fail(e->data, hvdlInvalidArgument, "negotiation: too many new names at once");

  const int cache_n = e->cache_count;
  const int words = HDR_WORDS + (cache_n + 63) / 64;
  HVDL_CHECK(hvdl_reserve(e->data, &e->wire2, &e->wire2_bytes,
                          sizeof(uint64_t) * (size_t)words * (size_t)(n + 1)));
  uint64_t *all = (uint64_t *)(void *)e->wire2;
  uint64_t *mine = all + (size_t)n * (size_t)words;
  memset(mine, 0, sizeof(uint64_t) * (size_t)words);
  for (int i = 0; i < np; i++)
    if (pending[i]->phase == HVDL_PHASE_CACHED && pending[i]->cache_id < cache_n)
      mine[HDR_WORDS + pending[i]->cache_id / 64] |= 1ull << (pending[i]->cache_id % 64);
  const int slow = uncached > 0 || (me == 0 && e->pending_shutdown[0]);
  mine[0] = (leaving ? FLAG_LEAVING : 0) | (slow ? FLAG_SLOW : 0) | (joined_here ? FLAG_JOINED : 0) |
            ((uint64_t)uncached << 32);

  MPI_Request req;
  HVDL_MPI(e->data, MPI_Iallgather(mine, words, MPI_UINT64_T, all, words, MPI_UINT64_T, e->ctrl, &req));
  HVDL_CHECK(wait_round(e, 1, &req));

  int any_slow = 0, shutdown = 0, anyone_leaving = 0, njoined = 0;
  char leavers[256] = "";
  size_t nl = 0;
  unsigned char *joined = calloc((size_t)n, 1);
  if (!joined) return hvdl_fail(e->data, hvdlSystemError, "negotiation: out of memory");
  e->round_no++;
  for (int r = 0; r < n; r++) {
    uint64_t h = all[(size_t)r * (size_t)words];
    any_slow |= (h & FLAG_SLOW) != 0;
    anyone_leaving |= (h & FLAG_LEAVING) != 0;
    joined[r] = (h & FLAG_JOINED) != 0;
    njoined += joined[r];
    if (joined[r] && e->join_round[r] < 0) e->join_round[r] = (int)e->round_no;
    if ((h & FLAG_LEAVING) && r != me && nl + 16 < sizeof leavers)
      nl += (size_t)snprintf(leavers + nl, sizeof leavers - nl, nl ? ", %d" : "%d", r);
  }

  struct ready_list rl = {ready, ready_cap, 0};
  hvdlResult_t res = hvdlSuccess;
  if (any_slow)
    res = slow_path(e, all, words, cache_n, anyone_leaving, joined, pending, np, &rl, &shutdown);
  if (res != hvdlSuccess || shutdown) {
    free(joined);
    *finished = shutdown;
    *nready = rl.n;
    return res; /* a shutdown is the same response on every rank: nobody executes anything */
  }

  /* Cached entries ready everywhere. With joined ranks, an allreduce needs only the
   * others' bits (the joined ranks run a stand-in); anything else needs every rank,
   * so it goes back to the coordinator, which reports it. */
  const int first_cached = rl.n;
  struct hvdl_request **by_id = calloc((size_t)cache_n + 1, sizeof *by_id);
  if (!by_id) res = hvdl_fail(e->data, hvdlSystemError, "negotiation: out of memory");
  for (int i = 0; i < np && res == hvdlSuccess; i++)
    if (pending[i]->phase == HVDL_PHASE_CACHED && pending[i]->cache_id < cache_n)
      by_id[pending[i]->cache_id] = pending[i];
  for (int id = 0; id < cache_n && res == hvdlSuccess && !anyone_leaving; id++) {
    if (!e->cache[id].valid) continue;
    const int allreduce = e->cache[id].desc.coll == HVDL_COLL_ALLREDUCE;
    int everywhere = 1, some = 0;
    for (int q = 0; q < n && everywhere; q++) {
      int on = bit_on(all, words, q, id);
      some |= on;
      everywhere = on || (joined[q] && allreduce);
    }
    if (!everywhere || !some) continue;
    if (by_id[id])
      res = ready_push(e, &rl, by_id[id]);
    else if (joined[me])
      res = push_stand_in(e, &rl, &e->cache[id].desc);
  }
  if (njoined > 0)
    for (int i = 0; i < np; i++)
      if (pending[i]->phase == HVDL_PHASE_CACHED && pending[i]->desc.coll != HVDL_COLL_ALLREDUCE) {
        pending[i]->phase = HVDL_PHASE_NEW;
        pending[i]->cache_id = -1;
      }
  free(by_id);
  free(joined);
  if (res != hvdlSuccess) {
    *nready = rl.n;
    return res;
  }
  qsort(*ready + first_cached, (size_t)(rl.n - first_cached), sizeof **ready, by_cache_id);
  if (njoined == n) finish_join(e, pending, np);

  if (me == 0) stall_inspect(e, all, words, cache_n);

  if (leaving) {
    *finished = 1;
  } else if (nl > 0) {
    char msg[HVDL_ERRMSG_LEN];
    snprintf(msg, sizeof msg,
             "hvd_lite has been shut down on rank %s (hvd_lite.shutdown(), the end of its script, "
             "or an exception there), so collectives that need it cannot complete",
             leavers);
    hvdl_engine_mark_dead(e, hvdlRemoteError, msg);
    *finished = 1;
  }
  *nready = rl.n;
  return hvdlSuccess;
}

void hvdl_negotiate_free(struct hvdl_engine *e) {
  for (int i = 0; i < e->table_count; i++) table_free_entry(&e->table[i]);
  free(e->table);
  free(e->cache);
  free(e->cache_slots);
  free(e->wire);
  free(e->wire2);
}
