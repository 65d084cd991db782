"""Process sets at 1-4 ranks: registration (static and dynamic, ids, duplicates, removal), every
numpy and torch collective inside disjoint, overlapping and one-rank sets with exact results,
sets making progress independently, errors for non-members and bad sets on every rank, failures
that stay inside their set, and DistributedOptimizer reducing within its set only."""

import contextlib

import numpy as np
import pytest
from conftest import agree, everywhere, raised, raises_before_submitting, raises_on_every_rank, world

import hvd_lite as hvd
from hvd_lite import basics

pytestmark = pytest.mark.mpi


def layouts(n: int) -> dict:
    """Named lists of sets (global ranks) that exist at n ranks, none equal to the global set."""
    out = {}
    if n >= 2:
        out["disjoint"] = [list(range(0, n, 2)), list(range(1, n, 2))]
        out["one_rank_each"] = [[r] for r in range(n)]
    if n >= 3:
        out["overlapping"] = [list(range(0, n - 1)), list(range(1, n))]
        out["pair_and_rest"] = [[0, n - 1], list(range(1, n - 1))]
    return out


@contextlib.contextmanager
def added(*rank_lists):
    """Adds these sets (on every rank) and removes them afterwards."""
    sets = [hvd.add_process_set(ranks) for ranks in rank_lists]
    try:
        yield sets
    finally:
        for ps in sets:
            hvd.remove_process_set(ps)


def registered_ids() -> dict:
    return {i: s.ranks for i, s in basics._state.sets.items()}


# ---------------------------------------------------------------------------- registration


