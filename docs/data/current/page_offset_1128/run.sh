#!/bin/bash
# usage: run.sh OUTDIR BASE_TREE NEW_TREE
out=$1; base=$2; new=$3
loop=$new/tools/allreduce_loop.py
for round in 1 2; do
  for build in base new; do
    tree=$base; [ $build = new ] && tree=$new
    f=$out/${build}_$round.txt
    : > $f
    for o in 0,0 16,16 64,64 0,16 16,0; do
      for b in 65536 262144 1048576 4194304; do
        calls=$(( 400000000 / b )); [ $calls -lt 300 ] && calls=300; [ $calls -gt 20000 ] && calls=20000
        PYTHONPATH=$tree mpirun -np 2 -x PYTHONPATH python $loop --bytes $b --calls $calls --offset $o >> $f 2>&1
      done
    done
    for o in 0,0 0,16; do
      for b in 65536 524288; do
        PYTHONPATH=$tree mpirun -np 2 -x PYTHONPATH python $loop --allgather --bytes $b --calls 3000 --offset $o >> $f 2>&1
      done
    done
  done
done
