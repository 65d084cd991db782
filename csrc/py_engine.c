/*
 * py_engine.c -- hvd_lite._core.Engine and Handle: the background engine
 * (engine.c) as Python objects.
 *
 *   Engine(fhandle=None, ranks=None)     starts the engine over the base communicator
 *                                        (Fortran handle) or the subset of it that
 *                                        `ranks` lists (topology.c makes it)
 *     .rank .size .local_rank .local_size .cross_rank .cross_size   (hvdl_topology)
 *     .submit(coll, send, recv, dtype, op, prescale, postscale, name, shape, root, splits,
 *             error, at_once=False) -> Handle   (at_once: waited on at once, no batching)
 *     .hold(on), .shutdown()
 *   Handle.poll() -> bool, Handle.wait()  (GIL released; raises if the request failed)
 *   Handle.out_rows(), .recv_splits(), .value(), and the buffer protocol: an
 *   engine-allocated output
 */
#include "py_binding.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "internal.h"
#include "topology.h"

/* A waiting handle checks for signals this often. */
#define WAIT_SLICE_SECONDS 0.1

typedef struct {
  PyObject_HEAD struct hvdl_engine *engine;
  struct hvdl_topology topo;
} EngineObject;

typedef struct {
  PyObject_HEAD EngineObject *owner;
  struct hvdl_request *req;
  Py_buffer send, recv;
  int has_send, has_recv;
} HandleObject;

/* `ranks` (a sequence of ints) as a malloc'ed array; -1 with an exception set. */
static int ranks_array(PyObject *ranks, long long **out, int *n) {
  PyObject *seq = PySequence_Fast(ranks, "ranks must be a sequence of ints");
  if (!seq) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
  if (len > INT_MAX) {
    Py_DECREF(seq);
    PyErr_Format(PyExc_ValueError, "init(comm=[...]): %zd ranks is more than MPI can name", len);
    return -1;
  }
  long long *list = malloc(sizeof *list * (size_t)(len > 0 ? len : 1));
  if (!list) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    list[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (list[i] == -1 && PyErr_Occurred()) {
      free(list);
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  *out = list;
  *n = (int)len;
  return 0;
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"fhandle", "ranks", NULL};
  PyObject *fobj = Py_None, *ranks = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO", kwlist, &fobj, &ranks)) return -1;
  if (self->engine) {
    PyErr_SetString(PyExc_RuntimeError, "Engine is already initialised");
    return -1;
  }
  struct hvdl_engine_config cfg;
  hvdlResult_t res = hvdl_engine_config_default(&cfg);
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL), -1;
  MPI_Comm base;
  if (hvdl_py_base_comm(fobj, &base)) return -1;
  MPI_Comm sub = MPI_COMM_NULL;
  if (ranks != Py_None) {
    long long *list;
    int n;
    if (ranks_array(ranks, &list, &n)) return -1;
    Py_BEGIN_ALLOW_THREADS res = hvdl_comm_subset(base, list, n, &sub);
    Py_END_ALLOW_THREADS
    free(list);
    if (res != hvdlSuccess) return hvdl_py_raise(res, NULL), -1;
    base = sub;
  }
  /* Both are collective over base: the GIL is released while other ranks catch up. */
  Py_BEGIN_ALLOW_THREADS
  res = hvdl_topology(base, &self->topo);
  if (res == hvdlSuccess) res = hvdl_engine_start(&self->engine, base, &cfg);
  Py_END_ALLOW_THREADS
  if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub); /* the engine runs on its own duplicate */
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL), -1;
  return 0;
}

