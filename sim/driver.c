/*
 * driver.c -- the simulation's benchmark: one collective of the C API
 * (hvdl.h) or its MPI counterpart on float32, timed in simulated time and
 * checked exactly; or hvd_lite's Adasum all-reduce, checked against a float64
 * reference.
 *
 *   driver hvdl|mpi [--coll C] [--op sum|adasum] [--type T] [--check] [--reps N] BYTES...
 *
 * C is the collective, and BYTES the size of each rank's buffer (nccl-tests'
 * "size"): allreduce (the default; hvdlAllReduce, a sum of BYTES per rank, or
 * MPI_Allreduce), broadcast (hvdlBroadcast from rank 0 of BYTES, in place, or
 * MPI_Bcast), allgather (hvdlAllGather of BYTES/n per rank into BYTES, or
 * MPI_Allgather), reducescatter (hvdlReduceScatter of BYTES into BYTES/n,
 * a sum, or MPI_Reduce_scatter_block) and alltoall (hvdlAllToAll of BYTES, n blocks
 * of BYTES/n each way, or MPI_Alltoall).
 *
 * For each size: every rank fills its buffer with small integers, x[q][i] =
 * (q % 5 - 2) + (i % 7 - 3) (index i in the whole buffer), whose sum over the
 * ranks is exact in float32 in any order; then `reps` times: a barrier, the
 * call, the time (a broadcast's non-root ranks clear their buffer before each).
 * The figure is the slowest rank's best time. Every result element is compared
 * with its exact value (unless SIM_NO_CHECK is set: the buffers may then be
 * shared between ranks to save memory, see sim/simulate.py). With --check an
 * all-reduce also runs in place, and once on random floats (whose sum depends
 * on the order), whose result bytes must be the same on every rank; an
 * all-gather, reduce-scatter or all-to-all of hvd_lite also runs in place.
 *
 * --op adasum (hvdl's all-reduce only): hvdlAllReduce with hvdlAdasum on type T
 * (float32, the default, float64, float16 or bfloat16; BYTES a multiple of its
 * size), flat, or with HVD_LITE_ADASUM_HIERARCHICAL=1 an average within each host
 * and Adasum across them. The inputs are adasum_reference.c's (correlated random
 * floats every rank regenerates from the rank and the index); the result is
 * compared with their float64 Adasum over the core's tree, each rank on its n-th
 * of the elements, within adasum_types' tolerance for T, and its bytes must be
 * the same on every rank; with --check it also runs in place.
 *
 * Output, rank 0: on the hvdl side first `init_s <T>`, the slowest rank's time in
 * hvdlCommInitMpi (the measurement of the terms across hosts, select_measure.c, is most
 * of it); then one line per size:
 *   bytes <B> time_s <T> wrong <W> identical <0|1> algo <name> model_s <M>
 * (identical is 1 without --check; wrong is -1 when not checked; algo and model_s,
 * the cost model's time for it, are the selector's, and "-" and 0 on the MPI
 * side; Adasum's algo is adasum or adasum_hier, its model_s 0, and the line goes
 * on with "type <T> err <E>", E the largest |y - ref| / (|ref| + rms(ref)) over
 * the elements, -1 when not checked). The hvdl side reads HVD_LITE_* as usual
 * (HVD_LITE_ALLREDUCE_ALGO, HVD_LITE_BROADCAST_ALGO, HVD_LITE_ALLGATHER_ALGO,
 * HVD_LITE_REDUCESCATTER_ALGO, HVD_LITE_ALLTOALL_ALGO, HVD_LITE_ADASUM_HIERARCHICAL), with the
 * shared-memory path off (so no shm or hier); the MPI side is SMPI's
 * --cfg=smpi/<collective>:<algo>.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adasum_reference.h"
#include "hvdl.h"

/* The selectors' view (csrc/select/select_allreduce.c, select_broadcast.c, select_gather.c,
 * select_alltoall.c, select.h): the simulation reports which
 * algorithm ran and the cost model's time for it next to the simulated one. */
