"""Fixtures for tests run under mpirun: every rank runs every test in the same order.

A test checks its rank-local result, then `agree()` combines the verdicts of all
ranks with an MPI allreduce, so a failure on one rank fails the test on every rank
instead of leaving the others waiting in the next collective. A bare `assert` or a
`pytest.raises` block fails on its own rank only: use `raised()`, `raises_on_every_rank()`,
`raises_before_submitting()` or `with everywhere():` instead.
"""

import contextlib
import os
import re
import time
from typing import Optional

import pytest

import hvd_lite as hvd


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def agree(ok: bool, detail: str = "") -> None:
    """Fails on every rank unless `ok` holds on every rank."""
    from mpi4py import MPI

    comm = world()
    all_ok = comm.allreduce(bool(ok), op=MPI.LAND)
    if not all_ok:
        verdicts = comm.allgather((bool(ok), detail))
        bad = {r: d for r, (good, d) in enumerate(verdicts) if not good}
        pytest.fail(f"failed on rank(s) {sorted(bad)}: {bad}")


def small_pages(x) -> int:
    """Bytes of numpy array x on small pages, not huge ones, as the single-copy all-reduce's
    stand-in asks the kernel (csrc/transport/shm/peer_memory.c, hvdl_mem_small: 0 where the kernel
    cannot say)."""
    import ctypes

    from hvd_lite import _core

    f = ctypes.CDLL(_core.__file__).hvdl_mem_small
    f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_size_t
    return f(x.ctypes.data, x.nbytes)


def on_small_pages(a):
    """A copy of numpy array `a` in plain anonymous memory (not hvdlMemAlloc's) that the kernel is
    told never to back with huge pages (MADV_NOHUGEPAGE): buffers the single-copy all-reduce's
    stand-in takes whatever the process's heap holds by then (a numpy array may lie on huge pages
    after earlier tests' allocations)."""
    import mmap

    import numpy as np

    m = mmap.mmap(-1, max(a.nbytes, 1))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)
    out = np.frombuffer(m, a.dtype, a.size).reshape(a.shape)
    out[...] = a
    return out


def stand_in_everywhere(probe=None) -> bool:
    """Whether every rank's kernel says that `probe` (default: a fresh 64 KiB numpy array) lies on
    small pages, so that such buffers take the stand-in (collective)."""
    import numpy as np
    from mpi4py import MPI

    probe = np.ones(1 << 14, np.float32) if probe is None else probe
    return world().allreduce(int(small_pages(probe) > 0), op=MPI.MIN) == 1


def device_tests():
    """(CuPy or None, the marks of a module of device tests). Where they cannot run (a build without
    CUDA, no device seen, no CuPy: CI has none of them) every test of the module is collected and
    skipped, saying why; a module skipped whole would collect nothing, which pytest under mpirun
    (pytest-mpi) ends with exit status 5."""
    from hvd_lite import _core

    cupy, why = None, None
    if not _core.build_info()["cuda"]:
        why = "this build has no CUDA (build_info()['cuda'] is False)"
    elif _core.cuda_device_count() == 0:
        why = "no CUDA device is seen"
    else:
        try:
            import cupy
        except ImportError:
            why = "CuPy is not installed"
    return cupy, [pytest.mark.mpi, pytest.mark.skipif(why is not None, reason=why or "")]


