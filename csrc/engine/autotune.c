/*
 * autotune.c -- the autotuner (HVD_LITE_AUTOTUNE), after Horovod's
 * HOROVOD_AUTOTUNE but simpler and deterministic: for a given sequence of
 * scores it always tries the same parameters in the same order.
 *
 * What is tuned, each over a small grid:
 *
 *   parameter                    grid                              default
 *   fusion threshold             64 KiB, 256 KiB, 1, 4, 16, 64 MiB  256 KiB
 *   ring segment size            64 KiB, 256 KiB, 1, 4 MiB          256 KiB
 *   batch time                   0, 0.5, 1, 2, 5 ms                 1 ms
 *   cycle time                   0, 1, 5 ms                         0
 *
 * A parameter the user set (HVD_LITE_FUSION_THRESHOLD, _SEGMENT_BYTES,
 * _BATCH_TIME, _CYCLE_TIME) is kept as set, as Horovod does.
 *
 * The score. A sample is HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE training steps; its
 * score is the bytes the engine executed in them per second of wall time (so it
 * counts the time between rounds too: a batch time that delays every step shows).
 * A step begins at the round in which a name comes back that was ready in an
 * earlier round of the current step: every tensor of a model is reduced once a
 * step, so this finds the step without being told, whether it takes one round or
 * ten. A window thus starts and ends at the same point of a step, and its count
 * of rounds does not matter. Rank 0 measures: no rank can leave a collective
 * before the slowest has joined it, so in steady state every rank sees the same
 * step time, and rank 0 is where the decision is made (measuring the slowest
 * rank instead would need another header word for nothing).
 *
 * The search: coordinate descent, one pass, then a confirmation. The first
 * HVD_LITE_AUTOTUNE_WARMUP_SAMPLES samples are dropped (caches, first-touch
 * allocations). Then a sample of the starting values, and, for each tuned
 * parameter in the order of the table, a sample of every other value in its grid
 * with the others at the best values found so far; the parameter keeps its best.
 * That is 1 + the sum of (grid length - 1) over the tuned parameters samples (15
 * with all four). One sample is noisier than the good values differ (the ResNet-50
 * step on 2 ranks: a 1 MiB fusion threshold scored 11 % over the default in a
 * sample twice, and is 2-5 % slower when the two run interleaved; docs/benchmarks.md),
 * so when the pass's best values are not the starting ones they must win again:
 * HVDL_TUNE_CONFIRM_PAIRS samples of each, in turn (the starting values first), and
 * they are kept only if their median score beats the starting values' median by
 * CONFIRM_MARGIN. The winner is the final choice, sent once more marked settled,
 * and nothing changes after that.
 *
 * Agreement. Fusion and segment size change what goes on the wire, so every rank
 * must switch at the same round. Rank 0 decides after a round and writes its
 * choice into its next round's header (request.h, the autotune word, as grid
 * indices); after that round every rank, rank 0 included, reads the word from the
 * allgathered headers and applies it before executing the round's ready list. A
 * sample starts only at a step that begins after its values were applied.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

#define KIB 1024.0
#define MIB (1024.0 * 1024.0)

static const double grid[HVDL_TUNE_PARAMS][6] = {
    {64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB},
    {64 * KIB, 256 * KIB, MIB, 4 * MIB},
    {0.0, 0.5, 1.0, 2.0, 5.0},
    {0.0, 1.0, 5.0}};
static const int grid_len[HVDL_TUNE_PARAMS] = {6, 4, 5, 3};

static int same_word(const struct hvdl_tune_word *a, const struct hvdl_tune_word *b) {
  return hvdl_tune_put(a) == hvdl_tune_put(b);
}

/* Under *at.mu, or by the turn holder. */
static void read_values(const struct hvdl_autotune *t, struct hvdl_tune_values *v) {
  v->fusion_threshold = *t->at.fusion_threshold;
  v->segment_bytes = *t->at.segment_bytes;
  v->batch_time_ms = *t->at.batch_time_ms;
  v->cycle_time_ms = *t->at.cycle_time_ms;
}

/* The values word w sets, the others as they are now. */
static void values_of(const struct hvdl_autotune *t, const struct hvdl_tune_word *w,
                      struct hvdl_tune_values *v) {
  read_values(t, v);
  const int *i = w->idx;
  if (i[HVDL_TUNE_FUSION] >= 0)
    v->fusion_threshold = (size_t)grid[HVDL_TUNE_FUSION][i[HVDL_TUNE_FUSION]];
  if (i[HVDL_TUNE_SEGMENT] >= 0)
    v->segment_bytes = (size_t)grid[HVDL_TUNE_SEGMENT][i[HVDL_TUNE_SEGMENT]];
  if (i[HVDL_TUNE_BATCH] >= 0) v->batch_time_ms = grid[HVDL_TUNE_BATCH][i[HVDL_TUNE_BATCH]];
  if (i[HVDL_TUNE_CYCLE] >= 0) v->cycle_time_ms = grid[HVDL_TUNE_CYCLE][i[HVDL_TUNE_CYCLE]];
}

