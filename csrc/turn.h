/*
 * turn.h -- one turn of the engine's work, by the engine thread or by a waiting
 * caller (turn.c).
 */
#ifndef HVDL_TURN_H_
#define HVDL_TURN_H_

#include "engine.h"

/* Under requests.mu: the requests in flight become this turn's pending list, each
 * held for the turn; -1 when out of memory. */
int hvdl_turn_take_locked(struct hvdl_engine *e);
/* The posted round's second half (unless res already failed), then the pins of
 * failed steps settled or kept. */
hvdlResult_t hvdl_turn_finish_round(struct hvdl_engine *e, hvdlResult_t res, int *finished);
hvdlResult_t hvdl_turn_execute(struct hvdl_engine *e);
/* The pending list let go; a failure stops the engine (and tells the others).
 * Nonzero when the loop must end. Waiters are woken by the caller, after the turn
 * is given back. */
int hvdl_turn_end(struct hvdl_engine *e, hvdlResult_t res, int finished);
/* Under requests.mu: the turn given back, with what a caller hands to the engine thread. */
void hvdl_turn_give_back_locked(struct hvdl_engine *e, int handed, int over);

/* The fast path of a synchronous call, from the thread that waits for r: when the
 * engine thread is idle, this thread runs the next round itself and, if the ready
 * list is small (HVD_LITE_FAST_PATH_BYTES), executes it, sparing the two thread
 * hand-offs of the engine thread's path. A round whose peers have not all arrived
 * within a short spin, or a larger ready list, goes to the engine thread, posted
 * as it is. At most one round; nonzero when r has completed. */
int hvdl_turn_run_for(struct hvdl_engine *e, struct hvdl_request *r);

#endif /* HVDL_TURN_H_ */
