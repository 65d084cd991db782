"""Moving training state between ranks: parameters, optimizer state, Python objects."""
from typing import Any, Optional

import torch

from .. import basics, state
from .mpi_ops import broadcast_async_, synchronize


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Overwrites every rank's tensors with root_rank's, in place: a state_dict (by sorted key),
    named_parameters() / a list of (name, tensor) pairs, or a list of tensors."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        params = list(params)
        if all(isinstance(p, tuple) and len(p) == 2 for p in params):
            items = params
            names = [n for n, _ in items]
            if len(set(names)) != len(names):
                raise ValueError("broadcast_parameters: duplicate names in the (name, tensor) list")
        else:
            items = [(str(i), p) for i, p in enumerate(params)]
    else:
        raise TypeError("broadcast_parameters takes a state_dict, named_parameters() or a list of "
                        f"tensors, got {type(params).__name__}")
    for key, value in items:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {key!r} is a {type(value).__name__}, not a "
                            "torch.Tensor")
    handles = [broadcast_async_(value, root_rank, name=f"broadcast_parameters.{key}")
               for key, value in items]
    for h in handles:
        synchronize(h)


def _describe(value: Any):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    return ("value", value)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Makes every rank's optimizer state and hyper-parameters (lr, betas, ...) root_rank's.

    A rank whose state is empty (no step taken yet) gets it created; no parameter changes."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise TypeError("broadcast_optimizer_state does not support LBFGS (its state is not per "
                        "parameter)")
    is_root = basics.rank() == root_rank
    sd = optimizer.state_dict() if is_root else None
    layout = None
    if is_root:
        layout = {
            "param_groups": sd["param_groups"],
            "state": {idx: {k: _describe(v) for k, v in st.items()}
                      for idx, st in sd["state"].items()},
        }
    layout = state.broadcast_object(layout, root_rank, name="broadcast_optimizer_state.layout")
    ours = [len(g["params"]) for g in optimizer.param_groups]
    theirs = [len(g["params"]) for g in layout["param_groups"]]
    if ours != theirs:
        raise ValueError(f"broadcast_optimizer_state: this rank's optimizer has parameter groups "
                         f"of sizes {ours}, rank {root_rank}'s {theirs}; build the same optimizer "
                         "on every rank")
    new_state, handles = {}, []
    for idx in sorted(layout["state"]):
        new_state[idx] = {}
        for key in sorted(layout["state"][idx]):
            desc = layout["state"][idx][key]
            if desc[0] == "value":
                new_state[idx][key] = desc[1]
                continue
            if is_root:
                tensor = sd["state"][idx][key].detach().to("cpu").contiguous()
            else:
                tensor = torch.empty(desc[1], dtype=desc[2])
            new_state[idx][key] = tensor
            handles.append(broadcast_async_(tensor, root_rank,
                                            name=f"broadcast_optimizer_state.{idx}.{key}"))
    for h in handles:
        synchronize(h)
    if not is_root:
        optimizer.load_state_dict({"state": new_state, "param_groups": layout["param_groups"]})


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """root_rank's `obj` on every rank (pickled: use only among your own job's ranks)."""
    return state.broadcast_object(obj, root_rank, name)


def allgather_object(obj: Any, name: Optional[str] = None) -> list:
    """Every rank's `obj`, as a list in rank order (pickled: use only among your own job's ranks)."""
    return state.allgather_object(obj, name)
