"""DistributedOptimizer: averages gradients across ranks while backward is still running.

Each parameter gets a post-accumulate-grad hook. When backward has accumulated a parameter's
gradient `backward_passes_per_step` times, the hook submits its allreduce (in place on `p.grad`,
named after the parameter) to the engine and returns, so communication overlaps the rest of
backward; with `groups`, a group's allreduces are submitted together once all of its gradients
are ready. A torch.sparse gradient is reduced by allgathering its indices and values (Horovod's
sparse_allreduce_async), or densely with sparse_as_dense=True. `step()` calls `synchronize()`,
which submits what no hook did (a parameter without a gradient on this rank sends zeros, so every
rank submits every name), waits for all of them and writes the results into `p.grad`; then the
wrapped optimizer's own `step()` runs.

With op=Adasum the optimizer is Horovod's delta optimizer (_DistributedAdasumOptimizer): the
same hooks run the wrapped optimizer's step on each ready parameter alone and Adasum-allreduce the
change it made; step() adds the combined changes to the weights.

The attributes Horovod's users read keep Horovod's names: `_parameter_names` ({parameter: name},
'allreduce.noname.<group>.<index>' without named_parameters), `backward_passes_per_step` (change
it with `set_backward_passes_per_step`), `op`, `gradient_predivide_factor`, `sparse_as_dense`,
`process_set`.
"""

import contextlib
import warnings
from typing import TYPE_CHECKING, Any, Dict

import torch

from .._horovod_args import resolve_groups, split_list
from .._submit import check_name, check_op
from ..process_sets import ProcessSet, global_process_set
from .compression import Compression
from .mpi_ops import (
    Adasum,
    Average,
    Sum,
    _check_adasum,
    allreduce_group,
    poll,
    sparse_allreduce_async,
    synchronize,
)

if TYPE_CHECKING:  # the class it is mixed in front of, for the checker: made at run time
    from torch.optim import Optimizer as _WrappedOptimizer
else:
    _WrappedOptimizer = object


def _ended(handle) -> bool:
    """Whether a gradient's reduction has ended, done or failed (a sparse gradient's wait function
    carries its two allgathers' handles)."""
    return all(poll(h) for h in getattr(handle, "handles", (handle,)))


