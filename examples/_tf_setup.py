"""Shared by the TensorFlow examples: quiet logs, a thread budget, the digits data, the tutorial's
CNN, and the closing report (test accuracy, and whether the weights are identical on every rank)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def threads():
    """One intra-op and one inter-op thread per rank unless TF_NUM_*_THREADS says otherwise."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", 1)))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_NUM_INTEROP_THREADS", 1)))


def digits(seed=42):
    """scikit-learn's bundled 8x8 digits as (x_train, x_test, y_train, y_test), x in [0, 1], NHWC."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype("float32")[..., None]
    return train_test_split(x, d.target.astype("int64"), test_size=0.2, random_state=seed, stratify=d.target)


def cnn():
    """The seed tutorial's CNN for 8x8 digits (softmax outputs)."""
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def report(hvd, model, x_test, y_test):
    """Prints (rank 0) the test accuracy and whether every rank ended with the same weights."""
    import numpy as np

    accuracy = float(np.mean(model(x_test).numpy().argmax(1) == y_test))
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    same = all(np.array_equal(flat, w) for w in hvd.allgather_object(flat))
    if hvd.rank() == 0:
        print(
            f"final test accuracy {accuracy:.4f}; weights identical on all {hvd.size()} ranks: "
            f"{'yes' if same else 'NO'}"
        )
