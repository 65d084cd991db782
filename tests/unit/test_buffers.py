"""The binding's one descriptor of a buffer (py_buffer.c, `_core.describe_buffer`): address,
bytes, element type, device type and number, stream; read from the buffer protocol (numpy),
DLPack (torch CPU tensors, numpy, and hand-made capsules for other devices and types) and the
CUDA array interface (hand-made dicts: the parsing rules). Memory the build cannot take is refused
with an error that names its device, before any call."""

import ctypes
import mmap

import ml_dtypes
import numpy as np
import pytest

from hvd_lite import _core
from hvd_lite.ops import HVDL_DTYPES

CPU, CUDA, ROCM = 1, 2, 10
FLOAT32 = HVDL_DTYPES[np.dtype(np.float32)]
CUDA_BUILT = _core.build_info()["cuda"]


def describe(obj, writable=False):
    return _core.describe_buffer(obj, writable)


@pytest.mark.parametrize(
    "dtype",
    [
        np.int8,
        np.uint8,
        np.int16,
        np.uint16,
        np.int32,
        np.uint32,
        np.int64,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
        np.bool_,
    ],
    ids=lambda d: np.dtype(d).name,
)
def test_a_numpy_array_is_host_memory_with_its_type(dtype):
    a = np.zeros((3, 5), dtype)
    d = describe(a)
    assert d == {
        "address": a.ctypes.data,
        "nbytes": a.nbytes,
        "dtype": HVDL_DTYPES[np.dtype(dtype)],
        "device_type": CPU,
        "device_id": 0,
        "stream": 0,
        "readonly": False,
    }


def test_a_bfloat16_array_gives_its_bytes_without_a_type():
    """numpy cannot spell ml_dtypes' bfloat16 in a buffer format: the bytes, type unknown (-1)."""
    a = np.zeros(4, ml_dtypes.bfloat16)
    d = describe(a)
    assert (d["address"], d["nbytes"], d["dtype"]) == (a.ctypes.data, 8, -1)


def test_a_read_only_array_is_refused_where_the_call_writes():
    a = np.zeros(3, np.float32)
    a.flags.writeable = False
    assert describe(a)["readonly"] is True
    with pytest.raises(ValueError, match="read-only"):
        describe(a, writable=True)


def test_a_strided_numpy_view_is_refused():
    with pytest.raises(ValueError, match="not C-contiguous"):
        describe(np.zeros((4, 4), np.float32)[:, 1])


try:
    import torch
except ImportError:  # the tests above and those below that name no torch run without it
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


@needs_torch
@pytest.mark.parametrize(
    "dtype,code",
    [
        (torch.float32, FLOAT32),
        (torch.bfloat16, HVDL_DTYPES[np.dtype(ml_dtypes.bfloat16)]),
        (torch.int64, HVDL_DTYPES[np.dtype(np.int64)]),
        (torch.bool, HVDL_DTYPES[np.dtype(np.bool_)]),
    ]
    if torch is not None
    else [],
)
def test_a_torch_cpu_tensor_is_read_through_dlpack(dtype, code):
    t = torch.zeros((2, 3), dtype=dtype)
    d = describe(t)
    assert (d["address"], d["nbytes"], d["dtype"], d["device_type"]) == (
        t.data_ptr(),
        t.numel() * t.element_size(),
        code,
        CPU,
    )


@needs_torch
def test_a_torch_view_with_an_offset_starts_at_its_first_element():
    t = torch.arange(10, dtype=torch.float32)[3:7]
    d = describe(t)
    assert (d["address"], d["nbytes"]) == (t.data_ptr(), 16)


@needs_torch
def test_a_transposed_torch_tensor_is_refused_as_not_contiguous():
    with pytest.raises(ValueError, match="not C-contiguous"):
        describe(torch.zeros(2, 3).t())


