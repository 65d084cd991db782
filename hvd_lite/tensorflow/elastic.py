"""horovod.tensorflow.elastic's names: `run`, `TensorFlowKerasState` and `TensorFlowState` for
elastic training in eager TensorFlow 2 (hvd_lite.elastic's State and run, with Keras models,
optimizers and tf.Variables as state; docs/elastic.md)."""

import functools
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from .. import basics
from .. import elastic as _elastic
from ..elastic import ObjectState, State
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .functions import broadcast_object, broadcast_variables
from .mpi_ops import graph_failure


def run(func: Callable) -> Callable:
    """hvd_lite.elastic.run for TensorFlow (horovod.tensorflow.elastic.run). A collective that
    fails inside a tf.function (model.fit's step, a traced DistributedGradientTape) reaches
    Python as a tf.errors.UnknownError, as TensorFlow turns an op's exception into one; it is
    raised as the HorovodInternalError it was (mpi_ops.graph_failure), so the job survives it as
    it survives an eager one."""
    if not callable(func):
        raise TypeError(f"hvd_lite.tensorflow.elastic.run decorates a function, got {func!r}")

    @functools.wraps(func)
    def failures_as_raised(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as exc:
            failure = graph_failure(exc)
            if failure is None:
                raise
            raise failure from exc

    return _elastic.run(failures_as_raised)


def _eager(fn: str) -> None:
    if not tf.executing_eagerly():
        raise NotImplementedError(
            f"hvd_lite.tensorflow.elastic.{fn} works in eager TensorFlow 2 only; TensorFlow 1 graphs "
            "and sessions are not supported"
        )


def _optimizer_variables(optimizer) -> List[tf.Variable]:
    """An optimizer's variables: a list in Keras 3, a method in Keras 2."""
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _values(variables: Sequence[tf.Variable]) -> List[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in variables]


def _assign(variables: Sequence[tf.Variable], values: Sequence[np.ndarray], what: str) -> None:
    if len(variables) != len(values):
        raise ValueError(
            f"the saved state has {len(values)} {what} variable(s), this one has {len(variables)}: "
            "make the model and optimizer as the committed run did (and build them)"
        )
    for var, value in zip(variables, values):
        var.assign(value)


class TensorFlowKerasState(ObjectState):
    """The state of a Keras model and its optimizer (their variables), and any other values as
    ObjectState's attributes; eager TensorFlow 2.

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default: the one the model was compiled with).
        backend: accepted for Horovod's signature; must be None (TensorFlow 1 sessions are not
            supported).
        kwargs: more values, exposed as attributes.
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any):
        _eager(type(self).__name__)
        if backend is not None:
            raise NotImplementedError(
                f"{type(self).__name__}(backend=...) is for TensorFlow 1 sessions, which hvd_lite's "
                "elastic states do not support; leave it out"
            )
        if hasattr(model, "built") and not model.built:
            raise ValueError("the model must be built first: call model.build(input_shape) or run it once")
        self.model = model
        """The Keras model."""
        self.optimizer: Any = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        """Its optimizer (None: the model's variables only)."""
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **kwargs)

    def _variables(self):
        return list(self.model.variables), _optimizer_variables(self.optimizer)

    def _save_model(self) -> None:
        model_vars, opt_vars = self._variables()
        self._saved_model_state = _values(model_vars)
        self._saved_optimizer_state = _values(opt_vars)

    def _load_model(self) -> None:
        model_vars, opt_vars = self._variables()
        optimizer = self.optimizer
        if len(opt_vars) != len(self._saved_optimizer_state) and hasattr(optimizer, "build"):
            optimizer.build(self.model.trainable_variables)  # a fresh process: not built yet
            opt_vars = _optimizer_variables(optimizer)
        _assign(model_vars, self._saved_model_state, "model")
        _assign(opt_vars, self._saved_optimizer_state, "optimizer")

    def save(self) -> None:
        """Saves the model's and optimizer's variables, and the other values."""
        self._save_model()
        super().save()

    def restore(self) -> None:
        """Assigns the saved variables back, and sets the other values back."""
        self._load_model()
        super().restore()

    def sync(self) -> None:
        """Broadcasts rank 0's model and optimizer variables and values, and saves them."""
        model_vars, opt_vars = self._variables()
        broadcast_variables(model_vars + opt_vars, root_rank=0)
        self._save_model()
        super().sync()

    def _snapshot(self) -> Any:
        return {
            "model": self._saved_model_state,
            "optimizer": self._saved_optimizer_state,
            "objects": super()._snapshot(),
        }

    def _load_snapshot(self, snapshot: Any) -> None:
        self._saved_model_state = snapshot["model"]
        self._saved_optimizer_state = snapshot["optimizer"]
        self._load_model()
        super()._load_snapshot(snapshot["objects"])


class TensorFlowState(ObjectState):
    """The state of a list of tf.Variables, and any other values as ObjectState's attributes;
    eager TensorFlow 2.

    Args:
        variables: the tf.Variables to keep (required: eager TensorFlow has no global list).
        session: accepted for Horovod's signature; must be None.
        kwargs: more values, exposed as attributes.
    """

    def __init__(self, variables: Optional[Sequence[tf.Variable]] = None, session: Any = None, **kwargs: Any):
        _eager("TensorFlowState")
        if session is not None:
            raise NotImplementedError(
                "TensorFlowState(session=...) is for TensorFlow 1, which is not supported"
            )
        if variables is None:
            raise ValueError("TensorFlowState needs variables= (eager TensorFlow has no global list of them)")
        self.variables = list(variables)
        """The variables kept."""
        self._saved_variables = _values(self.variables)
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **kwargs)

    def save(self) -> None:
        """Saves the variables' values, and the other values."""
        self._saved_variables = _values(self.variables)
        super().save()

    def restore(self) -> None:
        """Assigns the saved values back, and sets the other values back."""
        _assign(self.variables, self._saved_variables, "tf")
        super().restore()

    def sync(self) -> None:
        """Broadcasts rank 0's variables and values, and saves them."""
        broadcast_variables(self.variables, root_rank=0)
        self._saved_variables = _values(self.variables)
        super().sync()

    def _snapshot(self) -> Any:
        return {"variables": self._saved_variables, "objects": super()._snapshot()}

    def _load_snapshot(self, snapshot: Any) -> None:
        self._saved_variables = snapshot["variables"]
        _assign(self.variables, self._saved_variables, "tf")
        super()._load_snapshot(snapshot["objects"])


__all__ = [
    "run",
    "State",
    "ObjectState",
    "TensorFlowKerasState",
    "TensorFlowState",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]
