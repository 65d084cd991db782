"""The engine on device memory under mpirun: hvd.allreduce and hvd.broadcast on CuPy arrays and
hvd_lite.torch's allreduce on CUDA tensors run on the device (alone: cuda.c's staged form, on the
producer's stream; fused: through a pinned host buffer, each member's copies on its own stream;
the engine counts them in stats()['device_steps']) and give the host calls' bits on every rank;
scaling (prescale, postscale, integer Average) gives the host's bits (the device's kernel alone,
the host's in a fused group); work queued on the array's stream comes first; ranks that disagree
on where the data is get a mismatch error; a joined rank's host stand-ins match the device ranks'
steps, alone and fused.

Skipped, with the reason, where the build has no CUDA, no device is seen or CuPy is missing
(CI has none). On a GPU machine (docs/gpu.md):

    mpirun -np 2 python -m pytest -q --with-mpi tests/parallel/test_cuda_engine.py
"""

import numpy as np
import pytest
from conftest import agree, device_tests, raised, world
from helpers import ALL_DTYPES, exact_inputs, random_bits, same_bits, same_or_both_nan, to_device

import hvd_lite as hvd
from hvd_lite import _core, basics
from hvd_lite._submit import held
from hvd_lite.ops import HVDL_DTYPES

cupy, pytestmark = device_tests()

STAGE = 4 << 20  # cuda.h's HVDL_CUDA_STAGE_BYTES
# CuPy's dtypes among the engine's (CuPy has no bfloat16: hvd_lite.torch's test covers it).
CUPY_DTYPES = [d for d in ALL_DTYPES if np.dtype(d).name != "bfloat16"]
OPS = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product, hvd.Average]


def device_steps() -> int:
    return basics._engine().stats()["device_steps"]


def code(dtype) -> int:
    return HVDL_DTYPES[np.dtype(dtype)]


# ---- the scale kernel -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_cuda_scale_kernel_gives_the_host_bits(dtype):
    """Every bit pattern, factors that round, truncate, clamp (1e30) and flip signs."""
    n, bad = 50_003, []
    for k, factor in enumerate((0.5, 1 / 3, 3.0, -2.5, 1e30, float("nan"), 1.0)):
        src = random_bits(dtype, n, 7 + k)
        want = np.empty_like(src)
        _core.scale_local(want, src, code(dtype), factor)
        d = to_device(np.zeros_like(src))
        _core.scale_local(d, to_device(src), code(dtype), factor)
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
            if not (
                isinstance(out, cupy.ndarray)
                and out.dtype == x.dtype
                and back is inplace
                and same_bits(cupy.asnumpy(out), want)
                and same_bits(cupy.asnumpy(inplace), want)
            ):
                bad.append((count, op.name))
    steps = device_steps() - before
    agree(not bad and steps == calls, f"differs from the host for {bad}; device steps {steps} of {calls}")


@pytest.mark.parametrize(
    "dtype", [np.int32, np.uint8, np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name
)
def test_scale_factors_and_integer_average_on_the_device_give_the_host_bits(dtype):
    r, n, bad = hvd.rank(), hvd.size(), []
    x = exact_inputs(dtype, 4099, r, seed=3)
    for op, pre, post in (
        (hvd.Sum, 0.5, 1.0),
        (hvd.Sum, 1.0, 3.0),
        (hvd.Sum, 0.25, 2.5),
        (hvd.Average, 1.0, 1.0),
        (hvd.Average, 2.0, 0.5),
    ):
        want = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post, name="h")
        got = hvd.allreduce(cupy.asarray(x), op=op, prescale_factor=pre, postscale_factor=post, name="d")
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
            if not (back is d and same_bits(cupy.asnumpy(out), want) and same_bits(cupy.asnumpy(d), want)):
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


