/*
 * engine.c -- the background thread: the queue of submitted requests, the loop
 * of rounds (negotiate.c) and executions (executor.c), and the engine's
 * lifetime. A request's own life (completion, waking, waiting) is request.c's.
 *
 * The loop. The thread sleeps on work_cv while nothing is in flight, waking
 * every idle tick to join a round (so that the others learn about stalls and
 * departures). While requests are in flight it runs rounds back to back; a
 * round that made no progress is followed by a short, growing sleep that a new
 * submission cuts short, so that ranks waiting on each other do not spin.
 *
 * Locking. requests.mu guards the in-flight list, the dead flag, the waiter
 * counts and the queue state here; a request's state and refs are atomics, so
 * poll needs no lock. Everything else in struct hvdl_engine belongs to the
 * engine thread.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "engine/engine.h"
#include "execute/execute.h"
#include "negotiate/negotiate.h"
#include "request/request.h"
#include "transport/shm/shm.h"

static const char SHUT_DOWN[] = "hvd_lite has been shut down on this rank";

/* After a round without progress the engine sleeps, 20 us doubling to 100 us, and
 * to 10 ms once nothing has moved for 50 ms (then the others are idle or late);
 * a new submission cuts the sleep short. */
static const struct hvdl_wait_limits no_progress = {
    .first_sleep = 20e-6, .max_sleep = 100e-6, .long_after = 50e-3, .long_sleep = 10e-3};

/* The first thread to wait on a handle ends a batch (under requests.mu). */
static void on_first_waiter(void *arg) {
  struct hvdl_engine *e = arg;
  if (e->batching) pthread_cond_signal(&e->work_cv); /* the burst is over */
}

/* The data communicator's watch (wait.c): completions are announced while the
 * engine waits, and a wait that has lasted ALARM_AFTER looks for alarms: an engine
 * alarm ends any wait, a data alarm for the step being run (or an earlier one) ends
 * its wait. Not sooner: a probe costs a wait that is about to end (the latency of a
 * small collective went up 5-14 % with alarms probed from the first sleep). */
#define ALARM_AFTER 1e-3
static hvdlResult_t on_data_wait(void *arg, double waited) {
  struct hvdl_engine *e = arg;
  hvdl_requests_notify(&e->requests, 0);
  if (waited < ALARM_AFTER) return hvdlSuccess;
  hvdl_alarm_poll(&e->alarm);
  if (e->alarm.engine_down) return hvdl_fail(e->data, hvdlRemoteError, "%s", e->alarm.engine.msg);
  if (e->in_data && hvdl_alarm_failed(&e->alarm, e->executor->step - 1))
    return hvdl_fail(e->data, (hvdlResult_t)e->alarm.first.code, "%s", e->alarm.first.msg);
  return hvdlSuccess;
}

/* The info line on the shared-memory path (rank 0's view; every rank's is alike). */
static void print_shm(const struct hvdl_engine *e) {
  const struct hvdl_shm *s = e->data->shm;
  const char *why = s && s->hosts == 1 ? hvdl_cma_off_reason(e->data) : NULL;
  fprintf(stderr, "hvd_lite: shared memory: %s%s\n",
          !s             ? "off (HVD_LITE_SHM=0, no host with two ranks, or no segment)"
          : s->hosts > 1 ? "on within each host"
          : !why         ? "on, with its single-copy form"
                         : "on, without its single-copy form: ",
          why ? why : "");
  fflush(stderr);
}

static double idle_tick(const struct hvdl_engine *e) {
  double tick = 1.0;
  if (e->cfg.stall_check_s > 0 && e->cfg.stall_check_s / 4 < tick) tick = e->cfg.stall_check_s / 4;
  if (e->cfg.stall_shutdown_s > 0 && e->cfg.stall_shutdown_s / 4 < tick)
    tick = e->cfg.stall_shutdown_s / 4;
  return tick < 0.01 ? 0.01 : tick;
}

