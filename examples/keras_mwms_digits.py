"""The tf.distribute multi-worker tutorial's CNN on scikit-learn's 8x8 digits, with Keras model.fit.

    mpirun -np 2 python examples/keras_mwms_digits.py         # or: hvd_lite.run -np 2 python ...

The tutorial's script with one line changed: the strategy is hvd_lite's
MultiWorkerMirroredStrategy (the cluster comes from mpirun, no TF_CONFIG). The dataset is batched
with the global batch size; the strategy gives each rank its share of every batch, and
model.evaluate / model.predict answer for the whole test set on every rank.
"""

import argparse

import _tf_setup
import keras
import numpy as np
import tensorflow as tf

import hvd_lite.tensorflow as hvd


def build_and_compile_cnn_model(lr):
    model = _tf_setup.cnn()  # Conv2D 32, Conv2D 64, MaxPool, Dense 64, Dense 10
    model.compile(
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(learning_rate=lr),
        metrics=["accuracy"],
    )
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--per-worker-batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.002)
    args = p.parse_args()
    _tf_setup.threads()
    keras.utils.set_random_seed(42)

    strategy = hvd.MultiWorkerMirroredStrategy()  # was: tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = args.per_worker_batch * strategy.num_replicas_in_sync
    x_train, x_test, y_train, y_test = _tf_setup.digits()
    train = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=42)
        .batch(global_batch)
    )

    with strategy.scope():
        model = build_and_compile_cnn_model(args.lr)
    model.fit(train, epochs=args.epochs, verbose=2 if hvd.rank() == 0 else 0)

    # evaluate and predict are global under the strategy: the whole test set on every rank
    accuracy = model.evaluate(x_test, y_test, verbose=0, return_dict=True)["accuracy"]
    predicted = model.predict(x_test, verbose=0).argmax(1)  # every row, in input order
    assert len(predicted) == len(y_test)
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    same = all(np.array_equal(flat, w) for w in hvd.allgather_object(flat))
    if strategy.extended.should_checkpoint:
        print(
            f"final test accuracy {accuracy:.4f}; weights identical on all "
            f"{strategy.num_replicas_in_sync} ranks: {'yes' if same else 'NO'}"
        )


if __name__ == "__main__":
    main()
