"""Per-step figures from the engine's event trace (docs/profiling/README.md).

    python docs/profiling/trace_report.py TRACE.0 [--tensors 161]

A step is a run of --tensors submissions (the fusion benchmark's hvd_lite steps, warm-up
included; the first two are skipped); it ends when the waiting thread last wakes. Medians
over the steps, ms unless counted.
"""

import argparse
import statistics

SUBMIT, ROUND, ROUND_END, WOKE, WAKE, CALL, RETURN = 1, 2, 3, 13, 14, 20, 21


def steps(events, tensors):
    submits = [i for i, (_, e, _) in enumerate(events) if e == SUBMIT]
    starts = submits[::tensors][: len(submits) // tensors]
    for k in range(2, len(starts)):
        end = starts[k + 1] if k + 1 < len(starts) else len(events)
        yield events[starts[k] : end]


def measure(step):
    t0 = step[0][0]
    woke = [t for t, e, _ in step if e == WOKE]
    end = woke[-1]
    calls, start = [], None
    for t, e, _ in step:
        if e == CALL:
            start = t
        elif e == RETURN and start is not None and t <= end:
            calls.append((start, t))
            start = None
    return {
        "step": end - t0,
        "submitting": [t for t, e, _ in step if e == SUBMIT][-1] - t0,
        "before the first call": calls[0][0] - t0,
        "in all-reduce calls": sum(b - a for a, b in calls),
        "between calls": sum(calls[i + 1][0] - calls[i][1] for i in range(len(calls) - 1)),
        "calls": len(calls),
        "waiting thread woken": len(woke),
        "engine broadcasts to waiters": sum(1 for t, e, _ in step if e == WAKE and t <= end),
        "rounds that found work": sum(1 for t, e, a in step if e == ROUND_END and a > 0 and t <= end),
    }


def per_size(events):
    """Median call time by size: inside hvd_lite steps (the engine) and outside them (the
    fusion benchmark's --core contender calls the C API from the Python thread)."""
    inside, outside = {}, {}
    last_submit, start = -1.0, None
    for t, e, a in events:
        if e == SUBMIT:
            last_submit = t
        elif e == CALL:
            start = t
        elif e == RETURN and start is not None:
            side = inside if start - last_submit < 0.03 else outside
            side.setdefault(a, []).append(t - start)
            start = None
    print("size (B)   engine (us)   C API (us)   ratio")
    for size in sorted(set(inside) & set(outside)):
        a, b = statistics.median(inside[size]), statistics.median(outside[size])
        print(f"{size:9d} {a * 1e6:12.1f} {b * 1e6:12.1f} {a / b:7.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--tensors", type=int, default=161)
    p.add_argument(
        "--per-size", action="store_true", help="also compare call times by size with the --core contender's"
    )
    args = p.parse_args()
    with open(args.trace) as f:
        events = [(float(t), int(e), int(a)) for t, e, a in (line.split() for line in f)]
    rows = [measure(s) for s in steps(events, args.tensors)]
    print(f"{len(rows)} steps, medians")
    for key in rows[0]:
        v = statistics.median(r[key] for r in rows)
        counted = key in ("calls",) or key.startswith(("waiting", "engine", "rounds"))
        print(f"  {key:32s} {v:8.1f}" if counted else f"  {key:32s} {v * 1e3:8.3f} ms")
    if args.per_size:
        per_size(events)


if __name__ == "__main__":
    main()
