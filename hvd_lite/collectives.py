"""The collectives besides allreduce, on numpy arrays, through the engine: allgather, broadcast,
alltoall, reducescatter, barrier, join, and their async and grouped variants."""
from typing import List, Optional, Sequence

import numpy as np

from . import basics
from .ops import (Average, Handle, ReduceOp, _check_array, _check_op, _check_scale, _name, _urgency,
                  at_once, held, synchronize)

_core = basics._core


def _submit(coll, send, recv, code, name, shape, op=0, pre=1.0, post=1.0, root=0, splits=None,
            error=""):
    return basics._engine().submit(coll, send, recv, code, op, pre, post, name, tuple(shape), root,
                                   splits, error, _urgency.now)


def _gathered(dtype, rest):
    """Builds an engine-allocated output: rows x rest."""
    def finish(c):
        rows = c.out_rows()
        if rows == 0:
            return np.empty((0,) + rest, dtype)
        return np.frombuffer(c, dtype=dtype).reshape((rows,) + rest)
    return finish


def allgather_async(array: np.ndarray, name: Optional[str] = None) -> Handle:
    """Starts concatenating every rank's array along dim 0 (dim 0 may differ per rank)."""
    code = _check_array("allgather", array, False)
    name = _name("allgather", "allgather", name)
    error = "" if array.ndim else "allgather needs an array with at least one dimension, got a 0-d array"
    shape = array.shape if array.ndim else (1,)
    c = _submit(_core.COLL_ALLGATHER, array, None, code, name, shape, error=error)
    return Handle(c, None, name, _gathered(array.dtype, tuple(shape[1:])))


def allgather(array: np.ndarray, name: Optional[str] = None) -> np.ndarray:
    """Concatenates every rank's array along dim 0, in rank order."""
    return synchronize(at_once(allgather_async, array, name))


def _check_root(fn: str, root_rank) -> int:
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)):
        raise TypeError(f"{fn}: root_rank must be an int, got {type(root_rank).__name__}")
    return int(root_rank)


def broadcast_async(array: np.ndarray, root_rank: int, name: Optional[str] = None) -> Handle:
    """Starts copying root_rank's array to every rank, into a new array."""
    code = _check_array("broadcast", array, False)
    root = _check_root("broadcast", root_rank)
    name = _name("broadcast", "broadcast", name)
    out = np.empty_like(array, order="C")
    c = _submit(_core.COLL_BROADCAST, array, out, code, name, array.shape, root=root)
    return Handle(c, out, name)


def broadcast_async_(array: np.ndarray, root_rank: int, name: Optional[str] = None) -> Handle:
    """Starts copying root_rank's array into `array` on every rank."""
    code = _check_array("broadcast_", array, True)
    root = _check_root("broadcast_", root_rank)
    name = _name("broadcast_", "broadcast", name)
    c = _submit(_core.COLL_BROADCAST, array, array, code, name, array.shape, root=root)
    return Handle(c, array, name)


def broadcast(array: np.ndarray, root_rank: int, name: Optional[str] = None) -> np.ndarray:
    """root_rank's array, on every rank (a new array)."""
    return synchronize(at_once(broadcast_async, array, root_rank, name))


def broadcast_(array: np.ndarray, root_rank: int, name: Optional[str] = None) -> np.ndarray:
    """Overwrites `array` with root_rank's on every rank; returns it."""
    return synchronize(at_once(broadcast_async_, array, root_rank, name))


def _split_error(splits, rows: int, n: int) -> str:
    if len(splits) != n:
        return f"alltoall splits {list(splits)} has {len(splits)} entries; it needs one per rank ({n})"
    if any(s < 0 for s in splits):
        return f"alltoall splits {list(splits)} contain a negative count"
    if sum(splits) != rows:
        return f"alltoall splits {list(splits)} sum to {sum(splits)}, but dim 0 of the array is {rows}"
    return ""


def alltoall_async(array: np.ndarray, splits=None, name: Optional[str] = None) -> Handle:
    """Starts sending rows splits[i] of `array` to rank i (evenly without splits)."""
    code = _check_array("alltoall", array, False)
    name = _name("alltoall", "alltoall", name)
    n = basics.size()
    rows = array.shape[0] if array.ndim else 0
    error = "" if array.ndim else "alltoall needs an array with at least one dimension, got a 0-d array"
    given = splits is not None
    if given:
        try:
            split_list = [int(s) for s in np.asarray(splits).reshape(-1)]
        except (TypeError, ValueError):
            raise TypeError(f"alltoall: splits must be a sequence of ints, got {splits!r}") from None
        error = error or _split_error(split_list, rows, n)
    else:
        split_list = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    if error:
        split_list = [0] * n
    shape = array.shape if array.ndim else (1,)
    c = _submit(_core.COLL_ALLTOALL, array, None, code, name, shape, splits=split_list, error=error)
    gathered = _gathered(array.dtype, tuple(shape[1:]))

    def finish(handle_c):
        out = gathered(handle_c)
        return (out, np.array(handle_c.recv_splits(), dtype=np.int64)) if given else out
    return Handle(c, None, name, finish)


