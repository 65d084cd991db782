/*
 * request.c -- a request's life: added to the in-flight set, completed or
 * failed, its waiters woken, waited on, released. See request.h.
 *
 * Waking. A completed request's waiters are woken only if it has any: a thread
 * synchronizing handle 1 of 161 would otherwise wake (and take the engine's
 * core) 161 times. With a notify time, a completion sets wake_due and the
 * completing thread wakes everyone at most every notify_s, and at the end of its
 * work (hvdl_requests_notify with flush): one condition variable serves every
 * waiter, and each checks its own request's state when woken.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "request/request.h"

void hvdl_requests_init(struct hvdl_requests *q, double notify_s, void (*on_first_waiter)(void *),
                        void *hook_arg) {
  memset(q, 0, sizeof *q);
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->done_cv, NULL);
  q->notify_s = notify_s;
  q->on_first_waiter = on_first_waiter;
  q->hook_arg = hook_arg;
}

void hvdl_requests_destroy(struct hvdl_requests *q) {
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->done_cv);
}

struct hvdl_request *hvdl_request_new(void) {
  struct hvdl_request *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  atomic_init(&r->refs, 1);
  atomic_init(&r->state, HVDL_REQ_PENDING);
  r->cache_id = -1;
  return r;
}

struct hvdl_request *hvdl_request_stand_in(const struct hvdl_desc *d) {
  struct hvdl_request *r = hvdl_request_new();
  if (!r) return NULL;
  size_t count = 1;
  for (int i = 0; i < d->ndim; i++) count *= (size_t)d->dims[i];
  const size_t bytes = count * hvdl_type_size((hvdlDataType_t)d->dtype);
  r->zeros = calloc(bytes ? bytes : 1, 1);
  r->out = malloc(bytes ? bytes : 1);
  if (!r->zeros || !r->out) {
    hvdl_request_release(r); /* frees both */
    return NULL;
  }
  r->desc = *d;
  r->send = r->zeros;
  r->recv = r->out;
  r->count = count;
  r->nbytes = bytes;
  r->t_submit = hvdl_now();
  return r;
}

void hvdl_request_release(struct hvdl_request *r) {
  if (atomic_fetch_sub(&r->refs, 1) == 1) {
    free(r->splits);
    free(r->recv_splits);
    if (r->out_pool)
      hvdl_outpool_put(r->out_pool, r->out, r->out_cap);
    else
      free(r->out);
    free(r->zeros);
    free(r);
  }
}

static struct hvdl_request **bucket_of(struct hvdl_requests *q, uint64_t name_hash) {
  return &q->by_name[name_hash & (HVDL_NAME_BUCKETS - 1)];
}

/* The request named like r in r's bucket (in flight, or earlier in r's group), or NULL. */
static const struct hvdl_request *named_like(struct hvdl_requests *q,
                                             const struct hvdl_request *r) {
  for (const struct hvdl_request *t = *bucket_of(q, r->name_hash); t; t = t->same_bucket)
    if (t->name_hash == r->name_hash && strcmp(t->desc.name, r->desc.name) == 0) return t;
  return NULL;
}

static void unhash(struct hvdl_requests *q, struct hvdl_request *r) {
  for (struct hvdl_request **p = bucket_of(q, r->name_hash); *p; p = &(*p)->same_bucket) {
    if (*p == r) {
      *p = r->same_bucket;
      r->same_bucket = NULL;
      return;
    }
  }
}

hvdlResult_t hvdl_requests_add_all_locked(struct hvdl_requests *q, struct hvdl_request **rs,
                                          int n) {
  if (q->dead) return hvdl_fail(NULL, q->dead_result, "%s", q->dead_reason);
  for (int i = 0; i < n; i++) { /* each name against those in flight and the group's before it */
    const struct hvdl_request *same = named_like(q, rs[i]);
    if (same) {
      for (int j = 0; j < i; j++) unhash(q, rs[j]);
      return same->set == q /* in flight; the group's own join the set below */
                 ? hvdl_fail(NULL, hvdlInvalidArgument,
                             "a collective named '%s' is still in flight on this rank; wait for "
                             "it (synchronize) before submitting the name again",
                             rs[i]->desc.name)
                 : hvdl_fail(NULL, hvdlInvalidArgument,
                             "the name '%s' appears twice in one group; every entry needs its "
                             "own name",
                             rs[i]->desc.name);
    }
    struct hvdl_request **b = bucket_of(q, rs[i]->name_hash);
    rs[i]->same_bucket = *b;
    *b = rs[i];
  }
  for (int i = 0; i < n; i++) {
    struct hvdl_request *r = rs[i];
    atomic_store(&r->state, HVDL_REQ_PENDING);
    atomic_fetch_add(&r->refs, 1); /* the set's reference */
    r->set = q;
    r->next = NULL;
    r->prev = q->tail;
    if (q->tail)
      q->tail->next = r;
    else
      q->head = r;
    q->tail = r;
  }
  return hvdlSuccess;
}

