"""hvd_lite's collectives on tf tensors, eager and inside tf.function, with horovod.tensorflow's
signatures.

Eagerly, a call converts its tensors to numpy, runs the numpy collective and converts back.
Inside a graph it becomes ops that do the same when the graph runs (graph_op): in a tf.function
one stateful `tf.numpy_function` op, which TensorFlow runs in program order; in a TF1 graph a
quick submit op and an asynchronous wait that holds none of the session's threads. Either way no
collective can keep another from starting. A name given at trace time (`tf.<kind>.noname.<n>`,
counted per process set as the core counts its automatic names) makes a mismatch stall with a
name instead of mixing two tensors up.
A grouped call (`grouped_allreduce`) is one op for a whole list: one fused step per call.

Every call takes Horovod's `process_set=` (the core's ProcessSet; default: every rank) and runs in
that set's engine; its gradient runs in the same set, with the set's size and ranks.

Errors: arguments are checked when the call is made (traced), before anything is sent
(ValueError, TypeError, NotImplementedError as Horovod raises them; a rank outside the process set
gets ProcessSetArgumentError, a tf.errors.InvalidArgumentError). A collective that fails across
ranks raises Horovod's types (_as_tf_error): eagerly, `CollectiveMismatchError` for a mismatch and
`CollectiveFailedError` otherwise (both `tf.errors.FailedPreconditionError` and
`hvd_lite.CollectiveError`). Inside a graph TensorFlow maps an exception raised by Python code by
its Python type only: the mismatch (a ValueError) reaches the caller as
`tf.errors.InvalidArgumentError`, any other failure as `tf.errors.UnknownError`, each with the
same message; `graph_failure` gives the failure back (hvd_lite.tensorflow.elastic.run raises it, so
an elastic job survives a rank's death inside a tf.function, model.fit's step included).
"""

import functools
import os
import queue
import time
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from .. import basics, collectives, ops
from .._horovod_args import resolve_op
from .._submit import HVDL_DTYPES, check_adasum, check_name, check_op, wait_for
from ..exceptions import CollectiveError, InvalidArgumentError, UnsupportedDtypeError
from ..ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .compression import Compression, called_back
from .process_sets import global_process_set, member_set, set_by_id

# TensorFlow's own folder: its frames (tf.function's, AutoGraph's) may lie between a user's line
# and hvd_lite's warning, and are skipped with hvd_lite's (_horovod_args.user_stacklevel).
TF_DIR = os.path.dirname(os.path.abspath(tf.__file__))


def graph_safe(fn):
    """Marks one of hvd_lite's TF entry points as code AutoGraph calls as it is, as it calls
    tensorflow's and keras's own: it branches on Python values only, so converting it changes
    nothing but the first trace's time (a tf.function calling the six collectives: 3.9 s with it
    converted, 0.13 s without; docs/tensorflow.md, "Tracing", tools/tf_trace_cost.py). Horovod's
    collectives are C++ ops, which AutoGraph never converts either. A compressor of the user's
    own is still converted where Horovod's converted code would have called it
    (compression.called_back)."""
    return tf.autograph.experimental.do_not_convert(fn)


# ---------------------------------------------------------------------------- errors


class CollectiveFailedError(CollectiveError, tf.errors.FailedPreconditionError):
    """A collective on tf tensors failed across ranks (a mismatch, a timeout, a failed peer):
    a tf.errors.FailedPreconditionError, as Horovod raises, and an hvd_lite.CollectiveError."""

    def __init__(self, code: int, message: str):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)
        self.code = code
        """The hvdlResult_t value (csrc/hvdl.h)."""


class CollectiveArgumentError(InvalidArgumentError, tf.errors.InvalidArgumentError):
    """A collective's arguments were refused across ranks (alltoall splits that do not add up):
    a tf.errors.InvalidArgumentError, as Horovod raises, and an hvd_lite.InvalidArgumentError."""

    def __init__(self, code: int, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)
        self.code = code
        """The hvdlResult_t value (csrc/hvdl.h)."""


