"""Keras 2 (tf_keras) beside Keras 3: which Keras an object belongs to, and the Keras 2
DistributedOptimizer.

tf_keras (`pip install --no-deps tf_keras==2.21.0`) is the Keras that `tf.keras` names when
TF_USE_LEGACY_KERAS=1; `import keras` is still Keras 3 then. hvd_lite.keras takes the objects of
either: an optimizer, model or layer is Keras 2's when one of its classes comes from the tf_keras
package (tested once, when it is wrapped or loaded; the training step is not touched).

A tf_keras optimizer has two families, the current one (tf_keras.optimizers.Optimizer) and the
legacy one (tf_keras.optimizers.legacy.Optimizer, OptimizerV2); both apply a gradient list through
`apply_gradients(grads_and_vars, ...)`, which model.fit's `minimize` and a custom loop both call.
DistributedOptimizer makes a subclass of the optimizer's class (same name and module, so that a
saved model loads without hvd_lite) whose apply_gradients reduces the gradient list first, in one
fused call. With backward_passes_per_step=n > 1 (Horovod's Keras 2 aggregation): every pass adds its
gradients to local accumulators (plain variables, not the optimizer's: they are not saved); on every
n-th pass the sums are reduced (divided by n with average_aggregated_gradients), applied, and the
accumulators cleared; the other passes only count the optimizer's `iterations`.
"""

import json
import os
import zipfile
from typing import Any, Dict, List, Optional

import tensorflow as tf

from ..tensorflow.functions import GradientReduction


def is_tf_keras_class(cls) -> bool:
    """Whether class `cls` is tf_keras's (Keras 2) or derives from one of tf_keras's."""
    return any(c.__module__.split(".", 1)[0] == "tf_keras" for c in getattr(cls, "__mro__", ()))


def is_tf_keras(obj) -> bool:
    """Whether `obj` (an optimizer, model, layer or callback) is a tf_keras (Keras 2) object."""
    return is_tf_keras_class(type(obj))


def tf_keras_is_tf_keras() -> bool:
    """Whether `tf.keras` is tf_keras (TF_USE_LEGACY_KERAS=1 with tf_keras installed), without
    importing either Keras for the answer."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() not in ("1", "true"):
        return False
    return getattr(tf.keras, "__name__", "").startswith("tf_keras")


def saved_by_tf_keras(filepath) -> Optional[bool]:
    """Whether the Keras that saved `filepath` was Keras 2 (tf_keras), as the file says: a .keras
    archive's metadata.json or an HDF5 file's `keras_version`, a SavedModel directory (tf_keras's
    only); None where it does not say."""
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    if path is None or not os.path.exists(path):
        return None
    if os.path.isdir(path):
        return True
    version = None
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if "metadata.json" in z.namelist():
                version = json.loads(z.read("metadata.json")).get("keras_version")
    else:
        try:
            import h5py
        except ImportError:
            return None
        if h5py.is_hdf5(path):
            with h5py.File(path, "r") as f:
                version = f.attrs.get("keras_version")
    if isinstance(version, bytes):
        version = version.decode()
    return str(version).startswith("2.") if version else None


def is_legacy_optimizer(optimizer) -> bool:
    """A tf_keras.optimizers.legacy optimizer (OptimizerV2: hyperparameters are variables)."""
    return any(c.__name__ == "OptimizerV2" and is_tf_keras_class(c) for c in type(optimizer).__mro__)


def optimizer_variables(optimizer) -> List[Any]:
    """The optimizer's variables under any Keras (a list in Keras 3; a method or a callable list
    in tf_keras)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def optimizer_built(optimizer) -> bool:
    """Whether the optimizer's variables (slots) have been created."""
    if is_legacy_optimizer(optimizer):
        return getattr(optimizer, "_iterations", None) is not None and bool(
            getattr(optimizer, "_hypers_created", False)
        )
    return bool(getattr(optimizer, "built", getattr(optimizer, "_built", False)))


