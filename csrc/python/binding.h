/*
 * binding.h -- what the units of the Python binding (module hvd_lite._core)
 * share. The binding is thin: it turns Python objects into the C core's
 * arguments and hvdlResult_t codes into exceptions; the core holds the logic.
 *
 *   py_module.c    the module: init, MPI lifetime, build_info, the method table
 *   py_engine.c    the Engine type (the background engine)
 *   py_handle.c    the Handle type (one submitted collective), and the orphans of
 *                  handles dropped while pending
 *   py_testing.c   for tests and benchmarks only: the Comm type (the bare C API)
 *   py_kernels.c   for tests and benchmarks only: the local kernels (host and CUDA)
 *                  and the kernel benchmark
 *   py_convert.c   conversions both ways: dtype and op checks, the base
 *                  communicator, and results into exceptions (with the error factory)
 *   py_mem.c       the SharedMemory type (hvdlMemAlloc's memory as a buffer)
 *   py_buffer.c    a Python object's memory as one descriptor (host or CUDA; the buffer
 *                  protocol, the CUDA array interface, DLPack)
 *
 * Arrows point down: py_module -> py_engine -> py_handle, py_testing -> py_buffer
 * -> py_convert -> the core; py_module -> py_mem -> py_convert.
 */
#ifndef HVDL_PY_BINDING_H_
#define HVDL_PY_BINDING_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "base/base.h"
#include "hvdl.h"

struct hvdl_engine;
struct hvdl_request;

/* ---- py_mem.c ------------------------------------------------------------ */

extern PyTypeObject hvdl_py_shared_memory_type;

/* mem_free(address): hvdlMemFree (tests: a pointer it did not make is refused). */
PyObject *hvdl_py_mem_free(PyObject *self, PyObject *arg);

/* ---- py_convert.c -------------------------------------------------------- */

/* Raises the exception the Python layer maps `res` to (through the error factory),
 * with comm's last message (comm NULL: this thread's); returns NULL. */
PyObject *hvdl_py_raise(hvdlResult_t res, hvdlComm_t comm);

/* set_error_factory(f): f(code, message) -> exception instance. */
PyObject *hvdl_py_set_error_factory(PyObject *self, PyObject *f);

/* error_string(code) -> hvdlGetErrorString(code). */
PyObject *hvdl_py_error_string(PyObject *self, PyObject *arg);

/* 0, or -1 with ValueError set for a value outside the public enum. */
int hvdl_py_check_dtype(int dtype);
/* ... and one that reduction ops apply to (not bool). */
int hvdl_py_check_reducible(int dtype);
int hvdl_py_check_op(int op);

/* ---- py_buffer.c --------------------------------------------------------- */

/* The memory a Python object holds. */
struct hvdl_py_memory {
  Py_buffer view;   /* view.buf, view.len: where and how many bytes; view.obj keeps it alive */
  int dtype;        /* the producer's element type (hvdlDataType_t), -1 where it names none
                     * (or was not asked: hvdl_py_describe's `typed`) */
  int device_type;  /* HVDL_DEVICE_CPU, HVDL_DEVICE_CUDA, ... (DLPack's numbers, cuda.h) */
  int device_id;    /* -1 where neither the producer nor CUDA says */
  uintptr_t stream; /* the producer's stream (the CUDA array interface's 'stream'), 0: none */
};

/* Fills m from obj: a tuple (owner, address, nbytes[, device, stream]) of memory that owner
 * keeps alive (a framework's tensor, whose memory the adapter vouches for; host memory, or
 * with device >= 0 that CUDA device's, ordered on stream), the buffer
 * protocol, __cuda_array_interface__ or __dlpack__, in that order; C-contiguous
 * memory only. -1 with an exception set otherwise. Release with PyBuffer_Release(&m->view).
 * `typed`: also read the buffer protocol's element type (its format), which no call
 * needs and which costs numpy a format string for each array it exports. */
int hvdl_py_describe(PyObject *obj, int writable, int typed, struct hvdl_py_memory *m,
                     const char *what);

/* hvdl_py_describe, then: memory on a device other than the host's is refused with a
 * ValueError naming it, unless device_ok and it is CUDA memory in a CUDA build; the
 * bytes must be a whole number of dtype elements, *count of them. */
int hvdl_py_get_memory(PyObject *obj, struct hvdl_py_memory *m, int writable, int dtype,
                       size_t *count, int device_ok, const char *what);

/* hvdl_py_get_memory for host memory, into a plain view. */
int hvdl_py_get_buffer(PyObject *obj, Py_buffer *view, int writable, int dtype, size_t *count,
                       const char *what);

/* describe_buffer(obj, writable=False) -> dict: the descriptor, for tests. */
PyObject *hvdl_py_describe_buffer(PyObject *self, PyObject *args);

/* A device type's name ("CPU", "CUDA", "ROCm", ...). */
const char *hvdl_py_device_name(int device_type);

/* The fault point a name (str) gives (HVD_LITE_FAULT's names, errors.c); -1 with
 * ValueError set for another. The engine's and the bare communicator's
 * _inject_fault take it. */
int hvdl_py_fault_point(PyObject *name);

/* The communicator a Fortran handle names; None means MPI_COMM_WORLD. */
int hvdl_py_base_comm(PyObject *fobj, MPI_Comm *out);

/* ---- py_engine.c, py_handle.c ------------------------------------------- */

/* A waiting thread checks for signals this often. */
#define HVDL_PY_WAIT_SLICE_SECONDS 0.1

/* A request and the buffers it reads and writes, exported while the engine may use them. */
struct hvdl_py_hold {
  struct hvdl_request *req;
  Py_buffer send, recv;
  int has_send, has_recv;
};

/* The hold of a handle dropped while its request was pending. */
struct hvdl_py_orphan {
  struct hvdl_py_hold hold;
  struct hvdl_py_orphan *next;
};

typedef struct {
  PyObject_HEAD struct hvdl_engine *engine;
  struct hvdl_topology topo;
  struct hvdl_py_orphan *orphans; /* under the GIL */
  int stopping;                   /* a thread is joining the engine thread (under the GIL) */
} hvdl_py_engine;

typedef struct {
  PyObject_HEAD hvdl_py_engine *owner;
  struct hvdl_py_hold hold;
} hvdl_py_handle;

extern PyTypeObject hvdl_py_engine_type; /* hvd_lite._core.Engine */
extern PyTypeObject hvdl_py_handle_type; /* hvd_lite._core.Handle */

/* Lets go of the engine object's orphans whose requests have completed (with `all`:
 * every one, once none can be pending: the engine has been freed). */
void hvdl_py_release_orphans(hvdl_py_engine *engine, int all);

/* ---- py_testing.c, py_kernels.c ------------------------------------------ */

extern PyTypeObject hvdl_py_comm_type; /* hvd_lite._core.Comm */

PyObject *hvdl_py_reduce_local(PyObject *self, PyObject *args);
PyObject *hvdl_py_divide_local(PyObject *self, PyObject *args);
PyObject *hvdl_py_scale_local(PyObject *self, PyObject *args);
PyObject *hvdl_py_kernel_bench(PyObject *self, PyObject *args);
PyObject *hvdl_py_plan_allreduce_model(PyObject *self, PyObject *args);
PyObject *hvdl_py_plan_alltoall_model(PyObject *self, PyObject *args);

#endif /* HVDL_PY_BINDING_H_ */