def test_the_global_set_has_id_0_and_every_rank():
    n, r = hvd.size(), hvd.rank()
    g = hvd.global_process_set
    with everywhere():
        assert (g.process_set_id, g.ranks, g.size(), g.rank(), g.included()) == (
            0,
            list(range(n)),
            n,
            r,
            True,
        )
        assert str(g) == f"ProcessSet(process_set_id=0, ranks={list(range(n))}, mpi_comm=None)"
        assert not hvd.remove_process_set(g)
    y = hvd.allreduce(np.array([r], np.int64), op=hvd.Sum, process_set=g)
    agree(int(y[0]) == n * (n - 1) // 2, f"{y}")


def test_added_sets_get_ids_in_order_and_removed_ids_are_reused_first():
    n, r = hvd.size(), hvd.rank()
    hvd.shutdown()
    hvd.init()  # ids start again from 1
    if n == 1:
        raises_on_every_rank(ValueError, "exists already", lambda: hvd.add_process_set([0]))
        return
    first = hvd.add_process_set([0])
    second = hvd.add_process_set(reversed(range(1, n)))  # the order of the ranks does not matter
    with everywhere():
        assert (first.process_set_id, second.process_set_id) == (1, 2)
        assert second.ranks == list(range(1, n))
        assert registered_ids() == {0: list(range(n)), 1: [0], 2: list(range(1, n))}
        assert (first.size(), first.included()) == (1, r == 0)
        assert str(first) == "ProcessSet(process_set_id=1, ranks=[0], mpi_comm=None)"
        if r == 0:
            assert first.rank() == 0
        else:
            assert second.rank() == r - 1
            with pytest.raises(ValueError, match="not a member"):
                first.rank()
    assert hvd.remove_process_set(first)
    with everywhere():
        assert first.process_set_id is None and first.size() is None and first.rank() is None
        assert registered_ids() == {0: list(range(n)), 2: list(range(1, n))}
        assert not hvd.remove_process_set(first)  # not registered any more: nothing happens
    third = hvd.add_process_set(hvd.ProcessSet([n - 1]) if n > 2 else [0])
    agree(third.process_set_id == 1, f"{third}")
    hvd.remove_process_set(third)
    hvd.remove_process_set(second)
    agree(registered_ids() == {0: list(range(n))}, f"{registered_ids()}")


def test_adding_a_set_that_exists_is_a_value_error_on_every_rank():
    n = hvd.size()
    raises_on_every_rank(ValueError, "exists already", lambda: hvd.add_process_set(range(n)))
    if n >= 2:
        with added([n - 1, 0][: n - 1]) as (ps,):
            raises_on_every_rank(
                ValueError, "exists already", lambda: hvd.add_process_set(list(reversed(ps.ranks)))
            )
    agree(list(registered_ids()) == [0], f"{registered_ids()}")


@pytest.mark.parametrize(
    "ranks,match",
    [
        ([-1], "out of range"),
        ([99], "out of range"),
        ([0, 0], "repeat a rank"),
        ([], "at least one rank"),
    ],
)
def test_bad_rank_lists_are_value_errors_before_anything_is_sent(ranks, match):
    raises_before_submitting(ValueError, match, lambda: hvd.add_process_set(ranks))
    agree(list(registered_ids()) == [0], f"{registered_ids()}")


@pytest.mark.parametrize("ranks", [[0.5], ["0"], [True], "01"])
def test_a_process_set_takes_a_list_of_int_ranks(ranks):
    with everywhere():
        with pytest.raises(ValueError, match="list of"):
            hvd.ProcessSet(ranks)
        with pytest.raises(NotImplementedError, match="not from MPI communicators"):
            hvd.ProcessSet(world())


def test_ranks_that_add_different_sets_all_get_a_value_error_and_nothing_is_added():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks to disagree")
    mine = [0] if r == 0 else [n - 1]
    raises_on_every_rank(
        ValueError, r"rank\(s\) \[.*\] made a different process-set change", lambda: hvd.add_process_set(mine)
    )
    agree(list(registered_ids()) == [0], f"{registered_ids()}")
    with added([0]) as (ps,):  # the next change works
        agree(registered_ids()[ps.process_set_id] == [0], f"{ps}")


def test_static_sets_from_init_and_shutdown_invalidates_them():
    n, r = hvd.size(), hvd.rank()
    hvd.shutdown()
    try:
        if n >= 2:
            dup = [hvd.ProcessSet([0]), hvd.ProcessSet(range(1, n)), hvd.ProcessSet([0])]
            err = raised(lambda: hvd.init(process_sets=dup))
            with everywhere():
                assert isinstance(err, ValueError) and "entry 2 is a duplicate" in str(err), err
                assert not hvd.is_initialized()  # a failed init leaves nothing behind
        err = raised(lambda: hvd.init(process_sets=[hvd.ProcessSet(range(n))]))
        with everywhere():
            assert isinstance(err, ValueError) and "entry 0 is a duplicate" in str(err), err
        sets = [hvd.ProcessSet([0]), hvd.ProcessSet(reversed(range(1, n)))] if n >= 2 else []
        hvd.init(process_sets=sets)
        with everywhere():
            assert [s.process_set_id for s in sets] == list(range(1, len(sets) + 1))
            assert registered_ids() == {0: list(range(n)), **{s.process_set_id: s.ranks for s in sets}}
        for ps in sets:
            if ps.included():
                got = hvd.allgather(np.array([r]), process_set=ps)
                agree(list(got) == ps.ranks, f"{got}")
            else:
                agree(True)
        hvd.shutdown()
        with everywhere():
            assert all(s.process_set_id is None for s in sets)
            assert hvd.global_process_set.process_set_id == 0
            with pytest.raises(TypeError, match="hvd_lite.ProcessSet"):
                hvd.init(process_sets=[[0]])
            with pytest.raises(TypeError, match="hvd_lite.ProcessSet"):
                hvd.init(process_sets=3)
        hvd.init(process_sets="dynamic")  # Horovod's spelling: nothing now, add_process_set later
        agree(list(registered_ids()) == [0], f"{registered_ids()}")
        raises_on_every_rank(
            ValueError,
            "initialized already",  # not a silent no-op
            lambda: hvd.init(process_sets=[hvd.ProcessSet([0])]),
        )
        hvd.shutdown()
        if n >= 2:  # ranks that pass different static sets all fail
            mine = [hvd.ProcessSet([0])] if r == 0 else [hvd.ProcessSet([n - 1])]
            raises_on_every_rank(
                ValueError, "different process-set change", lambda: hvd.init(process_sets=mine)
            )
            agree(not hvd.is_initialized())
    finally:
        hvd.shutdown()
        hvd.init()


# ---------------------------------------------------------------------------- collectives


def exercise(ps) -> list:
    """Every numpy collective in `ps` (this rank is a member); the problems found (rank-local)."""
    R, r = ps.ranks, hvd.rank()
    m, i = len(R), R.index(r)
    bad = []

    def check(what, ok, got=""):
        if not ok:
            bad.append(f"set {R} {what}: {got}")

    mine = np.arange(5, dtype=np.int64) + 10 * r
    want = sum(np.arange(5, dtype=np.int64) + 10 * q for q in R)
    got = hvd.allreduce(mine, op=hvd.Sum, process_set=ps)
    check("allreduce Sum", np.array_equal(got, want), got)
    got = hvd.allreduce(mine.astype(np.float64), process_set=ps)
    check("allreduce Average", np.array_equal(got, want / m), got)
    got = hvd.allreduce(mine, op=hvd.Max, process_set=ps)
    check("allreduce Max", np.array_equal(got, np.arange(5) + 10 * max(R)), got)
    x = mine.copy()
    hvd.allreduce_(x, op=hvd.Sum, process_set=ps)
    check("allreduce_", np.array_equal(x, want), x)
    got = hvd.grouped_allreduce([mine, 2 * mine], op=hvd.Sum, process_set=ps)
    check("grouped_allreduce", np.array_equal(got[0], want) and np.array_equal(got[1], 2 * want), got)
    h = hvd.allreduce_async(mine, op=hvd.Sum, process_set=ps)
    got = hvd.synchronize(h)
    check("allreduce_async", np.array_equal(got, want), got)
    got = hvd.allgather(np.full((r + 1, 2), r, np.int32), process_set=ps)
    check(
        "allgather", np.array_equal(got, np.concatenate([np.full((q + 1, 2), q, np.int32) for q in R])), got
    )
    got = hvd.grouped_allgather([np.array([r]), np.array([r, r])], process_set=ps)
    check("grouped_allgather", list(got[0]) == R and list(got[1]) == [q for q in R for _ in (0, 1)], got)
    for root in R:
        got = hvd.broadcast(np.array([r, 7]), root, process_set=ps)
        check(f"broadcast from {root}", list(got) == [root, 7], got)
        y = np.array([r], np.float32)
        hvd.broadcast_(y, root, process_set=ps)
        check(f"broadcast_ from {root}", y[0] == root, y)
    splits = [(r + j) % 3 for j in range(m)]  # rows to the set's rank j
    x = np.concatenate([np.full(splits[j], 100 * r + j, np.int64) for j in range(m)]).reshape(-1, 1)
    got, received = hvd.alltoall(x, splits=splits, process_set=ps)
    want_rows = np.concatenate([np.full((q + i) % 3, 100 * q + i, np.int64) for q in R]).reshape(-1, 1)
    check(
        "alltoall",
        np.array_equal(got, want_rows) and list(received) == [(q + i) % 3 for q in R],
        (got.ravel(), received),
    )
    even = hvd.alltoall(np.arange(2 * m) + 100 * r, process_set=ps)
    check("alltoall even", list(even) == [100 * q + 2 * i + k for q in R for k in (0, 1)], even)
    rows = 2 * m + 1
    block = rows // m + (1 if i < rows % m else 0)
    got = hvd.reducescatter(np.full((rows, 3), r, np.int64), op=hvd.Sum, process_set=ps)
    check("reducescatter", got.shape == (block, 3) and (got == sum(R)).all(), got)
    got = hvd.grouped_reducescatter([np.full((rows,), r, np.int64)] * 2, op=hvd.Sum, process_set=ps)
    check("grouped_reducescatter", all(g.shape == (block,) and (g == sum(R)).all() for g in got), got)
    hvd.barrier(process_set=ps)
    got = hvd.broadcast_object({"from": r}, root_rank=R[-1], process_set=ps)
    check("broadcast_object", got == {"from": R[-1]}, got)
    got = hvd.allgather_object(("o", r), process_set=ps)
    check("allgather_object", got == [("o", q) for q in R], got)
    params = {"w": np.full(3, r, np.float32), "b": np.array([r, r], np.int32)}
    hvd.broadcast_parameters(params, root_rank=R[0], process_set=ps)
    check("broadcast_parameters", (params["w"] == R[0]).all() and (params["b"] == R[0]).all(), params)
    return bad


@pytest.mark.parametrize("layout", ["global", "disjoint", "one_rank_each", "overlapping", "pair_and_rest"])
def test_every_collective_in_a_set_gives_exact_results(layout):
    n = hvd.size()
    if layout == "global":
        agree(not exercise(hvd.global_process_set), "global")
        return
    if layout not in layouts(n):
        pytest.skip(f"no {layout} sets at {n} ranks")
    with added(*layouts(n)[layout]) as sets:
        bad = []
        for ps in sets:  # a rank in two sets runs one after the other; the others do not wait
            if ps.included():
                bad += exercise(ps)
        agree(not bad, "; ".join(bad))
        hvd.barrier()


def test_collectives_in_flight_in_overlapping_sets_at_once():
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("needs two overlapping sets")
    a_ranks, b_ranks = layouts(n)["overlapping"]
    with added(a_ranks, b_ranks) as (a, b):
        handles = []
        x = np.arange(1000, dtype=np.float64) + r
        for _ in range(3):
            for ps in (a, b) if r % 2 else (b, a):  # ranks in both submit in different orders
                if ps.included():
                    handles.append((ps, hvd.allreduce_async(x, op=hvd.Sum, process_set=ps)))
        got = [(ps, hvd.synchronize(h)) for ps, h in reversed(handles)]
        ok = all(
            np.array_equal(y, sum(np.arange(1000, dtype=np.float64) + q for q in ps.ranks)) for ps, y in got
        )
        agree(ok and len(got) == 3 * (a.included() + b.included()), f"{len(got)}")


def test_a_set_completes_while_another_set_waits_for_one_of_its_ranks():
    # Rank 1 is in A = {0, 1} and B = {1, 2}. Rank 0 submits its part of A's allreduce only after
    # hearing (outside hvd_lite) that B's allreduce has completed, which needs rank 1 to finish B
    # while its A allreduce is still pending: the sets' engines progress independently.
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("needs three ranks")
    comm = world()
    with added([0, 1], [1, 2]) as (a, b):
        result = None
        if r == 1:
            pending = hvd.allreduce_async(np.array([1.0]), op=hvd.Sum, name="waits", process_set=a)
            done_b = hvd.allreduce(np.array([1.0]), op=hvd.Sum, name="goes", process_set=b)
            comm.send(float(done_b[0]), dest=0, tag=77)
            result = (hvd.poll(pending) or True, hvd.synchronize(pending)[0])
        elif r == 2:
            result = hvd.allreduce(np.array([1.0]), op=hvd.Sum, name="goes", process_set=b)[0]
        elif r == 0:
            heard = comm.recv(source=1, tag=77)
            result = (heard, hvd.allreduce(np.array([1.0]), op=hvd.Sum, name="waits", process_set=a)[0])
        want = {0: (2.0, 2.0), 1: (True, 2.0), 2: 2.0}.get(r)
        agree(result == want, f"{result}")


def test_automatic_names_are_counted_per_set():
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs a set that is not the global one")
    with added([0]) as (ps,):
        if r == 0:
            for _ in range(3):
                hvd.allreduce(np.ones(2), process_set=ps)  # unnamed, only rank 0
        got = hvd.allreduce(np.ones(2), op=hvd.Sum)  # unnamed in the global set: still matches
        agree(np.array_equal(got, np.full(2, n)), f"{got}")


# ---------------------------------------------------------------------------- errors


def numpy_calls(ps, root=0):
    a = np.ones(4, np.float32)
    return {
        "allreduce": lambda: hvd.allreduce(a, process_set=ps),
        "allreduce_": lambda: hvd.allreduce_(a.copy(), process_set=ps),
        "allreduce_async": lambda: hvd.allreduce_async(a, process_set=ps),
        "allreduce_async_": lambda: hvd.allreduce_async_(a.copy(), process_set=ps),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([a], process_set=ps),
        "grouped_allreduce_": lambda: hvd.grouped_allreduce_([a.copy()], process_set=ps),
        "grouped_allreduce_async": lambda: hvd.grouped_allreduce_async([], process_set=ps),
        "grouped_allreduce_async_": lambda: hvd.grouped_allreduce_async_([a.copy()], process_set=ps),
        "allgather": lambda: hvd.allgather(a, process_set=ps),
        "allgather_async": lambda: hvd.allgather_async(a, process_set=ps),
        "grouped_allgather": lambda: hvd.grouped_allgather([a], process_set=ps),
        "grouped_allgather_async": lambda: hvd.grouped_allgather_async([], process_set=ps),
        "broadcast": lambda: hvd.broadcast(a, root, process_set=ps),
        "broadcast_": lambda: hvd.broadcast_(a.copy(), root, process_set=ps),
        "broadcast_async": lambda: hvd.broadcast_async(a, root, process_set=ps),
        "broadcast_async_": lambda: hvd.broadcast_async_(a.copy(), root, process_set=ps),
        "alltoall": lambda: hvd.alltoall(a, process_set=ps),
        "alltoall_async": lambda: hvd.alltoall_async(a, process_set=ps),
        "reducescatter": lambda: hvd.reducescatter(a, process_set=ps),
        "reducescatter_async": lambda: hvd.reducescatter_async(a, process_set=ps),
        "grouped_reducescatter": lambda: hvd.grouped_reducescatter([a], process_set=ps),
        "grouped_reducescatter_async": lambda: hvd.grouped_reducescatter_async([a], process_set=ps),
        "barrier": lambda: hvd.barrier(process_set=ps),
        "broadcast_object": lambda: hvd.broadcast_object(1, root, process_set=ps),
        "allgather_object": lambda: hvd.allgather_object(1, process_set=ps),
        "broadcast_parameters": lambda: hvd.broadcast_parameters({}, root, process_set=ps),
    }


def test_every_numpy_call_by_a_non_member_is_a_value_error_before_anything_is_sent():
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("every rank is in every set at 1 rank")
    with added(*layouts(n)["disjoint"]) as (evens, odds):
        other = odds if r % 2 == 0 else evens
        for fn, call in numpy_calls(other, root=other.ranks[0]).items():
            raises_before_submitting(
                ValueError, f"rank {r} is not a member of the provided process set", call
            )


def test_sets_that_are_not_registered_are_refused_before_anything_is_sent():
    n = hvd.size()
    never = hvd.ProcessSet([0])
    for fn, call in numpy_calls(never).items():
        raises_before_submitting(ValueError, "is not registered", call)
    for fn, call in numpy_calls(0).items():
        raises_before_submitting(TypeError, "process_set must be a hvd_lite.ProcessSet", call)
    if n >= 2:
        ps = hvd.add_process_set([0])
        hvd.remove_process_set(ps)
        raises_before_submitting(
            ValueError, "is not registered", lambda: hvd.allreduce(np.ones(1), process_set=ps)
        )


def test_a_broadcast_root_outside_the_set_is_a_value_error_on_every_member():
    n = hvd.size()
    if n < 2:
        pytest.skip("needs a rank outside the set")
    with added(list(range(n - 1))) as (ps,):
        if ps.included():
            raises_before_submitting(
                ValueError,
                rf"root rank {n - 1} is not in the process set",
                lambda: hvd.broadcast(np.ones(2), n - 1, process_set=ps),
            )
        else:
            agree(True)  # raises_before_submitting's agreement, on the members


def test_a_bad_argument_fails_its_set_on_every_member_and_spares_the_other_set():
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs two sets")
    with added(*layouts(n)["disjoint"]) as (evens, odds):
        mine = evens if r % 2 == 0 else odds
        m = mine.size()
        if mine is evens:  # rank 0's splits do not add up: every even rank fails
            splits = [1] * m if r else [2] * m
            err = raised(lambda: hvd.alltoall(np.ones(m), splits=splits, process_set=evens))
            ok = err is not None and "sum to" in str(err)
        else:
            got = hvd.alltoall(np.arange(m, dtype=np.float64), splits=[1] * m, process_set=odds)
            ok = got[0].shape == (m,)
        after = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=mine)  # the set works again
        agree(ok and after[0] == m, f"{err if mine is evens else ok} {after}")


