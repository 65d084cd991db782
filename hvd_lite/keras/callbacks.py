"""Horovod's Keras callbacks: broadcast the initial state, average the epoch's metrics, warm up
the learning rate."""
import keras
import numpy as np

from .. import basics, ops
from ..tensorflow.functions import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, every rank takes rank `root_rank`'s model and optimizer state."""

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        model = self.model
        opt = getattr(model, "optimizer", None)
        if opt is not None and not opt.built:
            opt.build(model.trainable_variables)
        variables = list(model.variables) + (list(opt.variables) if opt is not None else [])
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replaces every numeric log by its average over the ranks (same
    keys on every rank, in sorted order)."""

    def _average(self, logs):
        if logs is None or basics.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and
                      isinstance(float(np.asarray(v)), float))
        if not keys:
            return
        values = np.array([float(np.asarray(logs[k])) for k in keys], np.float64)
        averaged = ops.allreduce(values, ops.Average, name=None)
        for k, v in zip(keys, averaged):
            logs[k] = float(v)

    def on_epoch_end(self, epoch, logs=None):
        self._average(logs)


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramps the learning rate from initial_lr / size to initial_lr over `warmup_epochs` epochs,
    batch by batch (Goyal et al.); `initial_lr` is the already scaled rate (e.g. 0.001 * size)."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch=None, verbose: int = 0):
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def lr_at(self, epoch_float: float) -> float:
        """The rate at a (fractional) epoch."""
        n = basics.size()
        if epoch_float >= self.warmup_epochs:
            return self.initial_lr
        return self.initial_lr / n * (epoch_float * (n - 1) / self.warmup_epochs + 1)

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch > self.warmup_epochs:
            return
        steps = self.steps_per_epoch or (self.params or {}).get("steps") or 1
        self.model.optimizer.learning_rate.assign(
            self.lr_at(self.current_epoch + batch / steps))

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1 and self.verbose and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished the learning rate warmup to {self.initial_lr:g}.")