class CollectiveMismatchError(InvalidArgumentError, tf.errors.FailedPreconditionError):
    """The ranks disagreed about a collective (shape, dtype, root, op): a
    tf.errors.FailedPreconditionError, as Horovod raises, and an hvd_lite.InvalidArgumentError
    (a ValueError and a CollectiveError)."""

    def __init__(self, code: int, message: str):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)
        self.code = code
        """The hvdlResult_t value (csrc/hvdl.h)."""


def _as_tf_error(exc: CollectiveError) -> Exception:
    """Horovod's types: an argument refused across ranks is InvalidArgumentError when it is an
    alltoall's splits (Horovod checks them in the op), FailedPreconditionError otherwise (Horovod's
    coordinator finds the mismatch); any other failure is FailedPreconditionError."""
    if isinstance(exc, InvalidArgumentError):
        cls = CollectiveArgumentError if "splits" in str(exc) else CollectiveMismatchError
    else:
        cls = CollectiveFailedError
    return cls(exc.code, str(exc))


# ---------------------------------------------------------------------------- argument checks


def supported_dtypes() -> List[tf.DType]:
    """The tf dtypes the collectives take: those whose numpy dtype the core has."""
    return [tf.as_dtype(d) for d in HVDL_DTYPES]


def check_dtype(fn: str, dtype: tf.DType) -> None:
    """TypeError unless the core takes `dtype` (the table is the core's: hvd_lite._submit)."""
    dtype = tf.as_dtype(dtype)
    try:
        ok = np.dtype(dtype.as_numpy_dtype) in HVDL_DTYPES
    except TypeError:  # tf.string, tf.variant, ...: no numpy dtype
        ok = False
    if not ok:
        names = ", ".join(d.name for d in supported_dtypes())
        raise UnsupportedDtypeError(f"{fn}: unsupported dtype {dtype.name} (supported: {names})")


def reduce_op(fn: str, op, average=None) -> ReduceOp:
    """The ReduceOp for Horovod's (op, average) pair (_horovod_args.resolve_op: op=None means
    Average, `average` is Horovod's deprecated spelling); anything that is no ReduceOp raises
    ValueError."""
    op = resolve_op(fn, op, average, TF_DIR)
    if op not in tuple(ReduceOp):
        raise ValueError(f"{fn}: op {op!r} is not one of Sum, Average, Adasum, Min, Max, Product")
    return ReduceOp(op)


def check_device(fn: str, label: str, device) -> None:
    """hvd_lite's collectives run on the host: '' or a CPU device is accepted, anything else
    raises (never ignored)."""
    if device in ("", None):
        return
    spec = tf.DeviceSpec.from_string(device) if isinstance(device, str) else None
    if spec is None or (spec.device_type or "CPU").upper() != "CPU":
        raise ValueError(
            f"{fn}: {label}={device!r}: hvd_lite's collectives run on the CPU; pass '' or a CPU device"
        )


def _graph_name(kind: str, name: Optional[str], process_set) -> Optional[str]:
    """`name` checked now (not when a graph runs), or inside a graph a trace-time name, the next
    of this kind in `process_set` (the ranks of a set trace its collectives in the same order)."""
    if name is not None:
        return check_name(kind, name)
    if tf.executing_eagerly():
        return name
    return basics.auto_name(f"tf.{kind}", member_set(kind, process_set))


# ---------------------------------------------------------------------------- running


def wait(handles, timeout: Optional[float] = None, what: str = "collective"):
    """Waits for hvd_lite handles; with `timeout` (seconds) raises CollectiveError past it. A
    collective given up on stays in flight under its name until the other ranks submit it."""
    if timeout:
        deadline = time.monotonic() + timeout
        for h in handles:
            pending = (
                []
                if wait_for(h, max(0.0, deadline - time.monotonic()))
                else [p for p in handles if not ops.poll(p)]
            )
            if pending:
                raise CollectiveError(
                    basics._core.hvdlRemoteError,
                    f"{what}: {len(pending)} collective(s) not done after "
                    f"{timeout} s (communication_options timeout); first: "
                    f"{pending[0].name!r}",
                )
    return [ops.synchronize(h) for h in handles]


