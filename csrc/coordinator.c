/*
 * coordinator.c -- rank 0's table, validation and stall inspector (coordinator.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"

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


/* Coordinator: a cache id for a newly ready name (evicting one pending nowhere if
 * the cache is full), or -1 for "do not cache". */
static int alloc_cache_id(struct hvdl_coordinator *co, const uint64_t *all, int words, int cache_n,
                          const unsigned char *fresh, struct hvdl_buf *resp) {
  if (co->cache->capacity == 0) return -1;
  for (int i = 0; i < co->cache->count; i++)
    if (!co->cache->entries[i].valid) return i;
  if ((size_t)co->cache->count < co->cache->capacity) return co->cache->count;
  for (int i = 0; i < cache_n; i++) {
    if (fresh[i]) continue;
    int anywhere = 0;
    for (int r = 0; r < co->size && !anywhere; r++) anywhere = hvdl_bit_on(all, words, r, i);
    if (!anywhere) {
      co->cache->entries[i].valid = 0;
      hvdl_buf_put_u32(resp, HVDL_RESP_EVICT);
      hvdl_buf_put_u32(resp, (uint32_t)i);
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

/* Rank 0: files the gathered descriptors and writes the response. */
hvdlResult_t hvdl_coordinate(struct hvdl_coordinator *co, const char *gathered, const int *counts,
                               const int *displs, const uint64_t *all, int words, int cache_n,
                               int anyone_leaving, const unsigned char *joined, struct hvdl_buf *resp) {
  const int n = co->size;
  unsigned char *fresh = calloc((size_t)(co->cache->count + 1 > cache_n ? co->cache->count + 1 : cache_n) + 1, 1);
  if (!fresh) return hvdl_fail(co->comm, hvdlSystemError, "coordinator: out of memory");
  size_t fresh_len = (size_t)(co->cache->count + 1 > cache_n ? co->cache->count + 1 : cache_n) + 1;
  struct hvdl_desc d;
  for (int r = 0; r < n; r++) {
    const char *p = gathered + displs[r], *end = p + counts[r];
    while (p < end) {
      p = hvdl_desc_get(p, &d);
      int id = hvdl_cache_find(co->cache, d.name, hvdl_name_hash(d.name));
      if (id >= 0) { /* its metadata changed on rank r: every rank drops the entry */
        co->cache->entries[id].valid = 0;
        hvdl_buf_put_u32(resp, HVDL_RESP_EVICT);
        hvdl_buf_put_u32(resp, (uint32_t)id);
      }
      int t = table_lookup(co, d.name);
      if (t < 0) {
        hvdlResult_t res = table_add(co, &t);
        if (res != hvdlSuccess) {
          free(fresh);
          return res;
        }
      }
      struct hvdl_table_entry *te = &co->table[t];
      te->descs[r] = d;
      if (!te->have[r]) {
        te->have[r] = 1;
        te->nhave++;
      }
    }
  }
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
      hvdl_buf_put_u32(resp, HVDL_RESP_ERROR);
      hvdl_buf_put_str(resp, ref->name);
      hvdl_buf_put_str(resp, msg);
    } else {
      int id = alloc_cache_id(co, all, words, cache_n, fresh, resp);
      if (id >= 0) {
        hvdlResult_t res = hvdl_cache_set(co->cache, id, ref);
        if (res != hvdlSuccess) {
          free(fresh);
          return res;
        }
        if ((size_t)id < fresh_len) fresh[id] = 1;
      }
      hvdl_buf_put_u32(resp, HVDL_RESP_READY);
      hvdl_buf_put_u32(resp, (uint32_t)id);
      hvdl_desc_put(resp, ref);
    }
    table_remove(co, i);
  }
  if (co->pending_shutdown[0]) {
    hvdl_buf_put_u32(resp, HVDL_RESP_SHUTDOWN);
    hvdl_buf_put_str(resp, co->pending_shutdown);
    co->pending_shutdown[0] = '\0';
  }
  free(fresh);
  return hvdlSuccess;
}


/* ---- the stall inspector (rank 0) ----------------------------------------- */

static size_t missing_ranks(const struct hvdl_coordinator *co, const uint64_t *all, int words, int id,
                            const unsigned char *have, char *out, size_t cap) {
  size_t k = 0;
  out[0] = '\0';
  for (int r = 0; r < co->size && k + 16 < cap; r++) {
    int present = have ? have[r] : hvdl_bit_on(all, words, r, id);
    if (!present) k += (size_t)snprintf(out + k, cap - k, k ? ", %d" : "%d", r);
  }
  return k;
}

static void stall_note(struct hvdl_coordinator *co, const char *name, const char *missing, double age,
                       int *warned, struct hvdl_buf *warn) {
  char line[HVDL_MAX_NAME + 128];
  if (co->stall_check_s > 0 && age > co->stall_check_s && !*warned) {
    snprintf(line, sizeof line, "\n  '%s' (%.0f s; missing ranks: %s)", name, age, missing);
    hvdl_buf_put(warn, line, strlen(line));
    *warned = 1;
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
