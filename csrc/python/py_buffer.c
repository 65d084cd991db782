/*
 * py_buffer.c -- the memory a Python object holds, as one descriptor
 * (struct hvdl_py_memory: address, bytes, element type, device type and
 * number, stream), from whichever protocol the object speaks, tried in order:
 *
 *   (owner, address, nbytes[, device, stream])
 *                               memory by address (hvd_lite.torch's tensors): host memory,
 *                               or with device >= 0 that CUDA device's, on `stream`
 *   the buffer protocol         host memory (numpy, bytearray, memoryview); where the
 *                               export fails and the object has the CUDA array interface
 *                               (CuPy's arrays refuse it for device memory), that instead
 *   __cuda_array_interface__    CUDA device memory (CuPy, torch.cuda, Numba), version 0..3;
 *                               a type it cannot name (bfloat16) through DLPack instead
 *   __dlpack__, or a capsule    host or CUDA memory (torch CPU tensors, numpy, JAX; a
 *                               'dltensor' capsule as TensorFlow's to_dlpack gives)
 *
 * Only C-contiguous memory is taken (a view with gaps is refused, naming its
 * strides). The DLPack structures are declared here from the DLPack ABI (v0.8:
 * the unversioned capsule every producer gives when no max_version is asked),
 * so no framework header is needed. A capsule is kept, unrenamed, as the
 * memory's owner: its own destructor calls the producer's deleter when the
 * view is released.
 */
#include "python/binding.h"

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "cuda/cuda.h"
#include "select/select.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int32_t device_type, device_id;
} dl_device;
typedef struct {
  uint8_t code, bits;
  uint16_t lanes;
} dl_dtype;
typedef struct {
  void *data;
  dl_device device;
  int32_t ndim;
  dl_dtype dtype;
  int64_t *shape, *strides; /* strides in elements; NULL: C-contiguous */
  uint64_t byte_offset;
} dl_tensor;
typedef struct dl_managed {
  dl_tensor tensor;
  void *manager_ctx;
  void (*deleter)(struct dl_managed *self);
} dl_managed;

#define HVDL_MAX_DIMS_PY 32

enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_BOOL = 6 };

const char *hvdl_py_device_name(int device_type) {
  switch (device_type) {
    case HVDL_DEVICE_CPU: return "CPU";
    case HVDL_DEVICE_CUDA: return "CUDA";
    case HVDL_DEVICE_CUDA_HOST: return "CUDA pinned host";
    case 4: return "OpenCL";
    case 7: return "Vulkan";
    case 8: return "Metal";
    case 10: return "ROCm";
    case HVDL_DEVICE_CUDA_MANAGED: return "CUDA managed";
    case 14: return "oneAPI";
    default: return "unknown";
  }
}

/* The hvdl type of a (kind, bytes) pair: kind 'i', 'u', 'f', 'b' (bool), 'B' (bfloat). */
static int type_of(char kind, int bytes) {
  static const struct {
    char kind;
    int bytes, type;
  } table[] = {{'i', 1, hvdlInt8},    {'i', 2, hvdlInt16},   {'i', 4, hvdlInt32},
               {'i', 8, hvdlInt64},   {'u', 1, hvdlUint8},   {'u', 2, hvdlUint16},
               {'u', 4, hvdlUint32},  {'u', 8, hvdlUint64},  {'f', 2, hvdlFloat16},
               {'f', 4, hvdlFloat32}, {'f', 8, hvdlFloat64}, {'B', 2, hvdlBfloat16},
               {'b', 1, hvdlBool}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (table[i].kind == kind && table[i].bytes == bytes) return table[i].type;
  return -1;
}

/* The hvdl type of a buffer protocol's format (struct module characters, native
 * order), or -1 (raw bytes, or a format no hvdl type has). */
static int format_type(const char *f, Py_ssize_t itemsize) {
  if (!f) return hvdlUint8;
  if (*f == '@' || *f == '=' || *f == '<') f++;
  if (!f[0] || f[1]) return -1;
  if (*f == 'e') return hvdlFloat16;
  if (*f == 'f' || *f == 'd') return type_of('f', (int)itemsize);
  if (*f == '?') return hvdlBool;
  if (strchr("bhilq", *f)) return type_of('i', (int)itemsize);
  if (strchr("BHILQ", *f)) return type_of('u', (int)itemsize);
  return -1;
}

/* 1 when strides (in bytes) walk shape C-contiguously; size-1 dimensions may have any. */
static int c_contiguous(int ndim, const int64_t *shape, const int64_t *strides, int64_t esize) {
  int64_t want = esize;
  for (int d = ndim - 1; d >= 0; d--) {
    if (shape[d] == 0) return 1;
    if (shape[d] != 1 && strides[d] != want) return 0;
    want *= shape[d];
  }
  return 1;
}

/* *n = the product of the ndim sizes, each at least 0, in at most PY_SSIZE_T_MAX / esize
 * elements; -1 with ValueError set otherwise. */
static int elements(int ndim, const int64_t *shape, int64_t esize, int64_t *n, const char *what) {
  *n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0 || (shape[d] > 0 && *n > PY_SSIZE_T_MAX / esize / shape[d])) {
      PyErr_Format(PyExc_ValueError, "%s: dimension %d of size %lld is %s", what, d,
                   (long long)shape[d], shape[d] < 0 ? "negative" : "too large");
      return -1;
    }
    *n *= shape[d];
  }
  return 0;
}

