"""Elastic jobs as users run them: `hvd_lite.run --min-np ...` with a rank that SIGKILLs itself. In
restart mode (any MPI) the job is relaunched and resumes from its last commit (on localhost, 3
ranks); in shrink mode (Open MPI with ULFM) the survivors go on in place from it (4 ranks)."""

import os
import re
import sys
import time

import pytest
from mpi_cmd import run_job
from run_helpers import env, tagged

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "system", "elastic_worker.py")
TIMEOUT = 110

# ObjectState over NumPy: rank 1 dies at step 4 while fewer than KILLS markers exist (or raises);
# with a hosts file as a 4th argument, it first writes there the slots left after its death.
NUMPY_WORKER = """
import os, signal, sys
import numpy as np
import hvd_lite as hvd

markers, kills, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hvd.init()
state = hvd.elastic.ObjectState(w=np.zeros(4), step=0)


@hvd.elastic.run
def train(state):
    while state.step < 6:
        if hvd.rank() == 1 and state.step == 4:
            if how == "raise":
                raise ValueError("a bug in the script")
            n = len(os.listdir(markers))
            if n < kills:
                if len(sys.argv) > 4:
                    with open(sys.argv[4], "w") as f:
                        f.write(f"localhost:{hvd.size() - 1}\\n")
                open(os.path.join(markers, f"killed{n}"), "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        state.w = state.w + hvd.allreduce(np.full(4, float(state.step + hvd.rank())), op=hvd.Sum)
        state.step += 1
        if state.step % 2 == 0:
            state.commit()


train(state)
sys.stdout.write(f"DONE {state.step} {state.w.tolist()}\\n")  # one write: Hydra tags each write
sys.stdout.flush()
"""