class _DistributedOptimizer(_WrappedOptimizer):
    """Mixed in front of the wrapped optimizer's class (see DistributedOptimizer)."""

    def _hvd_setup(
        self,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
    ):
        params = [p for g in self.param_groups for p in g["params"]]
        check_op("DistributedOptimizer", op)
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not (isinstance(x, tuple) and len(x) == 2) for x in named):
                raise ValueError(
                    "named_parameters must be a list of (name, parameter) pairs, as "
                    "model.named_parameters() gives"
                )
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"named_parameters has duplicate names: {', '.join(dups)}")
            by_param = {id(p): n for n, p in named}
            missing = [i for i, p in enumerate(params) if id(p) not in by_param]
            if missing:
                raise ValueError(
                    f"named_parameters does not name {len(missing)} of the optimizer's "
                    f"parameters (indices {missing[:10]} in param_groups order); pass "
                    "the named_parameters() of the model the optimizer was built on"
                )
        else:  # Horovod's automatic names
            by_param = {
                id(p): f"allreduce.noname.{i}.{j}"
                for i, g in enumerate(self.param_groups)
                for j, p in enumerate(g["params"])
            }
        if (
            isinstance(backward_passes_per_step, bool)
            or not isinstance(backward_passes_per_step, int)
            or backward_passes_per_step < 1
        ):
            raise ValueError(f"backward_passes_per_step must be an int > 0, got {backward_passes_per_step!r}")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError(f"gradient_predivide_factor applies to op=Average only, got op={op!r}")
        process_set = global_process_set if process_set is None else process_set
        if not isinstance(process_set, ProcessSet):
            raise TypeError(
                f"DistributedOptimizer: process_set must be a hvd_lite.ProcessSet, got "
                f"{type(process_set).__name__}"
            )
        if process_set.process_set_id is None:
            raise ValueError(
                f"DistributedOptimizer: {process_set} is not registered; pass it to "
                "hvd_lite.init(process_sets=[...]) or add_process_set() first"
            )
        # a rank outside the set steps on its own gradients, as in Horovod
        self.process_set = process_set
        self._hvd_reduces = bool(process_set.included()) and process_set.size() > 1
        self._parameter_names = {p: by_param[id(p)] for p in params}
        # the engine's names: prefixed, so that they never meet a name of the user's own calls
        self._hvd_names = {
            p: check_name("DistributedOptimizer", f"DistributedOptimizer.allreduce.{by_param[id(p)]}")
            for p in params
        }
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = bool(sparse_as_dense)
        self._hvd_requires_update = [p for p in params if p.requires_grad]
        self._hvd_delay: Dict[torch.Tensor, int] = {
            p: backward_passes_per_step for p in self._hvd_requires_update
        }
        # p -> (handle, compression ctx, sent, sent densely for a sparse gradient); for a sparse
        # gradient reduced sparsely, (function that waits, None, None, False)
        self._hvd_handles: Dict[torch.Tensor, tuple] = {}
        self._hvd_group_of, self._hvd_groups, self._hvd_ready = self._hvd_make_groups(groups)
        self._hvd_should_sync = True
        self._hvd_synchronized = False
        self._hvd_hooks = []
        if self._hvd_reduces:
            for p in self._hvd_requires_update:
                self._hvd_hooks.append(p.register_post_accumulate_grad_hook(self._hvd_hook))

    def _hvd_make_groups(self, groups):
        ps = self._hvd_requires_update
        if groups is None:
            return {}, [], {}
        if isinstance(groups, int) and not isinstance(groups, bool):
            if groups < 1:
                raise ValueError(f"groups must be a positive int or a list of lists, got {groups}")
            lists = split_list(ps, groups)  # contiguous runs, as Horovod cuts them
        else:
            if not isinstance(groups, list) or any(
                not isinstance(g, (list, tuple)) or any(not isinstance(p, torch.Tensor) for p in g)
                for g in groups
            ):
                raise ValueError(
                    f"groups must be a positive int or a list of lists of torch.Tensor, got {groups!r}"
                )
            lists = [list(g) for g in groups]
            seen = [id(p) for g in lists for p in g]
            if len(seen) != len(set(seen)):
                raise ValueError("groups: a parameter appears in more than one group")
            known = {id(p) for p in ps}
            if any(i not in known for i in seen):
                raise ValueError(
                    "groups: every parameter must be one of the optimizer's "
                    "parameters that require a gradient"
                )
        lists = [g for g in lists if g]
        group_of = {p: gi for gi, g in enumerate(lists) for p in g}
        return group_of, lists, {gi: set() for gi in range(len(lists))}

    # -- submission ---------------------------------------------------------------------------

    def _hvd_hook(self, p: torch.Tensor) -> None:
        if p in self._hvd_handles:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step "
                f"({self.backward_passes_per_step}) times before step(); increase "
                "backward_passes_per_step to "
                "accumulate gradients locally, or call step() (or synchronize()) after each backward"
            )
        self._hvd_delay[p] -= 1
        if self._hvd_delay[p] > 0:
            return
        gi = self._hvd_group_of.get(p)
        if gi is None:
            self._hvd_submit([p])
            return
        ready = self._hvd_ready[gi]
        ready.add(p)
        if len(ready) == len(self._hvd_groups[gi]):
            self._hvd_submit(self._hvd_groups[gi])
            ready.clear()

    def _hvd_submit(self, params) -> None:
        """Submits the allreduces of these parameters' gradients as one group: every gradient
        checked before any is submitted, then all in one engine round, so they can be fused. A
        sparse gradient (without sparse_as_dense) is reduced on its own, by allgathers."""
        dense, sent, ctxs, was_sparse = [], [], [], []
        for p in params:
            grad = p.grad
            if grad is None:  # not used on this rank: send zeros so that every rank sends every name
                grad = p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif grad.is_sparse:
                if not self.sparse_as_dense:
                    self._hvd_handles[p] = (
                        sparse_allreduce_async(grad, self._hvd_names[p], self.op, self.process_set),
                        None,
                        None,
                        False,
                    )
                    continue
                grad = grad.to_dense()  # reduced densely, made sparse again by synchronize()
            elif not grad.is_contiguous():
                grad = p.grad = grad.contiguous()
            s, ctx = self._compression.compress(grad)
            dense.append(p)
            sent.append(s)
            ctxs.append(ctx)
            was_sparse.append(p.grad.is_sparse)
        op, pre, post = self.op, 1.0, 1.0
        if self.gradient_predivide_factor != 1.0:
            f = self.gradient_predivide_factor
            op, pre, post = Sum, 1.0 / f, f / self.process_set.size()
        handles = allreduce_group(
            "allreduce_async_",
            sent,
            [self._hvd_names[p] for p in dense],
            True,
            op,
            pre,
            post,
            self.process_set,
        )
        for p, handle, ctx, s, sp in zip(dense, handles, ctxs, sent, was_sparse):
            self._hvd_handles[p] = (handle, ctx, s, sp)

    # -- the optimizer's interface ------------------------------------------------------------

    def synchronize(self) -> None:
        """Submits what the hooks have not, waits for every gradient's allreduce and writes the
        averages into p.grad."""
        if not self._hvd_reduces:
            self._hvd_synchronized = True
            return
        missing = [p for p in self._hvd_requires_update if p not in self._hvd_handles]
        if missing:
            self._hvd_submit(missing)
        for ready in self._hvd_ready.values():
            ready.clear()
        try:
            for p, (handle, ctx, sent, sparse) in self._hvd_handles.items():
                if callable(handle):  # a sparse gradient, reduced by allgathers
                    p.grad = handle()
                    continue
                synchronize(handle)
                if sparse:
                    p.grad = self._compression.decompress(sent, ctx).to_sparse()
                elif sent is not p.grad:
                    p.grad.copy_(self._compression.decompress(sent, ctx))
        finally:
            self._hvd_reset()
        self._hvd_synchronized = True

    def _hvd_reset(self) -> None:
        self._hvd_handles.clear()
        for ready in self._hvd_ready.values():
            ready.clear()
        for p in self._hvd_requires_update:
            self._hvd_delay[p] = self.backward_passes_per_step

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes backward_passes_per_step (and restarts the count of backward passes)."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be an int > 0, got {passes!r}")
        self.backward_passes_per_step = passes
        for p in self._hvd_requires_update:
            self._hvd_delay[p] = passes

    def load_state_dict(self, state_dict) -> None:
        """The wrapped optimizer's load_state_dict; forgets gradients not yet synchronized
        (their allreduces must not be in flight; those that failed, as after a rank's death
        before an elastic restore, have ended)."""
        if not all(_ended(entry[0]) for entry in self._hvd_handles.values()):
            raise AssertionError(
                "optimizer.load_state_dict() was called while gradient "
                "allreduces are in flight; call optimizer.synchronize() first"
            )
        self._hvd_reset()
        self._hvd_synchronized = False
        self._hvd_should_sync = True
        return super().load_state_dict(state_dict)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within this block step() does not synchronize (call synchronize() yourself first)."""
        self._hvd_should_sync = False
        try:
            yield
        finally:
            self._hvd_should_sync = True

    def step(self, closure=None):
        """Waits for the gradients' allreduces (unless in skip_synchronize()) and applies them."""
        if self._hvd_should_sync:
            if self._hvd_synchronized and not self._hvd_handles:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() "
                    "context after optimizer.synchronize(). The gradients are not "
                    "reduced again (as Horovod would); use `with "
                    "optimizer.skip_synchronize():` around step() to say so.",
                    stacklevel=2,
                )
            else:
                self.synchronize()
        self._hvd_synchronized = False
        return super().step(closure)

    step.hooked = True  # type: ignore[attr-defined]  # torch reads it: the base class's step already runs the optimizer's step hooks

    def _hvd_wrapped_step(self, closure=None):
        """The wrapped optimizer's own step()."""
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears the gradients; refuses while their allreduces are in flight."""
        if self._hvd_handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                "or optimizer.synchronize(): gradient allreduces are still in flight and would "
                "write into the cleared gradients. Call zero_grad() before backward or after step()."
            )
        return super().zero_grad(set_to_none)


class _DistributedAdasumOptimizer(_DistributedOptimizer):
    """op=Adasum: Horovod's delta optimizer, mixed in front of the wrapped optimizer's class.

    When a parameter's gradient is ready (the same hooks, counts and groups as the averaging
    optimizer's), the wrapped optimizer steps that parameter alone; the change it made, the local
    update, is taken out again (the parameter keeps its weights until step()) and Adasum-allreduced
    in the background under the parameter's name. step() waits for the combined updates and adds
    them to the weights; the wrapped optimizer's state (momentum, Adam's moments) follows this
    rank's own gradients, as in Horovod.
    """

    def _hvd_setup(self, named_parameters, compression, backward_passes_per_step, op, *rest):
        for p in (p for g in self.param_groups for p in g["params"] if p.requires_grad):
            _check_adasum("DistributedOptimizer", p, Adasum)
        super()._hvd_setup(named_parameters, compression, backward_passes_per_step, op, *rest)

    def _hvd_submit(self, params) -> None:
        """The local updates of these parameters, then their Adasum allreduces as one group."""
        sent, ctxs = [], []
        with torch.no_grad():
            for p in params:
                s, ctx = self._compression.compress(self._hvd_local_update(p))
                sent.append(s)
                ctxs.append(ctx)
        handles = allreduce_group(
            "DistributedOptimizer",
            sent,
            [self._hvd_names[p] for p in params],
            True,
            Adasum,
            1.0,
            1.0,
            self.process_set,
        )
        for p, handle, ctx, s in zip(params, handles, ctxs, sent):
            self._hvd_handles[p] = (handle, ctx, s, False)

    def _hvd_local_update(self, p: torch.Tensor) -> torch.Tensor:
        """What the wrapped optimizer's step changes `p` by (-lr * f(grad) for SGD), with `p` put
        back as it was. A parameter without a gradient on this rank steps on zeros."""
        if p.grad is None:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        start = p.detach().clone(memory_format=torch.contiguous_format)
        stashed = [g["params"] for g in self.param_groups]
        for g in self.param_groups:
            g["params"] = [p] if any(p is q for q in g["params"]) else []
        try:
            self._hvd_wrapped_step()
        finally:
            for g, params in zip(self.param_groups, stashed):
                g["params"] = params
        delta = p.detach() - start
        p.copy_(start)
        return delta

    def synchronize(self) -> None:
        """Nothing to do: step() waits for the updates (as Horovod's Adasum optimizer)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Refused: step() is where the combined updates are applied."""
        raise AssertionError(
            "Skipping synchronization is not supported with op=Adasum: step() applies the combined update"
        )
        yield  # a generator, for contextmanager

    def step(self, closure=None):
        """Adds every parameter's combined update to its weights (submitting the ones no hook
        has: a parameter with fewer than backward_passes_per_step passes steps on what it has)."""
        if not self._hvd_reduces:  # one rank in the set, or a rank outside it: a plain step
            return self._hvd_wrapped_step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        missing = [p for p in self._hvd_requires_update if p not in self._hvd_handles]
        try:
            if missing:
                self._hvd_submit(missing)
            with torch.no_grad():
                for p, (handle, ctx, sent, _) in self._hvd_handles.items():
                    synchronize(handle)
                    p.add_(self._compression.decompress(sent, ctx))
        finally:
            self._hvd_reset()
        return loss

    step.hooked = True  # type: ignore[attr-defined]  # as the averaging optimizer's step


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step: int = 1,
    op=Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups=None,
    sparse_as_dense: bool = False,
    process_set=global_process_set,
) -> torch.optim.Optimizer:
    """Wraps `optimizer` so that step() applies gradients averaged across ranks.

    The result is an instance of a subclass of the optimizer's class with the same name, sharing
    its param_groups, state and defaults (so state_dict, load_state_dict and LR schedulers keep
    working); build LR schedulers on the returned optimizer. With `process_set`, gradients are
    averaged over that set's ranks only; ranks outside it step on their own gradients. With
    op=Adasum, each rank's update (the wrapped optimizer's step on its own gradients) is combined
    by Adasum instead, and step() applies the combined update (docs/adasum.md).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("the optimizer is already a DistributedOptimizer")
    groups = resolve_groups("DistributedOptimizer", groups, num_groups)
    base = type(optimizer)
    mixin = _DistributedAdasumOptimizer if isinstance(op, int) and op == Adasum else _DistributedOptimizer
    cls: Any = type(
        base.__name__,
        (mixin, base),  # made at run time
        {"__module__": base.__module__, "__qualname__": base.__qualname__},
    )
    wrapped = cls.__new__(cls)
    # Share everything but instance attributes bound to the old object (an LR scheduler built
    # on it wraps its step).
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in ("step", "zero_grad")})
    wrapped._hvd_setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
    )
    return wrapped
