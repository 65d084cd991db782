/*
 * alarm.h -- alarms: how one rank's failure reaches the others (docs/design.md,
 * "Failures"). A rank whose part of a collective fails sends a data alarm to every
 * other rank; a rank whose engine fails sends an engine alarm. Both travel on the
 * control communicator, point to point, with tags of their own. alarm.c calls
 * base.c and MPI; the executor, the negotiation and the engine call it.
 */
#ifndef HVDL_ALARM_H_
#define HVDL_ALARM_H_

#include <stdint.h>

#include "internal.h"

#define HVDL_NO_STEP UINT64_MAX

/* What an alarm says: the step of the ready lists that failed (the engine counts
 * steps identically on every rank), the failing rank, its result code and message. */
struct hvdl_alarm_note {
  uint64_t step;
  int rank;
  int code;
  char msg[HVDL_ERRMSG_LEN];
};

struct hvdl_alarm {
  MPI_Comm comm;
  int rank, size;
  unsigned epoch;               /* settles so far */
  /* data alarms of the current epoch (until the next settle) */
  int sent;                     /* this rank has sent its data alarm */
  unsigned char *got;           /* [size]: rank q's data alarm has been received */
  struct hvdl_alarm_note first; /* the earliest failed step known here (HVDL_NO_STEP: none) */
  /* engine alarms */
  int engine_sent;
  int engine_down;              /* an engine alarm has been received */
  struct hvdl_alarm_note engine;
  /* buffers and requests of what this rank sent */
  char *out, *engine_out;
  MPI_Request *sreq, *engine_sreq;
};

hvdlResult_t hvdl_alarm_init(struct hvdl_alarm *a, MPI_Comm comm);
void hvdl_alarm_free(struct hvdl_alarm *a);

/* This rank failed step `step` (code, msg): record it and, once an epoch, tell
 * every other rank. */
void hvdl_alarm_raise(struct hvdl_alarm *a, uint64_t step, int code, const char *msg);
/* This rank's engine is failing: tell every other rank (once). */
void hvdl_alarm_raise_engine(struct hvdl_alarm *a, int code, const char *msg);
/* Receives the alarms that have arrived; returns 1 if any did. */
int hvdl_alarm_poll(struct hvdl_alarm *a);
/* Whether step `step` has failed somewhere (a data alarm for it or an earlier step). */
static inline int hvdl_alarm_failed(const struct hvdl_alarm *a, uint64_t step) {
  return a->first.step <= step;
}
/* Ends the epoch, on every rank in the same round: receives the data alarms still
 * owed by the ranks flagged in alarmed[], completes this rank's own, and forgets
 * them. */
hvdlResult_t hvdl_alarm_settle(struct hvdl_alarm *a, const unsigned char *alarmed);

#endif /* HVDL_ALARM_H_ */