/* Fills m's view over [address, address + nbytes), owned by owner. The view holds `owner`
 * alive; its release must be a decref and nothing else, since the owner exported nothing here.
 * An owner whose type releases buffers of its own (CuPy's arrays: their release, called on a
 * view they never gave, corrupts them) is held through a 1-tuple. */
static int fill(struct hvdl_py_memory *m, PyObject *owner, uintptr_t address, Py_ssize_t nbytes,
                int readonly) {
  const PyBufferProcs *procs = Py_TYPE(owner)->tp_as_buffer;
  PyObject *holder = owner;
  if (procs && procs->bf_releasebuffer)
    holder = PyTuple_Pack(1, owner);
  else
    Py_INCREF(holder);
  if (!holder) return -1;
  const int rc =
      PyBuffer_FillInfo(&m->view, holder, (void *)address, nbytes, readonly, PyBUF_SIMPLE);
  Py_DECREF(holder);
  return rc;
}

/* ---- the CUDA array interface -------------------------------------------- */

static int int_tuple(PyObject *t, int64_t *out, int max, const char *key, const char *what) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > max) {
    PyErr_Format(PyExc_ValueError,
                 "%s: __cuda_array_interface__[%s] must be a tuple of at most "
                 "%d ints, got %R",
                 what, key, max, t);
    return -1;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
    if (out[i] == -1 && PyErr_Occurred()) return -1;
  }
  return (int)PyTuple_GET_SIZE(t);
}

static int no_type(PyObject *typestr, const char *what, int rc) {
  PyErr_Format(PyExc_TypeError,
               "%s: typestr %R names no type hvd_lite takes (bfloat16 has no "
               "typestr: pass it through DLPack)",
               what, typestr);
  return rc;
}

