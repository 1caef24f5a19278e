"""Gradient compression (Horovod's ``Compression.none`` / ``Compression.fp16``), once for
every framework: the classes are the same, only "is it a float tensor" and "cast it" differ,
so each framework module builds its ``Compression`` from those two functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar


class Compressor:
    """Compress a tensor before communication and restore it after."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class CompressionNamespace:
    """What a framework's ``Compression`` holds (Horovod's two compressors), declared so
    ``hvd.Compression.fp16`` is known to type checkers."""

    none: ClassVar[type[Compressor]] = NoneCompressor
    fp16: ClassVar[type[Compressor]]  # each framework's own (``compression_for``)


def compression_for(
    is_float: Callable[[Any], bool], cast: Callable[[Any, Any], Any], half: Any
) -> type[CompressionNamespace]:
    """A ``Compression`` namespace whose fp16 compressor sends floating-point tensors (other
    than ``half`` ones) as ``half`` and casts them back to their dtype afterwards."""

    class FP16Compressor(Compressor):
        """Floating-point tensors travel as float16 (half the bytes); others untouched."""

        @staticmethod
        def compress(tensor):
            if is_float(tensor) and tensor.dtype != half:
                return cast(tensor, half), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else cast(tensor, ctx)

    class Compression(CompressionNamespace):
        fp16 = FP16Compressor

    return Compression
