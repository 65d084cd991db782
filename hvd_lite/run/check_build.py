"""`hvd_lite.run --check-build`: how hvd_lite was built, and what it can use on this machine."""

import ctypes
import importlib.metadata
import importlib.util
import re
import sys
from typing import List, Optional

from ..exceptions import HvdLiteError
from . import flavour as flavours

FRAMEWORKS = (
    ("torch", "PyTorch"),
    ("tensorflow", "TensorFlow"),
    ("jax", "JAX"),
    ("mxnet", "MXNet"),
    ("numpy", "NumPy"),
)
_HEADER_VENDOR = {"openmpi": flavours.OPENMPI, "mpich": flavours.MPICH, "intel": flavours.INTEL}
THREAD_CHECK_TIMEOUT_S = 60


def _version_of(header: str) -> str:
    m = re.search(r"(\d+(?:\.\d+)+)", header)
    return m.group(1) if m else ""


def _cuda() -> str:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return "no (no CUDA driver, libcuda.so.1 not found)"
    if lib.cuInit(0) != 0:
        return "no (CUDA driver found, but cuInit failed: no usable GPU)"
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "no (CUDA driver found, no GPU)"
    return f"yes ({count.value} GPU(s))"


def _cupy() -> str:
    if importlib.util.find_spec("cupy") is None:
        return "no (not installed)"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
        return f"yes (CuPy {cupy.__version__}, {n} GPU(s))"
    except Exception as exc:  # noqa: BLE001 - any failure means not usable
        return f"no (CuPy installed but not usable: {type(exc).__name__}: {exc})".splitlines()[0]


def _framework(module: str) -> Optional[str]:
    """The installed version of the package that provides `module`, read from its metadata: the
    framework is not imported (TensorFlow would print its start-up log on stderr)."""
    if importlib.util.find_spec(module) is None:
        return None
    dists = importlib.metadata.packages_distributions().get(module, [])
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "installed (version unknown: no package metadata)"


def _thread_support(mpirun: Optional[str]) -> str:
    """Runs a 1-rank job (MPI needs a launcher to init cleanly) and asks MPI its thread level."""
    from .func import run

    try:
        multiple = run(_threads_multiple, np=1, mpirun=mpirun, start_timeout=THREAD_CHECK_TIMEOUT_S)[0]
    except HvdLiteError as exc:
        return f"unknown (a 1-rank job failed: {str(exc).splitlines()[0]})"
    return "MPI_THREAD_MULTIPLE (yes)" if multiple else "below MPI_THREAD_MULTIPLE (no)"


def _threads_multiple() -> bool:
    import hvd_lite as hvd

    hvd.init()
    try:
        return hvd.mpi_threads_supported()
    finally:
        hvd.shutdown()


def elastic_mode(mpirun: Optional[str] = None) -> str:
    """How an elastic job survives a rank's death with this build and this mpirun: in place
    (shrink mode, Open MPI with ULFM), or by a relaunch (restart mode)."""
    from .elastic import shrinks_in_place

    if shrinks_in_place(mpirun):
        return (
            "shrink (ULFM: the survivors go on in place from the last commit; hvd_lite.run "
            "starts an elastic job with mpirun --with-ft ulfm)"
        )
    return (
        "restart (a rank's death relaunches the job, which resumes from its last commit; this "
        "MPI has no ULFM to shrink it in place)"
    )


def report(mpirun: Optional[str] = None) -> str:
    """The --check-build text."""
    import hvd_lite

    info = hvd_lite.build_info()
    lines: List[str] = [
        f"hvd_lite {hvd_lite.__version__} (Python {sys.version.split()[0]}, {sys.executable})",
        "",
    ]
    runtime = (info.get("mpi_runtime") or "unknown").splitlines()[0].strip()
    lines += [
        f"  MPI built against:   {info['mpi_header']} ({info['mpi_vendor']}, "
        f"{info.get('libmpi') or 'libmpi'} in {info.get('mpi_libdir') or '?'})",
        f"  MPI loaded now:      {runtime}",
    ]
    warnings = []
    try:
        mpi = flavours.find(mpirun)
        lines.append(f"  mpirun on PATH:      {mpi.describe()}")
        built = _HEADER_VENDOR.get(info["mpi_vendor"])
        built_version = _version_of(info["mpi_header"])
        if built != mpi.flavour or (built_version and mpi.version and built_version != mpi.version):
            warnings.append(
                f"WARNING: the mpirun found ({mpi.describe()}) is not the MPI hvd_lite was built "
                f"against ({info['mpi_header']}); jobs will fail or run as separate 1-rank jobs. "
                "Put the matching mpirun first on PATH, pass --mpirun, or rebuild hvd_lite."
            )
        lines.append(f"  MPI thread support:  {_thread_support(mpi.path)}")
    except HvdLiteError as exc:
        lines.append(f"  mpirun on PATH:      none ({exc})")
        lines.append("  MPI thread support:  unknown (no mpirun to start a job)")
    built_cuda = (
        "yes (HVD_LITE_CUDA=1: the C API's all-reduce and broadcast take device buffers)"
        if info.get("cuda")
        else "no (build with HVD_LITE_CUDA=1 for device buffers)"
    )
    lines.append(f"  Elastic mode:        {elastic_mode(mpirun)}")
    lines += [
        "",
        f"  CUDA in this build:  {built_cuda}",
        f"  CUDA:                {_cuda()}",
        f"  CuPy:                {_cupy()}",
        "",
        "  Frameworks:",
    ]
    for module, name in FRAMEWORKS:
        version = _framework(module)
        mark = "[X]" if version and not version.startswith("installed,") else "[ ]"
        lines.append(f"    {mark} {name:<11} {version or 'not installed'}")
    if warnings:
        lines += [""] + warnings
    return "\n".join(lines)
