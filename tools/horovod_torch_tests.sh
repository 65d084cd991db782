#!/usr/bin/env bash
# Horovod 0.28.1's own test/parallel/test_torch.py against hvd_lite.torch: a measurement of how much
# of Horovod's PyTorch contract hvd_lite keeps. Not part of CI.
#
#   bash tools/horovod_torch_tests.sh [WORKDIR] [TEST ...]
#
# WORKDIR (default /tmp/hvdtest) receives the two files below; TEST names (test_horovod_allreduce
# ...) run only those tests, else every test whose name does not mention process sets, GPU, CUDA,
# Adasum, sparse, timeline, sync batch norm, reinit or CCL. Each test runs as its own 2-rank job
# (mpirun -np 2 python -m pytest -x test_torch.py::TorchTests::NAME) with a 120 s limit; the result
# of each goes to WORKDIR/results.txt (PASS, FAIL, SKIP or TIMEOUT) and its output to
# WORKDIR/logs/NAME.log.
#
# The files come from Horovod's git history (HOROVOD_REPO, default the mirror at
# /work/.mirror/horovod+horovod/repo, tag v0.28.1), changed as little as possible:
#   test/parallel/test_torch.py -> test_torch.py: `import horovod.torch as hvd` becomes
#       `import hvd_lite.torch as hvd`; nothing else;
#   test/utils/common.py -> common.py (imported for mpi_env_rank_and_size, temppath and
#       skip_or_fail_gpu_test): its `import mock` and `from horovod.runner.util.threads import
#       in_thread` are dropped (neither is used by those three functions, and neither package is
#       installed with hvd_lite).
# Run it from the repository root with the Python environment whose hvd_lite is to be measured
# first on PATH (PYTHONPATH=$PWD for a source tree).
set -uo pipefail

WORK=${1:-/tmp/hvdtest}
shift || true
REPO=${HOROVOD_REPO:-/work/.mirror/horovod+horovod/repo}
TAG=${HOROVOD_TAG:-v0.28.1}
PY=${PYTHON:-python}
LIMIT=${TEST_TIMEOUT:-120}

mkdir -p "$WORK/logs"
git -C "$REPO" show "$TAG:test/parallel/test_torch.py" \
  | sed 's/^import horovod\.torch as hvd$/import hvd_lite.torch as hvd/' > "$WORK/test_torch.py"
grep -q '^import hvd_lite.torch as hvd$' "$WORK/test_torch.py" || { echo "import not found" >&2; exit 2; }
git -C "$REPO" show "$TAG:test/utils/common.py" \
  | sed -e '/^import mock$/d' -e '/^from horovod\.runner\.util\.threads import in_thread$/d' \
  > "$WORK/common.py"

if [ $# -gt 0 ]; then
  tests=("$@")
else
  mapfile -t tests < <(grep -oP '^    def \Ktest_\w+' "$WORK/test_torch.py" \
    | grep -viE 'process_set|gpu|cuda|adasum|sparse|timeline|sync_batch_norm|reinit|ccl')
fi

flags=()
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  flags+=(--oversubscribe)
  if [ "$(id -u)" = 0 ]; then flags+=(--allow-run-as-root); fi
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$WORK

: > "$WORK/results.txt"
for t in "${tests[@]}"; do
  log="$WORK/logs/$t.log"
  (cd "$WORK" && timeout "$LIMIT" mpirun "${flags[@]}" -np 2 "$PY" -m pytest -x -q -p no:cacheprovider \
     "test_torch.py::TorchTests::$t") > "$log" 2>&1
  rc=$?
  if [ $rc -eq 124 ]; then res=TIMEOUT
  elif [ $rc -eq 0 ] && grep -qE '[0-9]+ skipped' "$log" && ! grep -qE '[0-9]+ passed' "$log"; then res=SKIP
  elif [ $rc -eq 0 ]; then res=PASS
  else res=FAIL
  fi
  echo "$res $t" | tee -a "$WORK/results.txt"
done
echo "== $(grep -c '^PASS' "$WORK/results.txt") passed, $(grep -c '^FAIL' "$WORK/results.txt") failed," \
     "$(grep -c '^TIMEOUT' "$WORK/results.txt") timed out, $(grep -c '^SKIP' "$WORK/results.txt") skipped" \
     "of ${#tests[@]}"
