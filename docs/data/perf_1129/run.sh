#!/bin/bash
# The performance page's figures (docs/benchmarks.md), one build, one sequence.
# Run from the repository root with the venv's mpirun and python first on PATH:
#   bash docs/data/perf_1129/run.sh [rounds] [out-dir] [deadline, e.g. 07:48]
# Each round runs every benchmark once, the order rotating by one each round, so that each
# benchmark meets the machine at several times; inside a run hvd_lite and MPI alternate batch by
# batch. A round is not started if the previous one would not end before the deadline (UTC).
set -u
R=${1:-5}
D=${2:-docs/data/perf_1129}
END=$(date -u -d "${3:-23:59}" +%s)
M="mpirun -np 2 -x PYTHONPATH"
mkdir -p "$D"
run() {
  local name=$1 i=$2 t0 rc
  t0=$(date +%s)
  echo "$(date -u +%H:%M:%S) start $name $i" >&2
  case $name in
    allreduce)     $M python -m hvd_lite.bench allreduce     -b 4  -e 256M -f 4 --repeats 60 --json $D/allreduce_$i.json ;;
    reducescatter) $M python -m hvd_lite.bench reducescatter -b 1K -e 64M  -f 4 --repeats 60 --json $D/reducescatter_$i.json ;;
    allgather)     $M python -m hvd_lite.bench allgather     -b 1K -e 64M  -f 4 --repeats 60 --json $D/allgather_$i.json ;;
    broadcast)     $M python -m hvd_lite.bench broadcast     -b 1K -e 64M  -f 4 --repeats 60 --json $D/broadcast_$i.json ;;
    alltoall)      $M python -m hvd_lite.bench alltoall      -b 1K -e 64M  -f 4 --repeats 60 --json $D/alltoall_$i.json ;;
    fusion)        $M python -m hvd_lite.bench fusion --steps 60 --core --json $D/fusion_$i.json ;;
    latency)       $M python -m hvd_lite.bench latency --repeats 10 --json $D/latency_$i.json ;;
    training)      $M python examples/pytorch_synthetic_benchmark.py --ddp --single --model cnn --num-iters 30 ;;
  esac > $D/${name}_$i.txt 2>&1
  rc=$?
  echo "$(date -u +%H:%M:%S) done  $name $i rc=$rc $(( $(date +%s) - t0 )) s" >&2
}
ALL="allreduce reducescatter allgather broadcast alltoall fusion latency training"
last=0
for i in $(seq 1 $R); do
  t0=$(date +%s)
  if [ $(( t0 + last )) -gt $END ]; then echo "$(date -u +%H:%M:%S) round $i would pass the deadline: stop" >&2; break; fi
  set -- $ALL
  for _ in $(seq 2 $i); do set -- "${@:2}" "$1"; done    # rotate the order by i-1 places
  for name in "$@"; do run $name $i; done
  last=$(( $(date +%s) - t0 ))
  echo "$(date -u +%H:%M:%S) round $i took $last s" >&2
done
echo "$(date -u +%H:%M:%S) all done" >&2
