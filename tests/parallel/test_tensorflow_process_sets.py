"""Process sets in hvd_lite.tensorflow and hvd_lite.keras at 1-4 ranks: the core's objects under
every module, sets added and removed through hvd_lite.tensorflow (size_op and
process_set_included_op by id), every TF collective inside disjoint and overlapping sets with
exact results, eager and in tf.function, gradients that run in the collective's set, the gradient
tape and the Keras optimizer reducing within their set (a non-member keeps its gradients, as in
Horovod), and a non-member's ValueError before anything is sent."""

import contextlib
import inspect
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install -e '.[tensorflow]')")

from conftest import agree, everywhere, raises_before_submitting  # noqa: E402

import hvd_lite  # noqa: E402
import hvd_lite.keras as hvdk  # noqa: E402
import hvd_lite.tensorflow as hvd  # noqa: E402

pytestmark = pytest.mark.mpi


def layout(n: int, name: str) -> list:
    """Sets (global ranks) that exist at n ranks, none equal to the global set."""
    if name == "disjoint" and n >= 2:
        return [list(range(0, n, 2)), list(range(1, n, 2))]
    if name == "overlapping" and n >= 3:
        return [list(range(0, n - 1)), list(range(1, n))]
    return []


@contextlib.contextmanager
def added(*rank_lists):
    """Adds these sets through hvd_lite.tensorflow (on every rank), removes them afterwards."""
    sets = [hvd.add_process_set(ranks) for ranks in rank_lists]
    try:
        yield sets
    finally:
        for ps in sets:
            hvd.remove_process_set(ps)


def test_the_process_set_api_is_the_cores_in_tensorflow_and_keras():
    import hvd_lite.tensorflow.keras as tfk

    names = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
    defaults = [
        inspect.signature(f).parameters["process_set"].default
        for f in (
            hvd.allreduce,
            hvd.broadcast_variables,
            hvd.DistributedGradientTape,
            hvd.DistributedOptimizer,
            hvdk.DistributedOptimizer,
        )
    ]
    with everywhere():
        for module in (hvd, hvdk, tfk):
            assert [getattr(module, a) for a in names] == [getattr(hvd_lite, a) for a in names]
        assert all(d is hvd_lite.global_process_set for d in defaults)


def test_sets_added_through_tensorflow_answer_size_op_and_included_op_by_id():
    n, r = hvd.size(), hvd.rank()

    @tf.function
    def traced(set_id):
        return hvd.size_op(set_id), hvd.process_set_included_op(set_id)

    with everywhere():
        assert [int(t) for t in traced(0)] == [n, 1]
        with pytest.raises(TypeError, match="process_set_id must be an int"):
            hvd.size_op(hvd.global_process_set)
        with pytest.raises(ValueError, match="size_op: process set 99 does not exist"):
            hvd.size_op(99)
    if n < 2:
        return
    evens = hvd.add_process_set(range(0, n, 2))
    sid, members = evens.process_set_id, len(range(0, n, 2))
    try:
        graph = tf.function(lambda: hvd.size_op(sid))
        with everywhere():
            assert int(hvd.size_op(sid)) == members and evens.size() == members
            assert int(hvd.process_set_included_op(sid)) == (r % 2 == 0)
            assert [int(t) for t in traced(sid)] == [members, r % 2 == 0]
            assert int(graph()) == members
    finally:
        hvd.remove_process_set(evens)
    with everywhere():  # a graph traced while the set existed asks again when it runs
        with pytest.raises(Exception, match=f"process set {sid} does not exist"):
            graph()


