/*
 * config.c -- every HVD_LITE_* environment variable the C core reads, parsed
 * here and nowhere else (docs/tuning.md lists the same table).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"

/* Defaults chosen by measurement (docs/benchmarks-history.md): 256 KiB segments took a
 * ResNet-50 gradient step (2 ranks) from 0.98-1.01x to 0.96-0.98x MPI per tensor and
 * were as good or better than 512 KiB from 4 to 256 MiB (section 12; 512 KiB had been
 * best in the older section 5); the latency path beat the ring up to 128 KiB at 2
 * ranks but only up to 2 KiB at 3 and 4. */
#define DEFAULT_SEGMENT_BYTES          ((size_t)256 * 1024)
#define DEFAULT_SMALL_BYTES_2_RANKS    ((size_t)128 * 1024)
#define DEFAULT_SMALL_BYTES_MORE_RANKS ((size_t)2 * 1024)
/* 256 KiB fusion buffers stay in cache: a ResNet-50 step at 2 ranks took 22.6 ms with
 * them, 31 ms with 4 MiB (the packing copies fall out of L2), 24.8 ms unfused. */
#define DEFAULT_FUSION_BYTES ((size_t)256 * 1024)
/* A ResNet-50 step at 2 ranks on 2 cores (docs/benchmarks-history.md, section 12): waking the
 * waiting training thread at most every 2 ms instead of after each handle took it from
 * 0.98-0.99x to 0.96-0.97x MPI per tensor. Letting the 161 submissions gather for 1 ms
 * (one round instead of three, no engine competing with the submitting thread) left the
 * median alike but the spread narrower: 0.95-0.98x in 8 runs, against 0.95-1.02x. */
#define DEFAULT_BATCH_MS  1.0
#define DEFAULT_NOTIFY_MS 2.0
/* A waiting caller runs the round and the collective itself (engine.c's fast path) up to
 * this many bytes; larger ready lists go to the engine thread, whose caller waits
 * interruptibly. */
#define DEFAULT_FAST_PATH_BYTES ((size_t)16 << 20)
/* The shared-memory path's chunk (segment.c): 4 areas of this many bytes per rank. Measured at 2
 * ranks (docs/benchmarks-history.md, "Shared memory against the ring", "The chunk"): 256 KiB areas
 * took shm's 1-4 MiB all-reduce from 0.77-1.22x MPI's time to 0.74-1.12x (C API, in the
 * cache), and the engine's 1 MiB all-reduce from 216-281 to 181-219 us, the fused step alike;
 * 64 and 128 KiB were no better, and a chunk's counter updates stay small beside its copies. */
#define DEFAULT_SHM_BYTES ((size_t)256 << 10)
/* The single-copy all-reduce's stand-in for plain buffers (single_copy.c's hvdl_cma_stand_in), up
 * to this many bytes per rank. At 2 ranks on small pages (docs/benchmarks-history.md, "A stand-in for
 * plain buffers"; the C API in place) it took less time than the kernel's copies in every run up
 * to 4 MiB (1.06-1.95x), was mixed at 8 MiB (0.82-1.07x) and took more from 16 MiB; each
 * communicator's stand-in is a region of this size, whose pages count once touched. */
#define DEFAULT_SHM_STAND_IN_BYTES ((size_t)4 << 20)
#define MIN_SHM_BYTES              ((size_t)64)
#define MAX_SHM_BYTES              ((size_t)1 << 30)
/* Limits keep every MPI message count within an int. */
#define MAX_SEGMENT_BYTES ((size_t)1 << 30)
#define MAX_SMALL_BYTES   HVDL_SMALL_BYTES_MAX
#define MAX_FUSION_BYTES  ((size_t)1 << 30)

static hvdlResult_t env_size(const char *name, size_t dflt, size_t min, size_t max, size_t *out) {
  const char *s = getenv(name);
  *out = dflt;
  if (!s || !*s) return hvdlSuccess;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end != '\0' || s[0] == '-' || v < min || v > max)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "%s=%s is not valid: expected an integer number of bytes in [%zu, %zu]", name,
                     s, min, max);
  *out = (size_t)v;
  return hvdlSuccess;
}

