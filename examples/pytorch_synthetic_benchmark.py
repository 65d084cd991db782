"""Training throughput on random data: hvd_lite's DistributedOptimizer, and with --ddp PyTorch DDP
(Gloo) on the same model in the same run, interleaved iteration by iteration.

    mpirun -np 2 python examples/pytorch_synthetic_benchmark.py --ddp

Per model: warm-up batches, then --num-iters iterations of --num-batches-per-iter training steps
(forward, backward, optimizer step) of each contender, the order alternating between iterations so
that noise on the machine falls on both. Rank 0 prints img/sec per rank as mean +- 1.96 std over
the iterations, and the total over all ranks.

With --single, one process is a contender too: rank 0 alone trains a copy of the model on the global
batch (the per-rank batch times the ranks) with the threads and the cores of all the ranks (it widens
its CPU affinity to theirs for its turn), while the other ranks wait in a barrier, interleaved with
the others like DDP. Its ratio (hvd_lite's median total rate over the iterations against the one
process's median) is what "2 ranks against one process" means in docs/benchmarks.md, measured in one
run instead of in two runs at different times.

    mpirun -np 2 python examples/pytorch_synthetic_benchmark.py --single --model cnn
"""

import argparse
import os
import socket
import sys
import time
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
        self.net = nn.Sequential(
            nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, classes)
        )

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
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per rank (default: cores / local ranks, at least 1)",
    )
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--ddp", action="store_true", help="also run torch DDP (Gloo), interleaved")
    p.add_argument(
        "--single",
        action="store_true",
        help="also run one process (rank 0, the global batch, every rank's threads), "
        "interleaved, the other ranks waiting",
    )
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
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size()
    )


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

    def after(self):
        """What follows a timed run, untimed."""

    def images(self, batches):
        """Images this rank trains in `batches` steps."""
        return self.data.shape[0] * batches


class SingleProcess(Contender):
    """The baseline on one process: rank 0 trains alone with `threads` torch threads while the other
    ranks wait in a barrier (sleeping, so rank 0 has the host's cores); rank 0 joins it untimed."""

    def __init__(self, label, model, optimizer, data, target, threads):
        super().__init__(label, model, optimizer, data, target)
        self.threads = threads
        self.waited = [0.0, 0.0]  # a waiting rank's CPU seconds (all its threads), wall seconds
        # mpirun may bind each rank to its own cores: the one process gets the cores of all the ranks
        self.cpus = set().union(*hvd.allgather_object(os.sched_getaffinity(0), name="bench.cpus"))

    def run(self, batches):
        if hvd.rank() != 0:
            return
        ranks_threads, ranks_cpus = torch.get_num_threads(), os.sched_getaffinity(0)
        # (torch's worker threads start from this thread's mask, and keep it while idle)
        os.sched_setaffinity(0, self.cpus)
        torch.set_num_threads(self.threads)
        try:
            super().run(batches)
        finally:
            torch.set_num_threads(ranks_threads)
            os.sched_setaffinity(0, ranks_cpus)

    def after(self):
        cpu, wall = time.process_time(), time.perf_counter()
        hvd.barrier()
        if hvd.rank() != 0:
            self.waited[0] += time.process_time() - cpu
            self.waited[1] += time.perf_counter() - wall

    def images(self, batches):
        return super().images(batches) if hvd.rank() == 0 else 0


def contenders(name, args):
    cls = MODELS[name]
    torch.manual_seed(0)
    data = torch.randn(args.batch_size, *cls.shape)
    target = torch.randint(0, 10, (args.batch_size,))
    model = cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    out = [Contender("hvd_lite", model, opt, data, target)]
    if args.ddp:
        ddp = nn.parallel.DistributedDataParallel(cls())
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
        out.append(Contender("DDP (Gloo)", ddp, ddp_opt, data, target))
    if args.single:
        # the same global batch: the per-rank batch of every rank, in one process
        one = cls()
        one_opt = torch.optim.SGD(one.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
        out.append(
            SingleProcess(
                "one process",
                one,
                one_opt,
                data.repeat(hvd.size(), *[1] * len(cls.shape)),
                target.repeat(hvd.size()),
                torch.get_num_threads() * hvd.size(),
            )
        )
    return out


def log(*words):
    if hvd.rank() == 0:
        print(*words, flush=True)


def bench(name, args):
    runners = contenders(name, args)
    params = sum(p.numel() for p in runners[0].model.parameters())
    log(
        f"\nModel: {name} ({params:,} parameters), batch size {args.batch_size} per rank, "
        f"{hvd.size()} ranks, {torch.get_num_threads()} torch thread(s) per rank"
    )
    for r in runners:
        r.run(args.num_warmup_batches)
    for it in range(args.num_iters):
        order = runners if it % 2 == 0 else runners[::-1]
        for r in order:
            t = timeit.timeit(lambda: r.run(args.num_batches_per_iter), number=1)
            r.after()
            r.rates.append(r.images(args.num_batches_per_iter) / t)
    results, medians = {}, {}
    for r in runners:
        # each rank's rate per iteration; the total counts every rank's images
        rates = np.array(r.rates)
        per_iter = np.sum(hvd.allgather_object(rates, name=f"bench.{name}.{r.label}"), axis=0)
        results[r.label], medians[r.label] = per_iter.mean(), np.median(per_iter)
        if isinstance(r, SingleProcess):
            waits = hvd.allgather_object(r.waited, name=f"bench.{name}.waited")[1:]
            busiest = max((cpu / wall for cpu, wall in waits if wall > 0), default=0.0)
            log(
                f"  {r.label:<11} img/sec: {per_iter.mean():.1f} +- {1.96 * per_iter.std():.1f} "
                f"(rank 0, batch {r.data.shape[0]}, {r.threads} torch threads on {len(r.cpus)} cpus); "
                f"median {medians[r.label]:.1f}; the waiting ranks used at most "
                f"{100 * busiest:.1f} % of a core"
            )
        else:
            mean, conf = rates.mean(), 1.96 * rates.std()
            log(
                f"  {r.label:<11} img/sec per rank: {mean:.1f} +- {conf:.1f};  total on {hvd.size()} "
                f"ranks: {results[r.label]:.1f} +- {conf * hvd.size():.1f}; median {medians[r.label]:.1f}"
            )
    if "DDP (Gloo)" in results:
        log(f"  hvd_lite / DDP: {results['hvd_lite'] / results['DDP (Gloo)']:.2f}x")
    if "one process" in results:
        log(
            f"  hvd_lite / one process (ratio of medians over {args.num_iters} iterations): "
            f"{medians['hvd_lite'] / medians['one process']:.3f}x"
        )
    return results


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    if args.single and hvd.local_size() != hvd.size():
        raise SystemExit(
            f"--single compares with one process on one host; the {hvd.size()} ranks are on "
            f"more than one host ({hvd.local_size()} on this one)"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    else:
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
