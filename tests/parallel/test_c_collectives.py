"""The C API's broadcast, reduce, allgather and reducescatter (through the bare `_core.Comm`) under
mpirun at 1-4 ranks: exact values for every dtype and op, every root, in-place and out-of-place,
misaligned buffers, tiny forced segments that cross every pipeline boundary, bitwise identity across
ranks and reruns, and each InvalidArgument case with the communicator still usable afterwards."""

import re

import numpy as np
import pytest
from conftest import agree, make_comm, raises_on_every_rank, world
from helpers import ALL_DTYPES, MOVE_DTYPES, exact_inputs, fold, same_bits

import hvd_lite as hvd
from hvd_lite import _core
from hvd_lite.ops import HVDL_DTYPES

pytestmark = pytest.mark.mpi

OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


def code(dtype) -> int:
    """The hvdl datatype code."""
    return HVDL_DTYPES[np.dtype(dtype)]


@pytest.fixture(scope="module")
def comm():
    with make_comm() as c:
        yield c


def misaligned(dtype, count):
    """A writable array whose address is not a multiple of the element size (for itemsize > 1)."""
    dt = np.dtype(dtype)
    return np.frombuffer(bytearray(count * dt.itemsize + 3), dtype=dt, count=count, offset=3)


def alloc(dtype, count, skew=False):
    return misaligned(dtype, count) if skew else np.zeros(count, np.dtype(dtype))


# ---- one call of each collective, checked against exact references ----------------------------


def check_broadcast(c, dtype, count, root, inplace=False, skew=False, seed=0):
    r = hvd.rank()
    x = exact_inputs(dtype, count, r, seed)
    want = exact_inputs(dtype, count, root, seed)
    out = alloc(dtype, count, skew)
    if inplace:
        out[...] = x
        c.broadcast(out, out, code(dtype), root)
    else:
        c.broadcast(x if r == root else None, out, code(dtype), root)
    agree(
        same_bits(out.copy(), want),
        f"broadcast {np.dtype(dtype).name} count={count} root={root} inplace={inplace}: "
        f"got {out[:6]}, want {want[:6]}",
    )


def check_reduce(c, dtype, op, count, root, inplace=False, skew=False, seed=0):
    n, r = hvd.size(), hvd.rank()
    x = exact_inputs(dtype, count, r, seed)
    want = fold([exact_inputs(dtype, count, q, seed) for q in range(n)], op, dtype)
    if inplace:
        out = alloc(dtype, count, skew)
        out[...] = x
        c.reduce(out, out, code(dtype), OPS[op], root)
        ok = same_bits(out.copy(), want) if r == root else True
    else:
        src = alloc(dtype, count, skew)
        src[...] = x
        out = alloc(dtype, count, skew) if r == root else None
        c.reduce(src, out, code(dtype), OPS[op], root)
        ok = (r != root or same_bits(out.copy(), want)) and same_bits(src.copy(), x)
    agree(
        ok,
        f"reduce {np.dtype(dtype).name} {op} count={count} root={root} inplace={inplace}: "
        f"got {None if out is None else out[:6]}, want {want[:6]}",
    )


def check_allgather(c, dtype, count, inplace=False, skew=False, seed=0):
    n, r = hvd.size(), hvd.rank()
    x = exact_inputs(dtype, count, r, seed)
    want = np.concatenate([exact_inputs(dtype, count, q, seed) for q in range(n)])
    out = alloc(dtype, n * count, skew)
    if inplace:
        mine = out[r * count : (r + 1) * count]
        mine[...] = x
        c.allgather(mine, out, code(dtype))
    else:
        src = alloc(dtype, count, skew)
        src[...] = x
        c.allgather(src, out, code(dtype))
    agree(
        same_bits(out.copy(), want),
        f"allgather {np.dtype(dtype).name} count={count} inplace={inplace}: got {out[:6]}, want {want[:6]}",
    )


def check_reducescatter(c, dtype, op, count, inplace=False, skew=False, seed=0):
    n, r = hvd.size(), hvd.rank()
    whole = exact_inputs(dtype, n * count, r, seed)
    want = fold([exact_inputs(dtype, n * count, q, seed) for q in range(n)], op, dtype)[
        r * count : (r + 1) * count
    ]
    src = alloc(dtype, n * count, skew)
    src[...] = whole
    if inplace:
        out = src[r * count : (r + 1) * count]
        c.reducescatter(src, out, code(dtype), OPS[op])
        ok = same_bits(out.copy(), want)
    else:
        out = alloc(dtype, count, skew)
        c.reducescatter(src, out, code(dtype), OPS[op])
        ok = same_bits(out.copy(), want) and same_bits(src.copy(), whole)
    agree(
        ok,
        f"reducescatter {np.dtype(dtype).name} {op} count={count} inplace={inplace}: "
        f"got {out[:6]}, want {want[:6]}",
    )


