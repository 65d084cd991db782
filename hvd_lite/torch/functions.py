"""Moving training state between ranks: parameters, optimizer state, Python objects."""

from typing import Any, Dict, List, Optional

import torch

from .. import basics, collectives, state
from .._submit import synchronize
from ..process_sets import global_process_set
from .mpi_ops import cpu_inplace, numpy_view


def broadcast_parameters(params, root_rank: int = 0, process_set=global_process_set) -> None:
    """Overwrites every rank's tensors with root_rank's, in place: a state_dict (by sorted key),
    named_parameters() / a list of (name, tensor) pairs, or a list of tensors."""
    if not isinstance(params, (dict, list, tuple)) and hasattr(params, "__iter__"):
        params = list(params)  # named_parameters() is a generator
    items = state.parameter_items(
        params,
        "tensor",
        "a state_dict, named_parameters() or a list of tensors",
        torch.Tensor,
        "torch.Tensor",
    )
    cpus = [cpu_inplace("broadcast_parameters", t) for _, t in items]
    # the numpy call broadcasts into the tensors' own memory (a CPU copy's for other devices)
    state.broadcast_parameters(
        [(key, numpy_view(c)) for (key, _), c in zip(items, cpus)], root_rank, process_set
    )
    for (_, t), c in zip(items, cpus):
        if c is not t:
            t.data.copy_(c)


def _describe(value: Any):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    return ("value", value)


def _zero_missing_grads(optimizer: torch.optim.Optimizer, model) -> None:
    """Horovod's preparation of an optimizer without state: a zero gradient for each parameter
    that requires one and has none (sparse for SparseAdam and for a model's sparse Embedding)."""
    sparse = set()
    if model is not None:
        sparse = {
            id(p)
            for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and m.sparse
            for p in m.parameters()
        }
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or id(p) in sparse:
                    p.grad = p.grad.to_sparse()


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer,
    root_rank: int = 0,
    model: Optional[torch.nn.Module] = None,
    process_set=global_process_set,
) -> None:
    """Makes every rank's optimizer state and hyper-parameters (lr, betas, ...) root_rank's.

    A rank whose state is empty (no step taken yet) gets root_rank's state created, and, as in
    Horovod, a zero gradient for each parameter that requires one and has none (sparse for the
    sparse Embeddings of `model`, and for SparseAdam); no step is taken, so no parameter changes."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError(
            "broadcast_optimizer_state does not support LBFGS (its state is not per parameter), as Horovod's"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"broadcast_optimizer_state expects a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"broadcast_optimizer_state: model must be a torch.nn.Module or None, got {type(model).__name__}"
        )
    basics.set_for("broadcast_optimizer_state", process_set)  # a bad set: before any change
    if not optimizer.state_dict()["state"]:
        _zero_missing_grads(optimizer, model)
    is_root = basics.rank() == root_rank
    sd: Dict[str, Any] = optimizer.state_dict() if is_root else {}  # read on the root only
    layout = None
    if is_root:
        layout = {
            "param_groups": sd["param_groups"],
            "state": {idx: {k: _describe(v) for k, v in st.items()} for idx, st in sd["state"].items()},
        }
    layout = state.broadcast_object(
        layout, root_rank, name="broadcast_optimizer_state.layout", process_set=process_set
    )
    new_state: Dict[Any, Dict[str, Any]] = {}
    tensors: List[torch.Tensor] = []
    names: List[str] = []
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
            tensors.append(tensor)
            names.append(f"broadcast_optimizer_state.{idx}.{key}")
    arrays = [numpy_view(cpu_inplace("broadcast_optimizer_state", t)) for t in tensors]
    for h in collectives.broadcast_group_("broadcast_optimizer_state", arrays, names, root_rank, process_set):
        synchronize(h)
    # checked after the broadcasts (which follow the root's layout), so that a rank that
    # raises here leaves none of the others waiting for it
    ours = [len(g["params"]) for g in optimizer.param_groups]
    theirs = [len(g["params"]) for g in layout["param_groups"]]
    if ours != theirs:
        raise ValueError(
            f"broadcast_optimizer_state: this rank's optimizer has parameter groups "
            f"of sizes {ours}, rank {root_rank}'s {theirs}; build the same optimizer "
            "on every rank"
        )
    if not is_root:
        optimizer.load_state_dict({"state": new_state, "param_groups": layout["param_groups"]})


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set=global_process_set
) -> Any:
    """root_rank's `obj` on every rank (pickled: use only among your own job's ranks)."""
    return state.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None, process_set=global_process_set) -> list:
    """Every rank's `obj`, as a list in rank order (pickled: use only among your own job's ranks)."""
    return state.allgather_object(obj, name, process_set)