hvdlAlgorithm_t hvdl_select_allreduce(hvdlComm_t comm, size_t bytes);
double hvdl_select_predict(hvdlComm_t comm, hvdlAlgorithm_t algo, size_t bytes);
const char *hvdl_algo_name(int algo);
hvdlBroadcastAlgorithm_t hvdl_select_broadcast(hvdlComm_t comm, size_t bytes);
double hvdl_select_predict_broadcast(hvdlComm_t comm, hvdlBroadcastAlgorithm_t algo, size_t bytes);
const char *hvdl_bcast_algo_name(int algo);
hvdlAllGatherAlgorithm_t hvdl_select_allgather(hvdlComm_t comm, size_t bytes);
double hvdl_select_predict_allgather(hvdlComm_t comm, hvdlAllGatherAlgorithm_t algo, size_t bytes);
const char *hvdl_allgather_algo_name(int algo);
hvdlReduceScatterAlgorithm_t hvdl_select_reducescatter(hvdlComm_t comm, size_t bytes);
double hvdl_select_predict_reducescatter(hvdlComm_t comm, hvdlReduceScatterAlgorithm_t algo,
                                         size_t bytes);
const char *hvdl_reducescatter_algo_name(int algo);
hvdlAllToAllAlgorithm_t hvdl_select_alltoall(hvdlComm_t comm, size_t block);
double hvdl_select_predict_alltoall(hvdlComm_t comm, hvdlAllToAllAlgorithm_t algo, size_t block);
const char *hvdl_alltoall_algo_name(int algo);

enum coll { ALLREDUCE, BROADCAST, ALLGATHER, REDUCESCATTER, ALLTOALL, NUM_COLLS };
static const char *const coll_names[] = {"allreduce", "broadcast", "allgather", "reducescatter",
                                         "alltoall"};

static int use_hvdl;
static hvdlComm_t comm;

static int failed_call(const char *what, hvdlResult_t res) {
  if (res == hvdlSuccess) return 0;
  fprintf(stderr, "%s: %s: %s\n", what, hvdlGetErrorString(res), hvdlGetLastError(comm));
  return 1;
}

static int allreduce(const float *send, float *recv, size_t count) {
  if (use_hvdl)
    return failed_call("hvdlAllReduce",
                       hvdlAllReduce(send, recv, count, hvdlFloat32, hvdlSum, comm, NULL));
  return MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, MPI_FLOAT, MPI_SUM,
                       MPI_COMM_WORLD) != MPI_SUCCESS;
}

/* One call of the collective c; count is the elements of the whole buffer
 * (BYTES / 4), n the ranks. The broadcast is in place on recv, from rank 0. */
