"""Gradient reduction (DistributedGradientTape, and the Keras DistributedOptimizer's), variable
and object broadcasts, with horovod.tensorflow's signatures."""

from typing import Any, Iterable, List, Set

import numpy as np
import tensorflow as tf

from .. import basics, ops, state
from .._horovod_args import resolve_groups, split_list
from .._submit import group_names
from ..collectives import _check_root, broadcast_group_
from .compression import Compression
from .mpi_ops import (
    TF_DIR,
    Average,
    _graph_name,
    _grouped_allreduce,
    _reduce_slices,
    check_device,
    check_dtype,
    graph_op,
    graph_safe,
    reduce_op,
)
from .process_sets import global_process_set, member_set, registered_set

# ---------------------------------------------------------------------------- broadcasts


@graph_safe
def broadcast_variables(
    variables: Iterable[tf.Variable], root_rank: int, process_set=global_process_set, inplace: bool = False
):
    """Assigns rank `root_rank`'s value to each variable on every rank of `process_set` (eager:
    all in one round; in a graph: returns the op). `inplace` is accepted as in Horovod (every
    broadcast here assigns the variables)."""
    fn = "broadcast_variables"
    where = member_set(fn, process_set)
    variables = list(variables)
    for v in variables:
        check_dtype(fn, v.dtype)  # every dtype checked before anything is sent

    def run(name, *values):
        """Every variable's value, root_rank's on return: writable copies broadcast in place, each
        checked before any is submitted, then all in one engine round."""
        arrays = [np.array(a, order="C", copy=True) for a in values]
        names = group_names(fn, fn, arrays, name, "variables", where)
        for h in broadcast_group_(fn, arrays, names, root_rank, process_set):
            ops.synchronize(h)
        return arrays

    if tf.executing_eagerly():
        for v, a in zip(variables, run(None, *[v.numpy() for v in variables])):
            v.assign(a)
        return None
    if not variables:
        return tf.no_op()
    where.set_rank(fn, _check_root(fn, root_rank))  # a root outside the set: ValueError now
    name = _graph_name(fn, None, process_set)  # the same on every rank and every run of the graph
    values = [tf.convert_to_tensor(v) for v in variables]
    outs = graph_op(lambda *a: run(name, *a), values, [t.dtype for t in values], "broadcast")
    return tf.group([v.assign(tf.ensure_shape(o, t.shape)) for v, o, t in zip(variables, outs, values)])


