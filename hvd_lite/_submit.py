"""From a call's arguments to the engine, for every collective: the dtype and op tables, the
argument checks, the names (one call's or a group's), the at_once mark, the request, its
submission (alone, or a group in one engine round, all or nothing) and the Handle that waits for
it.

ops.py (allreduce), collectives.py (the others), state.py and the framework adapters build on
this module; it calls nothing above it.
"""

import contextlib
import enum
import numbers
import sys
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import ml_dtypes
import numpy as np

from . import basics
from ._submission import Submission
from .exceptions import UnsupportedDtypeError

_core = basics._core


class ReduceOp(enum.IntEnum):
    """Reduction ops, with Horovod's numbers."""

    Average = 0
    """The sum divided by the number of ranks."""
    Sum = 1
    """The elementwise sum."""
    Adasum = 2
    """Adaptive summation of floating-point vectors (docs/adasum.md)."""
    Min = 3
    """The elementwise minimum."""
    Max = 4
    """The elementwise maximum."""
    Product = 5
    """The elementwise product."""


Average = ReduceOp.Average
"""ReduceOp.Average: the sum divided by the number of ranks."""
Sum = ReduceOp.Sum
"""ReduceOp.Sum: the elementwise sum."""
Adasum = ReduceOp.Adasum
"""ReduceOp.Adasum: adaptive summation of floating-point vectors (docs/adasum.md)."""
Min = ReduceOp.Min
"""ReduceOp.Min: the elementwise minimum."""
Max = ReduceOp.Max
"""ReduceOp.Max: the elementwise maximum."""
Product = ReduceOp.Product
"""ReduceOp.Product: the elementwise product."""

HVDL_OPS: Dict[int, int] = {  # ReduceOp -> hvdlRedOp_t
    ReduceOp.Average: _core.hvdlAvg,
    ReduceOp.Sum: _core.hvdlSum,
    ReduceOp.Min: _core.hvdlMin,
    ReduceOp.Max: _core.hvdlMax,
    ReduceOp.Product: _core.hvdlProd,
    ReduceOp.Adasum: _core.hvdlAdasum,
}
"""The C API's op (hvdlRedOp_t) for each ReduceOp."""

# The dtypes Adasum takes (csrc/hvdl.h): the floating-point ones.
ADASUM_DTYPES = ("float16", "bfloat16", "float32", "float64")

# NCCL's types, then hvd_lite's own (int16, uint16, bool: csrc/hvdl.h numbers them from 32).
HVDL_DTYPES = {
    np.dtype(np.int8): _core.hvdlInt8,
    np.dtype(np.uint8): _core.hvdlUint8,
    np.dtype(np.int32): _core.hvdlInt32,
    np.dtype(np.uint32): _core.hvdlUint32,
    np.dtype(np.int64): _core.hvdlInt64,
    np.dtype(np.uint64): _core.hvdlUint64,
    np.dtype(np.float16): _core.hvdlFloat16,
    np.dtype(np.float32): _core.hvdlFloat32,
    np.dtype(np.float64): _core.hvdlFloat64,
    np.dtype(ml_dtypes.bfloat16): _core.hvdlBfloat16,
    np.dtype(np.int16): _core.hvdlInt16,
    np.dtype(np.uint16): _core.hvdlUint16,
    np.dtype(np.bool_): _core.hvdlBool,
}
"""The C API's type (hvdlDataType_t) for each numpy dtype the engine moves."""

# The longest name the engine takes, in UTF-8 bytes: csrc/request/request.h's HVDL_MAX_NAME less its NUL.
MAX_NAME_BYTES = 511
# The most dimensions an array may have: csrc/request/request.h's HVDL_MAX_DIMS.
MAX_DIMS = 16


# ---------------------------------------------------------------------------- argument checks


def hvdl_dtype(dtype) -> int:
    """The hvdlDataType_t of a numpy dtype; UnsupportedDtypeError (a TypeError) if it has none."""
    dt = np.dtype(dtype)
    code = HVDL_DTYPES.get(dt)
    if code is None:
        names = ", ".join(str(d) for d in HVDL_DTYPES)
        raise UnsupportedDtypeError(f"unsupported dtype {dt} (supported: {names})")
    return code


def is_device_array(obj) -> bool:
    """True for a CuPy array: CUDA memory, which allreduce and broadcast take (in a build with
    CUDA: the C core refuses it otherwise, saying so)."""
    return type(obj).__module__.partition(".")[0] == "cupy"


