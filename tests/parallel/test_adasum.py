"""Adasum (csrc/algorithms/allreduce_adasum.c) under mpirun, through the C API and the numpy API:
the paper's formula over the ranks' tree (tests/helpers.py's float64 reference) for every float
dtype, count and rank count, in place and not; bitwise identity across ranks; the exact cases
(orthogonal vectors sum, identical ones come back, a zero vector is left out); each fused tensor's
own norms; scale factors, process sets and a joined rank; the hierarchical form on emulated hosts;
and the refusals, on every rank before anything is sent. (A rank failing mid-Adasum:
tests/system/test_faults.py, in jobs of their own, as a failed collective's messages must not
meet later tests'.)"""

import ml_dtypes
import numpy as np
import pytest
from conftest import agree, make_comm, raises_before_submitting, raises_on_every_rank, reinit, world
from helpers import ADASUM_DTYPES, adasum_reference, same_bits
from test_process_sets import added

import hvd_lite as hvd
from hvd_lite import _core
from hvd_lite.ops import HVDL_DTYPES

pytestmark = pytest.mark.mpi

ADASUM = _core.hvdlAdasum
COUNTS = (1, 2, 7, 1000, 100_003)
# The error of a result against the float64 reference, relative to its largest magnitude: a few
# roundings to the type per level of the tree.
TOLERANCE = {
    np.dtype(np.float16): 1e-2,
    np.dtype(ml_dtypes.bfloat16): 8e-2,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float64): 1e-12,
}


def code(dtype) -> int:
    return HVDL_DTYPES[np.dtype(dtype)]


def inputs(dtype, count: int, rank: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 1000 + rank)
    return rng.standard_normal(count).astype(np.dtype(dtype))


def all_inputs(dtype, count: int, seed: int):
    return [inputs(dtype, count, q, seed) for q in range(hvd.size())]


def close(got: np.ndarray, want: np.ndarray) -> bool:
    scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / scale if want.size else 0.0
    return err <= TOLERANCE[np.dtype(got.dtype)]


def same_everywhere(x: np.ndarray) -> bool:
    return len(set(world().allgather(x.tobytes()))) == 1


# ---- the C API --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ADASUM_DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_c_api_gives_the_formula_and_the_same_bits_on_every_rank(dtype):
    r = hvd.rank()
    with make_comm() as c:
        for count in COUNTS:
            xs = all_inputs(dtype, count, count)
            want = adasum_reference(xs)
            out = np.zeros(count, np.dtype(dtype))
            c.allreduce(xs[r], out, code(dtype), ADASUM)
            inplace = xs[r].copy()
            c.allreduce(inplace, inplace, code(dtype), ADASUM)
            agree(
                close(out, want) and same_everywhere(out) and same_bits(inplace, out),
                f"{count}: max error {np.max(np.abs(out.astype(np.float64) - want)):.3g}",
            )


def test_misaligned_buffers_give_the_bits_of_aligned_ones():
    r, count = hvd.rank(), 1001
    x = inputs(np.float32, count, r, 5)
    raw = np.zeros(4 * count + 1, np.uint8)
    view = np.frombuffer(raw.data, np.float32, count, offset=1)
    view[...] = x
    with make_comm() as c:
        aligned = np.zeros(count, np.float32)
        c.allreduce(x, aligned, code(np.float32), ADASUM)
        c.allreduce(view, view, code(np.float32), ADASUM)
    agree(same_bits(np.array(view), aligned))


def test_orthogonal_vectors_sum_and_identical_ones_come_back_exactly():
    """Rank q's vector is nonzero only where the index is q modulo n: every pair the tree meets is
    orthogonal (coefficients exactly 1), so the result is the exact sum. Identical vectors have
    coefficients of exactly 1/2 at every level: the vector comes back."""
    n, r, count = hvd.size(), hvd.rank(), 1003
    with make_comm() as c:
        for dtype in ADASUM_DTYPES:
            x = np.zeros(count, np.dtype(dtype))
            x[r::n] = np.arange(1, count + 1, dtype=np.float64)[r::n] % 64 + 1
            want = np.zeros(count, np.dtype(dtype))
            for q in range(n):
                want[q::n] = np.arange(1, count + 1, dtype=np.float64)[q::n] % 64 + 1
            out = np.zeros_like(x)
            c.allreduce(x, out, code(dtype), ADASUM)
            same = inputs(dtype, count, 0, 9)  # the same on every rank
            back = np.zeros_like(same)
            c.allreduce(same, back, code(dtype), ADASUM)
            agree(
                same_bits(out, want) and same_bits(back, same),
                f"{np.dtype(dtype).name}: sum {out[:4]} want {want[:4]}; back {back[:3]} of {same[:3]}",
            )


