"""Gradient compression for the framework adapters' allreduce, written once: Horovod's
Compression.none and Compression.fp16. Each adapter's compression.py says how its tensors are
cast; the logic here does not know the framework."""

from typing import Any, Tuple


class Compressor:
    """Turns a tensor into what is sent (compress) and the received result back (decompress)."""

    @staticmethod
    def compress(tensor) -> Tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx: Any):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and casts the result back to their dtype.

    A framework's subclass sets `float16` (its float16 dtype) and defines `is_floating(dtype)` and
    `cast(tensor, dtype)`."""

    float16: Any = None

    @staticmethod
    def is_floating(dtype) -> bool:
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        if cls.is_floating(tensor.dtype) and tensor.dtype != cls.float16:
            return cls.cast(tensor, cls.float16), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.cast(tensor, ctx)
