"""The cost model's terms, measured on this machine (and across hosts when the job spans them) and
written as a cost-model file.

Run under mpirun with at least 2 ranks; rank 0 prints and writes --out. Within a host (ranks 0 and 1
on one): ranks 0 and 1 ping-pong messages of --sizes bytes (mpi4py Send/Recv on the world
communicator, the MPI transport hvd_lite's messages take between ranks of a host); the one-way time,
half the round trip of the quickest of --repeats batches (the least disturbed, as the measurement at
init takes), is fitted as alpha + bytes * beta through the smallest and the largest size (the others are
printed, to show how well a line fits). Where that line is implausible (the largest message no slower
than the smallest: a busy machine took the core from a batch of each), up to FIT_SERIES series run, each
size keeping its quickest batch of them all, and then bench fit says so and exits non-zero rather than
write a file with such terms. gamma is the C core's float32 sum
kernel (dst = a op b) on --gamma-bytes per operand, seconds per operand byte, the median of
--repeats. Across hosts (the ranks on more than one, emulated ones of HVD_LITE_RANKS_PER_HOST
included): the measurement every communicator spanning hosts makes at init
(csrc/select/select_measure.c: a ping-pong between rank 0 and a rank on another host, the latency
as a step function of the size), written as inter_alpha, inter_beta and inter_alpha_step lines,
so that a job that names the file skips that measurement (where it fails, bench fit says why and
exits non-zero rather than write a file without them). --inter-alpha and --inter-beta, if given,
are written instead; on one host the file leaves the terms across hosts to the measurement at init
or the defaults (csrc/base/config.c).

    mpirun -np 2 python -m hvd_lite.bench fit --out cost_model.conf
    HVD_LITE_COST_MODEL_FILE=cost_model.conf mpirun -np 2 python train.py
"""

import argparse
import os
import socket
import time
from typing import List

import numpy as np