static void *engine_main(void *arg) {
  struct hvdl_engine *e = arg;
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* 1 us: short sleeps stay short */
#endif
  hvdl_wait_yield_in_spins(1);
  const double tick = idle_tick(e);
  double next_tick = hvdl_now() + tick;
  double backoff = 0.0;            /* after a round without progress */
  double stuck_since = hvdl_now(); /* the last round that made progress */

  for (;;) {
    pthread_mutex_lock(&e->requests.mu);
    int backoff_done = 0;
    for (;;) {
      const double now = hvdl_now(),
                   batch = e->cfg.batch_time_ms * 1e-3; /* the tuner may change it */
      if (e->over || e->handed) break;
      if (e->turn == HVDL_TURN_CALLER || (e->caller_expected && now < e->caller_deadline)) {
        /* A caller runs the round, or is about to (the fast path): wait for it. */
        struct timespec ts;
        double until = e->turn == HVDL_TURN_CALLER ? next_tick - now : e->caller_deadline - now;
        hvdl_deadline(&ts, until > 0 ? until : 0);
        pthread_cond_timedwait(&e->work_cv, &e->requests.mu, &ts);
        continue;
      }
      if (e->stop_requested || (now >= next_tick && !e->hold)) break;
      if (e->hold) { /* a group is being submitted: wait for its end */
        pthread_cond_wait(&e->work_cv, &e->requests.mu);
        continue;
      }
      if (backoff_done && e->requests.head) break;
      if (e->nnew && !e->requests.nwaiting && !e->at_once && now - e->first_new < batch) {
        /* New requests, and nobody waits yet: let more come, so that a burst enters one
         * round (submissions do not wake us meanwhile; the first wait does). */
        struct timespec ts;
        hvdl_deadline(&ts, e->first_new + batch - now);
        e->batching = 1;
        pthread_cond_timedwait(&e->work_cv, &e->requests.mu, &ts);
        e->batching = 0;
        continue;
      }
      if (e->requests.head && (backoff == 0.0 || e->nnew)) break;
      struct timespec ts;
      double until = e->requests.head ? backoff : next_tick - now;
      hvdl_deadline(&ts, until < next_tick - now ? until : next_tick - now);
      int rc = pthread_cond_timedwait(&e->work_cv, &e->requests.mu, &ts);
      if (rc == ETIMEDOUT) backoff_done = 1;
    }
    if (e->over) {
      pthread_mutex_unlock(&e->requests.mu);
      break;
    }
    e->turn = HVDL_TURN_ENGINE;
    const int stage = e->handed;
    e->handed = HVDL_HANDED_NONE;
    if (stage == HVDL_HANDED_NONE) {
      e->leaving = e->stop_requested;
      if (e->leaving) {
        /* Pending requests fail here and now; the last round only says goodbye. */
        pthread_mutex_unlock(&e->requests.mu);
        hvdl_requests_fail_all(&e->requests, hvdlInvalidUsage, SHUT_DOWN);
        pthread_mutex_lock(&e->requests.mu);
      }
      if (hvdl_turn_take_locked(e) != 0) {
        hvdl_turn_give_back_locked(e, HVDL_HANDED_NONE, 1);
        pthread_mutex_unlock(&e->requests.mu);
        hvdl_requests_fail_all(&e->requests, hvdlSystemError, "hvd_lite engine: out of memory");
        break;
      }
    }
    pthread_mutex_unlock(&e->requests.mu);

    hvdlResult_t res = hvdlSuccess;
    int finished = 0;
    if (stage == HVDL_HANDED_NONE) {
      if (e->cfg.cycle_time_ms > 0)
        hvdl_sleep(e->last_round + e->cfg.cycle_time_ms * 1e-3 - hvdl_now());
      e->last_round = hvdl_now();
      res = hvdl_round_post(e->negotiator, e->pending, e->npending, e->leaving);
    }
    if (stage != HVDL_HANDED_READY) res = hvdl_turn_finish_round(e, res, &finished);
    if (res == hvdlSuccess) res = hvdl_turn_execute(e);
    const int progress = e->nready > 0 || e->had_new;
    const int over = hvdl_turn_end(e, res, finished);
    pthread_mutex_lock(&e->requests.mu);
    hvdl_turn_give_back_locked(e, HVDL_HANDED_NONE, over);
    pthread_mutex_unlock(&e->requests.mu);
    hvdl_requests_notify(&e->requests, 1);
    if (over) break;
    const double now = hvdl_now();
    next_tick = now + tick;
    if (progress) {
      backoff = 0.0;
      stuck_since = now;
    } else {
      backoff = hvdl_wait_next_sleep(&no_progress, backoff, now - stuck_since);
    }
  }
  hvdl_requests_fail_all(&e->requests, hvdlInvalidUsage, SHUT_DOWN);
  hvdl_executor_unpin(e->executor, 1); /* no settle is coming */
  return NULL;
}

/* The engine thread leaves a synchronous submission to its caller (engine_turn.c's fast
 * path) for this long before it runs the round itself. */
#define CALLER_GRACE 2e-3

