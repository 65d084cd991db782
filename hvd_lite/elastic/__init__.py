"""Elastic training, Horovod's API: a job that keeps training through the loss of a rank.

    state = hvd.elastic.ObjectState(epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

Run it with `hvd_lite.run -np 4 --min-np 2 --max-np 4 python train.py`. Under an Open MPI with ULFM a
job survives a rank's death in *shrink mode*: the survivors go on in place from the last commit in
memory. Elsewhere it does in *restart mode*: the launcher relaunches every rank and `run` resumes
from the newest commit, which each host keeps on its own disk (commit_store.py; docs/elastic.md says
why that is safe). Outside an elastic launch, commits stay in memory and a
failed collective is raised as usual.
"""

import contextlib
import functools
import os
import pickle
import socket
import sys
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .. import basics
from ..collectives import barrier, broadcast
from ..exceptions import (
    CollectiveError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    InvalidArgumentError,
)
from ..ops import Max, Min, allreduce
from ..run.rank import HOSTS_REMOVED
from ..state import broadcast_object
from . import host_updates
from .commit_store import CommitStore

_made = [0]  # states made so far in this process


def _next_name() -> str:
    """state0, state1, ...: a state's commit file name, the same in every launch of the script as
    long as it makes its states in the same order."""
    _made[0] += 1
    return f"state{_made[0] - 1}"


def _launch_env() -> Tuple[Optional[str], int]:
    """(the commit directory, the number of relaunches so far) of an elastic launch, else (None, 0)."""
    from ..run.rank import ELASTIC_DIR_VAR, ELASTIC_RESTARTS_VAR

    directory = os.environ.get(ELASTIC_DIR_VAR) or None
    text = os.environ.get(ELASTIC_RESTARTS_VAR, "0")
    restarts = int(text) if text.isascii() and text.isdigit() else 0
    return directory, restarts


def _note(text: str) -> None:
    sys.stderr.write(f"hvd_lite.elastic: {text}\n")
    sys.stderr.flush()


