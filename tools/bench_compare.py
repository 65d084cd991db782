"""Before/after from `python -m hvd_lite.bench ... --json` records: ratio of medians over runs.

Each record already holds hvd_lite against its MPI baseline from the same run. For every point
(size, or contender) this takes hvd_lite's time as a fraction of the baseline's in each run, the
median of those over the runs of one build, and prints after / before. 1.00 = unchanged; a
restructuring that moves no work should stay within +-5 %.

    python tools/bench_compare.py --before old/fusion_*.json --after new/fusion_*.json
    python tools/bench_compare.py --table new/fusion_*.json     # one build's figures, as markdown
"""

import argparse
import json
import statistics
import sys


def points(rec):
    """{point: (hvd time, baseline time)} of one record (seconds, or us for latency)."""
    kind, out = rec["benchmark"], {}
    if kind == "fusion":
        res = {r["label"]: r for r in rec["results"]}
        best = min(r["median_s"] for r in res.values() if r["kind"] == "mpi")
        for label, r in res.items():
            if r["kind"] != "mpi":
                out[f"{label} / best MPI"] = (r["median_s"], best)
    elif kind == "latency":
        for row in rec["results"]:
            libs = row["libs"]
            for label, r in libs.items():
                if label != "MPI_Allreduce":
                    out[f"{row['bytes']} B {label} / MPI"] = (
                        r["median_us"] * 1e-6,
                        libs["MPI_Allreduce"]["median_us"] * 1e-6,
                    )
    else:  # allreduce and the other collectives: hvd_lite (or a sweep's contenders) against MPI
        for row in rec["results"]:
            libs = row["libs"]
            # the baseline: kind "mpi" (allreduce) or the label "MPI" (the other collectives)
            base = [label for label, r in libs.items() if r.get("kind") == "mpi" or label == "MPI"]
            mpi = [libs[label] for label in base]
            for label, r in libs.items():
                if label not in base and mpi:
                    out[f"{row['bytes']} B {label} / MPI"] = (r["median_s"], mpi[0]["median_s"])
    return out


def medians(paths, absolute=False):
    """{point: median over the runs of hvd time / baseline time (or of hvd time alone, in us)},
    and the number of runs."""
    runs = [points(json.load(open(p))) for p in paths]
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    value = (lambda t: t[0] * 1e6) if absolute else (lambda t: t[0] / t[1])
    return {k: statistics.median(value(r[k]) for r in runs) for k in keys}, len(runs)


def table(paths):
    """A markdown table of runs of one build: per point, the median times and ratio over runs."""
    runs = [points(json.load(open(p))) for p in paths]
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    print(f"| point ({len(runs)} runs) | hvd_lite | baseline | hvd_lite / baseline (range) |")
    print("|---|---:|---:|---|")
    for k in keys:
        hvd = statistics.median(r[k][0] for r in runs)
        base = statistics.median(r[k][1] for r in runs)
        ratios = [r[k][0] / r[k][1] for r in runs]
        print(
            f"| {k} | {fmt(hvd)} | {fmt(base)} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) |"
        )


def fmt(seconds):
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+")
    ap.add_argument("--after", nargs="+")
    ap.add_argument(
        "--table",
        nargs="+",
        metavar="RECORD",
        help="instead: a markdown table of these runs (one build), medians over runs",
    )
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument(
        "--absolute",
        action="store_true",
        help="compare hvd_lite's own times (us), not its ratio to the baseline: for "
        "interleaved before/after runs whose baseline is noisier than hvd_lite",
    )
    a = ap.parse_args(argv)
    if a.table:
        table(a.table)
        return 0
    if not (a.before and a.after):
        ap.error("--before and --after (or --table) are required")
    before, nb = medians(a.before, a.absolute)
    after, na = medians(a.after, a.absolute)
    what = "hvd_lite's time, us" if a.absolute else "time relative to the baseline of the same run"
    print(
        f"{'point':40} {'before':>8} {'after':>8} {'after/before':>13}   ({nb} and {na} runs; "
        f"{what}, median over runs)"
    )
    worst = 1.0
    for k in before:
        if k in after:
            q = after[k] / before[k]
            worst = max(worst, q)
            flag = "" if q <= 1 + a.tolerance else "   slower"
            label = k.split(" / ")[0] if a.absolute else k
            print(f"{label:40} {before[k]:8.3f} {after[k]:8.3f} {q:13.3f}{flag}")
    print(f"worst after/before: {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
