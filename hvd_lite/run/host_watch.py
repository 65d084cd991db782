"""While an elastic job runs: watch the discovery script, blacklist failed hosts, tell rank 0.

Horovod's elastic driver, in restart mode. Every DISCOVERY_INTERVAL_S seconds (Horovod's
DISCOVER_HOSTS_FREQUENCY_SECS, 1 s) a thread runs --host-discovery-script. When the usable hosts
(those printed, less the blacklisted ones) differ from the ones seen before, and the slots they
give (capped at --max-np) would place the ranks differently from the running launch, the launcher
announces an update to rank 0 over a TCP connection:

    rank 0 -> launcher   SECRET\\n              (HVD_LITE_ELASTIC_SECRET: only the job's rank 0 listens)
    launcher -> rank 0   update SEQ KIND\\n     (SEQ counts updates; KIND: ADDED | REMOVED bits)

Rank 0 reads the connection without blocking at each `state.commit()` / `check_host_updates()` and
broadcasts what it read, so every rank raises HostsUpdatedInterrupt at the same step
(hvd_lite/elastic/host_updates.py); the ranks then exit with RESTART_EXIT and the launcher
relaunches on the new slots. Rank 0 connects on its first check, so an update announced before
then is sent as it connects.

A host where a rank failed first (killed by a signal, or exited with a code of its own) is
blacklisted: no longer used, for good, or, with --blacklist-cooldown-range LOW HIGH, for a period
that doubles with each failure of the host (LOW * 2^failures plus up to LOW at random, kept within
[LOW, HIGH]), as Horovod 0.28.1 does.
"""

import random
import secrets
import socket
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..exceptions import LauncherError
from .hosts import Host, listen_host, place, total_slots
from .rank import HOSTS_ADDED as ADDED
from .rank import HOSTS_REMOVED as REMOVED

DISCOVERY_INTERVAL_S = 1.0  # Horovod's DISCOVER_HOSTS_FREQUENCY_SECS
COOLDOWN_RANGE_S = (1, 3600)  # the bounds Horovod puts on --blacklist-cooldown-range

Placement = List[Tuple[str, int]]


class Blacklist:
    """Hosts not to use: for good, or until a cooldown ends (`cooldown`: (low, high) seconds)."""

    def __init__(
        self, cooldown: Optional[Tuple[int, int]] = None, clock: Callable[[], float] = time.monotonic
    ):
        if cooldown is not None:
            low, high = cooldown
            if not COOLDOWN_RANGE_S[0] <= low <= high <= COOLDOWN_RANGE_S[1]:
                raise LauncherError(
                    f"--blacklist-cooldown-range {low} {high}: give LOW <= HIGH, both from "
                    f"{COOLDOWN_RANGE_S[0]} to {COOLDOWN_RANGE_S[1]} seconds"
                )
        self.cooldown = cooldown
        self._clock = clock
        self._until: Dict[str, float] = {}  # host -> end of its cooldown (inf: for good)
        self._failures: Dict[str, int] = {}

    def add(self, host: str) -> float:
        """Blacklists `host`; returns how many seconds it stays out (inf without a cooldown)."""
        key = host.lower()
        self._failures[key] = self._failures.get(key, 0) + 1
        if self.cooldown is None:
            self._until[key] = float("inf")
            return float("inf")
        low, high = self.cooldown
        delay = max(low, min(high, low * (1 << self._failures[key]) + random.uniform(0, 1) * low))
        self._until[key] = self._clock() + delay
        return delay

    def blocks(self, host: str) -> bool:
        """Whether `host` is blacklisted now."""
        return self._until.get(host.lower(), 0.0) > self._clock()

    def usable(self, hosts: Sequence[Host]) -> List[Host]:
        """`hosts` less the blacklisted ones."""
        return [h for h in hosts if not self.blocks(h.name)]

    def listed(self) -> List[str]:
        """The hosts blacklisted now."""
        return sorted(h for h in self._until if self.blocks(h))


def placement(hosts: Sequence[Host], min_np: int, max_np: Optional[int]) -> Placement:
    """Ranks per host a launch on `hosts` gets: every slot, capped at max_np; [] under min_np."""
    n = total_slots(hosts)
    if max_np is not None:
        n = min(n, max_np)
    return place(hosts, n) if n >= min_np and n > 0 else []


def update_kind(before: Placement, after: Placement, live: Optional[Placement] = None) -> int:
    """ADDED and/or REMOVED, going from the launch placed as `before` to `after`: ADDED when a host
    gets more ranks than `before` gave it, REMOVED when it gets fewer than it still runs (`live`:
    `before` less the ranks that died in a launch that went on without them; default `before`). A
    dead rank's slot is neither new when it is still listed, nor a loss when it is no longer."""
    old, new = dict(before), dict(after)
    running = dict(live) if live is not None else old
    kind = 0
    for host in set(old) | set(new) | set(running):
        if new.get(host, 0) > old.get(host, 0):
            kind |= ADDED
        if new.get(host, 0) < running.get(host, 0):
            kind |= REMOVED
    return kind


