"""Runs one mpirun command: relays its output, reads the ranks' markers, bounds the start,
propagates the failing rank's exit code and turns Ctrl-C/SIGTERM into the end of every rank.

mpirun runs in its own session (process group) with stdout passed through and stderr piped. A
reader thread copies stderr through, minus the marker lines the rank shim (rank.py) writes. The
calling thread waits on mpirun and ends the job (SIGTERM to mpirun's process group, then SIGKILL
after KILL_GRACE_S) when: the launcher gets SIGINT/SIGTERM/SIGHUP; not every rank started within
the start timeout; or a rank failed and the MPI has not ended the job FAILURE_GRACE_S later
(Hydra waits for the other ranks, which may be blocked on the dead one). A job that survives
deaths (shrink mode) goes on without a rank killed by a signal: only a rank that exits with a code
of its own starts that wait.

Such a job also hears each rank's exit marker over TCP (ExitReports): Open MPI 5 stops relaying the
ranks' output when it loses a host's daemon, and then ends the other hosts' ranks. Ranks that
finished the job before then must be known to have exited 0, or the launcher takes them for lost
with the host and runs the job again.
"""

import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .hosts import listen_host
from .rank import PREFIX

FAILURE_GRACE_S = 3.0
KILL_GRACE_S = 5.0
START_TIMEOUT_EXIT = 124
LOST_EXIT = 1  # mpirun exited 0, yet ranks never reported how they ended
_MARKER = re.compile(re.escape(PREFIX).encode() + rb":([0-9a-f]+):(\w+):(-?\d+):(\d+)/(\d+):([^\r\n]*)")
_TAG_ONLY = re.compile(rb"^\s*(\[[^\]]*\](<std(?:out|err)>:)?\s*)?$")
# Open MPI's libnbc writes this to stderr, with an empty line after it, in every rank that had a
# non-blocking collective (hvd_lite's negotiation) in flight when a rank died: error 75 is
# MPI_ERR_PROC_FAILED. A job that survives deaths has handled it (the survivors shrink and go on),
# so there the line says the opposite of what happened, and the launcher drops it.
_LOST_RANK_NOISE = re.compile(
    rb"^(\[[^\]]*\](<stderr>:)?\s*)?NBC_Progress: an error 75 was found during schedule \S+ "
    rb"at row-offset \d+ - aborting the schedule\s*$"
)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
REPORT_READ_TIMEOUT_S = 2.0  # for a shim's report to arrive once it has connected
REPORT_MAX_BYTES = 1 << 16  # of one report (an exit marker is under 100)


@dataclass
class JobResult:
    """How a job ended."""

    exit_code: int
    mpirun_code: int
    started: List[int] = field(default_factory=list)
    exits: Dict[int, int] = field(default_factory=dict)  # rank -> code, in the order reported
    payloads: Dict[Tuple[str, int], str] = field(default_factory=dict)
    error: Optional[str] = None
    error_printed: bool = False  # the job runner already wrote `error` to stderr
    signal: Optional[int] = None
    ended_by_launcher: bool = False  # the launcher ended the job (a signal, the start timeout, a failure)
    rank_hosts: List[str] = field(default_factory=list)  # each rank's host, as the launch placed them
    killed: Dict[int, int] = field(default_factory=dict)  # rank -> signal its command died of

    def first_failure(self, of_its_own: bool = False) -> Optional[Tuple[int, int]]:
        """(rank, code) of the first rank that reported a non-zero exit (of_its_own: the first
        that exited with a code, not killed by a signal), or None."""
        for rank, code in self.exits.items():
            if code != 0 and not (of_its_own and rank in self.killed):
                return rank, code
        return None

    @property
    def unreported(self) -> List[int]:
        """The ranks that started and never reported how they ended: their shim (rank.py) was
        killed with them, or the MPI stopped relaying their output (Open MPI 5 ends every rank,
        and exits 0, when it loses a host's daemon)."""
        return sorted(rank for rank in self.started if rank not in self.exits)

    def describe(self, rank: int) -> str:
        """How a rank ended: 'rank 1 was killed by SIGKILL (signal 9)', 'rank 1 exited with
        code 3' or 'rank 1 never reported how it ended'."""
        if rank not in self.exits:
            return f"rank {rank} never reported how it ended"
        if rank not in self.killed:
            return f"rank {rank} exited with code {self.exits.get(rank)}"
        return f"rank {rank} was killed by {_signal_text(self.killed[rank])}"