static PyObject *Engine_shutdown(EngineObject *self, PyObject *noargs) {
  (void)noargs;
  if (self->engine) {
    struct hvdl_engine *e = self->engine;
    Py_BEGIN_ALLOW_THREADS hvdl_engine_stop(e);
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

static PyObject *Engine_stats(EngineObject *self, PyObject *noargs) {
  (void)noargs;
  if (!self->engine) return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine has been shut down");
  struct hvdl_engine_stats st;
  hvdl_engine_get_stats(self->engine, &st);
  return Py_BuildValue("{sKsKsKsK}", "rounds", (unsigned long long)st.rounds, "slow_rounds",
                       (unsigned long long)st.slow_rounds, "announced",
                       (unsigned long long)st.announced, "cached_ready",
                       (unsigned long long)st.cached_ready);
}

/* Fault injection, a testing aid (docs/design.md, "Failures"). */
static int fault_point(PyObject *name) {
  const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  for (int i = 0; s && i < HVDL_FAULT_POINTS; i++)
    if (strcmp(s, hvdl_fault_name(i)) == 0) return i;
  if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "unknown fault point %R", name);
  return -1;
}

static PyObject *Engine_inject_fault(EngineObject *self, PyObject *args) {
  PyObject *name;
  int n = 1;
  if (!PyArg_ParseTuple(args, "U|i", &name, &n)) return NULL;
  int point = fault_point(name);
  if (point < 0) return NULL;
  if (!self->engine) return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine has been shut down");
  hvdl_engine_inject_fault(self->engine, point, n);
  Py_RETURN_NONE;
}

static PyObject *Engine_fault_hit(EngineObject *self, PyObject *name) {
  int point = fault_point(name);
  if (point < 0) return NULL;
  return PyBool_FromLong(self->engine && hvdl_engine_fault_hit(self->engine, point));
}

static PyObject *Engine_hold(EngineObject *self, PyObject *arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0) return NULL;
  if (self->engine) hvdl_engine_hold(self->engine, on);
  Py_RETURN_NONE;
}