static int from_cai(PyObject *obj, PyObject *cai, int writable, struct hvdl_py_memory *m,
                    const char *what) {
  if (!PyDict_Check(cai)) {
    PyErr_Format(PyExc_TypeError, "%s: __cuda_array_interface__ is not a dict", what);
    return -1;
  }
  PyObject *shape = PyDict_GetItemString(cai, "shape"),
           *typestr = PyDict_GetItemString(cai, "typestr");
  PyObject *data = PyDict_GetItemString(cai, "data"),
           *strides = PyDict_GetItemString(cai, "strides");
  PyObject *mask = PyDict_GetItemString(cai, "mask"), *stream = PyDict_GetItemString(cai, "stream");
  if (!shape || !typestr || !data) {
    PyErr_Format(PyExc_ValueError, "%s: __cuda_array_interface__ lacks %s", what,
                 !shape     ? "'shape'"
                 : !typestr ? "'typestr'"
                            : "'data'");
    return -1;
  }
  if (mask && mask != Py_None) {
    PyErr_Format(PyExc_ValueError, "%s: a masked CUDA array is not taken", what);
    return -1;
  }
  const char *ts = PyUnicode_Check(typestr) ? PyUnicode_AsUTF8(typestr) : NULL;
  int esize = 0, type = -1;
  if (ts && strlen(ts) >= 3 && strchr("<>|=", ts[0])) {
    esize = atoi(ts + 2);
    type = type_of(ts[1], esize);
    if (ts[0] == '>' && esize > 1) type = -1; /* big-endian */
  }
  if (type < 0 && esize <= 0) return no_type(typestr, what, -1);
  int64_t dims[HVDL_MAX_DIMS_PY], st[HVDL_MAX_DIMS_PY];
  const int ndim = int_tuple(shape, dims, HVDL_MAX_DIMS_PY, "'shape'", what);
  if (ndim < 0) return -1;
  int64_t n;
  if (elements(ndim, dims, esize, &n, what)) return -1;
  if (strides && strides != Py_None) {
    if (int_tuple(strides, st, HVDL_MAX_DIMS_PY, "'strides'", what) != ndim) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: strides %R do not match shape %R", what, strides,
                     shape);
      return -1;
    }
    if (!c_contiguous(ndim, dims, st, esize)) {
      PyErr_Format(PyExc_ValueError,
                   "%s: the CUDA array is not C-contiguous (shape %R, strides "
                   "%R); pass a contiguous copy",
                   what, shape, strides);
      return -1;
    }
  }
  PyObject *where, *ro;
  if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2) {
    PyErr_Format(PyExc_ValueError,
                 "%s: __cuda_array_interface__['data'] must be "
                 "(address, read_only), got %R",
                 what, data);
    return -1;
  }
  where = PyTuple_GET_ITEM(data, 0), ro = PyTuple_GET_ITEM(data, 1);
  const unsigned long long address = PyLong_AsUnsignedLongLong(where);
  if (address == (unsigned long long)-1 && PyErr_Occurred()) return -1;
  const int readonly = PyObject_IsTrue(ro);
  if (readonly < 0) return -1;
  if (readonly && writable) {
    PyErr_Format(PyExc_ValueError, "%s: the CUDA array is read-only and the call writes it", what);
    return -1;
  }
  if (address == 0 && n > 0) {
    PyErr_Format(PyExc_ValueError, "%s: the CUDA array has %lld elements at address 0", what, n);
    return -1;
  }
  m->stream = 0;
  if (stream && stream != Py_None) {
    const long long s = PyLong_AsLongLong(stream);
    if (s == -1 && PyErr_Occurred()) return -1;
    if (s == 0) { /* the interface's rule: 0 is ambiguous, producers give 1 or 2 for defaults */
      PyErr_Format(PyExc_ValueError,
                   "%s: __cuda_array_interface__['stream'] is 0, which the "
                   "interface disallows (1: the legacy default stream, 2: per-thread)",
                   what);
      return -1;
    }
    m->stream = (uintptr_t)s;
  }
  /* A type the typestr cannot name, in an array otherwise taken (its stream kept in m): the
   * caller may read it through DLPack instead. */
  if (type < 0) return no_type(typestr, what, -2);
  m->dtype = type;
  m->device_type = HVDL_DEVICE_CUDA;
  m->device_id = hvdl_cuda_device_of((const void *)(uintptr_t)address);
  return fill(m, obj, (uintptr_t)address, (Py_ssize_t)(n * esize), readonly);
}

/* ---- DLPack --------------------------------------------------------------- */

