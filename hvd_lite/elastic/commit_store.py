"""Where an elastic job's commits live between launches: one file per state on each host's disk.

A commit file is `<directory>/<name>.commit`: a header line (`hvd_lite-commit 1`), the commit's
counter and the payload's length and CRC-32 as decimal fields, then the payload (a pickle). It is
written as a temporary file in the same directory, flushed with fsync, renamed over the previous
commit (atomic on a POSIX file system) and the directory fsynced, so a process killed at any point
leaves either the previous commit or the new one whole; a torn temporary file is never read. A file
that does not parse (a disk that lies about fsync, a stranger's file) reads as no commit, with a
warning, rather than as state.

The directory comes from the launcher (`HVD_LITE_ELASTIC_JOB_DIR`): the same path on every host, unique
to the job, kept across relaunches.
"""

import os
import sys
import zlib
from typing import Optional, Tuple

_MAGIC = b"hvd_lite-commit 1\n"
_SUFFIX = ".commit"


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory; the rename stands
        pass
    finally:
        os.close(fd)


class CommitStore:
    """The commits of one job on this host, in `directory` (created on the first write, mode 0700)."""

    def __init__(self, directory: str):
        if not isinstance(directory, str) or not directory:
            raise ValueError(f"the commit directory must be a non-empty path, got {directory!r}")
        self.directory = directory
        """The directory that holds the commit files."""

    def path(self, name: str) -> str:
        """The commit file of state `name`."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"a state's commit name must be a plain file name, got {name!r}")
        return os.path.join(self.directory, name + _SUFFIX)

    def write(self, name: str, counter: int, payload: bytes) -> None:
        """Replaces the commit of `name` with (counter, payload), atomically."""
        if isinstance(counter, bool) or not isinstance(counter, int) or counter < 0:
            raise ValueError(f"a commit counter is an int >= 0, got {counter!r}")
        final = self.path(name)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        tmp = f"{final}.tmp.{os.getpid()}"
        header = b"%s%d %d %d\n" % (_MAGIC, counter, len(payload), zlib.crc32(payload))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(self.directory)

    def read(self, name: str) -> Optional[Tuple[int, bytes]]:
        """(counter, payload) of the commit of `name` on this host, or None when there is none."""
        path = self.path(name)
        try:
            owner = os.stat(self.directory).st_uid
        except OSError:
            return None
        if owner != os.getuid():  # a commit is unpickled: only from a directory of this user's
            _warn(f"{self.directory} belongs to user id {owner}, not this user's; ignoring its commits")
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            _warn(f"cannot read the commit {path}: {exc.strerror}; treating it as absent")
            return None
        head, sep, rest = data[len(_MAGIC) :].partition(b"\n")
        try:
            if not data.startswith(_MAGIC) or not sep:
                raise ValueError("no header")
            counter, length, crc = (int(x) for x in head.split(b" "))
            if len(rest) != length or zlib.crc32(rest) != crc:
                raise ValueError(f"{len(rest)} payload bytes of {length}, or a bad checksum")
        except ValueError as exc:
            _warn(f"the commit {path} is damaged ({exc}); treating it as absent")
            return None
        return counter, rest

    def remove(self, name: str) -> None:
        """Removes the commit of `name` (and temporary files left by killed writers); then the
        directory, if nothing else is in it."""
        final = self.path(name)
        try:
            entries = os.listdir(self.directory)
        except OSError:
            return
        prefix = os.path.basename(final)
        for entry in entries:
            if entry == prefix or entry.startswith(prefix + ".tmp."):
                try:
                    os.unlink(os.path.join(self.directory, entry))
                except OSError:
                    pass
        try:
            os.rmdir(self.directory)
        except OSError:  # not empty (another state's commit) or already gone
            pass


def _warn(text: str) -> None:
    sys.stderr.write(f"hvd_lite.elastic: {text}\n")
    sys.stderr.flush()
