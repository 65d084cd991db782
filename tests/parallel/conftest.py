"""Fixtures for tests run under mpirun: every rank runs every test in the same order.

A test checks its rank-local result, then `agree()` combines the verdicts of all
ranks with an MPI allreduce, so a failure on one rank fails the test on every rank
instead of leaving the others waiting in the next collective.
"""
import contextlib
import os

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
        details = comm.allgather(detail if not ok else "")
        bad = {r: d for r, d in enumerate(details) if d or not all_ok}
        pytest.fail(f"failed on some rank: {bad}")


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