/* obj: a producer with __dlpack__, or a capsule one gave (TensorFlow's to_dlpack). */
static int from_dlpack(PyObject *obj, int writable, struct hvdl_py_memory *m, const char *what) {
  PyObject *cap = PyCapsule_CheckExact(obj) ? (Py_INCREF(obj), obj)
                                            : PyObject_CallMethod(obj, "__dlpack__", NULL);
  if (!cap) return -1;
  dl_managed *t = PyCapsule_IsValid(cap, "dltensor") ? PyCapsule_GetPointer(cap, "dltensor") : NULL;
  if (!t) {
    PyErr_Format(PyExc_TypeError, "%s: %s no unused 'dltensor' capsule", what,
                 PyCapsule_CheckExact(obj) ? "the capsule is" : "__dlpack__() gave");
    goto fail;
  }
  const dl_tensor *d = &t->tensor;
  static const char kinds[] = {[DL_INT] = 'i',    [DL_UINT] = 'u', [DL_FLOAT] = 'f', [3] = 0,
                               [DL_BFLOAT] = 'B', [5] = 0,         [DL_BOOL] = 'b'};
  const int type = d->dtype.code <= DL_BOOL && d->dtype.lanes == 1 && d->dtype.bits % 8 == 0
                       ? type_of(kinds[d->dtype.code], d->dtype.bits / 8)
                       : -1;
  if (type < 0) {
    PyErr_Format(PyExc_TypeError,
                 "%s: DLPack type (code %d, %d bits, %d lanes) is no type "
                 "hvd_lite takes",
                 what, d->dtype.code, d->dtype.bits, d->dtype.lanes);
    goto fail;
  }
  const int64_t esize = d->dtype.bits / 8;
  int64_t n, st[HVDL_MAX_DIMS_PY];
  if (d->ndim < 0 || d->ndim > HVDL_MAX_DIMS_PY) {
    PyErr_Format(PyExc_ValueError, "%s: %d dimensions (at most %d)", what, d->ndim,
                 HVDL_MAX_DIMS_PY);
    goto fail;
  }
  if (elements(d->ndim, d->shape, esize, &n, what)) goto fail;
  for (int i = 0; d->strides && i < d->ndim; i++) st[i] = d->strides[i] * esize;
  if (d->strides && !c_contiguous(d->ndim, d->shape, st, esize)) {
    PyErr_Format(PyExc_ValueError, "%s: the tensor is not C-contiguous; pass a contiguous copy",
                 what);
    goto fail;
  }
  const uintptr_t address = (uintptr_t)d->data + (uintptr_t)d->byte_offset;
  m->dtype = type;
  m->device_type = d->device.device_type;
  m->device_id = d->device.device_id;
  m->stream = 0;
  (void)
      writable; /* the unversioned capsule has no read-only flag; producers refuse to export one */
  int rc = fill(m, cap, address, (Py_ssize_t)(n * esize), 0);
  Py_DECREF(cap);
  return rc;
fail:
  Py_DECREF(cap);
  return -1;
}

/* ---- the one entry ---------------------------------------------------------- */

/* Host memory through the buffer protocol: typed, the element type from its format. */
static int host_buffer(PyObject *obj, int writable, int typed, struct hvdl_py_memory *m) {
  const int flags = (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS;
  if (!typed) return PyObject_GetBuffer(obj, &m->view, flags);
  if (PyObject_GetBuffer(obj, &m->view, flags | PyBUF_FORMAT) == 0) {
    m->dtype = format_type(m->view.format, m->view.itemsize);
    return 0;
  }
  PyErr_Clear(); /* a format the exporter cannot spell (ml_dtypes' bfloat16): the bytes alone */
  return PyObject_GetBuffer(obj, &m->view, flags);
}

/* obj's attribute `name` (a new reference), or NULL where it has none; the error set before the
 * call stays set after it either way. */
static PyObject *attr_keeping_error(PyObject *obj, const char *name) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject *attr = PyObject_GetAttrString(obj, name);
  if (!attr) PyErr_Clear();
  PyErr_Restore(type, value, tb);
  return attr;
}

