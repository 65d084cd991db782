"""hvd_lite: Horovod-style data-parallel collectives over MPI.

    import hvd_lite as hvd
    hvd.init()
    y = hvd.allreduce(x)            # numpy arrays; Average by default
"""
from .basics import (
    build_info,
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
from .collectives import (
    allgather,
    allgather_async,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
)
from .exceptions import (
    CollectiveError,
    HvdLiteError,
    InvalidArgumentError,
    LauncherError,
    MPIMismatchError,
    NotInitializedError,
    RemoteRankError,
    UnsupportedDtypeError,
)
from .memory import empty
from .ops import (
    Average,
    Handle,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    poll,
    synchronize,
)
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .state import allgather_object, broadcast_object, broadcast_parameters

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "build_info",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "poll",
    "synchronize", "Handle", "ReduceOp", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "barrier", "join", "broadcast_object", "allgather_object",
    "broadcast_parameters", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "empty", "Sum", "Average", "Min", "Max", "Product",
    "HvdLiteError", "NotInitializedError", "MPIMismatchError", "CollectiveError",
    "InvalidArgumentError", "LauncherError", "RemoteRankError", "UnsupportedDtypeError",
    "__version__",
]
