"""Flat byte views of the buffers a message is made of, without copies.

Why its own module: the wire format (wire.py), the MACs (integrity.py), the stream
framing (stream.py) and the transports all hand tensors around as buffers and need
the same one-dimensional byte view of them; the view must never copy a payload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import PSConfigError

if TYPE_CHECKING:  # aliases are strings: job processes may run in Python 3.7/3.8
    from typing import TypeAlias

#: what a frame may be: bytes, a writable buffer, a view, or a (C-contiguous) array
Buffer: TypeAlias = "bytes | bytearray | memoryview | np.ndarray"


def array_view(arr: np.ndarray) -> memoryview:
    """``memoryview(arr)``: an array exports its buffer (PEP 3118); typed here once.

    numpy's stubs declare ``ndarray.__buffer__`` only for Python >= 3.12, and mypy
    checks this code as 3.11 (the oldest supported), where the stubs leave it out."""
    return memoryview(arr)  # type: ignore[arg-type]  # numpy stubs: __buffer__ only on 3.12+


def as_bytes_view(buf: Buffer) -> memoryview:
    """A flat byte view of any contiguous buffer (numpy arrays included), no copy."""
    if type(buf) is memoryview and buf.ndim == 1 and buf.format == "B":
        return buf  # already one (what the stream hands over): the common case, no new view
    if isinstance(buf, np.ndarray):
        try:  # ~3x cheaper than reshape + view + memoryview, the same bytes
            return array_view(buf).cast("B")
        except (TypeError, ValueError):  # not C-contiguous, or zero-size: the long way
            pass
        if not buf.flags.c_contiguous:
            raise PSConfigError("tensor payloads must be C-contiguous")
        return array_view(buf.reshape(-1).view(np.uint8))
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv
