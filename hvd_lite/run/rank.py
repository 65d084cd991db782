"""The rank shim: runs the user's command on a rank and reports its start and exit to the launcher.

mpirun starts `python .../hvd_lite/run/rank.py CMD ARGS...` on every rank. The shim writes one
marker line to stderr ("started"), runs CMD ARGS exactly as given (no shell), forwards the signals
it receives to it, writes a second marker line with the exit status (and the signal, when CMD was
killed by one), and exits with that status (or dies of the same signal). The launcher reads the
markers out of mpirun's stderr: that is how it bounds the start (--start-timeout) and reports the
exit code of the rank that failed, whatever the MPI does with exit codes (Hydra ORs them together).
Where the launcher listens for them (REPORT_VAR, a job that survives deaths), the shim also sends
its exit marker there over TCP: an MPI that loses a host's daemon may stop relaying the other
ranks' output before their shims end (job.ExitReports). There the shim also passes CMD's output on
itself (Relay), through a pipe, or a pseudo-terminal where its own stream is a terminal: once the
MPI stops reading, the rest is dropped, and CMD's writes go on succeeding. Without that, a survivor
that prints after the loss fails on its write (Python exits 1, or 120 at its final flush), which the
launcher cannot tell from a failure of the script.

This file is run by path and imports only the standard library, so it works before (and without)
hvd_lite's C extension loading.
"""

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional, Tuple

TOKEN_VAR = "HVD_LITE_RUN_TOKEN"
FUNC_VAR = "HVD_LITE_RUN_FUNC"  # run(func): the pickled function, read by task.py
# An elastic job (hvd_lite.run --min-np ...), read by hvd_lite.elastic on the ranks:
ELASTIC_BASE_VAR = "HVD_LITE_ELASTIC_DIR"  # the user's: where the launcher makes the job's commit directory
ELASTIC_DIR_VAR = "HVD_LITE_ELASTIC_JOB_DIR"  # the job's commit directory, the same path on every host
ELASTIC_RESTARTS_VAR = "HVD_LITE_ELASTIC_RESTARTS"  # how many times the launcher has relaunched the job
ELASTIC_MIN_NP_VAR = "HVD_LITE_ELASTIC_MIN_NP"  # --min-np: below it, survivors of a shrink stop
ELASTIC_NOTIFY_VAR = "HVD_LITE_ELASTIC_NOTIFY"  # HOST:PORT where the launcher tells rank 0 of host updates
ELASTIC_SECRET_VAR = "HVD_LITE_ELASTIC_SECRET"  # what rank 0 sends first on that connection
HOSTS_ADDED, HOSTS_REMOVED = 1, 2  # the KIND bits of a host update on that connection
RESTART_EXIT = 75  # a rank's exit code asking for a relaunch: a collective failed under elastic.run
REPORT_VAR = "HVD_LITE_RUN_REPORT"  # HOST:PORT where the launcher also takes each rank's exit marker
REPORT_TIMEOUT_S = 2.0  # to look its name up, connect to it and send the marker, at most
RELAY_DRAIN_S = 1.0  # after CMD ends, how long the relay waits for more of its output
RELAY_MAX_DRAIN_S = 10.0  # ... and how long in all
PREFIX = "@@hvdl-run"
CHUNK = 2000  # characters of payload per marker line: one write, below PIPE_BUF
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
_FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def rank_from_env() -> int:
    """This process's rank as the MPI launcher told it, or -1."""
    for var in _RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return -1


def marker_lines(kind: str, rank: int, payload: str = "") -> list:
    """The marker lines `@@hvdl-run:TOKEN:KIND:RANK:I/N:DATA` for a payload (none without a token)."""
    token = os.environ.get(TOKEN_VAR)
    if not token:
        return []
    pieces = [payload[i : i + CHUNK] for i in range(0, len(payload), CHUNK)] or [""]
    n = len(pieces)
    return [f"{PREFIX}:{token}:{kind}:{rank}:{i}/{n}:{piece}\n".encode() for i, piece in enumerate(pieces)]


