"""Adasum against averaging on the same training: scikit-learn's 8x8 digits (bundled, no
download), the MLP of examples/pytorch_digits.py, each rank on its own shard, hvd.DistributedOptimizer
with op=Average and op=Adasum at each learning rate given, the same batches and initial weights
for every run.

    mpirun -np 4 python tools/adasum_convergence.py --lrs 0.05,0.2,0.4,0.8
    mpirun -np 4 python tools/adasum_convergence.py --lrs 0.05,0.1,0.2 --scale-average

With --scale-average, Average's learning rate is the one given times the number of ranks (the
linear scaling rule that examples/pytorch_digits.py follows) while Adasum's is the one given
(Horovod's guidance for Adasum: the best single-worker rate); without it both take the one given.
Rank 0 prints, per op and learning rate, the training loss after each epoch (the mean over the
ranks' batches) and the final test accuracy; a run whose loss is no longer finite says so. Nothing
is asserted: the numbers are for docs/adasum.md.
"""

import argparse
import math
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvd_lite.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lrs", default="0.05,0.2,0.4,0.8", help="learning rates, not scaled by the size")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--ops", default="Average,Adasum")
    p.add_argument("--scale-average", action="store_true", help="Average's rate times the size")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def shards():
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    r, n = hvd.rank(), hvd.size()
    return (
        torch.from_numpy(x_train[r::n]),
        torch.from_numpy(y_train[r::n]),
        torch.from_numpy(x_test),
        torch.from_numpy(y_test),
    )


def train(op, lr: float, args, data):
    """One run: (the loss after each epoch, the final test accuracy)."""
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(args.seed)  # the same initial weights on every rank and in every run
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum),
        named_parameters=model.named_parameters(),
        op=op,
    )
    steps = len(x_train) // args.batch_size  # the shards differ by at most one row
    gen = torch.Generator().manual_seed(args.seed + hvd.rank())  # the same batches in every run
    losses = []
    for _ in range(args.epochs):
        order = torch.randperm(len(x_train), generator=gen)
        total = torch.zeros(1)
        for s in range(steps):
            idx = order[s * args.batch_size : (s + 1) * args.batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            total += loss.detach()
        losses.append(hvd.allreduce(total / steps, name="epoch_loss").item())
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    return losses, accuracy


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)  # one core per rank
    data = shards()
    ops = [getattr(hvd, name) for name in args.ops.split(",")]
    lrs = [float(v) for v in args.lrs.split(",")]
    if hvd.rank() == 0:
        print(
            f"{hvd.size()} ranks, {args.batch_size} rows a rank a step, {args.epochs} epochs, "
            f"SGD momentum {args.momentum}; loss after each epoch, then the test accuracy",
            flush=True,
        )
    for lr in lrs:
        for op in ops:
            rate = lr * hvd.size() if args.scale_average and op == hvd.Average else lr
            losses, accuracy = train(op, rate, args, data)
            if hvd.rank() == 0:
                shown = " ".join(f"{v:.3f}" if math.isfinite(v) else "nan" for v in losses)
                print(f"{op.name:<8} lr {rate:<5g} loss {shown}  accuracy {accuracy:.3f}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
