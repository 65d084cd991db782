#!/bin/bash
# The single-copy reduce-scatter against the ring, forced in turn (docs/benchmarks-history.md, "The single-copy
# reduce-scatter"). Run from the repository root with the venv's mpirun and python on PATH; writes here.
D=docs/data/current/reducescatter_shm
for i in 1 2; do for a in shm ring; do
  HVD_LITE_REDUCESCATTER_ALGO=$a mpirun -np 2 -x HVD_LITE_REDUCESCATTER_ALGO python -m hvd_lite.bench \
    reducescatter -b 1K -e 64M -f 4 --repeats 10 --json $D/${a}_$i.json
done; done
for i in 3 4; do for a in ring shm; do
  HVD_LITE_REDUCESCATTER_ALGO=$a mpirun -np 2 -x HVD_LITE_REDUCESCATTER_ALGO python -m hvd_lite.bench \
    reducescatter -b 2K -e 64M -f 2 --repeats 10 --json $D/${a}_$i.json
done; done
# 3 and 4 ranks, oversubscribed on the two cores, one run of each, shm, ring, halving in turn (after commit
# 9ebbf97; each rank count's broadcast runs, docs/data/current/broadcast_shm/, came just before)
for np in 3 4; do for a in shm ring halving; do
  HVD_LITE_REDUCESCATTER_ALGO=$a mpirun --oversubscribe -np $np -x HVD_LITE_REDUCESCATTER_ALGO python -m \
    hvd_lite.bench reducescatter -b 1K -e 16M -f 4 --repeats 7 --json $D/rs_${np}_$a.json
done; done