def _signal_text(signum: int) -> str:
    """'SIGKILL (signal 9)', or 'signal 40' for a number without a name (a real-time signal)."""
    try:
        return f"{signal.Signals(signum).name} (signal {signum})"
    except ValueError:
        return f"signal {signum}"


class _Markers:
    """What the ranks reported, filled by the reader thread; `on_killed(rank)` is called as a rank's
    death by a signal is read."""

    def __init__(self, token: str, on_killed: Optional[Callable[[int], None]] = None):
        self.token = token.encode()
        self.on_killed = on_killed
        self.lock = threading.Lock()
        self.started: List[int] = []
        self.exits: Dict[int, int] = {}
        self.killed: Dict[int, int] = {}
        self.done: Set[int] = set()  # ranks whose hvd_lite ended normally (rank.emit_done)
        self.failed_at: Optional[float] = None  # the first non-zero exit
        self.own_failure_at: Optional[float] = None  # the first one not by a signal
        self.chunks: Dict[Tuple[str, int], Dict[int, str]] = {}
        self.counts: Dict[Tuple[str, int], int] = {}

    def take(self, m: "re.Match") -> None:
        kind, rank = m.group(2).decode(), int(m.group(3))
        index, count, data = int(m.group(4)), int(m.group(5)), m.group(6).decode()
        died = False
        with self.lock:
            if kind == "start":
                if rank not in self.started:
                    self.started.append(rank)
            elif kind == "done":
                self.done.add(rank)
            elif kind == "exit":  # data: CODE, or CODE:SIGNAL when the command was killed
                text, _, signum = data.partition(":")
                code = int(text) if text.isascii() and text.isdigit() else 1
                self.exits.setdefault(rank, code)
                if signum.isascii() and signum.isdigit() and rank not in self.killed:
                    self.killed[rank] = int(signum)
                    died = True
                if code != 0 and self.failed_at is None:
                    self.failed_at = time.monotonic()
                if code != 0 and rank not in self.killed and self.own_failure_at is None:
                    self.own_failure_at = time.monotonic()
            else:
                self.chunks.setdefault((kind, rank), {})[index] = data
                self.counts[(kind, rank)] = count
        if died and self.on_killed is not None:
            self.on_killed(rank)

    def _payloads(self) -> Dict[Tuple[str, int], str]:
        out = {}
        for key, parts in self.chunks.items():
            if len(parts) == self.counts[key]:
                out[key] = "".join(parts[i] for i in range(len(parts)))
        return out

    def result(self, **fields) -> JobResult:
        """What the ranks reported so far, with the given other fields of a JobResult. A rank that
        said its hvd_lite ended normally and was then killed, or never reported more (its shim lost
        with its host), counts as exited 0."""
        with self.lock:
            exits, killed = dict(self.exits), dict(self.killed)
            for rank in self.done & (set(killed) | (set(self.started) - set(exits))):
                exits[rank] = 0  # killed after it, or its shim lost with its host
                killed.pop(rank, None)
            return JobResult(
                started=list(self.started), exits=exits, killed=killed, payloads=self._payloads(), **fields
            )


def _own_marker(line: bytes, token: bytes) -> "Optional[re.Match]":
    """The marker of the job with this token on `line`, or None."""
    m = _MARKER.search(line)
    return m if m is not None and m.group(1) == token else None


def _take_marker(line: bytes, markers: _Markers) -> None:
    """Gives `markers` the marker on `line`, if it holds one of this job's."""
    m = _own_marker(line, markers.token)
    if m is not None:
        markers.take(m)


