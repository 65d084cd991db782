"""Collectives on torch tensors: horovod.torch's names and arguments over hvd_lite's engine.

CPU tensors reach the engine without a copy, as numpy views of their memory (bfloat16 through an
int16 view). Out-of-place calls copy a non-contiguous input once; in-place calls refuse it. A tensor
on another device goes through a CPU copy and its result comes back to that device.
"""
from typing import Callable, List, Optional, Sequence

import ml_dtypes
import numpy as np
import torch

from .. import basics, collectives, ops
from ..process_sets import global_process_set
from .._submit import Average, Max, Min, Product, ReduceOp, Sum, at_once, group_names
from ..exceptions import CollectiveError
from .compression import Compression

# horovod.torch's name for a failed collective.
HorovodInternalError = CollectiveError

# Every dtype the engine takes (hvd_lite._submit.HVDL_DTYPES) but bfloat16, which numpy lacks.
# bool moves with allgather, broadcast and alltoall only; reductions refuse it, as Horovod does.
_NUMPY_DTYPES = {
    torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16, torch.uint16: np.uint16,
    torch.int32: np.int32, torch.uint32: np.uint32, torch.int64: np.int64,
    torch.uint64: np.uint64, torch.float16: np.float16, torch.float32: np.float32,
    torch.float64: np.float64, torch.bool: np.bool_,
}
SUPPORTED_DTYPES = tuple(_NUMPY_DTYPES) + (torch.bfloat16,)


