/*
 * py_module.c -- the Python binding's module, hvd_lite._core: its init, MPI's
 * lifetime and what this build was compiled against. binding.h lists the
 * other units of the binding; it is thin: it turns Python objects into the C
 * API's arguments and result codes into exceptions, with the GIL released
 * while C works.
 *
 *   mpi_init() -> (provided_thread_level, initialized_here)
 *   mpi_finalize()
 *   mpi_world_size() -> int
 *   mpi_library_version() -> str         (callable before MPI is initialised)
 *   build_info() -> dict                 (the MPI this extension was compiled against; CUDA)
 *   set_error_factory(f)                 f(code, message) -> exception instance
 *   error_string(code) -> str            (hvdlGetErrorString)
 *   Engine, Handle                       py_engine.c
 *   Comm                                 py_testing.c (tests, benchmarks)
 *   SharedMemory, mem_free(address)      py_mem.c (hvdlMemAlloc's memory)
 *   reduce_local, divide_local, scale_local, kernel_bench
 *                                        py_kernels.c (tests, benchmarks)
 *   describe_buffer(obj, writable=False) py_buffer.c (tests)
 *   cuda_device_count()                  the CUDA devices this process sees
 *   hvdlInt8 ... hvdlInProgress, COLL_*  (the public enums' values)
 */
#include "python/binding.h"

#include "algorithms/algorithms.h"
#include "api/api.h"
#include "base/base.h"
#include "cuda/cuda.h"
#include "engine/engine.h"
#include "select/select.h"
#include "transport/shm/shm.h"
#include "transport/transport.h"

#include <string.h>

#ifndef HVDL_BUILD_LIBMPI
#define HVDL_BUILD_LIBMPI ""
#endif
#ifndef HVDL_BUILD_MPI_LIBDIR
#define HVDL_BUILD_MPI_LIBDIR ""
#endif

/* ---- MPI lifetime -------------------------------------------------------- */

static PyObject *py_mpi_init(PyObject *self, PyObject *noargs) {
  (void)self;
  (void)noargs;
  int initialized = 0, finalized = 0, provided = 0, here = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    hvdl_fail(NULL, hvdlInvalidUsage,
              "MPI was already finalized in this process; "
              "hvd_lite cannot initialise it again");
    return hvdl_py_raise(hvdlInvalidUsage, NULL);
  }
  if (!initialized) {
    int err;
    Py_BEGIN_ALLOW_THREADS
      err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    Py_END_ALLOW_THREADS
    if (err != MPI_SUCCESS) {
      return hvdl_py_raise(hvdl_fail_mpi(NULL, err, "MPI_Init_thread"), NULL);
    }
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
    Py_BEGIN_ALLOW_THREADS
      MPI_Finalize();
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

static PyObject *py_mpi_ft(PyObject *self, PyObject *noargs) {
  (void)self;
  (void)noargs;
  return PyBool_FromLong(hvdl_ft_enabled());
}

/* The survivors' communicator of base (None: MPI_COMM_WORLD) after a rank's death, as
 * (Fortran handle, size): base revoked, then shrunk (collective over every living rank). */
static PyObject *py_mpi_shrink(PyObject *self, PyObject *fobj) {
  (void)self;
  MPI_Comm base, out = MPI_COMM_NULL;
  if (hvdl_py_base_comm(fobj, &base)) return NULL;
  hvdlResult_t res;
  int size = 0;
  Py_BEGIN_ALLOW_THREADS
    res = hvdl_failed_shrink(base, &out);
    if (res == hvdlSuccess) MPI_Comm_size(out, &size);
  Py_END_ALLOW_THREADS
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL);
  return Py_BuildValue("(Li)", (long long)MPI_Comm_c2f(out), size);
}

/* The AND of every living rank's flag over base (None: MPI_COMM_WORLD), the same on every
 * survivor, or the same failure on every one (ULFM's MPIX_Comm_agree). */
