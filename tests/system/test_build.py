"""Building the extension through an MPI compiler wrapper (the MPICC switch for a system MPI)."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_mpicc_switch_builds_an_extension_that_loads(tmp_path):
    mpicc = os.path.join(os.path.dirname(sys.executable), "mpicc")
    assert os.access(mpicc, os.X_OK), "the test environment's MPI has no mpicc"
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.so",
                                                             "__pycache__", "docs", "tests"))
    env = dict(os.environ, MPICC=mpicc)
    env.pop("HVD_LITE_MPI", None)
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=src,
                           env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    check = subprocess.run(
        [sys.executable, "-c", "import hvd_lite, numpy as np; hvd_lite.init(); "
         "print(hvd_lite._core.__file__); "
         "print(hvd_lite.build_info()['mpi_header'], hvd_lite.allreduce(np.ones(3))[0])"],
        cwd=src, env=dict(os.environ, PYTHONPATH=str(src)), capture_output=True, text=True,
        timeout=120)
    assert check.returncode == 0, check.stderr
    import hvd_lite
    core_file, result = check.stdout.splitlines()
    assert core_file.startswith(str(src)), core_file  # the extension just built, not the installed one
    assert result.split() == [*hvd_lite.build_info()["mpi_header"].split(), "1.0"]
