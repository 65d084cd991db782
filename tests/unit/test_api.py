"""The numpy API in a 1-rank job (no mpirun): argument checks and the init lifecycle."""

import ml_dtypes
import numpy as np
import pytest

import hvd_lite as hvd


@pytest.fixture
def initialized():
    hvd.init()
    yield
    hvd.shutdown()


def test_calls_before_init_raise_not_initialized():
    assert not hvd.is_initialized()
    for call in (
        hvd.rank,
        hvd.size,
        hvd.local_rank,
        hvd.local_size,
        hvd.cross_rank,
        hvd.cross_size,
        hvd.mpi_threads_supported,
        lambda: hvd.allreduce(np.ones(3, np.float32)),
    ):
        with pytest.raises(hvd.NotInitializedError, match=r"call hvd_lite.init\(\) first"):
            call()


def test_one_rank_job_without_mpirun(initialized):
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    assert hvd.mpi_threads_supported()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = hvd.allreduce(x)
    assert y is not x and y.shape == (2, 3) and np.array_equal(x, y)
    assert hvd.allreduce_(x, op=hvd.Sum) is x


def test_init_and_shutdown_can_repeat():
    for _ in range(3):
        hvd.init()
        hvd.init()  # a second init is a no-op
        assert hvd.is_initialized() and hvd.size() == 1
        hvd.shutdown()
        assert not hvd.is_initialized()
    hvd.shutdown()  # shutting down twice is harmless


def test_build_info_names_the_mpi():
    info = hvd.build_info()
    assert info["mpi_vendor"] in ("openmpi", "mpich", "intel", "unknown")
    assert info["libmpi"].startswith("libmpi.so.")
    assert info["mpi_runtime"]


@pytest.mark.parametrize(
    "bad,exc,match",
    [
        ([1.0, 2.0], TypeError, "expects a numpy.ndarray or a cupy.ndarray, got list"),
        (np.ones(3, np.complex128), TypeError, "unsupported dtype complex128"),
        (np.ones(3, np.complex64), TypeError, "unsupported dtype complex64"),
        (np.ones(3, bool), TypeError, "bool arrays cannot be reduced"),
        (np.ones(3, ">f4"), TypeError, "unsupported dtype >f4"),
        (np.ones((4, 4), np.float32)[:, 1], ValueError, "not C-contiguous"),
        (np.ones((4, 4), np.float32).T, ValueError, "not C-contiguous"),
    ],
)
def test_bad_arrays_are_rejected_before_sending(initialized, bad, exc, match):
    with pytest.raises(exc, match=match):
        hvd.allreduce(bad)


class DeviceArray:
    """Stands for a CuPy array: a class called ndarray with the CUDA array interface."""

    __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (4096, False), "version": 3}


DeviceArray.__qualname__ = "ndarray"


def test_a_device_array_is_refused_naming_its_type_and_where_its_memory_is(initialized):
    with pytest.raises(
        TypeError,
        match=r"allreduce expects a numpy.ndarray or a cupy.ndarray, got "
        r"test_api\.ndarray: its memory is on a CUDA device, and "
        r"of device arrays this call takes CuPy's only",
    ):
        hvd.allreduce(DeviceArray())
    with pytest.raises(
        TypeError,
        match=r"broadcast expects a numpy.ndarray or a cupy.ndarray, got "
        r"test_api\.ndarray: its memory is on a CUDA device",
    ):
        hvd.broadcast(DeviceArray(), root_rank=0)
    with pytest.raises(
        TypeError,
        match=r"allgather expects a numpy.ndarray, got test_api\.ndarray: "
        r"its memory is on a CUDA device, and this call takes "
        r"host memory \(of the numpy API's calls, allreduce and "
        r"broadcast take CuPy arrays\)",
    ):
        hvd.allgather(DeviceArray())


class CupyLike:
    """Stands for a CuPy array as the numpy API sees one (its module is cupy's): the C core
    decides whether it can take the memory."""

    __module__ = "cupy._core.core"
    dtype = np.dtype(np.float32)
    shape = (3,)
    ndim = 1
    strides = (4,)

    class flags:
        c_contiguous = True

    __cuda_array_interface__ = {
        "shape": (3,),
        "typestr": "<f4",
        "data": (4096, False),
        "version": 3,
        "stream": 1,
    }


