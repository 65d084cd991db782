"""What elastic training costs: a commit of a large PyTorch state, and a relaunch after a death.

commit    under mpirun: a TorchState over a model of --params float32 parameters (default 25M,
          100 MB) and its SGD optimizer with momentum (another 100 MB once a step has run).
          Times, on every rank, --repeats calls of state.commit() with the commit written to a
          job directory as in an elastic launch (HVD_LITE_ELASTIC_JOB_DIR, made in $TMPDIR when
          unset), and as many of state.save() alone (the in-memory copy every commit makes).
          Rank 0 prints the median, p10 and p90 over every call of every rank, in ms.

recovery  not under mpirun: runs `hvd_lite.run -np N --min-np 2 --max-np N --elastic-mode M`
          --repeats times on a small PyTorch job that commits every step; rank 1 SIGKILLs itself
          at step 5 after noting the time, and rank 0 notes when its first step after the reset
          (the relaunch, or the shrink in place) completes.
          Prints the median, min and max of that gap over the runs, in seconds. Restart mode: the
          launcher's notice of the death, the end of the other ranks, a new mpirun, Python and
          PyTorch imported again, hvd.init, the commit read and broadcast, one step. Shrink
          mode: the survivors' notice, the shrink, a new engine, the sync, one step.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

KILL_AT = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The elastic benchmark's options."""
    p.add_argument("what", choices=("commit", "recovery"), help="which cost to measure")
    p.add_argument(
        "--params", type=int, default=25_000_000, help="commit: model parameters (default 25000000)"
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="commit: calls (default 9); recovery: runs (default 5)"
    )
    p.add_argument("-np", "--np", dest="np", type=int, default=4, help="recovery: ranks (default 4)")
    p.add_argument(
        "--elastic-mode",
        choices=("shrink", "restart"),
        default="restart",
        help="recovery: how the job survives the death (hvd_lite.run's --elastic-mode; default restart)",
    )
    p.add_argument("--json", metavar="FILE", help="write every measured time to FILE")
    p.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)  # recovery's rank program


def _spread(values: List[float]) -> str:
    q = np.percentile(values, [10, 50, 90])
    return f"median {q[1]:8.1f}  p10 {q[0]:8.1f}  p90 {q[2]:8.1f}"


def _commit(args: argparse.Namespace) -> int:
    import torch

    import hvd_lite.torch as hvd

    hvd.init()
    if "HVD_LITE_ELASTIC_JOB_DIR" not in os.environ:
        os.environ["HVD_LITE_ELASTIC_JOB_DIR"] = os.path.join(
            tempfile.gettempdir(), f"hvd_lite-bench-commit-{os.getppid()}-{hvd.local_size()}"
        )
    width = 1000  # layers of 1000 x 1000 weights, as many as --params allows
    layers = max(1, round(int(args.params) / width**2))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    n = sum(p.numel() for p in model.parameters())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), named_parameters=model.named_parameters()
    )
    model(torch.randn(2, width)).sum().backward()
    opt.step()  # the momentum buffers exist from here on
    state = hvd.elastic.TorchState(model, opt, step=0)
    repeats = args.repeats or 9
    times: Dict[str, List[float]] = {"commit": [], "save": []}
    for name, call in (("save", state.save), ("commit", state.commit)):
        call()  # warm-up
        for _ in range(repeats):
            hvd.barrier()
            t0 = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - t0) * 1e3)
    gathered = hvd.allgather_object(times)
    from ..elastic.commit_store import CommitStore

    if hvd.local_rank() == 0:
        CommitStore(os.environ["HVD_LITE_ELASTIC_JOB_DIR"]).remove(state._commit_name)
    if hvd.rank() == 0:
        mb = n * 4 / 1e6
        print(
            f"# state.commit() of a TorchState: {n / 1e6:.1f}M float32 parameters ({mb:.0f} MB) plus "
            f"SGD momentum ({mb:.0f} MB); {hvd.size()} rank(s), {repeats} calls each; ms"
        )
        for name in ("save", "commit"):
            slowest = [max(g[name][i] for g in gathered) for i in range(repeats)]
            label = "save (in memory)" if name == "save" else "commit (memory + disk)"
            print(f"{label:24s} {_spread(slowest)}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"params": n, "size": hvd.size(), "ms": gathered}, f)
    hvd.shutdown()
    return 0


def _worker(directory: str) -> int:
    import torch

    import hvd_lite.torch as hvd

    hvd.init()
    model = torch.nn.Linear(64, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, opt, step=0)
    # after a relaunch (restart mode) or a shrink in place (shrink mode, the reset callback)
    resumed = [os.environ.get("HVD_LITE_ELASTIC_RESTARTS", "0") != "0"]
    state.register_reset_callbacks([lambda: resumed.__setitem__(0, True)])
    noted = [False]

    @hvd.elastic.run
    def train(state):
        while state.step < KILL_AT + 3:
            if hvd.rank() == 1 and state.step == KILL_AT and not resumed[0]:
                with open(os.path.join(directory, "died"), "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            if resumed[0] and not noted[0] and hvd.rank() == 0:
                noted[0] = True
                with open(os.path.join(directory, "resumed"), "w") as f:
                    f.write(repr(time.time()))
            state.step += 1
            state.commit()

    train(state)
    hvd.shutdown()
    return 0


def _recovery(args: argparse.Namespace) -> int:
    repeats = args.repeats or 5
    gaps = []
    for i in range(repeats):
        with tempfile.TemporaryDirectory(prefix="hvd_lite-bench-recovery-") as d:
            cmd = [sys.executable, "-m", "hvd_lite.run", "-np", str(args.np), "--min-np", "2"]
            cmd += ["--max-np", str(args.np), "--reset-limit", "1", "--elastic-mode", args.elastic_mode]
            cmd += [sys.executable, "-m", "hvd_lite.bench", "elastic", "recovery", "--worker", d]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            try:
                with open(os.path.join(d, "died")) as f:
                    died = float(f.read())
                with open(os.path.join(d, "resumed")) as f:
                    resumed = float(f.read())
            except OSError:
                sys.stderr.write(res.stdout + res.stderr)
                sys.stderr.write(f"run {i}: the job did not die and resume (exit code {res.returncode})\n")
                return 1
            gaps.append(resumed - died)
            print(
                f"run {i}: {gaps[-1]:.2f} s from rank 1's SIGKILL to the first step after it",
                flush=True,
            )
    print(
        f"# death to the next completed step, {args.np} ranks, {args.elastic_mode} mode, {repeats} runs: "
        f"median {statistics.median(gaps):.2f} s, min {min(gaps):.2f} s, max {max(gaps):.2f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "mode": args.elastic_mode, "seconds": gaps}, f)
    return 0


def main(args: argparse.Namespace) -> int:
    """Runs the chosen measurement."""
    if args.worker:
        return _worker(args.worker)
    return _commit(args) if args.what == "commit" else _recovery(args)
