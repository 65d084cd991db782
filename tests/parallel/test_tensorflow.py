"""hvd_lite.tensorflow and hvd_lite.keras at 1-4 ranks: the collectives on tf tensors (eager and in
tf.function), DistributedGradientTape, the Keras DistributedOptimizer and callbacks, and
MultiWorkerMirroredStrategy under Keras model.fit and a custom loop, each against one process
training on the same global batches."""

import json
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install -e '.[tensorflow]')")

from conftest import agree, everywhere, raises_before_submitting, raises_on_every_rank, world  # noqa: E402

import hvd_lite.keras as hvdk  # noqa: E402
import hvd_lite.tensorflow as hvd  # noqa: E402

pytestmark = pytest.mark.mpi

try:  # the machine is shared: one thread per op and between ops
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass

G = 12  # global batch: divisible by 1, 2, 3 and 4 ranks


def data(rows=3 * G, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(rows, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
    return x, y


def shard(a):
    """This rank's block of every global batch of G rows (as the strategy's rebatch gives)."""
    r, n = hvd.rank(), hvd.size()
    per = G // n
    return np.concatenate([a[i + r * per : i + (r + 1) * per] for i in range(0, len(a), G)])


def mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(1)]
    )


def weights(model):
    return [v.numpy().copy() for v in model.weights]


def close(a, b, tol=1e-5):
    bad = [float(np.abs(x - y).max()) for x, y in zip(a, b) if not np.allclose(x, y, atol=tol)]
    return not bad, f"max differences {bad}"


# ------------------------------------------------------------------ collectives on tensors


def test_collectives_on_tensors_eager_and_in_tf_function_give_the_same_results():
    r, n = hvd.rank(), hvd.size()

    def step(x):
        return (
            hvd.allreduce(x, op=hvd.Sum),
            hvd.allreduce(x),
            hvd.allgather(tf.fill([r + 1, 2], tf.cast(r, tf.float32))),
            hvd.broadcast(x, root_rank=n - 1),
            hvd.reducescatter(tf.ones([2 * n, 3]), op=hvd.Sum),
            hvd.alltoall(tf.range(n, dtype=tf.int32) + 10 * r),
        )

    x = tf.constant([1.0, 2.0]) * (r + 1)
    want = [
        np.array([1.0, 2.0]) * n * (n + 1) / 2,
        np.array([1.0, 2.0]) * (n + 1) / 2,
        np.concatenate([np.full((q + 1, 2), q) for q in range(n)]),
        np.array([1.0, 2.0]) * n,
        np.full((2, 3), n),
        np.array([r + 10 * q for q in range(n)]),
    ]
    ok, detail = True, ""
    for mode, fn in (("eager", step), ("tf.function", tf.function(step))):
        for _ in range(2):  # a traced function runs its collectives again, in the same order
            got = [t.numpy() for t in fn(x)]
            for i, (g, w) in enumerate(zip(got, want)):
                if g.shape != w.shape or not np.allclose(g, w):
                    ok, detail = False, f"{mode} output {i}: {g} != {w}"
    agree(ok, detail)


def test_allreduce_keeps_dtype_and_scalar_shape_and_is_differentiable():
    n = hvd.size()
    s = hvd.allreduce(tf.constant(3, tf.int64), op=hvd.Sum)
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.allreduce(v * v, op=hvd.Sum))
    g = tape.gradient(y, v).numpy()
    agree(
        s.dtype == tf.int64
        and s.shape == ()
        and int(s) == 3 * n
        and np.allclose(g, 2 * n * np.array([1.0, 2.0])),
        f"{s} {g}",
    )


def test_fp16_compression_returns_the_original_dtype():
    out = hvd.grouped_allreduce(
        [tf.constant([0.5, 1.5], tf.float32)], op=hvd.Average, compression=hvd.Compression.fp16
    )[0]
    agree(out.dtype == tf.float32 and np.allclose(out.numpy(), [0.5, 1.5]), str(out))


