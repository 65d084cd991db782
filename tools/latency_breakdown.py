"""Where a small synchronous all-reduce's microseconds go, at 2 ranks: its parts timed in one run,
interleaved, each as the median round trip over every call on the slowest rank.

    mpirun -np 2 python tools/latency_breakdown.py [--bytes 4] [--iters 2000] [--repeats 10]

Contenders, each called back to back after a barrier:
  mpi          MPI_Allreduce (mpi4py, in place): what the data costs MPI
  core         hvdlAllReduce through the C binding, no engine: what the data costs hvd_lite
  round        MPI_Allgather of one negotiation header (2 x uint64 per rank): what the round's
               collective costs through MPI (across hosts, or with HVD_LITE_SHM=0; on one host the
               engine's round goes through the shared segment instead, csrc/transport/shm/segment.c)
  alone        hvd.allreduce_ in a process set of this rank alone: the Python API, submission, the
               engine's turn (round and execution on one rank) and completion, with nobody to wait for
  engine       hvd.allreduce_ on both ranks: the whole call
  bare         the engine's own submit and wait (Engine.submit(...).wait()) with the arguments
               built once: the call without the Python layer's checks, names and request
  plain        the quick route's parts alone (_submit.run of ops.plain_args' arguments): bare
               with the arguments built and tested each call, without the public function
The rest, engine - alone - round - core, is what waiting for the peer costs beyond the two
collectives themselves (both ranks reaching the round, wake-ups); negative when the engine's
round costs less than the MPI one.

Two more lines split the engine's call by the engine's own clock (Engine.stats()'s step_seconds,
the time its executor spent running collectives, per call, the slowest rank's):
  in step     the collective inside the engine (compare with core)
  around      engine - in step: everything else a call costs (Python, submission, the round,
              completion), with the caches as the collective left them (compare with alone,
              the same work on a warm cache)
and one more contender:
  alone after core   alone's call timed right after a core call (untimed) each time: the same
              work as alone, on the caches a collective of this size leaves
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import hvd_lite as hvd
from hvd_lite import _submit, basics, ops
from hvd_lite._submission import Submission


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=4)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    world = MPI.COMM_WORLD
    n, r = world.Get_size(), world.Get_rank()
    own = [hvd.ProcessSet([k]) for k in range(n)]
    hvd.init(process_sets=own)
    mine = own[r]
    count = max(1, args.bytes // 4)
    x = np.ones(count, np.float32)
    core = basics._core.Comm()
    hdr, gathered = np.zeros(2, np.uint64), np.zeros(2 * n, np.uint64)

    def core_call():
        core.allreduce(x, x, 7, 0)  # float32 sum

    engine = basics._engine()
    bare_args = Submission.of(basics._core.COLL_ALLREDUCE, x, x, 7, "lat.bare", tuple(x.shape), op=0).entry()

    contenders = {
        "mpi": lambda: world.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM),
        "core": core_call,
        "round": lambda: world.Allgather(hdr, gathered),
        "alone": lambda: hvd.allreduce_(x, op=hvd.Sum, name="lat.alone", process_set=mine),
        "engine": lambda: hvd.allreduce_(x, op=hvd.Sum, name="lat.engine"),
        "bare": lambda: engine.submit(*bare_args, True).wait(),
        "plain": lambda: _submit.run(
            basics._state.sets[0], None, ops.plain_args(x, True, hvd.Sum, 1.0, 1.0, "lat.plain")
        ),
    }

    def alone_after_core() -> float:
        spent = 0.0
        for _ in range(args.iters):
            core_call()
            t = time.perf_counter()
            hvd.allreduce_(x, op=hvd.Sum, name="lat.alone", process_set=mine)
            spent += time.perf_counter() - t
        return spent / args.iters

    times = {k: [] for k in contenders}
    in_step, after = [], []
    for rep in range(args.repeats):
        order = list(contenders)
        order = order[rep % len(order) :] + order[: rep % len(order)]
        for k in order:
            fn = contenders[k]
            for _ in range(50):
                fn()
            world.Barrier()
            busy = engine.stats()["step_seconds"]
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            t = (time.perf_counter() - t0) / args.iters
            times[k].append(world.allreduce(t, op=MPI.MAX))
            if k == "engine":
                busy = (engine.stats()["step_seconds"] - busy) / args.iters
                in_step.append(world.allreduce(busy, op=MPI.MAX))
        world.Barrier()
        after.append(world.allreduce(alone_after_core(), op=MPI.MAX))
        x[:] = 1
    if r == 0:
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print(
            f"# {n} ranks, {count * 4} B float32 sum, {args.iters} calls x {args.repeats} repeats; "
            "median round trip (us), slowest rank"
        )
        for k, v in med.items():
            print(f"{k:>8} {v:8.2f}   (range {min(times[k]) * 1e6:.2f}-{max(times[k]) * 1e6:.2f})")
        rest = med["engine"] - med["alone"] - med["round"] - med["core"]
        print(f"{'rest':>8} {rest:8.2f}   engine - alone - round - core: waiting for the peer")
        step = statistics.median(in_step) * 1e6
        print(
            f"{'in step':>8} {step:8.2f}   (range {min(in_step) * 1e6:.2f}-{max(in_step) * 1e6:.2f}) "
            "the engine's collective, by its own clock"
        )
        print(f"{'around':>8} {med['engine'] - step:8.2f}   engine - in step: the rest of the call")
        cold = statistics.median(after) * 1e6
        print(f"alone after core {cold:8.2f}   (range {min(after) * 1e6:.2f}-{max(after) * 1e6:.2f})")
    core.destroy()


if __name__ == "__main__":
    main()
