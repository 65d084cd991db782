"""DistributedOptimizer steps on a CUDA model under mpirun: what fusing device gradients buys.

A stack of small Linear layers on the GPU (--layers of --width x --width: 2 gradients each, 64 KiB
at width 128), trained with hvd_lite.torch.DistributedOptimizer. Each configuration re-initialises
hvd_lite with its HVD_LITE_FUSION_THRESHOLD; the configurations alternate, round by round, and
rank 0 prints each one's median step time (the slowest rank's, over --steps steps after a warmup)
and its ratio to the first:

    mpirun -np 2 python tools/gpu_fusion_bench.py [--layers 60 --width 128 --steps 30 --rounds 3]

  fused      the default threshold (256 KiB): the gradients of a round fuse through the pinned
             buffer, a few device steps a round
  alone      HVD_LITE_FUSION_THRESHOLD=0: every gradient its own device step (cuda.c's staged form)
"""

import argparse
import os
import statistics
import time

import torch
from mpi4py import MPI

import hvd_lite.torch as hvd
from hvd_lite import basics

CONFIGS = {"fused": {}, "alone": {"HVD_LITE_FUSION_THRESHOLD": "0"}}


def step_times(args) -> list:
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters()
    )
    x = torch.randn(args.batch, args.width, device=dev)
    times = []
    for s in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        if s >= args.warmup:
            times.append(MPI.COMM_WORLD.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=60)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    medians = {k: [] for k in CONFIGS}
    steps = {}
    for _ in range(args.rounds):
        for name, env in CONFIGS.items():
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            hvd.init()
            before = basics._engine().stats()["device_steps"]
            medians[name].append(statistics.median(step_times(args)))
            steps[name] = basics._engine().stats()["device_steps"] - before
            hvd.shutdown()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    if MPI.COMM_WORLD.Get_rank() == 0:
        first = statistics.median(medians["fused"])
        print(
            f"# {MPI.COMM_WORLD.Get_size()} ranks, {args.layers} layers of "
            f"{args.width}x{args.width} ({2 * args.layers} gradients), batch {args.batch}, "
            f"{args.steps} steps x {args.rounds} rounds"
        )
        for name in CONFIGS:
            m = statistics.median(medians[name])
            rounds = [round(v * 1e3, 2) for v in medians[name]]
            print(
                f"{name:>6}: step {m * 1e3:8.2f} ms (rounds {rounds}), device steps in the "
                f"last round {steps[name]}, / fused {m / first:.2f}"
            )


if __name__ == "__main__":
    main()
