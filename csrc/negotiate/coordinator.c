/*
 * coordinator.c -- rank 0's table, validation and stall inspector (negotiate.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "negotiate/negotiate.h"

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

/* Two scale factors whose bits differ, as text that shows the difference: %g,
 * all the digits when %g reads the same, and the bits too when even those do
 * (NaNs with different payloads). */
static void scale_pair(double a, double b, char *x, char *y, size_t cap) {
  snprintf(x, cap, "%g", a);
  snprintf(y, cap, "%g", b);
  if (strcmp(x, y) != 0) return;
  uint64_t ua, ub;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  snprintf(x, cap, "%.17g", a);
  snprintf(y, cap, "%.17g", b);
  if (strcmp(x, y) != 0) return;
  snprintf(x, cap, "%.17g (bits 0x%016llx)", a, (unsigned long long)ua);
  snprintf(y, cap, "%.17g (bits 0x%016llx)", b, (unsigned long long)ub);
}

/* Writes the first difference between two ranks' descriptors; 0 if none. */
static int mismatch(const struct hvdl_desc *a, int ra, const struct hvdl_desc *b, int rb, char *msg,
                    size_t cap) {
  char x[256], y[256];
  const char *what = NULL;
  if (a->coll != b->coll) {
    snprintf(msg, cap,
             "Mismatched collective operations: one rank sent %s, another sent %s "
             "(tensor '%s'; ranks %d and %d)",
             hvdl_coll_name(a->coll), hvdl_coll_name(b->coll), a->name, ra, rb);
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
  } else if (a->device != b->device) {
    what = "memory";
    snprintf(x, sizeof x, "%s", a->device == HVDL_MEM_CUDA ? "CUDA device memory" : "host memory");
    snprintf(y, sizeof y, "%s", b->device == HVDL_MEM_CUDA ? "CUDA device memory" : "host memory");
  } else if (a->op != b->op) {
    what = "reduction ops";
    snprintf(x, sizeof x, "%s", hvdl_op_name((hvdlRedOp_t)a->op));
    snprintf(y, sizeof y, "%s", hvdl_op_name((hvdlRedOp_t)b->op));
  } else if (!hvdl_same_bits(a->prescale, b->prescale)) {
    what = "prescale factors";
    scale_pair(a->prescale, b->prescale, x, y, sizeof x);
  } else if (!hvdl_same_bits(a->postscale, b->postscale)) {
    what = "postscale factors";
    scale_pair(a->postscale, b->postscale, x, y, sizeof x);
  } else {
    return 0;
  }
  snprintf(msg, cap,
           "Mismatched %s %s: one rank sent %s, another sent %s (tensor '%s'; ranks %d and %d)",
           hvdl_coll_name(a->coll), what, x, y, a->name, ra, rb);
  return 1;
}

/* ---- cache ids ------------------------------------------------------------- */

/* The coordinator writes a response without changing the cache: the cache
 * changes when the response is applied, on every rank (rank 0 too) from the same
 * bytes, so a response that fails to be written leaves rank 0's cache as every
 * other rank's. A plan holds what the response being written does to each id. */
enum { ID_KEPT = 0, ID_DROPPED, ID_GIVEN };

struct id_plan {
  unsigned char *state; /* per id: ID_KEPT (as the cache says), ID_DROPPED (evicted), ID_GIVEN */
  size_t len;
  int next_new; /* the next id past the cache's entries */
};

/* A cache id for a newly ready name, or -1 for "do not cache": a free one, a new
 * one while the cache is below its capacity, or else one pending nowhere, which
 * the response must evict first (*evict). */
static int alloc_cache_id(const struct hvdl_coordinator *co, const uint64_t *all, int words,
                          int cache_n, struct id_plan *plan, int *evict) {
  const struct hvdl_cache *c = co->cache;
  *evict = 0;
  if (c->capacity == 0) return -1;
  int id = -1;
  for (int i = 0; i < c->count && id < 0; i++)
    if (plan->state[i] == ID_DROPPED || (plan->state[i] == ID_KEPT && !c->entries[i].valid)) id = i;
  if (id < 0 && (size_t)plan->next_new < c->capacity && (size_t)plan->next_new < plan->len)
    id = plan->next_new++;
  for (int i = 0; i < cache_n && id < 0; i++) {
    if (plan->state[i] != ID_KEPT) continue;
    int anywhere = 0;
    for (int r = 0; r < co->size && !anywhere; r++) anywhere = hvdl_bit_on(all, words, r, i);
    if (!anywhere) {
      *evict = 1;
      id = i;
    }
  }
  if (id >= 0) plan->state[id] = ID_GIVEN;
  return id;
}

/* ---- the coordinator's table (rank 0) ------------------------------------ */

static void table_free_entry(struct hvdl_table_entry *t) {
  free(t->descs);
  free(t->have);
}

