"""Keras `model.fit` throughput under hvd_lite's MultiWorkerMirroredStrategy against one process on
the same global batch.

    mpirun -np 2 python tools/keras_fit_throughput.py      # 2 ranks, global batch 128
    python tools/keras_fit_throughput.py                   # 1 process, the same global batch

The tutorial's CNN (examples/_tf_setup.py) on synthetic 28x28 images; each rank uses one intra-op and
one inter-op thread (TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS override), so 2 ranks use 2
threads in all: set TF_NUM_INTRAOP_THREADS=2 for the one-process run to compare with the same
threads. Prints global samples per second over the epochs after the first (which builds the graph),
and the engine's negotiation rounds per step.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import _tf_setup  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_lite.tensorflow as hvd  # noqa: E402
from hvd_lite import basics as core  # noqa: E402


class Timer(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.t = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(time.perf_counter() - self.t)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()
    _tf_setup.threads()
    keras.utils.set_random_seed(1)
    strategy = hvd.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, 10, args.samples)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.global_batch)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(32, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            metrics=["accuracy"],
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    timer = Timer()
    engine = core._engine()
    model.fit(data, epochs=1, verbose=0, callbacks=[timer])  # builds the step
    before = engine.stats()["rounds"]
    model.fit(data, epochs=args.epochs, verbose=0, callbacks=[timer])
    steps = args.epochs * ((args.samples + args.global_batch - 1) // args.global_batch)
    rounds = engine.stats()["rounds"] - before
    secs = sorted(timer.epochs)[len(timer.epochs) // 2]
    if hvd.rank() == 0:
        print(
            f"ranks {hvd.size()} global batch {args.global_batch}: "
            f"{args.samples / secs:.0f} samples/s (median epoch {secs:.3f} s), "
            f"{rounds / steps:.2f} rounds per step"
        )


if __name__ == "__main__":
    main()
