/*
 * engine_turn.c -- one turn of the engine's work: the in-flight requests taken as the
 * pending list, the round's second half, the execution of its ready list, and the
 * turn's end (waiters, failures). Whoever holds the turn runs it (engine.h: turn,
 * under requests.mu): the engine thread (engine.c's loop), or a thread waiting in a
 * synchronous call, which runs a whole turn itself when the engine is idle
 * (hvdl_turn_run_for: the fast path, docs/design.md "The engine"). It calls the
 * negotiation, the executor, the request set and alarms; engine.c and the Python
 * binding call it.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "engine/engine.h"
#include "execute/execute.h"
#include "negotiate/negotiate.h"

/* Under mu: the requests in flight become this turn's pending list, each held for
 * the turn; -1 when out of memory. */
int hvdl_turn_take_locked(struct hvdl_engine *e) {
  int n = 0;
  for (struct hvdl_request *r = e->requests.head; r; r = r->next) n++;
  if (n > e->pending_cap) {
    struct hvdl_request **p = realloc(e->pending, sizeof *p * (size_t)n * 2);
    if (!p) return -1;
    e->pending = p;
    e->pending_cap = n * 2;
  }
  n = 0;
  for (struct hvdl_request *r = e->requests.head; r; r = r->next) {
    atomic_fetch_add(&r->refs, 1);
    e->pending[n++] = r;
  }
  e->npending = n;
  e->had_new = e->nnew;
  e->nnew = 0;
  e->at_once = 0;
  e->caller_expected = 0;
  return 0;
}

hvdlResult_t hvdl_turn_finish_round(struct hvdl_engine *e, hvdlResult_t res, int *finished) {
  *finished = 0;
  e->nready = 0;
  if (res == hvdlSuccess)
    res = hvdl_round_finish(e->negotiator, e->pending, e->npending, e->leaving, &e->ready,
                            &e->ready_cap, &e->nready, finished);
  if (res ==
      hvdlSuccess) /* rank 0's autotune word of the round, applied before the ready list runs */
    res = hvdl_autotune_round(&e->tuner, e->negotiator->tune_in, e->negotiator->round_no, e->ready,
                              e->nready, &e->negotiator->tune_out);
  hvdl_executor_unpin(e->executor, res != hvdlSuccess);
  return res;
}

hvdlResult_t hvdl_turn_execute(struct hvdl_engine *e) {
  if (e->nready == 0) return hvdlSuccess;
  e->in_data = 1;
  hvdlResult_t res = hvdl_execute(e->executor, e->ready, e->nready);
  e->in_data = 0;
  return res;
}

/* The end of a turn: the pending list let go (its waiters are woken once the turn is
 * given back, so that one that submits again finds the turn free). A failure stops the
 * engine here, and the other ranks learn why from its engine alarm, unless it stops
 * because another engine stopped. Nonzero when the loop must end. */
int hvdl_turn_end(struct hvdl_engine *e, hvdlResult_t res, int finished) {
  for (int i = 0; i < e->npending; i++) hvdl_request_release(e->pending[i]);
  e->npending = 0;
  if (res == hvdlSuccess) return finished;
  char msg[HVDL_ERRMSG_LEN];
  if (e->alarm.engine_down) {
    snprintf(msg, sizeof msg, "%s", e->alarm.engine.msg);
  } else {
    snprintf(msg, sizeof msg, "hvd_lite engine failed on rank %d: %s", e->rank,
             hvdlGetLastError(e->data));
    hvdl_alarm_raise_engine(&e->alarm, res, msg);
  }
  hvdl_requests_fail_all(&e->requests, res, msg);
  return 1;
}

/* Under mu: gives the turn back; a caller may leave work for the engine thread. */
void hvdl_turn_give_back_locked(struct hvdl_engine *e, int handed, int over) {
  e->turn = HVDL_TURN_FREE;
  e->handed = handed;
  if (over) e->over = 1;
}