def exercise(ps, traced) -> list:
    """Every TF collective in `ps` (this rank is a member); the problems found (rank-local)."""
    R, r = ps.ranks, hvd.rank()
    m, i = len(R), R.index(r)
    bad = []

    def check(what, ok, got=""):
        if not ok:
            bad.append(f"set {R} {what}: {got}")

    mine = tf.constant(np.arange(3, dtype=np.int64) + 10 * r)
    want = sum(np.arange(3, dtype=np.int64) + 10 * q for q in R)
    got = hvd.allreduce(mine, op=hvd.Sum, process_set=ps)
    check("allreduce Sum", np.array_equal(got, want), got)
    got = hvd.allreduce(tf.cast(mine, tf.float64), process_set=ps)
    check("allreduce Average", np.array_equal(got, want / m), got)
    got = hvd.grouped_allreduce([mine, 2 * mine], op=hvd.Sum, process_set=ps)
    check("grouped_allreduce", np.array_equal(got[0], want) and np.array_equal(got[1], 2 * want), got)
    sl = tf.IndexedSlices(tf.fill([1, 2], float(r)), tf.constant([i]), tf.constant([m, 2]))
    got = tf.convert_to_tensor(hvd.allreduce(sl, process_set=ps))
    check("allreduce IndexedSlices", np.allclose(got, np.array([[q, q] for q in R]) / m), got)
    got = hvd.allgather(tf.fill([r + 1, 2], r), process_set=ps)
    check("allgather", np.array_equal(got, np.concatenate([np.full((q + 1, 2), q) for q in R])), got)
    got = hvd.grouped_allgather([tf.constant([r]), tf.constant([r, r])], process_set=ps)
    check(
        "grouped_allgather",
        list(got[0].numpy()) == R and list(got[1].numpy()) == [q for q in R for _ in (0, 1)],
        got,
    )
    got = hvd.broadcast(tf.constant([r, 7]), R[-1], process_set=ps)
    check("broadcast", list(got.numpy()) == [R[-1], 7], got)
    v = tf.Variable([float(r)])
    got = hvd.broadcast_([v], R[0], process_set=ps)
    check("broadcast_", float(v.numpy()[0]) == R[0] and float(got[0][0]) == R[0], v)
    splits = [(r + j) % 3 for j in range(m)]  # rows to the set's rank j
    x = np.concatenate([np.full(splits[j], 100 * r + j, np.int64) for j in range(m)])
    got, received = hvd.alltoall(tf.constant(x), splits=splits, process_set=ps)
    want_rows = np.concatenate([np.full((q + i) % 3, 100 * q + i, np.int64) for q in R])
    check(
        "alltoall",
        np.array_equal(got, want_rows) and list(received.numpy()) == [(q + i) % 3 for q in R],
        (got, received),
    )
    rows = 2 * m + 1
    block = rows // m + (1 if i < rows % m else 0)
    got = hvd.reducescatter(tf.fill([rows, 2], r), op=hvd.Sum, process_set=ps)
    check("reducescatter", got.shape == (block, 2) and (got.numpy() == sum(R)).all(), got)
    got = hvd.grouped_reducescatter([tf.fill([rows], r)] * 2, op=hvd.Sum, process_set=ps)
    check("grouped_reducescatter", all(g.shape == (block,) and (g.numpy() == sum(R)).all() for g in got), got)
    hvd.barrier(process_set=ps)
    ws = [tf.Variable(tf.fill([2], float(r))), tf.Variable([r])]
    hvd.broadcast_variables(ws, root_rank=R[-1], process_set=ps)
    check("broadcast_variables", all((w.numpy() == R[-1]).all() for w in ws), ws)
    got = hvd.broadcast_object({"from": r}, root_rank=R[-1], process_set=ps)
    check("broadcast_object", got == {"from": R[-1]}, got)
    got = hvd.allgather_object(("o", r), process_set=ps)
    check("allgather_object", got == [("o", q) for q in R], got)
    total, gathered, root = traced(tf.constant([float(r)]), ps)
    check(
        "in tf.function",
        float(total[0]) == sum(R) and list(gathered.numpy()) == R and float(root[0]) == R[0],
        (total, gathered, root),
    )
    return bad


@pytest.mark.parametrize("name", ["disjoint", "overlapping"])
def test_every_tf_collective_in_a_set_gives_exact_results(name):
    n = hvd.size()
    if not layout(n, name):
        pytest.skip(f"no {name} sets at {n} ranks")

    @tf.function
    def traced(x, ps):  # one trace per set
        return (
            hvd.allreduce(x, op=hvd.Sum, process_set=ps),
            hvd.allgather(x, process_set=ps),
            hvd.broadcast(x, ps.ranks[0], process_set=ps),
        )

    with added(*layout(n, name)) as sets:
        bad = []
        for ps in sets:  # a rank in two sets runs one after the other; the others do not wait
            if ps.included():
                bad += exercise(ps, traced)
        agree(not bad, "; ".join(bad))


