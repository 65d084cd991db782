"""The collectives besides allreduce, on numpy arrays, through the engine: allgather, broadcast,
alltoall, reducescatter, barrier, join, and their async and grouped variants."""

from typing import List, Optional, Sequence

import numpy as np

from . import basics
from ._submission import Submission
from ._submit import (
    Average,
    Handle,
    ReduceOp,
    Request,
    at_once,
    check_array,
    check_op,
    check_reducible,
    check_scale,
    empty_like,
    engine_buffer,
    group_names,
    name_of,
    name_or_auto,
    run_now,
    submit,
    submit_group,
    synchronize,
)
from .process_sets import ProcessSet, global_process_set

_core = basics._core


def _gathered(dtype, rest):
    """Builds an engine-allocated output: rows x rest."""

    def finish(c):
        rows = c.out_rows()
        if rows == 0:
            return np.empty((0,) + rest, dtype)
        return np.frombuffer(c, dtype=dtype).reshape((rows,) + rest)

    return finish


def allgather_request(fn: str, array, name, process_set=None) -> Request:
    """An allgather of `array` in `process_set` (None: the global set), checked."""
    where = basics.set_for(fn, process_set)
    code = check_array(fn, array, False)
    name, auto = name_or_auto(fn, "allgather", name)
    error = "" if array.ndim else "allgather needs an array with at least one dimension, got a 0-d array"
    shape = array.shape if array.ndim else (1,)
    return Request(
        Submission.of(_core.COLL_ALLGATHER, array, None, code, name, shape, error=error),
        finish=_gathered(array.dtype, tuple(shape[1:])),
        where=where,
        auto=auto,
    )


def allgather_async(
    array: np.ndarray, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts concatenating every rank's array along dim 0 (dim 0 may differ per rank)."""
    return submit(allgather_request("allgather", array, name, process_set))


def allgather(
    array: np.ndarray, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Concatenates every rank's array along dim 0, in rank order."""
    return run_now(allgather_request("allgather", array, name, process_set))


def _check_root(fn: str, root_rank) -> int:
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)):
        raise TypeError(f"{fn}: root_rank must be an int, got {type(root_rank).__name__}")
    return int(root_rank)


def broadcast_request(fn: str, array, inplace: bool, root_rank, name, process_set=None) -> Request:
    """A broadcast from root_rank (a global rank) into `array` itself when `inplace`, else into
    a new array, in `process_set` (None: the global set), checked."""
    where = basics.set_for(fn, process_set)
    code = check_array(fn, array, inplace, device_ok=True)
    root = where.set_rank(fn, _check_root(fn, root_rank))
    name, auto = name_or_auto(fn, "broadcast", name)
    out = array if inplace else empty_like(array)
    send = engine_buffer(array)
    recv = send if inplace else engine_buffer(out)
    return Request(
        Submission.of(_core.COLL_BROADCAST, send, recv, code, name, array.shape, root=root),
        output=out,
        where=where,
        auto=auto,
    )


