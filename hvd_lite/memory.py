"""NumPy arrays in memory that the ranks of a host reach directly (the C API's hvdlMemAlloc).

    x = hvd.empty((1 << 20,), np.float32)   # like numpy.empty, but zeroed
    hvd.allreduce_(x)

A collective on such arrays gives the same result as on any other array. On one host, where every
rank's buffer is such an array, the single-copy all-reduce (above 32 KiB) and all-gather read and
write the peers' arrays with plain loads and stores instead of the kernel's process_vm_readv/writev,
which pins every page of every copy: docs/benchmarks-history.md, "Memory the peers reach". A tensor smaller
than HVD_LITE_FUSION_THRESHOLD is fused through the engine's own buffer, which is such memory too.

The memory is freed when the array and every NumPy view of it are gone, except that a peer rank on
the host may keep its own view of it for a while (at most 8 of a rank's arrays per peer and
communicator, the least recently used given back first, all when the communicator goes), so their
pages stay in use that long. Each array holds a file descriptor while it lives (`ulimit -n` bounds
how many there may be at once), and its memory is shared, not copied on write, with processes forked
from this one (multiprocessing, DataLoader workers): a child's writes into it are the parent's too.
"""

import math
import sys
from typing import Sequence, Union

import numpy as np

from . import _loader


def empty(shape: Union[int, Sequence[int]], dtype=np.float32) -> np.ndarray:
    """A C-contiguous, zeroed array of `shape` and `dtype` in hvdlMemAlloc's memory."""
    dt = np.dtype(dtype)
    try:
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    except TypeError:
        dims = None
    if dims is None or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"hvd_lite.empty: shape must be an int or a sequence of ints (got {shape!r})")
    if any(d < 0 for d in dims):
        raise ValueError(f"hvd_lite.empty: negative dimension in shape {dims}")
    if dt.hasobject or dt.itemsize == 0:
        raise TypeError(f"hvd_lite.empty: dtype {dt} has no fixed-size elements")
    nbytes = math.prod(int(d) for d in dims) * dt.itemsize
    if nbytes > sys.maxsize // 2:
        raise ValueError(f"hvd_lite.empty: shape {dims} of {dt} is {nbytes} bytes, too many")
    memory = _loader._core.SharedMemory(max(nbytes, 1))
    # numpy's stubs before Python 3.12 list the buffer types frombuffer takes; this one has __buffer__
    return (
        np.frombuffer(
            memory,
            np.uint8,  # type: ignore[call-overload]
            count=nbytes,
        )
        .view(dt)
        .reshape(dims)
    )