def counts_for(n: int, seg_elems: int, per_rank: bool):
    """0, 1, n±1, primes, and the segment edges of a chunk (whole-buffer counts cover n chunks)."""
    base = {0, 1, max(n - 1, 0), n + 1, 7, 13, 101}
    unit = seg_elems if per_rank else seg_elems * n
    for k in (1, 2, 3):
        base |= {k * unit - 1, k * unit, k * unit + 1}
    return sorted(base)


# ---- the matrix ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_every_root(comm, dtype):
    for count in (0, 1, 5, 1000):
        for root in range(hvd.size()):
            check_broadcast(comm, dtype, count, root, seed=count + root)
            check_reduce(comm, dtype, "sum", count, root, seed=count + root)
        check_allgather(comm, dtype, count, seed=count)
        check_reducescatter(comm, dtype, "sum", count, seed=count)
        check_reducescatter(comm, dtype, "avg", count, seed=count)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize(
    "dtype", [np.float32, np.int32, np.uint8, np.float16], ids=lambda d: np.dtype(d).name
)
def test_every_op(comm, dtype, op):
    n = hvd.size()
    for count in (1, n + 1, 1009):
        check_reduce(comm, dtype, op, count, root=n - 1, seed=count)
        check_reducescatter(comm, dtype, op, count, seed=count)


# The all-reduce's (and reduce's) two message-passing paths, forced: the ring (the all-gather's and
# reduce-scatter's too), or the latency path.
PATHS = {
    "ring": {
        "HVD_LITE_ALLREDUCE_ALGO": "ring",
        "HVD_LITE_ALLGATHER_ALGO": "ring",
        "HVD_LITE_REDUCESCATTER_ALGO": "ring",
    },
    "latency-path": {"HVD_LITE_ALLREDUCE_ALGO": "small"},
}


