"""A tiny elastic PyTorch job for tests/system/test_elastic.py, run by `hvd_lite.run --min-np ...`.

Each step's data depends only on (step, rank), so a job that resumes from a commit must end with the
same weights as a job without a failure. Rank KILL_RANK SIGKILLs itself at step KILL_AT while fewer
than KILLS marker files exist in MARKERS (it writes one first, with the time of death), so the
first KILLS launches die there. After training, every rank trains a fresh copy without commits or
failures (the reference, through the same collectives) and rank 0 prints one RESULT line.

Environment: EW_MARKERS (a directory), EW_KILLS, EW_STEPS, EW_COMMIT_EVERY, EW_KILL_AT.
"""

import os
import signal
import sys
import time

import torch

import hvd_lite.torch as hvd

STEPS = int(os.environ.get("EW_STEPS", "12"))
COMMIT_EVERY = int(os.environ.get("EW_COMMIT_EVERY", "3"))
KILL_AT = int(os.environ.get("EW_KILL_AT", "7"))
KILLS = int(os.environ.get("EW_KILLS", "1"))
KILL_RANK = 1
MARKERS = os.environ["EW_MARKERS"]


def data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 4, generator=g)
    return x, x.sum(1, keepdim=True) * 0.5 + 1.0


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())


def one_step(model, opt, step):
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in data(step, hvd.rank()))
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def maybe_die(step):
    if hvd.rank() != KILL_RANK or step != KILL_AT:
        return
    killed = sorted(f for f in os.listdir(MARKERS) if f.startswith("killed"))
    if len(killed) >= KILLS:
        return
    with open(os.path.join(MARKERS, f"killed{len(killed)}"), "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    hvd.init()
    model, opt = make()
    state = hvd.elastic.TorchState(model, opt, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    relaunched = os.environ.get("HVD_LITE_ELASTIC_RESTARTS", "0") != "0"  # set by hvd_lite.run

    @hvd.elastic.run
    def train(state):
        first = True
        while state.step < STEPS:
            maybe_die(state.step)
            one_step(state.model, state.optimizer, state.step)
            if first and relaunched and hvd.rank() == 0:
                sys.stdout.write(f"FIRST_STEP_AFTER_RELAUNCH {time.time()!r} step={state.step}\n")
                sys.stdout.flush()
            first = False
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                state.commit()

    train(state)
    ref_model, ref_opt = make()
    for step in range(STEPS):
        one_step(ref_model, ref_opt, step)
    mine = [p.detach().clone() for p in model.parameters()]
    equal_ref = all(torch.equal(a, b) for a, b in zip(mine, ref_model.parameters()))
    everyone = hvd.allgather_object([t.tolist() for t in mine])
    identical = all(w == everyone[0] for w in everyone)
    if hvd.rank() == 0:
        line = f"RESULT equal_ref={equal_ref} identical={identical} resets={resets} step={state.step}"
        sys.stdout.write(line + "\n")  # one write: Hydra tags each write
        sys.stdout.flush()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
