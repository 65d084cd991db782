"""hvd_lite.torch's quick route (mpi_ops._plain_args: a tensor's memory to the engine by address)
against its full route (the tensor's numpy view through the numpy API's checks): it takes only
tensors and arguments the full route accepts, and gives the engine the same ones."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import route_matrix  # noqa: E402

import hvd_lite as hvd  # noqa: E402
from hvd_lite import basics, ops  # noqa: E402
from hvd_lite.torch import mpi_ops  # noqa: E402


@pytest.fixture
def initialized():
    hvd.init()
    yield
    hvd.shutdown()


def _tensors():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    grad = torch.ones(3, requires_grad=True)
    return {
        "float32": base,
        "float64": torch.ones(5, dtype=torch.float64),
        "int8": torch.ones(3, dtype=torch.int8),
        "uint16": torch.ones(3, dtype=torch.uint16),
        "bfloat16": torch.ones(3, dtype=torch.bfloat16),
        "float16": torch.ones(3, dtype=torch.float16),
        "0-d": torch.tensor(2.0),
        "empty": torch.ones(0),
        "bool": torch.ones(3, dtype=torch.bool),
        "complex": torch.ones(3, dtype=torch.complex64),
        "transposed": base.t(),
        "strided": base[:, 1],
        "offset view": base[1],
        "requires grad": grad,
        "parameter": torch.nn.Parameter(torch.ones(3)),
        "sparse": torch.ones(3).to_sparse(),
        "17 dims": torch.ones((1,) * 17),
        "meta": torch.ones(3, device="meta"),
        "channels last": torch.ones(1, 2, 3, 3).to(memory_format=torch.channels_last),
        "numpy": np.ones(3, np.float32),
        "negative view": torch.tensor(1 + 2j).conj().imag,
        "zero tensor": torch._efficientzerotensor(3),
    }


_OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product, ops.ReduceOp.Adasum, 1, None]
_FACTORS = [1.0, 0.5, 1, True, np.float32(1.0)]
_NAMES = [None, "loss", "x" * 128, "a\0b", 3]


def _full(tensor, inplace, op, pre, post, name):
    """What the full route gives the engine (its numpy view's checked request), or its error."""
    try:
        fn = "allreduce_" if inplace else "allreduce"
        cpu = mpi_ops.cpu_inplace(fn, tensor) if inplace else mpi_ops.cpu_input(fn, tensor)
        array = mpi_ops.numpy_view(cpu)
        where = basics.set_for(fn, None)
        return array, ops.checked_request(fn, array, inplace, op, pre, post, name, where)
    except Exception as exc:  # pylint: disable=broad-except
        return exc


def _same(quick, full, tensor, inplace):
    assert isinstance(full, tuple), f"the quick route took a tensor the full one refuses: {full!r}"
    array, request = full
    owner, address, nbytes = quick.send
    assert isinstance(owner, torch.UntypedStorage) and owner.data_ptr() <= address
    assert address == tensor.data_ptr() == array.ctypes.data
    assert nbytes == array.nbytes
    if inplace:
        assert quick.recv is quick.send
    else:
        out, out_address, out_bytes = quick.recv
        assert out is not tensor and out.is_contiguous() and out_address == out.data_ptr()
        assert (out.shape, out.dtype, out_bytes) == (tensor.shape, tensor.dtype, nbytes)
    if request.auto is not None:
        assert quick.name is None and request.auto == ops._KIND
    route_matrix.assert_same_past_buffers(quick, request.submission, unnamed=request.auto is not None)


def test_the_quick_route_takes_only_what_the_full_one_accepts_and_gives_the_same_args(initialized):
    taken = route_matrix.taken(
        _tensors(),
        _OPS,
        _FACTORS,
        _NAMES,
        mpi_ops._plain_args,
        lambda quick, tensor, inplace, *call: _same(quick, _full(tensor, inplace, *call), tensor, inplace),
    )
    # The common calls take it (else this test would pass with a route never taken), and the ones
    # it must leave to the full route (a copy, a view of another dtype, an error) do not.
    for label in (
        "float32",
        "float64",
        "int8",
        "uint16",
        "bfloat16",
        "float16",
        "0-d",
        "offset view",
        "requires grad",
    ):
        for inplace in (True, False):
            assert (label, inplace, hvd.Sum, 1.0, 1.0, None) in taken, label
    assert ("float32", True, hvd.Sum, 0.5, 1.0, None) in taken
    assert ("float32", False, hvd.Sum, 1.0, 1.0, "loss") in taken
    for label in (
        "transposed",
        "strided",
        "parameter",
        "sparse",
        "meta",
        "channels last",
        "empty",
        "bool",
        "complex",
        "17 dims",
        "numpy",
        "negative view",
        "zero tensor",
    ):
        assert not any(t[0] == label for t in taken), label


def test_the_quick_route_declines_while_an_adapter_fault_is_armed(initialized):
    t = torch.ones(3)
    assert mpi_ops._plain_args(t, True, hvd.Sum, 1.0, 1.0, None) is not None
    basics.inject_fault("adapter")
    assert mpi_ops._plain_args(t, True, hvd.Sum, 1.0, 1.0, None) is None


def test_a_tensor_given_by_address_is_written_by_every_call(initialized):
    """One rank: Sum with a prescale of 2 doubles each value, so the engine must have written the
    tensor's own memory (in place) or the new tensor (out of place), one by one and in groups;
    the engine holds the tensor until the call completes (test_plain_args.py counts the
    references of such an owner)."""
    import hvd_lite.torch as hvd_torch

    t = torch.arange(4, dtype=torch.float32)
    assert hvd_torch.allreduce_(t, op=hvd_torch.Sum, prescale_factor=2.0) is t
    assert t.tolist() == [0.0, 2.0, 4.0, 6.0]
    out = hvd_torch.allreduce(t, op=hvd_torch.Sum, postscale_factor=0.5)
    assert out is not t and out.tolist() == [0.0, 1.0, 2.0, 3.0] and t.tolist()[1] == 2.0
    h = hvd_torch.allreduce_async_(torch.full((3,), 1.5), op=hvd_torch.Sum, prescale_factor=2.0)
    assert hvd_torch.synchronize(h).tolist() == [3.0, 3.0, 3.0]
    ts = [torch.ones(2), torch.ones(3, dtype=torch.float64)]
    outs = hvd_torch.grouped_allreduce(ts, op=hvd_torch.Sum, prescale_factor=3.0)
    assert [o.tolist() for o in outs] == [[3.0] * 2, [3.0] * 3] and ts[0].tolist() == [1.0, 1.0]
    assert [o.dtype for o in outs] == [torch.float32, torch.float64]
