"""Round trip of one small all-reduce: through hvd_lite's engine, its C core, and MPI.

Run under mpirun; rank 0 prints. For each size (-s, default 4 B and 4 KiB,
float32 sum, in place), contenders alternate batch by batch (order rotating):

  hvd named      hvd.allreduce_(x, op=hvd.Sum, name="latency.<size>"): the same
                 name every call, so negotiation takes the response cache's fast path
  hvd auto       hvd.allreduce_(x, op=hvd.Sum): a synchronous call's automatic
                 name, one for every such call (allreduce.sync), so it is cached
                 from the second call on, as a named one
  core           the C binding without the engine (_core.Comm.allreduce), for reference
  torch          hvd_lite.torch.allreduce_(t, op=Sum) on a CPU tensor sharing x's memory,
                 unnamed (only with --only torch: needs PyTorch)
  torch_new      t.copy_(hvd_lite.torch.allreduce(t, op=Sum)): the out-of-place call, its
                 result copied back (only with --only torch_new)
  MPI            mpi4py Comm.Allreduce(MPI.IN_PLACE, x)

Each call is timed on its own (time.perf_counter_ns around the call) on every
rank; the input is restored, untimed, before each call. A batch is -n calls
after a barrier. Median, p10 and p90 are over every call of every batch on
every rank, in microseconds. #wrong counts wrong result elements of the last
call of each batch, summed over ranks.
"""

import argparse
import sys
import time
from typing import Any, Callable, Dict

import numpy as np

