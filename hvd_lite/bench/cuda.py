"""All-reduce on CUDA memory (`bench allreduce --device cuda`): hvd_lite's C API on CuPy arrays
against the naive user's way and the machine's copy bounds, in one run.

Run under mpirun on a GPU machine; rank 0 prints. For each size (bytes per rank):

  hvd      hvdlAllReduce on device buffers (the staged path: pinned chunks, host algorithm),
           then a synchronize of the stream
  engine   hvd.allreduce_ on a CuPy array (the engine: negotiation, then the same staged path
           on the array's stream), then a synchronize of the stream
  naive    what a user does without hvd_lite: copy to the host (cupy.asnumpy, pageable),
           MPI_Allreduce (mpi4py), copy back (cupy's set)
  d2h+h2d  the pinned copy bound of staging: one copy down and one up of the buffer through
           pinned host memory, no reduction (the least the staged path can take)
  d2d      one device-to-device copy of the buffer (the bound an IPC path would have)

Each is timed in batches of back-to-back calls after a barrier (the slowest rank's time),
the contenders alternating batch by batch; medians over --repeats. naive/hvd > 1 means hvd_lite
is faster; hvd/copy is its time over the pinned copy bound. #wrong counts result elements of
hvd_lite (the C API's and the engine's) whose bits differ from the exact answer (small integers:
every order gives it).
"""

import time
from typing import Any, Callable, Dict, List

import numpy as np

from . import common, exact, progress


def main(args) -> int:
    from hvd_lite import _core

    if not _core.build_info()["cuda"] or _core.cuda_device_count() == 0:
        raise SystemExit(
            "--device cuda needs a CUDA build (HVD_LITE_CUDA=1) and a device "
            f"(build_info()['cuda'] = {_core.build_info()['cuda']}, "
            f"devices seen: {_core.cuda_device_count()})"
        )
    try:
        import cupy
    except ImportError as exc:
        raise SystemExit(f"--device cuda times CuPy arrays: {exc}") from exc
    from mpi4py import MPI

    import hvd_lite as hvd
    from hvd_lite.ops import HVDL_DTYPES

    hvd.init()
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    if args.op == "avg":
        raise SystemExit("--device cuda times sum, prod, max or min (MPI has no avg)")
    dtype = common.dtype_from_name(args.dtype)
    if dtype.itemsize == 2 and dtype != np.float16:
        raise SystemExit("--device cuda: CuPy has no bfloat16; use another --dtype")
    code, op = HVDL_DTYPES[dtype], common.OPS.index(args.op)
    hvd_op = {"sum": hvd.Sum, "prod": hvd.Product, "max": hvd.Max, "min": hvd.Min}[args.op]
    mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[args.op]
    sizes = [
        s for s in common.size_range(args.minbytes, args.maxbytes, args.stepfactor) if s >= dtype.itemsize
    ]
    comm = _core.Comm()
    stream = cupy.cuda.get_current_stream()
    if rank == 0:
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        print(f"# {n} ranks, {dtype.name} {args.op}, device {device}")
        print(
            f"{'size':>6} {'count':>10} {'hvd us':>10} {'engine us':>10} {'naive us':>10} "
            f"{'d2h+h2d us':>11} {'d2d us':>9} {'naive/hvd':>9} {'naive/eng':>9} "
            f"{'hvd/copy':>8} {'busbw GB/s':>10} {'#wrong':>6}",
            flush=True,
        )
    bar = progress.Progress("bench allreduce --device cuda", len(sizes), rank == 0 and not args.quiet)
    for nbytes in sizes:
        bar.point(common.format_size(nbytes))
        count = nbytes // dtype.itemsize
        host = np.empty(count, dtype)
        exact.fill(host, exact.rank_pattern(dtype, args.op, rank))
        want = np.empty(count, dtype)
        exact.fill(want, exact.expected_pattern(dtype, args.op, n))
        send = cupy.asarray(host)
        recv = cupy.zeros_like(send)
        scratch = send.copy()  # the engine's in-place call (its values change: timing only)
        pinned = cupy.cuda.alloc_pinned_memory(count * dtype.itemsize)
        staged: Any = np.frombuffer(pinned, dtype, count)  # None once the size is done
        out = np.empty_like(host)

        def run_hvd():
            comm.allreduce(send, recv, code, op)
            stream.synchronize()

        def run_engine():
            hvd.allreduce_(scratch, op=hvd_op, name="bench.cuda")
            stream.synchronize()

        def run_naive():
            h = cupy.asnumpy(send)
            world.Allreduce(h, out, op=mpi_op)
            recv.set(out)
            stream.synchronize()

        def run_copy():
            send.get(out=staged, stream=stream)
            recv.set(staged, stream=stream)
            stream.synchronize()

        def run_d2d():
            cupy.copyto(recv, send)
            stream.synchronize()

        calls: Dict[str, Callable[[], None]] = {
            "hvd": run_hvd,
            "engine": run_engine,
            "naive": run_naive,
            "copy": run_copy,
            "d2d": run_d2d,
        }
        for f in calls.values():
            for _ in range(args.warmup):
                f()
        iters = args.iters or max(
            1, min(args.max_iters, int(args.batch_time / max(_once(run_naive, world), 1e-6)))
        )
        times: Dict[str, List[float]] = {k: [] for k in calls}
        wrong = 0
        for _ in range(args.repeats):
            for k, f in calls.items():
                times[k].append(_batch(f, iters, world))
            recv.fill(0)
            run_hvd()
            for got in (recv, hvd.allreduce(send, op=hvd_op, name="bench.cuda.check")):
                wrong += int(
                    np.count_nonzero(
                        cupy.asnumpy(got).view(np.uint8).reshape(count, -1)
                        != want.view(np.uint8).reshape(count, -1)
                    )
                )
        wrong = world.allreduce(wrong)
        med = {k: common.median(v) for k, v in times.items()}
        if rank == 0:
            busbw = common.gbps(nbytes, med["hvd"]) * 2 * (n - 1) / n if n > 1 else 0.0
            print(
                f"{common.format_size(nbytes):>6} {count:>10} {med['hvd'] * 1e6:>10.1f} "
                f"{med['engine'] * 1e6:>10.1f} {med['naive'] * 1e6:>10.1f} "
                f"{med['copy'] * 1e6:>11.1f} {med['d2d'] * 1e6:>9.1f} "
                f"{med['naive'] / med['hvd']:>9.2f} {med['naive'] / med['engine']:>9.2f} "
                f"{med['hvd'] / med['copy']:>8.2f} {busbw:>10.2f} {wrong:>6}",
                flush=True,
            )
        send = recv = scratch = pinned = staged = None  # let go of this size's memory before the next
    bar.finish()
    comm.destroy()
    hvd.shutdown()
    return 0


def _once(call: Callable[[], None], world) -> float:
    """One call's seconds, the slowest rank's."""
    return _batch(call, 1, world)


def _batch(call: Callable[[], None], iters: int, world) -> float:
    """Seconds per call of `iters` back-to-back calls after a barrier, the slowest rank's."""
    from mpi4py import MPI

    world.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        call()
    return world.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)
