"""What Keras 3 does for a model under hvd_lite's MultiWorkerMirroredStrategy, so that a script
sees what tf.distribute promises: every rank gets the same, global answers.

Keras 3's TensorFlow trainer has no multi-worker path that works (keras-team/keras#20585), so the
strategy, when created, installs these hooks (once, for the process); each one acts only on a
model whose `distribute_strategy` is an hvd_lite strategy, and leaves every other model alone:

- `Trainer.get_metrics_result` (the logs of every step, of fit's epochs and of evaluate): the
  metric states (Keras metric variables with aggregation "sum" or "mean") are reduced across
  ranks in one call (one per op: Sum, and Average for "mean" states), the results computed from the
  global states, and the local states put
  back: every rank reports the metrics of the whole global batch or data set;
- `reduce_per_replica(..., "concat")` (what predict does with each step's outputs): one allgather
  per step: each rank predicts its share of the batch, every rank gets the whole batch in input
  order;
- `Model.save`, `Model.save_weights` on a rank other than 0: written to a temporary directory,
  removed at once (TF's write_filepath rule: only the chief's file is kept, and a save that
  fails fails on every rank);
- the writes of `ModelCheckpoint` and `BackupAndRestore`, and BackupAndRestore's final deletion
  of its backup: rank 0 only (Keras 3 would have every rank write and delete the same files at
  once).
"""

import functools
import os
import shutil
import sys
import tempfile

import tensorflow as tf

from .. import basics
from ..ops import Average, Sum
from .mpi_ops import _grouped_allreduce, grouped_allgather
from .strategy_extended import is_hvd_lite_strategy

_installed = False


def _ours(model) -> bool:
    try:
        strategy = model.distribute_strategy
    except AttributeError:
        return False
    return is_hvd_lite_strategy(strategy)


# ---------------------------------------------------------------------------- metrics


def _metric_variables(model):
    """The model's metric state variables by the reduction that makes them global."""
    by_op = {Sum: [], Average: []}
    seen = set()
    for metric in model.metrics:
        for v in metric.variables:
            aggregation = getattr(
                v, "aggregation", None
            )  # "sum" (Keras 3), VariableAggregation.SUM (tf_keras)
            op = {"sum": Sum, "mean": Average}.get(str(getattr(aggregation, "name", aggregation)).lower())
            if op is not None and id(v) not in seen:
                seen.add(id(v))
                by_op[op].append(v)
    return by_op


def _read(v):
    """A metric variable's value (a property of a Keras 3 variable, a method of a tf.Variable)."""
    value = v.value
    return tf.convert_to_tensor(value() if callable(value) else value)


def _global_metrics_result(get_metrics_result):
    @functools.wraps(get_metrics_result)
    def wrapper(self):
        if not _ours(self) or basics.size() == 1:
            return get_metrics_result(self)
        saved = []
        for op, variables in _metric_variables(self).items():
            if not variables:
                continue
            local = [tf.identity(_read(v)) for v in variables]
            for v, g in zip(variables, _grouped_allreduce(local, op)):
                v.assign(g)
            saved.append((variables, local))
        try:
            result = get_metrics_result(self)
        finally:
            for variables, local in saved:  # the states stay local: the next update adds to them
                for v, value in zip(variables, local):
                    v.assign(value)
        return result

    return wrapper


# ---------------------------------------------------------------------------- predict


def _gathering(reduce_per_replica):
    @functools.wraps(reduce_per_replica)
    def wrapper(values, strategy, reduction):
        if reduction != "concat" or not is_hvd_lite_strategy(strategy) or basics.size() == 1:
            return reduce_per_replica(values, strategy, reduction)
        flat = tf.nest.flatten(values)
        tensors = [tf.convert_to_tensor(v) for v in flat]
        scalars = [t.shape.rank == 0 for t in tensors]
        gathered = grouped_allgather([tf.reshape(t, [1]) if s else t for t, s in zip(tensors, scalars)])
        return tf.nest.pack_sequence_as(values, gathered)

    return wrapper


# ---------------------------------------------------------------------------- files


def _written_by_chief(save):
    @functools.wraps(save)
    def wrapper(self, filepath, *args, **kwargs):
        if basics.rank() == 0 or not _ours(self) or not isinstance(filepath, (str, os.PathLike)):
            return save(self, filepath, *args, **kwargs)
        tmp = tempfile.mkdtemp(prefix=f"hvd_lite_rank{basics.rank()}_")
        try:
            return save(self, os.path.join(tmp, os.path.basename(os.fspath(filepath))), *args, **kwargs)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return wrapper


def _chief_only(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if basics.rank() != 0 and _ours(getattr(self, "model", None)):
            return None
        return method(self, *args, **kwargs)

    return wrapper


def install() -> None:
    """Installs the hooks (once per process): Keras 3's, and tf_keras's where tf_keras is in use
    (imported, or named by TF_USE_LEGACY_KERAS=1)."""
    global _installed
    if not _installed:
        import keras
        from keras.src.backend.tensorflow import trainer as tf_trainer

        cls = tf_trainer.TensorFlowTrainer
        cls.get_metrics_result = _global_metrics_result(cls.get_metrics_result)
        tf_trainer.reduce_per_replica = _gathering(tf_trainer.reduce_per_replica)
        keras.Model.save = _written_by_chief(keras.Model.save)
        keras.Model.save_weights = _written_by_chief(keras.Model.save_weights)
        ckpt, backup = keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore
        ckpt._save_model = _chief_only(ckpt._save_model)
        backup._save_model = _chief_only(backup._save_model)
        backup.on_train_end = _chief_only(backup.on_train_end)
        _installed = True
    _install_tf_keras()


_installed_tf_keras = False


def _install_tf_keras() -> None:
    """tf_keras's (Keras 2's) trainer has the same three places: Model.get_metrics_result,
    training.reduce_per_replica, Model.save and save_weights, ModelCheckpoint._save_model.
    (Its BackupAndRestore keeps a TF checkpoint of its own, which these hooks leave as it is.)"""
    global _installed_tf_keras
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")
    if _installed_tf_keras or not (legacy or "tf_keras" in sys.modules):
        return
    try:
        import tf_keras
        from tf_keras.src.engine import training
    except ImportError:
        return
    model = training.Model
    model.get_metrics_result = _global_metrics_result(model.get_metrics_result)
    training.reduce_per_replica = _gathering(training.reduce_per_replica)
    model.save = _written_by_chief(model.save)
    model.save_weights = _written_by_chief(model.save_weights)
    ckpt = tf_keras.callbacks.ModelCheckpoint
    ckpt._save_model = _chief_only(ckpt._save_model)
    _installed_tf_keras = True
