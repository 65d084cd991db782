"""All-reduce time and bus bandwidth of hvd_lite against MPI_Allreduce, in one run.

Run under mpirun; rank 0 prints. For each size from -b to -e (times -f):

  time    median over --repeats of one batch's seconds per call; a batch is -n
          back-to-back calls after a barrier, and its time is the slowest rank's
  algbw   bytes / time                     (bytes = the buffer of one rank)
  busbw   algbw * 2(n-1)/n                 (what each rank's links carry, as nccl-tests)
  #wrong  result elements whose bits differ from the exact answer, summed over
          ranks and over one check per repeat (inputs are small integers times
          powers of two, so every order of reduction gives the same answer)

hvd_lite and MPI_Allreduce (mpi4py, `Comm.Allreduce` on numpy buffers) alternate
batch by batch, so that machine noise falls on both; the ratio columns compare
their medians (busbw ratio = hvd_lite busbw / MPI busbw; time ratio = hvd_lite
time / MPI time).

--sweep VAR=V1,V2,... times one hvd_lite communicator per value of an
HVD_LITE_* knob (read when a communicator is made), all interleaved with each
other and with MPI, e.g. --sweep HVD_LITE_SEGMENT_BYTES=64K,256K,1M.

-o adasum times hvd_lite's Adasum against hvd_lite's own Average all-reduce of the
same buffer (MPI has no Adasum): the ratio columns compare the two. Every rank
gives the same input, which Adasum gives back bit for bit (identical vectors are
averaged), so #wrong still checks every element. HVD_LITE_ALLREDUCE_ALGO=rab makes
the Average take Adasum's message schedule (recursive halving and doubling).
"""

import argparse
import math
import os
import sys
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from . import common, exact, progress

KNOBS = ("HVD_LITE_SEGMENT_BYTES", "HVD_LITE_SMALL_ALLREDUCE_BYTES", "HVD_LITE_SHM_STAND_IN_BYTES")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The allreduce options (nccl-tests' letters where they exist)."""
    p.add_argument(
        "-b",
        "--minbytes",
        type=common.parse_size,
        default=common.parse_size("4"),
        help="smallest size in bytes per rank (4, 64K, 1M...; default 4)",
    )
    p.add_argument(
        "-e",
        "--maxbytes",
        type=common.parse_size,
        default=common.parse_size("64M"),
        help="largest size in bytes per rank (default 64M)",
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
        help="calls per timed batch; 0 (default) picks per size so that a batch lasts about --batch-time",
    )
    p.add_argument(
        "-w",
        "--warmup",
        type=int,
        default=5,
        help="untimed calls of each library before each size (default 5)",
    )
    p.add_argument(
        "-d", "--dtype", default="float32", help=f"element type: {', '.join(common.DTYPES)} (default float32)"
    )
    p.add_argument(
        "-o",
        "--op",
        default="sum",
        choices=common.OPS + ("adasum",),
        help="reduction (default sum; MPI has no avg and runs sum for it; adasum is timed "
        "against hvd_lite's avg)",
    )
    p.add_argument("--inplace", action="store_true", help="reduce in place (recvbuf = sendbuf)")
    p.add_argument(
        "--repeats",
        type=int,
        default=10,
        help="batches of each library per size; medians are reported (default 10)",
    )
    p.add_argument(
        "--batch-time", type=float, default=0.02, help="target seconds per batch when -n is 0 (default 0.02)"
    )
    p.add_argument(
        "--max-iters", type=int, default=20000, help="most calls per batch when -n is 0 (default 20000)"
    )
    p.add_argument(
        "--api",
        choices=("core", "numpy"),
        default="core",
        help="hvd_lite entry point timed: 'core' (default) the C binding on "
        "preallocated buffers, as MPI is timed; 'numpy' hvd.allreduce_ "
        "(--inplace) or hvd.allreduce (allocates its result each call)",
    )
    p.add_argument(
        "--shared",
        action="store_true",
        help="both libraries' buffers from hvd_lite.empty (the C API's hvdlMemAlloc), "
        "which the peers on a host reach directly, not numpy.empty",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the buffers are: 'cpu' (default) host memory against MPI; 'cuda' "
        "CuPy arrays against the naive copy-to-host way and the copy bounds "
        "(a GPU machine; see bench/cuda.py)",
    )
    p.add_argument(
        "--sweep",
        metavar="VAR=V1,V2,...",
        help="time one hvd_lite communicator per value of an HVD_LITE_* knob",
    )
    p.add_argument("--json", metavar="FILE", help="write every repeat's times to FILE")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw busbw against size (needs matplotlib: pip install hvd_lite[plot])",
    )
    progress.add_argument(p)