def _check_tensor(fn: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{fn} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _NUMPY_DTYPES and tensor.dtype != torch.bfloat16:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise TypeError(f"{fn}: unsupported dtype {tensor.dtype} (supported: {names})")
    if tensor.is_sparse or tensor.layout != torch.strided:
        raise TypeError(f"{fn}: {tensor.layout} tensors are not supported; pass a dense tensor "
                        "(tensor.to_dense())")


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy)."""
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A torch view of a numpy array (no copy)."""
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def cpu_input(fn: str, tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when it is a contiguous CPU tensor, else a contiguous CPU copy."""
    _check_tensor(fn, tensor)
    if tensor.device.type != "cpu":
        tensor = tensor.detach().to("cpu")
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def cpu_inplace(fn: str, tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's own CPU memory for an in-place call (a CPU copy for other devices)."""
    _check_tensor(fn, tensor)
    if not tensor.is_contiguous():
        raise ValueError(f"{fn}: the tensor is not contiguous (shape {list(tensor.shape)}, stride "
                         f"{list(tensor.stride())}) and cannot be reduced in place; use the "
                         "out-of-place call or tensor.contiguous()")
    if tensor.device.type != "cpu":
        return tensor.detach().to("cpu")
    return tensor


class Handle:
    """A collective on tensors in flight: pass it to poll() or synchronize()."""

    __slots__ = ("_h", "_finish", "_done", "_result")

    def __init__(self, handle: ops.Handle, finish: Callable):
        self._h = handle
        self._finish = finish  # numpy output -> torch result
        self._done = False
        self._result = None

    def __repr__(self) -> str:
        return f"<hvd_lite.torch.Handle {self._h.name!r} {'done' if poll(self) else 'pending'}>"


def _to_device(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return result if like.device.type == "cpu" else result.to(like.device)


def _out_of_place(like: torch.Tensor) -> Callable:
    return lambda out: _to_device(_tensor(out), like)


def _in_place(original: torch.Tensor, cpu: torch.Tensor) -> Callable:
    def finish(_out):
        if cpu is not original:
            original.data.copy_(cpu)
        return original
    return finish


def poll(handle: Handle) -> bool:
    """True once the collective behind `handle` has completed."""
    return handle._done or ops.poll(handle._h)


def synchronize(handle: Handle):
    """Waits for `handle` and returns its output tensor, or raises its error."""
    if not handle._done:
        out = ops.synchronize(handle._h)
        handle._result, handle._finish, handle._done = handle._finish(out), None, True
    return handle._result


def _op(op, average, fn: str) -> ReduceOp:
    if average is not None:
        if op is not None:
            raise ValueError(f"{fn}: give op or the deprecated average, not both")
        return Average if average else Sum
    return Average if op is None else op


# ---------------------------------------------------------------------------- allreduce

def allreduce_async(tensor: torch.Tensor, average=None, name: Optional[str] = None, op=None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set=global_process_set) -> Handle:
    """Starts reducing `tensor` across ranks into a new tensor; returns a handle."""
    src = cpu_input("allreduce_async", tensor)
    h = ops.allreduce_async(numpy_view(src), _op(op, average, "allreduce_async"), prescale_factor,
                            postscale_factor, name, process_set)
    return Handle(h, _out_of_place(tensor))


def allreduce_async_(tensor: torch.Tensor, average=None, name: Optional[str] = None, op=None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set=global_process_set) -> Handle:
    """Starts reducing `tensor` across ranks in place; returns a handle."""
    cpu = cpu_inplace("allreduce_async_", tensor)
    array = numpy_view(cpu)
    h = ops.allreduce_async_(array, _op(op, average, "allreduce_async_"), prescale_factor,
                             postscale_factor, name, process_set)
    return Handle(h, _in_place(tensor, cpu))


class _Allreduce(torch.autograd.Function):
    """allreduce; its gradient is the allreduce of the gradient with the same op and factors."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(at_once(allreduce_async, tensor, None, name, op,
                                   prescale_factor, postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, process_set = ctx.args
        out = synchronize(at_once(allreduce_async, grad, None, None, op, pre, post, process_set))
        return out, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average=None, name: Optional[str] = None,
              compression=Compression.none, op=None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set=global_process_set) -> torch.Tensor:
    """Reduces `tensor` across ranks into a new tensor (Average by default); differentiable."""
    op = _op(op, average, "allreduce")
    compressed, ctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def allreduce_(tensor: torch.Tensor, average=None, name: Optional[str] = None, op=None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set=global_process_set) -> torch.Tensor:
    """Reduces `tensor` across ranks in place and returns it."""
    return synchronize(at_once(allreduce_async_, tensor, average, name, op, prescale_factor,
                               postscale_factor, process_set))


def allreduce_group(fn: str, tensors: Sequence[torch.Tensor], names: Sequence[str],
                    inplace: bool, op: ReduceOp, prescale_factor: float,
                    postscale_factor: float, process_set=global_process_set) -> List[Handle]:
    """Allreduces of `tensors` under `names`, in place or into new tensors: every one checked
    before any is submitted (a bad one raises and sends nothing), then all submitted in one
    engine round, so they can be fused."""
    cpus = [cpu_inplace(fn, t) if inplace else cpu_input(fn, t) for t in tensors]
    handles = ops.allreduce_group(fn, [numpy_view(c) for c in cpus], names, inplace, op,
                                  prescale_factor, postscale_factor, process_set)
    return [Handle(h, _in_place(t, c) if inplace else _out_of_place(t))
            for h, t, c in zip(handles, tensors, cpus)]


def _grouped(fn, tensors, inplace, average, name, op, prescale_factor,
             postscale_factor, process_set) -> List[Handle]:
    op = _op(op, average, fn)
    names = group_names(fn, "grouped_allreduce", tensors, name, "tensors",
                        basics.set_for(fn, process_set))
    return allreduce_group(fn, tensors, names, inplace, op, prescale_factor, postscale_factor,
                           process_set)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average=None,
                            name: Optional[str] = None, op=None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set=global_process_set) -> List[Handle]:
    """Starts reducing a list of tensors, submitted together; one handle each."""
    return _grouped("grouped_allreduce_async", tensors, False, average, name, op, prescale_factor,
                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average=None,
                             name: Optional[str] = None, op=None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set=global_process_set) -> List[Handle]:
    """In-place grouped_allreduce_async."""
    return _grouped("grouped_allreduce_async_", tensors, True, average, name, op, prescale_factor,
                    postscale_factor, process_set)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        handles = at_once(grouped_allreduce_async, list(tensors), None, name, op,
                          prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(h) for h in handles)

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, process_set = ctx.args
        handles = at_once(grouped_allreduce_async, list(grads), None, None, op, pre, post,
                          process_set)
        return (None, None, None, None, None) + tuple(synchronize(h) for h in handles)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average=None, name: Optional[str] = None,
                      compression=Compression.none, op=None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set=global_process_set) -> List[torch.Tensor]:
    """Reduces a list of tensors into new tensors (submitted together, so they can be fused)."""
    op = _op(op, average, "grouped_allreduce")
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"grouped_allreduce expects a list of tensors, got {type(tensors).__name__}")
    for t in tensors:  # before compressing them
        _check_tensor("grouped_allreduce", t)
    packed = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                   *[c for c, _ in packed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average=None, name: Optional[str] = None,
                       op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set=global_process_set) -> List[torch.Tensor]:
    """Reduces a list of tensors in place and returns them."""
    handles = at_once(grouped_allreduce_async_, tensors, average, name, op, prescale_factor,
                      postscale_factor, process_set)
    return [synchronize(h) for h in handles]


# ---------------------------------------------------------------------------- allgather

def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set=global_process_set) -> Handle:
    """Starts concatenating every rank's tensor along dim 0 (dim 0 may differ per rank)."""
    src = cpu_input("allgather_async", tensor)
    h = collectives.allgather_async(numpy_view(src), name, process_set)
    return Handle(h, _out_of_place(tensor))


class _Allgather(torch.autograd.Function):
    """allgather; the gradient is this rank's rows of the sum of every rank's gradient."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return synchronize(at_once(allgather_async, tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        ps = ctx.process_set
        summed = synchronize(at_once(allreduce_async, grad, None, None, Sum, 1.0, 1.0, ps))
        rows = collectives.allgather(np.array([ctx.rows], np.int64), process_set=ps)
        start = int(rows[:basics.set_for("allgather", ps).rank].sum())
        return summed.narrow(0, start, ctx.rows), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's tensor concatenated along dim 0, in rank order; differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set=global_process_set) -> List[Handle]:
    """allgather_async of each tensor, submitted together: every one checked before any is
    submitted."""
    fn = "grouped_allgather"
    names = group_names(fn, fn, tensors, name, "tensors", basics.set_for(fn, process_set))
    srcs = [cpu_input(fn, t) for t in tensors]
    handles = collectives.allgather_group(fn, [numpy_view(s) for s in srcs], names, process_set)
    return [Handle(h, _out_of_place(t)) for h, t in zip(handles, tensors)]


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set=global_process_set) -> List[torch.Tensor]:
    """allgather of each tensor."""
    return [synchronize(h) for h in at_once(grouped_allgather_async, tensors, name, process_set)]


# ---------------------------------------------------------------------------- broadcast

def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set=global_process_set) -> Handle:
    """Starts copying root_rank's tensor to every rank, into a new tensor."""
    src = cpu_input("broadcast_async", tensor)
    h = collectives.broadcast_async(numpy_view(src), root_rank, name, process_set)
    return Handle(h, _out_of_place(tensor))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set=global_process_set) -> Handle:
    """Starts copying root_rank's tensor into `tensor` on every rank."""
    cpu = cpu_inplace("broadcast_async_", tensor)
    h = collectives.broadcast_async_(numpy_view(cpu), root_rank, name, process_set)
    return Handle(h, _in_place(tensor, cpu))


class _Broadcast(torch.autograd.Function):
    """broadcast; the root's gradient is the sum of every rank's, the others' zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(at_once(broadcast_async, tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        summed = synchronize(at_once(allreduce_async, grad, None, None, Sum, 1.0, 1.0,
                                     ctx.process_set))
        if basics.rank() != ctx.root_rank:
            summed.zero_()
        return summed, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set=global_process_set) -> torch.Tensor:
    """root_rank's tensor on every rank (a new tensor); differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set=global_process_set) -> torch.Tensor:
    """Overwrites `tensor` with root_rank's on every rank; returns it."""
    return synchronize(at_once(broadcast_async_, tensor, root_rank, name, process_set))


# ---------------------------------------------------------------------------- alltoall, reducescatter

def alltoall_async(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
                   process_set=global_process_set) -> Handle:
    """Starts sending rows splits[i] of `tensor` to rank i (evenly without splits)."""
    src = cpu_input("alltoall_async", tensor)
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    h = collectives.alltoall_async(numpy_view(src), splits, name, process_set)

    def finish(out):
        if isinstance(out, tuple):
            return _to_device(_tensor(out[0]), tensor), torch.from_numpy(out[1]).to(torch.int32)
        return _to_device(_tensor(out), tensor)
    return Handle(h, finish)


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None, process_set=global_process_set):
    """Rows splits[i] go to rank i; returns the rows received in rank order, and with `splits`
    given also the rows received from each rank."""
    return synchronize(at_once(alltoall_async, tensor, splits, name, process_set))


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op=Average,
                        process_set=global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Starts reducing `tensor` across ranks; rank r keeps its block of dim 0."""
    src = cpu_input("reducescatter_async", tensor)
    h = collectives.reducescatter_async(numpy_view(src), op, name, prescale_factor, postscale_factor,
                                        process_set)
    return Handle(h, _out_of_place(tensor))


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None,
                  compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces `tensor` across ranks; rank r gets its block of dim 0."""
    compressed, ctx = compression.compress(tensor)
    out = synchronize(at_once(reducescatter_async, compressed, name, op, process_set,
                              prescale_factor, postscale_factor))
    return compression.decompress(out, ctx)


def barrier(process_set=global_process_set) -> None:
    """Returns once every rank of the set has called barrier()."""
    collectives.barrier(process_set)


def join(device: int = -1) -> int:
    """This rank has no more data (it joins the others' allreduces with zeros until every rank
    has joined); returns the last rank to join."""
    return collectives.join()


__all__ = [
    "HorovodInternalError", "Handle", "poll", "synchronize", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "barrier", "join", "Sum", "Average", "Min", "Max", "Product", "ReduceOp",
]
