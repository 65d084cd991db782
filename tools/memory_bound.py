"""What memory allows an in-place all-reduce on one host, against MPI_Allreduce, in one run, interleaved
(docs/benchmarks-history.md, "What memory allows").

    mpirun -np 2 python tools/memory_bound.py [--repeats 8]

Whatever the algorithm, every rank ends with B bytes of result that it wrote, computed from B bytes of its
own input that something read: at least a copy of B bytes per rank, with every rank copying at the same time
(they share the caches and the memory). So the time of one copy of B bytes on every rank at once (`copy`,
numpy's copyto between two private buffers, after a barrier; the slowest rank) bounds any all-reduce's time
from below, shared memory or not. `sum` is the same for the reduction kernel's pass (out = a + b, numpy) over
B bytes. Printed per size: the medians over the repeats, and copy / MPI: an all-reduce at twice MPI's bus
bandwidth must take at most MPI / 2, which no algorithm can where copy / MPI is above 0.5.
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

SIZES = [64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20]


def timed(world, fn, iters):
    fn()
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return world.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=8)
    args = p.parse_args()
    world = MPI.COMM_WORLD
    if world.rank == 0:
        print(
            f"# {world.size} ranks, float32; medians over {args.repeats} repeats of a ~50 ms batch, "
            "slowest rank; us"
        )
        print(f"# {'bytes':>9} {'MPI':>9} {'copy':>9} {'sum':>9}  copy/MPI  sum/MPI")
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, np.float32)
        a, b = np.ones_like(x), np.empty_like(x)
        iters = max(2, min(2000, int(0.05 / (nbytes / 2e9 + 5e-6))))
        fns = {
            "mpi": lambda: world.Allreduce(MPI.IN_PLACE, x),
            "copy": lambda: np.copyto(b, a),
            "sum": lambda: np.add(a, x, out=b),
        }
        res = {k: [] for k in fns}
        for rep in range(args.repeats):
            for k in list(fns) if rep % 2 == 0 else list(fns)[::-1]:
                res[k].append(timed(world, fns[k], iters))
                x[:] = 1
        if world.rank == 0:
            m = {k: statistics.median(v) * 1e6 for k, v in res.items()}
            print(
                f"  {nbytes:>9} {m['mpi']:9.1f} {m['copy']:9.1f} {m['sum']:9.1f}  "
                f"{m['copy'] / m['mpi']:8.2f} {m['sum'] / m['mpi']:8.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