def _np(x) -> np.ndarray:
    return np.ascontiguousarray(x)


def _run(fn, tensors: Sequence[tf.Tensor], tout: List[tf.DType], kind: str):
    """Runs `fn(*numpy arrays) -> list of arrays` now (eager) or as a graph op (graph_op)."""
    if tf.executing_eagerly():
        outs = _converting(fn)(*[t.numpy() for t in tensors])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, tout)]
    return graph_op(fn, tensors, tout, kind)


# The last failure (not a refused argument) of a collective run by _converting: inside a graph,
# TensorFlow hands the caller only its message (graph_failure gives the exception back).
_last_failure: List[CollectiveError] = []


def _converting(fn):
    """fn, raising Horovod's tf.errors types for a CollectiveError (_as_tf_error), eager and in a
    graph alike. In a graph TensorFlow then maps the raised exception by its Python type only
    (ValueError, TypeError: InvalidArgumentError; others: UnknownError), whatever its tf.errors
    class, and keeps its message; a failure is kept for graph_failure."""

    def converted(*arrays):
        try:
            return fn(*arrays)
        except CollectiveError as exc:
            if not isinstance(exc, InvalidArgumentError):
                _last_failure[:] = [exc]
            raise _as_tf_error(exc) from None

    return converted


def graph_failure(exc: BaseException) -> Optional[CollectiveError]:
    """The collective failure a tf.errors.OpError from a graph stands for, or None: the last one
    an op of hvd_lite's raised (a rank died, a timeout), when `exc` is no CollectiveError itself
    (an eager call raises that) and its message holds the failure's first line. A failure is
    given back once."""
    if isinstance(exc, CollectiveError) or not isinstance(exc, tf.errors.OpError) or not _last_failure:
        return None
    failure = _last_failure[0]
    text = str(failure)
    first = text.splitlines()[0] if text else ""
    if not first or first not in str(getattr(exc, "message", exc)):
        return None
    _last_failure.clear()
    return failure


def _ordered_graph() -> bool:
    """True inside a graph whose stateful ops TensorFlow runs in program order: a tf.function's
    (its automatic control dependencies; the flag is how tf.function's own code marks the graph).
    A TF1 graph, and tf.compat.v1.wrap_function's, have no such order."""
    return bool(getattr(tf.compat.v1.get_default_graph(), "_add_control_dependencies", False))


def graph_op(fn, tensors: Sequence[tf.Tensor], tout: List[tf.DType], kind: str) -> List[tf.Tensor]:
    """`fn(*numpy arrays) -> list of arrays` (a collective: it waits for the other ranks) as ops
    of the current graph, run when the graph runs.

    In a tf.function it is one stateful numpy_function op: TensorFlow runs those one after another
    in program order, the same on every rank, so one waiting collective never holds back a peer's.

    In a graph without that order (a TF1 session) a waiting op would hold one of the session's
    inter-op threads; with every thread held by collectives that the ranks started in different
    orders, none could finish. So the wait holds none: a `submit` op (quick, on the pool) hands
    the inputs over, and the iterator of a dataset of this op's results, which waits on a thread
    of its own (a private tf.data pool) while IteratorGetNext is asynchronous and frees the pool,
    runs `fn` and returns its outputs; a last quick op re-raises fn's exception, if any.
    Collectives that become ready together are submitted together, and fuse.
    """
    fn = _converting(fn)
    if _ordered_graph():
        outs = tf.numpy_function(
            lambda *a: [np.asarray(o, d.as_numpy_dtype) for o, d in zip(fn(*a), tout)],
            list(tensors),
            tout,
            stateful=True,
            name=f"hvdl_{kind}",
        )
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return _unordered_graph_op(fn, tensors, tout, kind)


