"""hvd_lite.keras with tf_keras (Keras 2, what tf.keras is under TF_USE_LEGACY_KERAS=1) at 1-4 ranks:
DistributedOptimizer over tf_keras's current and legacy optimizers (backward_passes_per_step,
average_aggregated_gradients, sparse_as_dense), the callbacks, load_model, and model.fit, each
against one process training on the same global batches. Runs under TF_USE_LEGACY_KERAS=1, as
ci/test.sh's second Keras pass runs it (with test_keras_strategy.py); skipped without tf_keras
(pip install --no-deps tf_keras==2.21.0)."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
K = pytest.importorskip(
    "tf_keras", reason="tf_keras is not installed (pip install --no-deps tf_keras==2.21.0)"
)
if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() not in ("1", "true"):
    pytest.skip("runs under TF_USE_LEGACY_KERAS=1 (ci/test.sh's second Keras pass)", allow_module_level=True)

from conftest import agree, engine_calls, everywhere, raises_on_every_rank  # noqa: E402

import hvd_lite.keras as hvdk  # noqa: E402
import hvd_lite.tensorflow as hvd  # noqa: E402
import hvd_lite.tensorflow.keras as hvdtk  # noqa: E402

pytestmark = pytest.mark.mpi

try:  # the machine is shared: one thread per op and between ops
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass

G = 12  # global batch: divisible by 1, 2, 3 and 4 ranks
OPTIMIZERS = {
    "current": lambda lr, **kw: K.optimizers.Adam(lr, **kw),
    "legacy": lambda lr, **kw: K.optimizers.legacy.Adam(lr, **kw),
}
SGDS = {"current": K.optimizers.SGD, "legacy": K.optimizers.legacy.SGD}


def data(rows=3 * G, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(rows, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
    return x, y


def shard(a):
    """This rank's block of every global batch of G rows."""
    r, n = hvd.rank(), hvd.size()
    per = G // n
    return np.concatenate([a[i + r * per : i + (r + 1) * per] for i in range(0, len(a), G)])


def mlp(seed=0):
    K.utils.set_random_seed(seed)
    return K.Sequential([K.Input((4,)), K.layers.Dense(5, activation="tanh"), K.layers.Dense(1)])


def weights(model):
    return [np.array(w) for w in model.get_weights()]


def close(a, b, tol=1e-5):
    bad = [float(np.abs(x - y).max()) for x, y in zip(a, b) if not np.allclose(x, y, atol=tol)]
    return not bad, f"max differences {bad}"


def same_on_every_rank(arrays):
    gathered = hvd.allgather_object([np.asarray(a) for a in arrays])
    return all(all(np.array_equal(a, b) for a, b in zip(g, gathered[0])) for g in gathered)


# ------------------------------------------------------------------ DistributedOptimizer and fit


@pytest.mark.parametrize("family", sorted(OPTIMIZERS))
def test_fit_with_the_distributed_optimizer_and_callbacks_matches_one_process_on_every_rank(family):
    x, y = data()
    model = mlp(seed=100 + hvd.rank())  # different on each rank: the callback broadcasts rank 0's
    ref = mlp(seed=100)
    opt = hvdk.DistributedOptimizer(OPTIMIZERS[family](0.01))
    with everywhere("the wrapped optimizer keeps its class's name and kind"):
        assert type(opt).__name__ == "Adam" and isinstance(opt, type(OPTIMIZERS[family](0.01)))
    model.compile(optimizer=opt, loss="mse")
    ref.compile(optimizer=OPTIMIZERS[family](0.01), loss="mse")
    hist = model.fit(
        shard(x),
        shard(y),
        batch_size=G // hvd.size(),
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[
            hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
            hvdk.callbacks.MetricAverageCallback(),
        ],
    )
    ref.fit(x, y, batch_size=G, epochs=2, shuffle=False, verbose=0)
    ok, detail = close(weights(model), weights(ref), 1e-4)
    losses = hvd.allgather_object(hist.history["loss"])
    agree(
        ok and same_on_every_rank(weights(model)) and all(np.allclose(ln, losses[0]) for ln in losses),
        f"{detail}; losses {losses}",
    )


