"""Redraws figures from --json records: busbw against size, or one contender's time over another's.

python -m hvd_lite.bench plot run.json -o run.png
python -m hvd_lite.bench plot np2.json np3.json --ratio "hvd small=64M/hvd small=0" -o x.png
"""

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The plot options."""
    p.add_argument(
        "records",
        nargs="+",
        metavar="FILE.json",
        help="--json records (allreduce, or allgather, reducescatter, broadcast, alltoall)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE.png", help="figure to write")
    p.add_argument(
        "--ratio", metavar="A/B", help="draw median time of contender A over contender B, one line per record"
    )


def main(args) -> int:
    """Reads the records and draws one figure."""
    from . import plot

    records = []
    for path in args.records:
        with open(path, encoding="utf-8") as f:
            records.append(json.load(f))
    if args.ratio:
        a, sep, b = args.ratio.partition("/")
        if not sep:
            raise SystemExit(f"--ratio {args.ratio!r}: expected A/B with two contender labels")
        plot.time_ratio(records, a, b, args.output)
    else:
        if len(records) != 1:
            raise SystemExit("without --ratio, give exactly one record")
        plot.busbw_vs_size(records[0], args.output)
    return 0
