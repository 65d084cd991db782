"""hvd_lite.allreduce under mpirun at 1-4 ranks: exact values, bitwise identity, the ring's
boundaries (tiny forced segments) and both sides of the small-message crossover. Tests that pin the
ring or the latency path turn the shared-memory path off (tests/parallel/test_shm.py has its own)."""

import ml_dtypes
import numpy as np
import pytest
from conftest import agree, everywhere, raises_before_submitting, raises_on_every_rank, reinit, world
from helpers import ALL_DTYPES, exact_inputs, fold, same_bits

import hvd_lite as hvd

pytestmark = pytest.mark.mpi

OPS = {"sum": hvd.Sum, "prod": hvd.Product, "max": hvd.Max, "min": hvd.Min, "avg": hvd.Average}


def counts_for(n: int, seg_elems: int = 4):
    """Counts that cross every boundary: 0, 1, n±1, primes, segment edges of each chunk."""
    base = {0, 1, max(n - 1, 0), n + 1, 7, 13, 101, 1009, 4099}
    for k in (1, 2, 3):
        for c in (k * seg_elems * n, k * seg_elems * n - 1, k * seg_elems * n + 1):
            base.add(c)
    return sorted(base)


def check_exact(dtype, op, count, seed=0, inplace=False):
    n, r = hvd.size(), hvd.rank()
    x = exact_inputs(dtype, count, r, seed)
    want = fold([exact_inputs(dtype, count, q, seed) for q in range(n)], op, dtype)
    if inplace:
        got = x.copy()
        agree(hvd.allreduce_(got, op=OPS[op]) is got, "allreduce_ did not return its array")
    else:
        got = hvd.allreduce(x, op=OPS[op])
        agree(same_bits(x, exact_inputs(dtype, count, r, seed)), "input was modified")
    agree(same_bits(got, want), f"{np.dtype(dtype).name} {op} count={count}: got {got[:6]}, want {want[:6]}")


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_exact_results_every_dtype_and_op(dtype, op):
    for count in (0, 1, 5, 1000, 100_003):
        check_exact(dtype, op, count)


# The ring or the latency path forced, or the selector's choice (test_allreduce_algorithms.py forces
# the others, test_shm.py the shared-memory paths).
PATHS = {
    "ring": {"HVD_LITE_ALLREDUCE_ALGO": "ring"},
    "latency-path": {"HVD_LITE_ALLREDUCE_ALGO": "small"},
    "default": {},
}


