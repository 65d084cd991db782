"""Reduction kernel GB/s per dtype and op, against a plain memcpy of the same size.

One process (no mpirun). For each size, dtype and op, the C core times
`dst = a op b` over nbytes per operand and a memcpy of nbytes, back to back,
--repeats times; medians are reported. Bytes moved are counted: the kernel
reads 2*nbytes and writes nbytes (3*nbytes), memcpy reads and writes nbytes
(2*nbytes). ratio = kernel GB/s / memcpy GB/s: near 1 means the kernel runs at
copy speed. Avg runs the Sum kernel (its division happens once, at the end).
"""

import argparse
import math
import sys

from . import common, progress

KERNEL_OPS = ("sum", "prod", "max", "min")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The kernels options."""
    p.add_argument("-d", "--dtype", action="append", help="element type (repeatable; default: all ten)")
    p.add_argument(
        "-o",
        "--op",
        action="append",
        choices=KERNEL_OPS,
        help="reduction (repeatable; default: sum, prod, max, min)",
    )
    p.add_argument(
        "-s",
        "--size",
        action="append",
        type=common.parse_size,
        help="bytes per operand (repeatable; default: 256K, in cache, and 64M, out of cache)",
    )
    p.add_argument(
        "-n",
        "--iters",
        type=int,
        default=0,
        help="calls per measurement; 0 (default) picks about --batch-time",
    )
    p.add_argument("--repeats", type=int, default=5, help="measurements; medians (default 5)")
    p.add_argument(
        "--batch-time",
        type=float,
        default=0.02,
        help="target seconds per measurement when -n is 0 (default 0.02)",
    )
    p.add_argument("--json", metavar="FILE", help="write every repeat's times to FILE")
    progress.add_argument(p)


def _iters(core, dt, op, nbytes, args) -> int:
    if args.iters > 0:
        return args.iters
    k, m = core.kernel_bench(dt, op, nbytes, 1)
    return max(1, min(100000, math.ceil(args.batch_time / max(k, m, 1e-9))))


def main(args) -> int:
    """Prints one row per dtype and op with kernel and memcpy GB/s for each size."""
    from hvd_lite import basics
    from hvd_lite import ops as hops

    core = basics._core
    dtypes = [common.dtype_from_name(d) for d in (args.dtype or list(common.DTYPES))]
    ops = args.op or list(KERNEL_OPS)
    sizes = args.size or [common.parse_size("256K"), common.parse_size("64M")]
    op_codes = {"sum": core.hvdlSum, "prod": core.hvdlProd, "max": core.hvdlMax, "min": core.hvdlMin}

    cols = [("dtype", 8, "{}"), ("op", 4, "{}")]
    groups = [("", 2)]
    for s in sizes:
        cols += [("kernel", 7, "{:.2f}"), ("memcpy", 7, "{:.2f}"), ("ratio", 5, "{:.2f}")]
        groups.append((f"{common.format_size(s)}B", 3))
    table = common.Table(cols)
    print(
        f"# hvd_lite.bench kernels: dst = a op b vs memcpy; GB/s (1e9 B/s) counting 3 x size "
        f"for the kernel and 2 x size for memcpy; median of {args.repeats}"
    )
    table.header(groups)

    rows = []
    bar = progress.Progress("bench kernels", len(dtypes) * len(ops) * len(sizes), not args.quiet)
    for dtype in dtypes:
        code = hops.HVDL_DTYPES[dtype]
        for op in ops:
            row = [common.dtype_name(dtype), op]
            entry = {"dtype": common.dtype_name(dtype), "op": op, "sizes": []}
            for nbytes in sizes:
                bar.point(f"{common.dtype_name(dtype)} {op} {common.format_size(nbytes)}")
                iters = _iters(core, code, op_codes[op], nbytes, args)
                runs = [core.kernel_bench(code, op_codes[op], nbytes, iters) for _ in range(args.repeats)]
                tk = common.median([k for k, _ in runs])
                tm = common.median([m for _, m in runs])
                kbw, mbw = common.gbps(3 * nbytes, tk), common.gbps(2 * nbytes, tm)
                row += [kbw, mbw, kbw / mbw]
                entry["sizes"].append(
                    {
                        "bytes": nbytes,
                        "iters": iters,
                        "kernel_s": [k for k, _ in runs],
                        "memcpy_s": [m for _, m in runs],
                        "kernel_GBps": kbw,
                        "memcpy_GBps": mbw,
                    }
                )
            table.row(row)
            rows.append(entry)
    bar.finish()
    if args.json:
        common.write_json(
            args.json,
            {
                "benchmark": "kernels",
                "argv": sys.argv,
                "repeats": args.repeats,
                "machine": common.machine_summary(),
                "results": rows,
            },
        )
    return 0
