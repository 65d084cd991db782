"""horovod.tensorflow's queries about the build and the job, answered for hvd_lite (an MPI build
on the CPU), and the ones hvd_lite does not have, which raise."""
from .. import basics
from ..ops import Average, Sum


def mpi_built() -> bool:
    """hvd_lite is always built on MPI."""
    return True


def mpi_enabled() -> bool:
    """True once hvd_lite is initialized (it runs on MPI only)."""
    return basics.is_initialized()


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> int:
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


def is_homogeneous() -> bool:
    """Not implemented: hvd_lite does not record every host's rank count."""
    raise NotImplementedError("is_homogeneous() is not implemented in hvd_lite (it matters to "
                              "Horovod's GPU Adasum only)")


def start_timeline(file_path, mark_cycles=False) -> None:
    """Not implemented at run time: the timeline starts with the job."""
    raise NotImplementedError("hvd_lite's timeline is started with the job: set HVD_LITE_TIMELINE="
                              "/path/timeline.json (or hvd_lite.run --timeline-filename); see "
                              "docs/timeline.md")


def stop_timeline() -> None:
    """Not implemented at run time: the timeline ends with the job."""
    raise NotImplementedError("hvd_lite's timeline runs for the whole job (HVD_LITE_TIMELINE); it "
                              "cannot be stopped at run time")


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """True if `num_rank` is a power of two."""
    return num_rank > 0 and (num_rank & (num_rank - 1)) == 0


def handle_average_backwards_compatibility(op, average):
    """Horovod's (op, average) pair as one op: op=None means Average."""
    from .mpi_ops import reduce_op

    return reduce_op("handle_average_backwards_compatibility", op, average)


__all__ = ["mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built",
           "ccl_built", "cuda_built", "rocm_built", "is_homogeneous", "start_timeline",
           "stop_timeline", "check_num_rank_power_of_2", "handle_average_backwards_compatibility",
           "Average", "Sum"]