int hvdl_py_describe(PyObject *obj, int writable, int typed, struct hvdl_py_memory *m,
                     const char *what) {
  memset(m, 0, sizeof *m);
  m->dtype = -1;
  m->device_type = HVDL_DEVICE_CPU;
  m->device_id = 0;
  if (PyTuple_CheckExact(obj)) { /* (owner, address, nbytes[, device, stream]): memory the owner
                                  * keeps alive, on the host, or on a CUDA device (device >= 0) */
    PyObject *owner, *where;
    Py_ssize_t len;
    int device = -1;
    unsigned long long stream = 0;
    if (!PyArg_ParseTuple(obj,
                          "OO!n|iK;a buffer by address is (owner, address, nbytes[, device, "
                          "stream])",
                          &owner, &PyLong_Type, &where, &len, &device, &stream))
      return -1;
    const unsigned long long address = PyLong_AsUnsignedLongLong(where); /* not negative */
    if (address == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (len < 0 || (address == 0 && len > 0) || device < -1) {
      PyErr_Format(PyExc_ValueError, "%s: %zd bytes at address %llu (device %d)", what, len,
                   address, device);
      return -1;
    }
    if (device >= 0) {
      m->device_type = HVDL_DEVICE_CUDA;
      m->device_id = device;
      m->stream = (uintptr_t)stream;
    }
    return fill(m, obj, (uintptr_t)address, len, 0); /* the tuple holds the owner */
  }
  if (PyCapsule_CheckExact(obj)) return from_dlpack(obj, writable, m, what);
  PyObject *cai;
  if (PyObject_CheckBuffer(obj)) {
    if (host_buffer(obj, writable, typed, m) == 0) return 0;
    /* CuPy's arrays export the buffer protocol only to refuse it for device memory: an object
     * that also has the CUDA array interface is read through that. Any other keeps its error. */
    cai = attr_keeping_error(obj, "__cuda_array_interface__");
    if (!cai) return -1;
    PyErr_Clear();
  } else {
    cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
  }
  int rc = 0;
  if (cai) {
    rc = from_cai(obj, cai, writable, m, what);
    Py_DECREF(cai);
    if (rc != -2) return rc;
  }
  /* No interface, one that raised for this array, or one whose typestr names no type (torch
   * gives bfloat16 as '<V2'; the interface's read-only flag checked, its stream kept): DLPack,
   * if the object has it. */
  const uintptr_t stream = m->stream;
  PyObject *dlpack = attr_keeping_error(obj, "__dlpack__");
  if (!dlpack) {
    if (rc == -2 || !PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "%s: a %.100s is no buffer hvd_lite can read (it has neither the "
                 "buffer protocol, __cuda_array_interface__ nor __dlpack__)",
                 what, Py_TYPE(obj)->tp_name);
    return -1;
  }
  Py_DECREF(dlpack);
  PyErr_Clear();
  if (from_dlpack(obj, writable, m, what)) return -1;
  m->stream = stream;
  return 0;
}

int hvdl_py_get_memory(PyObject *obj, struct hvdl_py_memory *m, int writable, int dtype,
                       size_t *count, int device_ok, const char *what) {
  if (hvdl_py_describe(obj, writable, 0, m, what)) return -1;
  const int host = m->device_type == HVDL_DEVICE_CPU || m->device_type == HVDL_DEVICE_CUDA_HOST;
  const int cuda = m->device_type == HVDL_DEVICE_CUDA || m->device_type == HVDL_DEVICE_CUDA_MANAGED;
  const char *refusal = NULL;
  if (!host && !cuda)
    refusal = "hvd_lite takes host and CUDA memory only";
  else if (cuda && !hvdl_cuda_built())
    refusal =
        "this hvd_lite was built without CUDA (build_info()['cuda'] is False); copy it to "
        "the host, or rebuild hvd_lite where nvcc is found";
  else if (cuda && !device_ok)
    refusal = "this call takes host memory only; copy it to the host";
  if (refusal) {
    PyErr_Format(PyExc_ValueError, "%s is in %s memory (device %d): %s", what,
                 hvdl_py_device_name(m->device_type), m->device_id, refusal);
    PyBuffer_Release(&m->view);
    return -1;
  }
  size_t es = hvdl_type_size((hvdlDataType_t)dtype);
  if ((size_t)m->view.len % es != 0) {
    PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, not a whole number of %s elements", what,
                 m->view.len, hvdl_type_name((hvdlDataType_t)dtype));
    PyBuffer_Release(&m->view);
    return -1;
  }
  *count = (size_t)m->view.len / es;
  return 0;
}

int hvdl_py_get_buffer(PyObject *obj, Py_buffer *view, int writable, int dtype, size_t *count,
                       const char *what) {
  struct hvdl_py_memory m;
  if (hvdl_py_get_memory(obj, &m, writable, dtype, count, 0, what)) return -1;
  *view = m.view;
  return 0;
}

PyObject *hvdl_py_describe_buffer(PyObject *self, PyObject *args) {
  PyObject *obj;
  int writable = 0;
  (void)self;
  if (!PyArg_ParseTuple(args, "O|p", &obj, &writable)) return NULL;
  struct hvdl_py_memory m;
  if (hvdl_py_describe(obj, writable, 1, &m, "buffer")) return NULL;
  PyObject *out =
      Py_BuildValue("{s:K,s:n,s:i,s:i,s:i,s:K,s:O}", "address",
                    (unsigned long long)(uintptr_t)m.view.buf, "nbytes", m.view.len, "dtype",
                    m.dtype, "device_type", m.device_type, "device_id", m.device_id, "stream",
                    (unsigned long long)m.stream, "readonly", m.view.readonly ? Py_True : Py_False);
  PyBuffer_Release(&m.view);
  return out;
}