static hvdlResult_t env_int(const char *name, int dflt, int min, int max, int *out) {
  const char *s = getenv(name);
  *out = dflt;
  if (!s || !*s) return hvdlSuccess;
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end != '\0' || v < min || v > max)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "%s=%s is not valid: expected an integer in [%d, %d]", name, s, min, max);
  *out = (int)v;
  return hvdlSuccess;
}

static int env_set(const char *name) {
  const char *s = getenv(name);
  return s && *s;
}

/* A path variable into buf (cap bytes with the NUL): unset or empty keeps buf; a longer
 * value is refused. */
static hvdlResult_t env_path(const char *name, char *buf, size_t cap) {
  const char *v = getenv(name);
  if (!v || !*v) return hvdlSuccess;
  if (strlen(v) >= cap)
    return hvdl_fail(NULL, hvdlInvalidArgument, "%s is longer than %zu bytes", name, cap - 1);
  strcpy(buf, v);
  return hvdlSuccess;
}

static hvdlResult_t env_seconds(const char *name, double dflt, double max, double *out) {
  const char *s = getenv(name);
  *out = dflt;
  if (!s || !*s) return hvdlSuccess;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end != '\0' || !(v >= 0.0) || v > max)
    return hvdl_fail(NULL, hvdlInvalidArgument, "%s=%s is not valid: expected a number in [0, %g]",
                     name, s, max);
  *out = v;
  return hvdlSuccess;
}

/* A 0/1 switch, 1 when unset. */
static hvdlResult_t env_switch(const char *name, int *out) {
  const char *s = getenv(name);
  *out = 1;
  if (!s || !*s) return hvdlSuccess;
  if (strcmp(s, "0") != 0 && strcmp(s, "1") != 0)
    return hvdl_fail(NULL, hvdlInvalidArgument, "%s=%s is not valid: expected 0 (off) or 1 (on)",
                     name, s);
  *out = s[0] == '1';
  return hvdlSuccess;
}

size_t hvdl_shm_bytes_default(void) { return DEFAULT_SHM_BYTES; }

hvdlResult_t hvdl_config_ranks_per_host(int *k) {
  size_t v = 0;
  HVDL_CHECK(env_size("HVD_LITE_RANKS_PER_HOST", 0, 0, 1 << 24, &v));
  *k = (int)v;
  return hvdlSuccess;
}

/* On one host the measured crossovers; across hosts none: the cost model's
 * algorithms take every size (the latency path receives (n-1) * bytes per rank). */
size_t hvdl_small_bytes_default(int nranks, int hosts) {
  if (hosts > 1) return 0;
  return nranks <= 2 ? DEFAULT_SMALL_BYTES_2_RANKS : DEFAULT_SMALL_BYTES_MORE_RANKS;
}

/* HVD_LITE_ALLREDUCE_ALGO's names, indexed by hvdlAlgorithm_t. */
static const char *const algo_names[hvdlNumAlgos] = {"auto",  "ring", "rd",       "rab", "hier",
                                                     "small", "shm",  "hier_p2p", "tree"};

const char *hvdl_algo_name(int algo) {
  return algo >= 0 && algo < hvdlNumAlgos ? algo_names[algo] : "?";
}

int hvdl_algo_parse(const char *name) {
  for (int i = 0; i < hvdlNumAlgos; i++)
    if (strcasecmp(name, algo_names[i]) == 0) return i;
  return -1;
}

/* HVD_LITE_BROADCAST_ALGO's names, indexed by hvdlBroadcastAlgorithm_t. */
static const char *const bcast_names[hvdlNumBcastAlgos] = {"auto",    "chain", "tree",
                                                           "scatter", "shm",   "hier_p2p"};

const char *hvdl_bcast_algo_name(int algo) {
  return algo >= 0 && algo < hvdlNumBcastAlgos ? bcast_names[algo] : "?";
}

/* HVD_LITE_ALLGATHER_ALGO's and HVD_LITE_REDUCESCATTER_ALGO's names, indexed by
 * hvdlAllGatherAlgorithm_t and hvdlReduceScatterAlgorithm_t. */
