"""A job over two host names on one machine (see run_helpers.two_hosts for how)."""

import os
import re
import time

from run_helpers import HANG_HOST, hvdrun, mpi_args, pid_alive, py, tagged, two_hosts

TOPOLOGY = """
import socket, sys, numpy as np, hvd_lite as hvd
hvd.init()
total = int(hvd.allreduce(np.array([hvd.rank() + 1], np.int64), op=hvd.Sum)[0])
# the hierarchical all-reduce: 3 chunks within each host, lanes across hosts
big = hvd.allreduce(np.arange(300_001, dtype=np.float64) * (hvd.rank() + 1), op=hvd.Sum)
exact = bool(np.array_equal(big, np.arange(300_001, dtype=np.float64) * total))
sys.stdout.write(f"TOPO {hvd.rank()} {socket.gethostname()} {hvd.local_rank()} {hvd.local_size()} "
                 f"{hvd.cross_rank()} {hvd.cross_size()} {total} {exact}\\n")
"""


def test_two_hosts_give_local_and_cross_ranks_per_host():
    with two_hosts() as (words, _root):
        res = hvdrun("-np", "4", "-H", "hosta:2,hostb:2", *mpi_args(words), *py(TOPOLOGY))
    assert res.returncode == 0, res.stdout + res.stderr
    # rank host local_rank local_size cross_rank cross_size sum(rank+1) big-all-reduce-exact
    assert sorted(tagged(res.stdout, "TOPO")) == [
        "0 hosta 0 2 0 2 10 True",
        "1 hosta 1 2 0 2 10 True",
        "2 hostb 0 2 1 2 10 True",
        "3 hostb 1 2 1 2 10 True",
    ]


def test_uneven_hosts_from_a_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two made-up hosts\nhosta slots=1\nhostb slots=2  # two ranks\n")
    with two_hosts() as (words, _root):
        res = hvdrun("-np", "3", "--hostfile", str(hostfile), *mpi_args(words), *py(TOPOLOGY))
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(tagged(res.stdout, "TOPO")) == [
        "0 hosta 0 1 0 2 6 True",
        "1 hostb 0 2 1 2 6 True",
        "2 hostb 1 2 0 1 6 True",
    ]


def test_start_timeout_ends_a_job_whose_host_never_comes_up():
    with two_hosts() as (words, root):
        t0 = time.monotonic()
        res = hvdrun(
            "-np",
            "2",
            "-H",
            f"hosta:1,{HANG_HOST}:1",
            "--start-timeout",
            "3",
            *mpi_args(words),
            *py("import time; time.sleep(60)"),
        )
        took = time.monotonic() - t0
        pid_file = f"{root}/{HANG_HOST}/pid"
        hung = int(open(pid_file).read()) if os.path.exists(pid_file) else None
    assert res.returncode == 124, res.stderr
    # Open MPI starts no rank before every daemon is up; Hydra starts the ranks of hosta.
    assert re.search(
        r"only [01] of 2 ranks started within 3 s \(--start-timeout\); "
        r"not started: (0, )?1\.",
        res.stderr,
    ), res.stderr
    assert took < 20
    if hung is not None:
        assert not pid_alive(hung), "the stand-in for the host that never started still runs"
