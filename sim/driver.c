/*
 * driver.c -- the simulation's benchmark: one collective of the C API
 * (hvdl.h) or its MPI counterpart on float32, timed in simulated time and
 * checked exactly.
 *
 *   driver hvdl|mpi [--coll C] [--check] [--reps N] BYTES...
 *
 * C is the collective, and BYTES the size of each rank's buffer (nccl-tests'
 * "size"): allreduce (the default; hvdlAllReduce, a sum of BYTES per rank, or
 * MPI_Allreduce), broadcast (hvdlBroadcast from rank 0 of BYTES, in place, or
 * MPI_Bcast), allgather (hvdlAllGather of BYTES/n per rank into BYTES, or
 * MPI_Allgather) and reducescatter (hvdlReduceScatter of BYTES into BYTES/n,
 * a sum, or MPI_Reduce_scatter_block).
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
 * all-gather or reduce-scatter of hvd_lite also runs in place.
 *
 * Output, rank 0, one line per size:
 *   bytes <B> time_s <T> wrong <W> identical <0|1> algo <name> model_s <M>
 * (identical is 1 without --check; wrong is -1 when not checked; algo and model_s,
 * the cost model's time for it, are the selector's, and "-" and 0 on the MPI
 * side). The hvdl side reads HVD_LITE_* as usual (HVD_LITE_ALLREDUCE_ALGO,
 * HVD_LITE_BROADCAST_ALGO, HVD_LITE_ALLGATHER_ALGO, HVD_LITE_REDUCESCATTER_ALGO),
 * with the shared-memory path off (so no shm or hier);
 * the MPI side is SMPI's --cfg=smpi/<collective>:<algo>.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvdl.h"

/* The selectors' view (csrc/select/select_allreduce.c, select_broadcast.c, select_gather.c, select.h): the simulation reports which
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

enum coll { ALLREDUCE, BROADCAST, ALLGATHER, REDUCESCATTER };
static const char *const coll_names[] = {"allreduce", "broadcast", "allgather", "reducescatter"};

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

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n, reps = 3, check = 0, nsizes = 0, failed = 0, bad_args = 0;
  enum coll c = ALLREDUCE;
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
      for (int k = 0; k < 4; k++)
        if (strcmp(argv[i + 1], coll_names[k]) == 0) c = (enum coll)k, bad_args = 0;
      i++;
    } else if (nsizes < 64) {
      sizes[nsizes++] = strtoull(argv[i], NULL, 10);
    }
  }
  for (int s = 0; s < nsizes; s++) /* all-gather, reduce-scatter: n equal blocks of float32 */
    if ((c == ALLGATHER || c == REDUCESCATTER) && sizes[s] % (4 * (size_t)n) != 0) bad_args = 1;
  if (bad_args) {
    if (rank == 0)
      fprintf(stderr,
              "usage: driver hvdl|mpi [--coll allreduce|broadcast|allgather|reducescatter] "
              "[--check] [--reps N] BYTES... (all-gather, reduce-scatter: BYTES a multiple "
              "of 4 x ranks)\n");
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
    res = hvdlCommInitMpi(&comm, MPI_COMM_WORLD, &cfg);
  }
  if (res != hvdlSuccess) {
    fprintf(stderr, "rank %d: hvdlCommInitMpi: %s\n", rank, hvdlGetLastError(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int s = 0; s < nsizes && !failed; s++) {
    const size_t count = sizes[s] / sizeof(float), block = count / (size_t)n;
    float *send = malloc(count * sizeof(float) + 64), *recv = malloc(count * sizeof(float) + 64);
    if (c == ALLGATHER)
      fill(send, block, rank);
    else
      fill(send, count, rank);
    double best = 1e30;
    long long wrong = 0;
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
      if (t < best) best = t;
    }
    if (verify) wrong += wrong_result(c, recv, count, rank, n);
    int identical = 1;
    if (check && c == ALLREDUCE && !failed) {
      memcpy(recv, send, count * sizeof(float));
      failed |= allreduce(recv, recv, count);
      wrong += wrong_elements(recv, count, n);
      uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
      for (size_t i = 0; i < count; i++) { /* order-dependent float sums */
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        send[i] = (float)((int64_t)(seed >> 40) - (1 << 23)) * (float)(1 << (seed >> 60)) * 1e-3f;
      }
      failed |= allreduce(send, recv, count);
      unsigned long long h[2];
      h[0] = digest(recv, count * sizeof(float));
      h[1] = ~h[0];
      MPI_Allreduce(MPI_IN_PLACE, h, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
      identical = h[0] == ~h[1];
    }
    if (check && use_hvdl && (c == ALLGATHER || c == REDUCESCATTER) && !failed) { /* in place */
      const size_t block = count / (size_t)n;
      float *mine = recv + (size_t)rank * block;
      if (c == ALLGATHER) {
        memset(recv, 0, count * sizeof(float));
        fill(mine, block, rank);
        failed |=
            failed_call("hvdlAllGather", hvdlAllGather(mine, recv, block, hvdlFloat32, comm, NULL));
        if (verify) wrong += wrong_result(c, recv, count, rank, n);
      } else {
        memcpy(recv, send, count * sizeof(float));
        failed |= failed_call("hvdlReduceScatter", hvdlReduceScatter(recv, mine, block, hvdlFloat32,
                                                                     hvdlSum, comm, NULL));
        if (verify) wrong += wrong_sum_at(mine, (size_t)rank * block, block, n);
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, &best, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const char *algo = "-";
    double model = 0;
    if (use_hvdl && c == ALLREDUCE) {
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
    }
    if (rank == 0)
      printf("bytes %zu time_s %.9g wrong %lld identical %d algo %s model_s %.9g%s\n", sizes[s],
             best, verify ? wrong : -1LL, identical, algo, model, failed ? " FAILED" : "");
    fflush(stdout);
    free(send);
    free(recv);
  }
  if (use_hvdl) hvdlCommDestroy(comm);
  MPI_Finalize();
  return failed;
}
