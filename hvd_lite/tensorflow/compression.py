"""Gradient compression for allreduce: horovod.tensorflow's Compression.none and .fp16 (the logic
is hvd_lite/_compression.py's; this module says how TensorFlow casts)."""
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


__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]