static void Engine_dealloc(EngineObject *self) {
  if (self->engine) {
    struct hvdl_engine *e = self->engine;
    self->engine = NULL;
    Py_BEGIN_ALLOW_THREADS hvdl_engine_free(e);
    Py_END_ALLOW_THREADS
  }
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int parse_shape(PyObject *shape, struct hvdl_desc *d) {
  PyObject *seq = PySequence_Fast(shape, "shape must be a sequence of ints");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > HVDL_MAX_DIMS) {
    Py_DECREF(seq);
    PyErr_Format(PyExc_ValueError, "arrays of more than %d dimensions are not supported (got %zd)",
                 HVDL_MAX_DIMS, n);
    return -1;
  }
  d->ndim = (int32_t)n;
  for (Py_ssize_t i = 0; i < n; i++) {
    d->dims[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (d->dims[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  return 0;
}

/* submit(coll, send, recv, dtype, op, prescale, postscale, name, shape, root, splits, error)
 *   -> Handle. recv None: the engine allocates the output (ALLGATHER, ALLTOALL); send and
 *   recv None: no data (BARRIER); splits: ALLTOALL rows per rank; error: a problem this rank
 *   found in its arguments, which fails the collective on every rank. */
static PyObject *Engine_submit(EngineObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj, *shape, *splits;
  int coll, dtype, op, root;
  double pre, post;
  const char *name, *error;
  Py_ssize_t name_len;
  int at_once = 0;
  if (!PyArg_ParseTuple(args, "iOOiidds#OiOs|p", &coll, &sendobj, &recvobj, &dtype, &op, &pre,
                        &post, &name, &name_len, &shape, &root, &splits, &error, &at_once))
    return NULL;
  if (!self->engine) return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine is gone");
  if (coll < 0 || coll >= HVDL_NUM_COLLS)
    return PyErr_Format(PyExc_ValueError, "invalid collective %d", coll);
  if (hvdl_py_check_dtype(dtype) || hvdl_py_check_op(op)) return NULL;
  if (name_len >= HVDL_MAX_NAME)
    return PyErr_Format(PyExc_ValueError, "name is %zd bytes long; the limit is %d", name_len,
                        HVDL_MAX_NAME - 1);
  HandleObject *h = PyObject_New(HandleObject, &hvdl_py_handle_type);
  if (!h) return NULL;
  h->owner = NULL;
  h->req = NULL;
  h->has_send = h->has_recv = 0;
  struct hvdl_request *r = hvdl_request_new();
  if (!r) {
    Py_DECREF(h);
    return PyErr_NoMemory();
  }
  h->req = r;
  Py_INCREF(self);
  h->owner = self;
  size_t scount = 0, rcount = 0;
  if (sendobj != Py_None) {
    if (hvdl_py_get_buffer(sendobj, &h->send, 0, dtype, &scount, "sendbuf")) goto fail;
    h->has_send = 1;
  }
  if (recvobj != Py_None) {
    if (hvdl_py_get_buffer(recvobj, &h->recv, 1, dtype, &rcount, "recvbuf")) goto fail;
    h->has_recv = 1;
  }
  if (parse_shape(shape, &r->desc)) goto fail;
  if (splits != Py_None) {
    PyObject *seq = PySequence_Fast(splits, "splits must be a sequence of ints");
    if (!seq) goto fail;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    r->splits = calloc((size_t)(k > self->topo.size ? k : self->topo.size) + 1, sizeof *r->splits);
    for (Py_ssize_t i = 0; r->splits && i < k; i++)
      r->splits[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    if (!r->splits) {
      PyErr_NoMemory();
      goto fail;
    }
    if (PyErr_Occurred()) goto fail;
  }
  r->desc.coll = coll;
  r->desc.dtype = dtype;
  r->desc.op = op;
  r->desc.root = root;
  r->desc.prescale = pre;
  r->desc.postscale = post;
  memcpy(r->desc.name, name, (size_t)name_len);
  r->desc.name[name_len] = '\0';
  snprintf(r->desc.error, sizeof r->desc.error, "%s", error);
  if ((coll == HVDL_COLL_ALLGATHER || coll == HVDL_COLL_ALLTOALL) && r->desc.ndim > 0) {
    r->dim0 = r->desc.dims[0];
    r->desc.dims[0] = -1; /* may differ per rank: exchanged when it runs */
  }
  r->send = h->has_send ? h->send.buf : NULL;
  r->recv = h->has_recv ? h->recv.buf : NULL;
  r->count = scount;
  r->nbytes = scount * hvdl_type_size((hvdlDataType_t)dtype);
  hvdlResult_t res = hvdl_engine_submit(self->engine, r, at_once);
  if (res != hvdlSuccess) {
    hvdl_py_raise(res, NULL);
    goto fail;
  }
  return (PyObject *)h;
fail:
  atomic_store(&r->state, HVDL_REQ_FAILED); /* never submitted: nothing to wait for */
  Py_DECREF(h);
  return NULL;
}

static void Handle_dealloc(HandleObject *self) {
  struct hvdl_request *r = self->req;
  if (r) {
    /* The engine (or, after a failure, a late peer's MPI traffic) may still use the
     * buffers: wait before letting them go. */
    if (!hvdl_request_idle(r) && self->owner && self->owner->engine) {
      Py_BEGIN_ALLOW_THREADS hvdl_request_wait(r);
      while (!hvdl_request_idle(r)) hvdl_sleep(1e-3);
      Py_END_ALLOW_THREADS
    }
    hvdl_request_release(r);
  }
  if (self->has_send) PyBuffer_Release(&self->send);
  if (self->has_recv) PyBuffer_Release(&self->recv);
  Py_XDECREF(self->owner);
  PyObject_Free(self);
}

static PyObject *Handle_poll(HandleObject *self, PyObject *noargs) {
  (void)noargs;
  return PyBool_FromLong(hvdl_request_poll(self->req));
}

static PyObject *Handle_wait(HandleObject *self, PyObject *noargs) {
  (void)noargs;
  struct hvdl_request *r = self->req;
  if (!hvdl_request_poll(r)) {
    if (!self->owner->engine)
      return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine is gone");
    /* In slices, so that a signal (Ctrl-C, a test's timeout) interrupts the wait. */
    for (int done = 0; !done;) {
      Py_BEGIN_ALLOW_THREADS done = hvdl_request_wait_for(r, WAIT_SLICE_SECONDS);
      Py_END_ALLOW_THREADS
      if (!done && PyErr_CheckSignals() < 0) return NULL;
    }
  }
  if (atomic_load(&r->state) == HVDL_REQ_FAILED) {
    hvdl_fail(NULL, r->result, "%s", r->error);
    return hvdl_py_raise(r->result, NULL);
  }
  Py_RETURN_NONE;
}

/* After a successful wait: rows of the engine-allocated output, and (alltoall) the
 * rows received from each rank. */
static PyObject *Handle_out_rows(HandleObject *self, PyObject *noargs) {
  (void)noargs;
  return PyLong_FromLongLong((long long)self->req->out_dim0);
}

static PyObject *Handle_value(HandleObject *self, PyObject *noargs) {
  (void)noargs;
  return PyLong_FromLongLong((long long)self->req->value);
}

static PyObject *Handle_recv_splits(HandleObject *self, PyObject *noargs) {
  (void)noargs;
  struct hvdl_request *r = self->req;
  if (!r->recv_splits || !self->owner) Py_RETURN_NONE;
  PyObject *list = PyList_New(self->owner->topo.size);
  for (int i = 0; list && i < self->owner->topo.size; i++)
    PyList_SET_ITEM(list, i, PyLong_FromLongLong((long long)r->recv_splits[i]));
  return list;
}

/* The buffer protocol exposes the engine-allocated output once the request is done. */
static int Handle_getbuffer(HandleObject *self, Py_buffer *view, int flags) {
  struct hvdl_request *r = self->req;
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
    {NULL, NULL, 0, NULL},
};

PyTypeObject hvdl_py_handle_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A submitted collective.",
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
    .tp_as_buffer = &Handle_as_buffer,
};

#define ENGINE_INT_GETTER(field)                                                       \
  static PyObject *Engine_get_##field(EngineObject *self, void *closure) {            \
    (void)closure;                                                                    \
    return PyLong_FromLong((long)self->topo.field);                                   \
  }
ENGINE_INT_GETTER(rank)
ENGINE_INT_GETTER(size)
ENGINE_INT_GETTER(local_rank)
ENGINE_INT_GETTER(local_size)
ENGINE_INT_GETTER(cross_rank)
ENGINE_INT_GETTER(cross_size)

static PyGetSetDef Engine_getset[] = {
    {"rank", (getter)Engine_get_rank, NULL, "rank in this communicator", NULL},
    {"size", (getter)Engine_get_size, NULL, "number of ranks", NULL},
    {"local_rank", (getter)Engine_get_local_rank, NULL, "rank on this host", NULL},
    {"local_size", (getter)Engine_get_local_size, NULL, "ranks on this host", NULL},
    {"cross_rank", (getter)Engine_get_cross_rank, NULL, "index of this host", NULL},
    {"cross_size", (getter)Engine_get_cross_size, NULL, "hosts with this local rank", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Engine_methods[] = {
    {"submit", (PyCFunction)Engine_submit, METH_VARARGS,
     "submit(coll, send, recv, dtype, op, prescale, postscale, name, shape, root, splits, error, at_once)"},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS,
     "stats() -> dict: rounds, slow_rounds (descriptors gathered at the coordinator), announced "
     "(names this rank sent), cached_ready (requests ready by their cache bit alone)"},
    {"hold", (PyCFunction)Engine_hold, METH_O,
     "hold(True) ... hold(False): submissions in between enter the same round"},
    {"shutdown", (PyCFunction)Engine_shutdown, METH_NOARGS,
     "leave: the last round tells the other ranks; pending requests fail"},
    {"_inject_fault", (PyCFunction)Engine_inject_fault, METH_VARARGS,
     "_inject_fault(point, n=1): this rank fails the n-th next time it reaches point (testing)"},
    {"_fault_hit", (PyCFunction)Engine_fault_hit, METH_O,
     "_fault_hit(point) -> bool: an arrival at point, True when an armed fault fires (testing)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject hvdl_py_engine_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The background engine over a communicator, with its host layout.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
};

