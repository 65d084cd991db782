"""The all-reduce cost model against measured times: each algorithm's predicted and measured time.

Run under mpirun; rank 0 prints. For each size (-b .. -e, step -f; float32 sum, out of place), each
algorithm forced through HVD_LITE_ALLREDUCE_ALGO on its own bare communicator (_core.Comm): the cost model's
time (csrc/select/select_allreduce.c, with HVD_LITE_COST_MODEL_FILE's terms if set, or those measured at
init where the ranks span hosts; the header line says which) and the measured one
(the median of --repeats batches of -n calls, each batch's time the slowest rank's), and which algorithm the
selector picks (`auto`). `*` marks the fastest measured; a row where the pick is not the fastest is where
the model and the machine disagree; a hier_p2p pick says what it runs across hosts (rd, rab or the direct
exchange). The shared-memory path (shm) has no model term (`-`); it, hier and
hier_p2p are timed where the layout lets them run (hier: several hosts, or emulated ones with
HVD_LITE_RANKS_PER_HOST; hier_p2p: several hosts with the same number of ranks each).
"""

import argparse
import os
from typing import Dict, List

import numpy as np

from . import common, progress

ALGOS = ("ring", "rd", "rab", "tree", "small", "shm", "hier", "hier_p2p")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The model options."""
    p.add_argument(
        "-b",
        "--minbytes",
        type=common.parse_size,
        default=4 << 10,
        help="smallest size, bytes per rank (default 4K)",
    )
    p.add_argument(
        "-e", "--maxbytes", type=common.parse_size, default=16 << 20, help="largest size (default 16M)"
    )
    p.add_argument("-f", "--stepfactor", type=float, default=4, help="size step factor (default 4)")
    p.add_argument("-n", "--iters", type=int, default=20, help="calls per batch (default 20)")
    p.add_argument("--repeats", type=int, default=5, help="batches per algorithm and size (default 5)")
    p.add_argument(
        "--algo", action="append", choices=ALGOS, help="algorithms to time (may be repeated; default all)"
    )
    p.add_argument("--json", metavar="FILE", help="write the figures to FILE")
    progress.add_argument(p)


def make_comm(algo: str):
    """A bare communicator with HVD_LITE_ALLREDUCE_ALGO=algo (collective)."""
    from hvd_lite import _core

    saved = os.environ.get("HVD_LITE_ALLREDUCE_ALGO")
    os.environ["HVD_LITE_ALLREDUCE_ALGO"] = algo
    try:
        return _core.Comm()
    finally:
        if saved is None:
            del os.environ["HVD_LITE_ALLREDUCE_ALGO"]
        else:
            os.environ["HVD_LITE_ALLREDUCE_ALGO"] = saved


def main(args) -> int:
    """Runs the model benchmark; rank 0 prints and writes --json."""
    from mpi4py import MPI

    import hvd_lite as hvd

    hvd.init()
    world = MPI.COMM_WORLD
    sizes = common.size_range(args.minbytes, args.maxbytes, args.stepfactor)
    auto = make_comm("auto")
    comms = {}
    for a in args.algo or ALGOS:
        try:
            comms[a] = make_comm(a)
        except hvd.InvalidArgumentError:  # refused alike on every rank: this layout cannot run it
            if args.algo:
                raise
    algos = list(comms)
    rows: List[Dict] = []
    bar = progress.Progress("bench model", len(sizes), world.rank == 0 and not args.quiet)
    try:
        for nbytes in sizes:
            bar.point(common.format_size(nbytes))
            count = nbytes // 4
            x = np.ones(count, np.float32)
            out = np.empty_like(x)
            plan = auto.allreduce_plan(count * 4)
            row = {
                "bytes": count * 4,
                "pick": plan["algorithm"],
                "predicted": plan["predicted"],
                "measured": {},
                # what hier_p2p runs across hosts (rd, rab or direct; None where it cannot run)
                "hier_p2p_across": plan["hier_p2p_across"],
                "hier_p2p_lanes": plan["hier_p2p_lanes"],
            }
            for a in algos:
                if a == "small" and count * 4 > 1 << 26:
                    continue
                c = comms[a]
                call = lambda: c.allreduce(x, out, 7, 0)  # noqa: E731 - float32 sum
                call()
                times = [
                    world.allreduce(common.time_batch(call, args.iters, world.Barrier), op=MPI.MAX)
                    for _ in range(args.repeats)
                ]
                row["measured"][a] = common.median(times)
            rows.append(row)
        bar.finish()
        terms = auto.cost_model()
    finally:
        for c in comms.values():
            c.destroy()
        auto.destroy()
    if world.rank == 0:
        print(
            f"# all-reduce cost model, {world.size} ranks on {plan['hosts']} host(s) "
            f"({plan['local_size']} a host at most): predicted / measured, float32 sum"
        )
        print(
            f"# terms across hosts {terms['inter_source']}, within a host {terms['intra_source']}: "
            f"alpha {terms['inter_alpha']:.3g} / {terms['intra_alpha']:.3g} s, "
            f"beta {terms['inter_beta']:.3g} / {terms['intra_beta']:.3g} s/B, gamma {terms['gamma']:.3g} s/B"
            + "".join(f", alpha across from {int(b)} B {a:.3g} s" for b, a in terms["inter_alpha_steps"])
        )
        print(f"{'bytes':>8}  {'pick':>15}  " + "  ".join(f"{a:>21}" for a in algos))
        for row in rows:
            best = min(row["measured"], key=row["measured"].get)
            cells = []
            for a in algos:
                pred, meas = row["predicted"].get(a), row["measured"].get(a)
                text = (
                    "-"
                    if meas is None
                    else f"{'-' if pred is None else f'{pred * 1e6:.1f}':>9} / {meas * 1e6:9.1f}"
                )
                cells.append(f"{text + ('*' if a == best else ' '):>21}")
            pick = row["pick"]
            if pick == "hier_p2p":  # and what it runs across hosts
                pick += "/" + row["hier_p2p_across"]
            print(f"{common.format_size(row['bytes']):>8}  {pick:>15}  " + "  ".join(cells))
        print("(microseconds; * the fastest measured; hier_p2p/rd, /rab, /direct: what it runs across hosts)")
        if args.json:
            common.write_json(
                args.json,
                {
                    "benchmark": "model",
                    "ranks": world.size,
                    "hosts": plan["hosts"],
                    "rows": rows,
                    "machine": common.machine_summary(),
                },
            )
    return 0
