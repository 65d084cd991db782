/*
 * peer_memory.c -- memory that the ranks of a host reach directly (hvdlMemAlloc,
 * NCCL's ncclMemAlloc), and each rank's views of its peers' such memory.
 *
 * hvdlMemAlloc makes each buffer a file of its own in memory (memfd_create),
 * mapped shared; the process keeps a table of them (base, size, descriptor and a
 * serial number never used twice). A single-copy call (single_copy.c) posts, beside
 * each buffer's address, the region that holds it (hvdl_mem_post). A peer maps
 * that region once, by opening the descriptor through /proc/<pid>/fd (which
 * needs what process_vm_readv needs: the same user, ptrace's leave), and then
 * reads and writes the buffer with plain loads and stores: no system call and no
 * page pinned per copy, where process_vm_readv/writev pin every 4 KiB page of
 * every copy (docs/benchmarks-history.md, "Memory the peers reach").
 *
 * Each buffer holds a file descriptor while it lives (the peers open it), so a
 * process's descriptor limit (ulimit -n) bounds how many it may have at once.
 *
 * A rank keeps at most MAPS views of each peer's regions (struct hvdl_shm's
 * maps), the least recently used given back first, and all of them with the
 * segment. A view is found by the region's serial number, so a region freed and
 * another made with the same descriptor is mapped anew. A freed region's pages
 * live until every peer's view of it is gone. A region that cannot be mapped
 * (its descriptor no longer open, a limit on mappings) is remembered as such and
 * copied through the kernel as before: this is a speed-up, never a new failure.
 *
 * hvdl_mem_small tells how much of plain memory lies on small (4 KiB) pages, not
 * huge ones, which the kernel's copies pin in one step each instead of 512
 * (single_copy.c's stand-in is for the former). It asks the kernel's PAGEMAP_SCAN
 * (Linux 6.7; the structures are spelled out here since older headers lack them)
 * for the runs of pages that are not huge; where the kernel cannot answer, none
 * (the stand-in is then not taken: the kernel's copies, as before it).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create (setup.py defines it; the simulation's build does not) */
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport/shm/shm.h"

#define MEM_PAGE ((size_t)4096)

struct region {
  char *base;
  size_t size;
  int fd;
  uint64_t serial, inode;
  struct region *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *regions; /* under lock */
static uint64_t serials;       /* under lock */
static _Atomic int live;       /* regions in the table: 0 skips the lookup */

hvdlResult_t hvdlMemAlloc(void **ptr, size_t size) {
  if (!ptr) return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlMemAlloc: ptr is NULL");
  *ptr = NULL;
  if (size == 0 || size > SIZE_MAX - MEM_PAGE)
    return hvdl_fail(NULL, hvdlInvalidArgument, "hvdlMemAlloc: size %zu (must be 1 to %zu)", size,
                     SIZE_MAX - MEM_PAGE);
  const size_t bytes = (size + MEM_PAGE - 1) & ~(MEM_PAGE - 1);
  struct region *r = malloc(sizeof *r);
  const int fd = r ? memfd_create("hvd_lite.mem", MFD_CLOEXEC) : -1;
  void *base = MAP_FAILED;
  struct stat st;
  if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0 && fstat(fd, &st) == 0)
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = r ? errno : ENOMEM;
    if (fd >= 0) close(fd);
    free(r);
    return hvdl_fail(NULL, hvdlSystemError, "hvdlMemAlloc: %zu bytes of shared memory: %s%s", size,
                     strerror(err),
                     err == EMFILE ? " (each buffer holds a file descriptor while it lives: "
                                     "raise the limit, ulimit -n)"
                                   : "");
  }
  pthread_mutex_lock(&lock);
  *r = (struct region){base, bytes, fd, ++serials, (uint64_t)st.st_ino, regions};
  regions = r;
  atomic_fetch_add(&live, 1);
  pthread_mutex_unlock(&lock);
  *ptr = base;
  return hvdlSuccess;
}

hvdlResult_t hvdlMemFree(void *ptr) {
  if (!ptr) return hvdlSuccess;
  pthread_mutex_lock(&lock);
  struct region **at = &regions;
  while (*at && (*at)->base != ptr) at = &(*at)->next;
  struct region *r = *at;
  if (r) {
    *at = r->next;
    atomic_fetch_sub(&live, 1);
  }
  pthread_mutex_unlock(&lock);
  if (!r)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "hvdlMemFree: %p is not a pointer that hvdlMemAlloc returned (or it was "
                     "freed already)",
                     ptr);
  munmap(r->base, r->size);
  close(r->fd);
  free(r);
  return hvdlSuccess;
}