static void apply(struct hvdl_autotune *t, const struct hvdl_tune_word *w, long round) {
  if (same_word(w, &t->applied)) return;
  struct hvdl_tune_values v;
  pthread_mutex_lock(t->at.mu);
  t->applied = *w;
  values_of(t, w, &v);
  *t->at.fusion_threshold = v.fusion_threshold;
  *t->at.segment_bytes = v.segment_bytes;
  *t->at.batch_time_ms = v.batch_time_ms;
  *t->at.cycle_time_ms = v.cycle_time_ms;
  if (t->nchanges < HVDL_TUNE_HISTORY)
    t->history[t->nchanges] =
        (struct hvdl_tune_change){.round = round, .v = v, .settled = w->settled};
  t->nchanges++;
  pthread_mutex_unlock(t->at.mu);
}

/* ---- finding the steps: the names ready since the current step began ---------- */

/* Open addressing, at most half full; a hash is stored with its low bit set, as 0
 * marks an empty slot. */
static int seen_has(const struct hvdl_autotune *t, uint64_t h) {
  if (t->seen_cap == 0) return 0;
  h |= 1;
  for (size_t i = h & (t->seen_cap - 1);; i = (i + 1) & (t->seen_cap - 1)) {
    if (t->seen[i] == h) return 1;
    if (t->seen[i] == 0) return 0;
  }
}

static void seen_put(uint64_t *slots, size_t cap, uint64_t h) {
  size_t i = h & (cap - 1);
  while (slots[i] != 0 && slots[i] != h) i = (i + 1) & (cap - 1);
  slots[i] = h;
}

static hvdlResult_t seen_add(struct hvdl_autotune *t, uint64_t h) {
  if (seen_has(t, h)) return hvdlSuccess;
  if (2 * (t->nseen + 1) > t->seen_cap) {
    const size_t cap = t->seen_cap ? t->seen_cap * 2 : 64;
    uint64_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return hvdl_fail(t->comm, hvdlSystemError, "autotune: out of memory");
    for (size_t i = 0; i < t->seen_cap; i++)
      if (t->seen[i]) seen_put(slots, cap, t->seen[i]);
    free(t->seen);
    t->seen = slots;
    t->seen_cap = cap;
  }
  seen_put(t->seen, t->seen_cap, h | 1);
  t->nseen++;
  return hvdlSuccess;
}

/* ---- the log ------------------------------------------------------------------ */

/* A line of the CSV (steps 0: the final choice, without a window) and of stderr at info level. */
static void log_row(struct hvdl_autotune *t, const char *kind, int no, long round,
                    const struct hvdl_tune_word *w, int steps, double bytes, double seconds,
                    double score) {
  struct hvdl_tune_values v;
  values_of(t, w, &v);
  if (t->log) {
    fprintf(t->log, "%s,%d,%ld,%zu,%zu,%g,%g,", kind, no, round, v.fusion_threshold,
            v.segment_bytes, v.batch_time_ms, v.cycle_time_ms);
    if (steps > 0)
      fprintf(t->log, "%d,%.0f,%.9g,%.9g\n", steps, bytes, seconds, score);
    else
      fprintf(t->log, ",,,%.9g\n", score);
    fflush(t->log);
  }
  if (t->log_level > HVDL_LOG_INFO) return;
  char what[96];
  if (steps == 0)
    snprintf(what, sizeof what, "settled after %d samples on sample %d's values", t->planned, no);
  else if (strcmp(kind, "warmup") == 0)
    snprintf(what, sizeof what, "warm-up sample %d of %d", no, t->warmups);
  else if (strcmp(kind, "confirm") == 0)
    snprintf(what, sizeof what, "sample %d of %d (confirming)", no, t->planned);
  else
    snprintf(what, sizeof what, "sample %d of %d", no, t->planned);
  fprintf(
      stderr,
      "hvd_lite: autotune %s: fusion threshold %zu B, segment %zu B, batch time %g ms, cycle time %g ms: "
      "%.4g B/s\n",
      what, v.fusion_threshold, v.segment_bytes, v.batch_time_ms, v.cycle_time_ms, score);
  fflush(stderr);
}

/* ---- the search ------------------------------------------------------------------- */

/* The confirmation keeps the pass's best values only if the median of their samples
 * beats the starting values' median by this much. */
#define CONFIRM_MARGIN 0.02