static const char *const allgather_names[hvdlNumAllGatherAlgos] = {"auto",   "ring", "rd",
                                                                   "rd_far", "shm",  "hier_p2p"};
static const char *const reducescatter_names[hvdlNumReduceScatterAlgos] = {
    "auto", "ring", "halving", "shm", "hier_p2p"};

const char *hvdl_allgather_algo_name(int algo) {
  return algo >= 0 && algo < hvdlNumAllGatherAlgos ? allgather_names[algo] : "?";
}

const char *hvdl_reducescatter_algo_name(int algo) {
  return algo >= 0 && algo < hvdlNumReduceScatterAlgos ? reducescatter_names[algo] : "?";
}

/* HVD_LITE_ALLTOALL_ALGO's names, indexed by hvdlAllToAllAlgorithm_t. */
static const char *const alltoall_names[hvdlNumAllToAllAlgos] = {"auto", "pairwise", "bruck",
                                                                 "hier_p2p", "hier_pairs"};

const char *hvdl_alltoall_algo_name(int algo) {
  return algo >= 0 && algo < hvdlNumAllToAllAlgos ? alltoall_names[algo] : "?";
}

/* *out = the index of variable's value in names (unset or empty: 0, auto); a
 * value not there is refused, naming the valid ones (`expected`). */
static hvdlResult_t env_choice(const char *variable, const char *const *names, int count,
                               const char *expected, int *out) {
  const char *v = getenv(variable);
  *out = 0;
  if (!v || !*v) return hvdlSuccess;
  for (int i = 0; i < count; i++)
    if (strcasecmp(v, names[i]) == 0) return (*out = i), hvdlSuccess;
  return hvdl_fail(NULL, hvdlInvalidArgument, "%s=%s is not valid: expected %s", variable, v,
                   expected);
}

/* The cost model's defaults. Within a host, this machine (2 cores, Open MPI over
 * shared memory; docs/benchmarks.md): about 1.5 us per message (MPI_Allreduce of 4 B
 * takes 1.3 us at 2 ranks), 9.5 GB/s per copy (the 1 MiB ring), 10 GB/s reduced.
 * Across hosts, the simulated platform of sim/ (100 Gb/s NICs, 2 us host to host,
 * without SMPI's latency factors): a guess for a network nobody measured, used only
 * where the ranks span hosts and the measurement at init (select_measure.c) is off or
 * failed; the selector then keeps the ring out from 16 ranks (select_allreduce.c).
 * HVD_LITE_COST_MODEL_FILE replaces any of them (docs/scale.md). */
static const struct hvdl_cost_model default_model = {.alpha = {1.5e-6, 2e-6},
                                                     .beta = {1.05e-10, 8e-11},
                                                     .gamma = 1e-10,
                                                     .inter_source = HVDL_MODEL_DEFAULT,
                                                     .intra_source = HVDL_MODEL_DEFAULT};

hvdlResult_t hvdl_config_cost_model_measure(int *on) {
  return env_switch("HVD_LITE_COST_MODEL_MEASURE", on);
}

