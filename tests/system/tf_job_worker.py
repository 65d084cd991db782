"""A Keras job under hvd_lite's MultiWorkerMirroredStrategy, for test_tensorflow_jobs.py.

    tf_job_worker.py backup DIR KILL_EPOCH   fit 4 epochs with BackupAndRestore(DIR); with
                                             KILL_EPOCH >= 0 the last rank SIGKILLs itself in
                                             that epoch's second batch
    tf_job_worker.py timeout T               fit with CommunicationOptions(timeout_seconds=T);
                                             the last rank stops before its third step for 3T
    tf_job_worker.py independent             a tf.function of twelve collectives that do not
                                             depend on each other, run three times (inter-op
                                             threads: TF_NUM_INTEROP_THREADS, else 1)
Each rank prints one line: `rank R ...`.
"""

import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_lite.tensorflow as hvd  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
if "TF_NUM_INTEROP_THREADS" not in os.environ:
    tf.config.threading.set_inter_op_parallelism_threads(1)


def model_and_data():
    keras.utils.set_random_seed(1)
    rng = np.random.RandomState(0)
    x = rng.rand(48, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model, tf.data.Dataset.from_tensor_slices((x, y)).batch(12)


class At(keras.callbacks.Callback):
    """Calls action() on the last rank when training reaches (epoch, batch)."""

    def __init__(self, epoch, batch, action):
        super().__init__()
        self.at, self.action, self.epoch = (epoch, batch), action, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.began = time.monotonic()
        if (self.epoch, batch) == self.at and hvd.rank() == hvd.size() - 1:
            self.action()


def backup(directory, kill_epoch):
    strategy = hvd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, ds = model_and_data()
    kill = At(kill_epoch, 1, lambda: os.kill(os.getpid(), signal.SIGKILL))
    hist = model.fit(ds, epochs=4, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(directory), kill])
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    print(
        f"rank {hvd.rank()} epochs {len(hist.history['loss'])} weights {' '.join(f'{v:.6f}' for v in flat)}",
        flush=True,
    )


def timeout(seconds):
    opts = tf.distribute.experimental.CommunicationOptions(timeout_seconds=seconds)
    strategy = hvd.MultiWorkerMirroredStrategy(communication_options=opts)
    with strategy.scope():
        model, ds = model_and_data()
    stall = At(0, 2, lambda: time.sleep(3 * seconds))
    try:
        model.fit(ds, epochs=1, verbose=0, callbacks=[stall])
        print(f"rank {hvd.rank()} finished", flush=True)
    except Exception as exc:  # noqa: BLE001 - reported for the test to judge
        took = time.monotonic() - stall.began
        message = " ".join(str(exc).split())  # TF wraps hvd_lite's message in a graph error
        print(f"rank {hvd.rank()} raised {type(exc).__name__} after {took:.2f} s: {message}", flush=True)


def independent():
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    @tf.function
    def step(x):
        gathered = [hvd.allgather(tf.fill([r + i + 1, 2], x)) for i in range(6)]
        scattered = [hvd.reducescatter(tf.fill([2 * n, 3], x + i), op=hvd.Sum) for i in range(3)]
        reduced = [hvd.allreduce(tf.fill([i + 1], x), op=hvd.Sum) for i in range(3)]
        return gathered + scattered + reduced

    for _ in range(3):
        got = step(tf.constant(float(r)))
    want = [np.concatenate([np.full([q + i + 1, 2], q, np.float32) for q in range(n)]) for i in range(6)]
    want += [np.full([2, 3], sum(q + i for q in range(n)), np.float32) for i in range(3)]
    want += [np.full([i + 1], sum(range(n)), np.float32) for i in range(3)]
    ok = all(np.array_equal(a.numpy(), b) for a, b in zip(got, want))
    threads = os.environ.get("TF_NUM_INTEROP_THREADS", 1)  # TensorFlow's pool reads it
    print(f"rank {r} {'right' if ok else 'wrong'} with {threads} inter-op threads", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "backup":
        backup(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "independent":
        independent()
    else:
        timeout(float(sys.argv[2]))
