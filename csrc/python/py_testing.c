/*
 * py_testing.c -- what hvd_lite._core offers only to tests and benchmarks.
 *
 *   Comm(fhandle=None).allreduce(send, recv, dtype, op), .broadcast(send, recv, dtype, root),
 *     .reduce(send, recv, dtype, op, root), .allgather(send, recv, dtype),
 *     .reducescatter(send, recv, dtype, op), .alltoall(send, recv, dtype), .destroy()
 *                                        the bare C API (hvdl.h)
 *   Comm.shm_layout() -> None or (hosts, lanes, local_rank, local_size)
 *                                        its shared-memory path (shm.h)
 *   Comm.shm_cma() -> bool               whether that path has its single-copy form
 *   Comm.shm_views() -> int              the peers' hvdlMemAlloc regions (stand-ins too) mapped
 *   Comm.shm_stand_ins() -> int          all-reduces that took this rank's stand-in
 *   Comm.allreduce_plan(nbytes)          the all-reduce selector's choice and model (select_allreduce.c)
 *   Comm.cost_model()                    the model's terms agreed at init (measured ones too)
 *   plan_allreduce_model(size, hosts, local_size, nbytes, model)
 *                                        the selector's choice on a made-up layout and model
 *   Comm.broadcast_plan(nbytes)          the broadcast selector's choice and model (select_broadcast.c)
 *   Comm.gather_plan(coll, nbytes)       the all-gather's or reduce-scatter's (select_gather.c)
 * (The local kernels and their benchmark are py_kernels.c's.)
 *
 * hvd_lite's collectives never use these: they go through the Engine.
 */
#include "python/binding.h"

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "kernels/kernels.h"
#include "select/select.h"
#include "transport/shm/shm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- Comm: the NCCL-shaped C API on its own ------------------------------ */

/* A bare hvdlComm over a duplicate of the world (or of a given communicator),
 * for benchmarks and tests of the C API. hvd_lite's collectives never use it:
 * they go through the Engine, whose thread owns their traffic. */
typedef struct {
  PyObject_HEAD hvdlComm_t comm;
  struct hvdl_faults faults; /* _inject_fault's (the engine's come from HVD_LITE_FAULT) */
} CommObject;

static int Comm_init(CommObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"fhandle", NULL};
  PyObject *fobj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O", kwlist, &fobj)) return -1;
  MPI_Comm base;
  if (hvdl_py_base_comm(fobj, &base)) return -1;
  hvdlResult_t res;
  Py_BEGIN_ALLOW_THREADS
    res = hvdlCommInitMpi(&self->comm, base, NULL);
  Py_END_ALLOW_THREADS
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL), -1;
  return 0;
}

static void Comm_dealloc(CommObject *self) {
  if (self->comm) hvdlCommAbort(self->comm);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The stream a device call runs on: the producer's (the CUDA array interface's),
 * where it names one; else NULL, the legacy default stream. */
static hvdlStream_t stream_of(const struct hvdl_py_memory *a, const struct hvdl_py_memory *b) {
  return (hvdlStream_t)(a->stream ? a->stream : b->stream);
}

