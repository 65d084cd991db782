"""An elastic Keras 3 job for tests/system/test_elastic.py's shrink mode: `model.fit` with
hvd_lite.keras's elastic callbacks inside `hvd.elastic.run`, as Horovod's docs show it, run by
`hvd_lite.run --elastic-mode shrink -np 3 --min-np 2`.

The process started as world rank 1 SIGKILLs itself before batch KILL_BATCH of epoch KILL_EPOCH:
the others fail in that batch's all-reduce, inside fit's compiled step. The commits come at each
epoch's end (CommitStateCallback every STEPS batches: Keras 3's fit cannot start an epoch in its
middle, so a commit made there could not be resumed from), so the survivors roll back to the end of
epoch KILL_EPOCH - 1 and fit again from `initial_epoch=state.epoch`. Each batch's data depends only
on (batch, rank). A reset callback records the state restored; after training every survivor
builds a fresh model and optimizer, loads that record and fits them over the same epochs through
the same collectives (the reference), and rank 0 prints one RESULT line: whether every rank's
weights are identical (bit for bit), whether they match the reference's (to float32 rounding),
whether the state restored was, bit for bit, the model's and optimizer's at the end of the epoch
it went back to, the sizes after each reset, the (epoch, batch) each reset went back to, the
state's epoch and batch at the end, and how many batches rank 0 saw end.
"""

import os
import signal
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hvd_lite.keras as hvd  # noqa: E402

EPOCHS, STEPS, BATCH = 4, 5, 8
KILL_EPOCH, KILL_BATCH = 2, 3
WORLD_RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))


def data(rank):
    """This rank's (x, y): STEPS batches, the same every epoch."""
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((STEPS * BATCH, 4)).astype(np.float32)
    return x, (x.sum(1, keepdims=True) * 0.5 + 1.0).astype(np.float32)


def make():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
    return model


def fit(model, initial_epoch, callbacks):
    x, y = data(hvd.rank())
    model.fit(
        x,
        y,
        batch_size=BATCH,
        shuffle=False,
        initial_epoch=initial_epoch,
        epochs=EPOCHS,
        callbacks=callbacks,
        verbose=0,
    )


def values(model):
    """Copies of the model's and its optimizer's variables."""
    return [v.numpy().copy() for v in list(model.variables) + list(model.optimizer.variables)]


class DieMidEpoch(keras.callbacks.Callback):
    """World rank 1 dies before batch KILL_BATCH of epoch KILL_EPOCH; counts the batches ended and
    keeps the variables at each epoch's end."""

    def __init__(self):
        super().__init__()
        self.epoch, self.ended = -1, 0
        self.at_end = {}  # epochs done -> values() then

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self.at_end[epoch + 1] = values(self.model)

    def on_train_batch_begin(self, batch, logs=None):
        if WORLD_RANK == 1 and (self.epoch, batch) == (KILL_EPOCH, KILL_BATCH):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        self.ended += 1


def main():
    hvd.init()
    model = make()
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    rolled_back = []  # ((epoch, batch), values(model), size) as restored, at each reset

    def record():
        rolled_back.append(((state.epoch, state.batch), values(model), hvd.size()))

    state.register_reset_callbacks([record])
    death = DieMidEpoch()
    callbacks = [  # the state updated before it is committed
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=STEPS),
        death,
    ]

    @hvd.elastic.run
    def train(state):
        fit(model, state.epoch, callbacks)

    train(state)
    mine = [v.numpy() for v in model.trainable_variables]
    everyone = hvd.allgather_object([w.tobytes() for w in mine])
    identical = all(w == everyone[0] for w in everyone)
    (epoch0, _), restored, _ = rolled_back[-1]
    committed = death.at_end[epoch0]
    same_as_committed = len(restored) == len(committed) and all(
        np.array_equal(a, b) for a, b in zip(restored, committed)
    )
    ref = make()
    ref.optimizer.build(ref.trainable_variables)
    ref_vars = list(ref.variables) + list(ref.optimizer.variables)
    assert len(ref_vars) == len(restored), (len(ref_vars), len(restored))
    for v, value in zip(ref_vars, restored):
        v.assign(value)
    fit(ref, epoch0, [])
    # Equal up to float32 rounding: fit's step is traced anew for the reference
    equal_ref = all(
        np.allclose(a, b.numpy(), rtol=1e-5, atol=1e-6) for a, b in zip(mine, ref.trainable_variables)
    )
    if hvd.rank() == 0:
        line = (
            f"RESULT identical={identical} equal_ref={equal_ref} restored={same_as_committed} "
            f"sizes={[r[2] for r in rolled_back]} "
            f"rolled_back_to={[r[0] for r in rolled_back]} epoch={state.epoch} batch={state.batch} "
            f"batches={death.ended}"
        )
        sys.stdout.write(line + "\n")  # one write: the launcher tags each write
        sys.stdout.flush()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