def test_a_failed_send_in_a_set_fails_that_collective_on_its_members_only():
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("needs a set of two that is not the global set")
    with added([0, 1]) as (ps,):
        if r == 0:
            basics.inject_fault("send", 1, process_set=ps)
        err = None
        if ps.included():
            err = raised(lambda: hvd.allreduce(np.ones(1 << 12), name="faulty", process_set=ps))
        y = hvd.allreduce(np.ones(1), op=hvd.Sum)  # the global set never saw it
        ok = (isinstance(err, hvd.CollectiveError) and "injected fault" in str(err)) == ps.included()
        z = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=ps)[0] if ps.included() else 2.0
        agree(ok and y[0] == n and z == 2.0, f"{err!r} {y} {z}")


def test_removing_a_set_fails_what_is_still_in_flight_in_it():
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("needs a set of two that is not the global set")
    ps = hvd.add_process_set([0, 1])
    pending = hvd.allreduce_async(np.ones(3), name="never", process_set=ps) if r == 0 else None
    removed = hvd.remove_process_set(ps)
    err = raised(lambda: hvd.synchronize(pending)) if pending is not None else None
    agree(removed and (r != 0 or isinstance(err, hvd.CollectiveError)), f"{removed} {err!r}")


# ---------------------------------------------------------------------------- torch


