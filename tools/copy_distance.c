/*
 * One memcpy of a buffer from a page-aligned shared mapping into a private one, timed at each
 * distance (destination minus source, modulo 4 KiB) from 0 to 72 bytes, against the same copy
 * in 2 KiB pieces (what csrc/base/memory.c's hvdl_copy does at distances 1-63): a check of glibc's
 * `rep movsb` on the machine at hand (docs/benchmarks-history.md, "A copy's distance").
 *
 *   gcc -O2 -o /tmp/copy_distance tools/copy_distance.c && /tmp/copy_distance 65536
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void in_pieces(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 2048) memcpy(d + i, s + i, n - i < 2048 ? n - i : 2048);
}

int main(int argc, char **argv) {
  const size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 65536;
  if (n == 0 || n > (4u << 20)) {
    fprintf(stderr, "usage: %s BYTES (1 .. 4 MiB)\n", argv[0]);
    return 2;
  }
  const size_t span = 8u << 20;
  char *shared = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char *private = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED || private == MAP_FAILED) return perror("mmap"), 1;
  memset(shared, 1, span);
  memset(private, 2, span);
  int reps = (int)(20000000 / (n / 64 + 1));
  if (reps < 50) reps = 50;
  printf("%zu bytes, %d copies each; us per copy\ndistance  memcpy  pieces\n", n, reps);
  for (int dist = 0; dist <= 72; dist++) {
    char *dst = private + dist;
    double t = now();
    for (int r = 0; r < reps; r++) {
      memcpy(dst, shared, n);
      __asm__ volatile("" ::"r"(dst) : "memory");
    }
    const double whole = (now() - t) / reps * 1e6;
    t = now();
    for (int r = 0; r < reps; r++) {
      in_pieces(dst, shared, n);
      __asm__ volatile("" ::"r"(dst) : "memory");
    }
    printf("%8d %7.2f %7.2f\n", dist, whole, (now() - t) / reps * 1e6);
  }
  return 0;
}
