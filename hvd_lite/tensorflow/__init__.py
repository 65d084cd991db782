"""hvd_lite for TensorFlow: `import hvd_lite.tensorflow as hvd` in place of
`import horovod.tensorflow as hvd`.

    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)   # after the first step

or, for Keras `model.fit`: `strategy = hvd.MultiWorkerMirroredStrategy()` (see docs/tensorflow.md).
Horovod 0.28.1's names and arguments are the spec; docs/tensorflow.md lists each name's status.
"""

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "hvd_lite.tensorflow needs TensorFlow: pip install 'hvd_lite[tensorflow]' "
        "(or pip install 'tensorflow-cpu==2.21.*')"
    ) from exc

from ..basics import (
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
from ..exceptions import HvdLiteError
from . import elastic
from .basics import (
    ccl_built,
    check_num_rank_power_of_2,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    handle_average_backwards_compatibility,
    is_homogeneous,
    mpi_built,
    mpi_enabled,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from .compression import Compression
from .functions import (
    DistributedGradientTape,
    PartialDistributedGradientTape,
    allgather_object,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from .mpi_ops import (
    Adasum,
    Average,
    CollectiveArgumentError,
    CollectiveFailedError,
    CollectiveMismatchError,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reducescatter,
    size_op,
)
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .tf1 import BroadcastGlobalVariablesHook


def DistributedOptimizer(
    optimizer,
    name=None,
    use_locking=False,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """An optimizer whose updates use gradients reduced across ranks: a Keras 3 or tf_keras
    optimizer's (hvd_lite.keras.DistributedOptimizer), or a tf.compat.v1.train optimizer's for TF1 graphs
    (its compute_gradients reduces them)."""
    import keras

    if isinstance(optimizer, _tf.compat.v1.train.Optimizer):
        from .tf1 import distributed_optimizer_v1

        return distributed_optimizer_v1(
            optimizer,
            name,
            use_locking,
            backward_passes_per_step,
            average_aggregated_gradients,
            device_dense=device_dense,
            device_sparse=device_sparse,
            compression=compression,
            sparse_as_dense=sparse_as_dense,
            op=op,
            gradient_predivide_factor=gradient_predivide_factor,
            num_groups=num_groups,
            groups=groups,
            process_set=process_set,
            scale_local_gradients=scale_local_gradients,
        )
    from ..keras import DistributedOptimizer as keras_distributed
    from ..keras.keras2 import is_tf_keras

    if not isinstance(optimizer, keras.optimizers.Optimizer) and not is_tf_keras(optimizer):
        raise TypeError(
            f"hvd_lite.tensorflow.DistributedOptimizer wraps a Keras optimizer (Keras 3's "
            f"keras.optimizers.Optimizer or tf_keras's) or a tf.compat.v1.train.Optimizer; "
            f"{type(optimizer).__module__}.{type(optimizer).__name__} is none of them"
        )
    if use_locking:
        raise ValueError("use_locking=True applies to TF1 optimizers only; Keras optimizers do not lock")

    return keras_distributed(
        optimizer,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        num_groups=num_groups,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )


def __getattr__(name):
    # the strategy module imports TF's distribute internals: load it on first use
    if name == "MultiWorkerMirroredStrategy":
        from .strategy import MultiWorkerMirroredStrategy

        return MultiWorkerMirroredStrategy
    if name == "SyncBatchNormalization":  # a Keras layer: Keras is imported on first use
        from .sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module 'hvd_lite.tensorflow' has no attribute {name!r}")


__all__ = [
    "elastic",
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "size",
    "local_size",
    "cross_size",
    "rank",
    "local_rank",
    "cross_rank",
    "is_homogeneous",
    "rank_op",
    "local_rank_op",
    "size_op",
    "local_size_op",
    "process_set_included_op",
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
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "ReduceOp",
    "handle_average_backwards_compatibility",
    "check_num_rank_power_of_2",
    "join",
    "barrier",
    "SyncBatchNormalization",
    "allreduce",
    "grouped_allreduce",
    "reducescatter",
    "grouped_reducescatter",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "broadcast_",
    "alltoall",
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
    "DistributedOptimizer",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "Compression",
    "allgather_object",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "MultiWorkerMirroredStrategy",
    "HvdLiteError",
    "CollectiveFailedError",
    "CollectiveArgumentError",
    "CollectiveMismatchError",
]
