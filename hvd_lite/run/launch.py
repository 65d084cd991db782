"""Turns the launcher's options into a plan (MPI, argv, environment) and runs it."""

import contextlib
import math
import os
import secrets
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from ..exceptions import LauncherError
from . import flavour as flavours
from .command import LaunchSpec, build_command, forwarded_names
from .hosts import place, resolve
from .job import ExitReports, Job, JobResult
from .rank import REPORT_VAR, TOKEN_VAR
from .values import parse_float

DEFAULT_START_TIMEOUT_S = 60.0

# Open MPI's mpirun keeps its session directory (PMIx's rendezvous files among it) at
# <base>/ompi.<its pid>; the base is $TMPDIR unless one of these says otherwise.
SESSION_BASE_VARS = ("PRTE_MCA_prte_tmpdir_base", "PRTE_MCA_prte_local_tmpdir_base")


def default_start_timeout() -> float:
    """$HVD_LITE_START_TIMEOUT, else 60 seconds."""
    value = os.environ.get("HVD_LITE_START_TIMEOUT")
    if value is None:
        return DEFAULT_START_TIMEOUT_S
    try:
        seconds = parse_float(value)
    except ValueError as exc:
        raise LauncherError(
            f"HVD_LITE_START_TIMEOUT must be a number of seconds > 0: expected {exc}"
        ) from None
    if seconds <= 0:
        raise LauncherError(f"HVD_LITE_START_TIMEOUT must be a number of seconds > 0, got {value!r}")
    return seconds


@dataclass
class Plan:
    """A job ready to run: the MPI found, the argv for it and the environment to give it."""

    mpi: flavours.MPI
    argv: List[str]
    env: Dict[str, str]
    np: int
    token: str
    reports: Optional[ExitReports] = None  # where the shims also report their exits (execute closes it)
    rank_hosts: List[str] = field(default_factory=list)  # each rank's host (hosts filled in order)
    mpi_args: List[str] = field(default_factory=list)  # the user's options for mpirun (in argv too)

    def shell_line(self) -> str:
        """The command as one line a shell would run unchanged."""
        return shlex.join(self.argv)


def make_plan(
    command: Sequence[str],
    np: Optional[int] = None,
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    mpi_args: Union[str, Sequence[str], None] = None,
    knob_env: Optional[Mapping[str, str]] = None,
    env: Optional[Mapping[str, str]] = None,
    tag_output: bool = True,
    mpirun: Optional[str] = None,
    report_exits: bool = False,
) -> Plan:
    """Validates the options, finds the MPI and builds its command line; `report_exits`: the ranks'
    shims also send their exit markers to a listener of the plan's (a job that survives deaths)."""
    if not command:
        raise LauncherError(
            "no command given: put the command to run after the options, "
            "e.g. hvd_lite.run -np 2 python train.py"
        )
    n, host_list = resolve(np, hosts, hostfile)
    if isinstance(mpi_args, str):
        try:
            mpi_args = shlex.split(mpi_args)
        except ValueError as exc:
            raise LauncherError(f"--mpi-args {mpi_args!r}: {exc}") from None
    mpi = flavours.find(mpirun)
    token = secrets.token_hex(8)
    job_env = dict(os.environ if env is None else env)
    job_env.update(knob_env or {})
    job_env[TOKEN_VAR] = token
    job_env.pop(REPORT_VAR, None)  # an enclosing job's (a launch from one of its ranks)
    reports = ExitReports([h.name for h in host_list]) if report_exits else None
    if reports is not None:
        job_env[REPORT_VAR] = reports.address
    if mpi.flavour == flavours.OPENMPI and os.geteuid() == 0:
        # Open MPI refuses root without these (or --allow-run-as-root, which we also pass).
        job_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        job_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    spec = LaunchSpec(
        np=n,
        hosts=host_list,
        command=list(command),
        mpi_args=list(mpi_args or ()),
        knob_env=dict(knob_env or {}),
        forward_env=forwarded_names(job_env),
        tag_output=tag_output,
        as_root=os.geteuid() == 0,
    )
    try:
        argv = build_command(mpi.flavour, mpi.path, spec)
    except BaseException:
        if reports is not None:
            reports.close()
        raise
    rank_hosts = [name for name, count in place(host_list, n) for _ in range(count)]
    return Plan(mpi, argv, job_env, n, token, reports, rank_hosts, list(spec.mpi_args))


def execute(
    plan: Plan,
    start_timeout: Optional[float] = None,
    stdin=None,
    quiet: bool = False,
    survives_deaths: bool = False,
    on_death: Optional[Callable[[int], None]] = None,
) -> JobResult:
    """Runs a plan to its end; `survives_deaths`: a rank killed by a signal does not end the job
    (an elastic job that shrinks in place); `on_death(rank)`: called as such a death is read."""
    timeout = default_start_timeout() if start_timeout is None else float(start_timeout)
    if not (math.isfinite(timeout) and timeout > 0):
        if plan.reports is not None:
            plan.reports.close()
        raise LauncherError(f"--start-timeout must be a finite number of seconds > 0, got {timeout:g}")
    with _own_session_base(plan) as env:
        job = Job(
            plan.argv,
            env,
            plan.np,
            plan.token,
            timeout,
            stdin,
            quiet,
            survives_deaths,
            on_death,
            plan.reports,
        )
        result = job.run()
    result.rank_hosts = list(plan.rank_hosts)
    return result


@contextlib.contextmanager
def _own_session_base(plan: Plan) -> Iterator[Dict[str, str]]:
    """The plan's environment, with Open MPI's mpirun given a session directory base of this
    job's own (removed after it). An mpirun killed by SIGKILL leaves its session directory behind,
    and a later mpirun that gets the same pid in the same base cannot start ("The PMIx server's
    listener thread failed to start": its rendezvous files exist); a base per job cannot hold
    another's. The ranks' TMPDIR is unchanged, and a base the user chose is kept."""
    chosen = any(name in plan.env for name in SESSION_BASE_VARS) or any(
        "tmpdir" in arg for arg in plan.mpi_args
    )
    if plan.mpi.flavour != flavours.OPENMPI or chosen:
        yield plan.env
        return
    try:
        base = tempfile.mkdtemp(prefix="hvd_lite-mpirun.", dir=plan.env.get("TMPDIR") or None)
    except OSError:  # no writable TMPDIR: mpirun's own default, which will say so if it matters
        yield plan.env
        return
    try:
        yield {**plan.env, "PRTE_MCA_prte_local_tmpdir_base": base}
    finally:
        shutil.rmtree(base, ignore_errors=True)
