"""All-gather, reduce-scatter, broadcast and all-to-all time and bus bandwidth of hvd_lite
against MPI's own collective (mpi4py), in one run.

Run under mpirun; rank 0 prints. For each size from -b to -e (times -f), as nccl-tests:

  size    allgather: the gathered result; reducescatter: the whole input (n blocks);
          broadcast: the buffer; alltoall: one rank's input (n blocks, one per rank)
  time    median over --repeats of one batch's seconds per call; a batch is -n
          back-to-back calls after a barrier, and its time is the slowest rank's
  algbw   size / time
  busbw   algbw * (n-1)/n for allgather, reducescatter and alltoall, algbw for
          broadcast
  #wrong  result elements whose bits differ from the exact answer, summed over
          ranks and over one check per repeat

hvd_lite and MPI (`Allgather`, `Reduce_scatter_block`, `Bcast` from rank 0,
`Alltoall`) alternate batch by batch; the ratio column compares their medians
(busbw ratio = hvd_lite busbw / MPI busbw). By default each times the C API
(`_core.Comm`, preallocated buffers, the algorithm its selector picks). With
--api numpy, all-to-all and all-gather time the public `hvd.alltoall(array)`
(even splits) and `hvd.allgather(array)` with a fixed name, through the engine,
which exchanges the counts and allocates each output.
"""

import argparse
import math
import sys
from typing import Callable, List

import numpy as np

from . import common, progress

BUSBW = {
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "alltoall": lambda n: (n - 1) / n,
}

# The hvd_lite entry point each collective is timed through (--api).
APIS = {"allgather": "core", "reducescatter": "core", "broadcast": "core", "alltoall": "core"}
# alltoall and allgather can also be timed through the engine (--api numpy): hvd.alltoall,
# hvd.allgather, a new array per call.
EXTRA_APIS = {"alltoall": ("numpy",), "allgather": ("numpy",)}
API_HELP = {
    "core": "the C binding on preallocated buffers",
    "numpy": "the public hvd.* call through the engine",
}


def add_arguments(p: argparse.ArgumentParser, api: str = "core", name: str = "") -> None:
    """The options (nccl-tests' letters where they exist)."""
    p.add_argument(
        "-b",
        "--minbytes",
        type=common.parse_size,
        default=common.parse_size("1K"),
        help="smallest size in bytes (default 1K)",
    )
    p.add_argument(
        "-e",
        "--maxbytes",
        type=common.parse_size,
        default=common.parse_size("64M"),
        help="largest size in bytes (default 64M)",
    )
    p.add_argument(
        "-f",
        "--stepfactor",
        type=float,
        default=2.0,
        help="multiply the size by this much each step (default 2)",
    )
    p.add_argument(
        "-n",
        "--iters",
        type=int,
        default=0,
        help="calls per timed batch; 0 (default) picks per size (about --batch-time)",
    )
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed calls before each size")
    p.add_argument(
        "-d", "--dtype", default="float32", help=f"element type: {', '.join(common.DTYPES)} (default float32)"
    )
    p.add_argument("--repeats", type=int, default=10, help="batches of each per size (default 10)")
    p.add_argument(
        "--batch-time", type=float, default=0.02, help="target seconds per batch when -n is 0 (default 0.02)"
    )
    p.add_argument("--max-iters", type=int, default=20000, help="most calls per batch")
    choices = (api,) + EXTRA_APIS.get(name, ())
    p.add_argument(
        "--api",
        choices=choices,
        default=api,
        help="hvd_lite entry point timed: "
        + "; ".join(f"'{a}', {API_HELP[a]}" for a in choices)
        + f" (default {api})",
    )
    p.add_argument("--json", metavar="FILE", help="write every repeat's times to FILE")
    progress.add_argument(p)


def _inputs(dtype, count: int, rank: int) -> np.ndarray:
    """Small integers (exact in every dtype, and in sums over a few ranks)."""
    return ((np.arange(count) + 3 * rank) % 5).astype(dtype)


