#!/bin/bash
# The records of docs/benchmarks-history.md, "A stand-in for plain buffers" (2 ranks, one host).
# Run from the repository root with the build to measure in place: bash docs/data/current/stand_in/run.sh
set -e
out=docs/data/current/stand_in
bench="python -m hvd_lite.bench allreduce"
for i in 1 2 3; do
  # Small pages: numpy asks for huge pages for arrays from 4 MiB unless NUMPY_MADVISE_HUGEPAGE=0.
  # One communicator without the stand-in (0), one with it up to 32 MiB, to find where it stops paying.
  NUMPY_MADVISE_HUGEPAGE=0 mpirun -x NUMPY_MADVISE_HUGEPAGE -np 2 $bench --api core --inplace \
      -b 64K -e 32M -f 2 --repeats 7 --sweep HVD_LITE_SHM_STAND_IN_BYTES=0,33554432 \
      --json $out/small_pages_r$i.json
  # Huge pages (numpy's own choice for a 16 MiB array): the default stand-in is not taken.
  mpirun -np 2 $bench --api core --inplace -b 64K -e 16M -f 2 --repeats 7 \
      --sweep HVD_LITE_SHM_STAND_IN_BYTES=0,4194304 --json $out/huge_pages_r$i.json
done
# The numpy-API target, as written (a 256 MiB array: huge pages), with the default.
for i in 1 2; do
  mpirun -np 2 $bench --api numpy --inplace -b 4 -e 256M -f 4 --repeats 5 --json $out/numpy_full_r$i.json
done
# A ResNet-50 step (small gradients fused through the fusion buffer; the others views of one flat array
# on huge pages: no stand-in).
mpirun -np 2 python -m hvd_lite.bench fusion --steps 20 --json $out/fusion_r1.json
