#!/bin/bash
# The 2-rank performance targets, one after the other, on one build (docs/benchmarks-history.md, "The 2-rank performance targets measured
# together"). Run from the repository root with the venv's mpirun and python on PATH; writes here.
set -u
D=docs/data/current/bars_1128
M="mpirun -np 2"
for i in 1 2; do
  $M python -m hvd_lite.bench allreduce --api numpy --inplace -b 4 -e 256M -f 4 --repeats 5 \
    --json $D/numpy_full_r$i.json
done
for i in 1 2; do
  $M python -m hvd_lite.bench allreduce --api core --inplace -b 64K -e 16M -f 2 --repeats 7 --shared \
    --json $D/core_shared_$i.json
  $M python -m hvd_lite.bench allreduce --api core --inplace -b 64K -e 16M -f 2 --repeats 7 \
    --json $D/core_plain_$i.json
done
for i in 1 2; do
  $M python -m hvd_lite.bench fusion --steps 20 --json $D/fusion_$i.json
done
HVD_LITE_AUTOTUNE=1 HVD_LITE_AUTOTUNE_LOG=$D/autotune_log.csv $M -x HVD_LITE_AUTOTUNE -x HVD_LITE_AUTOTUNE_LOG \
  python -m hvd_lite.bench fusion --warmup 300 --steps 30 --json $D/autotune.json
$M python -m hvd_lite.bench fusion --steps 30 --sweep HVD_LITE_FUSION_THRESHOLD=64K,1M --json $D/handset.json
for i in 1 2; do
  $M python examples/pytorch_synthetic_benchmark.py --ddp --single --model cnn --num-iters 20 > $D/cnn_$i.txt 2>&1
done
$M python examples/pytorch_synthetic_benchmark.py --ddp --model mlp --num-iters 20 > $D/mlp_1.txt 2>&1
# The second sequence, right after.
for i in 1 2; do
  $M python -m hvd_lite.bench allreduce --api numpy --inplace -b 256K -e 256M -f 2 --repeats 5 \
    --json $D/numpy_every_r$i.json
done
for i in 1 2; do $M python tools/cpu_while_waiting.py 10 > $D/cpu_$i.txt 2>&1; done
for i in 2 3; do
  HVD_LITE_AUTOTUNE=1 HVD_LITE_AUTOTUNE_LOG=$D/autotune_log_$i.csv $M -x HVD_LITE_AUTOTUNE \
    -x HVD_LITE_AUTOTUNE_LOG python -m hvd_lite.bench fusion --warmup 300 --steps 30 --json $D/autotune_$i.json
  $M python -m hvd_lite.bench fusion --steps 30 --sweep HVD_LITE_FUSION_THRESHOLD=64K,1M --json $D/handset_$i.json
done
for i in 1 2 3; do
  $M python examples/pytorch_synthetic_benchmark.py --ddp --model cnn --num-iters 10 > $D/cnn_pair_ranks_$i.txt 2>&1
  python examples/pytorch_synthetic_benchmark.py --model cnn --batch-size 64 --threads 2 --num-iters 10 \
    > $D/cnn_pair_one_$i.txt 2>&1
done
