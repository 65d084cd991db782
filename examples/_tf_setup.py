"""Shared by the TensorFlow examples: quiet logs, a thread budget, the digits data."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def threads():
    """One intra-op and one inter-op thread per rank unless TF_NUM_*_THREADS says otherwise."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", 1)))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_NUM_INTEROP_THREADS", 1)))


def digits(seed=42):
    """scikit-learn's bundled 8x8 digits as (x_train, y_train, x_test, y_test), x in [0, 1], NHWC."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype("float32")[..., None]
    return train_test_split(x, d.target.astype("int64"), test_size=0.2, random_state=seed,
                            stratify=d.target)