def _unordered_graph_op(fn, tensors, tout, kind) -> List[tf.Tensor]:
    inputs: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()  # one entry a run, in run order
    failures: "queue.SimpleQueue[BaseException]" = queue.SimpleQueue()

    def submit(*arrays):
        inputs.put(arrays)
        return np.bool_(True)

    def results():  # the dataset's generator, on its own thread; never ends, never raises
        while True:
            arrays = inputs.get()
            try:
                outs = [np.asarray(o, d.as_numpy_dtype) for o, d in zip(fn(*arrays), tout)]
            except Exception as exc:  # raised by `check`: the iterator lives on for the next run
                failures.put(exc)
                outs = [np.zeros([0], d.as_numpy_dtype) for d in tout]
                yield (np.bool_(False), *outs)
            else:
                yield (np.bool_(True), *outs)

    def check(ok):
        if not ok:
            raise failures.get()
        return ok

    submitted = tf.numpy_function(submit, list(tensors), tf.bool, stateful=True, name=f"hvdl_{kind}")
    spec = (tf.TensorSpec([], tf.bool), *[tf.TensorSpec(None, d) for d in tout])
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = 1  # fn waits on this pool's thread, not the session's
    opts.autotune.enabled = False  # and nothing asks for the next run's element ahead of time
    opts.experimental_optimization.inject_prefetch = False
    ds = tf.data.Dataset.from_generator(results, output_signature=spec).with_options(opts)
    with tf.control_dependencies([submitted]):
        ok, *outs = tf.compat.v1.data.make_one_shot_iterator(ds).get_next(name=f"hvdl_{kind}_wait")
    checked = tf.numpy_function(check, [ok], tf.bool, stateful=True, name=f"hvdl_{kind}_check")
    with tf.control_dependencies([checked]):
        return [tf.identity(o) for o in outs]


def _tensor(fn: str, x) -> tf.Tensor:
    t = tf.convert_to_tensor(x)
    check_dtype(fn, t.dtype)
    return t


