/*
 * driver.c -- the simulation's benchmark: hvdlAllReduce (the C API) or
 * MPI_Allreduce on float32 sums, timed in simulated time and checked exactly.
 *
 *   driver hvdl|mpi [--check] [--reps N] BYTES...
 *
 * For each size (bytes per rank): every rank fills its buffer with small
 * integers, x[q][i] = (q % 5 - 2) + (i % 7 - 3), whose sum over the ranks is
 * exact in float32 in any order; then `reps` times: a barrier, the call, the
 * time. The figure is the slowest rank's best time. Every result element is
 * compared with its exact value (unless SIM_NO_CHECK is set: the buffers may
 * then be shared between ranks to save memory, see sim/simulate.py). With
 * --check it also runs the call in place, and once on random floats (whose sum
 * depends on the order), whose result bytes must be the same on every rank.
 *
 * Output, rank 0, one line per size:
 *   bytes <B> time_s <T> wrong <W> identical <0|1> algo <name> model_s <M>
 * (identical is 1 without --check; wrong is -1 when not checked; algo and model_s,
 * the cost model's time for it, are the selector's, "-" and 0 on the MPI side). The hvdl side reads HVD_LITE_* as usual
 * (HVD_LITE_ALLREDUCE_ALGO), with the shared-memory path off (so no shm or hier); the
 * MPI side is SMPI's --cfg=smpi/allreduce:<algo>.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvdl.h"

/* The selector's view (csrc/select.c, internal.h): the simulation reports which
 * algorithm ran and the cost model's time for it next to the simulated one. */
hvdlAlgorithm_t hvdl_select_allreduce(hvdlComm_t comm, size_t bytes);
double hvdl_select_predict(hvdlComm_t comm, hvdlAlgorithm_t algo, size_t bytes);
const char *hvdl_algo_name(int algo);

static int use_hvdl;
static hvdlComm_t comm;

static int allreduce(const float *send, float *recv, size_t count) {
  if (use_hvdl) {
    hvdlResult_t res = hvdlAllReduce(send, recv, count, hvdlFloat32, hvdlSum, comm, NULL);
    if (res != hvdlSuccess) {
      fprintf(stderr, "hvdlAllReduce: %s: %s\n", hvdlGetErrorString(res), hvdlGetLastError(comm));
      return 1;
    }
    return 0;
  }
  return MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, MPI_FLOAT, MPI_SUM,
                       MPI_COMM_WORLD) != MPI_SUCCESS;
}

static void fill(float *x, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) x[i] = (float)(rank % 5 - 2) + (float)((int)(i % 7) - 3);
}

/* Elements that differ from the exact sum over n ranks. */
static long long wrong_elements(const float *y, size_t count, int n) {
  long long a = 0, wrong = 0;
  for (int q = 0; q < n; q++) a += q % 5 - 2;
  for (size_t i = 0; i < count; i++)
    if (y[i] != (float)(a + (long long)n * ((int)(i % 7) - 3))) wrong++;
  return wrong;
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
  int rank, n, reps = 3, check = 0, nsizes = 0, failed = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t sizes[64];
  if (argc < 3 || (strcmp(argv[1], "hvdl") != 0 && strcmp(argv[1], "mpi") != 0)) {
    if (rank == 0) fprintf(stderr, "usage: driver hvdl|mpi [--check] [--reps N] BYTES...\n");
    MPI_Finalize();
    return 2;
  }
  use_hvdl = strcmp(argv[1], "hvdl") == 0;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--check") == 0) check = 1;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (nsizes < 64) sizes[nsizes++] = strtoull(argv[i], NULL, 10);
  }
  const int verify = getenv("SIM_NO_CHECK") == NULL;
  /* No shared-memory path: simulated ranks are contexts of one process that take turns, so
   * a rank spinning on a peer's counter in shm.c would never let that peer run. */
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
    const size_t count = sizes[s] / sizeof(float);
    float *send = malloc(count * sizeof(float) + 64), *recv = malloc(count * sizeof(float) + 64);
    fill(send, count, rank);
    double best = 1e30;
    long long wrong = 0;
    for (int k = 0; k < reps && !failed; k++) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      failed |= allreduce(send, recv, count);
      const double t = MPI_Wtime() - t0;
      if (t < best) best = t;
    }
    if (verify) wrong += wrong_elements(recv, count, n);
    int identical = 1;
    if (check && !failed) {
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
    MPI_Allreduce(MPI_IN_PLACE, &best, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const hvdlAlgorithm_t algo = use_hvdl ? hvdl_select_allreduce(comm, sizes[s]) : hvdlAlgoAuto;
    if (rank == 0)
      printf("bytes %zu time_s %.9g wrong %lld identical %d algo %s model_s %.9g%s\n", sizes[s],
             best, verify ? wrong : -1LL, identical, use_hvdl ? hvdl_algo_name(algo) : "-",
             use_hvdl ? hvdl_select_predict(comm, algo, sizes[s]) : 0.0, failed ? " FAILED" : "");
    fflush(stdout);
    free(send);
    free(recv);
  }
  if (use_hvdl) hvdlCommDestroy(comm);
  MPI_Finalize();
  return failed;
}
