"""Builds the mpirun command line for Open MPI 5, MPICH/Hydra and Intel MPI.

Every flavour gets the same job: N ranks filled host by host in the order given, no binding of a
rank's threads to one core, output tagged with the rank, the HVD_LITE_* knobs set on every rank,
and the user's command run unchanged through the rank shim (rank.py).

  Open MPI 5  mpirun [--allow-run-as-root] -np N --host h1:2,h2:2 --map-by slot --bind-to none
              [--output tag] -x KNOB=VALUE... -x NAME... MPI_ARGS... PYTHON rank.py CMD...
  MPICH       mpiexec -n N -hosts h1:2,h2:2 -bind-to none [-prepend-rank] -genvall
              -genv KNOB VALUE... MPI_ARGS... PYTHON rank.py CMD...
  Intel MPI   mpirun [-prepend-rank] -genvall -genv KNOB VALUE... -genv I_MPI_PIN 0
              -ppn S -hosts h1,h2 MPI_ARGS... -n N PYTHON rank.py CMD...
              (hosts with different slot counts: one argument set per host, joined by ':')
"""

import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence

from .flavour import INTEL, MPICH, OPENMPI
from .hosts import Host, place

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank.py")

# Variables Open MPI forwards to remote hosts with -x NAME (Hydra passes the whole environment).
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")
FORWARD_PREFIXES = ("HVD_LITE_", "PYTHON", "CUDA_", "NCCL_", "OMP_", "MKL_")


def forwarded_names(environ: Mapping[str, str]) -> List[str]:
    """Names of the variables in `environ` that Open MPI's -x forwards, sorted."""
    return sorted(
        name
        for name in environ
        if name.isidentifier() and (name in FORWARD_NAMES or name.startswith(FORWARD_PREFIXES))
    )


@dataclass
class LaunchSpec:
    """What to launch: ranks, hosts, the command, and how."""

    np: int
    hosts: Sequence[Host]
    command: Sequence[str]
    mpi_args: Sequence[str] = ()
    knob_env: Dict[str, str] = field(default_factory=dict)
    forward_env: Sequence[str] = ()
    tag_output: bool = True
    as_root: bool = False
    python: str = sys.executable
    shim: str = SHIM


def _given(mpi_args: Sequence[str], *options: str) -> bool:
    return any(a == o or a.startswith(o + "=") for a in mpi_args for o in options)


def _rank_command(spec: LaunchSpec) -> List[str]:
    return [spec.python, spec.shim] + list(spec.command)


def openmpi_command(mpirun: str, spec: LaunchSpec) -> List[str]:
    """Open MPI 5 (PRRTE) spelling: double-dash options, -x for the environment."""
    placed = place(spec.hosts, spec.np)
    cmd = [mpirun]
    if spec.as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["-np", str(spec.np), "--host", ",".join(f"{h}:{n}" for h, n in placed)]
    if not _given(spec.mpi_args, "--map-by", "-map-by"):
        cmd += ["--map-by", "slot"]
    if not _given(spec.mpi_args, "--bind-to", "-bind-to"):
        cmd += ["--bind-to", "none"]
    if spec.tag_output:
        cmd += ["--output", "tag"]
    for name, value in sorted(spec.knob_env.items()):
        cmd += ["-x", f"{name}={value}"]
    for name in spec.forward_env:
        if name not in spec.knob_env:
            cmd += ["-x", name]
    return cmd + list(spec.mpi_args) + _rank_command(spec)


def _hydra_env(spec: LaunchSpec) -> List[str]:
    cmd = ["-genvall"]
    for name, value in sorted(spec.knob_env.items()):
        cmd += ["-genv", name, value]
    return cmd


def mpich_command(mpiexec: str, spec: LaunchSpec) -> List[str]:
    """MPICH's Hydra: -hosts h:n, -bind-to none, -genvall plus -genv for the knobs."""
    placed = place(spec.hosts, spec.np)
    cmd = [mpiexec, "-n", str(spec.np), "-hosts", ",".join(f"{h}:{n}" for h, n in placed)]
    if not _given(spec.mpi_args, "-bind-to", "--bind-to", "-binding"):
        cmd += ["-bind-to", "none"]
    if spec.tag_output:
        cmd.append("-prepend-rank")
    return cmd + _hydra_env(spec) + list(spec.mpi_args) + _rank_command(spec)


def intel_command(mpirun: str, spec: LaunchSpec) -> List[str]:
    """Intel MPI's Hydra: -ppn/-hosts (or one argument set per host), pinning off with I_MPI_PIN."""
    placed = place(spec.hosts, spec.np)
    cmd = [mpirun]
    if spec.tag_output:
        cmd.append("-prepend-rank")
    cmd += _hydra_env(spec)
    if not _given(spec.mpi_args, "I_MPI_PIN"):
        cmd += ["-genv", "I_MPI_PIN", "0"]
    counts = [n for _, n in placed]
    if all(n == counts[0] for n in counts[:-1]) and counts[-1] <= counts[0]:
        return (
            cmd
            + ["-ppn", str(counts[0]), "-hosts", ",".join(h for h, _ in placed)]
            + list(spec.mpi_args)
            + ["-n", str(spec.np)]
            + _rank_command(spec)
        )
    cmd += list(spec.mpi_args)
    for i, (host, n) in enumerate(placed):
        if i:
            cmd.append(":")
        cmd += ["-n", str(n), "-host", host] + _rank_command(spec)
    return cmd


BUILDERS = {OPENMPI: openmpi_command, MPICH: mpich_command, INTEL: intel_command}


def build_command(flavour: str, mpirun: str, spec: LaunchSpec) -> List[str]:
    """The argv that launches `spec` with the given MPI flavour's mpirun."""
    return BUILDERS[flavour](mpirun, spec)