static PyObject *Comm_allreduce(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype, op;
  if (!PyArg_ParseTuple(args, "OOii", &sendobj, &recvobj, &dtype, &op)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  if (hvdl_py_check_dtype(dtype) || hvdl_py_check_op(op)) return NULL;
  struct hvdl_py_memory sm, rm;
  size_t scount, rcount;
  if (hvdl_py_get_memory(sendobj, &sm, 0, dtype, &scount, 1, "sendbuf")) return NULL;
  if (hvdl_py_get_memory(recvobj, &rm, 1, dtype, &rcount, 1, "recvbuf")) {
    PyBuffer_Release(&sm.view);
    return NULL;
  }
  hvdlResult_t res = hvdlInvalidArgument;
  hvdlComm_t c = self->comm;
  hvdlStream_t stream = stream_of(&rm, &sm);
  if (scount != rcount) {
    hvdl_fail(c, res, "allreduce: sendbuf has %zu elements, recvbuf %zu", scount, rcount);
  } else {
    Py_BEGIN_ALLOW_THREADS
      res = hvdlAllReduce(sm.view.buf, rm.view.buf, scount, (hvdlDataType_t)dtype, (hvdlRedOp_t)op,
                          c, stream);
    Py_END_ALLOW_THREADS
  }
  PyBuffer_Release(&sm.view);
  PyBuffer_Release(&rm.view);
  if (res != hvdlSuccess) return hvdl_py_raise(res, c);
  Py_RETURN_NONE;
}

/* The other collectives of the C API. A buffer may be None (NULL), so that
 * callers can pass what NCCL lets them leave out (a non-root's sendbuf in
 * broadcast, its recvbuf in reduce) and tests can check the NULL rules.
 * Sizes are bytes / element size; a size that does not fit the call's rule
 * is refused here with InvalidArgumentError, before any traffic. */

/* Exports obj (or None: NULL, 0 elements). */
static int get_opt_buffer(PyObject *obj, Py_buffer *view, int writable, int dtype, size_t *count,
                          const char *what) {
  if (obj == Py_None) {
    memset(view, 0, sizeof *view);
    *count = 0;
    return 0;
  }
  return hvdl_py_get_buffer(obj, view, writable, dtype, count, what);
}

static void release_opt(Py_buffer *view) {
  if (view->obj) PyBuffer_Release(view);
}

/* Exports both buffers; -1 with an exception set on failure. */
static int get_pair(PyObject *sendobj, PyObject *recvobj, int dtype, Py_buffer *sv, Py_buffer *rv,
                    size_t *scount, size_t *rcount) {
  if (hvdl_py_check_dtype(dtype)) return -1;
  if (get_opt_buffer(sendobj, sv, 0, dtype, scount, "sendbuf")) return -1;
  if (get_opt_buffer(recvobj, rv, 1, dtype, rcount, "recvbuf")) {
    release_opt(sv);
    return -1;
  }
  return 0;
}

static PyObject *finish_call(hvdlResult_t res, hvdlComm_t c, Py_buffer *sv, Py_buffer *rv) {
  release_opt(sv);
  release_opt(rv);
  if (res != hvdlSuccess) return hvdl_py_raise(res, c);
  Py_RETURN_NONE;
}

static PyObject *Comm_broadcast(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype, root;
  if (!PyArg_ParseTuple(args, "OOii", &sendobj, &recvobj, &dtype, &root)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  if (hvdl_py_check_dtype(dtype)) return NULL;
  struct hvdl_py_memory sm = {.device_type = 0}, rm;
  size_t scount = 0, rcount;
  if (sendobj != Py_None && hvdl_py_get_memory(sendobj, &sm, 0, dtype, &scount, 1, "sendbuf"))
    return NULL;
  if (hvdl_py_get_memory(recvobj, &rm, 1, dtype, &rcount, 1, "recvbuf")) {
    if (sm.view.obj) PyBuffer_Release(&sm.view);
    return NULL;
  }
  hvdlComm_t c = self->comm;
  hvdlResult_t res = hvdlInvalidArgument;
  hvdlStream_t stream = stream_of(&rm, &sm);
  if (sm.view.obj && scount != rcount) {
    hvdl_fail(c, res, "broadcast: sendbuf has %zu elements, recvbuf %zu", scount, rcount);
  } else {
    Py_BEGIN_ALLOW_THREADS
      res = hvdlBroadcast(sm.view.buf, rm.view.buf, rcount, (hvdlDataType_t)dtype, root, c, stream);
    Py_END_ALLOW_THREADS
  }
  return finish_call(res, c, &sm.view, &rm.view);
}

static PyObject *Comm_reduce(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype, op, root;
  if (!PyArg_ParseTuple(args, "OOiii", &sendobj, &recvobj, &dtype, &op, &root)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  Py_buffer sv, rv;
  size_t scount, rcount;
  if (get_pair(sendobj, recvobj, dtype, &sv, &rv, &scount, &rcount)) return NULL;
  hvdlComm_t c = self->comm;
  hvdlResult_t res = hvdlInvalidArgument;
  size_t count = sv.obj ? scount : rcount;
  if (sv.obj && rv.obj && scount != rcount) {
    hvdl_fail(c, res, "reduce: sendbuf has %zu elements, recvbuf %zu", scount, rcount);
  } else {
    Py_BEGIN_ALLOW_THREADS
      res =
          hvdlReduce(sv.buf, rv.buf, count, (hvdlDataType_t)dtype, (hvdlRedOp_t)op, root, c, NULL);
    Py_END_ALLOW_THREADS
  }
  return finish_call(res, c, &sv, &rv);
}

static PyObject *Comm_allgather(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype;
  if (!PyArg_ParseTuple(args, "OOi", &sendobj, &recvobj, &dtype)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  Py_buffer sv, rv;
  size_t scount, rcount;
  if (get_pair(sendobj, recvobj, dtype, &sv, &rv, &scount, &rcount)) return NULL;
  hvdlComm_t c = self->comm;
  const size_t n = (size_t)c->size;
  hvdlResult_t res = hvdlInvalidArgument;
  size_t count = sv.obj ? scount : rcount / n;
  if (rv.obj && rcount != count * n) {
    hvdl_fail(c, res, "allgather: recvbuf has %zu elements, not %zu ranks x sendbuf's %zu", rcount,
              n, count);
  } else {
    Py_BEGIN_ALLOW_THREADS
      res = hvdlAllGather(sv.buf, rv.buf, count, (hvdlDataType_t)dtype, c, NULL);
    Py_END_ALLOW_THREADS
  }
  return finish_call(res, c, &sv, &rv);
}

static PyObject *Comm_alltoall(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype;
  if (!PyArg_ParseTuple(args, "OOi", &sendobj, &recvobj, &dtype)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  Py_buffer sv, rv;
  size_t scount, rcount;
  if (get_pair(sendobj, recvobj, dtype, &sv, &rv, &scount, &rcount)) return NULL;
  hvdlComm_t c = self->comm;
  const size_t n = (size_t)c->size;
  hvdlResult_t res = hvdlInvalidArgument;
  if (scount != rcount || scount % n != 0) {
    hvdl_fail(c, res,
              "alltoall: sendbuf has %zu elements and recvbuf %zu; both need ranks (%zu) x count",
              scount, rcount, n);
  } else {
    Py_BEGIN_ALLOW_THREADS
      res = hvdlAllToAll(sv.buf, rv.buf, scount / n, (hvdlDataType_t)dtype, c, NULL);
    Py_END_ALLOW_THREADS
  }
  return finish_call(res, c, &sv, &rv);
}

static PyObject *Comm_reducescatter(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype, op;
  if (!PyArg_ParseTuple(args, "OOii", &sendobj, &recvobj, &dtype, &op)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  Py_buffer sv, rv;
  size_t scount, rcount;
  if (get_pair(sendobj, recvobj, dtype, &sv, &rv, &scount, &rcount)) return NULL;
  hvdlComm_t c = self->comm;
  const size_t n = (size_t)c->size;
  hvdlResult_t res = hvdlInvalidArgument;
  size_t count = rv.obj ? rcount : scount / n;
  if (sv.obj && scount != count * n) {
    hvdl_fail(c, res, "reducescatter: sendbuf has %zu elements, not %zu ranks x recvbuf's %zu",
              scount, n, count);
  } else {
    Py_BEGIN_ALLOW_THREADS
      res =
          hvdlReduceScatter(sv.buf, rv.buf, count, (hvdlDataType_t)dtype, (hvdlRedOp_t)op, c, NULL);
    Py_END_ALLOW_THREADS
  }
  return finish_call(res, c, &sv, &rv);
}

static PyObject *Comm_destroy(CommObject *self, PyObject *noargs) {
  (void)noargs;
  if (self->comm) {
    hvdlComm_t c = self->comm;
    self->comm = NULL;
    hvdlResult_t res;
    Py_BEGIN_ALLOW_THREADS
      res = hvdlCommDestroy(c);
    Py_END_ALLOW_THREADS
    if (res != hvdlSuccess) return hvdl_py_raise(res, NULL);
  }
  Py_RETURN_NONE;
}

/* hvdlCommShrink: a new Comm of the ranks not in `exclude` (None for a living excluded
 * rank with HVDL_SHRINK_ABORT). */
static PyObject *Comm_shrink(CommObject *self, PyObject *args) {
  PyObject *seq;
  int flags = HVDL_SHRINK_DEFAULT;
  if (!PyArg_ParseTuple(args, "O|i", &seq, &flags)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  PyObject *fast = PySequence_Fast(seq, "shrink: exclude must be a sequence of ranks");
  if (!fast) return NULL;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  int *list = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  if (!list) {
    Py_DECREF(fast);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) {
      free(list);
      Py_DECREF(fast);
      return NULL;
    }
    list[i] = (int)v;
  }
  Py_DECREF(fast);
  hvdlComm_t out = NULL;
  hvdlResult_t res;
  Py_BEGIN_ALLOW_THREADS
    res = hvdlCommShrink(self->comm, list, (int)n, &out, NULL, flags);
  Py_END_ALLOW_THREADS
  free(list);
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL);
  if (!out) Py_RETURN_NONE;
  CommObject *c = (CommObject *)Py_TYPE(self)->tp_alloc(Py_TYPE(self), 0);
  if (!c) {
    hvdlCommAbort(out);
    return NULL;
  }
  c->comm = out;
  return (PyObject *)c;
}

/* Arms a fault on this rank and bounds the communicator's data waits (a bare
 * communicator's are unbounded), for tests of failures in the C API's calls. */
static PyObject *Comm_inject_fault(CommObject *self, PyObject *args) {
  PyObject *name;
  int n;
  double timeout;
  if (!PyArg_ParseTuple(args, "Uid", &name, &n, &timeout)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  const int point = hvdl_py_fault_point(name);
  if (point < 0) return NULL;
  atomic_store(&self->faults.armed[point], n > 0 ? n : 0);
  self->comm->faults = &self->faults;
  self->comm->data_timeout = timeout;
  Py_RETURN_NONE;
}

static PyObject *Comm_shm_layout(CommObject *self, PyObject *unused) {
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  const struct hvdl_shm *s = self->comm->shm;
  if (!s) Py_RETURN_NONE;
  return Py_BuildValue("(iiii)", s->hosts, s->lanes, s->local_rank, s->local_size);
}

static PyObject *Comm_shm_cma(CommObject *self, PyObject *unused) {
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  return PyBool_FromLong(self->comm->shm && self->comm->shm->cma);
}

static PyObject *Comm_shm_views(CommObject *self, PyObject *unused) {
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  return PyLong_FromLong(self->comm->shm ? hvdl_mem_views(self->comm->shm) : 0);
}

static PyObject *Comm_shm_stand_ins(CommObject *self, PyObject *unused) {
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  return PyLong_FromUnsignedLongLong(self->comm->shm ? hvdl_cma_stand_ins(self->comm->shm) : 0);
}

/* The all-reduce selector's view of a call of nbytes per rank on comm (select_allreduce.c). */
static PyObject *allreduce_plan(hvdlComm_t comm, unsigned long long nbytes) {
  PyObject *pred = PyDict_New();
  if (!pred) return NULL;
  for (int a = hvdlAlgoRing; a < hvdlNumAlgos; a++) {
    const double t = hvdl_select_predict(comm, (hvdlAlgorithm_t)a, (size_t)nbytes);
    PyObject *v = t >= 0 ? PyFloat_FromDouble(t) : (Py_INCREF(Py_None), Py_None);
    if (!v || PyDict_SetItemString(pred, hvdl_algo_name(a), v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(pred);
      return NULL;
    }
    Py_DECREF(v);
  }
  const char *chosen = hvdl_algo_name(hvdl_select_allreduce(comm, (size_t)nbytes));
  /* hier_p2p's step across hosts and its lanes, where it can run */
  const char *across = NULL;
  int lanes = 0;
  if (comm->hier_p2p && comm->hosts > 1) {
    const hvdlAlgorithm_t a = hvdl_select_hier_p2p_across(comm, (size_t)nbytes, &lanes);
    across = a == hvdlAlgoLatency ? "direct" : hvdl_algo_name(a);
  }
  /* hier's lanes across hosts: what the selector prices them as running, and, on a lane holder,
   * what the lane's own communicator picks for its share (hier splits a call as
   * hvdl_block_start does: the first lanes take the remainder's elements, so B/lanes rounded
   * down is one of the two sizes) */
  const char *hier_lane = NULL, *hier_lane_runs = NULL;
  if (comm->shm && comm->shm->hosts > 1) {
    hier_lane = hvdl_algo_name(hvdl_select_hier_lane(comm, (size_t)nbytes));
    if (comm->cross)
      hier_lane_runs = hvdl_algo_name(
          hvdl_select_allreduce(comm->cross, (size_t)nbytes / (size_t)comm->shm->lanes));
  }
  return Py_BuildValue("{s:s,s:N,s:i,s:i,s:z,s:i,s:z,s:z}", "algorithm", chosen, "predicted", pred,
                       "hosts", comm->hosts, "local_size", comm->local_size, "hier_p2p_across",
                       across, "hier_p2p_lanes", lanes, "hier_lane", hier_lane, "hier_lane_runs",
                       hier_lane_runs);
}

static PyObject *Comm_allreduce_plan(CommObject *self, PyObject *args) {
  unsigned long long nbytes;
  if (!PyArg_ParseTuple(args, "K", &nbytes)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  return allreduce_plan(self->comm, nbytes);
}

static const char *const model_sources[] = {"default", "file", "measured"};

static const char *error_or_none(const char *why) { return why[0] ? why : NULL; }

/* The agreed cost model of comm (select_allreduce.c, select_measure.c) as a dict. */
static PyObject *cost_model(const struct hvdl_cost_model *m) {
  PyObject *steps = PyList_New(0);
  for (int i = 0; steps && i < m->steps; i++) {
    PyObject *step = Py_BuildValue("(dd)", m->step_bytes[i], m->step_alpha[i]);
    if (!step || PyList_Append(steps, step) < 0) Py_CLEAR(steps);
    Py_XDECREF(step);
  }
  if (!steps) return NULL;
  const int inter = m->inter_source >= 0 && m->inter_source <= HVDL_MODEL_MEASURED
                        ? m->inter_source
                        : HVDL_MODEL_DEFAULT;
  const int intra = m->intra_source >= 0 && m->intra_source <= HVDL_MODEL_MEASURED
                        ? m->intra_source
                        : HVDL_MODEL_DEFAULT;
  return Py_BuildValue(
      "{s:d,s:d,s:d,s:d,s:d,s:N,s:s,s:s,s:d,s:z,s:z}", "intra_alpha", m->alpha[HVDL_LINK_INTRA],
      "inter_alpha", m->alpha[HVDL_LINK_INTER], "intra_beta", m->beta[HVDL_LINK_INTRA],
      "inter_beta", m->beta[HVDL_LINK_INTER], "gamma", m->gamma, "inter_alpha_steps", steps,
      "inter_source", model_sources[inter], "intra_source", model_sources[intra], "measure_s",
      m->measure_s, "inter_measure_error", error_or_none(m->measure_error[HVDL_LINK_INTER]),
      "intra_measure_error", error_or_none(m->measure_error[HVDL_LINK_INTRA]));
}

static PyObject *Comm_cost_model(CommObject *self, PyObject *unused) {
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  return cost_model(&self->comm->model);
}

/* A dict's float, or the default when the key is absent; -1 with an exception set on a
 * value that is not a number. */
static int model_term(PyObject *d, const char *key, double *out) {
  PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
  if (!v) return 0;
  const double x = PyFloat_AsDouble(v);
  if (x == -1.0 && PyErr_Occurred()) return -1;
  *out = x;
  return 0;
}

/* A communicator struct made up for a selector alone, on a layout no job has (tests of the
 * rules at 64 ranks on one process), with no MPI behind it and never used for a collective,
 * from plan_*_model's arguments (size, hosts, local_size, nbytes, model): every algorithm
 * auto; hier_p2p a candidate where the hosts have local_size ranks each (more than one).
 * model: cost_model()'s keys, any left out the defaults'. 0, or -1 with an exception set. */
static int model_comm(const char *fn, PyObject *args, struct hvdlComm *c,
                      unsigned long long *nbytes) {
  int size, hosts, local_size;
  PyObject *model;
  if (!PyArg_ParseTuple(args, "iiiKO!", &size, &hosts, &local_size, nbytes, &PyDict_Type, &model))
    return -1;
  if (size < 1 || hosts < 1 || local_size < 1 || hosts > size || local_size > size) {
    PyErr_Format(PyExc_ValueError, "%s: size %d, hosts %d, local_size %d is no layout", fn, size,
                 hosts, local_size);
    return -1;
  }
  memset(c, 0, sizeof *c);
  if (hvdlConfigDefault(&c->config) != hvdlSuccess)
    return hvdl_py_raise(hvdlInvalidArgument, NULL), -1;
  c->config.allReduceAlgorithm = hvdlAlgoAuto;
  c->config.allToAllAlgorithm = hvdlAllToAllAuto;
  c->config.smallAllReduceBytes = hvdl_small_bytes_default(size, hosts);
  c->size = size;
  c->hosts = hosts;
  c->local_size = local_size;
  static char p2p_stand_in; /* select_allreduce.c only tests the pointer */
  if (hosts > 1 && local_size > 1 && size == hosts * local_size)
    c->hier_p2p = (struct hvdl_hier_p2p *)(void *)&p2p_stand_in;
  struct hvdl_cost_model *m = &c->model;
  if (hvdl_config_cost_model(m) != hvdlSuccess) return hvdl_py_raise(hvdlInvalidArgument, NULL), -1;
  if (model_term(model, "intra_alpha", &m->alpha[HVDL_LINK_INTRA]) ||
      model_term(model, "inter_alpha", &m->alpha[HVDL_LINK_INTER]) ||
      model_term(model, "intra_beta", &m->beta[HVDL_LINK_INTRA]) ||
      model_term(model, "inter_beta", &m->beta[HVDL_LINK_INTER]) ||
      model_term(model, "gamma", &m->gamma))
    return -1;
  const char *source_keys[2] = {"inter_source", "intra_source"};
  int *sources[2] = {&m->inter_source, &m->intra_source};
  for (int k = 0; k < 2; k++) {
    PyObject *src = PyDict_GetItemString(model, source_keys[k]);
    if (!src) continue;
    const char *name = PyUnicode_AsUTF8(src);
    if (!name) return -1;
    *sources[k] = -1;
    for (int i = 0; i <= HVDL_MODEL_MEASURED; i++)
      if (strcmp(name, model_sources[i]) == 0) *sources[k] = i;
    if (*sources[k] < 0)
      return PyErr_Format(PyExc_ValueError, "%s %s: expected default, file or measured",
                          source_keys[k], name),
             -1;
  }
  PyObject *steps = PyDict_GetItemString(model, "inter_alpha_steps");
  if (steps) {
    PyObject *seq = PySequence_Fast(steps, "inter_alpha_steps: a list of (bytes, seconds)");
    if (!seq) return -1;
    const Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (k > HVDL_ALPHA_STEPS) {
      Py_DECREF(seq);
      return PyErr_Format(PyExc_ValueError, "inter_alpha_steps: at most %d", HVDL_ALPHA_STEPS), -1;
    }
    m->steps = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
      double b, a;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "dd", &b, &a)) {
        Py_DECREF(seq);
        return -1;
      }
      m->step_bytes[m->steps] = b;
      m->step_alpha[m->steps++] = a;
    }
    Py_DECREF(seq);
  }
  return 0;
}

/* plan_allreduce_model(size, hosts, local_size, nbytes, model[, shm_lanes]): the all-reduce
 * selector's choice for nbytes per rank on a made-up communicator (model_comm); shm_lanes > 0
 * gives every host a shared segment, and the shared-memory hierarchical all-reduce that many
 * lanes (the fewest ranks on a host), as on a real cluster; 0 (the default): none, as in the
 * simulation. */
PyObject *hvdl_py_plan_allreduce_model(PyObject *self, PyObject *args) {
  struct hvdlComm comm;
  unsigned long long nbytes;
  int shm_lanes = 0;
  const Py_ssize_t given = PyTuple_Size(args);
  if (given == 6 && !PyArg_Parse(PyTuple_GET_ITEM(args, 5), "i", &shm_lanes)) return NULL;
  PyObject *head = PyTuple_GetSlice(args, 0, given < 5 ? given : 5);
  if (!head) return NULL;
  const int bad = model_comm("plan_allreduce_model", head, &comm, &nbytes) < 0;
  Py_DECREF(head);
  if (bad) return NULL;
  if (given > 6 || shm_lanes < 0 || shm_lanes > comm.local_size)
    return PyErr_Format(PyExc_ValueError,
                        "plan_allreduce_model: shm_lanes %d: expected 0 .. local_size (%d), and at "
                        "most 6 arguments",
                        shm_lanes, comm.local_size);
  struct hvdl_shm shm; /* select_allreduce.c reads its hosts and lanes only (cma: 0) */
  if (shm_lanes) {
    memset(&shm, 0, sizeof shm);
    shm.hosts = comm.hosts;
    shm.lanes = shm_lanes;
    shm.local_size = comm.local_size;
    comm.shm = &shm;
  }
  return allreduce_plan(&comm, nbytes);
}

/* The all-to-all selector's view of n blocks of `block` bytes (select_alltoall.c). */
static PyObject *alltoall_plan(hvdlComm_t comm, unsigned long long block) {
  PyObject *pred = PyDict_New();
  for (int a = hvdlAllToAllPairwise; pred && a < hvdlNumAllToAllAlgos; a++) {
    const double t = hvdl_select_predict_alltoall(comm, (hvdlAllToAllAlgorithm_t)a, (size_t)block);
    PyObject *v = t < 0 ? (Py_INCREF(Py_None), Py_None) : PyFloat_FromDouble(t);
    if (!v || PyDict_SetItemString(pred, hvdl_alltoall_algo_name(a), v) < 0) Py_CLEAR(pred);
    Py_XDECREF(v);
  }
  if (!pred) return NULL;
  const char *chosen = hvdl_alltoall_algo_name(hvdl_select_alltoall(comm, (size_t)block));
  return Py_BuildValue("{s:s,s:N}", "algorithm", chosen, "predicted", pred);
}

/* plan_alltoall_model(size, hosts, local_size, block, model): the same for the all-to-all
 * of n blocks of `block` bytes. */
PyObject *hvdl_py_plan_alltoall_model(PyObject *self, PyObject *args) {
  struct hvdlComm comm;
  unsigned long long block;
  if (model_comm("plan_alltoall_model", args, &comm, &block) < 0) return NULL;
  return alltoall_plan(&comm, block);
}

static PyObject *Comm_alltoall_plan(CommObject *self, PyObject *args) {
  unsigned long long block;
  if (!PyArg_ParseTuple(args, "K", &block)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  return alltoall_plan(self->comm, block);
}

/* The broadcast selector's view of a call of nbytes (select_broadcast.c). */
static PyObject *Comm_broadcast_plan(CommObject *self, PyObject *args) {
  unsigned long long nbytes;
  if (!PyArg_ParseTuple(args, "K", &nbytes)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  PyObject *pred = PyDict_New();
  if (!pred) return NULL;
  for (int a = hvdlBcastChain; a < hvdlNumBcastAlgos; a++) {
    const double t =
        hvdl_select_predict_broadcast(self->comm, (hvdlBroadcastAlgorithm_t)a, (size_t)nbytes);
    PyObject *v = t < 0 ? (Py_INCREF(Py_None), Py_None) : PyFloat_FromDouble(t);
    if (!v || PyDict_SetItemString(pred, hvdl_bcast_algo_name(a), v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(pred);
      return NULL;
    }
    Py_DECREF(v);
  }
  const char *chosen = hvdl_bcast_algo_name(hvdl_select_broadcast(self->comm, (size_t)nbytes));
  return Py_BuildValue("{s:s,s:N}", "algorithm", chosen, "predicted", pred);
}

/* The all-gather's (coll "allgather") or reduce-scatter's ("reducescatter") selector's
 * view of a call of nbytes in all (select_gather.c). */
static PyObject *Comm_gather_plan(CommObject *self, PyObject *args) {
  const char *coll;
  unsigned long long nbytes;
  if (!PyArg_ParseTuple(args, "sK", &coll, &nbytes)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  const int gather = strcmp(coll, "allgather") == 0;
  if (!gather && strcmp(coll, "reducescatter") != 0)
    return PyErr_Format(PyExc_ValueError, "gather_plan: coll %s is not allgather or reducescatter",
                        coll);
  const hvdlComm_t c = self->comm;
  const size_t b = (size_t)nbytes;
  PyObject *pred = PyDict_New();
  for (int a = 1; pred && a < (gather ? hvdlNumAllGatherAlgos : hvdlNumReduceScatterAlgos); a++) {
    const double t = gather
                         ? hvdl_select_predict_allgather(c, (hvdlAllGatherAlgorithm_t)a, b)
                         : hvdl_select_predict_reducescatter(c, (hvdlReduceScatterAlgorithm_t)a, b);
    PyObject *v = t < 0 ? (Py_INCREF(Py_None), Py_None) : PyFloat_FromDouble(t);
    const char *name = gather ? hvdl_allgather_algo_name(a) : hvdl_reducescatter_algo_name(a);
    if (!v || PyDict_SetItemString(pred, name, v) < 0) Py_CLEAR(pred);
    Py_XDECREF(v);
  }
  if (!pred) return NULL;
  const char *chosen = gather ? hvdl_allgather_algo_name(hvdl_select_allgather(c, b))
                              : hvdl_reducescatter_algo_name(hvdl_select_reducescatter(c, b));
  return Py_BuildValue("{s:s,s:N}", "algorithm", chosen, "predicted", pred);
}

static PyMethodDef Comm_methods[] = {
    {"gather_plan", (PyCFunction)Comm_gather_plan, METH_VARARGS,
     "gather_plan(coll, nbytes) -> {'algorithm', 'predicted': {name: seconds or None}}: the "
     "all-gather's or reduce-scatter's selector's choice and the cost model's times (None: not "
     "modelled, the all-gather's shm)"},
    {"alltoall_plan", (PyCFunction)Comm_alltoall_plan, METH_VARARGS,
     "alltoall_plan(block) -> {'algorithm', 'predicted': {name: seconds}}: the all-to-all "
     "selector's choice for ranks blocks of `block` bytes each, and the cost model's times"},
    {"broadcast_plan", (PyCFunction)Comm_broadcast_plan, METH_VARARGS,
     "broadcast_plan(nbytes) -> {'algorithm', 'predicted': {name: seconds or None}}: the "
     "selector's choice and the cost model's times (None: not modelled, shm)"},
    {"cost_model", (PyCFunction)Comm_cost_model, METH_NOARGS,
     "cost_model() -> {'intra_alpha', 'inter_alpha', 'intra_beta', 'inter_beta', 'gamma', "
     "'inter_alpha_steps': [(bytes, seconds)], 'inter_source', 'intra_source': 'default', 'file' "
     "or 'measured', 'measure_s', 'inter_measure_error', 'intra_measure_error': why that measurement at init "
     "failed, or None}: "
     "the model every rank agreed on at init"},
    {"allreduce_plan", (PyCFunction)Comm_allreduce_plan, METH_VARARGS,
     "allreduce_plan(nbytes) -> {'algorithm', 'predicted': {name: seconds or None}, 'hosts', "
     "'local_size', 'hier_p2p_across' ('rd', 'rab', 'direct', or None where hier_p2p cannot "
     "run), 'hier_p2p_lanes'}: the selector's choice and the cost model's times"},
    {"allreduce", (PyCFunction)Comm_allreduce, METH_VARARGS,
     "allreduce(sendbuf, recvbuf, dtype, op): hvdlAllReduce on byte buffers (GIL released)"},
    {"broadcast", (PyCFunction)Comm_broadcast, METH_VARARGS,
     "broadcast(sendbuf, recvbuf, dtype, root): hvdlBroadcast (sendbuf may be None off the root)"},
    {"reduce", (PyCFunction)Comm_reduce, METH_VARARGS,
     "reduce(sendbuf, recvbuf, dtype, op, root): hvdlReduce (recvbuf may be None off the root)"},
    {"allgather", (PyCFunction)Comm_allgather, METH_VARARGS,
     "allgather(sendbuf, recvbuf, dtype): hvdlAllGather; recvbuf holds size x sendbuf"},
    {"reducescatter", (PyCFunction)Comm_reducescatter, METH_VARARGS,
     "reducescatter(sendbuf, recvbuf, dtype, op): hvdlReduceScatter; sendbuf holds size x recvbuf"},
    {"alltoall", (PyCFunction)Comm_alltoall, METH_VARARGS,
     "alltoall(sendbuf, recvbuf, dtype): hvdlAllToAll, ranks x count elements each"},
    {"destroy", (PyCFunction)Comm_destroy, METH_NOARGS, "hvdlCommDestroy (collective)"},
    {"shrink", (PyCFunction)Comm_shrink, METH_VARARGS,
     "shrink(exclude, flags=0) -> Comm or None: hvdlCommShrink (the ranks left call it)"},
    {"_inject_fault", (PyCFunction)Comm_inject_fault, METH_VARARGS,
     "_inject_fault(point, n, data_timeout): this rank fails the n-th next time it reaches point "
     "(n=0: none), and the data waits end after data_timeout seconds without progress (testing)"},
    {"shm_layout", (PyCFunction)Comm_shm_layout, METH_NOARGS,
     "None without a shared-memory path, else (hosts, lanes, local_rank, local_size)"},
    {"shm_cma", (PyCFunction)Comm_shm_cma, METH_NOARGS,
     "whether the shared-memory path reads the peers' own buffers above SHM_CMA_MIN bytes"},
    {"shm_views", (PyCFunction)Comm_shm_views, METH_NOARGS,
     "how many of the peers' hvdlMemAlloc regions (stand-ins too) this rank has mapped (peer_memory.c)"},
    {"shm_stand_ins", (PyCFunction)Comm_shm_stand_ins, METH_NOARGS,
     "how many all-reduces took this rank's stand-in for plain buffers (single_copy.c)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject hvdl_py_comm_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.Comm",
    .tp_basicsize = sizeof(CommObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A bare hvdlComm (the C API), for benchmarks and tests.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Comm_init,
    .tp_dealloc = (destructor)Comm_dealloc,
    .tp_methods = Comm_methods,
};
