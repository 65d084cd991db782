"""process_set= in hvd_lite.tensorflow and hvd_lite.keras: every call that takes one checks it
here. Until process sets reach hvd_lite's core, the global set (or None) is the only one
accepted; any other raises ValueError, so that no call silently runs on the wrong ranks."""
from .. import basics


class _GlobalProcessSet:
    """Every rank: Horovod's `global_process_set` (process_set_id 0)."""

    process_set_id = 0

    @property
    def ranks(self):
        return list(range(basics.size()))

    def size(self) -> int:
        return basics.size()

    def rank(self) -> int:
        return basics.rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, global)"


global_process_set = _GlobalProcessSet()


def check_process_set(fn: str, process_set) -> None:
    """Returns if `process_set` is None or the global set; ValueError for anything else."""
    if process_set is None or process_set is global_process_set:
        return
    raise ValueError(f"{fn}: process_set={process_set!r}: hvd_lite runs collectives on the global "
                     "process set only (process sets are not in its core yet); pass "
                     "process_set=None or hvd.global_process_set")


_NOT_YET = ("process sets are not implemented in hvd_lite yet: every collective runs on "
            "hvd.global_process_set")


class ProcessSet:
    """Not implemented: hvd_lite has the global process set only (constructing one raises)."""

    def __init__(self, ranks_or_comm=None):
        raise NotImplementedError(_NOT_YET)


def add_process_set(process_set):
    """Not implemented: raises NotImplementedError."""
    raise NotImplementedError(_NOT_YET)


def remove_process_set(process_set):
    """Not implemented: raises NotImplementedError."""
    raise NotImplementedError(_NOT_YET)


__all__ = ["global_process_set", "check_process_set", "ProcessSet", "add_process_set",
           "remove_process_set"]
