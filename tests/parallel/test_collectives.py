"""allgather, broadcast, alltoall, reducescatter, barrier, join and the object helpers under
mpirun at 1-4 ranks: values, async and grouped variants, and every error on every rank."""

import re
import time

import ml_dtypes
import numpy as np
import pytest
from conftest import agree, raised, raises_before_submitting, raises_on_every_rank
from helpers import MOVE_DTYPES, exact_inputs, fold, same_bits

import hvd_lite as hvd

pytestmark = pytest.mark.mpi

SHAPES = [(0,), (1,), (5,), (3, 4), (7, 2, 3)]


def rows_of(r: int) -> int:
    return (r * 3) % 4  # differs per rank, 0 included


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_allgather_concatenates_uneven_rows_in_rank_order(dtype):
    n, r = hvd.size(), hvd.rank()
    for rest in ((), (3,), (2, 2)):
        mine = exact_inputs(dtype, rows_of(r) * int(np.prod(rest, dtype=int)), r).reshape(
            (rows_of(r),) + rest
        )
        want = np.concatenate(
            [
                exact_inputs(dtype, rows_of(q) * int(np.prod(rest, dtype=int)), q).reshape(
                    (rows_of(q),) + rest
                )
                for q in range(n)
            ]
        )
        got = hvd.allgather(mine)
        agree(same_bits(got, want), f"{np.dtype(dtype)} rest {rest}: {got.shape} vs {want.shape}")


def test_allgather_when_one_rank_sends_nothing():
    x = np.zeros((0, 2), np.float32) if hvd.rank() == 0 else np.ones((2, 2), np.float32)
    got = hvd.allgather(x)
    agree(got.shape == (2 * (hvd.size() - 1), 2) and (got == 1).all(), f"{got.shape}")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "dtype",
    [np.float32, np.int8, np.float64, ml_dtypes.bfloat16, np.int16, np.uint16, np.bool_],
    ids=lambda d: np.dtype(d).name,
)
def test_broadcast_from_every_root(dtype, shape):
    count = int(np.prod(shape, dtype=int))
    for root in range(hvd.size()):
        x = exact_inputs(dtype, count, hvd.rank(), seed=root).reshape(shape)
        want = exact_inputs(dtype, count, root, seed=root).reshape(shape)
        got = hvd.broadcast(x, root)
        agree(
            same_bits(got, want)
            and same_bits(x, exact_inputs(dtype, count, hvd.rank(), seed=root).reshape(shape)),
            f"root {root}",
        )
        hvd.broadcast_(x, root)
        agree(same_bits(x, want), f"in place, root {root}")


def test_alltoall_even_and_with_splits():
    n, r = hvd.size(), hvd.rank()
    x = (np.arange(2 * n, dtype=np.int64) + 1000 * r).reshape(2 * n, 1)
    got = hvd.alltoall(x)
    want = np.concatenate([(np.arange(2 * n) + 1000 * q)[2 * r : 2 * r + 2] for q in range(n)]).reshape(-1, 1)
    agree(np.array_equal(got, want), f"even: {got.ravel()}")
    splits = [(r + q) % 3 for q in range(n)]  # rows rank r sends to rank q
    rows = sum(splits)
    x = np.full((rows, 2), r, np.float32)
    out, received = hvd.alltoall(x, splits=splits)
    want_recv = [(q + r) % 3 for q in range(n)]
    want = np.concatenate([np.full(((q + r) % 3, 2), q, np.float32) for q in range(n)])
    agree(list(received) == want_recv and same_bits(out, want), f"splits: {received}")


def test_an_alltoall_over_the_size_limit_on_one_rank_fails_on_every_rank_and_the_next_works():
    """Rank 0 alone sends more than 2 GiB (to itself: the others see small counts); it used to
    fail there while the others waited for ever. The big array is never written (virtual memory)."""
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs a rank without the oversized block")
    if r == 0:
        x = np.empty(2**31 + 8, np.uint8).reshape(-1, 1)
        splits = [x.shape[0]] + [0] * (n - 1)
    else:
        x = np.zeros((n, 1), np.uint8)
        splits = [1] * n
    raises_on_every_rank(
        hvd.CollectiveError,
        r"ALLTOALL .* failed on rank 0: .*2 GiB",
        lambda: hvd.alltoall(x, splits=splits, name="too.big"),
    )
    got = hvd.allreduce(np.ones(3, np.float32), op=hvd.Sum, name="after.too.big")
    agree(bool(np.all(got == n)), f"the next collective: {got}")