from . import common, exact, progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The latency options."""
    p.add_argument(
        "-s",
        "--size",
        type=common.parse_size,
        action="append",
        help="bytes per rank (float32; may be repeated; default 4 and 4K)",
    )
    p.add_argument("-n", "--iters", type=int, default=1000, help="calls per batch (default 1000)")
    p.add_argument("--repeats", type=int, default=10, help="batches of each contender per size (default 10)")
    p.add_argument(
        "-w",
        "--warmup",
        type=int,
        default=100,
        help="untimed calls of each contender before each size (default 100)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=("named", "auto", "core", "mpi", "torch", "torch_new"),
        help="time only these contenders (may be repeated; default all but the torch ones)",
    )
    p.add_argument("--json", metavar="FILE", help="write every call's time to FILE")
    progress.add_argument(p)


LABELS = {
    "named": "hvd named",
    "auto": "hvd auto",
    "core": "core (no engine)",
    "mpi": "MPI_Allreduce",
    "torch": "hvd.torch auto",
    "torch_new": "hvd.torch new",
}


def main(args) -> int:
    """Runs the latency benchmark; rank 0 prints and writes --json."""
    import hvd_lite as hvd

    hvd.init()
    import mpi4py
    from mpi4py import MPI

    from hvd_lite import basics
    from hvd_lite import ops as hops

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    root = rank == 0
    sizes = args.size or [4, 4096]
    kinds = args.only or ["named", "auto", "core", "mpi"]
    dtype = np.dtype(np.float32)
    expected = exact.expected_pattern(dtype, "sum", n)
    pattern = exact.rank_pattern(dtype, "sum", rank)
    # a _core.Comm when "core" is one of the kinds (the only one that calls it)
    comm: Any = basics._core.Comm() if "core" in kinds else None
    fcode, scode = hops.HVDL_DTYPES[dtype], hops.HVDL_OPS[hvd.Sum]
    if "torch" in kinds or "torch_new" in kinds:
        import torch

        import hvd_lite.torch as htorch

    if root:
        print(
            f"# hvd_lite.bench latency: {n} ranks, float32 sum in place; {args.warmup} warm-up "
            f"calls of each, then {args.repeats} batches of {args.iters} calls of each "
            "(order rotating)"
        )
        print(
            f"# hvd_lite {hvd.__version__}; mpi4py {mpi4py.__version__}; times in us, over "
            "every call on every rank"
        )
    table = common.Table(
        [
            ("size(B)", 8, "{}"),
            ("contender", 17, "{}"),
            ("median", 8, "{:.2f}"),
            ("p10", 8, "{:.2f}"),
            ("p90", 8, "{:.2f}"),
            ("p99", 9, "{:.2f}"),
            ("vs MPI", 7, "{:.1f}"),
            ("#wrong", 6, "{}"),
        ]
    )
    if root:
        table.header()

    load_start = common.loadavg()
    results = []
    bar = progress.Progress("bench latency", len(sizes), root and not args.quiet)
    for nbytes in sizes:
        bar.point(common.format_size(nbytes))
        count = max(1, nbytes // dtype.itemsize)
        x = np.empty(count, dtype)
        pristine = np.empty(count, dtype)
        exact.fill(pristine, pattern)
        xb = x.view(np.uint8)
        fixed = f"latency.{nbytes}"
        calls: Dict[str, Callable[[], object]] = {
            "named": lambda: hvd.allreduce_(x, op=hvd.Sum, name=fixed),
            "auto": lambda: hvd.allreduce_(x, op=hvd.Sum),
            "core": lambda: comm.allreduce(xb, xb, fcode, scode),
            "mpi": lambda: world.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM),
        }
        if "torch" in kinds or "torch_new" in kinds:
            t = torch.from_numpy(x)
            calls["torch"] = lambda: htorch.allreduce_(t, op=htorch.Sum)
            calls["torch_new"] = lambda: t.copy_(htorch.allreduce(t, op=htorch.Sum))
        for kind in kinds:
            for _ in range(args.warmup):
                np.copyto(x, pristine)
                calls[kind]()
        samples = np.zeros((len(kinds), args.repeats, args.iters), dtype=np.int64)
        wrong = np.zeros(len(kinds), dtype=np.int64)
        now = time.perf_counter_ns
        for rep in range(args.repeats):
            for j in range(len(kinds)):
                i = (j + rep) % len(kinds)
                call, out = calls[kinds[i]], samples[i, rep]
                world.Barrier()
                for it in range(args.iters):
                    np.copyto(x, pristine)
                    t0 = now()
                    call()
                    out[it] = now() - t0
                wrong[i] += exact.count_wrong(x, expected)
        gathered = world.gather(samples, root=0)
        world.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
        if not root:
            continue
        assert gathered is not None  # the root's
        allr = np.stack(gathered)  # rank, kind, repeat, iter
        entry = {"bytes": count * dtype.itemsize, "libs": {}}
        mpi_median = None
        if "mpi" in kinds:
            mpi_median = float(np.median(allr[:, kinds.index("mpi")])) / 1e3
        for i, kind in enumerate(kinds):
            us = allr[:, i].reshape(-1) / 1e3
            q = {p: float(np.percentile(us, p)) for p in (10, 50, 90, 99)}
            entry["libs"][LABELS[kind]] = {
                "median_us": q[50],
                "p10_us": q[10],
                "p90_us": q[90],
                "p99_us": q[99],
                "batch_median_us": [float(np.median(allr[:, i, r])) / 1e3 for r in range(args.repeats)],
                "wrong": int(wrong[i]),
            }
            table.row(
                [
                    entry["bytes"],
                    LABELS[kind],
                    q[50],
                    q[10],
                    q[90],
                    q[99],
                    q[50] / mpi_median if mpi_median else None,
                    int(wrong[i]),
                ]
            )
        results.append(entry)
    bar.finish()

    if comm is not None:
        comm.destroy()
    load_end = common.loadavg()
    total_wrong = 0
    if root:
        total_wrong = sum(v["wrong"] for e in results for v in e["libs"].values())
        print(f"# load average (1, 5, 15 min) at start {load_start}, at end {load_end}")
        if args.json:
            common.write_json(
                args.json,
                {
                    "benchmark": "latency",
                    "argv": sys.argv,
                    "ranks": n,
                    "dtype": "float32",
                    "op": "sum",
                    "iters": args.iters,
                    "repeats": args.repeats,
                    "warmup": args.warmup,
                    "contenders": [LABELS[k] for k in kinds],
                    **common.provenance(load_start, load_end),
                    "results": results,
                },
            )
    return common.verdict(world, total_wrong)
