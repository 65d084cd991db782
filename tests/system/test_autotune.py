"""Autotuning (HVD_LITE_AUTOTUNE) in whole jobs: results stay exact while the parameters change,
every rank applies the same values after the same rounds, the search settles after the documented
number of samples (its pass, and a confirmation when the pass moved), and the log file has the
documented format."""

import csv
import json
import statistics
import sys
import textwrap

import pytest
from mpi_cmd import job_env, mpirun_cmd, run_job

STEPS = 160  # enough for the longest search below (about 4 steps a sample) and 30 steps more
SETTLED_BY = STEPS - 30

# Each step: a large all-reduce submitted first (the ring, over segments), then a group of four
# small ones (fused), then the wait for the large one: one or two rounds a step. Integer values,
# so every sum is exact whatever the fusion and segmentation. Every rank prints its Engine.autotune()
# state at the end and the first step at which it saw the final choice.
JOB = f"""
    import json, numpy as np, hvd_lite as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    eng = hvd.basics._engine()
    wrong, settled_at, at_settle = 0, None, None
    for step in range({STEPS}):
        big = np.full(150_000, r + step, np.float32)
        h = hvd.allreduce_async(big, op=hvd.Sum, name="big")
        small = [np.full(3_000 + 1_000 * i, r * (i + 1) + step, np.float32) for i in range(4)]
        outs = hvd.grouped_allreduce(small, op=hvd.Sum, name="small")
        for i, o in enumerate(outs):
            wrong += int(not np.array_equal(o, np.full_like(o, sum(q * (i + 1) + step for q in range(n)))))
        out = hvd.synchronize(h)
        wrong += int(not np.array_equal(out, np.full_like(out, sum(q + step for q in range(n)))))
        st = eng.autotune()
        if st["settled"] and settled_at is None:
            settled_at, at_settle = step, st
    st = eng.autotune()
    print("RESULT " + json.dumps(dict(rank=r, wrong=wrong, settled_at=settled_at, at_settle=at_settle,
                                      end=st)), flush=True)
    hvd.shutdown()
"""

HEADER = [
    "kind",
    "sample",
    "round",
    "fusion_threshold",
    "segment_bytes",
    "batch_time_ms",
    "cycle_time_ms",
    "steps",
    "bytes",
    "seconds",
    "score",
]
PARAMS = ["fusion_threshold", "segment_bytes", "batch_time_ms", "cycle_time_ms"]
# The grids of csrc/engine/autotune.c and the defaults the search starts from.
GRIDS = {
    "fusion_threshold": [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20],
    "segment_bytes": [64 << 10, 256 << 10, 1 << 20, 4 << 20],
    "batch_time_ms": [0.0, 0.5, 1.0, 2.0, 5.0],
    "cycle_time_ms": [0.0, 1.0, 5.0],
}
CONFIRM_PAIRS = 3  # csrc/engine/engine.h, HVDL_TUNE_CONFIRM_PAIRS
DEFAULTS = {
    "fusion_threshold": 256 << 10,
    "segment_bytes": 256 << 10,
    "batch_time_ms": 1.0,
    "cycle_time_ms": 0.0,
}


