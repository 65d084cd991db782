"""Gradient compression for allreduce: horovod.tensorflow's Compression.none and .fp16 (the logic
is hvd_lite/_compression.py's; this module says how TensorFlow casts)."""
import warnings

import tensorflow as tf

from .._compression import Compressor, NoneCompressor
from .._compression import FP16Compressor as _FP16Compressor


class FP16Compressor(_FP16Compressor):
    """Sends floating-point tensors as float16 and casts the result back to their dtype."""

    float16 = tf.float16

    @staticmethod
    def is_floating(dtype) -> bool:
        return dtype.is_floating

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


class Compression:
    """The compressors, by Horovod's names."""

    none = NoneCompressor
    fp16 = FP16Compressor


def called_back(compression):
    """(compress, decompress) of `compression`, as hvd_lite's collectives call them. A compressor
    of the user's own, while a tf.function traces, goes through AutoGraph, as Horovod's Python
    code (which AutoGraph converts) calls it, so a Python `if` on a tensor in it works; hvd_lite's
    entry points are not converted themselves (mpi_ops.graph_safe). hvd_lite's compressors, and
    any compressor eagerly, are called as they are. One AutoGraph cannot convert (no source) runs
    as written, with a warning, as AutoGraph itself would run it."""
    if compression in (Compression.none, Compression.fp16) or not tf.inside_function():
        return compression.compress, compression.decompress
    return _converted(compression.compress), _converted(compression.decompress)


def _converted(fn):
    try:
        return tf.autograph.to_graph(fn)
    except Exception as exc:  # noqa: BLE001 - AutoGraph's own fallback, said out loud
        warnings.warn(f"AutoGraph could not convert the compressor's {fn.__name__} ({exc}); it "
                      "runs as written", stacklevel=3)
        return fn


__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]