class DeviceBuffer:
    """A CuPy array as the engine reads it: its CUDA array interface as of now (naming the current
    stream, which the engine's copies and kernels queue on) and that stream object, both held with
    the array while the engine may use them (CuPy destroys a stream whose object is dropped, and
    the engine's work may still be pending on it)."""

    __slots__ = ("__cuda_array_interface__", "array", "stream")

    def __init__(self, array):
        cupy = sys.modules.get("cupy")  # loaded: the array is CuPy's
        self.array = array
        self.stream = cupy.cuda.get_current_stream() if cupy is not None else None
        self.__cuda_array_interface__ = array.__cuda_array_interface__


def engine_buffer(array):
    """What the engine is given for `array`: itself, or a CuPy array's DeviceBuffer."""
    return array if type(array) is np.ndarray or not is_device_array(array) else DeviceBuffer(array)


def empty_like(array):
    """A new C-contiguous array like `array`: numpy's, or CuPy's on the array's own device."""
    if type(array) is np.ndarray or not is_device_array(array):
        return np.empty_like(array, order="C")
    import cupy  # the array is CuPy's: it is installed

    with array.device:
        return cupy.empty_like(array, order="C")


def _not_an_array(fn: str, obj, device_ok: bool) -> TypeError:
    """What the engine says of an object that is no numpy array: its full type name (CuPy's is
    also 'ndarray'), and for device memory (the CUDA array interface) where to take it instead."""
    t = type(obj)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    where = ""
    try:  # the interface is a property that may raise (torch's, on a tensor that requires grad)
        on_device = hasattr(obj, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 - then where its memory is stays unsaid
        on_device = False
    if on_device and device_ok:
        where = (
            ": its memory is on a CUDA device, and of device arrays this call takes CuPy's "
            "only; copy it into one (cupy.asarray) or to the host first. hvd_lite.torch "
            "moves CUDA tensors itself"
        )
    elif on_device:
        where = (
            ": its memory is on a CUDA device, and this call takes host memory (of the "
            "numpy API's calls, allreduce and broadcast take CuPy arrays); copy it to the "
            "host first (for CuPy: cupy.asnumpy). hvd_lite.torch moves CUDA tensors itself"
        )
    return TypeError(
        f"{fn} expects a numpy.ndarray{' or a cupy.ndarray' if device_ok else ''}, got {name}{where}"
    )


def check_array(fn: str, array, inplace: bool, device_ok: bool = False) -> int:
    """The array's hvdl dtype code; TypeError or ValueError if the engine cannot take it.
    device_ok: a CuPy array is taken too (allreduce, broadcast)."""
    if not isinstance(array, np.ndarray) and not (device_ok and is_device_array(array)):
        raise _not_an_array(fn, array, device_ok)
    code = HVDL_DTYPES.get(np.dtype(array.dtype))
    if code is None:
        try:
            code = hvdl_dtype(array.dtype)  # raises: the message lists the dtypes
        except TypeError as exc:
            raise TypeError(f"{fn}: {exc}") from None
    if array.ndim > MAX_DIMS:
        raise ValueError(
            f"{fn}: arrays of more than {MAX_DIMS} dimensions are not supported "
            f"(got {array.ndim}); reshape it"
        )
    flags = array.flags
    if not flags.c_contiguous:
        raise ValueError(
            f"{fn}: the array is not C-contiguous (shape {list(array.shape)}, strides "
            f"{list(array.strides)}); pass a C-contiguous copy "
            "(numpy.ascontiguousarray or cupy.ascontiguousarray)"
        )
    if inplace and not getattr(flags, "writeable", True):  # CuPy's arrays are always writable
        raise ValueError(
            f"{fn}: the array is read-only and cannot be reduced in place; "
            "use the out-of-place call or pass a writable copy"
        )
    return code


def check_reducible(fn: str, array: np.ndarray) -> None:
    """TypeError for an array no reduction op applies to (bool)."""
    if array.dtype.kind == "b":
        raise TypeError(
            f"{fn}: bool arrays cannot be reduced (bool takes allgather, broadcast "
            "and alltoall only, as in Horovod); cast to an integer type to reduce"
        )


def check_op(fn: str, op, adasum: bool = True) -> int:
    """The hvdl op code of a ReduceOp; ValueError for anything else, and for Adasum where the
    collective does not take it (`adasum` False: Adasum combines whole vectors, so only an
    allreduce has it)."""
    code = HVDL_OPS.get(op) if isinstance(op, int) else None
    if code is None:
        raise ValueError(f"{fn}: op {op!r} is not one of Sum, Average, Adasum, Min, Max, Product")
    if code == _core.hvdlAdasum and not adasum:
        raise ValueError(
            f"{fn}: op=Adasum applies to allreduce only (it combines the ranks' whole vectors); "
            "use Sum or Average here"
        )
    return code


def check_adasum(fn: str, dtype_name: str, on_device: bool) -> None:
    """TypeError for an Adasum allreduce of data that is not floating point, ValueError for one of
    device memory (Adasum has no device form yet)."""
    if dtype_name not in ADASUM_DTYPES:
        raise TypeError(
            f"{fn}: op=Adasum takes float16, bfloat16, float32 or float64 data, got {dtype_name} "
            "(its dot products and norms are defined on real vectors); cast to a float type"
        )
    if on_device:
        raise ValueError(
            f"{fn}: op=Adasum takes host memory only (it has no device form yet); copy the "
            "tensor to the CPU first"
        )


def check_scale(fn: str, label: str, factor) -> float:
    """A scale factor as a float (integer arrays are scaled in float64 and truncated toward
    zero, as Horovod does: csrc/kernels/kernels.h)."""
    if factor == 1.0 and type(factor) in (float, int):  # the common case, quickly
        return 1.0
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
        raise TypeError(f"{fn}: {label} must be a real number, got {type(factor).__name__}")
    return float(factor)


# ---------------------------------------------------------------------------- names


def check_name(fn: str, name) -> str:
    """`name` if the engine can take it: a str without NUL, at most MAX_NAME_BYTES in UTF-8."""
    if not isinstance(name, str):
        raise TypeError(f"{fn}: name must be a str or None, got {type(name).__name__}")
    if "\0" in name:
        raise ValueError(f"{fn}: name {name!r} contains a NUL character; names are C strings")
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{fn}: name is {size} bytes long; the limit is {MAX_NAME_BYTES}")
    return name


def name_of(fn: str, kind: str, name: Optional[str], where=None) -> str:
    """`name` once checked, or the next automatic name of this kind in the process set `where`
    (basics.set_for; None: the global set) when it is None."""
    return basics.auto_name(kind, where) if name is None else check_name(fn, name)


def name_or_auto(fn: str, kind: str, name: Optional[str]) -> tuple:
    """(name, auto) for a request: `name` once checked and None, or, when it is None, the kind
    twice: the request is then named automatically when it is handed to the engine (submit:
    the set's next counter name; run_now: its synchronous name)."""
    return (kind, kind) if name is None else (check_name(fn, name), None)


def group_names(
    fn: str, kind: str, items, name: Optional[str], of: str = "numpy arrays", where=None
) -> List[str]:
    """The names of a grouped call's entries: `<name>.<i>`, or an automatic base name of this
    kind (in the process set `where`); TypeError unless `items` is a list or tuple (of `of`)."""
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{fn} expects a list of {of}, got {type(items).__name__}")
    if name is not None and items:
        check_name(fn, name)
        check_name(fn, f"{name}.{len(items) - 1}")  # the longest
    base = name_of(fn, kind, name, where)
    return [f"{base}.{i}" for i in range(len(items))]


# ---------------------------------------------------------------------------- at once, held


class _ThisThread(threading.local):
    at_once = False  # this thread's submissions are waited on at once (see at_once())


_this_thread = _ThisThread()


def at_once(fn, *args):
    """fn(*args), its submissions marked as waited on at once (the synchronous calls): the engine
    negotiates them without letting more submissions gather first (HVD_LITE_BATCH_TIME)."""
    _this_thread.at_once = True
    try:
        return fn(*args)
    finally:
        _this_thread.at_once = False


@contextlib.contextmanager
def held(engine):
    """Submissions inside enter the engine's same round (so a group can be fused)."""
    engine.hold(True)
    try:
        yield
    finally:
        engine.hold(False)


# ---------------------------------------------------------------------------- requests, handles


class Handle:
    """A collective in flight: pass it to poll() or synchronize()."""

    __slots__ = ("_c", "output", "name", "_finish")

    def __init__(self, c_handle, output, name: Optional[str], finish=None):
        self._c = c_handle
        self.output = output
        """The result, as synchronize() returns it (where it is built once done, set by synchronize())."""
        self.name = name
        """The collective's name, as negotiated with the other ranks."""
        self._finish = finish  # builds the output from the engine's buffer, once done

    def __repr__(self) -> str:
        state = "done" if self._c.poll() else "pending"
        return f"<hvd_lite.Handle {self.name!r} {state}>"


class Request(NamedTuple):
    """One collective, checked and named: what the engine is given, and what its Handle returns."""

    submission: Submission
    output: Any = None  # the Handle's output until it is finished
    finish: Optional[Callable] = None  # C handle -> output, once done
    where: Any = None  # the process set it runs in (basics.set_for); None: the global set
    auto: Optional[str] = None  # its kind if it is named automatically (name_or_auto); the
    # submission's name is a stand-in until then

    @property
    def name(self) -> Optional[str]:
        return self.submission.name


def _named(r: Request) -> Submission:
    """r's submission (a request is submitted once: it is completed in place), named: for an
    automatic name, the set's next one."""
    s = r.submission
    if r.auto is not None:
        s.name = basics.auto_name(r.auto, r.where)
    return _armed(s)


def _armed(s: Submission) -> Submission:
    """s, with the error an armed adapter fault gives it (a testing aid: basics.inject_fault)."""
    if basics._state.adapter_faults and not s.error:
        s.error = basics.adapter_fault()
    return s


def _engine_of(where):
    """The engine of a process set (basics.set_for's); None: the global set's."""
    return where.engine if where is not None and where.id else basics._engine()


def submit(request: Request) -> Handle:
    """Hands a checked request to its process set's engine."""
    return start(request.where, request.auto, _armed(request.submission), request.output, request.finish)


def start(where, kind: Optional[str], s: Submission, output, finish=None) -> Handle:
    """An asynchronous call's engine part: `s` (complete, armed) submitted to the engine of
    `where` (basics.set_for's set; None: the global set); its Handle returned, with `output` and
    `finish` (see Request). `kind` not None: the call is named automatically, the set's next
    counter name of that kind, put in s."""
    if kind is not None:
        s.name = basics.auto_name(kind, where)
    c = _engine_of(where).submit(*s, _this_thread.at_once)
    return Handle(c, output, s.name, finish)


def submit_group(requests: Sequence[Request]) -> List[Handle]:
    """Hands checked requests to the engine together, in one round (so they can be fused): all
    of them, or none if the engine refuses one (a name in flight, the engine shut down). They
    run in the first one's process set (the callers build them all for the same set)."""
    subs = [_named(r) for r in requests]
    cs = _engine_of(requests[0].where if requests else None).submit_group(
        [s.entry() for s in subs], _this_thread.at_once
    )
    return [Handle(c, r.output, s.name, r.finish) for c, r, s in zip(cs, requests, subs)]


def run(where, kind: Optional[str], s: Submission):
    """A synchronous call's engine part: `s` (complete) submitted as waited on at once (see
    at_once()) to the engine of `where` (basics.set_for's set; None: the global set), waited for
    (GIL released); its C handle returned, or its error raised. `kind` not None (and `where` then
    a set): the call is named automatically and runs under the set's synchronous name for its
    kind (basics._Set.sync_name), put in s."""
    if kind is not None:
        s.name = where.sync_name(kind)
    c = done = None
    try:
        c = _engine_of(where).submit(*s, True)
        c.wait()
        done = True
    finally:
        if kind is not None:  # given back, with the call if it was given up on in flight
            where.release_sync_name(kind, None if done or c is None or c.poll() else c)
    return c


def run_now(request: Request):
    """A synchronous call: run() of `request`, its output returned or its error raised.
    submit() + synchronize() without a Handle in between: the Python part of a small call is most
    of its cost (docs/benchmarks.md). Named automatically, it runs under its set's synchronous
    name, where submit() takes the set's next counter name."""
    c = run(request.where, request.auto, _armed(request.submission))
    return request.output if request.finish is None else request.finish(c)


def poll(handle: Handle) -> bool:
    """True once the collective behind `handle` has completed (successfully or not)."""
    return handle._c.poll()


def wait_for(handle: Handle, seconds: float) -> bool:
    """Waits at most `seconds` for `handle` (GIL released; a signal interrupts it); True once
    its collective has completed (successfully or not: synchronize() says which)."""
    return handle._c.wait_for(seconds)


def synchronize(handle: Handle):
    """Waits for `handle` (GIL released) and returns its output, or raises its error."""
    handle._c.wait()
    if handle._finish is not None:
        handle.output, handle._finish = handle._finish(handle._c), None
    return handle.output
