"""Building the extension: through an MPI compiler wrapper (the MPICC switch for a system MPI),
and with CUDA (HVD_LITE_CUDA=1)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_mpicc_switch_builds_an_extension_that_loads(tmp_path):
    mpicc = os.path.join(os.path.dirname(sys.executable), "mpicc")
    assert os.access(mpicc, os.X_OK), "the test environment's MPI has no mpicc"
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.so", "__pycache__", "docs", "tests"),
    )
    env = dict(os.environ, MPICC=mpicc)
    env.pop("HVD_LITE_MPI", None)
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import hvd_lite, numpy as np; hvd_lite.init(); "
            "print(hvd_lite._core.__file__); "
            "print(hvd_lite.build_info()['mpi_header'], hvd_lite.allreduce(np.ones(3))[0])",
        ],
        cwd=src,
        env=dict(os.environ, PYTHONPATH=str(src)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
    import hvd_lite

    core_file, result = check.stdout.splitlines()
    assert core_file.startswith(str(src)), core_file  # the extension just built, not the installed one
    assert result.split() == [*hvd_lite.build_info()["mpi_header"].split(), "1.0"]


def _copy_tree(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.so", "__pycache__", "docs", "tests"),
    )
    return src


def test_hvd_lite_cuda_1_without_nvcc_stops_the_build_saying_so(tmp_path):
    src = _copy_tree(tmp_path)
    env = dict(os.environ, HVD_LITE_CUDA="1", PATH="/usr/bin:/bin", CUDA_HOME=str(tmp_path))
    env.pop("CUDA_PATH", None)
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode != 0
    assert "HVD_LITE_CUDA=1, but no nvcc with a CUDA toolkit was found" in build.stderr


def _build_cuda_over_cpu(tmp_path):
    """A copy of the tree built for the CPU, then with HVD_LITE_CUDA=1 over that build."""
    src = _copy_tree(tmp_path)
    cpu_env = dict(os.environ)
    cpu_env.pop("HVD_LITE_CUDA", None)
    cpu = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=src,
        env=cpu_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cpu.returncode == 0, cpu.stdout + cpu.stderr
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=src,
        env=dict(os.environ, HVD_LITE_CUDA="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return src


# A copy of the tree already built the way the test below builds one (a CPU build, then HVD_LITE_CUDA=1
# over it): .ci/run makes one for its own tests of the CUDA build, and the test then checks that copy
# instead of compiling the two builds a second time.
CUDA_TREE = os.environ.get("HVD_LITE_TEST_CUDA_TREE")


@pytest.mark.skipif(
    shutil.which("nvcc") is None and not CUDA_TREE,
    reason="no nvcc on PATH (the CUDA toolkit), and no HVD_LITE_TEST_CUDA_TREE",
)
def test_the_cuda_build_compiles_and_loads_without_a_device(tmp_path):
    """HVD_LITE_CUDA=1 where nvcc is found: the kernels compile and link (static runtime), the
    extension loads on a machine with no GPU or driver, says it has CUDA and sees no device, a
    host all-reduce is unchanged, and a kernel on an address the CUDA runtime cannot reach fails
    with CUDA's own message instead of a crash. It is built over a CPU build of the same tree:
    a change of flags alone must rebuild (distutils' own check looks at the files' times only,
    and kept the CPU build)."""
    src = CUDA_TREE or _build_cuda_over_cpu(tmp_path)
    code = (
        "import hvd_lite, numpy as np\n"
        "from hvd_lite import _core\n"
        "hvd_lite.init()\n"
        "print(_core.build_info()['cuda'], _core.cuda_device_count(), "
        "hvd_lite.allreduce(np.ones(3))[0])\n"
        "class Cai:\n"
        "    __cuda_array_interface__ = {'shape': (3,), 'typestr': '<f4', 'data': (4096, False),"
        " 'version': 3}\n"
        "try:\n"
        "    _core.reduce_local(Cai(), Cai(), Cai(), 7, 0)\n"
        "except hvd_lite.CollectiveError as e:\n"
        "    print('refused:', e)\n"
    )
    check = subprocess.run(
        [sys.executable, "-c", code],
        cwd=src,
        env=dict(os.environ, PYTHONPATH=str(src)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
    first, second = check.stdout.splitlines()[:2]
    if first.split()[1] != "0":
        pytest.skip("this machine has a CUDA device: tests/parallel/test_cuda.py covers it")
    assert first == "True 0 1.0"
    assert second.startswith("refused: reduction kernel: ") and "(CUDA error" in second, second