def test_gradients_of_tf_collectives_run_in_the_collectives_set():
    """Horovod's gradients, in the set: allreduce Sum's is the set's sum of the incoming
    gradient, allgather's a rank's block of its set average, broadcast's the set average on the
    root, reducescatter Sum's times the set's size, alltoall's sent back the way it came."""
    n, r = hvd.size(), hvd.rank()
    sets = layout(n, "overlapping") or layout(n, "disjoint")
    with added(*sets) as added_sets:
        bad = []
        for ps in [hvd.global_process_set] + added_sets:
            if not ps.included():
                continue
            R, m = ps.ranks, ps.size()
            mean = sum(q + 1.0 for q in R) / m  # the set's average of the incoming (r + 1)
            x = tf.Variable(tf.fill([r + 1, 2], 1.0))
            y = tf.Variable(tf.fill([2 * m, 2], 1.0))
            with tf.GradientTape(persistent=True) as tape:
                s = tf.reduce_sum(hvd.allreduce(y, op=hvd.Sum, process_set=ps) * (r + 1))
                g = tf.reduce_sum(hvd.allgather(x, process_set=ps) * (r + 1))
                b = tf.reduce_sum(hvd.broadcast(y, R[-1], process_set=ps) * (r + 1))
                rs = tf.reduce_sum(hvd.reducescatter(y, op=hvd.Sum, process_set=ps))
                a = tf.reduce_sum(hvd.alltoall(y, process_set=ps) * (r + 1))
            ds, dg, db, drs, da = (
                tape.gradient(v, w).numpy() for v, w in ((s, y), (g, x), (b, y), (rs, y), (a, y))
            )
            want_a = np.repeat(np.array(R, float) + 1, 2)[:, None] * np.ones((1, 2))
            if not (
                np.array_equal(ds, np.full_like(ds, sum(R) + m))
                and np.allclose(dg, mean)
                and np.allclose(db, mean if r == R[-1] else 0.0)
                and np.array_equal(drs, np.full_like(drs, m))
                and np.array_equal(da, want_a)
            ):
                bad.append(
                    f"set {R}: allreduce {ds[0]} allgather {dg[0]} broadcast {db[0]} "
                    f"reducescatter {drs[0]} alltoall {da[:, 0]}"
                )
        agree(not bad, "; ".join(bad))


def test_the_tape_and_the_keras_optimizer_reduce_within_their_set_and_non_members_keep_theirs():
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs a set that is not the global one")
    c = {q: np.array([q + 1.0, 2.0 * q]) for q in range(n)}  # rank q's gradient
    with added(range(0, n, 2)) as (evens,):
        want = (sum(c[q] for q in evens.ranks) / evens.size()) if evens.included() else c[r]
        v, local = tf.Variable(tf.zeros([2], tf.float64)), tf.Variable(tf.zeros([2], tf.float64))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * c[r]) + tf.reduce_sum(local * c[r])
        tape = hvd.DistributedGradientTape(tape, process_set=evens)
        tape.register_local_source(local)  # divided by the set's size, as Horovod does
        dv, dlocal = (t.numpy() for t in tape.gradient(loss, [v, local]))

        w = keras.Variable(np.ones(2), dtype="float64")
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=evens)
        opt.apply_gradients([(tf.constant(c[r]), w)])
        agree(
            np.allclose(dv, want)
            and np.allclose(dlocal, c[r] / evens.size())
            and np.allclose(w.numpy(), 1.0 - want),
            f"tape {dv} local {dlocal} keras {w.numpy()} vs {want}",
        )


def test_a_non_member_gets_a_value_error_before_anything_is_sent():
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("every rank is in every set at 1 rank")
    x, v = tf.ones([2]), tf.Variable(tf.ones([2]))
    with added(*layout(n, "disjoint")) as (evens, odds):
        ps = odds if r % 2 == 0 else evens
        root = ps.ranks[0]
        calls = [
            lambda: hvd.allreduce(x, process_set=ps),
            lambda: hvd.grouped_allreduce([x], process_set=ps),
            lambda: hvd.allgather(x, process_set=ps),
            lambda: hvd.grouped_allgather([x], process_set=ps),
            lambda: hvd.broadcast(x, root, process_set=ps),
            lambda: hvd.broadcast_([v], root, process_set=ps),
            lambda: hvd.alltoall(x, process_set=ps),
            lambda: hvd.reducescatter(x, process_set=ps),
            lambda: hvd.grouped_reducescatter([x], process_set=ps),
            lambda: hvd.barrier(process_set=ps),
            lambda: hvd.broadcast_variables([v], root, process_set=ps),
            lambda: hvd.broadcast_object(1, root, process_set=ps),
            lambda: hvd.allgather_object(1, process_set=ps),
            lambda: tf.function(lambda t: hvd.allreduce(t, process_set=ps))(x),  # when traced
        ]
        for call in calls:  # a ValueError too (ProcessSetArgumentError), as the numpy API raises
            raises_before_submitting(tf.errors.InvalidArgumentError, f"rank {r} is not a member", call)
            raises_before_submitting(ValueError, f"rank {r} is not a member", call)
    for exc, match, call in [
        (
            tf.errors.InvalidArgumentError,
            "is not registered",
            lambda: hvd.allreduce(x, process_set=hvd.ProcessSet([0])),
        ),
        (TypeError, "process_set must be a hvd_lite.ProcessSet", lambda: hvd.allgather(x, process_set=[0])),
        (
            ValueError,
            "is not registered",
            lambda: hvd.DistributedGradientTape(tf.GradientTape(), process_set=hvd.ProcessSet([0])),
        ),
        (
            TypeError,
            "process_set must be a hvd_lite.ProcessSet",
            lambda: hvdk.DistributedOptimizer(keras.optimizers.SGD(), process_set=object()),
        ),
    ]:
        raises_before_submitting(exc, match, call)
