/*
 * coordinator.h -- rank 0's part of a negotiation round: the table of names
 * some ranks have announced, their validation (a mismatch becomes an error
 * response naming both values), cache ids for the ready ones, and the stall
 * inspector. coordinator.c calls cache.c, wire.c and base.c; negotiate.c calls
 * it on rank 0.
 */
#ifndef HVDL_COORDINATOR_H_
#define HVDL_COORDINATOR_H_

#include "cache.h"
#include "wire.h"

/* One name announced by some ranks. */
struct hvdl_table_entry {
  struct hvdl_desc *descs;       /* one per rank */
  unsigned char *have;           /* which ranks announced it */
  int nhave;
  double first_seen;
  int warned;
};

struct hvdl_coordinator {
  hvdlComm_t comm;               /* where failures are recorded */
  int size;
  struct hvdl_cache *cache;      /* the negotiation's cache, which this assigns ids in */
  double stall_check_s;          /* HVD_LITE_STALL_CHECK_TIME_SECONDS; 0 disables the warning */
  double stall_shutdown_s;       /* HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS; 0 = wait forever */
  int log_level;
  struct hvdl_table_entry *table;
  int table_count, table_cap;
  char pending_shutdown[HVDL_ERRMSG_LEN]; /* a stall shutdown to broadcast in the next response */
};

/* Files the descriptors gathered from every rank (rank r's at gathered + displs[r],
 * counts[r] bytes) and writes the response: READY for names every rank that has
 * not joined announced and that agree, ERROR for those that do not, EVICT for
 * cache entries whose metadata changed or that make room, SHUTDOWN for a stall.
 * `all` holds every rank's header and bit vector (`words` each; `cache_n` entries).
 * The cache is left as it is: it changes as the response is applied, on every
 * rank alike. A malformed descriptor is hvdlInternalError naming the rank that
 * sent it, running out of memory hvdlSystemError; either way *resp must not be sent. */
hvdlResult_t hvdl_coordinate(struct hvdl_coordinator *co, const char *gathered, const int *counts,
                             const int *displs, const uint64_t *all, int words, int cache_n,
                             int anyone_leaving, const unsigned char *joined,
                             struct hvdl_buf *resp);
/* Warns about (HVD_LITE_STALL_CHECK_TIME_SECONDS) names pending on some ranks only,
 * and queues a shutdown response past HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS. */
void hvdl_stall_inspect(struct hvdl_coordinator *co, const uint64_t *all, int words, int cache_n);
void hvdl_coordinator_free(struct hvdl_coordinator *co);

#endif /* HVDL_COORDINATOR_H_ */
