"""Process-level state: init, shutdown, the rank/size queries, and the process sets' engines."""

import atexit
import collections
import hashlib
import itertools
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from . import _loader
from ._submission import Submission
from .exceptions import CollectiveError, MPIMismatchError, NotInitializedError

_core = _loader._core

_VENDOR_MARKERS = {"openmpi": "Open MPI", "mpich": "MPICH", "intel": "Intel"}
# Variables each launcher sets to the job's size: (variable, launcher, MPI vendor).
_LAUNCHER_SIZE_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun", "openmpi"),
    ("PMI_SIZE", "an MPICH/Hydra mpiexec", "mpich"),
)


class _Set:
    """A process set as this rank sees it: its id, its ranks (global ranks, sorted), the
    ProcessSet objects registered under it, and on its members an engine over those ranks with
    its own automatic names (the global set's engine is _State.engine)."""

    __slots__ = ("id", "ranks", "engine", "auto_names", "owners", "sync_names", "sync_left")

    def __init__(self, set_id: int, ranks: List[int], engine, auto_names: dict):
        self.id, self.ranks, self.engine, self.auto_names = set_id, ranks, engine, auto_names
        self.owners: list = []
        self.sync_names: Dict[str, threading.Lock] = {}  # kind -> its synchronous name's lock
        self.sync_left: Dict[str, Any] = {}  # kind -> a call given up on under that name

    def sync_name(self, kind: str) -> str:
        """The set's one automatic name for synchronous calls of this kind ("allreduce.sync"),
        this thread's until release_sync_name: another thread's unnamed synchronous call of the
        kind waits for it (interruptibly). A synchronous call has completed before its thread
        makes the next one, so one name serves them all, and the engine's response cache every
        call after the first; with a new name per call each was negotiated through the
        coordinator and took a cache entry. The k-th such call on one rank meets the k-th on
        the others, as automatic names assume (the same calls in the same order everywhere);
        threads' calls are taken one at a time, in the order they get the name."""
        lock = self.sync_names.get(kind)
        if lock is None:
            lock = self.sync_names.setdefault(kind, threading.Lock())
        lock.acquire()
        left = self.sync_left.pop(kind, None) if self.sync_left else None
        if left is not None:  # a call given up on (a signal): the name is free once it completes
            try:
                left.wait()
            except BaseException:
                if not left.poll():  # interrupted again: still not free
                    self.sync_left[kind] = left
                    lock.release()
                    raise
                # it completed with an error: that call's, which its caller gave up on
        return kind + ".sync"

    def release_sync_name(self, kind: str, left=None) -> None:
        """Gives the name back; `left`: the C handle of a call its caller gave up on, still in
        flight under it (the next sync_name waits for it, as the next counter name would have
        met the peers' next call)."""
        if left is not None:
            self.sync_left[kind] = left
        self.sync_names[kind].release()

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        """This rank's place in the set (the set's engine's rank)."""
        return self.engine.rank if self.id else _engine().rank

    def set_rank(self, fn: str, global_rank: int) -> int:
        """The set rank of a global rank; ValueError if it is not in the set."""
        if not self.id:
            return global_rank
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(
                f"{fn}: root rank {global_rank} is not in the process set (ranks "
                f"{self.ranks}); give a global rank of one of its members"
            ) from None


class _State:
    engine: Optional[Any] = None
    auto_names: dict = {}
    sets: Dict[int, _Set] = {}  # id -> set, the global set (0) included
    free_ids: collections.deque = collections.deque()  # removed sets' ids, reused first
    next_id: int = 1
    base: tuple = (None, None)  # the global set's communicator: (Fortran handle, ranks in it)
    sets_lock = threading.Lock()  # one process-set change at a time
    thread_level: int = -1
    finalize_at_exit: bool = False
    atexit_registered: bool = False
    after_mpi: list = []  # functions run at a normal exit once MPI is finalized (after_mpi_at_exit)
    adapter_faults: bool = False  # an adapter fault may be armed (a testing aid)


_state = _State()


def build_info() -> dict:
    """The MPI this build was compiled against, and the one loaded now."""
    info = dict(_core.build_info())
    info["mpi_runtime"] = _core.mpi_library_version().strip()
    return info