@pytest.mark.parametrize("rows", [0, 1, 5, 9])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_reducescatter_uneven_blocks(rows, op):
    n, r = hvd.size(), hvd.rank()
    hop = {"sum": hvd.Sum, "avg": hvd.Average, "max": hvd.Max}[op]
    x = exact_inputs(np.float32, rows * 3, r, seed=rows).reshape(rows, 3)
    full = fold([exact_inputs(np.float32, rows * 3, q, seed=rows) for q in range(n)], op, np.float32).reshape(
        rows, 3
    )
    starts = np.cumsum([0] + [rows // n + (1 if q < rows % n else 0) for q in range(n)])
    got = hvd.reducescatter(x, op=hop)
    agree(same_bits(got, full[starts[r] : starts[r + 1]]), f"rows {rows} {op}: {got}")


def test_async_and_grouped_variants():
    n = hvd.size()
    hs = [hvd.allgather_async(np.full((1, 2), hvd.rank()), name=f"ag{i}") for i in range(3)]
    outs = [hvd.synchronize(h) for h in hs]
    agree(all(o.shape == (n, 2) for o in outs), "allgather_async")
    outs = hvd.grouped_allgather([np.ones(2), np.ones((1, 3))])
    agree(outs[0].shape == (2 * n,) and outs[1].shape == (n, 3), "grouped_allgather")
    outs = hvd.grouped_reducescatter([np.ones((n, 2)), np.ones((2 * n,))], op=hvd.Sum)
    agree((outs[0] == n).all() and outs[0].shape == (1, 2) and outs[1].shape == (2,), "grouped_reducescatter")
    h = hvd.broadcast_async_(np.full(3, float(hvd.rank())), 0)
    agree((hvd.synchronize(h) == 0).all(), "broadcast_async_")
    h = hvd.reducescatter_async(np.ones((n,)), op=hvd.Sum)
    agree((hvd.synchronize(h) == n).all(), "reducescatter_async")
    hvd.barrier()


def raises_everywhere(match, call):
    raises_on_every_rank(hvd.HvdLiteError, re.escape(match), call)


@pytest.mark.mpi(min_size=2)
def test_errors_on_every_rank():
    r = hvd.rank()
    raises_everywhere(
        "Mismatched ALLGATHER tensor shapes: one rank sent [*, 3], another sent [*, 4]",
        lambda: hvd.allgather(np.ones((2, 3 if r == 0 else 4))),
    )
    raises_everywhere(
        "Mismatched BROADCAST root ranks: one rank sent 0, another sent 1",
        lambda: hvd.broadcast(np.ones(2), 0 if r == 0 else 1),
    )
    raises_everywhere(
        f"BROADCAST root rank 9 is out of range for {hvd.size()} ranks", lambda: hvd.broadcast(np.ones(2), 9)
    )
    raises_everywhere(
        "sum to 99, but dim 0 of the array is 4",
        lambda: hvd.alltoall(
            np.ones(4), splits=[99] + [0] * (hvd.size() - 1) if r == 0 else [4] + [0] * (hvd.size() - 1)
        ),
    )
    raises_everywhere(
        "has 1 entries; it needs one per rank",
        lambda: hvd.alltoall(np.ones(4), splits=[4] if r == 1 else [4] + [0] * (hvd.size() - 1)),
    )
    raises_everywhere(
        "allgather needs an array with at least one dimension",
        lambda: hvd.allgather(np.array(1.0) if r == 0 else np.ones(1)),
    )
    raises_everywhere(
        "reducescatter needs an array with at least one dimension", lambda: hvd.reducescatter(np.array(1.0))
    )
    raises_everywhere(
        "Mismatched REDUCESCATTER tensor shapes: one rank sent [4], another sent [6]",
        lambda: hvd.reducescatter(np.ones(4 if r == 0 else 6)),
    )
    raises_everywhere(
        "Mismatched REDUCESCATTER reduction ops: one rank sent sum, another sent max",
        lambda: hvd.reducescatter(np.ones(4), op=hvd.Sum if r == 0 else hvd.Max),
    )
    got = hvd.allgather(np.ones(1))
    agree(got.shape == (hvd.size(),), "engine unusable after the errors")


def test_join_with_uneven_steps():
    n, r = hvd.size(), hvd.rank()
    total = np.zeros(4)
    for _ in range(2 + r):  # rank r has 2 + r batches
        total += hvd.allreduce(np.full(4, float(r + 1)), op=hvd.Sum, name="join.grad")
    last = hvd.join()
    # step s: ranks with more than s batches contribute r + 1, the joined ones zeros
    want = sum(sum(q + 1 for q in range(n) if s < 2 + q) for s in range(2 + r))
    agree(last == n - 1 and (total == want).all(), f"last {last}, total {total[0]} want {want}")


@pytest.mark.mpi(min_size=2)
def test_a_joined_rank_keeps_the_order_of_cached_allreduces():
    """A joined rank runs stand-ins for the others' cached allreduces and its own pending ones in
    the same place of the ready list as every other rank (ascending cache id): here it still has
    the middle one of three cached names pending when it joins."""
    n, r = hvd.size(), hvd.rank()
    late = n - 1
    sizes = (3, 5, 7)

    def arrays():
        return [np.full(k, float(r + 1 + i)) for i, k in enumerate(sizes)]

    hvd.grouped_allreduce(arrays(), op=hvd.Sum, name="jo")  # jo.0, jo.1, jo.2 enter the cache
    if r == late:
        handle = hvd.allreduce_async(arrays()[1], op=hvd.Sum, name="jo.1")
        hvd.join()
        got = {1: hvd.synchronize(handle)}
    else:
        got = dict(enumerate(hvd.grouped_allreduce(arrays(), op=hvd.Sum, name="jo")))
        hvd.join()
    everyone = range(n)
    want = {
        i: np.full(k, float(sum(q + 1 + i for q in everyone if i == 1 or q != late)))
        for i, k in enumerate(sizes)
    }
    agree(all(same_bits(got[i], want[i]) for i in got), f"got {got}, want {want}")


def _join_after_the_others_announced(since: int) -> int:
    """join() once the others' new names have been announced (a negotiation round that gathered
    descriptors, counted by the engine, has passed since `since`) and the join comes in a later round
    of its own; returns what join() returns."""
    from hvd_lite import basics

    engine = basics._engine()
    deadline = time.monotonic() + 30
    while engine.stats()["slow_rounds"] <= since and time.monotonic() < deadline:
        time.sleep(0.01)
    return hvd.join()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("coll", ["allreduce", "allgather"])
def test_a_rank_that_joins_after_the_others_announced_a_new_name_is_counted(coll):
    """The others' new allreduce runs with the late rank's zeros; another collective fails saying
    a rank has joined. Neither waits for a rank that has already joined (both once stalled, as the
    join came in a round that gathered no descriptors)."""
    from hvd_lite import basics

    n, r = hvd.size(), hvd.rank()
    late = n - 1
    hvd.barrier()
    since = basics._engine().stats()["slow_rounds"]
    ok, detail = True, ""
    if r == late:
        last = _join_after_the_others_announced(since)
    else:
        name = f"late.join.{coll}"
        if coll == "allreduce":
            got = hvd.allreduce(np.full(3, float(r + 1)), op=hvd.Sum, name=name)
            ok, detail = (got == sum(q + 1 for q in range(late))).all(), f"got {got}"
        else:
            err = raised(lambda: hvd.allgather(np.ones(2), name=name))
            ok = isinstance(err, hvd.HvdLiteError) and f"cannot run while rank {late} has joined" in str(err)
            detail = repr(err)
        last = hvd.join()
    # the late rank joined first: the last to join is one of the others, the same on every rank
    everyone = hvd.allgather_object(last)
    agree(ok and len(set(everyone)) == 1 and last != late, f"{detail}; join returned {everyone}")


@pytest.mark.mpi(min_size=2)
def test_collectives_other_than_allreduce_fail_while_a_rank_has_joined():
    r, n = hvd.rank(), hvd.size()
    err = None
    if r != 0:  # rank 0 is in join() until the others join: the verdict is agreed after it
        err = raised(lambda: hvd.allgather(np.ones(2), name="during.join"))
        err = (
            None
            if (isinstance(err, hvd.HvdLiteError) and "cannot run while rank 0 has joined" in str(err))
            else (err or "no error")
        )
    if r == n - 1:
        # this allreduce completes only once every other rank has joined (they contribute zeros),
        # so rank n - 1 joins last
        got = raised(lambda: hvd.allreduce(np.ones(2), op=hvd.Sum, name="during.join.last"))
        err = err or got
    last = hvd.join()
    agree(err is None and last == n - 1, f"during join: {err!r}; join returned {last}")


def test_objects():
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        obj = {"rank": r, "data": [1, 2.5, "x" * r], "arr": np.arange(r)}
        got = hvd.broadcast_object(obj, root_rank=root)
        agree(got["rank"] == root and got["data"][2] == "x" * root and len(got["arr"]) == root, str(got))
    everyone = hvd.allgather_object(("rank", r, None if r % 2 else {r}))
    agree(everyone == [("rank", q, None if q % 2 else {q}) for q in range(n)], str(everyone))


def test_an_object_a_rank_cannot_pickle_raises_there_and_collective_error_elsewhere():
    """The root's unpicklable object (broadcast_object), or the last rank's (allgather_object):
    that rank raises pickle's error, the others CollectiveError naming it; the next call works."""
    import pickle

    r, n = hvd.rank(), hvd.size()

    def unpicklable():
        return lambda: None  # a local function: pickle refuses it

    for call, bad_rank in (
        (lambda obj: hvd.broadcast_object(obj, root_rank=n - 1), n - 1),
        (hvd.allgather_object, n - 1),
    ):
        err = raised(lambda: call(unpicklable() if r == bad_rank else "fine"))
        if r == bad_rank:
            ok = isinstance(err, (pickle.PicklingError, AttributeError, TypeError))
        else:
            ok = isinstance(err, hvd.HvdLiteError) and f"rank(s) [{bad_rank}] could not pickle" in str(err)
        agree(ok, repr(err))
    agree(hvd.broadcast_object(("ok", r), root_rank=0) == ("ok", 0), "the next broadcast_object")


def test_object_names_the_engine_cannot_take_raise_before_anything_is_sent():
    raises_before_submitting(
        ValueError, "contains a NUL character", lambda: hvd.broadcast_object(1, 0, name="a\0b")
    )
    raises_before_submitting(ValueError, "the limit is 511", lambda: hvd.allgather_object(1, name="x" * 507))
    raises_before_submitting(TypeError, "name must be a str", lambda: hvd.allgather_object(1, name=5))


def test_broadcast_parameters_dict_pairs_and_list():
    r = hvd.rank()
    d = {"b": np.full(2, float(r)), "a": np.full(3, r, np.int32)}
    hvd.broadcast_parameters(d, root_rank=0)
    agree((d["b"] == 0).all() and (d["a"] == 0).all(), "dict")
    pairs = [("w", np.full(2, float(r))), ("v", np.full(1, float(r)))]
    hvd.broadcast_parameters(pairs, root_rank=hvd.size() - 1)
    agree(all((a == hvd.size() - 1).all() for _, a in pairs), "pairs")
    lst = [np.full(2, float(r)), np.full(3, float(r))]
    hvd.broadcast_parameters(lst, root_rank=0)
    agree(all((a == 0).all() for a in lst), "list")
    raises_on_every_rank(
        ValueError,
        "duplicate names",
        lambda: hvd.broadcast_parameters([("w", np.ones(1)), ("w", np.ones(1))]),
    )


@pytest.mark.parametrize("bad", ["not-an-array", "not-contiguous"])
def test_broadcast_parameters_with_a_bad_later_entry_raises_everywhere_and_sends_nothing(bad):
    r = hvd.rank()
    if bad == "not-an-array":
        exc_type, match, later = TypeError, "parameter 'z' is a list, not a numpy.ndarray", [1.0]
    else:
        exc_type, match, later = ValueError, "not C-contiguous", np.ones((4, 4))[:, ::2]
    params = {"a": np.full(2, float(r)), "z": later}  # broadcast in sorted order: 'z' comes last
    raises_before_submitting(exc_type, match, lambda: hvd.broadcast_parameters(params, root_rank=0))
    agree(np.array_equal(params["a"], np.full(2, float(r))), f"'a' changed: {params['a']}")
    hvd.broadcast_parameters({"a": params["a"]}, root_rank=0)
    agree((params["a"] == 0).all(), f"after the refused call: {params['a']}")
