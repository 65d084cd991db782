"""What torch.compile costs a step that calls hvd_lite.torch's collectives.

    python tools/torch_compile_cost.py [--runs 5] [--backend aot_eager|inductor]

Each run is a fresh 1-rank process (nothing compiled in memory; inductor keeps an on-disk cache,
which the first process fills) that compiles one step calling five collectives (allreduce with
factors, allgather, broadcast, reducescatter, allreduce with fp16 compression), each in the loss,
and runs it forward and backward: its first call (the compile), the median of 200 later calls, and
the graphs Dynamo made. Two modes in turn: the collectives as hvd_lite.torch gives them
(`untraced`: Dynamo calls each as it is) and, with every wrapper of mpi_ops.untraced taken off
again in the process (`traced`: each `fn.__wrapped__` put back, so the collectives' calls to each
other are undecorated too), what Dynamo met before: tracing into hvd_lite's Python and breaking
the graph where it could not go on. Then, outside torch.compile, what untraced's check costs:
eager 4-byte `allreduce_` calls, hvd_lite.torch's and the undecorated function in turn in each
process (the best of 7 batches of 5,000 each), as a ratio and in microseconds.
docs/pytorch.md, "torch.compile".
"""

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo
import hvd_lite.torch as hvd
hvd.init()
mode, backend = sys.argv[1], sys.argv[2]
from hvd_lite.torch import mpi_ops
undecorated = {n: getattr(mpi_ops, n).__wrapped__ for n in mpi_ops.__all__
               if hasattr(getattr(mpi_ops, n), "__wrapped__")}
if mode == "traced":  # the module as it was before mpi_ops.untraced
    for n, f in undecorated.items():
        setattr(mpi_ops, n, f)
allreduce, allgather, broadcast, reducescatter = (mpi_ops.allreduce, mpi_ops.allgather,
                                                  mpi_ops.broadcast, mpi_ops.reducescatter)

def step(x, w):
    a = allreduce(x * w, name="a", op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    b = allgather(x * w, name="b")
    c = broadcast(x * w, root_rank=0, name="c")
    d = reducescatter(x * w, name="d", op=hvd.Average)
    e = allreduce(x * w, name="e", compression=hvd.Compression.fp16)
    return a.sum() + (b * b).sum() + c.sum() + (d * d).sum() + e.sum()

f = torch.compile(step, backend=backend)
x = torch.arange(64, dtype=torch.float32)
def call():
    w = torch.tensor(1.5, requires_grad=True)
    f(x, w).backward()
t0 = time.perf_counter(); call(); first = time.perf_counter() - t0
later = []
for _ in range(200):
    t0 = time.perf_counter(); call(); later.append(time.perf_counter() - t0)
later.sort()
# outside torch.compile: a 4-byte in-place allreduce, eagerly, untraced and undecorated in turn in
# this process (what untraced's check costs)
one, best = torch.ones(1), {}
for _ in range(7):
    for key, fn in (("untraced", hvd.allreduce_), ("traced", undecorated["allreduce_"])):
        t0 = time.perf_counter()
        for _ in range(5000):
            fn(one, name="eager")
        best[key] = min(best.get(key, 1.0), (time.perf_counter() - t0) / 5000)
print(json.dumps({"first": first, "later": later[len(later) // 2],
                  "eager": best["untraced"] / best["traced"], "eager_us": best["untraced"] * 1e6,
                  "eager_plain_us": best["traced"] * 1e6,
                  "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"]}))
"""


def one(mode: str, backend: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, backend], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per mode (default 5)")
    ap.add_argument(
        "--backend",
        default="aot_eager",
        help="torch.compile's backend (default aot_eager: no C++ build; inductor is torch.compile's default)",
    )
    args = ap.parse_args()
    got = {"untraced": [], "traced": []}
    for _ in range(args.runs):
        for mode in got:
            got[mode].append(one(mode, args.backend))
    med = {
        m: {k: statistics.median(r[k] for r in rs) for k in ("first", "later", "eager", "graphs")}
        for m, rs in got.items()
    }
    for m, rs in got.items():
        print(
            f"{m:8s} first call {med[m]['first'] * 1e3:8.1f} ms, later calls "
            f"{med[m]['later'] * 1e3:6.2f} ms, graphs {med[m]['graphs']:.0f} (medians of "
            f"{args.runs} fresh processes, backend {args.backend})"
        )
        print("  first: " + " ".join(f"{r['first'] * 1e3:.1f}" for r in rs))
        print("  later: " + " ".join(f"{r['later'] * 1e3:.2f}" for r in rs))
        print(
            "  eager allreduce_ of 4 bytes, untraced / undecorated (best of 7 batches of 5,000 "
            "each, in turn): " + " ".join(f"{r['eager']:.3f}" for r in rs)
        )
        print(
            "    us a call, untraced against undecorated: "
            + " ".join(f"{r['eager_us']:.2f}/{r['eager_plain_us']:.2f}" for r in rs)
        )
    u, t = med["untraced"], med["traced"]
    print(
        f"traced / untraced: first call {t['first'] / u['first']:.2f}, later calls "
        f"{t['later'] / u['later']:.2f}; eager calls, untraced / undecorated: median "
        f"{statistics.median(r['eager'] for rs in got.values() for r in rs):.3f}"
    )


if __name__ == "__main__":
    main()
