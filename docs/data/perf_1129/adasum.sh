#!/bin/bash
# Adasum against hvd_lite's own Average all-reduce (docs/benchmarks.md, "Adasum against the Average"),
# right after run.sh, the same build: the default selection and the Average on Adasum's schedule (rab),
# alternating. Run from the repository root with the venv's mpirun and python first on PATH.
set -u
R=${1:-3}
D=${2:-docs/data/perf_1129}
M="mpirun -np 2 -x PYTHONPATH"
for i in $(seq 1 $R); do
  echo "$(date -u +%H:%M:%S) start adasum $i" >&2
  $M python -m hvd_lite.bench allreduce -o adasum -b 64K -e 64M -f 4 --repeats 20 \
    --json $D/adasum_default_$i.json > $D/adasum_default_$i.txt 2>&1
  HVD_LITE_ALLREDUCE_ALGO=rab $M -x HVD_LITE_ALLREDUCE_ALGO python -m hvd_lite.bench allreduce -o adasum \
    -b 64K -e 64M -f 4 --repeats 20 --json $D/adasum_rab_$i.json > $D/adasum_rab_$i.txt 2>&1
  echo "$(date -u +%H:%M:%S) done  adasum $i" >&2
done