static PyObject *py_mpi_agree(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *fobj;
  int flag = 0;
  if (!PyArg_ParseTuple(args, "Op", &fobj, &flag)) return NULL;
  MPI_Comm base;
  if (hvdl_py_base_comm(fobj, &base)) return NULL;
  hvdlResult_t res;
  Py_BEGIN_ALLOW_THREADS
    res = hvdl_failed_agree(base, &flag);
  Py_END_ALLOW_THREADS
  if (res != hvdlSuccess) return hvdl_py_raise(res, NULL);
  return PyBool_FromLong(flag);
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
  return Py_BuildValue(
      "{s:s,s:s,s:s,s:s,s:i,s:O,s:O}", "mpi_vendor", vendor, "mpi_header", header, "libmpi",
      HVDL_BUILD_LIBMPI, "mpi_libdir", HVDL_BUILD_MPI_LIBDIR, "hvdl_version", HVDL_VERSION_CODE,
      "cuda", hvdl_cuda_built() ? Py_True : Py_False, "ulfm", hvdl_ft_built() ? Py_True : Py_False);
}

/* ---- module -------------------------------------------------------------- */

static PyObject *py_oversubscribed(PyObject *self, PyObject *unused) {
  return PyBool_FromLong(hvdl_oversubscribed());
}

static PyObject *py_cuda_device_count(PyObject *self, PyObject *unused) {
  return PyLong_FromLong(hvdl_cuda_device_count());
}

