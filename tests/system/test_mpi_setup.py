"""Whole processes: how hvd_lite meets MPI (singleton jobs, mpi4py first or second, a launcher
of another MPI, clean exits)."""

import os
import sys
import textwrap

import pytest
from mpi_cmd import job_env, mpirun_cmd, mpirun_path, run_job

TIMEOUT = 120


def run(cmd, script, env=None):
    full_env = job_env(env)
    return run_job(cmd + [sys.executable, "-c", textwrap.dedent(script)], timeout=TIMEOUT, env=full_env)


def test_one_rank_job_runs_without_mpirun():
    res = run(
        [],
        """
        import numpy as np, hvd_lite as hvd
        hvd.init()
        print(hvd.rank(), hvd.size(), hvd.allreduce(np.array([3.0]))[0])
    """,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0", "1", "3.0"]


def test_mpi4py_imported_first_keeps_thread_support():
    res = run(
        mpirun_cmd(2),
        """
        from mpi4py import MPI
        import numpy as np, hvd_lite as hvd
        hvd.init()
        assert hvd.mpi_threads_supported()
        s = hvd.allreduce(np.array([hvd.rank() + 1], np.int32), op=hvd.Sum)[0]
        t = MPI.COMM_WORLD.allreduce(1)
        print("ok", s, t)
    """,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split().count("ok") == 2 and "3" in res.stdout.split()


def test_hvd_lite_first_then_mpi4py_and_a_clean_exit_without_shutdown():
    res = run(
        mpirun_cmd(2),
        """
        import numpy as np, hvd_lite as hvd
        hvd.init()
        from mpi4py import MPI
        assert MPI.Query_thread() == MPI.THREAD_MULTIPLE
        assert MPI.COMM_WORLD.allreduce(hvd.rank()) == 1
        hvd.allreduce(np.ones(100_000, np.float32))
        print("done")
    """,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("done") == 2
    assert "finalize" not in res.stderr.lower()


def test_errors_before_init_are_clear_in_a_fresh_process():
    res = run(
        [],
        """
        import numpy as np, hvd_lite as hvd
        hvd.allreduce(np.ones(2))
    """,
    )
    assert res.returncode != 0
    assert "hvd_lite has not been initialized; call hvd_lite.init() first" in res.stderr


@pytest.mark.skipif(
    not os.environ.get("HVD_LITE_TEST_OTHER_MPI_BIN"),
    reason="set HVD_LITE_TEST_OTHER_MPI_BIN to the bin/ of another MPI (.ci/run does)",
)
def test_launcher_of_a_different_mpi_gives_a_clear_error():
    other = mpirun_path(os.environ["HVD_LITE_TEST_OTHER_MPI_BIN"])
    res = run(
        mpirun_cmd(2, other),
        """
        import hvd_lite as hvd
        hvd.init()
        print("size", hvd.size())
    """,
    )
    assert res.returncode != 0, res.stdout
    assert "the launcher belongs to a different MPI" in res.stderr
    assert "size" not in res.stdout


def test_ranks_know_when_their_host_is_oversubscribed():
    """More ranks on the host than the CPUs they may run on: every wait's spins yield
    (csrc/base/wait.c). The ranks count their host's CPUs together (the union of their affinity
    masks, csrc/base/topology.c), so a launcher held to one CPU (taskset, a container's cpuset)
    counts too; as many ranks as CPUs, or one rank alone: not."""
    cpus = len(os.sched_getaffinity(0))
    if cpus > 8:
        pytest.skip(f"{cpus + 1} ranks take too long to start for this check")
    script = """
        from hvd_lite import _core
        import hvd_lite as hvd
        hvd.init()
        print(hvd.rank(), _core.oversubscribed())
    """
    over = run(mpirun_cmd(cpus + 1), script)
    assert over.returncode == 0, over.stderr
    assert sorted(over.stdout.split()[1::2]) == ["True"] * (cpus + 1), over.stdout
    alone = run([], script)
    assert alone.returncode == 0 and alone.stdout.split() == ["0", "False"], alone.stderr
    fits = run(mpirun_cmd(cpus), script)
    assert fits.returncode == 0, fits.stderr
    assert sorted(fits.stdout.split()[1::2]) == ["False"] * cpus, fits.stdout
    # The launcher (and so every rank) held to one CPU: two ranks share it.
    one_cpu = [
        sys.executable,
        "-c",
        "import os, sys; os.sched_setaffinity(0, {%d}); "
        "os.execvp(sys.argv[1], sys.argv[1:])" % min(os.sched_getaffinity(0)),
    ]
    held = run(one_cpu + mpirun_cmd(2), script)
    assert held.returncode == 0, held.stderr
    assert sorted(held.stdout.split()[1::2]) == ["True"] * 2, held.stdout
