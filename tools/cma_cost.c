/*
 * What one copy of another process's memory costs, three ways: a child process copies B bytes
 * (default 512 KiB) of its parent's memory in chunks of C (default 256 KiB) with
 * process_vm_readv, with process_vm_writev (both pin every page they touch in the parent), and
 * with memcpy from a mapping they share; 400 times each, median and minimum printed.
 * docs/benchmarks-history.md, "A stand-in for plain buffers".
 *
 *   cc -O2 -o /tmp/cma_cost tools/cma_cost.c && /tmp/cma_cost 524288 262144
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static int cmp(const void *a, const void *b) {
  double x = *(double *)a, y = *(double *)b;
  return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
  size_t B = argc > 1 ? strtoul(argv[1], 0, 0) : 524288,
         C = argc > 2 ? strtoul(argv[2], 0, 0) : 262144;
  char *priv = aligned_alloc(4096, B);
  memset(priv, 1, B);
  char *shared = mmap(0, B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(shared, 1, B);
  pid_t parent = getpid();
  pid_t ch = fork();
  if (ch == 0) {
    char *dst = aligned_alloc(4096, B);
    memset(dst, 0, B);
    enum { N = 400 };
    double t[N];
    for (int mode = 0; mode < 3; mode++) {
      for (int i = 0; i < N; i++) {
        double t0 = now();
        for (size_t o = 0; o < B; o += C) {
          size_t n = B - o < C ? B - o : C;
          if (mode == 0) {
            struct iovec l = {dst + o, n}, r = {priv + o, n};
            process_vm_readv(parent, &l, 1, &r, 1, 0);
          } else if (mode == 1) {
            struct iovec l = {dst + o, n}, r = {priv + o, n};
            process_vm_writev(parent, &l, 1, &r, 1, 0);
          } else
            memcpy(dst + o, shared + o, n);
        }
        t[i] = now() - t0;
      }
      qsort(t, N, sizeof *t, cmp);
      printf("%s B=%zu chunk=%zu: median %.1f us  min %.1f\n",
             mode == 0   ? "readv "
             : mode == 1 ? "writev"
                         : "memcpy",
             B, C, t[N / 2] * 1e6, t[0] * 1e6);
    }
    return 0;
  }
  waitpid(ch, 0, 0);
}
