"""Horovod's rules for the arguments every framework adapter takes, written once: the deprecated
`average=` against `op=`, the deprecated `num_groups=` against `groups=`, and how `groups=k`
cuts a list of gradients into k fused calls. Framework-free: hvd_lite.torch, hvd_lite.tensorflow
and hvd_lite.keras all call these, so the adapters cannot drift apart (Horovod 0.28.1 is the
spec: horovod/common/util.py)."""

import os
import sys
import warnings
from types import FrameType
from typing import Any, List, Optional, Sequence, TypeVar

from ._submit import Average, Sum

T = TypeVar("T")

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # hvd_lite/, not hvd_lite_x/


def user_stacklevel(*also_inside: str) -> int:
    """warnings.warn's stacklevel, for a warning given by the function calling this one, that
    names the first line outside hvd_lite (and outside the folders `also_inside`: a framework
    whose code may lie between, as TensorFlow's): the user's, however many wrappers lie between."""
    inside = (_HERE,) + tuple(os.path.join(os.path.abspath(d), "") for d in also_inside)
    frame: Optional[FrameType] = sys._getframe(1)  # the function that warns, at level 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def resolve_op(fn: str, op: Any, average: Any, *also_inside: str) -> Any:
    """The op of Horovod's (op, average) pair, as Horovod's handle_average_backwards_compatibility
    gives it: both given is a ValueError; `average` alone (deprecated) gives Average or Sum with a
    DeprecationWarning naming the user's line; neither gives Average; `op` alone is returned as
    it is (the caller checks it). `also_inside`: see user_stacklevel."""
    if op is not None:
        if average is not None:
            raise ValueError(f"{fn}: the op parameter supersedes average; please provide only one of them")
        return op
    if average is not None:
        warnings.warn(
            f"{fn}: parameter `average` has been replaced with `op` (as in Horovod, where "
            "it is to be removed in v1.0); use op=Average or op=Sum",
            DeprecationWarning,
            stacklevel=user_stacklevel(*also_inside),
        )
        return Average if average else Sum
    return Average


def resolve_groups(fn: str, groups: Any, num_groups: int, *also_inside: str) -> Any:
    """`groups`, or Horovod's deprecated `num_groups` in its place (with a DeprecationWarning)
    when it is not 0 and `groups` is None."""
    if num_groups != 0:
        warnings.warn(
            f"{fn}: num_groups is deprecated (as in Horovod); use groups",
            DeprecationWarning,
            stacklevel=user_stacklevel(*also_inside),
        )
        if groups is None:
            return num_groups
    return groups


def split_list(items: Sequence[T], n: int) -> List[List[T]]:
    """`items` cut into `n` contiguous runs in order, as Horovod's split_list cuts them for
    `groups=n`: the first len(items) % n runs one item longer than the rest. Runs left empty
    (n larger than the list) are left out."""
    size, longer = divmod(len(items), n)
    runs, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < longer else 0)
        if end > start:
            runs.append(list(items[start:end]))
        start = end
    return runs
