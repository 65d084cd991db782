"""Horovod's TF1 names: a tf.compat.v1.train optimizer whose gradients are reduced across ranks,
and the SessionRunHook that broadcasts the global variables once a session is made."""

import tensorflow as tf

from .functions import GradientReduction, broadcast_global_variables
from .mpi_ops import Adasum, check_device, reduce_op


class _DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train optimizer whose compute_gradients() returns the gradients reduced
    across ranks (one fused call, or one per group); applying them is the wrapped optimizer's."""

    def __init__(self, optimizer, name, use_locking, reduction: GradientReduction):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._reduction = reduction

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's (gradient, variable) pairs, the gradients reduced across ranks."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        return list(zip(self._reduction(list(grads), list(variables)), variables))

    def apply_gradients(self, *args, **kwargs):
        """The wrapped optimizer's apply_gradients."""
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        """The wrapped optimizer's slot."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        """The wrapped optimizer's slot names."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        """The wrapped optimizer's variables."""
        return self._optimizer.variables(*args, **kwargs)


def distributed_optimizer_v1(
    optimizer, name, use_locking, backward_passes_per_step, average_aggregated_gradients, **kw
):
    """horovod.tensorflow.DistributedOptimizer for a tf.compat.v1.train optimizer. Locking is the
    wrapped optimizer's, which applies the gradients: use_locking=True is refused unless it locks."""
    if use_locking and not getattr(optimizer, "_use_locking", False):
        raise ValueError(
            "DistributedOptimizer(use_locking=True): the wrapped optimizer applies the gradients, "
            "so construct it with use_locking=True instead"
        )
    if reduce_op("DistributedOptimizer", kw["op"]) == Adasum:
        raise NotImplementedError(
            "DistributedOptimizer(op=Adasum) of a tf.compat.v1.train optimizer (Horovod's delta "
            "optimizer) is not implemented; use a Keras optimizer (hvd_lite.keras.DistributedOptimizer "
            "takes op=Adasum), or DistributedGradientTape(op=Adasum) for the gradients"
        )
    if backward_passes_per_step != 1 or average_aggregated_gradients:
        raise NotImplementedError(
            "DistributedOptimizer of a tf.compat.v1.train optimizer: backward_passes_per_step "
            f"must be 1 (got {backward_passes_per_step}) and average_aggregated_gradients False; "
            "accumulate with a Keras optimizer (hvd_lite.keras.DistributedOptimizer) instead"
        )
    return _DistributedOptimizerV1(
        optimizer, name, use_locking, GradientReduction("DistributedOptimizer", **kw)
    )


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook that broadcasts rank `root_rank`'s global variables to every rank once
    the session is created (or restored from a checkpoint), as Horovod's."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        check_device("BroadcastGlobalVariablesHook", "device", device)
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self):
        """Builds the broadcast op in the default graph (once per graph)."""
        if not self.bcast_op or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        """Runs the broadcast."""
        session.run(self.bcast_op)