@graph_safe
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Assigns rank `root_rank`'s values to `variables` on every rank (in place); returns their
    new values."""
    variables = list(variables)
    op = broadcast_variables(variables, root_rank, process_set, inplace=True)
    if tf.executing_eagerly():
        return [v.read_value() if hasattr(v, "read_value") else tf.convert_to_tensor(v) for v in variables]
    with tf.control_dependencies([op]):
        return [tf.identity(v) for v in variables]


@graph_safe
def broadcast_global_variables(root_rank):
    """In a graph, the op that assigns rank `root_rank`'s value to every global variable
    (tf.compat.v1.global_variables()); refused when executing eagerly, as Horovod refuses it."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution (TF2 "
            "has no global variable collection); use hvd.broadcast_variables(<model/"
            "optimizer variables>, root_rank) instead"
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Rank `root_rank`'s picklable `obj` on every rank (of the set). `session` (TF1) may be given
    as in Horovod; the object moves without one."""
    _check_session("broadcast_object", session)
    member_set("broadcast_object", process_set)
    return state.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every rank's (of the set) picklable `obj`, as a list in rank order. `session` (TF1) may be
    given as in Horovod; the objects move without one."""
    _check_session("allgather_object", session)
    member_set("allgather_object", process_set)
    return state.allgather_object(obj, name, process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's TF1 graph-mode helper (placeholders and a session): not implemented."""
    raise NotImplementedError(
        "broadcast_object_fn builds a TF1 graph with placeholders; under "
        "TensorFlow 2 use hvd.broadcast_object(obj, root_rank)"
    )


def _check_session(fn: str, session) -> None:
    """Horovod's TF1 `session=`: None or a tf.compat.v1 session (hvd_lite sends objects without
    running a graph, so any session gives the same result); TypeError otherwise."""
    if session is not None and not isinstance(session, tf.compat.v1.Session):
        raise TypeError(f"{fn}: session must be a tf.compat.v1.Session or None, got {type(session).__name__}")


# ---------------------------------------------------------------------------- gradients


def _key(v):
    return v.ref() if hasattr(v, "ref") else id(v)


class GradientReduction:
    """How a list of gradients is reduced across the ranks of `process_set` (Horovod's arguments
    of DistributedGradientTape and DistributedOptimizer); calling it reduces one list. As in
    Horovod, a rank outside the set, or a set of one rank, leaves the gradients as they are."""

    def __init__(
        self,
        fn: str,
        device_dense="",
        device_sparse="",
        compression=Compression.none,
        sparse_as_dense=False,
        op=Average,
        gradient_predivide_factor=1.0,
        num_groups=0,
        groups=None,
        process_set=global_process_set,
        scale_local_gradients=True,
    ):
        op = reduce_op(fn, op)
        check_device(fn, "device_dense", device_dense)
        check_device(fn, "device_sparse", device_sparse)
        registered_set(fn, process_set)  # a non-member may build one: it reduces nothing
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        groups = resolve_groups(fn, groups, num_groups, TF_DIR)
        if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable")
        self.fn, self.process_set = fn, process_set
        self.op, self.compression, self.sparse_as_dense = op, compression, sparse_as_dense
        self.groups = groups
        self.scale_local_gradients = scale_local_gradients
        self.local: Set[Any] = set()  # _key()s
        # Average's 1/size is applied by the core: predividing splits it around the sum
        self.pre = 1.0 / gradient_predivide_factor
        self.post = gradient_predivide_factor

    def register_local(self, variable) -> None:
        self.local.add(_key(variable))

    def is_local(self, variable) -> bool:
        """Whether this variable's gradient stays local (register_local)."""
        return variable is not None and _key(variable) in self.local

    def reduces(self) -> bool:
        """Whether this rank reduces anything: it is in the set, and the set has other ranks."""
        where = registered_set(self.fn, self.process_set)
        return where.size > 1 and basics.rank() in where.ranks

    def local_gradient(self, g):
        """A local variable's gradient as the update takes it: divided by the set's size with
        scale_local_gradients (so that it weighs as much as a reduced one)."""
        n = registered_set(self.fn, self.process_set).size
        if not self.scale_local_gradients or n == 1 or g is None:
            return g
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
        return g / n

    def _partition(self, idx, variables):
        """Lists of positions in `idx`, one per fused call."""
        if self.groups is None:
            return [idx]
        if isinstance(self.groups, int):
            return split_list(idx, self.groups)
        where = {_key(variables[i]): i for i in idx}
        parts = []
        for group in self.groups:
            part = [where.pop(_key(v)) for v in group if _key(v) in where]
            if part:
                parts.append(part)
        return parts + [[i] for i in idx if _key(variables[i]) in where]

    def __call__(self, grads, variables=None, scale: float = 1.0):
        """`grads` reduced across the set's ranks (None stays None; a registered local variable's
        gradient is not reduced, and divided by the set's size with scale_local_gradients);
        `scale` multiplies every gradient but the local ones (on a rank that reduces nothing,
        too)."""
        grads = list(grads)
        variables = list(variables) if variables is not None else [None] * len(grads)
        out = list(grads)
        reduces = self.reduces()
        dense: List[int] = []
        sparse: List[int] = []
        for i, (g, v) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            if self.is_local(v):
                out[i] = self.local_gradient(g)
                continue
            if isinstance(g, tf.IndexedSlices) and self.sparse_as_dense:
                g = out[i] = tf.convert_to_tensor(g)
            (sparse if isinstance(g, tf.IndexedSlices) else dense).append(i)
        if not reduces:
            if scale != 1.0:
                for i in sparse + dense:
                    g = out[i]
                    out[i] = (
                        tf.IndexedSlices(g.values * scale, g.indices, g.dense_shape)
                        if isinstance(g, tf.IndexedSlices)
                        else g * scale
                    )
            return out
        for i in sparse:
            out[i] = _reduce_slices(
                "gradient reduction", out[i], self.op, self.pre * scale, self.post, self.process_set
            )
        for part in self._partition(dense, variables):
            reduced = _grouped_allreduce(
                [out[i] for i in part],
                self.op,
                self.pre * scale,
                self.post,
                None,
                self.compression,
                process_set=self.process_set,
            )
            for i, r in zip(part, reduced):
                out[i] = r
        return out


class _DistributedGradientTape(tf.GradientTape):
    """A tf.GradientTape whose gradient() returns gradients reduced across ranks."""

    def __init__(self, tape: tf.GradientTape, reduction: GradientReduction):
        super().__init__(tape._persistent, tape._watch_accessed_variables)
        self._tape = tape._tape  # take over the recording of the tape given
        self._hvd_reduction = reduction

    @graph_safe
    def register_local_source(self, source) -> None:
        """This source's gradient stays local (not reduced)."""
        self._hvd_reduction.register_local(source)

    @graph_safe
    def gradient(self, target, sources, output_gradients=None, **kwargs):
        """The tape's gradients, reduced by `op` across ranks; None stays None."""
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_s, flat_g = tf.nest.flatten(sources), tf.nest.flatten(grads)
        return tf.nest.pack_sequence_as(grads, self._hvd_reduction(flat_g, flat_s))

    @graph_safe
    def get_local_and_global_gradients(self, target, sources, output_gradients=None):
        """(local (source, grad) pairs, global (source, grad) pairs), as Horovod returns."""
        grads = self.gradient(target, sources, output_gradients)
        local, glob = [], []
        for s, g in zip(sources, grads):
            (local if _key(s) in self._hvd_reduction.local else glob).append((s, g))
        return local, glob


@graph_safe
def DistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Wraps a tf.GradientTape: gradient() reduces the gradients across ranks (one fused call, or
    one per group)."""
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
    reduction = GradientReduction(
        "DistributedGradientTape",
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
    return _DistributedGradientTape(gradtape, reduction)


@graph_safe
def PartialDistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients=True,
):
    """DistributedGradientTape whose `local_layers`' gradients stay local."""
    local_layers = local_layer_list(local_layers)
    tape = DistributedGradientTape(
        gradtape,
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
    for layer in local_layers:
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape


def _is_keras_layer(obj) -> bool:
    """A Keras 3 layer or a tf_keras (Keras 2) one."""
    import keras

    if isinstance(obj, keras.layers.Layer):
        return True
    return any(c.__name__ == "Layer" and c.__module__.startswith("tf_keras.") for c in type(obj).__mro__)


def local_layer_list(local_layers) -> list:
    """Horovod's `local_layers` (None, a layer or layers of Keras 3 or tf_keras) as a list."""
    if local_layers is None:
        return []
    if _is_keras_layer(local_layers):
        return [local_layers]
    if not all(_is_keras_layer(layer) for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    return list(local_layers)
