"""DistributedGradientTape and broadcast_variables."""
from typing import Iterable

import numpy as np
import tensorflow as tf

from .. import ops
from .._submit import group_names
from ..collectives import broadcast_group_
from .compression import Compression
from .mpi_ops import Average, broadcast, grouped_allreduce


def broadcast_variables(variables: Iterable[tf.Variable], root_rank: int = 0) -> None:
    """Assigns rank `root_rank`'s value to each variable on every rank (eager or in a graph)."""
    variables = list(variables)
    if tf.executing_eagerly():
        fn = "broadcast_variables"
        arrays = [np.array(v.numpy(), order="C", copy=True) for v in variables]  # writable copies
        names = group_names(fn, fn, arrays, None, "variables")
        # every variable checked before any is submitted, then all in one round
        for v, a, h in zip(variables, arrays, broadcast_group_(fn, arrays, names, root_rank)):
            ops.synchronize(h)
            v.assign(a)
        return None
    return tf.group([v.assign(broadcast(v, root_rank)) for v in variables])


class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() all-reduces the gradients in one fused call."""

    def __init__(self, tape: tf.GradientTape, op=Average, compression=Compression.none,
                 sparse_as_dense: bool = True, prescale_factor: float = 1.0,
                 postscale_factor: float = 1.0):
        self._tape = tape
        self._op = op
        self._compression = compression
        self._pre, self._post = prescale_factor, postscale_factor

    def __getattr__(self, item):
        return getattr(self._tape, item)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        """The tape's gradients, averaged (or reduced by `op`) across ranks; None stays None."""
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat = tf.nest.flatten(grads)
        idx = [i for i, g in enumerate(flat) if g is not None]
        reduced = grouped_allreduce([flat[i] for i in idx], self._op, self._pre, self._post,
                                    None, self._compression)
        for i, r in zip(idx, reduced):
            flat[i] = r
        return tf.nest.pack_sequence_as(grads, flat)