hvdlResult_t hvdl_config_check(const hvdlConfig_t *c) {
  if ((c->shmBytes && (c->shmBytes < MIN_SHM_BYTES || c->shmBytes > MAX_SHM_BYTES)) ||
      c->shmStandInBytes > MAX_SHM_BYTES || (c->disableShm != 0 && c->disableShm != 1) ||
      (c->disableShmCma != 0 && c->disableShmCma != 1) ||
      (c->adasumHierarchical != 0 && c->adasumHierarchical != 1))
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlConfig_t out of range: shmBytes %zu (%zu .. %zu, or 0 for the default), "
                     "shmStandInBytes %zu (0 .. %zu), disableShm %d, disableShmCma %d, "
                     "adasumHierarchical %d (0 or 1)",
                     c->shmBytes, MIN_SHM_BYTES, MAX_SHM_BYTES, c->shmStandInBytes, MAX_SHM_BYTES,
                     c->disableShm, c->disableShmCma, c->adasumHierarchical);
  if (c->allReduceAlgorithm < 0 || c->allReduceAlgorithm >= hvdlNumAlgos)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlConfig_t out of range: allReduceAlgorithm %d (valid: 0..%d)",
                     c->allReduceAlgorithm, hvdlNumAlgos - 1);
  if (c->broadcastAlgorithm < 0 || c->broadcastAlgorithm >= hvdlNumBcastAlgos)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlConfig_t out of range: broadcastAlgorithm %d (valid: 0..%d)",
                     c->broadcastAlgorithm, hvdlNumBcastAlgos - 1);
  if (c->allGatherAlgorithm < 0 || c->allGatherAlgorithm >= hvdlNumAllGatherAlgos ||
      c->reduceScatterAlgorithm < 0 || c->reduceScatterAlgorithm >= hvdlNumReduceScatterAlgos)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlConfig_t out of range: allGatherAlgorithm %d (valid: 0..%d), "
                     "reduceScatterAlgorithm %d (valid: 0..%d)",
                     c->allGatherAlgorithm, hvdlNumAllGatherAlgos - 1, c->reduceScatterAlgorithm,
                     hvdlNumReduceScatterAlgos - 1);
  if (c->allToAllAlgorithm < 0 || c->allToAllAlgorithm >= hvdlNumAllToAllAlgos)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlConfig_t out of range: allToAllAlgorithm %d (valid: 0..%d)",
                     c->allToAllAlgorithm, hvdlNumAllToAllAlgos - 1);
  if (c->segmentBytes > MAX_SEGMENT_BYTES ||
      (c->smallAllReduceBytes > MAX_SMALL_BYTES && c->smallAllReduceBytes != HVDL_SMALL_BYTES_AUTO))
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlConfig_t out of range: segmentBytes %zu (max %zu), "
                     "smallAllReduceBytes %zu (max %zu)",
                     c->segmentBytes, MAX_SEGMENT_BYTES, c->smallAllReduceBytes, MAX_SMALL_BYTES);
  return hvdlSuccess;
}

hvdlResult_t hvdlConfigDefault(hvdlConfig_t *config) {
  if (!config) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlConfigDefault: config is NULL");
  HVDL_CHECK(env_size("HVD_LITE_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES, 1, MAX_SEGMENT_BYTES,
                      &config->segmentBytes));
  HVDL_CHECK(env_size("HVD_LITE_SMALL_ALLREDUCE_BYTES", HVDL_SMALL_BYTES_AUTO, 0, MAX_SMALL_BYTES,
                      &config->smallAllReduceBytes));
  int shm;
  HVDL_CHECK(env_switch("HVD_LITE_SHM", &shm));
  config->disableShm = !shm;
  HVDL_CHECK(env_switch("HVD_LITE_SHM_CMA", &shm));
  config->disableShmCma = !shm;
  HVDL_CHECK(env_int("HVD_LITE_ADASUM_HIERARCHICAL", 0, 0, 1, &config->adasumHierarchical));
  HVDL_CHECK(env_size("HVD_LITE_SHM_BYTES", DEFAULT_SHM_BYTES, MIN_SHM_BYTES, MAX_SHM_BYTES,
                      &config->shmBytes));
  HVDL_CHECK(env_size("HVD_LITE_SHM_STAND_IN_BYTES", DEFAULT_SHM_STAND_IN_BYTES, 0, MAX_SHM_BYTES,
                      &config->shmStandInBytes));
  const char *algo = getenv("HVD_LITE_ALLREDUCE_ALGO");
  config->allReduceAlgorithm = hvdlAlgoAuto;
  if (algo && *algo) {
    const int a = hvdl_algo_parse(algo);
    if (a < 0)
      return hvdl_fail(
          NULL, hvdlInvalidArgument,
          "HVD_LITE_ALLREDUCE_ALGO=%s is not valid: expected auto, ring, rd, rab, tree, hier, "
          "hier_p2p, shm or small",
          algo);
    config->allReduceAlgorithm = a;
  }
  HVDL_CHECK(env_choice("HVD_LITE_BROADCAST_ALGO", bcast_names, hvdlNumBcastAlgos,
                        "auto, chain, tree, scatter, shm or hier_p2p",
                        &config->broadcastAlgorithm));
  HVDL_CHECK(env_choice("HVD_LITE_ALLGATHER_ALGO", allgather_names, hvdlNumAllGatherAlgos,
                        "auto, ring, rd, rd_far, shm or hier_p2p", &config->allGatherAlgorithm));
  HVDL_CHECK(env_choice("HVD_LITE_REDUCESCATTER_ALGO", reducescatter_names,
                        hvdlNumReduceScatterAlgos, "auto, ring, halving, shm or hier_p2p",
                        &config->reduceScatterAlgorithm));
  HVDL_CHECK(env_choice("HVD_LITE_ALLTOALL_ALGO", alltoall_names, hvdlNumAllToAllAlgos,
                        "auto, pairwise, bruck, hier_p2p or hier_pairs",
                        &config->allToAllAlgorithm));
  int k;
  HVDL_CHECK(
      hvdl_config_ranks_per_host(&k)); /* read by topology.c: refused here, before any traffic */
  HVDL_CHECK(hvdl_config_cost_model_measure(&k)); /* read by select_allreduce.c, on rank 0 */
  return hvdlSuccess;
}