def emit(kind: str, rank: int, payload: str = "") -> None:
    """Writes marker lines to stderr, one write each."""
    for line in marker_lines(kind, rank, payload):
        try:
            os.write(2, line)
        except OSError:
            return


def connect_within(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to (host, port) made within `timeout` seconds, the lookup of the host's name
    included (getaddrinfo has no time limit of its own: a resolver that does not answer would hold
    the caller for as long as its own, often 5 s a try); socket.timeout past it. The socket's own
    timeout is what is left of `timeout`, so that a send right after stays within it too."""
    deadline = time.monotonic() + timeout
    found: list = []

    def look_up() -> None:
        _no_forwarded_signals()
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA refuses
            found.append(OSError(f"cannot look up {host!r}: {exc}"))

    thread = threading.Thread(target=look_up, daemon=True)
    thread.start()
    thread.join(timeout)
    if not found:
        raise socket.timeout(f"looking up {host!r} took over {timeout:g} s")
    if isinstance(found[0], OSError):
        raise found[0]
    error: OSError = OSError(f"no address for {host!r}")
    for family, kind, proto, _, address in found[0]:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(address)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))  # what is left, for the caller
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


def report(kind: str, rank: int, payload: str = "") -> None:
    """Sends the marker lines to the launcher's REPORT_VAR too, where it is set: one connection,
    bounded by REPORT_TIMEOUT_S (its name's lookup included); a launcher that cannot be reached
    leaves stderr's copy alone."""
    host, _, port = os.environ.get(REPORT_VAR, "").rpartition(":")
    lines = marker_lines(kind, rank, payload)
    if not host or not port.isdigit() or not lines:
        return
    try:
        with connect_within(host, int(port), REPORT_TIMEOUT_S) as conn:
            conn.sendall(b"".join(lines))
    except OSError:
        pass


def emit_done(rank: int) -> None:
    """Said by hvd_lite in a rank of an elastic job as it ends normally, its elastic functions
    returned and MPI finalized, on stderr and to REPORT_VAR: the launcher then counts the rank as
    exited 0 even if a signal ends it in what is left (mpirun ends every rank when it loses a
    host), as the commits it may remove next are no longer needed."""
    emit("done", rank)
    report("done", rank)


def emit_exit(rank: int, payload: str) -> None:
    """How the command ended, on stderr and to the launcher's REPORT_VAR."""
    emit("exit", rank, payload)
    report("exit", rank, payload)


class Relay:
    """Passes what the command writes to one of the shim's streams (fd 1 or 2) on to it, and drops
    the rest once that stream fails (the MPI stopped reading it), so the command's writes never do.
    The command's end is a pseudo-terminal's where the shim's stream is a terminal (Open MPI gives
    each rank's stdout one), so that line buffering stays as it was, else a pipe. OSError if
    neither can be made (no file descriptors left): the shim then runs the command without."""

    def __init__(self, fd: int):
        self.fd = fd
        ends = _pseudo_terminal(fd) if os.isatty(fd) else None
        self.read_end, self.child_end = ends if ends is not None else os.pipe()
        self.dropped = 0  # bytes not passed on
        self.last_read = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def make(fd: int) -> "Optional[Relay]":
        """A relay for `fd`, or None where it is not open (nothing to pass on to) or none can be
        made (the command then writes to `fd` itself, as outside shrink mode)."""
        try:
            os.fstat(fd)
            return Relay(fd)
        except OSError:
            return None

    def start(self) -> None:
        """Closes the shim's copy of the command's end (the command holds its own) and starts."""
        os.close(self.child_end)
        self.thread.start()

    def finish(self) -> None:
        """Waits for the output the command left while it keeps coming (at most RELAY_DRAIN_S
        without any, RELAY_MAX_DRAIN_S in all: a process the command started may hold its end)."""
        start = time.monotonic()
        while self.thread.is_alive() and time.monotonic() < start + RELAY_MAX_DRAIN_S:
            if time.monotonic() - max(self.last_read, start) > RELAY_DRAIN_S:
                return
            self.thread.join(0.05)

    def _run(self) -> None:
        _no_forwarded_signals()
        try:
            while True:
                try:
                    data = os.read(self.read_end, 65536)
                except OSError:  # a pseudo-terminal's: EIO once no process holds the command's end
                    return
                self.last_read = time.monotonic()
                if not data:
                    return
                while data and not self.dropped:
                    try:
                        data = data[os.write(self.fd, data) :]
                    except BlockingIOError:  # a non-blocking stream that is full: wait, bounded
                        select.select([], [self.fd], [], 1.0)
                    except OSError:  # EPIPE, EIO: nobody reads it any more
                        break
                self.dropped += len(data)
        finally:
            os.close(self.read_end)


def _pseudo_terminal(fd: int) -> "Optional[Tuple[int, int]]":
    """(master, slave) of a new pseudo-terminal set like the terminal `fd` (its window size too),
    but passing the bytes written to it as they are: the terminal `fd` does what output processing
    it does (line feeds to CR-LF, say) once. None where none can be made."""
    try:
        import fcntl
        import termios

        master, slave = os.openpty()
    except (ImportError, OSError):
        return None
    try:
        attrs = termios.tcgetattr(fd)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        pass
    return master, slave


def _no_forwarded_signals() -> None:
    """In a helper thread: the signals the shim forwards are not delivered here (the main thread,
    waiting for the command, forwards them)."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, name) for name in _FORWARDED])
    except (AttributeError, OSError, ValueError):
        pass


def _die_on_parent_exit() -> None:
    """In the child: get SIGKILL if the shim dies, so no rank outlives a killed shim (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort, not on Linux
        pass


def _die_of(signum: int) -> None:
    """Ends this process by `signum`, as its child ended, without leaving a core file of its own
    (one from the shim could overwrite the child's). SIGKILL's handler cannot be changed and is
    left alone."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, OSError, ValueError):
        pass
    if signum not in _UNCATCHABLE:
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):  # a signal Python may not handle (one glibc reserves)
            pass
    os.kill(os.getpid(), signum)


def main(argv) -> int:
    """Runs argv on this rank between a 'start' and an 'exit' marker; returns the exit status."""
    rank = rank_from_env()
    if not argv:
        sys.stderr.write("hvd_lite.run rank shim: no command given\n")
        return 2
    child = None
    early = []  # signals that arrived before the child existed

    def forward(signum, _frame):
        if child is None:
            early.append(signum)
            return
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for name in _FORWARDED:
        signal.signal(getattr(signal, name), forward)
    emit("start", rank)
    relays = [Relay.make(1), Relay.make(2)] if os.environ.get(REPORT_VAR) else [None, None]
    out, err = (None if relay is None else relay.child_end for relay in relays)
    try:
        # close_fds=False: Hydra hands each rank its PMI connection as an inherited fd (PMI_FD).
        child = subprocess.Popen(
            argv, close_fds=False, preexec_fn=_die_on_parent_exit, stdout=out, stderr=err
        )
    except OSError as exc:
        sys.stderr.write(f"hvd_lite.run: rank {rank}: cannot run {argv[0]!r}: {exc.strerror}\n")
        emit_exit(rank, "127")
        return 127
    finally:
        for relay in filter(None, relays):
            relay.start()
    for signum in early:
        forward(signum, None)
    code = child.wait()
    for relay in filter(None, relays):
        relay.finish()
    if code < 0:
        emit_exit(rank, f"{128 - code}:{-code}")
        _die_of(-code)
        return 128 - code  # still alive: the signal does not end this process
    emit_exit(rank, str(code))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