@needs_torch
def test_a_dlpack_capsule_itself_is_read_and_a_used_one_refused():
    """TensorFlow gives capsules (tf.experimental.dlpack.to_dlpack), not producers."""
    a = np.arange(5, dtype=np.int32)
    d = describe(a.__dlpack__())
    assert (d["address"], d["nbytes"], d["dtype"]) == (a.ctypes.data, 20, HVDL_DTYPES[np.dtype(np.int32)])
    used = a.__dlpack__()
    torch.from_dlpack(used)  # the consumer renames it 'used_dltensor'
    with pytest.raises(TypeError, match="the capsule is no unused 'dltensor' capsule"):
        describe(used)


def test_a_tensorflow_tensor_is_read_through_its_dlpack_capsule():
    tf = pytest.importorskip("tensorflow")
    t = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    d = describe(tf.experimental.dlpack.to_dlpack(t))
    assert (d["nbytes"], d["dtype"], d["device_type"]) == (24, FLOAT32, CPU)


def test_an_object_with_no_protocol_is_refused_naming_its_type():
    with pytest.raises(
        TypeError, match="a object is no buffer.*buffer protocol, __cuda_array_interface__ nor __dlpack__"
    ):
        describe(object())


# ---- the CUDA array interface -----------------------------------------------------------------


class Cai:
    """An object that exports only a CUDA array interface (what CuPy, Numba, torch.cuda give)."""

    def __init__(self, **fields):
        base = {"shape": (2, 3), "typestr": "<f4", "data": (4096, False), "version": 3}
        base.update(fields)
        self.__cuda_array_interface__ = {k: v for k, v in base.items() if v is not ...}


def test_the_cuda_array_interface_gives_address_bytes_type_and_stream():
    d = describe(Cai(stream=7, strides=None))
    assert (d["address"], d["nbytes"], d["dtype"], d["device_type"], d["stream"]) == (
        4096,
        24,
        FLOAT32,
        CUDA,
        7,
    )
    assert describe(Cai(strides=(12, 4)))["nbytes"] == 24  # explicit C-contiguous strides
    assert describe(Cai(shape=(3, 1), strides=(4, 999)))["nbytes"] == 12  # size-1 dims: any stride
    assert describe(Cai(shape=(0,), data=(0, False)))["nbytes"] == 0
    assert describe(Cai(typestr="|u1", shape=(5,)))["dtype"] == HVDL_DTYPES[np.dtype(np.uint8)]
    assert describe(Cai(typestr="|b1", shape=(5,)))["dtype"] == HVDL_DTYPES[np.dtype(np.bool_)]


@pytest.mark.parametrize(
    "fields,error,match",
    [
        ({"strides": (4, 8)}, ValueError, r"not C-contiguous \(shape \(2, 3\), strides \(4, 8\)\)"),
        ({"strides": (4,)}, ValueError, "strides .* do not match shape"),
        ({"typestr": "<c8"}, TypeError, "typestr '<c8' names no type"),
        ({"typestr": "<V2"}, TypeError, "bfloat16 has no typestr: pass it through DLPack"),
        ({"typestr": ">f4"}, TypeError, "typestr '>f4' names no type"),
        ({"stream": 0}, ValueError, r"\['stream'\] is 0, which the interface disallows"),
        ({"mask": (1, 2)}, ValueError, "a masked CUDA array is not taken"),
        ({"shape": ...}, ValueError, "lacks 'shape'"),
        ({"data": 4096}, ValueError, r"\['data'\] must be \(address, read_only\)"),
        ({"data": (0, False)}, ValueError, "6 elements at address 0"),
        ({"shape": (2, -3)}, ValueError, "dimension 1 of size -3 is negative"),
        ({"shape": (1 << 40, 1 << 40)}, ValueError, "dimension 1 of size 1099511627776 is too large"),
    ],
)
def test_the_cuda_array_interface_rules(fields, error, match):
    with pytest.raises(error, match=match):
        describe(Cai(**fields))


