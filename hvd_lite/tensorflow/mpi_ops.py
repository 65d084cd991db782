"""hvd_lite's collectives on tf tensors, eager and inside tf.function.

Eagerly, a call converts its tensors to numpy, runs the numpy collective and converts back.
Inside a graph it becomes one stateful `tf.numpy_function` op that does the same when the graph
runs. tf.function's automatic control dependencies keep stateful ops in program order, so every
rank issues its collectives in the order the function was written; a name given at trace time
(`tf.<kind>.<n>`) makes a mismatch stall with a name instead of mixing two tensors up.
A grouped call (`grouped_allreduce`) is one op for a whole list: one fused step per call.
"""
import itertools
import time
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from .. import basics, collectives, ops
from .._submit import check_name, wait_for
from ..exceptions import CollectiveError
from ..ops import Average, Max, Min, Product, ReduceOp, Sum

_trace_ids = itertools.count()


def _graph_name(kind: str, name: Optional[str]) -> Optional[str]:
    """`name` checked now (not when a graph runs), or a trace-time name inside a graph."""
    if name is not None:
        return check_name(kind, name)
    if tf.executing_eagerly():
        return name
    return f"tf.{kind}.{next(_trace_ids)}"


def wait(handles, timeout: Optional[float] = None, what: str = "collective"):
    """Waits for hvd_lite handles; with `timeout` (seconds) raises CollectiveError past it. A
    collective given up on stays in flight under its name until the other ranks submit it."""
    if timeout:
        deadline = time.monotonic() + timeout
        for h in handles:
            pending = [] if wait_for(h, max(0.0, deadline - time.monotonic())) else [
                p for p in handles if not ops.poll(p)]
            if pending:
                raise CollectiveError(basics._core.hvdlRemoteError,
                                      f"{what}: {len(pending)} collective(s) not done after "
                                      f"{timeout} s (communication_options timeout); first: "
                                      f"{pending[0].name!r}")
    return [ops.synchronize(h) for h in handles]


def _np(x) -> np.ndarray:
    return np.ascontiguousarray(x)


def _run(fn, tensors: Sequence[tf.Tensor], tout: List[tf.DType], kind: str):
    """Runs `fn(*numpy arrays) -> list of arrays` now (eager) or as one graph op."""
    if tf.executing_eagerly():
        outs = fn(*[t.numpy() for t in tensors])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, tout)]
    outs = tf.numpy_function(lambda *a: [np.asarray(o, d.as_numpy_dtype) for o, d in
                                         zip(fn(*a), tout)],
                             list(tensors), tout, stateful=True, name=f"hvdl_{kind}")
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _tensor(x) -> tf.Tensor:
    if isinstance(x, tf.IndexedSlices):
        x = tf.convert_to_tensor(x)
    return tf.convert_to_tensor(x)


def grouped_allreduce(tensors: Sequence[tf.Tensor], op: ReduceOp = Average,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: Optional[str] = None, compression=None,
                      timeout: Optional[float] = None) -> List[tf.Tensor]:
    """Reduces a list of tensors across ranks in one fused call; each keeps its dtype and shape."""
    from .compression import Compression

    compression = compression or Compression.none
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    packed = [compression.compress(t) for t in tensors]
    sent = [p[0] for p in packed]
    name = _graph_name("grouped_allreduce", name)

    def fn(*arrays):
        hs = ops.at_once(ops.grouped_allreduce_async, [_np(a) for a in arrays], op,
                         prescale_factor, postscale_factor, name)  # waited on at once
        return [np.reshape(o, a.shape) for o, a in zip(wait(hs, timeout, "allreduce"), arrays)]

    outs = _run(fn, sent, [s.dtype for s in sent], "allreduce")
    result = []
    for o, s, (_, ctx) in zip(outs, sent, packed):
        o = tf.ensure_shape(o, s.shape) if s.shape.is_fully_defined() else o
        result.append(compression.decompress(o, ctx))
    return result


def allreduce(tensor, op: ReduceOp = Average, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None, compression=None,
              average=None) -> tf.Tensor:
    """Reduces `tensor` across ranks (Average by default); differentiable (the gradient is the
    same reduction of the incoming gradient)."""
    if average is not None:
        op = Average if average else Sum

    @tf.custom_gradient
    def _reduce(x):
        y = grouped_allreduce([x], op, prescale_factor, postscale_factor, name, compression)[0]

        def grad(dy):
            return grouped_allreduce([dy], op, prescale_factor, postscale_factor, None,
                                     compression)[0]
        return y, grad

    return _reduce(_tensor(tensor))


def allgather(tensor, name: Optional[str] = None) -> tf.Tensor:
    """Concatenates every rank's `tensor` along dim 0 (dim 0 may differ between ranks)."""
    t = _tensor(tensor)
    name = _graph_name("allgather", name)
    out = _run(lambda a: [collectives.allgather(_np(a), name)], [t], [t.dtype], "allgather")[0]
    return tf.ensure_shape(out, [None] + t.shape.as_list()[1:]) if t.shape.rank else out


def broadcast(tensor, root_rank: int, name: Optional[str] = None) -> tf.Tensor:
    """Rank `root_rank`'s `tensor` on every rank."""
    t = _tensor(tensor)
    name = _graph_name("broadcast", name)
    out = _run(lambda a: [collectives.broadcast(_np(a), root_rank, name).reshape(a.shape)], [t],
               [t.dtype],
               "broadcast")[0]
    return tf.ensure_shape(out, t.shape)


def alltoall(tensor, splits=None, name: Optional[str] = None):
    """Rows splits[i] of `tensor` go to rank i; returns the rows received in rank order, and with
    `splits` given also the number of rows received from each rank."""
    t = _tensor(tensor)
    name = _graph_name("alltoall", name)
    if splits is None:
        out = _run(lambda a: [collectives.alltoall(_np(a), None, name)], [t], [t.dtype],
                   "alltoall")[0]
        return tf.ensure_shape(out, [None] + t.shape.as_list()[1:]) if t.shape.rank else out
    s = tf.cast(_tensor(splits), tf.int64)

    def fn(a, sp):
        recv, rsplits = collectives.alltoall(_np(a), [int(v) for v in sp], name)
        return [recv, np.asarray(rsplits, np.int64)]

    out, rsplits = _run(fn, [t, s], [t.dtype, tf.int64], "alltoall")
    return out, tf.ensure_shape(rsplits, [basics.size()])


def reducescatter(tensor, op: ReduceOp = Average, name: Optional[str] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces `tensor` across ranks; rank r keeps its block of dim 0."""
    t = _tensor(tensor)
    name = _graph_name("reducescatter", name)
    out = _run(lambda a: [collectives.reducescatter(_np(a), op, name, prescale_factor,
                                                    postscale_factor)], [t], [t.dtype],
               "reducescatter")[0]
    return tf.ensure_shape(out, [None] + t.shape.as_list()[1:]) if t.shape.rank else out


def barrier() -> None:
    """Returns once every rank has called barrier() (eager only)."""
    collectives.barrier()


__all__ = ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall",
           "reducescatter", "barrier", "wait", "Average", "Sum", "Min", "Max", "Product",
           "ReduceOp"]
