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


@pytest.mark.parametrize("keras2", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.parametrize("mode", ["tape", "fit"])
def test_synthetic_benchmark_with_horovods_api_lines_runs_under_either_keras_at_two_ranks(mode, keras2):
    pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
    if keras2:
        pytest.importorskip(
            "tf_keras", reason="tf_keras is not installed (pip install --no-deps tf_keras==2.21.0)"
        )
    env = dict(job_env(), TF_USE_LEGACY_KERAS="1" if keras2 else "0")
    script = os.path.join(ROOT, "examples", "tf_keras_synthetic_benchmark.py")
    tiny = ["--num-iters", "1", "--num-batches-per-iter", "1", "--batch-size", "2"]
    res = run_job(mpirun_cmd(2) + [sys.executable, script, "--mode", mode] + tiny, timeout=240, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    keras = "Keras 2 (tf_keras)" if keras2 else "Keras 3"
    assert f"{keras}, {mode}, model cnn, 2 ranks" in res.stdout, res.stdout
    assert "weights identical on all 2 ranks: yes" in res.stdout, res.stdout


HOROVOD_BENCHMARKS = {
    "tensorflow2_synthetic_benchmark.py": ("import horovod.tensorflow as hvd", "--num-warmup-batches 1"),
    "tensorflow2_keras_synthetic_benchmark.py": ("import horovod.tensorflow.keras as hvd", "--num-iters 2"),
}


@pytest.mark.parametrize("name", sorted(HOROVOD_BENCHMARKS))
def test_horovods_own_benchmark_runs_under_tf_keras_with_only_the_import_changed(name, tmp_path):
    """Horovod 0.28.1's examples/tensorflow2 script, read from the Horovod git repository that
    HVD_LITE_TEST_HOROVOD_REPO names (skipped without it), `horovod` replaced by `hvd_lite` in its
    import line and nothing else."""
    import subprocess

    repo = os.environ.get("HVD_LITE_TEST_HOROVOD_REPO")
    if not repo:
        pytest.skip("HVD_LITE_TEST_HOROVOD_REPO (a Horovod git repository) is not set")
    pytest.importorskip(
        "tf_keras", reason="tf_keras is not installed (pip install --no-deps tf_keras==2.21.0)"
    )
    line, more = HOROVOD_BENCHMARKS[name]
    text = subprocess.run(
        ["git", "-C", repo, "show", f"HEAD:examples/tensorflow2/{name}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert text.count(line + "\n") == 1, f"{name} no longer has the line {line!r}"
    script = tmp_path / name
    script.write_text(text.replace(line + "\n", line.replace("horovod", "hvd_lite") + "\n"))
    args = ["--no-cuda", "--model", "MobileNetV3Small", "--batch-size", "2", "--num-batches-per-iter", "1"]
    args += ["--num-iters", "1"] if "--num-iters" not in more else []
    env = dict(job_env(), TF_USE_LEGACY_KERAS="1", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    res = run_job(mpirun_cmd(2) + [sys.executable, str(script)] + args + more.split(), timeout=300, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Total img/sec on 2 CPU(s):" in res.stdout and "nan" not in res.stdout, res.stdout