static void table_remove(struct hvdl_coordinator *co, int i) {
  table_free_entry(&co->table[i]);
  memmove(&co->table[i], &co->table[i + 1], sizeof *co->table * (size_t)(co->table_count - i - 1));
  co->table_count--;
}

/* The name an entry is filed under (the first rank that announced it). */
static const char *table_name(const struct hvdl_coordinator *co, const struct hvdl_table_entry *t) {
  for (int r = 0; r < co->size; r++)
    if (t->have[r]) return t->descs[r].name;
  return "";
}

static int table_lookup(const struct hvdl_coordinator *co, const char *name) {
  for (int i = 0; i < co->table_count; i++)
    if (strcmp(table_name(co, &co->table[i]), name) == 0) return i;
  return -1;
}

static hvdlResult_t table_add(struct hvdl_coordinator *co, int *index) {
  if (co->table_count == co->table_cap) {
    int cap = co->table_cap ? co->table_cap * 2 : 64;
    struct hvdl_table_entry *t = realloc(co->table, sizeof *t * (size_t)cap);
    if (!t) return hvdl_fail(co->comm, hvdlSystemError, "coordinator table: out of memory");
    co->table = t;
    co->table_cap = cap;
  }
  struct hvdl_table_entry *t = &co->table[co->table_count];
  memset(t, 0, sizeof *t);
  t->descs = calloc((size_t)co->size, sizeof *t->descs);
  t->have = calloc((size_t)co->size, 1);
  if (!t->descs || !t->have) {
    table_free_entry(t);
    return hvdl_fail(co->comm, hvdlSystemError, "coordinator table: out of memory");
  }
  t->first_seen = hvdl_now();
  *index = co->table_count++;
  return hvdlSuccess;
}

/* The text of a validated table entry's error into msg; 0 if it has none. */
static int validate(const struct hvdl_coordinator *co, const struct hvdl_table_entry *te, int first,
                    const unsigned char *joined, char *msg, size_t cap) {
  const int n = co->size;
  const struct hvdl_desc *ref = &te->descs[first];
  for (int r = 0; r < n; r++)
    if (te->have[r] && te->descs[r].error[0]) {
      snprintf(msg, cap, "%s (on rank %d)", te->descs[r].error, r);
      return 1;
    }
  for (int r = first + 1; r < n; r++)
    if (te->have[r] && mismatch(ref, first, &te->descs[r], r, msg, cap)) return 1;
  if (ref->coll == HVDL_COLL_BROADCAST && (ref->root < 0 || ref->root >= n)) {
    snprintf(msg, cap, "BROADCAST root rank %d is out of range for %d ranks (tensor '%s')",
             ref->root, n, ref->name);
    return 1;
  }
  if (ref->coll != HVDL_COLL_ALLREDUCE && te->nhave < n) {
    char who[256];
    size_t k = 0;
    who[0] = '\0';
    for (int r = 0; r < n && k + 16 < sizeof who; r++)
      if (joined[r]) k += (size_t)snprintf(who + k, sizeof who - k, k ? ", %d" : "%d", r);
    snprintf(msg, cap,
             "%s '%s' cannot run while rank %s has joined (hvd_lite.join): only allreduce "
             "continues with joined ranks, which contribute zeros",
             hvdl_coll_name(ref->coll), ref->name, who);
    return 1;
  }
  return 0;
}

/* Rank 0: files the gathered descriptors and writes the response. */
hvdlResult_t hvdl_coordinate(struct hvdl_coordinator *co, const char *gathered, const int *counts,
                             const int *displs, const uint64_t *all, int words, int cache_n,
                             int anyone_leaving, const unsigned char *joined,
                             struct hvdl_buf *resp) {
  const int n = co->size;
  hvdlResult_t res = hvdlSuccess;
  struct id_plan plan = {calloc((size_t)co->cache->count + 1, 1), (size_t)co->cache->count + 1,
                         co->cache->count};
  if (!plan.state) return hvdl_fail(co->comm, hvdlSystemError, "coordinator: out of memory");
  struct hvdl_desc d;
  for (int r = 0; r < n; r++) {
    struct hvdl_reader rd;
    hvdl_reader_init(&rd, gathered + displs[r], (size_t)counts[r]);
    while (!hvdl_reader_done(&rd)) {
      if (hvdl_desc_get(&rd, &d)) {
        res = hvdl_reader_fail(co->comm, &rd, "descriptors", r);
        goto out;
      }
      int id = hvdl_cache_find(co->cache, d.name, hvdl_name_hash(d.name));
      if (id >= 0 &&
          plan.state[id] != ID_DROPPED) { /* its metadata changed on rank r: every rank drops it */
        plan.state[id] = ID_DROPPED;
        if (hvdl_resp_put_evict(resp, id)) goto oom;
      }
      int t = table_lookup(co, d.name);
      if (t < 0 && (res = table_add(co, &t)) != hvdlSuccess) goto out;
      struct hvdl_table_entry *te = &co->table[t];
      te->descs[r] = d;
      if (!te->have[r]) {
        te->have[r] = 1;
        te->nhave++;
      }
    }
  }
  /* Each name may take one new id. */
  const size_t len = (size_t)co->cache->count + (size_t)co->table_count + 1;
  unsigned char *grown = realloc(plan.state, len);
  if (!grown) goto oom;
  memset(grown + plan.len, 0, len - plan.len);
  plan.state = grown;
  plan.len = len;
  for (int i = 0; i < co->table_count;) {
    struct hvdl_table_entry *te = &co->table[i];
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
    if (validate(co, te, first, joined, msg, sizeof msg)) {
      if (hvdl_resp_put_error(resp, ref->name, msg)) goto oom;
    } else {
      int evict;
      const int id = alloc_cache_id(co, all, words, cache_n, &plan, &evict);
      if ((evict && hvdl_resp_put_evict(resp, id)) || hvdl_resp_put_ready(resp, id, ref)) goto oom;
    }
    table_remove(co, i);
  }
  if (co->pending_shutdown[0]) {
    if (hvdl_resp_put_shutdown(resp, co->pending_shutdown)) goto oom;
    co->pending_shutdown[0] = '\0';
  }
  goto out;
oom:
  res = hvdl_fail(co->comm, hvdlSystemError, "coordinator: out of memory writing the response");
out:
  free(plan.state);
  return res;
}

