"""hvd_lite._loader's way to libmpi where the extension's RUNPATH does not reach an MPI wheel (the whole
path, from an installed wheel, is checked by tools/build_wheel.sh)."""

from importlib import metadata

import pytest

import hvd_lite
from hvd_lite import _loader


def _installed(name):
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def test_the_builds_libmpi_is_loaded_from_the_installed_mpi_wheel():
    if not any(_installed(name) for name in _loader._MPI_WHEELS):
        pytest.skip("no MPI wheel installed (a system MPI build)")
    assert _loader._load_from_mpi_wheel(hvd_lite.build_info()["libmpi"])


def test_a_libmpi_that_no_mpi_wheel_has_is_not_loaded():
    assert not _loader._load_from_mpi_wheel("libmpi.so.999")
