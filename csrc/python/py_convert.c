/*
 * py_convert.c -- the binding's conversions, both ways: Python arguments into
 * the C core's (flat byte buffers, dtype and op numbers, a communicator's
 * Fortran handle, a fault point's name) and the core's hvdlResult_t codes into
 * Python exceptions.
 *
 * Buffers are py_buffer.c's.
 * Exceptions are built by the error factory that the Python layer registers
 * (hvd_lite.exceptions.error_from_code); without one they are RuntimeErrors.
 */
#include "python/binding.h"

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "select/select.h"

/* f(code, message) -> exception instance; set once by hvd_lite._loader. */
static PyObject *error_factory = NULL;

PyObject *hvdl_py_raise(hvdlResult_t res, hvdlComm_t comm) {
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

PyObject *hvdl_py_set_error_factory(PyObject *self, PyObject *f) {
  (void)self;
  Py_XINCREF(f);
  Py_XSETREF(error_factory, f);
  Py_RETURN_NONE;
}

PyObject *hvdl_py_error_string(PyObject *self, PyObject *arg) {
  (void)self;
  long code = PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(hvdlGetErrorString((hvdlResult_t)code));
}

int hvdl_py_check_dtype(int dtype) {
  if (!hvdl_type_valid(dtype)) {
    PyErr_Format(PyExc_ValueError, "invalid hvdl datatype %d", dtype);
    return -1;
  }
  return 0;
}

int hvdl_py_check_reducible(int dtype) {
  if (hvdl_py_check_dtype(dtype)) return -1;
  if (!hvdl_type_reducible(dtype)) {
    PyErr_Format(PyExc_ValueError, "%s data has no reduction ops",
                 hvdl_type_name((hvdlDataType_t)dtype));
    return -1;
  }
  return 0;
}

int hvdl_py_check_op(int op) {
  if (!hvdl_op_valid(op)) {
    PyErr_Format(PyExc_ValueError, "invalid hvdl op %d", op);
    return -1;
  }
  return 0;
}

int hvdl_py_fault_point(PyObject *name) {
  const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  for (int i = 0; s && i < HVDL_FAULT_POINTS; i++)
    if (strcmp(s, hvdl_fault_name(i)) == 0) return i;
  if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "unknown fault point %R", name);
  return -1;
}

/* None, not -1, means the world: MPICH's handles may be negative. */
int hvdl_py_base_comm(PyObject *fobj, MPI_Comm *out) {
  *out = MPI_COMM_WORLD;
  if (fobj == Py_None) return 0;
  long long fhandle = PyLong_AsLongLong(fobj);
  if (fhandle == -1 && PyErr_Occurred()) return -1;
  *out = MPI_Comm_f2c((MPI_Fint)fhandle);
  return 0;
}