def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


def test_torch_collectives_and_gradients_in_a_set():
    torch = torch_or_skip()
    import hvd_lite.torch as ht

    n, r = hvd.size(), hvd.rank()
    sets = layouts(n).get("overlapping") or layouts(n).get("disjoint") or []
    with added(*sets) as added_sets:
        bad = []
        for ps in [ht.global_process_set] + list(added_sets):
            if not ps.included():
                continue
            R, m, i = ps.ranks, ps.size(), ps.rank()
            t = torch.full((3,), float(r), requires_grad=True)
            y = ht.allreduce(t, op=ht.Sum, process_set=ps)
            y.sum().backward()
            if not (
                torch.equal(y, torch.full((3,), float(sum(R))))
                and torch.equal(t.grad, torch.full((3,), float(m)))
            ):
                bad.append(f"{R} allreduce {y} grad {t.grad}")
            got = ht.grouped_allreduce([torch.tensor([r]), torch.tensor([2 * r])], op=ht.Sum, process_set=ps)
            if [int(g) for g in got] != [sum(R), 2 * sum(R)]:
                bad.append(f"{R} grouped_allreduce {got}")
            u = torch.ones(r + 1, requires_grad=True)
            g = ht.allgather(u, process_set=ps)
            (g * torch.arange(g.numel())).sum().backward()
            start = sum(q + 1 for q in R[:i])
            # Horovod's allgather gradient: this rank's rows of the set's average (m equal ones)
            want_grad = torch.arange(start, start + r + 1, dtype=torch.float32)
            if g.numel() != sum(q + 1 for q in R) or not torch.equal(u.grad, want_grad):
                bad.append(f"{R} allgather {g} grad {u.grad}")
            b = ht.broadcast(torch.tensor([r]), R[-1], process_set=ps)
            if int(b) != R[-1]:
                bad.append(f"{R} broadcast {b}")
            out, rec = ht.alltoall(
                torch.arange(m) + 10 * r, splits=torch.ones(m, dtype=torch.int32), process_set=ps
            )
            if out.tolist() != [10 * q + i for q in R] or rec.tolist() != [1] * m:
                bad.append(f"{R} alltoall {out} {rec}")
            rs = ht.reducescatter(torch.ones(m, 2), op=ht.Sum, process_set=ps)
            if not torch.equal(rs, torch.full((1, 2), float(m))):
                bad.append(f"{R} reducescatter {rs}")
            ht.barrier(process_set=ps)
            if ht.broadcast_object(r, root_rank=R[0], process_set=ps) != R[0]:
                bad.append(f"{R} broadcast_object")
            if ht.allgather_object(r, process_set=ps) != R:
                bad.append(f"{R} allgather_object")
            model = torch.nn.Linear(2, 1)
            with torch.no_grad():
                model.weight.fill_(r)
            ht.broadcast_parameters(model.state_dict(), root_rank=R[-1], process_set=ps)
            if not (model.weight == R[-1]).all():
                bad.append(f"{R} broadcast_parameters {model.weight}")
        agree(not bad, "; ".join(bad))


