/*
 * pymodule.c -- the Python binding, module hvd_lite._core.
 *
 * Thin: it turns Python objects into the C API's arguments and result codes
 * into exceptions. Buffers arrive through the buffer protocol as flat byte
 * views (the Python layer passes arr.view(uint8)), so no framework or numpy
 * header is needed. The GIL is released while C works.
 *
 *   mpi_init() -> (provided_thread_level, initialized_here)
 *   mpi_finalize()
 *   mpi_library_version() -> str         (callable before MPI is initialised)
 *   build_info() -> dict                 (the MPI this extension was compiled against)
 *   set_error_factory(f)                 f(code, message) -> exception instance
 *   Engine(fhandle=None, ranks=None)     starts the background engine (engine.c) over the
 *                                        base communicator (Fortran handle) or a subset of it
 *     .rank .size .local_rank .local_size .cross_rank .cross_size
 *     .submit(coll, send, recv, dtype, op, prescale, postscale, name, shape, root, splits,
 *             error, urgent=False) -> Handle   (urgent: waited on at once, no batching)
 *     .shutdown()
 *   Handle.poll() -> bool, Handle.wait()  (GIL released; raises if the request failed)
 *   Handle.out_rows(), .recv_splits(), and the buffer protocol: an engine-allocated output
 *   Comm(fhandle=None).allreduce(send, recv, dtype, op), .broadcast(send, recv, dtype, root),
 *     .reduce(send, recv, dtype, op, root), .allgather(send, recv, dtype),
 *     .reducescatter(send, recv, dtype, op), .destroy()
 *                                        the bare C API, for benchmarks and C-level tests
 *   reduce_local(dst, a, b, dtype, op), divide_local(buf, dtype, divisor)
 *   kernel_bench(dtype, op, nbytes, iters) -> (kernel_s, memcpy_s)
 *   error_string(code) -> str            (hvdlGetErrorString)
 *   hvdlInt8 ... hvdlInProgress          (the public enums' values)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "hvdl.h"
#include "internal.h"
#include "reduce.h"

#ifndef HVDL_BUILD_LIBMPI
#define HVDL_BUILD_LIBMPI ""
#endif
#ifndef HVDL_BUILD_MPI_LIBDIR
#define HVDL_BUILD_MPI_LIBDIR ""
#endif

/* A waiting handle checks for signals this often. */
#define WAIT_SLICE_SECONDS 0.1

static PyObject *error_factory = NULL;

/* Raises the exception the Python layer maps `res` to, with comm's message. */
static PyObject *raise_result(hvdlResult_t res, hvdlComm_t comm) {
  const char *msg = hvdlGetLastError(comm);
  if (!msg || !*msg) msg = hvdlGetErrorString(res);
  if (error_factory) {
    PyObject *exc = PyObject_CallFunction(error_factory, "is", (int)res, msg);
    if (exc) {
      PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
      Py_DECREF(exc);
    }
    return NULL;
  }
  PyErr_Format(PyExc_RuntimeError, "%s (hvdl result %d)", msg, (int)res);
  return NULL;
}

static PyObject *py_set_error_factory(PyObject *self, PyObject *f) {
  (void)self;
  Py_XINCREF(f);
  Py_XSETREF(error_factory, f);
  Py_RETURN_NONE;
}

static PyObject *py_error_string(PyObject *self, PyObject *arg) {
  (void)self;
  long code = PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(hvdlGetErrorString((hvdlResult_t)code));
}

static PyObject *mpi_error(int err, const char *what) {
  char text[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) len = 0;
  text[len] = '\0';
  hvdl_fail(NULL, hvdlSystemError, "%s failed: %s (MPI error %d)", what, text, err);
  return raise_result(hvdlSystemError, NULL);
}

/* ---- MPI lifetime -------------------------------------------------------- */

