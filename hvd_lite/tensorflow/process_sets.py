"""Process sets in hvd_lite.tensorflow and hvd_lite.keras: the core's objects
(hvd_lite.process_sets), and how the adapter looks a set up.

A collective on tf tensors runs in its set's engine through the numpy layer, which checks the set
again when a graph runs (a set removed since the trace raises there). At call (trace) time:
`member_set` for a collective (TypeError for a non-set; for a set that is not registered or that
this rank is not in, a ValueError that is also tf.errors.InvalidArgumentError), `registered_set`
where a non-member is allowed (the gradient reductions, which leave a non-member's gradients as
they are)."""

import tensorflow as tf

from .. import basics
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set


class ProcessSetArgumentError(ValueError, tf.errors.InvalidArgumentError):
    """A collective on a process set this rank is not in, or on one that is not registered: a
    ValueError, as the numpy API raises, and a tf.errors.InvalidArgumentError, as Horovod's ops
    raise."""

    def __init__(self, node_def, op, message, *args):
        # TF's signature, which AutoGraph calls when it re-raises an error from a function it
        # traces with the user's lines added (any other signature becomes its StagingError)
        ValueError.__init__(self, message)
        tf.errors.InvalidArgumentError.__init__(self, node_def, op, message, *args)


def member_set(fn: str, process_set):
    """The registered set a collective on `process_set` (None: the global set) runs in; TypeError
    for a non-set, or ProcessSetArgumentError, before anything is sent, unless this rank is a
    member of a registered set."""
    try:
        return basics.set_for(fn, process_set)
    except ValueError as exc:
        raise ProcessSetArgumentError(None, None, str(exc)) from None


def registered_set(fn: str, process_set):
    """The registered set `process_set` (None: the global set) names, this rank a member or not;
    TypeError for a non-set, ValueError for a set that is not registered."""
    return basics.set_for(fn, process_set, member=False)


def set_by_id(fn: str, process_set_id):
    """The registered set with this id (Horovod's process_set_id); TypeError for a non-int,
    ValueError for an id no set has."""
    if isinstance(process_set_id, bool) or not isinstance(process_set_id, int):
        raise TypeError(
            f"{fn}: process_set_id must be an int (a ProcessSet's process_set_id), "
            f"got {type(process_set_id).__name__}"
        )
    try:
        return basics.registered(process_set_id)
    except ValueError as exc:
        raise ValueError(f"{fn}: {exc}") from None


__all__ = [
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "member_set",
    "ProcessSetArgumentError",
    "registered_set",
    "set_by_id",
]
