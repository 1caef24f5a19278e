"""Gradient compression, as Horovod's ``horovod.torch.compression``."""

from __future__ import annotations

import torch

from ..compression import Compressor, NoneCompressor, compression_for

Compression = compression_for(
    lambda t: t.dtype.is_floating_point, lambda t, dtype: t.to(dtype), torch.float16
)
FP16Compressor = Compression.fp16

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
