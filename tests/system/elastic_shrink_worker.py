"""A tiny elastic job for tests/system/test_elastic.py's shrink mode (Open MPI with ULFM), run by
`hvd_lite.run --min-np ...`: ranks die and the survivors go on in place.

The model is a two-layer perceptron trained by SGD with momentum, in NumPy (an ObjectState of its
weights and momentum, the gradients averaged by one all-reduce each, which the engine fuses) or, with
EW_FRAMEWORK=torch, in PyTorch (a TorchState, hvd_lite.torch's DistributedOptimizer; on the device
EW_DEVICE names, "cpu" by default, such as "cuda": its gradients then take hvd_lite's device path
in a CUDA build). NumPy by default:
four ranks importing PyTorch (and torch._dynamo, which its first optimizer imports) take about 5 s of
CPU each, most of such a test's time on a small machine; what is tested under the model is the same.

Each step's data depends only on (step, rank). The process started as world rank EW_VICTIM (then
EW_VICTIM2, if set) dies at step EW_KILL_AT (EW_KILL_AT2), how EW_HOW says:
  between  SIGKILL in Python, between collectives (the others are in the next round's negotiation);
  send     SIGKILL inside the data phase of its next step's all-reduce, before its first send: a
           message (HVD_LITE_SHM=0) or a shared-memory step (the fused gradients);
  send3    the same, before its third send (mid-ring, with HVD_LITE_ALLREDUCE_ALGO=ring).
Victims due at the same step die together, as a host's ranks do when it is lost. The process started
as world rank EW_DIE_IN_REFORM dies in the survivors' re-forming after the first death: the shrink
done, before it builds its engine on the survivors (the others' build then fails, and they shrink
again). The process started as world rank EW_STALL_IN_SHRINK stops (sleeps) as it is about to shrink,
so the others wait in the shrink (MPIX_Comm_shrink) for it; every survivor writes its pid in
`shrinking<world rank>` in EW_MARKERS as it starts its shrink. With
EW_RESTORE_RAISES set to a world rank, that survivor's state.restore() raises instead. With EW_HOSTS (a
discovery script's hosts file), the new rank 0 replaces it with EW_HOSTS_AFTER at the reset
after the last death (0.5 s after it, when the launcher has read the victims' ends from their rank
wrappers); EW_RESET_PAUSE: seconds every survivor then waits (the launcher's watcher reads the file).
A reset callback records the restored state (the commit the survivors rolled back to); after
training every survivor trains a fresh copy from that record over the same steps through the same
collectives (the reference), and rank 0 prints one RESULT line: whether every rank's weights are
identical (bit for bit), whether they match the reference (to float32 rounding: which gradients fuse
depends on timing, and with it the ring's order of summation), the sizes after each reset, the step.
"""

import contextlib
import copy
import os
import signal
import sys
import time

import numpy as np

from hvd_lite import basics

FRAMEWORK = os.environ.get("EW_FRAMEWORK", "numpy")
DEVICE = os.environ.get("EW_DEVICE", "cpu")
if FRAMEWORK == "torch":
    import torch
    from elastic_worker import one_step as torch_step  # restart mode's worker: the same data and step

    import hvd_lite.torch as hvd
else:
    import hvd_lite as hvd

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


LR, MOMENTUM = 0.05, 0.9


