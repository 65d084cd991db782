"""Hosts and slots: parses `-H host1:2,host2:4` and hostfiles, and places ranks on hosts."""

import os
import re
import socket
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..exceptions import LauncherError
from .values import MAX_RANKS, parse_int

_LOCAL_NAMES = ("localhost", "127.0.0.1")
# A host name or IPv4 address: letters, digits, '-', '_' and '.' (ASCII only).
_HOST_RE = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class Host:
    """A host name and the number of ranks it may run."""

    name: str
    slots: int

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def _check_name(name: str, where: str) -> str:
    if not name:
        raise LauncherError(f"{where}: empty host name")
    if name.startswith("-"):
        raise LauncherError(
            f"{where}: host name {name!r} starts with '-', which mpirun would "
            "read as an option; give the host's name"
        )
    if not _HOST_RE.fullmatch(name):
        raise LauncherError(
            f"{where}: {name!r} is not a valid host name (use letters, digits, '-', '_' and '.'; "
            "IPv6 literals are not supported, give the host's name instead)"
        )
    return name


def _check_slots(text: str, where: str) -> int:
    try:
        return parse_int(text, 1, MAX_RANKS)
    except ValueError as exc:
        raise LauncherError(f"{where}: slots must be {exc}") from None


def _no_duplicates(hosts: List[Host], where: str) -> List[Host]:
    seen: Dict[str, str] = {}
    for h in hosts:
        key = h.name.lower()  # host names are case-insensitive
        if key in seen:
            same = f"host {h.name!r}" + (f" (the same as {seen[key]!r})" if seen[key] != h.name else "")
            raise LauncherError(
                f"{where}: {same} is listed twice; give it once with the total number of slots"
            )
        seen[key] = h.name
    return hosts


def parse_hosts(text: str) -> List[Host]:
    """Parses `host1:2,host2:4` (a host without `:N` has one slot)."""
    where = f"-H {text!r}"
    if not text or not text.strip():
        raise LauncherError("-H: the host list is empty; use -H host1:2,host2:2")
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise LauncherError(f"{where}: empty entry (two commas in a row, or a trailing comma)")
        name, sep, slots = item.partition(":")
        if sep and ":" in slots:
            raise LauncherError(
                f"{where}: {item!r} has more than one ':'; use host:N (IPv6 literals are not supported)"
            )
        hosts.append(
            Host(_check_name(name, where), _check_slots(slots, f"{where}, host {name!r}") if sep else 1)
        )
    return _no_duplicates(hosts, where)


def parse_hostfile(path: str) -> List[Host]:
    """Reads a hostfile: one `host slots=N` per line (`slots=` optional), `#` starts a comment."""
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise LauncherError(f"--hostfile {path!r}: cannot read it: {exc.strerror}") from None
    hosts = []
    for lineno, data in enumerate(lines, 1):
        where = f"{path}:{lineno}"
        try:
            raw = data.decode("utf-8")
        except UnicodeDecodeError:
            raise LauncherError(f"{where}: the line is not UTF-8 text: {data!r}") from None
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        name, slots = fields[0], None
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            if key == "slots" and sep and slots is None:
                slots = _check_slots(value, f"{where}, host {name!r}")
            elif key == "slots" and sep:
                raise LauncherError(
                    f"{where}: slots= is given twice in {raw.strip()!r}; a line is 'host slots=N'"
                )
            else:
                raise LauncherError(
                    f"{where}: cannot read {field!r} in {raw.strip()!r}; a line is 'host slots=N'"
                )
        hosts.append(Host(_check_name(name, where), 1 if slots is None else slots))
    if not hosts:
        raise LauncherError(f"--hostfile {path!r} lists no hosts; add lines 'host slots=N'")
    return _no_duplicates(hosts, f"--hostfile {path!r}")


def total_slots(hosts: Sequence[Host]) -> int:
    """Sum of the hosts' slots."""
    return sum(h.slots for h in hosts)


def _check_np(np: int) -> int:
    if isinstance(np, bool) or not isinstance(np, int):
        raise TypeError(f"np must be an int, got {type(np).__name__} {np!r}")
    if not 1 <= np <= MAX_RANKS:
        raise LauncherError(f"-np must be from 1 to {MAX_RANKS}, got {np}")
    return np


def place(hosts: Sequence[Host], np: int) -> List[Tuple[str, int]]:
    """Ranks per host, filling hosts in order: rank 0.. on the first host, and so on."""
    _check_np(np)
    total = total_slots(hosts)
    if np > total:
        listed = ", ".join(str(h) for h in hosts)
        raise LauncherError(
            f"-np {np} is more than the {total} slot(s) on the hosts ({listed}); "
            "lower -np or give the hosts more slots (-H host:N, or slots=N in the "
            "hostfile)"
        )
    placed, left = [], np
    for h in hosts:
        if left == 0:
            break
        n = min(h.slots, left)
        placed.append((h.name, n))
        left -= n
    return placed


def resolve(
    np: Optional[int], hosts: Optional[str] = None, hostfile: Optional[str] = None
) -> Tuple[int, List[Host]]:
    """The job's np and hosts from the options; the default is localhost with np slots."""
    if hosts is not None and hostfile is not None:
        raise LauncherError("give either -H/--hosts or --hostfile, not both")
    if hostfile is not None:
        host_list = parse_hostfile(os.fspath(hostfile))
    elif hosts is not None:
        host_list = parse_hosts(hosts)
    else:
        n = _check_np(1 if np is None else np)
        return n, [Host("localhost", n)]
    n = total_slots(host_list) if np is None else np
    place(host_list, n)  # validates np, and np against the slots
    return n, host_list


def listen_host(hosts: Sequence[str]) -> str:
    """The name ranks on `hosts` reach this machine by: 127.0.0.1 where every host is this machine
    by a name that needs no lookup, else this machine's host name."""
    return "127.0.0.1" if all(h.lower() in _LOCAL_NAMES for h in hosts) else socket.gethostname()
