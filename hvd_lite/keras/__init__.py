"""hvd_lite for Keras 3 and Keras 2 (tf_keras): `import hvd_lite.keras as hvd` in place of
`import horovod.keras as hvd`.

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, ...)
    model.fit(..., callbacks=[hvd.BroadcastGlobalVariablesCallback(0), hvd.MetricAverageCallback()])

The TensorFlow backend is supported; the JAX and torch backends are refused with an error. tf_keras's
optimizers, models and callbacks (tf.keras under TF_USE_LEGACY_KERAS=1) are taken too: keras2.py.
"""

try:
    import keras as _keras
except ImportError as exc:
    raise ImportError(
        "hvd_lite.keras needs Keras 3 with TensorFlow: pip install 'hvd_lite[tensorflow]'"
    ) from exc

from ..exceptions import HvdLiteError


def _check_backend() -> None:
    backend = _keras.backend.backend()
    if backend != "tensorflow":
        raise HvdLiteError(
            f"hvd_lite.keras supports the Keras 'tensorflow' backend, but Keras runs "
            f"the {backend!r} backend; set KERAS_BACKEND=tensorflow before importing "
            "keras (for torch, use hvd_lite.torch on a plain torch training loop)"
        )


_check_backend()

import tensorflow as tf  # noqa: E402

from ..basics import (  # noqa: E402
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
)
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set  # noqa: E402
from ..state import allgather_object, broadcast_object  # noqa: E402
from ..tensorflow import functions as _tf_functions  # noqa: E402
from ..tensorflow import mpi_ops as _ops  # noqa: E402
from ..tensorflow.basics import (  # noqa: E402
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from ..tensorflow.compression import Compression  # noqa: E402
from ..tensorflow.functions import broadcast_variables  # noqa: E402
from ..tensorflow.mpi_ops import Adasum, Average, Max, Min, Product, Sum, graph_safe  # noqa: E402
from . import callbacks, elastic  # noqa: E402
from . import keras2 as _keras2  # noqa: E402
from .callbacks import (  # noqa: E402
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer  # noqa: E402


@graph_safe
def broadcast_global_variables(root_rank):
    """Horovod's TF1 call: refused under eager TensorFlow 2, as Horovod refuses it."""
    return _tf_functions.broadcast_global_variables(root_rank)


@graph_safe
def allreduce(
    value,
    name=None,
    average=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    op=None,
    compression=Compression.none,
):
    """`value` (anything tf.constant takes) reduced across ranks, Average by default."""
    return _ops.allreduce(
        tf.constant(value, name=name),
        average=average,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        op=op,
        compression=compression,
    )


@graph_safe
def allgather(value, name=None):
    """Every rank's `value` concatenated along dim 0."""
    return _ops.allgather(tf.constant(value, name=name))


@graph_safe
def broadcast(value, root_rank, name=None):
    """Rank `root_rank`'s `value` on every rank."""
    return _ops.broadcast(tf.constant(value, name=name), root_rank)


@graph_safe
def reducescatter(value, name=None, op=Average):
    """`value` reduced across ranks; rank r keeps its block of dim 0."""
    return _ops.reducescatter(tf.constant(value, name=name), op=op)


def load_model(
    filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none, legacy_opts=False
):
    """Loads a saved model (keras.models.load_model, or tf_keras's) with its optimizer wrapped in
    DistributedOptimizer and its state kept. The Keras is the one the file says saved it; where it
    does not say, tf_keras when `custom_optimizers` are tf_keras classes or `tf.keras` is tf_keras
    (TF_USE_LEGACY_KERAS=1), Keras 3 otherwise;
    `legacy_opts=True` (tf_keras only) expects a tf_keras.optimizers.legacy optimizer in the file."""
    use_tf_keras = _keras2.saved_by_tf_keras(filepath)
    if use_tf_keras is None:
        use_tf_keras = (
            any(_keras2.is_tf_keras_class(c) for c in custom_optimizers)
            if custom_optimizers
            else _keras2.tf_keras_is_tf_keras()
        )
    if legacy_opts and not use_tf_keras:
        raise ValueError(
            "legacy_opts=True loads tf_keras.optimizers.legacy optimizers, which Keras 3 does not "
            "have: install tf_keras and set TF_USE_LEGACY_KERAS=1 (or pass tf_keras custom_optimizers)"
        )
    objects = {c.__name__: c for c in custom_optimizers or ()}
    objects.update(custom_objects or {})
    loader = _tf_keras().models.load_model if use_tf_keras else _keras.models.load_model
    model = loader(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if legacy_opts and opt is not None and not _keras2.is_legacy_optimizer(opt):
        raise ValueError(
            f"legacy_opts=True, but {filepath!r} was saved with a tf_keras.optimizers."
            f"{type(opt).__name__}, not a legacy one (tf_keras loads the kind that was saved, and "
            "its state fits only that kind); load it with legacy_opts=False"
        )
    if (
        custom_optimizers is not None
        and opt is not None
        and not any(isinstance(opt, c) for c in custom_optimizers)
    ):
        raise ValueError(
            f"the saved optimizer is a {type(opt).__name__}, not one of "
            f"custom_optimizers {[c.__name__ for c in custom_optimizers]}"
        )
    if opt is not None and not hasattr(opt, "_hvd_reduction"):
        dist = DistributedOptimizer(opt, compression=compression)
        if _keras2.optimizer_built(opt):
            _keras2.build_optimizer(dist, model.trainable_variables)
            for mine, saved in zip(_keras2.optimizer_variables(dist), _keras2.optimizer_variables(opt)):
                mine.assign(saved)
        model.optimizer = dist
    return model


def _tf_keras():
    try:
        import tf_keras
    except ImportError as exc:
        raise ImportError(
            "loading a Keras 2 model needs tf_keras: pip install --no-deps tf_keras==2.21.0"
        ) from exc
    return tf_keras


__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "broadcast_variables",
    "broadcast_global_variables",
    "allgather_object",
    "broadcast_object",
    "load_model",
    "callbacks",
    "elastic",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "HvdLiteError",
]
