"""Data-parallel training of a small network on scikit-learn's 8x8 digits (bundled, no download).

    mpirun -np 2 python examples/pytorch_digits.py            # or: hvd_lite.run -np 2 python ...

Each rank trains on its own shard of the training set; gradients are averaged by
hvd.DistributedOptimizer while backward runs; the learning rate is scaled by the number of ranks.
Rank 0 prints one line per epoch. At the end every rank checks that its weights are identical to
rank 0's, bit for bit.
"""

import argparse
import hashlib
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvd_lite.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by size")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    return p.parse_args()


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)  # one core per rank
    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: rank 0's weights win below

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    # this rank's shard of the training set
    x_train = torch.from_numpy(x_train[hvd.rank() :: hvd.size()])
    y_train = torch.from_numpy(y_train[hvd.rank() :: hvd.size()])
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # every rank runs the same number of steps per epoch (the shards differ by at most one row)
    steps = len(x_train) // args.batch_size
    gen = torch.Generator().manual_seed(args.seed + hvd.rank())
    start = time.time()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=gen)
        total = torch.zeros(1)
        for s in range(steps):
            idx = order[s * args.batch_size : (s + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.detach()
        scheduler.step()
        loss = hvd.allreduce(total / steps, name="epoch_loss").item()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if hvd.rank() == 0:
            print(
                f"epoch {epoch + 1:3d}/{args.epochs}  loss {loss:.4f}  test accuracy "
                f"{accuracy:.4f}  ({time.time() - start:.1f} s)",
                flush=True,
            )

    digest = hashlib.sha256(
        b"".join(p.detach().numpy().tobytes() for p in model.state_dict().values())
    ).hexdigest()
    digests = hvd.allgather_object(digest)
    same = all(d == digests[0] for d in digests)
    if hvd.rank() == 0:
        print(
            f"final test accuracy {accuracy:.4f}; weights identical on all {hvd.size()} ranks: "
            f"{'yes' if same else 'NO'}",
            flush=True,
        )
    hvd.shutdown()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
