"""Whole TensorFlow jobs: under hvd_lite's MultiWorkerMirroredStrategy at two ranks, a job killed
mid-epoch resumes from tf.keras.callbacks.BackupAndRestore's backup, and a peer that never arrives
makes fit raise on every rank within CommunicationOptions' timeout; a tf.function's independent
collectives complete with two inter-op threads (a pool the parallel tests, at one thread, cannot
have)."""

import os
import re
import sys

import pytest
from mpi_cmd import job_env, mpirun_cmd, run_job

pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_job_worker.py")


def job(*args, timeout=240, ranks=2, env=None):
    return run_job(
        mpirun_cmd(ranks) + [sys.executable, WORKER, *map(str, args)], timeout=timeout, env=job_env(env)
    )


def final_weights(res):
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("rank ")]
    assert len(lines) == 2, res.stdout + res.stderr
    return {int(ln.split()[1]): (int(ln.split()[3]), [float(v) for v in ln.split()[5:]]) for ln in lines}


def test_a_job_killed_mid_epoch_resumes_from_backup_and_restore_and_ends_like_an_unbroken_one(tmp_path):
    backup = tmp_path / "backup"
    killed = job("backup", backup, 2)  # killed in epoch 2 (0-based): epochs 0 and 1 backed up
    assert killed.returncode != 0, killed.stdout + killed.stderr
    assert "epochs" not in killed.stdout
    assert sorted(os.listdir(backup)) == ["latest.weights.h5", "training_metadata.json"]
    resumed = final_weights(job("backup", backup, -1))
    assert not backup.exists()  # deleted at the end (by rank 0 only)
    unbroken = final_weights(job("backup", tmp_path / "other", -1))
    # the relaunch ran the 2 remaining epochs, identical on both ranks, and ended where an
    # unbroken 4-epoch job ends
    assert [resumed[r][0] for r in (0, 1)] == [2, 2] and unbroken[0][0] == 4
    assert resumed[0][1] == resumed[1][1]
    assert resumed[0][1] == pytest.approx(unbroken[0][1], abs=1e-5)


def test_fit_raises_on_every_rank_within_the_communication_timeout_when_a_peer_never_arrives():
    t = 2.0
    res = job("timeout", t)
    lines = sorted(ln for ln in res.stdout.splitlines() if ln.startswith("rank "))
    assert len(lines) == 2, res.stdout + res.stderr
    waiting, stalled = lines  # rank 0 waits for rank 1, which stalls for 3t
    m = re.match(
        r"rank 0 raised (\w+) after ([\d.]+) s: .*CollectiveFailedError: allreduce: \d+ "
        r"collective\(s\) not done after 2.0 s",
        waiting,
    )
    assert m, waiting
    assert t <= float(m.group(2)) < t + 3.0, waiting
    # the stalled rank raises as soon as it submits: its peer has given up and left
    assert re.match(
        r"rank 1 raised \w+ after [\d.]+ s: .*CollectiveFailedError: hvd_lite has been shut "
        r"down on rank 0",
        stalled,
    ), stalled


def test_independent_collectives_in_a_tf_function_complete_with_two_inter_op_threads():
    """TensorFlow runs a tf.function's stateful ops in program order, whatever its pool: twelve
    collectives that do not depend on each other, with two inter-op threads at two ranks, all
    complete with the right values."""
    res = job("independent", ranks=2, env={"TF_NUM_INTEROP_THREADS": "2"}, timeout=180)
    lines = sorted(ln for ln in res.stdout.splitlines() if ln.startswith("rank "))
    assert lines == [f"rank {r} right with 2 inter-op threads" for r in range(2)], res.stdout + res.stderr