class Contender:
    """One library being timed: its call, where its result lands, and its expected bits."""

    def __init__(self, label: str, kind: str, expected: np.ndarray):
        self.label = label
        self.kind = kind  # "hvd", "mpi", or "base" (hvd_lite's Average beside its Adasum)
        self.expected = expected  # periodic pattern of the right answer
        self.call: Callable[[], object] = lambda: None
        self.result: Callable[[], np.ndarray] = lambda: np.empty(0)


def _parse_sweep(text: str):
    var, sep, values = text.partition("=")
    var = var.strip()
    if not sep or var not in KNOBS or not values:
        raise SystemExit(f"--sweep {text!r}: expected VAR=V1,V2,... with VAR one of {', '.join(KNOBS)}")
    return var, [common.parse_size(v) for v in values.split(",")]


def _knob_label(var: str, value: int) -> str:
    short = {
        "HVD_LITE_SEGMENT_BYTES": "seg",
        "HVD_LITE_SMALL_ALLREDUCE_BYTES": "small",
        "HVD_LITE_SHM_STAND_IN_BYTES": "stand-in",
    }[var]
    return f"hvd {short}={common.format_size(value)}"


def _make_comms(sweep) -> List[tuple]:
    """(label, core communicator, owned) for each hvd_lite contender."""
    from hvd_lite import basics

    if sweep is None:
        return [("hvd_lite", basics._core.Comm(), True)]
    var, values = sweep
    saved = os.environ.get(var)
    comms = []
    try:
        for value in values:
            os.environ[var] = str(value)  # read by the C core when the communicator is made
            comms.append((_knob_label(var, value), basics._core.Comm(), True))
    finally:
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved
    return comms


def _mpi_op(MPI, op: str):
    return {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]


def _mpi_supports(world, MPI, dtype: np.dtype, op) -> Optional[str]:
    """None if MPI can reduce this dtype through mpi4py, else why not (same on every rank)."""
    a, b = np.zeros(1, dtype), np.zeros(1, dtype)
    try:
        world.Allreduce(a, b, op=op)
    except Exception as exc:  # noqa: BLE001 - any failure means: no MPI baseline
        return f"{type(exc).__name__}: {exc}"
    return None


def _bind(c: Contender, args, comm, world, MPI, send: np.ndarray, recv: np.ndarray) -> None:
    """Points c.call and c.result at this size's buffers (built outside the timed loop)."""
    import hvd_lite as hvd
    from hvd_lite import ops as hops

    if c.kind == "mpi":
        op = _mpi_op(MPI, args.op)
        if args.inplace:
            c.call = lambda: world.Allreduce(MPI.IN_PLACE, recv, op=op)
        else:
            c.call = lambda: world.Allreduce(send, recv, op=op)
        c.result = lambda: recv
        return
    hops_by_name = {"sum": hvd.Sum, "avg": hvd.Average, "prod": hvd.Product, "max": hvd.Max, "min": hvd.Min}
    hop = hvd.Average if c.kind == "base" else {**hops_by_name, "adasum": hvd.Adasum}[args.op]
    if args.api == "numpy":
        if args.inplace:
            c.call = lambda: hvd.allreduce_(recv, op=hop)
            c.result = lambda: recv
        else:
            box = [recv]

            def call():
                box[0] = hvd.allreduce(send, op=hop)

            c.call = call
            c.result = lambda: box[0]
        return
    code = hops.HVDL_DTYPES[send.dtype]
    cop = hops.HVDL_OPS[hop]
    sb, rb = send.view(np.uint8), recv.view(np.uint8)
    if args.inplace:
        c.call = lambda: comm.allreduce(rb, rb, code, cop)
    else:
        c.call = lambda: comm.allreduce(sb, rb, code, cop)
    c.result = lambda: recv


def _check(c: Contender, inplace: bool, send: np.ndarray, recv: np.ndarray) -> int:
    """Wrong elements of c's result (in place: restore the input and run once more)."""
    if inplace:
        np.copyto(recv, send)
        c.call()
    return exact.count_wrong(c.result(), c.expected)


