"""Process-level state: init, shutdown, and the rank/size queries."""
import atexit
import os
from typing import Any, Optional

from . import _loader
from .exceptions import MPIMismatchError, NotInitializedError

_core = _loader._core

_VENDOR_MARKERS = {"openmpi": "Open MPI", "mpich": "MPICH", "intel": "Intel"}
# Variables each launcher sets to the job's size: (variable, launcher, MPI vendor).
_LAUNCHER_SIZE_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun", "openmpi"),
    ("PMI_SIZE", "an MPICH/Hydra mpiexec", "mpich"),
)


class _State:
    engine: Optional[Any] = None
    auto_names: dict = {}
    thread_level: int = -1
    finalize_at_exit: bool = False
    atexit_registered: bool = False
    adapter_faults: bool = False  # an adapter fault may be armed (a testing aid)


_state = _State()


def build_info() -> dict:
    """The MPI this build was compiled against, and the one loaded now."""
    info = dict(_core.build_info())
    info["mpi_runtime"] = _core.mpi_library_version().strip()
    return info


def _check_runtime_mpi() -> None:
    info = build_info()
    marker = _VENDOR_MARKERS.get(info["mpi_vendor"])
    runtime = info["mpi_runtime"]
    if marker and marker not in runtime:
        raise MPIMismatchError(
            f"hvd_lite was built against {info['mpi_header']} but the MPI loaded at run time is "
            f"{runtime.splitlines()[0] if runtime else 'unknown'}; rebuild hvd_lite against this MPI "
            "or run it with the MPI it was built with (README, 'Choosing the MPI')."
        )


def _launcher_mismatch(launcher: str, var: str, value: str) -> MPIMismatchError:
    return MPIMismatchError(
        f"this process was started by {launcher} for {value} ranks ({var}={value}), but the "
        f"launcher belongs to a different MPI than the one hvd_lite was built against "
        f"({_core.build_info()['mpi_header']}). Use that MPI's mpirun (or hvd_lite.run), or rebuild "
        "hvd_lite against this MPI (README, 'Choosing the MPI')."
    )


def _check_launcher_before_init() -> None:
    """A launcher of another MPI vendor: say so before MPI_Init (MPICH aborts inside it)."""
    built = _core.build_info()["mpi_vendor"]
    for var, launcher, vendor in _LAUNCHER_SIZE_VARS:
        value = os.environ.get(var, "")
        if value and vendor != built and built in ("openmpi", "mpich") and not any(
                os.environ.get(v) for v, _, vend in _LAUNCHER_SIZE_VARS if vend == built):
            raise _launcher_mismatch(launcher, var, value)


def _check_launcher_after_init(size: int) -> None:
    """A job the launcher says has N > 1 ranks but MPI sees as a singleton."""
    if size != 1:
        return
    for var, launcher, _ in _LAUNCHER_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1:
            raise _launcher_mismatch(launcher, var, value)


def _atexit() -> None:
    shutdown()  # tells the other ranks this one is leaving
    if _state.finalize_at_exit:
        _core.mpi_finalize()


def init(comm: Any = None) -> None:
    """Initialises hvd_lite (and MPI, with thread support, if nobody has)."""
    if _state.engine is not None:
        return
    if comm is None:
        fhandle, ranks = None, None
    elif hasattr(comm, "py2f"):  # an mpi4py communicator
        fhandle, ranks = int(comm.py2f()), None
    elif isinstance(comm, (list, tuple)) and all(isinstance(r, int) for r in comm):
        if len(set(comm)) != len(comm) or not comm:
            raise ValueError(f"init(comm=...): the list of ranks must be non-empty and without "
                             f"duplicates, got {list(comm)}")
        fhandle, ranks = None, list(comm)
    else:
        raise TypeError("init(comm=...) takes None, an mpi4py communicator or a list of ranks, "
                        f"got {type(comm).__name__}")
    _check_runtime_mpi()
    _check_launcher_before_init()
    provided, initialized_here = _core.mpi_init()
    _state.thread_level = provided
    if initialized_here:
        _state.finalize_at_exit = True
    if not _state.atexit_registered:
        atexit.register(_atexit)
        _state.atexit_registered = True
    if comm is None:
        _check_launcher_after_init(_core.mpi_world_size())
    _state.engine = _core.Engine(fhandle, ranks)
    _state.auto_names = {}  # automatic names restart with every engine, on every rank
    # HVD_LITE_FAULT (parsed by the engine) may arm the adapter's fault point too
    _state.adapter_faults = "adapter" in os.environ.get("HVD_LITE_FAULT", "")


def inject_fault(point: str, n: int = 1) -> None:
    """A testing aid: this rank fails the n-th next time it reaches `point` (alloc, send, recv,
    negotiate, stall, exit, adapter; docs/design.md, "Failures"); n=0 disarms it."""
    _engine()._inject_fault(point, n)
    if point == "adapter":
        _state.adapter_faults = True


def adapter_fault() -> str:
    """The error an armed adapter fault gives this request, or "" (the common case, quickly)."""
    if not _state.adapter_faults or not _engine()._fault_hit("adapter"):
        return ""
    return "injected fault (HVD_LITE_FAULT): the adapter failed"


def auto_name(kind: str) -> str:
    """The next automatic name for a collective of this kind: the same on every rank
    that makes the same calls in the same order since init()."""
    n = _state.auto_names.get(kind, 0)
    _state.auto_names[kind] = n + 1
    return f"{kind}.noname.{n}"


def shutdown() -> None:
    """Stops the engine (pending collectives fail); MPI itself stays up until the process exits.
    A signal (Ctrl-C) interrupts the wait for the engine to leave: it goes on leaving, refusing
    new collectives, and the next shutdown() (or the one at exit) waits for the rest."""
    engine = _state.engine
    if engine is not None:
        engine.shutdown()
        if _state.engine is engine:
            _state.engine = None


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _state.engine is not None


def _engine():
    if _state.engine is None:
        raise NotInitializedError("hvd_lite has not been initialized; call hvd_lite.init() first")
    return _state.engine


def rank() -> int:
    """This process's rank."""
    return _engine().rank


def size() -> int:
    """Number of ranks."""
    return _engine().size


def local_rank() -> int:
    """Rank among the processes on this host."""
    return _engine().local_rank


def local_size() -> int:
    """Number of ranks on this host."""
    return _engine().local_size


def cross_rank() -> int:
    """Index of this host among the hosts (ranks with the same local rank)."""
    return _engine().cross_rank


def cross_size() -> int:
    """Number of hosts that have a rank with this local rank."""
    return _engine().cross_size


def mpi_threads_supported() -> bool:
    """True if MPI runs with MPI_THREAD_MULTIPLE."""
    _engine()
    return _state.thread_level == _core.MPI_THREAD_MULTIPLE