def elastic_run(tmp_path, *args, extra=None):
    """`hvd_lite.run` with TMPDIR in tmp_path (where the job's commit directory goes)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    e = env(TMPDIR=str(tmp), PYTHONPATH=ROOT, EW_MARKERS=str(markers), **(extra or {}))
    e.pop("PYTHONUNBUFFERED", None)  # a print is then one write (Hydra tags each write)
    if "--elastic-mode" not in args:  # these tests are restart mode's, whatever the MPI could do
        args = ("--elastic-mode", "restart", *args)
    t0 = time.monotonic()
    res = run_job([sys.executable, "-m", "hvd_lite.run", *args], timeout=TIMEOUT, env=e, cwd=ROOT)
    return res, sorted(os.listdir(markers)), time.monotonic() - t0, tmp


def commit_dirs(tmp):
    return [d for d in os.listdir(tmp) if d.startswith("hvd_lite-elastic-")]


def test_a_killed_rank_relaunches_the_job_which_resumes_from_the_last_commit_to_the_reference_weights(
    tmp_path,
):
    pytest.importorskip("torch")
    res, killed, took, tmp = elastic_run(
        tmp_path,
        *("-np", "3", "--min-np", "2", "--max-np", "3", "--reset-limit", "2"),
        *(sys.executable, WORKER),
        extra={"EW_KILLS": "1", "EW_STEPS": "12", "EW_COMMIT_EVERY": "3", "EW_KILL_AT": "7"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert killed == ["killed0"]
    assert "rank 1 was killed by SIGKILL (signal 9); relaunching the job (1 of at most 2)" in res.stderr
    # killed at step 7: steps 6 and 7 are redone from commit 2 (step 6), with the same 3 ranks
    assert "relaunch 1: 3 rank(s) resume from commit 2" in res.stderr
    assert tagged(res.stdout, "RESULT") == ["equal_ref=True identical=True resets=[3] step=12"]
    assert commit_dirs(tmp) == []
    died = float((tmp_path / "markers" / "killed0").read_text())
    first = float(re.search(r"FIRST_STEP_AFTER_RELAUNCH (\S+) step=6", res.stdout).group(1))
    sys.stderr.write(
        f"death to the relaunched job's first step: {first - died:.1f} s; whole test {took:.1f} s\n"
    )


def test_a_job_killed_more_often_than_the_reset_limit_fails_saying_so(tmp_path):
    res, killed, took, tmp = elastic_run(
        tmp_path,
        *("-np", "3", "--min-np", "2", "--max-np", "3", "--reset-limit", "1"),
        *(sys.executable, "-c", NUMPY_WORKER, str(tmp_path / "markers"), "2", "kill"),
    )
    assert res.returncode == 128 + 9, res.stdout + res.stderr
    assert killed == ["killed0", "killed1"]
    assert "relaunching the job (1 of at most 1)" in res.stderr
    assert (
        "hvd_lite.run: rank 1 was killed by SIGKILL (signal 9); the job was relaunched 1 time(s), "
        "the --reset-limit 1: giving up"
    ) in res.stderr
    assert "relaunch 1: 3 rank(s) resume from commit 2" in res.stderr
    assert "DONE" not in res.stdout and commit_dirs(tmp) == []
    assert took < TIMEOUT


def test_a_rank_that_raises_is_the_scripts_error_and_is_not_relaunched(tmp_path):
    res, killed, _, tmp = elastic_run(
        tmp_path,
        *("-np", "3", "--min-np", "2", "--reset-limit", "2"),
        *(sys.executable, "-c", NUMPY_WORKER, str(tmp_path / "markers"), "0", "raise"),
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "ValueError: a bug in the script" in res.stderr
    assert "relaunching" not in res.stderr and killed == []
    assert commit_dirs(tmp) == []


def test_a_clean_elastic_job_runs_once_and_leaves_no_commits(tmp_path):
    res, _, _, tmp = elastic_run(
        tmp_path,
        *("-np", "2", "--min-np", "1", "--max-np", "2"),
        *(sys.executable, "-c", NUMPY_WORKER, str(tmp_path / "markers"), "0", "kill"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # w = sum over steps 0..5 of (step + 0) + (step + 1) = 2 * 15 + 6
    assert tagged(res.stdout, "DONE") == ["6 [36.0, 36.0, 36.0, 36.0]"] * 2
    assert "relaunch" not in res.stderr and commit_dirs(tmp) == []


def test_a_relaunch_takes_the_slots_the_discovery_script_reports_and_resumes_with_fewer_ranks(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:3\n")
    res, killed, _, tmp = elastic_run(
        tmp_path,
        *("-np", "3", "--min-np", "2", "--max-np", "3", "--reset-limit", "1"),
        *("--host-discovery-script", f"cat {hosts}"),
        *(sys.executable, "-c", NUMPY_WORKER, str(tmp_path / "markers"), "1", "kill", str(hosts)),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert killed == ["killed0"]
    assert "relaunch 1: 2 rank(s) resume from commit 2" in res.stderr
    # steps 0-3 on 3 ranks add 3s + 3 each (30), steps 4-5 on 2 ranks add 2s + 1 each (20)
    assert tagged(res.stdout, "DONE") == ["6 [50.0, 50.0, 50.0, 50.0]"] * 2
    assert commit_dirs(tmp) == []


def test_fewer_slots_than_min_np_after_a_death_end_the_job_after_the_elastic_timeout(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    res, killed, took, tmp = elastic_run(
        tmp_path,
        *("-np", "2", "--min-np", "2", "--elastic-timeout", "2"),
        *("--host-discovery-script", f"cat {hosts}"),
        *(sys.executable, "-c", NUMPY_WORKER, str(tmp_path / "markers"), "1", "kill", str(hosts)),
    )
    assert res.returncode != 0 and killed == ["killed0"]
    assert (
        "hvd_lite.run: error: only 1 slot(s) available (localhost:1), fewer than --min-np 2, "
        "after waiting --elastic-timeout 2 s"
    ) in res.stderr, res.stderr
    assert "DONE" not in res.stdout and commit_dirs(tmp) == []


# ---------------------------------------------------------------------------- shrink mode (ULFM)

SHRINK_WORKER = os.path.join(ROOT, "tests", "system", "elastic_shrink_worker.py")


def needs_shrink():
    from hvd_lite.run.elastic import shrinks_in_place

    if not shrinks_in_place():
        pytest.skip("shrink mode needs hvd_lite built against an Open MPI with ULFM, and its mpirun")
    pytest.importorskip("torch")


def shrink_run(tmp_path, np, min_np, extra):
    return elastic_run(
        tmp_path,
        *("--elastic-mode", "shrink", "-np", str(np), "--min-np", str(min_np)),
        *(sys.executable, SHRINK_WORKER),
        extra={"EW_STEPS": "16", "EW_COMMIT_EVERY": "3", **extra},
    )


@pytest.mark.parametrize(
    "how,env",
    [
        ("between", {}),
        ("send", {}),
        ("send3", {"HVD_LITE_SHM": "0", "HVD_LITE_ALLREDUCE_ALGO": "ring"}),
    ],
    ids=["between-collectives", "fused-shared-memory-step", "fused-mid-ring"],
)
def test_the_survivors_of_a_killed_rank_go_on_in_place_from_the_last_commit_to_the_reference_weights(
    tmp_path, how, env
):
    needs_shrink()
    res, _, took, tmp = shrink_run(
        tmp_path, 4, 2, {"EW_HOW": how, "EW_VICTIM": "1", "EW_KILL_AT": "7", **env}
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # killed at step 7: the survivors roll back to the commit of step 6 and go on, 3 of them
    assert "3 of 4 rank(s) go on in place" in res.stderr, res.stderr
    assert tagged(res.stdout, "RESULT") == [
        "identical=True equal_ref=True sizes=[3] rolled_back_to=[6] step=16"
    ], res.stdout + res.stderr
    assert (
        "hvd_lite.run: rank 1 was killed by SIGKILL (signal 9); the job went on without it, and every "
        "other rank exited 0"
    ) in res.stderr
    assert "relaunch" not in res.stderr and commit_dirs(tmp) == []
    assert took < TIMEOUT


def test_two_deaths_in_a_row_shrink_the_job_twice_down_to_min_np(tmp_path):
    needs_shrink()
    res, _, took, _ = shrink_run(
        tmp_path,
        4,
        2,
        {"EW_HOW": "between", "EW_VICTIM": "3", "EW_KILL_AT": "4", "EW_VICTIM2": "0", "EW_KILL_AT2": "11"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 of 4 rank(s) go on in place" in res.stderr and "2 of 3 rank(s) go on in place" in res.stderr
    assert tagged(res.stdout, "RESULT") == [
        "identical=True equal_ref=True sizes=[3, 2] rolled_back_to=[3, 9] step=16"
    ], res.stdout + res.stderr
    assert took < TIMEOUT


def test_a_death_below_min_np_ends_the_job_on_every_rank_with_an_error_saying_so(tmp_path):
    needs_shrink()
    res, _, took, _ = shrink_run(tmp_path, 3, 3, {"EW_HOW": "between", "EW_VICTIM": "2", "EW_KILL_AT": "4"})
    assert res.returncode != 0, res.stdout + res.stderr
    assert res.stderr.count("2 rank(s) survived, fewer than --min-np 3: the job stops") == 2, res.stderr
    assert "RESULT" not in res.stdout and "relaunch" not in res.stderr
    assert took < TIMEOUT
