#!/bin/bash
# usage: more.sh OUTDIR BASE_TREE NEW_TREE -- four more rounds, builds alternated, of buffers at the same
# place in their pages other than page-aligned (16,16: numpy's; 64,64: torch's), 256 KiB and 1 MiB.
out=$1; base=$2; new=$3
loop=$new/tools/allreduce_loop.py
for round in 1 2 3 4; do
  for build in base new; do
    tree=$base; [ $build = new ] && tree=$new
    f=$out/more_${build}_$round.txt
    : > $f
    for o in 16,16 64,64; do
      for b in 262144 1048576; do
        PYTHONPATH=$tree mpirun -np 2 -x PYTHONPATH python $loop --bytes $b --calls $(( 400000000 / b )) --offset $o >> $f 2>&1
      done
    done
  done
done