class ExitReports:
    """Where the ranks' shims send their exit markers over TCP (rank.report), beside stderr: the
    second way a job that survives deaths hears how each rank ended. A report is one connection
    carrying marker lines, admitted by the job's token as stderr's are; `close()` reads every
    report sent before it (a shim connects and sends before it ends, so once mpirun has ended,
    every report is in the listening socket's queue)."""

    def __init__(self, hosts: Sequence[str]):
        # every rank may end at once: the largest queue the system allows (a shim left out would
        # retry its connection within its timeout)
        self._server = socket.create_server(("", 0), backlog=socket.SOMAXCONN)
        self._server.setblocking(False)
        self.address = f"{listen_host(hosts)}:{self._server.getsockname()[1]}"
        """HOST:PORT for the shims (rank.REPORT_VAR)."""
        self._lock = threading.Lock()
        self._take: Optional[Callable[[bytes], None]] = None
        self._early: List[bytes] = []  # lines read before follow()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="hvd_lite.run-reports", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._server], [], [], 0.1)
            except (OSError, ValueError):
                return
            if ready:
                self._read_one()

    def _read_one(self) -> bool:
        """Reads one waiting report; False when none is waiting."""
        try:
            conn, _ = self._server.accept()
        except OSError:  # BlockingIOError: none waiting
            return False
        data = b""
        with conn:
            conn.settimeout(REPORT_READ_TIMEOUT_S)
            try:
                while len(data) < REPORT_MAX_BYTES:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
        with self._lock:
            for line in data.splitlines():
                if self._take is None:
                    self._early.append(line)
                else:
                    self._take(line)
        return True

    def follow(self, take: Callable[[bytes], None]) -> None:
        """Calls take(line) for each line reported, those before this call first."""
        with self._lock:
            self._take = take
            for line in self._early:
                take(line)
            self._early = []

    def close(self) -> None:
        """Reads the reports already sent, then stops listening (once)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        while self._read_one():
            pass
        self._server.close()


def _descendants(root: int) -> List[int]:
    """Pids of every process below `root` (from /proc; empty where there is no /proc)."""
    children: Dict[int, List[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _writer():
    buf = getattr(sys.stderr, "buffer", None)
    if buf is not None:
        return lambda data: (buf.write(data), buf.flush())
    return lambda data: (sys.stderr.write(data.decode(errors="replace")), sys.stderr.flush())


def _relay(pipe, markers: _Markers, write, drop_lost_rank_noise: bool = False) -> None:
    owed = 0  # libnbc's lines dropped whose empty line has not come yet (ranks' lines interleave)
    for line in iter(pipe.readline, b""):
        if drop_lost_rank_noise and _LOST_RANK_NOISE.match(line):
            owed += 1
            continue
        if owed and _TAG_ONLY.match(line):
            owed -= 1
            continue
        m = _own_marker(line, markers.token)
        if m is None:
            write(line)
            continue
        before = line[: m.start()]
        if before and not _TAG_ONLY.match(before):
            write(before + b"\n")
        markers.take(m)
    pipe.close()


def _only_deaths(result: JobResult) -> bool:
    """Every rank that failed so far was killed by a signal (none exited with a code of its own)."""
    return all(code == 0 or rank in result.killed for rank, code in result.exits.items())


class Job:
    """One launch of an mpirun command line."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        np: int,
        token: str,
        start_timeout: float,
        stdin=None,
        quiet: bool = False,
        survives_deaths: bool = False,
        on_death: Optional[Callable[[int], None]] = None,
        reports: Optional[ExitReports] = None,
    ):
        self.argv, self.env, self.np, self.token = list(argv), dict(env), np, token
        self.start_timeout, self.stdin, self.quiet = start_timeout, stdin, quiet
        # An elastic job under an MPI with ULFM: a rank killed by a signal does not end the job
        # (the others shrink it and go on), and the job succeeds when every other rank exits 0.
        self.survives_deaths = survives_deaths
        self.on_death = on_death  # called with a rank killed by a signal, as the launcher reads it
        self.reports = reports  # the shims' exit markers over TCP, beside stderr's; closed by run()
        self.proc: Optional[subprocess.Popen] = None
        self._caught: Optional[int] = None
        self._ending_since: Optional[float] = None
        self._killed = False
        self._tree: set = set()  # mpirun's descendants seen while ending the job

    def _note(self, text: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"hvd_lite.run: {text}\n")
            sys.stderr.flush()

    def _end(self, sig=signal.SIGTERM) -> None:
        """Signals mpirun's process group and every descendant (some, like the ssh that starts a
        remote daemon, run in their own session)."""
        if self._ending_since is None:
            self._ending_since = time.monotonic()
        if self.proc is None:  # not started: nothing to signal
            return
        self._tree.update(_descendants(self.proc.pid))
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in self._tree:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _on_signal(self, signum, _frame) -> None:
        if self._caught is not None:  # a second Ctrl-C: do not wait any more
            self._killed = True
            self._end(signal.SIGKILL)
            return
        self._caught = signum
        self._end(signal.SIGTERM)

    def run(self) -> JobResult:
        """Runs the job to its end and says how it ended."""
        markers = _Markers(self.token, self.on_death)
        if self.reports is None:
            return self._run(markers)
        self.reports.follow(lambda line: _take_marker(line, markers))
        try:
            return self._run(markers)
        finally:
            self.reports.close()

    def _run(self, markers: _Markers) -> JobResult:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            for sig in _STOP_SIGNALS:
                handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdin=self.stdin, stderr=subprocess.PIPE, start_new_session=True
            )
        except OSError as exc:
            for sig, old in handlers.items():
                signal.signal(sig, old)
            return JobResult(127, 127, error=f"cannot run {self.argv[0]!r}: {exc.strerror}")
        reader = threading.Thread(
            target=_relay,
            args=(self.proc.stderr, markers, _writer(), self.survives_deaths),
            name="hvd_lite.run-stderr",
            daemon=True,
        )
        reader.start()
        error = None
        t0 = time.monotonic()
        try:
            while True:
                try:
                    rc = self.proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if self._ending_since is not None:
                    if not self._killed and now - self._ending_since > KILL_GRACE_S:
                        self._killed = True
                        self._end(signal.SIGKILL)
                    else:
                        self._tree.update(_descendants(self.proc.pid))
                    continue
                with markers.lock:
                    started = len(markers.started)
                    # a job that survives deaths goes on without the dead: its wait for the
                    # others starts when a rank exits with a code of its own
                    failed_at = markers.own_failure_at if self.survives_deaths else markers.failed_at
                    missing = sorted(set(range(self.np)) - set(markers.started))
                if started < self.np and now - t0 > self.start_timeout:
                    shown = ", ".join(map(str, missing[:16]))
                    shown += " ..." if len(missing) > 16 else ""
                    error = (
                        f"only {started} of {self.np} ranks started within "
                        f"{self.start_timeout:g} s (--start-timeout); not started: {shown}. "
                        "Check that mpirun can reach every host (ssh without a password, "
                        "the same Python and hvd_lite there) or raise --start-timeout."
                    )
                    self._note(error + " Ending the job.")
                    self._end()
                elif failed_at is not None and now - failed_at > FAILURE_GRACE_S:
                    so_far = markers.result(exit_code=0, mpirun_code=0)
                    failure = so_far.first_failure(of_its_own=self.survives_deaths)
                    if failure is not None:  # the markers' failure (failed_at is its time)
                        self._note(
                            f"{so_far.describe(failure[0])} and the job is still running "
                            f"{FAILURE_GRACE_S:g} s later; ending the other ranks."
                        )
                    self._end()
        finally:
            for sig, old in handlers.items():
                signal.signal(sig, old)
        # Kill what is left of the job (daemons or ranks that ignored SIGTERM, or outlived mpirun).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in self._tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        reader.join(timeout=KILL_GRACE_S)
        if self.reports is not None:
            self.reports.close()  # the reports of shims that ended as mpirun did
        result = markers.result(
            exit_code=0,
            mpirun_code=rc,
            error=error,
            signal=self._caught,
            ended_by_launcher=self._ending_since is not None,
        )
        if self._caught is not None:
            result.exit_code = 128 + self._caught
            result.error = f"stopped by {signal.Signals(self._caught).name}; ended every rank"
        elif error is not None:
            result.exit_code = START_TIMEOUT_EXIT
            result.error_printed = not self.quiet
        elif (
            self.survives_deaths
            and (result.killed or result.unreported)
            and _only_deaths(result)
            and len(result.exits) > len(result.killed)
        ):
            result.exit_code = 0  # the survivors finished the job
            gone = list(result.killed) + result.unreported
            self._note(
                "; ".join(result.describe(r) for r in gone)
                + f"; the job went on without {'it' if len(gone) == 1 else 'them'}, "
                "and every other rank exited 0"
            )
        elif (
            failure := result.first_failure(of_its_own=self.survives_deaths) or result.first_failure()
        ) is not None:
            # where deaths are survived, the survivors' own failure (below --min-np: their error)
            result.exit_code = failure[1]
        else:
            result.exit_code = rc if rc >= 0 else 128 - rc
            if rc < 0 or (rc != 0 and len(result.started) < self.np):
                how = f"exited with code {rc}" if rc > 0 else f"was killed by {_signal_text(-rc)}"
                result.error = (
                    f"{os.path.basename(self.argv[0])} {how} after "
                    f"{len(result.started)} of {self.np} ranks started"
                )
            elif result.unreported:  # a rank that never said it succeeded did not
                if rc == 0:
                    result.exit_code = LOST_EXIT
                result.error = (
                    f"{os.path.basename(self.argv[0])} exited {'0' if rc == 0 else f'with code {rc}'}, "
                    f"and rank(s) {', '.join(map(str, result.unreported))} never reported how they "
                    "ended: the MPI lost them (Open MPI ends every rank, and exits 0, when a host's "
                    "daemon goes away)"
                )
        return result
