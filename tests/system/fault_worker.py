"""One job of the fault-injection suite (tests/system/test_faults.py): for each case
`family:point:victim` given on the command line, rank `victim` arms `point`
(hvd_lite.basics.inject_fault; `point#k`: to fail the k-th time it is reached), every rank
runs one collective of `family`, and then one
all-reduce that must be right. Every rank prints one JSON line per case:
{"case", "rank", "ok", "error", "seconds", "right", "next_right"}."""

import json
import sys
import time

import numpy as np

import hvd_lite as hvd

RING = 1 << 20  # elements: above the latency path, several segments


def families(r, n):
    """family -> (run it, check its output)."""
    tri = n * (n + 1) / 2
    big = np.full(RING, r + 1, np.float32)

    def fused():
        hs = [
            hvd.allreduce_async(np.full(8, r + 1, np.float32), op=hvd.Sum, name=f"fused.{i}")
            for i in range(4)
        ]
        return [hvd.synchronize(h) for h in hs]

    return {
        "allreduce_small": (
            lambda: hvd.allreduce(np.full(8, r + 1, np.float32), op=hvd.Sum),
            lambda o: bool(np.all(o == tri)),
        ),
        "allreduce_ring": (lambda: hvd.allreduce(big, op=hvd.Sum), lambda o: bool(np.all(o == tri))),
        "allreduce_fused": (fused, lambda o: all(bool(np.all(x == tri)) for x in o)),
        # identical vectors: Adasum gives them back
        "allreduce_adasum": (
            lambda: hvd.allreduce(np.full(RING, 3.0, np.float32), op=hvd.Adasum),
            lambda o: bool(np.all(o == 3.0)),
        ),
        "allgather": (
            lambda: hvd.allgather(np.full((r + 1, 1000), r, np.float32)),
            lambda o: (
                o.shape[0] == tri
                and all(bool(np.all(o[q * (q + 1) // 2 : (q + 1) * (q + 2) // 2] == q)) for q in range(n))
            ),
        ),
        "broadcast": (
            lambda: hvd.broadcast(np.full(RING, r + 7, np.float32), 0),
            lambda o: bool(np.all(o == 7)),
        ),
        "alltoall": (
            lambda: hvd.alltoall(np.full((n, 1000), r, np.float32)),
            lambda o: all(bool(np.all(o[q] == q)) for q in range(n)),
        ),
        "reducescatter": (
            lambda: hvd.reducescatter(np.ones((n * 1000, 300), np.float32), op=hvd.Sum),
            lambda o: o.shape[0] == 1000 and bool(np.all(o == n)),
        ),
    }


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    table = families(r, n)
    for case in sys.argv[1:]:
        family, point, victim = case.split(":")
        point, _, nth = point.partition("#")
        run, right = table[family]
        if r == int(victim):
            hvd.basics.inject_fault(point, int(nth or 1))
        t0 = time.monotonic()
        out, error = None, ""
        try:
            out = run()
        except hvd.HvdLiteError as e:
            error = f"{type(e).__name__}: {e}"
        seconds = time.monotonic() - t0
        if r == int(victim):
            hvd.basics.inject_fault(point, 0)  # disarm, had it not fired
        try:
            nxt = hvd.allreduce(np.full(4, r + 1, np.float32), op=hvd.Sum, name=f"next.{case}")
            next_right = bool(np.all(nxt == n * (n + 1) / 2))
        except hvd.HvdLiteError as e:
            next_right = f"{type(e).__name__}: {e}"
        print(
            json.dumps(
                {
                    "case": case,
                    "rank": r,
                    "ok": not error,
                    "error": error,
                    "seconds": round(seconds, 3),
                    "right": right(out) if not error else None,
                    "next_right": next_right,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
