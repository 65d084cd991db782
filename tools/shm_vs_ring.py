"""The shared-memory all-reduce against the ring and MPI_Allreduce on one host, interleaved in one
run (docs/benchmarks.md, "Shared memory against the ring"; csrc/select.c's SHM_ALLREDUCE_MAX).

    mpirun -np 2 python tools/shm_vs_ring.py
"""
import os, time, statistics, numpy as np
from mpi4py import MPI
import hvd_lite as hvd
from hvd_lite import basics
hvd.init()
w = MPI.COMM_WORLD
def mk(algo):
    os.environ["HVD_LITE_ALLREDUCE_ALGO"] = algo
    c = basics._core.Comm(); del os.environ["HVD_LITE_ALLREDUCE_ALGO"]; return c
comms = {"shm": mk("shm"), "ring": mk("ring")}
for nbytes in [65536, 131072, 262144, 524288, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 64 << 20]:
    x = np.ones(nbytes // 4, np.float32)
    iters = max(2, min(2000, int(0.05 / (nbytes / 2e9 + 5e-6))))
    res = {k: [] for k in list(comms) + ["mpi"]}
    for rep in range(12):
        order = ["shm", "ring", "mpi"] if rep % 2 == 0 else ["mpi", "ring", "shm"]
        for k in order:
            f = (lambda: w.Allreduce(MPI.IN_PLACE, x)) if k == "mpi" else (lambda c=comms[k]: c.allreduce(x, x, 7, 0))
            f(); w.Barrier(); t0 = time.perf_counter()
            for _ in range(iters): f()
            res[k].append(w.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
            x[:] = 1
    if w.rank == 0:
        m = {k: statistics.median(v) * 1e6 for k, v in res.items()}
        print(f"{nbytes:>9} shm {m['shm']:9.1f} ring {m['ring']:9.1f} mpi {m['mpi']:9.1f}  shm/ring {m['shm']/m['ring']:.2f}", flush=True)