@pytest.mark.parametrize("path", list(PATHS))
def test_tiny_segments_cross_every_boundary(path):
    n = hvd.size()
    with make_comm(HVD_LITE_SEGMENT_BYTES=16, **PATHS[path]) as c:
        for i, dtype in enumerate((np.float32, np.int8, np.float64)):
            seg = max(16 // np.dtype(dtype).itemsize, 1)
            for count in counts_for(n, seg, per_rank=True):
                inplace = count % 2 == 1
                check_allgather(c, dtype, count, inplace=inplace, seed=count)
                check_reducescatter(c, dtype, "sum", count, inplace=not inplace, seed=count)
                check_reducescatter(c, dtype, "avg", count, inplace=inplace, seed=count)
            for count in counts_for(n, seg, per_rank=False):
                root = (count + i) % n
                check_broadcast(c, dtype, count, root, inplace=count % 2 == 0, seed=count)
                check_reduce(c, dtype, "sum", count, root, inplace=count % 2 == 1, seed=count)


def test_pieces_too_long_for_the_segment_limit_use_larger_segments():
    # 16-byte segments would need ~6,000 per chunk; the pipe caps them at 1024.
    n = hvd.size()
    with make_comm(HVD_LITE_SEGMENT_BYTES=16, **PATHS["ring"]) as c:
        check_allgather(c, np.float32, 25_013)
        check_reducescatter(c, np.float32, "sum", 25_013)
        check_broadcast(c, np.float32, 25_013 * n, root=n // 2)
        check_reduce(c, np.float32, "max", 25_013 * n, root=n // 2)


def check_allreduce(c, dtype, op, count, seed=0):
    n, r = hvd.size(), hvd.rank()
    x = exact_inputs(dtype, count, r, seed)
    want = fold([exact_inputs(dtype, count, q, seed) for q in range(n)], op, dtype)
    out = np.empty_like(x)
    c.allreduce(x, out, code(dtype), OPS[op])
    agree(
        same_bits(out, want),
        f"allreduce {np.dtype(dtype).name} {op} count={count}: got {out[:6]}, want {want[:6]}",
    )


def test_send_steps_longer_than_the_send_window():
    # A send step posts PIPE_SEND_WINDOW segments and the rest while the next steps receive and
    # forward (transport.h): pieces of the window's length and just past it, twice it, and past the
    # segment cap, through every collective with a send step (the ring all-reduce's first step,
    # the ring all-gather and reduce-scatter, the chain broadcast's root; on 2 ranks the copying
    # collectives send each piece as one message). The pending segments and the next piece's
    # forwarded ones are in flight together: without a tag per piece they would be received
    # into each other's places.
    n, w, cap = hvd.size(), _core.PIPE_SEND_WINDOW, _core.PIPE_MAX_SEGMENTS
    with make_comm(HVD_LITE_SEGMENT_BYTES=16, **PATHS["ring"]) as c:
        for nseg in (w - 1, w, w + 1, 2 * w + 3, cap + 5):
            per_rank = 4 * nseg - 1  # 16-byte segments of float32: the last one short
            check_allreduce(c, np.float32, "sum", n * per_rank, seed=nseg)
            check_allreduce(c, np.float32, "avg", n * per_rank + n - 1, seed=nseg)
            check_allgather(c, np.float32, per_rank, seed=nseg)
            check_reducescatter(c, np.float32, "sum", per_rank, seed=nseg)
            check_broadcast(c, np.float32, n * per_rank, root=nseg % n, seed=nseg)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16], ids=lambda d: np.dtype(d).name)
def test_in_place_and_misaligned_buffers(comm, dtype):
    n = hvd.size()
    for count in (5, 3001):
        for inplace in (False, True):
            check_broadcast(comm, dtype, count, root=count % n, inplace=inplace, skew=True)
            check_reduce(comm, dtype, "sum", count, root=(count + 1) % n, inplace=inplace, skew=True)
            check_allgather(comm, dtype, count, inplace=inplace, skew=True)
            check_reducescatter(comm, dtype, "sum", count, inplace=inplace, skew=True)


# ---- bitwise identity ---------------------------------------------------------------------------


def random_floats(count, seed):
    """Order-dependent float32 sums: identity must not depend on luck."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count) * 10.0 ** rng.integers(-6, 6, count)).astype(np.float32)


@pytest.mark.parametrize("path", list(PATHS))
def test_reduce_gives_the_bits_of_allreduce_and_reruns_agree(path):
    n, r = hvd.size(), hvd.rank()
    with make_comm(HVD_LITE_SEGMENT_BYTES=4096, **PATHS[path]) as c:
        for count in (3, 1000, 33_333):
            x = random_floats(count, 100 + r)
            every = np.empty_like(x)
            c.allreduce(x, every, code(np.float32), OPS["sum"])
            for root in range(n):
                got = [np.empty_like(x) if r == root else None for _ in range(2)]
                c.reduce(x, got[0], code(np.float32), OPS["sum"], root)
                c.reduce(x, got[1], code(np.float32), OPS["sum"], root)
                agree(
                    r != root or (same_bits(got[0], every) and same_bits(got[1], every)),
                    f"count {count} root {root}: reduce differs from allreduce or from its rerun",
                )


def test_broadcast_and_allgather_move_bits_verbatim(comm):
    # Random bytes seen as float16 include NaNs with payloads and signed zeros.
    n, r = hvd.size(), hvd.rank()
    rng = np.random.default_rng(300 + r)
    x = rng.integers(0, 256, 2 * 4097, dtype=np.uint8).view(np.float16)
    everyone = world().allgather(x.tobytes())
    out = np.empty(n * x.size, np.float16)
    comm.allgather(x, out, code(np.float16))
    agree(out.tobytes() == b"".join(everyone), "allgather changed some bits")
    for root in range(n):
        got = np.empty_like(x)
        comm.broadcast(x, got, code(np.float16), root)
        agree(got.tobytes() == everyone[root], f"broadcast from {root} changed some bits")


def test_bool_moves_by_broadcast_allgather_and_alltoall_byte_for_byte(comm):
    # bool is one byte moved verbatim: even bytes other than 0 and 1 arrive unchanged
    n, r = hvd.size(), hvd.rank()
    x = np.random.default_rng(400 + r).integers(0, 256, 3 * n, dtype=np.uint8).view(np.bool_)
    everyone = world().allgather(x.tobytes())
    out = np.empty(n * x.size, np.bool_)
    comm.allgather(x, out, _core.hvdlBool)
    agree(out.tobytes() == b"".join(everyone), "allgather changed some bytes")
    got = np.empty_like(x)
    comm.broadcast(x, got, _core.hvdlBool, n - 1)
    agree(got.tobytes() == everyone[n - 1], "broadcast changed some bytes")
    comm.alltoall(x, got, _core.hvdlBool)
    agree(got.tobytes() == b"".join(e[3 * r : 3 * r + 3] for e in everyone), "alltoall changed bytes")


# ---- invalid arguments --------------------------------------------------------------------------


def still_usable(c, problems):
    """Agrees on the invalid calls' outcomes (some ranks may have made none), then checks that the
    communicator still works."""
    agree(not problems, "; ".join(problems))
    n = hvd.size()
    y = np.full(5, 1.0, np.float32)
    out = np.empty(5 * n, np.float32)
    c.allgather(y, out, code(np.float32))
    agree(np.array_equal(out, np.ones(5 * n, np.float32)), f"after an invalid call: {out}")


def expect_invalid(problems, call, match):
    """Records a problem unless call() raises InvalidArgumentError matching `match` (rank-local:
    a failure must not leave the other ranks waiting in the next collective)."""
    try:
        call()
        problems.append(f"no error (expected {match!r})")
    except hvd.InvalidArgumentError as e:
        if not re.search(match, str(e)):
            problems.append(f"expected {match!r}, got {e}")
    except Exception as e:  # noqa: BLE001 - reported on every rank
        problems.append(f"expected InvalidArgumentError {match!r}, got {type(e).__name__}: {e}")


def test_root_out_of_range_is_invalid(comm):
    n, bad = hvd.size(), []
    x = np.zeros(4, np.float32)
    for root in (-1, n):
        expect_invalid(bad, lambda: comm.broadcast(x, x, code(np.float32), root), "root .* out of range")
        expect_invalid(
            bad, lambda: comm.reduce(x, x, code(np.float32), OPS["sum"], root), "root .* out of range"
        )
    still_usable(comm, bad)


def test_invalid_op_is_invalid(comm):
    n, r, bad = hvd.size(), hvd.rank(), []
    x = np.zeros(4 * n, np.float32)
    expect_invalid(bad, lambda: comm.reduce(x, x, code(np.float32), 5, 0), "invalid op 5")
    expect_invalid(
        bad, lambda: comm.reducescatter(x, x[r * 4 : (r + 1) * 4], code(np.float32), 5), "invalid op 5"
    )
    still_usable(comm, bad)


def test_reductions_of_bool_are_invalid(comm):
    n, r, bad = hvd.size(), hvd.rank(), []
    x = np.ones(2 * n, np.bool_)
    match = "bool data has no reduction ops"
    for op in OPS.values():
        expect_invalid(bad, lambda: comm.allreduce(x, x.copy(), _core.hvdlBool, op), match)
        expect_invalid(bad, lambda: comm.reduce(x, x.copy(), _core.hvdlBool, op, 0), match)
        expect_invalid(
            bad, lambda: comm.reducescatter(x, x[2 * r : 2 * r + 2].copy(), _core.hvdlBool, op), match
        )
    still_usable(comm, bad)


def test_null_buffers_with_a_count_are_invalid(comm):
    n, r, bad = hvd.size(), hvd.rank(), []
    x = np.zeros(4, np.float32)
    whole = np.zeros(4 * n, np.float32)
    expect_invalid(bad, lambda: comm.allgather(None, whole, code(np.float32)), "sendbuff is NULL")
    expect_invalid(bad, lambda: comm.allgather(x, None, code(np.float32)), "recvbuff is NULL")
    expect_invalid(bad, lambda: comm.reducescatter(None, x, code(np.float32), 0), "sendbuff is NULL")
    expect_invalid(bad, lambda: comm.reducescatter(whole, None, code(np.float32), 0), "recvbuff is NULL")
    # Only the root reads broadcast's sendbuff and writes reduce's recvbuff: the root alone fails
    # (before sending anything, so the other ranks are not involved).
    if r == 0:
        expect_invalid(bad, lambda: comm.broadcast(None, x, code(np.float32), 0), "sendbuff is NULL")
        expect_invalid(bad, lambda: comm.reduce(x, None, code(np.float32), 0, 0), "recvbuff is NULL")
    still_usable(comm, bad)


def test_overlap_other_than_in_place_is_invalid(comm):
    n, r, bad = hvd.size(), hvd.rank(), []
    c = 4
    buf = np.zeros(n * c + 1, np.float32)
    expect_invalid(
        bad,
        lambda: comm.allgather(buf[r * c + 1 : r * c + 1 + c], buf[: n * c], code(np.float32)),
        "overlap without being in place",
    )
    expect_invalid(
        bad,
        lambda: comm.reducescatter(buf[: n * c], buf[r * c + 1 : r * c + 1 + c], code(np.float32), 0),
        "overlap without being in place",
    )
    if r == 0:
        expect_invalid(
            bad,
            lambda: comm.broadcast(buf[0:c], buf[1 : c + 1], code(np.float32), 0),
            "overlap without being identical",
        )
        expect_invalid(
            bad,
            lambda: comm.reduce(buf[0:c], buf[1 : c + 1], code(np.float32), 0, 0),
            "overlap without being identical",
        )
    still_usable(comm, bad)


def test_sizes_that_break_the_count_rule_are_invalid(comm):
    n, bad = hvd.size(), []
    x = np.zeros(4, np.float32)
    expect_invalid(
        bad,
        lambda: comm.allgather(x, np.zeros(4 * n + 1, np.float32), code(np.float32)),
        "allgather: recvbuf has",
    )
    expect_invalid(
        bad,
        lambda: comm.reducescatter(np.zeros(4 * n + 1, np.float32), x, code(np.float32), 0),
        "reducescatter: sendbuf has",
    )
    expect_invalid(
        bad, lambda: comm.broadcast(x, np.zeros(5, np.float32), code(np.float32), 0), "broadcast: sendbuf has"
    )
    still_usable(comm, bad)


def test_count_zero_is_a_no_op_even_with_null_buffers(comm):
    n = hvd.size()
    empty = np.zeros(0, np.float32)
    comm.broadcast(None, empty, code(np.float32), n - 1)
    comm.reduce(empty, None, code(np.float32), OPS["sum"], 0)
    comm.allgather(empty, None, code(np.float32))
    comm.reducescatter(None, empty, code(np.float32), OPS["avg"])
    still_usable(comm, [])


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_alltoall_sends_block_q_to_rank_q(comm, dtype):
    n, r = hvd.size(), hvd.rank()
    for count in (0, 1, 5, 1001):
        for skew in (False, True):
            send = alloc(dtype, n * count, skew)
            send[...] = exact_inputs(dtype, n * count, r, seed=count)
            recv = alloc(dtype, n * count, skew)
            comm.alltoall(send, recv, code(dtype))
            want = (
                np.concatenate(
                    [
                        exact_inputs(dtype, n * count, q, seed=count)[r * count : (r + 1) * count]
                        for q in range(n)
                    ]
                )
                if n * count
                else np.zeros(0, dtype)
            )
            agree(same_bits(recv.copy(), want.astype(dtype)), f"count {count} skew {skew}")


def test_alltoall_invalid_arguments_leave_the_communicator_usable(comm):
    n = hvd.size()
    x = np.zeros(4 * n, np.float32)
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        "overlap",
        lambda: comm.alltoall(x[: 2 * n], x[1 : 2 * n + 1], _core.hvdlFloat32),
    )
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        "ranks",
        lambda: comm.alltoall(
            np.zeros(n + 1 if n > 1 else 2, np.float32), np.zeros(n, np.float32), _core.hvdlFloat32
        ),
    )
    send, recv = np.full(n, 7.0, np.float32), np.zeros(n, np.float32)
    comm.alltoall(send, recv, _core.hvdlFloat32)
    agree((recv == 7.0).all(), f"after invalid calls: {recv}")


class CudaArray:
    """What CuPy or torch.cuda exports: device memory by the CUDA array interface."""

    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (4096, False), "version": 3}


@pytest.mark.skipif(_core.build_info()["cuda"], reason="this build has CUDA (HVD_LITE_CUDA=1)")
def test_device_memory_is_refused_without_cuda_on_every_rank_before_any_traffic(comm):
    """A build without CUDA cannot tell device memory from host memory in the C API, so the
    binding refuses what the producer says is on a device, naming it, before the call."""
    host = np.zeros(4, np.float32)
    for call in (
        lambda: comm.allreduce(CudaArray(), host, _core.hvdlFloat32, OPS["sum"]),
        lambda: comm.broadcast(host, CudaArray(), _core.hvdlFloat32, 0),
        lambda: comm.allgather(CudaArray(), np.zeros(4 * hvd.size(), np.float32), _core.hvdlFloat32),
    ):
        raises_on_every_rank(
            ValueError,
            r"in CUDA memory \(device -1\): this hvd_lite was built "
            r"without CUDA",
            call,
        )
    still_usable(comm, [])
