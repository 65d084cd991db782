"""What one asynchronous submission costs with many in flight: the engine held (no round runs, so
every submission stays in flight), n named calls submitted back to back, timed, then all
synchronized; per n, the median over repeats of the time per submission, in microseconds.

    python tools/submit_cost.py [--counts 10,161,1000,3000] [--repeats 60]

Contenders, interleaved within each repeat:
  public   hvd.allreduce_async_(x, op=hvd.Sum, name=...): what a training script's hook pays
  engine   the engine's own submit with the arguments built once (Engine.submit): the C part
  torch    hvd_lite.torch.allreduce_async_ on a float32 tensor (when torch is installed)
One process is enough (a rank of its own); under mpirun rank 0 prints.
"""

import argparse
import statistics
import time

import numpy as np

import hvd_lite as hvd
from hvd_lite import _submit, basics, ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", default="10,161,1000,3000")
    p.add_argument("--repeats", type=int, default=60)
    args = p.parse_args()
    hvd.init()
    engine = basics._engine()
    counts = [int(c) for c in args.counts.split(",")]
    arrays = [np.ones(16, np.float32) for _ in range(max(counts))]
    names = [f"submit_cost.{i}" for i in range(len(arrays))]
    built = [
        (
            ops.plain_args(a, True, hvd.Sum, 1.0, 1.0, n)
            or ops.allreduce_request("f", a, True, hvd.Sum, 1.0, 1.0, n).submission
        ).entry()
        for a, n in zip(arrays, names)
    ]

    def public(i):
        return hvd.allreduce_async_(arrays[i], op=hvd.Sum, name=names[i])

    def bare(i):
        return engine.submit(*built[i], False)

    def finish(h):
        if isinstance(h, _submit.Handle):
            hvd.synchronize(h)
        elif not hasattr(h, "wait"):  # hvd_lite.torch's Handle
            hvd_torch.synchronize(h)
        else:
            h.wait()

    contenders = {"public": public, "engine": bare}
    try:
        import torch

        import hvd_lite.torch as hvd_torch
    except ImportError:
        pass
    else:
        tensors = [torch.ones(16) for _ in arrays]

        def torch_call(i):
            return hvd_torch.allreduce_async_(tensors[i], op=hvd_torch.Sum, name=names[i])

        contenders["torch"] = torch_call
    times = {(k, n): [] for k in contenders for n in counts}
    for rep in range(args.repeats):
        for n in counts:
            for k, fn in contenders.items():
                with _submit.held(engine):
                    settle = time.perf_counter() + 0.002  # the engine thread done with the last
                    while time.perf_counter() < settle:  # turn (a spin: a sleep leaves the core
                        pass  # cold for the first call)
                    t0 = time.perf_counter()
                    handles = [fn(i) for i in range(n)]
                    t = (time.perf_counter() - t0) / n
                for h in handles:
                    finish(h)
                del handles, h  # let go before the next timing, not inside it
                if rep >= 3:
                    times[(k, n)].append(t)
    if hvd.rank() == 0:
        print(f"# us a submission, median of {args.repeats - 3} repeats")
        for n in counts:
            print(
                f"{n:>6} in flight  "
                + "  ".join(f"{k} {statistics.median(times[(k, n)]) * 1e6:6.2f}" for k in contenders)
            )


if __name__ == "__main__":
    main()
