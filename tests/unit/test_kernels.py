"""The C reduction kernels against numpy references, one process, no MPI traffic."""

import ml_dtypes
import numpy as np
import pytest
from helpers import ALL_DTYPES, FLOAT16ISH, INT_DTYPES, horovod_scale

from hvd_lite import _core
from hvd_lite.ops import HVDL_DTYPES

OPS = {
    "sum": _core.hvdlSum,
    "prod": _core.hvdlProd,
    "max": _core.hvdlMax,
    "min": _core.hvdlMin,
    "avg": _core.hvdlAvg,
}


def kernel(a, b, op):
    """dst = a op b with the C kernel."""
    dst = np.empty_like(a)
    _core.reduce_local(dst.view(np.uint8), a.view(np.uint8), b.view(np.uint8), HVDL_DTYPES[a.dtype], OPS[op])
    return dst


def random_values(dtype, n, rng):
    dt = np.dtype(dtype)
    if dt.kind in "iu" or dt in FLOAT16ISH:
        # every bit pattern: full integer range, and for 16-bit floats subnormals, inf, nan
        return rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8).view(dt)
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, size=n)).astype(dt)


def reference(a, b, op):
    dt = a.dtype
    if dt.kind in "iu":
        return {"sum": a + b, "avg": a + b, "prod": a * b, "max": np.maximum(a, b), "min": np.minimum(a, b)}[
            op
        ].astype(dt)
    if op in ("max", "min"):
        # IEEE fmax/fmin (NaN loses), keeping the chosen operand's bits
        x, y = a.astype(np.float32), b.astype(np.float32)
        pick_a = (x > y if op == "max" else x < y) | np.isnan(y)
        return np.where(pick_a, a, b)
    if dt in FLOAT16ISH:
        x, y = a.astype(np.float32), b.astype(np.float32)
        with np.errstate(all="ignore"):
            wide = x + y if op in ("sum", "avg") else x * y
            return wide.astype(dt)  # one round to nearest-even per binary op
    with np.errstate(all="ignore"):
        return a + b if op in ("sum", "avg") else a * b


def assert_same(got, want):
    """Equal bit patterns, except that any NaN matches any NaN."""
    g = got.view(np.dtype(f"u{got.dtype.itemsize}"))
    w = want.view(np.dtype(f"u{want.dtype.itemsize}"))
    if got.dtype.kind == "f" or got.dtype in FLOAT16ISH:
        nan_g = np.isnan(got.astype(np.float64))
        nan_w = np.isnan(want.astype(np.float64))
        assert np.array_equal(nan_g, nan_w), "NaN positions differ"
        g, w = g[~nan_g], w[~nan_w]
    bad = np.nonzero(g != w)[0]
    assert bad.size == 0, (
        f"{bad.size} elements differ, first at {bad[:5]}: got {g[bad[:5]]}, want {w[bad[:5]]}"
    )


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_kernel_matches_numpy_reference(dtype, op):
    rng = np.random.default_rng(7)
    for n in (0, 1, 3, 17, 1000, 4099):
        a, b = random_values(dtype, n, rng), random_values(dtype, n, rng)
        assert_same(kernel(a, b, op), reference(a, b, op))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_16bit_floats_round_to_nearest_even_over_every_bit_pattern(dtype, op):
    a = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(dtype)
    rng = np.random.default_rng(1)
    for b in (random_values(dtype, 65536, rng), np.roll(a, 12345)):
        assert_same(kernel(a, b, op), reference(a, b, op))


def test_float16_ties_round_to_even():
    one = np.float16(1.0)
    ulp = np.float16(np.finfo(np.float16).eps)  # 2^-10
    half_ulp = np.float16(ulp / 2)
    # 1 + 2^-11 is a tie between 1 and 1+2^-10: even mantissa (1) wins
    got = kernel(np.array([one], np.float16), np.array([half_ulp], np.float16), "sum")
    assert got[0] == one
    # (1 + 2^-10) + 2^-11 ties between 1+2^-10 (odd) and 1+2^-9 (even): rounds up
    got = kernel(np.array([one + ulp], np.float16), np.array([half_ulp], np.float16), "sum")
    assert got[0] == np.float16(1.0 + 2 * float(ulp))


@pytest.mark.parametrize(
    "dtype,a,b,want",
    [
        (np.int8, 127, 1, -128),
        (np.uint8, 255, 1, 0),
        (np.int32, 2**31 - 1, 1, -(2**31)),
        (np.uint32, 2**32 - 1, 2, 1),
        (np.int64, 2**63 - 1, 1, -(2**63)),
        (np.uint64, 2**64 - 1, 1, 0),
        (np.int16, 2**15 - 1, 1, -(2**15)),
        (np.uint16, 2**16 - 1, 1, 0),
    ],
)
def test_integer_sum_wraps(dtype, a, b, want):
    got = kernel(np.array([a], dtype), np.array([b], dtype), "sum")
    assert got[0] == np.array([want], dtype)[0]