class State:
    """State kept across failures: `commit()` saves it, `restore()` goes back to the last commit,
    `sync()` makes every rank's state rank 0's. Subclasses say what is saved (`save`, `restore`,
    `sync`, and the committed snapshot that a relaunched job resumes from).

    Args:
        bcast_object: broadcasts an object from rank 0 (default: hvd_lite.broadcast_object).
        get_rank: returns this process's rank (default: hvd_lite.rank).
    """

    def __init__(self, bcast_object: Optional[Callable] = None, get_rank: Optional[Callable] = None):
        self._bcast_object = bcast_object or broadcast_object
        self._rank = get_rank or basics.rank
        self._reset_callbacks: List[Callable[[], Any]] = []
        self._commit_name = _next_name()
        self._commits = 0
        self._resumed = False  # a relaunched job's elastic function resumed from its commits
        self._in_commit = False
        self._hosts_changed: Optional[bool] = None  # announced: whether right after a commit

    def register_reset_callbacks(self, callbacks: List[Callable[[], Any]]) -> None:
        """Adds functions to call after each reset (the job re-formed, perhaps with another size)."""
        if callable(callbacks) or not all(callable(c) for c in callbacks):
            raise TypeError(f"register_reset_callbacks takes a list of functions, got {callbacks!r}")
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Runs `reset()`, then the reset callbacks in the order registered."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state (in memory, and in an elastic launch on each host's disk, where a
        relaunched job resumes from it), then checks for host changes (`check_host_updates`)."""
        self.save()
        self._write_commit()
        self._in_commit = True
        try:
            self.check_host_updates()
        finally:
            self._in_commit = False

    def _write_commit(self) -> None:
        """Counts a commit of the saved state and, in an elastic launch, writes it on each host."""
        self._commits += 1
        directory, _ = _launch_env()
        if directory is not None and basics.local_rank() == 0:
            payload = pickle.dumps(self._snapshot(), protocol=pickle.HIGHEST_PROTOCOL)
            CommitStore(directory).write(self._commit_name, self._commits, payload)

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every rank when hvd_lite.run announced a change of the
        job's hosts (its discovery script found slots added or removed): rank 0 reads the
        launcher's announcements and broadcasts them, so every rank raises at the same call.
        Without a discovery script there are no announcements, and this returns at once."""
        updates = host_updates.from_env()
        if updates is None:
            return
        mine = updates.poll() if basics.rank() == 0 else 0
        kind = int(broadcast(np.array([mine], np.int64), root_rank=0, name="hvd_lite.elastic.hosts")[0])
        if kind:
            self._hosts_changed = self._in_commit
            raise HostsUpdatedInterrupt(skip_sync=kind == HOSTS_REMOVED)

    def save(self) -> None:
        """Saves the state in memory (the point `restore()` goes back to)."""
        raise NotImplementedError(f"{type(self).__name__}.save")

    def restore(self) -> None:
        """Goes back to the last saved state, dropping the changes made since."""
        raise NotImplementedError(f"{type(self).__name__}.restore")

    def sync(self) -> None:
        """Makes every rank's state rank 0's."""
        raise NotImplementedError(f"{type(self).__name__}.sync")

    def reset(self) -> None:
        """Called after the job re-formed, before the callbacks and the sync; does nothing here."""

    def _snapshot(self) -> Any:
        """The saved state, as a picklable object (what a commit file holds)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be committed to disk")

    def _load_snapshot(self, snapshot: Any) -> None:
        """Makes `snapshot` the saved state and restores it."""
        raise NotImplementedError(f"{type(self).__name__} cannot be resumed from disk")

    def _resume(self) -> Optional[int]:
        """In a relaunched elastic job: loads the newest commit any host holds (the ranks agree which,
        and its holder broadcasts it); returns its counter, or None when no host holds one."""
        directory, _ = _launch_env()
        mine: Optional[Tuple[int, bytes]] = None
        if directory is not None and basics.local_rank() == 0:
            mine = CommitStore(directory).read(self._commit_name)
        counter = -1 if mine is None else mine[0]
        newest = int(allreduce(np.array([counter], np.int64), op=Max, name="hvd_lite.elastic.newest")[0])
        if newest < 0:
            return None
        big = basics.size()
        holder = int(
            allreduce(
                np.array([basics.rank() if counter == newest else big], np.int64),
                op=Min,
                name="hvd_lite.elastic.holder",
            )[0]
        )
        payload = mine[1] if mine is not None and basics.rank() == holder else None
        payload = broadcast_object(payload, root_rank=holder, name="hvd_lite.elastic.commit")
        self._load_snapshot(pickle.loads(payload))
        self._commits = newest
        return newest


class ObjectState(State):
    """State made of plain Python objects, given as keyword arguments and read and set as
    attributes (`state.epoch += 1`); synced with bcast_object, saved by reference as Horovod does
    (keep the values immutable, or copy before changing them in place)."""

    def __init__(
        self, bcast_object: Optional[Callable] = None, get_rank: Optional[Callable] = None, **kwargs
    ):
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        """Saves the attributes' current values."""
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        """Sets the attributes back to their saved values."""
        self._set_attrs()

    def sync(self) -> None:
        """Makes every rank's saved values rank 0's, and sets the attributes to them."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)

    def _snapshot(self) -> Any:
        return dict(self._saved_state)

    def _load_snapshot(self, snapshot: Any) -> None:
        self._saved_state = dict(snapshot)
        self._set_attrs()


# The start of the error of a collective whose peer shut down (csrc/negotiate/negotiate.c): the
# peer left on purpose (its script ended or raised), so it did not die: no relaunch is asked for.
_PEER_LEFT = "hvd_lite has been shut down on rank"


def _reset() -> None:
    """Re-forms the job in place: the engine stopped and started again on the same ranks."""
    basics.shutdown()
    basics.init()


def _shrink_in_place(exc: BaseException) -> None:
    """A rank died and this MPI can go on without it (ULFM): the survivors re-form the job among
    themselves; below the launcher's --min-np, every rank raises instead."""
    from ..run.rank import ELASTIC_MIN_NP_VAR

    before = basics.size()
    basics._shrink()
    text = os.environ.get(ELASTIC_MIN_NP_VAR, "1")
    min_np = int(text) if text.isascii() and text.isdigit() else 1
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if basics.size() < min_np:
        raise HorovodInternalError(
            basics._core.hvdlRemoteError,
            f"{basics.size()} rank(s) survived, fewer than --min-np {min_np}: the job stops "
            f"(the failure: {first})",
        ) from exc
    if basics.rank() == 0:
        _note(f"a collective failed ({first}); {basics.size()} of {before} rank(s) go on in place")


