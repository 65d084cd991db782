"""Collectives on numpy arrays, submitted to the engine; the synchronous calls are submit + wait."""
import contextlib
import enum
import numbers
import threading
from typing import List, Optional, Sequence

import ml_dtypes
import numpy as np

from . import basics

_core = basics._core


class ReduceOp(enum.IntEnum):
    """Reduction ops, with Horovod's numbers."""

    Average = 0
    Sum = 1
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max,
                                   ReduceOp.Product)

_HVDL_OPS = {
    ReduceOp.Average: _core.hvdlAvg,
    ReduceOp.Sum: _core.hvdlSum,
    ReduceOp.Min: _core.hvdlMin,
    ReduceOp.Max: _core.hvdlMax,
    ReduceOp.Product: _core.hvdlProd,
}

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
}

def hvdl_dtype(dtype) -> int:
    """The hvdlDataType_t of a numpy dtype; TypeError if it has none."""
    dt = np.dtype(dtype)
    code = HVDL_DTYPES.get(dt)
    if code is None:
        names = ", ".join(str(d) for d in HVDL_DTYPES)
        raise TypeError(f"unsupported dtype {dt} (supported: {names})")
    return code


def _check_array(fn: str, array, inplace: bool) -> int:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{fn} expects a numpy.ndarray, got {type(array).__name__}")
    code = HVDL_DTYPES.get(array.dtype)
    if code is None:
        try:
            hvdl_dtype(array.dtype)
        except TypeError as exc:
            raise TypeError(f"{fn}: {exc}") from None
    flags = array.flags
    if not flags.c_contiguous:
        raise ValueError(f"{fn}: the array is not C-contiguous (shape {list(array.shape)}, strides "
                         f"{list(array.strides)}); pass numpy.ascontiguousarray(array)")
    if inplace and not flags.writeable:
        raise ValueError(f"{fn}: the array is read-only and cannot be reduced in place; "
                         "use the out-of-place call or pass a writable copy")
    return code


def _check_op(fn: str, op) -> int:
    code = _HVDL_OPS.get(op) if isinstance(op, int) else None
    if code is None:
        raise ValueError(f"{fn}: op {op!r} is not one of Sum, Average, Min, Max, Product")
    return code


def _check_scale(fn: str, label: str, factor, array: np.ndarray) -> float:
    if factor == 1.0 and type(factor) in (float, int):  # the common case, quickly
        return 1.0
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
        raise TypeError(f"{fn}: {label} must be a real number, got {type(factor).__name__}")
    factor = float(factor)
    if factor != 1.0 and array.dtype.kind in "iu":
        raise ValueError(f"{fn}: {label}={factor:g} applies to floating-point arrays only, "
                         f"not {array.dtype}")
    return factor


def _name(fn: str, kind: str, name) -> str:
    if name is None:
        return basics.auto_name(kind)
    if not isinstance(name, str):
        raise TypeError(f"{fn}: name must be a str or None, got {type(name).__name__}")
    return name


class _Urgency(threading.local):
    now = False


_urgency = _Urgency()


def at_once(fn, *args):
    """fn(*args), its submissions marked as waited on at once (the synchronous calls): the engine
    negotiates them without letting more submissions gather first (HVD_LITE_BATCH_TIME)."""
    _urgency.now = True
    try:
        return fn(*args)
    finally:
        _urgency.now = False


class Handle:
    """A collective in flight: pass it to poll() or synchronize()."""

    __slots__ = ("_c", "output", "name", "_finish")

    def __init__(self, c_handle, output, name: str, finish=None):
        self._c = c_handle
        self.output = output
        self.name = name
        self._finish = finish  # builds the output from the engine's buffer, once done

    def __repr__(self) -> str:
        state = "done" if self._c.poll() else "pending"
        return f"<hvd_lite.Handle {self.name!r} {state}>"


def _submit_allreduce(fn, array, out, op, prescale_factor, postscale_factor, name) -> Handle:
    engine = basics._engine()
    inplace = out is array
    code = _check_array(fn, array, inplace)
    hop = _check_op(fn, op)
    pre = _check_scale(fn, "prescale_factor", prescale_factor, array)
    post = _check_scale(fn, "postscale_factor", postscale_factor, array)
    name = _name(fn, "allreduce", name)
    if out is None:
        out = np.empty_like(array, order="C")
    # The C core takes the arrays' memory through the buffer protocol without a
    # format, which works for every dtype here, bfloat16 included.
    c = engine.submit(_core.COLL_ALLREDUCE, array, out, code, hop, pre, post, name, array.shape, 0,
                      None, "", _urgency.now)
    return Handle(c, out, name)


