"""How often the measurement of the terms across hosts (csrc/select/select_measure.c) succeeds, and what
it takes: N communicators made one after another on emulated hosts, each measuring at init; rank 0
prints each one's source, time and terms, then the count that fell back to the defaults and why.

    HVD_LITE_RANKS_PER_HOST=1 mpirun -np 2 python tools/cost_model_measure.py [N]     # default 20

To see it on a loaded machine, start busy loops beside it first, for example six of
`timeout 150 sh -c 'while :; do :; done' &`.
"""

import sys

import hvd_lite as hvd
from hvd_lite import basics
from hvd_lite.bench.fit import _across_hosts


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    hvd.init()
    failed, times = [], []
    for i in range(n):
        m = _across_hosts(basics._core)  # bench fit's: the measurement on, no model file
        if hvd.rank() != 0:
            continue
        times.append(m["measure_s"])
        if m["inter_source"] != "measured":
            failed.append(m["inter_measure_error"])
        print(
            f"{i} {m['inter_source']} {m['measure_s'] * 1e3:.2f} ms alpha {m['inter_alpha']:.3g} s "
            f"beta {m['inter_beta']:.3g} s/B",
            flush=True,
        )
    if hvd.rank() == 0:
        times.sort()
        print(
            f"measured {n - len(failed)} of {n}; time median {times[len(times) // 2] * 1e3:.2f} ms, "
            f"longest {times[-1] * 1e3:.2f} ms"
        )
        for why in failed:
            print(f"fell back to the defaults: {why}")


if __name__ == "__main__":
    main()
