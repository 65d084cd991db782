"""CPU a rank uses while idle, and while blocked in a synchronous call on a peer that has not
submitted yet: process CPU time (every thread: caller, engine, MPI's) over wall time.

    mpirun -np 2 python tools/cpu_while_waiting.py [SECONDS]      # default 10

Both ranks sleep SECONDS (idle); then rank 1 calls hvd.allreduce while rank 0 sleeps SECONDS more
before joining it (blocked). The aim: idle ~0 %, blocked <= 1 % of a core.
"""

import sys
import time

import numpy as np

import hvd_lite as hvd


def cpu_share(fn) -> float:
    """Process CPU seconds per wall second while fn runs."""
    c0, t0 = time.process_time(), time.monotonic()
    fn()
    return (time.process_time() - c0) / (time.monotonic() - t0)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    hvd.init()
    hvd.allreduce(np.ones(10), name="warm-up")
    idle = cpu_share(lambda: time.sleep(seconds))
    if hvd.rank() == 1:
        blocked = f"{cpu_share(lambda: hvd.allreduce(np.ones(10), name='late')):.2%}"
    else:
        time.sleep(seconds)
        hvd.allreduce(np.ones(10), name="late")
        blocked = "-"
    print(f"rank {hvd.rank()}: idle {idle:.2%} of a core, blocked in synchronize {blocked}", flush=True)


if __name__ == "__main__":
    main()
