"""DistributedOptimizer for Keras 3: all-reduces the gradient list in one fused call, then applies it.

The wrapped optimizer's class gets a subclass whose `apply()` (which `apply_gradients()` and
`model.fit` call) reduces the gradients first. With `backward_passes_per_step=n` the optimizer
accumulates n steps of reduced gradients before it updates (Keras's gradient_accumulation_steps);
the reduction still runs every step, so this saves no communication, only changes the update.
"""
import keras

from .. import basics
from ..tensorflow.compression import Compression
from ..tensorflow.mpi_ops import Average, grouped_allreduce


class _DistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class."""

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if basics.size() > 1:
            idx = [i for i, g in enumerate(grads) if g is not None]
            reduced = grouped_allreduce([grads[i] for i in idx], self._hvd_op, name=None,
                                        compression=self._hvd_compression)
            for i, r in zip(idx, reduced):
                grads[i] = r
        return super().apply(grads, trainable_variables)


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, op=Average,
                         backward_passes_per_step: int = 1, compression=Compression.none,
                         name=None) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (same class and config) whose updates use gradients reduced by `op`
    across ranks."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a keras.optimizers.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        config["gradient_accumulation_steps"] = backward_passes_per_step
    if name is not None:
        config["name"] = name
    cls = type(f"Distributed{type(optimizer).__name__}", (_DistributedOptimizer, type(optimizer)),
               {})
    dist = cls.from_config(config)
    dist._hvd_op = op
    dist._hvd_compression = compression
    return dist
