"""DistributedOptimizer for Keras 3: reduces the gradients across ranks, then applies them.

The wrapped optimizer's class gets a subclass (same name and module, so a saved model loads
without hvd_lite) whose `apply()` (which `apply_gradients()` and `model.fit` call) reduces the
gradient list first, in one fused call.

With `backward_passes_per_step=n > 1` the gradients are accumulated locally and reduced once per
n passes, as Horovod does: the accumulation is Keras's own (`gradient_accumulation_steps=n`,
which updates the weights on every n-th pass with the mean of the n passes' gradients), and the
reduction runs in that update, from `_clip_gradients`, the first thing Keras does with the
accumulated gradients. Horovod's default sums the n passes (average_aggregated_gradients=False):
the mean is then scaled back by n, as a prescale factor of the same reduction.

With op=Adasum it is Horovod's delta optimizer instead (_DistributedAdasumOptimizer): the wrapped
optimizer steps on this rank's own gradients, and the weights' change is combined by Adasum.
"""

from typing import Any, List

import keras
import tensorflow as tf

from ..process_sets import global_process_set
from ..tensorflow.compression import Compression
from ..tensorflow.functions import GradientReduction, local_layer_list
from ..tensorflow.mpi_ops import Adasum, Average, Sum, graph_safe, reduce_op
from . import keras2


class _DistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class."""

    _hvd_reduction: GradientReduction
    _hvd_average_aggregated: bool

    def register_local_var(self, var) -> None:
        """This variable's gradient stays local (not reduced)."""
        self._hvd_reduction.register_local(var)

    def _hvd_reduce(self, grads, variables, scale=1.0):
        return self._hvd_reduction(grads, variables, scale)

    @graph_safe
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not self.gradient_accumulation_steps:
            variables = (
                list(trainable_variables)
                if trainable_variables is not None
                else self._trainable_variables
                if self.built
                else None
            )
            grads = self._hvd_reduce(grads, variables)
        return super().apply(grads, trainable_variables)

    def _hvd_wrapped_apply(self, grads, trainable_variables=None):
        """The wrapped optimizer's own apply()."""
        return super().apply(grads, trainable_variables)

    def _clip_gradients(self, grads):
        if self.gradient_accumulation_steps:  # the n-th pass: the mean of n local passes
            n = self.gradient_accumulation_steps
            grads = self._hvd_reduce(
                grads, self._hvd_update_variables(grads), 1.0 if self._hvd_average_aggregated else float(n)
            )
        return super()._clip_gradients(grads)

    def _hvd_update_variables(self, grads):
        # Keras filtered out None gradients; match by position only when nothing was filtered
        variables = list(self._trainable_variables)
        return variables if len(variables) == len(grads) else None


class _DistributedAdasumOptimizer(_DistributedOptimizer):
    """op=Adasum: Horovod's delta optimizer (horovod.tensorflow's), mixed in front of the wrapped
    optimizer's class. Every apply() is the wrapped optimizer's own step on this rank's gradients;
    on every n-th (backward_passes_per_step=n) the weights' change since the first of the n, this
    rank's local update, is Adasum-allreduced (one fused call, or one per group), and the weights
    become what they were before the n steps plus the combined update. A local variable
    (register_local_var) keeps its local steps. With n > 1 the weights before the n steps are kept
    in optimizer variables ('adasum_start', one per trainable variable)."""

    _hvd_passes: int
    _hvd_starts: List[Any]

    def build(self, variables):
        super().build(variables)
        if self._hvd_passes > 1:
            self._hvd_starts = [self.add_variable_from_reference(v, "adasum_start") for v in variables]

    @graph_safe
    def apply(self, grads, trainable_variables=None):
        reduction = self._hvd_reduction
        if not reduction.reduces():  # one rank in the set, or a rank outside it: a plain step
            return self._hvd_wrapped_apply(grads, trainable_variables)
        if trainable_variables is not None:
            variables = list(trainable_variables)
            if not self.built:
                self.build(variables)
        elif self.built:
            variables = list(self._trainable_variables)
        else:  # the wrapped apply says what is missing
            return self._hvd_wrapped_apply(grads, trainable_variables)
        grads = [
            reduction.local_gradient(g) if reduction.is_local(v) else g for g, v in zip(grads, variables)
        ]
        shared = [v for v in variables if not reduction.is_local(v)]
        n = self._hvd_passes
        if n == 1:
            starts = [tf.identity(v.value) for v in shared]  # read before the step assigns them
            self._hvd_wrapped_apply(grads, variables)
            self._hvd_combine(shared, starts)
            return
        starts = [self._hvd_starts[self._get_variable_index(v)] for v in shared]
        phase = self.iterations % n  # read before the step counts itself

        def begin():
            for s, v in zip(starts, shared):
                s.assign(v.value)

        tf.cond(tf.equal(phase, 0), begin, lambda: None)
        self._hvd_wrapped_apply(grads, variables)
        tf.cond(tf.equal(phase, n - 1), lambda: self._hvd_combine(shared, starts), lambda: None)

    def _hvd_combine(self, variables, starts) -> None:
        """variables = starts + the Adasum of the ranks' (variables - starts)."""
        deltas = [v.value - tf.convert_to_tensor(s) for v, s in zip(variables, starts)]
        for v, s, d in zip(variables, starts, self._hvd_reduction(deltas, variables)):
            v.assign(tf.convert_to_tensor(s) + d)


def DistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
) -> Any:
    """A copy of `optimizer` (same class name and config) whose updates use gradients reduced by
    `op` across ranks; with backward_passes_per_step=n, reduced once per n passes. Takes a Keras 3
    optimizer or a tf_keras (Keras 2) one, current or legacy."""

    def _reduction() -> GradientReduction:
        return GradientReduction(
            "DistributedOptimizer",
            device_dense,
            device_sparse,
            compression,
            sparse_as_dense,
            op,
            gradient_predivide_factor,
            num_groups,
            groups,
            process_set,
            scale_local_gradients,
        )

    tf_keras = keras2.is_tf_keras(optimizer)
    if not tf_keras and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "DistributedOptimizer wraps a keras.optimizers.Optimizer (Keras 3) or a "
            "tf_keras.optimizers.Optimizer (Keras 2, tf.keras under TF_USE_LEGACY_KERAS=1), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        )
    adasum = reduce_op("DistributedOptimizer", op) == Adasum
    if adasum and tf_keras:
        raise ValueError(
            "op=Adasum (Horovod's delta optimizer) takes a Keras 3 optimizer; with a tf_keras "
            "optimizer use op=Average or op=Sum"
        )
    if not adasum and op not in (Average, Sum):
        raise ValueError("op currently only supports Average, Sum and Adasum")
    if adasum and average_aggregated_gradients:
        raise ValueError(
            "op=Adasum does not take average_aggregated_gradients=True (as in Horovod): its "
            "backward passes are local steps whose updates add up, not gradients to average"
        )
    if (
        isinstance(backward_passes_per_step, bool)
        or not isinstance(backward_passes_per_step, int)
        or backward_passes_per_step < 1
    ):
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
    if tf_keras:
        return keras2.distributed_optimizer(
            optimizer,
            name,
            _reduction(),
            sparse_as_dense,
            backward_passes_per_step,
            average_aggregated_gradients,
        )
    config = optimizer.get_config()
    if config.get("gradient_accumulation_steps") and adasum:
        raise ValueError(
            "op=Adasum combines the weights' updates, not gradients: it does not take an "
            "optimizer that accumulates gradients (gradient_accumulation_steps="
            f"{config['gradient_accumulation_steps']}); pass backward_passes_per_step instead"
        )
    if config.get("gradient_accumulation_steps") and backward_passes_per_step > 1:
        raise ValueError(
            "the optimizer already accumulates gradients (gradient_accumulation_steps="
            f"{config['gradient_accumulation_steps']}); pass backward_passes_per_step "
            "or gradient_accumulation_steps, not both"
        )
    reduction = _reduction()
    if backward_passes_per_step > 1 and not adasum:
        config["gradient_accumulation_steps"] = backward_passes_per_step
    if name is not None:
        config["name"] = name
    base = type(optimizer)
    cls: Any = type(
        base.__name__,
        (_DistributedAdasumOptimizer if adasum else _DistributedOptimizer, base),  # made at run time
        {"__module__": base.__module__},
    )
    dist = cls.from_config(config)
    dist._hvd_reduction = reduction
    dist._hvd_average_aggregated = bool(average_aggregated_gradients)
    dist._hvd_passes = backward_passes_per_step
    return dist


def PartialDistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients=True,
) -> Any:
    """DistributedOptimizer whose `local_layers`' gradients stay local."""
    local_layers = local_layer_list(local_layers)
    opt = DistributedOptimizer(
        optimizer,
        name,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        gradient_predivide_factor,
        op,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    for layer in local_layers:
        for v in layer.trainable_weights:
            opt.register_local_var(v)
    return opt
