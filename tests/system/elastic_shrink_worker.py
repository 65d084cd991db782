"""A tiny elastic PyTorch job for tests/system/test_elastic.py's shrink mode (Open MPI with ULFM),
run by `hvd_lite.run --min-np ...`: ranks die and the survivors go on in place.

Each step's data depends only on (step, rank). The process started as world rank EW_VICTIM (then
EW_VICTIM2, if set) dies at step EW_KILL_AT (EW_KILL_AT2), how EW_HOW says:
  between  SIGKILL in Python, between collectives (the others are in the next round's negotiation);
  send     SIGKILL inside the data phase of its next step's all-reduce, before its first send: a
           message (HVD_LITE_SHM=0) or a shared-memory step (the fused gradients);
  send3    the same, before its third send (mid-ring, with HVD_LITE_ALLREDUCE_ALGO=ring).
With EW_RESTORE_RAISES set to a world rank, that survivor's state.restore() raises instead. With
EW_HOSTS (a discovery script's hosts file), the new rank 0 replaces it with EW_HOSTS_AFTER at the reset
after the last death (0.5 s after it, when the launcher has read the victims' ends from their rank
wrappers); EW_RESET_PAUSE: seconds every survivor then waits (the launcher's watcher reads the file).
A reset callback records the restored state (the commit the survivors rolled back to); after
training every survivor trains a fresh copy from that record over the same steps through the same
collectives (the reference), and rank 0 prints one RESULT line: whether every rank's weights are
identical (bit for bit), whether they match the reference (to float32 rounding: which gradients fuse
depends on timing, and with it the ring's order of summation), the sizes after each reset, the step.
"""

import copy
import os
import signal
import sys
import time

import torch
from elastic_worker import one_step  # restart mode's worker: the same data and step

import hvd_lite.torch as hvd
from hvd_lite import basics

STEPS = int(os.environ.get("EW_STEPS", "16"))
COMMIT_EVERY = int(os.environ.get("EW_COMMIT_EVERY", "3"))
HOW = os.environ.get("EW_HOW", "between")
WORLD_RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))
WORLD_SIZE = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "0"))
DEATHS = {
    int(os.environ[v]): int(os.environ[k])
    for v, k in (("EW_VICTIM", "EW_KILL_AT"), ("EW_VICTIM2", "EW_KILL_AT2"))
    if v in os.environ
}


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())


def maybe_die(step):
    if DEATHS.get(WORLD_RANK) != step:
        return
    if HOW == "between":
        os.kill(os.getpid(), signal.SIGKILL)
    basics._engine()._inject_fault("kill", 3 if HOW == "send3" else 1)


def main():
    hvd.init()
    model, opt = make()
    state = hvd.elastic.TorchState(model, opt, step=0)
    rolled_back = []  # (step, model, optimizer) as restored, at each reset

    def record():
        rolled_back.append(
            (state.step, copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), hvd.size())
        )
        if "EW_HOSTS" in os.environ and hvd.rank() == 0 and hvd.size() == WORLD_SIZE - len(DEATHS):
            time.sleep(0.5)
            with open(os.environ["EW_HOSTS"] + ".new", "w") as f:  # replaced whole: never read half written
                f.write(os.environ["EW_HOSTS_AFTER"])
            os.replace(os.environ["EW_HOSTS"] + ".new", os.environ["EW_HOSTS"])
        time.sleep(float(os.environ.get("EW_RESET_PAUSE", "0")))

    state.register_reset_callbacks([record])
    if int(os.environ.get("EW_RESTORE_RAISES", "-1")) == WORLD_RANK:  # a survivor's restore fails

        def broken_restore():
            raise RuntimeError(f"world rank {WORLD_RANK}: restore failed (EW_RESTORE_RAISES)")

        state.restore = broken_restore

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            maybe_die(state.step)
            one_step(state.model, state.optimizer, state.step)
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                state.commit()

    train(state)
    mine = [p.detach().clone() for p in model.parameters()]
    everyone = hvd.allgather_object([t.tolist() for t in mine])
    identical = all(w == everyone[0] for w in everyone)
    step0, model_sd, opt_sd, _ = rolled_back[-1]
    ref_model, ref_opt = make()
    ref_model.load_state_dict(model_sd)
    ref_opt.load_state_dict(opt_sd)
    for step in range(step0, STEPS):
        one_step(ref_model, ref_opt, step)
    # Equal up to float32 rounding: the ring's reduction order follows each tensor's place in a
    # fused buffer, and which gradients fuse depends on timing, in the run as in the reference.
    equal_ref = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(mine, ref_model.parameters()))
    if hvd.rank() == 0:
        sizes = [r[3] for r in rolled_back]
        steps = [r[0] for r in rolled_back]
        line = (
            f"RESULT identical={identical} equal_ref={equal_ref} sizes={sizes} "
            f"rolled_back_to={steps} step={state.step}"
        )
        sys.stdout.write(line + "\n")  # one write: Hydra tags each write
        sys.stdout.flush()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