@pytest.mark.parametrize("family,average", [("current", False), ("legacy", True)])
def test_backward_passes_per_step_accumulates_locally_and_reduces_once_per_n_passes(family, average):
    """4 passes with n=2: 2 reductions (counted at the engine), each of the sum of the 2 passes'
    gradients (or their mean); `iterations` counts every pass, as in Horovod (so that an update
    that reads it, Adam's, is not one process's: SGD's is)."""
    x, y = data(rows=4 * G)
    model, ref = mlp(), mlp()
    opt = hvdk.DistributedOptimizer(
        SGDS[family](0.05), backward_passes_per_step=2, average_aggregated_gradients=average
    )
    model.compile(optimizer=opt, loss="mse")
    with engine_calls() as calls:
        model.fit(shard(x), shard(y), batch_size=G // hvd.size(), epochs=1, shuffle=False, verbose=0)
    entries = sum(1 for kind, _ in calls if kind == "submit")
    reductions = entries / len(model.trainable_variables)
    ref_opt = SGDS[family](0.05)
    for i in range(0, 4 * G, 2 * G):  # one process: the 2 global batches' gradients, summed
        grads = []
        for j in (i, i + G):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((ref(x[j : j + G]) - y[j : j + G]) ** 2)
            grads.append(tape.gradient(loss, ref.trainable_variables))
        total = [(a + b) / (2 if average else 1) for a, b in zip(*grads)]
        ref_opt.apply_gradients(zip(total, ref.trainable_variables))
    ok, detail = close(weights(model), weights(ref))
    want = 2 if hvd.size() > 1 else 0
    iterations = int(opt.iterations.numpy())
    agree(
        ok and reductions == want and iterations == 4, f"{detail}; {reductions} reductions, {iterations} its"
    )


def embedding_model(seed=0):
    K.utils.set_random_seed(seed)
    return K.Sequential([K.Input((3,), dtype="int32"), K.layers.Embedding(10, 2), K.layers.Flatten()])


@pytest.mark.parametrize("passes", [1, 2])
def test_sparse_gradients_are_reduced_and_sparse_as_dense_lets_them_accumulate(passes):
    """An Embedding's IndexedSlices gradient: reduced as slices (n=1) or densified and accumulated
    (sparse_as_dense=True, n=2), matching one process; n=2 without sparse_as_dense is refused."""
    rng = np.random.RandomState(1)
    x = rng.randint(0, 10, (2 * G, 3)).astype("int32")
    y = rng.rand(2 * G, 6).astype("float32")
    model, ref = embedding_model(), embedding_model()
    opt = hvdk.DistributedOptimizer(
        K.optimizers.SGD(0.5), sparse_as_dense=passes > 1, backward_passes_per_step=passes
    )
    model.compile(optimizer=opt, loss="mse")
    model.fit(shard(x), shard(y), batch_size=G // hvd.size(), epochs=1, shuffle=False, verbose=0)
    ref_opt = K.optimizers.SGD(0.5)
    grads = []
    for j in range(0, 2 * G, G):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((ref(x[j : j + G]) - y[j : j + G]) ** 2)
        (g,) = tape.gradient(loss, ref.trainable_variables)
        if passes == 1:
            ref_opt.apply_gradients([(g, ref.trainable_variables[0])])
        else:
            grads.append(tf.convert_to_tensor(g))
    if passes > 1:
        ref_opt.apply_gradients([(grads[0] + grads[1], ref.trainable_variables[0])])
    agree(*close(weights(model), weights(ref)))
    if passes > 1:
        refused = embedding_model()
        refused.compile(
            optimizer=hvdk.DistributedOptimizer(K.optimizers.SGD(0.5), backward_passes_per_step=2), loss="mse"
        )
        raises_on_every_rank(
            ValueError,
            "sparse_as_dense=True",
            lambda: refused.fit(shard(x), shard(y), batch_size=G // hvd.size(), epochs=1, verbose=0),
        )


def test_a_custom_loop_as_horovods_benchmark_writes_it_matches_one_process():
    """hvd_lite.tensorflow's DistributedGradientTape with a tf_keras optimizer in a tf.function,
    the variables broadcast after the first step (opt.variables() called, as tf_keras allows), and
    hvd_lite.tensorflow.DistributedOptimizer's apply_gradients in a second loop."""
    x, y = data()
    model = mlp(seed=7 + hvd.rank())
    opt, ref_opt = K.optimizers.SGD(0.1), K.optimizers.SGD(0.1)

    @tf.function
    def step(xb, yb, first):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)

    # the broadcast after the first step gives every rank rank 0's weights and optimizer state
    xs, ys = shard(x), shard(y)
    per = G // hvd.size()
    for i in range(len(x) // G):
        step(xs[i * per : (i + 1) * per], ys[i * per : (i + 1) * per], i == 0)
    same = same_on_every_rank(weights(model))

    dist = hvd.DistributedOptimizer(K.optimizers.legacy.SGD(0.1))
    model2 = mlp(seed=9)
    ref2 = mlp(seed=9)

    @tf.function
    def step2(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model2(xb) - yb) ** 2)
        dist.apply_gradients(zip(tape.gradient(loss, model2.trainable_variables), model2.trainable_variables))

    for i in range(len(x) // G):
        step2(xs[i * per : (i + 1) * per], ys[i * per : (i + 1) * per])
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((ref2(x[i * G : (i + 1) * G]) - y[i * G : (i + 1) * G]) ** 2)
        grads = tape.gradient(loss, ref2.trainable_variables)
        ref_opt.apply_gradients(zip(grads, ref2.trainable_variables))
    ok, detail = close(weights(model2), weights(ref2))
    agree(same and ok, f"same on every rank: {same}; {detail}")


# ------------------------------------------------------------------ callbacks


def test_callbacks_are_the_kind_tf_keras_names_and_either_kind_runs_under_tf_keras_fit():
    cb = hvdtk.callbacks.MetricAverageCallback()
    with everywhere("the callbacks' base class"):
        assert isinstance(cb, tf.keras.callbacks.Callback), type(cb).__mro__
        assert hvdtk.callbacks.MetricAverageCallback is hvdk.MetricAverageCallback


def test_learning_rate_warmup_ramps_and_corrects_a_legacy_optimizers_momentum_for_each_batch():
    """Horovod's schedule: lr(e) = lr / n * ((e + 1 / steps) * (n - 1) / warmup + 1) at each batch of
    the warmup epochs; a legacy SGD's momentum is m * new_lr / old_lr during the batch that changed
    the rate, and m again after it."""
    n, steps = hvd.size(), 3
    x, y = data(rows=steps * G)
    model = mlp()
    opt = K.optimizers.legacy.SGD(0.4, momentum=0.5)
    model.compile(optimizer=opt, loss="mse")
    seen, during, after = [], [], []
    record = K.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: during.append(float(opt.momentum.numpy())),
        on_train_batch_end=lambda b, logs: seen.append(float(opt.learning_rate.numpy())),
    )
    restored = K.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: after.append(float(opt.momentum.numpy()))
    )
    warm = hvdk.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    hist = model.fit(x, y, batch_size=G, epochs=3, verbose=0, callbacks=[warm, record])
    model.fit(x, y, batch_size=G, epochs=1, verbose=0, callbacks=[restored])
    want = [
        0.4 / n * ((e + b / steps + 1 / steps) * (n - 1) / 2 + 1) for e in range(2) for b in range(steps)
    ] + [0.4] * steps
    old = [0.4] + want[:-1]
    want_m = [0.5 * w / o for w, o in zip(want[:6], old[:6])] + [0.5] * steps
    agree(
        np.allclose(seen, want)
        and np.allclose(hist.history["lr"], [want[2], 0.4, 0.4])
        and np.allclose(during, want_m)
        and np.allclose(after, 0.5),
        f"lr {seen} vs {want}; momentum {during} vs {want_m}, then {after}",
    )


def test_a_momentum_the_step_reads_as_a_constant_is_refused_and_a_schedule_needs_a_float_rate():
    model = mlp()
    model.compile(optimizer=K.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    x, y = data(rows=G)
    raises_on_every_rank(
        ValueError,
        "momentum_correction=True cannot be applied",
        lambda: model.fit(x, y, verbose=0, callbacks=[hvdk.LearningRateWarmupCallback(0.1, warmup_epochs=1)]),
    )
    model.compile(
        optimizer=K.optimizers.SGD(K.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)), loss="mse"
    )
    raises_on_every_rank(
        ValueError,
        "a schedule",
        lambda: model.fit(x, y, verbose=0, callbacks=[hvdk.LearningRateScheduleCallback(0.1, 0.5)]),
    )


def test_keras_3_callbacks_still_run_under_keras_3_fit():
    """Under TF_USE_LEGACY_KERAS=1 the callbacks are tf_keras's; a Keras 3 model's fit takes them too."""
    import keras

    keras.utils.set_random_seed(hvd.rank())
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = data()
    model.fit(
        shard(x),
        shard(y),
        batch_size=G // hvd.size(),
        epochs=1,
        verbose=0,
        callbacks=[hvdk.BroadcastGlobalVariablesCallback(0), hvdk.MetricAverageCallback()],
    )
    agree(same_on_every_rank([v.numpy() for v in model.weights]), "weights differ across ranks")


# ------------------------------------------------------------------ load_model


# (tf_keras's own .keras format keeps no state of a legacy optimizer: it loads unbuilt)
@pytest.mark.parametrize("family,fmt", [("current", "keras"), ("current", "h5"), ("legacy", "h5")])
def test_a_saved_model_loads_with_its_optimizer_wrapped_and_its_state_kept(tmp_path, family, fmt):
    model = K.Sequential([K.Input((2,)), K.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(OPTIMIZERS[family](0.01)), loss="mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    path = str(tmp_path / f"m{hvd.rank()}.{fmt}")
    model.save(path)
    plain = K.models.load_model(path)  # loads without hvd_lite: the class is Adam's
    loaded = hvdk.load_model(path, custom_optimizers=[type(OPTIMIZERS[family](0.01))])
    saved = [np.asarray(v.numpy()) for v in plain.optimizer.variables()]
    kept = [np.asarray(v.numpy()) for v in loaded.optimizer.variables()]
    with everywhere("load_model"):
        assert type(plain.optimizer).__name__ == "Adam"
        assert hasattr(loaded.optimizer, "_hvd_reduction")
        assert isinstance(loaded.optimizer, type(OPTIMIZERS[family](0.01)))
        assert len(saved) == len(kept) and all(np.array_equal(a, b) for a, b in zip(saved, kept))
        assert int(loaded.optimizer.iterations.numpy()) == 1
    loaded.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)  # and it trains on


def test_load_model_with_legacy_opts_takes_a_legacy_optimizer_and_refuses_a_current_one(tmp_path):
    model = K.Sequential([K.Input((2,)), K.layers.Dense(1)])
    model.compile(optimizer=K.optimizers.Adam(0.01), loss="mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    path = str(tmp_path / f"l{hvd.rank()}.h5")
    model.save(path)
    legacy_model = K.Sequential([K.Input((2,)), K.layers.Dense(1)])
    legacy_model.compile(optimizer=K.optimizers.legacy.Adam(0.01), loss="mse")
    legacy_model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    legacy_path = str(tmp_path / f"k{hvd.rank()}.h5")
    legacy_model.save(legacy_path)
    loaded = hvdk.load_model(legacy_path, custom_optimizers=[K.optimizers.legacy.Adam], legacy_opts=True)
    with everywhere("legacy_opts"):
        assert isinstance(loaded.optimizer, K.optimizers.legacy.Adam), type(loaded.optimizer).__mro__
        assert hasattr(loaded.optimizer, "_hvd_reduction")
    raises_on_every_rank(
        ValueError,
        "saved with a tf_keras.optimizers.Adam",
        lambda: hvdk.load_model(path, custom_optimizers=[K.optimizers.legacy.Adam], legacy_opts=True),
    )


def test_arguments_a_tf_keras_optimizer_cannot_take_are_refused_before_anything_is_sent():
    opt = K.optimizers.SGD(0.1)
    raises_on_every_rank(ValueError, "op=Adasum", lambda: hvdk.DistributedOptimizer(opt, op=hvd.Adasum))
    raises_on_every_rank(
        ValueError,
        "backward_passes_per_step",
        lambda: hvdk.DistributedOptimizer(opt, backward_passes_per_step=0),
    )
    raises_on_every_rank(TypeError, "tf_keras", lambda: hvdk.DistributedOptimizer(object()))


def test_load_model_loads_a_file_with_the_keras_that_saved_it(tmp_path):
    """Under TF_USE_LEGACY_KERAS=1 a Keras 3 file still loads as Keras 3, a tf_keras one as tf_keras."""
    import keras

    k3 = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    k3.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    k2 = K.Sequential([K.Input((2,)), K.layers.Dense(1)])
    k2.compile(optimizer=K.optimizers.Adam(0.01), loss="mse")
    loaded = {}
    for name, model in (("k3", k3), ("k2", k2)):
        model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
        path = str(tmp_path / f"{name}-{hvd.rank()}.keras")
        model.save(path)
        loaded[name] = hvdk.load_model(path)
    with everywhere("load_model's Keras"):
        assert isinstance(loaded["k3"], keras.Model) and isinstance(
            loaded["k3"].optimizer, keras.optimizers.Adam
        )
        assert isinstance(loaded["k2"], K.Model) and isinstance(loaded["k2"].optimizer, K.optimizers.Adam)
        assert all(hasattr(m.optimizer, "_hvd_reduction") for m in loaded.values())
