"""Inputs whose reduction is exact in any order, and the expected results.

Rank r's element i is K[(i + 3r) % P] * 2**E[i % P] for tables K and E of
period P chosen per op: small integers times powers of two for Sum/Avg/Min/Max
(every partial sum of up to ~16 ranks fits even bfloat16's 8-bit significand),
±1, ±2, ±0.5 for Prod. Integer types use the same small integers and wrap the
way the C kernels do, so numpy's wrapped arithmetic gives the expected value.
Because inputs and results repeat with period P, a buffer of any length is
checked against a P-element pattern without materialising the full answer.
"""

import numpy as np

PERIOD = 64
_SHIFT = 3  # rank r reads the K table 3r places further on


def _tables(dtype: np.dtype, op: str):
    j = np.arange(PERIOD)
    if op == "prod":
        if dtype.kind == "u":
            k = np.array([1, 2, 3])[(j * 5) % 3]
        elif dtype.kind == "i":
            k = np.array([1, -1, 2, -2, 3, -3])[(j * 5) % 6]
        else:
            k = np.array([1, -1, 2, -2, 0.5, -0.5])[(j * 5) % 6]
        return k.astype(np.float64), np.zeros(PERIOD)
    k = ((j * 5) % 17).astype(np.float64)  # 0..16
    if dtype.kind != "u":
        k -= 8  # -8..8
    e = ((j * 3) % 5 - 2).astype(np.float64) if dtype.kind not in "iu" else np.zeros(PERIOD)
    return k, e


def rank_pattern(dtype: np.dtype, op: str, rank: int) -> np.ndarray:
    """The P elements rank `rank` repeats as its input."""
    k, e = _tables(dtype, op)
    shifted = np.roll(k, -_SHIFT * rank)
    return (shifted * np.exp2(e)).astype(dtype)


def expected_pattern(dtype: np.dtype, op: str, nranks: int) -> np.ndarray:
    """The P elements of the correct result: ranks combined in rank order (Avg: sum / n)."""
    base = "sum" if op == "avg" else op
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[base]
    if dtype.kind in "iu":
        acc = rank_pattern(dtype, base, 0)
        for r in range(1, nranks):
            acc = ufunc(acc, rank_pattern(dtype, base, r))  # wraps in the dtype, as C does
    else:  # exact in float64, so the cast back is exact too
        acc = rank_pattern(dtype, base, 0).astype(np.float64)
        for r in range(1, nranks):
            acc = ufunc(acc, rank_pattern(dtype, base, r).astype(np.float64))
        acc = acc.astype(dtype)
    if op != "avg":
        return acc
    if dtype.kind == "i":  # one truncating division of the wrapped sum
        s = acc.astype(np.int64)
        return np.where(s < 0, -((-s) // nranks), s // nranks).astype(dtype)
    if dtype.kind == "u":
        return (acc // dtype.type(nranks)).astype(dtype)
    if dtype == np.float64:
        return acc / np.float64(nranks)
    # float32, and float16/bfloat16 computed in float32 and rounded once
    return (acc.astype(np.float32) / np.float32(nranks)).astype(dtype)


def fill(buf: np.ndarray, pattern: np.ndarray) -> None:
    """Writes the periodic pattern over the whole 1-D buffer."""
    full = (buf.size // PERIOD) * PERIOD
    buf[:full].reshape(-1, PERIOD)[:] = pattern
    buf[full:] = pattern[: buf.size - full]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def count_wrong(result: np.ndarray, pattern: np.ndarray) -> int:
    """Elements of the 1-D result whose bits differ from the periodic pattern's."""
    r, p = _bits(result.reshape(-1)), _bits(pattern)
    full = (r.size // PERIOD) * PERIOD
    wrong = int(np.count_nonzero(r[:full].reshape(-1, PERIOD) != p))
    return wrong + int(np.count_nonzero(r[full:] != p[: r.size - full]))
