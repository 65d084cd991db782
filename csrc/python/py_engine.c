/*
 * py_engine.c -- hvd_lite._core.Engine: the background engine (engine.c) as a
 * Python object; its handles are py_handle.c's.
 *
 *   Engine(fhandle=None, ranks=None, set_id=0)
 *                                        starts the engine over the base communicator
 *                                        (Fortran handle) or the subset of it that
 *                                        `ranks` lists (topology.c makes it); set_id > 0:
 *                                        a process set's engine (see set_config)
 *     .rank .size .local_rank .local_size .cross_rank .cross_size .homogeneous (hvdl_topology)
 *     .submit(coll, send, recv, dtype, op, prescale, postscale, name, shape, root, splits,
 *             error, at_once=False) -> Handle   (at_once: waited on at once, no batching;
 *                                        send/recv: a buffer, None, or (owner, address,
 *                                        nbytes[, device, stream]): hvdl_py_describe;
 *                                        CUDA memory for ALLREDUCE and BROADCAST only)
 *     .submit_group([(coll, send, ..., error), ...], at_once=False) -> [Handle]
 *                                        all of them in one round, or none
 *     .hold(on), .shutdown()             (shutdown waits in slices: a signal interrupts it)
 *
 * The engine object keeps the orphans of dropped handles (py_handle.c) and lets go
 * of those whose requests have completed at each submit, after shutdown and when it
 * is released itself.
 */
#include "python/binding.h"

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "cuda/cuda.h"
#include "engine/engine.h"
#include "select/select.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

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

/* A process set's engine (hvd_lite/basics.py): HVD_LITE_FAULT names global ranks and arms the
 * global set's engine only, and the timeline goes to "<HVD_LITE_TIMELINE>.set<id>". */
static hvdlResult_t set_config(struct hvdl_engine_config *cfg, int set_id) {
  cfg->nfaults = 0;
  if (!cfg->timeline[0]) return hvdlSuccess;
  char suffix[32];
  size_t n = strlen(cfg->timeline), k = (size_t)snprintf(suffix, sizeof suffix, ".set%d", set_id);
  if (n + k >= sizeof cfg->timeline)
    return hvdl_fail(NULL, hvdlInvalidArgument,
                     "HVD_LITE_TIMELINE is too long to name process "
                     "set %d's timeline %s.%s: at most %zu bytes leave room for the suffix",
                     set_id, "<file>", suffix + 1, sizeof cfg->timeline - 1 - k);
  memcpy(cfg->timeline + n, suffix, k + 1);
  return hvdlSuccess;
}

