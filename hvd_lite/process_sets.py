"""Process sets: collectives among a subset of the ranks, as in Horovod.

    evens = hvd.add_process_set([0, 2])          # on every rank, in the same order
    if evens.included():
        y = hvd.allreduce(x, process_set=evens)  # averaged over ranks 0 and 2

Each set has its own engine over a communicator of its members (basics.py), so collectives in
different sets are negotiated, fused and run independently and concurrently. Ranks are global
ranks (hvd.rank()) everywhere, broadcast's root_rank included; ProcessSet.rank() is a rank's
place in the set. Sets may be added and removed at any time (Horovod needs
HOROVOD_DYNAMIC_PROCESS_SETS=1 for that; hvd_lite needs nothing).
"""

import numbers
from typing import List, Optional, Sequence, Union

from . import basics


class ProcessSet:
    """A set of ranks that runs collectives together: pass it to hvd_lite.init(process_sets=[...])
    or hvd_lite.add_process_set(), then as process_set= to the collectives."""

    process_set_id: Optional[int] = None
    """The set's id once registered (0 is the global set), else None."""
    ranks: Optional[List[int]] = None
    """The set's ranks, sorted."""
    mpi_comm = None
    """Always None: hvd_lite makes sets from lists of ranks, not from MPI communicators."""

    def __init__(self, ranks: Sequence[int]):
        if hasattr(ranks, "py2f"):
            raise NotImplementedError(
                "hvd_lite builds process sets from lists of ranks, not from "
                "MPI communicators; pass the communicator's global ranks"
            )
        if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
            raise ValueError(f"ProcessSet takes a list of ranks, got {ranks!r}")
        ranks = list(ranks)
        if any(isinstance(r, bool) or not isinstance(r, numbers.Integral) for r in ranks):
            raise ValueError(f"ProcessSet takes a list of int ranks, got {ranks!r}")
        self.ranks = sorted(int(r) for r in ranks)

    def size(self) -> Optional[int]:
        """The number of ranks in the set, or None if it is not registered."""
        if self.process_set_id is None:
            return None
        return basics.registered(self.process_set_id).size

    def rank(self) -> Optional[int]:
        """This rank's place in the set (0 .. size()-1), or None if it is not registered;
        ValueError if this rank is not a member."""
        if self.process_set_id is None:
            return None
        s = basics.registered(self.process_set_id)
        if basics.rank() not in s.ranks:
            raise ValueError(f"rank {basics.rank()} is not a member of {self}")
        return s.rank

    def included(self) -> Optional[bool]:
        """Whether this rank is in the set (None before its ranks are known)."""
        if self.ranks is None:
            return None
        return basics.rank() in self.ranks

    def __str__(self) -> str:
        return (
            f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"
        )

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """global_process_set: every rank of the job (of init(comm=...)'s ranks), id 0."""

    process_set_id = 0

    def __init__(self):  # pylint: disable=super-init-not-called - its ranks follow init()
        pass

    @property
    def ranks(self) -> Optional[List[int]]:  # type: ignore[override]  # read-only: follows init()
        return list(range(basics.size())) if basics.is_initialized() else None


global_process_set = _GlobalProcessSet()
"""Every rank of the job (of init(comm=...)'s ranks): the set a collective runs on by default."""


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers a new process set (a ProcessSet or a list of ranks) and returns it. Collective:
    every rank of the job calls it, in the same order; ValueError if a set with the same ranks
    exists (the global set included)."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    basics.add_set(process_set)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a registered process set: collective, as add_process_set. Collectives still in
    flight in it fail. False (and nothing happens) for the global set or a set not registered."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"remove_process_set takes a ProcessSet, got {type(process_set).__name__}")
    return basics.remove_set(process_set)


__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
