"""The engine on device memory under mpirun: hvd.allreduce and hvd.broadcast on CuPy arrays and
hvd_lite.torch's allreduce on CUDA tensors run on the device (cuda.c's staged form, on the
producer's stream; the engine counts them in stats()['device_steps']) and give the host calls'
bits on every rank; scaling (prescale, postscale, integer Average) by the device's kernel gives
the host kernel's bits; work queued on the array's stream comes first; ranks that disagree on
where the data is get a mismatch error; a joined rank's host stand-in matches the device ranks'
chunks.

Skipped, with the reason, where the build has no CUDA, no device is seen or CuPy is missing
(CI has none). On a GPU machine (README, "GPUs"):

    mpirun -np 2 python -m pytest -q --with-mpi tests/parallel/test_cuda_engine.py
"""
import numpy as np
import pytest

import hvd_lite as hvd
from conftest import agree, raised, world
from helpers import ALL_DTYPES, exact_inputs, same_bits
from hvd_lite import _core, basics
from hvd_lite.ops import HVDL_DTYPES

pytestmark = pytest.mark.mpi

if not _core.build_info()["cuda"]:
    pytest.skip("this build has no CUDA (build_info()['cuda'] is False)", allow_module_level=True)
if _core.cuda_device_count() == 0:
    pytest.skip("no CUDA device is seen", allow_module_level=True)
cupy = pytest.importorskip("cupy", reason="CuPy is not installed")

STAGE = 4 << 20  # cuda.h's HVDL_CUDA_STAGE_BYTES
# CuPy's dtypes among the engine's (CuPy has no bfloat16: hvd_lite.torch's test covers it).
CUPY_DTYPES = [d for d in ALL_DTYPES if np.dtype(d).name != "bfloat16"]
OPS = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product, hvd.Average]


def device_steps() -> int:
    return basics._engine().stats()["device_steps"]


def code(dtype) -> int:
    return HVDL_DTYPES[np.dtype(dtype)]


# ---- the scale kernel -------------------------------------------------------------------------

def random_bits(dtype, n, seed):
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt)


def as_device(a: np.ndarray):
    """A CuPy array with a's bytes (16-bit types as uint16: CuPy has no bfloat16)."""
    return cupy.asarray(a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize == 2 else a)


def same_or_both_nan(got: np.ndarray, want: np.ndarray) -> bool:
    if got.dtype.kind in "iu":
        return same_bits(got, want)
    with np.errstate(invalid="ignore"):
        g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    return bool(np.array_equal(np.isnan(g), nan)) and same_bits(got[~nan], want[~nan])


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_cuda_scale_kernel_gives_the_host_bits(dtype):
    """Every bit pattern, factors that round, truncate, clamp (1e30) and flip signs."""
    n, bad = 50_003, []
    for k, factor in enumerate((0.5, 1 / 3, 3.0, -2.5, 1e30, float("nan"), 1.0)):
        src = random_bits(dtype, n, 7 + k)
        want = np.empty_like(src)
        _core.scale_local(want, src, code(dtype), factor)
        d = as_device(np.zeros_like(src))
        _core.scale_local(d, as_device(src), code(dtype), factor)
        if not same_or_both_nan(cupy.asnumpy(d).view(src.dtype), want):
            bad.append(factor)
    agree(not bad, f"{np.dtype(dtype).name}: differs from the host for factors {bad}")


# ---- the numpy API on CuPy arrays ----------------------------------------------------------

