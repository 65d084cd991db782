"""The engine under mpirun: async handles, ranks submitting in different orders, validation of
mismatches on every rank, names in flight, grouped calls and fusion."""

import struct

import ml_dtypes
import numpy as np
import pytest
from conftest import agree, raised, raises_on_every_rank, reinit, world
from helpers import exact_inputs, fold, same_bits

import hvd_lite as hvd
from hvd_lite import _core, basics, ops

pytestmark = pytest.mark.mpi


def expected_sum(dtype, count, seed):
    return fold([exact_inputs(dtype, count, q, seed) for q in range(hvd.size())], "sum", dtype)


def test_async_handles_poll_and_synchronize():
    handles, wants = [], []
    for i in range(20):
        x = exact_inputs(np.float32, 100 + i, hvd.rank(), seed=i)
        handles.append(hvd.allreduce_async(x, op=hvd.Sum, name=f"async.{i}"))
        wants.append(expected_sum(np.float32, 100 + i, i))
    results = [hvd.synchronize(h) for h in handles]
    agree(all(hvd.poll(h) for h in handles), "poll is False after synchronize")
    agree(all(same_bits(r, w) for r, w in zip(results, wants)), "wrong async results")


def test_in_place_async_returns_the_same_array():
    x = exact_inputs(np.float64, 1000, hvd.rank())
    h = hvd.allreduce_async_(x, op=hvd.Sum)
    out = hvd.synchronize(h)
    agree(out is x and same_bits(x, expected_sum(np.float64, 1000, 0)), "in-place async")


def test_ranks_may_submit_in_different_orders():
    n_tensors = 30
    order = np.random.default_rng(1234 + hvd.rank()).permutation(n_tensors)  # differs per rank
    handles = {}
    for i in order:
        x = exact_inputs(np.float32, 50 + 7 * int(i), hvd.rank(), seed=int(i))
        handles[int(i)] = hvd.allreduce_async(x, op=hvd.Sum, name=f"order.{i}")
    ok = all(
        same_bits(hvd.synchronize(handles[i]), expected_sum(np.float32, 50 + 7 * i, i))
        for i in range(n_tensors)
    )
    agree(ok, "a tensor submitted in a different order came back wrong")


@pytest.mark.parametrize("capacity", [None, 0], ids=["cache", "no-cache"])
def test_repeated_names_are_negotiated_from_the_cache_without_names(capacity):
    """After the first step, a name the engine has seen costs a bit, not a descriptor: no name
    is announced and every request becomes ready through the cache (Engine.stats counts both).
    With the cache disabled every step announces every name again, so the same counts differ."""
    env = {} if capacity is None else {"HVD_LITE_CACHE_CAPACITY": capacity}
    with reinit(**env):
        engine = basics._engine()
        for step in range(4):
            before = engine.stats()
            handles = [
                hvd.allreduce_async(
                    exact_inputs(np.float32, 64 * (i + 1), hvd.rank(), seed=i), op=hvd.Sum, name=f"steady.{i}"
                )
                for i in range(10)
            ]
            ok = all(
                same_bits(hvd.synchronize(h), expected_sum(np.float32, 64 * (i + 1), i))
                for i, h in enumerate(handles)
            )
            after = engine.stats()
            announced = after["announced"] - before["announced"]
            cached = after["cached_ready"] - before["cached_ready"]
            want = (10, 0) if step == 0 or capacity == 0 else (0, 10)
            agree(
                ok and (announced, cached) == want,
                f"step {step}: results ok {ok}; {announced} names announced and {cached} requests "
                f"ready from the cache, want {want}",
            )


def mismatch_case(kind):
    """(array, kwargs) for this rank: rank 0 differs from the others in `kind`."""
    first = hvd.rank() == 0
    x, kw = np.ones((17, 17) if first else (18, 18), np.float32), {}
    if kind != "shape":
        x = np.ones((4, 4), np.float32)
    if kind == "dtype":
        x = x.astype(np.float32 if first else np.float64)
    if kind == "op":
        kw["op"] = hvd.Sum if first else hvd.Max
    if kind == "prescale":
        kw["prescale_factor"] = 1.0 if first else 0.5
    if kind == "postscale":
        kw["postscale_factor"] = 2.0 if first else 1.0
    return x, kw