def test_a_zero_vector_is_left_out():
    n, r, count = hvd.size(), hvd.rank(), 777
    if n == 1:
        pytest.skip("needs 2 ranks")
    xs = all_inputs(np.float64, count, 3)
    xs[0] = np.zeros(count)
    with make_comm() as c:
        out = np.zeros(count)
        c.allreduce(xs[r], out, code(np.float64), ADASUM)
    want = adasum_reference(xs)
    # at 2 ranks the result is rank 1's vector, bit for bit
    agree(close(out, want) and (n != 2 or same_bits(out, xs[1])))


def test_the_c_api_refuses_adasum_outside_an_allreduce_and_on_data_that_is_not_float():
    n = hvd.size()
    x, out = np.ones(4 * n, np.float32), np.zeros(4 * n, np.float32)
    ints = np.ones(4, np.int32)
    with make_comm() as c:
        raises_on_every_rank(
            hvd.HvdLiteError,
            "hvdlReduceScatter: hvdlAdasum is an all-reduce only",
            lambda: c.reducescatter(x, out[:4], code(np.float32), ADASUM),
        )
        raises_on_every_rank(
            hvd.HvdLiteError,
            "hvdlReduce: hvdlAdasum is an all-reduce only",
            lambda: c.reduce(x, out, code(np.float32), ADASUM, 0),
        )
        raises_on_every_rank(
            hvd.HvdLiteError,
            "hvdlAllReduce: hvdlAdasum takes float16, bfloat16, float32 or float64 data, not int32",
            lambda: c.allreduce(ints, ints.copy(), code(np.int32), ADASUM),
        )
        raises_on_every_rank(ValueError, "invalid hvdl op 33", lambda: c.allreduce(x, out, 0, 33))
        # the communicator is still good
        c.allreduce(x, out, code(np.float32), ADASUM)
        agree(np.all(out == 1.0))


# ---- the hierarchical form ------------------------------------------------------------------------