class NumpyJob:
    """The perceptron in NumPy: its weights and momentum buffers are the ObjectState's."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.params = {
            "w1": rng.standard_normal((4, 8)).astype(np.float32) * 0.5,
            "b1": np.zeros(8, np.float32),
            "w2": rng.standard_normal((8, 1)).astype(np.float32) * 0.5,
            "b2": np.zeros(1, np.float32),
        }
        self.state = hvd.elastic.ObjectState(
            params=self.params, momentum={k: np.zeros_like(v) for k, v in self.params.items()}, step=0
        )

    def step(self, step):
        self.state.params, self.state.momentum = self.train(self.state.params, self.state.momentum, step)

    @staticmethod
    def train(params, momentum, step):
        x = np.random.default_rng(1000 * step + hvd.rank()).standard_normal((8, 4)).astype(np.float32)
        y = x.sum(1, keepdims=True) * 0.5 + 1.0
        h = np.tanh(x @ params["w1"] + params["b1"])
        d_out = 2.0 * (h @ params["w2"] + params["b2"] - y) / y.size
        dh = (d_out @ params["w2"].T) * (1.0 - h * h)
        grads = {"w1": x.T @ dh, "b1": dh.sum(0), "w2": h.T @ d_out, "b2": d_out.sum(0)}
        # one all-reduce each, submitted together: the engine fuses them (the optimizers' way)
        handles = {k: hvd.allreduce_async(g, op=hvd.Average, name=f"grad.{k}") for k, g in grads.items()}
        momentum = {k: MOMENTUM * momentum[k] + hvd.synchronize(h) for k, h in handles.items()}
        return {k: params[k] - LR * momentum[k] for k in params}, momentum

    def snapshot(self):
        return copy.deepcopy((self.state.params, self.state.momentum))

    def weights(self):
        return [self.state.params[k] for k in sorted(self.state.params)]

    def reference(self, snapshot, step0):
        params, momentum = snapshot
        for step in range(step0, STEPS):
            params, momentum = self.train(params, momentum, step)
        return [params[k] for k in sorted(params)]


class TorchJob:
    """The same perceptron in PyTorch, in a TorchState."""

    def __init__(self):
        self.model, self.opt = self.make()
        self.state = hvd.elastic.TorchState(self.model, self.opt, step=0)

    @staticmethod
    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        model.to(DEVICE)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    def step(self, step):
        torch_step(self.state.model, self.state.optimizer, step)

    def snapshot(self):
        return copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.opt.state_dict())

    def weights(self):
        return [p.detach().cpu().numpy().copy() for p in self.model.parameters()]

    def reference(self, snapshot, step0):
        model, opt = self.make()
        model.load_state_dict(snapshot[0])
        opt.load_state_dict(snapshot[1])
        for step in range(step0, STEPS):
            torch_step(model, opt, step)
        return [p.detach().cpu().numpy().copy() for p in model.parameters()]


def die_together(ranks):
    """SIGKILL of every process of `ranks` at once, as a host's power cut takes them: each writes its
    pid in EW_MARKERS and waits; the one that finds them all kills the others, then itself. (Each
    dying at its own pace, a survivor could hear of one death, shrink with the other still in, and
    shrink again.)"""
    markers = os.environ["EW_MARKERS"]
    mine = os.path.join(markers, f"pid{WORLD_RANK}")
    with open(mine + ".new", "w") as f:
        f.write(str(os.getpid()))
    os.replace(mine + ".new", mine)
    paths = [os.path.join(markers, f"pid{r}") for r in ranks]
    deadline = time.monotonic() + 30
    while not all(map(os.path.exists, paths)) and time.monotonic() < deadline:
        time.sleep(0.001)
    for path in paths:  # a victim that never came (past the deadline), or one already dead: skipped
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            with open(path) as f:
                pid = int(f.read())
            if pid != os.getpid():
                os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def maybe_die(step):
    if DEATHS.get(WORLD_RANK) != step:
        return
    if HOW == "between":
        together = [r for r, s in DEATHS.items() if s == step]
        if len(together) > 1:
            die_together(together)
        os.kill(os.getpid(), signal.SIGKILL)
    basics._engine()._inject_fault("kill", 3 if HOW == "send3" else 1)


def die_in_reform():
    """From now on this process dies (SIGKILL) when it would build an engine: the next one is the
    survivors' after a death, once the shrink is done."""

    def engine_then_die(*_args):
        os.kill(os.getpid(), signal.SIGKILL)

    basics._core.Engine = engine_then_die


def mark_shrinks():
    """Writes its pid in `shrinking<world rank>` in EW_MARKERS as this process starts a shrink, and
    stops there for good if it is EW_STALL_IN_SHRINK."""
    shrink = basics._core.mpi_shrink

    def marked(*args):
        path = os.path.join(os.environ["EW_MARKERS"], f"shrinking{WORLD_RANK}")
        with open(path + ".new", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".new", path)
        if int(os.environ["EW_STALL_IN_SHRINK"]) == WORLD_RANK:
            time.sleep(3600)
        return shrink(*args)

    basics._core.mpi_shrink = marked


def main():
    hvd.init()
    if int(os.environ.get("EW_DIE_IN_REFORM", "-1")) == WORLD_RANK:
        die_in_reform()
    if "EW_STALL_IN_SHRINK" in os.environ:
        mark_shrinks()
    job = TorchJob() if FRAMEWORK == "torch" else NumpyJob()
    state = job.state
    rolled_back = []  # (step, snapshot, size) as restored, at each reset

    def record():
        rolled_back.append((state.step, job.snapshot(), hvd.size()))
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
            job.step(state.step)
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                state.commit()

    train(state)
    mine = job.weights()
    everyone = hvd.allgather_object([w.tobytes() for w in mine])
    identical = all(w == everyone[0] for w in everyone)
    step0, snapshot, _ = rolled_back[-1]
    ref = job.reference(snapshot, step0)
    # Equal up to float32 rounding: the ring's reduction order follows each tensor's place in a
    # fused buffer, and which gradients fuse depends on timing, in the run as in the reference.
    equal_ref = all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(mine, ref))
    if hvd.rank() == 0:
        sizes = [r[2] for r in rolled_back]
        steps = [r[0] for r in rolled_back]
        line = (
            f"RESULT identical={identical} equal_ref={equal_ref} sizes={sizes} "
            f"rolled_back_to={steps} step={state.step}"
        )
        if DEVICE != "cpu":  # the steps the engine the survivors built ran on device memory
            line += f"\nDEVICE_STEPS {basics._engine().stats()['device_steps']}"
        sys.stdout.write(line + "\n")  # one write: Hydra tags each write
        sys.stdout.flush()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
