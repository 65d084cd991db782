"""Training throughput on random data: hvd_lite's DistributedOptimizer, and with --ddp PyTorch DDP
(Gloo) on the same model in the same run, interleaved iteration by iteration.

    mpirun -np 2 python examples/pytorch_synthetic_benchmark.py --ddp

Per model: warm-up batches, then --num-iters iterations of --num-batches-per-iter training steps
(forward, backward, optimizer step) of each contender, the order alternating between iterations so
that noise on the machine falls on both. Rank 0 prints img/sec per rank as mean +- 1.96 std over
the iterations, and the total over all ranks.
"""
import argparse
import socket
import sys
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hvd_lite.torch as hvd


class SmallCNN(nn.Module):
    """Two conv layers and two dense ones on 3x32x32 images (545k parameters)."""

    shape = (3, 32, 32)

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class MLP(nn.Module):
    """784-1024-1024-10 on flattened 28x28 images (1.9M parameters)."""

    shape = (784,)

    def __init__(self, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                 nn.Linear(1024, classes))

    def forward(self, x):
        return self.net(x)


MODELS = {"cnn": SmallCNN, "mlp": MLP}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS) + ["all"], default="all")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (default: cores / local ranks, at least 1)")
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--ddp", action="store_true", help="also run torch DDP (Gloo), interleaved")
    return p.parse_args(argv)


def init_ddp():
    """torch.distributed over Gloo, with the rendezvous address sent through hvd_lite."""
    import torch.distributed as dist

    port = 0
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name="bench.ddp_port")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(),
                            world_size=hvd.size())


class Contender:
    """One way of training the model: a step function and its timings."""

    def __init__(self, label, model, optimizer, data, target):
        self.label, self.model, self.optimizer = label, model, optimizer
        self.data, self.target = data, target
        self.rates = []

    def step(self):
        self.optimizer.zero_grad()
        F.cross_entropy(self.model(self.data), self.target).backward()
        self.optimizer.step()

    def run(self, batches):
        for _ in range(batches):
            self.step()


def contenders(name, args):
    cls = MODELS[name]
    torch.manual_seed(0)
    data = torch.randn(args.batch_size, *cls.shape)
    target = torch.randint(0, 10, (args.batch_size,))
    model = cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    out = [Contender("hvd_lite", model, opt, data, target)]
    if args.ddp:
        ddp = nn.parallel.DistributedDataParallel(cls())
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
        out.append(Contender("DDP (Gloo)", ddp, ddp_opt, data, target))
    return out


def log(*words):
    if hvd.rank() == 0:
        print(*words, flush=True)


def bench(name, args):
    runners = contenders(name, args)
    params = sum(p.numel() for p in runners[0].model.parameters())
    log(f"\nModel: {name} ({params:,} parameters), batch size {args.batch_size} per rank, "
        f"{hvd.size()} ranks, {torch.get_num_threads()} torch thread(s) per rank")
    for r in runners:
        r.run(args.num_warmup_batches)
    for it in range(args.num_iters):
        order = runners if it % 2 == 0 else runners[::-1]
        for r in order:
            t = timeit.timeit(lambda: r.run(args.num_batches_per_iter), number=1)
            r.rates.append(args.batch_size * args.num_batches_per_iter / t)
    results = {}
    for r in runners:
        # each rank's rate per iteration; the total counts every rank's images
        rates = np.array(r.rates)
        mean, conf = rates.mean(), 1.96 * rates.std()
        totals = hvd.allgather_object(mean, name=f"bench.{name}.{r.label}")
        results[r.label] = sum(totals)
        log(f"  {r.label:<11} img/sec per rank: {mean:.1f} +- {conf:.1f};  total on {hvd.size()} "
            f"ranks: {sum(totals):.1f} +- {conf * hvd.size():.1f}")
    if len(results) == 2:
        log(f"  hvd_lite / DDP: {results['hvd_lite'] / results['DDP (Gloo)']:.2f}x")
    return results


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    if args.threads:
        torch.set_num_threads(args.threads)
    else:
        import os
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    if args.ddp:
        init_ddp()
    names = sorted(MODELS) if args.model == "all" else [args.model]
    for name in names:
        bench(name, args)
    if args.ddp:
        import torch.distributed as dist
        dist.destroy_process_group()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