def broadcast_async(
    array: np.ndarray,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts copying root_rank's array to every rank, into a new array."""
    return submit(broadcast_request("broadcast", array, False, root_rank, name, process_set))


def broadcast_async_(
    array: np.ndarray,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts copying root_rank's array into `array` on every rank."""
    return submit(broadcast_request("broadcast_", array, True, root_rank, name, process_set))


def broadcast_group_(
    fn: str, arrays: Sequence[np.ndarray], names: Sequence[str], root_rank: int, process_set=None
) -> List[Handle]:
    """In-place broadcasts of `arrays` under `names`: every one checked before any is submitted
    (a bad one raises and sends nothing), then all submitted in one engine round."""
    basics.set_for(fn, process_set)  # an empty group too: not a member, say so
    return submit_group(
        [broadcast_request(fn, a, True, root_rank, n, process_set) for a, n in zip(arrays, names)]
    )


def broadcast(
    array: np.ndarray,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """root_rank's array, on every rank (a new array)."""
    return run_now(broadcast_request("broadcast", array, False, root_rank, name, process_set))


def broadcast_(
    array: np.ndarray,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Overwrites `array` with root_rank's on every rank; returns it."""
    return run_now(broadcast_request("broadcast_", array, True, root_rank, name, process_set))


def _split_error(splits, rows: int, n: int) -> str:
    if len(splits) != n:
        return f"alltoall splits {list(splits)} has {len(splits)} entries; it needs one per rank ({n})"
    if any(s < 0 for s in splits):
        return f"alltoall splits {list(splits)} contain a negative count"
    if sum(splits) != rows:
        return f"alltoall splits {list(splits)} sum to {sum(splits)}, but dim 0 of the array is {rows}"
    return ""


def alltoall_async(
    array: np.ndarray,
    splits=None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    *,
    even: bool = False,
) -> Handle:
    """Starts sending rows splits[i] of `array` to the set's rank i (without splits as evenly as
    possible; with `even`, splits must be None or equal and dim 0 must divide by the set's size,
    else it fails on every rank, as Horovod's alltoall without splits)."""
    where = basics.set_for("alltoall", process_set)
    code = check_array("alltoall", array, False)
    name = name_of("alltoall", "alltoall", name, where)
    n = where.size
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
    if even and not error and (rows % n or any(s != rows // n for s in split_list)):
        error = (
            f"alltoall without splits needs dim 0 ({rows}) divisible by the number of ranks "
            f"({n}); pass splits for an uneven split"
        )
    if error:
        split_list = [0] * n
    shape = array.shape if array.ndim else (1,)
    gathered = _gathered(array.dtype, tuple(shape[1:]))

    def finish(handle_c):
        out = gathered(handle_c)
        return (out, np.array(handle_c.recv_splits(), dtype=np.int64)) if given else out

    return submit(
        Request(
            Submission.of(
                _core.COLL_ALLTOALL, array, None, code, name, shape, splits=split_list, error=error
            ),
            finish=finish,
            where=where,
        )
    )


def alltoall(
    array: np.ndarray, splits=None, name: Optional[str] = None, process_set: ProcessSet = global_process_set
):
    """Rows splits[i] of `array` go to the set's rank i; returns the rows received in rank order,
    and with `splits` given also the rows received from each rank."""
    return synchronize(at_once(alltoall_async, array, splits, name, process_set))


def reducescatter_request(
    fn: str, array, op, name, prescale_factor, postscale_factor, process_set=None
) -> Request:
    """A reducescatter of `array` into this rank's block (its place in `process_set`; None: the
    global set), checked."""
    where = basics.set_for(fn, process_set)
    code = check_array(fn, array, False)
    check_reducible(fn, array)
    hop = check_op(fn, op, adasum=False)
    pre = check_scale(fn, "prescale_factor", prescale_factor)
    post = check_scale(fn, "postscale_factor", postscale_factor)
    name, auto = name_or_auto(fn, "reducescatter", name)
    n, r = where.size, where.rank
    error = "" if array.ndim else "reducescatter needs an array with at least one dimension, got a 0-d array"
    shape = array.shape if array.ndim else (1,)
    rows = shape[0] // n + (1 if r < shape[0] % n else 0)
    out = np.empty((rows,) + tuple(shape[1:]), array.dtype)
    send = array if array.ndim else array.reshape(1)
    return Request(
        Submission.of(
            _core.COLL_REDUCESCATTER, send, out, code, name, shape, op=hop, pre=pre, post=post, error=error
        ),
        output=out,
        where=where,
        auto=auto,
    )


def reducescatter_async(
    array: np.ndarray,
    op: ReduceOp = Average,
    name: Optional[str] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts reducing `array` across ranks; rank r keeps its block of dim 0."""
    return submit(
        reducescatter_request(
            "reducescatter", array, op, name, prescale_factor, postscale_factor, process_set
        )
    )


def reducescatter(
    array: np.ndarray,
    op: ReduceOp = Average,
    name: Optional[str] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Reduces `array` across ranks; rank r gets its block of dim 0 (as even as possible, the
    first ranks taking the extra rows)."""
    return run_now(
        reducescatter_request(
            "reducescatter", array, op, name, prescale_factor, postscale_factor, process_set
        )
    )


def allgather_group(
    fn: str, arrays: Sequence[np.ndarray], names: Sequence[str], process_set=None
) -> List[Handle]:
    """Allgathers of `arrays` under `names`: every one checked before any is submitted (a bad one
    raises and sends nothing), then all submitted in one engine round."""
    basics.set_for(fn, process_set)  # an empty group too: not a member, say so
    return submit_group([allgather_request(fn, a, n, process_set) for a, n in zip(arrays, names)])


def grouped_allgather_async(
    arrays: Sequence[np.ndarray], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> List[Handle]:
    """allgather_async of each array, submitted together."""
    fn = "grouped_allgather"
    names = group_names(fn, fn, arrays, name, where=basics.set_for(fn, process_set))
    return allgather_group(fn, arrays, names, process_set)


def grouped_allgather(
    arrays: Sequence[np.ndarray], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> List[np.ndarray]:
    """allgather of each array."""
    return [synchronize(h) for h in at_once(grouped_allgather_async, arrays, name, process_set)]


def grouped_reducescatter_async(
    arrays: Sequence[np.ndarray],
    op: ReduceOp = Average,
    name: Optional[str] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> List[Handle]:
    """reducescatter_async of each array, submitted together (every one checked before any is
    submitted)."""
    fn = "grouped_reducescatter"
    names = group_names(fn, fn, arrays, name, where=basics.set_for(fn, process_set))
    return submit_group(
        [
            reducescatter_request(fn, a, op, n, prescale_factor, postscale_factor, process_set)
            for a, n in zip(arrays, names)
        ]
    )


def grouped_reducescatter(
    arrays: Sequence[np.ndarray],
    op: ReduceOp = Average,
    name: Optional[str] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> List[np.ndarray]:
    """reducescatter of each array."""
    return [
        synchronize(h)
        for h in at_once(
            grouped_reducescatter_async, arrays, op, name, prescale_factor, postscale_factor, process_set
        )
    ]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank of the set has called barrier()."""
    where = basics.set_for("barrier", process_set)
    request = Request(
        Submission.of(_core.COLL_BARRIER, None, None, _core.hvdlUint8, "barrier", ()),
        where=where,
        auto="barrier",
    )
    run_now(request)


def join() -> int:
    """This rank has no more data: until every rank has joined, it takes part in the others'
    allreduces with zeros (Average still divides by size()). Returns the last rank to join."""
    request = Request(
        Submission.of(_core.COLL_JOIN, None, None, _core.hvdlUint8, "join", ()), finish=lambda c: c.value()
    )
    return run_now(request)