MESSAGES = {
    "shape": "Mismatched ALLREDUCE tensor shapes: one rank sent [17, 17], another sent [18, 18]",
    "dtype": "Mismatched ALLREDUCE data types: one rank sent float32, another sent float64",
    "op": "Mismatched ALLREDUCE reduction ops: one rank sent sum, another sent max",
    "prescale": "Mismatched ALLREDUCE prescale factors: one rank sent 1, another sent 0.5",
    "postscale": "Mismatched ALLREDUCE postscale factors: one rank sent 2, another sent 1",
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", list(MESSAGES))
def test_mismatches_raise_on_every_rank_and_the_engine_carries_on(kind):
    x, kw = mismatch_case(kind)
    err = raised(lambda: hvd.allreduce(x, name=f"mismatch.{kind}", **kw))
    agree(
        isinstance(err, hvd.HvdLiteError) and MESSAGES[kind] in str(err) and f"'mismatch.{kind}'" in str(err),
        repr(err),
    )
    y = hvd.allreduce(np.full(3, 2.0), op=hvd.Sum, name=f"after.{kind}")
    agree(np.array_equal(y, np.full(3, 2.0 * hvd.size())), "engine unusable after a mismatch")


@pytest.mark.parametrize("which", ["prescale_factor", "postscale_factor"])
def test_the_same_nan_scale_factor_on_every_rank_agrees_and_is_cached(which):
    """Scale factors are compared by their bits: the same NaN everywhere is no mismatch, and the
    second call is a cache bit (a NaN that never equals itself would be announced every time)."""
    engine = basics._engine()
    results, deltas = [], []
    for _ in range(2):
        before = engine.stats()
        try:
            out = hvd.allreduce(
                np.ones(5, np.float32), op=hvd.Sum, name=f"nan.{which}", **{which: float("nan")}
            )
            results.append(bool(np.isnan(out).all()))
        except hvd.HvdLiteError as exc:
            results.append(str(exc))
        after = engine.stats()
        deltas.append(
            (after["announced"] - before["announced"], after["cached_ready"] - before["cached_ready"])
        )
    agree(
        results == [True, True] and deltas == [(1, 0), (0, 1)],
        f"all NaN per call: {results}; (names announced, ready from the cache) per call: {deltas}, "
        "want [(1, 0), (0, 1)]",
    )


def float_from_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


# rank 0's factor, the others', and the message: values that print alike show their bits too
DIFFERENT_BITS = {
    "zero": (0.0, -0.0, "prescale factors: one rank sent 0, another sent -0"),
    "nan-payload": (
        float_from_bits(0x7FF8000000000001),
        float_from_bits(0x7FF8000000000000),
        "prescale factors: one rank sent nan (bits 0x7ff8000000000001), "
        "another sent nan (bits 0x7ff8000000000000)",
    ),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", list(DIFFERENT_BITS))
def test_scale_factors_with_different_bits_are_a_mismatch_naming_both(case):
    first, others, message = DIFFERENT_BITS[case]
    x = np.ones(4, np.float32)
    err = raised(
        lambda: hvd.allreduce(x, prescale_factor=first if hvd.rank() == 0 else others, name=f"bits.{case}")
    )
    agree(isinstance(err, hvd.HvdLiteError) and f"Mismatched ALLREDUCE {message}" in str(err), repr(err))
    y = hvd.allreduce(np.full(3, 2.0), op=hvd.Sum, name=f"after.bits.{case}")
    agree(np.array_equal(y, np.full(3, 2.0 * hvd.size())), "engine unusable after a mismatch")


@pytest.mark.mpi(min_size=2)
def test_a_changed_shape_for_a_cached_name_is_revalidated():
    for _ in range(2):
        hvd.allreduce(np.ones(8, np.float32), name="reshaped")  # now cached
    x = np.ones(9 if hvd.rank() == 0 else 8, np.float32)
    raises_on_every_rank(
        hvd.HvdLiteError,
        r"tensor shapes: one rank sent \[9\], another sent \[8\]",
        lambda: hvd.allreduce(x, name="reshaped"),
    )
    y = hvd.allreduce(np.ones(10, np.float32), op=hvd.Sum, name="reshaped")
    agree(np.array_equal(y, np.full(10, float(hvd.size()))), "a consistent new shape failed")


@pytest.mark.mpi(min_size=2)
def test_a_name_still_in_flight_is_refused_at_once():
    x = np.ones(4, np.float32)
    refused = True
    world().barrier()
    if hvd.rank() == 0:
        h = hvd.allreduce_async(x, name="busy")
        err = raised(lambda: hvd.allreduce_async(x, name="busy"))
        refused = isinstance(err, ValueError) and "'busy' is still in flight on this rank" in str(err)
        world().barrier()  # only now do the others submit, so 'busy' was surely pending
    else:
        world().barrier()
        h = hvd.allreduce_async(x, name="busy")
    out = hvd.synchronize(h)
    agree(refused and np.array_equal(out, x), f"second 'busy' refused: {refused}, result {out}")


def test_grouped_allreduce_variants():
    arrays = [exact_inputs(np.float32, c, hvd.rank(), seed=c) for c in (1, 10, 1000)]
    wants = [expected_sum(np.float32, c, c) for c in (1, 10, 1000)]
    outs = hvd.grouped_allreduce(arrays, op=hvd.Sum)
    agree(all(same_bits(o, w) for o, w in zip(outs, wants)), "grouped")
    handles = hvd.grouped_allreduce_async(arrays, op=hvd.Sum)
    agree(all(same_bits(hvd.synchronize(h), w) for h, w in zip(handles, wants)), "grouped async")
    copies = [a.copy() for a in arrays]
    outs = hvd.grouped_allreduce_(copies, op=hvd.Sum)
    agree(all(o is c and same_bits(c, w) for o, c, w in zip(outs, copies, wants)), "grouped in place")
    copies = [a.copy() for a in arrays]
    for h in hvd.grouped_allreduce_async_(copies, op=hvd.Sum):
        hvd.synchronize(h)
    agree(all(same_bits(c, w) for c, w in zip(copies, wants)), "grouped async in place")


@pytest.mark.parametrize("threshold", [0, 4096, 1 << 20], ids=["no-fusion", "4KiB", "1MiB"])
def test_fusion_of_mixed_tensors_is_exact(threshold):
    with reinit(HVD_LITE_FUSION_THRESHOLD=threshold, HVD_LITE_SEGMENT_BYTES=512):
        specs = [
            (np.float32, 1),
            (np.float32, 300),
            (np.float64, 7),
            (np.float32, 5000),
            (ml_dtypes.bfloat16, 33),
            (np.int32, 100),
            (np.float32, 0),
            (np.float16, 1025),
            (np.float32, 2),
        ] * 3
        handles = []
        for i, (dt, count) in enumerate(specs):
            x = exact_inputs(dt, count, hvd.rank(), seed=i)
            op = hvd.Sum if i % 2 else hvd.Average
            kw = {"postscale_factor": 2.0} if np.dtype(dt).kind == "f" and i % 3 == 0 else {}
            handles.append((hvd.allreduce_async(x, op=op, name=f"fuse.{i}", **kw), dt, count, i, op, kw))
        bad = []
        for h, dt, count, i, op, kw in handles:
            got = hvd.synchronize(h)
            want = fold(
                [exact_inputs(dt, count, q, seed=i) for q in range(hvd.size())],
                "sum" if op == hvd.Sum else "avg",
                dt,
            )
            if kw:
                want = (want.astype(np.float64) * 2.0).astype(dt)
            if not same_bits(got, want):
                bad.append(i)
        agree(not bad, f"wrong fused results for {bad}")


def test_many_auto_named_calls_stay_consistent():
    total = 0.0
    for i in range(300):
        total += hvd.allreduce(np.array([float(i)]), op=hvd.Sum)[0]
    agree(total == hvd.size() * sum(range(300)), f"total {total}")


@pytest.mark.parametrize(
    "call", ["allreduce", "allreduce_", "allgather", "broadcast", "reducescatter", "barrier"]
)
def test_unnamed_synchronous_calls_share_one_name_and_the_cache(call):
    """An unnamed synchronous call runs under its set's one synchronous name, so after the first
    call every one is ready from the response cache (no name announced); asynchronous unnamed
    calls still take a new counter name each."""
    engine = basics._engine()
    x = exact_inputs(np.float32, 12, hvd.rank())
    run = {
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum),
        "allreduce_": lambda: hvd.allreduce_(x.copy(), op=hvd.Sum),
        "allgather": lambda: hvd.allgather(x),
        "broadcast": lambda: hvd.broadcast(x, root_rank=0),
        "reducescatter": lambda: hvd.reducescatter(np.ones((hvd.size(), 3), np.float32), op=hvd.Sum),
        "barrier": lambda: hvd.barrier(),
    }[call]
    run()
    before = engine.stats()
    outs = [run() for _ in range(5)]
    after = engine.stats()
    announced = after["announced"] - before["announced"]
    cached = after["cached_ready"] - before["cached_ready"]
    same = all(o is None or same_bits(o, outs[0]) for o in outs)
    agree(
        (announced, cached, same) == (0, 5, True),
        f"{call}: {announced} names announced, {cached} ready from the cache, the same results "
        f"{same}; want 0, 5, True",
    )
    before = engine.stats()
    hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum))
    hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum))
    announced = engine.stats()["announced"] - before["announced"]
    agree(announced == 2, f"two unnamed async calls announced {announced} names, want 2")


