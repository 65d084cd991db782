/*
 * py_mem.c -- the SharedMemory type of hvd_lite._core: memory from hvdlMemAlloc
 * (peer_memory.c), which the ranks of a host reach directly, as a writable buffer
 * of bytes (the buffer protocol); freed with hvdlMemFree when the object and
 * every view of it are gone.
 *
 *   SharedMemory(nbytes)     nbytes > 0; zeroed, page-aligned
 *   len(m), memoryview(m), numpy.frombuffer(m, dtype)
 *   mem_free(address)        hvdlMemFree on any address (tests: its refusals)
 */

#include "python/binding.h"

#include <stdint.h>

typedef struct {
  PyObject_HEAD void *ptr;
  Py_ssize_t nbytes;
} shared_memory;

static PyObject *mem_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"nbytes", NULL};
  Py_ssize_t nbytes;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", names, &nbytes)) return NULL;
  if (nbytes <= 0)
    return PyErr_Format(PyExc_ValueError, "SharedMemory: nbytes must be positive (got %zd)",
                        nbytes);
  shared_memory *m = (shared_memory *)type->tp_alloc(type, 0);
  if (!m) return NULL;
  hvdlResult_t res;
  Py_BEGIN_ALLOW_THREADS
    res = hvdlMemAlloc(&m->ptr, (size_t)nbytes);
  Py_END_ALLOW_THREADS
  if (res != hvdlSuccess) {
    Py_DECREF(m);
    return hvdl_py_raise(res, NULL);
  }
  m->nbytes = nbytes;
  return (PyObject *)m;
}

static void mem_dealloc(shared_memory *m) {
  if (m->ptr) hvdlMemFree(m->ptr); /* hvdlMemAlloc's pointer (unless mem_free took it first) */
  Py_TYPE(m)->tp_free((PyObject *)m);
}

static int mem_getbuffer(shared_memory *m, Py_buffer *view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)m, m->ptr, m->nbytes, 0, flags);
}

static Py_ssize_t mem_length(shared_memory *m) { return m->nbytes; }

static PyObject *mem_address(shared_memory *m, void *unused) { return PyLong_FromVoidPtr(m->ptr); }

static PyBufferProcs mem_buffer = {(getbufferproc)mem_getbuffer, NULL};
static PySequenceMethods mem_sequence = {.sq_length = (lenfunc)mem_length};
static PyGetSetDef mem_getset[] = {
    {"address", (getter)mem_address, NULL, "the memory's address", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyObject *hvdl_py_mem_free(PyObject *self, PyObject *arg) {
  void *ptr = PyLong_AsVoidPtr(arg);
  if (!ptr && PyErr_Occurred()) return NULL;
  const hvdlResult_t res = hvdlMemFree(ptr);
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL);
  Py_RETURN_NONE;
}

PyTypeObject hvdl_py_shared_memory_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hvd_lite._core.SharedMemory",
    .tp_basicsize = sizeof(shared_memory),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "SharedMemory(nbytes): hvdlMemAlloc's memory, which the ranks of a host reach "
        "directly, as a writable buffer of bytes",
    .tp_new = mem_new,
    .tp_dealloc = (destructor)mem_dealloc,
    .tp_as_buffer = &mem_buffer,
    .tp_as_sequence = &mem_sequence,
    .tp_getset = mem_getset,
};
