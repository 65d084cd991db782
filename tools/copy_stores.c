/*
 * A copy of MIB MiB between two private buffers (2 MiB-aligned, transparent huge pages asked for),
 * in P processes at once (a process-shared barrier before each batch), four ways: glibc's memcpy,
 * non-temporal 32-byte stores (the destination's lines are not read first), `rep movsb` (what the
 * kernel's process_vm_readv/writev copies use) and plain 32-byte stores. Printed by process 0: the
 * median and best of 15 batches of 5 copies, a copy's time. What bounds an all-reduce's large
 * sizes on the machine at hand (docs/benchmarks-history.md, "What memory allows").
 *
 *   gcc -O2 -mavx2 -o /tmp/copy_stores tools/copy_stores.c -lpthread && /tmp/copy_stores 16 2
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BATCHES 15
#define COPIES  5

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void streamed(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 32)
    _mm256_stream_si256((__m256i *)(d + i), _mm256_load_si256((const __m256i *)(s + i)));
  _mm_sfence();
}

static void movsb(char *d, const char *s, size_t n) {
  __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

static void stored(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 32)
    _mm256_store_si256((__m256i *)(d + i), _mm256_load_si256((const __m256i *)(s + i)));
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void run(int p, int procs, size_t n, pthread_barrier_t *bar) {
  char *a, *b;
  if (posix_memalign((void **)&a, 1 << 21, n) || posix_memalign((void **)&b, 1 << 21, n)) _exit(1);
  madvise(a, n, MADV_HUGEPAGE);
  madvise(b, n, MADV_HUGEPAGE);
  memset(a, 1, n);
  memset(b, 2, n);
  static const char *names[4] = {"memcpy", "non-temporal stores", "rep movsb", "plain stores"};
  for (int m = 0; m < 4; m++) {
    double t[BATCHES];
    for (int r = 0; r < BATCHES; r++) {
      pthread_barrier_wait(bar);
      const double t0 = now();
      for (int k = 0; k < COPIES; k++) {
        if (m == 0)
          memcpy(b, a, n);
        else if (m == 1)
          streamed(b, a, n);
        else if (m == 2)
          movsb(b, a, n);
        else
          stored(b, a, n);
      }
      t[r] = (now() - t0) / COPIES;
    }
    qsort(t, BATCHES, sizeof t[0], by_value);
    if (p == 0)
      printf("%-20s %zu MiB, %d at once: median %8.1f us, best %8.1f us\n", names[m], n >> 20,
             procs, t[BATCHES / 2] * 1e6, t[0] * 1e6);
    fflush(stdout);
  }
  _exit(0);
}

int main(int argc, char **argv) {
  const long mib = argc > 1 ? atol(argv[1]) : 16;
  const int procs = argc > 2 ? atoi(argv[2]) : 2;
  if (mib < 1 || mib > 1024 || procs < 1 || procs > 64) {
    fprintf(stderr, "usage: %s MIB (1..1024) PROCESSES (1..64)\n", argv[0]);
    return 2;
  }
  pthread_barrierattr_t at;
  pthread_barrierattr_init(&at);
  pthread_barrierattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
  pthread_barrier_t *bar =
      mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (bar == MAP_FAILED) return 1;
  pthread_barrier_init(bar, &at, (unsigned)procs);
  for (int p = 0; p < procs; p++)
    if (fork() == 0) run(p, procs, (size_t)mib << 20, bar);
  int failed = 0, status;
  while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status);
  return failed;
}
