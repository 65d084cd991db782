/*
 * py_kernels.c -- the reduction kernels on local buffers, for tests and the
 * kernel benchmark (hvd_lite's collectives never call these):
 *
 *   reduce_local(dst, a, b, dtype, op), divide_local(buf, dtype, divisor)
 *                                        reduce.c's kernels on host memory; on CUDA
 *                                        memory, cuda_kernels.cu's (then synchronized)
 *   scale_local(dst, src, dtype, factor) the scale kernels (host memory; on CUDA memory,
 *                                        cuda_kernels.cu's, then synchronized)
 *   kernel_bench(dtype, op, nbytes, iters) -> (kernel_s, memcpy_s)
 */
#include "python/binding.h"

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "cuda/cuda.h"
#include "kernels/kernels.h"
#include "select/select.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The kernels' result code on CUDA memory, as an exception (NULL comm: this thread's message). */
static int cuda_done(hvdlResult_t res) {
  if (res == hvdlSuccess) res = hvdl_cuda_sync(NULL, NULL);
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL), -1;
  return 0;
}

PyObject *hvdl_py_reduce_local(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *d, *a, *b;
  int dtype, op;
  if (!PyArg_ParseTuple(args, "OOOii", &d, &a, &b, &dtype, &op)) return NULL;
  if (hvdl_py_check_reducible(dtype) || hvdl_py_check_op(op)) return NULL;
  struct hvdl_py_memory dm, am, bm;
  size_t nd, na, nb;
  if (hvdl_py_get_memory(d, &dm, 1, dtype, &nd, 1, "dst")) return NULL;
  if (hvdl_py_get_memory(a, &am, 0, dtype, &na, 1, "a")) goto fail_d;
  if (hvdl_py_get_memory(b, &bm, 0, dtype, &nb, 1, "b")) goto fail_a;
  const int on_cuda = dm.device_type == HVDL_DEVICE_CUDA;
  if (na != nd || nb != nd) {
    PyErr_SetString(PyExc_ValueError, "reduce_local: buffers differ in length");
  } else if (am.device_type != dm.device_type || bm.device_type != dm.device_type) {
    PyErr_SetString(PyExc_ValueError, "reduce_local: buffers on different devices");
  } else if (on_cuda) {
    cuda_done(hvdl_cuda_reduce(NULL, dm.view.buf, am.view.buf, bm.view.buf, nd,
                               (hvdlDataType_t)dtype, (hvdlRedOp_t)op, NULL));
  } else {
    Py_BEGIN_ALLOW_THREADS
      hvdl_reduce(dm.view.buf, am.view.buf, bm.view.buf, nd, (hvdlDataType_t)dtype,
                  (hvdlRedOp_t)op);
    Py_END_ALLOW_THREADS
  }
  PyBuffer_Release(&bm.view);
fail_a:
  PyBuffer_Release(&am.view);
fail_d:
  PyBuffer_Release(&dm.view);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

PyObject *hvdl_py_divide_local(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *d;
  int dtype;
  unsigned long long divisor;
  if (!PyArg_ParseTuple(args, "OiK", &d, &dtype, &divisor)) return NULL;
  if (hvdl_py_check_reducible(dtype)) return NULL;
  struct hvdl_py_memory dm;
  size_t n;
  if (hvdl_py_get_memory(d, &dm, 1, dtype, &n, 1, "buf")) return NULL;
  if (dm.device_type == HVDL_DEVICE_CUDA)
    cuda_done(hvdl_cuda_divide(NULL, dm.view.buf, n, (hvdlDataType_t)dtype, divisor, NULL));
  else
    hvdl_divide(dm.view.buf, n, (hvdlDataType_t)dtype, divisor);
  PyBuffer_Release(&dm.view);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

PyObject *hvdl_py_scale_local(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *d, *s;
  int dtype;
  double factor;
  if (!PyArg_ParseTuple(args, "OOid", &d, &s, &dtype, &factor)) return NULL;
  if (hvdl_py_check_reducible(dtype)) return NULL;
  struct hvdl_py_memory dm, sm;
  size_t nd, ns;
  if (hvdl_py_get_memory(d, &dm, 1, dtype, &nd, 1, "dst")) return NULL;
  if (hvdl_py_get_memory(s, &sm, 0, dtype, &ns, 1, "src")) {
    PyBuffer_Release(&dm.view);
    return NULL;
  }
  if (ns != nd)
    PyErr_SetString(PyExc_ValueError, "scale_local: buffers differ in length");
  else if (sm.device_type != dm.device_type)
    PyErr_SetString(PyExc_ValueError, "scale_local: buffers on different devices");
  else if (dm.device_type == HVDL_DEVICE_CUDA)
    cuda_done(
        hvdl_cuda_scale(NULL, dm.view.buf, sm.view.buf, nd, (hvdlDataType_t)dtype, factor, NULL));
  else
    hvdl_scale(dm.view.buf, sm.view.buf, nd, (hvdlDataType_t)dtype, factor);
  PyBuffer_Release(&sm.view);
  PyBuffer_Release(&dm.view);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

PyObject *hvdl_py_kernel_bench(PyObject *self, PyObject *args) {
  (void)self;
  int dtype, op, iters;
  Py_ssize_t nbytes;
  if (!PyArg_ParseTuple(args, "iini", &dtype, &op, &nbytes, &iters)) return NULL;
  if (hvdl_py_check_reducible(dtype) || hvdl_py_check_op(op)) return NULL;
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
  static const uint64_t one_bits[HVDL_TYPE_SLOTS] = {
      1, 1, 1, 1, 1, 1, 0x3C00, 0x3F800000, 0x3FF0000000000000ull, 0x3F80, 1, 1, 1};
  const uint64_t one = one_bits[hvdl_type_slot(dtype)];
  for (size_t i = 0; i < n; i++) {
    memcpy(a + i * es, &one, es); /* little-endian: the low bytes */
    memcpy(b + i * es, &one, es);
  }
  memset(d, 0, bytes);
  double tk, tm;
  Py_BEGIN_ALLOW_THREADS
    hvdl_reduce(d, a, b, n, (hvdlDataType_t)dtype, (hvdlRedOp_t)op);
    double t0 = hvdl_now();
    for (int i = 0; i < iters; i++) hvdl_reduce(d, a, b, n, (hvdlDataType_t)dtype, (hvdlRedOp_t)op);
    double t1 = hvdl_now();
    for (int i = 0; i < iters; i++) memcpy(d, a, bytes);
    double t2 = hvdl_now();
    tk = (t1 - t0) / iters;
    tm = (t2 - t1) / iters;
  Py_END_ALLOW_THREADS
  free(a);
  free(b);
  free(d);
  return Py_BuildValue("(dd)", tk, tm);
}