def test_horovods_newer_torch_calls_and_their_gradients_stay_in_the_set():
    torch = torch_or_skip()
    import hvd_lite.torch as ht

    n, r = hvd.size(), hvd.rank()
    sets = layouts(n).get("overlapping") or layouts(n).get("disjoint") or []
    with added(*sets) as added_sets:
        bad = []
        for ps in [ht.global_process_set] + list(added_sets):
            if not ps.included():
                continue
            R, m, i = ps.ranks, ps.size(), ps.rank()
            x = torch.ones(m, 2, requires_grad=True)
            y = ht.reducescatter(x, op=ht.Sum, process_set=ps)
            y.sum().backward()  # Horovod: the allgather of the output gradients times the size
            if not (
                torch.equal(y, torch.full((1, 2), float(m)))
                and torch.equal(x.grad, torch.full((m, 2), float(m)))
            ):
                bad.append(f"{R} reducescatter {y} grad {x.grad}")
            xs = [torch.ones(m, 2, requires_grad=True), torch.ones(2 * m, requires_grad=True)]
            ys = ht.grouped_reducescatter(xs, op=ht.Sum, process_set=ps)
            (ys[0].sum() + ys[1].sum()).backward()
            if not (
                torch.equal(ys[0], torch.full((1, 2), float(m)))
                and torch.equal(ys[1], torch.full((2,), float(m)))
                and all(torch.equal(t.grad, torch.full_like(t, float(m))) for t in xs)
            ):
                bad.append(f"{R} grouped_reducescatter {ys} grads {[t.grad for t in xs]}")
            got = ht.synchronize(
                ht.grouped_reducescatter_async([torch.full((m,), float(r))], op=ht.Sum, process_set=ps)
            )
            if not (isinstance(got, list) and torch.equal(got[0], torch.tensor([float(sum(R))]))):
                bad.append(f"{R} grouped_reducescatter_async {got}")
            got = ht.synchronize(
                ht.grouped_allreduce_async([torch.tensor([float(r)])], op=ht.Sum, process_set=ps)
            )
            if not (isinstance(got, list) and torch.equal(got[0], torch.tensor([float(sum(R))]))):
                bad.append(f"{R} grouped_allreduce_async {got}")
            t = (torch.arange(m) + 10.0 * r).requires_grad_()
            out = ht.alltoall(t, process_set=ps)  # no splits: one row to each of the set's ranks
            (out * (torch.arange(m) + 1.0)).sum().backward()  # row i of each went to place i
            if out.tolist() != [10.0 * q + i for q in R] or t.grad.tolist() != [i + 1.0] * m:
                bad.append(f"{R} alltoall {out} grad {t.grad}")
            if m > 1:
                err = raised(lambda: ht.alltoall(torch.arange(m + 1.0), process_set=ps))
                if not (isinstance(err, hvd.InvalidArgumentError) and "divisible" in str(err)):
                    bad.append(f"{R} alltoall of {m + 1} rows without splits: {err!r}")
            u = torch.ones(r + 1, requires_grad=True)
            g = ht.grouped_allgather([u], process_set=ps)[0]
            (g * torch.arange(g.numel())).sum().backward()
            start = sum(q + 1 for q in R[:i])
            if not torch.equal(u.grad, torch.arange(start, start + r + 1, dtype=torch.float32)):
                bad.append(f"{R} grouped_allgather grad {u.grad}")
            b_in = torch.full((2,), float(r), requires_grad=True)
            b = ht.broadcast(b_in, R[-1], process_set=ps)
            (b * (r + 1.0)).sum().backward()  # the root gets the set's average of r + 1
            want = sum(q + 1.0 for q in R) / m if r == R[-1] else 0.0
            if not (
                torch.equal(b, torch.full((2,), float(R[-1])))
                and torch.allclose(b_in.grad, torch.full((2,), want))
            ):
                bad.append(f"{R} broadcast {b} grad {b_in.grad}")
            sparse = torch.sparse_coo_tensor([[r]], [1.0], (n,))
            wait = ht.sparse_allreduce_async(sparse, f"sparse.{ps.process_set_id}", ht.Average, ps)
            dense = wait().to_dense()
            want_dense = torch.zeros(n)
            want_dense[R] = 1.0 / m
            if not torch.allclose(dense, want_dense):
                bad.append(f"{R} sparse_allreduce_async {dense}")
        agree(not bad, "; ".join(bad))


