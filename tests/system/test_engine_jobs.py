"""Whole jobs that exercise the engine's failure paths, stall inspector, timeline and idle cost."""

import json
import sys
import textwrap
import time

import pytest
from mpi_cmd import job_env, mpirun_cmd, run_job

TIMEOUT = 120


def job(np_, script, env=None, timeout=TIMEOUT):
    """Runs `script` on np_ ranks; returns (CompletedProcess, seconds)."""
    full_env = job_env(env)
    t0 = time.monotonic()
    res = run_job(
        mpirun_cmd(np_) + [sys.executable, "-c", textwrap.dedent(script)], timeout=timeout, env=full_env
    )
    return res, time.monotonic() - t0


def test_a_rank_that_leaves_early_fails_the_others_with_a_clear_error():
    res, took = job(
        3,
        """
        import sys, numpy as np, hvd_lite as hvd
        hvd.init()
        r = hvd.rank()
        try:
            for step in range(100000):
                if r == 1 and step == 5:
                    sys.exit(0)  # uneven data: this rank is done
                hvd.allreduce(np.ones(1000, np.float32), name=f"g{step % 3}")
        except hvd.HvdLiteError as e:
            print(f"rank {r} caught: {e}", flush=True)
            sys.exit(3)
    """,
    )
    assert res.returncode != 0
    for r in (0, 2):
        assert f"rank {r} caught: hvd_lite has been shut down on rank 1" in res.stdout, (
            res.stdout + res.stderr
        )
    assert took < 60


def test_a_rank_that_raises_ends_the_job():
    res, took = job(
        3,
        """
        import numpy as np, hvd_lite as hvd
        hvd.init()
        for step in range(100000):
            if hvd.rank() == 2 and step == 5:
                raise RuntimeError("boom")
            hvd.allreduce(np.ones(1000, np.float32), name=f"g{step % 3}")
    """,
    )
    assert res.returncode != 0 and "boom" in res.stderr
    assert took < 60


def test_a_killed_rank_ends_the_job():
    res, took = job(
        2,
        """
        import os, signal, numpy as np, hvd_lite as hvd
        hvd.init()
        for step in range(100000):
            if hvd.rank() == 1 and step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            hvd.allreduce(np.ones(1000, np.float32), name=f"g{step % 3}")
    """,
    )
    assert res.returncode != 0
    assert took < 60


def test_shutdown_fails_pending_handles_here_and_there():
    res, _ = job(
        2,
        """
        import time, numpy as np, hvd_lite as hvd
        hvd.init()
        x = np.ones(4, np.float32)
        if hvd.rank() == 0:
            h = hvd.allreduce_async(x, name="x")
            hvd.shutdown()
            try:
                hvd.synchronize(h)
            except hvd.HvdLiteError as e:
                print("rank 0:", e, flush=True)
        else:
            time.sleep(1.0)
            try:
                hvd.allreduce(x, name="x")
            except hvd.HvdLiteError as e:
                print("rank 1:", e, flush=True)
    """,
    )
    assert "rank 0: hvd_lite has been shut down on this rank" in res.stdout, res.stdout + res.stderr
    assert "rank 1: hvd_lite has been shut down on rank 0" in res.stdout, res.stdout + res.stderr