def _check_runtime_mpi() -> None:
    info = build_info()
    marker = _VENDOR_MARKERS.get(info["mpi_vendor"])
    runtime = info["mpi_runtime"]
    if marker and marker not in runtime:
        raise MPIMismatchError(
            f"hvd_lite was built against {info['mpi_header']} but the MPI loaded at run time is "
            f"{runtime.splitlines()[0] if runtime else 'unknown'}; rebuild hvd_lite against this MPI "
            "or run it with the MPI it was built with (docs/install.md)."
        )


def _launcher_mismatch(launcher: str, var: str, value: str) -> MPIMismatchError:
    return MPIMismatchError(
        f"this process was started by {launcher} for {value} ranks ({var}={value}), but the "
        f"launcher belongs to a different MPI than the one hvd_lite was built against "
        f"({_core.build_info()['mpi_header']}). Use that MPI's mpirun (or hvd_lite.run), or rebuild "
        "hvd_lite against this MPI (docs/install.md)."
    )


def _check_launcher_before_init() -> None:
    """A launcher of another MPI vendor: say so before MPI_Init (MPICH aborts inside it)."""
    built = _core.build_info()["mpi_vendor"]
    for var, launcher, vendor in _LAUNCHER_SIZE_VARS:
        value = os.environ.get(var, "")
        if (
            value
            and vendor != built
            and built in ("openmpi", "mpich")
            and not any(os.environ.get(v) for v, _, vend in _LAUNCHER_SIZE_VARS if vend == built)
        ):
            raise _launcher_mismatch(launcher, var, value)


def _check_launcher_after_init(size: int) -> None:
    """A job the launcher says has N > 1 ranks but MPI sees as a singleton."""
    if size != 1:
        return
    for var, launcher, _ in _LAUNCHER_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1:
            raise _launcher_mismatch(launcher, var, value)


def _atexit() -> None:
    shutdown()  # tells the other ranks this one is leaving
    if _state.finalize_at_exit:
        _core.mpi_finalize()
    for fn in _state.after_mpi:
        fn()


def after_mpi_at_exit(fn: Callable[[], None]) -> None:
    """Runs `fn` (once, however often it is given) as this process ends normally, after hvd_lite's
    shutdown and MPI_Finalize: what it marks then, the process got through its whole end."""
    if fn not in _state.after_mpi:
        _state.after_mpi.append(fn)


