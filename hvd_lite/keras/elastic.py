"""horovod.keras.elastic's names: `run`, `KerasState` and the callbacks that keep a state's epoch
and batch and commit it during `model.fit` (docs/elastic.md). `run` is hvd_lite.tensorflow.elastic's,
which survives a rank's death inside model.fit's compiled step. The callbacks are of the Keras that
`tf.keras` names, as hvd_lite.keras.callbacks's are, and run under either Keras's fit."""

from typing import Any, Optional

from ..elastic import ObjectState, State
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from ..tensorflow.elastic import TensorFlowKerasState, run
from .callbacks import _Callback


class KerasState(TensorFlowKerasState):
    """The state of a Keras model and its optimizer, and any other values as attributes
    (horovod.keras.elastic's name for TensorFlowKerasState).

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default: the one the model was compiled with).
        kwargs: more values, exposed as attributes.
    """

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any):
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(_Callback):
    """Commits `state` every `batches_per_commit` batches and at the end of each epoch.

    Args:
        state: the elastic state.
        batches_per_commit: batches between commits (>= 1).
    """

    def __init__(self, state: State, batches_per_commit: int = 1):
        super().__init__()
        if (
            isinstance(batches_per_commit, bool)
            or not isinstance(batches_per_commit, int)
            or batches_per_commit < 1
        ):
            raise ValueError(f"batches_per_commit must be an int >= 1, got {batches_per_commit!r}")
        self.state = state
        """The state committed."""
        self.batches_per_commit = batches_per_commit
        """Batches between commits."""
        self.batches_remaining = batches_per_commit
        """Batches left before the next commit."""

    def on_train_begin(self, logs=None):
        """Starts counting batches afresh."""
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        """Commits when `batches_per_commit` batches have ended since the last commit."""
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        """Commits at each epoch's end."""
        self.state.commit()


class UpdateBatchStateCallback(_Callback):
    """Keeps `state.batch` at the last batch ended, and 0 after each epoch. Unlike Horovod's, it
    does not shorten the first epoch after a relaunch (Keras 3 does not take `params['steps']`
    changes): skip the batches done yourself, from `state.batch`."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state
        """The state whose `batch` is kept."""

    def on_batch_end(self, batch, logs=None):
        """Sets `state.batch` to the batch that ended."""
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        """Sets `state.batch` to 0."""
        self.state.batch = 0


class UpdateEpochStateCallback(_Callback):
    """Keeps `state.epoch` at the number of epochs done: its value at the start of `fit`, plus
    the epochs that ended since, however fit numbers them: called as Horovod's docs do
    (`epochs=epochs - state.epoch`, numbered from 0) or as Keras's own resumption does
    (`initial_epoch=state.epoch, epochs=epochs`, numbered from state.epoch)."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state
        """The state whose `epoch` is kept."""
        self.initial_epoch = getattr(state, "epoch")
        """`state.epoch` when training began."""
        self._first_epoch: Optional[int] = None  # fit's number for its first epoch

    def on_train_begin(self, logs=None):
        """Takes `state.epoch` as the starting point."""
        self.initial_epoch = getattr(self.state, "epoch")
        self._first_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        """Notes fit's number for its first epoch."""
        if self._first_epoch is None:
            self._first_epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        """Sets `state.epoch` to the starting point plus the epochs ended."""
        first = epoch if self._first_epoch is None else self._first_epoch
        self.state.epoch = self.initial_epoch + epoch - first + 1


__all__ = [
    "run",
    "State",
    "ObjectState",
    "KerasState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]
