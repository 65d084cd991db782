/*
 * response_cache.c -- the response cache (negotiate.h).
 *
 * The index is open addressing on the name hash, linear probing. A slot keeps
 * the id it was given even after that entry is dropped or reused for another name
 * (lookups check the name), so the index is rebuilt from the valid entries when
 * half of its slots are taken. A step of N new requests costs N lookups, not N^2/2
 * name comparisons (50 us of a ResNet-50 step at 161 tensors).
 */
#include <stdlib.h>
#include <string.h>

#include "negotiate/negotiate.h"

int hvdl_cache_find(const struct hvdl_cache *c, const char *name, uint64_t hash) {
  if (!c->slot_cap) return -1;
  const size_t mask = (size_t)c->slot_cap - 1;
  for (size_t s = hash & mask;; s = (s + 1) & mask) {
    const int id = c->slots[s];
    if (id < 0) return -1;
    const struct hvdl_cache_entry *ent = &c->entries[id];
    if (ent->valid && ent->hash == hash && strcmp(ent->desc.name, name) == 0) return id;
  }
}

static void index_put(struct hvdl_cache *c, int id) {
  const size_t mask = (size_t)c->slot_cap - 1;
  size_t s = c->entries[id].hash & mask;
  while (c->slots[s] >= 0) s = (s + 1) & mask;
  c->slots[s] = id;
  c->slot_used++;
}

/* Makes room for one more slot, rebuilding the index from the valid entries when
 * it is half full. */
static hvdlResult_t index_reserve(struct hvdl_cache *c) {
  if (2 * (c->slot_used + 1) <= c->slot_cap) return hvdlSuccess;
  int valid = 0;
  for (int i = 0; i < c->count; i++) valid += c->entries[i].valid;
  int cap = 64;
  while (cap < 4 * (valid + 1)) cap *= 2;
  int *slots = malloc(sizeof *slots * (size_t)cap);
  if (!slots) return hvdl_fail(c->comm, hvdlSystemError, "response cache: out of memory");
  for (int i = 0; i < cap; i++) slots[i] = -1;
  free(c->slots);
  c->slots = slots;
  c->slot_cap = cap;
  c->slot_used = 0;
  for (int i = 0; i < c->count; i++)
    if (c->entries[i].valid) index_put(c, i);
  return hvdlSuccess;
}

hvdlResult_t hvdl_cache_set(struct hvdl_cache *c, int id, const struct hvdl_desc *d) {
  if (id >= c->cap) {
    int cap = c->cap ? c->cap * 2 : 64;
    while (cap <= id) cap *= 2;
    struct hvdl_cache_entry *grown = realloc(c->entries, sizeof *grown * (size_t)cap);
    if (!grown) return hvdl_fail(c->comm, hvdlSystemError, "response cache: out of memory");
    memset(grown + c->cap, 0, sizeof *grown * (size_t)(cap - c->cap));
    c->entries = grown;
    c->cap = cap;
  }
  HVDL_CHECK(index_reserve(c));
  if (id >= c->count) c->count = id + 1;
  struct hvdl_cache_entry *ent = &c->entries[id];
  ent->valid = 1;
  ent->desc = *d;
  ent->hash = hvdl_name_hash(d->name);
  index_put(c, id);
  ent->pending_since = 0;
  ent->warned = 0;
  return hvdlSuccess;
}

void hvdl_cache_free(struct hvdl_cache *c) {
  free(c->entries);
  free(c->slots);
  c->entries = NULL;
  c->slots = NULL;
}
