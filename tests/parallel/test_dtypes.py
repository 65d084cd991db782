"""hvd_lite's data types beyond NCCL's (int16, uint16, bool) through every collective that takes
them, and Horovod's scaling of integer arrays (prescale, postscale, Average: in float64, truncated
toward zero), at 1-4 ranks, in the numpy API and hvd_lite.torch (hvd_lite.tensorflow's:
test_tensorflow_dtypes.py).

bool moves with allgather, broadcast and alltoall only; a reduction of bool is a TypeError before
anything is sent (Horovod refuses it too)."""

import numpy as np
import pytest
from conftest import agree, raises_before_submitting, raises_on_every_rank
from helpers import INT_DTYPES, exact_inputs, fold, horovod_scale, same_bits

import hvd_lite as hvd

pytestmark = pytest.mark.mpi

NEW_DTYPES = [np.int16, np.uint16, np.bool_]
NEW_INT_DTYPES = [np.int16, np.uint16]
OPS = {"sum": hvd.Sum, "prod": hvd.Product, "max": hvd.Max, "min": hvd.Min, "avg": hvd.Average}


def rows(dtype, nrows: int, rank: int, seed: int = 0, width: int = 3) -> np.ndarray:
    return exact_inputs(dtype, nrows * width, rank, seed).reshape(nrows, width)


def scaled_reference(inputs, op: str, pre: float, post: float) -> np.ndarray:
    """What Horovod computes for an integer reduction with scale factors: each rank's input
    scaled by `pre`, reduced (Average: summed), the result scaled by `post` (Average: post / size)."""
    n, dt = len(inputs), inputs[0].dtype
    if pre != 1.0:
        inputs = [horovod_scale(x, pre) for x in inputs]
    total = fold(inputs, "sum" if op == "avg" else op, dt)
    factor = post / n if op == "avg" else post
    return horovod_scale(total, factor) if factor != 1.0 else total


def int_inputs(dtype, count: int, rank: int, seed: int = 0) -> np.ndarray:
    """Integers in -50..50 (0..100 unsigned): scaled by the factors below they stay in range."""
    rng = np.random.default_rng(seed * 1000 + rank + 17)
    lo = 0 if np.dtype(dtype).kind == "u" else -50
    return rng.integers(lo, lo + 101, size=count).astype(dtype)


# ------------------------------------------------------------------ the new types, numpy API


@pytest.mark.parametrize("dtype", NEW_DTYPES, ids=lambda d: np.dtype(d).name)
def test_new_dtypes_move_through_allgather_broadcast_and_alltoall(dtype):
    n, r = hvd.size(), hvd.rank()
    mine = rows(dtype, r + 1, r)
    want = np.concatenate([rows(dtype, q + 1, q) for q in range(n)])
    agree(same_bits(hvd.allgather(mine), want), "allgather")
    got = hvd.grouped_allgather([mine, rows(dtype, 2, r, seed=1)])
    agree(
        same_bits(got[0], want)
        and same_bits(got[1], np.concatenate([rows(dtype, 2, q, seed=1) for q in range(n)])),
        "grouped_allgather",
    )
    root = n - 1
    agree(same_bits(hvd.broadcast(rows(dtype, 4, r), root), rows(dtype, 4, root)), "broadcast")
    x = rows(dtype, 4, r)
    hvd.synchronize(hvd.broadcast_async_(x, root))
    agree(same_bits(x, rows(dtype, 4, root)), "broadcast_async_")
    send = rows(dtype, 2 * n, r)
    want = np.concatenate([rows(dtype, 2 * n, q)[2 * r : 2 * r + 2] for q in range(n)])
    agree(same_bits(hvd.alltoall(send), want), "alltoall")
    splits = [(r + q) % 3 for q in range(n)]
    send = rows(dtype, sum(splits), r, seed=2)
    got, received = hvd.alltoall(send, splits=splits)
    starts = {q: sum((q + p) % 3 for p in range(r)) for q in range(n)}
    want = np.concatenate(
        [
            rows(dtype, sum((q + p) % 3 for p in range(n)), q, seed=2)[starts[q] : starts[q] + (q + r) % 3]
            for q in range(n)
        ]
    )
    agree(
        same_bits(got, want) and list(received) == [(q + r) % 3 for q in range(n)],
        f"alltoall with splits: {got.tolist()} vs {want.tolist()}",
    )