def raised(call) -> Optional[BaseException]:
    """The exception call() raised, or None (a rank-local outcome, for `agree`)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - judged by the caller, on every rank
        return exc
    return None


def raises_on_every_rank(exc_type, match: str, call) -> None:
    """pytest.raises(exc_type, match=match) with the verdict agreed across ranks."""
    err = raised(call)
    agree(
        isinstance(err, exc_type) and re.search(match, str(err)) is not None,
        f"expected {exc_type.__name__} matching {match!r}, got {err!r}",
    )


def raises_before_submitting(exc_type, match: str, call) -> None:
    """raises_on_every_rank, and call() submitted nothing to the engine and took no hold before
    raising (a grouped call checks every entry first)."""
    with engine_calls() as calls:
        err = raised(call)
    agree(
        isinstance(err, exc_type) and re.search(match, str(err)) is not None and not calls,
        f"expected {exc_type.__name__} matching {match!r} before any submission, got {err!r} after {calls}",
    )


@contextlib.contextmanager
def everywhere(what: str = "checks"):
    """Runs a block of rank-local checks (asserts, pytest.raises) and agrees on its verdict. The
    block must not start a collective after a check that can fail."""
    try:
        yield
    except (Exception, pytest.fail.Exception) as exc:  # pytest.raises fails with the latter
        agree(False, f"{what}: {type(exc).__name__}: {exc}")
    else:
        agree(True)


@contextlib.contextmanager
def engine_calls():
    """Records what reaches this rank's engine inside the block: one ("submit", name) per
    submission (each entry of a group too) and one ("hold", on) per hold. Rank-local: judge it
    with `agree`."""
    from hvd_lite import basics

    calls = []
    real = basics._engine

    class Spy:
        def __init__(self, engine):
            self._engine = engine

        def submit(self, *args):
            calls.append(("submit", args[7]))  # _submit.submit passes the name eighth
            return self._engine.submit(*args)

        def submit_group(self, entries, *args):
            calls.extend(("submit", e[7]) for e in entries)
            return self._engine.submit_group(entries, *args)

        def hold(self, on):
            calls.append(("hold", on))
            return self._engine.hold(on)

        def __getattr__(self, attr):
            return getattr(self._engine, attr)

    basics._engine = lambda: Spy(real())
    try:
        yield calls
    finally:
        basics._engine = real


@pytest.fixture(scope="session", autouse=True)
def hvd_session():
    hvd.init()
    yield
    hvd.shutdown()


@contextlib.contextmanager
def reinit(**env):
    """Re-initialises hvd_lite with HVD_LITE_* variables set (collective)."""
    saved = {k: os.environ.get(k) for k in env}
    hvd.shutdown()
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        hvd.init()
        yield
    finally:
        hvd.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        hvd.init()


@contextlib.contextmanager
def make_comm(**env):
    """A bare communicator (the C API, hvd_lite._core.Comm) created with HVD_LITE_* variables set,
    then restored (collective); no cost-model file unless one is given. Destroyed on exit."""
    from hvd_lite import _core

    env.setdefault("HVD_LITE_COST_MODEL_FILE", "")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        comm = _core.Comm()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield comm
    finally:
        comm.destroy()


def single_copy_runs() -> bool:
    """Whether the shared-memory path's single copy can run (its all-gather, reduce-scatter and
    broadcast forms): every rank on one host (so 2 ranks or more), each able to read and write the
    others' memory (the path's probe, Comm.shm_cma; collective)."""
    with make_comm() as c:
        return c.shm_cma()


def skip_unless_single_copy(algo: str) -> None:
    """Skips a test of a forced algorithm `shm` where the single copy cannot run."""
    if algo == "shm" and not single_copy_runs():
        pytest.skip(
            "the single copy needs 2 ranks or more that can reach each other's memory "
            "(process_vm_readv/writev)"
        )


def fails_everywhere_at_the_fault(call, point: str, victim: int, verb: str) -> None:
    """Arms fault point `point` on rank `victim` for its second hit (after step 1's: the single
    copy's first read or write of a peer's memory, then made at address 0), runs `call` on every
    rank through the engine, disarms it, and checks that every rank raised within 5 s, naming
    the shared-memory path's `verb` ("reading", "writing") and the kernel's "Bad address"."""
    import hvd_lite as hvd

    if hvd.rank() == victim:
        hvd.basics.inject_fault(point, 2)
    t0, err = time.monotonic(), None
    try:
        call()
    except hvd.HvdLiteError as e:
        err = e
    took = time.monotonic() - t0
    if hvd.rank() == victim:
        hvd.basics.inject_fault(point, 0)
    agree(
        err is not None
        and f"shared-memory path: {verb}" in str(err)
        and "Bad address" in str(err)
        and took < 5,
        f"{err!r} after {took:.2f} s",
    )