@pytest.mark.parametrize("shm", ["1", "0"], ids=["shared-memory", "messages"])
def test_the_hierarchical_form_averages_each_host_and_combines_the_hosts(shm):
    """Hosts of k emulated ranks, within them through the shared segment or by messages: Adasum of
    the hosts' averages (k = 1: of the ranks; one host: its average); counts below the lanes leave
    lanes empty."""
    n, r = hvd.size(), hvd.rank()
    for k in [k for k in range(1, n + 1) if n % k == 0]:
        with make_comm(HVD_LITE_ADASUM_HIERARCHICAL=1, HVD_LITE_RANKS_PER_HOST=k, HVD_LITE_SHM=shm) as c:
            for count in (1, 3, 10_007):
                xs = all_inputs(np.float32, count, k + count)
                hosts = [
                    np.mean([x.astype(np.float64) for x in xs[h * k : (h + 1) * k]], axis=0)
                    for h in range(n // k)
                ]
                want = adasum_reference(hosts)
                out = np.zeros(count, np.float32)
                c.allreduce(xs[r], out, code(np.float32), ADASUM)
                agree(close(out, want) and same_everywhere(out), f"hosts of {k}, {count}")


def test_the_hierarchical_form_keeps_each_fused_tensors_norms():
    """Two hosts of 2: tensor A is the same everywhere (comes back exactly), tensor B has orthogonal
    supports across hosts and the same values within one (sums exactly); with one set of sums for
    the fused buffer neither would be exact. (That the sums span the host's lanes, the test above
    checks: without it random inputs miss the reference.)"""
    n, r = hvd.size(), hvd.rank()
    if n != 4:
        pytest.skip("two hosts of 2 need 4 ranks")
    host = r // 2
    a = inputs(np.float32, 1001, 0, 21)
    b = np.zeros(999, np.float32)
    b[host::2] = 5.0
    with reinit(HVD_LITE_ADASUM_HIERARCHICAL=1, HVD_LITE_RANKS_PER_HOST=2):
        outs = hvd.grouped_allreduce([a, b], op=hvd.Adasum, name="adasum.hier.fused")
    agree(same_bits(outs[0], a) and same_bits(outs[1], np.full(999, 5.0, np.float32)), f"{outs[1][:4]}")


def test_the_hierarchical_form_refuses_hosts_of_different_sizes():
    n = hvd.size()
    if n != 3:
        pytest.skip("hosts of 2 and 1 need 3 ranks")
    with make_comm(HVD_LITE_ADASUM_HIERARCHICAL=1, HVD_LITE_RANKS_PER_HOST=2) as c:
        x = np.ones(8, np.float32)
        raises_on_every_rank(
            hvd.HvdLiteError,
            "needs every host to run the same number of ranks",
            lambda: c.allreduce(x, x.copy(), code(np.float32), ADASUM),
        )


# ---- the numpy API and the engine -------------------------------------------------------------


@pytest.mark.parametrize("dtype", ADASUM_DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_numpy_api_gives_the_formula(dtype):
    r = hvd.rank()
    for count in (3, 4096, 300_001):
        xs = all_inputs(dtype, count, count + 1)
        out = hvd.allreduce(xs[r], op=hvd.Adasum, name=f"adasum.{count}")
        agree(close(out, adasum_reference(xs)) and same_everywhere(out), f"{count}")


def test_fused_tensors_keep_their_own_norms():
    """Tensor A is the same on every rank (comes back exactly), tensor B has orthogonal supports
    (sums exactly): with one norm over the fused buffer neither would be exact. Random tensors
    beside them match the reference tensor by tensor."""
    n, r = hvd.size(), hvd.rank()
    a = inputs(np.float32, 1000, 0, 11)
    b = np.zeros(999, np.float32)
    b[r::n] = 3.0
    rand = [inputs(np.float32, c, r, 12 + c) for c in (5, 300, 2048)]
    outs = hvd.grouped_allreduce([a, b] + rand, op=hvd.Adasum, name="adasum.fused")
    want_b = np.full(999, 3.0, np.float32)
    refs = [adasum_reference([inputs(np.float32, c, q, 12 + c) for q in range(n)]) for c in (5, 300, 2048)]
    agree(
        same_bits(outs[0], a)
        and same_bits(outs[1], want_b)
        and all(close(o, w) for o, w in zip(outs[2:], refs)),
        f"A {outs[0][:3]} of {a[:3]}; B {outs[1][:4]}",
    )


def test_scale_factors_apply_before_and_after():
    """Adasum commutes with a power-of-two scale: prescale 4 and postscale 1/4 give the plain bits."""
    r = hvd.rank()
    x = inputs(np.float32, 5000, r, 13)
    plain = hvd.allreduce(x, op=hvd.Adasum, name="adasum.plain")
    scaled = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=4.0, postscale_factor=0.25, name="adasum.scaled")
    doubled = hvd.allreduce(x, op=hvd.Adasum, postscale_factor=2.0, name="adasum.doubled")
    agree(same_bits(scaled, plain) and same_bits(doubled, plain * 2))


def test_a_process_set_combines_its_members_only():
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("needs 3 ranks")
    members = list(range(1, n))
    with added(members) as (ps,):
        x = inputs(np.float64, 2001, r, 14)
        if r in members:
            out = hvd.allreduce(x, op=hvd.Adasum, process_set=ps, name="adasum.set")
            want = adasum_reference([inputs(np.float64, 2001, q, 14) for q in members])
            ok = close(out, want)
        else:
            ok = True
    agree(ok)


def test_a_joined_rank_is_left_out():
    """A joined rank sends zeros, which Adasum leaves out."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs 2 ranks")
    if r == 0:
        hvd.join()
        agree(True)
        return
    x = inputs(np.float64, 600, r, 15)
    out = hvd.allreduce(x, op=hvd.Adasum, name="adasum.joined")
    hvd.join()
    xs = [np.zeros(600)] + [inputs(np.float64, 600, q, 15) for q in range(1, n)]
    agree(close(out, adasum_reference(xs)))


def test_the_numpy_api_refuses_before_submitting():
    x = np.ones(8, np.int32)
    raises_before_submitting(
        TypeError,
        "op=Adasum takes float16, bfloat16, float32 or float64 data, got int32",
        lambda: hvd.allreduce(x, op=hvd.Adasum),
    )
    raises_before_submitting(
        ValueError,
        "op=Adasum applies to allreduce only",
        lambda: hvd.reducescatter(np.ones((hvd.size(), 2), np.float32), op=hvd.Adasum),
    )
