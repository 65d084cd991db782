"""SyncBatchNormalization: Keras batch normalization over every rank's batch together
(horovod.tensorflow's)."""

import keras
import tensorflow as tf

from .. import basics
from .mpi_ops import Sum, grouped_allreduce


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Keras' BatchNormalization whose training statistics are those of every rank's batch
    together, as one process computes them on the global batch.

    In training (with more than one rank) each call allreduces, per feature, the count, the sum
    and the sum of squares of its input (masked entries left out), so every rank must call it the
    same number of times; the gradient flows back through that allreduce (the sum of every
    rank's). Ranks' batches may differ in size; the sums are taken in float64. In inference, or
    with one rank, it is Keras' batch normalization. `fused` is accepted as Horovod's: False only."""

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True (or None); pass fused=False")
        if fused is not False:
            raise TypeError(f"SyncBatchNormalization: fused must be False, got {fused!r}")
        kwargs.setdefault("name", "sync_batch_normalization")
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        if basics.size() == 1:
            return super()._moments(inputs, mask)
        # Summed in float64: the variance is E[x^2] - E[x]^2, whose cancellation in float32 loses
        # digits where the mean is large against the spread (one pass over the data, one allreduce).
        x = tf.cast(inputs, tf.float64)
        axes = list(self._reduction_axes)
        if mask is None:
            total, squares = tf.reduce_sum(x, axes), tf.reduce_sum(tf.square(x), axes)
            rows = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
            count = tf.fill(tf.shape(total), rows)
        else:
            weight = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), x.dtype), tf.shape(x))
            count = tf.reduce_sum(weight, axes)
            total = tf.reduce_sum(x * weight, axes)
            squares = tf.reduce_sum(tf.square(x) * weight, axes)
        total, squares, count = grouped_allreduce([total, squares, count], op=Sum)
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