@pytest.mark.parametrize("dtype", NEW_INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_int16_and_uint16_reduce_with_every_op_in_every_reducing_call(dtype):
    n, r = hvd.size(), hvd.rank()
    for op, hop in OPS.items():
        for count in (1, 7, 70_001):  # 70_001: above the fusion threshold, the unfused path
            x = exact_inputs(dtype, count, r, seed=count)
            want = fold([exact_inputs(dtype, count, q, seed=count) for q in range(n)], op, dtype)
            agree(same_bits(hvd.allreduce(x, op=hop), want), f"allreduce {op} count {count}")
        xs = [exact_inputs(dtype, 5, r, seed=s) for s in range(3)]
        wants = [fold([exact_inputs(dtype, 5, q, seed=s) for q in range(n)], op, dtype) for s in range(3)]
        got = hvd.grouped_allreduce(xs, op=hop)
        agree(all(same_bits(g, w) for g, w in zip(got, wants)), f"grouped_allreduce {op}")
        hvd.allreduce_(xs[0], op=hop)
        agree(same_bits(xs[0], wants[0]), f"allreduce_ {op}")
        whole = rows(dtype, 2 * n, r, seed=3)
        full = fold([rows(dtype, 2 * n, q, seed=3) for q in range(n)], op, dtype)
        agree(same_bits(hvd.reducescatter(whole, op=hop), full[2 * r : 2 * r + 2]), f"reducescatter {op}")
        got = hvd.grouped_reducescatter([whole, whole[:n]], op=hop)
        agree(
            same_bits(got[0], full[2 * r : 2 * r + 2]) and same_bits(got[1], full[:n][r : r + 1]),
            f"grouped_reducescatter {op}",
        )


@pytest.mark.parametrize(
    "call",
    [
        lambda x: hvd.allreduce(x),
        lambda x: hvd.allreduce_(x),
        lambda x: hvd.allreduce_async(x),
        lambda x: hvd.grouped_allreduce([np.ones(2, np.int16), x]),
        lambda x: hvd.grouped_allreduce_async_([np.ones(2, np.int16), x]),
        lambda x: hvd.reducescatter(x),
        lambda x: hvd.reducescatter_async(x),
        lambda x: hvd.grouped_reducescatter([np.ones(2, np.int16), x]),
    ],
    ids=[
        "allreduce",
        "allreduce_",
        "allreduce_async",
        "grouped_allreduce",
        "grouped_allreduce_async_",
        "reducescatter",
        "reducescatter_async",
        "grouped_reducescatter",
    ],
)
def test_a_reduction_of_bool_is_a_type_error_before_anything_is_sent(call):
    x = np.ones((hvd.size(), 2), np.bool_)
    raises_before_submitting(TypeError, "bool arrays cannot be reduced", lambda: call(x))


# ------------------------------------------------------------------ integer scale factors

SCALES = [(2.5, 1.0), (1.0, 0.3), (-1.5, 1.0 / 3.0), (0.7, -2.25)]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_scale_factors_follow_horovods_float64_formula(dtype, op):
    n, r = hvd.size(), hvd.rank()
    for pre, post in SCALES + [(1.0, 1.0)]:
        for count in (5, 70_001):
            x = int_inputs(dtype, count, r, seed=count)
            want = scaled_reference(
                [int_inputs(dtype, count, q, seed=count) for q in range(n)], op, pre, post
            )
            got = hvd.allreduce(x, op=OPS[op], prescale_factor=pre, postscale_factor=post)
            agree(
                same_bits(got, want),
                f"allreduce pre {pre} post {post} count {count}: got {got[:5]}, want {want[:5]}",
            )
        # fused: three small arrays in one buffer
        xs = [int_inputs(dtype, 4 + s, r, seed=s) for s in range(3)]
        wants = [
            scaled_reference([int_inputs(dtype, 4 + s, q, seed=s) for q in range(n)], op, pre, post)
            for s in range(3)
        ]
        got = hvd.grouped_allreduce(xs, op=OPS[op], prescale_factor=pre, postscale_factor=post)
        agree(
            all(same_bits(g, w) for g, w in zip(got, wants)),
            f"grouped pre {pre} post {post}: {got} vs {wants}",
        )
        whole = int_inputs(dtype, 2 * n * 3, r, seed=9).reshape(2 * n, 3)
        full = scaled_reference(
            [int_inputs(dtype, 2 * n * 3, q, seed=9).reshape(2 * n, 3) for q in range(n)], op, pre, post
        )
        got = hvd.reducescatter(whole, op=OPS[op], prescale_factor=pre, postscale_factor=post)
        agree(same_bits(got, full[2 * r : 2 * r + 2]), f"reducescatter pre {pre} post {post}")


def test_integer_average_is_the_sum_times_one_over_size_in_float64_like_horovod():
    n, r = hvd.size(), hvd.rank()
    total = 2**53 + 3  # not a float64: the sum rounds to 2**53 + 4 before it is scaled
    x = np.array([total - (n - 1) if r == 0 else 1, -7 if r == 0 else 0], np.int64)
    got = hvd.allreduce(x, op=hvd.Average)
    want = [
        total if n == 1 else int(np.trunc(np.float64(1.0 / n) * np.float64(total))),
        int(np.trunc(-7.0 * (1.0 / n))),
    ]  # toward zero: -3 on 2 ranks, not -4
    agree(got.tolist() == want, f"got {got.tolist()}, want {want}")
    if n == 2:  # where the float64 product differs from integer division
        agree(got[0] != total // 2, "the average took integer division, not Horovod's product")


def test_scaled_integers_clamp_to_the_type_and_nan_gives_zero_on_every_rank():
    n = hvd.size()
    x = np.array([100, -100, 0, 1], np.int8)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=10.0)
    want = fold([horovod_scale(x, 10.0)] * n, "sum", np.int8)  # [127, -128, 0, 10] each
    agree(same_bits(got, want), f"prescale clamps before the sum wraps: {got} vs {want}")
    got = hvd.allreduce(np.array([3, 200], np.uint8), op=hvd.Sum, postscale_factor=float("nan"))
    agree(got.tolist() == [0, 0], f"nan: {got}")
    got = hvd.allreduce(np.array([1, -1], np.int32), op=hvd.Max, postscale_factor=1e300)
    agree(got.tolist() == [2**31 - 1, -(2**31)], f"huge: {got}")


# ------------------------------------------------------------------ hvd_lite.torch


def test_torch_new_dtypes_through_every_collective_that_takes_them():
    torch = pytest.importorskip("torch")
    import hvd_lite.torch as ht

    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.int16, torch.uint16, torch.bool):
        np_dt = {torch.int16: np.int16, torch.uint16: np.uint16, torch.bool: np.bool_}[dtype]

        def t(a):
            return torch.from_numpy(np.ascontiguousarray(a))

        def same(out, want):
            return out.dtype == dtype and same_bits(out.numpy(), want)

        want = np.concatenate([rows(np_dt, q + 1, q) for q in range(n)])
        agree(same(ht.allgather(t(rows(np_dt, r + 1, r))), want), f"{dtype} allgather")
        got = ht.grouped_allgather([t(rows(np_dt, r + 1, r)), t(rows(np_dt, 1, r, seed=1))])
        agree(same(got[0], want), f"{dtype} grouped_allgather")
        agree(same(ht.broadcast(t(rows(np_dt, 4, r)), n - 1), rows(np_dt, 4, n - 1)), f"{dtype} broadcast")
        x = t(rows(np_dt, 4, r))
        ht.broadcast_(x, 0)
        agree(same(x, rows(np_dt, 4, 0)), f"{dtype} broadcast_")
        want = np.concatenate([rows(np_dt, 2 * n, q)[2 * r : 2 * r + 2] for q in range(n)])
        agree(same(ht.alltoall(t(rows(np_dt, 2 * n, r))), want), f"{dtype} alltoall")
        if dtype == torch.bool:
            raises_before_submitting(
                TypeError,
                "bool arrays cannot be reduced",
                lambda: ht.allreduce(t(rows(np_dt, 2, r)), op=ht.Sum),
            )
            raises_before_submitting(
                TypeError,
                "bool arrays cannot be reduced",
                lambda: ht.reducescatter(t(rows(np_dt, n, r)), op=ht.Sum),
            )
            continue
        for op in ("sum", "min", "max", "prod", "avg"):
            hop = {"sum": ht.Sum, "min": ht.Min, "max": ht.Max, "prod": ht.Product, "avg": ht.Average}[op]
            want = fold([rows(np_dt, 2 * n, q) for q in range(n)], op, np_dt)
            agree(same(ht.allreduce(t(rows(np_dt, 2 * n, r)), op=hop), want), f"{dtype} {op}")
            x = t(rows(np_dt, 2 * n, r))
            ht.allreduce_(x, op=hop)
            agree(same(x, want), f"{dtype} allreduce_ {op}")
            got = ht.grouped_allreduce([t(rows(np_dt, 2 * n, r))], op=hop)
            agree(same(got[0], want), f"{dtype} grouped_allreduce {op}")
        want = fold([rows(np_dt, 2 * n, q) for q in range(n)], "sum", np_dt)[2 * r : 2 * r + 2]
        agree(same(ht.reducescatter(t(rows(np_dt, 2 * n, r)), op=ht.Sum), want), f"{dtype} reducescatter")