def test_broadcast_variables_takes_the_root_value():
    r = hvd.rank()
    vs = [tf.Variable(tf.fill([3], float(r))), tf.Variable(r, dtype=tf.int64)]
    hvd.broadcast_variables(vs, root_rank=0)
    agree(np.all(vs[0].numpy() == 0) and int(vs[1].numpy()) == 0, str([v.numpy() for v in vs]))


def test_broadcast_variables_with_a_bad_later_variable_raises_everywhere_and_sends_nothing():
    r = hvd.rank()
    vs = [tf.Variable(tf.fill([3], float(r))), tf.Variable([1 + 2j], dtype=tf.complex64)]
    raises_before_submitting(
        TypeError, "unsupported dtype complex64", lambda: hvd.broadcast_variables(vs, root_rank=0)
    )
    agree(np.all(vs[0].numpy() == r), f"the first variable changed: {vs[0].numpy()}")


@pytest.mark.mpi(min_size=2)
def test_names_that_differ_after_a_nul_are_refused_eagerly_and_when_traced():
    name = "a\0x" if hvd.rank() == 0 else "a\0y"
    x = tf.ones([2])
    for call in (
        lambda: hvd.allreduce(x, name=name),
        lambda: hvd.grouped_allreduce([x], name=name),
        lambda: hvd.allgather(x, name=name),
        lambda: hvd.broadcast(x, 0, name=name),
        lambda: tf.function(lambda: hvd.allreduce(x, name=name))(),
    ):
        raises_before_submitting(ValueError, "contains a NUL character", call)


@pytest.mark.mpi(min_size=2)
def test_a_reduction_with_a_timeout_raises_collective_error_when_a_rank_never_submits():
    """Rank 0 does not submit 'tf.timeout' until the others have given up on it: they raise
    CollectiveError within the timeout (plus a little) and carry on; the collective they left
    in flight completes when rank 0 submits it at last."""
    import time

    from hvd_lite.exceptions import CollectiveError
    from hvd_lite.tensorflow.mpi_ops import _grouped_allreduce

    x = tf.fill([4], float(hvd.rank() + 1))
    err, took = None, 0.0
    if hvd.rank() != 0:
        t0 = time.monotonic()
        try:
            _grouped_allreduce([x], hvd.Sum, name="tf.timeout", timeout=1.0)
        except CollectiveError as exc:
            err = exc
        took = time.monotonic() - t0
    world().barrier()
    if hvd.rank() == 0:
        hvd.grouped_allreduce([x], op=hvd.Sum, name="tf.timeout")  # completes the others' too
    out = hvd.allreduce(x, op=hvd.Sum, name="tf.after.timeout")
    n = hvd.size()
    ok = np.allclose(out.numpy(), n * (n + 1) / 2)
    if hvd.rank() != 0:
        ok = ok and err is not None and "not done after 1.0 s" in str(err) and 1.0 <= took < 2.0
    agree(ok, f"{err!r} after {took:.2f} s; then {out.numpy()}")


# ------------------------------------------------------------------ DistributedGradientTape