_Static_assert(HVDL_TUNE_CONFIRM_PAIRS % 2 == 1, "an odd count: the median is a sample");

static double median(const double *v) {
  double s[HVDL_TUNE_CONFIRM_PAIRS];
  memcpy(s, v, sizeof s);
  for (int i = 1; i < HVDL_TUNE_CONFIRM_PAIRS; i++) /* insertion sort: a handful of values */
    for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
      const double x = s[j];
      s[j] = s[j - 1];
      s[j - 1] = x;
    }
  return s[HVDL_TUNE_CONFIRM_PAIRS / 2];
}

/* The final choice: w, sent once more marked settled; the search is over. */
static void settle(struct hvdl_autotune *t, const struct hvdl_tune_word *w, int sample,
                   double score, long round) {
  t->proposed = *w;
  t->proposed.settled = 1;
  t->searching = 0;
  log_row(t, "best", sample, round, w, 0, 0, 0, score);
  free(t->seen);
  t->seen = NULL;
  t->seen_cap = t->nseen = 0;
}

/* After a sample of the proposed values scored `score`: the next values to try, or
 * the final choice. */
static void advance(struct hvdl_autotune *t, double score, long round) {
  if (t->confirm_done >= 0) { /* the confirmation: the starting values, then the best, in turn */
    const int i = t->confirm_done++;
    t->confirm_score[i % 2][i / 2] = score;
    if (t->confirm_done < 2 * HVDL_TUNE_CONFIRM_PAIRS) {
      t->proposed = t->confirm_done % 2 ? t->best : t->start;
      return;
    }
    const double start = median(t->confirm_score[0]), best = median(t->confirm_score[1]);
    if (best > start * (1 + CONFIRM_MARGIN))
      settle(t, &t->best, t->best_sample, best, round);
    else
      settle(t, &t->start, 1, start, round);
    return;
  }
  const int n = atomic_load(&t->samples);
  if (n == 1 || score > t->best_score) {
    t->best = t->proposed;
    t->best_score = score;
    t->best_sample = n;
  }
  for (; t->param < t->nparams; t->param++, t->k = -1) {
    const int p = t->order[t->param];
    if (t->k < 0) t->scan_from = t->best.idx[p];
    while (++t->k < grid_len[p])
      if (t->k != t->scan_from) {
        t->proposed = t->best;
        t->proposed.idx[p] = t->k;
        return;
      }
  }
  if (same_word(&t->best, &t->start)) {
    settle(t, &t->best, t->best_sample, t->best_score, round);
    return;
  }
  t->confirm_done = 0; /* the pass found other values: confirm them against the starting ones */
  t->planned += 2 * HVDL_TUNE_CONFIRM_PAIRS;
  t->proposed = t->start;
}

static void sample_done(struct hvdl_autotune *t, long round, double now) {
  const double seconds = now - t->t0 > 1e-9 ? now - t->t0 : 1e-9, score = t->bytes / seconds;
  if (t->warmup_left > 0) {
    t->warmup_left--;
    log_row(t, "warmup", t->warmups - t->warmup_left, round, &t->proposed, t->steps, t->bytes,
            seconds, score);
    return;
  }
  atomic_fetch_add(&t->samples, 1);
  log_row(t, t->confirm_done >= 0 ? "confirm" : "sample", atomic_load(&t->samples), round,
          &t->proposed, t->steps, t->bytes, seconds, score);
  advance(t, score, round);
}

/* Rank 0: one round's ready list, measured. */
static hvdlResult_t measure(struct hvdl_autotune *t, long round, struct hvdl_request *const *ready,
                            int n) {
  double bytes = 0;
  int boundary = 0;
  for (int i = 0; i < n; i++) {
    if (ready[i]->zeros) continue; /* a joined rank's stand-in */
    bytes += (double)ready[i]->nbytes;
    boundary |= seen_has(t, ready[i]->name_hash);
  }
  if (boundary) {
    memset(t->seen, 0, sizeof *t->seen * t->seen_cap);
    t->nseen = 0;
  }
  for (int i = 0; i < n; i++)
    if (!ready[i]->zeros) HVDL_CHECK(seen_add(t, ready[i]->name_hash));
  if (!same_word(&t->applied, &t->proposed))
    return hvdlSuccess; /* its values are not in effect yet */
  const double now = hvdl_now();
  if (boundary && t->started && ++t->steps == t->steps_per_sample) {
    sample_done(t, round, now);
    /* The next sample starts here if the values stay, else at a step after they change. */
    t->started = t->searching && same_word(&t->applied, &t->proposed);
    t->steps = 0;
    t->t0 = now;
    t->bytes = 0;
  } else if (boundary && !t->started) {
    t->started = 1;
    t->steps = 0;
    t->t0 = now;
    t->bytes = 0;
  }
  t->bytes += bytes;
  return hvdlSuccess;
}

