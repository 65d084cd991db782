"""Collectives on torch tensors: horovod.torch's names and arguments over hvd_lite's engine.

CPU tensors reach the engine without a copy: an allreduce's common case (_plain_args) gives the
engine the tensor's memory by address, everything else goes as numpy views of it (bfloat16 through
an int16 view) through the numpy API's checks. Out-of-place calls copy a non-contiguous input once;
in-place calls refuse it. In a build with CUDA, a CUDA tensor's allreduce in that common case goes
to the engine by address too, on torch's current stream (_memory). Any other call on a tensor on
another device goes through a CPU copy and its result comes back to that device, but an op=Adasum
allreduce, which takes floating-point CPU tensors only (_check_adasum).
"""

import functools
from typing import Callable, List, Optional, Sequence

import ml_dtypes
import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad

from .. import basics, collectives, ops
from .._build import cuda_built
from .._horovod_args import resolve_op
from .._submission import Submission
from .._submit import (
    MAX_DIMS,
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Request,
    Sum,
    at_once,
    check_adasum,
    check_name,
    group_names,
    run,
    start,
    submit_group,
)
from ..exceptions import CollectiveError, UnsupportedDtypeError
from ..process_sets import global_process_set
from .compression import Compression

HorovodInternalError = CollectiveError
"""horovod.torch's name for a failed collective: hvd_lite.CollectiveError."""

# Every dtype the engine takes (hvd_lite._submit.HVDL_DTYPES) but bfloat16, which numpy lacks.
# bool moves with allgather, broadcast and alltoall only; reductions refuse it, as Horovod does.
_NUMPY_DTYPES = {
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.int16: np.int16,
    torch.uint16: np.uint16,
    torch.int32: np.int32,
    torch.uint32: np.uint32,
    torch.int64: np.int64,
    torch.uint64: np.uint64,
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.bool: np.bool_,
}
SUPPORTED_DTYPES = tuple(_NUMPY_DTYPES) + (torch.bfloat16,)


def _check_tensor(fn: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{fn} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _NUMPY_DTYPES and tensor.dtype != torch.bfloat16:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise UnsupportedDtypeError(f"{fn}: unsupported dtype {tensor.dtype} (supported: {names})")
    if tensor.is_sparse or tensor.layout != torch.strided:
        raise TypeError(
            f"{fn}: {tensor.layout} tensors are not supported; pass a dense tensor (tensor.to_dense())"
        )


def _check_adasum(fn: str, tensor, op) -> None:
    """For op=Adasum, what the engine's Adasum cannot take, refused before anything is sent: a
    tensor that is not floating point (TypeError) or not in CPU memory (ValueError; without this
    check a CUDA tensor would go through a CPU copy unsaid)."""
    if isinstance(op, int) and op == Adasum:
        _check_tensor(fn, tensor)
        check_adasum(fn, str(tensor.dtype).replace("torch.", ""), not tensor.is_cpu)


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy). The view holds an alias of the
    tensor that torch makes (a new tensor object on the same storage), not the caller's tensor, so
    the memory lives as long as the view does, even if the tensor is given other memory (set_,
    .data =) while its collective is in flight (tests/unit/test_torch_memory.py)."""
    t = tensor.detach() if tensor.requires_grad else tensor  # numpy() refuses a tensor with grad
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A torch view of a numpy array (no copy)."""
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


# The hvdl codes of the dtypes a reduction takes (bool is not one), by way of numpy's.
_REDUCIBLE = {t: ops._REDUCIBLE[np.dtype(n)] for t, n in _NUMPY_DTYPES.items() if t != torch.bool}
_REDUCIBLE[torch.bfloat16] = ops._REDUCIBLE[np.dtype(ml_dtypes.bfloat16)]


