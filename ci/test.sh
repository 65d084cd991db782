#!/usr/bin/env bash
# The whole test suite, against the MPI of the Python environment in use.
#
#   bash ci/test.sh             unit, parallel (at 1-4 ranks) and system tests
#   bash ci/test.sh --other-mpi parallel tests and the system tests that depend on the MPI (how CI
#                               runs the MPICH build)
#
# Environment: PYTHON (default: python), NP_LIST (default: "1 2 3 4"), TF_NP_LIST (the rank counts of NP_LIST
# at which the TensorFlow and Keras parallel test files run; default: all of them), REST_NP_LIST (the rank counts
# of NP_LIST at which the other parallel test files run; default: all of them), KERAS2_NP_LIST (default: "1 3"),
# PARTS (default: all of "unit parallel keras2 system"; a run of some of them, as CI runs the MPICH
# pass's parallel tests beside Open MPI's system tests), SYSTEM_TESTS (the system test files to run, by
# name; default: all of them, or under --other-mpi those that depend on the MPI; CI splits Open MPI's in two).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
NP_LIST=${NP_LIST:-"1 2 3 4"}
PARTS=" ${PARTS:-unit parallel keras2 system} "
mode=${1:-all}
case $mode in all|--other-mpi) ;; *) echo "usage: $0 [--other-mpi]" >&2; exit 2;; esac
for part in $PARTS; do
  case $part in unit|parallel|keras2|system) ;; *) echo "$0: PARTS: no part $part" >&2; exit 2;; esac
done
part() { [[ $PARTS == *" $1 "* ]]; }

BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
MPIRUN=$BIN/mpirun
[ -x "$MPIRUN" ] || MPIRUN=$(command -v mpirun)
flags=()
if "$MPIRUN" --version 2>&1 | grep -q "Open MPI"; then
  flags+=(--oversubscribe)
  if [ "$(id -u)" = 0 ]; then flags+=(--allow-run-as-root); fi
fi
echo "== hvd_lite tests with $("$PY" -c 'import hvd_lite; print(hvd_lite.build_info()["mpi_header"])')"

# Open MPI's ofi BTL sleeps a second as it closes (btl_ofi_component.c), which it does in every
# MPI_Init on a machine without a fabric it can use, such as CI's: 1.1 s against 0.1 s for MPI_Init,
# in every job the system tests start. Left out unless the caller chose the BTLs (MPICH
# ignores the variable; a test's own --mca btl wins over it).
export OMPI_MCA_btl=${OMPI_MCA_btl-^ofi}
# A test that stalls (ranks waiting on each other) fails in a minute instead of hanging.
export HVD_LITE_STALL_CHECK_TIME_SECONDS=${HVD_LITE_STALL_CHECK_TIME_SECONDS:-10}
export HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS=${HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS:-60}
export HVD_LITE_TEST_LOGDIR
HVD_LITE_TEST_LOGDIR=$(mktemp -d)
trap 'rm -rf "$HVD_LITE_TEST_LOGDIR"' EXIT  # a failed run's logs are printed below first
# --durations: the slowest tests of each run in the log, to see where CI's time goes.
PYTEST=("$PY" -m pytest -q -rs -p no:cacheprovider --color=no --timeout=300 --durations=20)

# Under the other MPI the parallel tests leave out torch.compile's (test_torch_compile.py): what
# they test is Dynamo's tracing around the collectives, which does not depend on the MPI, and they
# took 3-8 s per rank count there.
skip=()
if [ "$mode" = --other-mpi ]; then skip+=(--ignore=tests/parallel/test_torch_compile.py); fi

# One parallel run of the given test paths at np ranks. Open MPI's launcher now and then fails to
# start itself (CI saw "The PMIx server's listener thread failed to start" once); then no rank ever
# ran (each one leaves a started-rank* marker as it begins), so the run is launched again, up to
# three times in all.
parallel() {
  local np=$1 attempt
  shift
  for attempt in 1 2 3; do
    rm -f "$HVD_LITE_TEST_LOGDIR"/started-rank*
    timeout 1200 "$MPIRUN" "${flags[@]}" -np "$np" ci/mpi_pytest.sh "${PYTEST[@]}" --with-mpi \
      ${skip[@]+"${skip[@]}"} "$@" && return 0
    compgen -G "$HVD_LITE_TEST_LOGDIR/started-rank*" >/dev/null && return 1
    echo "== mpirun failed before any rank started (attempt $attempt)"
  done
  return 1
}

# The TensorFlow and Keras test files (the slowest per test: TensorFlow's imports, tracing and fits on every
# rank) run at the rank counts TF_NP_LIST names, the other files at those REST_NP_LIST names (CI: TensorFlow's
# at 1 and 3 ranks, the others at 1, 2 and 4, and at 3 under MPICH).
TF_NP_LIST=${TF_NP_LIST:-$NP_LIST}
REST_NP_LIST=${REST_NP_LIST:-$NP_LIST}
tf_files=(tests/parallel/test_*tensorflow*.py tests/parallel/test_keras*.py)
tf_at() { [[ " $(echo $TF_NP_LIST) " == *" $1 "* ]]; }
rest_at() { [[ " $(echo $REST_NP_LIST) " == *" $1 "* ]]; }
# What the parallel pass at np ranks runs, in words.
parallel_what() {
  if tf_at "$1" && rest_at "$1"; then echo ""
  elif tf_at "$1"; then echo " (the TensorFlow and Keras files only)"
  elif rest_at "$1"; then echo " (without the TensorFlow and Keras files)"
  else echo " (no file: left out)"
  fi
}
# The parallel pass at np ranks: the files TF_NP_LIST and REST_NP_LIST give it.
parallel_all() {
  local np=$1
  if tf_at "$np" && rest_at "$np"; then
    parallel "$np" tests/parallel
  elif tf_at "$np"; then
    parallel "$np" "${tf_files[@]}"
  elif rest_at "$np"; then
    parallel "$np" tests/parallel "${tf_files[@]/#/--ignore=}"
  fi
}