def test_a_cupy_array_reaches_the_core_which_refuses_it_in_a_build_without_cuda(initialized):
    if hvd.build_info()["cuda"]:
        pytest.skip("this build has CUDA: tests/parallel/test_cuda_engine.py runs CuPy arrays")
    # in place only: an out-of-place call first makes its output with CuPy, not installed here
    for call in (
        lambda: hvd.allreduce_(CupyLike(), name="cupy.ar_", op=hvd.Sum),
        lambda: hvd.grouped_allreduce_([CupyLike()], name="cupy.gar_", op=hvd.Sum),
        lambda: hvd.broadcast_(CupyLike(), 0, name="cupy.bc"),
    ):
        with pytest.raises(
            ValueError,
            match=r"sendbuf is in CUDA memory \(device -1\): this "
            r"hvd_lite was built without CUDA",
        ):
            call()
    with pytest.raises(
        TypeError,
        match=r"allgather expects a numpy.ndarray, got "
        r"cupy\._core\.core\.CupyLike",
    ):
        hvd.allgather(CupyLike())


class Unsure:
    """An interface that raises (torch's does, on a CUDA tensor that requires grad)."""

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("cannot say")


def test_an_object_whose_interface_raises_is_still_refused_with_a_type_error(initialized):
    with pytest.raises(TypeError, match=r"expects a numpy.ndarray or a cupy.ndarray, got test_api\.Unsure$"):
        hvd.allreduce(Unsure())
    with pytest.raises(TypeError, match=r"expects a numpy.ndarray or a cupy.ndarray, got list$"):
        hvd.allreduce([1.0])


def test_read_only_array_is_rejected_for_in_place_only(initialized):
    x = np.ones(4, np.float32)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        hvd.allreduce_(x)
    assert np.array_equal(hvd.allreduce(x), x)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"op": 42}, ValueError, "op 42 is not one of"),
        ({"op": "sum"}, ValueError, "is not one of"),
        ({"prescale_factor": "2"}, TypeError, "prescale_factor must be a real number"),
        ({"postscale_factor": None}, TypeError, "postscale_factor must be a real number"),
        ({"name": 7}, TypeError, "name must be a str or None"),
    ],
)
def test_bad_arguments_are_rejected(initialized, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        hvd.allreduce(np.ones(3, np.float32), **kwargs)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_scale_factors_apply_before_and_after(initialized, dtype):
    x = np.array([1, 2, 4, 8], dtype=dtype)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert np.array_equal(y, x)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=4.0)
    assert np.array_equal(y, (x.astype(np.float64) * 4).astype(dtype))


def test_scale_factors_on_integer_arrays_scale_in_float64_and_truncate(initialized):
    x = np.array([3, -3, 7, 100], np.int32)
    assert hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5).tolist() == [1, -1, 3, 50]
    assert hvd.allreduce(x, op=hvd.Sum, postscale_factor=2.9).tolist() == [8, -8, 20, 290]
    assert hvd.allreduce(x, op=hvd.Sum, prescale_factor=1.0).tolist() == x.tolist()


def test_zero_d_and_empty_arrays(initialized):
    s = np.array(3.5, np.float32)
    out = hvd.allreduce(s)
    assert out.shape == () and out == 3.5
    e = np.zeros((0, 5), np.float64)
    assert hvd.allreduce(e).shape == (0, 5)


def test_init_rejects_bad_comm_arguments():
    with pytest.raises(TypeError, match="takes None, an mpi4py communicator or a list of ranks"):
        hvd.init(comm="world")
    with pytest.raises(ValueError, match="without duplicates"):
        hvd.init(comm=[0, 0])
    with pytest.raises(ValueError, match="out of range"):
        hvd.init(comm=[0, 5])
    assert not hvd.is_initialized()