def _plain_args(tensor, inplace: bool, op, pre, post, name) -> Optional[Submission]:
    """ops.plain_args for a tensor: the Submission of an allreduce whose arguments the full
    route (a numpy view through the numpy API) would accept at once, or None. A dense, contiguous,
    non-empty CPU torch.Tensor (not a subclass) of a reducible dtype, and what ops.plain_op takes
    (the op, factors and name). Its memory goes to the engine by
    address, with its storage to keep it alive (no numpy view, which costs more than the rest of the
    call: docs/benchmarks-history.md, "Submitting"); out of place, into a new tensor like it. The two
    routes give the engine the same arguments (tests/unit/test_torch_plain_args.py)."""
    if type(tensor) is not torch.Tensor:
        return None
    hop, code = ops.plain_op(op, pre, post, name), _REDUCIBLE.get(tensor.dtype)
    if (
        hop is None
        or code is None
        or tensor.layout != torch.strided
        or tensor.dim() > MAX_DIMS
        or not tensor.is_contiguous()
        or tensor.is_neg()
    ):
        return None  # a negative view: its memory holds minus its values (the full route copies)
    where = _memory(tensor)
    count, address = tensor.numel(), tensor.data_ptr()
    if where is None or count == 0 or address == 0:
        return None  # address 0: a tensor without memory (a ZeroTensor)
    # The engine holds the tensor's storage, not the tensor: a tensor given other memory while the
    # call is in flight (set_, .data =) leaves the engine writing memory still alive.
    send = (tensor.untyped_storage(), address, count * tensor.element_size()) + where
    recv = send if inplace else _output(tensor, send)
    # Submission's FIELDS, in order (a list, not Submission.of: as ops.plain_args)
    return Submission(
        [
            basics._core.COLL_ALLREDUCE,
            send,
            recv,
            code,
            hop,
            pre,
            post,
            name,
            tuple(tensor.shape),
            0,
            None,
            "",
        ]
    )


def _memory(tensor: torch.Tensor) -> Optional[tuple]:
    """Where a tensor's memory is, as the engine's (owner, address, nbytes[, device, stream])
    buffers end: () for the CPU; for a CUDA tensor in a build with CUDA, its device and torch's
    current stream there (the engine's copies and kernels queue on it, after the work that made
    the tensor, and the result is ready where that stream reaches it, as NCCL's is); None for
    anything else (the route through a CPU copy)."""
    if tensor.is_cpu:
        return ()
    if tensor.is_cuda and _cuda():
        return (tensor.device.index, torch.cuda.current_stream(tensor.device).cuda_stream)
    return None


def _cuda() -> bool:
    """Whether this build takes CUDA memory (asked once)."""
    global _CUDA
    if _CUDA is None:
        _CUDA = cuda_built()
    return _CUDA


_CUDA: Optional[bool] = None


def _output(like: torch.Tensor, send: tuple) -> tuple:
    """A new tensor like `like` (whose buffer is `send`), by address, where `like` is: an
    out-of-place call's output (the result itself, since nothing else holds it while the call is
    in flight)."""
    out = torch.empty_like(like, memory_format=torch.contiguous_format)
    return (out, out.data_ptr()) + send[2:]


