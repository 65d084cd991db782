"""Whole jobs in which a rank waits for one that does not come: a signal (Ctrl-C, pytest-timeout's
alarm) interrupts every wait promptly, and the handle the interrupted call leaves behind does not
block the process afterwards."""

import sys
import textwrap
import time

import pytest
from mpi_cmd import job_env, mpirun_cmd, run_job

TIMEOUT = 120


def job(np_, script, timeout=TIMEOUT):
    """Runs `script` on np_ ranks; returns (CompletedProcess, seconds)."""
    t0 = time.monotonic()
    res = run_job(
        mpirun_cmd(np_) + [sys.executable, "-c", textwrap.dedent(script)], timeout=timeout, env=job_env()
    )
    return res, time.monotonic() - t0


def seconds_after(label: str, out: str) -> float:
    lines = [line for line in out.splitlines() if line.startswith(label)]
    assert len(lines) == 1, out
    return float(lines[0].split()[-2])


@pytest.mark.parametrize("call", ["hvd.barrier()", "hvd.join()", "hvd.allreduce(np.ones(3), name='never')"])
def test_a_signal_interrupts_a_wait_for_a_rank_that_never_arrives(call):
    """Rank 1 waits in `call`, which rank 0 never makes (it leaves after 4 s, twice the 2 s in
    which rank 1 must have carried on); SIGINT after 1 s raises KeyboardInterrupt at once, and
    the process carries on at once: the dropped handle does not wait for rank 0."""
    res, _ = job(
        2,
        f"""
        import os, signal, threading, time, numpy as np, hvd_lite as hvd
        hvd.init()
        if hvd.rank() == 0:
            time.sleep(4)
        else:
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            t0 = time.monotonic()
            try:
                {call}
            except KeyboardInterrupt:
                print(f"interrupted after {{time.monotonic() - t0:.2f}} s", flush=True)
            print(f"carried on after {{time.monotonic() - t0:.2f}} s", flush=True)
    """,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert 0.9 < seconds_after("interrupted after", res.stdout) < 2.0, res.stdout
    assert seconds_after("carried on after", res.stdout) < 2.0, res.stdout


def test_a_signal_interrupts_shutdown_and_a_second_shutdown_finishes_it():
    """Rank 0 is stopped (SIGSTOP), so rank 1's engine cannot say goodbye: SIGINT after 1 s
    interrupts rank 1's shutdown(); once rank 0 runs again, shutdown() finishes."""
    res, _ = job(
        2,
        """
        import os, signal, subprocess, threading, time, hvd_lite as hvd
        hvd.init()
        pids = hvd.allgather_object(os.getpid())
        hvd.barrier()
        if hvd.rank() == 0:
            # in case rank 1 never continues this rank: a watchdog does after 30 s (it holds no
            # output pipe, which would keep the job open until it ends; it goes once not needed)
            watchdog = subprocess.Popen(["sh", "-c", f"sleep 30; kill -CONT {os.getpid()}"],
                                        start_new_session=True, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.kill(os.getpid(), signal.SIGSTOP)
            os.killpg(watchdog.pid, signal.SIGKILL)  # its shell and its sleep
            watchdog.wait()
        else:
            time.sleep(0.5)  # rank 0 has stopped
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            t0 = time.monotonic()
            try:
                hvd.shutdown()
                print(f"shutdown returned after {time.monotonic() - t0:.2f} s", flush=True)
            except KeyboardInterrupt:
                print(f"interrupted after {time.monotonic() - t0:.2f} s", flush=True)
            refused = False
            try:
                hvd.barrier()
            except hvd.HvdLiteError:
                refused = True  # leaving: new collectives are refused
            os.kill(pids[0], signal.SIGCONT)
            hvd.shutdown()
            print(f"refused {refused} initialized {hvd.is_initialized()}", flush=True)
    """,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert 0.9 < seconds_after("interrupted after", res.stdout) < 2.0, res.stdout
    assert "refused True initialized False" in res.stdout, res.stdout


def test_a_collective_given_up_on_still_completes_when_the_peer_comes():
    """Rank 1 interrupts its wait for 'late' and drops the handle; rank 0 submits 'late' 2 s later
    and gets the sum of both ranks' data, which rank 1's engine still sent."""
    res, _ = job(
        2,
        """
        import os, signal, threading, time, numpy as np, hvd_lite as hvd
        hvd.init()
        x = np.full(100_000, hvd.rank() + 1.0)
        if hvd.rank() == 0:
            time.sleep(2)
            out = hvd.allreduce(x, op=hvd.Sum, name="late")
            print("rank 0 got", out[0], out[-1], flush=True)
            hvd.barrier()
        else:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                hvd.allreduce_(x, op=hvd.Sum, name="late")
            except KeyboardInterrupt:
                pass
            hvd.barrier()  # rank 0 is done with 'late'
            print("rank 1 in place", x[0], x[-1], flush=True)
    """,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rank 0 got 3.0 3.0" in res.stdout, res.stdout
    assert "rank 1 in place 3.0 3.0" in res.stdout, res.stdout


def test_an_unnamed_call_given_up_on_is_met_by_the_peers_first_call_and_the_next_by_their_next():
    """Unnamed synchronous calls share one name (allreduce.sync): rank 1 interrupts its first
    one and makes a second at once; it waits for the first to complete (rank 0's first call,
    2 s later), then meets rank 0's second."""
    res, _ = job(
        2,
        """
        import os, signal, threading, time, numpy as np, hvd_lite as hvd
        hvd.init()
        if hvd.rank() == 0:
            time.sleep(2)
            a = hvd.allreduce(np.full(10, 1.0), op=hvd.Sum)
            b = hvd.allreduce(np.full(10, 10.0), op=hvd.Sum)
            print("rank 0 got", a[0], b[0], flush=True)
        else:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                hvd.allreduce(np.full(10, 2.0), op=hvd.Sum)
            except KeyboardInterrupt:
                print("rank 1 interrupted", flush=True)
            b = hvd.allreduce(np.full(10, 20.0), op=hvd.Sum)
            print("rank 1 got", b[0], flush=True)
    """,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rank 1 interrupted" in res.stdout, res.stdout
    assert "rank 0 got 3.0 30.0" in res.stdout, res.stdout
    assert "rank 1 got 30.0" in res.stdout, res.stdout