static PyObject *py_mpi_init(PyObject *self, PyObject *noargs) {
  (void)self;
  (void)noargs;
  int initialized = 0, finalized = 0, provided = 0, here = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    hvdl_fail(NULL, hvdlInvalidUsage, "MPI was already finalized in this process; "
                                      "hvd_lite cannot initialise it again");
    return raise_result(hvdlInvalidUsage, NULL);
  }
  if (!initialized) {
    int err;
    Py_BEGIN_ALLOW_THREADS err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    Py_END_ALLOW_THREADS if (err != MPI_SUCCESS) return mpi_error(err, "MPI_Init_thread");
    here = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  /* The library's own calls report errors instead of aborting. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return Py_BuildValue("(iO)", provided, here ? Py_True : Py_False);
}

static PyObject *py_mpi_finalize(PyObject *self, PyObject *noargs) {
  (void)self;
  (void)noargs;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    Py_BEGIN_ALLOW_THREADS MPI_Finalize();
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

static PyObject *py_mpi_world_size(PyObject *self, PyObject *noargs) {
  (void)self;
  (void)noargs;
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return PyLong_FromLong(size);
}

static PyObject *py_mpi_library_version(PyObject *self, PyObject *noargs) {
  (void)self;
  (void)noargs;
  char text[MPI_MAX_LIBRARY_VERSION_STRING + 1];
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) len = 0;
  text[len] = '\0';
  return PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
}

static PyObject *py_build_info(PyObject *self, PyObject *noargs) {
  (void)self;
  (void)noargs;
  char header[128];
  const char *vendor = "unknown";
#if defined(OPEN_MPI)
  vendor = "openmpi";
  snprintf(header, sizeof header, "Open MPI %d.%d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION,
           OMPI_RELEASE_VERSION);
#elif defined(I_MPI_VERSION)
  vendor = "intel";
  snprintf(header, sizeof header, "Intel MPI %s", I_MPI_VERSION);
#elif defined(MPICH_VERSION)
  vendor = "mpich";
  snprintf(header, sizeof header, "MPICH %s", MPICH_VERSION);
#else
  snprintf(header, sizeof header, "MPI %d.%d", MPI_VERSION, MPI_SUBVERSION);
#endif
  return Py_BuildValue("{s:s,s:s,s:s,s:s,s:i}", "mpi_vendor", vendor, "mpi_header", header,
                       "libmpi", HVDL_BUILD_LIBMPI, "mpi_libdir", HVDL_BUILD_MPI_LIBDIR,
                       "hvdl_version", HVDL_VERSION_CODE);
}

/* ---- buffers ------------------------------------------------------------- */

static int check_dtype(int dtype) {
  if (dtype < 0 || dtype >= hvdlNumTypes) {
    PyErr_Format(PyExc_ValueError, "invalid hvdl datatype %d", dtype);
    return -1;
  }
  return 0;
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, int dtype, size_t *count,
                      const char *what) {
  if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS
                                             : PyBUF_C_CONTIGUOUS) != 0)
    return -1;
  size_t es = hvdl_type_size((hvdlDataType_t)dtype);
  if ((size_t)view->len % es != 0) {
    PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, not a whole number of %s elements", what,
                 view->len, hvdl_type_name((hvdlDataType_t)dtype));
    PyBuffer_Release(view);
    return -1;
  }
  *count = (size_t)view->len / es;
  return 0;
}

static int check_op(int op);

/* ---- Engine and Handle ---------------------------------------------------- */

typedef struct {
  PyObject_HEAD struct hvdl_engine *engine;
  int rank, size, local_rank, local_size, cross_rank, cross_size;
} EngineObject;

typedef struct {
  PyObject_HEAD EngineObject *owner;
  struct hvdl_request *req;
  Py_buffer send, recv;
  int has_send, has_recv;
} HandleObject;

static PyTypeObject HandleType;

static int topology(EngineObject *self, MPI_Comm base) {
  MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  int err;
  MPI_Comm_rank(base, &self->rank);
  MPI_Comm_size(base, &self->size);
  err = MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, self->rank, MPI_INFO_NULL, &local);
  if (err != MPI_SUCCESS) return mpi_error(err, "MPI_Comm_split_type"), -1;
  MPI_Comm_rank(local, &self->local_rank);
  MPI_Comm_size(local, &self->local_size);
  err = MPI_Comm_split(base, self->local_rank, self->rank, &cross);
  if (err != MPI_SUCCESS) {
    MPI_Comm_free(&local);
    return mpi_error(err, "MPI_Comm_split"), -1;
  }
  MPI_Comm_rank(cross, &self->cross_rank);
  MPI_Comm_size(cross, &self->cross_size);
  MPI_Comm_free(&local);
  MPI_Comm_free(&cross);
  return 0;
}