/* The autotuner's knobs (csrc/engine/autotune.c). Horovod's defaults: 3 warm-up samples of 10 steps.
 * A knob the user set is kept as set; the sample knobs and the log without
 * HVD_LITE_AUTOTUNE=1 would do nothing, so they are refused. */
static hvdlResult_t config_autotune(struct hvdl_engine_config *c) {
  HVDL_CHECK(env_int("HVD_LITE_AUTOTUNE", 0, 0, 1, &c->autotune));
  HVDL_CHECK(env_int("HVD_LITE_AUTOTUNE_WARMUP_SAMPLES", 3, 0, 1000, &c->autotune_warmup));
  HVDL_CHECK(env_int("HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE", 10, 1, 1000000, &c->autotune_steps));
  static const char *others[] = {"HVD_LITE_AUTOTUNE_WARMUP_SAMPLES",
                                 "HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE", "HVD_LITE_AUTOTUNE_LOG"};
  for (int i = 0; i < 3 && !c->autotune; i++)
    if (env_set(others[i]))
      return hvdl_fail(
          NULL, hvdlInvalidArgument,
          "%s is set but HVD_LITE_AUTOTUNE is not 1: set HVD_LITE_AUTOTUNE=1 to tune, or unset it",
          others[i]);
  static const char *tuned[HVDL_TUNE_PARAMS] = {"HVD_LITE_FUSION_THRESHOLD",
                                                "HVD_LITE_SEGMENT_BYTES", "HVD_LITE_BATCH_TIME",
                                                "HVD_LITE_CYCLE_TIME"};
  for (int p = 0; p < HVDL_TUNE_PARAMS; p++)
    if (env_set(tuned[p])) c->autotune_fixed |= 1u << p;
  return env_path("HVD_LITE_AUTOTUNE_LOG", c->autotune_log, sizeof c->autotune_log);
}

/* HVD_LITE_COST_MODEL_FILE: lines `key value` (seconds, seconds per byte), '#'
 * comments; keys intra_alpha, intra_beta, inter_alpha, inter_beta, gamma, and
 * `inter_alpha_step bytes seconds` (up to HVDL_ALPHA_STEPS, ascending bytes): from
 * that many bytes up, a message across hosts has that latency. A file that names
 * any term across hosts makes them the file's, and one within a host those (neither
 * is measured at init then: select_measure.c). */
