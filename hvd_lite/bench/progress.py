"""Progress lines of a long run on stderr, one per point, as nccl-tests and pytest show theirs.

    bench allreduce: 64K (3/12, 0.8 s)        the point starting now, its number, seconds so far
    bench allreduce: 12 points in 4.1 s       the end

Only stderr: stdout (tables, --json records) reads the same with or without them. The standard library
only, so that sim/simulate.py, which runs without the package's dependencies, loads this file too.
"""

import argparse
import sys
import time


def add_argument(p: argparse.ArgumentParser) -> None:
    """--quiet: the command prints no progress lines."""
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (one per point)")


class Progress:
    """Says on stderr which point of `total` starts, and the time at the end, where `show` is true
    (rank 0, without --quiet)."""

    def __init__(self, name: str, total: int, show: bool = True):
        self.name = name
        self.total = total
        self.show = show
        self.count = 0
        self.start = time.monotonic()

    def point(self, what: str) -> None:
        """The next point, `what`, starts now."""
        self.count += 1
        self._say(f"{what} ({self.count}/{self.total}, {time.monotonic() - self.start:.1f} s)")

    def finish(self) -> None:
        """The run's points are done."""
        self._say(f"{self.count} points in {time.monotonic() - self.start:.1f} s")

    def _say(self, text: str) -> None:
        if self.show:
            print(f"{self.name}: {text}", file=sys.stderr, flush=True)
