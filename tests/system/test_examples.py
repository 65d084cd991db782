"""The examples run as a user would run them."""
import os
import subprocess
import sys

from mpi_cmd import job_env, mpirun_cmd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_allreduce_numpy_example_at_three_ranks():
    res = subprocess.run(mpirun_cmd(3) + [sys.executable, os.path.join(ROOT, "examples", "allreduce_numpy.py")],
                         capture_output=True, text=True, timeout=120, env=job_env())
    assert res.returncode == 0, res.stderr
    lines = sorted(l for l in res.stdout.splitlines() if l.startswith("rank"))
    assert lines == [f"rank {r}/3: sum 6, average 2, max 3: ok" for r in range(3)]
