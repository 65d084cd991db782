"""hvd_lite.torch keeps a tensor's memory alive while its collective is in flight: on either route
(by address, mpi_ops._plain_args; a numpy view, mpi_ops.numpy_view) the engine holds the memory
itself, not the caller's tensor, which may be given other memory (set_, .data =) before the call
completes. One process: the engine is held, so the call stays in flight while the tensor is given
new memory and the allocator hands out fresh tensors, filled with 7, where freed memory would go."""

import gc

import pytest

torch = pytest.importorskip("torch")

import hvd_lite.torch as hvd  # noqa: E402
from hvd_lite import basics, ops  # noqa: E402

N = 1 << 14  # 64 KiB of float32: heap memory the allocator hands out again at once


@pytest.fixture
def initialized():
    hvd.init()
    yield
    hvd.shutdown()


def _renew(t, how):
    """Gives `t` other memory (zeros), dropping its hold on the memory it had."""
    if how == "set_":
        with torch.no_grad():  # a Parameter that requires grad refuses set_ otherwise
            t.set_(torch.zeros(t.shape, dtype=t.dtype).untyped_storage())
    else:
        t.data = torch.zeros(t.shape, dtype=t.dtype)


# name: (make the tensor, start the call, the result the tensor's old values should give).
# A Parameter is a tensor subclass, so its calls take the numpy view (not _plain_args).
_CALLS = {
    "allreduce_async_": (
        torch.ones,
        lambda t: hvd.allreduce_async_(t, op=hvd.Sum, prescale_factor=2.0),
        None,
    ),
    "allreduce_async_ Parameter": (
        lambda n: torch.nn.Parameter(torch.ones(n), requires_grad=False),
        lambda t: hvd.allreduce_async_(t, op=hvd.Sum, prescale_factor=2.0),
        None,
    ),
    "allreduce_async": (torch.ones, lambda t: hvd.allreduce_async(t, op=hvd.Sum), 1.0),
    "allreduce_async Parameter": (
        lambda n: torch.nn.Parameter(torch.ones(n)),
        lambda t: hvd.allreduce_async(t, op=hvd.Sum),
        1.0,
    ),
    "allgather_async": (torch.ones, hvd.allgather_async, 1.0),
    "grouped_allgather_async": (torch.ones, lambda t: hvd.grouped_allgather_async([t]), 1.0),
    "broadcast_async": (torch.ones, lambda t: hvd.broadcast_async(t, 0), 1.0),
    "alltoall_async": (torch.ones, hvd.alltoall_async, 1.0),
    "reducescatter_async": (
        torch.ones,
        lambda t: hvd.reducescatter_async(t, op=hvd.Sum, prescale_factor=3.0),
        3.0,
    ),
    "grouped_reducescatter_async": (
        torch.ones,
        lambda t: hvd.grouped_reducescatter_async([t], op=hvd.Sum),
        1.0,
    ),
    "grouped_allreduce_async": (torch.ones, lambda t: hvd.grouped_allreduce_async([t], op=hvd.Sum), 1.0),
}


@pytest.mark.parametrize("how", ["set_", ".data ="])
@pytest.mark.parametrize("call", list(_CALLS))
def test_memory_in_flight_outlives_a_tensor_given_other_memory(initialized, call, how):
    """An in-place call writes the tensor's old memory, not the fresh tensors put where it would
    have been freed; an out-of-place call reads the old values (1), not those fresh tensors' (7).
    With the by-address route holding the tensor instead of its storage, the process crashes. The
    numpy view's case guards torch's numpy(), which holds an alias it makes itself."""
    make, start, expect = _CALLS[call]
    t = make(N)
    with ops.held(basics._engine()):
        h = start(t)
        _renew(t, how)
        gc.collect()
        others = [torch.full((N,), 7.0) for _ in range(8)]
    out = hvd.synchronize(h)
    assert all(bool((o == 7.0).all()) for o in others)
    assert bool((t == 0.0).all())  # the new memory is not the call's
    if expect is not None:
        out = out[0] if isinstance(out, list) else out
        assert out.shape == (N,) and bool((out == expect).all()), out[:4]


def test_a_tensor_whose_memory_holds_minus_its_values_gives_its_values(initialized):
    """Out of place, each collective reads the tensor's values, not its memory's; in place, the
    result is written back as values (the complex tensor behind it changes accordingly)."""
    z = torch.tensor([1 + 2j])
    n = z.conj().imag  # contiguous, one element: -2 held as 2
    assert n.is_neg() and n.is_contiguous() and n.tolist() == [-2.0]
    outs = {
        "allreduce": hvd.allreduce(n, op=hvd.Sum, prescale_factor=2.0),
        "grouped_allreduce": hvd.grouped_allreduce([n], op=hvd.Sum)[0],
        "allgather": hvd.allgather(n),
        "broadcast": hvd.broadcast(n, 0),
        "alltoall": hvd.alltoall(n),
        "reducescatter": hvd.reducescatter(n, op=hvd.Sum),
    }
    assert {k: v.tolist() for k, v in outs.items()} == {
        "allreduce": [-4.0],
        "grouped_allreduce": [-2.0],
        "allgather": [-2.0],
        "broadcast": [-2.0],
        "alltoall": [-2.0],
        "reducescatter": [-2.0],
    }
    assert hvd.allreduce_(n, op=hvd.Sum, prescale_factor=3.0) is n and n.tolist() == [-6.0]
    assert z.tolist() == [1 + 6j]
    hvd.synchronize(hvd.allreduce_async_(n, op=hvd.Sum, prescale_factor=0.5))
    assert n.tolist() == [-3.0] and z.tolist() == [1 + 3j]
    hvd.grouped_allreduce_([n], op=hvd.Sum, postscale_factor=2.0)
    assert n.tolist() == [-6.0] and z.tolist() == [1 + 6j]
    assert hvd.broadcast_(n, 0) is n and n.tolist() == [-6.0]
