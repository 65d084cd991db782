"""horovod.tensorflow's queries about the build and the job, answered for hvd_lite (an MPI build
on the CPU; the build and timeline queries are hvd_lite._build's, shared with hvd_lite.torch)."""

from .._build import (  # noqa: F401
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    mpi_built,
    mpi_enabled,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from .._horovod_args import resolve_op
from ..ops import Average, Sum


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """True if `num_rank` is a power of two."""
    return num_rank > 0 and (num_rank & (num_rank - 1)) == 0


def handle_average_backwards_compatibility(op, average):
    """Horovod's (op, average) pair as one op, as Horovod resolves it: op=None means Average."""
    return resolve_op("handle_average_backwards_compatibility", op, average)


__all__ = [
    "mpi_built",
    "mpi_enabled",
    "gloo_built",
    "gloo_enabled",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "is_homogeneous",
    "start_timeline",
    "stop_timeline",
    "check_num_rank_power_of_2",
    "handle_average_backwards_compatibility",
    "Average",
    "Sum",
]