def _pick_iters(args, contenders, world, MPI) -> int:
    """Warms up, then returns the calls per batch: -n, or enough for --batch-time.

    The per-call time is probed with batches of 1, 4, 16... calls until one lasts
    2 ms, each probe agreed across ranks (max), so every rank picks the same count.
    """
    for c in contenders:
        for _ in range(args.warmup):
            c.call()
    if args.iters > 0:
        return args.iters
    probe, n = np.zeros(1), 1
    while True:
        probe[0] = max(common.time_batch(c.call, n, world.Barrier) for c in contenders)
        world.Allreduce(MPI.IN_PLACE, probe, op=MPI.MAX)
        if probe[0] * n >= 0.002 or n >= args.max_iters:
            break
        n *= 4
    return int(min(args.max_iters, max(1, math.ceil(args.batch_time / max(probe[0], 1e-9)))))


def _columns(contenders, compact: bool):
    cols = [("size(B)", 10, "{}"), ("count", 10, "{}")]
    groups = [("", 2)]
    for c in contenders:
        if compact:
            cols += [("time(us)", 9, "{:.2f}"), ("busbw", 7, "{:.3f}")]
            groups.append((c.label, 2))
        else:
            cols += [
                ("time(us)", 10, "{:.2f}"),
                ("algbw", 7, "{:.3f}"),
                ("busbw", 7, "{:.3f}"),
                ("#wrong", 6, "{}"),
            ]
            groups.append((c.label, 4))
    hvds = [c for c in contenders if c.kind == "hvd"]
    mpi = any(c.kind in ("mpi", "base") for c in contenders)
    if compact:
        cols.append(("#wrong", 6, "{}"))
        groups.append(("", 1))
    if mpi:
        for c in hvds:
            cols += [("busbw", 6, "{:.2f}"), ("time", 6, "{:.2f}")]
            groups.append(("ratio" if len(hvds) == 1 else c.label.replace("hvd ", ""), 2))
    return cols, groups