/* A caller waits for its peers' part of the round as the engine thread would (a
 * spin of 100 us, without yields, then sleeps from 1 us doubling to 100 us, with the
 * engine thread's 1 us timer slack, set before the first sleep: a thread's default,
 * 50 us, stretches every short sleep to that) for at most CALLER_HOLD, then hands
 * the round to the engine thread: within a Python wait slice (100 ms), so a signal is
 * not delayed beyond what a wait slice allows. Handing over after a 100 us spin cost
 * a late peer's caller the spin, two wake-ups and the engine's own round wait. The
 * engine thread leaves a synchronous submission to its caller for a while first
 * (engine.c, CALLER_GRACE). */
#define CALLER_HOLD 50e-3
static const struct hvdl_wait_limits caller_round = {
    .spin = 100e-6, .yield = 0, .first_sleep = 1e-6, .max_sleep = 100e-6};

static size_t ready_bytes(const struct hvdl_engine *e) {
  size_t b = 0;
  for (int i = 0; i < e->nready; i++) b += e->ready[i]->nbytes;
  return b;
}

/* Sets the calling thread's timer slack to 1 us and returns what it was (0 where
 * there is no such setting). Only a caller that sleeps pays for it: two system
 * calls, which cost as much as the rest of a small call's turn. */
static int short_sleeps(void) {
#ifdef __linux__
  const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  if (slack > 1000) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  return slack;
#else
  return 0;
#endif
}

int hvdl_turn_run_for(struct hvdl_engine *e, struct hvdl_request *r) {
  if (hvdl_request_poll(r)) return 1;
  const size_t limit = e->cfg.fast_path_bytes;
  pthread_mutex_lock(&e->requests.mu);
  const int free_turn = e->thread_started && e->turn == HVDL_TURN_FREE && !e->handed && !e->over &&
                        !e->hold && !e->stop_requested && !e->requests.dead;
  if (!free_turn || limit == 0 || r->nbytes > limit || e->cfg.cycle_time_ms > 0 ||
      hvdl_turn_take_locked(e) != 0) {
    e->caller_expected = 0; /* the engine thread runs the round, now */
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->requests.mu);
    return hvdl_request_poll(r);
  }
  e->turn = HVDL_TURN_CALLER;
  e->leaving = 0;
  pthread_mutex_unlock(&e->requests.mu);
  int slack = -1; /* the caller's timer slack, set to 1 us before its first sleep here */
  int handed = HVDL_HANDED_NONE, finished = 0, arrived = 0, over = 0;
  e->last_round = hvdl_now();
  hvdlResult_t res = hvdl_round_post(e->negotiator, e->pending, e->npending, 0);
  const double start = hvdl_now();
  double sleep = 0;
  while (res == hvdlSuccess && !arrived) {
    res = hvdl_round_arrived(e->negotiator, &arrived);
    const double waited = hvdl_now() - start;
    if (arrived || res != hvdlSuccess) break;
    if (waited > CALLER_HOLD) {
      handed = HVDL_HANDED_ROUND;
      break;
    }
    if (waited < caller_round.spin) { /* spins yield only on an oversubscribed host (wait.c) */
      if (hvdl_oversubscribed()) sched_yield();
    } else {
      sleep = hvdl_wait_next_sleep(&caller_round, sleep, waited);
      if (slack < 0) slack = short_sleeps();
      hvdl_sleep(sleep);
    }
  }
  if (!handed) {
    res = hvdl_turn_finish_round(e, res, &finished);
    if (res == hvdlSuccess && !finished && ready_bytes(e) > limit) handed = HVDL_HANDED_READY;
  }
  if (!handed) {
    if (res == hvdlSuccess) res = hvdl_turn_execute(e);
    over = hvdl_turn_end(e, res, finished);
  }
#ifdef __linux__
  if (slack > 1000) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
#endif
  pthread_mutex_lock(&e->requests.mu);
  hvdl_turn_give_back_locked(e, handed, over);
  if (handed || over || e->requests.head || e->stop_requested) pthread_cond_signal(&e->work_cv);
  pthread_mutex_unlock(&e->requests.mu);
  if (!handed) {
    hvdl_requests_notify(&e->requests, 1);
    atomic_fetch_add_explicit(&e->caller_turns, 1, memory_order_relaxed);
  }
  return hvdl_request_poll(r);
}
