"""The shared-memory all-reduce against the ring and MPI_Allreduce on one host, interleaved in one
run (docs/benchmarks-history.md, "Shared memory against the ring"; algorithms.h's SHM_ALLREDUCE_MAX).

    mpirun -np 2 python tools/shm_vs_ring.py [--cold MiB] [--sizes 65536,1048576]

Float32 sum in place; per size, 12 repeats in alternating order, each a batch of ~50 ms; the
median of the slowest rank's per-call time. By default every call takes the same buffer, which
stays in the cache (as a benchmark's does). With --cold M the calls go round buffers filling M
MiB per rank (more than the last-level cache: each call's buffer then comes from memory, as a
training step's gradients do).
"""

import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import hvd_lite as hvd
from hvd_lite import basics

SIZES = [65536, 131072, 262144, 524288, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 64 << 20]


def make_comm(algo, **env):
    os.environ["HVD_LITE_ALLREDUCE_ALGO"] = algo
    os.environ.update(env)
    try:
        return basics._core.Comm()
    finally:
        for k in ["HVD_LITE_ALLREDUCE_ALGO", *env]:
            del os.environ[k]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cold", type=int, default=0, metavar="MiB")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = p.parse_args()
    hvd.init()
    w = MPI.COMM_WORLD
    # shm: its single-copy form above SHM_CMA_MIN where the host allows it; areas: every size
    # through the segment's areas (HVD_LITE_SHM_CMA=0)
    comms = {
        "shm": make_comm("shm"),
        "areas": make_comm("shm", HVD_LITE_SHM_CMA="0"),
        "ring": make_comm("ring"),
    }
    for nbytes in [int(s) for s in args.sizes.split(",")]:
        nbufs = max(1, (args.cold << 20) // nbytes)
        bufs = [np.ones(nbytes // 4, np.float32) for _ in range(nbufs)]
        iters = max(2, min(2000, int(0.05 / (nbytes / 2e9 + 5e-6))))
        res = {k: [] for k in list(comms) + ["mpi"]}
        for rep in range(12):
            order = ["shm", "areas", "ring", "mpi"]
            order = order if rep % 2 == 0 else order[::-1]
            for k in order:
                if k == "mpi":

                    def f(x):
                        w.Allreduce(MPI.IN_PLACE, x)
                else:

                    def f(x, c=comms[k]):
                        c.allreduce(x, x, 7, 0)

                f(bufs[0])
                w.Barrier()
                t0 = time.perf_counter()
                for i in range(iters):
                    f(bufs[i % nbufs])
                res[k].append(w.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
                for x in bufs[:iters]:  # the ones this batch used
                    x[:] = 1
        if w.rank == 0:
            m = {k: statistics.median(v) * 1e6 for k, v in res.items()}
            print(
                f"{nbytes:>9} shm {m['shm']:9.1f} areas {m['areas']:9.1f} ring {m['ring']:9.1f} "
                f"mpi {m['mpi']:9.1f}  shm/ring {m['shm'] / m['ring']:.2f}  "
                f"areas/mpi {m['areas'] / m['mpi']:.2f}  shm/mpi {m['shm'] / m['mpi']:.2f}"
                + (f"  ({nbufs} buffers)" if nbufs > 1 else ""),
                flush=True,
            )
        del bufs
    for c in comms.values():
        c.destroy()


if __name__ == "__main__":
    main()