/* With `ranks`, builds the communicator of those ranks of base (only they call). */
static int subset_comm(MPI_Comm base, PyObject *ranks, MPI_Comm *out) {
  PyObject *seq = PySequence_Fast(ranks, "ranks must be a sequence of ints");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int base_size, base_rank, member = 0, err;
  MPI_Comm_size(base, &base_size);
  MPI_Comm_rank(base, &base_rank);
  int *list = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  if (!list) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) goto fail;
    if (v < 0 || v >= base_size) {
      PyErr_Format(PyExc_ValueError, "init(comm=[...]): rank %ld is out of range [0, %d)", v,
                   base_size);
      goto fail;
    }
    list[i] = (int)v;
    member |= list[i] == base_rank;
  }
  if (!member) {
    PyErr_Format(PyExc_ValueError,
                 "init(comm=[...]): this process (rank %d) is not in the list of ranks; "
                 "only the listed ranks may call init with it",
                 base_rank);
    goto fail;
  }
  MPI_Group world_group, group;
  MPI_Comm_group(base, &world_group);
  MPI_Group_incl(world_group, (int)n, list, &group);
  Py_BEGIN_ALLOW_THREADS err = MPI_Comm_create_group(base, group, 0x4856, out);
  Py_END_ALLOW_THREADS MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  free(list);
  Py_DECREF(seq);
  if (err != MPI_SUCCESS) return mpi_error(err, "MPI_Comm_create_group"), -1;
  return 0;
fail:
  free(list);
  Py_DECREF(seq);
  return -1;
}

/* The communicator a Fortran handle names; None (not -1: MPICH's handles may be
 * negative) means MPI_COMM_WORLD. */
