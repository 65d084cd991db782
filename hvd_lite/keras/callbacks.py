"""Horovod's Keras callbacks: broadcast the initial state, average the epoch's metrics, schedule
and warm up the learning rate.

They are Keras callbacks of the Keras that `tf.keras` names: tf_keras's (Keras 2) under
TF_USE_LEGACY_KERAS=1, Keras 3's otherwise (decided once, when this module is imported). Either
kind also runs under the other Keras's model.fit: a Keras 3 callback here has the three
`_implements_*_batch_hooks` methods tf_keras's fit asks of every callback."""

from typing import Any, Optional, Set

import keras
import numpy as np
import tensorflow as tf

from .. import basics, ops
from ..tensorflow.functions import broadcast_variables
from ..tensorflow.mpi_ops import check_device
from . import keras2

_Callback: Any
if keras2.tf_keras_is_tf_keras():
    _Callback = tf.keras.callbacks.Callback
else:

    class _Callback(keras.callbacks.Callback):  # type: ignore[no-redef]
        """Keras 3's Callback, with what tf_keras's model.fit also asks of a callback."""

        def _implements_train_batch_hooks(self) -> bool:
            base = keras.callbacks.Callback
            hooks = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")
            return any(getattr(type(self), h) is not getattr(base, h) for h in hooks)

        def _implements_test_batch_hooks(self) -> bool:
            return False

        def _implements_predict_batch_hooks(self) -> bool:
            return False


class BroadcastGlobalVariablesCallback(_Callback):
    """At the start of training, every rank takes rank `root_rank`'s model and optimizer state
    (except `local_variables`)."""

    def __init__(self, root_rank: int, device: str = "", local_variables=None):
        super().__init__()
        check_device("BroadcastGlobalVariablesCallback", "device", device)
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local_vars: Set[int] = set()  # id()s
        if local_variables is None:
            local_variables = []
        elif isinstance(local_variables, (tf.Variable, keras.Variable)):
            local_variables = [local_variables]
        elif not all(isinstance(v, (tf.Variable, keras.Variable)) for v in local_variables):
            raise ValueError("All local variables must be of tf.Variable type.")
        for v in local_variables:
            self.register_local_var(v)

    def register_local_var(self, var) -> None:
        """This variable is not broadcast."""
        self._local_vars.add(id(var))

    def on_train_begin(self, logs=None):
        """Broadcasts the model's and the optimizer's variables from `root_rank` (once)."""
        if self.broadcast_done:
            return
        model = self.model
        opt = getattr(model, "optimizer", None)
        if opt is not None:
            keras2.build_optimizer(opt, model.trainable_variables)
        variables = list(model.variables) + (keras2.optimizer_variables(opt) if opt is not None else [])
        broadcast_variables([v for v in variables if id(v) not in self._local_vars], self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(_Callback):
    """At the end of each epoch, replaces every numeric log by its average over the ranks (same
    keys on every rank, in sorted order; one reduction)."""

    def __init__(self, device: str = ""):
        super().__init__()
        check_device("MetricAverageCallback", "device", device)
        self.device = device

    def _average(self, logs):
        if logs is None or basics.size() == 1:
            return
        keys = sorted(
            k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number)
        )
        if not keys:
            return
        values = np.array([float(np.asarray(logs[k])) for k in keys], np.float64)
        averaged = ops.allreduce(values, ops.Average, name=None)
        for k, v in zip(keys, averaged):
            logs[k] = float(v)

    def on_epoch_end(self, epoch, logs=None):
        """Averages the epoch's numeric logs over the ranks."""
        self._average(logs)


def _momentum_variable(optimizer) -> Optional[Any]:
    """A legacy tf_keras optimizer's momentum (a variable the step reads), else None."""
    if not keras2.is_legacy_optimizer(optimizer):
        return None
    try:
        momentum = optimizer.momentum
    except AttributeError:
        return None
    return momentum if hasattr(momentum, "assign") else None