def _recover_in_place(state: State, exc: BaseException, returned: bool) -> bool:
    """A rank died (shrink mode): Horovod's order on every survivor, restore the last commit,
    re-form the job in place, run the reset callbacks (the sync follows in `run`). `returned`:
    whether this rank had returned from the function (the death came in the barrier after it).
    Where every survivor had, the function is not run again: each of them did every collective
    of it with the dead rank, so their results are whole. Where some had not, those that had
    restore the commit too, and all of them run it again from there. Returns whether it is done.
    A death while the job re-forms re-forms it again; a failure there that a new shrink finds no
    death behind is raised."""
    size = None
    while True:
        if not returned:
            state.restore()
        _shrink_in_place(exc)  # below --min-np it raises
        if size is not None and basics.size() == size:
            raise exc
        size = basics.size()
        try:
            everyone = basics._agree_alive(returned)
            if returned and not everyone:
                state.restore()
                returned = False
            state.on_reset()
            return returned
        except InvalidArgumentError:
            raise
        except HorovodInternalError as again:
            if _PEER_LEFT in str(again):
                raise
            exc = again


def _exit_for_relaunch(exc: BaseException) -> None:
    """A collective failed and this MPI cannot shrink the job: end this process with the code
    that tells hvd_lite.run to relaunch the job from the last commit."""
    from ..run.rank import RESTART_EXIT

    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    _note(
        f"rank {basics.rank()}: a collective failed ({first}); this MPI cannot shrink the job in "
        f"place, so the rank exits with code {RESTART_EXIT} and hvd_lite.run relaunches the job from "
        "the last commit"
    )
    sys.stdout.flush()
    os._exit(RESTART_EXIT)


def _exit_for_new_hosts(state: State) -> None:
    """hvd_lite.run announced new hosts: commit the state as it is (unless that was just done),
    then every rank ends with the relaunch code, for the launcher to start the job on the new
    hosts; the relaunched job resumes from this commit, so no step is done again. A rank that
    dies meanwhile fails the barrier: the others leave all the same, and the relaunched job
    resumes from the newest commit a host holds."""
    from ..run.rank import RESTART_EXIT

    if not state._hosts_changed:
        state.save()
        state._write_commit()
    try:
        barrier()  # every host's copy of the commit is written
    except HorovodInternalError as exc:
        if basics.rank() == 0:
            _note(f"a rank died as the job left for the new hosts ({str(exc).splitlines()[0]})")
    if basics.rank() == 0:
        _note(
            f"the hosts changed: the {basics.size()} rank(s) exit with code {RESTART_EXIT} for "
            f"hvd_lite.run to relaunch the job on the new hosts, resuming from commit {state._commits}"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESTART_EXIT)


class _Leaving:
    """The commits this host removes once every rank of it has ended normally (_leave_host)."""

    def __init__(self, directory: str, restarts: int):
        self.directory, self.restarts = directory, restarts
        self.local_rank, self.local_size = basics.local_rank(), basics.local_size()
        self.names: set = set()


_leaving: List[_Leaving] = []  # at most one: this process's, as of its elastic function's last return


def _remove_at_exit(directory: str, restarts: int, name: str) -> None:
    """Removes the commits of `name` (and of the other states whose functions returned) from this
    host once every rank of it has ended normally (_leave_host), with the ranks' layout as it is now
    (a shrink may have changed it). Not before: a rank ended by a signal after its function returned
    (mpirun ends every rank when it loses a host, some of them still saving or printing their
    results) leaves its host's commits for the relaunch to resume from, never from the start."""
    leaving = _Leaving(directory, restarts)
    if _leaving:
        leaving.names = _leaving[0].names
    leaving.names.add(name)
    _leaving[:] = [leaving]
    basics.after_mpi_at_exit(_leave_host)


