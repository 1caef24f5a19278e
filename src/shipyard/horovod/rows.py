"""Op descriptions, as every rank writes them into the negotiation table.

Each collective is described by a tuple (kind, name, shape, dtype, op, root, ...); its
``signature`` is a 62-bit hash identical on every rank, and ``describe`` turns one back
into the words a TensorMismatchError shows. Pure functions over numpy dtypes.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .ops import op_name

# Row kinds.


# Row kinds.
(
    K_JOIN,
    K_ALLREDUCE,
    K_ALLGATHER,
    K_BROADCAST,
    K_ALLTOALL,
    K_BARRIER,
    K_BCAST_OBJ,
    K_ALLGATHER_OBJ,
    K_ADASUM,
) = range(9)

_KIND_NAMES = {
    K_JOIN: "join",
    K_ALLREDUCE: "allreduce",
    K_ALLGATHER: "allgather",
    K_BROADCAST: "broadcast",
    K_ALLTOALL: "alltoall",
    K_BARRIER: "barrier",
    K_BCAST_OBJ: "broadcast_object",
    K_ALLGATHER_OBJ: "allgather_object",
    K_ADASUM: "allreduce(Adasum)",
}

_DTYPE_CODES: dict[np.dtype, int] = {}

for _i, _t in enumerate(
    [
        np.bool_,
        np.uint8,
        np.int8,
        np.uint16,
        np.int16,
        np.uint32,
        np.int32,
        np.uint64,
        np.int64,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    ],
    start=1,
):
    _DTYPE_CODES[np.dtype(_t)] = _i

_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}

_DNAMES: dict[np.dtype, str] = {}


def _dname(dtype: np.dtype) -> str:
    n = _DNAMES.get(dtype)
    if n is None:
        n = _DNAMES[dtype] = dtype.name if dtype.isnative else dtype.str
    return n


def _dtype_error(dtype: np.dtype) -> str | None:
    return None if dtype in _DTYPE_CODES else f"unsupported dtype {dtype}"


_SIG_CACHE: dict[tuple, int] = {}


def signature(desc: tuple) -> int:
    """A 62-bit signature of an op description, identical on every rank (no PYTHONHASHSEED)."""
    s = _SIG_CACHE.get(desc)
    if s is None:
        s = (
            int.from_bytes(hashlib.blake2b(repr(desc).encode(), digest_size=8).digest(), "little")
            >> 2
        )
        if len(_SIG_CACHE) > 100_000:
            _SIG_CACHE.clear()
        _SIG_CACHE[desc] = s
    return s


def describe(desc: tuple | None) -> str:
    """Readable form of a description tuple (kind, names, dtype, shapes, extra...)."""
    if desc is None:
        return "joined (no op)"
    kind, names, dtype, shapes, extra = desc
    parts = [kind]
    if names is not None:
        ns = list(names) if isinstance(names, tuple) else [names]
        shown = ", ".join(repr(n) for n in ns[:6]) + (
            f", ... ({len(ns)} tensors)" if len(ns) > 6 else ""
        )
        parts.append(f"tensor {shown}")
    if dtype is not None:
        parts.append(f"dtype {dtype}")
    if shapes is not None:
        if shapes and isinstance(shapes[0], tuple):
            shown = ", ".join(str(s) for s in shapes[:6]) + (", ..." if len(shapes) > 6 else "")
            parts.append(f"shapes [{shown}]")
        else:
            parts.append(f"shape {shapes}")
    for k, v in extra:
        parts.append(f"{k}={v}")
    return " ".join(parts)


_EXTRA_CACHE: dict[tuple, tuple] = {}


def _ar_extra(op: int, pre: float, post: float) -> tuple:
    key = (op, pre, post)
    extra = _EXTRA_CACHE.get(key)
    if extra is None:
        extra = (("op", op_name(op)),)
        if pre != 1.0:
            extra += (("prescale", pre),)
        if post != 1.0:
            extra += (("postscale", post),)
        if len(_EXTRA_CACHE) < 1000:
            _EXTRA_CACHE[key] = extra
    return extra


def _mismatch_message(kind: str, descs: list[str | None]) -> str:
    lines = [
        f"shipyard.horovod: ranks submitted different tensors to the same {kind} (nothing was exchanged):"
    ]
    for r, d in enumerate(descs):
        lines.append(f"  rank {r}: {d}")
    lines.append(
        "Every rank must call collectives in the same order with the same name, shape (for allgather/alltoall: "
        "same shape after the first dimension), dtype, op and root rank."
    )
    return "\n".join(lines)
