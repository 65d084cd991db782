"""State helpers: Python objects and parameter sets moved between ranks.

Objects travel pickled: broadcast_object and allgather_object unpickle what other ranks sent, so
use them only between processes you trust as much as your own code (the ranks of your own job).
"""

import pickle
from typing import Any, List, Optional, Tuple

import numpy as np

from . import basics
from ._submit import check_name, name_of, synchronize
from .collectives import allgather, broadcast_, broadcast_group_
from .exceptions import CollectiveError
from .process_sets import ProcessSet, global_process_set

_core = basics._core


def _pickled(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def _object_names(fn: str, name: Optional[str], process_set) -> Tuple[str, str]:
    """The names of an object helper's two collectives, checked before either is submitted."""
    base = name_of(fn, fn, name or None, basics.set_for(fn, process_set))
    check_name(fn, f"{base}.size")  # as long as the other
    return f"{base}.size", f"{base}.data"


def _unpicklable(fn: str, ranks: List[int]) -> CollectiveError:
    return CollectiveError(
        _core.hvdlRemoteError,
        f"{fn}: rank(s) {ranks} could not pickle their object (see the error there); nothing was sent",
    )


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> Any:
    """root_rank's `obj` on every rank (of the set; pickled, see the module's trust note). An
    object the root cannot pickle raises there, and CollectiveError on the other ranks."""
    fn = "broadcast_object"
    size_name, data_name = _object_names(fn, name, process_set)
    is_root = basics.rank() == root_rank
    mine, failure = np.empty(0, np.uint8), None
    if is_root:
        try:
            mine = _pickled(obj)
        except Exception as exc:  # noqa: BLE001 - raised below, after telling the others
            failure = exc
    size = np.array([-1 if failure else mine.size], np.int64)
    broadcast_(size, root_rank, name=size_name, process_set=process_set)
    if size[0] < 0:
        if failure is not None:
            raise failure
        raise _unpicklable(fn, [root_rank])
    data = mine.copy() if is_root else np.empty(int(size[0]), np.uint8)
    broadcast_(data, root_rank, name=data_name, process_set=process_set)
    return obj if is_root else pickle.loads(data.tobytes())


def allgather_object(
    obj: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> List[Any]:
    """Every rank's `obj` (of the set), as a list in rank order (pickled; see the module's trust
    note). An object a rank cannot pickle raises there, and CollectiveError on the others."""
    fn = "allgather_object"
    size_name, data_name = _object_names(fn, name, process_set)
    data, failure = np.empty(0, np.uint8), None
    try:
        data = _pickled(obj)
    except Exception as exc:  # noqa: BLE001 - raised below, after telling the others
        failure = exc
    sizes = allgather(
        np.array([-1 if failure else data.size], np.int64), name=size_name, process_set=process_set
    )
    if (sizes < 0).any():
        if failure is not None:
            raise failure
        ranks = basics.set_for(fn, process_set).ranks
        raise _unpicklable(fn, [ranks[int(r)] for r in np.flatnonzero(sizes < 0)])
    gathered = allgather(data, name=data_name, process_set=process_set)
    ends = np.cumsum(sizes)
    return [pickle.loads(gathered[end - size : end].tobytes()) for size, end in zip(sizes, ends)]


def parameter_items(params, noun: str, takes: str, kind: type, kind_name: str) -> List[Tuple[str, Any]]:
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
            raise TypeError(
                f"broadcast_parameters: parameter {key!r} is a {type(value).__name__}, not a {kind_name}"
            )
    return items


def broadcast_parameters(params, root_rank: int = 0, process_set: ProcessSet = global_process_set) -> None:
    """Overwrites every rank's parameters (of the set's ranks) with root_rank's, in place: a dict
    (by sorted key), a list of (name, array) pairs, or a list of arrays. Every array is checked
    before any is sent."""
    items = parameter_items(
        params,
        "array",
        "a dict, a list of (name, array) pairs or a list of arrays",
        np.ndarray,
        "numpy.ndarray",
    )
    handles = broadcast_group_(
        "broadcast_parameters",
        [a for _, a in items],
        [f"broadcast_parameters.{key}" for key, _ in items],
        root_rank,
        process_set,
    )
    for h in handles:
        synchronize(h)
