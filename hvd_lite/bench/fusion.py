"""Tensor fusion: one training step's gradient all-reduce of ResNet-50, hvd_lite against MPI.

Run under mpirun; rank 0 prints. A step reduces ResNet-50's 161 gradient
tensors (25,557,032 float32, 97.5 MiB per rank), generated from the
architecture (hvd_lite.bench.models) in backward order, last layer first.
The gradients are views into one flat buffer; before every step it is
refilled with the rank's exact input (untimed), as a backward pass would have
just written it. Contenders, interleaved step by step (order rotating):

  hvd_lite         hvd.allreduce_async_(grad, name="grad.<param>") for each
                   tensor in turn, then hvd.synchronize on every handle
  MPI per tensor   (a) one mpi4py Allreduce (in place) per tensor, in the same order
  MPI flat         (b) one mpi4py Allreduce (in place) of the whole flat buffer
  core per tensor  with --core: hvd_lite's C binding without the engine
                   (_core.Comm.allreduce), one call per tensor in the calling thread:
                   what the ring and the latency path alone cost for this step
  core flat        with --core: one such call on the whole flat buffer (97.5 MiB): what
                   no fusion of these tensors could beat on this host

  time     median over --steps of one step's time, from a barrier to the last
           result, the slowest rank's (p10 and p90 beside it)
  submit   hvd_lite only: the part of the step spent submitting (Python)
  ratio    median time / the faster median of (a) and (b)
  #wrong   result elements whose bits differ from the exact answer, summed over
           ranks and steps (every step is checked)

--sweep VAR=V1,V2,... adds one hvd_lite contender per value of an engine knob
(HVD_LITE_FUSION_THRESHOLD, HVD_LITE_CYCLE_TIME, ...). Engine knobs are read
at hvd.init(), so switching contender shuts the engine down and starts it
again with the knob set (collective, untimed), followed by --warmup untimed
steps so that the response cache is warm again. --sweep may be repeated.
"""

import argparse
import math
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import common, exact, models, progress

