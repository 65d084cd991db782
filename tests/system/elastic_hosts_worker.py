"""An elastic PyTorch job that grows and shrinks, for tests/system/test_elastic.py.

Run by `hvd_lite.run --host-discovery-script "cat HOSTS"`: at step GROW_AT, rank 0 of a 2-rank job
writes `localhost:4` to HOSTS and every rank calls `state.check_host_updates()` until it raises
(hvd_lite.run relaunches the job on 4 ranks); at step SHRINK_AT, rank 0 of the 4-rank job writes
`localhost:2` and every rank commits until the commit raises (relaunched on 2 ranks). The model, a
reference model trained on one process with the gradients every rank would average, and the step
are all in the TorchState, so both travel through the commits. After each step rank 0 prints
`STEP s size identical equal_ref`: whether every rank's weights are the same bits and equal the
reference's. Each step's data depends only on (step, rank).

Environment: EW_HOSTS (the hosts file the discovery script reads).
"""

import os
import sys
import time

import torch

import hvd_lite.torch as hvd

STEPS, GROW_AT, SHRINK_AT = 12, 4, 9
COMMIT_EVERY = 3
WAIT_S = 30  # for the launcher to notice the hosts file (it runs the script every second)
HOSTS = os.environ["EW_HOSTS"]


def data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 4, generator=g)
    return x, x.sum(1, keepdim=True) * 0.5 + 1.0


def grads(model, step, rank):
    model.zero_grad()
    x, y = data(step, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def reference_step(ref, ref_opt, step, size):
    """One step of the reference: the average of every rank's gradients, folded in rank order."""
    per_rank = [grads(ref, step, r) for r in range(size)]
    for i, p in enumerate(ref.parameters()):
        total = per_rank[0][i]
        for g in per_rank[1:]:
            total = total + g[i]
        p.grad = total / size
    ref_opt.step()


def new_hosts(text):
    with open(HOSTS + ".tmp", "w") as f:
        f.write(text)
    os.replace(HOSTS + ".tmp", HOSTS)


def wait_for_the_interrupt(state, call):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        call()  # raises HostsUpdatedInterrupt on every rank at the same call
        time.sleep(0.05)
    raise RuntimeError(f"no HostsUpdatedInterrupt within {WAIT_S} s of rewriting {HOSTS}")


def main():
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), named_parameters=model.named_parameters()
    )
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, ref=ref, ref_opt=ref_opt, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            if state.step == GROW_AT and hvd.size() == 2:
                if hvd.rank() == 0:
                    new_hosts("localhost:4\n")
                wait_for_the_interrupt(state, state.check_host_updates)
            if state.step == SHRINK_AT and hvd.size() == 4:
                if hvd.rank() == 0:
                    new_hosts("localhost:2\n")
                wait_for_the_interrupt(state, state.commit)
            opt.zero_grad()
            x, y = data(state.step, hvd.rank())
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            reference_step(state.ref, state.ref_opt, state.step, hvd.size())
            mine = [p.detach().clone() for p in model.parameters()]
            everyone = hvd.allgather_object([t.tolist() for t in mine])
            identical = all(w == everyone[0] for w in everyone)
            equal_ref = all(
                torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(mine, state.ref.parameters())
            )
            if hvd.rank() == 0:
                sys.stdout.write(f"STEP {state.step} {hvd.size()} {identical} {equal_ref}\n")
                sys.stdout.flush()
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                state.commit()

    train(state)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