def allreduce_async(array: np.ndarray, op: ReduceOp = Average, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, name: Optional[str] = None) -> Handle:
    """Starts reducing `array` across ranks into a new array; returns a handle."""
    return _submit_allreduce("allreduce_async", array, None, op, prescale_factor, postscale_factor,
                             name)


def allreduce_async_(array: np.ndarray, op: ReduceOp = Average, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, name: Optional[str] = None) -> Handle:
    """Starts reducing `array` across ranks in place; returns a handle."""
    return _submit_allreduce("allreduce_async_", array, array, op, prescale_factor,
                             postscale_factor, name)


def poll(handle: Handle) -> bool:
    """True once the collective behind `handle` has completed (successfully or not)."""
    return handle._c.poll()


def synchronize(handle: Handle):
    """Waits for `handle` (GIL released) and returns its output, or raises its error."""
    handle._c.wait()
    if handle._finish is not None:
        handle.output, handle._finish = handle._finish(handle._c), None
    return handle.output


def allreduce(array: np.ndarray, op: ReduceOp = Average, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None) -> np.ndarray:
    """Reduces `array` across ranks into a new array (Average: sum, then / size)."""
    return synchronize(at_once(_submit_allreduce, "allreduce", array, None, op, prescale_factor,
                               postscale_factor, name))


def allreduce_(array: np.ndarray, op: ReduceOp = Average, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, name: Optional[str] = None) -> np.ndarray:
    """Reduces `array` across ranks in place and returns it."""
    return synchronize(at_once(_submit_allreduce, "allreduce_", array, array, op, prescale_factor,
                               postscale_factor, name))


@contextlib.contextmanager
def held(engine):
    """Submissions inside enter the engine's same round (so a group can be fused)."""
    engine.hold(True)
    try:
        yield
    finally:
        engine.hold(False)


def _group_names(fn: str, arrays, name) -> List[str]:
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{fn} expects a list of numpy arrays, got {type(arrays).__name__}")
    if name is None:
        base = basics.auto_name("grouped_allreduce")
    elif isinstance(name, str):
        base = name
    else:
        raise TypeError(f"{fn}: name must be a str or None, got {type(name).__name__}")
    return [f"{base}.{i}" for i in range(len(arrays))]


def _grouped(fn, arrays, inplace, op, prescale_factor, postscale_factor, name) -> List[Handle]:
    names = _group_names(fn, arrays, name)
    # check every array before submitting any, so that a bad one sends nothing
    for a in arrays:
        _check_array(fn, a, inplace)
    with held(basics._engine()):
        return [_submit_allreduce(fn, a, a if inplace else None, op, prescale_factor,
                                  postscale_factor, n) for a, n in zip(arrays, names)]


def grouped_allreduce_async(arrays: Sequence[np.ndarray], op: ReduceOp = Average,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            name: Optional[str] = None) -> List[Handle]:
    """Starts reducing a list of arrays, submitted together so they can be fused; one handle each."""
    return _grouped("grouped_allreduce_async", arrays, False, op, prescale_factor, postscale_factor,
                    name)


def grouped_allreduce_async_(arrays: Sequence[np.ndarray], op: ReduceOp = Average,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             name: Optional[str] = None) -> List[Handle]:
    """In-place grouped_allreduce_async."""
    return _grouped("grouped_allreduce_async_", arrays, True, op, prescale_factor, postscale_factor,
                    name)


def grouped_allreduce(arrays: Sequence[np.ndarray], op: ReduceOp = Average,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: Optional[str] = None) -> List[np.ndarray]:
    """Reduces a list of arrays into new arrays."""
    handles = at_once(grouped_allreduce_async, arrays, op, prescale_factor, postscale_factor, name)
    return [synchronize(h) for h in handles]


def grouped_allreduce_(arrays: Sequence[np.ndarray], op: ReduceOp = Average,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       name: Optional[str] = None) -> List[np.ndarray]:
    """Reduces a list of arrays in place and returns them."""
    handles = at_once(grouped_allreduce_async_, arrays, op, prescale_factor, postscale_factor,
                      name)
    return [synchronize(h) for h in handles]