static int Engine_init(hvdl_py_engine *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"fhandle", "ranks", "set_id", NULL};
  PyObject *fobj = Py_None, *ranks = Py_None;
  int set_id = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOi", kwlist, &fobj, &ranks, &set_id)) return -1;
  if (self->engine) {
    PyErr_SetString(PyExc_RuntimeError, "Engine is already initialised");
    return -1;
  }
  struct hvdl_engine_config cfg;
  hvdlResult_t res = hvdl_engine_config_default(&cfg);
  if (res == hvdlSuccess && set_id > 0) res = set_config(&cfg, set_id);
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL), -1;
  MPI_Comm base;
  if (hvdl_py_base_comm(fobj, &base)) return -1;
  MPI_Comm sub = MPI_COMM_NULL;
  if (ranks != Py_None) {
    long long *list;
    int n;
    if (ranks_array(ranks, &list, &n)) return -1;
    Py_BEGIN_ALLOW_THREADS
      res = hvdl_comm_subset(base, list, n, &sub);
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

/* Stops the engine, waiting for its thread in slices so that a signal interrupts the
 * wait (then the engine goes on leaving; call again to wait for it). One thread joins
 * the engine thread at a time; another caller waits for that one. */
static PyObject *Engine_shutdown(hvdl_py_engine *self, PyObject *noargs) {
  (void)noargs;
  struct hvdl_engine *e = self->engine;
  if (!e) Py_RETURN_NONE;
  for (int done = 0; !done;) {
    const int mine = !self->stopping;
    self->stopping = 1;
    Py_BEGIN_ALLOW_THREADS
      if (mine)
        done = hvdl_engine_stop_for(e, HVDL_PY_WAIT_SLICE_SECONDS);
      else
        hvdl_sleep(HVDL_PY_WAIT_SLICE_SECONDS);
    Py_END_ALLOW_THREADS
    if (mine) self->stopping = 0;
    if (!done && PyErr_CheckSignals() < 0) return NULL;
  }
  hvdl_py_release_orphans(self, 0); /* the engine failed whatever was pending */
  Py_RETURN_NONE;
}

static PyObject *Engine_stats(hvdl_py_engine *self, PyObject *noargs) {
  (void)noargs;
  if (!self->engine)
    return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine has been shut down");
  struct hvdl_engine_stats st;
  hvdl_engine_get_stats(self->engine, &st);
  return Py_BuildValue(
      "{sKsKsKsKsKsKsKsdsisK}", "rounds", (unsigned long long)st.rounds, "slow_rounds",
      (unsigned long long)st.slow_rounds, "shm_rounds", (unsigned long long)st.shm_rounds,
      "announced", (unsigned long long)st.announced, "cached_ready",
      (unsigned long long)st.cached_ready, "caller_turns", (unsigned long long)st.caller_turns,
      "device_steps", (unsigned long long)st.device_steps, "step_seconds", st.step_seconds,
      "shm_views", st.shm_views, "shm_stand_ins", (unsigned long long)st.shm_stand_ins);
}

static PyObject *Engine_autotune(hvdl_py_engine *self, PyObject *noargs) {
  (void)noargs;
  if (!self->engine)
    return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine has been shut down");
  struct hvdl_tune_values v;
  struct hvdl_tune_change ch[HVDL_TUNE_HISTORY];
  int settled, samples;
  const int n =
      hvdl_autotune_state(&self->engine->tuner, &v, &settled, &samples, ch, HVDL_TUNE_HISTORY);
  PyObject *changes = PyList_New(0);
  for (int i = 0; changes && i < n && i < HVDL_TUNE_HISTORY; i++) {
    PyObject *c = Py_BuildValue(
        "(lnndd"
        "O)",
        ch[i].round, (Py_ssize_t)ch[i].v.fusion_threshold, (Py_ssize_t)ch[i].v.segment_bytes,
        ch[i].v.batch_time_ms, ch[i].v.cycle_time_ms, ch[i].settled ? Py_True : Py_False);
    if (!c || PyList_Append(changes, c) < 0) Py_CLEAR(changes);
    Py_XDECREF(c);
  }
  if (!changes) return NULL;
  return Py_BuildValue("{snsnsdsdsOsisN}", "fusion_threshold", (Py_ssize_t)v.fusion_threshold,
                       "segment_bytes", (Py_ssize_t)v.segment_bytes, "batch_time_ms",
                       v.batch_time_ms, "cycle_time_ms", v.cycle_time_ms, "settled",
                       settled ? Py_True : Py_False, "samples", samples, "changes", changes);
}

/* Fault injection, a testing aid (docs/design.md, "Failures"). */
static PyObject *Engine_inject_fault(hvdl_py_engine *self, PyObject *args) {
  PyObject *name;
  int n = 1;
  if (!PyArg_ParseTuple(args, "U|i", &name, &n)) return NULL;
  int point = hvdl_py_fault_point(name);
  if (point < 0) return NULL;
  if (!self->engine)
    return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine has been shut down");
  hvdl_engine_inject_fault(self->engine, point, n);
  Py_RETURN_NONE;
}

static PyObject *Engine_fault_hit(hvdl_py_engine *self, PyObject *name) {
  int point = hvdl_py_fault_point(name);
  if (point < 0) return NULL;
  return PyBool_FromLong(self->engine && hvdl_engine_fault_hit(self->engine, point));
}

static PyObject *Engine_hold(hvdl_py_engine *self, PyObject *arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0) return NULL;
  if (self->engine) hvdl_engine_hold(self->engine, on);
  Py_RETURN_NONE;
}