class _Case:
    """One collective at one size: both libraries' calls and how to check their results."""

    def __init__(self, name, comm, world, MPI, dtype, nbytes, code, api="core"):
        n, r = world.Get_size(), world.Get_rank()
        esize = dtype.itemsize
        self.engine_output = name in ("alltoall", "allgather") and api == "numpy"  # a new array
        self.hvd_out = None  # that array, from the last call
        import hvd_lite as hvd

        if name == "alltoall":
            count = max(nbytes // (esize * n), 1)
            self.send = _inputs(dtype, n * count, r)
            self.recv = np.zeros(n * count, dtype)
            # Block r of every rank's input, in rank order.
            self.want = np.concatenate(
                [_inputs(dtype, n * count, q)[r * count : (r + 1) * count] for q in range(n)]
            )
            send, tag, recv = self.send, f"bench.alltoall.{count}", self.recv

            def hvd_call():
                self.hvd_out = hvd.alltoall(send, name=tag)

            self.hvd = hvd_call if api == "numpy" else (lambda: comm.alltoall(send, recv, code))
            self.mpi = lambda: world.Alltoall(send, self.recv)
            self.bytes = n * count * esize
        elif name == "broadcast":
            count = nbytes // esize
            self.send = _inputs(dtype, count, r)
            self.recv = np.zeros(count, dtype)
            self.want = _inputs(dtype, count, 0)
            send, recv = self.send, self.recv
            self.hvd = lambda: comm.broadcast(send, recv, code, 0)
            buf = self.recv
            # MPI broadcasts in place: the root's buffer must hold its input.

            def mpi():
                if r == 0:
                    np.copyto(buf, send)
                world.Bcast(buf, root=0)

            self.mpi = mpi
            self.bytes = count * esize
        elif name == "allgather":
            count = max(nbytes // (esize * n), 1)
            self.send = _inputs(dtype, count, r)
            self.recv = np.zeros(n * count, dtype)
            self.want = np.concatenate([_inputs(dtype, count, q) for q in range(n)])
            send, recv, tag = self.send, self.recv, f"bench.allgather.{count}"

            def hvd_allgather():
                self.hvd_out = hvd.allgather(send, name=tag)

            self.hvd = hvd_allgather if api == "numpy" else (lambda: comm.allgather(send, recv, code))
            self.mpi = lambda: world.Allgather(send, recv)
            self.bytes = n * count * esize
        else:
            count = max(nbytes // (esize * n), 1)
            self.send = _inputs(dtype, n * count, r)
            self.recv = np.zeros(count, dtype)
            total = sum(_inputs(np.int64, n * count, q) for q in range(n))
            self.want = total[r * count : (r + 1) * count].astype(dtype)
            send, recv = self.send, self.recv
            self.hvd = lambda: comm.reducescatter(send, recv, code, 0)
            self.mpi = lambda: world.Reduce_scatter_block(send, recv, op=MPI.SUM)
            self.bytes = n * count * esize

    def reset(self) -> None:
        """Clears every output, so that a check sees only what the next batch wrote."""
        self.recv[...] = 0
        self.hvd_out = None

    def wrong(self, lib: int) -> int:
        """Wrong elements in the output of contender lib (0 hvd_lite, 1 MPI)."""
        out = self.recv
        if lib == 0 and self.engine_output:
            out = self.hvd_out
            if out is None or out.shape != self.want.shape:
                return int(self.want.size)
        bits = np.dtype(f"u{out.dtype.itemsize}")
        return int(np.count_nonzero(out.view(bits) != self.want.view(bits)))


def _pick_iters(args, calls: List[Callable], world, MPI) -> int:
    for call in calls:
        for _ in range(args.warmup):
            call()
    if args.iters > 0:
        return args.iters
    probe, n = np.zeros(1), 1
    while True:
        probe[0] = max(common.time_batch(c, n, world.Barrier) for c in calls)
        world.Allreduce(MPI.IN_PLACE, probe, op=MPI.MAX)
        if probe[0] * n >= 0.002 or n >= args.max_iters:
            break
        n *= 4
    return int(min(args.max_iters, max(1, math.ceil(args.batch_time / max(probe[0], 1e-9)))))


def run(name: str, args) -> int:
    """Runs one collective's benchmark; rank 0 prints and writes --json."""
    import hvd_lite as hvd
    from hvd_lite import basics
    from hvd_lite import ops as hops

    hvd.init()
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    n, root = world.Get_size(), world.Get_rank() == 0
    dtype = common.dtype_from_name(args.dtype)
    code = hops.HVDL_DTYPES[dtype]
    sizes = common.size_range(args.minbytes, args.maxbytes, args.stepfactor)
    comm = basics._core.Comm()
    mpi_ok = True
    try:
        _Case(name, comm, world, MPI, dtype, n * dtype.itemsize, code, args.api).mpi()
    except Exception:  # noqa: BLE001 - no MPI baseline for this dtype
        mpi_ok = False
    labels = ["hvd_lite"] + (["MPI"] if mpi_ok else [])
    cols = [("size(B)", 10, "{}")]
    for _ in labels:
        cols += [
            ("time(us)", 10, "{:.2f}"),
            ("algbw", 7, "{:.3f}"),
            ("busbw", 7, "{:.3f}"),
            ("#wrong", 6, "{}"),
        ]
    if mpi_ok:
        cols += [("busbw", 6, "{:.2f}")]
    table = common.Table(cols)
    factor = BUSBW[name](n)
    if root:
        print(
            f"# hvd_lite.bench {name}: {n} ranks, {common.dtype_name(dtype)}, api {args.api}; "
            f"busbw = algbw * {factor:.3f}; MPI: {'mpi4py' if mpi_ok else 'n/a for this dtype'}"
        )
        print("# time in us, algbw and busbw in GB/s; last column: hvd_lite busbw / MPI busbw")
        table.header([("", 1)] + [(lb, 4) for lb in labels] + ([("ratio", 1)] if mpi_ok else []))
    load_start = common.loadavg()
    results = []
    bar = progress.Progress(f"bench {name}", len(sizes), root and not args.quiet)
    for nbytes in sizes:
        bar.point(common.format_size(nbytes))
        case = _Case(name, comm, world, MPI, dtype, nbytes, code, args.api)
        calls = [case.hvd] + ([case.mpi] if mpi_ok else [])
        iters = _pick_iters(args, calls, world, MPI)
        times = np.zeros((args.repeats, len(calls)))
        wrong = np.zeros(len(calls), dtype=np.int64)
        for rep in range(args.repeats):
            for k in range(len(calls)):
                i = (k + rep) % len(calls)
                case.reset()
                times[rep, i] = common.time_batch(calls[i], iters, world.Barrier)
                wrong[i] += case.wrong(i)
        world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        world.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
        if not root:
            continue
        row: List[object] = [case.bytes]
        entry = {"bytes": case.bytes, "iters": iters, "libs": {}}
        for i, label in enumerate(labels):
            t = common.median(times[:, i].tolist())
            alg = common.gbps(case.bytes, t)
            entry["libs"][label] = {
                "times_s": times[:, i].tolist(),
                "median_s": t,
                "algbw_GBps": alg,
                "busbw_GBps": alg * factor,
                "wrong": int(wrong[i]),
            }
            row += [t * 1e6, alg, alg * factor, int(wrong[i])]
        if mpi_ok:
            row.append(entry["libs"]["MPI"]["median_s"] / entry["libs"]["hvd_lite"]["median_s"])
        table.row(row)
        results.append(entry)
    bar.finish()
    comm.destroy()
    load_end = common.loadavg()
    if root:
        print(f"# load average (1, 5, 15 min) at start {load_start}, at end {load_end}")
    total_wrong = sum(v["wrong"] for e in results for v in e["libs"].values()) if root else 0
    if root and args.json:
        common.write_json(
            args.json,
            {
                "benchmark": name,
                "argv": sys.argv,
                "ranks": n,
                "dtype": common.dtype_name(dtype),
                "busbw_factor": factor,
                "contenders": labels,
                "api": args.api,
                **common.provenance(load_start, load_end),
                "results": results,
            },
        )
    return common.verdict(world, total_wrong)


class Command:
    """One subcommand of `python -m hvd_lite.bench` for one collective."""

    def __init__(self, name: str):
        self.name = name
        where = "C API" if APIS[name] == "core" else "public API, through the engine,"
        if name in EXTRA_APIS:
            where += " (or, with --api numpy, its public API through the engine)"
        self.__doc__ = f"{name.capitalize()} of hvd_lite's {where} against MPI's (mpi4py).\n\n" + __doc__

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_arguments(p, APIS[self.name], self.name)

    def main(self, args) -> int:
        return run(self.name, args)