@pytest.mark.parametrize(
    "var,value",
    [
        ("HVD_LITE_FUSION_THRESHOLD", "-1"),
        ("HVD_LITE_FUSION_THRESHOLD", "4M"),
        ("HVD_LITE_CYCLE_TIME", "fast"),
        ("HVD_LITE_STALL_CHECK_TIME_SECONDS", "-5"),
        ("HVD_LITE_BATCH_TIME", "-1"),
        ("HVD_LITE_NOTIFY_TIME", "1e9"),
        ("HVD_LITE_SEGMENT_BYTES", "0"),
        ("HVD_LITE_LOG_LEVEL", "loud"),
        ("HVD_LITE_SMALL_ALLREDUCE_BYTES", str(1 << 40)),
        ("HVD_LITE_AUTOTUNE", "yes"),
        ("HVD_LITE_AUTOTUNE", "2"),
        ("HVD_LITE_AUTOTUNE_WARMUP_SAMPLES", "-1"),
        ("HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE", "0"),
        ("HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE", "10x"),
        ("HVD_LITE_ALLREDUCE_ALGO", "binary_tree"),
        ("HVD_LITE_ALLGATHER_ALGO", "tree"),
        ("HVD_LITE_ALLTOALL_ALGO", "ring"),
    ],
)
def test_bad_knob_values_are_named_at_init(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=f"{var}={value} is not valid"):
        hvd.init()
    assert not hvd.is_initialized()


def test_log_level_info_prints_the_configuration(capfd, monkeypatch):
    monkeypatch.setenv("HVD_LITE_LOG_LEVEL", "info")
    monkeypatch.setenv("HVD_LITE_FUSION_THRESHOLD", "12345")
    hvd.init()
    hvd.shutdown()
    assert "fusion threshold 12345 B" in capfd.readouterr().err


@pytest.mark.parametrize(
    "var,value",
    [
        ("HVD_LITE_AUTOTUNE_LOG", "tune.csv"),
        ("HVD_LITE_AUTOTUNE_WARMUP_SAMPLES", "2"),
        ("HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE", "5"),
    ],
)
def test_autotune_knobs_without_autotune_are_refused(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    monkeypatch.setenv("HVD_LITE_AUTOTUNE", "0")
    with pytest.raises(ValueError, match=f"{var} is set but HVD_LITE_AUTOTUNE is not 1"):
        hvd.init()
    assert not hvd.is_initialized()


def test_an_autotune_log_that_cannot_be_created_is_named_at_init(monkeypatch, tmp_path):
    path = tmp_path / "missing" / "tune.csv"
    monkeypatch.setenv("HVD_LITE_AUTOTUNE", "1")
    monkeypatch.setenv("HVD_LITE_AUTOTUNE_LOG", str(path))
    with pytest.raises(ValueError, match=f"HVD_LITE_AUTOTUNE_LOG={path}: cannot create the file"):
        hvd.init()
    assert not hvd.is_initialized()


def test_autotune_keeps_the_knobs_the_user_set_and_says_what_it_tunes(capfd, monkeypatch):
    monkeypatch.setenv("HVD_LITE_LOG_LEVEL", "info")
    monkeypatch.setenv("HVD_LITE_AUTOTUNE", "1")
    monkeypatch.setenv("HVD_LITE_FUSION_THRESHOLD", "12345")
    monkeypatch.setenv("HVD_LITE_CYCLE_TIME", "0")
    hvd.init()
    try:
        state = hvd.basics._engine().autotune()
    finally:
        hvd.shutdown()
    # fusion (6 values) and cycle time (3) are set: 1 + (4 - 1) segment sizes + (5 - 1) batch times
    assert (
        "autotune: tuning segment size, batch time in 8 samples of 10 steps (6 more to confirm a "
        "change), after 3 warm-up samples" in capfd.readouterr().err
    )
    assert state["fusion_threshold"] == 12345 and state["cycle_time_ms"] == 0.0
    assert state["segment_bytes"] == 262144 and state["batch_time_ms"] == 1.0
    assert not state["settled"] and state["samples"] == 0


def test_automatic_names_restart_at_init():
    from hvd_lite import basics

    hvd.init()
    first = [basics.auto_name("allreduce") for _ in range(3)]
    hvd.shutdown()
    hvd.init()
    assert basics.auto_name("allreduce") == first[0] == "allreduce.noname.0"
    hvd.shutdown()