def skip_mpi_finalize() -> None:
    """This process will end without MPI_Finalize, even if init() initialised MPI (elastic.run,
    once a rank has died: docs/design.md, "Elastic jobs: shrink mode")."""
    _state.finalize_at_exit = False


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Initialises hvd_lite (and MPI, with thread support, if nobody has); `process_sets`: a
    list of hvd_lite.ProcessSet to register now (or "dynamic", Horovod's spelling for none:
    add_process_set works either way)."""
    if _state.engine is not None:
        if _static_sets(process_sets):
            raise ValueError(
                "init(process_sets=...): hvd_lite is initialized already; add the "
                "sets with add_process_set(), or shutdown() first"
            )
        return
    if comm is None:
        fhandle, ranks = None, None
    elif hasattr(comm, "py2f"):  # an mpi4py communicator
        fhandle, ranks = int(comm.py2f()), None
    elif isinstance(comm, (list, tuple)) and all(isinstance(r, int) for r in comm):
        if len(set(comm)) != len(comm) or not comm:
            raise ValueError(
                f"init(comm=...): the list of ranks must be non-empty and without "
                f"duplicates, got {list(comm)}"
            )
        fhandle, ranks = None, list(comm)
    else:
        raise TypeError(
            f"init(comm=...) takes None, an mpi4py communicator or a list of ranks, got {type(comm).__name__}"
        )
    static = _static_sets(process_sets)
    _check_runtime_mpi()
    _check_launcher_before_init()
    provided, initialized_here = _core.mpi_init()
    _state.thread_level = provided
    if initialized_here:
        _state.finalize_at_exit = True
    if not _state.atexit_registered:
        atexit.register(_atexit)
        _state.atexit_registered = True
    if comm is None:
        _check_launcher_after_init(_core.mpi_world_size())
    engine = _core.Engine(fhandle, ranks)
    _state.engine, _state.base = engine, (fhandle, ranks)
    _state.auto_names = {}  # automatic names restart with every engine, on every rank
    _state.sets = {0: _Set(0, list(range(engine.size)), engine, _state.auto_names)}
    _state.free_ids, _state.next_id = collections.deque(), 1
    # HVD_LITE_FAULT (parsed by the engine) may arm the adapter's fault point too
    _state.adapter_faults = "adapter" in os.environ.get("HVD_LITE_FAULT", "")
    if static:
        try:
            _register_static(static)
        except BaseException:
            shutdown()
            raise


# ---------------------------------------------------------------------------- process sets
#
# A process set has its own engine over a communicator of its members (MPI_Comm_create_group,
# collective over the members only), so it negotiates, fuses and fails on its own, concurrently
# with the other sets. Adding and removing one are collective over the global set: every rank
# makes the same changes in the same order (Horovod's rule), and an allgather through the global
# engine checks that before any member builds or stops the set's engine, so a mismatch is a
# ValueError on every rank instead of a hang in MPI.


def _check_set_ranks(fn: str, ranks: Sequence[int], size: int) -> List[int]:
    """The ranks of a set as a sorted list; ValueError if out of range, repeated or empty."""
    out = sorted(int(r) for r in ranks)
    bad = [r for r in out if not 0 <= r < size]
    if bad:
        raise ValueError(f"{fn}: rank(s) {bad} are out of range; the global set has ranks 0..{size - 1}")
    if len(set(out)) != len(out):
        raise ValueError(f"{fn}: the ranks {out} repeat a rank")
    if not out:
        raise ValueError(f"{fn}: a process set needs at least one rank")
    return out


def _static_sets(process_sets) -> list:
    """init()'s process_sets as a list of ProcessSet objects; TypeError for anything else."""
    if process_sets is None or (isinstance(process_sets, str) and process_sets.lower() == "dynamic"):
        return []
    if isinstance(process_sets, (str, bytes)) or not hasattr(process_sets, "__iter__"):
        raise TypeError(
            f'init(process_sets=...) takes a list of hvd_lite.ProcessSet or "dynamic", got {process_sets!r}'
        )
    out = list(process_sets)
    for i, ps in enumerate(out):
        if not hasattr(ps, "process_set_id") or getattr(ps, "ranks", None) is None:
            raise TypeError(
                f"init(process_sets=...): entry {i} is not a hvd_lite.ProcessSet "
                f"built from a list of ranks: {ps!r}"
            )
    return out


def _agree(fn: str, change: str) -> None:
    """Checks that every rank of the global set makes this process-set change now: an allgather
    of its digest through the global engine; ValueError on every rank if they differ."""
    mine = np.frombuffer(hashlib.blake2b(change.encode(), digest_size=16).digest(), np.uint8)
    change_digests = Submission.of(
        _core.COLL_ALLGATHER, mine, None, _core.hvdlUint8, "hvd_lite.process_set_change", (16,)
    )
    handle = _engine().submit(*change_digests, True)
    handle.wait()
    digests = np.frombuffer(handle, np.uint8).reshape(-1, 16)
    differ = [r for r in range(len(digests)) if not np.array_equal(digests[r], mine)]
    if differ:
        raise ValueError(
            f"{fn}: rank(s) {differ} made a different process-set change than rank "
            f"{rank()} ({change}); every rank must add and remove the same process "
            "sets in the same order"
        )


def _set_engine(set_id: int, ranks: List[int]):
    """The engine of a set this rank belongs to (collective over its members), or None."""
    if rank() not in ranks:
        return None
    fhandle, base_ranks = _state.base
    in_base = [base_ranks[r] for r in ranks] if base_ranks else ranks
    return _core.Engine(fhandle, in_base, set_id=set_id)


def _check_threads(fn: str) -> None:
    if _state.thread_level != _core.MPI_THREAD_MULTIPLE:
        raise ValueError(
            f"{fn}: process sets need MPI_THREAD_MULTIPLE (each set's engine has its "
            "own thread), but MPI was initialised with a lower thread level"
        )


def _new_set(ranks: List[int], owner) -> int:
    set_id = _state.free_ids.popleft() if _state.free_ids else _state.next_id
    engine = _set_engine(set_id, ranks)
    if set_id == _state.next_id:
        _state.next_id += 1
    s = _Set(set_id, ranks, engine, {})
    s.owners.append(owner)
    _state.sets[set_id] = s
    owner.process_set_id, owner.ranks = set_id, ranks
    return set_id


