"""Small synchronous all-reduces on a loaded machine: the distribution of one call's time, and
how the engine ran them, at 2 ranks or more.

    mpirun -np 2 python tools/latency_under_load.py [--hogs 2] [--calls 20000] [--repeats 4]

Rank 0 starts --hogs busy-looping processes at nice 10 (default: one per core) for the whole run,
as other work on the machine would be; then every rank calls hvd.allreduce_ on one float32,
back to back, and prints per repeat the mean, median, 99th percentile and maximum time of a call,
the calls over 1 ms and the time they took, and the engine's rounds and caller turns (the fast
path). A thread that waits by sched_yield on such a machine gets its core back a time slice later
(ms): csrc/base/wait.c.
"""

import argparse
import multiprocessing as mp
import os
import time

import numpy as np
from mpi4py import MPI

import hvd_lite as hvd
from hvd_lite import basics


def _hog() -> None:
    os.nice(10)
    while True:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hogs", type=int, default=os.cpu_count())
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=4)
    args = p.parse_args()
    world = MPI.COMM_WORLD
    hogs = []
    if world.Get_rank() == 0:
        hogs = [mp.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
        for h in hogs:
            h.start()
    hvd.init()
    x = np.ones(1, np.float32)
    engine = basics._engine()
    clock = time.perf_counter
    try:
        for rep in range(args.repeats):
            ts = np.empty(args.calls)
            before = engine.stats()
            for i in range(args.calls):
                t0 = clock()
                hvd.allreduce_(x, op=hvd.Sum, name="load")
                ts[i] = clock() - t0
            after = engine.stats()
            ts *= 1e6
            slow = ts[ts > 1000]
            print(
                f"rank {hvd.rank()} repeat {rep}: mean {ts.mean():.1f} us, p50 {np.median(ts):.1f}, "
                f"p99 {np.percentile(ts, 99):.1f}, max {ts.max():.0f}; {len(slow)} calls over 1 ms "
                f"({slow.sum() / 1e3:.0f} ms); rounds {after['rounds'] - before['rounds']}, "
                f"caller turns {after['caller_turns'] - before['caller_turns']}",
                flush=True,
            )
    finally:
        for h in hogs:
            h.terminate()


if __name__ == "__main__":
    main()