static int collective(enum coll c, const float *send, float *recv, size_t count, int n) {
  const size_t block = count / (size_t)n;
  switch (c) {
    case ALLREDUCE: return allreduce(send, recv, count);
    case BROADCAST:
      if (use_hvdl)
        return failed_call("hvdlBroadcast",
                           hvdlBroadcast(recv, recv, count, hvdlFloat32, 0, comm, NULL));
      return MPI_Bcast(recv, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
    case ALLGATHER:
      if (use_hvdl)
        return failed_call("hvdlAllGather",
                           hvdlAllGather(send, recv, block, hvdlFloat32, comm, NULL));
      return MPI_Allgather(send, (int)block, MPI_FLOAT, recv, (int)block, MPI_FLOAT,
                           MPI_COMM_WORLD) != MPI_SUCCESS;
    case REDUCESCATTER:
      if (use_hvdl)
        return failed_call("hvdlReduceScatter",
                           hvdlReduceScatter(send, recv, block, hvdlFloat32, hvdlSum, comm, NULL));
      return MPI_Reduce_scatter_block(send, recv, (int)block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) !=
             MPI_SUCCESS;
    case ALLTOALL:
      if (use_hvdl)
        return failed_call("hvdlAllToAll",
                           hvdlAllToAll(send, recv, block, hvdlFloat32, comm, NULL));
      return MPI_Alltoall(send, (int)block, MPI_FLOAT, recv, (int)block, MPI_FLOAT,
                          MPI_COMM_WORLD) != MPI_SUCCESS;
    case NUM_COLLS: break;
  }
  return 1;
}

/* x[i] for the elements first .. first+count-1 of rank q's whole buffer. */
static void fill_at(float *x, size_t first, size_t count, int q) {
  for (size_t i = 0; i < count; i++)
    x[i] = (float)(q % 5 - 2) + (float)((int)((first + i) % 7) - 3);
}

static void fill(float *x, size_t count, int rank) { fill_at(x, 0, count, rank); }

/* Elements that differ from the exact sum over n ranks (of the whole buffer's
 * elements first .. first+count-1). */
static long long wrong_sum_at(const float *y, size_t first, size_t count, int n) {
  long long a = 0, wrong = 0;
  for (int q = 0; q < n; q++) a += q % 5 - 2;
  for (size_t i = 0; i < count; i++)
    if (y[i] != (float)(a + (long long)n * ((int)((first + i) % 7) - 3))) wrong++;
  return wrong;
}

static long long wrong_elements(const float *y, size_t count, int n) {
  return wrong_sum_at(y, 0, count, n);
}

/* Elements that differ from rank q's x[first + i]. */
static long long wrong_copy_at(const float *y, size_t first, size_t count, int q) {
  long long wrong = 0;
  for (size_t i = 0; i < count; i++)
    if (y[i] != (float)(q % 5 - 2) + (float)((int)((first + i) % 7) - 3)) wrong++;
  return wrong;
}

/* The wrong elements of collective c's result at this rank. */
static long long wrong_result(enum coll c, const float *recv, size_t count, int rank, int n) {
  const size_t block = count / (size_t)n;
  long long wrong = 0;
  switch (c) {
    case ALLREDUCE: return wrong_elements(recv, count, n);
    case BROADCAST: return wrong_copy_at(recv, 0, count, 0);
    case ALLGATHER: /* block q is rank q's elements 0 .. block-1 */
      for (int q = 0; q < n; q++) wrong += wrong_copy_at(recv + (size_t)q * block, 0, block, q);
      return wrong;
    case REDUCESCATTER: return wrong_sum_at(recv, (size_t)rank * block, block, n);
    case ALLTOALL: /* block q is block `rank` of rank q's buffer */
      for (int q = 0; q < n; q++)
        wrong += wrong_copy_at(recv + (size_t)q * block, (size_t)rank * block, block, q);
      return wrong;
    case NUM_COLLS: break;
  }
  return -1;
}

/* FNV-1a of the bytes. */
static uint64_t digest(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* 1 where every rank holds the same bytes (collective). */
static int identical_everywhere(const void *p, size_t bytes) {
  unsigned long long h[2];
  h[0] = digest(p, bytes);
  h[1] = ~h[0];
  MPI_Allreduce(MPI_IN_PLACE, h, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return h[0] == ~h[1];
}

/* One size's figures at this rank: its best time, its wrong elements, whether every rank's
 * result bytes were the same, and (Adasum) the largest error against the reference. */
struct outcome {
  double best;
  long long wrong;
  int identical;
  double err;
};

/* Collective c of BYTES per rank on float32, timed `reps` times and checked exactly. Returns 1
 * where a call failed. */
static int sum_size(enum coll c, size_t bytes, int reps, int check, int verify, int rank, int n,
                    struct outcome *o) {
  const size_t count = bytes / sizeof(float), block = count / (size_t)n;
  float *send = malloc(count * sizeof(float) + 64), *recv = malloc(count * sizeof(float) + 64);
  int failed = 0;
  if (c == ALLGATHER)
    fill(send, block, rank);
  else
    fill(send, count, rank);
  for (int k = 0; k < reps && !failed; k++) {
    if (c == BROADCAST) { /* in place: the root's data, nothing elsewhere */
      if (rank == 0)
        memcpy(recv, send, count * sizeof(float));
      else
        memset(recv, 0, count * sizeof(float));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    failed |= collective(c, send, recv, count, n);
    const double t = MPI_Wtime() - t0;
    if (t < o->best) o->best = t;
  }
  if (verify) o->wrong += wrong_result(c, recv, count, rank, n);
  if (check && c == ALLREDUCE && !failed) {
    memcpy(recv, send, count * sizeof(float));
    failed |= allreduce(recv, recv, count);
    o->wrong += wrong_elements(recv, count, n);
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
    for (size_t i = 0; i < count; i++) { /* order-dependent float sums */
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      send[i] = (float)((int64_t)(seed >> 40) - (1 << 23)) * (float)(1 << (seed >> 60)) * 1e-3f;
    }
    failed |= allreduce(send, recv, count);
    o->identical = identical_everywhere(recv, count * sizeof(float));
  }
  if (check && use_hvdl && (c == ALLGATHER || c == REDUCESCATTER || c == ALLTOALL) &&
      !failed) { /* in place */
    float *mine = recv + (size_t)rank * block;
    if (c == ALLTOALL) {
      memcpy(recv, send, count * sizeof(float));
      failed |=
          failed_call("hvdlAllToAll", hvdlAllToAll(recv, recv, block, hvdlFloat32, comm, NULL));
      if (verify) o->wrong += wrong_result(c, recv, count, rank, n);
    } else if (c == ALLGATHER) {
      memset(recv, 0, count * sizeof(float));
      fill(mine, block, rank);
      failed |=
          failed_call("hvdlAllGather", hvdlAllGather(mine, recv, block, hvdlFloat32, comm, NULL));
      if (verify) o->wrong += wrong_result(c, recv, count, rank, n);
    } else {
      memcpy(recv, send, count * sizeof(float));
      failed |= failed_call("hvdlReduceScatter",
                            hvdlReduceScatter(recv, mine, block, hvdlFloat32, hvdlSum, comm, NULL));
      if (verify) o->wrong += wrong_sum_at(mine, (size_t)rank * block, block, n);
    }
  }
  free(send);
  free(recv);
  return failed;
}

/* ---- Adasum (--op adasum): hvdlAllReduce with hvdlAdasum, against a float64 reference ---- */

/* Its types, and the tolerance of each: an element is wrong where it differs from the
 * reference by more than tol x (|its reference| + the reference's root mean square). tol is 8
 * units of the type's rounding (2^-23, 2^-52, 2^-10, 2^-7): the largest error measured on 60
 * and 64 ranks was 0.7 (float32), 2.3 (float64), 0.9 (float16) and 0.7 (bfloat16) of them. */
static const struct adasum_type {
  const char *name;
  hvdlDataType_t dt;
  size_t size;
  double tol;
} adasum_types[] = {
    {"float32", hvdlFloat32, 4, 0x1p-20},
    {"float64", hvdlFloat64, 8, 0x1p-49},
    {"float16", hvdlFloat16, 2, 0x1p-7},
    {"bfloat16", hvdlBfloat16, 2, 0x1p-4},
};

/* leaf_of[q]: the leaf of Adasum's tree that rank q belongs to (adasum_reference.h), and the
 * number of leaves. Flat: every rank. Hierarchical: its host, as the core splits them
 * (csrc/base/topology.c: the ranks that share memory, cut into HVD_LITE_RANKS_PER_HOST
 * consecutive ones where it is set), the hosts in the order of their first ranks. */
static int adasum_leaves(int hierarchical, int rank, int n, int *leaf_of) {
  if (!hierarchical) {
    for (int q = 0; q < n; q++) leaf_of[q] = q;
    return n;
  }
  MPI_Comm shared, local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
  const char *k = getenv("HVD_LITE_RANKS_PER_HOST");
  if (k && atoi(k) > 0) {
    MPI_Comm_split(shared, rank / atoi(k), rank, &local);
    MPI_Comm_free(&shared);
  } else {
    local = shared;
  }
  int first = rank, leaves = 0;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, local);
  MPI_Comm_free(&local);
  MPI_Allgather(&first, 1, MPI_INT, leaf_of, 1, MPI_INT, MPI_COMM_WORLD);
  int *index = malloc((size_t)n * sizeof(int)); /* a host's first rank -> its leaf */
  for (int q = 0; q < n; q++)
    if (leaf_of[q] == q) index[q] = leaves++;
  for (int q = 0; q < n; q++) leaf_of[q] = index[leaf_of[q]];
  free(index);
  return leaves;
}

/* Checks y (every rank's whole result, count elements) against the reference on this rank's
 * elements lo .. hi-1; every rank's range together cover the buffer, and identical_everywhere
 * says that the other ranks hold the same bytes. Adds the wrong elements to o, and raises
 * o->err to the largest error (collective). */
static void adasum_compare(const void *y, const double *ref, size_t lo, size_t hi, size_t count,
                           const struct adasum_type *ty, struct outcome *o) {
  double sq = 0, err = 0;
  for (size_t i = lo; i < hi; i++) sq += ref[i - lo] * ref[i - lo];
  MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const double rms = sqrt(sq / (double)count);
  for (size_t i = lo; i < hi; i++) {
    const double e = fabs(adasum_load(y, i, ty->dt) - ref[i - lo]) / (fabs(ref[i - lo]) + rms);
    if (!(e <= ty->tol)) o->wrong++; /* NaN too */
    if (!(e <= err)) err = e;
  }
  MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (!(err <= o->err)) o->err = err;
}

/* hvdlAllReduce with hvdlAdasum of BYTES per rank of type ty, timed `reps` times; verified,
 * its result is compared with the float64 reference and must have the same bytes on every
 * rank; with check, in place too. Returns 1 where a call failed. */
static int adasum_size(const struct adasum_type *ty, int hierarchical, size_t bytes, int reps,
                       int check, int verify, int rank, int n, struct outcome *o) {
  const size_t count = bytes / ty->size;
  char *send = malloc(bytes + 64), *recv = malloc(bytes + 64);
  int failed = 0;
  adasum_fill(send, 0, count, rank, ty->dt);
  for (int k = 0; k < reps && !failed; k++) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    failed |= failed_call("hvdlAllReduce(hvdlAdasum)",
                          hvdlAllReduce(send, recv, count, ty->dt, hvdlAdasum, comm, NULL));
    const double t = MPI_Wtime() - t0;
    if (t < o->best) o->best = t;
  }
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (verify && !failed) {
    const size_t lo = count * (size_t)rank / (size_t)n, hi = count * (size_t)(rank + 1) / (size_t)n;
    int *leaf_of = malloc((size_t)n * sizeof(int));
    double *ref = malloc((hi - lo + 1) * sizeof(double));
    const int leaves = adasum_leaves(hierarchical, rank, n, leaf_of);
    if (adasum_reference(MPI_COMM_WORLD, leaf_of, leaves, n, lo, hi, ty->dt, ref) != 0) {
      fprintf(stderr, "rank %d: out of memory for Adasum's reference\n", rank);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    o->err = 0;
    adasum_compare(recv, ref, lo, hi, count, ty, o);
    o->identical = identical_everywhere(recv, bytes);
    if (check) {
      memcpy(recv, send, bytes);
      failed |= failed_call("hvdlAllReduce(hvdlAdasum), in place",
                            hvdlAllReduce(recv, recv, count, ty->dt, hvdlAdasum, comm, NULL));
      MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (!failed) {
        adasum_compare(recv, ref, lo, hi, count, ty, o);
        o->identical &= identical_everywhere(recv, bytes);
      }
    }
    free(leaf_of);
    free(ref);
  }
  free(send);
  free(recv);
  return failed;
}

static void usage(void) {
  fprintf(stderr,
          "usage: driver hvdl|mpi [--coll allreduce|broadcast|allgather|reducescatter|alltoall] "
          "[--op sum|adasum] [--type float32|float64|float16|bfloat16] [--check] [--reps N] "
          "BYTES... (all-gather, reduce-scatter, all-to-all: BYTES a multiple of 4 x ranks; --op "
          "adasum: "
          "hvdl's all-reduce only, BYTES a multiple of the type's size; --type: Adasum's)\n");
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n, reps = 3, check = 0, nsizes = 0, failed = 0, bad_args = 0, adasum = 0;
  enum coll c = ALLREDUCE;
  const struct adasum_type *ty = &adasum_types[0];
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t sizes[64];
  if (argc < 3 || (strcmp(argv[1], "hvdl") != 0 && strcmp(argv[1], "mpi") != 0)) bad_args = 1;
  use_hvdl = argc > 1 && strcmp(argv[1], "hvdl") == 0;
  for (int i = 2; i < argc && !bad_args; i++) {
    if (strcmp(argv[i], "--check") == 0) {
      check = 1;
    } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--coll") == 0 && i + 1 < argc) {
      bad_args = 1;
      for (int k = 0; k < NUM_COLLS; k++)
        if (strcmp(argv[i + 1], coll_names[k]) == 0) c = (enum coll)k, bad_args = 0;
      i++;
    } else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc) {
      adasum = strcmp(argv[++i], "adasum") == 0;
      bad_args = !adasum && strcmp(argv[i], "sum") != 0;
    } else if (strcmp(argv[i], "--type") == 0 && i + 1 < argc) {
      bad_args = 1;
      for (size_t k = 0; k < sizeof adasum_types / sizeof adasum_types[0]; k++)
        if (strcmp(argv[i + 1], adasum_types[k].name) == 0) ty = &adasum_types[k], bad_args = 0;
      i++;
    } else if (nsizes < 64) {
      sizes[nsizes++] = strtoull(argv[i], NULL, 10);
    }
  }
  for (int s = 0; s < nsizes; s++) /* all-gather, reduce-scatter, all-to-all: n equal blocks */
    if ((c == ALLGATHER || c == REDUCESCATTER || c == ALLTOALL) && sizes[s] % (4 * (size_t)n) != 0)
      bad_args = 1;
  if (adasum && (!use_hvdl || c != ALLREDUCE)) bad_args = 1; /* MPI has no Adasum */
  if (!adasum && ty != &adasum_types[0]) bad_args = 1;       /* the sums are float32 */
  for (int s = 0; s < nsizes && adasum; s++)
    if (sizes[s] % ty->size != 0) bad_args = 1;
  if (bad_args) {
    if (rank == 0) usage();
    MPI_Finalize();
    return 2;
  }
  const int verify = getenv("SIM_NO_CHECK") == NULL;
  /* No shared-memory path: simulated ranks are contexts of one process that take turns, so
   * a rank spinning on a peer's counter in segment.c would never let that peer run. */
  hvdlConfig_t cfg;
  hvdlResult_t res = use_hvdl ? hvdlConfigDefault(&cfg) : hvdlSuccess;
  if (use_hvdl && res == hvdlSuccess) {
    cfg.disableShm = 1;
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    res = hvdlCommInitMpi(&comm, MPI_COMM_WORLD, &cfg);
    double took = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &took, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && res == hvdlSuccess) printf("init_s %.9g\n", took);
  }
  if (res != hvdlSuccess) {
    fprintf(stderr, "rank %d: hvdlCommInitMpi: %s\n", rank, hvdlGetLastError(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int s = 0; s < nsizes && !failed; s++) {
    struct outcome o = {1e30, 0, 1, -1};
    if (adasum)
      failed |= adasum_size(ty, cfg.adasumHierarchical, sizes[s], reps, check, verify, rank, n, &o);
    else
      failed |= sum_size(c, sizes[s], reps, check, verify, rank, n, &o);
    MPI_Allreduce(MPI_IN_PLACE, &o.best, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &o.wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const char *algo = "-";
    double model = 0;
    if (adasum) {
      algo = cfg.adasumHierarchical ? "adasum_hier" : "adasum";
    } else if (use_hvdl && c == ALLREDUCE) {
      const hvdlAlgorithm_t a = hvdl_select_allreduce(comm, sizes[s]);
      algo = hvdl_algo_name(a);
      model = hvdl_select_predict(comm, a, sizes[s]);
    } else if (use_hvdl && c == BROADCAST) {
      const hvdlBroadcastAlgorithm_t a = hvdl_select_broadcast(comm, sizes[s]);
      algo = hvdl_bcast_algo_name(a);
      model = hvdl_select_predict_broadcast(comm, a, sizes[s]);
    } else if (use_hvdl && c == ALLGATHER) {
      const hvdlAllGatherAlgorithm_t a = hvdl_select_allgather(comm, sizes[s]);
      algo = hvdl_allgather_algo_name(a);
      model = hvdl_select_predict_allgather(comm, a, sizes[s]);
    } else if (use_hvdl && c == REDUCESCATTER) {
      const hvdlReduceScatterAlgorithm_t a = hvdl_select_reducescatter(comm, sizes[s]);
      algo = hvdl_reducescatter_algo_name(a);
      model = hvdl_select_predict_reducescatter(comm, a, sizes[s]);
    } else if (use_hvdl && c == ALLTOALL) {
      const hvdlAllToAllAlgorithm_t a = hvdl_select_alltoall(comm, sizes[s] / (size_t)n);
      algo = hvdl_alltoall_algo_name(a);
      model = hvdl_select_predict_alltoall(comm, a, sizes[s] / (size_t)n);
    }
    if (rank == 0) {
      printf("bytes %zu time_s %.9g wrong %lld identical %d algo %s model_s %.9g", sizes[s], o.best,
             verify ? o.wrong : -1LL, o.identical, algo, model);
      if (adasum) printf(" type %s err %.3g", ty->name, o.err);
      printf("%s\n", failed ? " FAILED" : "");
    }
    fflush(stdout);
  }
  if (use_hvdl) hvdlCommDestroy(comm);
  MPI_Finalize();
  return failed;
}
