"""The fixed binary header of a shipyard.ps message, and the code tables in it.

Why its own module: the header is the one part of a message every layer reads (the
MAC covers it and takes the session and counter from it, the replay guard checks its
session fields, a client finds the request a reply answers by its request id), so
its layout, its field codes (message types, dtypes, MAC algorithm ids) and its
parsing live here, below all of them. Every number here is on the wire: never renumber.

Layout: ``struct`` little-endian, ``HEADER_SIZE`` bytes (``HEADER_FORMAT``): magic
``b"SYPS"``, protocol version, message type, dtype code, ndim, flags, MAC algorithm id,
reserved, key id, worker id, request id, shard index, step, payload byte length, up to
``MAX_NDIM`` dimensions, and (protocol 2) the sender's session, its sequence number and
the receiver's session (replay.py).
"""

from __future__ import annotations

import enum
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers import Buffer, as_bytes_view
from .errors import ErrorCode, MalformedFrameError, PSConfigError

MAGIC = b"SYPS"
PROTOCOL_VERSION = 2  # 2: session, seq and peer in the header (replay protection)
MAX_NDIM = 8

# MAC algorithm ids (the header's "mac alg" field); integrity.py implements them
MAC_HMAC_SHA256 = 1  # stdlib only: HMAC-SHA256 over per-segment SHA-256 digests
MAC_BLAKE3 = 2  # optional: keyed BLAKE3, ~2.6x faster than SHA-256 here; needs `pip install blake3`
MAC_POLY1305 = 3  # optional: HMAC-derived one-time Poly1305 key, ~6x faster; needs `cryptography`
MAC_GMAC = 4  # optional, the default with `cryptography`: AES-256-GCM tag, a key per sender session

#: magic, version, type, dtype, ndim, flags, mac alg, reserved,
#: key, worker, request id, shard, step, nbytes, shape[8],
#: session (the sender's), seq (the sender's counter), peer (the receiver's session)
HEADER_FORMAT = "<4sBBBBHBBIIIIQQ8QQQQ"
HEADER = struct.Struct(HEADER_FORMAT)
HEADER_SIZE = HEADER.size

FLAG_JSON = 1 << 0  # payload is a UTF-8 JSON document
FLAG_APPLIED = 1 << 1  # INIT reply: the value was stored (first writer)

U32_MAX = 0xFFFFFFFF
SESSION_OFFSET = HEADER_SIZE - 24  # session, seq, peer close the header
PAD = tuple((0,) * (MAX_NDIM - n) for n in range(MAX_NDIM + 1))  # unused shape slots


class MsgType(enum.IntEnum):
    """Message types. Requests < 64, replies >= 64."""

    HELLO = 1  # worker joins; JSON {"worker", "pid", "host"} -> OK JSON shard info
    REGISTER = 2  # JSON {"optimizer", "keys": [...]} -> OK JSON
    INIT = 3  # tensor: first writer sets the initial value -> OK (FLAG_APPLIED)
    PUSH = 4  # tensor gradient -> OK
    PULL = 5  # -> TENSOR
    PUSH_PULL = 6  # tensor gradient -> TENSOR (value after the update that includes it)
    SET_LR = 7  # JSON {"lr", "group"} -> OK
    STATS = 8  # -> OK JSON stats
    HEARTBEAT = 9  # no reply
    LEAVE = 10  # worker leaves cleanly -> OK
    CHECKPOINT = 11  # write a checkpoint now -> OK JSON {"path"}
    SHUTDOWN = 12  # final checkpoint then exit -> OK
    DONE = 13  # a worker process ended: JSON {"exit_code", "error"} -> held until every
    #            worker of the job is done or lost, then OK JSON {"finished", "stats", "placement"}
    PUSH_PULL_MANY = 14  # [u32 key ids] + one gradient frame per key -> TENSORS, each key
    #                      served as its own PUSH_PULL (many small tensors, one round trip)
    OK = 64
    TENSOR = 65
    ERROR = 66  # JSON {"code", "message"}
    TENSORS = 67  # [u32 key ids, u64 versions] + one value frame per key


VALID_TYPES = frozenset(int(t) for t in MsgType)

# dtype codes: stable numbers on the wire, little-endian numpy dtypes in memory.
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("<f2"),
    2: np.dtype("<f4"),
    3: np.dtype("<f8"),
    4: np.dtype("i1"),
    5: np.dtype("<i2"),
    6: np.dtype("<i4"),
    7: np.dtype("<i8"),
    8: np.dtype("u1"),
    9: np.dtype("<u2"),
    10: np.dtype("<u4"),
    11: np.dtype("<u8"),
    12: np.dtype("?"),
}
_CODE_OF: dict[str, int] = {dt.str: code for code, dt in DTYPE_CODES.items()}
FLOAT_CODES = frozenset({1, 2, 3})


