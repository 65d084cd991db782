"""Progress lines of the benchmark sweeps and the simulator: one per point on stderr, none with --quiet,
and stdout (the table, the --json record) the same either way."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _numbers_out(text: str) -> str:
    """The text with every number (times, load averages, versions) as N, and runs of spaces as one."""
    return re.sub(r" +", " ", re.sub(r"\d+(\.\d+)?", "N", text))


def _bench(args, tmp_path, quiet):
    out = tmp_path / ("quiet.json" if quiet else "progress.json")
    cmd = [sys.executable, "-m", "hvd_lite.bench", *args, "--json", str(out)] + (["--quiet"] if quiet else [])
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout, res.stderr, json.loads(out.read_text())


ALLREDUCE = ["allreduce", "-b", "4", "-e", "64", "-f", "4", "-n", "1", "-w", "0", "--repeats", "1"]
KERNELS = ["kernels", "-d", "float32", "-o", "sum", "-o", "max", "--size", "4K", "--repeats", "1", "-n", "1"]


@pytest.mark.parametrize(
    "args,name,points",
    [(ALLREDUCE, "allreduce", ["4", "16", "64"]), (KERNELS, "kernels", ["float32 sum 4K", "float32 max 4K"])],
)
def test_a_bench_sweep_says_each_point_on_stderr_and_nothing_with_quiet(tmp_path, args, name, points):
    stdout, stderr, record = _bench(args, tmp_path, quiet=False)
    lines = [line for line in stderr.splitlines() if line.startswith(f"bench {name}: ")]
    n = len(points)
    for i, (line, what) in enumerate(zip(lines, points), 1):
        assert re.fullmatch(rf"bench {name}: {re.escape(what)} \({i}/{n}, \d+\.\d s\)", line), line
    assert len(lines) == n + 1 and re.fullmatch(rf"bench {name}: {n} points in \d+\.\d s", lines[-1]), stderr
    assert not [line for line in stdout.splitlines() if line.startswith(f"bench {name}: ")]

    quiet_stdout, quiet_stderr, quiet_record = _bench(args, tmp_path, quiet=True)
    assert not [line for line in quiet_stderr.splitlines() if line.startswith(f"bench {name}: ")]
    assert _numbers_out(quiet_stdout) == _numbers_out(stdout)
    assert quiet_record.keys() == record.keys()
    assert len(quiet_record["results"]) == len(record["results"])


def _simulate(monkeypatch):
    spec = importlib.util.spec_from_file_location("simulate", os.path.join(ROOT, "sim", "simulate.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run_driver(driver, platform, side, algo, sizes, args, **how):
        return {
            s: {
                "time_s": 1e-6,
                "wrong": 0,
                "identical": True,
                "algo": "ring",
                "model_s": 1e-6,
                "failed": False,
            }
            for s in sizes
        }

    # SimGrid's build and runs stood in for (a real run rebuilds the core with smpicc: about 15 s)
    monkeypatch.setattr(mod, "build", lambda verbose=False: "driver")
    monkeypatch.setattr(mod, "run_driver", run_driver)
    return mod


def test_the_simulator_says_each_smpirun_on_stderr_and_nothing_with_quiet(monkeypatch, capsys):
    argv = [
        "--platform",
        "host1x8",
        "--ranks",
        "2",
        "--sizes",
        "4,1K",
        "--hvdl",
        "auto,ring",
        "--mpi",
        "ompi",
    ]
    assert _simulate(monkeypatch).main(argv) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    want = ["hvdl auto", "hvdl ring", "mpi ompi"]
    for i, (line, what) in enumerate(zip(lines, want), 1):
        assert re.fullmatch(rf"simulate allreduce: {what} \({i}/3, \d+\.\d s\)", line), line
    assert len(lines) == 4 and re.fullmatch(r"simulate allreduce: 3 points in \d+\.\d s", lines[-1]), err
    assert "| 4 B |" in out and "simulate allreduce:" not in out

    assert _simulate(monkeypatch).main(argv + ["--quiet"]) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert quiet_err == "" and quiet_out == out
