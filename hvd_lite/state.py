"""State helpers: Python objects and parameter sets moved between ranks.

Objects travel pickled: broadcast_object and allgather_object unpickle what other ranks sent, so
use them only between processes you trust as much as your own code (the ranks of your own job).
"""
import pickle
from typing import Any, List, Optional, Tuple

import numpy as np

from . import basics
from ._submit import synchronize
from .collectives import allgather, broadcast_, broadcast_group_


def _pickled(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """root_rank's `obj` on every rank (pickled; see the module's trust note)."""
    name = name or basics.auto_name("broadcast_object")
    mine = _pickled(obj) if basics.rank() == root_rank else np.empty(0, np.uint8)
    size = np.array([mine.size], np.int64)
    broadcast_(size, root_rank, name=f"{name}.size")
    data = mine.copy() if basics.rank() == root_rank else np.empty(int(size[0]), np.uint8)
    broadcast_(data, root_rank, name=f"{name}.data")
    return obj if basics.rank() == root_rank else pickle.loads(data.tobytes())


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Every rank's `obj`, as a list in rank order (pickled; see the module's trust note)."""
    name = name or basics.auto_name("allgather_object")
    data = _pickled(obj)
    sizes = allgather(np.array([data.size], np.int64), name=f"{name}.size")
    gathered = allgather(data, name=f"{name}.data")
    ends = np.cumsum(sizes)
    return [pickle.loads(gathered[end - size:end].tobytes()) for size, end in zip(sizes, ends)]


def parameter_items(params, noun: str, takes: str, kind: type,
                    kind_name: str) -> List[Tuple[str, Any]]:
    """broadcast_parameters' (name, value) pairs: a dict's by sorted key, a list of (name, value)
    pairs as given, or a list of values named by their index; every value of type `kind`."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)):
        if all(isinstance(p, tuple) and len(p) == 2 for p in params):
            items = list(params)
            names = [n for n, _ in items]
            if len(set(names)) != len(names):
                raise ValueError(f"broadcast_parameters: duplicate names in the (name, {noun}) list")
        else:
            items = [(str(i), p) for i, p in enumerate(params)]
    else:
        raise TypeError(f"broadcast_parameters takes {takes}, got {type(params).__name__}")
    for key, value in items:
        if not isinstance(value, kind):
            raise TypeError(f"broadcast_parameters: parameter {key!r} is a {type(value).__name__}, "
                            f"not a {kind_name}")
    return items


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Overwrites every rank's parameters with root_rank's, in place: a dict (by sorted key), a
    list of (name, array) pairs, or a list of arrays. Every array is checked before any is sent."""
    items = parameter_items(params, "array",
                            "a dict, a list of (name, array) pairs or a list of arrays",
                            np.ndarray, "numpy.ndarray")
    handles = broadcast_group_("broadcast_parameters", [a for _, a in items],
                               [f"broadcast_parameters.{key}" for key, _ in items], root_rank)
    for h in handles:
        synchronize(h)