static PyMethodDef module_methods[] = {
    {"describe_buffer", hvdl_py_describe_buffer, METH_VARARGS,
     "describe_buffer(obj, writable=False) -> dict: the memory obj holds, as the core takes it"},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS,
     "the CUDA devices this process sees (0 without CUDA in the build, a driver or a device)"},
    {"mpi_init", py_mpi_init, METH_NOARGS, "initialise MPI with MPI_THREAD_MULTIPLE if needed"},
    {"mpi_finalize", py_mpi_finalize, METH_NOARGS, "finalize MPI if it is initialised"},
    {"mpi_world_size", py_mpi_world_size, METH_NOARGS, "size of MPI_COMM_WORLD"},
    {"mpi_library_version", py_mpi_library_version, METH_NOARGS, "MPI_Get_library_version"},
    {"mpi_ft", py_mpi_ft, METH_NOARGS,
     "True when the MPI reports dead ranks (ULFM: Open MPI's mpirun --with-ft ulfm)"},
    {"mpi_shrink", py_mpi_shrink, METH_O,
     "mpi_shrink(fhandle or None) -> (fhandle, size): the survivors' communicator (revoke, "
     "shrink)"},
    {"mpi_agree", py_mpi_agree, METH_VARARGS,
     "mpi_agree(fhandle or None, flag) -> bool: every living rank's flag ANDed, alike on every "
     "survivor or failing alike (ULFM)"},
    {"build_info", py_build_info, METH_NOARGS, "the MPI this extension was compiled against"},
    {"oversubscribed", py_oversubscribed, METH_NOARGS,
     "whether a communicator made so far found more ranks on its host than the CPUs they may run on "
     "(the union of their affinity masks); then every wait's spins yield"},
    {"error_string", hvdl_py_error_string, METH_O, "hvdlGetErrorString(code)"},
    {"set_error_factory", hvdl_py_set_error_factory, METH_O, "f(code, message) -> exception"},
    {"mem_free", hvdl_py_mem_free, METH_O,
     "mem_free(address): hvdlMemFree (tests: what it refuses)"},
    {"reduce_local", hvdl_py_reduce_local, METH_VARARGS, "dst = a op b with the C kernels"},
    {"divide_local", hvdl_py_divide_local, METH_VARARGS, "buf /= divisor with Avg's division"},
    {"scale_local", hvdl_py_scale_local, METH_VARARGS, "dst = src * factor with the scale kernels"},
    {"kernel_bench", hvdl_py_kernel_bench, METH_VARARGS,
     "(kernel seconds, memcpy seconds) per call"},
    {"plan_allreduce_model", hvdl_py_plan_allreduce_model, METH_VARARGS,
     "plan_allreduce_model(size, hosts, local_size, nbytes, model[, shm_lanes]) -> "
     "allreduce_plan's dict: the selector on a made-up layout and cost model (tests of its "
     "rules); shm_lanes > 0: a shared segment on every host, the hierarchical all-reduce's "
     "lanes"},
    {"plan_alltoall_model", hvdl_py_plan_alltoall_model, METH_VARARGS,
     "plan_alltoall_model(size, hosts, local_size, block, model) -> Comm.alltoall_plan's dict: "
     "the all-to-all's selector on a made-up layout and cost model (tests of its rules)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "hvd_lite._core",
    "hvd_lite's C core",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
  if (PyType_Ready(&hvdl_py_engine_type) < 0 || PyType_Ready(&hvdl_py_handle_type) < 0 ||
      PyType_Ready(&hvdl_py_comm_type) < 0 || PyType_Ready(&hvdl_py_shared_memory_type) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  Py_INCREF(&hvdl_py_comm_type);
  if (PyModule_AddObject(m, "Comm", (PyObject *)&hvdl_py_comm_type) < 0) {
    Py_DECREF(&hvdl_py_comm_type);
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&hvdl_py_shared_memory_type);
  if (PyModule_AddObject(m, "SharedMemory", (PyObject *)&hvdl_py_shared_memory_type) < 0) {
    Py_DECREF(&hvdl_py_shared_memory_type);
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&hvdl_py_engine_type);
  if (PyModule_AddObject(m, "Engine", (PyObject *)&hvdl_py_engine_type) < 0) {
    Py_DECREF(&hvdl_py_engine_type);
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
      {"hvdlExtTypesBegin", hvdlExtTypesBegin},
      {"hvdlInt16", hvdlInt16},
      {"hvdlUint16", hvdlUint16},
      {"hvdlBool", hvdlBool},
      {"hvdlExtTypesEnd", hvdlExtTypesEnd},
      {"hvdlSum", hvdlSum},
      {"hvdlProd", hvdlProd},
      {"hvdlMax", hvdlMax},
      {"hvdlMin", hvdlMin},
      {"hvdlAvg", hvdlAvg},
      {"hvdlNumOps", hvdlNumOps},
      {"hvdlExtOpsBegin", hvdlExtOpsBegin},
      {"hvdlAdasum", hvdlAdasum},
      {"hvdlExtOpsEnd", hvdlExtOpsEnd},
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
  /* the segment pipeline's limits (transport.h), for tests that cross them */
  PyModule_AddIntConstant(m, "PIPE_SEND_WINDOW", PIPE_SEND_WINDOW);
  PyModule_AddIntConstant(m, "PIPE_MAX_SEGMENTS", PIPE_MAX_SEGMENTS);
  /* the most words a round sends through the host's segment (shm.h), for its test */
  PyModule_AddIntConstant(m, "SHM_ROUND_WORDS", SHM_ROUND_WORDS);
  /* the selector's shared-memory crossover (algorithms.h), for the test that checks it */
  PyModule_AddIntConstant(m, "SHM_ALLREDUCE_MAX", (long)SHM_ALLREDUCE_MAX);
  PyModule_AddIntConstant(m, "SHM_CMA_MIN", (long)SHM_CMA_MIN);
  PyModule_AddIntConstant(m, "SHM_ALLGATHER_MIN", (long)SHM_ALLGATHER_MIN);
  PyModule_AddIntConstant(m, "SHM_REDUCESCATTER_MIN", (long)SHM_REDUCESCATTER_MIN);
  PyModule_AddIntConstant(m, "SHM_BROADCAST_MIN", (long)SHM_BROADCAST_MIN);
  PyModule_AddIntConstant(m, "SHM_BROADCAST_MAX", (long)SHM_BROADCAST_MAX);
  return m;
}
