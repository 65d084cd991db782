"""hvd_lite for Keras 3: `import hvd_lite.keras as hvd` in place of `import horovod.keras as hvd`.

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, ...)
    model.fit(..., callbacks=[hvd.BroadcastGlobalVariablesCallback(0), hvd.MetricAverageCallback()])

The TensorFlow backend is supported; the JAX and torch backends are refused with an error.
"""
try:
    import keras as _keras
except ImportError as exc:
    raise ImportError("hvd_lite.keras needs Keras 3 with TensorFlow: pip install "
                      "'hvd_lite[tensorflow]'") from exc

from ..exceptions import HvdLiteError


def _check_backend() -> None:
    backend = _keras.backend.backend()
    if backend != "tensorflow":
        raise HvdLiteError(f"hvd_lite.keras supports the Keras 'tensorflow' backend, but Keras runs "
                           f"the {backend!r} backend; set KERAS_BACKEND=tensorflow before importing "
                           "keras (for torch, use hvd_lite.torch on a plain torch training loop)")


_check_backend()

from ..basics import (cross_rank, cross_size, init, is_initialized, local_rank, local_size,  # noqa: E402
                      rank, shutdown, size)
from ..state import allgather_object, broadcast_object  # noqa: E402
from ..tensorflow import (Average, Compression, Max, Min, Product, Sum, allgather, allreduce,  # noqa: E402
                          broadcast, broadcast_variables)
from .callbacks import (BroadcastGlobalVariablesCallback, LearningRateWarmupCallback,  # noqa: E402
                        MetricAverageCallback)
from .optimizer import DistributedOptimizer  # noqa: E402

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "allreduce", "allgather", "broadcast", "broadcast_variables",
           "allgather_object", "broadcast_object",
           "Average", "Sum", "Min", "Max", "Product", "Compression", "DistributedOptimizer",
           "BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateWarmupCallback", "HvdLiteError"]
