"""The tests' job runner launches again only when the MPI launcher itself failed to start, and
tells a job past its timeout to stop before killing it."""

import subprocess
import sys

import pytest
from mpi_cmd import LAUNCH_ATTEMPTS, LAUNCHER_FAILURES, run_job


def _flaky(tmp_path, failures: int, message: str):
    """A command that fails `failures` times printing `message`, then succeeds; and its count."""
    count = tmp_path / "count"
    code = (
        f"import pathlib, sys; p = pathlib.Path({str(count)!r}); "
        f"n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1)); "
        f"sys.exit(0) if n >= {failures} else (sys.stderr.write({message!r}), sys.exit(1))"
    )
    return [sys.executable, "-c", code], count


def test_a_launcher_start_failure_is_launched_again(tmp_path):
    cmd, count = _flaky(tmp_path, 1, LAUNCHER_FAILURES[0])
    res = run_job(cmd, timeout=60)
    assert res.returncode == 0 and count.read_text() == "2"


def test_launching_again_stops_after_the_last_attempt(tmp_path):
    cmd, count = _flaky(tmp_path, LAUNCH_ATTEMPTS + 5, LAUNCHER_FAILURES[0])
    res = run_job(cmd, timeout=60)
    assert res.returncode == 1 and count.read_text() == str(LAUNCH_ATTEMPTS)
    assert LAUNCHER_FAILURES[0] in res.stderr


def test_any_other_failure_is_returned_at_once(tmp_path):
    cmd, count = _flaky(tmp_path, 1, "Mismatched ALLREDUCE tensor shapes")
    res = run_job(cmd, timeout=60)
    assert res.returncode == 1 and count.read_text() == "1"


def test_a_job_past_its_timeout_is_told_to_stop_before_it_is_killed(tmp_path):
    """SIGTERM first, so that a launcher ends its ranks (SIGKILL would leave them running)."""
    mark = tmp_path / "stopped"
    cmd = ["sh", "-c", f"trap 'kill $!; echo bye > {mark}; exit 3' TERM; sleep 30 & wait"]
    with pytest.raises(subprocess.TimeoutExpired):
        run_job(cmd, timeout=0.5)
    assert mark.read_text() == "bye\n"


STUCK = "import time\ndef stuck_here():\n    time.sleep(60)\nstuck_here()\n"


def test_a_job_past_its_timeout_shows_where_its_python_stood():
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_job([sys.executable, "-c", STUCK], timeout=3)
    assert 'File "<string>", line 3 in stuck_here' in str(e.value), str(e.value)


def test_only_the_innermost_python_processes_are_asked_for_their_stacks():
    # A Python launcher waiting for its Python rank: the rank prints its stack and ends, and the
    # launcher, not signalled (it has a child), then exits on its own.
    launcher = (
        "import subprocess, sys\n"
        "def launching():\n"
        f"    sys.exit(subprocess.call([sys.executable, '-c', {STUCK!r}]))\n"
        "launching()\n"
    )
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_job([sys.executable, "-c", launcher], timeout=3)
    text = str(e.value)
    assert "in stuck_here" in text and "in launching" not in text, text
    assert text.count("Fatal Python error: Aborted") == 1, text


def test_a_python_launcher_whose_ranks_are_not_python_is_told_to_stop(tmp_path):
    """Its child is no Python process, so no stacks are asked for; SIGTERM, not SIGABRT, reaches
    the launcher, which ends what it started."""
    mark = tmp_path / "stopped"
    launcher = (
        "import pathlib, signal, subprocess, sys\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        "def stop(*_):\n"
        f"    child.kill(); pathlib.Path({str(mark)!r}).write_text('bye'); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "child.wait()\n"
    )
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_job([sys.executable, "-c", launcher], timeout=3)
    assert mark.read_text() == "bye" and "Fatal Python error" not in str(e.value), str(e.value)
