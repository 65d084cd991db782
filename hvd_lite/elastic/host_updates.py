"""Rank 0's end of the launcher's host-update connection (hvd_lite/run/host_watch.py says the rest).

In an elastic job whose launcher runs a discovery script, rank 0 connects to HVD_LITE_ELASTIC_NOTIFY
on its first check, sends HVD_LITE_ELASTIC_SECRET, and from then on reads what has arrived without
waiting: `update SEQ KIND` lines. The other ranks never connect; State.check_host_updates
broadcasts rank 0's reading, so every rank sees the same update at the same step. When rank 0 dies
in shrink mode, the survivor that becomes rank 0 connects at its first check, and the launcher
sends it the last update (host_watch.Notifier).
"""

import os
import socket
import sys
from typing import Optional

from ..run.rank import ELASTIC_NOTIFY_VAR, ELASTIC_SECRET_VAR, connect_within

CONNECT_TIMEOUT_S = 10.0


class HostUpdates:
    """The updates the launcher sent to this rank 0."""

    def __init__(self, address: str, secret: str):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{ELASTIC_NOTIFY_VAR} must be HOST:PORT, got {address!r}")
        self.address = (host, int(port))
        self._secret = secret
        self._sock: Optional[socket.socket] = None
        self._failed = False
        self._buffer = b""

    def _connect(self) -> Optional[socket.socket]:
        if self._sock is None and not self._failed:
            try:
                sock = connect_within(*self.address, CONNECT_TIMEOUT_S)
                sock.sendall(self._secret.encode() + b"\n")
                sock.setblocking(False)
                self._sock = sock
            except OSError as exc:
                self._failed = True
                sys.stderr.write(
                    f"hvd_lite.elastic: cannot reach hvd_lite.run at {self.address[0]}:{self.address[1]} "
                    f"({exc}); this job will not hear of host changes\n"
                )
        return self._sock

    def poll(self) -> int:
        """The KIND bits of the updates that arrived since the last call (0: none)."""
        sock = self._connect()
        if sock is None:
            return 0
        while True:
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:  # the launcher closed it: no more updates in this launch
                sock.close()
                self._sock, self._failed = None, True
                break
            self._buffer += data
        kind = 0
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            words = line.split()
            if len(words) == 3 and words[0] == b"update" and words[2].isdigit():
                kind |= int(words[2])
        return kind


_updates: list = []  # [HostUpdates or None], made on the first call of from_env


def from_env() -> Optional[HostUpdates]:
    """This process's connection to the launcher's host updates, or None outside an elastic launch
    with a discovery script."""
    if not _updates:
        address = os.environ.get(ELASTIC_NOTIFY_VAR)
        _updates.append(HostUpdates(address, os.environ.get(ELASTIC_SECRET_VAR, "")) if address else None)
    return _updates[0]
