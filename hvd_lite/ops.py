"""Collectives on numpy arrays."""
import enum
import numbers
from typing import Optional

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


def _supported_names() -> str:
    return ", ".join(str(d) for d in HVDL_DTYPES)


def hvdl_dtype(dtype) -> int:
    """The hvdlDataType_t of a numpy dtype; TypeError if it has none."""
    dt = np.dtype(dtype)
    code = HVDL_DTYPES.get(dt.newbyteorder("=") if dt.byteorder == "=" else dt)
    if code is None:
        raise TypeError(f"unsupported dtype {dt} (supported: {_supported_names()})")
    return code


def _check_array(fn: str, array, inplace: bool) -> int:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{fn} expects a numpy.ndarray, got {type(array).__name__}")
    try:
        code = hvdl_dtype(array.dtype)
    except TypeError as exc:
        raise TypeError(f"{fn}: {exc}") from None
    if not array.flags.c_contiguous:
        raise ValueError(f"{fn}: the array is not C-contiguous (shape {list(array.shape)}, strides "
                         f"{list(array.strides)}); pass numpy.ascontiguousarray(array)")
    if inplace and not array.flags.writeable:
        raise ValueError(f"{fn}: the array is read-only and cannot be reduced in place; "
                         "use the out-of-place call or pass a writable copy")
    return code


def _check_op(fn: str, op) -> int:
    try:
        return _HVDL_OPS[ReduceOp(op)]
    except (ValueError, TypeError):
        raise ValueError(f"{fn}: op {op!r} is not one of Sum, Average, Min, Max, Product") from None


def _check_scale(fn: str, label: str, factor) -> float:
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
        raise TypeError(f"{fn}: {label} must be a real number, got {type(factor).__name__}")
    return float(factor)


def _check_name(fn: str, name) -> None:
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{fn}: name must be a str or None, got {type(name).__name__}")


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


def _scale(array: np.ndarray, factor: float, out: np.ndarray) -> None:
    np.multiply(array, factor, out=out, casting="unsafe")


def _allreduce_into(fn, array, out, op, prescale_factor, postscale_factor, name, inplace):
    comm = basics._comm()
    code = _check_array(fn, array, inplace)
    hop = _check_op(fn, op)
    pre = _check_scale(fn, "prescale_factor", prescale_factor)
    post = _check_scale(fn, "postscale_factor", postscale_factor)
    _check_name(fn, name)
    if out is None:
        out = np.empty_like(array, order="C")
    send = array
    if pre != 1.0:
        _scale(array, pre, out)
        send = out
    comm.allreduce(_bytes(send), _bytes(out), code, hop)
    if post != 1.0:
        _scale(out, post, out)
    return out


def allreduce(array: np.ndarray, op: ReduceOp = Average, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None) -> np.ndarray:
    """Reduces `array` across ranks into a new array (Average: sum, then / size)."""
    return _allreduce_into("allreduce", array, None, op, prescale_factor, postscale_factor, name,
                           inplace=False)


def allreduce_(array: np.ndarray, op: ReduceOp = Average, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, name: Optional[str] = None) -> np.ndarray:
    """Reduces `array` across ranks in place and returns it."""
    return _allreduce_into("allreduce_", array, array, op, prescale_factor, postscale_factor, name,
                           inplace=True)