def test_stats_count_the_time_spent_running_collectives():
    """Engine.stats()["step_seconds"] grows by the time the engine spent inside its collectives
    (tools/latency_breakdown.py subtracts it from a call's time): some time for ten 1 MiB
    all-reduces, and never more than the calls took."""
    import time

    engine = basics._engine()
    x = np.ones(1 << 18, np.float32)
    hvd.allreduce_(x, op=hvd.Sum, name="stats.step_seconds")
    before = engine.stats()["step_seconds"]
    t0 = time.perf_counter()
    for _ in range(10):
        hvd.allreduce_(x, op=hvd.Sum, name="stats.step_seconds")
    wall = time.perf_counter() - t0
    spent = engine.stats()["step_seconds"] - before
    agree(0 < spent <= wall, f"step_seconds grew by {spent} s over calls that took {wall} s")


@pytest.mark.mpi(min_size=2)
def test_unnamed_synchronous_calls_from_two_threads_at_once_complete():
    """The synchronous name is one thread's at a time: a second thread's unnamed call waits for
    it, so the k-th call on one rank meets the k-th on the other and every call completes
    (which thread's array meets which is up to the threads, as with Horovod's automatic names:
    every result is a sum of 0s and 1s)."""
    import threading

    n = hvd.size()
    results, errors = {0: [], 1: []}, []

    def work(t):
        try:
            for i in range(50):
                results[t].append(hvd.allreduce(np.full(4, float(t), np.float64), op=hvd.Sum)[0])
        except Exception as e:  # reported below, on every rank
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    values = set(results[0] + results[1])
    agree(
        not errors and len(results[0]) == len(results[1]) == 50 and values <= set(range(n + 1)),
        f"errors {errors[:2]}, {len(results[0])} and {len(results[1])} results, values {values}",
    )