failed_logs() {
  for log in "$HVD_LITE_TEST_LOGDIR"/pytest-rank*.log; do
    [ -f "$log" ] && { echo "---- $log"; tail -n 40 "$log"; }
  done
}

# A pass at one rank is one process, as the unit tests are: the parallel tests' and the Keras 2 pass's
# run beside them (on CI's 2 cores the three took 53, 63 and 32 s one after the other, 102 s side by
# side), each with its output kept and printed after the unit tests'.
KERAS2_NP_LIST=${KERAS2_NP_LIST:-1 3}
has_keras2() { part keras2 && "$PY" -c 'import tf_keras' 2>/dev/null; }
# The Keras test files again with Keras 2 (below), at np ranks.
keras2() { TF_USE_LEGACY_KERAS=1 parallel "$1" tests/parallel/test_keras2.py tests/parallel/test_keras_strategy.py; }
without_1() { for np in $1; do [ "$np" = 1 ] || echo "$np"; done; }
# One such pass in the background, with a log folder of its own (its rank's start marker apart from
# the other's): `beside NAME DIR COMMAND...`.
beside=()
beside() {
  local name=$1 dir=$HVD_LITE_TEST_LOGDIR/$2
  shift 2
  mkdir -p "$dir"
  (HVD_LITE_TEST_LOGDIR=$dir && "$@") > "$dir/out.log" 2>&1 &
  beside+=("$name:$!:$dir")
}
if [ "$mode" = all ] && part unit; then
  if part parallel && [[ " $(echo $NP_LIST) " == *" 1 "* ]]; then
    beside "parallel tests, 1 rank(s)$(parallel_what 1)" parallel-1 parallel_all 1
    NP_LIST=$(without_1 "$NP_LIST")
  fi
  if has_keras2 && [[ " $(echo $KERAS2_NP_LIST) " == *" 1 "* ]]; then
    beside "Keras 2 (tf_keras) parallel tests, 1 rank(s)" keras2-1 keras2 1
    KERAS2_NP_LIST=$(without_1 "$KERAS2_NP_LIST")
  fi
  echo "== unit tests"
  unit_rc=0
  "${PYTEST[@]}" tests/unit || unit_rc=$?
  beside_failed=0
  for job in ${beside[@]+"${beside[@]}"}; do
    IFS=: read -r name pid dir <<<"$job"
    echo "== $name (beside the unit tests)"
    rc=0
    wait "$pid" || rc=$?
    cat "$dir/out.log"
    [ "$rc" = 0 ] || beside_failed=1
  done
  if [ "$beside_failed" != 0 ]; then failed_logs; exit 1; fi
  [ "$unit_rc" = 0 ] || exit "$unit_rc"
fi

for np in $NP_LIST; do
  part parallel || break
  echo "== parallel tests, $np rank(s)$(parallel_what "$np")"
  if ! parallel_all "$np"; then failed_logs; exit 1; fi
done

# The Keras test files again with Keras 2: under TF_USE_LEGACY_KERAS=1 tf.keras is tf_keras, which
# test_keras_strategy.py then trains and test_keras2.py (skipped in the pass above) tests. Where
# tf_keras is not installed (the MPICH pass), the pass is left out. At 1 and 3 ranks by default
# (KERAS2_NP_LIST): one rank's shortcuts and an odd count's uneven shards; the collectives under it
# are the pass above's, and each rank count costs a minute or more on CI's two cores.
if has_keras2; then
  for np in $KERAS2_NP_LIST; do
    echo "== Keras 2 (tf_keras) parallel tests, $np rank(s)"
    if ! keras2 "$np"; then
      failed_logs
      exit 1
    fi
  done
fi

# A second MPI runs the system tests whose outcome depends on the MPI: the launcher (it drives each
# flavour's mpirun; emulated hosts through its daemons), how hvd_lite meets MPI (singletons,
# mpi4py, another MPI's launcher), faults and signals (how a dying rank ends the job), elastic
# relaunches (how each launcher ends a job whose rank died), whole engine jobs. The others run
# code that is the same under any MPI once the parallel tests pass: the examples and TensorFlow
# jobs (framework adapters over the same collectives), the benchmarks, autotuning (engine logic),
# the MPICC build switch (setup.py; the MPICH build itself is CI's install).
OTHER_MPI_SYSTEM_TESTS=(test_run_launcher.py test_run_multihost.py test_run_func.py test_mpi_setup.py
                        test_faults.py test_interrupts.py test_engine_jobs.py test_elastic.py)
if ! part system; then
  :
elif [ -n "${SYSTEM_TESTS:-}" ]; then
  read -ra system_tests <<<"$SYSTEM_TESTS"
  echo "== system tests: ${system_tests[*]}"
  "${PYTEST[@]}" "${system_tests[@]/#/tests/system/}"
elif [ "$mode" = all ]; then
  echo "== system tests"
  "${PYTEST[@]}" tests/system
else
  echo "== system tests that depend on the MPI"
  "${PYTEST[@]}" "${OTHER_MPI_SYSTEM_TESTS[@]/#/tests/system/}"
fi