def _leave_host() -> None:
    """At a normal exit, after MPI_Finalize: tells the launcher this rank ended well (a signal after
    this is no failure: rank.emit_done), then marks its end in the commit directory
    (`exited.<launch>.<host>.<local rank>`: the host's name keeps hosts apart if the directory is
    shared), and the host's last rank to end so removes the commits and the marks. A rank ended by a
    signal before it marks nothing: the launcher relaunches the job, and its host keeps the commits
    to resume from (the launcher removes its own host's directory at the job's end, however it
    ended)."""
    if not _leaving:
        return
    from ..run.rank import emit_done, rank_from_env

    emit_done(rank_from_env())  # first: killed after it, the rank still counts as ended well
    leaving = _leaving[0]
    prefix = f"exited.{leaving.restarts}.{socket.gethostname()}."
    try:
        with open(os.path.join(leaving.directory, prefix + str(leaving.local_rank)), "w"):
            pass
        ended = [e for e in os.listdir(leaving.directory) if e.startswith(prefix)]
    except OSError:
        return
    if len(ended) < leaving.local_size:
        return
    store = CommitStore(leaving.directory)
    for name in sorted(leaving.names):
        store.remove(name)
    for entry in ended:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(leaving.directory, entry))
    with contextlib.suppress(OSError):
        os.rmdir(leaving.directory)


def run(func: Callable) -> Callable:
    """Decorates `func(state, ...)` to run elastically (Horovod's `hvd.elastic.run`).

    The call syncs `state` from rank 0, then runs `func`. In a job that `hvd_lite.run` relaunched
    after a failure, it first loads the newest commit and runs the reset callbacks (Horovod's
    order: restore, re-form, callbacks, sync, resume). A failed collective (HorovodInternalError)
    under an elastic launch is survived: where the MPI reports dead ranks (ULFM, shrink mode) the
    survivors restore the last commit, shrink the job in place, run the callbacks, sync and go on
    (below --min-np they raise); elsewhere the process ends with exit code 75, for the launcher to
    relaunch the job. Outside an elastic launch it is raised. HostsUpdatedInterrupt from
    check_host_updates (hvd_lite.run's discovery script found other hosts) commits the state as
    it is and ends the process with code 75 too, and the relaunched job resumes from that commit,
    so nothing is rolled back; one the function raises itself re-forms the job in place and
    resumes without going back to the commit. A mismatch of arguments (InvalidArgumentError) is
    the script's error, and is raised."""
    if not callable(func):
        raise TypeError(f"hvd_lite.elastic.run decorates a function, got {func!r}")

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError(
                f"{getattr(func, '__name__', 'func')}'s first argument must be an hvd_lite.elastic.State "
                f"(ObjectState, TorchState, ...), got {type(state).__name__}"
            )
        directory, restarts = _launch_env()
        skip_sync = False
        # a relaunched job: the state's first call resumes from its newest commit, not a later one
        resume = directory is not None and restarts > 0 and not state._resumed
        result, returned = None, False
        while True:
            try:
                if not returned:
                    if resume:  # a relaunched job: the newest commit, then the callbacks (Horovod's order)
                        resume, state._resumed = False, True
                        counter = state._resume()
                        if basics.rank() == 0:
                            where = (
                                "no commit was made: starting again"
                                if counter is None
                                else f"commit {counter}"
                            )
                            _note(f"relaunch {restarts}: {basics.size()} rank(s) resume from {where}")
                        state.on_reset()
                    if not skip_sync:
                        state.sync()
                    result = func(state, *args, **kwargs)
                    returned = True
                if directory is not None:  # every rank has returned: the commits go as the processes end
                    if basics._core.mpi_ft():
                        basics._agree_alive(
                            True
                        )  # every survivor sees a death here alike (a barrier may not)
                    else:
                        barrier()
                break
            except InvalidArgumentError:
                raise
            except HorovodInternalError as exc:
                if directory is None or _PEER_LEFT in str(exc):
                    raise
                if not basics._core.mpi_ft():
                    _exit_for_relaunch(exc)
                # After a death this process ends without MPI_Finalize: Open MPI 5's waited forever
                # once every rank of a host had died, though the survivors had finished, and a
                # survivor whose recovery raises (its restore, say) would wait there on the others
                # while they wait for it in the shrink or the new engine. hvd_lite.run ends the job
                # on such a rank's error.
                basics.skip_mpi_finalize()
                returned = _recover_in_place(state, exc, returned)
                skip_sync = False
                continue
            except HostsUpdatedInterrupt as exc:
                if directory is not None and state._hosts_changed is not None:
                    _exit_for_new_hosts(state)
                skip_sync = exc.skip_sync
            _reset()
            state.on_reset()
        if directory is not None:
            _remove_at_exit(directory, restarts, state._commit_name)
        return result

    return wrapper


__all__ = [
    "run",
    "State",
    "ObjectState",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "CollectiveError",
]
