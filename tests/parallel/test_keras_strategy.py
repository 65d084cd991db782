"""Keras 3 (or tf_keras, under TF_USE_LEGACY_KERAS=1) under hvd_lite.tensorflow.MultiWorkerMirroredStrategy
at 1-4 ranks answers as under
tf.distribute: predict returns every row in input order, evaluate and fit's History (per batch
and per epoch, validation included) are the whole data set's metrics, identical on every rank,
and checkpoints are written once, by rank 0. Each is compared with one process (no strategy)
running the same model on the same data in the same test."""

import glob
import os
import tempfile

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true"):  # ci/test.sh's second Keras pass
    keras = pytest.importorskip(
        "tf_keras", reason="tf_keras is not installed (pip install --no-deps tf_keras==2.21.0)"
    )
else:
    keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install -e '.[tensorflow]')")

from conftest import agree, world  # noqa: E402

import hvd_lite.tensorflow as hvd  # noqa: E402

pytestmark = pytest.mark.mpi

try:  # the machine is shared: one thread per op and between ops
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass

# A global batch of 12 splits evenly at 1-4 ranks. predict and evaluate also get an uneven last
# batch (41 = 3 * 12 + 5 rows: at 4 ranks, ranks hold 2, 1, 1, 1 of its rows); fit does not, as
# there the loss of an uneven batch is the mean of the ranks' means under tf.distribute (not the
# mean over the batch), so training would differ from one process by design.
BATCH = 12


def data(seed=0, rows=41):
    rng = np.random.RandomState(seed)
    x = rng.rand(rows, 4).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32") * 2).astype("int64") % 3
    return x, y


def classifier(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(6, activation="tanh"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


@pytest.fixture(scope="module")
def strategy():
    return hvd.MultiWorkerMirroredStrategy()


@pytest.fixture
def pair(strategy):
    """A model under the strategy (differently seeded per rank: it takes rank 0's weights) and
    the same model, with the same weights, in this process alone."""
    with strategy.scope():
        model = classifier(seed=hvd.rank())
    ref = classifier()
    ref.set_weights(model.get_weights())
    return model, ref


def close(a, b, tol=1e-5):
    return np.allclose(np.asarray(a, float), np.asarray(b, float), atol=tol, rtol=1e-5)


def same_everywhere(value) -> bool:
    every = hvd.allgather_object(value)
    return all(np.array_equal(np.asarray(e), np.asarray(every[0])) for e in every)


def test_predict_returns_every_row_in_input_order_on_every_rank(pair):
    model, ref = pair
    x, _ = data()
    got = model.predict(x, batch_size=BATCH, verbose=0)
    want = ref.predict(x, batch_size=BATCH, verbose=0)
    agree(
        got.shape == want.shape and close(got, want) and same_everywhere(got),
        f"shape {got.shape} vs {want.shape}; max difference "
        f"{np.abs(got - want).max() if got.shape == want.shape else '-'}",
    )


def test_evaluate_returns_the_whole_data_sets_metrics_on_every_rank(pair):
    model, ref = pair
    x, y = data()
    got = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    want = ref.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    agree(
        got.keys() == want.keys()
        and all(close(got[k], want[k]) for k in want)
        and same_everywhere([got[k] for k in sorted(got)]),
        f"{got} != {want}",
    )


class BatchLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append(dict(logs))


def test_fit_history_and_batch_logs_are_global_and_match_one_process(pair):
    model, ref = pair
    x, y = data(rows=36)
    xv, yv = data(seed=1)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    seen, ref_seen = BatchLogs(), BatchLogs()
    hist = model.fit(ds, epochs=2, verbose=0, validation_data=(xv, yv), callbacks=[seen])
    ref_hist = ref.fit(ds, epochs=2, verbose=0, validation_data=(xv, yv), callbacks=[ref_seen])
    h, rh = hist.history, ref_hist.history
    ok = (
        sorted(h) == sorted(rh) == ["accuracy", "loss", "val_accuracy", "val_loss"]
        and all(close(h[k], rh[k]) for k in rh)
        and same_everywhere([h[k] for k in sorted(h)])
    )
    batches = [[b[k] for k in sorted(b)] for b in seen.logs]
    ref_batches = [[b[k] for k in sorted(b)] for b in ref_seen.logs]
    ok = ok and close(batches, ref_batches) and same_everywhere(batches)
    agree(ok, f"history {h} vs {rh}; batch logs {batches} vs {ref_batches}")


def test_model_checkpoint_and_save_leave_only_rank_0s_files(pair):
    model, _ = pair
    x, y = data(rows=36)
    r = hvd.rank()
    tmp = hvd.broadcast_object(tempfile.mkdtemp(prefix="hvdl_ckpt_") if r == 0 else None)

    def leftovers():
        return glob.glob(os.path.join(tempfile.gettempdir(), f"hvd_lite_rank{r}_*"))

    before = leftovers()
    ckpt = keras.callbacks.ModelCheckpoint(
        os.path.join(tmp, "sub", "w{epoch}.weights.h5"), save_weights_only=True
    )
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[ckpt])
    model.save(os.path.join(tmp, "model.keras"))
    model.save_weights(os.path.join(tmp, "final.weights.h5"))
    world().barrier()
    files = sorted(
        os.path.relpath(p, tmp)
        for p in glob.glob(os.path.join(tmp, "**"), recursive=True)
        if os.path.isfile(p)
    )
    want = ["final.weights.h5", "model.keras", "sub/w1.weights.h5", "sub/w2.weights.h5"]
    loaded = keras.models.load_model(os.path.join(tmp, "model.keras"))
    ok = (
        files == want
        and leftovers() == before
        and all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), model.get_weights()))
    )
    world().barrier()
    if r == 0:
        import shutil

        shutil.rmtree(tmp)
    agree(ok, f"files {files}; temporary directories left {sorted(set(leftovers()) - set(before))}")
