"""Allreduce on numpy arrays, submitted to the engine; the synchronous calls are submit + wait."""

from typing import List, Optional, Sequence

import numpy as np

from . import basics
from ._submission import Submission
from ._submit import (
    HVDL_DTYPES,
    HVDL_OPS,
    MAX_DIMS,
    MAX_NAME_BYTES,
    Adasum,
    Average,
    Handle,
    Max,
    Min,
    Product,
    ReduceOp,
    Request,
    Sum,
    at_once,
    check_adasum,
    check_array,
    check_op,
    check_reducible,
    check_scale,
    empty_like,
    engine_buffer,
    group_names,
    held,
    hvdl_dtype,
    is_device_array,
    name_or_auto,
    poll,
    run,
    run_now,
    start,
    submit,
    submit_group,
    synchronize,
)
from .process_sets import ProcessSet, global_process_set

_core = basics._core
# The kind of an allreduce's automatic names (both routes: a synchronous call's is "allreduce.sync").
_KIND = "allreduce"


def allreduce_request(
    fn: str, array, inplace: bool, op, prescale_factor, postscale_factor, name, process_set=None
) -> Request:
    """An allreduce of `array` (into itself when `inplace`, else into a new array) in
    `process_set` (None: the global set), checked: plain_args' common case at a glance, anything
    else in full (checked_request), which raises for what the engine cannot take."""
    where = basics.set_for(fn, process_set)  # not initialized, not a member: say so first
    s = plain_args(array, inplace, op, prescale_factor, postscale_factor, name)
    if s is None:
        return checked_request(fn, array, inplace, op, prescale_factor, postscale_factor, name, where)
    return Request(s, s.recv, None, where, _KIND if name is None else None)


def checked_request(
    fn: str, array, inplace: bool, op, prescale_factor, postscale_factor, name, where
) -> Request:
    """allreduce_request's full checks, in the set `where` (basics.set_for's)."""
    code = check_array(fn, array, inplace, device_ok=True)
    check_reducible(fn, array)
    hop = check_op(fn, op)
    if hop == _core.hvdlAdasum:
        check_adasum(fn, array.dtype.name, is_device_array(array))
    pre = check_scale(fn, "prescale_factor", prescale_factor)
    post = check_scale(fn, "postscale_factor", postscale_factor)
    name, auto = name_or_auto(fn, _KIND, name)
    out = array if inplace else empty_like(array)
    # The C core takes the arrays' memory through the buffer protocol without a
    # format, which works for every dtype here, bfloat16 included (CuPy's through the CUDA
    # array interface, on the stream it names: the result is ready where that stream reaches it).
    send = engine_buffer(array)
    recv = send if inplace else engine_buffer(out)
    return Request(
        Submission.of(_core.COLL_ALLREDUCE, send, recv, code, name, array.shape, hop, pre, post),
        out,
        None,
        where,
        auto,
    )