hvdlResult_t hvdl_engine_start(struct hvdl_engine **out, MPI_Comm base,
                               const struct hvdl_engine_config *cfg) {
  *out = NULL;
  struct hvdl_engine *e = calloc(1, sizeof *e);
  if (!e) return hvdl_fail(NULL, hvdlSystemError, "hvd_lite engine: out of memory");
  e->cfg = *cfg;
  e->ctrl = MPI_COMM_NULL;
  hvdl_requests_init(&e->requests, cfg->notify_time_ms * 1e-3, on_first_waiter, e);
  pthread_cond_init(&e->work_cv, NULL);
  hvdl_outpool_init(&e->outpool);
  hvdlResult_t res = hvdlCommInitMpi(&e->data, base, &cfg->comm);
  if (res != hvdlSuccess) {
    hvdl_engine_free(e);
    return res;
  }
  int err = MPI_Comm_dup(base, &e->ctrl);
  if (err != MPI_SUCCESS) {
    e->ctrl = MPI_COMM_NULL;
    hvdl_engine_free(e);
    return hvdl_fail_mpi(NULL, err, "MPI_Comm_dup of the control communicator");
  }
  MPI_Comm_set_errhandler(e->ctrl, MPI_ERRORS_RETURN);
  e->rank = e->data->rank;
  e->size = e->data->size;
  res = hvdl_alarm_init(&e->alarm, e->ctrl);
  if (res != hvdlSuccess) {
    hvdl_engine_free(e);
    return res;
  }
  e->data->watch = on_data_wait;
  e->data->watch_arg = e;
  e->data->data_timeout = cfg->data_timeout_s;
  e->data->faults = &e->faults;
  for (int i = 0; i < cfg->nfaults; i++)
    if (cfg->faults[i].rank == e->rank)
      atomic_store(&e->faults.armed[cfg->faults[i].point], cfg->faults[i].n);
  e->negotiator = malloc(sizeof *e->negotiator);
  e->executor = calloc(1, sizeof *e->executor);
  if (!e->negotiator || !e->executor) {
    free(e->negotiator);
    e->negotiator = NULL;
    hvdl_engine_free(e);
    return hvdl_fail(NULL, hvdlSystemError, "hvd_lite engine: out of memory");
  }
  res = hvdl_negotiator_init(e->negotiator, e->data, e->ctrl, &e->requests, &e->alarm, cfg);
  if (res != hvdlSuccess) {
    hvdl_engine_free(e);
    return res;
  }
  e->executor->data = e->data;
  e->executor->fusion_threshold = cfg->fusion_threshold;
  e->executor->requests = &e->requests;
  e->executor->outpool = &e->outpool;
  e->executor->alarm = &e->alarm;
  if (e->rank == 0 && cfg->timeline[0]) {
    e->timeline = e->executor->timeline = hvdl_timeline_open(cfg->timeline);
    if (!e->timeline) {
      hvdl_engine_free(e);
      return hvdl_fail(NULL, hvdlInvalidArgument, "HVD_LITE_TIMELINE=%s: cannot create the file",
                       cfg->timeline);
    }
  }
  const struct hvdl_tune_targets at = {&e->executor->fusion_threshold,
                                       &e->data->config.segmentBytes, &e->cfg.batch_time_ms,
                                       &e->cfg.cycle_time_ms, &e->requests.mu};
  if ((res = hvdl_autotune_init(&e->tuner, cfg, e->rank, e->data, &at)) != hvdlSuccess) {
    hvdl_engine_free(e);
    return res;
  }
  e->negotiator->tune_out = hvdl_autotune_word(&e->tuner);
  if (e->rank == 0) hvdl_engine_config_print(cfg, e->size, &e->data->config);
  if (e->rank == 0 && cfg->log_level <= HVDL_LOG_INFO) print_shm(e);
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
    hvdl_engine_free(e);
    return hvdl_fail(NULL, hvdlSystemError, "hvd_lite engine: cannot start its thread");
  }
  e->thread_started = 1;
  *out = e;
  return hvdlSuccess;
}

hvdlResult_t hvdl_engine_submit(struct hvdl_engine *e, struct hvdl_request *r, int at_once) {
  return hvdl_engine_submit_group(e, &r, 1, at_once);
}

hvdlResult_t hvdl_engine_submit_group(struct hvdl_engine *e, struct hvdl_request **rs, int n,
                                      int at_once) {
  const double now = hvdl_now();
  for (int i = 0; i < n; i++) {
    rs[i]->name_hash = hvdl_name_hash(rs[i]->desc.name);
    rs[i]->phase = HVDL_PHASE_NEW;
    rs[i]->cache_id = -1;
    rs[i]->t_submit = now;
  }
  pthread_mutex_lock(&e->requests.mu);
  hvdlResult_t res =
      e->stop_requested && !e->requests.dead
          ? hvdl_fail(NULL, hvdlInvalidUsage, "hvd_lite is shutting down on this rank")
          : hvdl_requests_add_all_locked(&e->requests, rs, n);
  if (res == hvdlSuccess && n > 0) {
    if (e->nnew == 0) e->first_new = now;
    e->nnew += n;
    e->at_once |= at_once;
    if (at_once && e->cfg.fast_path_bytes > 0 && e->cfg.cycle_time_ms <= 0 &&
        e->turn == HVDL_TURN_FREE) {
      /* its caller will run the round (hvdl_turn_run_for): no hand-off */
      e->caller_expected = 1;
      e->caller_deadline = now + CALLER_GRACE;
    } else if (!e->batching || at_once) {
      pthread_cond_signal(&e->work_cv);
    }
  }
  pthread_mutex_unlock(&e->requests.mu);
  return res;
}