hvdlResult_t hvdl_config_cost_model(struct hvdl_cost_model *m) {
  static const char *const keys[] = {"intra_alpha", "inter_alpha", "intra_beta", "inter_beta",
                                     "gamma"};
  static const int across[] = {0, 1, 0, 1, -1}; /* 1 across, 0 within, -1 gamma */
  *m = default_model;
  double *slot[] = {&m->alpha[0], &m->alpha[1], &m->beta[0], &m->beta[1], &m->gamma};
  const char *path = getenv("HVD_LITE_COST_MODEL_FILE");
  if (!path || !*path) return hvdlSuccess;
  FILE *fp = fopen(path, "r");
  if (!fp)
    return hvdl_fail(NULL, hvdlInvalidArgument, "HVD_LITE_COST_MODEL_FILE=%s cannot be read: %s",
                     path, strerror(errno));
  char line[256];
  int lineno = 0;
  hvdlResult_t res = hvdlSuccess;
  while (res == hvdlSuccess && fgets(line, sizeof line, fp)) {
    lineno++;
    char key[64], extra[2];
    double v, w;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    if (sscanf(line, "%63s", key) == 1 && strcmp(key, "inter_alpha_step") == 0) {
      const int got = sscanf(line, "%63s %lf %lf %1s", key, &v, &w, extra);
      if (got != 3 || !(v >= 0) || v > 1e15 || !(w >= 0) || w > 1.0 ||
          m->steps == HVDL_ALPHA_STEPS || (m->steps && v <= m->step_bytes[m->steps - 1])) {
        res = hvdl_fail(NULL, hvdlInvalidArgument,
                        "HVD_LITE_COST_MODEL_FILE=%s, line %d: expected `inter_alpha_step bytes "
                        "seconds`, at most %d of them, bytes ascending and seconds in [0, 1]",
                        path, lineno, HVDL_ALPHA_STEPS);
        break;
      }
      m->step_bytes[m->steps] = v;
      m->step_alpha[m->steps++] = w;
      m->inter_source = HVDL_MODEL_FILE;
      continue;
    }
    int got = sscanf(line, "%63s %lf %1s", key, &v, extra);
    if (got <= 0) continue; /* blank or comment */
    int k = -1;
    for (int i = 0; i < (int)(sizeof keys / sizeof keys[0]); i++)
      if (strcmp(key, keys[i]) == 0) k = i;
    if (got != 2 || k < 0 || !(v >= 0) || v > 1.0)
      res = hvdl_fail(NULL, hvdlInvalidArgument,
                      "HVD_LITE_COST_MODEL_FILE=%s, line %d: expected `key value` with key one of "
                      "intra_alpha, intra_beta, inter_alpha, inter_beta, gamma and a value in "
                      "[0, 1] (seconds, seconds per byte), or `inter_alpha_step bytes seconds`",
                      path, lineno);
    else {
      *slot[k] = v;
      if (across[k] == 1) m->inter_source = HVDL_MODEL_FILE;
      if (across[k] == 0) m->intra_source = HVDL_MODEL_FILE;
    }
  }
  fclose(fp);
  return res;
}