def alltoall(array: np.ndarray, splits=None, name: Optional[str] = None):
    """Rows splits[i] of `array` go to rank i; returns the rows received in rank order, and with
    `splits` given also the rows received from each rank."""
    return synchronize(at_once(alltoall_async, array, splits, name))


def reducescatter_async(array: np.ndarray, op: ReduceOp = Average, name: Optional[str] = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Starts reducing `array` across ranks; rank r keeps its block of dim 0."""
    code = _check_array("reducescatter", array, False)
    hop = _check_op("reducescatter", op)
    pre = _check_scale("reducescatter", "prescale_factor", prescale_factor, array)
    post = _check_scale("reducescatter", "postscale_factor", postscale_factor, array)
    name = _name("reducescatter", "reducescatter", name)
    n, r = basics.size(), basics.rank()
    error = "" if array.ndim else "reducescatter needs an array with at least one dimension, got a 0-d array"
    shape = array.shape if array.ndim else (1,)
    rows = shape[0] // n + (1 if r < shape[0] % n else 0)
    out = np.empty((rows,) + tuple(shape[1:]), array.dtype)
    send = array if array.ndim else array.reshape(1)
    c = _submit(_core.COLL_REDUCESCATTER, send, out, code, name, shape, op=hop, pre=pre, post=post,
                error=error)
    return Handle(c, out, name)


def reducescatter(array: np.ndarray, op: ReduceOp = Average, name: Optional[str] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    """Reduces `array` across ranks; rank r gets its block of dim 0 (as even as possible, the
    first ranks taking the extra rows)."""
    return synchronize(at_once(reducescatter_async, array, op, name, prescale_factor,
                               postscale_factor))


def _names(fn: str, kind: str, arrays, name) -> List[str]:
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{fn} expects a list of numpy arrays, got {type(arrays).__name__}")
    base = _name(fn, kind, name)
    return [f"{base}.{i}" for i in range(len(arrays))]


def grouped_allgather_async(arrays: Sequence[np.ndarray], name: Optional[str] = None) -> List[Handle]:
    """allgather_async of each array, submitted together."""
    names = _names("grouped_allgather", "grouped_allgather", arrays, name)
    for a in arrays:
        _check_array("grouped_allgather", a, False)
    with held(basics._engine()):
        return [allgather_async(a, n) for a, n in zip(arrays, names)]


def grouped_allgather(arrays: Sequence[np.ndarray], name: Optional[str] = None) -> List[np.ndarray]:
    """allgather of each array."""
    return [synchronize(h) for h in at_once(grouped_allgather_async, arrays, name)]


def grouped_reducescatter_async(arrays: Sequence[np.ndarray], op: ReduceOp = Average,
                                name: Optional[str] = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> List[Handle]:
    """reducescatter_async of each array, submitted together."""
    names = _names("grouped_reducescatter", "grouped_reducescatter", arrays, name)
    for a in arrays:
        _check_array("grouped_reducescatter", a, False)
    with held(basics._engine()):
        return [reducescatter_async(a, op, n, prescale_factor, postscale_factor)
                for a, n in zip(arrays, names)]


def grouped_reducescatter(arrays: Sequence[np.ndarray], op: ReduceOp = Average,
                          name: Optional[str] = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[np.ndarray]:
    """reducescatter of each array."""
    return [synchronize(h) for h in at_once(grouped_reducescatter_async, arrays, op, name,
                                            prescale_factor, postscale_factor)]


def barrier() -> None:
    """Returns once every rank has called barrier()."""
    c = at_once(_submit, _core.COLL_BARRIER, None, None, _core.hvdlUint8,
                basics.auto_name("barrier"), ())
    synchronize(Handle(c, None, "barrier"))


def join() -> int:
    """This rank has no more data: until every rank has joined, it takes part in the others'
    allreduces with zeros (Average still divides by size()). Returns the last rank to join."""
    c = at_once(_submit, _core.COLL_JOIN, None, None, _core.hvdlUint8, "join", ())
    synchronize(Handle(c, None, "join"))
    return c.value()