def run(np_, env):
    res = run_job(
        mpirun_cmd(np_) + [sys.executable, "-c", textwrap.dedent(JOB)], timeout=300, env=job_env(env)
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    results = sorted(
        (
            json.loads(line.split("RESULT ", 1)[1])
            for line in res.stdout.splitlines()
            if line.startswith("RESULT ")
        ),
        key=lambda d: d["rank"],
    )
    assert [d["rank"] for d in results] == list(range(np_)), out
    return results, res.stderr


def values(row):
    return (
        int(row["fusion_threshold"]),
        int(row["segment_bytes"]),
        float(row["batch_time_ms"]),
        float(row["cycle_time_ms"]),
    )


@pytest.mark.parametrize(
    "np_,fixed",
    [(2, {}), (3, {}), (2, {"HVD_LITE_SEGMENT_BYTES": "65536"})],
    ids=["2-ranks", "3-ranks", "2-ranks-segment-set"],
)
def test_autotuning_agrees_across_ranks_settles_and_keeps_results_exact(tmp_path, np_, fixed):
    log = tmp_path / "autotune.csv"
    env = {
        "HVD_LITE_AUTOTUNE": "1",
        "HVD_LITE_AUTOTUNE_WARMUP_SAMPLES": "1",
        "HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE": "2",
        "HVD_LITE_AUTOTUNE_LOG": str(log),
        "HVD_LITE_LOG_LEVEL": "info",
        **fixed,
    }
    results, err = run(np_, env)
    tuned = [p for p in PARAMS if not (p == "segment_bytes" and fixed)]
    planned = 1 + sum(len(GRIDS[p]) - 1 for p in tuned)  # 15 with all four, 12 without the segment

    # (a) exact results on every rank through every change
    assert all(d["wrong"] == 0 for d in results), results

    # (b) every rank applied the same values after the same rounds
    changes = results[0]["end"]["changes"]
    for d in results[1:]:
        assert d["end"]["changes"] == changes, (d["rank"], d["end"]["changes"], changes)
    assert changes[0][1:5] == [DEFAULTS[p] if p in tuned else 65536 for p in PARAMS]

    # (c) it settles after the documented number of samples (a pass, then a confirmation when the
    # pass found other values than the start), and nothing changes afterwards
    samples_taken = results[0]["end"]["samples"]
    assert samples_taken in (planned, planned + 2 * CONFIRM_PAIRS), (samples_taken, planned)
    assert [c[5] for c in changes] == [False] * (len(changes) - 1) + [True]
    for d in results:
        assert d["settled_at"] is not None and d["settled_at"] <= SETTLED_BY, d
        assert d["at_settle"]["changes"] == d["end"]["changes"], d
        assert d["end"]["settled"] and [d["end"][p] for p in PARAMS] == changes[-1][1:5]
    if fixed:  # a knob the user set is never changed
        assert all(c[2] == 65536 for c in changes)

    # (d) the log: a header, the warm-up sample, every sample of the pass, the confirmation, then the
    # final choice
    with open(log, newline="") as f:
        rows = list(csv.DictReader(f))
        f.seek(0)
        assert next(csv.reader(f)) == HEADER
    confirming = samples_taken > planned
    kinds = ["warmup"] + ["sample"] * planned + ["confirm"] * (samples_taken - planned) + ["best"]
    assert [r["kind"] for r in rows] == kinds
    scored, best = rows[1:-1], rows[-1]
    samples, confirms = scored[:planned], scored[planned:]
    assert [int(r["sample"]) for r in scored] == list(range(1, samples_taken + 1))
    for r in rows[:-1]:
        assert int(r["steps"]) == 2 and int(r["bytes"]) > 0 and float(r["seconds"]) > 0
        assert float(r["score"]) == pytest.approx(int(r["bytes"]) / float(r["seconds"]), rel=1e-4)
    # each sample ran with the values applied before it, and the next ones were applied after the
    # round it ended (consecutive samples always differ in their values)
    assert len(changes) == samples_taken + 1  # the start, one change per further sample, the final choice
    for k, r in enumerate(scored):
        assert list(values(r)) == changes[k][1:5], (k, r, changes[k])
        assert changes[k + 1][0] == int(r["round"]) + 1, (k, r, changes[k + 1])
    # coordinate descent: each sample differs from the best before it in one tuned parameter at most
    best_so_far = samples[0]
    for r in samples[1:]:
        diff = [p for p, a, b in zip(PARAMS, values(r), values(best_so_far)) if a != b]
        assert len(diff) == 1 and diff[0] in tuned, (r, best_so_far)
        if float(r["score"]) > float(best_so_far["score"]):
            best_so_far = r
    top = max(samples, key=lambda r: float(r["score"]))
    start = values(samples[0])
    if not confirming:  # the pass kept the starting values: they are the final choice
        assert values(top) == start and values(best) == start
    else:  # the starting values and the pass's best in turn; the best kept if its median wins by 2 %
        assert values(top) != start
        assert [values(r) for r in confirms] == [start, values(top)] * CONFIRM_PAIRS
        med = [statistics.median(float(r["score"]) for r in confirms[i::2]) for i in (0, 1)]
        want = values(top) if med[1] > med[0] * 1.02 else start
        assert values(best) == want, (med, best)
    assert list(values(best)) == changes[-1][1:5]
    assert f"autotune settled after {samples_taken} samples" in err