class RefusesItsBuffer(np.ndarray):
    """An exporter of the buffer protocol that refuses every export a call asks for (its memory
    is not C-contiguous) and has the CUDA array interface: what CuPy's arrays (14) are, whose
    export raises TypeError for device memory."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": (2, 3), "typestr": "<f4", "data": (4096, False), "version": 3}


def test_an_object_that_refuses_its_buffer_is_read_through_its_cuda_array_interface():
    obj = np.zeros((4, 6), np.float32)[:, ::2].view(RefusesItsBuffer)
    assert not memoryview(obj).c_contiguous  # the C-contiguous export is refused ...
    d = describe(obj)  # ... and the interface read instead
    assert (d["address"], d["nbytes"], d["device_type"]) == (4096, 24, CUDA)
    # an exporter with no interface keeps its own error
    with pytest.raises(ValueError, match="not C-contiguous|contiguous"):
        describe(np.zeros((4, 6), np.float32)[:, ::2])


@needs_torch
def test_a_type_the_interface_cannot_name_is_read_through_dlpack():
    """torch.cuda's bfloat16 tensors give typestr '<V2' and have __dlpack__, which names the type;
    the interface's stream is kept, and its read-only flag still refuses a write."""

    class Both(Cai):
        def __init__(self, **fields):
            super().__init__(**dict(dict(typestr="<V2", shape=(4,), stream=7), **fields))
            self.tensor = torch.zeros(4, dtype=torch.bfloat16)

        def __dlpack__(self, **kwargs):
            return self.tensor.__dlpack__(**kwargs)

    obj = Both()
    d = describe(obj)
    assert (d["address"], d["nbytes"], d["dtype"], d["stream"]) == (
        obj.tensor.data_ptr(),
        8,
        HVDL_DTYPES[np.dtype(ml_dtypes.bfloat16)],
        7,
    )
    with pytest.raises(ValueError, match="read-only and the call writes it"):
        describe(Both(data=(4096, True)), writable=True)


class ReadOnlyMap(mmap.mmap):
    """What CuPy's arrays are to the descriptor: a buffer exporter that refuses the export asked
    for (writable, from a read-only map), whose type has a buffer release of its own (mmap counts
    its exports: the release takes one off), and the CUDA array interface."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": (3,), "typestr": "<f4", "data": (4096, False), "version": 3}


def test_a_view_read_through_the_interface_never_calls_the_owners_buffer_release():
    """The view the core fills from the interface is released as a decref only: the owner's
    release, called on a view it never gave, corrupted CuPy's arrays (a crash on the GPU
    machine); here it would take off an export that mmap never counted."""
    m = ReadOnlyMap(-1, 4096, access=mmap.ACCESS_READ)
    assert describe(m, writable=True)["nbytes"] == 12  # the export refused, the interface read
    view = memoryview(m)  # one export: mmap must refuse to close while it lives
    with pytest.raises(BufferError):
        m.close()
    view.release()
    m.close()


def test_a_read_only_cuda_array_is_refused_where_the_call_writes():
    assert describe(Cai(data=(4096, True)))["readonly"] is True
    with pytest.raises(ValueError, match="read-only and the call writes it"):
        describe(Cai(data=(4096, True)), writable=True)


def test_cuda_memory_is_refused_without_cuda_naming_the_device():
    """Before any call: no kernel runs on an address the build cannot reach."""
    if CUDA_BUILT:
        pytest.skip("this build has CUDA (HVD_LITE_CUDA=1)")
    a = Cai(shape=(3,))
    with pytest.raises(
        ValueError,
        match=r"dst is in CUDA memory \(device -1\): this hvd_lite was "
        r"built without CUDA",
    ):
        _core.reduce_local(a, a, a, FLOAT32, 0)


def test_memory_by_address_names_its_device_and_stream_when_the_adapter_gives_them():
    """hvd_lite.torch's route by address: (owner, address, nbytes) is host memory; with a device
    and a stream after it, that CUDA device's memory on that stream (the adapter vouches)."""
    owner = bytearray(16)
    address = ctypes.addressof((ctypes.c_char * 16).from_buffer(owner))
    host = describe((owner, address, 16))
    assert (host["device_type"], host["address"], host["nbytes"]) == (CPU, address, 16)
    assert host["stream"] == 0
    dev = describe((owner, address, 16, 3, 0x1234))
    assert (dev["device_type"], dev["device_id"], dev["stream"]) == (CUDA, 3, 0x1234)
    with pytest.raises(ValueError, match=r"16 bytes at address \d+ \(device -2\)"):
        describe((owner, address, 16, -2, 0))
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        describe((owner, address, 16, "cuda"))


