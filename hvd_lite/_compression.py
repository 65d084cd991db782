"""Gradient compression for the framework adapters' allreduce, written once: Horovod's
Compression.none and Compression.fp16. Each adapter's compression.py says how its tensors are
cast; the logic here does not know the framework."""

from typing import Any, Tuple


class Compressor:
    """Turns a tensor into what is sent (compress) and the received result back (decompress)."""

    @staticmethod
    def compress(tensor) -> Tuple[Any, Any]:
        """(what to send, the context decompress needs)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx: Any):
        """The received tensor as the caller's result."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor):
        """(tensor, None): the tensor as it is."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """The tensor as it is."""
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and casts the result back to their dtype.

    A framework's subclass sets `float16` (its float16 dtype) and defines `is_floating(dtype)` and
    `cast(tensor, dtype)`."""

    float16: Any = None

    @staticmethod
    def is_floating(dtype) -> bool:
        """Whether `dtype` is a floating-point type (defined by the framework's subclass)."""
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        """`tensor` cast to `dtype` (defined by the framework's subclass)."""
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        """(the tensor as float16, its dtype) for a floating-point tensor; (tensor, None) otherwise."""
        if cls.is_floating(tensor.dtype) and tensor.dtype != cls.float16:
            return cls.cast(tensor, cls.float16), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        """The tensor cast back to its dtype (`ctx`), if compress cast it."""
        return tensor if ctx is None else cls.cast(tensor, ctx)