def test_integer_prod_wraps():
    got = kernel(np.array([100, -128], np.int8), np.array([3, -1], np.int8), "prod")
    assert got.tolist() == [44, -128]  # 300 mod 256; -128 * -1 wraps to -128


def test_float_max_min_ignore_nan_like_fmax():
    nan = np.nan
    a = np.array([nan, 1.0, nan, 2.0], np.float32)
    b = np.array([1.0, nan, nan, 3.0], np.float32)
    assert kernel(a, b, "max")[[0, 1, 3]].tolist() == [1.0, 1.0, 3.0]
    assert kernel(a, b, "min")[[0, 1, 3]].tolist() == [1.0, 1.0, 2.0]
    assert np.isnan(kernel(a, b, "max")[2])


def divide(values, n):
    out = values.copy()
    _core.divide_local(out.view(np.uint8), HVDL_DTYPES[out.dtype], n)
    return out


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_avg_division_truncates_toward_zero(dtype):
    info = np.iinfo(dtype)
    candidates = [int(info.min), int(info.min) + 1, -7, -1, 0, 1, 7, int(info.max) - 1, int(info.max)]
    values = np.array([v for v in candidates if info.min <= v <= info.max], dtype=dtype)
    for n in (2, 3, 4):
        want = [int(v) // n if int(v) >= 0 else -((-int(v)) // n) for v in values.tolist()]
        assert divide(values, n).tolist() == want


@pytest.mark.parametrize(
    "dtype",
    [np.float16, np.float32, np.float64, ml_dtypes.bfloat16],
    ids=["float16", "float32", "float64", "bfloat16"],
)
def test_float_avg_division_is_correctly_rounded(dtype):
    rng = np.random.default_rng(3)
    values = random_values(dtype, 5000, rng)
    for n in (2, 3, 7):
        with np.errstate(all="ignore"):
            if np.dtype(dtype) in FLOAT16ISH:
                want = (values.astype(np.float32) / np.float32(n)).astype(dtype)
            else:
                want = values / np.array(n, dtype)
        assert_same(divide(values, n), want)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_misaligned_buffers_reduce_correctly(dtype):
    dt = np.dtype(dtype)
    rng = np.random.default_rng(5)
    n = 5000  # more than one 4 KiB bounce block
    a, b = random_values(dt, n, rng), random_values(dt, n, rng)
    raw = [bytearray(n * dt.itemsize + 1) for _ in range(3)]
    ma, mb, md = (np.frombuffer(r, dtype=dt, count=n, offset=1) for r in raw)
    ma[...] = a
    mb[...] = b
    assert not ma.flags.aligned or dt.itemsize == 1
    _core.reduce_local(md.view(np.uint8), ma.view(np.uint8), mb.view(np.uint8), HVDL_DTYPES[dt], OPS["sum"])
    assert_same(md, reference(a, b, "sum"))
    want = divide(md.copy(), 3)
    _core.divide_local(md.view(np.uint8), HVDL_DTYPES[dt], 3)
    assert_same(md, want)


def test_in_place_kernel_calls_alias_safely():
    rng = np.random.default_rng(9)
    a, b = random_values(np.float32, 10001, rng), random_values(np.float32, 10001, rng)
    want = reference(a, b, "sum")
    x = b.copy()
    _core.reduce_local(x.view(np.uint8), a.view(np.uint8), x.view(np.uint8), _core.hvdlFloat32, _core.hvdlSum)
    assert_same(x, want)
    y = a.copy()
    _core.reduce_local(y.view(np.uint8), y.view(np.uint8), b.view(np.uint8), _core.hvdlFloat32, _core.hvdlSum)
    assert_same(y, want)


def scale(values, factor):
    out = np.empty_like(values)
    _core.scale_local(out.view(np.uint8), values.view(np.uint8), HVDL_DTYPES[values.dtype], factor)
    return out


FACTORS = [0.5, -0.5, 1 / 3, 2.5, -1.75, 1e-3, 3.0, 1e10, -1e10, 2.0**-60, np.nan, np.inf, -np.inf]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_scaling_is_horovods_float64_product_truncated_toward_zero(dtype):
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    edges = np.array([info.min, info.min + 1, -7, -3, -1, 0, 1, 3, 7, info.max - 1, info.max], dtype=object)
    values = np.concatenate(
        [
            random_values(dtype, 4099, rng),
            edges[[info.min <= int(v) <= info.max for v in edges]].astype(dtype),
        ]
    )
    for f in FACTORS:
        got = scale(values, f)
        want = horovod_scale(values, f)
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, f"factor {f}: {values[bad[:4]]} -> {got[bad[:4]]}, want {want[bad[:4]]}"


def test_integer_scaling_truncates_clamps_and_maps_nan_to_zero():
    x = np.array([7, -7, 100, -100], np.int8)
    assert scale(x, 0.5).tolist() == [3, -3, 50, -50]  # toward zero, not floor
    assert scale(x, 2.0).tolist() == [14, -14, 127, -128]  # clamped, not wrapped
    assert scale(x, np.nan).tolist() == [0, 0, 0, 0]
    assert scale(np.array([5, 200], np.uint8), -1.0).tolist() == [0, 0]
    big = np.array([2**53 + 1], np.int64)  # rounds to 2**53 in float64, as in Horovod
    assert scale(big, 3.0).tolist() == [3 * 2**53]
    assert scale(np.array([2**62], np.int64), 4.0).tolist() == [2**63 - 1]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_misaligned_integer_scaling(dtype):
    dt = np.dtype(dtype)
    values = random_values(dt, 5000, np.random.default_rng(4))
    raw = [bytearray(values.nbytes + 1) for _ in range(2)]
    src, dst = (np.frombuffer(r, dtype=dt, count=values.size, offset=1) for r in raw)
    src[...] = values
    _core.scale_local(dst.view(np.uint8), src.view(np.uint8), HVDL_DTYPES[dt], -2.5)
    assert np.array_equal(dst, horovod_scale(values, -2.5))


@pytest.mark.parametrize(
    "call",
    [
        lambda b: _core.reduce_local(b, b, b, _core.hvdlBool, _core.hvdlSum),
        lambda b: _core.divide_local(b, _core.hvdlBool, 2),
        lambda b: _core.scale_local(b, b, _core.hvdlBool, 2.0),
    ],
    ids=["reduce", "divide", "scale"],
)
def test_bool_has_no_kernels(call):
    with pytest.raises(ValueError, match="bool data has no reduction ops"):
        call(np.zeros(4, np.uint8))


@pytest.mark.parametrize("dtype", [10, 31, 35, -1])
def test_numbers_between_and_beyond_the_type_ranges_are_no_types(dtype):
    with pytest.raises(ValueError, match=f"invalid hvdl datatype {dtype}"):
        _core.reduce_local(
            np.zeros(4, np.uint8), np.zeros(4, np.uint8), np.zeros(4, np.uint8), dtype, _core.hvdlSum
        )


@pytest.mark.parametrize("nbytes", [1, 2048, 2049, 4096, 10_000, 65_536, 65_536 + 7])
def test_a_copy_gives_the_bytes_at_every_distance_between_its_buffers(nbytes):
    """hvdl_copy (through hvdl_scale with factor 1, the fusion copies' route) copies in 2 KiB
    pieces where the destination lies 1-31 bytes past the source modulo 4 KiB (errors.c): the
    bytes must be the same whichever way it went, for sizes on each side of a piece and whole
    pieces; and overlapping buffers move as memmove moves them."""
    rng = np.random.default_rng(nbytes)
    page = 4096
    src_mem = np.zeros(nbytes + 2 * page, np.uint8)
    dst_mem = np.zeros(nbytes + 3 * page, np.uint8)
    s0 = (-src_mem.ctypes.data) % page
    d0 = (-dst_mem.ctypes.data) % page
    for ahead in (0, 1, 16, 31, 32, 63, 64, 4095):
        src_mem[:] = rng.integers(1, 256, src_mem.size, dtype=np.uint8)  # a copy past the end shows
        src = src_mem[s0 : s0 + nbytes]
        dst_mem[:] = 0
        dst = dst_mem[d0 + ahead : d0 + ahead + nbytes]
        _core.scale_local(dst, src, HVDL_DTYPES[np.dtype(np.uint8)], 1.0)
        assert np.array_equal(dst, src), ahead
        assert not dst_mem[: d0 + ahead].any() and not dst_mem[d0 + ahead + nbytes :].any(), ahead
    for shift in (-17, 17):  # overlapping: forwards and backwards, 17 bytes apart
        mem = rng.integers(0, 256, nbytes + 64, dtype=np.uint8)
        want = mem.copy()
        a, b = 32 + shift, 32
        want[a : a + nbytes] = mem[b : b + nbytes]
        _core.scale_local(mem[a : a + nbytes], mem[b : b + nbytes], HVDL_DTYPES[np.dtype(np.uint8)], 1.0)
        assert np.array_equal(mem, want), shift
