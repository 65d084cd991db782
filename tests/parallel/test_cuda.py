"""Device buffers (CUDA) under mpirun: the CUDA reduction kernels against the host's, and the C
API's all-reduce and broadcast on CuPy arrays and torch.cuda tensors (the staged path through
pinned host memory) against the same calls on host memory, bit for bit, at every rank count.

Skipped, with the reason, where the build has no CUDA, no device is seen or CuPy is missing
(CI has no GPU). On a GPU machine (docs/gpu.md):

    mpirun -np 2 python -m pytest -q --with-mpi tests/parallel/test_cuda.py
"""

import re
import zlib

import numpy as np
import pytest
from conftest import agree, device_tests, make_comm, raised, world
from helpers import ALL_DTYPES, exact_inputs, fold, random_bits, same_bits, same_or_both_nan, to_device

import hvd_lite as hvd
from hvd_lite import _core
from hvd_lite.ops import HVDL_DTYPES

cupy, pytestmark = device_tests()

OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
STAGE = 4 << 20  # cuda.h's HVDL_CUDA_STAGE_BYTES: a count above it crosses a chunk boundary


def code(dtype) -> int:
    return HVDL_DTYPES[np.dtype(dtype)]


def to_host(d, like: np.ndarray) -> np.ndarray:
    return cupy.asnumpy(d).view(like.dtype)


def digest(a: np.ndarray) -> int:
    return zlib.crc32(a.tobytes())


@pytest.fixture(scope="module")
def comm():
    cupy.cuda.Device(0).use()
    with make_comm() as c:
        yield c


# ---- the kernels ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_cuda_kernels_give_the_host_kernels_bits(dtype):
    n = 100_003
    bad = []
    for op in range(4):
        a, b = random_bits(dtype, n, 1 + op), random_bits(dtype, n, 11 + op)
        want = np.empty_like(a)
        _core.reduce_local(want, a, b, code(dtype), op)
        d = to_device(np.zeros_like(a))
        _core.reduce_local(d, to_device(a), to_device(b), code(dtype), op)
        if not same_or_both_nan(to_host(d, a), want):
            bad.append(op)
    for divisor in (2, 3, 7):
        a = random_bits(dtype, n, 100 + divisor)
        want = a.copy()
        _core.divide_local(want, code(dtype), divisor)
        d = to_device(a)
        _core.divide_local(d, code(dtype), divisor)
        if not same_or_both_nan(to_host(d, a), want):
            bad.append(f"divide by {divisor}")
    agree(not bad, f"{np.dtype(dtype).name}: differs from the host for {bad}")


# ---- the C API on device memory -------------------------------------------------------------