def test_torch_state_helpers_and_a_sparse_distributed_optimizer_in_a_set():
    torch = torch_or_skip()
    import hvd_lite.torch as ht

    n, r = hvd.size(), hvd.rank()
    sets = layouts(n).get("overlapping") or layouts(n).get("disjoint") or []
    with added(*sets) as added_sets:
        bad = []
        for ps in [ht.global_process_set] + list(added_sets):
            if not ps.included():
                continue
            R, m = ps.ranks, ps.size()
            model = torch.nn.Linear(2, 1, bias=False)
            opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
            if r == R[-1]:  # only the root has state and its own lr
                model.weight.grad = torch.full((1, 2), float(r))
                opt.step()
                opt.param_groups[0]["lr"] = 0.5
            ht.broadcast_optimizer_state(opt, R[-1], model=model, process_set=ps)
            buf = opt.state_dict()["state"].get(0, {}).get("momentum_buffer")
            if not (
                buf is not None
                and torch.equal(buf, torch.full((1, 2), float(R[-1])))
                and opt.param_groups[0]["lr"] == 0.5
            ):
                bad.append(f"{R} broadcast_optimizer_state {buf} lr {opt.param_groups[0]['lr']}")
            emb = torch.nn.Embedding(n, 2, sparse=True)  # (torch 2.13's SGD skips a width-1 one)
            with torch.no_grad():
                emb.weight.zero_()
            dopt = ht.DistributedOptimizer(
                torch.optim.SGD(emb.parameters(), lr=1.0),
                named_parameters=emb.named_parameters(),
                process_set=ps,
            )
            emb(torch.tensor([r])).sum().backward()  # a sparse gradient: 1 at row r
            dopt.step()
            want = torch.zeros(n, 2)
            want[R] = -1.0 / m  # the set's average; a one-rank set: its own gradient
            if not torch.allclose(emb.weight.detach(), want):
                bad.append(f"{R} sparse DistributedOptimizer {emb.weight.detach().flatten()}")
        agree(not bad, "; ".join(bad))