/* ---- the unit's interface ------------------------------------------------------- */

static const char *const param_names[HVDL_TUNE_PARAMS] = {"fusion threshold", "segment size",
                                                          "batch time", "cycle time"};

hvdlResult_t hvdl_autotune_init(struct hvdl_autotune *t, const struct hvdl_engine_config *cfg,
                                int rank, hvdlComm_t comm, const struct hvdl_tune_targets *at) {
  memset(t, 0, sizeof *t);
  t->confirm_done = -1;
  t->at = *at;
  t->comm = comm;
  t->rank = rank;
  t->log_level = cfg->log_level;
  for (int p = 0; p < HVDL_TUNE_PARAMS; p++) t->applied.idx[p] = t->proposed.idx[p] = -1;
  if (rank != 0 || !cfg->autotune) return hvdlSuccess;
  t->searching = 1;
  t->warmup_left = t->warmups = cfg->autotune_warmup;
  t->steps_per_sample = cfg->autotune_steps;
  t->planned = 1;
  t->k = -1;
  struct hvdl_tune_values v;
  read_values(t, &v);
  const double now[HVDL_TUNE_PARAMS] = {(double)v.fusion_threshold, (double)v.segment_bytes,
                                        v.batch_time_ms, v.cycle_time_ms};
  char names[128] = "";
  size_t len = 0;
  for (int p = 0; p < HVDL_TUNE_PARAMS; p++) {
    int at_idx = -1;
    for (int i = 0; i < grid_len[p]; i++)
      if (grid[p][i] == now[p]) at_idx = i;
    if ((cfg->autotune_fixed >> p) & 1u || at_idx < 0) continue; /* set by the user: kept */
    t->order[t->nparams++] = p;
    t->proposed.idx[p] = at_idx;
    t->planned += grid_len[p] - 1;
    len +=
        (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", param_names[p]);
  }
  t->start = t->proposed;
  if (cfg->autotune_log[0]) {
    t->log = fopen(cfg->autotune_log, "w");
    if (!t->log)
      return hvdl_fail(NULL, hvdlInvalidArgument,
                       "HVD_LITE_AUTOTUNE_LOG=%s: cannot create the file", cfg->autotune_log);
    fprintf(
        t->log,
        "kind,sample,round,fusion_threshold,segment_bytes,batch_time_ms,cycle_time_ms,steps,bytes,"
        "seconds,score\n");
    fflush(t->log);
  }
  if (t->log_level <= HVDL_LOG_INFO) {
    fprintf(
        stderr,
        "hvd_lite: autotune: tuning %s in %d samples of %d steps (%d more to confirm a change), "
        "after %d warm-up samples\n",
        t->nparams ? names : "nothing (every parameter is set)", t->planned, t->steps_per_sample,
        2 * HVDL_TUNE_CONFIRM_PAIRS, t->warmup_left);
    fflush(stderr);
  }
  return hvdlSuccess;
}

uint64_t hvdl_autotune_word(const struct hvdl_autotune *t) {
  return t->searching || t->proposed.settled ? hvdl_tune_put(&t->proposed) : 0;
}

hvdlResult_t hvdl_autotune_round(struct hvdl_autotune *t, uint64_t word, long round,
                                 struct hvdl_request *const *ready, int n, uint64_t *next) {
  if (word != 0) {
    struct hvdl_reader rd;
    struct hvdl_tune_word w;
    hvdl_reader_init(&rd, &word, sizeof word);
    if (hvdl_tune_get(&rd, grid_len, &w)) return hvdl_reader_fail(t->comm, &rd, "autotune word", 0);
    apply(t, &w, round);
  }
  if (t->searching && n > 0) HVDL_CHECK(measure(t, round, ready, n));
  *next = hvdl_autotune_word(t);
  return hvdlSuccess;
}

int hvdl_autotune_state(struct hvdl_autotune *t, struct hvdl_tune_values *now, int *settled,
                        int *samples, struct hvdl_tune_change *changes, int cap) {
  pthread_mutex_lock(t->at.mu);
  read_values(t, now);
  *settled = t->applied.settled;
  *samples = atomic_load(&t->samples);
  const int n = t->nchanges;
  for (int i = 0; i < n && i < cap && i < HVDL_TUNE_HISTORY; i++) changes[i] = t->history[i];
  pthread_mutex_unlock(t->at.mu);
  return n;
}

void hvdl_autotune_free(struct hvdl_autotune *t) {
  if (t->log) fclose(t->log);
  t->log = NULL;
  free(t->seen);
  t->seen = NULL;
}