@pytest.mark.parametrize("path", ["ring", "latency-path"])
def test_tiny_segments_cross_every_boundary(path):
    with reinit(HVD_LITE_SEGMENT_BYTES=16, **PATHS[path]):
        for dtype in (np.float32, np.int8, np.float64, ml_dtypes.bfloat16):
            seg_elems = max(16 // np.dtype(dtype).itemsize, 1)
            for count in counts_for(hvd.size(), seg_elems):
                check_exact(dtype, "sum", count, seed=count)
                check_exact(dtype, "avg", count, seed=count, inplace=True)


@pytest.mark.parametrize("path", list(PATHS))
def test_every_rank_gets_bitwise_identical_results(path):
    with reinit(HVD_LITE_SEGMENT_BYTES=4096, **PATHS[path]):
        rng = np.random.default_rng(100 + hvd.rank())
        for count in (3, 1000, 33_333, 1 << 20):
            # order-dependent float sums: identity must not depend on luck
            x = (rng.standard_normal(count) * 10.0 ** rng.integers(-6, 6, count)).astype(np.float32)
            out = hvd.allreduce(x, op=hvd.Sum)
            inplace = x.copy()
            hvd.allreduce_(inplace, op=hvd.Sum)
            again = hvd.allreduce(x, op=hvd.Sum)
            everyone = world().allgather(out.tobytes())
            agree(all(b == everyone[0] for b in everyone), f"count {count}: ranks differ")
            agree(same_bits(out, inplace), f"count {count}: in-place differs from out-of-place")
            agree(same_bits(out, again), f"count {count}: a rerun differs")


def test_ring_and_latency_path_agree_on_exact_inputs():
    results = []
    for path in ("ring", "latency-path"):
        with reinit(HVD_LITE_SEGMENT_BYTES=64, **PATHS[path]):
            x = exact_inputs(np.float32, 4097, hvd.rank())
            results.append(hvd.allreduce(x, op=hvd.Sum))
    agree(same_bits(results[0], results[1]), "ring and latency path differ")


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_misaligned_buffers(dtype):
    dt = np.dtype(dtype)
    for count in (5, 3001, 70_001):
        raw = bytearray(count * dt.itemsize + 3)
        x = np.frombuffer(raw, dtype=dt, count=count, offset=3)
        x[...] = exact_inputs(dt, count, hvd.rank())
        want = fold([exact_inputs(dt, count, q) for q in range(hvd.size())], "sum", dt)
        agree(same_bits(hvd.allreduce(x, op=hvd.Sum), want), f"out-of-place count {count}")
        hvd.allreduce_(x, op=hvd.Sum)
        agree(same_bits(x.copy(), want), f"in-place count {count}")


def test_average_is_sum_divided_by_size_with_scale_factors():
    n = hvd.size()
    x = np.full(10, 2.0 * (hvd.rank() + 1), np.float64)
    got = hvd.allreduce(x, prescale_factor=0.5, postscale_factor=3.0)
    want = np.full(10, 3.0 * sum(q + 1 for q in range(n)) / n)
    agree(np.array_equal(got, want), f"got {got[:3]}, want {want[:3]}")


def test_integer_sums_wrap_across_ranks():
    n = hvd.size()
    x = np.full(7, 100, np.int8)
    got = hvd.allreduce(x, op=hvd.Sum)
    want = np.array([(100 * n + 128) % 256 - 128] * 7, np.int8)
    agree(np.array_equal(got, want), f"got {got}, want {want}")


def test_shapes_are_kept():
    x = exact_inputs(np.float32, 2 * 3 * 5, hvd.rank()).reshape(2, 3, 5)
    got = hvd.allreduce(x, op=hvd.Max)
    agree(got.shape == (2, 3, 5) and got.dtype == np.float32, f"shape {got.shape}")


def test_topology_on_one_host():
    n, r = hvd.size(), hvd.rank()
    agree(
        (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == (r, n, 0, 1),
        f"topology {(hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())}",
    )
    agree(hvd.mpi_threads_supported(), "MPI_THREAD_MULTIPLE not provided")


# A later entry that every rank refuses, by kind: (exception, message, entry).
BAD_LATER_ENTRIES = {
    "not-an-array": (TypeError, "expects a numpy.ndarray or a cupy.ndarray, got list", [1.0, 2.0]),
    "unsupported-dtype": (TypeError, "unsupported dtype complex64", np.ones(3, np.complex64)),
    "bool": (TypeError, "bool arrays cannot be reduced", np.ones(3, np.bool_)),
    "not-contiguous": (ValueError, "not C-contiguous", np.ones((4, 4), np.float32)[:, ::2]),
    "too-many-dimensions": (ValueError, "more than 16 dimensions", np.ones((1,) * 17, np.float32)),
}


@pytest.mark.parametrize("bad", list(BAD_LATER_ENTRIES))
@pytest.mark.parametrize(
    "call", ["grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_"]
)
def test_a_grouped_allreduce_with_a_bad_later_entry_raises_everywhere_and_submits_nothing(call, bad):
    n, r = hvd.size(), hvd.rank()
    exc_type, match, entry = BAD_LATER_ENTRIES[bad]
    good = [np.full(3, float(r + 1), np.float32), np.ones(2, np.float32)]
    raises_before_submitting(
        exc_type, match, lambda: getattr(hvd, call)(good + [entry], op=hvd.Sum, name="bad.later")
    )
    agree(np.array_equal(good[0], np.full(3, float(r + 1))), f"the first entry changed: {good[0]}")
    # the same names again: nothing of the refused call is in flight, and the engine still works
    outs = hvd.grouped_allreduce(good, op=hvd.Sum, name="bad.later")
    agree(
        np.array_equal(outs[0], np.full(3, n * (n + 1) / 2))
        and np.array_equal(outs[1], np.full(2, float(n))),
        f"after the refused call: {outs}",
    )


def test_init_with_an_mpi4py_communicator():
    comm = world()
    half = comm.Split(color=comm.rank % 2, key=comm.rank)
    hvd.shutdown()
    try:
        hvd.init(comm=half)
        ok = hvd.size() == half.size and hvd.rank() == half.rank
        got = hvd.allreduce(np.array([comm.rank], np.int64), op=hvd.Sum)
        want = sum(q for q in range(comm.size) if q % 2 == comm.rank % 2)
        agree(ok and got[0] == want, f"size {hvd.size()} sum {got}")
    finally:
        hvd.shutdown()
        half.Free()
        hvd.init()


def test_init_with_a_list_of_ranks():
    comm = world()
    members = list(range(0, comm.size, 2))
    hvd.shutdown()
    try:
        with everywhere("init(comm=a list of ranks)"):
            if comm.rank in members:
                hvd.init(comm=members)
                try:
                    size = hvd.size()
                    got = hvd.allreduce(np.array([comm.rank], np.int32), op=hvd.Sum)
                finally:
                    hvd.shutdown()
                assert size == len(members) and got[0] == sum(members), f"size {size}, got {got}"
            else:
                with pytest.raises(ValueError, match="not in the list of ranks"):
                    hvd.init(comm=members)
    finally:
        hvd.init()


def test_c_api_invalid_argument_leaves_the_communicator_usable():
    from hvd_lite import _core

    comm = _core.Comm()
    try:
        x = np.zeros(10, np.float32)
        raises_on_every_rank(
            hvd.InvalidArgumentError,
            "overlap without being identical",
            lambda: comm.allreduce(x[0:8], x[1:9], _core.hvdlFloat32, _core.hvdlSum),
        )
        y = np.full(5, 1.0, np.float32)
        out = np.empty_like(y)
        comm.allreduce(y, out, _core.hvdlFloat32, _core.hvdlSum)
        agree(np.array_equal(out, np.full(5, float(hvd.size()))), f"after an invalid call: {out}")
    finally:
        comm.destroy()
