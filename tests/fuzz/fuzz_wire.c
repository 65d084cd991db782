/*
 * fuzz_wire.c -- a fuzz test of the negotiation wire format, in one process, no
 * MPI communication. tests/fuzz/run.sh builds it with AddressSanitizer and UBSan
 * against csrc/request/wire.c, response_cache.c, coordinator.c and errors.c, and runs it:
 *
 *   fuzz_wire [cases [seed]]        (default 20000 cases, seed 1)
 *
 * Messages are made by the real writers (hvdl_desc_put, hvdl_resp_put_*, and
 * hvdl_coordinate from random announcements) and mutated: truncated, bits
 * flipped, bytes overwritten, a 4- or 8-byte field set to an edge value (huge
 * lengths, -1, unknown kinds), bytes inserted or dropped, another message
 * spliced in, or random bytes in place of the message. Each case feeds one to
 * a real reader, in a buffer of exactly its size so that a read past the end is
 * a sanitizer error:
 *   - a descriptor stream to hvdl_desc_get;
 *   - a response to hvdl_resp_get, with the cache size the negotiation passes;
 *   - every rank's gathered descriptors to rank 0's intake, hvdl_coordinate, one
 *     rank's segment mutated, across rounds with a table and a cache that live on;
 *   - rank 0's autotune header word to hvdl_tune_get, with random grid lengths.
 * It checks that a message as written is accepted and reads back as written;
 * that what a reader accepts is within the ranges it promises; that a rejection
 * says why and names the rank whose bytes they were (rank 0 for a response);
 * that hvdl_coordinate never changes the cache, and that the response it writes
 * reads back whole; and that running out of memory while writing the response
 * (realloc and calloc in wire.c and coordinator.c failing after k calls; run.sh
 * builds them with -Drealloc=fuzz_realloc -Dcalloc=fuzz_calloc) is an error.
 * At the end it prints the accepted and rejected counts and fails unless every
 * reader both accepted and rejected some, so it cannot pass without reaching
 * the readers' error paths.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "negotiate/negotiate.h"

/* ---- the allocator run.sh routes wire.c and coordinator.c through ---------- */

static long alloc_budget = -1; /* allocations left before one fails; -1: none fails */
static long alloc_failed;

static int alloc_fails(void) {
  if (alloc_budget < 0) return 0;
  if (alloc_budget == 0) {
    alloc_failed++;
    return 1;
  }
  alloc_budget--;
  return 0;
}
void *fuzz_realloc(void *p, size_t n) { return alloc_fails() ? NULL : realloc(p, n); }
void *fuzz_calloc(size_t k, size_t n) { return alloc_fails() ? NULL : calloc(k, n); }

/* errors.c's hvdl_fail_mpi names MPI's error text; nothing here fails in MPI, so
 * the harness needs no libmpi. */
int MPI_Error_string(int code, char *text, int *len) {
  *len = snprintf(text, MPI_MAX_ERROR_STRING, "MPI error %d", code);
  return MPI_SUCCESS;
}

/* ---- checks and counts ----------------------------------------------------- */

static long failures;
#define CHECK(cond, ...)                                            \
  do {                                                              \
    if (!(cond)) {                                                  \
      fprintf(stderr, "fuzz_wire: case %ld: %s: ", case_no, #cond); \
      fprintf(stderr, __VA_ARGS__);                                 \
      fputc('\n', stderr);                                          \
      if (++failures >= 20) exit(1);                                \
    }                                                               \
  } while (0)

static long case_no;
enum { DESCS, RESPONSES, INTAKE, TUNE, NREADERS };
static const char *reader_names[NREADERS] = {"hvdl_desc_get", "hvdl_resp_get",
                                             "hvdl_coordinate intake", "hvdl_tune_get"};
static long accepted[NREADERS], rejected[NREADERS];
static long oom_cases, oom_errors;

/* ---- random numbers (splitmix64) ------------------------------------------- */

static uint64_t rng_state;
static uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }
static int chance(int percent) { return (int)below(100) < percent; }

/* ---- random descriptors ------------------------------------------------------ */