def counts_for(dtype):
    item = np.dtype(dtype).itemsize
    return [1, 7, 1000, 65_537, STAGE // item + 5]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_device_allreduce_gives_the_host_allreduce_bits_on_every_rank(comm, dtype):
    r = hvd.rank()
    bad = []
    for count in counts_for(dtype):
        for opname, op in OPS.items():
            x = exact_inputs(dtype, count, r, seed=count + op)
            host = np.empty_like(x)
            comm.allreduce(x, host, code(dtype), op)
            for inplace in (False, True):
                send = to_device(x)
                recv = send if inplace else to_device(np.zeros_like(x))
                comm.allreduce(send, recv, code(dtype), op)
                cupy.cuda.get_current_stream().synchronize()
                got = to_host(recv, x)
                if not same_bits(got, host):
                    bad.append((count, opname, inplace))
            want = fold(
                [exact_inputs(dtype, count, k, seed=count + op) for k in range(hvd.size())], opname, dtype
            )
            if not same_bits(host, want):
                bad.append((count, opname, "host against the fold"))
    agree(not bad, f"{np.dtype(dtype).name}: {bad[:5]}")
    digests = world().allgather(digest(got))
    agree(len(set(digests)) == 1, f"ranks differ: {digests}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64], ids=lambda d: np.dtype(d).name)
def test_a_device_broadcast_gives_every_rank_the_roots_bytes(comm, dtype):
    r = hvd.rank()
    bad = []
    for count in counts_for(dtype):
        for root in range(hvd.size()):
            x = exact_inputs(dtype, count, r, seed=count)
            want = exact_inputs(dtype, count, root, seed=count)
            for inplace in (False, True):
                send = to_device(x)
                recv = send if inplace else to_device(np.zeros_like(x))
                comm.broadcast(send if inplace or r == root else None, recv, code(dtype), root)
                cupy.cuda.get_current_stream().synchronize()
                if not same_bits(to_host(recv, x), want):
                    bad.append((count, root, inplace))
    agree(not bad, f"{np.dtype(dtype).name}: {bad[:5]}")


def test_the_staged_copies_follow_the_work_queued_before_them_on_the_arrays_stream(comm):
    """The copies run on the stream the array names (CuPy's current one), after the kernels
    queued there: a sum of doubled values, not of the values before doubling."""
    n = 8 << 20
    stream = cupy.cuda.Stream(non_blocking=True)
    bad = []
    for trial in range(3):
        with stream:
            x = cupy.full(n, hvd.rank() + 1, dtype=cupy.float32)
            for _ in range(20):  # long enough that a copy on another stream would race it
                x *= 1.0
            x *= 2.0
            comm.allreduce(x, x, code(np.float32), OPS["sum"])
        stream.synchronize()
        want = float(sum(2 * (k + 1) for k in range(hvd.size())))
        got = cupy.asnumpy(x)
        if not np.all(got == want):
            bad.append((trial, np.unique(got)[:4].tolist()))
    agree(not bad, f"{bad}")


def test_torch_cuda_tensors_go_through_the_same_path(comm):
    torch = pytest.importorskip("torch")
    r = hvd.rank()
    x = exact_inputs(np.float32, 300_001, r, seed=5)
    t = torch.from_numpy(x).cuda()
    out = torch.zeros_like(t)
    comm.allreduce(t, out, code(np.float32), OPS["sum"])
    torch.cuda.synchronize()
    want = fold([exact_inputs(np.float32, 300_001, k, seed=5) for k in range(hvd.size())], "sum", np.float32)
    agree(same_bits(out.cpu().numpy(), want))


def test_device_buffers_are_refused_where_the_c_api_does_not_take_them(comm):
    n = hvd.size()
    d = cupy.zeros(4 * n, dtype=cupy.float32)
    err = raised(lambda: comm.allgather(d[:4], d, code(np.float32)))
    agree(
        isinstance(err, ValueError)
        and re.search(
            r"sendbuf is in CUDA memory \(device \d+\): this call takes host memory "
            "only",
            str(err),
        ),
        repr(err),
    )
    err = raised(lambda: comm.allreduce(d, np.zeros(4 * n, np.float32), code(np.float32), 0))
    agree(
        isinstance(err, hvd.InvalidArgumentError)
        and re.search(r"sendbuff is in CUDA device \d+ memory and recvbuff in host memory", str(err)),
        repr(err),
    )
    # ... and the communicator still works
    x = cupy.ones(5, dtype=cupy.float32)
    comm.allreduce(x, x, code(np.float32), 0)
    agree(bool(cupy.all(x == n)))


def test_the_descriptor_reads_cupy_and_torch_cuda_memory():
    torch = pytest.importorskip("torch")
    c = cupy.arange(6, dtype=cupy.float32)
    d = _core.describe_buffer(c)
    ok = (
        d["address"] == c.data.ptr
        and d["nbytes"] == 24
        and d["dtype"] == code(np.float32)
        and d["device_type"] == 2
        and d["device_id"] == 0
    )
    t = torch.zeros(3, dtype=torch.bfloat16, device="cuda")
    e = _core.describe_buffer(t)  # bfloat16 has no typestr: through DLPack
    ok = ok and e["dtype"] == code(np.dtype("bfloat16")) and e["device_type"] == 2
    agree(ok, f"{d} {e}")
