"""hvdlMemAlloc and hvdlMemFree through the C API itself (ctypes on hvd_lite._core's library): the
refusals name their values, memory comes page-aligned and zeroed and is shared (a forked child's
write is the parent's), and a pointer is freed once. The collectives on such memory:
tests/parallel/test_shared_memory.py."""

import ctypes
import os

import pytest

from hvd_lite import _core

INVALID_ARGUMENT = 4  # hvdlInvalidArgument, NCCL's number


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(_core.__file__)
    lib.hvdlMemAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.hvdlMemFree.argtypes = [ctypes.c_void_p]
    lib.hvdlGetLastError.argtypes = [ctypes.c_void_p]
    lib.hvdlGetLastError.restype = ctypes.c_char_p
    return lib


def last_error(lib) -> str:
    return lib.hvdlGetLastError(None).decode()


def test_bad_arguments_are_refused_naming_them(lib):
    assert lib.hvdlMemAlloc(None, 64) == INVALID_ARGUMENT
    assert "ptr is NULL" in last_error(lib)
    p = ctypes.c_void_p(1234)
    assert lib.hvdlMemAlloc(ctypes.byref(p), 0) == INVALID_ARGUMENT
    assert "size 0" in last_error(lib) and p.value is None
    assert lib.hvdlMemAlloc(ctypes.byref(p), 2**64 - 1) == INVALID_ARGUMENT
    assert f"size {2**64 - 1}" in last_error(lib)


def test_memory_is_page_aligned_zeroed_shared_and_freed_once(lib):
    p = ctypes.c_void_p()
    assert lib.hvdlMemAlloc(ctypes.byref(p), 10_000) == 0
    assert p.value % 4096 == 0
    buf = (ctypes.c_ubyte * 10_000).from_address(p.value)
    assert not any(buf)
    pid = os.fork()
    if pid == 0:  # the child writes; shared memory, not copy on write
        buf[9_999] = 7
        os._exit(0)
    os.waitpid(pid, 0)
    assert buf[9_999] == 7
    assert lib.hvdlMemFree(p) == 0
    assert lib.hvdlMemFree(p) == INVALID_ARGUMENT
    assert "not a pointer that hvdlMemAlloc returned (or it was freed already)" in last_error(lib)
    assert lib.hvdlMemFree(None) == 0


def test_a_pointer_inside_a_buffer_is_not_one_it_returned(lib):
    p = ctypes.c_void_p()
    assert lib.hvdlMemAlloc(ctypes.byref(p), 8192) == 0
    try:
        assert lib.hvdlMemFree(ctypes.c_void_p(p.value + 64)) == INVALID_ARGUMENT
        assert hex(p.value + 64) in last_error(lib)
    finally:
        assert lib.hvdlMemFree(p) == 0
