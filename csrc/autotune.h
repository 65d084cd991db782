/*
 * autotune.h -- the autotuner (HVD_LITE_AUTOTUNE): rank 0 measures the engine's
 * throughput and searches for the fusion threshold, the ring segment size and the
 * batch and cycle times; its choice travels in its round header (wire.h, the
 * autotune word) and every rank applies it after the same round (autotune.c has
 * the search). It calls wire.c and base.c; the engine calls it after every round.
 */
#ifndef HVDL_AUTOTUNE_H_
#define HVDL_AUTOTUNE_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "wire.h"

/* The values of the tunable parameters. */
struct hvdl_tune_values {
  size_t fusion_threshold, segment_bytes;
  double batch_time_ms, cycle_time_ms;
};

/* A word every rank applied: after round `round`, these values (settled: the final choice). */
struct hvdl_tune_change {
  long round;
  struct hvdl_tune_values v;
  int settled;
};

/* Where the tuned values live. The thread that holds the engine's turn writes them,
 * the two times under *mu (other threads read those under it). */
struct hvdl_tune_targets {
  size_t *fusion_threshold, *segment_bytes;
  double *batch_time_ms, *cycle_time_ms;
  pthread_mutex_t *mu;
};

#define HVDL_TUNE_HISTORY 64

/* Samples of each of the two contenders in the confirmation (autotune.c). */
#define HVDL_TUNE_CONFIRM_PAIRS 3

struct hvdl_autotune {
  struct hvdl_tune_targets at;
  hvdlComm_t comm;               /* where a malformed word is recorded */
  int rank, log_level;
  struct hvdl_tune_word applied; /* the last word applied (every idx -1: none yet) */
  struct hvdl_tune_change history[HVDL_TUNE_HISTORY]; /* the words applied, under *at.mu */
  int nchanges;                  /* under *at.mu; past HVDL_TUNE_HISTORY only counted */
  _Atomic int samples;           /* rank 0: samples scored so far (warm-up ones not counted) */

  /* Rank 0's search; owned by the turn holder. */
  int searching;
  int warmups, warmup_left, steps_per_sample, planned;
  int order[HVDL_TUNE_PARAMS], nparams; /* the tuned parameters, in the order they are tuned */
  int param, scan_from, k;       /* the parameter being scanned, its value before, the one tried */
  struct hvdl_tune_word proposed, best, start;
  double best_score;
  int best_sample;
  /* the confirmation: the starting values and the pass's best, sampled in turn */
  int confirm_done;              /* confirmation samples scored so far (-1: none planned) */
  double confirm_score[2][HVDL_TUNE_CONFIRM_PAIRS]; /* [0] the starting values, [1] the best */
  /* the sample being measured: steps counted from t0, bytes executed since */
  int started, steps;
  double t0, bytes;
  uint64_t *seen;                /* hashes of the names ready since the last step began */
  size_t seen_cap, nseen;
  FILE *log;                     /* HVD_LITE_AUTOTUNE_LOG */
};

/* Sets the tuner up; on rank 0 with cfg->autotune, starts the search from the
 * targets' values (and opens the log). */
hvdlResult_t hvdl_autotune_init(struct hvdl_autotune *t, const struct hvdl_engine_config *cfg, int rank,
                                hvdlComm_t comm, const struct hvdl_tune_targets *at);
/* Every rank, after each round and before its ready list runs: applies rank 0's
 * autotune word of the round (`word`, checked: hvdlInternalError when malformed);
 * on rank 0 also measures the round's ready list and moves the search on. *next:
 * the word for this rank's next round (0 except on rank 0). */
hvdlResult_t hvdl_autotune_round(struct hvdl_autotune *t, uint64_t word, long round,
                                 struct hvdl_request *const *ready, int n, uint64_t *next);
/* The word rank 0 sends now (0 when it is not tuning). */
uint64_t hvdl_autotune_word(const struct hvdl_autotune *t);
/* Any thread: the values in effect, whether the last word applied was the final
 * choice, the samples scored (rank 0), and the first `cap` changes applied;
 * returns the number of changes. */
int hvdl_autotune_state(struct hvdl_autotune *t, struct hvdl_tune_values *now, int *settled, int *samples,
                        struct hvdl_tune_change *changes, int cap);
void hvdl_autotune_free(struct hvdl_autotune *t);

#endif /* HVDL_AUTOTUNE_H_ */
