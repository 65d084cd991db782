/*
 * py_handle.c -- hvd_lite._core.Handle: one submitted collective, as Python sees it.
 *
 *   Handle.poll() -> bool, Handle.wait(), Handle.wait_for(seconds) -> bool
 *                                 GIL released, in slices: a signal interrupts them;
 *                                 wait raises if the request failed
 *   Handle.out_rows(), .recv_splits(), .value(), and the buffer protocol: an
 *   engine-allocated output
 *
 * A handle holds its request and the exports of the buffers the engine reads and
 * writes (struct hvdl_py_hold). Dropped while its request is pending, it leaves them
 * with its engine object as an orphan: they stay exported until the request
 * completes, and are let go by the engine object's next submit, a handle's release,
 * shutdown or the engine object's own release, whichever comes first after that.
 * Nothing waits for the request, so dropping a handle never blocks.
 */
#include "python/binding.h"

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "engine/engine.h"
#include "request/request.h"
#include "select/select.h"

#include <stdlib.h>

static void release_hold(struct hvdl_py_hold *h) {
  if (h->req) hvdl_request_release(h->req);
  if (h->has_send) PyBuffer_Release(&h->send);
  if (h->has_recv) PyBuffer_Release(&h->recv);
}

void hvdl_py_release_orphans(hvdl_py_engine *engine, int all) {
  for (struct hvdl_py_orphan **p = &engine->orphans; *p;) {
    struct hvdl_py_orphan *o = *p;
    if (all || hvdl_request_idle(o->hold.req)) {
      *p = o->next;
      release_hold(&o->hold);
      free(o);
    } else {
      p = &o->next;
    }
  }
}

static void Handle_dealloc(hvdl_py_handle *self) {
  hvdl_py_engine *owner = self->owner;
  struct hvdl_py_hold *h = &self->hold;
  if (h->req && !hvdl_request_idle(h->req) && owner) {
    /* The engine (or, after a failure, a late peer's MPI traffic: request.h's pins)
     * may still read or write the buffers: they go to the engine object, which lets
     * them go once the request is idle. Without memory for that, they are
     * kept for ever rather than freed under the engine. */
    struct hvdl_py_orphan *o = malloc(sizeof *o);
    if (o) {
      o->hold = *h;
      o->next = owner->orphans;
      owner->orphans = o;
    }
  } else {
    release_hold(h);
  }
  if (owner) hvdl_py_release_orphans(owner, 0);
  Py_XDECREF(owner);
  PyObject_Free(self);
}

static PyObject *Handle_poll(hvdl_py_handle *self, PyObject *noargs) {
  (void)noargs;
  return PyBool_FromLong(hvdl_request_poll(self->hold.req));
}

/* Waits for the request at most `seconds` (< 0: without a bound), in slices, so that a
 * signal (Ctrl-C, a test's timeout) interrupts the wait: 1 done, 0 not yet, -1 with an
 * exception set. */
static int wait_in_slices(hvdl_py_handle *self, double seconds) {
  struct hvdl_request *r = self->hold.req;
  if (hvdl_request_poll(r)) return 1;
  if (!self->owner->engine) {
    PyErr_SetString(PyExc_RuntimeError, "the hvd_lite engine is gone");
    return -1;
  }
  const double deadline = hvdl_now() + seconds;
  if (seconds < 0 || seconds > HVDL_PY_WAIT_SLICE_SECONDS) {
    /* the fast path: this thread may run the round itself (bounded: one round) */
    struct hvdl_engine *engine = self->owner->engine;
    int done;
    Py_BEGIN_ALLOW_THREADS
      done = hvdl_turn_run_for(engine, r);
    Py_END_ALLOW_THREADS
    if (done) return 1;
  }
  for (;;) {
    double slice = HVDL_PY_WAIT_SLICE_SECONDS;
    if (seconds >= 0 && deadline - hvdl_now() < slice) slice = deadline - hvdl_now();
    int done = 1;
    if (slice > 0) {
      Py_BEGIN_ALLOW_THREADS
        done = hvdl_request_wait_for(r, slice);
      Py_END_ALLOW_THREADS
    } else {
      done = hvdl_request_poll(r);
    }
    if (done) return 1;
    if (PyErr_CheckSignals() < 0) return -1;
    if (seconds >= 0 && hvdl_now() >= deadline) return 0;
  }
}