void hvdl_engine_hold(struct hvdl_engine *e, int on) {
  pthread_mutex_lock(&e->requests.mu);
  e->hold += on ? 1 : -1;
  if (e->hold <= 0) {
    e->hold = 0;
    pthread_cond_signal(&e->work_cv);
  }
  pthread_mutex_unlock(&e->requests.mu);
}

void hvdl_engine_get_stats(struct hvdl_engine *e, struct hvdl_engine_stats *out) {
  const struct hvdl_negotiate_stats *st = &e->negotiator->stats;
  out->rounds = atomic_load_explicit(&st->rounds, memory_order_relaxed);
  out->slow_rounds = atomic_load_explicit(&st->slow_rounds, memory_order_relaxed);
  out->shm_rounds = atomic_load_explicit(&st->shm_rounds, memory_order_relaxed);
  out->announced = atomic_load_explicit(&st->announced, memory_order_relaxed);
  out->cached_ready = atomic_load_explicit(&st->cached_ready, memory_order_relaxed);
  out->caller_turns = atomic_load_explicit(&e->caller_turns, memory_order_relaxed);
  out->device_steps = atomic_load_explicit(&e->executor->device_steps, memory_order_relaxed);
  out->step_seconds =
      1e-9 * (double)atomic_load_explicit(&e->executor->busy_ns, memory_order_relaxed);
  out->shm_views = e->data->shm ? hvdl_mem_views(e->data->shm) : 0;
  out->shm_stand_ins = e->data->shm ? hvdl_cma_stand_ins(e->data->shm) : 0;
}

void hvdl_engine_inject_fault(struct hvdl_engine *e, int point, int n) {
  if (point >= 0 && point < HVDL_FAULT_POINTS) atomic_store(&e->faults.armed[point], n > 0 ? n : 0);
}

int hvdl_engine_fault_hit(struct hvdl_engine *e, int point) {
  return point >= 0 && point < HVDL_FAULT_POINTS && hvdl_fault_hit(&e->faults, point);
}

hvdlResult_t hvdl_engine_stop(struct hvdl_engine *e) {
  hvdl_engine_stop_for(e, -1.0);
  return hvdlSuccess;
}

int hvdl_engine_stop_for(struct hvdl_engine *e, double seconds) {
  if (!e->thread_started) return 1;
  pthread_mutex_lock(&e->requests.mu);
  e->stop_requested = 1;
  pthread_cond_signal(&e->work_cv);
  pthread_mutex_unlock(&e->requests.mu);
#ifdef __GLIBC__
  if (seconds >= 0) {
    struct timespec ts;
    hvdl_deadline(&ts, seconds);
    if (pthread_timedjoin_np(e->thread, NULL, &ts) != 0) return 0;
  } else {
    pthread_join(e->thread, NULL);
  }
#else
  (void)seconds; /* no timed join: wait for the thread */
  pthread_join(e->thread, NULL);
#endif
  e->thread_started = 0;
  return 1;
}

void hvdl_engine_free(struct hvdl_engine *e) {
  if (!e) return;
  if (e->thread_started) hvdl_engine_stop(e);
  hvdl_requests_fail_all(&e->requests, hvdlInvalidUsage, SHUT_DOWN);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (e->data) {
    if (finalized)
      hvdlCommAbort(e->data);
    else
      hvdlCommDestroy(e->data);
  }
  if (e->ctrl != MPI_COMM_NULL && !finalized) MPI_Comm_free(&e->ctrl);
  hvdl_timeline_close(e->timeline);
  hvdl_autotune_free(&e->tuner);
  if (e->negotiator) hvdl_negotiator_free(e->negotiator);
  if (e->executor) hvdl_executor_free(e->executor);
  hvdl_alarm_free(&e->alarm);
  free(e->negotiator);
  free(e->executor);
  hvdl_outpool_free(&e->outpool);
  free(e->pending);
  free(e->ready);
  hvdl_requests_destroy(&e->requests);
  pthread_cond_destroy(&e->work_cv);
  free(e);
}
