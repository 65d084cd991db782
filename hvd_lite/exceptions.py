"""hvd_lite's exceptions: one hierarchy rooted in HvdLiteError."""


class HvdLiteError(RuntimeError):
    """Base of every error hvd_lite raises on its own behalf."""


class NotInitializedError(HvdLiteError):
    """A collective or query was called before hvd_lite.init()."""


class MPIMismatchError(HvdLiteError):
    """The MPI at run time is not the one hvd_lite was built against."""


class LauncherError(HvdLiteError):
    """hvd_lite.run could not start, run or finish a job (bad hosts, no MPI, ranks not starting)."""


class RemoteRankError(HvdLiteError):
    """A function given to hvd_lite.run.run() raised on a rank; carries the rank and its traceback."""

    def __init__(self, rank: int, remote_traceback: str, exception=None):
        super().__init__(f"rank {rank} raised an exception; its traceback:\n{remote_traceback.rstrip()}")
        self.rank = rank
        """The rank that raised."""
        self.remote_traceback = remote_traceback
        """The exception's traceback on that rank, as text."""
        self.exception = exception
        """The exception itself, if it could be sent back (else None)."""


class CollectiveError(HvdLiteError):
    """A collective failed in the C core; `code` is the hvdlResult_t value."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        """The hvdlResult_t value (csrc/hvdl.h)."""
        self.message = message
        """What failed and where, as the C core reported it."""


class InvalidArgumentError(CollectiveError, ValueError):
    """An argument was refused (hvdlInvalidArgument), by this rank or, for a collective, by the
    negotiation on every rank (the ranks' arguments disagree, or one rank's were bad); nothing
    was sent. A ValueError, as Horovod users catch it, and a RuntimeError."""


class UnsupportedDtypeError(HvdLiteError, TypeError, ValueError):
    """A tensor's element type is not one hvd_lite moves: a TypeError, and a ValueError as Horovod
    raises for it, so either `except` clause catches it. Raised before anything is sent."""


# Result codes (NCCL's numbers) as read from the C header by the extension.
INVALID_ARGUMENT = 4


def error_from_code(code: int, message: str) -> CollectiveError:
    """Builds the exception for an hvdlResult_t; the C extension calls this."""
    cls = InvalidArgumentError if code == INVALID_ARGUMENT else CollectiveError
    return cls(code, message)


HorovodInternalError = CollectiveError
"""Horovod's name for a failed collective: the same class as CollectiveError, so `except
HorovodInternalError` catches what hvd_lite's collectives raise (hvd_lite.elastic.run does)."""


class HostsUpdatedInterrupt(HvdLiteError):
    """The job's hosts changed: hvd_lite.elastic.run re-forms the job and resumes without rolling
    back to the last commit (Horovod's name). `skip_sync`: the state need not be synced again."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the job's hosts changed")
        self.skip_sync = bool(skip_sync)
        """True when the ranks' states are already identical (no sync after the reset)."""