def cpu_input(fn: str, tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when it is a contiguous CPU tensor, else a contiguous CPU copy."""
    _check_tensor(fn, tensor)
    if not tensor.is_cpu:
        tensor = tensor.detach().to("cpu")
    if tensor.is_neg():  # its memory holds minus its values: a copy that holds them
        return tensor.resolve_neg().contiguous()
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def cpu_inplace(fn: str, tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's own CPU memory for an in-place call (a CPU copy for other devices)."""
    _check_tensor(fn, tensor)
    if not tensor.is_contiguous():
        raise ValueError(
            f"{fn}: the tensor is not contiguous (shape {list(tensor.shape)}, stride "
            f"{list(tensor.stride())}) and cannot be reduced in place; use the "
            "out-of-place call or tensor.contiguous()"
        )
    if not tensor.is_cpu:
        return tensor.detach().to("cpu")
    if tensor.is_neg():  # its memory holds minus its values: a copy, copied back (_in_place)
        return tensor.detach().resolve_neg()
    return tensor


class Handle:
    """A collective on tensors in flight (or a group of them, submitted together): pass it to
    poll() or synchronize()."""

    __slots__ = ("_hs", "_finish", "_group", "_done", "_result")

    def __init__(self, handles, finish: Callable, group: bool = False):
        self._hs = handles if group else [handles]
        # numpy output (a list of them for a group) -> torch result; None once finished
        self._finish: Optional[Callable] = finish
        self._group = group
        self._done = False
        self._result = None

    def __repr__(self) -> str:
        names = ", ".join(repr(h.name) for h in self._hs)
        return f"<hvd_lite.torch.Handle {names} {'done' if poll(self) else 'pending'}>"


def _to_device(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return result if like.is_cpu else result.to(like.device)


def _out_of_place(like: torch.Tensor) -> Callable:
    return lambda out: _to_device(_tensor(out), like)


def _given(out: torch.Tensor) -> Callable:
    return lambda _out: out


def _in_place(original: torch.Tensor, cpu: torch.Tensor) -> Callable:
    def finish(_out):
        if cpu is not original:
            original.data.copy_(cpu)
        return original

    return finish


def _group_handle(handles, finishes) -> Handle:
    """One Handle for a group: synchronize() gives the list of its outputs, as horovod.torch's."""
    return Handle(list(handles), lambda outs: [f(o) for f, o in zip(finishes, outs)], group=True)


def poll(handle: Handle) -> bool:
    """True once the collective (every one of a group) behind `handle` has completed."""
    _check_handle("poll", handle)
    return handle._done or all(ops.poll(h) for h in handle._hs)


def synchronize(handle: Handle):
    """Waits for `handle` and returns its output tensor (a list of them for a grouped call), or
    raises its error."""
    _check_handle("synchronize", handle)
    finish = handle._finish
    if finish is not None:  # not finished yet; once it is, the finish (and what it holds) goes
        outs = [ops.synchronize(h) for h in handle._hs]
        result = finish(outs if handle._group else outs[0])
        handle._result, handle._finish, handle._done = result, None, True
    return handle._result


def _check_handle(fn: str, handle) -> None:
    if not isinstance(handle, Handle):
        raise TypeError(
            f"{fn} expects a handle from one of hvd_lite.torch's *_async calls, got {type(handle).__name__}"
        )


def _differentiable(function, tensors, *args):
    """function.apply(*args) when autograd would act on the call (grad mode on and one of
    `tensors` requiring grad, or a forward-mode level open: the Functions define no jvp, so
    apply refuses dual tensors), else function.run(*args): the same collective without
    autograd's bookkeeping, which costs more than a small collective (docs/benchmarks.md,
    "Latency")."""
    if (torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)) or getattr(
        _forward_ad, "_current_level", -1
    ) >= 0:
        return function.apply(*args)
    return function.run(*args)


# ---------------------------------------------------------------------------- allreduce


def allreduce_async(
    tensor: torch.Tensor,
    average=None,
    name: Optional[str] = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> Handle:
    """Starts reducing `tensor` across ranks into a new tensor; returns a handle."""
    op = resolve_op("allreduce_async", op, average)
    return _allreduce_start(
        "allreduce_async", tensor, False, op, prescale_factor, postscale_factor, name, process_set
    )


def allreduce_async_(
    tensor: torch.Tensor,
    average=None,
    name: Optional[str] = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> Handle:
    """Starts reducing `tensor` across ranks in place; returns a handle."""
    op = resolve_op("allreduce_async_", op, average)
    return _allreduce_start(
        "allreduce_async_", tensor, True, op, prescale_factor, postscale_factor, name, process_set
    )


def _allreduce_start(fn: str, tensor, inplace: bool, op, pre, post, name, process_set) -> Handle:
    """An asynchronous allreduce: _plain_args' route by address straight to the engine, anything
    else through a CPU tensor's numpy view and the numpy API."""
    s = _plain_args(tensor, inplace, op, pre, post, name)
    if s is not None:
        where = basics.set_for(fn, process_set)
        return Handle(
            start(where, ops._KIND if name is None else None, s, None),
            _in_place(tensor, tensor) if inplace else _given(s.recv[0]),
        )
    _check_adasum(fn, tensor, op)
    if inplace:
        cpu = cpu_inplace(fn, tensor)
        return Handle(
            ops.allreduce_async_(numpy_view(cpu), op, pre, post, name, process_set), _in_place(tensor, cpu)
        )
    src = cpu_input(fn, tensor)
    return Handle(
        ops.allreduce_async(numpy_view(src), op, pre, post, name, process_set), _out_of_place(tensor)
    )


def _allreduce_now(tensor: torch.Tensor, op, pre, post, name, process_set) -> torch.Tensor:
    """A synchronous allreduce into a new tensor through the numpy API's synchronous call (no
    handle; unnamed, it takes the set's one synchronous name instead of a new counter name that
    rank 0's coordinator must match). _plain_args' common case goes to the engine directly."""
    s = _plain_args(tensor, False, op, pre, post, name)
    if s is None:
        _check_adasum("allreduce", tensor, op)
        src = cpu_input("allreduce", tensor)
        return _out_of_place(tensor)(ops.allreduce(numpy_view(src), op, pre, post, name, process_set))
    run(basics.set_for("allreduce", process_set), ops._KIND if name is None else None, s)
    return s.recv[0]


class _Allreduce(torch.autograd.Function):
    """allreduce; its gradient is the allreduce of the gradient with the same op and factors."""

    @staticmethod
    def run(tensor, name, op, prescale_factor, postscale_factor, process_set):
        return _allreduce_now(tensor, op, prescale_factor, postscale_factor, name, process_set)

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _Allreduce.run(tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, process_set = ctx.args
        return _allreduce_now(grad, op, pre, post, None, process_set), None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average=None,
    name: Optional[str] = None,
    compression=Compression.none,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> torch.Tensor:
    """Reduces `tensor` across ranks into a new tensor (Average by default); differentiable."""
    op = resolve_op("allreduce", op, average)
    compressed, ctx = compression.compress(tensor)
    out = _differentiable(
        _Allreduce, (compressed,), compressed, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(out, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average=None,
    name: Optional[str] = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> torch.Tensor:
    """Reduces `tensor` across ranks in place and returns it."""
    op = resolve_op("allreduce_", op, average)
    s = _plain_args(tensor, True, op, prescale_factor, postscale_factor, name)
    if s is None:
        _check_adasum("allreduce_", tensor, op)
        cpu = cpu_inplace("allreduce_", tensor)
        ops.allreduce_(numpy_view(cpu), op, prescale_factor, postscale_factor, name, process_set)
        return _in_place(tensor, cpu)(None)
    run(basics.set_for("allreduce_", process_set), ops._KIND if name is None else None, s)
    return tensor


def allreduce_group(
    fn: str,
    tensors: Sequence[torch.Tensor],
    names: Sequence[str],
    inplace: bool,
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
    process_set=global_process_set,
) -> List[Handle]:
    """Allreduces of `tensors` under `names`, in place or into new tensors: every one checked
    before any is submitted (a bad one raises and sends nothing), then all submitted in one
    engine round, so they can be fused. One handle each."""
    maybe = [
        _plain_args(t, True, op, prescale_factor, postscale_factor, n)  # no output yet
        for t, n in zip(tensors, names)
    ]
    plain = [s for s in maybe if s is not None]
    if plain and len(plain) == len(maybe):  # every one by address (the optimizer's gradients)
        where = basics.set_for(fn, process_set)
        if not inplace:
            for s, t in zip(plain, tensors):
                s.recv = _output(t, s.send)
        handles = submit_group([Request(s, None, None, where) for s in plain])
        return [
            Handle(h, _in_place(t, t) if inplace else _given(s.recv[0]))
            for h, t, s in zip(handles, tensors, plain)
        ]
    for t in tensors:
        _check_adasum(fn, t, op)
    cpus = [cpu_inplace(fn, t) if inplace else cpu_input(fn, t) for t in tensors]
    handles = ops.allreduce_group(
        fn, [numpy_view(c) for c in cpus], names, inplace, op, prescale_factor, postscale_factor, process_set
    )
    return [
        Handle(h, _in_place(t, c) if inplace else _out_of_place(t)) for h, t, c in zip(handles, tensors, cpus)
    ]


def _grouped(
    fn, tensors, inplace, average, name, op, prescale_factor, postscale_factor, process_set
) -> Handle:
    op = resolve_op(fn, op, average)
    names = group_names(fn, "grouped_allreduce", tensors, name, "tensors", basics.set_for(fn, process_set))
    handles = allreduce_group(fn, tensors, names, inplace, op, prescale_factor, postscale_factor, process_set)
    return _group_handle([h._hs[0] for h in handles], [h._finish for h in handles])


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average=None,
    name: Optional[str] = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> Handle:
    """Starts reducing a list of tensors, submitted together; synchronize() gives the list."""
    return _grouped(
        "grouped_allreduce_async",
        tensors,
        False,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average=None,
    name: Optional[str] = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> Handle:
    """In-place grouped_allreduce_async."""
    return _grouped(
        "grouped_allreduce_async_",
        tensors,
        True,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )


class _GroupedAllreduce(torch.autograd.Function):
    """grouped_allreduce; each gradient is the allreduce of its output's gradient."""

    @staticmethod
    def run(name, op, prescale_factor, postscale_factor, process_set, *tensors):
        return tuple(
            synchronize(
                at_once(
                    grouped_allreduce_async,
                    list(tensors),
                    None,
                    name,
                    op,
                    prescale_factor,
                    postscale_factor,
                    process_set,
                )
            )
        )

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _GroupedAllreduce.run(name, op, prescale_factor, postscale_factor, process_set, *tensors)

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, process_set = ctx.args
        outs = synchronize(
            at_once(grouped_allreduce_async, list(grads), None, None, op, pre, post, process_set)
        )
        return (None, None, None, None, None) + tuple(outs)


def _check_list(fn: str, tensors) -> None:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{fn} expects a list of tensors, got {type(tensors).__name__}")
    for t in tensors:  # before compressing them
        _check_tensor(fn, t)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average=None,
    name: Optional[str] = None,
    compression=Compression.none,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> List[torch.Tensor]:
    """Reduces a list of tensors into new tensors (submitted together, so they can be fused);
    differentiable."""
    op = resolve_op("grouped_allreduce", op, average)
    _check_list("grouped_allreduce", tensors)
    packed = [compression.compress(t) for t in tensors]
    compressed = [c for c, _ in packed]
    outs = _differentiable(
        _GroupedAllreduce, compressed, name, op, prescale_factor, postscale_factor, process_set, *compressed
    )
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average=None,
    name: Optional[str] = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> List[torch.Tensor]:
    """Reduces a list of tensors in place and returns them."""
    return synchronize(
        at_once(
            grouped_allreduce_async_,
            tensors,
            average,
            name,
            op,
            prescale_factor,
            postscale_factor,
            process_set,
        )
    )


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op=Average, process_set=global_process_set):
    """Starts reducing a torch.sparse tensor by allgathering its indices and values in the set
    (Horovod's sparse_allreduce_async); returns a function that waits and gives the reduced
    sparse tensor (uncoalesced: entries from every rank of the set, summed, divided by the set's
    size for Average)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError(
            "sparse_allreduce_async expects a torch.sparse (COO) tensor, got "
            f"{type(tensor).__name__ if not isinstance(tensor, torch.Tensor) else tensor.layout}"
        )
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async: op must be Average or Sum, got {op!r}")
    check_name("sparse_allreduce_async", name)
    n = basics.set_for("sparse_allreduce_async", process_set).size
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = allgather_async(t._indices().t().contiguous(), f"{name}.indices", process_set)
    values = allgather_async(t._values().contiguous(), f"{name}.values", process_set)

    def wait() -> torch.Tensor:
        vals = synchronize(values)
        idx = synchronize(indices)
        if op == Average:
            vals = vals / n
        return torch.sparse_coo_tensor(idx.t(), vals, t.size())

    wait.handles = (indices, values)  # type: ignore[attr-defined]  # what poll() can ask about
    return wait


# ---------------------------------------------------------------------------- allgather


def allgather_async(
    tensor: torch.Tensor, name: Optional[str] = None, process_set=global_process_set
) -> Handle:
    """Starts concatenating every rank's tensor along dim 0 (dim 0 may differ per rank)."""
    src = cpu_input("allgather_async", tensor)
    h = collectives.allgather_async(numpy_view(src), name, process_set)
    return Handle(h, _out_of_place(tensor))


def _rows_before_me(rows: Sequence[int], process_set) -> List[int]:
    """For each of this rank's tensors with these dim-0 sizes: the rows the set's lower ranks
    put before its own in the gathered tensor."""
    every = collectives.allgather(
        np.array([list(rows)], np.int64), process_set=process_set
    )  # set size x len(rows)
    me = basics.set_for("allgather", process_set).rank
    return [int(x) for x in every[:me].sum(axis=0)] if len(rows) else []


class _Allgather(torch.autograd.Function):
    """allgather; the gradient is this rank's rows of the average of every rank's gradient
    (Horovod's definition)."""

    @staticmethod
    def run(tensor, name, process_set):
        return synchronize(at_once(allgather_async, tensor, name, process_set))

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return _Allgather.run(tensor, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        ps = ctx.process_set
        averaged = _allreduce_now(grad, Average, 1.0, 1.0, None, ps)
        return averaged.narrow(0, _rows_before_me([ctx.rows], ps)[0], ctx.rows), None, None


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set=global_process_set
) -> torch.Tensor:
    """Every rank's tensor concatenated along dim 0, in rank order; differentiable."""
    return _differentiable(_Allgather, (tensor,), tensor, name, process_set)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set=global_process_set
) -> Handle:
    """allgather_async of each tensor, submitted together (every one checked before any is
    submitted); synchronize() gives the list."""
    fn = "grouped_allgather"
    names = group_names(fn, fn, tensors, name, "tensors", basics.set_for(fn, process_set))
    srcs = [cpu_input(fn, t) for t in tensors]
    handles = collectives.allgather_group(fn, [numpy_view(s) for s in srcs], names, process_set)
    return _group_handle(handles, [_out_of_place(t) for t in tensors])


class _GroupedAllgather(torch.autograd.Function):
    """grouped_allgather; each gradient as allgather's."""

    @staticmethod
    def run(name, process_set, *tensors):
        return tuple(synchronize(at_once(grouped_allgather_async, list(tensors), name, process_set)))

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [t.shape[0] if t.dim() else 1 for t in tensors]
        ctx.process_set = process_set
        return _GroupedAllgather.run(name, process_set, *tensors)

    @staticmethod
    def backward(ctx, *grads):
        ps = ctx.process_set
        averaged = synchronize(
            at_once(grouped_allreduce_async, list(grads), None, None, Average, 1.0, 1.0, ps)
        )
        starts = _rows_before_me(ctx.rows, ps)
        return (None, None) + tuple(g.narrow(0, s, r) for g, s, r in zip(averaged, starts, ctx.rows))


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set=global_process_set
) -> List[torch.Tensor]:
    """allgather of each tensor, submitted together; differentiable."""
    _check_list("grouped_allgather", tensors)
    return list(_differentiable(_GroupedAllgather, tensors, name, process_set, *tensors))


# ---------------------------------------------------------------------------- broadcast


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set=global_process_set
) -> Handle:
    """Starts copying root_rank's tensor to every rank, into a new tensor."""
    src = cpu_input("broadcast_async", tensor)
    h = collectives.broadcast_async(numpy_view(src), root_rank, name, process_set)
    return Handle(h, _out_of_place(tensor))


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set=global_process_set
) -> Handle:
    """Starts copying root_rank's tensor into `tensor` on every rank."""
    cpu = cpu_inplace("broadcast_async_", tensor)
    h = collectives.broadcast_async_(numpy_view(cpu), root_rank, name, process_set)
    return Handle(h, _in_place(tensor, cpu))


class _Broadcast(torch.autograd.Function):
    """broadcast; the root's gradient is the average of every rank's, the others' zero
    (Horovod's definition)."""

    @staticmethod
    def run(tensor, root_rank, name, process_set):
        src = cpu_input("broadcast", tensor)
        return _out_of_place(tensor)(collectives.broadcast(numpy_view(src), root_rank, name, process_set))

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _Broadcast.run(tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        averaged = _allreduce_now(grad, Average, 1.0, 1.0, None, ctx.process_set)
        if basics.rank() != ctx.root_rank:
            averaged.zero_()
        return averaged, None, None, None


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set=global_process_set
) -> torch.Tensor:
    """root_rank's tensor on every rank (a new tensor); differentiable."""
    return _differentiable(_Broadcast, (tensor,), tensor, root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set=global_process_set
) -> torch.Tensor:
    """Overwrites `tensor` with root_rank's on every rank; returns it."""
    cpu = cpu_inplace("broadcast_", tensor)
    collectives.broadcast_(numpy_view(cpu), root_rank, name, process_set)
    return _in_place(tensor, cpu)(None)


# ---------------------------------------------------------------------------- alltoall


def _split_list(splits) -> Optional[List[int]]:
    """`splits` as a list of ints; ValueError unless it holds integers (as Horovod's int32)."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise ValueError(
                f"alltoall: splits must hold integers (torch.int32 as in Horovod), "
                f"got a {splits.dtype} tensor"
            )
        return [int(s) for s in splits.reshape(-1).tolist()]
    items = list(splits) if isinstance(splits, (list, tuple, np.ndarray)) else None
    if items is None or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) for s in items):
        raise ValueError(f"alltoall: splits must be a sequence of ints or an integer tensor, got {splits!r}")
    return [int(s) for s in items]


def _alltoall(tensor: torch.Tensor, splits, name, process_set) -> Handle:
    """The alltoall behind alltoall_async: its handle always gives (output, received splits)."""
    src = cpu_input("alltoall_async", tensor)
    split_list = _split_list(splits)
    n, rows = basics.set_for("alltoall", process_set).size, (tensor.shape[0] if tensor.dim() else 0)
    even = split_list is None
    if even and rows % n == 0:  # Horovod's default: dim 0 split evenly over the set's ranks
        split_list = [rows // n] * n
    # dim 0 not divisible without splits: the engine fails the alltoall on every rank
    h = collectives.alltoall_async(numpy_view(src), split_list, name, process_set, even=even)

    def finish(out):
        if isinstance(out, tuple):
            return _to_device(_tensor(out[0]), tensor), torch.from_numpy(out[1]).to(torch.int32)
        return _to_device(_tensor(out), tensor), None

    return Handle(h, finish)


def alltoall_async(
    tensor: torch.Tensor, splits=None, name: Optional[str] = None, process_set=global_process_set
) -> Handle:
    """Starts sending rows splits[i] of `tensor` to the set's rank i (without splits dim 0 must
    divide evenly by the set's size); synchronize() gives the rows received, and with `splits`
    given also the rows received from each rank."""
    h = _alltoall(tensor, splits, name, process_set)
    finish = h._finish
    if splits is None and finish is not None:  # without splits: the rows received only
        h._finish = lambda out: finish(out)[0]
    return h


class _Alltoall(torch.autograd.Function):
    """alltoall; the gradient goes back where its rows came from (an alltoall with the received
    splits)."""

    @staticmethod
    def both(tensor, splits, name, process_set):
        """The rows received and the received splits."""
        return synchronize(at_once(_alltoall, tensor, splits, name, process_set))

    @staticmethod
    def run(tensor, splits, name, process_set):
        out, received = _Alltoall.both(tensor, splits, name, process_set)
        return out if splits is None else (out, received)

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, received = _Alltoall.both(tensor, splits, name, process_set)
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, *_):
        back, _ = synchronize(at_once(_alltoall, grad, ctx.received, None, ctx.process_set))
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None, process_set=global_process_set):
    """Rows splits[i] go to the set's rank i (without splits dim 0 must divide evenly by the
    set's size); returns the rows received in rank order, and with `splits` given also the rows
    received from each rank; differentiable."""
    return _differentiable(_Alltoall, (tensor,), tensor, splits, name, process_set)


# ---------------------------------------------------------------------------- reducescatter


def reducescatter_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op=Average,
    process_set=global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts reducing `tensor` across ranks; rank r keeps its block of dim 0."""
    src = cpu_input("reducescatter_async", tensor)
    h = collectives.reducescatter_async(
        numpy_view(src), op, name, prescale_factor, postscale_factor, process_set
    )
    return Handle(h, _out_of_place(tensor))


def _reducescatter_grad(grad: torch.Tensor, op, pre: float, post: float, process_set) -> torch.Tensor:
    """Horovod's scaling of a reducescatter's output gradient before it is allgathered: the
    set's size for Sum, and the scale factors."""
    if op == Sum:
        grad = grad * basics.set_for("reducescatter", process_set).size
    if pre != 1.0:
        grad = grad * pre
    if post != 1.0:
        grad = grad * post
    return grad


class _Reducescatter(torch.autograd.Function):
    """reducescatter; the gradient is the allgather of the output gradients, scaled as
    Horovod's (by the set's size for Sum, by the scale factors), in the same set."""

    @staticmethod
    def run(tensor, name, op, prescale_factor, postscale_factor, process_set):
        return synchronize(
            at_once(reducescatter_async, tensor, name, op, process_set, prescale_factor, postscale_factor)
        )

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _Reducescatter.run(tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, process_set = ctx.args
        g = _reducescatter_grad(grad, op, pre, post, process_set)
        out = synchronize(at_once(allgather_async, g, None, process_set))
        return out, None, None, None, None, None


def reducescatter(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    compression=Compression.none,
    op=Average,
    process_set=global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduces `tensor` across ranks; rank r gets its block of dim 0; differentiable."""
    compressed, ctx = compression.compress(tensor)
    out = _differentiable(
        _Reducescatter, (compressed,), compressed, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op=Average,
    process_set=global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """reducescatter_async of each tensor, submitted together (every one checked before any is
    submitted); synchronize() gives the list."""
    fn = "grouped_reducescatter"
    names = group_names(fn, fn, tensors, name, "tensors", basics.set_for(fn, process_set))
    srcs = [cpu_input(fn, t) for t in tensors]
    handles = submit_group(
        [
            collectives.reducescatter_request(
                fn, numpy_view(s), op, n, prescale_factor, postscale_factor, process_set
            )
            for s, n in zip(srcs, names)
        ]
    )
    return _group_handle(handles, [_out_of_place(t) for t in tensors])


class _GroupedReducescatter(torch.autograd.Function):
    """grouped_reducescatter; each gradient as reducescatter's."""

    @staticmethod
    def run(name, op, prescale_factor, postscale_factor, process_set, *tensors):
        return tuple(
            synchronize(
                at_once(
                    grouped_reducescatter_async,
                    list(tensors),
                    name,
                    op,
                    process_set,
                    prescale_factor,
                    postscale_factor,
                )
            )
        )

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _GroupedReducescatter.run(name, op, prescale_factor, postscale_factor, process_set, *tensors)

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        gs = [_reducescatter_grad(g, op, pre, post, ps) for g in grads]
        return (None, None, None, None, None) + tuple(
            synchronize(at_once(grouped_allgather_async, gs, None, ps))
        )


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    compression=Compression.none,
    op=Average,
    process_set=global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[torch.Tensor]:
    """reducescatter of each tensor, submitted together; differentiable."""
    _check_list("grouped_reducescatter", tensors)
    packed = [compression.compress(t) for t in tensors]
    compressed = [c for c, _ in packed]
    outs = _differentiable(
        _GroupedReducescatter,
        compressed,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        *compressed,
    )
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)]


# ---------------------------------------------------------------------------- barrier, join


def barrier(process_set=global_process_set) -> None:
    """Returns once every rank of the set has called barrier()."""
    collectives.barrier(process_set)


def join(device: int = -1) -> int:
    """This rank has no more data (it joins the others' allreduces with zeros until every rank
    has joined); returns the last rank to join. `device` is where Horovod puts the zeros; here
    they are always in host memory, so any device gives the same result."""
    if isinstance(device, bool) or not isinstance(device, int) or device < -1:
        raise ValueError(f"join: device must be -1 (CPU) or a device index, got {device!r}")
    return collectives.join()


def untraced(fn: Callable) -> Callable:
    """`fn` as torch.compile meets it: Dynamo calls it as it is (one graph break, at the call)
    instead of tracing into hvd_lite's Python down to the engine and breaking the graph at each
    step there it cannot trace. A compiled step of five collectives (tools/torch_compile_cost.py)
    makes 6 graphs instead of 22; its first call is 3.4x faster and each later one 2.8x
    (docs/pytorch.md, "torch.compile"). Outside torch.compile it costs a check a call (a 4-byte
    allreduce_ about 1.1x the time). The disabled form is made at the first call under
    torch.compile, not here: torch.compiler.disable imports Dynamo, and `import hvd_lite.torch`
    took 6.2 s with it against 3.5 s without (median of 5, 2 cores). Dynamo breaks the graph at
    that first making too, next to the break at the call, so the graphs are the same."""
    disabled: List[Callable] = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            if not disabled:
                disabled.append(torch.compiler.disable(fn))
            return disabled[0](*args, **kwargs)
        return fn(*args, **kwargs)

    return call


__all__ = [
    "HorovodInternalError",
    "Handle",
    "poll",
    "synchronize",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "barrier",
    "join",
    "Sum",
    "Average",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "ReduceOp",
]

# The collectives and waits, as torch.compile meets them (untraced).
for _name in __all__:
    if _name[0].islower():  # the functions (the classes, ops and error are capitalised)
        globals()[_name] = untraced(globals()[_name])