def _momentum_refused(optimizer) -> bool:
    return _momentum_variable(optimizer) is None and bool(getattr(optimizer, "momentum", 0))


class LearningRateScheduleCallback(_Callback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)` from `start_epoch` up to
    `end_epoch` (exclusive): at each epoch's start with `staircase`, else at every batch with a
    fractional epoch. `multiplier` is a function of the epoch or a constant (then
    multiplier ** (epoch - start_epoch))."""

    def __init__(
        self,
        initial_lr,
        multiplier,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=True,
        steps_per_epoch=None,
    ):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self._restore_momentum: Optional[float] = None
        self.multiplier = (
            multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))
        )

    def _lr_variable(self):
        opt = self.model.optimizer
        lr = opt.learning_rate
        # tf_keras's current optimizers show a schedule as a variable the step overwrites
        if not hasattr(lr, "assign") or callable(getattr(opt, "_learning_rate", None)):
            raise ValueError(
                f"{type(self).__name__} sets the optimizer's learning rate, but it is a "
                f"{type(lr).__name__} (a schedule); pass a float learning rate"
            )
        return lr

    def on_train_begin(self, logs=None):
        """Checks the optimizer and finds the number of steps per epoch."""
        self._lr_variable()
        if self.momentum_correction and _momentum_refused(self.model.optimizer):
            # Keras 3 optimizers, and tf_keras's current ones, keep momentum as a Python float,
            # read when the step is traced: changing it during fit would do nothing. tf_keras's
            # legacy optimizers keep it in a variable, which is corrected.
            raise ValueError(
                f"{type(self).__name__}: momentum_correction=True cannot be applied to "
                f"{type(self.model.optimizer).__name__} (its momentum is fixed when the "
                "training step is compiled; a tf_keras.optimizers.legacy optimizer's is not); "
                "pass momentum_correction=False"
            )
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(
                    "Could not autodetect the number of steps per epoch. Please "
                    f"specify the steps_per_epoch parameter to the "
                    f"{type(self).__name__}()"
                )

    def _adjust(self, epoch: float) -> None:
        lr, new = self._lr_variable(), self.initial_lr * self.multiplier(epoch)
        momentum = _momentum_variable(self.model.optimizer) if self.momentum_correction else None
        if momentum is not None:  # for this batch: momentum * new_lr / old_lr (Horovod's correction)
            old = float(lr.numpy())
            if old != 0.0:
                self._restore_momentum = float(momentum.numpy())
                momentum.assign(self._restore_momentum * new / old)
        lr.assign(new)

    def on_epoch_begin(self, epoch, logs=None):
        """Notes the epoch."""
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        """Sets the learning rate for this batch, within the callback's epochs."""
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        """Puts back the momentum that momentum correction changed for the batch."""
        if self._restore_momentum is not None:
            _momentum_variable(self.model.optimizer).assign(self._restore_momentum)
            self._restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        """Logs the learning rate as `lr`."""
        if logs is not None:
            logs["lr"] = float(np.asarray(self._lr_variable().numpy()))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from initial_lr / size to initial_lr over `warmup_epochs` epochs,
    batch by batch (Goyal et al.); `initial_lr` is the already scaled rate (e.g. 0.001 * size)."""

    def __init__(
        self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0
    ):
        def multiplier(epoch):
            # shifted by one batch, so that each epoch ends on a round value (as Horovod does)
            epoch += 1.0 / self.steps_per_epoch
            n = basics.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        """Logs the learning rate as `lr`, and on rank 0 says when the warmup ends (`verbose`)."""
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(
                f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                f"{float(self._lr_variable().numpy()):g}."
            )


class BestModelCheckpoint:
    """Horovod's ModelCheckpoint without a path (for its Spark estimators): not implemented."""

    def __init__(
        self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto", save_freq="epoch"
    ):
        raise NotImplementedError(
            "BestModelCheckpoint needs Horovod's Spark estimator to set its "
            "path; use keras.callbacks.ModelCheckpoint(filepath, "
            "save_best_only=True)"
        )


__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "BestModelCheckpoint",
]
