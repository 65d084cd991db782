"""hvd_lite.tensorflow's and hvd_lite.keras's op=Adasum at 1-4 ranks: the allreduce (eager and in
tf.function) against the float64 reference over the core's tree (tests/helpers.py), identical bytes
on every rank, grouped calls, a process set, what is refused before anything is sent,
DistributedGradientTape, and the Keras DistributedOptimizer's delta optimizer against each rank's
own plain optimizer, its updates combined by the reference."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install -e '.[tensorflow]')")

from conftest import agree, raises_before_submitting, world  # noqa: E402
from helpers import adasum_reference, adasum_tree  # noqa: E402

import hvd_lite.keras as hvdk  # noqa: E402
import hvd_lite.tensorflow as hvd  # noqa: E402

pytestmark = pytest.mark.mpi

try:  # the machine is shared: one thread per op and between ops
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass

FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
TOL = {tf.float16: 4e-3, tf.bfloat16: 3e-2, tf.float32: 2e-6, tf.float64: 1e-13}


def as64(t) -> np.ndarray:
    return np.asarray(tf.cast(t, tf.float64)).reshape(-1)


def gathered(t) -> list:
    return world().allgather(as64(t))


def local(count: int, dtype, seed: int = 0, rank=None):
    rng = np.random.RandomState(1000 * seed + (hvd.rank() if rank is None else rank))
    return tf.cast(tf.constant(rng.rand(count) * 2 - 1), dtype)


def close_to(got, want: np.ndarray, dtype) -> tuple:
    err = float(np.max(np.abs(as64(got) - want), initial=0.0))
    scale = float(np.max(np.abs(want), initial=0.0))
    return err <= TOL[dtype] * max(scale, 1e-30), f"max error {err:.3g} against max |value| {scale:.3g}"


def same_bytes_everywhere(t) -> tuple:
    every = world().allgather(np.asarray(t).tobytes())
    return all(b == every[0] for b in every), "the result's bytes differ between ranks"


# ------------------------------------------------------------------ the allreduce


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_orthogonal_vectors_add_up(dtype):
    r, n = hvd.rank(), hvd.size()
    x = np.zeros(2 * n)
    x[2 * r], x[2 * r + 1] = r + 1, -(r + 1)
    got = hvd.allreduce(tf.cast(x, dtype), op=hvd.Adasum)
    want = np.array([v for k in range(n) for v in (k + 1, -(k + 1))], np.float64)
    agree(np.array_equal(as64(got), want), f"{got} != {want}")


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_random_vectors_match_the_reference_with_identical_bytes_on_every_rank(dtype, graph):
    x = tf.reshape(local(1200, dtype, seed=1), [30, 40])
    call = lambda t: hvd.allreduce(t, op=hvd.Adasum)  # noqa: E731
    got = tf.function(call)(x) if graph else call(x)
    ok, detail = close_to(got, adasum_tree(gathered(x)), dtype)
    same, why = same_bytes_everywhere(got)
    agree(ok and same and got.dtype == dtype and got.shape == x.shape, f"{detail}; {'' if same else why}")


def test_a_grouped_call_keeps_each_tensors_norms_its_own():
    ts = [local(50, tf.float32, seed=7) * 100, local(3, tf.float32, seed=8), local(1000, tf.float32, seed=9)]
    grouped = hvd.grouped_allreduce(ts, op=hvd.Adasum)
    alone = [hvd.allreduce(t, op=hvd.Adasum) for t in ts]
    want = adasum_reference(world().allgather(np.concatenate([as64(t) for t in ts])), [50, 3, 1000])
    got = np.concatenate([as64(g) for g in grouped])
    agree(
        np.allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
        and all(np.array_equal(np.asarray(g), np.asarray(a)) for g, a in zip(grouped, alone)),
        f"grouped {got[:4]} want {want[:4]}",
    )


def test_a_process_set_reduces_over_its_ranks_only():
    n = hvd.size()
    if n == 1:
        pytest.skip("a set other than the global one needs 2 ranks or more")
    ranks = list(range(1, n)) if n > 2 else [1]
    ps = hvd.add_process_set(ranks)
    try:
        x = local(500, tf.float32, seed=14)
        every = gathered(x)
        if hvd.rank() in ranks:
            got = hvd.allreduce(x, op=hvd.Adasum, process_set=ps)
            ok, detail = close_to(got, adasum_tree([every[r] for r in ranks]), tf.float32)
        else:
            ok, detail = True, ""
        agree(ok, detail)
    finally:
        hvd.remove_process_set(ps)


def test_keras_allreduce_takes_adasum():
    x = local(40, tf.float32, seed=15)
    agree(*close_to(hvdk.allreduce(x.numpy(), op=hvdk.Adasum), adasum_tree(gathered(x)), tf.float32))


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.uint8], ids=lambda d: d.name)
def test_adasum_of_data_that_is_not_floating_point_is_a_type_error(dtype, graph):
    def call():
        f = lambda: hvd.grouped_allreduce([tf.ones([2]), tf.ones([3], dtype)], op=hvd.Adasum)  # noqa: E731
        return tf.function(f)() if graph else f()

    raises_before_submitting(TypeError, dtype.name, call)


@pytest.mark.parametrize("call", ["reducescatter", "grouped_reducescatter", "keras"])
def test_reducescatter_refuses_adasum(call):
    t = tf.ones([4 * hvd.size()])
    f = {
        "reducescatter": lambda: hvd.reducescatter(t, op=hvd.Adasum),
        "grouped_reducescatter": lambda: hvd.grouped_reducescatter([t], op=hvd.Adasum),
        "keras": lambda: hvdk.reducescatter(t.numpy(), op=hvdk.Adasum),
    }[call]
    raises_before_submitting(ValueError, "Adasum applies to allreduce only", f)


def slices():
    return tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 2]), tf.constant([4, 3]))


@pytest.mark.parametrize("call", ["allreduce", "grouped_allreduce", "tape"])
def test_indexed_slices_with_adasum_are_refused_naming_sparse_as_dense(call):
    if call == "tape" and hvd.size() == 1:
        pytest.skip("one rank reduces nothing: the tape gives its gradients as they are, as Horovod's")

    def tape():
        v = tf.Variable(tf.ones([4, 3]))
        with tf.GradientTape() as t:
            loss = tf.reduce_sum(tf.gather(v, [0, 2]))
        return hvd.DistributedGradientTape(t, op=hvd.Adasum).gradient(loss, [v])

    f = {
        "allreduce": lambda: hvd.allreduce(slices(), op=hvd.Adasum),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([tf.ones([2]), slices()], op=hvd.Adasum),
        "tape": tape,
    }[call]
    raises_before_submitting(NotImplementedError, "sparse_as_dense=True", f)


def test_sparse_as_dense_takes_the_slices_through_adasum():
    v = tf.Variable(tf.ones([4, 3]))
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(tf.gather(v, [0, hvd.rank() % 4])) * (hvd.rank() + 1)
    (g,) = hvd.DistributedGradientTape(t, op=hvd.Adasum, sparse_as_dense=True).gradient(loss, [v])
    dense = np.zeros([4, 3])
    dense[0] += hvd.rank() + 1
    dense[hvd.rank() % 4] += hvd.rank() + 1
    agree(*close_to(g, adasum_tree(world().allgather(dense.reshape(-1))), tf.float32))


# ------------------------------------------------------------------ DistributedGradientTape


def mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(2)]
    )


def batch(step: int, rank: int, rows: int = 8):
    rng = np.random.RandomState(100 * step + rank)
    x = rng.rand(rows, 4).astype("float32")
    return x, (x[:, :2] * 2 - x[:, 2:]).astype("float32")


def grads_of(m, step, rank, tape_wrap=lambda t: t):
    x, y = batch(step, rank)
    with tf.GradientTape() as t:
        loss = tf.reduce_mean((m(x) - y) ** 2)
    return tape_wrap(t).gradient(loss, m.trainable_variables)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_the_tape_combines_the_ranks_gradients_by_adasum(graph):
    m = mlp()
    mine = grads_of(m, 0, hvd.rank())

    def reduced():
        return grads_of(m, 0, hvd.rank(), lambda t: hvd.DistributedGradientTape(t, op=hvd.Adasum, groups=2))

    got = tf.function(reduced)() if graph else reduced()
    results = [close_to(g, adasum_tree(gathered(w)), tf.float32) for g, w in zip(got, mine)]
    agree(all(ok for ok, _ in results), str([d for _, d in results]))


# ------------------------------------------------------------------ the Keras DistributedOptimizer


def sgd():
    return keras.optimizers.SGD(learning_rate=0.3, momentum=0.9)


def adam():
    return keras.optimizers.Adam(learning_rate=0.05)


def values(m):
    return [np.asarray(v.numpy(), np.float64) for v in m.trainable_variables]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("make", [sgd, adam], ids=["sgd-momentum", "adam"])
def test_the_delta_optimizer_matches_every_ranks_own_update_combined(make, passes, graph):
    """Each rank's twin (a plain optimizer of the same kind, stepping on the same batches from the
    same weights) gives this rank's update over `passes` local steps; the reference tree combines
    the ranks' updates, and the distributed model must hold the weights before plus that."""
    m, twin = mlp(), mlp()
    opt = hvdk.DistributedOptimizer(make(), op=hvdk.Adasum, backward_passes_per_step=passes)
    plain = make()

    def step(grads):
        opt.apply_gradients(zip(grads, m.trainable_variables))

    opt.build(m.trainable_variables)
    run = tf.function(step) if graph else step
    problems = []
    for window in range(3):
        start = values(m)
        for v, w in zip(twin.trainable_variables, start):
            v.assign(w.astype(np.float32))
        for k in range(passes):
            s = window * passes + k
            plain.apply_gradients(zip(grads_of(twin, s, hvd.rank()), twin.trainable_variables))
            run(grads_of(m, s, hvd.rank()))
        deltas = [t - w for t, w in zip(values(twin), start)]
        every = world().allgather(deltas)
        for i, (got, w) in enumerate(zip(values(m), start)):
            want = w.reshape(-1) + adasum_tree([d[i].reshape(-1) for d in every])
            err = float(np.abs(got.reshape(-1) - want).max())
            if err > 1e-5:
                problems.append(f"window {window} variable {i}: max error {err:.3g}")
        same, why = same_bytes_everywhere(np.concatenate([v.reshape(-1) for v in values(m)]))
        if not same:
            problems.append(f"window {window}: {why}")
    agree(not problems, "; ".join(problems))