def test_distributed_gradient_tape_matches_one_process_on_the_global_batch():
    x, y = data()
    local, ref = mlp(), mlp()
    opt_l, opt_r = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)

    @tf.function
    def dist_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((local(xb) - yb) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, local.trainable_variables)
        opt_l.apply_gradients(zip(grads, local.trainable_variables))

    def ref_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((ref(xb) - yb) ** 2)
        opt_r.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))

    xs, ys = shard(x), shard(y)
    per = G // hvd.size()
    for i in range(len(x) // G):
        dist_step(xs[i * per : (i + 1) * per], ys[i * per : (i + 1) * per])
        ref_step(x[i * G : (i + 1) * G], y[i * G : (i + 1) * G])
    agree(*close(weights(local), weights(ref)))


# ------------------------------------------------------------------ hvd_lite.keras


def test_keras_distributed_optimizer_and_callbacks_match_one_process_fit():
    x, y = data()
    r = hvd.rank()
    model = mlp(seed=100 + r)  # different on each rank: the callback broadcasts rank 0's
    ref = mlp(seed=100)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    hist = model.fit(
        shard(x),
        shard(y),
        batch_size=G // hvd.size(),
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[hvdk.BroadcastGlobalVariablesCallback(0), hvdk.MetricAverageCallback()],
    )
    ref.fit(x, y, batch_size=G, epochs=2, shuffle=False, verbose=0)
    ok, detail = close(weights(model), weights(ref), 1e-4)
    losses = hvd.allgather_object(hist.history["loss"])
    agree(ok and all(np.allclose(ln, losses[0]) for ln in losses), f"{detail}; losses {losses}")


def test_learning_rate_warmup_ramps_from_lr_over_size_to_lr_batch_by_batch():
    """Horovod's schedule: lr(e) = lr / n * ((e + 1 / steps) * (n - 1) / warmup + 1) at each batch
    of the warmup epochs, then lr; the epoch's logs carry it."""
    n, steps = hvd.size(), 3
    x, y = data(rows=steps * G)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.4), loss="mse")
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: seen.append(float(model.optimizer.learning_rate.numpy()))
    )
    warm = hvdk.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    hist = model.fit(x, y, batch_size=G, epochs=3, verbose=0, callbacks=[warm, record])
    want = [
        0.4 / n * ((e + b / steps + 1 / steps) * (n - 1) / 2 + 1) for e in range(2) for b in range(steps)
    ] + [0.4] * steps  # epoch 3: left at 0.4
    agree(
        np.allclose(seen, want) and np.allclose(hist.history["lr"], [want[2], 0.4, 0.4]),
        f"{seen} vs {want}; logged {hist.history['lr']}",
    )


def test_a_momentum_correction_keras_cannot_apply_is_refused_and_a_schedule_needs_a_float_rate():
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    x, y = data(rows=G)
    raises_on_every_rank(
        ValueError,
        "momentum_correction=True cannot be applied",
        lambda: model.fit(x, y, verbose=0, callbacks=[hvdk.LearningRateWarmupCallback(0.1, warmup_epochs=1)]),
    )
    model.compile(
        optimizer=keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)), loss="mse"
    )
    raises_on_every_rank(
        ValueError,
        "a schedule",
        lambda: model.fit(x, y, verbose=0, callbacks=[hvdk.LearningRateScheduleCallback(0.1, 0.5)]),
    )


