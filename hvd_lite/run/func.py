"""`run(func)`: runs a Python function on every rank and returns the results in rank order."""

import base64
import os
import sys
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import cloudpickle

from ..exceptions import LauncherError, RemoteRankError
from .knobs import knob_env
from .launch import execute, make_plan
from .rank import FUNC_VAR

MAX_PAYLOAD = 100_000  # bytes of base64 in one environment variable (Linux allows 128 KiB)


def _python_path(environ: Mapping[str, str]) -> str:
    """PYTHONPATH for the ranks: this process's sys.path entries outside the interpreter's own
    directories (so a function from a module the caller imported unpickles there too)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    own = tuple(os.path.realpath(p) + os.sep for p in prefixes)
    extra = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if os.path.isdir(path) and not (path + os.sep).startswith(own) and path not in extra:
            extra.append(path)
    old = environ.get("PYTHONPATH", "")
    return os.pathsep.join(extra + ([old] if old else []))


def run(
    func: Callable,
    args: Sequence = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    np: int = 1,
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    mpi_args: Union[str, Sequence[str], None] = None,
    env: Optional[Mapping[str, str]] = None,
    start_timeout: Optional[float] = None,
    mpirun: Optional[str] = None,
    verbose: bool = False,
    **knobs: Any,
) -> List[Any]:
    """Runs func(*args, **kwargs) on np ranks; returns the return values in rank order."""
    payload = base64.b64encode(cloudpickle.dumps((func, tuple(args), dict(kwargs or {}))))
    if len(payload) > MAX_PAYLOAD:
        raise LauncherError(
            f"the pickled function and arguments take {len(payload)} bytes, more than the "
            f"{MAX_PAYLOAD} that fit in the environment variable that carries them; pass large "
            "data through files and give run() their paths"
        )
    job_env = dict(os.environ if env is None else env)
    job_env["PYTHONPATH"] = _python_path(job_env)
    job_env[FUNC_VAR] = payload.decode()  # before planning: Open MPI forwards it with -x
    plan = make_plan(
        [sys.executable, "-m", "hvd_lite.run.task"],
        np=np,
        hosts=hosts,
        hostfile=hostfile,
        mpi_args=mpi_args,
        knob_env=knob_env(**knobs),
        env=job_env,
        tag_output=False,
        mpirun=mpirun,
    )
    if verbose:
        sys.stderr.write(f"hvd_lite.run: {plan.shell_line()}\n")
    result = execute(plan, start_timeout=start_timeout, stdin=None)
    errors = [(rank, data) for (kind, rank), data in result.payloads.items() if kind == "err"]
    if errors:
        rank, data = errors[0]
        exc, text = cloudpickle.loads(base64.b64decode(data))
        raise RemoteRankError(rank, text, exc) from exc
    missing = [r for r in range(plan.np) if ("ret", r) not in result.payloads]
    if result.error or missing:
        first = result.first_failure()
        why = result.error or (
            f"the job ended with exit code {result.exit_code}"
            + (f" (first: {result.describe(first[0])})" if first else "")
        )
        raise LauncherError(
            f"run({getattr(func, '__name__', func)!r}) got no result from "
            f"rank(s) {', '.join(map(str, missing)) or '-'}: {why}"
        )
    return [cloudpickle.loads(base64.b64decode(result.payloads[("ret", r)])) for r in range(plan.np)]
