"""horovod.torch.elastic's names: `run`, `TorchState` and `ElasticSampler` for elastic training
(hvd_lite.elastic's State and run, with PyTorch's models, optimizers and samplers as state)."""

import copy
import math
import random
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.utils.data

from .. import basics
from ..elastic import ObjectState, State, run
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset over the ranks, as DistributedSampler does, and after a reset splits the
    samples this epoch has not processed yet over the ranks there are now. Put it in a TorchState,
    call `record_batch` after each batch and `set_epoch` at the end of each epoch.

    Args:
        dataset: the dataset (its length must not change).
        shuffle: shuffle the indices each epoch (the same order on every rank).
        seed: the shuffle's seed, the same on every rank.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        """The dataset sampled."""
        self.shuffle = bool(shuffle)
        """Whether the indices are shuffled each epoch."""
        self.seed = int(seed)
        """The shuffle's seed (plus the epoch)."""
        self.epoch = 0
        """The epoch, set by set_epoch."""
        self.processed_num = 0
        """Samples of this epoch processed by all ranks together, counted by record_batch."""
        self.num_replicas = 1
        """The ranks the samples are split over (the job's size at the last reset)."""
        self.rank = 0
        """This rank's share (its rank at the last reset)."""
        self.remaining_indices: List[int] = []
        """The epoch's indices not processed yet."""
        self.num_samples = 0
        """How many indices this rank gets."""
        self.total_size = 0
        """num_samples times num_replicas (the remaining indices, padded by repeating)."""
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` with nothing processed (call it at the end of an epoch)."""
        self.epoch = int(epoch)
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Counts a batch of `batch_size` samples per rank as processed."""
        self.processed_num += int(batch_size) * self.num_replicas

    def state_dict(self) -> Dict[str, int]:
        """The epoch and the samples processed in it."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: Dict[str, int]) -> None:
        """Takes a state_dict() and splits what remains of its epoch again."""
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Splits the epoch's unprocessed indices over the job's ranks as they are now."""
        self.num_replicas = basics.size() if basics.is_initialized() else 1
        self.rank = basics.rank() if basics.is_initialized() else 0
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num :]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        if indices:
            while len(indices) < self.total_size:
                indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class _Handler:
    """Saves, restores and syncs one value of a TorchState that PyTorch owns."""

    def __init__(self, value: Any):
        self.value = value
        self.saved: Any = None
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        raise NotImplementedError


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


_HANDLERS: Tuple[Tuple[type, type], ...] = (
    (torch.nn.Module, _ModelHandler),
    (torch.optim.Optimizer, _OptimizerHandler),
    (ElasticSampler, _SamplerHandler),
)


class TorchState(ObjectState):
    """The state of a PyTorch training loop: models, optimizers and ElasticSamplers (by their
    state_dict), and any other values as ObjectState's attributes.

    Args:
        model: a torch.nn.Module, or None.
        optimizer: a torch.optim.Optimizer (hvd_lite's DistributedOptimizer too), or None.
        kwargs: more values, exposed as attributes; modules, optimizers and samplers among them
            are handled as `model` and `optimizer` are.
    """

    _handlers: Dict[str, _Handler]

    def __init__(
        self,
        model: Optional[torch.nn.Module] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        **kwargs: Any,
    ):
        kwargs.update(model=model, optimizer=optimizer)
        handlers: Dict[str, _Handler] = {}
        plain: Dict[str, Any] = {}
        for name, value in kwargs.items():
            kind = next((h for t, h in _HANDLERS if isinstance(value, t)), None)
            if kind is None:
                plain[name] = value
            else:
                handlers[name] = kind(value)
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **plain)

    def save(self) -> None:
        """Saves the state_dicts of the models, optimizers and samplers, and the other values."""
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        """Loads the saved state_dicts back, and sets the other values back."""
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        """Broadcasts rank 0's parameters, optimizer state, sampler state and values."""
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
            handlers[name].save()
        super().__setattr__(name, value)

    def _snapshot(self) -> Any:
        return {
            "handlers": {name: h.saved for name, h in self._handlers.items()},
            "objects": super()._snapshot(),
        }

    def _load_snapshot(self, snapshot: Any) -> None:
        for name, saved in snapshot["handlers"].items():
            if name not in self._handlers:
                raise ValueError(
                    f"the commit holds {name!r}, which this TorchState does not have "
                    f"(it has {sorted(self._handlers)}): make the state as the committed run did"
                )
            self._handlers[name].saved = saved
            self._handlers[name].restore()
        super()._load_snapshot(snapshot["objects"])


__all__ = [
    "run",
    "State",
    "ObjectState",
    "TorchState",
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]