@pytest.mark.parametrize("dtype", CUPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_allreduce_of_cupy_arrays_runs_on_the_device_with_the_host_bits(dtype):
    r, bad = hvd.rank(), []
    before = device_steps()
    calls = 0
    for count in (1, 1000, STAGE // np.dtype(dtype).itemsize + 3):
        for op in OPS:
            x = exact_inputs(dtype, count, r, seed=count)
            want = hvd.allreduce(x, op=op, name="host")
            out = hvd.allreduce(cupy.asarray(x), op=op, name="dev")
            inplace = cupy.asarray(x)
            back = hvd.allreduce_(inplace, op=op, name="dev_")
            calls += 2
            if not (isinstance(out, cupy.ndarray) and out.dtype == x.dtype and back is inplace
                    and same_bits(cupy.asnumpy(out), want)
                    and same_bits(cupy.asnumpy(inplace), want)):
                bad.append((count, op.name))
    steps = device_steps() - before
    agree(not bad and steps == calls, f"differs from the host for {bad}; device steps {steps} "
                                      f"of {calls}")


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.float16, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_scale_factors_and_integer_average_on_the_device_give_the_host_bits(dtype):
    r, n, bad = hvd.rank(), hvd.size(), []
    x = exact_inputs(dtype, 4099, r, seed=3)
    for op, pre, post in ((hvd.Sum, 0.5, 1.0), (hvd.Sum, 1.0, 3.0), (hvd.Sum, 0.25, 2.5),
                          (hvd.Average, 1.0, 1.0), (hvd.Average, 2.0, 0.5)):
        want = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post, name="h")
        got = hvd.allreduce(cupy.asarray(x), op=op, prescale_factor=pre, postscale_factor=post,
                            name="d")
        if not same_bits(cupy.asnumpy(got), want):
            bad.append((op.name, pre, post))
    agree(not bad, f"{np.dtype(dtype).name} at {n} ranks: differs for {bad}")


def test_broadcast_of_cupy_arrays_from_every_root_on_the_device():
    r, n, bad = hvd.rank(), hvd.size(), []
    before = device_steps()
    for root in range(n):
        for count in (5, STAGE // 4 + 1):
            x = np.arange(count, dtype=np.float32) + 1000 * r
            want = np.arange(count, dtype=np.float32) + 1000 * root
            out = hvd.broadcast(cupy.asarray(x), root_rank=root, name="bc")
            d = cupy.asarray(x)
            back = hvd.broadcast_(d, root_rank=root, name="bc_")
            if not (back is d and same_bits(cupy.asnumpy(out), want)
                    and same_bits(cupy.asnumpy(d), want)):
                bad.append((root, count))
    steps = device_steps() - before
    agree(not bad and steps == 4 * n, f"wrong for (root, count) {bad}; device steps {steps}")


def test_work_queued_on_the_arrays_stream_comes_before_the_reduction():
    """The data is written by a long kernel chain on a non-default stream that the call is made
    on; nothing waits for it on the host. The engine's copies queue behind it."""
    r, n = hvd.rank(), hvd.size()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.zeros(1 << 20, cupy.float32)
        big = cupy.ones(1 << 26, cupy.float32)
        for _ in range(20):
            big *= 1.0
        x[...] = big[: x.size] * (r + 1)
        out = hvd.allreduce(x, op=hvd.Sum, name="stream")
        hvd.allreduce_(x, op=hvd.Sum, name="stream_")
        got, got_ = cupy.asnumpy(out, stream=s), cupy.asnumpy(x, stream=s)
    s.synchronize()
    want = np.full(1 << 20, n * (n + 1) / 2, np.float32)
    agree(same_bits(got, want) and same_bits(got_, want), f"got {got[:3]} and {got_[:3]}")


def test_grouped_cupy_and_host_arrays_each_reduce_right():
    """Device requests go alone; the host ones of the same round still fuse among themselves."""
    r, n = hvd.rank(), hvd.size()
    arrays = [np.full(10, r + 1.0, np.float32), cupy.full(10, r + 1.0, cupy.float32),
              np.full(3, r + 2.0, np.float32), cupy.full(STAGE // 4 + 7, r + 1.0, cupy.float32)]
    outs = hvd.grouped_allreduce(arrays, op=hvd.Sum, name="mixed")
    host = [o if isinstance(o, np.ndarray) else cupy.asnumpy(o) for o in outs]
    sums = [n * (n + 1) / 2, n * (n + 1) / 2, n * (n + 3) / 2, n * (n + 1) / 2]
    ok = all(np.array_equal(h, np.full(h.shape, s, np.float32)) for h, s in zip(host, sums))
    kinds = [type(o).__module__.split(".")[0] for o in outs]
    agree(ok and kinds == ["numpy", "cupy", "numpy", "cupy"], f"{kinds}: {[h[:2] for h in host]}")


@pytest.mark.mpi(min_size=2)
def test_ranks_that_disagree_on_where_the_data_is_all_get_a_mismatch_error():
    r = hvd.rank()
    x = np.ones(8, np.float32)
    err = raised(lambda: hvd.allreduce(cupy.asarray(x) if r == 0 else x, name="where"))
    agree(isinstance(err, hvd.HvdLiteError) and "Mismatched ALLREDUCE memory" in str(err)
          and "CUDA device memory" in str(err) and "host memory" in str(err), repr(err))
    y = hvd.allreduce(cupy.full(3, 2.0), op=hvd.Sum, name="after.where")
    agree(np.array_equal(cupy.asnumpy(y), np.full(3, 2.0 * hvd.size())), "engine after it")


@pytest.mark.mpi(min_size=2)
def test_a_joined_ranks_stand_in_matches_the_device_ranks_chunks():
    """The last rank joins while the others reduce a CuPy array over two staging chunks: its
    zeros (host memory) go through the host algorithm chunk by chunk, as theirs do."""
    r, n = hvd.rank(), hvd.size()
    count = STAGE // 4 * 2 + 11
    out = None
    if r < n - 1:
        out = hvd.allreduce(cupy.full(count, r + 1.0, cupy.float32), op=hvd.Sum, name="joined")
    last = hvd.join()  # the last rank to join: one of the others, the same on every rank
    lasts = world().allgather(last)
    want = np.full(count, (n - 1) * n / 2, np.float32)
    agree((out is None or same_bits(cupy.asnumpy(out), want)) and len(set(lasts)) == 1
          and 0 <= last < n - 1, f"got {None if out is None else cupy.asnumpy(out)[:3]}, "
                                 f"join {lasts}")


def test_the_calls_that_take_host_memory_refuse_a_cupy_array_with_a_type_error():
    err = raised(lambda: hvd.allgather(cupy.ones(4)))
    agree(isinstance(err, TypeError) and "cupy.asnumpy" in str(err), repr(err))
