"""All-reduce a NumPy array across ranks and check the result on every rank.

mpirun -np 2 python examples/allreduce_numpy.py
"""

import numpy as np

import hvd_lite as hvd


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = np.full(1_000_000, rank + 1, dtype=np.float32)

    total = hvd.allreduce(x, op=hvd.Sum)
    mean = hvd.allreduce(x)  # Average
    expected = size * (size + 1) / 2
    assert np.all(total == expected) and np.all(mean == expected / size)

    hvd.allreduce_(x, op=hvd.Max)  # in place
    assert np.all(x == size)
    print(f"rank {rank}/{size}: sum {total[0]:g}, average {mean[0]:g}, max {x[0]:g}: ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
