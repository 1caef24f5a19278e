"""The common prediction request, ``{"instances": [...numbers...]}`` for a signature with
one numeric input, read straight into an array, skipping the nested Python lists.

Why: the general path (``protocol.invocations_to_tfs`` then ``parse_tfs_request``)
parses the body into nested lists and has numpy rediscover their shape, ~17 us of CPU
per digits request (8x8x1 floats: 73 lists, 64 floats) of a worker's ~60 us handler;
this way takes ~7 us (docs/decisions.md, issue 19). The body is checked, not trusted:

1. outside the array it is exactly ``{"instances": ... }`` (white space aside);
2. the array's skeleton, what is left once number characters and white space are
   deleted, is exactly the brackets and commas of ``n`` instances of the signature's
   per-row shape (so the nesting is regular, and nothing but numbers sits in it: no
   strings, ``true``, ``null``, ``NaN``, objects or ``{"b64": ...}``);
3. the numbers, brackets deleted, are parsed by orjson as one flat JSON array: JSON's
   own number syntax, so ``+1``, ``.5``, ``01`` or ``1.2.3`` are refused as before.

Anything else returns ``None`` and takes the general path, which answers exactly as it
always did (errors included); what this path returns is what that path returns for the
same body (numpy picks int64 or float64 for the flat list as for the nested one, then
the same cast to the input's dtype).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from shipyard.serving import protocol
from shipyard.serving.protocol import Signature

_WHITE = b" \t\n\r"
_NUMBER_OR_WHITE = b"0123456789.eE+-" + _WHITE
_PREFIX = b'{"instances":'
_MAX_CACHED_ROWS = 1024


@functools.lru_cache(maxsize=64)
def _row_skeleton(row_shape: tuple[int, ...]) -> bytes:
    """The brackets and commas of one instance of ``row_shape`` (a number: nothing)."""
    if not row_shape:
        return b""
    inner = _row_skeleton(row_shape[1:])
    return b"[" + b",".join([inner] * row_shape[0]) + b"]"


@functools.lru_cache(maxsize=256)
def _skeleton(row_shape: tuple[int, ...], rows: int) -> bytes:
    return b"[" + b",".join([_row_skeleton(row_shape)] * rows) + b"]"


Fit = tuple[str, tuple[int, ...], np.dtype[Any], int | None]


def fit(sig: Signature) -> Fit | None:
    """(input name, per-row shape, dtype, fixed first dimension) when ``sig`` fits this
    path, else None; callers keep it per signature (~2 us to work out)."""
    if len(sig.inputs) != 1:
        return None
    ((name, spec),) = sig.inputs.items()
    shape = spec.shape
    if spec.dtype == "string" or shape is None or not shape:
        return None
    row = tuple(d for d in shape[1:] if d is not None)
    if len(row) != len(shape) - 1 or math.prod(row) == 0:  # a free or empty row dimension
        return None
    try:
        dtype = np.dtype(spec.dtype)
    except TypeError:
        return None
    if dtype.kind not in "iuf":
        return None
    return name, row, dtype, shape[0]


def instances(body: bytes, fitted: Fit) -> dict[str, np.ndarray] | None:
    """``{"instances": [...]}`` of numbers -> ``{input: array}`` for the signature
    ``fitted`` came from (``fit``), or None (see above)."""
    orjson = protocol._ORJSON  # (looked up per call: tests run without it)
    if orjson is None:
        return None
    name, row_shape, dtype, first = fitted
    start, end = body.find(b"["), body.rfind(b"]")
    if start < 0 or end < start:
        return None
    if body[:start].translate(None, _WHITE) != _PREFIX:
        return None
    if body[end + 1 :].translate(None, _WHITE) != b"}":
        return None
    array = body[start : end + 1]
    skeleton = array.translate(None, _NUMBER_OR_WHITE)
    unit = len(_row_skeleton(row_shape)) + 1  # one instance and its comma
    rows = (len(skeleton) - 1) // unit
    if rows < 1:
        return None
    if first is not None and first != rows:
        return None
    expected = (
        _skeleton(row_shape, rows)
        if rows <= _MAX_CACHED_ROWS
        else _skeleton.__wrapped__(row_shape, rows)
    )
    if skeleton != expected:
        return None
    try:
        flat = orjson.loads(b"[" + array.translate(None, b"[]") + b"]")
    except orjson.JSONDecodeError:
        return None
    values = np.asarray(flat)
    if values.dtype.kind not in "if" or values.size != rows * math.prod(row_shape):
        return None
    if values.dtype == dtype:
        arr = values
    else:
        with np.errstate(all="ignore"):  # as to_array: out-of-range values as numpy casts
            arr = values.astype(dtype)
    return {name: arr.reshape((rows, *row_shape))}
