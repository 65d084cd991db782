"""How tests start MPI jobs: the mpirun next to the running Python, with the flags its flavour needs."""

import os
import shutil
import signal
import subprocess
import sys
from typing import Dict, List, Optional


def mpirun_path(bindir: Optional[str] = None) -> str:
    """The mpirun of the environment running the tests (or of `bindir`)."""
    bindir = bindir or os.path.dirname(sys.executable)
    for name in ("mpirun", "mpiexec"):
        p = os.path.join(bindir, name)
        if os.access(p, os.X_OK):
            return p
    found = shutil.which("mpirun")
    if not found:
        raise RuntimeError("no mpirun found next to the Python interpreter or on PATH")
    return found


def is_open_mpi(mpirun: str) -> bool:
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr


def mpirun_cmd(np: int, mpirun: Optional[str] = None) -> List[str]:
    """`mpirun -np N` plus what Open MPI needs on a small machine as root."""
    mpirun = mpirun or mpirun_path()
    cmd = [mpirun]
    if is_open_mpi(mpirun):
        cmd += ["--oversubscribe"]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd + ["-np", str(np)]


# Open MPI 5's mpirun cannot start ("The PMIx server's listener thread failed to start", exit 213,
# before any rank exists) where an earlier mpirun with the same pid was killed by SIGKILL and left
# its session directory, <TMPDIR>/ompi.<pid>, behind: PIDs wrap at 32,768 in a long run. hvd_lite.run
# gives each job's mpirun a session base of its own; the tests' plain mpirun jobs share $TMPDIR with
# whatever a developer's machine killed before, so a job that failed this way is launched again
# (LAUNCH_ATTEMPTS in all).
LAUNCHER_FAILURES = ("PMIx server's listener thread failed to start",)
LAUNCH_ATTEMPTS = 3


def launcher_failed(res: subprocess.CompletedProcess) -> bool:
    """True if `res` (a job run with text output captured) died in the MPI launcher's own start."""
    return res.returncode != 0 and any(
        m in (res.stdout or "") + (res.stderr or "") for m in LAUNCHER_FAILURES
    )


STOP_GRACE_S = 15.0  # for a launcher told to stop (SIGTERM) to end its job before SIGKILL
STACKS_GRACE_S = 5.0  # for the job's Python processes to print their stacks (_ask_for_stacks)


class JobTimeout(subprocess.TimeoutExpired):
    """A command past its timeout, whose message ends with what it printed last (a test's
    failure then says where the job stood; stderr holds the stacks of its Python processes)."""

    def __str__(self) -> str:
        tails = [
            f"{name} (last {len(text[-keep:]):,} characters):\n{text[-keep:]}"
            for name, text, keep in (("stdout", self.output, 3000), ("stderr", self.stderr, 12000))
            if text
        ]
        return "\n".join([super().__str__(), *tails])


def _python_leaves(root: int) -> List[int]:
    """The Python processes at `root` or under it that have no child process: a job's ranks, not
    the launchers and wrappers that started them, which would die of SIGABRT without ending
    what they started (Linux's /proc)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))

    def is_python(pid: int) -> bool:
        try:
            return "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            return False

    found, todo, seen = [], [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:  # a pid reused while /proc was read
            continue
        seen.add(pid)
        below = children.get(pid, [])
        if below:
            todo.extend(below)
        elif is_python(pid):
            found.append(pid)
    return found


def _ask_for_stacks(proc: subprocess.Popen) -> bool:
    """SIGABRT to the job's Python ranks: with PYTHONFAULTHANDLER set (run_job's environment),
    each prints every thread's Python stack to stderr as it ends, which the launcher passes on
    before it ends the job. Best effort, never raising: True if any was sent."""
    sent = False
    try:
        for pid in _python_leaves(proc.pid):
            try:
                os.kill(pid, signal.SIGABRT)
                sent = True
            except OSError:  # already gone
                pass
    except Exception:  # an escape here would leave the job running
        pass
    return sent


def _run(cmd: List[str], timeout: Optional[float] = None, **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw), except that
    past the timeout the job's Python processes are asked for their stacks (_ask_for_stacks),
    and a command still running STACKS_GRACE_S later gets SIGTERM: a launcher (hvd_lite.run,
    mpirun) then ends its job's ranks, which SIGKILL of the launcher alone would leave running."""
    kw["env"] = dict(os.environ if kw.get("env") is None else kw["env"], PYTHONFAULTHANDLER="1")
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out = err = None
            if _ask_for_stacks(proc):
                try:
                    out, err = proc.communicate(timeout=STACKS_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            if out is None:
                proc.terminate()
                try:
                    out, err = proc.communicate(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    try:  # what it started may still hold the pipes
                        out, err = proc.communicate(timeout=5)
                    except subprocess.TimeoutExpired:
                        out, err = "", ""
            raise JobTimeout(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_job(cmd: List[str], **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, **kw), launched again if the MPI
    launcher itself failed to start (see LAUNCHER_FAILURES); past a `timeout` the command gets
    SIGTERM, then SIGKILL STOP_GRACE_S later (_run)."""
    for attempt in range(1, LAUNCH_ATTEMPTS + 1):
        res = _run(cmd, **kw)
        if not launcher_failed(res) or attempt == LAUNCH_ATTEMPTS:
            return res
        sys.stderr.write(
            f"mpi_cmd: the MPI launcher failed to start (attempt {attempt}); launching again:\n{res.stderr}\n"
        )
    raise AssertionError("unreachable")


def job_env(extra=None) -> dict:
    """The environment for a job whose ranks print lines: Python buffered, so that each
    print(..., flush=True) is one write (MPICH's Hydra interleaves ranks' output at write
    boundaries, and PYTHONUNBUFFERED=1 splits a print into several writes)."""
    env = dict(os.environ, **(extra or {}))
    env.pop("PYTHONUNBUFFERED", None)
    return env
