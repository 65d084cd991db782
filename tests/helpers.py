"""Test helpers shared by the unit and parallel suites (no MPI here)."""
import ml_dtypes
import numpy as np

ALL_DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16,
              np.float32, np.float64, ml_dtypes.bfloat16]
INT_DTYPES = ALL_DTYPES[:6]
FLOAT16ISH = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def is_int(dtype) -> bool:
    return np.dtype(dtype).kind in "iu"


def exact_inputs(dtype, count: int, rank: int, seed: int = 0) -> np.ndarray:
    """Values whose sum, product, min and max over up to 4 ranks are exact in any order.

    Small integers times small powers of two: sums of 4 stay within 32 (exact
    even in bfloat16), products of 4 within 256.
    """
    rng = np.random.default_rng(seed * 1000 + rank)
    ints = rng.integers(-4, 5, size=count)
    dt = np.dtype(dtype)
    if dt.kind == "u":
        ints = np.abs(ints)
    if dt.kind == "f" or dt in FLOAT16ISH:
        ints = ints * (2.0 ** rng.integers(0, 2, size=count))
    return ints.astype(dt)


def fold(values, op: str, dtype):
    """Reference reduction of a list of arrays in list order, with the C core's rules."""
    dt = np.dtype(dtype)
    if is_int(dt):
        acc = values[0].copy()
        for v in values[1:]:
            if op in ("sum", "avg"):
                acc = (acc + v).astype(dt)  # numpy integer arrays wrap
            elif op == "prod":
                acc = (acc * v).astype(dt)
            elif op == "max":
                acc = np.maximum(acc, v)
            elif op == "min":
                acc = np.minimum(acc, v)
        if op == "avg":
            n = len(values)
            acc = np.array([int(x) // n if int(x) >= 0 else -((-int(x)) // n) for x in acc.tolist()],
                           dtype=object).astype(dt)
        return acc
    # Floats: exact inputs make the float64 result exact; round once to dtype.
    wide = [v.astype(np.float64) for v in values]
    acc = wide[0].copy()
    for v in wide[1:]:
        if op in ("sum", "avg"):
            acc = acc + v
        elif op == "prod":
            acc = acc * v
        elif op == "max":
            acc = np.fmax(acc, v)
        elif op == "min":
            acc = np.fmin(acc, v)
    if op == "avg":
        acc = acc / len(values)
    return acc.astype(dt)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