static void Engine_dealloc(hvdl_py_engine *self) {
  if (self->engine) {
    struct hvdl_engine *e = self->engine;
    self->engine = NULL;
    Py_BEGIN_ALLOW_THREADS
      hvdl_engine_free(e);
    Py_END_ALLOW_THREADS
  }
  hvdl_py_release_orphans(self, 1); /* the engine failed whatever was pending */
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

static int on_cuda(const struct hvdl_py_memory *m) {
  return m->device_type == HVDL_DEVICE_CUDA || m->device_type == HVDL_DEVICE_CUDA_MANAGED;
}

/* h's buffers, exported into its hold: host memory, or for an all-reduce or a broadcast
 * both on one CUDA device, whose number and stream the request takes (the CUDA array
 * interface's per-thread stream, 2, names the submitting thread's, which the engine's
 * thread cannot: the legacy default stream, 1, which waits for it, instead). */
static int take_buffers(hvdl_py_handle *h, int coll, int dtype, PyObject *sendobj,
                        PyObject *recvobj, size_t *scount) {
  const int device_ok = coll == HVDL_COLL_ALLREDUCE || coll == HVDL_COLL_BROADCAST;
  struct hvdl_py_memory sm = {.device_type = HVDL_DEVICE_CPU}, rm = sm;
  size_t rcount = 0;
  if (sendobj != Py_None) {
    if (hvdl_py_get_memory(sendobj, &sm, 0, dtype, scount, device_ok, "sendbuf")) return -1;
    h->hold.send = sm.view;
    h->hold.has_send = 1;
  }
  if (recvobj != Py_None) {
    if (hvdl_py_get_memory(recvobj, &rm, 1, dtype, &rcount, device_ok, "recvbuf")) return -1;
    h->hold.recv = rm.view;
    h->hold.has_recv = 1;
  }
  const int sc = h->hold.has_send && on_cuda(&sm), rc = h->hold.has_recv && on_cuda(&rm);
  const int both = h->hold.has_send && h->hold.has_recv;
  if ((both && sc != rc) || (sc && rc && sm.device_id != rm.device_id)) {
    PyErr_Format(PyExc_ValueError,
                 "sendbuf and recvbuf must both be host memory or both on one "
                 "CUDA device (sendbuf: %s device %d, recvbuf: %s device %d)",
                 hvdl_py_device_name(sm.device_type), sm.device_id,
                 hvdl_py_device_name(rm.device_type), rm.device_id);
    return -1;
  }
  if (!sc && !rc) return 0;
  const struct hvdl_py_memory *m = sc ? &sm : &rm;
  struct hvdl_request *r = h->hold.req;
  r->desc.device = HVDL_MEM_CUDA;
  r->device_id = m->device_id >= 0 ? m->device_id : hvdl_cuda_device_of(m->view.buf);
  const uintptr_t stream = sm.stream ? sm.stream : rm.stream;
  r->stream = (hvdlStream_t)(stream == 2 ? (uintptr_t)1 : stream);
  return 0;
}

/* A handle for one submit() argument tuple, its request filled but not submitted (and
 * not pending, so that dropping it waits for nothing); NULL with an exception set.
 * recv None: the engine allocates the output (ALLGATHER, ALLTOALL); send and recv None:
 * no data (BARRIER); splits: ALLTOALL rows per rank; error: a problem this rank found in
 * its arguments, which fails the collective on every rank. */
static hvdl_py_handle *new_handle(hvdl_py_engine *self, PyObject *args, int *at_once) {
  PyObject *sendobj, *recvobj, *shape, *splits;
  int coll, dtype, op, root;
  double pre, post;
  const char *name, *error;
  Py_ssize_t name_len;
  if (!PyTuple_Check(args)) {
    PyErr_Format(PyExc_TypeError, "a submission is a tuple of arguments, got %s",
                 Py_TYPE(args)->tp_name);
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "iOOiidds#OiOs|p", &coll, &sendobj, &recvobj, &dtype, &op, &pre,
                        &post, &name, &name_len, &shape, &root, &splits, &error, at_once))
    return NULL;
  if (!self->engine) {
    PyErr_SetString(PyExc_RuntimeError, "the hvd_lite engine is gone");
    return NULL;
  }
  if (coll < 0 || coll >= HVDL_NUM_COLLS) {
    PyErr_Format(PyExc_ValueError, "invalid collective %d", coll);
    return NULL;
  }
  if (hvdl_py_check_dtype(dtype) || hvdl_py_check_op(op)) return NULL;
  if ((coll == HVDL_COLL_ALLREDUCE || coll == HVDL_COLL_REDUCESCATTER) &&
      hvdl_py_check_reducible(dtype))
    return NULL;
  if (op == hvdlAdasum && coll != HVDL_COLL_ALLREDUCE) {
    PyErr_SetString(PyExc_ValueError, "op Adasum applies to allreduce only");
    return NULL;
  }
  if (op == hvdlAdasum && !hvdl_type_floating(dtype)) {
    PyErr_Format(PyExc_TypeError,
                 "op Adasum takes float16, bfloat16, float32 or float64 data, not %s",
                 hvdl_type_name((hvdlDataType_t)dtype));
    return NULL;
  }
  if (name_len >= HVDL_MAX_NAME) {
    PyErr_Format(PyExc_ValueError, "name is %zd bytes long; the limit is %d", name_len,
                 HVDL_MAX_NAME - 1);
    return NULL;
  }
  if (memchr(name, '\0', (size_t)name_len)) {
    PyErr_Format(PyExc_ValueError, "name %R contains a NUL character; names are C strings",
                 PyTuple_GET_ITEM(args, 7));
    return NULL;
  }
  hvdl_py_handle *h = PyObject_New(hvdl_py_handle, &hvdl_py_handle_type);
  if (!h) return NULL;
  memset(&h->hold, 0, sizeof h->hold);
  Py_INCREF(self);
  h->owner = self;
  struct hvdl_request *r = h->hold.req = hvdl_request_new();
  if (!r) {
    Py_DECREF(h);
    return (hvdl_py_handle *)PyErr_NoMemory();
  }
  atomic_store(&r->state, HVDL_REQ_FAILED); /* until it is submitted: nothing to wait for */
  size_t scount = 0;
  if (take_buffers(h, coll, dtype, sendobj, recvobj, &scount)) goto fail;
  if (op == hvdlAdasum && r->desc.device == HVDL_MEM_CUDA) {
    PyErr_SetString(PyExc_ValueError,
                    "op Adasum takes host memory only (it has no device form); copy the data to "
                    "the host");
    goto fail;
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
  const size_t elen = strnlen(error, sizeof r->desc.error - 1); /* usually empty */
  memcpy(r->desc.error, error, elen);
  r->desc.error[elen] = '\0';
  if ((coll == HVDL_COLL_ALLGATHER || coll == HVDL_COLL_ALLTOALL) && r->desc.ndim > 0) {
    r->dim0 = r->desc.dims[0];
    r->desc.dims[0] = -1; /* may differ per rank: exchanged when it runs */
  }
  r->send = h->hold.has_send ? h->hold.send.buf : NULL;
  r->recv = h->hold.has_recv ? h->hold.recv.buf : NULL;
  r->count = scount;
  r->nbytes = scount * hvdl_type_size((hvdlDataType_t)dtype);
  return h;
fail:
  Py_DECREF(h);
  return NULL;
}

/* submit(coll, send, recv, dtype, op, prescale, postscale, name, shape, root, splits, error,
 *        at_once=False) -> Handle */
static PyObject *Engine_submit(hvdl_py_engine *self, PyObject *args) {
  hvdl_py_release_orphans(self, 0);
  int at_once = 0;
  hvdl_py_handle *h = new_handle(self, args, &at_once);
  if (!h) return NULL;
  hvdlResult_t res = hvdl_engine_submit(self->engine, h->hold.req, at_once);
  if (res != hvdlSuccess) {
    Py_DECREF(h);
    return hvdl_py_raise(res, NULL);
  }
  return (PyObject *)h;
}

/* submit_group(entries, at_once=False) -> [Handle]: every entry (submit's arguments but
 * at_once) checked, then all submitted in one round, or none if any is refused. */
static PyObject *Engine_submit_group(hvdl_py_engine *self, PyObject *args) {
  PyObject *entries;
  int at_once = 0;
  if (!PyArg_ParseTuple(args, "O|p", &entries, &at_once)) return NULL;
  hvdl_py_release_orphans(self, 0);
  PyObject *seq = PySequence_Fast(entries, "submit_group takes a sequence of argument tuples");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > INT_MAX) {
    Py_DECREF(seq);
    return PyErr_Format(PyExc_ValueError, "a group of %zd entries is too large", n);
  }
  PyObject *list = PyList_New(n);
  struct hvdl_request **reqs = malloc(sizeof *reqs * (size_t)(n > 0 ? n : 1));
  if (!list || !reqs) {
    Py_XDECREF(list);
    free(reqs);
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    int ignored = 0;
    hvdl_py_handle *h = new_handle(self, PySequence_Fast_GET_ITEM(seq, i), &ignored);
    if (!h) { /* nothing is submitted yet: the handles made so far go without waiting */
      free(reqs);
      Py_DECREF(list);
      Py_DECREF(seq);
      return NULL;
    }
    reqs[i] = h->hold.req;
    PyList_SET_ITEM(list, i, (PyObject *)h);
  }
  Py_DECREF(seq);
  hvdlResult_t res =
      n ? hvdl_engine_submit_group(self->engine, reqs, (int)n, at_once) : hvdlSuccess;
  free(reqs);
  if (res != hvdlSuccess) {
    Py_DECREF(list);
    return hvdl_py_raise(res, NULL);
  }
  return list;
}