from . import common, progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The fit options."""
    p.add_argument("--out", metavar="FILE", required=True, help="the cost-model file to write")
    p.add_argument(
        "--sizes",
        default="8,1K,64K,1M,4M",
        help="ping-pong message sizes, comma-separated (default 8,1K,64K,1M,4M)",
    )
    p.add_argument("-n", "--iters", type=int, default=50, help="round trips per batch (default 50)")
    p.add_argument(
        "--repeats",
        type=int,
        default=7,
        help="batches per size (the ping-pong keeps the quickest, the kernel the median; default 7)",
    )
    p.add_argument(
        "--gamma-bytes",
        type=common.parse_size,
        default=4 << 20,
        help="bytes per operand for the reduction kernel (default 4M)",
    )
    p.add_argument("--inter-alpha", type=float, help="seconds: written as inter_alpha if given")
    p.add_argument("--inter-beta", type=float, help="seconds per byte: written as inter_beta")
    p.add_argument("--json", metavar="FILE", help="write the measurements to FILE")
    progress.add_argument(p)


def _pingpong(world, nbytes: int, iters: int) -> float:
    """One batch: seconds per one-way trip between ranks 0 and 1 (the other ranks wait)."""
    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    rank = world.Get_rank()
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        if rank == 0:
            world.Send(buf, dest=1, tag=7)
            world.Recv(buf, source=1, tag=7)
        elif rank == 1:
            world.Recv(buf, source=0, tag=7)
            world.Send(buf, dest=0, tag=7)
    return (time.perf_counter() - t0) / (2 * iters)


# Series of ping-pongs within a host, at most, where the line through them is implausible. On 2 cores
# beside MPICH's tests, one series' median batches gave an 8 B message 4 ms and a line with beta 0.
FIT_SERIES = 3


def fit_line(sizes: List[int], times: List[float]) -> tuple:
    """(alpha, beta) of times = alpha + sizes * beta through the smallest and the largest size
    (Hockney's two points: a least-squares line is ruled by the large messages' noise, which
    can swamp a microsecond alpha); each clamped at 0."""
    lo, hi = sizes.index(min(sizes)), sizes.index(max(sizes))
    beta = max((times[hi] - times[lo]) / (sizes[hi] - sizes[lo]), 0.0)
    return max(times[lo] - sizes[lo] * beta, 0.0), beta


def _across_hosts(core) -> dict:
    """The cost model a communicator agrees on at init with the measurement on (its cost_model():
    the terms across hosts measured where the ranks span hosts; collective)."""
    saved = {k: os.environ.get(k) for k in ("HVD_LITE_COST_MODEL_FILE", "HVD_LITE_COST_MODEL_MEASURE")}
    os.environ.update({"HVD_LITE_COST_MODEL_FILE": "", "HVD_LITE_COST_MODEL_MEASURE": "1"})
    try:
        comm = core.Comm()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        return comm.cost_model()
    finally:
        comm.destroy()


def quickest_series(sizes: List[int], measure, agree) -> tuple:
    """Up to FIT_SERIES series of measure(nbytes, series) over sizes, each size keeping its quickest,
    until the line through them is plausible (beta > 0). agree(fitted, times) gives every rank rank 0's
    (mpi4py's bcast). Returns (this rank's times, whether they fitted, rank 0's times)."""
    one_way = [float("inf")] * len(sizes)
    fitted, times0 = False, one_way
    for series in range(FIT_SERIES):
        for i, nbytes in enumerate(sizes):
            one_way[i] = min(one_way[i], measure(nbytes, series))
        fitted, times0 = agree(fit_line(sizes, one_way)[1] > 0, list(one_way))
        if fitted:
            break
    return one_way, fitted, times0


def main(args) -> int:
    """Measures, prints the terms and (rank 0) writes --out."""
    from mpi4py import MPI

    from hvd_lite import basics
    from hvd_lite.ops import HVDL_DTYPES, HVDL_OPS, Sum

    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        raise SystemExit("bench fit: run it under mpirun with at least 2 ranks")
    hosts = world.allgather(socket.gethostname())
    sizes = [common.parse_size(s) for s in args.sizes.split(",") if s]
    if len(set(sizes)) < 2:
        raise SystemExit(f"bench fit: --sizes needs at least two different sizes, got {args.sizes}")
    within = hosts[0] == hosts[1]
    one_way: List[float] = []
    bar = progress.Progress("bench fit", len(sizes) + 2, world.Get_rank() == 0 and not args.quiet)
    if within:

        def measure(nbytes: int, series: int) -> float:
            bar.point(
                f"ping-pong {common.format_size(nbytes)}" + (f", series {series + 1}" if series else "")
            )
            _pingpong(world, nbytes, 5)  # warm-up
            return min(_pingpong(world, nbytes, args.iters) for _ in range(args.repeats))

        # rank 0's times decide, for every rank: each takes part in every series' barriers
        one_way, fitted, times0 = quickest_series(sizes, measure, lambda ok, t: world.bcast((ok, t), root=0))
        if not fitted:
            raise SystemExit(  # every rank, with rank 0's times
                f"bench fit: the ping-pong within a host fitted no line after {FIT_SERIES} series (the "
                "largest message no slower than the smallest; rank 0's one-way times "
                + ", ".join(f"{common.format_size(n)}B {t:.3g} s" for n, t in zip(sizes, times0))
                + "): run it again on a quieter machine"
            )
    core = basics._core
    bar.point("across hosts")
    model = _across_hosts(core)
    across = model if model["inter_source"] == "measured" else None
    if model["inter_measure_error"] and args.inter_alpha is None and args.inter_beta is None:
        raise SystemExit(  # every rank: the model is rank 0's
            f"bench fit: the measurement across hosts failed ({model['inter_measure_error']}); "
            "run it again on a quieter machine, or give --inter-alpha and --inter-beta"
        )
    code, op = HVDL_DTYPES[np.dtype(np.float32)], HVDL_OPS[Sum]
    bar.point(f"reduction kernel {common.format_size(args.gamma_bytes)}")
    core.kernel_bench(code, op, args.gamma_bytes, 2)
    kernel = common.median([core.kernel_bench(code, op, args.gamma_bytes, 5)[0] for _ in range(args.repeats)])
    bar.finish()
    gamma = kernel / args.gamma_bytes
    if world.Get_rank() != 0:
        return 0
    terms = {}
    if within:
        terms["intra_alpha"], terms["intra_beta"] = fit_line(sizes, one_way)
    terms["gamma"] = gamma
    steps = []
    if across is not None and args.inter_alpha is None and args.inter_beta is None:
        terms["inter_alpha"], terms["inter_beta"] = across["inter_alpha"], across["inter_beta"]
        steps = across["inter_alpha_steps"]
    if args.inter_alpha is not None:
        terms["inter_alpha"] = args.inter_alpha
    if args.inter_beta is not None:
        terms["inter_beta"] = args.inter_beta
    for key, value in terms.items():
        if not 0 <= value <= 1:
            raise SystemExit(f"bench fit: {key} {value} is outside [0, 1] (seconds, seconds per byte)")
    lines = [
        f"# hvd_lite cost model measured by `python -m hvd_lite.bench fit` on {hosts[0]}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
        + (
            "; within a host, one-way times (s) "
            + ", ".join(f"{common.format_size(s)}B {t:.3g}" for s, t in zip(sizes, one_way))
            if within
            else f"; ranks 0 and 1 on different hosts ({hosts[0]}, {hosts[1]}): the terms within a host "
            "are the defaults"
        )
    ]
    if across is not None:
        lines.append(
            f"# across hosts: hvdlCommInitMpi's measurement ({across['measure_s'] * 1e3:.2f} ms), "
            "the latency from each inter_alpha_step's bytes up"
        )
    lines += [f"{key} {value:.6g}" for key, value in terms.items()]
    lines += [f"inter_alpha_step {int(b)} {a:.6g}" for b, a in steps]
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, args.out)
    print("\n".join(lines))
    print(f"# written to {args.out}: use it with HVD_LITE_COST_MODEL_FILE={args.out}")
    if args.json:
        common.write_json(
            args.json,
            {
                "benchmark": "fit",
                "sizes": sizes,
                "one_way_s": one_way,
                "kernel_s": kernel,
                "gamma_bytes": args.gamma_bytes,
                "terms": terms,
                "inter_alpha_steps": steps,
            },
        )
    return 0