static int base_comm(PyObject *fobj, MPI_Comm *out) {
  *out = MPI_COMM_WORLD;
  if (fobj == Py_None) return 0;
  long long fhandle = PyLong_AsLongLong(fobj);
  if (fhandle == -1 && PyErr_Occurred()) return -1;
  *out = MPI_Comm_f2c((MPI_Fint)fhandle);
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
  if (res != hvdlSuccess) return raise_result(res, NULL), -1;
  MPI_Comm base;
  if (base_comm(fobj, &base)) return -1;
  MPI_Comm sub = MPI_COMM_NULL;
  if (ranks != Py_None) {
    if (subset_comm(base, ranks, &sub) != 0) return -1;
    base = sub;
  }
  int rc = topology(self, base);
  if (rc == 0) {
    Py_BEGIN_ALLOW_THREADS res = hvdl_engine_start(&self->engine, base, &cfg);
    Py_END_ALLOW_THREADS if (res != hvdlSuccess) rc = (raise_result(res, NULL), -1);
  }
  if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
  return rc;
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
  int urgent = 0;
  if (!PyArg_ParseTuple(args, "iOOiidds#OiOs|p", &coll, &sendobj, &recvobj, &dtype, &op, &pre,
                        &post, &name, &name_len, &shape, &root, &splits, &error, &urgent))
    return NULL;
  if (!self->engine) return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine is gone");
  if (coll < 0 || coll >= HVDL_NUM_COLLS) return PyErr_Format(PyExc_ValueError, "invalid collective %d", coll);
  if (check_dtype(dtype) || check_op(op)) return NULL;
  if (name_len >= HVDL_MAX_NAME)
    return PyErr_Format(PyExc_ValueError, "name is %zd bytes long; the limit is %d", name_len,
                        HVDL_MAX_NAME - 1);
  HandleObject *h = PyObject_New(HandleObject, &HandleType);
  if (!h) return NULL;
  h->owner = NULL;
  h->req = NULL;
  h->has_send = h->has_recv = 0;
  struct hvdl_request *r = calloc(1, sizeof *r);
  if (!r) {
    Py_DECREF(h);
    return PyErr_NoMemory();
  }
  atomic_init(&r->refs, 1);
  atomic_init(&r->state, HVDL_REQ_PENDING);
  h->req = r;
  Py_INCREF(self);
  h->owner = self;
  size_t scount = 0, rcount = 0;
  if (sendobj != Py_None) {
    if (get_buffer(sendobj, &h->send, 0, dtype, &scount, "sendbuf")) goto fail;
    h->has_send = 1;
  }
  if (recvobj != Py_None) {
    if (get_buffer(recvobj, &h->recv, 1, dtype, &rcount, "recvbuf")) goto fail;
    h->has_recv = 1;
  }
  if (parse_shape(shape, &r->desc)) goto fail;
  if (splits != Py_None) {
    PyObject *seq = PySequence_Fast(splits, "splits must be a sequence of ints");
    if (!seq) goto fail;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    r->splits = calloc((size_t)(k > self->size ? k : self->size) + 1, sizeof *r->splits);
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
  hvdlResult_t res = hvdl_engine_submit(self->engine, r, urgent);
  if (res != hvdlSuccess) {
    raise_result(res, NULL);
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
    /* The engine may still write into the buffers: wait before letting them go. */
    if (!hvdl_request_poll(r) && self->owner && self->owner->engine) {
      Py_BEGIN_ALLOW_THREADS hvdl_request_wait(self->owner->engine, r);
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
    if (!self->owner->engine) return PyErr_Format(PyExc_RuntimeError, "the hvd_lite engine is gone");
    struct hvdl_engine *e = self->owner->engine;
    /* In slices, so that a signal (Ctrl-C, a test's timeout) interrupts the wait. */
    for (int done = 0; !done;) {
      Py_BEGIN_ALLOW_THREADS done = hvdl_request_wait_for(e, r, WAIT_SLICE_SECONDS);
      Py_END_ALLOW_THREADS
      if (!done && PyErr_CheckSignals() < 0) return NULL;
    }
  }
  if (atomic_load(&r->state) == HVDL_REQ_FAILED) {
    hvdl_fail(NULL, r->result, "%s", r->error);
    return raise_result(r->result, NULL);
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
  PyObject *list = PyList_New(self->owner->size);
  for (int i = 0; list && i < self->owner->size; i++)
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

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A submitted collective.",
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
    .tp_as_buffer = &Handle_as_buffer,
};

/* ---- Comm: the NCCL-shaped C API on its own ------------------------------ */

/* A bare hvdlComm over a duplicate of the world (or of a given communicator),
 * for benchmarks and tests of the C API. hvd_lite's collectives never use it:
 * they go through the Engine, whose thread owns their traffic. */
typedef struct {
  PyObject_HEAD hvdlComm_t comm;
} CommObject;

static int Comm_init(CommObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"fhandle", NULL};
  PyObject *fobj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O", kwlist, &fobj)) return -1;
  MPI_Comm base;
  if (base_comm(fobj, &base)) return -1;
  hvdlResult_t res;
  Py_BEGIN_ALLOW_THREADS res = hvdlCommInitMpi(&self->comm, base, NULL);
  Py_END_ALLOW_THREADS if (res != hvdlSuccess) return raise_result(res, NULL), -1;
  return 0;
}

static void Comm_dealloc(CommObject *self) {
  if (self->comm) hvdlCommAbort(self->comm);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Comm_allreduce(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype, op;
  if (!PyArg_ParseTuple(args, "OOii", &sendobj, &recvobj, &dtype, &op)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  if (check_dtype(dtype) || check_op(op)) return NULL;
  Py_buffer sv, rv;
  size_t scount, rcount;
  if (get_buffer(sendobj, &sv, 0, dtype, &scount, "sendbuf")) return NULL;
  if (get_buffer(recvobj, &rv, 1, dtype, &rcount, "recvbuf")) {
    PyBuffer_Release(&sv);
    return NULL;
  }
  hvdlResult_t res = hvdlInvalidArgument;
  hvdlComm_t c = self->comm;
  if (scount != rcount) {
    hvdl_fail(c, res, "allreduce: sendbuf has %zu elements, recvbuf %zu", scount, rcount);
  } else {
    Py_BEGIN_ALLOW_THREADS res = hvdlAllReduce(sv.buf, rv.buf, scount, (hvdlDataType_t)dtype,
                                               (hvdlRedOp_t)op, c, NULL);
    Py_END_ALLOW_THREADS
  }
  PyBuffer_Release(&sv);
  PyBuffer_Release(&rv);
  if (res != hvdlSuccess) return raise_result(res, c);
  Py_RETURN_NONE;
}

/* The other collectives of the C API. A buffer may be None (NULL), so that
 * callers can pass what NCCL lets them leave out (a non-root's sendbuf in
 * broadcast, its recvbuf in reduce) and tests can check the NULL rules.
 * Sizes are bytes / element size; a size that does not fit the call's rule
 * is refused here with InvalidArgumentError, before any traffic. */

/* Exports obj (or None: NULL, 0 elements). */
static int get_opt_buffer(PyObject *obj, Py_buffer *view, int writable, int dtype,
                          size_t *count, const char *what) {
  if (obj == Py_None) {
    memset(view, 0, sizeof *view);
    *count = 0;
    return 0;
  }
  return get_buffer(obj, view, writable, dtype, count, what);
}

static void release_opt(Py_buffer *view) {
  if (view->obj) PyBuffer_Release(view);
}

/* Exports both buffers; -1 with an exception set on failure. */
static int get_pair(PyObject *sendobj, PyObject *recvobj, int dtype, Py_buffer *sv,
                    Py_buffer *rv, size_t *scount, size_t *rcount) {
  if (check_dtype(dtype)) return -1;
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
  if (res != hvdlSuccess) return raise_result(res, c);
  Py_RETURN_NONE;
}

static PyObject *Comm_broadcast(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype, root;
  if (!PyArg_ParseTuple(args, "OOii", &sendobj, &recvobj, &dtype, &root)) return NULL;
  if (!self->comm) return PyErr_Format(PyExc_RuntimeError, "the communicator was destroyed");
  Py_buffer sv, rv;
  size_t scount, rcount;
  if (get_pair(sendobj, recvobj, dtype, &sv, &rv, &scount, &rcount)) return NULL;
  hvdlComm_t c = self->comm;
  hvdlResult_t res = hvdlInvalidArgument;
  if (sv.obj && scount != rcount) {
    hvdl_fail(c, res, "broadcast: sendbuf has %zu elements, recvbuf %zu", scount, rcount);
  } else {
    Py_BEGIN_ALLOW_THREADS res = hvdlBroadcast(sv.buf, rv.buf, rcount, (hvdlDataType_t)dtype,
                                               root, c, NULL);
    Py_END_ALLOW_THREADS
  }
  return finish_call(res, c, &sv, &rv);
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
    Py_BEGIN_ALLOW_THREADS res = hvdlReduce(sv.buf, rv.buf, count, (hvdlDataType_t)dtype,
                                            (hvdlRedOp_t)op, root, c, NULL);
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
    hvdl_fail(c, res, "allgather: recvbuf has %zu elements, not %zu ranks x sendbuf's %zu",
              rcount, n, count);
  } else {
    Py_BEGIN_ALLOW_THREADS res = hvdlAllGather(sv.buf, rv.buf, count, (hvdlDataType_t)dtype, c,
                                               NULL);
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
    hvdl_fail(c, res, "alltoall: sendbuf has %zu elements and recvbuf %zu; both need ranks (%zu) x count",
              scount, rcount, n);
  } else {
    Py_BEGIN_ALLOW_THREADS res = hvdlAllToAll(sv.buf, rv.buf, scount / n, (hvdlDataType_t)dtype, c, NULL);
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
    Py_BEGIN_ALLOW_THREADS res = hvdlReduceScatter(sv.buf, rv.buf, count, (hvdlDataType_t)dtype,
                                                   (hvdlRedOp_t)op, c, NULL);
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
    Py_BEGIN_ALLOW_THREADS res = hvdlCommDestroy(c);
    Py_END_ALLOW_THREADS if (res != hvdlSuccess) return raise_result(res, NULL);
  }
  Py_RETURN_NONE;
}

static PyMethodDef Comm_methods[] = {
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
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CommType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.Comm",
    .tp_basicsize = sizeof(CommObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A bare hvdlComm (the C API), for benchmarks and tests.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Comm_init,
    .tp_dealloc = (destructor)Comm_dealloc,
    .tp_methods = Comm_methods,
};

#define ENGINE_INT_GETTER(field)                                                       \
  static PyObject *Engine_get_##field(EngineObject *self, void *closure) {            \
    (void)closure;                                                                    \
    return PyLong_FromLong((long)self->field);                                        \
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
     "submit(coll, send, recv, dtype, op, prescale, postscale, name, shape, root, splits, error)"},
    {"hold", (PyCFunction)Engine_hold, METH_O,
     "hold(True) ... hold(False): submissions in between enter the same round"},
    {"shutdown", (PyCFunction)Engine_shutdown, METH_NOARGS,
     "leave: the last round tells the other ranks; pending requests fail"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
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

/* ---- local kernels, for tests and the kernel benchmark ------------------- */

static int check_op(int op) {
  if (op < 0 || op >= hvdlNumOps) {
    PyErr_Format(PyExc_ValueError, "invalid hvdl op %d", op);
    return -1;
  }
  return 0;
}

static PyObject *py_reduce_local(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *d, *a, *b;
  int dtype, op;
  if (!PyArg_ParseTuple(args, "OOOii", &d, &a, &b, &dtype, &op)) return NULL;
  if (check_dtype(dtype) || check_op(op)) return NULL;
  Py_buffer dv, av, bv;
  size_t nd, na, nb;
  if (get_buffer(d, &dv, 1, dtype, &nd, "dst")) return NULL;
  if (get_buffer(a, &av, 0, dtype, &na, "a")) goto fail_d;
  if (get_buffer(b, &bv, 0, dtype, &nb, "b")) goto fail_a;
  if (na != nd || nb != nd) {
    PyErr_SetString(PyExc_ValueError, "reduce_local: buffers differ in length");
  } else {
    Py_BEGIN_ALLOW_THREADS hvdl_reduce(dv.buf, av.buf, bv.buf, nd, (hvdlDataType_t)dtype,
                                       (hvdlRedOp_t)op);
    Py_END_ALLOW_THREADS
  }
  PyBuffer_Release(&bv);
fail_a:
  PyBuffer_Release(&av);
fail_d:
  PyBuffer_Release(&dv);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

static PyObject *py_divide_local(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *d;
  int dtype;
  unsigned long long divisor;
  if (!PyArg_ParseTuple(args, "OiK", &d, &dtype, &divisor)) return NULL;
  if (check_dtype(dtype)) return NULL;
  Py_buffer dv;
  size_t n;
  if (get_buffer(d, &dv, 1, dtype, &n, "buf")) return NULL;
  hvdl_divide(dv.buf, n, (hvdlDataType_t)dtype, divisor);
  PyBuffer_Release(&dv);
  Py_RETURN_NONE;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Median-free raw timing: the benchmark repeats and takes medians itself. */
static PyObject *py_kernel_bench(PyObject *self, PyObject *args) {
  (void)self;
  int dtype, op, iters;
  Py_ssize_t nbytes;
  if (!PyArg_ParseTuple(args, "iini", &dtype, &op, &nbytes, &iters)) return NULL;
  if (check_dtype(dtype) || check_op(op)) return NULL;
  size_t es = hvdl_type_size((hvdlDataType_t)dtype);
  size_t n = (size_t)nbytes / es, bytes = n * es;
  if (n == 0 || iters < 1) return PyErr_Format(PyExc_ValueError, "kernel_bench: nothing to time");
  char *a = NULL, *b = NULL, *d = NULL;
  if (posix_memalign((void **)&a, 64, bytes) || posix_memalign((void **)&b, 64, bytes) ||
      posix_memalign((void **)&d, 64, bytes)) {
    free(a);
    free(b);
    free(d);
    return PyErr_NoMemory();
  }
  /* Ones of the type: products stay normal numbers (0x11 bytes made subnormals). */
  static const uint64_t one_bits[hvdlNumTypes] = {1, 1, 1, 1, 1, 1, 0x3C00, 0x3F800000,
                                                  0x3FF0000000000000ull, 0x3F80};
  for (size_t i = 0; i < n; i++) {
    memcpy(a + i * es, &one_bits[dtype], es); /* little-endian: the low bytes */
    memcpy(b + i * es, &one_bits[dtype], es);
  }
  memset(d, 0, bytes);
  double tk, tm;
  Py_BEGIN_ALLOW_THREADS hvdl_reduce(d, a, b, n, (hvdlDataType_t)dtype, (hvdlRedOp_t)op);
  double t0 = now_s();
  for (int i = 0; i < iters; i++) hvdl_reduce(d, a, b, n, (hvdlDataType_t)dtype, (hvdlRedOp_t)op);
  double t1 = now_s();
  for (int i = 0; i < iters; i++) memcpy(d, a, bytes);
  double t2 = now_s();
  tk = (t1 - t0) / iters;
  tm = (t2 - t1) / iters;
  Py_END_ALLOW_THREADS free(a);
  free(b);
  free(d);
  return Py_BuildValue("(dd)", tk, tm);
}

/* ---- module -------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"mpi_init", py_mpi_init, METH_NOARGS, "initialise MPI with MPI_THREAD_MULTIPLE if needed"},
    {"mpi_finalize", py_mpi_finalize, METH_NOARGS, "finalize MPI if it is initialised"},
    {"mpi_world_size", py_mpi_world_size, METH_NOARGS, "size of MPI_COMM_WORLD"},
    {"mpi_library_version", py_mpi_library_version, METH_NOARGS, "MPI_Get_library_version"},
    {"build_info", py_build_info, METH_NOARGS, "the MPI this extension was compiled against"},
    {"error_string", py_error_string, METH_O, "hvdlGetErrorString(code)"},
    {"set_error_factory", py_set_error_factory, METH_O, "f(code, message) -> exception"},
    {"reduce_local", py_reduce_local, METH_VARARGS, "dst = a op b with the C kernels"},
    {"divide_local", py_divide_local, METH_VARARGS, "buf /= divisor with Avg's division"},
    {"kernel_bench", py_kernel_bench, METH_VARARGS, "(kernel seconds, memcpy seconds) per call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "hvd_lite._core", "hvd_lite's C core", -1, module_methods,
    NULL,                  NULL,             NULL,                NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
  if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&HandleType) < 0 ||
      PyType_Ready(&CommType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  Py_INCREF(&CommType);
  if (PyModule_AddObject(m, "Comm", (PyObject *)&CommType) < 0) {
    Py_DECREF(&CommType);
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&EngineType);
  if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
    Py_DECREF(&EngineType);
    Py_DECREF(m);
    return NULL;
  }
  PyModule_AddIntConstant(m, "MPI_THREAD_MULTIPLE", MPI_THREAD_MULTIPLE);
  /* The public enums, so that Python (and a unit test) read the header's numbers. */
  static const struct {
    const char *name;
    int value;
  } enums[] = {
      {"hvdlInt8", hvdlInt8},
      {"hvdlUint8", hvdlUint8},
      {"hvdlInt32", hvdlInt32},
      {"hvdlUint32", hvdlUint32},
      {"hvdlInt64", hvdlInt64},
      {"hvdlUint64", hvdlUint64},
      {"hvdlFloat16", hvdlFloat16},
      {"hvdlFloat32", hvdlFloat32},
      {"hvdlFloat64", hvdlFloat64},
      {"hvdlBfloat16", hvdlBfloat16},
      {"hvdlNumTypes", hvdlNumTypes},
      {"hvdlSum", hvdlSum},
      {"hvdlProd", hvdlProd},
      {"hvdlMax", hvdlMax},
      {"hvdlMin", hvdlMin},
      {"hvdlAvg", hvdlAvg},
      {"hvdlNumOps", hvdlNumOps},
      {"hvdlSuccess", hvdlSuccess},
      {"hvdlUnhandledCudaError", hvdlUnhandledCudaError},
      {"hvdlSystemError", hvdlSystemError},
      {"hvdlInternalError", hvdlInternalError},
      {"hvdlInvalidArgument", hvdlInvalidArgument},
      {"hvdlInvalidUsage", hvdlInvalidUsage},
      {"hvdlRemoteError", hvdlRemoteError},
      {"hvdlInProgress", hvdlInProgress},
      {"COLL_ALLREDUCE", HVDL_COLL_ALLREDUCE},
      {"COLL_ALLGATHER", HVDL_COLL_ALLGATHER},
      {"COLL_BROADCAST", HVDL_COLL_BROADCAST},
      {"COLL_ALLTOALL", HVDL_COLL_ALLTOALL},
      {"COLL_REDUCESCATTER", HVDL_COLL_REDUCESCATTER},
      {"COLL_BARRIER", HVDL_COLL_BARRIER},
      {"COLL_JOIN", HVDL_COLL_JOIN},
  };
  for (size_t i = 0; i < sizeof enums / sizeof enums[0]; i++)
    PyModule_AddIntConstant(m, enums[i].name, enums[i].value);
  PyModule_AddIntConstant(m, "HVDL_VERSION_CODE", HVDL_VERSION_CODE);
  return m;
}
