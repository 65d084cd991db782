"""The segment pipeline (csrc/pipe.c) with many segments in flight, under mpirun at 1-4 ranks.

Tiny forced segments (HVD_LITE_SEGMENT_BYTES) give pieces of up to the pipe's 64-segment cap, far
more than its windows of sends in flight and receives posted, so every collective built on the pipe
(ring all-reduce, chain broadcast, ring all-gather, reduce-scatter, and reduce through it) runs with
a full send queue that wraps round over consecutive steps. Results must be exact, and no pipe may
ever have had more sends in flight than its window."""
import contextlib
import os

import numpy as np
import pytest

import hvd_lite as hvd
from conftest import agree
from helpers import exact_inputs, fold, same_bits
from hvd_lite import _core
from hvd_lite.ops import HVDL_DTYPES

pytestmark = pytest.mark.mpi

SUM, AVG, MAX = 0, 4, 2
# csrc/pipe.h: PIPE_SEND_WINDOW, PIPE_MAX_SEGMENTS.
SEND_WINDOW = 32
MAX_SEGMENTS = 64


@contextlib.contextmanager
def tiny_segment_comm(seg_bytes=16):
    """A bare communicator on the ring (no shared-memory or latency path) with tiny segments."""
    env = {"HVD_LITE_SEGMENT_BYTES": str(seg_bytes), "HVD_LITE_ALLREDUCE_ALGO": "ring"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        comm = _core.Comm()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield comm
    finally:
        comm.destroy()


def code(dtype) -> int:
    return HVDL_DTYPES[np.dtype(dtype)]


def reduced(dtype, op, count, seed):
    return fold([exact_inputs(dtype, count, q, seed) for q in range(hvd.size())], op, dtype)


# Per-rank piece lengths (float32, 4 elements a segment): a few segments, just past the send
# window, and at and past the 64-segment cap (where segments grow).
PIECES = [3, 4 * SEND_WINDOW + 1, 4 * MAX_SEGMENTS - 1, 4 * MAX_SEGMENTS * 3 + 5]


@pytest.mark.parametrize("piece", PIECES)
def test_ring_allreduce_is_exact_with_many_segments_in_flight(piece):
    n = hvd.size()
    with tiny_segment_comm() as c:
        for rep, op in enumerate(("sum", "avg", "max")):
            count = piece * n + rep  # uneven chunks too
            x = exact_inputs(np.float32, count, hvd.rank(), seed=rep)
            out = np.empty_like(x)
            c.allreduce(x, out, code(np.float32), {"sum": SUM, "avg": AVG, "max": MAX}[op])
            agree(same_bits(out, reduced(np.float32, op, count, rep)),
                  f"allreduce {op} count={count}: got {out[:6]}")
        agree(c.pipe_peak_sends() <= SEND_WINDOW,
              f"{c.pipe_peak_sends()} sends in flight at once, window {SEND_WINDOW}")


@pytest.mark.parametrize("piece", PIECES)
def test_chains_are_exact_with_many_segments_in_flight(piece):
    n, r = hvd.size(), hvd.rank()
    with tiny_segment_comm() as c:
        x = exact_inputs(np.float32, piece, r, seed=1)
        gathered = np.empty(n * piece, np.float32)
        c.allgather(x, gathered, code(np.float32))
        want = np.concatenate([exact_inputs(np.float32, piece, q, seed=1) for q in range(n)])
        agree(same_bits(gathered, want), f"allgather piece={piece}: got {gathered[:6]}")

        whole = exact_inputs(np.float32, n * piece, r, seed=2)
        block = np.empty(piece, np.float32)
        c.reducescatter(whole, block, code(np.float32), SUM)
        want = reduced(np.float32, "sum", n * piece, 2)[r * piece:(r + 1) * piece]
        agree(same_bits(block, want), f"reducescatter piece={piece}: got {block[:6]}")

        for root in range(n):
            got = np.empty(n * piece, np.float32)
            c.broadcast(whole if r == root else None, got, code(np.float32), root)
            want = exact_inputs(np.float32, n * piece, root, seed=2)
            agree(same_bits(got, want), f"broadcast piece={piece} root={root}: got {got[:6]}")

            out = np.empty(n * piece, np.float32) if r == root else None
            c.reduce(whole, out, code(np.float32), SUM, root)
            agree(r != root or same_bits(out, reduced(np.float32, "sum", n * piece, 2)),
                  f"reduce piece={piece} root={root}: got {None if out is None else out[:6]}")
        agree(c.pipe_peak_sends() <= SEND_WINDOW,
              f"{c.pipe_peak_sends()} sends in flight at once, window {SEND_WINDOW}")


def test_a_long_piece_fills_the_send_window():
    # The window bound above could hold trivially if the queue never filled it.
    if hvd.size() == 1:
        pytest.skip("one rank sends nothing")
    with tiny_segment_comm() as c:
        count = 4 * MAX_SEGMENTS * hvd.size()
        x = exact_inputs(np.float32, count, hvd.rank(), seed=3)
        out = np.empty_like(x)
        c.allreduce(x, out, code(np.float32), SUM)
        agree(same_bits(out, reduced(np.float32, "sum", count, 3)), "allreduce is wrong")
        agree(c.pipe_peak_sends() == SEND_WINDOW,
              f"peak sends in flight {c.pipe_peak_sends()}, expected the window {SEND_WINDOW}")


def test_consecutive_collectives_on_one_communicator_keep_their_order():
    # Back-to-back calls of different sizes: a pipe must leave nothing queued for the next one.
    n, r = hvd.size(), hvd.rank()
    with tiny_segment_comm() as c:
        for i, count in enumerate((4 * MAX_SEGMENTS * n, 5, 4 * SEND_WINDOW * n + 3, 1, 999)):
            x = exact_inputs(np.float32, count, r, seed=10 + i)
            out = np.empty_like(x)
            c.allreduce(x, out, code(np.float32), SUM)
            agree(same_bits(out, reduced(np.float32, "sum", count, 10 + i)),
                  f"call {i} count={count}: got {out[:6]}")
            got = np.empty_like(x)
            c.broadcast(x if r == i % n else None, got, code(np.float32), i % n)
            agree(same_bits(got, exact_inputs(np.float32, count, i % n, seed=10 + i)),
                  f"broadcast {i} count={count}: got {got[:6]}")