def test_stall_warning_names_the_missing_rank_and_tensor():
    res, _ = job(
        2,
        """
        import time, numpy as np, hvd_lite as hvd
        hvd.init()
        if hvd.rank() == 1:
            out = hvd.allreduce(np.ones(3), op=hvd.Sum, name="lonely")
        else:
            time.sleep(3.0)
            out = hvd.allreduce(np.ones(3), op=hvd.Sum, name="lonely")
        print("result", out[0], flush=True)
    """,
        env={"HVD_LITE_STALL_CHECK_TIME_SECONDS": "1"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("result 2.0") == 2
    assert "stall warning (rank 0)" in res.stderr
    assert "'lonely'" in res.stderr and "missing ranks: 0" in res.stderr


def test_stall_shutdown_raises_on_every_rank():
    res, took = job(
        2,
        """
        import time, numpy as np, hvd_lite as hvd
        hvd.init()
        try:
            if hvd.rank() == 1:
                hvd.allreduce(np.ones(3), name="lonely")
            else:
                time.sleep(5.0)
                hvd.allreduce(np.ones(3), name="late")
        except hvd.HvdLiteError as e:
            print(f"rank {hvd.rank()} raised:", e, flush=True)
    """,
        env={"HVD_LITE_STALL_CHECK_TIME_SECONDS": "1", "HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS": "2"},
    )
    for r in (0, 1):
        assert (
            f"rank {r} raised: hvd_lite stalled: 'lonely' was submitted by some ranks but not by ranks 0"
            in res.stdout
        ), res.stdout + res.stderr
    assert took < 60


def test_timeline_is_valid_json_with_the_phases(tmp_path):
    path = tmp_path / "timeline.json"
    res, _ = job(
        2,
        """
        import numpy as np, hvd_lite as hvd
        hvd.init()
        for step in range(3):
            # a group enters one round together, so the small ones are fused
            hs = hvd.grouped_allreduce_async([np.ones(100, np.float32)] * 4, name="small")
            hs.append(hvd.allreduce_async(np.ones(2_000_000, np.float32), name="big"))
            for h in hs:
                hvd.synchronize(h)
    """,
        env={
            "HVD_LITE_TIMELINE": str(path),
            "HVD_LITE_FUSION_THRESHOLD": str(1 << 20),
            "HVD_LITE_ALLREDUCE_ALGO": "ring",
        },
    )  # the ring's phases (shared memory: one ALLREDUCE)
    assert res.returncode == 0, res.stderr
    events = json.loads(path.read_text())
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    phases = {(rows[e["tid"]], e["name"]) for e in events if e.get("ph") == "X"}
    assert ("big", "RING_REDUCE_SCATTER") in phases and ("big", "RING_ALL_GATHER") in phases
    assert ("big", "NEGOTIATE") in phases
    assert {("small.0", "MEMCPY_IN_FUSION_BUFFER"), ("small.0", "MEMCPY_OUT_FUSION_BUFFER")} <= phases
    assert all(e["dur"] >= 0 for e in events if e.get("ph") == "X")


def test_timeline_stays_valid_json_when_the_job_is_killed(tmp_path):
    path = tmp_path / "timeline.json"
    res, _ = job(
        2,
        """
        import os, signal, numpy as np, hvd_lite as hvd
        hvd.init()
        for step in range(100000):
            hvd.allreduce(np.ones(1000, np.float32), name=f"t{step % 5}")
            if step == 50 and hvd.rank() == 0:
                os.kill(os.getpid(), signal.SIGKILL)
    """,
        env={"HVD_LITE_TIMELINE": str(path)},
    )
    assert res.returncode != 0
    events = json.loads(path.read_text())
    assert sum(1 for e in events if e.get("name") == "NEGOTIATE") >= 50


def test_an_idle_or_waiting_engine_uses_almost_no_cpu():
    res, _ = job(
        2,
        """
        import time, numpy as np, hvd_lite as hvd
        hvd.init()
        hvd.allreduce(np.ones(10))
        c0, t0 = time.process_time(), time.monotonic()
        time.sleep(3.0)                       # idle: nothing in flight anywhere
        idle = (time.process_time() - c0) / (time.monotonic() - t0)
        if hvd.rank() == 1:                   # waiting: rank 0 is 3 s late
            c0, t0 = time.process_time(), time.monotonic()
            hvd.allreduce(np.ones(10), name="late")
            waiting = (time.process_time() - c0) / (time.monotonic() - t0)
        else:
            time.sleep(3.0)
            hvd.allreduce(np.ones(10), name="late")
            waiting = 0.0
        print(f"rank {hvd.rank()} idle_cpu {idle:.4f} waiting_cpu {waiting:.4f}", flush=True)
    """,
    )
    assert res.returncode == 0, res.stderr
    lines = [ln.split() for ln in res.stdout.splitlines() if ln.startswith("rank")]
    assert len(lines) == 2
    for line in lines:
        idle, waiting = float(line[3]), float(line[5])
        assert idle < 0.05, f"idle engine used {idle:.1%} of a core"
        assert waiting < 0.10, f"waiting engine used {waiting:.1%} of a core"
    print(res.stdout)


@pytest.mark.parametrize(
    "batch_ms,rounds_ok", [(1000, lambda n: n <= 2), (0, lambda n: n >= 3)], ids=["batched", "unbatched"]
)
def test_a_burst_of_submissions_enters_one_round_within_the_batch_time(tmp_path, batch_ms, rounds_ok):
    """Six submissions 3 ms apart, then the waits: with HVD_LITE_BATCH_TIME=1000 the engine lets
    the burst finish and negotiates it in one round (two if its 1 s idle tick falls inside the
    burst); with 0 each submission starts a round of its own. Rounds are the engine's own count
    (a round is collective: every rank counts the same), from the first submission to the last
    wait; the timeline says every tensor was negotiated."""
    path = tmp_path / "timeline.json"
    res, _ = job(
        2,
        """
        import time, numpy as np, hvd_lite as hvd
        hvd.init()
        hvd.allreduce(np.ones(1), name="warmup")
        eng = hvd.basics._engine()
        before = eng.stats()["rounds"]
        hs = []
        for i in range(6):
            hs.append(hvd.allreduce_async(np.ones(100, np.float32), name=f"burst.{i}"))
            time.sleep(0.003)
        for h in hs:
            hvd.synchronize(h)
        print(f"rank {hvd.rank()} rounds {eng.stats()['rounds'] - before}", flush=True)
    """,
        env={"HVD_LITE_TIMELINE": str(path), "HVD_LITE_BATCH_TIME": str(batch_ms)},
    )
    assert res.returncode == 0, res.stderr
    events = json.loads(path.read_text())
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    negotiated = [e for e in events if e.get("name") == "NEGOTIATE" and rows[e["tid"]].startswith("burst.")]
    rounds = [int(line.split()[3]) for line in res.stdout.splitlines() if line.startswith("rank ")]
    assert len(negotiated) == 6 and len(rounds) == 2, res.stdout
    assert rounds_ok(rounds[0]), f"{rounds[0]} rounds for the burst (rank 0; all ranks: {rounds})"


def test_a_signal_interrupts_a_waiting_synchronize():
    """Rank 1 waits for a collective rank 0 joins 3 s late; an alarm after 1 s raises in the
    waiting thread (Ctrl-C and pytest's timeout work the same way) instead of being held off.
    Rank 1 then waits in a barrier, so that it is still there when rank 0 comes."""
    res, _ = job(
        2,
        """
        import signal, time, numpy as np, hvd_lite as hvd
        hvd.init()
        if hvd.rank() == 0:
            time.sleep(3)
            hvd.allreduce(np.ones(3), name="late")
            hvd.barrier()
        else:
            def alarm(*_):
                raise TimeoutError("alarm")
            signal.signal(signal.SIGALRM, alarm)
            signal.alarm(1)
            t0 = time.monotonic()
            try:
                hvd.allreduce(np.ones(3), name="late")
            except TimeoutError:
                print(f"interrupted after {time.monotonic() - t0:.1f} s", flush=True)
            hvd.barrier()
    """,
    )
    assert res.returncode == 0, res.stderr
    assert "interrupted after 1." in res.stdout, res.stdout + res.stderr


FAST_PATH_JOB = """
    import threading, numpy as np, hvd_lite as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    tri = n * (n + 1) // 2
    eng = hvd.basics._engine()
    before = eng.stats()["caller_turns"]
    wrong = 0
    # synchronous calls, small and large (the large ones above HVD_LITE_FAST_PATH_BYTES = 4096)
    for step in range(60):
        count = 8 if step % 3 else 64 * 1024
        out = hvd.allreduce(np.full(count, r + 1, np.float64), op=hvd.Sum, name=f"s{step % 4}.{count}")
        wrong += int(np.count_nonzero(out != tri))
    # asynchronous ones in flight while another thread makes synchronous calls
    def sync_calls():
        global wrong
        for step in range(30):
            out = hvd.allreduce(np.full(16, r + 1, np.int32), op=hvd.Sum, name=f"t{step}")
            wrong += int(np.count_nonzero(out != tri))
    t = threading.Thread(target=sync_calls)
    t.start()
    hs = [hvd.allreduce_async(np.full(1000, r + 1, np.float32), op=hvd.Sum, name=f"a{i}")
          for i in range(30)]
    wrong += sum(int(np.count_nonzero(hvd.synchronize(h) != tri)) for h in hs)
    t.join()
    print(f"rank {r} wrong {wrong} caller_turns {eng.stats()['caller_turns'] - before}", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_synchronous_calls_run_their_rounds_in_the_calling_thread_and_stay_right(n):
    res, _ = job(n, FAST_PATH_JOB, env={"HVD_LITE_FAST_PATH_BYTES": "4096"})
    assert res.returncode == 0, res.stdout + res.stderr
    for r in range(n):
        line = next(ln for ln in res.stdout.splitlines() if ln.startswith(f"rank {r} wrong"))
        assert line.split()[3] == "0", res.stdout
        assert int(line.split()[5]) > 0, res.stdout  # the fast path ran


def test_without_the_fast_path_every_round_is_the_engine_threads():
    res, _ = job(2, FAST_PATH_JOB, env={"HVD_LITE_FAST_PATH_BYTES": "0"})
    assert res.returncode == 0, res.stdout + res.stderr
    for r in range(2):
        assert f"rank {r} wrong 0 caller_turns 0" in res.stdout, res.stdout
