"""Horovod-style Keras training on scikit-learn's 8x8 digits, with no tf.distribute strategy.

    mpirun -np 2 python examples/keras_horovod_style.py

A horovod.keras script with `import horovod.keras as hvd` replaced by `import hvd_lite.keras as
hvd`: each rank fits on its own shard; DistributedOptimizer averages the gradients (one fused
allreduce per step); the callbacks broadcast rank 0's initial state, warm the scaled learning rate
up and average the epoch's metrics over the ranks.
"""

import argparse

import _tf_setup
import keras
import numpy as np

import hvd_lite.keras as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.001, help="for one rank; scaled by size")
    args = p.parse_args()
    _tf_setup.threads()
    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # different on purpose: the callback broadcasts

    x_train, x_test, y_train, y_test = _tf_setup.digits()
    x_train, y_train = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]
    model = _tf_setup.cnn()  # Conv2D 32, Conv2D 64, MaxPool, Dense 64, Dense 10
    lr = args.lr * hvd.size()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(learning_rate=lr))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    callbacks = [
        hvd.BroadcastGlobalVariablesCallback(0),
        hvd.MetricAverageCallback(),
        hvd.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=2),
    ]
    steps = int(np.ceil(len(x_train) / args.batch_size))
    # the same number of steps on every rank: one more rank may hold one more example
    steps = min(hvd.allgather_object(steps))
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        steps_per_epoch=steps,
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )

    _tf_setup.report(hvd, model, x_test, y_test)


if __name__ == "__main__":
    main()
