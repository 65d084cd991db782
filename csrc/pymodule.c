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
 *   Comm(fhandle=None, ranks=None)       fhandle: Fortran handle of the base communicator
 *     .rank .size .local_rank .local_size .cross_rank .cross_size
 *     .allreduce(sendbuf, recvbuf, dtype, op)
 *     .destroy()
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

#include "hvdl.h"
#include "internal.h"
#include "reduce.h"

#ifndef HVDL_BUILD_LIBMPI
#define HVDL_BUILD_LIBMPI ""
#endif
#ifndef HVDL_BUILD_MPI_LIBDIR
#define HVDL_BUILD_MPI_LIBDIR ""
#endif

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

/* ---- Comm ---------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD hvdlComm_t comm;
  int local_rank, local_size, cross_rank, cross_size;
} CommObject;

static int topology(CommObject *self, MPI_Comm base) {
  MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  int rank = self->comm->rank, err;
  err = MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  if (err != MPI_SUCCESS) return mpi_error(err, "MPI_Comm_split_type"), -1;
  MPI_Comm_rank(local, &self->local_rank);
  MPI_Comm_size(local, &self->local_size);
  err = MPI_Comm_split(base, self->local_rank, rank, &cross);
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

static int Comm_init(CommObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"fhandle", "ranks", NULL};
  PyObject *fobj = Py_None, *ranks = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO", kwlist, &fobj, &ranks)) return -1;
  if (self->comm) {
    PyErr_SetString(PyExc_RuntimeError, "Comm is already initialised");
    return -1;
  }
  /* Fortran handles may be negative (MPICH), so None, not -1, means the world. */
  MPI_Comm base = MPI_COMM_WORLD;
  if (fobj != Py_None) {
    long long fhandle = PyLong_AsLongLong(fobj);
    if (fhandle == -1 && PyErr_Occurred()) return -1;
    base = MPI_Comm_f2c((MPI_Fint)fhandle);
  }
  MPI_Comm sub = MPI_COMM_NULL;
  if (ranks != Py_None) {
    if (subset_comm(base, ranks, &sub) != 0) return -1;
    base = sub;
  }
  hvdlResult_t res;
  Py_BEGIN_ALLOW_THREADS res = hvdlCommInitMpi(&self->comm, base, NULL);
  Py_END_ALLOW_THREADS if (res != hvdlSuccess) {
    if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
    raise_result(res, NULL);
    return -1;
  }
  int rc = topology(self, base);
  if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
  return rc;
}

static void Comm_dealloc(CommObject *self) {
  /* A Comm dropped without destroy() (e.g. at interpreter exit after a failure)
   * is abandoned, not freed collectively. */
  if (self->comm) hvdlCommAbort(self->comm);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int require_comm(CommObject *self) {
  if (!self->comm) {
    PyErr_SetString(PyExc_RuntimeError, "hvd_lite communicator has been destroyed");
    return -1;
  }
  return 0;
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

static PyObject *Comm_allreduce(CommObject *self, PyObject *args) {
  PyObject *sendobj, *recvobj;
  int dtype, op;
  if (!PyArg_ParseTuple(args, "OOii", &sendobj, &recvobj, &dtype, &op)) return NULL;
  if (require_comm(self) || check_dtype(dtype)) return NULL;
  Py_buffer sv, rv;
  size_t scount, rcount;
  if (get_buffer(sendobj, &sv, 0, dtype, &scount, "sendbuf")) return NULL;
  if (get_buffer(recvobj, &rv, 1, dtype, &rcount, "recvbuf")) {
    PyBuffer_Release(&sv);
    return NULL;
  }
  if (scount != rcount) {
    PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    return PyErr_Format(PyExc_ValueError, "allreduce: sendbuf has %zu elements, recvbuf %zu",
                        scount, rcount);
  }
  hvdlResult_t res;
  hvdlComm_t c = self->comm;
  Py_BEGIN_ALLOW_THREADS res =
      hvdlAllReduce(sv.buf, rv.buf, scount, (hvdlDataType_t)dtype, (hvdlRedOp_t)op, c, NULL);
  Py_END_ALLOW_THREADS PyBuffer_Release(&sv);
  PyBuffer_Release(&rv);
  if (res != hvdlSuccess) return raise_result(res, c);
  Py_RETURN_NONE;
}

#define COMM_INT_GETTER(field, expr)                                                   \
  static PyObject *Comm_get_##field(CommObject *self, void *closure) {                \
    (void)closure;                                                                    \
    if (require_comm(self)) return NULL;                                              \
    return PyLong_FromLong((long)(expr));                                             \
  }
COMM_INT_GETTER(rank, self->comm->rank)
COMM_INT_GETTER(size, self->comm->size)
COMM_INT_GETTER(local_rank, self->local_rank)
COMM_INT_GETTER(local_size, self->local_size)
COMM_INT_GETTER(cross_rank, self->cross_rank)
COMM_INT_GETTER(cross_size, self->cross_size)

static PyGetSetDef Comm_getset[] = {
    {"rank", (getter)Comm_get_rank, NULL, "rank in this communicator", NULL},
    {"size", (getter)Comm_get_size, NULL, "number of ranks", NULL},
    {"local_rank", (getter)Comm_get_local_rank, NULL, "rank on this host", NULL},
    {"local_size", (getter)Comm_get_local_size, NULL, "ranks on this host", NULL},
    {"cross_rank", (getter)Comm_get_cross_rank, NULL, "index of this host", NULL},
    {"cross_size", (getter)Comm_get_cross_size, NULL, "hosts with this local rank", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Comm_methods[] = {
    {"allreduce", (PyCFunction)Comm_allreduce, METH_VARARGS,
     "allreduce(sendbuf, recvbuf, dtype, op): hvdlAllReduce on byte buffers"},
    {"destroy", (PyCFunction)Comm_destroy, METH_NOARGS, "free the communicator (collective)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CommType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.Comm",
    .tp_basicsize = sizeof(CommObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An hvdl communicator with its host topology.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Comm_init,
    .tp_dealloc = (destructor)Comm_dealloc,
    .tp_methods = Comm_methods,
    .tp_getset = Comm_getset,
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
  memset(a, 0x11, bytes);
  memset(b, 0x22, bytes);
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
  if (PyType_Ready(&CommType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  Py_INCREF(&CommType);
  if (PyModule_AddObject(m, "Comm", (PyObject *)&CommType) < 0) {
    Py_DECREF(&CommType);
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
  };
  for (size_t i = 0; i < sizeof enums / sizeof enums[0]; i++)
    PyModule_AddIntConstant(m, enums[i].name, enums[i].value);
  PyModule_AddIntConstant(m, "HVDL_VERSION_CODE", HVDL_VERSION_CODE);
  return m;
}