def test_every_torch_call_by_a_non_member_is_a_value_error_before_anything_is_sent():
    torch = torch_or_skip()
    import hvd_lite.torch as ht

    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("every rank is in every set at 1 rank")
    with added(*layouts(n)["disjoint"]) as (evens, odds):
        ps = odds if r % 2 == 0 else evens
        root = ps.ranks[0]
        t = torch.ones(4)
        calls = [
            lambda: ht.allreduce(t, process_set=ps),
            lambda: ht.allreduce_(t.clone(), process_set=ps),
            lambda: ht.allreduce_async(t, process_set=ps),
            lambda: ht.allreduce_async_(t.clone(), process_set=ps),
            lambda: ht.grouped_allreduce([t], process_set=ps),
            lambda: ht.grouped_allreduce_([t.clone()], process_set=ps),
            lambda: ht.grouped_allreduce_async([t], process_set=ps),
            lambda: ht.grouped_allreduce_async_([t.clone()], process_set=ps),
            lambda: ht.allgather(t, process_set=ps),
            lambda: ht.allgather_async(t, process_set=ps),
            lambda: ht.grouped_allgather([t], process_set=ps),
            lambda: ht.grouped_allgather_async([t], process_set=ps),
            lambda: ht.broadcast(t, root, process_set=ps),
            lambda: ht.broadcast_(t.clone(), root, process_set=ps),
            lambda: ht.broadcast_async(t, root, process_set=ps),
            lambda: ht.broadcast_async_(t.clone(), root, process_set=ps),
            lambda: ht.alltoall(t, process_set=ps),
            lambda: ht.alltoall_async(t, process_set=ps),
            lambda: ht.reducescatter(t, process_set=ps),
            lambda: ht.reducescatter_async(t, process_set=ps),
            lambda: ht.grouped_reducescatter([t], process_set=ps),
            lambda: ht.grouped_reducescatter_async([t], process_set=ps),
            lambda: ht.alltoall(t, splits=[4], process_set=ps),
            lambda: ht.sparse_allreduce_async(t.to_sparse(), "sparse", process_set=ps),
            lambda: ht.barrier(process_set=ps),
            lambda: ht.broadcast_object(1, root, process_set=ps),
            lambda: ht.allgather_object(1, process_set=ps),
            lambda: ht.broadcast_parameters({"t": t}, root, process_set=ps),
            lambda: ht.broadcast_optimizer_state(
                torch.optim.SGD([torch.nn.Parameter(t)], lr=1.0), root, process_set=ps
            ),
        ]
        for call in calls:
            raises_before_submitting(ValueError, f"rank {r} is not a member", call)