_CODE_CACHE: dict[Any, int] = {}  # dtype (or what names one) -> wire code, as looked up


def dtype_code(dtype: Any) -> int:
    """Wire code of a numpy dtype (native or little-endian); PSConfigError if unsupported.
    (Cached per dtype: every tensor message's header needs one.)"""
    try:
        return _CODE_CACHE[dtype]
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    elif dt.byteorder == "=":
        dt = dt.newbyteorder("<") if dt.itemsize > 1 else dt
    code = _CODE_OF.get(dt.str)
    if code is None:
        raise PSConfigError(
            f"dtype {np.dtype(dtype)} is not supported on the wire; use one of "
            + ", ".join(str(d) for d in DTYPE_CODES.values())
        )
    try:
        if len(_CODE_CACHE) < 256:
            _CODE_CACHE[dtype] = code
    except TypeError:  # unhashable: not cached
        pass
    return code


def code_dtype(code: int) -> np.dtype:
    """numpy dtype of a wire code; MalformedFrameError if unknown."""
    try:
        return DTYPE_CODES[code]
    except KeyError:
        raise MalformedFrameError(f"unknown dtype code {code}") from None


#: dataclass(slots=True) is Python 3.10+; older framework environments get a plain dataclass
_SLOTS = {"slots": True} if sys.version_info >= (3, 10) else {}


@dataclass(**_SLOTS)
class Header:
    """The fixed-size message header. ``shape`` is only meaningful for tensors.

    Treated as immutable (``dataclasses.replace`` makes changed copies); not declared
    frozen because a frozen dataclass's ``__init__`` costs ~3x more, and a header is
    built or parsed several times per message."""

    msg_type: int
    key: int = 0
    worker: int = 0
    request_id: int = 0
    shard: int = 0
    step: int = 0
    dtype: int = 0
    shape: tuple[int, ...] = ()
    nbytes: int = 0
    flags: int = 0
    mac_alg: int = MAC_HMAC_SHA256
    session: int = 0  # the sender's random session id (integrity.Signer.session)
    seq: int = 0  # the sender's message counter in that session, from 1
    peer: int = 0  # the receiver's session as the sender knows it; 0 only in HELLO

    def pack(self, session: int | None = None, seq: int | None = None) -> bytes:
        """Serialize (``session``/``seq`` override the fields: ``encode`` stamps them);
        PSConfigError for fields out of range (a client bug, not wire input)."""
        shape = self.shape
        ndim = len(shape)
        if ndim > MAX_NDIM:
            raise PSConfigError(f"tensors have at most {MAX_NDIM} dimensions, got {ndim}")
        try:  # dims and the other fields go in as they are: struct takes any __index__ int
            return HEADER.pack(
                MAGIC,
                PROTOCOL_VERSION,
                self.msg_type,
                self.dtype,
                ndim,
                self.flags,
                self.mac_alg,
                0,
                self.key,
                self.worker,
                self.request_id & U32_MAX,
                self.shard,
                self.step,
                self.nbytes,
                *shape,
                *PAD[ndim],
                self.session if session is None else session,
                self.seq if seq is None else seq,
                self.peer,
            )
        except struct.error as exc:
            raise PSConfigError(f"header field out of range: {exc}") from None

    @classmethod
    def unpack(cls, buf: Buffer) -> Header:
        """Parse a header frame; MalformedFrameError on size/magic/version/ndim problems."""
        if type(buf) is not bytes:
            buf = as_bytes_view(buf)
        if len(buf) != HEADER_SIZE:
            raise MalformedFrameError(f"header frame is {len(buf)} bytes, expected {HEADER_SIZE}")
        # fields by position (HEADER_FORMAT): 0 magic, 1 version, 2 type, 3 dtype, 4 ndim,
        # 5 flags, 6 mac alg, 7 reserved, 8 key, 9 worker, 10 request id, 11 shard,
        # 12 step, 13 nbytes, 14-21 shape, 22 session, 23 seq, 24 peer
        f = HEADER.unpack(buf)
        if f[0] != MAGIC:
            err = MalformedFrameError(f"bad magic {f[0]!r}")
            err.code = ErrorCode.BAD_MAGIC
            raise err
        if f[1] != PROTOCOL_VERSION:
            err = MalformedFrameError(
                f"protocol version {f[1]}, this build speaks {PROTOCOL_VERSION}"
            )
            err.code = ErrorCode.BAD_VERSION
            raise err
        ndim = f[4]
        if ndim > MAX_NDIM:
            raise MalformedFrameError(f"ndim {ndim} > {MAX_NDIM}")
        # positional: the dataclass's field order (a keyword call costs ~2x here)
        return cls(
            f[2], f[8], f[9], f[10], f[11], f[12], f[3], f[14 : 14 + ndim], f[13], f[5], f[6],
            f[22], f[23], f[24],
        )  # fmt: skip