static char long_name[HVDL_MAX_NAME];
static const char *name_pool[] = {"a", "b", "grad.0", "grad.1", "w", "", "x/y:0", long_name};
#define NAMES (sizeof name_pool / sizeof name_pool[0])

static double random_scale(void) {
  static const double edge[] = {1.0, 0.5, 0.0, -0.0, 2.0, 1e300, -1.0};
  switch (below(4)) {
    case 0: return NAN;
    case 1: return edge[below(sizeof edge / sizeof edge[0])];
    default: return 1.0;
  }
}

/* The data types: NCCL's numbers, then hvd_lite's from hvdlExtTypesBegin. */
static int32_t type_at(size_t slot) {
  return (int32_t)(slot < hvdlNumTypes ? slot : hvdlExtTypesBegin + (slot - hvdlNumTypes));
}

static void random_desc(struct hvdl_desc *d, const char *name, int nranks) {
  memset(d, 0, sizeof *d);
  d->coll = (int32_t)below(HVDL_COLL_JOIN); /* JOIN is never announced */
  d->dtype = type_at(below(HVDL_TYPE_SLOTS));
  d->op = chance(10) ? hvdlAdasum : (int32_t)below(hvdlNumOps);
  d->ndim = chance(3) ? HVDL_MAX_DIMS : (int32_t)below(4);
  for (int i = 0; i < d->ndim; i++) d->dims[i] = chance(3) ? 0 : (int64_t)below(6);
  if ((d->coll == HVDL_COLL_ALLGATHER || d->coll == HVDL_COLL_ALLTOALL) && d->ndim > 0)
    d->dims[0] = -1;
  d->root = chance(90) ? (int32_t)below((size_t)nranks) : (int32_t)rnd();
  d->device = chance(10) ? HVDL_MEM_CUDA : HVDL_MEM_HOST;
  d->prescale = random_scale();
  d->postscale = random_scale();
  snprintf(d->name, sizeof d->name, "%s", name);
  if (chance(5)) {
    size_t n = below(sizeof d->error);
    memset(d->error, 'e', n);
    d->error[n] = '\0';
  }
}

/* What hvdl_desc_get promises of what it accepts. */
static void check_desc_ranges(const struct hvdl_desc *d) {
  CHECK(d->coll >= 0 && d->coll < HVDL_NUM_COLLS, "coll %d", d->coll);
  CHECK(hvdl_type_valid(d->dtype), "dtype %d", d->dtype);
  CHECK(hvdl_op_valid(d->op), "op %d", d->op);
  CHECK(d->ndim >= 0 && d->ndim <= HVDL_MAX_DIMS, "ndim %d", d->ndim);
  CHECK(d->device == HVDL_MEM_HOST || d->device == HVDL_MEM_CUDA, "device %d", d->device);
  for (int i = 0; i < d->ndim && i < HVDL_MAX_DIMS; i++)
    CHECK(d->dims[i] >= -1, "dims[%d] %lld", i, (long long)d->dims[i]);
  CHECK(memchr(d->name, '\0', sizeof d->name) != NULL, "name not terminated");
  CHECK(memchr(d->error, '\0', sizeof d->error) != NULL, "error not terminated");
}

/* ---- messages and their mutations -------------------------------------------- */

struct bytes {
  unsigned char *p;
  size_t len, cap;
};

