"""Gradient compression for allreduce: horovod.torch's Compression.none and Compression.fp16 (the
logic is hvd_lite/_compression.py's; this module says how torch casts)."""

import torch

from .._compression import Compressor, NoneCompressor
from .._compression import FP16Compressor as _FP16Compressor


class FP16Compressor(_FP16Compressor):
    """Sends floating-point tensors as float16 and casts the result back to their dtype."""

    float16 = torch.float16

    @staticmethod
    def is_floating(dtype) -> bool:
        """Whether the torch dtype is a floating-point one."""
        return dtype.is_floating_point

    @staticmethod
    def cast(tensor, dtype):
        """`tensor.to(dtype)`."""
        return tensor.to(dtype)


class Compression:
    """The compressors, by horovod.torch's names."""

    none = NoneCompressor
    """No compression."""
    fp16 = FP16Compressor
    """Floating-point tensors sent as float16."""


__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]