hvdlResult_t hvdl_engine_config_default(struct hvdl_engine_config *c) {
  memset(c, 0, sizeof *c);
  HVDL_CHECK(hvdlConfigDefault(&c->comm));
  HVDL_CHECK(env_size("HVD_LITE_FUSION_THRESHOLD", DEFAULT_FUSION_BYTES, 0, MAX_FUSION_BYTES,
                      &c->fusion_threshold));
  HVDL_CHECK(env_seconds("HVD_LITE_CYCLE_TIME", 0.0, 1e4, &c->cycle_time_ms));
  HVDL_CHECK(env_seconds("HVD_LITE_BATCH_TIME", DEFAULT_BATCH_MS, 1e4, &c->batch_time_ms));
  HVDL_CHECK(env_seconds("HVD_LITE_NOTIFY_TIME", DEFAULT_NOTIFY_MS, 1e4, &c->notify_time_ms));
  HVDL_CHECK(env_seconds("HVD_LITE_STALL_CHECK_TIME_SECONDS", 60.0, 1e7, &c->stall_check_s));
  HVDL_CHECK(env_seconds("HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS", 0.0, 1e7, &c->stall_shutdown_s));
  size_t cap;
  HVDL_CHECK(env_size("HVD_LITE_CACHE_CAPACITY", 1024, 0, 1 << 20, &cap));
  c->cache_capacity = cap;
  static const char *levels[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  const char *lv = getenv("HVD_LITE_LOG_LEVEL");
  c->log_level = HVDL_LOG_WARNING;
  if (lv && *lv) {
    int found = -1;
    for (int i = 0; i < (int)(sizeof levels / sizeof levels[0]); i++)
      if (strcasecmp(lv, levels[i]) == 0) found = i;
    if (found < 0)
      return hvdl_fail(NULL, hvdlInvalidArgument,
                       "HVD_LITE_LOG_LEVEL=%s is not valid: expected trace, debug, info, warning, "
                       "error or fatal",
                       lv);
    c->log_level = found;
  }
  HVDL_CHECK(env_seconds("HVD_LITE_DATA_TIMEOUT_SECONDS", 60.0, 1e7, &c->data_timeout_s));
  HVDL_CHECK(env_size("HVD_LITE_FAST_PATH_BYTES", DEFAULT_FAST_PATH_BYTES, 0, MAX_FUSION_BYTES,
                      &c->fast_path_bytes));
  HVDL_CHECK(hvdl_config_faults(c, getenv("HVD_LITE_FAULT")));
  HVDL_CHECK(config_autotune(c));
  return env_path("HVD_LITE_TIMELINE", c->timeline, sizeof c->timeline);
}

void hvdl_engine_config_print(const struct hvdl_engine_config *cfg, int nranks,
                              const hvdlConfig_t *comm) {
  if (cfg->log_level > HVDL_LOG_INFO) return;
  fprintf(stderr,
          "hvd_lite: engine on %d ranks: fusion threshold %zu B, cycle time %g ms, batch time "
          "%g ms, notify time %g ms, stall check %g s, stall shutdown %g s, cache %zu, segment "
          "%zu B, latency path up to %zu B%s%s%s\n",
          nranks, cfg->fusion_threshold, cfg->cycle_time_ms, cfg->batch_time_ms,
          cfg->notify_time_ms, cfg->stall_check_s, cfg->stall_shutdown_s, cfg->cache_capacity,
          comm->segmentBytes, comm->smallAllReduceBytes, cfg->autotune ? ", autotune" : "",
          cfg->timeline[0] ? ", timeline " : "", cfg->timeline);
  fflush(stderr);
}

/* HVD_LITE_FAULT=point@rank[#n],... : rank `rank` fails the n-th time (default 1)
 * it reaches `point` (docs/design.md, "Failures"; a testing aid). */
hvdlResult_t hvdl_config_faults(struct hvdl_engine_config *c, const char *spec) {
  c->nfaults = 0;
  for (const char *p = spec; p && *p;) {
    const char *at = strchr(p, '@'), *comma = strchr(p, ',');
    const char *end = comma ? comma : p + strlen(p);
    if (!at || at > end || c->nfaults == 16) goto bad;
    int point = -1;
    for (int i = 0; i < HVDL_FAULT_POINTS; i++)
      if (strlen(hvdl_fault_name(i)) == (size_t)(at - p) &&
          strncmp(p, hvdl_fault_name(i), (size_t)(at - p)) == 0)
        point = i;
    char *q;
    if (point < 0 || at[1] < '0' || at[1] > '9') goto bad;
    long rank = strtol(at + 1, &q, 10), n = 1;
    if (*q == '#') {
      if (q[1] < '0' || q[1] > '9') goto bad;
      n = strtol(q + 1, &q, 10);
    }
    if (q != end || rank > 1 << 24 || n < 1 || n > 1 << 30) goto bad;
    c->faults[c->nfaults].point = point;
    c->faults[c->nfaults].rank = (int)rank;
    c->faults[c->nfaults].n = (int)n;
    c->nfaults++;
    p = comma ? comma + 1 : end;
  }
  return hvdlSuccess;
bad:
  return hvdl_fail(
      NULL, hvdlInvalidArgument,
      "HVD_LITE_FAULT=%s is not valid: expected point@rank or point@rank#n, comma-separated "
      "(at most 16), point one of alloc, send, recv, negotiate, stall, exit, adapter",
      spec);
}