# Engine knobs --sweep accepts; byte knobs take sizes (4M), the cycle time milliseconds.
SWEEP_KNOBS = {
    "HVD_LITE_FUSION_THRESHOLD": ("fusion", True),
    "HVD_LITE_CYCLE_TIME": ("cycle", False),
    "HVD_LITE_BATCH_TIME": ("batch", False),
    "HVD_LITE_NOTIFY_TIME": ("notify", False),
    "HVD_LITE_SEGMENT_BYTES": ("seg", True),
    "HVD_LITE_SMALL_ALLREDUCE_BYTES": ("small", True),
    "HVD_LITE_CACHE_CAPACITY": ("cache", False),
    "HVD_LITE_SHM_STAND_IN_BYTES": ("stand-in", True),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The fusion options."""
    p.add_argument(
        "--steps",
        type=int,
        default=20,
        help="timed steps of each contender; medians are reported (default 20)",
    )
    p.add_argument(
        "-w",
        "--warmup",
        type=int,
        default=2,
        help="untimed steps of each contender first, and of hvd_lite after each engine restart (default 2)",
    )
    p.add_argument(
        "-o",
        "--op",
        default="sum",
        choices=("sum", "avg"),
        help="hvd_lite's reduction (default sum; MPI always runs sum)",
    )
    p.add_argument(
        "--sweep",
        metavar="VAR=V1,V2,...",
        action="append",
        default=[],
        help="one more hvd_lite contender per value of an engine knob "
        f"({', '.join(SWEEP_KNOBS)}); may be repeated",
    )
    p.add_argument(
        "--shrink",
        type=int,
        default=1,
        help="divide every tensor's element count by this (rounding up) for quick "
        "tests; 1 (default) is the real model",
    )
    p.add_argument(
        "--wait",
        choices=("in-order", "last-first"),
        default="in-order",
        help="hvd_lite: synchronize the handles in submission order (default, as "
        "Horovod's optimizer does), or the last one first, then the rest",
    )
    p.add_argument("--no-mpi", action="store_true", help="time hvd_lite contenders only")
    p.add_argument(
        "--core",
        action="store_true",
        help="also time hvd_lite's C binding without the engine, one call per tensor "
        "and one of the whole flat buffer",
    )
    p.add_argument("--json", metavar="FILE", help="write every step's times to FILE")
    progress.add_argument(p)


class Contender:
    """One way of reducing a step's gradients."""

    def __init__(self, label: str, kind: str, env: Optional[Dict[str, str]] = None):
        self.label = label
        self.kind = kind  # "hvd" or "mpi"
        self.env = env or {}  # engine knobs this hvd_lite contender runs with
        self.step: Callable[[], float] = lambda: 0.0  # runs one step; returns submit seconds


def parse_sweep(text: str) -> List[Tuple[str, Dict[str, str]]]:
    """'HVD_LITE_FUSION_THRESHOLD=0,1M' -> [(label, {var: '0'}), (label, {var: '1048576'})]."""
    var, sep, values = text.partition("=")
    var = var.strip()
    if not sep or var not in SWEEP_KNOBS or not values:
        raise SystemExit(f"--sweep {text!r}: expected VAR=V1,V2,... with VAR one of {', '.join(SWEEP_KNOBS)}")
    short, is_bytes = SWEEP_KNOBS[var]
    out = []
    for v in values.split(","):
        v = v.strip()
        if is_bytes:
            n = common.parse_size(v)
            out.append((f"hvd {short}={common.format_size(n) if n else 0}", {var: str(n)}))
        else:
            float(v)  # a number, or ValueError now rather than at init on every rank
            out.append((f"hvd {short}={v}", {var: v}))
    return out


def tensor_shapes(shrink: int) -> List[Tuple[str, Tuple[int, ...]]]:
    """ResNet-50's gradients in backward order; with shrink > 1, 1-D and shrink times smaller."""
    shapes = models.resnet50_backward()
    counts = [math.prod(s) for _, s in shapes]
    assert len(shapes) == models.RESNET50_TENSORS, len(shapes)
    assert sum(counts) == models.RESNET50_ELEMENTS, sum(counts)
    assert min(counts) == 64 and max(counts) == 2_359_296, (min(counts), max(counts))
    if shrink <= 1:
        return shapes
    return [(n, (-(-math.prod(s) // shrink),)) for n, s in shapes]


class EngineSwitch:
    """Restarts hvd_lite's engine when the next contender needs other knob values."""

    def __init__(self, hvd, step_warmup: Callable[[Contender], None]):
        self.hvd = hvd
        self.current: Optional[Dict[str, str]] = None
        self.step_warmup = step_warmup
        self.restarts = 0
        self.baseline = {v: os.environ.get(v) for v in SWEEP_KNOBS}

    def use(self, c: Contender) -> bool:
        """Makes the engine match c's knobs; True if it restarted it (and warmed c up)."""
        if c.kind != "hvd" or c.env == self.current:
            return False
        if self.current is not None:
            self.hvd.shutdown()
            self.restarts += 1
        for var, value in self.baseline.items():
            if var in c.env:
                os.environ[var] = c.env[var]
            elif value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        self.hvd.init()
        self.current = c.env
        self.step_warmup(c)
        return True


def _percentile(values: List[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main(args) -> int:
    """Runs the fusion benchmark; rank 0 prints and writes --json."""
    import hvd_lite as hvd

    hvd.init()
    import time

    import mpi4py
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    root = rank == 0
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    shapes = tensor_shapes(args.shrink)
    counts = [math.prod(s) for _, s in shapes]
    total = sum(counts)
    dtype = np.dtype(np.float32)

    flat = np.empty(total, dtype)
    pristine = np.empty(total, dtype)
    exact.fill(pristine, exact.rank_pattern(dtype, "sum", rank))
    np.copyto(flat, pristine)
    views, names, off = [], [], 0
    for (pname, shape), cnt in zip(shapes, counts):
        views.append(flat[off : off + cnt].reshape(shape))
        names.append(f"grad.{pname}")
        off += cnt

    hop = hvd.Sum if args.op == "sum" else hvd.Average
    last_first = args.wait == "last-first"

    def hvd_step() -> float:
        t0 = time.perf_counter()
        handles = [hvd.allreduce_async_(v, op=hop, name=nm) for v, nm in zip(views, names)]
        t1 = time.perf_counter()
        if last_first:
            hvd.synchronize(handles[-1])
        for h in handles:
            hvd.synchronize(h)
        return t1 - t0

    def mpi_per_tensor() -> float:
        for v in views:
            world.Allreduce(MPI.IN_PLACE, v, op=MPI.SUM)
        return 0.0

    def mpi_flat() -> float:
        world.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        return 0.0

    def core_per_tensor() -> float:
        for v in core_views:
            core.allreduce(v, v, fcode, ccode)
        return 0.0

    def core_flat() -> float:
        core.allreduce(flat_bytes, flat_bytes, fcode, ccode)
        return 0.0

    contenders = [Contender("hvd_lite", "hvd")]
    for text in args.sweep:
        contenders += [Contender(label, "hvd", env) for label, env in parse_sweep(text)]
    for c in contenders:
        c.step = hvd_step
    if not args.no_mpi:
        contenders.append(Contender("MPI per tensor", "mpi"))
        contenders[-1].step = mpi_per_tensor
        contenders.append(Contender("MPI flat", "mpi"))
        contenders[-1].step = mpi_flat
    core: Any = None  # a _core.Comm when --core asks for one (its contenders use it)
    if args.core:
        from hvd_lite import basics
        from hvd_lite import ops as hops

        core = basics._core.Comm()  # its own communicator, knobs as in the environment
        fcode, ccode = hops.HVDL_DTYPES[dtype], hops.HVDL_OPS[hvd.Sum]
        core_views = [v.reshape(-1).view(np.uint8) for v in views]
        contenders.append(Contender("core per tensor", "core"))
        contenders[-1].step = core_per_tensor
        flat_bytes = flat.view(np.uint8)
        contenders.append(Contender("core flat", "core"))
        contenders[-1].step = core_flat
    expected = {
        "hvd": exact.expected_pattern(dtype, args.op, n),
        "mpi": exact.expected_pattern(dtype, "sum", n),
        "core": exact.expected_pattern(dtype, "sum", n),
    }

    def warm(c: Contender) -> None:
        for _ in range(args.warmup):
            np.copyto(flat, pristine)
            c.step()

    switch = EngineSwitch(hvd, warm)
    switch.current = {}  # the engine started above runs with the environment as given
    if root:
        print(
            f"# hvd_lite.bench fusion: {n} ranks, ResNet-50 gradients: {len(shapes)} float32 "
            f"tensors, {total:,} elements ({total * 4 / 2**20:.1f} MiB) per rank"
            + (f" (shrunk {args.shrink}x)" if args.shrink > 1 else "")
            + f", hvd_lite op {args.op}"
        )
        print(
            f"# hvd_lite {hvd.__version__}; mpi4py {mpi4py.__version__}; knobs: "
            + ", ".join(f"{k}={os.environ.get(k, 'default')}" for k in SWEEP_KNOBS)
        )
        print(
            f"# {args.warmup} warm-up steps of each, then {args.steps} timed steps of each "
            "(order rotating); step time = slowest rank's; times in ms"
        )
    for c in contenders:
        if not switch.use(c):
            warm(c)

    load_start = common.loadavg()
    k = len(contenders)
    times = np.zeros((args.steps, k))
    submit = np.zeros((args.steps, k))
    wrong = np.zeros(k, dtype=np.int64)
    bar = progress.Progress("bench fusion", args.steps, root and not args.quiet)
    for s in range(args.steps):
        bar.point(f"step {s + 1}")
        for j in range(k):
            i = (j + s) % k
            c = contenders[i]
            switch.use(c)
            np.copyto(flat, pristine)
            world.Barrier()
            t0 = time.perf_counter()
            submit[s, i] = c.step()
            times[s, i] = time.perf_counter() - t0
            wrong[i] += exact.count_wrong(flat, expected[c.kind])
    bar.finish()
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    world.Allreduce(MPI.IN_PLACE, submit, op=MPI.MAX)
    world.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
    load_end = common.loadavg()
    if core is not None:
        core.destroy()

    total_wrong = int(wrong.sum())
    if root:
        med = {c.label: common.median(times[:, i].tolist()) for i, c in enumerate(contenders)}
        mpi_best = min((med[c.label] for c in contenders if c.kind == "mpi"), default=None)
        table = common.Table(
            [
                ("contender", 20, "{}"),
                ("time", 8, "{:.2f}"),
                ("p10", 8, "{:.2f}"),
                ("p90", 8, "{:.2f}"),
                ("submit", 7, "{:.2f}"),
                ("ratio", 6, "{:.2f}"),
                ("#wrong", 6, "{}"),
            ]
        )
        table.header()
        rows = []
        for i, c in enumerate(contenders):
            t = times[:, i].tolist()
            entry = {
                "label": c.label,
                "kind": c.kind,
                "env": c.env,
                "times_s": t,
                "submit_s": submit[:, i].tolist(),
                "median_s": med[c.label],
                "p10_s": _percentile(t, 10),
                "p90_s": _percentile(t, 90),
                "ratio_to_best_mpi": med[c.label] / mpi_best if mpi_best else None,
                "wrong": int(wrong[i]),
            }
            rows.append(entry)
            table.row(
                [
                    c.label,
                    entry["median_s"] * 1e3,
                    entry["p10_s"] * 1e3,
                    entry["p90_s"] * 1e3,
                    common.median(entry["submit_s"]) * 1e3 if c.kind == "hvd" else None,
                    entry["ratio_to_best_mpi"],
                    entry["wrong"],
                ]
            )
        print(
            f"# engine restarts: {switch.restarts}; load average (1, 5, 15 min) at start "
            f"{load_start}, at end {load_end}"
        )
        if args.json:
            common.write_json(
                args.json,
                {
                    "benchmark": "fusion",
                    "argv": sys.argv,
                    "ranks": n,
                    "model": "resnet50",
                    "tensors": len(shapes),
                    "elements": total,
                    "shrink": args.shrink,
                    "op": args.op,
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "knobs": {k2: os.environ.get(k2, "default") for k2 in SWEEP_KNOBS},
                    **common.provenance(load_start, load_end),
                    "results": rows,
                },
            )
    return common.verdict(world, total_wrong)