def test_distributed_optimizer_with_a_process_set_averages_within_it_only():
    torch = torch_or_skip()
    import hvd_lite.torch as ht

    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs a set that is not the global one")
    evens = ht.add_process_set(range(0, n, 2))
    try:
        model = torch.nn.Linear(3, 1, bias=False).double()
        with torch.no_grad():
            model.weight.fill_(1.0)
        opt = ht.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=1.0),
            named_parameters=model.named_parameters(),
            process_set=evens,
        )
        x = torch.tensor([[r + 1.0, 2.0 * r, 1.0]], dtype=torch.float64)  # grad of sum(w x) is x
        model(x).sum().backward()
        opt.step()
        grads = {q: torch.tensor([q + 1.0, 2.0 * q, 1.0], dtype=torch.float64) for q in range(n)}
        if evens.included():
            want = 1.0 - sum(grads[q] for q in evens.ranks) / evens.size()
        else:
            want = 1.0 - grads[r]  # outside the set: its own gradient
        got = model.weight.detach()[0]
        agree(torch.equal(got, want), f"{got} vs {want}")
        with everywhere():
            with pytest.raises(ValueError, match="not registered"):
                ht.DistributedOptimizer(
                    torch.optim.SGD(model.parameters(), lr=1.0), process_set=ht.ProcessSet([0])
                )
            with pytest.raises(TypeError, match="must be a hvd_lite.ProcessSet"):
                ht.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), process_set=[0])
    finally:
        ht.remove_process_set(evens)


def test_the_torch_module_exports_the_process_set_api():
    torch_or_skip()
    import hvd_lite.torch as ht

    with everywhere():
        assert ht.ProcessSet is hvd.ProcessSet and ht.global_process_set is hvd.global_process_set
        assert ht.add_process_set is hvd.add_process_set
        assert ht.remove_process_set is hvd.remove_process_set


def test_a_sets_timeline_goes_to_its_own_file(tmp_path_factory):
    from conftest import reinit

    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs a set that is not the global one")
    base = world().bcast(str(tmp_path_factory.mktemp("timeline") / "t.json") if r == 0 else None)
    with reinit(HVD_LITE_TIMELINE=base):
        with added([n - 1]) as (ps,):
            if ps.included():
                hvd.allreduce(np.ones(2), name="in_the_set", process_set=ps)
            hvd.allreduce(np.ones(2), name="in_the_world")
            path = f"{base}.set{ps.process_set_id}"
        hvd.barrier()
        with everywhere():
            if r == n - 1:  # the set's first rank writes its timeline
                assert "in_the_set" in open(path).read()
            if r == 0:
                text = open(base).read()
                assert "in_the_world" in text and "in_the_set" not in text