struct page_region {
  uint64_t start, end, categories;
};
struct pm_scan_arg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted,
      category_mask, category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN_IOCTL _IOWR('f', 16, struct pm_scan_arg)
#define PAGE_IS_HUGE       ((uint64_t)1 << 6)

size_t hvdl_mem_small(const void *p, size_t bytes) {
  enum { RUNS = 8 };
  struct page_region run[RUNS];
  const uint64_t a = (uintptr_t)p & ~(uint64_t)(MEM_PAGE - 1);
  const uint64_t b = ((uintptr_t)p + bytes + MEM_PAGE - 1) & ~(uint64_t)(MEM_PAGE - 1);
  /* The runs of pages whose huge bit is not set (inverted, then required). */
  struct pm_scan_arg q = {sizeof q,     0, a,           b, 0, (uintptr_t)run, RUNS, 0, PAGE_IS_HUGE,
                          PAGE_IS_HUGE, 0, PAGE_IS_HUGE};
  /* Opened for each question (few: single_copy.c keeps the last answer), so that a forked
   * child asks about its own pages. */
  const int pagemap = bytes ? open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC) : -1;
  const long n = pagemap < 0 ? -1 : ioctl(pagemap, PAGEMAP_SCAN_IOCTL, &q);
  if (pagemap >= 0) close(pagemap);
  if (n < 0) return 0;
  uint64_t small = b - q.walk_end; /* not walked (more runs than RUNS): counted as small */
  for (long i = 0; i < n; i++) small += run[i].end - run[i].start;
  return small < bytes ? (size_t)small : bytes;
}

void hvdl_mem_post(const void *p, size_t bytes, struct hvdl_mem_post *out) {
  *out = (struct hvdl_mem_post){0, 0, 0, 0, 0};
  if (atomic_load_explicit(&live, memory_order_relaxed) == 0 || !p) return;
  const uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&lock);
  for (const struct region *r = regions; r; r = r->next) {
    const uintptr_t b = (uintptr_t)r->base;
    if (a >= b && a - b <= r->size && bytes <= r->size - (a - b)) {
      *out = (struct hvdl_mem_post){r->serial, (uint64_t)r->fd, b, r->size, r->inode};
      break;
    }
  }
  pthread_mutex_unlock(&lock);
}

/* Maps local rank q's region p: the view, or NULL where it cannot be mapped. The
 * descriptor is checked to be p's file (its inode and size): a peer that comes to it
 * late, after the owner's call failed and the owner freed the region and made another
 * on the same descriptor, must not write into that one. */
static char *map_region(const struct hvdl_shm *s, int q, const struct hvdl_mem_post *p) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", s->pids[q], (int)p->fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  void *v = MAP_FAILED;
  if (fstat(fd, &st) == 0 && (uint64_t)st.st_ino == p->inode && (uint64_t)st.st_size == p->size)
    v = mmap(NULL, (size_t)p->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return v == MAP_FAILED ? NULL : v;
}

char *hvdl_mem_reach(struct hvdl_shm *s, int q, const struct hvdl_mem_post *p, uint64_t addr,
                     size_t bytes) {
  if (p->serial == 0 || !s->maps || addr < p->base || addr - p->base > p->size ||
      bytes > p->size - (addr - p->base))
    return NULL;
  struct hvdl_mem_map *m = s->maps + (size_t)q * HVDL_MEM_MAPS, *old = m;
  for (int i = 0; i < HVDL_MEM_MAPS; i++) {
    if (m[i].serial == p->serial) {
      m[i].used = ++s->map_uses;
      return m[i].view ? m[i].view + (addr - p->base) : NULL;
    }
    if (m[i].used < old->used) old = m + i;
  }
  if (old->view) {
    munmap(old->view, old->size);
    atomic_fetch_sub_explicit(&s->views, 1, memory_order_relaxed);
  }
  *old = (struct hvdl_mem_map){p->serial, (size_t)p->size, map_region(s, q, p), ++s->map_uses};
  if (!old->view) return NULL;
  atomic_fetch_add_explicit(&s->views, 1, memory_order_relaxed);
  return old->view + (addr - p->base);
}

int hvdl_mem_views(const struct hvdl_shm *s) {
  return atomic_load_explicit(&s->views, memory_order_relaxed);
}

void hvdl_mem_unmap(struct hvdl_shm *s) {
  if (!s->maps) return;
  for (size_t i = 0; i < (size_t)s->local_size * HVDL_MEM_MAPS; i++)
    if (s->maps[i].view) munmap(s->maps[i].view, s->maps[i].size);
  free(s->maps);
  s->maps = NULL;
  atomic_store_explicit(&s->views, 0, memory_order_relaxed);
}