@pytest.mark.parametrize("capacity,names", [(0, 7), (3, 7), (40, 100)], ids=["disabled", "small", "churn"])
def test_a_small_or_disabled_cache_stays_consistent(capacity, names):
    """Names beyond the capacity are evicted and their ids reused every step; with 100 names in
    40 entries the cache's name index (csrc/negotiate/negotiate.c) is also rebuilt as it fills."""
    with reinit(HVD_LITE_CACHE_CAPACITY=capacity):
        bad = []
        for step in range(4):
            handles = [
                (
                    i,
                    hvd.allreduce_async(
                        exact_inputs(np.float32, 10 + i, hvd.rank(), seed=i), op=hvd.Sum, name=f"cap.{i}"
                    ),
                )
                for i in range(names)
            ]
            for i, h in handles:
                if not same_bits(hvd.synchronize(h), expected_sum(np.float32, 10 + i, i)):
                    bad.append((step, i))
        agree(not bad, f"wrong results {bad}")


def test_a_waiting_thread_ends_the_batch_and_synchronous_calls_skip_it():
    """With a 10 s batch time, an async submission returns in milliseconds once a thread waits
    on it (the wait starts the round; without it the engine's 1 s idle tick would), and a
    synchronous call, which says at submit that it will wait, is not batched at all."""
    import time

    with reinit(HVD_LITE_BATCH_TIME=10000):
        took = []
        for i in range(5):
            world().Barrier()
            t0 = time.monotonic()
            h = hvd.allreduce_async(np.ones(10, np.float32), name=f"batch.async.{i}")
            time.sleep(0.01)  # the engine is batching by now
            hvd.synchronize(h)
            took.append(time.monotonic() - t0 - 0.01)
            world().Barrier()
            t0 = time.monotonic()
            hvd.allreduce(np.ones(10, np.float32), name=f"batch.sync.{i}")
            took.append(time.monotonic() - t0)
        agree(max(took) < 0.25, f"allreduces took {took} s")