def allreduce_async(
    array: np.ndarray,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts reducing `array` across ranks into a new array; returns a handle."""
    return _allreduce_start(
        "allreduce_async", array, False, op, prescale_factor, postscale_factor, name, process_set
    )


def allreduce_async_(
    array: np.ndarray,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts reducing `array` across ranks in place; returns a handle."""
    return _allreduce_start(
        "allreduce_async_", array, True, op, prescale_factor, postscale_factor, name, process_set
    )


def allreduce(
    array: np.ndarray,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Reduces `array` across ranks into a new array (Average: sum, then / size)."""
    return _allreduce_now("allreduce", array, False, op, prescale_factor, postscale_factor, name, process_set)


def allreduce_(
    array: np.ndarray,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Reduces `array` across ranks in place and returns it."""
    return _allreduce_now("allreduce_", array, True, op, prescale_factor, postscale_factor, name, process_set)


def _allreduce_start(fn: str, array, inplace: bool, op, pre, post, name, process_set) -> Handle:
    """An asynchronous allreduce: plain_args' common case straight to the engine (start), without
    a Request, anything else through checked_request's checks (submit). Unnamed, both take the
    set's next counter name (tests/unit/test_plain_args.py)."""
    where = basics.set_for(fn, process_set)  # not initialized, not a member: say so first
    s = plain_args(array, inplace, op, pre, post, name)
    if s is None:
        return submit(checked_request(fn, array, inplace, op, pre, post, name, where))
    return start(where, _KIND if name is None else None, s, s.recv)


def _allreduce_now(fn: str, array, inplace: bool, op, pre, post, name, process_set):
    """A synchronous allreduce: plain_args' common case straight to the engine (run), without
    a Request, anything else through checked_request's checks (run_now), which raise for what the
    engine cannot take. The two give the engine the same arguments
    (tests/unit/test_plain_args.py)."""
    where = basics.set_for(fn, process_set)  # not initialized, not a member: say so first
    s = plain_args(array, inplace, op, pre, post, name)
    if s is None:
        return run_now(checked_request(fn, array, inplace, op, pre, post, name, where))
    run(where, _KIND if name is None else None, s)
    return s.recv


# The dtypes a reduction takes: HVDL_DTYPES but bool (check_reducible).
_REDUCIBLE = {dt: code for dt, code in HVDL_DTYPES.items() if dt.kind != "b"}
# The longest name in characters that is surely at most MAX_NAME_BYTES in UTF-8.
_PLAIN_NAME_CHARS = MAX_NAME_BYTES // 4


def plain_op(op, pre, post, name) -> Optional[int]:
    """The hvdl op code of an allreduce whose op, factors and name pass checked_request's checks at
    a glance (a ReduceOp but Adasum, float factors, no name or a short one) while no adapter fault
    is armed, or None: the part of a quick route that does not depend on the buffer (plain_args
    here, hvd_lite.torch's _plain_args for tensors)."""
    if (
        type(op) is not ReduceOp
        or type(pre) is not float
        or type(post) is not float
        or basics._state.adapter_faults
        or (name is not None and (type(name) is not str or len(name) > _PLAIN_NAME_CHARS or "\0" in name))
    ):
        return None
    return None if op == ReduceOp.Adasum else HVDL_OPS.get(op)


def plain_args(array, inplace: bool, op, pre, post, name) -> Optional[Submission]:
    """The Submission of an allreduce whose arguments pass checked_request's checks at a
    glance, or None: a C-contiguous numpy.ndarray (writable in place) of a reducible dtype, and
    what plain_op takes. Automatically named, the name is left for run(), start() or submit() to
    set. Whatever this declines, checked_request checks in full, so each error is written once;
    this is what a small call's microseconds allow (docs/benchmarks-history.md, "Through the numpy API")."""
    if type(array) is not np.ndarray:
        return None
    hop, code, flags = plain_op(op, pre, post, name), _REDUCIBLE.get(array.dtype), array.flags
    if (
        hop is None
        or code is None
        or array.ndim > MAX_DIMS
        or not flags.c_contiguous
        or (inplace and not flags.writeable)
    ):
        return None
    out = array if inplace else np.empty_like(array, order="C")
    # Submission's FIELDS, in order: coll, send, recv, dtype, op, pre, post, name, shape, root,
    # splits, error (a list, not Submission.of: a call saves the function's frame)
    return Submission(
        [_core.COLL_ALLREDUCE, array, out, code, hop, pre, post, name, array.shape, 0, None, ""]
    )


def allreduce_group(
    fn: str,
    arrays: Sequence[np.ndarray],
    names: Sequence[str],
    inplace: bool,
    op,
    prescale_factor,
    postscale_factor,
    process_set=None,
) -> List[Handle]:
    """Allreduces of `arrays` under `names` in `process_set` (None: the global set): every one
    checked before any is submitted (a bad one raises and sends nothing), then all submitted in
    one engine round."""
    basics.set_for(fn, process_set)  # an empty group too: not a member, say so
    requests = [
        allreduce_request(fn, a, inplace, op, prescale_factor, postscale_factor, n, process_set)
        for a, n in zip(arrays, names)
    ]
    return submit_group(requests)


def _grouped(fn, arrays, inplace, op, prescale_factor, postscale_factor, name, process_set) -> List[Handle]:
    where = basics.set_for(fn, process_set)
    names = group_names(fn, "grouped_allreduce", arrays, name, where=where)
    return allreduce_group(fn, arrays, names, inplace, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async(
    arrays: Sequence[np.ndarray],
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> List[Handle]:
    """Starts reducing a list of arrays, submitted together so they can be fused; one handle each."""
    return _grouped(
        "grouped_allreduce_async", arrays, False, op, prescale_factor, postscale_factor, name, process_set
    )


def grouped_allreduce_async_(
    arrays: Sequence[np.ndarray],
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> List[Handle]:
    """In-place grouped_allreduce_async."""
    return _grouped(
        "grouped_allreduce_async_", arrays, True, op, prescale_factor, postscale_factor, name, process_set
    )


def grouped_allreduce(
    arrays: Sequence[np.ndarray],
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> List[np.ndarray]:
    """Reduces a list of arrays into new arrays."""
    handles = at_once(
        grouped_allreduce_async, arrays, op, prescale_factor, postscale_factor, name, process_set
    )
    return [synchronize(h) for h in handles]


def grouped_allreduce_(
    arrays: Sequence[np.ndarray],
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> List[np.ndarray]:
    """Reduces a list of arrays in place and returns them."""
    handles = at_once(
        grouped_allreduce_async_, arrays, op, prescale_factor, postscale_factor, name, process_set
    )
    return [synchronize(h) for h in handles]


# Defined in _submit and part of this module's interface: the handle calls, the op names and the
# tables (the benchmarks use HVDL_DTYPES and HVDL_OPS).
__all__ = [
    "ReduceOp",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "Adasum",
    "HVDL_DTYPES",
    "HVDL_OPS",
    "hvdl_dtype",
    "Handle",
    "poll",
    "synchronize",
    "at_once",
    "held",
    "allreduce_request",
    "allreduce_async",
    "allreduce_async_",
    "allreduce",
    "allreduce_",
    "allreduce_group",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
]