static void bytes_set(struct bytes *b, const void *src, size_t n) {
  if (n > b->cap) {
    b->cap = n * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  if (n) memmove(b->p, src, n);
  b->len = n;
}

/* memcpy that takes a NULL pointer with 0 bytes (an empty message has none). */
static void copy(void *dst, const void *src, size_t n) {
  if (n) memcpy(dst, src, n);
}

static void put_le(unsigned char *p, uint64_t v, size_t n) {
  memcpy(p, &v, n);
} /* host order, as wire.c */

static void mutate_once(struct bytes *m, const struct bytes *other) {
  /* 9, 10, 31 .. 35: the edges of the data types' two ranges (0 .. 9, 32 .. 34) */
  static const uint32_t edge32[] = {
      0,  1,  2,  3,  4,   5,   6,    7,          9,          10,         16,         17,
      31, 32, 34, 35, 511, 512, 4096, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff, 0x10000};
  static const int64_t edge64[] = {
      -1, -2, 0, 1, INT64_MAX, INT64_MIN, (int64_t)1 << 40, (int64_t)1 << 62};
  size_t at = below(m->len + 1);
  switch (below(8)) {
    case 0: /* truncate */ m->len = below(m->len + 1); break;
    case 1: /* flip a bit */
      if (m->len) m->p[below(m->len)] ^= (unsigned char)(1u << below(8));
      break;
    case 2: /* overwrite a byte */
      if (m->len) m->p[below(m->len)] = (unsigned char)rnd();
      break;
    case 3: /* a 4-byte field (a length, a count, a kind, an id, an enum) set to an edge value */
      if (m->len >= 4) {
        at = chance(50) ? below(m->len / 4) * 4 : below(m->len - 3);
        uint32_t v = chance(80) ? edge32[below(sizeof edge32 / sizeof edge32[0])] : (uint32_t)rnd();
        if (chance(10)) v = (uint32_t)(m->len - at + below(3)); /* just past the end */
        put_le(m->p + at, v, 4);
      }
      break;
    case 4: /* an 8-byte field (a dimension, a scale) set to an edge value */
      if (m->len >= 8)
        put_le(m->p + below(m->len - 7), (uint64_t)edge64[below(sizeof edge64 / sizeof edge64[0])],
               8);
      break;
    case 5: { /* insert random bytes */
      const size_t k = 1 + below(8), n = m->len + k;
      unsigned char *p = malloc(n);
      if (!p) abort();
      copy(p, m->p, at);
      for (size_t i = 0; i < k; i++) p[at + i] = (unsigned char)rnd();
      copy(p + at + k, m->p + at, m->len - at);
      bytes_set(m, p, n);
      free(p);
      break;
    }
    case 6: { /* drop bytes */
      const size_t k = 1 + below(8);
      if (at + k <= m->len) {
        memmove(m->p + at, m->p + at + k, m->len - at - k);
        m->len -= k;
      }
      break;
    }
    default: /* splice: this message's head, another's tail */
      if (other->len) {
        const size_t from = below(other->len), n = at + other->len - from;
        unsigned char *p = malloc(n);
        if (!p) abort();
        copy(p, m->p, at);
        copy(p + at, other->p + from, other->len - from);
        bytes_set(m, p, n);
        free(p);
      }
      break;
  }
}

/* Mutates m (1 to 3 times), or replaces it with random bytes. */
static void mutate(struct bytes *m, const struct bytes *other) {
  if (chance(5)) {
    size_t n = below(300);
    unsigned char *p = malloc(n ? n : 1);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rnd();
    bytes_set(m, p, n);
    free(p);
    return;
  }
  for (int k = 1 + (int)below(3); k > 0; k--) mutate_once(m, other);
}

/* A copy in a buffer of exactly its size, so that ASan sees a read past its end. */
static char *exact_copy(const struct bytes *m) {
  char *p = malloc(m->len ? m->len : 1);
  if (!p) abort();
  if (m->len) memcpy(p, m->p, m->len);
  return p;
}

/* ---- a rejection says why and names the sender --------------------------------- */

static struct hvdlComm err_comm;

static void check_rejection(const struct hvdl_reader *rd, const char *what, int rank) {
  CHECK(rd->why[0] != '\0', "a rejected %s says nothing", what);
  CHECK(rd->p >= rd->begin && rd->p < rd->end, "rejected at byte %td of %td", rd->p - rd->begin,
        rd->end - rd->begin);
  hvdlResult_t res = hvdl_reader_fail(&err_comm, rd, what, rank);
  char want[64];
  snprintf(want, sizeof want, "malformed %s from rank %d (", what, rank);
  CHECK(res == hvdlInternalError, "result %d", (int)res);
  CHECK(strstr(err_comm.last_error, want) != NULL, "'%s' lacks '%s'", err_comm.last_error, want);
}

/* The readers accept exactly what the writers write: an accepted item, written
 * again, is the bytes it was read from. */
static void check_rewrites_to(const struct hvdl_buf *b, const char *from, const char *to,
                              const char *what) {
  CHECK(b->len == (size_t)(to - from) && memcmp(b->p, from, b->len) == 0,
        "an accepted %s (%td bytes) is written back as %zu different bytes", what, to - from,
        b->len);
}

/* ---- case 1: a stream of descriptors ------------------------------------------ */

static void desc_case(struct bytes *m, struct bytes *prev) {
  struct hvdl_desc want[4], got;
  struct hvdl_buf b = {0};
  const int k = 1 + (int)below(4);
  for (int i = 0; i < k; i++) {
    random_desc(&want[i], name_pool[below(NAMES)], 4);
    if (hvdl_desc_put(&b, &want[i])) abort();
  }
  bytes_set(m, b.p, b.len);
  free(b.p);
  const int mutated = chance(85);
  if (mutated) mutate(m, prev);
  char *p = exact_copy(m);
  struct hvdl_reader rd;
  hvdl_reader_init(&rd, p, m->len);
  int n = 0, ok = 1;
  while (!hvdl_reader_done(&rd)) {
    const char *from = rd.p;
    if (hvdl_desc_get(&rd, &got)) {
      ok = 0;
      check_rejection(&rd, "descriptors",
                      3); /* as if from rank 3: the intake case checks the rank */
      break;
    }
    check_desc_ranges(&got);
    struct hvdl_buf again = {0};
    if (hvdl_desc_put(&again, &got)) abort();
    check_rewrites_to(&again, from, rd.p, "descriptor");
    free(again.p);
    if (!mutated)
      CHECK(n < k && memcmp(&got, &want[n], sizeof got) == 0, "descriptor %d reads back different",
            n);
    n++;
  }
  if (!mutated)
    CHECK(ok && n == k, "a stream of %d descriptors as written: %d read, ok %d (%s)", k, n, ok,
          rd.why);
  (ok ? accepted : rejected)[DESCS]++;
  free(p);
}

/* ---- case 2: a response ------------------------------------------------------------ */

static void resp_case(struct bytes *m, struct bytes *prev) {
  struct hvdl_buf b = {0};
  const int count0 = (int)below(40);
  int count = count0, k = 1 + (int)below(6);
  struct hvdl_resp want[6];
  for (int i = 0; i < k; i++) {
    struct hvdl_resp *w = &want[i];
    memset(w, 0, sizeof *w);
    w->kind = (uint32_t)(1 + below(4));
    if (w->kind == HVDL_RESP_EVICT && count == 0) w->kind = HVDL_RESP_ERROR;
    int bad = 0;
    switch (w->kind) {
      case HVDL_RESP_READY:
        w->id = chance(20) ? -1 : (int32_t)below((size_t)count + 1);
        if (w->id == count) count++;
        random_desc(&w->desc, name_pool[below(NAMES)], 4);
        bad = hvdl_resp_put_ready(&b, w->id, &w->desc);
        break;
      case HVDL_RESP_ERROR:
        snprintf(w->name, sizeof w->name, "%s", name_pool[below(NAMES)]);
        memset(w->msg, 'm', below(sizeof w->msg));
        bad = hvdl_resp_put_error(&b, w->name, w->msg);
        break;
      case HVDL_RESP_EVICT:
        w->id = (int32_t)below((size_t)count);
        bad = hvdl_resp_put_evict(&b, w->id);
        break;
      default:
        memset(w->msg, 's', below(sizeof w->msg));
        bad = hvdl_resp_put_shutdown(&b, w->msg);
        break;
    }
    if (bad) abort();
  }
  bytes_set(m, b.p, b.len);
  free(b.p);
  const int mutated = chance(85);
  if (mutated) mutate(m, prev);
  char *p = exact_copy(m);
  struct hvdl_reader rd;
  struct hvdl_resp got;
  hvdl_reader_init(&rd, p, m->len);
  int n = 0, ok = 1;
  count = count0;
  while (!hvdl_reader_done(&rd)) {
    const char *from = rd.p;
    if (hvdl_resp_get(&rd, count, &got)) {
      ok = 0;
      check_rejection(&rd, "response", 0);
      break;
    }
    struct hvdl_buf again = {0};
    int failed = 0;
    switch (got.kind) {
      case HVDL_RESP_READY: failed = hvdl_resp_put_ready(&again, got.id, &got.desc); break;
      case HVDL_RESP_ERROR: failed = hvdl_resp_put_error(&again, got.name, got.msg); break;
      case HVDL_RESP_EVICT: failed = hvdl_resp_put_evict(&again, got.id); break;
      default: failed = hvdl_resp_put_shutdown(&again, got.msg); break;
    }
    if (failed) abort();
    check_rewrites_to(&again, from, rd.p, "response entry");
    free(again.p);
    switch (got.kind) {
      case HVDL_RESP_READY:
        CHECK(got.id >= -1 && got.id <= count, "READY id %d with %d entries", got.id, count);
        check_desc_ranges(&got.desc);
        if (got.id == count) count++;
        break;
      case HVDL_RESP_EVICT:
        CHECK(got.id >= 0 && got.id < count, "EVICT id %d with %d entries", got.id, count);
        break;
      case HVDL_RESP_ERROR:
        CHECK(memchr(got.name, '\0', sizeof got.name) != NULL, "ERROR name not terminated");
        /* fallthrough */
      case HVDL_RESP_SHUTDOWN:
        CHECK(memchr(got.msg, '\0', sizeof got.msg) != NULL, "message not terminated");
        break;
      default: CHECK(0, "accepted kind %u", got.kind);
    }
    if (!mutated && n < k) {
      const struct hvdl_resp *w = &want[n];
      CHECK(got.kind == w->kind, "entry %d: kind %u, written %u", n, got.kind, w->kind);
      if (w->kind == HVDL_RESP_READY || w->kind == HVDL_RESP_EVICT)
        CHECK(got.id == w->id, "entry %d: id", n);
      if (w->kind == HVDL_RESP_READY)
        CHECK(memcmp(&got.desc, &w->desc, sizeof got.desc) == 0, "entry %d: desc", n);
      if (w->kind == HVDL_RESP_ERROR) CHECK(strcmp(got.name, w->name) == 0, "entry %d: name", n);
      if (w->kind == HVDL_RESP_ERROR || w->kind == HVDL_RESP_SHUTDOWN)
        CHECK(strcmp(got.msg, w->msg) == 0, "entry %d: message", n);
    }
    n++;
  }
  if (!mutated)
    CHECK(ok && n == k, "a response of %d entries as written: %d read, ok %d (%s)", k, n, ok,
          rd.why);
  (ok ? accepted : rejected)[RESPONSES]++;
  free(p);
}

/* ---- case 3: rank 0's intake of the gathered descriptors ----------------------- */

#define MAX_RANKS 5

/* A coordinator and its cache across rounds, until an error or a shutdown ends
 * them (as it ends the engine). Each name has this session's metadata; a rank
 * sometimes announces it changed (dirty until a response settles it). */
struct session {
  int n;
  struct hvdlComm comm;
  struct hvdl_cache cache;
  struct hvdl_coordinator co;
  struct hvdl_desc base[NAMES];
  int dirty[NAMES];
  int rounds;
};

static void session_start(struct session *s) {
  memset(s, 0, sizeof *s);
  s->n = 1 + (int)below(MAX_RANKS);
  s->comm.size = s->n;
  static const size_t capacities[] = {0, 1, 3, 8, 1024};
  s->cache.comm = &s->comm;
  s->cache.capacity = capacities[below(sizeof capacities / sizeof capacities[0])];
  s->co.comm = &s->comm;
  s->co.size = s->n;
  s->co.cache = &s->cache;
  s->co.stall_check_s = 1e-9;                    /* the warning's text is built every round... */
  s->co.log_level = HVDL_LOG_ERROR;              /* ...and not printed */
  s->co.stall_shutdown_s = chance(5) ? 1e-9 : 0; /* a stall shutdown in the next response */
  for (size_t i = 0; i < NAMES; i++) random_desc(&s->base[i], name_pool[i], s->n);
}

static void session_end(struct session *s) {
  hvdl_coordinator_free(&s->co);
  hvdl_cache_free(&s->cache);
}

/* A copy of what hvdl_coordinate must not change. */
struct cache_copy {
  struct hvdl_cache c;
  struct hvdl_cache_entry *entries;
  int *slots;
};
static void cache_copy(struct cache_copy *k, const struct hvdl_cache *c) {
  k->c = *c;
  k->entries = malloc(sizeof *k->entries * (size_t)c->cap + 1);
  k->slots = malloc(sizeof *k->slots * (size_t)c->slot_cap + 1);
  if (!k->entries || !k->slots) abort();
  if (c->cap) memcpy(k->entries, c->entries, sizeof *k->entries * (size_t)c->cap);
  if (c->slot_cap) memcpy(k->slots, c->slots, sizeof *k->slots * (size_t)c->slot_cap);
}
static int cache_same(const struct cache_copy *k, const struct hvdl_cache *c) {
  return memcmp(&k->c, c, sizeof *c) == 0 &&
         (!c->cap || memcmp(k->entries, c->entries, sizeof *k->entries * (size_t)c->cap) == 0) &&
         (!c->slot_cap || memcmp(k->slots, c->slots, sizeof *k->slots * (size_t)c->slot_cap) == 0);
}

static int pool_index(const char *name) {
  for (size_t i = 0; i < NAMES; i++)
    if (strcmp(name_pool[i], name) == 0) return (int)i;
  return -1;
}

/* Rank r's announcement of name i: as the session says, or changed. */
static void announce(struct session *s, int i, struct hvdl_buf *b) {
  struct hvdl_desc d = s->base[i];
  if (chance(8)) {
    s->dirty[i] = 1;
    switch (below(4)) {
      case 0: d.dtype = type_at(((size_t)hvdl_type_slot(d.dtype) + 1) % HVDL_TYPE_SLOTS); break;
      case 1: d.prescale = -d.prescale; break; /* 0.0 against -0.0, a NaN's sign */
      case 2:
        d.dims[0] = 7;
        if (d.ndim == 0) d.ndim = 1;
        break;
      default: snprintf(d.error, sizeof d.error, "a problem on one rank"); break;
    }
  }
  if (hvdl_desc_put(b, &d)) abort();
}

/* Applies an accepted response to the cache, as the negotiation does on every rank. */
static int apply_to_cache(struct session *s, const struct bytes *resp, int mutated) {
  char *p = exact_copy(resp);
  struct hvdl_reader rd;
  struct hvdl_resp e;
  int shutdown = 0;
  hvdl_reader_init(&rd, p, resp->len);
  while (!hvdl_reader_done(&rd)) {
    if (hvdl_resp_get(&rd, s->cache.count, &e)) {
      CHECK(0, "the coordinator's response does not read back: %s", rd.why);
      break;
    }
    const int i = e.kind == HVDL_RESP_READY   ? pool_index(e.desc.name)
                  : e.kind == HVDL_RESP_ERROR ? pool_index(e.name)
                                              : -1;
    if (e.kind == HVDL_RESP_READY && e.id >= 0)
      CHECK(hvdl_cache_set(&s->cache, e.id, &e.desc) == hvdlSuccess, "cache_set %d", e.id);
    if (e.kind == HVDL_RESP_EVICT) s->cache.entries[e.id].valid = 0;
    if (e.kind == HVDL_RESP_ERROR && i >= 0 && !s->dirty[i] && !mutated)
      CHECK(strstr(e.msg, "Mismatched") == NULL,
            "identical announcements reported as a mismatch: %s", e.msg);
    if (i >= 0) s->dirty[i] = 0;
    if (e.kind == HVDL_RESP_SHUTDOWN) shutdown = 1;
  }
  free(p);
  return shutdown;
}

static void intake_case(struct session *s, struct bytes *prev) {
  const int n = s->n;
  struct bytes seg[MAX_RANKS] = {{0}};
  for (int r = 0; r < n; r++) {
    struct hvdl_buf b = {0};
    for (size_t i = 0; i < NAMES; i++) {
      if (!chance(35)) continue;
      const int id = hvdl_cache_find(&s->cache, name_pool[i], hvdl_name_hash(name_pool[i]));
      if (id >= 0 && chance(80)) continue; /* cached: a bit, not an announcement */
      announce(s, (int)i, &b);
    }
    bytes_set(&seg[r], b.p, b.len);
    free(b.p);
  }
  const int mutated = chance(60), bad_rank = (int)below((size_t)n);
  if (mutated) {
    mutate(&seg[bad_rank], prev);
    for (size_t i = 0; i < NAMES; i++) s->dirty[i] = 1; /* what it now says is anyone's guess */
  }
  /* The mutated rank's segment goes last, against the end of the block. */
  int counts[MAX_RANKS], displs[MAX_RANKS];
  size_t total = 0;
  for (int r = 0; r < n; r++) total += seg[r].len;
  char *gathered = malloc(total ? total : 1);
  if (!gathered) abort();
  size_t at = 0;
  for (int k = 1; k <= n; k++) {
    const int r = (bad_rank + k) % n;
    counts[r] = (int)seg[r].len;
    displs[r] = (int)at;
    if (seg[r].len) memcpy(gathered + at, seg[r].p, seg[r].len);
    at += seg[r].len;
  }
  /* Every rank's bit vector: each cached id pending everywhere, nowhere or here and there. */
  const int cache_n = s->cache.count, words = HVDL_HDR_WORDS + (cache_n + 63) / 64;
  uint64_t *all = calloc((size_t)n * (size_t)words, sizeof *all);
  unsigned char joined[MAX_RANKS];
  if (!all) abort();
  for (int id = 0; id < cache_n; id++) {
    const int how = (int)below(3);
    for (int r = 0; r < n; r++)
      if (how == 0 || (how == 2 && chance(50)))
        all[(size_t)r * (size_t)words + HVDL_HDR_WORDS + (size_t)id / 64] |= 1ull << (id % 64);
  }
  for (int r = 0; r < n; r++) joined[r] = (unsigned char)chance(4);
  const int leaving = chance(3);

  struct cache_copy before;
  cache_copy(&before, &s->cache);
  const int oom = chance(6);
  const long failed_before = alloc_failed;
  if (oom) alloc_budget = (long)below(8);
  struct hvdl_buf resp = {0};
  const hvdlResult_t res = hvdl_coordinate(&s->co, gathered, counts, displs, all, words, cache_n,
                                           leaving, joined, &resp);
  alloc_budget = -1;
  CHECK(cache_same(&before, &s->cache), "hvdl_coordinate changed the cache (result %d)", (int)res);
  CHECK(res != hvdlSuccess || alloc_failed == failed_before,
        "an allocation failed, yet the response was written");
  free(before.entries);
  free(before.slots);

  int end_session = 0;
  if (res == hvdlSuccess) {
    accepted[INTAKE]++;
    struct bytes r = {0};
    bytes_set(&r, resp.p, resp.len);
    end_session = apply_to_cache(s, &r, mutated);
    free(r.p);
    hvdl_stall_inspect(&s->co, all, words, cache_n);
  } else if (res == hvdlInternalError) {
    rejected[INTAKE]++;
    char want[64];
    snprintf(want, sizeof want, "malformed descriptors from rank %d (", bad_rank);
    CHECK(mutated, "announcements as written rejected: %s", s->comm.last_error);
    CHECK(strstr(s->comm.last_error, want) != NULL, "'%s' does not name rank %d",
          s->comm.last_error, bad_rank);
    end_session = 1;
  } else {
    CHECK(res == hvdlSystemError && oom && alloc_failed > failed_before, "result %d: %s", (int)res,
          s->comm.last_error);
    CHECK(strstr(s->comm.last_error, "out of memory") != NULL, "%s", s->comm.last_error);
    oom_errors++;
    end_session = 1;
  }
  oom_cases += oom;
  if (resp.len) bytes_set(prev, resp.p, resp.len); /* material for later splices */
  free(resp.p);
  free(all);
  free(gathered);
  for (int r = 0; r < n; r++) free(seg[r].p);
  if (end_session || ++s->rounds >= 40) {
    session_end(s);
    session_start(s);
  }
}

/* ---- case 4: rank 0's autotune word ------------------------------------------------ */

static void tune_case(struct bytes *m, struct bytes *prev) {
  int sizes[HVDL_TUNE_PARAMS];
  struct hvdl_tune_word want, got;
  for (int q = 0; q < HVDL_TUNE_PARAMS; q++) {
    sizes[q] = (int)below(10); /* 0: a grid with nothing in it, so only "not tuned" reads */
    want.idx[q] = sizes[q] && chance(80) ? (int)below((size_t)sizes[q]) : -1;
  }
  want.settled = chance(30);
  const uint64_t w = hvdl_tune_put(&want);
  bytes_set(m, &w, sizeof w);
  const int mutated = chance(85);
  if (mutated) mutate(m, prev);
  char *p = exact_copy(m);
  struct hvdl_reader rd;
  hvdl_reader_init(&rd, p, m->len);
  const int ok = hvdl_tune_get(&rd, sizes, &got) == 0;
  if (ok) {
    for (int q = 0; q < HVDL_TUNE_PARAMS; q++)
      CHECK(got.idx[q] >= -1 && got.idx[q] < sizes[q], "parameter %d: index %d of %d", q,
            got.idx[q], sizes[q]);
    CHECK(rd.p == rd.begin + sizeof w, "an autotune word read %td bytes", rd.p - rd.begin);
    const uint64_t again = hvdl_tune_put(&got);
    CHECK(memcmp(&again, p, sizeof again) == 0,
          "an accepted autotune word is written back different");
    if (!mutated) CHECK(again == w, "an autotune word reads back different");
  } else {
    CHECK(mutated, "an autotune word as written rejected: %s", rd.why);
    CHECK(rd.why[0] != '\0', "a rejected autotune word says nothing");
    if (m->len) check_rejection(&rd, "autotune word", 0);
  }
  (ok ? accepted : rejected)[TUNE]++;
  free(p);
}

/* ---- the run ------------------------------------------------------------------ */

int main(int argc, char **argv) {
  const long cases = argc > 1 ? atol(argv[1]) : 20000;
  const uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
  rng_state = seed;
  memset(long_name, 'n', sizeof long_name - 1);
  struct bytes prev = {0}, m = {0};
  struct session s;
  session_start(&s);
  for (case_no = 0; case_no < cases; case_no++) {
    switch (case_no % 4) {
      case 0: desc_case(&m, &prev); break;
      case 1: resp_case(&m, &prev); break;
      case 2: intake_case(&s, &prev); break;
      default: tune_case(&m, &prev); break;
    }
    if (case_no % 4 != 2 && m.len) bytes_set(&prev, m.p, m.len);
  }
  session_end(&s);
  free(prev.p);
  free(m.p);
#ifdef __SANITIZE_ADDRESS__
  const char *asan = "AddressSanitizer";
#else
  const char *asan = "no AddressSanitizer";
#endif
  printf("fuzz_wire: %ld cases, seed %" PRIu64 ", built with %s\n", cases, seed, asan);
  int vacuous = 0;
  for (int k = 0; k < NREADERS; k++) {
    printf("  %-24s accepted %6ld  rejected %6ld\n", reader_names[k], accepted[k], rejected[k]);
    vacuous |= accepted[k] == 0 || rejected[k] == 0;
  }
  printf("  %-24s injected %6ld  errors   %6ld\n", "out of memory (intake)", oom_cases, oom_errors);
  vacuous |= oom_errors == 0;
  if (vacuous) {
    fprintf(
        stderr,
        "fuzz_wire: some reader never accepted or never rejected a message: the cases do not reach it\n");
    return 1;
  }
  if (failures) {
    fprintf(stderr, "fuzz_wire: %ld checks failed\n", failures);
    return 1;
  }
  printf("fuzz_wire: ok\n");
  return 0;
}
