"""Helpers the benchmarks share: sizes, dtypes, ops, timing, tables, JSON."""

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import ml_dtypes
import numpy as np

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

# Names accepted by -d, with nccl-tests' aliases.
DTYPES = {
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
DTYPE_ALIASES = {"char": "int8", "int": "int32", "half": "float16", "float": "float32", "double": "float64"}

# nccl-tests' op names; "avg" is hvd_lite's Average.
OPS = ("sum", "prod", "max", "min", "avg")


def parse_size(text: str) -> int:
    """'4', '64K', '1M', '256M', '1G' (powers of 1024) -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"size {text!r} is not a number of bytes such as 4, 64K, 1M or 256M")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def format_size(nbytes: int) -> str:
    """Bytes in the shortest exact form: 4, 64K, 1M."""
    for suffix in ("G", "M", "K"):
        unit = _SUFFIX[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def size_range(minbytes: int, maxbytes: int, factor: float) -> List[int]:
    """minbytes, minbytes*factor, ... up to maxbytes (inclusive), as nccl-tests steps."""
    if minbytes < 1 or maxbytes < minbytes:
        raise ValueError(f"sizes must satisfy 1 <= minbytes <= maxbytes, got {minbytes} and {maxbytes}")
    if factor <= 1 and minbytes != maxbytes:
        raise ValueError(f"the step factor must be > 1, got {factor}")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        if factor <= 1:
            break
        nxt = int(size * factor)
        size = nxt if nxt > size else size + 1
    return sizes


def dtype_from_name(name: str) -> np.dtype:
    """-d's dtype name -> numpy dtype."""
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: np.dtype) -> str:
    """The name -d accepts for a numpy dtype."""
    return next(name for name, dt in DTYPES.items() if dt == dtype)


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    return statistics.median(values)


def time_batch(call: Callable[[], object], iters: int, sync: Callable[[], object]) -> float:
    """Seconds per call of `iters` back-to-back calls, started after sync()."""
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def gbps(nbytes: float, seconds: float) -> float:
    """nbytes per second in GB/s (1e9 bytes)."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def machine_summary() -> Dict[str, str]:
    """A short description of this machine (lscpu's main fields where available)."""
    info = {
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": str(os.cpu_count()),
    }
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return info
    keep = (
        "Model name",
        "CPU(s)",
        "Thread(s) per core",
        "Core(s) per socket",
        "Socket(s)",
        "L1d cache",
        "L2 cache",
        "L3 cache",
        "Hypervisor vendor",
    )
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keep:
            info[key.strip()] = value.strip()
    return info


def loadavg() -> List[float]:
    """The 1, 5 and 15-minute load averages (other work on the machine skews timings)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def provenance(load_start: List[float], load_end: List[float]) -> dict:
    """What a benchmark's JSON record says about where it ran: the build, mpi4py, the machine
    and its load averages at the start and the end."""
    import mpi4py

    import hvd_lite as hvd

    return {
        "build_info": hvd.build_info(),
        "mpi4py": mpi4py.__version__,
        "machine": machine_summary(),
        "loadavg": {"start": load_start, "end": load_end},
    }


def verdict(world, total_wrong: int) -> int:
    """The exit status on every rank (collective over `world`): 1 if the root counted wrong
    elements, which it says on stderr, else 0; only the root's count matters."""
    if total_wrong:
        print(f"# {total_wrong} wrong elements", file=sys.stderr)
    return 1 if world.bcast(total_wrong, root=0) else 0


def write_json(path: str, record: dict) -> None:
    """Writes a benchmark record as indented JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


class Table:
    """Fixed-width text table, printed row by row as results come in."""

    def __init__(self, columns: Sequence[tuple], out=None):
        # columns: (header, width, format) with format like "{:.2f}" or "{}".
        self.columns = list(columns)
        self.out = out or sys.stdout

    def header(self, groups: Optional[Sequence[tuple]] = None) -> None:
        """Prints the header, with optional (title, number_of_columns) groups above it."""
        if groups:
            cells, i = [], 0
            for title, span in groups:
                width = sum(w for _, w, _ in self.columns[i : i + span]) + (span - 1)
                cells.append(title.center(width) if title else " " * width)
                i += span
            print("#" + " ".join(cells).rstrip()[1:], file=self.out)
        line = " ".join(h.rjust(w) for h, w, _ in self.columns)
        print("#" + line[1:], file=self.out)
        self.out.flush()

    def row(self, values: Sequence[object]) -> None:
        """Prints one row; None prints as 'n/a'."""
        cells = []
        for (_, width, fmt), v in zip(self.columns, values):
            cells.append(("n/a" if v is None else fmt.format(v)).rjust(width))
        print(" ".join(cells), file=self.out)
        self.out.flush()