#define ENGINE_INT_GETTER(field)                                             \
  static PyObject *Engine_get_##field(hvdl_py_engine *self, void *closure) { \
    (void)closure;                                                           \
    return PyLong_FromLong((long)self->topo.field);                          \
  }
ENGINE_INT_GETTER(rank)
ENGINE_INT_GETTER(size)
ENGINE_INT_GETTER(local_rank)
ENGINE_INT_GETTER(local_size)
ENGINE_INT_GETTER(cross_rank)
ENGINE_INT_GETTER(cross_size)
ENGINE_INT_GETTER(homogeneous)

static PyGetSetDef Engine_getset[] = {
    {"rank", (getter)Engine_get_rank, NULL, "rank in this communicator", NULL},
    {"size", (getter)Engine_get_size, NULL, "number of ranks", NULL},
    {"local_rank", (getter)Engine_get_local_rank, NULL, "rank on this host", NULL},
    {"local_size", (getter)Engine_get_local_size, NULL, "ranks on this host", NULL},
    {"cross_rank", (getter)Engine_get_cross_rank, NULL, "index of this host", NULL},
    {"cross_size", (getter)Engine_get_cross_size, NULL, "hosts with this local rank", NULL},
    {"homogeneous", (getter)Engine_get_homogeneous, NULL, "1 if every host has as many ranks",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Engine_methods[] = {
    {"submit", (PyCFunction)Engine_submit, METH_VARARGS,
     "submit(coll, send, recv, dtype, op, prescale, postscale, name, shape, root, splits, error, at_once)"},
    {"submit_group", (PyCFunction)Engine_submit_group, METH_VARARGS,
     "submit_group([(coll, send, ..., error), ...], at_once) -> [Handle]: all in one round, or none"},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS,
     "stats() -> dict: rounds, slow_rounds (descriptors gathered at the coordinator), shm_rounds "
     "(rounds through the host's shared segment), announced "
     "(names this rank sent), cached_ready (requests ready by their cache bit alone), "
     "caller_turns (rounds run by a waiting caller: the fast path), device_steps (collectives "
     "run on CUDA memory), step_seconds (time spent "
     "running collectives, fusion copies included), shm_views (the peers' hvdlMemAlloc regions "
     "the engine's communicator has mapped: their fusion buffers, hvd.empty arrays, stand-ins), "
     "shm_stand_ins (all-reduces that took this rank's stand-in for plain buffers)"},
    {"autotune", (PyCFunction)Engine_autotune, METH_NOARGS,
     "autotune() -> dict: the tunable parameters in effect (fusion_threshold, segment_bytes, "
     "batch_time_ms, cycle_time_ms), settled (the autotuner's final choice is in effect), samples "
     "(scored so far; rank 0) and changes: [(round, fusion_threshold, segment_bytes, batch_time_ms, "
     "cycle_time_ms, settled)], each set of values rank 0's autotuner chose, applied after that round"},
    {"hold", (PyCFunction)Engine_hold, METH_O,
     "hold(True) ... hold(False): submissions in between enter the same round"},
    {"shutdown", (PyCFunction)Engine_shutdown, METH_NOARGS,
     "leave: the last round tells the other ranks; pending requests fail (a signal interrupts "
     "the wait; call again to finish it)"},
    {"_inject_fault", (PyCFunction)Engine_inject_fault, METH_VARARGS,
     "_inject_fault(point, n=1): this rank fails the n-th next time it reaches point (testing)"},
    {"_fault_hit", (PyCFunction)Engine_fault_hit, METH_O,
     "_fault_hit(point) -> bool: an arrival at point, True when an armed fault fires (testing)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject hvdl_py_engine_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.Engine",
    .tp_basicsize = sizeof(hvdl_py_engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The background engine over a communicator, with its host layout.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
};