def test_a_waiter_is_told_when_the_ready_list_ends_whatever_the_notify_time():
    """With a 10 s notify time, completions inside a ready list are announced when the list
    ends: waiting on the first of 30 handles, then the rest, takes milliseconds."""
    import time

    with reinit(HVD_LITE_NOTIFY_TIME=10000):
        world().Barrier()
        t0 = time.monotonic()
        with ops.held(basics._engine()):  # one round, one ready list
            handles = [
                hvd.allreduce_async(np.full(1000, float(i), np.float32), op=hvd.Sum, name=f"notify.{i}")
                for i in range(30)
            ]
        ok = all(hvd.synchronize(h)[0] == i * hvd.size() for i, h in enumerate(handles))
        took = time.monotonic() - t0
        agree(ok and took < 0.5, f"results ok {ok}, took {took:.3f} s")


# ------------------------------------------------------------------ groups, dropped handles, names


@pytest.mark.parametrize("call", ["grouped_allreduce_async", "grouped_allgather_async"])
def test_a_group_whose_later_name_is_in_flight_is_refused_whole(call):
    """The engine refuses 'grp.1' (still in flight): it refuses 'grp.0' with it, so the same group
    goes through once 'grp.1' is done."""
    x = np.full(3, float(hvd.rank()), np.float32)
    with ops.held(basics._engine()):  # no round starts: 'grp.1' is surely still in flight
        busy = hvd.allreduce_async(np.ones(2, np.float32), op=hvd.Sum, name=f"{call}.grp.1")
        err = raised(lambda: getattr(hvd, call)([x, x], name=f"{call}.grp"))
    hvd.synchronize(busy)
    outs = [hvd.synchronize(h) for h in getattr(hvd, call)([x, x], name=f"{call}.grp")]
    agree(
        isinstance(err, ValueError) and f"'{call}.grp.1' is still in flight" in str(err) and len(outs) == 2,
        f"first group: {err!r}; second: {outs}",
    )