def kind_text(kind: int) -> str:
    """'slots added', 'slots removed' or 'slots added and removed'."""
    return "slots " + " and ".join(w for bit, w in ((ADDED, "added"), (REMOVED, "removed")) if kind & bit)


def rank_hosts(placed: Placement) -> List[str]:
    """The host of each rank of a launch placed so (ranks fill hosts in order)."""
    return [host for host, n in placed for _ in range(n)]


class Notifier:
    """The launcher's end of the connection to rank 0: accepts rank 0's connections (the job's
    secret first) and sends them each update; a connection made after an update gets it at once."""

    def __init__(self) -> None:
        self.secret = secrets.token_hex(16)
        """What rank 0 sends first (HVD_LITE_ELASTIC_SECRET)."""
        self._server = socket.create_server(("", 0))
        self.port = self._server.getsockname()[1]
        """The port listened on."""
        self._lock = threading.Lock()
        self._clients: List[socket.socket] = []
        self._last: Optional[bytes] = None
        self._seq = 0
        self._closed = False
        threading.Thread(target=self._accept, name="hvd_lite.run-notify", daemon=True).start()

    def address(self, hosts: Sequence[str]) -> str:
        """HOST:PORT for ranks on `hosts` to connect to."""
        return f"{listen_host(hosts)}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._greet, args=(conn,), daemon=True).start()

    def _greet(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            line = conn.makefile("rb").readline(200)
        except OSError:
            line = b""
        if line.strip() != self.secret.encode():
            conn.close()
            return
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._clients.append(conn)
            if self._last is not None:
                self._send(conn, self._last)

    def _send(self, conn: socket.socket, data: bytes) -> None:
        try:
            conn.sendall(data)
        except OSError:
            self._clients = [c for c in self._clients if c is not conn]

    def announce(self, kind: int) -> None:
        """Sends `update SEQ KIND` to rank 0 (and to whoever connects later in this launch)."""
        with self._lock:
            self._seq += 1
            self._last = b"update %d %d\n" % (self._seq, kind)
            for conn in list(self._clients):
                self._send(conn, self._last)

    def new_launch(self) -> None:
        """Forgets the last launch's rank 0 and its update."""
        with self._lock:
            for conn in self._clients:
                conn.close()
            self._clients, self._last = [], None

    def close(self) -> None:
        """Stops listening and closes every connection."""
        self.new_launch()
        with self._lock:
            self._closed = True
        self._server.close()


class HostWatcher:
    """Runs the discovery script every DISCOVERY_INTERVAL_S while one launch runs, and announces an
    update when the usable hosts change the placement. `discover()` returns the hosts printed.

    In a launch that goes on without a rank that died (shrink mode), `lost(rank)` takes the rank's
    slot out of the running ranks: the survivors are what a host that the script drops, or lists
    with fewer slots, must still make room for (update_kind). The dead slot is not offered back
    while this launch runs (a host where a rank died is not blacklisted, its survivors go on there);
    the next launch, for an update or a failure, places ranks on every slot listed then."""

    def __init__(
        self,
        discover: Callable[[], List[Host]],
        blacklist: Blacklist,
        min_np: int,
        max_np: Optional[int],
        notifier: Notifier,
        seen: List[Host],
        running: Placement,
        interval: float = DISCOVERY_INTERVAL_S,
    ):
        self._discover, self._blacklist, self._notifier = discover, blacklist, notifier
        self._min_np, self._max_np, self._interval = min_np, max_np, interval
        self._seen = blacklist.usable(seen)
        self._running = running
        self._lock = threading.Lock()
        self._dead: List[int] = []  # ranks of this launch that died while it went on
        self._stop = threading.Event()
        self.announced: Optional[Tuple[int, Placement]] = None
        """(KIND, the placement announced) once an update was sent to rank 0."""
        self._thread = threading.Thread(target=self._loop, name="hvd_lite.run-discovery", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                found = self._blacklist.usable(self._discover())
            except LauncherError as exc:  # a transient failure: tried again next time
                sys.stderr.write(f"hvd_lite.run: {exc}\n")
                continue
            if found == self._seen:
                continue
            self._seen = found
            target = placement(found, self._min_np, self._max_np)
            kind = update_kind(self._running, target, self.live())
            if not kind or (self.announced and target == self.announced[1]):
                continue
            self.announced = (kind, target)
            self._notifier.announce(kind)

    def lost(self, rank: int) -> None:
        """Rank `rank` of this launch died and the launch goes on without it (called from the
        launcher's output thread, or the thread reading the shims' reports over TCP)."""
        with self._lock:
            if rank not in self._dead:
                self._dead.append(rank)

    def live(self) -> Placement:
        """The running launch's ranks per host, less those that died."""
        hosts = rank_hosts(self._running)
        with self._lock:
            for rank in self._dead:
                if 0 <= rank < len(hosts):
                    hosts[rank] = ""
        return [(h, sum(1 for x in hosts if x == h)) for h, _ in self._running]

    def stop(self) -> None:
        """Ends the thread (after the script's run in progress, if any)."""
        self._stop.set()
        self._thread.join()
