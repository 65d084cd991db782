/*
 * clock.c -- the monotonic clock every timing and wait reads, and deadlines for
 * pthread_cond_timedwait.
 */
#include <time.h>

#include "base/base.h"

double hvdl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hvdl_deadline(struct timespec *ts, double seconds_from_now) {
  clock_gettime(CLOCK_REALTIME, ts);
  double ns = (double)ts->tv_nsec + seconds_from_now * 1e9;
  ts->tv_sec += (time_t)(ns / 1e9);
  ts->tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
}
