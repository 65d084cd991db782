"""One in-place all-reduce through the C API, in a loop and nothing else: a job for a profiler
(docs/benchmarks.md, "The single-copy form", "On an AMD machine").

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
    args = p.parse_args(argv)
    if args.bytes <= 0 or args.bytes % 4 or args.calls <= 0 or args.warmup < 0:
        p.error(f"--bytes must be a positive multiple of 4 and --calls positive (got --bytes {args.bytes}, "
                f"--calls {args.calls}, --warmup {args.warmup})")
    hvd.init()
    comm = basics._core.Comm()
    buf = np.ones(args.bytes // 4, np.float32).view(np.uint8)
    code, op = hops.HVDL_DTYPES[np.dtype(np.float32)], hops.HVDL_OPS[hvd.Sum]
    for _ in range(args.warmup):
        comm.allreduce(buf, buf, code, op)
    start = time.perf_counter()
    for _ in range(args.calls):
        comm.allreduce(buf, buf, code, op)
    per_call = (time.perf_counter() - start) / args.calls
    if hvd.rank() == 0:
        print(f"{args.bytes} bytes: {per_call * 1e6:.1f} us a call ({args.calls} calls, rank 0)")
    hvd.shutdown()


if __name__ == "__main__":
    main()