def _find(ranks: List[int]) -> Optional[_Set]:
    return next((s for s in _state.sets.values() if s.ranks == ranks), None)


def _register_static(process_sets: list) -> None:
    _check_threads("init(process_sets=...)")
    n = size()
    lists = [
        _check_set_ranks(f"init(process_sets=...): entry {i}", ps.ranks, n)
        for i, ps in enumerate(process_sets)
    ]
    for i, ranks in enumerate(lists):
        if ranks == _state.sets[0].ranks or ranks in lists[:i]:
            raise ValueError(
                f"init(process_sets=...): entry {i} is a duplicate "
                f"(ranks {ranks}); every process set must have different ranks"
            )
    with _state.sets_lock:
        _agree("init(process_sets=...)", f"init {lists}")
        for ps, ranks in zip(process_sets, lists):
            _new_set(ranks, ps)


def add_set(process_set) -> int:
    """Registers a ProcessSet (collective over the global set) and returns its id."""
    fn = "add_process_set"
    _engine()
    _check_threads(fn)
    ranks = _check_set_ranks(fn, process_set.ranks, size())
    with _state.sets_lock:
        _agree(fn, f"add {ranks}")
        found = _find(ranks)
        if found is not None:
            raise ValueError(
                f"{fn}: a process set with ranks {ranks} exists already (id "
                f"{found.id}); remove it first or use that one"
            )
        return _new_set(ranks, process_set)


def remove_set(process_set) -> bool:
    """Removes a registered set (collective over the global set): its engine stops, and what
    is still in flight in it fails. False for the global set or a set not registered."""
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0 or _state.engine is None or set_id not in _state.sets:
        return False
    with _state.sets_lock:
        _agree("remove_process_set", f"remove {set_id}")
        s = _state.sets.pop(set_id)
        _state.free_ids.append(set_id)
        for owner in s.owners:
            owner.process_set_id = None
        if s.engine is not None:
            s.engine.shutdown()
    return True


def set_for(fn: str, process_set, member: bool = True) -> _Set:
    """The set a collective on `process_set` runs in (None: the global set); TypeError or
    ValueError, before anything is sent, for a set that is not registered or (with `member`)
    that this rank is not a member of."""
    if process_set is None:
        _engine()
        return _state.sets[0]
    set_id = getattr(process_set, "process_set_id", _NOT_A_SET)
    if set_id == 0:
        _engine()
        return _state.sets[0]
    if set_id is _NOT_A_SET:
        raise TypeError(f"{fn}: process_set must be a hvd_lite.ProcessSet, got {type(process_set).__name__}")
    _engine()
    s = _state.sets.get(set_id) if isinstance(set_id, int) else None
    if s is None or process_set not in s.owners:
        raise ValueError(
            f"{fn}: {process_set} is not registered (or was removed); pass it to "
            "hvd_lite.init(process_sets=[...]) or hvd_lite.add_process_set() first"
        )
    if member and s.engine is None:
        raise ValueError(f"{fn}: rank {rank()} is not a member of the provided process set (ranks {s.ranks})")
    return s


_NOT_A_SET = object()


def registered(set_id: int) -> _Set:
    """The registered set with this id; ValueError if there is none."""
    _engine()
    s = _state.sets.get(set_id)
    if s is None:
        raise ValueError(f"process set {set_id} does not exist or has not been registered")
    return s


def inject_fault(point: str, n: int = 1, process_set=None) -> None:
    """A testing aid: this rank fails the n-th next time it reaches `point` (alloc, send, recv,
    negotiate, stall, exit, adapter; docs/design.md, "Failures") in the global set's engine, or
    in `process_set`'s; n=0 disarms it."""
    where = set_for("inject_fault", process_set)
    (where.engine if where.id else _engine())._inject_fault(point, n)
    if point == "adapter":
        _state.adapter_faults = True


def adapter_fault() -> str:
    """The error an armed adapter fault gives this request, or "" (the common case, quickly)."""
    if not _state.adapter_faults or not _engine()._fault_hit("adapter"):
        return ""
    return "injected fault (HVD_LITE_FAULT): the adapter failed"