def build_optimizer(optimizer, variables) -> None:
    """Creates the optimizer's variables for `variables` if they are not there yet."""
    if is_legacy_optimizer(optimizer):
        optimizer._create_all_weights(list(variables))
    elif not optimizer_built(optimizer):
        optimizer.build(list(variables))


class _DistributedKeras2Optimizer:
    """Mixed in front of a tf_keras optimizer's class."""

    _hvd_reduction: GradientReduction
    _hvd_passes: int
    _hvd_average_aggregated: bool
    _hvd_sparse_as_dense: bool
    _hvd_acc: "_Accumulators"

    def register_local_var(self, var) -> None:
        """This variable's gradient stays local (not reduced)."""
        self._hvd_reduction.register_local(var)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Applies the gradients reduced across ranks (once every backward_passes_per_step)."""
        pairs = list(grads_and_vars)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        parent = super()
        if self._hvd_passes == 1:
            reduced = self._hvd_reduction(grads, variables)
            return parent.apply_gradients(list(zip(reduced, variables)), *args, **kwargs)
        build_optimizer(self, [v for g, v in pairs if g is not None])
        sums = self._hvd_accumulate(grads, variables)
        n = self._hvd_passes

        def reduce_and_apply():
            scale = 1.0 / n if self._hvd_average_aggregated else 1.0
            reduced = self._hvd_reduction(sums, variables, scale)
            parent.apply_gradients(list(zip(reduced, variables)), *args, **kwargs)
            self._hvd_clear()

        def count():
            self.iterations.assign_add(1)

        if tf.executing_eagerly():
            reduce_and_apply() if int(self._hvd_acc.counter.numpy()) == n else count()
        else:
            tf.cond(tf.equal(self._hvd_acc.counter, n), reduce_and_apply, count)
        return self.iterations

    def _hvd_accumulate(self, grads, variables):
        """Adds the gradients to their accumulators; the sums so far (None stays None)."""
        acc = self._hvd_acc
        with tf.init_scope():  # created eagerly on the first pass, also under a tf.function
            if acc.counter is None:
                acc.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvd_passes")
        sums = []
        for g, v in zip(grads, variables):
            if g is None:
                sums.append(None)
                continue
            if isinstance(g, tf.IndexedSlices):
                if not self._hvd_sparse_as_dense:
                    raise ValueError(
                        f"the gradient of {v.name} is sparse (IndexedSlices): "
                        "backward_passes_per_step > 1 accumulates dense gradients; pass "
                        "sparse_as_dense=True"
                    )
                g = tf.convert_to_tensor(g)
            key = v.ref()
            if key not in acc.sums:
                with tf.init_scope():
                    acc.sums[key] = tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False, name="hvd_sum")
            acc.sums[key].assign_add(g, read_value=False)
            sums.append(acc.sums[key].read_value())  # a value: clearing the sum later leaves it
        acc.counter.assign_add(1)
        return sums

    def _hvd_clear(self) -> None:
        self._hvd_acc.counter.assign(0)
        for s in self._hvd_acc.sums.values():
            s.assign(tf.zeros_like(s))


class _Accumulators:
    """The local sums of backward_passes_per_step: a plain object, so that the optimizer does
    not track (save, checkpoint) its variables."""

    def __init__(self):
        self.counter: Any = None
        self.sums: Dict[Any, Any] = {}


def distributed_optimizer(
    optimizer, name, reduction: GradientReduction, sparse_as_dense, backward_passes_per_step, average
):
    """A copy of tf_keras `optimizer` (same class name and config) that reduces its gradients."""
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    base = type(optimizer)
    cls: Any = type(base.__name__, (_DistributedKeras2Optimizer, base), {"__module__": base.__module__})
    dist = cls.from_config(config)
    dist._hvd_reduction = reduction
    dist._hvd_passes = backward_passes_per_step
    dist._hvd_average_aggregated = bool(average)
    dist._hvd_sparse_as_dense = bool(sparse_as_dense)
    dist._hvd_acc = _Accumulators()
    return dist
