"""An elastic job that grows and shrinks, for tests/system/test_elastic.py (NumPy: three launches of
a PyTorch job would spend most of the test importing PyTorch; the mechanism is the same State).

Run by `hvd_lite.run --host-discovery-script "cat HOSTS"`: at step GROW_AT, rank 0 of a 2-rank job
writes `localhost:4` to HOSTS and every rank calls `state.check_host_updates()` (or, with
EW_GROW_CALL=commit, `state.commit()`) until it raises (hvd_lite.run relaunches the job on 4 ranks);
at step SHRINK_AT, rank 0 of the 4-rank job writes `localhost:2` and every rank commits until the
commit raises (relaunched on 2 ranks). With EW_VICTIM and EW_KILL_AT, the process started as that
world rank SIGKILLs itself at the start of that step of the first launch (in shrink mode the others
go on in place, from the last commit). The weights of a linear model, a reference trained on one
process with the gradients every rank would average, and the step are all in the ObjectState, so
they travel through the commits. After each step rank 0 prints `STEP s size identical equal_ref`:
whether every rank's weights are the same bits and equal the reference's; after each reset it
prints `RESET s size`, the step it goes on from. Each step's data depends only on (step, rank).

With EW_DIE_AT_UPDATE, the process started as that world rank SIGKILLs itself in the first launch's
barrier before the ranks leave for the new hosts (its commit written, the others' not yet known).

Environment: EW_HOSTS (the hosts file the discovery script reads); EW_GROW_AT (default 4),
EW_SHRINK_AT (default 9; a step past the last one: never), EW_GROW_CALL, EW_VICTIM, EW_KILL_AT,
EW_DIE_AT_UPDATE.
"""

import os
import signal
import sys
import time

import numpy as np

import hvd_lite as hvd

STEPS = 12
GROW_AT = int(os.environ.get("EW_GROW_AT", "4"))
SHRINK_AT = int(os.environ.get("EW_SHRINK_AT", "9"))
GROW_CALL = os.environ.get("EW_GROW_CALL", "check")
COMMIT_EVERY = 3
LR = 0.05
WAIT_S = 30  # for the launcher to notice the hosts file (it runs the script every second)
HOSTS = os.environ["EW_HOSTS"]
WORLD_RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "-1")))
FIRST_LAUNCH = os.environ.get("HVD_LITE_ELASTIC_RESTARTS", "0") == "0"
VICTIM = int(os.environ.get("EW_VICTIM", "-1"))
KILL_AT = int(os.environ.get("EW_KILL_AT", "-1"))


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
    if FIRST_LAUNCH and WORLD_RANK == int(os.environ.get("EW_DIE_AT_UPDATE", "-1")):
        import hvd_lite.elastic

        hvd_lite.elastic.barrier = lambda: os.kill(os.getpid(), signal.SIGKILL)  # its first: the update's
    state = hvd.elastic.ObjectState(w=np.zeros(4), ref=np.zeros(4), step=0)

    def note_reset():
        if hvd.rank() == 0:
            sys.stdout.write(f"RESET {state.step} {hvd.size()}\n")
            sys.stdout.flush()

    state.register_reset_callbacks([note_reset])

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            if FIRST_LAUNCH and WORLD_RANK == VICTIM and state.step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            if state.step == GROW_AT and hvd.size() == 2:
                if hvd.rank() == 0:
                    new_hosts("localhost:4\n")
                wait_for_the_interrupt(state.commit if GROW_CALL == "commit" else state.check_host_updates)
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