def test_a_cuda_buffer_by_address_is_refused_by_the_engine_without_cuda():
    """The engine's submit takes CUDA memory for an allreduce only in a CUDA build; here it is
    refused before anything is sent, naming the device."""
    if CUDA_BUILT:
        pytest.skip("this build has CUDA (HVD_LITE_CUDA=1)")
    owner = bytearray(16)
    address = ctypes.addressof((ctypes.c_char * 16).from_buffer(owner))
    with pytest.raises(
        ValueError,
        match=r"dst is in CUDA memory \(device 0\): this hvd_lite was "
        r"built without CUDA",
    ):
        _core.reduce_local((owner, address, 16, 0, 0), (owner, address, 16), (owner, address, 16), FLOAT32, 0)


# ---- DLPack capsules made by hand: other devices and types --------------------------------------


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManaged(ctypes.Structure):
    _fields_ = [("tensor", _DLTensor), ("ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class HandMade:
    """A producer whose __dlpack__ gives a capsule over memory it keeps (no deleter)."""

    def __init__(
        self, device_type=CPU, device_id=0, code=2, bits=32, lanes=1, shape=(4,), strides=None, byte_offset=0
    ):
        self.buf = (ctypes.c_char * 64)()
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        self.managed = _DLManaged(
            _DLTensor(
                ctypes.addressof(self.buf),
                device_type,
                device_id,
                len(shape),
                code,
                bits,
                lanes,
                self.shape,
                self.strides,
                byte_offset,
            ),
            None,
            None,
        )

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (self.managed.tensor.device_type, self.managed.tensor.device_id)


def test_a_dlpack_capsule_gives_its_offset_address_and_type():
    h = HandMade(byte_offset=8, shape=(2, 2), strides=(2, 1))
    d = describe(h)
    assert (d["address"], d["nbytes"], d["dtype"], d["device_type"]) == (
        ctypes.addressof(h.buf) + 8,
        16,
        FLOAT32,
        CPU,
    )


@pytest.mark.parametrize(
    "fields,error,match",
    [
        ({"code": 5, "bits": 64}, TypeError, r"DLPack type \(code 5, 64 bits, 1 lanes\)"),
        ({"lanes": 4}, TypeError, "4 lanes"),
        ({"shape": (2, 2), "strides": (1, 2)}, ValueError, "not C-contiguous"),
        ({"shape": (-1,)}, ValueError, "dimension 0 of size -1 is negative"),
    ],
)
def test_dlpack_types_and_layouts_hvd_lite_cannot_take_are_refused(fields, error, match):
    with pytest.raises(error, match=match):
        describe(HandMade(**fields))


def test_memory_on_another_device_is_refused_naming_it():
    rocm = HandMade(device_type=ROCM, device_id=1)
    assert describe(rocm)["device_type"] == ROCM  # described...
    host = np.zeros(4, np.float32)
    with pytest.raises(
        ValueError,
        match=r"a is in ROCm memory \(device 1\): hvd_lite takes host "
        r"and CUDA memory only",
    ):
        _core.reduce_local(host, rocm, host, FLOAT32, 0)  # ...but taken by no call


def test_cuda_dlpack_memory_is_refused_without_cuda():
    if CUDA_BUILT:
        pytest.skip("this build has CUDA (HVD_LITE_CUDA=1)")
    h = HandMade(device_type=CUDA, device_id=0)
    with pytest.raises(
        ValueError,
        match=r"buf is in CUDA memory \(device 0\): this hvd_lite was "
        r"built without CUDA",
    ):
        _core.divide_local(h, FLOAT32, 2)