hvdlResult_t hvdl_requests_add_locked(struct hvdl_requests *q, struct hvdl_request *r) {
  return hvdl_requests_add_all_locked(q, &r, 1);
}

/* Unlinks r from the in-flight list and its name's bucket (under mu); nothing if it is
 * not in them (hvdl_requests_fail_all took it out already). */
static void unlink_locked(struct hvdl_requests *q, struct hvdl_request *r) {
  if (!r->prev && q->head != r) return;
  if (r->prev)
    r->prev->next = r->next;
  else
    q->head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    q->tail = r->prev;
  r->next = r->prev = NULL;
  unhash(q, r);
}

void hvdl_request_complete(struct hvdl_request *r, hvdlResult_t res, const char *msg) {
  struct hvdl_requests *q = r->set;
  if (!q) { /* an engine-made stand-in, never added to a set */
    r->result = res;
    atomic_store(&r->state, res == hvdlSuccess ? HVDL_REQ_DONE : HVDL_REQ_FAILED);
    hvdl_request_release(r);
    return;
  }
  pthread_mutex_lock(&q->mu);
  unlink_locked(q, r);
  r->result = res;
  if (res != hvdlSuccess) snprintf(r->error, sizeof r->error, "%s", msg ? msg : "");
  atomic_store(&r->state, res == hvdlSuccess ? HVDL_REQ_DONE : HVDL_REQ_FAILED);
  if (r->waiters) {
    if (q->notify_s > 0) {
      if (!q->wake_due) q->wake_due_since = hvdl_now();
      q->wake_due = 1;
    } else {
      pthread_cond_broadcast(&q->done_cv);
    }
  }
  pthread_mutex_unlock(&q->mu);
  hvdl_request_release(r); /* the set's reference */
}

void hvdl_requests_notify(struct hvdl_requests *q, int flush) {
  if (!q->wake_due || (!flush && hvdl_now() - q->wake_due_since < q->notify_s)) return;
  q->wake_due = 0;
  pthread_mutex_lock(&q->mu);
  pthread_cond_broadcast(&q->done_cv);
  pthread_mutex_unlock(&q->mu);
}

static void mark_dead_locked(struct hvdl_requests *q, hvdlResult_t res, const char *reason) {
  if (!q->dead) {
    q->dead = 1;
    q->dead_result = res;
    snprintf(q->dead_reason, sizeof q->dead_reason, "%s", reason);
  }
}

void hvdl_requests_mark_dead(struct hvdl_requests *q, hvdlResult_t res, const char *reason) {
  pthread_mutex_lock(&q->mu);
  mark_dead_locked(q, res, reason);
  pthread_mutex_unlock(&q->mu);
}

void hvdl_requests_fail_all(struct hvdl_requests *q, hvdlResult_t res, const char *reason) {
  pthread_mutex_lock(&q->mu);
  mark_dead_locked(q, res, reason);
  while (q->head) {
    struct hvdl_request *r = q->head;
    unlink_locked(q, r);
    r->result = q->dead_result;
    snprintf(r->error, sizeof r->error, "%s", q->dead_reason);
    atomic_store(&r->state, HVDL_REQ_FAILED);
    hvdl_request_release(r);
  }
  pthread_cond_broadcast(&q->done_cv);
  pthread_mutex_unlock(&q->mu);
}

int hvdl_request_poll(const struct hvdl_request *r) {
  return atomic_load(&r->state) != HVDL_REQ_PENDING;
}

int hvdl_request_idle(const struct hvdl_request *r) {
  return hvdl_request_poll(r) && atomic_load(&r->pins) == 0;
}

/* A waiter goes straight to sleep, without spinning first: on a small machine its spin
 * took the core the engine thread needed (35 -> 15 us for a 4 KiB allreduce at 2 ranks). */
int hvdl_request_wait_for(struct hvdl_request *r, double seconds) {
  if (atomic_load(&r->state) != HVDL_REQ_PENDING) return 1;
  struct hvdl_requests *q = r->set;
  struct timespec ts;
  hvdl_deadline(&ts, seconds);
  pthread_mutex_lock(&q->mu);
  r->waiters++;
  if (q->nwaiting++ == 0 && q->on_first_waiter) q->on_first_waiter(q->hook_arg);
  int rc = 0;
  while (atomic_load(&r->state) == HVDL_REQ_PENDING && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&q->done_cv, &q->mu, &ts);
  r->waiters--;
  q->nwaiting--;
  pthread_mutex_unlock(&q->mu);
  return atomic_load(&r->state) != HVDL_REQ_PENDING;
}

void hvdl_request_wait(struct hvdl_request *r) {
  while (!hvdl_request_wait_for(r, 1.0)) {}
}
