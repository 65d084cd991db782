"""hvd_lite for TensorFlow: `import hvd_lite.tensorflow as hvd` in place of `import horovod.tensorflow as hvd`.

    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)   # after the first step

or, for Keras `model.fit`: `strategy = hvd.MultiWorkerMirroredStrategy()` (see docs/tensorflow.md).
"""
try:
    import tensorflow as _tf  # noqa: F401
except ImportError as exc:
    raise ImportError("hvd_lite.tensorflow needs TensorFlow: pip install 'hvd_lite[tensorflow]' "
                      "(or pip install 'tensorflow-cpu==2.21.*')") from exc

from ..basics import (cross_rank, cross_size, init, is_initialized, local_rank, local_size,
                      mpi_threads_supported, rank, shutdown, size)
from ..exceptions import HvdLiteError
from ..state import allgather_object, broadcast_object
from .compression import Compression
from .functions import DistributedGradientTape, broadcast_variables
from .mpi_ops import (Average, Max, Min, Product, ReduceOp, Sum, allgather, allreduce, alltoall,
                      barrier, broadcast, grouped_allreduce, reducescatter)


def __getattr__(name):
    # the strategy module imports TF's distribute internals: load it on first use
    if name == "MultiWorkerMirroredStrategy":
        from .strategy import MultiWorkerMirroredStrategy

        return MultiWorkerMirroredStrategy
    raise AttributeError(f"module 'hvd_lite.tensorflow' has no attribute {name!r}")


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported",
    "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "barrier", "ReduceOp", "Sum", "Average", "Min", "Max", "Product", "Compression",
    "DistributedGradientTape", "broadcast_variables", "broadcast_object", "allgather_object",
    "MultiWorkerMirroredStrategy", "HvdLiteError",
]