def _rows(out: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """`out` given `like`'s static shape but for dim 0, which a gather, scatter or all-to-all
    changes (Horovod's shape functions): a graph's numpy_function output has no shape of its own,
    and layers after it need one."""
    if like.shape.rank is not None:
        out.set_shape([None] + like.shape.as_list()[1:])
    return out


# ---------------------------------------------------------------------------- allreduce


def _grouped_allreduce(
    tensors: Sequence[tf.Tensor],
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    compression=Compression.none,
    timeout: Optional[float] = None,
    process_set=None,
) -> List[tf.Tensor]:
    """Reduces dense tensors across the ranks of `process_set` (None: every rank) in one op (one
    fused call); each keeps its dtype and shape. The internal form the tape, the optimizers and
    the strategy call."""
    tensors = [_tensor("grouped_allreduce", t) for t in tensors]
    if not tensors:
        return []
    compress, decompress = called_back(compression)
    packed = [compress(t) for t in tensors]
    sent = [p[0] for p in packed]
    for s in sent:
        check_dtype("grouped_allreduce", s.dtype)
        if op == Adasum:  # float data only, refused now (not when a graph runs)
            check_adasum("grouped_allreduce", s.dtype.name, False)
    name = _graph_name("grouped_allreduce", name, process_set)

    def fn(*arrays):
        hs = ops.at_once(
            ops.grouped_allreduce_async,
            [_np(a) for a in arrays],
            op,
            prescale_factor,
            postscale_factor,
            name,
            process_set,
        )  # waited on at once
        return [np.reshape(o, a.shape) for o, a in zip(wait(hs, timeout, "allreduce"), arrays)]

    outs = _run(fn, sent, [s.dtype for s in sent], "allreduce")
    result = []
    for o, s, (_, ctx) in zip(outs, sent, packed):
        o.set_shape(s.shape)  # the input's static shape, known or partly known
        result.append(decompress(o, ctx))
    return result


def _reduce_slices(
    fn: str, t: tf.IndexedSlices, op: ReduceOp, pre, post, process_set=None, name=None
) -> tf.IndexedSlices:
    """Horovod's reduction of tf.IndexedSlices: allgathers of the values and the indices (in
    `process_set`; None: every rank), named `<name>.values` and `<name>.indices` when `name` is
    given."""
    if op == Adasum:
        raise NotImplementedError(
            f"{fn}: op=Adasum does not take tf.IndexedSlices (sparse gradients), as in Horovod; "
            "pass sparse_as_dense=True to DistributedOptimizer or DistributedGradientTape, or "
            "tf.convert_to_tensor the slices first"
        )
    if op not in (Sum, Average):
        raise NotImplementedError(f"{fn}: only Sum and Average are supported with tf.IndexedSlices")
    if pre != 1.0 or post != 1.0:
        raise NotImplementedError(
            f"{fn}: prescale_factor and postscale_factor are not supported with tf.IndexedSlices"
        )
    values = allgather(t.values, name and f"{name}.values", process_set=process_set)
    indices = allgather(t.indices, name and f"{name}.indices", process_set=process_set)
    if op == Average:
        values = values / tf.cast(member_set(fn, process_set).size, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=t.dense_shape)


@graph_safe
def grouped_allreduce(
    tensors,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    ignore_name_scope=False,
    name=None,
):
    """Reduces a list of tensors (or tf.IndexedSlices) across ranks, the dense ones in one fused
    call; differentiable."""
    fn = "grouped_allreduce"
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{fn} expects a list of tensors, got {type(tensors).__name__}")
    if not tensors:
        return tensors
    op = reduce_op(fn, op, average)
    check_device(fn, "device_dense", device_dense)
    check_device(fn, "device_sparse", device_sparse)
    member_set(fn, process_set)
    out = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            sname = name if name is None or len(tensors) == 1 else f"{name}.{i}"
            out[i] = _reduce_slices(fn, t, op, prescale_factor, postscale_factor, process_set, sname)
    if dense:

        @tf.custom_gradient
        def _reduce(*xs):
            ys = _grouped_allreduce(
                xs, op, prescale_factor, postscale_factor, name, compression, process_set=process_set
            )

            def grad(*dys):
                return _grouped_allreduce(
                    dys, op, prescale_factor, postscale_factor, None, compression, process_set=process_set
                )

            return ys, grad

        for i, r in zip(dense, _reduce(*[_tensor(fn, tensors[i]) for i in dense])):
            out[i] = r
    return out


@graph_safe
def allreduce(
    tensor,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
):
    """Reduces `tensor` (or a tf.IndexedSlices) across ranks, Average by default; differentiable
    (the gradient is the same reduction of the incoming gradient)."""
    return grouped_allreduce(
        [tensor],
        average,
        device_dense,
        device_sparse,
        compression,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        ignore_name_scope,
        name,
    )[0]


# ---------------------------------------------------------------------------- the others


@graph_safe
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates every rank's `tensor` along dim 0 (dim 0 may differ between ranks);
    differentiable (each rank's gradient is its block of the averaged incoming gradient)."""
    return grouped_allgather([tensor], name, ignore_name_scope, process_set)[0]


@graph_safe
def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """allgather of each tensor, in one op; differentiable."""
    fn = "grouped_allgather"
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{fn} expects a list of tensors, got {type(tensors).__name__}")
    where = member_set(fn, process_set)
    ts = [_tensor(fn, t) for t in tensors]
    if not ts:
        return []
    if any(t.shape.rank == 0 for t in ts):
        raise ValueError(f"{fn}: a scalar cannot be gathered along dim 0; reshape it to [1]")
    gname = _graph_name("allgather", name, process_set)

    @tf.custom_gradient
    def _gather(*xs):
        outs = _run(
            lambda *a: collectives.grouped_allgather([_np(x) for x in a], gname, process_set),
            xs,
            [x.dtype for x in xs],
            "allgather",
        )

        def grad(*dys):
            reduced = _grouped_allreduce(dys, Average, process_set=process_set)
            cname = _graph_name("allgather", None, process_set)  # now: graph ops run in any order
            counts = _run(
                lambda *a: [
                    collectives.allgather(np.array([len(x) for x in a], np.int64), cname, process_set)
                ],
                xs,
                [tf.int64],
                "allgather",
            )[0]
            n, r = where.size, where.rank  # this rank's block: its place in the set
            counts = tf.reshape(counts, [n, len(xs)])
            return [tf.split(g, counts[:, i], num=n, axis=0)[r] for i, g in enumerate(reduced)]

        return [_rows(o, x) for o, x in zip(outs, xs)], grad

    return list(_gather(*ts))


@graph_safe
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Rank `root_rank`'s `tensor` on every rank (of the set; `root_rank` is a global rank, a
    member's); differentiable (the averaged gradient on the root, zero elsewhere)."""
    fn = "broadcast"
    where = member_set(fn, process_set)
    t = _tensor(fn, tensor)
    root = collectives._check_root(fn, root_rank)
    where.set_rank(fn, root)  # a root outside the set: ValueError now
    gname = _graph_name(fn, name, process_set)

    @tf.custom_gradient
    def _bcast(x):
        out = _run(
            lambda a: [collectives.broadcast(_np(a), root, gname, process_set).reshape(a.shape)],
            [x],
            [x.dtype],
            "broadcast",
        )[0]

        def grad(dy):
            g = _grouped_allreduce([dy], Average, process_set=process_set)[0]
            return g if basics.rank() == root else g * 0

        return tf.ensure_shape(out, x.shape), grad

    return _bcast(t)


@graph_safe
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Rows splits[i] of `tensor` go to rank i (without splits, dim 0 must divide evenly by the
    ranks, as in Horovod); returns the rows received in rank order and, with `splits`
    given, the number of rows received from each rank (as Horovod does); differentiable in
    `tensor` (the gradient goes back the way the rows came)."""
    fn = "alltoall"
    where = member_set(fn, process_set)
    t = _tensor(fn, tensor)
    if t.shape.rank == 0:
        raise ValueError(f"{fn}: a scalar cannot be split along dim 0; reshape it to [1]")
    gname = _graph_name(fn, name, process_set)
    n = where.size
    even = splits is None
    if even:  # Horovod's rule: dim 0 divided evenly, or an error on every rank
        s = tf.fill([n], tf.shape(t, out_type=tf.int64)[0] // n)
    else:
        s = tf.cast(tf.convert_to_tensor(splits), tf.int64)

    def send(x, sp, label, even=False):
        def run(a, b):
            try:
                out = ops.synchronize(
                    ops.at_once(
                        functools.partial(collectives.alltoall_async, even=even),
                        _np(a),
                        None if even else [int(v) for v in b],
                        label,
                        process_set,
                    )
                )  # even: the rows only, and every rank received b's even split
                recv, rsplits = (out, b) if even else out
            except CollectiveError as exc:  # bad splits (on any rank): Horovod's argument error
                if "splits" in str(exc):
                    raise InvalidArgumentError(exc.code, str(exc)) from None
                raise
            return [recv, np.asarray(rsplits, np.int64)]

        out, rsplits = _run(run, [x, sp], [x.dtype, tf.int64], "alltoall")
        return _rows(out, x), tf.ensure_shape(rsplits, [n])

    @tf.custom_gradient
    def _a2a(x):
        out, rsplits = send(x, s, gname, even)

        def grad(dy, _):
            return send(dy, rsplits, _graph_name(fn, None, process_set))[0]

        return (out, rsplits), grad

    out, rsplits = _a2a(t)
    return (out, tf.stop_gradient(rsplits)) if splits is not None else out


def _scatter(fn, tensors, op, pre, post, name, process_set):
    where = member_set(fn, process_set)
    ts = [_tensor(fn, t) for t in tensors]
    if any(t.shape.rank == 0 for t in ts):
        raise ValueError(f"{fn}: a scalar cannot be scattered along dim 0; reshape it to [1]")
    gname = _graph_name("reducescatter", name, process_set)

    @tf.custom_gradient
    def _rs(*xs):
        outs = _run(
            lambda *a: collectives.grouped_reducescatter(
                [_np(x) for x in a], op, gname, pre, post, process_set
            ),
            xs,
            [x.dtype for x in xs],
            "reducescatter",
        )

        def grad(*dys):
            scale = (where.size if op == Sum else 1.0) * pre * post
            return [allgather(dy * scale if scale != 1.0 else dy, process_set=process_set) for dy in dys]

        return [_rows(o, x) for o, x in zip(outs, xs)], grad

    return list(_rs(*ts))


@graph_safe
def reducescatter(
    tensor,
    device_dense="",
    compression=Compression.none,
    op=Average,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Reduces `tensor` across ranks; rank r keeps its block of dim 0; differentiable."""
    return grouped_reducescatter(
        [tensor], device_dense, compression, op, process_set, prescale_factor, postscale_factor, _name=name
    )[0]


@graph_safe
def grouped_reducescatter(
    tensors,
    device_dense="",
    compression=Compression.none,
    op=Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
    _name=None,
):
    """reducescatter of each tensor, in one op; differentiable."""
    fn = "grouped_reducescatter"
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{fn} expects a list of tensors, got {type(tensors).__name__}")
    if not tensors:
        return tensors
    op = reduce_op(fn, op)
    check_op(fn, op, adasum=False)
    check_device(fn, "device_dense", device_dense)
    member_set(fn, process_set)
    compress, decompress = called_back(compression)
    packed = [compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _scatter(fn, [p[0] for p in packed], op, prescale_factor, postscale_factor, _name, process_set)
    return [decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)]


@graph_safe
def join():
    """This rank has no more data (eager): it takes part in the others' allreduces with zeros
    until every rank has joined; returns the last rank to join, as a tensor."""
    return tf.constant(collectives.join(), tf.int32)


@graph_safe
def barrier(process_set=global_process_set) -> None:
    """Returns once every rank (of the set) has called barrier() (eager; hvd_lite's, not in
    Horovod's TF API)."""
    member_set("barrier", process_set)
    collectives.barrier(process_set)


# ---------------------------------------------------------------------------- values as ops


def _set_value(fn: str, process_set_id, value, name) -> tf.Tensor:
    """value(the set with this id) as an int32 tensor, worked out when a graph runs, as Horovod's
    ops are (a set may be removed and its id reused in between); an unknown id raises ValueError
    now (and when the graph runs), where Horovod returns a negative error code."""
    set_by_id(fn, process_set_id)
    if tf.executing_eagerly():
        return tf.constant(value(set_by_id(fn, process_set_id)), tf.int32, name=name)
    out = tf.numpy_function(
        lambda: np.int32(value(set_by_id(fn, process_set_id))), [], tf.int32, stateful=True, name=name or fn
    )
    return tf.ensure_shape(out, [])


@graph_safe
def size_op(process_set_id=0, name=None) -> tf.Tensor:
    """The number of ranks (in the process set with this id), as an int32 tensor."""
    return _set_value("size_op", process_set_id, lambda s: s.size, name)


@graph_safe
def local_size_op(name=None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 tensor."""
    return tf.constant(basics.local_size(), tf.int32, name=name)


@graph_safe
def rank_op(name=None) -> tf.Tensor:
    """This rank, as an int32 tensor."""
    return tf.constant(basics.rank(), tf.int32, name=name)


@graph_safe
def local_rank_op(name=None) -> tf.Tensor:
    """This rank on its host, as an int32 tensor."""
    return tf.constant(basics.local_rank(), tf.int32, name=name)


@graph_safe
def process_set_included_op(process_set_id=0, name=None) -> tf.Tensor:
    """1 if this rank is in the process set with this id (the global one, 0: always), else 0, as
    an int32 tensor."""
    return _set_value(
        "process_set_included_op", process_set_id, lambda s: int(basics.rank() in s.ranks), name
    )


__all__ = [
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
    "join",
    "barrier",
    "size_op",
    "local_size_op",
    "rank_op",
    "local_rank_op",
    "process_set_included_op",
    "wait",
    "supported_dtypes",
    "check_dtype",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "Adasum",
    "ReduceOp",
    "CollectiveFailedError",
    "CollectiveArgumentError",
    "CollectiveMismatchError",
]
