/*
 * cache.h -- the response cache: descriptors already negotiated, by id, found
 * by name through a hash index. Identical on every rank, because it changes only
 * as the coordinator's broadcast responses say. cache.c calls only base.c; the
 * negotiation and the coordinator use it.
 */
#ifndef HVDL_CACHE_H_
#define HVDL_CACHE_H_

#include "request.h"

struct hvdl_cache_entry {
  int valid;
  uint64_t hash;                 /* hvdl_name_hash(desc.name) */
  struct hvdl_desc desc;
  double pending_since;          /* stall inspector, rank 0: first round seen pending somewhere */
  int warned;
};

struct hvdl_cache {
  hvdlComm_t comm;               /* where failures are recorded */
  size_t capacity;               /* HVD_LITE_CACHE_CAPACITY; 0 disables the cache */
  struct hvdl_cache_entry *entries;
  int count, cap;                /* ids in use are below count */
  int *slots;                    /* open-addressing index by name hash: ids, -1 empty */
  int slot_cap, slot_used;
};

/* The id of the valid entry named `name` (hash = hvdl_name_hash(name)), or -1. */
int hvdl_cache_find(const struct hvdl_cache *c, const char *name, uint64_t hash);
/* Entry `id` becomes d (growing the cache as needed). */
hvdlResult_t hvdl_cache_set(struct hvdl_cache *c, int id, const struct hvdl_desc *d);
void hvdl_cache_free(struct hvdl_cache *c);

#endif /* HVDL_CACHE_H_ */