static PyObject *Handle_wait(hvdl_py_handle *self, PyObject *noargs) {
  (void)noargs;
  struct hvdl_request *r = self->hold.req;
  if (wait_in_slices(self, -1.0) < 0) return NULL;
  if (atomic_load(&r->state) == HVDL_REQ_FAILED) {
    hvdl_fail(NULL, r->result, "%s", r->error);
    return hvdl_py_raise(r->result, NULL);
  }
  Py_RETURN_NONE;
}

/* wait_for(seconds) -> True once the request has completed (successfully or not), False
 * if it is still pending after `seconds`. */
static PyObject *Handle_wait_for(hvdl_py_handle *self, PyObject *arg) {
  double seconds = PyFloat_AsDouble(arg);
  if (seconds == -1.0 && PyErr_Occurred()) return NULL;
  if (!(seconds >= 0))
    return PyErr_Format(PyExc_ValueError, "wait_for(%R): seconds must be >= 0", arg);
  int done = wait_in_slices(self, seconds);
  if (done < 0) return NULL;
  return PyBool_FromLong(done);
}

/* After a successful wait: rows of the engine-allocated output, and (alltoall) the
 * rows received from each rank. */
static PyObject *Handle_out_rows(hvdl_py_handle *self, PyObject *noargs) {
  (void)noargs;
  return PyLong_FromLongLong((long long)self->hold.req->out_dim0);
}

static PyObject *Handle_value(hvdl_py_handle *self, PyObject *noargs) {
  (void)noargs;
  return PyLong_FromLongLong((long long)self->hold.req->value);
}

static PyObject *Handle_recv_splits(hvdl_py_handle *self, PyObject *noargs) {
  (void)noargs;
  struct hvdl_request *r = self->hold.req;
  if (!r->recv_splits || !self->owner) Py_RETURN_NONE;
  PyObject *list = PyList_New(self->owner->topo.size);
  for (int i = 0; list && i < self->owner->topo.size; i++)
    PyList_SET_ITEM(list, i, PyLong_FromLongLong((long long)r->recv_splits[i]));
  return list;
}

/* The buffer protocol exposes the engine-allocated output once the request is done. */
static int Handle_getbuffer(hvdl_py_handle *self, Py_buffer *view, int flags) {
  struct hvdl_request *r = self->hold.req;
  if (atomic_load(&r->state) != HVDL_REQ_DONE || !r->out) {
    PyErr_SetString(PyExc_BufferError, "this handle has no output (yet)");
    view->obj = NULL;
    return -1;
  }
  return PyBuffer_FillInfo(view, (PyObject *)self, r->out, (Py_ssize_t)r->out_bytes, 0, flags);
}

static PyBufferProcs Handle_as_buffer = {(getbufferproc)Handle_getbuffer, NULL};

static PyMethodDef Handle_methods[] = {
    {"out_rows", (PyCFunction)Handle_out_rows, METH_NOARGS, "rows of the engine-allocated output"},
    {"recv_splits", (PyCFunction)Handle_recv_splits, METH_NOARGS, "alltoall: rows from each rank"},
    {"value", (PyCFunction)Handle_value, METH_NOARGS, "join: the last rank to join"},
    {"poll", (PyCFunction)Handle_poll, METH_NOARGS, "True once the request has completed"},
    {"wait", (PyCFunction)Handle_wait, METH_NOARGS, "wait (GIL released); raise if it failed"},
    {"wait_for", (PyCFunction)Handle_wait_for, METH_O,
     "wait_for(seconds) -> bool: wait at most this long (GIL released); True once it completed"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject hvdl_py_handle_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.Handle",
    .tp_basicsize = sizeof(hvdl_py_handle),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A submitted collective.",
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
    .tp_as_buffer = &Handle_as_buffer,
};
