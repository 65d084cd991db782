"""The examples run as a user would run them."""

import os
import sys

import pytest
from mpi_cmd import job_env, mpirun_cmd, run_job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_allreduce_numpy_example_at_three_ranks():
    res = run_job(
        mpirun_cmd(3) + [sys.executable, os.path.join(ROOT, "examples", "allreduce_numpy.py")],
        timeout=120,
        env=job_env(),
    )
    assert res.returncode == 0, res.stderr
    lines = sorted(ln for ln in res.stdout.splitlines() if ln.startswith("rank"))
    assert lines == [f"rank {r}/3: sum 6, average 2, max 3: ok" for r in range(3)]


def test_pytorch_digits_example_reaches_95_percent_with_identical_weights_at_two_ranks():
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[torch]')")
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e '.[torch]')")
    res = run_job(
        mpirun_cmd(2) + [sys.executable, os.path.join(ROOT, "examples", "pytorch_digits.py")],
        timeout=240,
        env=job_env(),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    final = [ln for ln in res.stdout.splitlines() if ln.startswith("final test accuracy")]
    assert len(final) == 1 and final[0].endswith("weights identical on all 2 ranks: yes"), res.stdout
    assert float(final[0].split()[3].rstrip(";")) >= 0.95, final[0]


def test_pytorch_synthetic_benchmark_runs_every_contender_at_two_ranks():
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[torch]')")
    script = os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py")
    res = run_job(
        mpirun_cmd(2)
        + [
            sys.executable,
            script,
            "--ddp",
            "--single",
            "--threads",
            "1",
            "--num-warmup-batches",
            "1",
            "--num-batches-per-iter",
            "1",
            "--num-iters",
            "2",
        ],
        timeout=240,
        env=job_env(),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for model in ("cnn", "mlp"):
        assert f"Model: {model}" in res.stdout, res.stdout
    assert res.stdout.count("hvd_lite / DDP:") == 2, res.stdout
    # the one process trains rank 0's copy on the global batch (2 x 32) with both ranks' threads
    singles = [ln for ln in res.stdout.splitlines() if ln.strip().startswith("one process")]
    assert len(singles) == 2, res.stdout
    assert all("(rank 0, batch 64, 2 torch threads on " in ln for ln in singles), res.stdout
    ratios = [
        float(ln.split()[-1].rstrip("x"))
        for ln in res.stdout.splitlines()
        if ln.strip().startswith("hvd_lite / one process")
    ]
    assert len(ratios) == 2 and all(r > 0 for r in ratios), res.stdout


TF_EXAMPLES = ["keras_mwms_digits.py", "tf_custom_loop.py", "keras_horovod_style.py"]


@pytest.mark.parametrize("script", TF_EXAMPLES)
def test_tensorflow_example_reaches_95_percent_with_identical_weights_at_two_ranks(script):
    pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e '.[tensorflow]')")
    env = dict(job_env(), TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    res = run_job(
        mpirun_cmd(2) + [sys.executable, os.path.join(ROOT, "examples", script)], timeout=240, env=env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    final = [ln for ln in res.stdout.splitlines() if ln.startswith("final test accuracy")]
    assert len(final) == 1 and final[0].endswith("weights identical on all 2 ranks: yes"), res.stdout
    assert float(final[0].split()[3].rstrip(";")) >= 0.95, final[0]