@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_per_step_accumulates_locally_and_reduces_once_per_n_passes(average):
    """4 passes with n=2: 2 reductions (counted at the engine); the update is Horovod's: the sum of
    the 2 passes' gradients (or their mean), averaged over ranks: one process applying the summed
    (or averaged) global-batch gradients of each pair of batches matches it."""
    from conftest import engine_calls

    x, y = data(rows=4 * G)
    model, ref = mlp(), mlp()
    opt = hvdk.DistributedOptimizer(
        keras.optimizers.SGD(0.05), backward_passes_per_step=2, average_aggregated_gradients=average
    )
    model.compile(optimizer=opt, loss="mse")
    with engine_calls() as calls:
        model.fit(shard(x), shard(y), batch_size=G // hvd.size(), epochs=1, shuffle=False, verbose=0)
    # a reduction submits one entry per gradient (under a trace-time name, the same each step)
    entries = sum(1 for kind, _ in calls if kind == "submit")
    reductions = entries / len(model.trainable_variables)
    ref_opt = keras.optimizers.SGD(0.05)
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
    agree(ok and reductions == want, f"{detail}; {reductions} reductions")


def test_the_callbacks_run_under_tf_keras_fit_too():
    """Without TF_USE_LEGACY_KERAS the callbacks are Keras 3's; a tf_keras model's fit takes them
    (broadcast, warmup, metric average) as well."""
    K = pytest.importorskip(
        "tf_keras", reason="tf_keras is not installed (pip install --no-deps tf_keras==2.21.0)"
    )
    K.utils.set_random_seed(hvd.rank())
    model = K.Sequential([K.Input((4,)), K.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(K.optimizers.SGD(0.1)), loss="mse")
    x, y = data()
    warm = hvdk.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1)
    hist = model.fit(
        shard(x),
        shard(y),
        batch_size=G // hvd.size(),
        epochs=2,
        verbose=0,
        callbacks=[hvdk.BroadcastGlobalVariablesCallback(0), warm, hvdk.MetricAverageCallback()],
    )
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    every = hvd.allgather_object((flat, hist.history["loss"]))
    agree(
        all(np.array_equal(f, every[0][0]) and np.allclose(ln, every[0][1]) for f, ln in every)
        and np.allclose(hist.history["lr"], [0.1, 0.1]),
        f"weights or losses differ across ranks, or lr {hist.history['lr']}",
    )


def test_keras_refuses_a_backend_other_than_tensorflow(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    raises_on_every_rank(hvd.HvdLiteError, "'jax' backend", hvdk._check_backend)


# ------------------------------------------------------------------ MultiWorkerMirroredStrategy


@pytest.fixture(scope="module")
def strategy():
    return hvd.MultiWorkerMirroredStrategy()


def test_strategy_describes_the_mpi_world(strategy):
    r, n = hvd.rank(), hvd.size()
    cr = strategy.cluster_resolver
    spec = cr.cluster_spec().as_dict()
    agree(
        strategy.num_replicas_in_sync == n
        and cr.task_type == "worker"
        and cr.task_id == r
        and len(spec["worker"]) == n
        and strategy.extended.should_checkpoint == (r == 0)
        and strategy.extended.should_save_summary == (r == 0)
        and not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
        f"{strategy.num_replicas_in_sync} {cr.task_type} {cr.task_id} {spec}",
    )


def test_differently_seeded_models_start_identical_in_the_scope(strategy):
    with strategy.scope():
        model = mlp(seed=hvd.rank())
    w = np.concatenate([a.ravel() for a in weights(model)])
    every = hvd.allgather_object(w)
    agree(all(np.array_equal(e, every[0]) for e in every), "weights differ")


def test_fit_under_the_strategy_matches_one_process_on_the_global_batches(strategy):
    x, y = data()
    with strategy.scope():
        model = mlp(seed=hvd.rank())
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    ref = mlp()
    ref.set_weights(model.get_weights())
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(G)
    model.fit(ds, epochs=2, verbose=0)
    ref.fit(ds, epochs=2, verbose=0)
    agree(*close(weights(model), weights(ref)))


def test_custom_loop_with_compute_average_loss_matches_one_process(strategy):
    x, y = data()
    with strategy.scope():
        model = mlp(seed=7)
        opt = keras.optimizers.SGD(0.1)
    ref, ref_opt = mlp(), keras.optimizers.SGD(0.1)
    ref.set_weights(model.get_weights())
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(G))

    @tf.function
    def train_step(batch):
        def step(xb, yb):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean((model(xb) - yb) ** 2, axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=G)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=batch), axis=None)

    losses = [float(train_step(b)) for b in dist]
    ref_losses = []
    for i in range(0, len(x), G):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((ref(x[i : i + G]) - y[i : i + G]) ** 2)
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
        ref_losses.append(float(loss))
    ok, detail = close(weights(model), weights(ref))
    agree(ok and np.allclose(losses, ref_losses, atol=1e-5), f"{detail}; {losses} {ref_losses}")


def test_reduce_mean_along_axis_0_with_an_uneven_last_batch(strategy):
    values = np.arange(10, dtype="float32") ** 2
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(values).batch(4))
    got = [float(strategy.reduce("MEAN", strategy.run(tf.identity, args=(b,)), axis=0)) for b in dist]
    want = [values[i : i + 4].mean() for i in range(0, 10, 4)]
    agree(np.allclose(got, want), f"{got} != {want}")