def test_grouped_cupy_and_host_arrays_fuse_each_with_their_own_kind():
    """A round's device requests below the fusion threshold (256 KiB) fuse among themselves (one
    device step, through the pinned buffer), the one above it goes alone (a second), the host ones
    fuse among theirs; every output is right and of its input's kind."""
    r, n = hvd.rank(), hvd.size()
    arrays = [
        np.full(10, r + 1.0, np.float32),
        cupy.full(10, r + 1.0, cupy.float32),
        np.full(3, r + 2.0, np.float32),
        cupy.full(STAGE // 4 + 7, r + 1.0, cupy.float32),
        cupy.full(1, r + 3.0, cupy.float32),
    ]
    before = device_steps()
    outs = hvd.grouped_allreduce(arrays, op=hvd.Sum, name="mixed")
    steps = device_steps() - before
    host = [o if isinstance(o, np.ndarray) else cupy.asnumpy(o) for o in outs]
    sums = [n * (n + 1) / 2, n * (n + 1) / 2, n * (n + 3) / 2, n * (n + 1) / 2, n * (n + 5) / 2]
    ok = all(np.array_equal(h, np.full(h.shape, s, np.float32)) for h, s in zip(host, sums))
    kinds = [type(o).__module__.split(".")[0] for o in outs]
    agree(
        ok and kinds == ["numpy", "cupy", "numpy", "cupy", "cupy"] and steps == 2,
        f"{kinds}: {[h[:2] for h in host]}; device steps {steps}",
    )


@pytest.mark.parametrize(
    "dtype", [np.int32, np.uint8, np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name
)
def test_a_fused_device_group_gives_the_host_groups_bits(dtype):
    """Every op, with scale factors and the integer Average, against the same group of host
    arrays (fused on the host): the device group's scaling is the host's."""
    r, bad = hvd.rank(), []
    counts = (1, 7, 1000, 33)
    for op, pre, post in (
        (hvd.Sum, 1.0, 1.0),
        (hvd.Product, 1.0, 1.0),
        (hvd.Min, 1.0, 1.0),
        (hvd.Max, 1.0, 1.0),
        (hvd.Average, 1.0, 1.0),
        (hvd.Sum, 0.5, 3.0),
        (hvd.Average, 2.0, 0.25),
    ):
        xs = [exact_inputs(dtype, c, r, seed=c) for c in counts]
        want = hvd.grouped_allreduce(xs, op=op, prescale_factor=pre, postscale_factor=post, name="hg")
        before = device_steps()
        got = hvd.grouped_allreduce(
            [cupy.asarray(x) for x in xs], op=op, prescale_factor=pre, postscale_factor=post, name="dg"
        )
        steps = device_steps() - before
        if steps != 1 or not all(same_bits(cupy.asnumpy(g), w) for g, w in zip(got, want)):
            bad.append((op.name, pre, post, steps))
    agree(not bad, f"{np.dtype(dtype).name}: differs (or not one step) for {bad}")


def test_a_fused_group_waits_for_each_members_own_stream():
    """Two members written by long kernel chains on two different non-default streams, with no
    host wait: the group's copies down queue behind each, and its copies up land on each."""
    r, n = hvd.rank(), hvd.size()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    xs = []
    for k, s in enumerate(streams):
        with s:
            big = cupy.ones(1 << 25, cupy.float32)
            for _ in range(10):
                big *= 1.0
            xs.append(big[: 1000 * (k + 1)] * (r + 1 + k))
    handles = []
    before = device_steps()
    with held(basics._engine()):  # both in one round, so that they fuse
        for k, (s, x) in enumerate(zip(streams, xs)):
            with s:  # each array's interface names its own stream
                handles.append(hvd.allreduce_async_(x, op=hvd.Sum, name=f"two.streams.{k}"))
    for h in handles:
        hvd.synchronize(h)
    steps = device_steps() - before
    got = [cupy.asnumpy(x, stream=s) for x, s in zip(xs, streams)]
    want = [np.full(1000 * (k + 1), sum(q + 1 + k for q in range(n)), np.float32) for k in range(2)]
    agree(
        all(same_bits(g, w) for g, w in zip(got, want)) and steps == 1,
        f"got {[g[:2] for g in got]}, device steps {steps}",
    )


@pytest.mark.mpi(min_size=2)
def test_a_joined_ranks_stand_ins_match_a_fused_device_group():
    """The last rank joins while the others reduce a group of small CuPy arrays (fused through
    the pinned buffer): its stand-ins (host zeros) take the host fusion buffer, the same one host
    all-reduce of the group."""
    r, n = hvd.rank(), hvd.size()
    outs = None
    if r < n - 1:
        outs = hvd.grouped_allreduce(
            [cupy.full(c, r + 1.0, cupy.float32) for c in (3, 50, 7)], op=hvd.Sum, name="joined.group"
        )
    last = hvd.join()
    want = (n - 1) * n / 2
    ok = outs is None or all(
        np.array_equal(cupy.asnumpy(o), np.full(o.shape, want, np.float32)) for o in outs
    )
    got = None if outs is None else [cupy.asnumpy(o)[:2] for o in outs]
    agree(ok and 0 <= last < n - 1, f"got {got}, join {last}")


@pytest.mark.mpi(min_size=2)
def test_ranks_that_disagree_on_where_the_data_is_all_get_a_mismatch_error():
    r = hvd.rank()
    x = np.ones(8, np.float32)
    err = raised(lambda: hvd.allreduce(cupy.asarray(x) if r == 0 else x, name="where"))
    agree(
        isinstance(err, hvd.HvdLiteError)
        and "Mismatched ALLREDUCE memory" in str(err)
        and "CUDA device memory" in str(err)
        and "host memory" in str(err),
        repr(err),
    )
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
    agree(
        (out is None or same_bits(cupy.asnumpy(out), want)) and len(set(lasts)) == 1 and 0 <= last < n - 1,
        f"got {None if out is None else cupy.asnumpy(out)[:3]}, join {lasts}",
    )


def test_the_calls_that_take_host_memory_refuse_a_cupy_array_with_a_type_error():
    err = raised(lambda: hvd.allgather(cupy.ones(4)))
    agree(isinstance(err, TypeError) and "cupy.asnumpy" in str(err), repr(err))


def test_empty_cupy_arrays_reduce_and_broadcast_to_empty_arrays():
    """No bytes on any rank: every call returns at once, alone or in a group."""
    e = cupy.zeros(0, cupy.float32)
    outs = [
        hvd.allreduce(e, name="empty"),
        hvd.allreduce_(cupy.zeros((0, 3)), name="empty_"),
        hvd.broadcast(e, root_rank=0, name="empty.bc"),
    ]
    outs += hvd.grouped_allreduce([e, cupy.ones(2, cupy.float32)], op=hvd.Sum, name="empty.group")
    shapes = [o.shape for o in outs]
    agree(
        shapes == [(0,), (0, 3), (0,), (0,), (2,)]
        and np.array_equal(cupy.asnumpy(outs[-1]), np.full(2, float(hvd.size()), np.float32)),
        f"shapes {shapes}",
    )


def _started_on_a_stream_that_goes(value):
    """An asynchronous call made on a stream whose only reference is dropped at once, its input
    made on that stream (a non-blocking stream is not ordered after the default stream's work)."""
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.full(1 << 16, value, cupy.float32)
        h = hvd.allreduce_async(x, op=hvd.Sum, name="gone.stream")
    return h


def test_a_stream_dropped_while_its_call_is_pending_stays_until_the_call_is_done():
    """The engine holds the stream the array's interface named (CuPy destroys a stream whose
    object goes), so its work still queues there and the result is right."""
    r, n = hvd.rank(), hvd.size()
    h = _started_on_a_stream_that_goes(r + 1.0)
    out = hvd.synchronize(h)
    cupy.cuda.runtime.deviceSynchronize()
    agree(
        np.array_equal(cupy.asnumpy(out), np.full(1 << 16, n * (n + 1) / 2, np.float32)),
        f"got {cupy.asnumpy(out)[:3]}",
    )
