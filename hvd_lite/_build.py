"""Horovod's queries about the build (which backends it has) and its timeline calls, as they are
for hvd_lite: MPI only, CUDA where the build has it, the timeline set by HVD_LITE_TIMELINE. One
module for hvd_lite.torch, hvd_lite.tensorflow and hvd_lite.keras."""

from . import basics


def mpi_built() -> bool:
    """True: hvd_lite always runs over MPI."""
    return True


def mpi_enabled() -> bool:
    """True: collectives run over MPI."""
    return True


def gloo_built() -> bool:
    """False: hvd_lite has no Gloo controller."""
    return False


def gloo_enabled() -> bool:
    """False: hvd_lite has no Gloo controller."""
    return False


def nccl_built() -> int:
    """0: no NCCL (Horovod returns NCCL's version code when it has it)."""
    return 0


def ddl_built() -> bool:
    """False: no IBM DDL."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL."""
    return False


def cuda_built() -> bool:
    """True when this build has CUDA (build_info()['cuda']): allreduce and broadcast then take
    CUDA memory (CuPy arrays; hvd_lite.torch's CUDA tensors) on its stream; without it CUDA
    tensors go through a CPU copy."""
    return bool(basics.build_info()["cuda"])


def rocm_built() -> bool:
    """False: no ROCm."""
    return False


def is_homogeneous() -> bool:
    """True if every host runs the same number of ranks."""
    return bool(basics._engine().homogeneous)


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Not supported: hvd_lite's timeline is set before init() by HVD_LITE_TIMELINE=<file>."""
    raise NotImplementedError(
        "hvd_lite does not start a timeline at run time; set "
        "HVD_LITE_TIMELINE=<file> before init() (docs/timeline.md)"
    )


def stop_timeline() -> None:
    """Not supported: hvd_lite's timeline runs from init() to shutdown() (HVD_LITE_TIMELINE)."""
    raise NotImplementedError(
        "hvd_lite does not stop a timeline at run time; its timeline "
        "(HVD_LITE_TIMELINE) runs from init() to shutdown()"
    )