def test_model_fit_trains_with_identical_weights_on_every_rank():
    m = mlp()
    x, y = batch(0, hvd.rank(), rows=64)
    m.compile(
        optimizer=hvdk.DistributedOptimizer(sgd(), op=hvdk.Adasum, backward_passes_per_step=2), loss="mse"
    )
    first = m.evaluate(x, y, verbose=0)
    m.fit(x, y, batch_size=8, epochs=3, verbose=0)
    last = m.evaluate(x, y, verbose=0)
    same, why = same_bytes_everywhere(np.concatenate([v.reshape(-1) for v in values(m)]))
    agree(same and last < first, f"loss {first} -> {last}; {'' if same else why}")


def test_a_local_variable_keeps_its_local_step():
    """PartialDistributedOptimizer: the local layer's update is its own (the gradient scaled by
    1/size, as scale_local_gradients says), never combined; the others are."""
    m = mlp()
    opt = hvdk.PartialDistributedOptimizer(
        keras.optimizers.SGD(learning_rate=0.3), op=hvdk.Adasum, local_layers=[m.layers[1]]
    )
    start = values(m)
    g = grads_of(m, 0, hvd.rank())
    opt.apply_gradients(zip(g, m.trainable_variables))
    n = hvd.size()
    want_local = [w - 0.3 * np.asarray(x, np.float64) / n for w, x in zip(start[2:], g[2:])]
    ok = all(np.allclose(v, w, atol=1e-6) for v, w in zip(values(m)[2:], want_local))
    every = world().allgather([-0.3 * np.asarray(x, np.float64).reshape(-1) for x in g[:2]])
    want_shared = [start[i].reshape(-1) + adasum_tree([d[i] for d in every]) for i in range(2)]
    ok_shared = all(np.allclose(values(m)[i].reshape(-1), want_shared[i], atol=1e-5) for i in range(2))
    agree(ok and ok_shared, f"local ok {ok}, shared ok {ok_shared}")


def test_tensorflow_distributed_optimizer_takes_adasum():
    opt = hvd.DistributedOptimizer(sgd(), op=hvd.Adasum)
    agree(type(opt).__name__ == "SGD" and hasattr(opt, "_hvd_reduction"))


@pytest.mark.parametrize(
    "make, kwargs, match",
    [
        (sgd, {"average_aggregated_gradients": True}, "average_aggregated_gradients"),
        (lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), {}, "gradient_accumulation_steps"),
        (sgd, {"gradient_predivide_factor": 2.0}, "gradient_predivide_factor"),
    ],
    ids=["average_aggregated_gradients", "gradient_accumulation_steps", "predivide"],
)
def test_what_the_adasum_optimizer_refuses_is_a_value_error(make, kwargs, match):
    raises_before_submitting(
        ValueError, match, lambda: hvdk.DistributedOptimizer(make(), op=hvdk.Adasum, **kwargs)
    )
