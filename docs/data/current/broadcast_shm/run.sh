#!/bin/bash
# The single-copy broadcast against the chain, forced in turn (docs/benchmarks-history.md, "The single-copy
# broadcast"). Run from the repository root with the venv's mpirun and python on PATH; writes here.
D=docs/data/current/broadcast_shm
for i in 1 2; do for a in shm chain; do
  HVD_LITE_BROADCAST_ALGO=$a mpirun -np 2 -x HVD_LITE_BROADCAST_ALGO python -m hvd_lite.bench \
    broadcast -b 1K -e 64M -f 4 --repeats 10 --json $D/${a}_$i.json
done; done
for i in 3 4; do for a in chain shm; do
  HVD_LITE_BROADCAST_ALGO=$a mpirun -np 2 -x HVD_LITE_BROADCAST_ALGO python -m hvd_lite.bench \
    broadcast -b 2K -e 64M -f 2 --repeats 10 --json $D/${a}_$i.json
done; done
# 3 and 4 ranks, oversubscribed on the two cores, one run of each, shm, tree, chain in turn (after commit 9ebbf97)
for np in 3 4; do for a in shm tree chain; do
  HVD_LITE_BROADCAST_ALGO=$a mpirun --oversubscribe -np $np -x HVD_LITE_BROADCAST_ALGO python -m hvd_lite.bench \
    broadcast -b 1K -e 1M -f 4 --repeats 7 --json $D/bc_${np}_$a.json
done; done
