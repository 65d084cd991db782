#!/usr/bin/env bash
# One rank of a parallel pytest run: rank 0 reports on the terminal, the other
# ranks write to a log (tests agree across ranks, so rank 0 sees every failure).
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-0}}}
: >"${HVD_LITE_TEST_LOGDIR:-/tmp}/started-rank$rank"  # ci/test.sh: this launch got as far as a rank
if [ "$rank" = 0 ]; then
  exec "$@"
else
  exec "$@" >"${HVD_LITE_TEST_LOGDIR:-/tmp}/pytest-rank$rank.log" 2>&1
fi
