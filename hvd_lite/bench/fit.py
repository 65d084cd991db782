"""The cost model's terms, measured on this machine (and across hosts when the job spans them) and
written as a cost-model file.

Run under mpirun with at least 2 ranks; rank 0 prints and writes --out. Within a host (ranks 0 and 1
on one): ranks 0 and 1 ping-pong messages of --sizes bytes (mpi4py Send/Recv on the world
communicator, the MPI transport hvd_lite's messages take between ranks of a host); the one-way time,
half the median round trip, is fitted as alpha + bytes * beta through the smallest and the largest
size (the others are printed, to show how well a line fits). gamma is the C core's float32 sum
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
    p.add_argument("--repeats", type=int, default=7, help="batches per size; medians (default 7)")
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
    one_way = []
    bar = progress.Progress("bench fit", len(sizes) + 2, world.Get_rank() == 0 and not args.quiet)
    for nbytes in sizes if within else []:
        bar.point(f"ping-pong {common.format_size(nbytes)}")
        _pingpong(world, nbytes, 5)  # warm-up
        one_way.append(common.median([_pingpong(world, nbytes, args.iters) for _ in range(args.repeats)]))
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