def auto_name(kind: str, where: Optional[_Set] = None) -> str:
    """The next automatic name for a collective of this kind in this set (None: the global
    set): the same on every rank that makes the same calls in the same order in the set since
    it was made. Threads never get the same one: each kind counts with an itertools.count, whose
    next() (like dict.setdefault) is one step under the GIL."""
    names = _state.auto_names if where is None else where.auto_names
    counter = names.get(kind)
    if counter is None:
        counter = names.setdefault(kind, itertools.count())
    return f"{kind}.noname.{next(counter)}"


def shutdown() -> None:
    """Stops the engine (pending collectives fail); MPI itself stays up until the process exits.
    A signal (Ctrl-C) interrupts the wait for the engine to leave: it goes on leaving, refusing
    new collectives, and the next shutdown() (or the one at exit) waits for the rest."""
    engine = _state.engine
    if engine is not None:
        for set_id in sorted(_state.sets):  # every rank stops its sets in the same order
            s = _state.sets[set_id]
            if set_id and s.engine is not None:
                s.engine.shutdown()
            for owner in s.owners:
                owner.process_set_id = None
        engine.shutdown()
        if _state.engine is engine:
            _state.engine = None
            _state.sets = {}


def _shrink() -> None:
    """After a rank's death under an MPI with ULFM: the engine stopped (it failed, and its
    communicator is revoked), then started again on the survivors (MPIX_Comm_shrink of the
    communicator init() was given, collective over every living rank). Ranks keep their order:
    the new rank 0 is the lowest surviving rank. Process sets are dropped: every rank registers
    them again (Horovod's reset callbacks are the place).

    Ranks found dead while the survivors build their engine (a host lost whole: its ranks are
    found dead one by one) fail that build on some ranks: those revoke the survivors'
    communicator and shrink it again. The others' build, or their next collective, fails on the
    same dead rank (the MPI reports it, or the data timeout ends a wait on it), and they shrink
    the same communicator (the base from then on). A shrink that finds no other rank dead means
    the build failed for another reason, which is raised."""
    fhandle, ranks = _state.base
    if ranks is not None:
        raise CollectiveError(
            _core.hvdlInvalidUsage,
            "hvd_lite cannot shrink a job started with init(comm=[list of ranks]); use the whole "
            "job or an mpi4py communicator",
        )
    shutdown()
    survivors, n = _core.mpi_shrink(fhandle)
    while True:
        _state.base = (survivors, None)
        try:
            engine = _core.Engine(survivors, None)
            break
        except CollectiveError:
            again, left = _core.mpi_shrink(survivors)
            if left == n:
                raise
            survivors, n = again, left
    _state.engine = engine
    _state.auto_names = {}  # automatic names restart with every engine, on every rank
    _state.sets = {0: _Set(0, list(range(engine.size)), engine, _state.auto_names)}
    _state.free_ids, _state.next_id = collections.deque(), 1


def _agree_alive(flag: bool) -> bool:
    """Under an MPI with ULFM: whether every living rank passed True (MPIX_Comm_agree over the
    communicator init() was given, or the survivors' after a shrink). Every survivor gets the
    same answer, or the same failure (CollectiveError) when a rank is found dead meanwhile, which
    a barrier or an all-reduce cannot promise: one may complete on some ranks and fail on others."""
    fhandle, ranks = _state.base
    if ranks is not None:
        raise CollectiveError(
            _core.hvdlInvalidUsage,
            "hvd_lite cannot agree across a job started with init(comm=[list of ranks]); use the "
            "whole job or an mpi4py communicator",
        )
    return _core.mpi_agree(fhandle, flag)


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _state.engine is not None


def _engine():
    if _state.engine is None:
        raise NotInitializedError("hvd_lite has not been initialized; call hvd_lite.init() first")
    return _state.engine


def rank() -> int:
    """This process's rank."""
    return _engine().rank


def size() -> int:
    """Number of ranks."""
    return _engine().size


def local_rank() -> int:
    """Rank among the processes on this host."""
    return _engine().local_rank


def local_size() -> int:
    """Number of ranks on this host."""
    return _engine().local_size


def cross_rank() -> int:
    """Index of this host among the hosts (ranks with the same local rank)."""
    return _engine().cross_rank


def cross_size() -> int:
    """Number of hosts that have a rank with this local rank."""
    return _engine().cross_size


def mpi_threads_supported() -> bool:
    """True if MPI runs with MPI_THREAD_MULTIPLE."""
    _engine()
    return _state.thread_level == _core.MPI_THREAD_MULTIPLE
