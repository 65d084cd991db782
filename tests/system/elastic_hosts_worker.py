"""An elastic job that grows and shrinks, for tests/system/test_elastic.py (NumPy: three launches of
a PyTorch job would spend most of the test importing PyTorch; the mechanism is the same State).

Run by `hvd_lite.run --host-discovery-script "cat HOSTS"`: at step GROW_AT, rank 0 of a 2-rank job
writes `localhost:4` to HOSTS and every rank calls `state.check_host_updates()` until it raises
(hvd_lite.run relaunches the job on 4 ranks); at step SHRINK_AT, rank 0 of the 4-rank job writes
`localhost:2` and every rank commits until the commit raises (relaunched on 2 ranks). The weights
of a linear model, a reference trained on one process with the gradients every rank would average,
and the step are all in the ObjectState, so they travel through the commits. After each step rank 0
prints `STEP s size identical equal_ref`: whether every rank's weights are the same bits and equal
the reference's. Each step's data depends only on (step, rank).

Environment: EW_HOSTS (the hosts file the discovery script reads).
"""

import os
import sys
import time

import numpy as np

import hvd_lite as hvd

STEPS, GROW_AT, SHRINK_AT = 12, 4, 9
COMMIT_EVERY = 3
LR = 0.05
WAIT_S = 30  # for the launcher to notice the hosts file (it runs the script every second)
HOSTS = os.environ["EW_HOSTS"]


def gradient(w, step, rank):
    """The mean squared error's gradient of a linear model on (step, rank)'s batch."""
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((8, 4))
    y = x.sum(1) * 0.5 + 1.0
    return 2.0 * x.T @ (x @ w - y) / len(y)


def new_hosts(text):
    with open(HOSTS + ".tmp", "w") as f:
        f.write(text)
    os.replace(HOSTS + ".tmp", HOSTS)


def wait_for_the_interrupt(call):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        call()  # raises HostsUpdatedInterrupt on every rank at the same call
        time.sleep(0.05)
    raise RuntimeError(f"no HostsUpdatedInterrupt within {WAIT_S} s of rewriting {HOSTS}")


def main():
    hvd.init()
    state = hvd.elastic.ObjectState(w=np.zeros(4), ref=np.zeros(4), step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            if state.step == GROW_AT and hvd.size() == 2:
                if hvd.rank() == 0:
                    new_hosts("localhost:4\n")
                wait_for_the_interrupt(state.check_host_updates)
            if state.step == SHRINK_AT and hvd.size() == 4:
                if hvd.rank() == 0:
                    new_hosts("localhost:2\n")
                wait_for_the_interrupt(state.commit)
            g = hvd.allreduce(gradient(state.w, state.step, hvd.rank()), op=hvd.Average, name="grad")
            state.w = state.w - LR * g
            mean = sum(gradient(state.ref, state.step, r) for r in range(hvd.size())) / hvd.size()
            state.ref = state.ref - LR * mean
            everyone = hvd.allgather_object(state.w.tobytes())
            identical = all(w == everyone[0] for w in everyone)
            equal_ref = bool(np.allclose(state.w, state.ref, rtol=1e-12, atol=1e-14))
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