def test_a_group_with_a_repeated_name_is_refused_whole():
    engine = basics._engine()
    x = np.ones(2)
    entry = (
        basics._core.COLL_ALLREDUCE,
        x,
        np.empty(2),
        ops.hvdl_dtype(x.dtype),
        ops.HVDL_OPS[hvd.Sum],
        1.0,
        1.0,
        "repeated",
        (2,),
        0,
        None,
        "",
    )
    err = raised(lambda: engine.submit_group([entry, entry[:7] + ("other",) + entry[8:], entry]))
    out = np.empty(2)
    handles = engine.submit_group([entry[:2] + (out,) + entry[3:]])  # 'repeated' is not in flight
    handles[0].wait()
    agree(
        isinstance(err, ValueError)
        and "'repeated' appears twice in one group" in str(err)
        and np.array_equal(out, np.full(2, float(hvd.size())))
        and engine.submit_group([]) == [],
        f"{err!r}, {out}",
    )


def test_in_flight_names_are_refused_and_freed_by_name_with_thousands_in_flight():
    """The in-flight names are kept in buckets (csrc/request/request.h): with 3,000 in flight (several a
    bucket) every one of a sample is refused again, a refused group leaves its earlier entries
    free, and once all have completed every name can be submitted again."""
    engine = basics._engine()
    x = np.ones(1, np.float32)

    def entry(name):
        return (
            basics._core.COLL_ALLREDUCE,
            x,
            np.empty(1, np.float32),
            ops.hvdl_dtype(x.dtype),
            ops.HVDL_OPS[hvd.Sum],
            1.0,
            1.0,
            name,
            (1,),
            0,
            None,
            "",
        )

    names = [f"many.{i}" for i in range(3000)]
    with ops.held(engine):
        handles = engine.submit_group([entry(n) for n in names])
        refused = [raised(lambda n=n: engine.submit(*entry(n), False)) for n in names[::97]]
        group = raised(lambda: engine.submit_group([entry("free.0"), entry("free.1"), entry(names[1234])]))
        free = engine.submit_group([entry("free.0"), entry("free.1")])
    for h in handles + free:
        h.wait()
    again = engine.submit_group([entry(n) for n in names[::-1]])
    for h in again:
        h.wait()
    ok = [isinstance(e, ValueError) and "still in flight" in str(e) for e in refused]
    agree(
        all(ok)
        and len(ok) == 31
        and isinstance(group, ValueError)
        and f"'{names[1234]}' is still in flight" in str(group)
        and len(again) == 3000,
        f"refused {sum(ok)} of {len(ok)}; group: {group!r}",
    )


@pytest.mark.mpi(min_size=2)
def test_dropping_a_pending_handle_returns_at_once_and_the_collective_still_completes():
    """Rank 0 drops its handles while the others have not submitted yet: del returns at once, the
    engine keeps the buffers (an in-place array is still written), the others get the right sums,
    and once done the buffers are let go."""
    import sys
    import time

    r, n = hvd.rank(), hvd.size()
    x = np.full(1000, float(r + 1))
    refs = sys.getrefcount(x)
    world().barrier()
    took, held = 0.0, 0
    if r == 0:
        h1 = hvd.allreduce_async_(x, op=hvd.Sum, name="dropped.inplace")
        h2 = hvd.allreduce_async(np.full(10, 1.0), op=hvd.Sum, name="dropped.out")
        t0 = time.monotonic()
        del h1, h2
        took = time.monotonic() - t0
        held = sys.getrefcount(x) - refs  # the engine's exports of x
        world().barrier()
    else:
        world().barrier()
        time.sleep(0.5)  # rank 0 has dropped its handles by now
        hvd.allreduce_(x, op=hvd.Sum, name="dropped.inplace")
        out = hvd.allreduce(np.full(10, 1.0), op=hvd.Sum, name="dropped.out")
        agree_out = np.array_equal(out, np.full(10, float(n)))
    hvd.allreduce(np.ones(1), name="dropped.after")  # rank 0's dropped ones are done before it
    hvd.allreduce(np.ones(1), name="dropped.after2")  # ... and let go by now
    want = np.full(1000, n * (n + 1) / 2)
    ok = np.array_equal(x, want) and sys.getrefcount(x) == refs
    if r == 0:
        ok = ok and took < 0.05 and held > 0
    else:
        ok = ok and agree_out
    agree(
        ok,
        f"del took {took:.3f} s, engine held {held} refs, x[:3] {x[:3]}, refs {sys.getrefcount(x)} vs {refs}",
    )


