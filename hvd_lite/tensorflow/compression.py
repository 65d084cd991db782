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
        """Whether the tf dtype is a floating-point one."""
        return dtype.is_floating

    @staticmethod
    def cast(tensor, dtype):
        """`tf.cast(tensor, dtype)`."""
        return tf.cast(tensor, dtype)


class Compression:
    """The compressors, by Horovod's names."""

    none = NoneCompressor
    """No compression."""
    fp16 = FP16Compressor
    """Floating-point tensors sent as float16."""


def called_back(compression):
    """(compress, decompress) of `compression`, as hvd_lite's collectives call them. While a graph
    traces, a compressor of the user's own goes through AutoGraph (TF's tf_convert, its way for a
    library to call user code), converted with everything it calls, as Horovod's Python, which
    AutoGraph converts, calls it: a Python `if` on a tensor in it works although hvd_lite's entry
    points are not converted themselves (mpi_ops.graph_safe). Unlike Horovod's, it is converted
    under tf.function(autograph=False) and in Keras's train step too, which changes nothing for
    code that traces without AutoGraph. One AutoGraph cannot convert runs as written, with
    AutoGraph's own warning. hvd_lite's compressors, and any compressor eagerly, are called as
    they are."""
    if compression in (Compression.none, Compression.fp16) or not tf.inside_function():
        return compression.compress, compression.decompress
    return _converted(compression.compress), _converted(compression.decompress)


# AutoGraph's status where nobody has set one (taken at import, outside any graph): under it, the
# function tf_convert wraps is converted, and so is every call it makes.
_UNSPECIFIED = tf.__internal__.autograph.control_status_ctx()


def _converted(fn):
    return tf.__internal__.autograph.tf_convert(fn, _UNSPECIFIED, convert_by_default=True)


__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]