def test_torch_integer_scale_factors_follow_horovods_float64_formula():
    torch = pytest.importorskip("torch")
    import hvd_lite.torch as ht

    n, r = hvd.size(), hvd.rank()
    for dtype, np_dt in ((torch.int32, np.int32), (torch.int64, np.int64), (torch.int16, np.int16)):
        for pre, post in SCALES:
            x = torch.from_numpy(int_inputs(np_dt, 6, r))
            inputs = [int_inputs(np_dt, 6, q) for q in range(n)]
            for op, hop in (("sum", ht.Sum), ("avg", ht.Average)):
                got = ht.allreduce(x, op=hop, prescale_factor=pre, postscale_factor=post)
                want = scaled_reference(inputs, op, pre, post)
                agree(
                    got.dtype == dtype and same_bits(got.numpy(), want),
                    f"{dtype} {op} pre {pre} post {post}: {got} vs {want}",
                )


def test_the_engine_itself_refuses_a_reduction_of_bool():
    from hvd_lite import _core, basics

    x = np.ones(4, np.bool_)
    for coll in (_core.COLL_ALLREDUCE, _core.COLL_REDUCESCATTER):
        raises_on_every_rank(
            ValueError,
            "bool data has no reduction ops",
            lambda: basics._engine().submit(
                coll, x, x.copy(), _core.hvdlBool, _core.hvdlSum, 1.0, 1.0, "engine.bool", (4,), 0, None, ""
            ),
        )
    # nothing of it is in flight: the name is free and the engine works
    got = hvd.allreduce(np.ones(4, np.int16), op=hvd.Sum, name="engine.bool")
    agree(got.tolist() == [hvd.size()] * 4, f"after the refused submissions: {got}")