@pytest.mark.mpi(min_size=2)
def test_names_that_differ_after_a_nul_are_refused_not_reduced_together():
    """'a\\0x' on rank 0 and 'a\\0y' elsewhere: ValueError on every rank, before anything is
    submitted, not one reduction of both."""
    name = "a\0x" if hvd.rank() == 0 else "a\0y"
    raises_on_every_rank(ValueError, "contains a NUL character", lambda: hvd.allreduce(np.ones(2), name=name))
    raises_on_every_rank(
        ValueError, "contains a NUL character", lambda: hvd.grouped_allreduce([np.ones(2)], name=name)
    )


def test_the_engine_itself_refuses_a_name_with_a_nul():
    """The binding's own check, for a caller that skips hvd_lite's (an adapter)."""
    x = np.ones(2)
    entry = (
        basics._core.COLL_ALLREDUCE,
        x,
        np.empty(2),
        ops.hvdl_dtype(x.dtype),
        ops.HVDL_OPS[hvd.Sum],
        1.0,
        1.0,
        "a\0x",
        (2,),
        0,
        None,
        "",
    )
    engine = basics._engine()
    single = raised(lambda: engine.submit(*entry))
    group = raised(lambda: engine.submit_group([entry]))
    agree(
        all(isinstance(e, ValueError) and "contains a NUL character" in str(e) for e in (single, group)),
        f"{single!r} {group!r}",
    )


@pytest.mark.parametrize("shm", [None, 0], ids=["shm", "no-shm"])
def test_rounds_on_one_host_go_through_shared_memory_until_the_cache_outgrows_a_slot(shm):
    """With every rank on one host, a round's all-gather goes through the segment's round slots
    (Engine.stats counts those rounds); with HVD_LITE_SHM=0 none does; and once the cache holds
    more names than a slot has bits (64 per word after the 2 header words), rounds go through
    MPI instead, on every rank alike, with the same results."""
    n = hvd.size()
    per_slot = 64 * (_core.SHM_ROUND_WORDS - 2)
    env = {"HVD_LITE_CACHE_CAPACITY": per_slot + 200}
    if shm is not None:
        env["HVD_LITE_SHM"] = shm
    with reinit(**env):
        engine = basics._engine()
        x = np.full(3, hvd.rank() + 1, np.int32)

        def step():
            before = engine.stats()
            out = hvd.allreduce(x, op=hvd.Sum, name="shm.round")
            after = engine.stats()
            return (
                same_bits(out, np.full(3, n * (n + 1) // 2, np.int32)),
                after["rounds"] - before["rounds"],
                after["shm_rounds"] - before["shm_rounds"],
            )

        through_shm = n > 1 and shm is None
        for _ in range(3):
            ok, rounds, shm_rounds = step()
            agree(
                ok and rounds >= 1 and shm_rounds == (rounds if through_shm else 0),
                f"small cache: ok={ok} rounds={rounds} shm_rounds={shm_rounds}",
            )
        xs = [np.full(1, hvd.rank() + 1, np.int32) for _ in range(per_slot + 100)]
        outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="shm.many")  # the cache outgrows a slot
        agree(all(int(o[0]) == n * (n + 1) // 2 for o in outs), "the grouped allreduce")
        for _ in range(3):
            ok, rounds, shm_rounds = step()
            agree(
                ok and rounds >= 1 and shm_rounds == 0,
                f"big cache: ok={ok} rounds={rounds} shm_rounds={shm_rounds}",
            )