/* ---- the stall inspector (rank 0) ----------------------------------------- */

static size_t missing_ranks(const struct hvdl_coordinator *co, const uint64_t *all, int words,
                            int id, const unsigned char *have, char *out, size_t cap) {
  size_t k = 0;
  out[0] = '\0';
  for (int r = 0; r < co->size && k + 16 < cap; r++) {
    int present = have ? have[r] : hvdl_bit_on(all, words, r, id);
    if (!present) k += (size_t)snprintf(out + k, cap - k, k ? ", %d" : "%d", r);
  }
  return k;
}

static void stall_note(struct hvdl_coordinator *co, const char *name, const char *missing,
                       double age, int *warned, struct hvdl_buf *warn) {
  char line[HVDL_MAX_NAME + 128];
  if (co->stall_check_s > 0 && age > co->stall_check_s && !*warned) {
    snprintf(line, sizeof line, "\n  '%s' (%.0f s; missing ranks: %s)", name, age, missing);
    if (hvdl_buf_put(warn, line, strlen(line)) == 0) *warned = 1; /* else: again next round */
  }
  if (co->stall_shutdown_s > 0 && age > co->stall_shutdown_s && !co->pending_shutdown[0])
    snprintf(co->pending_shutdown, sizeof co->pending_shutdown,
             "hvd_lite stalled: '%s' was submitted by some ranks but not by ranks %s for %.0f s "
             "(HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS=%g); shutting down on every rank",
             name, missing, age, co->stall_shutdown_s);
}

void hvdl_stall_inspect(struct hvdl_coordinator *co, const uint64_t *all, int words, int cache_n) {
  if (co->stall_check_s <= 0 && co->stall_shutdown_s <= 0) return;
  const double now = hvdl_now();
  struct hvdl_buf warn = {0};
  char missing[512];
  for (int id = 0; id < cache_n; id++) {
    struct hvdl_cache_entry *c = &co->cache->entries[id];
    if (!c->valid) continue;
    int cnt = 0;
    for (int r = 0; r < co->size; r++) cnt += hvdl_bit_on(all, words, r, id);
    if (cnt == 0 || cnt == co->size) {
      c->pending_since = 0;
      c->warned = 0;
      continue;
    }
    if (c->pending_since == 0) c->pending_since = now;
    missing_ranks(co, all, words, id, NULL, missing, sizeof missing);
    stall_note(co, c->desc.name, missing, now - c->pending_since, &c->warned, &warn);
  }
  for (int i = 0; i < co->table_count; i++) {
    struct hvdl_table_entry *t = &co->table[i];
    missing_ranks(co, all, words, 0, t->have, missing, sizeof missing);
    stall_note(co, table_name(co, t), missing, now - t->first_seen, &t->warned, &warn);
  }
  if (warn.len && co->log_level <= HVDL_LOG_WARNING) {
    fprintf(stderr,
            "hvd_lite: stall warning (rank 0): these collectives have been submitted by some "
            "ranks but not by others for more than %g s (HVD_LITE_STALL_CHECK_TIME_SECONDS):%.*s\n",
            co->stall_check_s, (int)warn.len, warn.p);
    fflush(stderr);
  }
  free(warn.p);
}

void hvdl_coordinator_free(struct hvdl_coordinator *co) {
  for (int i = 0; i < co->table_count; i++) table_free_entry(&co->table[i]);
  free(co->table);
  co->table = NULL;
  co->table_count = co->table_cap = 0;
}