def main(args) -> int:
    """Runs the all-reduce benchmark; rank 0 prints and writes --json/--plot."""
    if args.device == "cuda":
        if args.op == "adasum":
            raise SystemExit("-o adasum takes host memory only (Adasum has no device form)")
        if args.sweep or args.json or args.plot or args.api != "core" or args.inplace or args.shared:
            raise SystemExit(
                "--device cuda takes the sizes, -d, -o, -n, -w, --repeats, --batch-time and --max-iters only"
            )
        from . import cuda

        return cuda.main(args)
    import hvd_lite as hvd

    hvd.init()
    import mpi4py
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    root = rank == 0
    dtype = common.dtype_from_name(args.dtype)
    sizes = [
        s for s in common.size_range(args.minbytes, args.maxbytes, args.stepfactor) if s >= dtype.itemsize
    ]
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    sweep = _parse_sweep(args.sweep) if args.sweep else None
    if sweep and args.api == "numpy":
        raise SystemExit("--sweep times the C binding; use it without --api numpy")

    adasum = args.op == "adasum"
    if adasum and dtype.kind != "f" and common.dtype_name(dtype) != "bfloat16":
        raise SystemExit(f"-o adasum takes a float type, not {common.dtype_name(dtype)}")
    maxcount = max(sizes) // dtype.itemsize
    alloc = hvd.empty if args.shared else np.empty
    send = alloc(maxcount, dtype)
    recv = alloc(maxcount, dtype)
    pattern = exact.rank_pattern(
        dtype, "sum" if args.op in ("avg", "adasum") else args.op, 0 if adasum else rank
    )
    exact.fill(send, pattern)
    recv[:] = 0  # touch every page before timing

    hvd_expected = pattern if adasum else exact.expected_pattern(dtype, args.op, n)
    contenders = []
    comms = _make_comms(sweep)
    for label, _, _ in comms:
        contenders.append(Contender(label + (" adasum" if adasum else ""), "hvd", hvd_expected))
    if adasum:  # the same input on every rank: its average is itself too
        contenders.append(Contender("hvd_lite avg", "base", pattern))
        comms.append(("hvd_lite avg", comms[0][1], False))
    mpi_why = "MPI has no Adasum" if adasum else _mpi_supports(world, MPI, dtype, _mpi_op(MPI, args.op))
    if mpi_why is None:
        mpi_label = "MPI_Allreduce" + (" (sum)" if args.op == "avg" else "")
        contenders.append(
            Contender(
                mpi_label, "mpi", exact.expected_pattern(dtype, "sum" if args.op == "avg" else args.op, n)
            )
        )
    hvd_comm_of = {c.label: comm for c, (_, comm, _) in zip(contenders, comms)}

    info = hvd.build_info()
    knobs = {k: os.environ.get(k, "default") for k in KNOBS}
    compact = len(contenders) > 2
    cols, groups = _columns(contenders, compact)
    table = common.Table(cols)
    if root:
        print(
            f"# hvd_lite.bench allreduce: {n} ranks, {common.dtype_name(dtype)} {args.op}, "
            f"{'in place' if args.inplace else 'out of place'}, api {args.api}"
            + (", buffers from hvd_lite.empty" if args.shared else "")
        )
        print(
            f"# hvd_lite {hvd.__version__} built against {info.get('mpi_header', '?')}; "
            f"runtime {info['mpi_runtime'].splitlines()[0] if info['mpi_runtime'] else '?'}; "
            f"mpi4py {mpi4py.__version__}"
        )
        print(
            "# knobs: "
            + ", ".join(f"{k}={v}" for k, v in knobs.items())
            + (f"; sweep {sweep[0]}" if sweep else "")
        )
        if mpi_why:
            print(f"# no MPI baseline for {common.dtype_name(dtype)}: {mpi_why}")
        print(
            f"# per size: {args.warmup} warm-up calls of each, then {args.repeats} repeats of "
            "one batch of each (order rotating); batch time = slowest rank; medians shown"
        )
        print("# time in us, algbw and busbw in GB/s (1e9 B/s); #wrong summed over ranks and repeats")
        table.header(groups)

    load_start = common.loadavg()
    results = []
    bar = progress.Progress("bench allreduce", len(sizes), root and not args.quiet)
    for nbytes in sizes:
        bar.point(common.format_size(nbytes))
        count = nbytes // dtype.itemsize
        s, r = send[:count], recv[:count]
        for c in contenders:
            _bind(c, args, hvd_comm_of.get(c.label), world, MPI, s, r)
        iters = _pick_iters(args, contenders, world, MPI)
        times = np.zeros((args.repeats, len(contenders)))
        wrong = np.zeros(len(contenders), dtype=np.int64)
        for rep in range(args.repeats):
            for k in range(len(contenders)):
                i = (k + rep) % len(contenders)
                times[rep, i] = common.time_batch(contenders[i].call, iters, world.Barrier)
                wrong[i] += _check(contenders[i], args.inplace, s, r)
        world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        world.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
        if not root:
            continue
        entry: Dict[str, Any] = {"bytes": count * dtype.itemsize, "count": count, "iters": iters, "libs": {}}
        row: List[object] = [entry["bytes"], count]
        for i, c in enumerate(contenders):
            t = common.median(times[:, i].tolist())
            alg = common.gbps(entry["bytes"], t)
            bus = alg * 2 * (n - 1) / n
            entry["libs"][c.label] = {
                "kind": c.kind,
                "times_s": times[:, i].tolist(),
                "median_s": t,
                "algbw_GBps": alg,
                "busbw_GBps": bus,
                "wrong": int(wrong[i]),
            }
            row += [t * 1e6, bus] if compact else [t * 1e6, alg, bus, int(wrong[i])]
        if compact:
            row.append(int(wrong.sum()))
        mpi = [v for v in entry["libs"].values() if v["kind"] in ("mpi", "base")]
        for c in contenders:
            if c.kind == "hvd" and mpi:
                h = entry["libs"][c.label]
                row += [mpi[0]["median_s"] / h["median_s"], h["median_s"] / mpi[0]["median_s"]]
        table.row(row)
        results.append(entry)
    bar.finish()

    for _, comm, owned in comms:
        if owned:
            comm.destroy()
    total_wrong = 0
    if root:
        total_wrong = sum(v["wrong"] for e in results for v in e["libs"].values())
        record = {
            "benchmark": "allreduce",
            "argv": sys.argv,
            "ranks": n,
            "dtype": common.dtype_name(dtype),
            "op": args.op,
            "inplace": args.inplace,
            "api": args.api,
            "shared": args.shared,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "knobs": knobs,
            "sweep": {"var": sweep[0], "values": sweep[1]} if sweep else None,
            "contenders": [c.label for c in contenders],
            "mpi_baseline": mpi_why is None,
            **common.provenance(load_start, common.loadavg()),
            "results": results,
        }
        if args.json:
            common.write_json(args.json, record)
        if args.plot:
            from . import plot

            plot.busbw_vs_size(record, args.plot)
        print(f"# load average (1, 5, 15 min) at start {load_start}, at end {common.loadavg()}")
    return common.verdict(world, total_wrong)