def test_input_is_read_by_plain_iterators_with_the_same_batches_under_any_input_options(strategy):
    """Not TF's MultiDeviceIterator: dropped before its thread begins, it segfaults (strategy.py);
    every InputOptions a CPU replica accepts gives rank r the r-th part of each global batch."""
    IO, mode = tf.distribute.InputOptions, tf.distribute.InputReplicationMode
    r, n = hvd.rank(), hvd.size()
    values = np.arange(2 * G + 2, dtype="float32")
    ds = tf.data.Dataset.from_tensor_slices(values).batch(G)
    want = [list(values[i : i + G][r * (G // n) : (r + 1) * (G // n)]) for i in range(0, 2 * G, G)]
    seen = []
    for opts in [
        None,
        IO(experimental_per_replica_buffer_size=0),
        IO(experimental_per_replica_buffer_size=3),
        IO(experimental_fetch_to_device=False),
    ]:
        it = iter(strategy.experimental_distribute_dataset(ds, opts))
        kinds = sorted({type(w._iterator).__name__ for w in it._iterators})
        seen.append((kinds, [list(b.numpy()) for b in it][:2]))
    per_replica = IO(
        experimental_replication_mode=mode.PER_REPLICA,
        experimental_fetch_to_device=False,
        experimental_place_dataset_on_device=True,
    )
    it = iter(
        strategy.distribute_datasets_from_function(
            lambda ctx: (
                tf.data.Dataset.range(8).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(2)
            ),
            per_replica,
        )
    )
    first = list(next(it).numpy())
    agree(
        all(s == (["OwnedIterator"], want) for s in seen)
        and first == [r, r + n][: len(first)]
        and first[0] == r,
        f"{seen} (want {want}); from a function: {first}",
    )
    raises_on_every_rank(
        ValueError,
        "place_dataset_on_device=True.*PER_REPLICA",
        lambda: strategy.experimental_distribute_dataset(ds, IO(experimental_place_dataset_on_device=True)),
    )


def test_gather_concatenates_the_rank_blocks_in_rank_order(strategy):
    r, n = hvd.rank(), hvd.size()
    got = strategy.gather(tf.fill([1, 2], float(r)), axis=1).numpy()
    agree(got.shape == (1, 2 * n) and np.array_equal(got[0], np.repeat(np.arange(n), 2)), str(got))


def test_distribute_datasets_from_function_passes_the_rank_as_input_pipeline(strategy):
    seen = []

    def dataset_fn(ctx):
        seen.append(
            (
                ctx.input_pipeline_id,
                ctx.num_input_pipelines,
                ctx.num_replicas_in_sync,
                ctx.get_per_replica_batch_size(G),
            )
        )
        return tf.data.Dataset.range(40).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(2)

    first = next(iter(strategy.distribute_datasets_from_function(dataset_fn))).numpy()
    r, n = hvd.rank(), hvd.size()
    agree(seen == [(r, n, n, G // n)] and list(first) == [r, r + n], f"{seen} {first}")


def test_communication_options_timeout_is_used_by_the_reductions():
    opts = tf.distribute.experimental.CommunicationOptions(timeout_seconds=30)
    s = hvd.MultiWorkerMirroredStrategy(communication_options=opts)
    total = s.reduce("SUM", tf.constant(1.0), axis=None)
    agree(s.extended._timeout(None) == 30 and float(total) == hvd.size(), str(total))


def test_tf_config_that_disagrees_with_the_mpi_world_is_refused(monkeypatch):
    from hvd_lite.tensorflow.strategy import _check_tf_config

    n, r = hvd.size(), hvd.rank()
    good = {"cluster": {"worker": [f"h:{i}" for i in range(n)]}, "task": {"type": "worker", "index": r}}
    with everywhere("TF_CONFIG checks"):
        monkeypatch.setenv("TF_CONFIG", json.dumps(good))
        _check_tf_config(r, n, [])
        bad = dict(good, cluster={"worker": [f"h:{i}" for i in range(n + 1)]})
        monkeypatch.setenv("TF_CONFIG", json.dumps(bad))
        with pytest.raises(hvd.HvdLiteError, match=f"{n + 1} workers but the MPI world has {n} ranks"):
            _check_tf_config(r, n, [])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_tf1_session_trains_as_one_process_with_a_v1_optimizer_and_the_broadcast_hook(threads):
    """A TF1 graph (tf.compat.v1 session, `threads` inter-op threads): the hook broadcasts rank 0's
    global variables (each rank starts from its own), and DistributedOptimizer around a
    tf.compat.v1.train optimizer averages the gradients, so three steps on each rank's rows give
    what one process gives on every row."""
    r = hvd.rank()
    x, y = data(rows=G)
    w0 = np.random.RandomState(3).rand(4, 1).astype("float32")
    lr, steps = 0.1, 3
    w_ref = w0.astype("float64")
    for _ in range(steps):  # one process: mean squared error on every row
        w_ref -= lr * 2.0 * x.T @ (x @ w_ref - y) / len(x)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=w0 + r)  # rank 0's wins
        b = tf.compat.v1.get_variable("b", initializer=np.float32(r))  # not trained, broadcast
        xs, ys = tf.constant(shard(x)), tf.constant(shard(y))
        loss = tf.reduce_mean(tf.square(tf.matmul(xs, w) - ys))
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(lr, use_locking=True), use_locking=True
        )
        train = opt.minimize(loss, var_list=[w])
        config = tf.compat.v1.ConfigProto(
            inter_op_parallelism_threads=threads, intra_op_parallelism_threads=1
        )
        hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        with tf.compat.v1.train.SingularMonitoredSession(hooks=hooks, config=config) as sess:
            for _ in range(steps):
                sess.run(train)
            got_w, got_b = sess.run([w, b])
    agree(
        np.allclose(got_w, w_ref, atol=1e-5)
        and got_b == 0.0
        and opt.get_name() == "DistributedGradientDescentOptimizer",
        f"w {got_w.ravel()} vs {w_ref.ravel()}; b {got_b}; {opt.get_name()}",
    )


def tf1_session(threads):
    return tf.compat.v1.Session(
        config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads, intra_op_parallelism_threads=1)
    )


@pytest.mark.parametrize("threads", [1, 2])
def test_independent_collectives_in_a_tf1_graph_complete_whatever_the_creation_order(threads):
    """Sixteen collectives that do not depend on each other (all-gathers of different sizes,
    reduce-scatters, all-reduces, an all-to-all, a broadcast and a sparse gradient's all-gathers),
    made in a different order on every rank and fetched in one run, in a session of one or two
    inter-op threads: every one completes with the right values, run after run. (Waiting on
    the session's threads, the ranks held them with different collectives and stalled.)"""
    r, n = hvd.rank(), hvd.size()
    kinds = [("ag", i) for i in range(6)] + [("rs", i) for i in range(3)] + [("ar", i) for i in range(3)]
    kinds += [("a2a", 0), ("bc", 0), ("sparse", 0), ("sparse", 1)]
    order = np.random.RandomState(100 + r).permutation(len(kinds))
    with tf.Graph().as_default():
        outs = {}
        for k in order:
            kind, i = kinds[k]
            if kind == "ag":
                outs[k] = hvd.allgather(tf.fill([r + i + 1, 3], float(r)), name=f"ag{i}")
            elif kind == "rs":
                outs[k] = hvd.reducescatter(tf.fill([2 * n, i + 1], float(r + i)), op=hvd.Sum, name=f"rs{i}")
            elif kind == "ar":
                outs[k] = hvd.allreduce(tf.fill([i + 2], float(r * i)), op=hvd.Sum, name=f"ar{i}")
            elif kind == "a2a":
                outs[k] = hvd.alltoall(tf.range(n) + 10 * r, name="a2a")
            elif kind == "bc":
                outs[k] = hvd.broadcast(tf.fill([4], float(r)), root_rank=n - 1, name="bc")
            else:  # an embedding's gradient: tf.IndexedSlices, all-gathered (two collectives)
                table = tf.constant(np.arange(10 * (i + 1), dtype=np.float32).reshape(10, i + 1))
                with tf.GradientTape() as tape:
                    tape.watch(table)
                    loss = tf.reduce_sum(tf.gather(table, [r % 10, 9]))
                grad = tape.gradient(loss, table)
                outs[k] = tf.convert_to_tensor(hvd.allreduce(grad, op=hvd.Sum, name=f"sparse{i}"))
        with tf1_session(threads) as sess:
            runs = [sess.run([outs[k] for k in range(len(kinds))]) for _ in range(2)]
    want = []
    for kind, i in kinds:
        if kind == "ag":
            want.append(np.concatenate([np.full([q + i + 1, 3], q, np.float32) for q in range(n)]))
        elif kind == "rs":
            want.append(np.full([2, i + 1], sum(q + i for q in range(n)), np.float32))
        elif kind == "ar":
            want.append(np.full([i + 2], sum(q * i for q in range(n)), np.float32))
        elif kind == "a2a":
            want.append(np.array([r + 10 * q for q in range(n)]))
        elif kind == "bc":
            want.append(np.full([4], n - 1, np.float32))
        else:
            g = np.zeros([10, i + 1], np.float32)
            for q in range(n):
                g[q % 10] += 1
                g[9] += 1
            want.append(g)
    bad = [
        (kinds[j], t)
        for t, got in enumerate(runs)
        for j, (a, b) in enumerate(zip(got, want))
        if not np.array_equal(a, b)
    ]
    agree(not bad, f"wrong (collective, run): {bad}")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failed_collective_in_a_tf1_graph_raises_there_and_the_next_run_works(threads):
    """A collective whose shapes differ between ranks fails in its run with the core's message,
    on every rank; the same op run again with matching shapes returns the sum (its wait lives on
    after a failure)."""
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        total = hvd.allreduce(x, op=hvd.Sum, name="varying")
        with tf1_session(threads) as sess:
            if n > 1:
                raises_on_every_rank(
                    tf.errors.InvalidArgumentError,
                    "shape",
                    lambda: sess.run(total, {x: np.ones(r + 1, np.float32)}),
                )
            got = sess.run(total, {x: np.full(3, r, np.float32)})
    agree(np.array_equal(got, np.full(3, sum(range(n)), np.float32)), f"{got}")


@pytest.mark.parametrize("threads", [1, 2])
def test_broadcast_global_variables_in_a_tf1_graph_is_one_op_for_every_variable(threads):
    """Many variables, one collective op (so a pool of one or two threads cannot hold
    independent broadcasts in different orders on different ranks): every rank ends with rank
    0's values, and a second run still works."""
    r = hvd.rank()
    with tf.Graph().as_default():
        vs = [
            tf.compat.v1.get_variable(f"v{i}", initializer=np.full([i + 1, 2], r + i, np.float32))
            for i in range(6)
        ]
        vs.append(tf.compat.v1.get_variable("count", initializer=np.int64(10 + r)))
        op = hvd.broadcast_global_variables(0)
        collectives = [  # each collective's wait
            o.name for o in tf.compat.v1.get_default_graph().get_operations() if o.type == "IteratorGetNext"
        ]
        with tf1_session(threads) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(op)
            sess.run(op)
            got = sess.run(vs)
    want = [np.full([i + 1, 2], i, np.float32) for i in range(6)] + [10]
    agree(
        len(collectives) == 1 and all(np.array_equal(a, b) for a, b in zip(got, want)),
        f"{collectives}; {got}",
    )
