"""Test helpers shared by the unit and parallel suites (no MPI here)."""

import ml_dtypes
import numpy as np

# Every dtype the reductions take (bool aside, every one hvd_lite takes).
ALL_DTYPES = [
    np.int8,
    np.uint8,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    ml_dtypes.bfloat16,
    np.int16,
    np.uint16,
]
# ... and the ones only allgather, broadcast and alltoall take.
MOVE_DTYPES = ALL_DTYPES + [np.bool_]
FLOAT16ISH = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def is_int(dtype) -> bool:
    return np.dtype(dtype).kind in "iu"


INT_DTYPES = [d for d in ALL_DTYPES if is_int(d)]


def exact_inputs(dtype, count: int, rank: int, seed: int = 0) -> np.ndarray:
    """Values whose sum, product, min and max over up to 4 ranks are exact in any order.

    Small integers times small powers of two: sums of 4 stay within 32 (exact
    even in bfloat16), products of 4 within 256. A new array each call (the draws
    are kept: tests ask for every rank's inputs again and again, and drawing them
    took 6 % of a parallel pass).
    """
    ints, exps = _exact_draws(count, rank, seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return ints > 0
    if dt.kind == "u":
        ints = np.abs(ints)
    if dt.kind == "f" or dt in FLOAT16ISH:
        return np.ldexp(ints.astype(np.float64), exps).astype(dt)  # ints * 2**exps, exactly
    return ints.astype(dt)


_DRAWS: "dict[tuple, tuple]" = {}
_DRAWS_MAX_ELEMENTS = 1 << 24  # 2 bytes each: 32 MiB at most per process


def _exact_draws(count: int, rank: int, seed: int):
    """exact_inputs' random integers in -4..4 and exponents in 0..1 (int8, read-only)."""
    key = (count, rank, seed)
    got = _DRAWS.get(key)
    if got is None:
        rng = np.random.default_rng(seed * 1000 + rank)
        ints = rng.integers(-4, 5, size=count).astype(np.int8)
        exps = rng.integers(0, 2, size=count).astype(np.int8)
        ints.flags.writeable = exps.flags.writeable = False
        if sum(a.size for a, _ in _DRAWS.values()) + count > _DRAWS_MAX_ELEMENTS:
            _DRAWS.clear()
        got = _DRAWS[key] = (ints, exps)
    return got


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
        if op == "avg":  # truncated toward zero: floor, then up by one where that dropped a rest
            n = len(values)
            acc = (acc // n + ((acc % n != 0) & (acc < 0))).astype(dt)
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


def horovod_scale(values: np.ndarray, factor: float) -> np.ndarray:
    """An integer array scaled as Horovod scales it: the product in float64, truncated toward
    zero. Where Horovod's result is undefined, hvd_lite's rule: out of range clamps, NaN is 0."""
    dt = values.dtype
    info = np.iinfo(dt)
    lo, hi = float(info.min), float(int(info.max) + 1)  # both exact in a double
    with np.errstate(invalid="ignore"):
        p = np.float64(factor) * values.astype(np.float64)
    out = np.zeros(values.shape, dt)
    fits = (p >= lo) & (p < hi)
    out[fits] = np.trunc(p[fits]).astype(dt)
    out[p >= hi] = info.max
    out[p < lo] = info.min
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ---- Adasum (csrc/hvdl.h's hvdlAdasum), written from the paper's formula ---------------------

ADASUM_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b in float64; a coefficient is 1 where its
    squared norm is below sqrt(DBL_MIN) (Horovod's rule: a zero vector is left out)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    tiny = np.sqrt(np.finfo(np.float64).tiny)
    ca = 1.0 - dot / aa * 0.5 if aa >= tiny else 1.0
    cb = 1.0 - dot / bb * 0.5 if bb >= tiny else 1.0
    return ca * a + cb * b


def adasum_tree(vectors) -> np.ndarray:
    """Adasum of the ranks' vectors (in rank order) over transport.h's tree: pairs (2i, 2i+1) for
    i < n - p first (p the largest power of two <= n), then aligned pairs, lower on the left."""
    n = len(vectors)
    p = 1
    while p * 2 <= n:
        p *= 2
    rem = n - p
    level = [
        adasum_pair(vectors[2 * v], vectors[2 * v + 1]) if v < rem else vectors[v + rem].astype(np.float64)
        for v in range(p)
    ]
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def adasum_reference(vectors, counts=None) -> np.ndarray:
    """adasum_tree of each tensor on its own, for buffers holding tensors of `counts` elements one
    after another (None: one tensor), in float64."""
    counts = [len(vectors[0])] if counts is None else counts
    out, at = [], 0
    for c in counts:
        out.append(adasum_tree([v[at : at + c] for v in vectors]))
        at += c
    return np.concatenate(out) if out else np.zeros(0)


# ---- device buffers (the CUDA tests; CuPy is imported where a test asks for it) ----------------


def random_bits(dtype, n, seed):
    """Every bit pattern of the type: NaNs, infinities, subnormals and wrapping integers."""
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt)


def same_or_both_nan(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bits, where a NaN result may differ in its payload (the device's arithmetic makes
    the canonical NaN, the host's keeps an operand's): the positions of NaNs must agree."""
    if got.dtype.kind in "iu":
        return same_bits(got, want)
    with np.errstate(invalid="ignore"):  # bfloat16's NaNs cast with a warning
        g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    return bool(np.array_equal(np.isnan(g), nan)) and same_bits(got[~nan], want[~nan])


def to_device(a: np.ndarray):
    """A CuPy array with a's bytes (16-bit floats as uint16: CuPy has no bfloat16)."""
    import cupy

    return cupy.asarray(a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize == 2 else a)
