"""One in-place all-reduce (or all-gather) through the C API, in a loop and nothing else: a job for a
profiler (docs/benchmarks-history.md, "The single-copy form", "On an AMD machine"), or for where in their
pages the ranks' buffers lie (`--offset`; "Buffers at their own place in a page").

    mpirun -np 2 sh -c 'exec perf record -g -o perf.$OMPI_COMM_WORLD_RANK.data \
        python tools/allreduce_loop.py --bytes 1048576 --calls 20000'
    perf report -i perf.0.data --no-children --sort dso,sym -g none

The communicator is the library's own (`_core.Comm`, what `bench allreduce --api core` times), the buffer
float32 and summed in place. Rank 0 prints the mean time per call; run it without the profiler for the
profiler's own cost.
"""

import argparse
import time

import numpy as np

import hvd_lite as hvd
from hvd_lite import basics
from hvd_lite import ops as hops


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=1 << 20, help="per rank (a multiple of 4)")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument(
        "--allgather",
        action="store_true",
        help="time the all-gather instead: each rank's block is --bytes, its result n times that",
    )
    p.add_argument(
        "--offset",
        default=None,
        help="place the buffer this many bytes past a 4 KiB boundary (a multiple of 4 below 4096; "
        "a comma-separated list gives rank r the entry r modulo its length; default: where "
        "numpy puts it, and --allgather's result at a page)",
    )
    p.add_argument(
        "--shared",
        action="store_true",
        help="take the buffers from hvdlMemAlloc (hvd_lite.empty), which the peers reach "
        'directly (docs/benchmarks-history.md, "Memory the peers reach")',
    )
    args = p.parse_args(argv)
    if args.bytes <= 0 or args.bytes % 4 or args.calls <= 0 or args.warmup < 0:
        p.error(
            f"--bytes must be a positive multiple of 4 and --calls positive (got --bytes {args.bytes}, "
            f"--calls {args.calls}, --warmup {args.warmup})"
        )
    offsets = None
    if args.offset is not None:
        try:
            offsets = [int(o) for o in args.offset.split(",")]
        except ValueError:
            offsets = []
        if not offsets or not all(0 <= o < 4096 and o % 4 == 0 for o in offsets):
            p.error(f"--offset takes multiples of 4 in [0, 4096), comma-separated (got {args.offset!r})")
    hvd.init()
    offset = None if offsets is None else offsets[hvd.rank() % len(offsets)]
    comm = basics._core.Comm()
    if offset is None:
        buf = np.ones(args.bytes // 4, np.float32).view(np.uint8)
        if args.shared:
            buf = np.frombuffer(basics._core.SharedMemory(args.bytes), np.uint8)
            buf.view(np.float32)[:] = 1
    else:
        raw = (
            np.frombuffer(basics._core.SharedMemory(args.bytes + 8192), np.uint8)
            if args.shared
            else np.empty(args.bytes + 8192, np.uint8)
        )
        start = (-raw.ctypes.data) % 4096 + offset
        buf = raw[start : start + args.bytes]
        buf.view(np.float32)[:] = 1
    code, op = hops.HVDL_DTYPES[np.dtype(np.float32)], hops.HVDL_OPS[hvd.Sum]
    if args.allgather:
        out = (
            np.frombuffer(basics._core.SharedMemory(hvd.size() * args.bytes + 8192), np.uint8)
            if args.shared
            else np.empty(hvd.size() * args.bytes + 8192, np.uint8)
        )
        start = (-out.ctypes.data) % 4096 + (0 if offset is None else offset)
        out = out[start : start + hvd.size() * args.bytes]
        call = lambda: comm.allgather(buf, out, code)  # noqa: E731
    else:
        call = lambda: comm.allreduce(buf, buf, code, op)  # noqa: E731
    for _ in range(args.warmup):
        call()
    start = time.perf_counter()
    for _ in range(args.calls):
        call()
    per_call = (time.perf_counter() - start) / args.calls
    if hvd.rank() == 0:
        where = "" if offsets is None else f" at {args.offset} past a page"
        what = "all-gather of " if args.allgather else ""
        print(f"{what}{args.bytes} bytes{where}: {per_call * 1e6:.1f} us a call ({args.calls} calls, rank 0)")
    hvd.shutdown()


if __name__ == "__main__":
    main()
