"""The shipyard.ps wire format: a fixed binary header, raw payload frames, a MAC.

Why this shape: tensors must cross the wire without pickling (unsafe) and without
copies (slow). A message is a list of frames (on TCP: stream.py's framing)::

    [header (HEADER.size bytes)] [payload frame]* [mac (16 or 32 bytes)]

* header: ``struct`` little-endian, fixed size (see ``HEADER_FORMAT``): magic
  ``b"SYPS"``, protocol version, message type, dtype code, ndim, flags, MAC
  algorithm id, key id, worker id, request id, shard index, step, payload byte
  length, up to ``MAX_NDIM`` dimensions, and (protocol 2) the sender's session, its
  sequence number and the receiver's session (``ReplayGuard``).
* payload: raw little-endian tensor bytes (``np.frombuffer`` on receive, sent
  from the caller's buffer), or a small UTF-8 JSON document for control messages
  (``FLAG_JSON``). Never pickle.
* mac: HMAC-SHA256 keyed by the per-job secret (``SHIPYARD_PS_SECRET``) over the
  header and every payload frame. Payload frames enter the HMAC through a SHA-256
  digest per 1 MiB segment (``payload_digest``), so a large payload can be hashed
  on several cores (hashlib releases the GIL) and a shard can reuse the digest of
  a parameter version it already sent; the construction stays HMAC-SHA256 over
  the exact bytes (SHA-256 collision resistance)::

      mac = HMAC-SHA256(K, header || u32 n || D(frame_1) || ... || D(frame_n))
      D(frame) = u64 len(frame) || SHA256(seg_1) || SHA256(seg_2) || ...
      K = SHA256(b"shipyard.ps.v1\\0" || secret)

  That is the stdlib fallback. SHA-256 runs at ~1.7 GB/s per core here, which
  caps a push+pull at about a fifth of loopback TCP on 2 cores (four hash passes
  per byte). With ``cryptography`` installed (the ps extra) there is also
  ``poly1305``: a one-time Poly1305 key per message, k = HMAC-SHA256(K', nonce ||
  header) with a random 128-bit nonce, over u32 n || (u64 len || frame)*, sent
  as nonce || tag in the 32-byte MAC frame (~12 GB/s per core, the construction
  ChaCha20-Poly1305 and NaCl's secretbox use). ``aes-gmac``, the default when
  ``cryptography`` is installed (``default_mac()``; else hmac-sha256), is AES-256-GCM
  used as documented, with nothing encrypted: a key per sender session (HKDF-SHA256 of the job key, the session id
  as info), the nonce ``u64 seq || u32 0`` (a counter, never repeated under one
  key) and as associated data the header, the frame lengths and the frames; the
  MAC frame is GCM's 16-byte tag (``Signer._gmac``; docs/decisions.md, issue 17).
  One GHASH pass per byte, ~20 GB/s per core with AES-NI here.
  ``blake3`` (needs the ``blake3`` package) is a keyed BLAKE3 over the HMAC
  structure with D(frame) = u64 len || BLAKE3(frame). ``SHIPYARD_PS_MAC`` picks one; the header's MAC id says which
  one a message uses, and a shard answers in kind.

The decoder checks, in order: frame count and header size, magic, version, the
MAC (a message failing any of these is not trusted, so it is dropped, never
answered), then the size limit, message type, shape/dtype and announced versus
actual payload length (an authenticated message failing those gets an error
reply). With a ``ReplayGuard`` it then refuses what is not new (seen before, or
addressed to another session), dropped and never answered. The stream layer
(stream.py) bounds the work an untrusted peer can cause before any of this: frame
count and message size limits, and a timeout mid-message.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import itertools
import json
import os
import secrets
import struct
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shipyard import settings

from .errors import (
    AuthenticationError,
    ErrorCode,
    MalformedFrameError,
    OversizedFrameError,
    PSConfigError,
    ReplayedMessageError,
    TruncatedFrameError,
    UnknownMessageTypeError,
    WireError,
)

Buffer = bytes | bytearray | memoryview | np.ndarray

MAGIC = b"SYPS"
PROTOCOL_VERSION = 2  # 2: session, seq and peer in the header (replay protection)
MAX_NDIM = 8
MAC_SIZE = 32
MAC_HMAC_SHA256 = 1
MAC_BLAKE3 = 2  # optional: keyed BLAKE3, ~2.6x faster than SHA-256 here; needs `pip install blake3`
MAC_POLY1305 = 3  # optional: HMAC-derived one-time Poly1305 key, ~6x faster; needs `cryptography`
MAC_GMAC = (
    4  # optional: HMAC-derived one-time AES-256-GMAC key, ~1.7x Poly1305 here; needs `cryptography`
)
MAC_ALGORITHMS = {
    "hmac-sha256": MAC_HMAC_SHA256,
    "blake3": MAC_BLAKE3,
    "poly1305": MAC_POLY1305,
    "aes-gmac": MAC_GMAC,
}
#: MACs keyed per message or per sender session: no payload digest to cache
ONE_TIME_KEY_MACS = frozenset({MAC_POLY1305, MAC_GMAC})
NONCE_SIZE = 16
MAC_ENV = "SHIPYARD_PS_MAC"
SEGMENT = 1 << 20
SECRET_ENV = "SHIPYARD_PS_SECRET"

#: magic, version, type, dtype, ndim, flags, mac alg, reserved,
#: key, worker, request id, shard, step, nbytes, shape[8],
#: session (the sender's), seq (the sender's counter), peer (the receiver's session)
HEADER_FORMAT = "<4sBBBBHBBIIIIQQ8QQQQ"
HEADER = struct.Struct(HEADER_FORMAT)
HEADER_SIZE = HEADER.size

FLAG_JSON = 1 << 0  # payload is a UTF-8 JSON document
FLAG_APPLIED = 1 << 1  # INIT reply: the value was stored (first writer)

U32_MAX = 0xFFFFFFFF
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SESSION_SEQ = struct.Struct("<QQ")
_GCM_IV = struct.Struct("<QI")  # the 96-bit GCM nonce: u64 seq || u32 0
_SESSION_OFFSET = HEADER_SIZE - 24  # session, seq, peer close the header
_LAYOUT_1 = struct.Struct("<IQ")  # the frame layout of a one-frame payload (u32 1, u64 len)
_LAYOUT_0 = _U32.pack(0)
_PAD = tuple((0,) * (MAX_NDIM - n) for n in range(MAX_NDIM + 1))  # unused shape slots


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


_VALID_TYPES = frozenset(int(t) for t in MsgType)

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


@dataclass(slots=True)
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
    session: int = 0  # the sender's random session id (wire.Signer.session)
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
                *_PAD[ndim],
                self.session if session is None else session,
                self.seq if seq is None else seq,
                self.peer,
            )
        except struct.error as exc:
            raise PSConfigError(f"header field out of range: {exc}") from None

    @classmethod
    def unpack(cls, buf: Buffer) -> Header:
        """Parse a header frame; MalformedFrameError on size/magic/version/ndim problems."""
        if (len(buf) if type(buf) is bytes else len(memoryview(buf).cast("B"))) != HEADER_SIZE:
            raise MalformedFrameError(
                f"header frame is {len(memoryview(buf).cast('B'))} bytes, expected {HEADER_SIZE}"
            )
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


@dataclass(slots=True)
class Message:
    """A decoded, authenticated message: header plus zero-copy payload views."""

    header: Header
    payload: list[memoryview] = field(default_factory=list)
    wire_bytes: int = 0
    #: the header's dtype once ``decode`` checked the shape fills ``nbytes`` (so
    #: ``tensor`` need not check the layout again); None: check it there
    dtype: np.dtype | None = None

    def json(self) -> Any:
        """The JSON payload (control messages); MalformedFrameError if not JSON."""
        raw = b"".join(bytes(p) for p in self.payload)
        try:
            return json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MalformedFrameError(f"payload is not JSON: {exc}") from None

    def tensor(self) -> np.ndarray:
        """The payload as an array (zero-copy when it is one frame)."""
        dt = self.dtype
        if dt is not None and len(self.payload) == 1:  # decode checked the layout
            return np.frombuffer(self.payload[0], dtype=dt).reshape(self.header.shape)
        return payload_array(self.header, self.payload)


def check_layout(header: Header) -> np.dtype:
    """The header's dtype, once its shape is known to fill exactly ``nbytes``.

    Raises MalformedFrameError if the dtype is unknown or the shape does not match
    the byte length.
    """
    dt = DTYPE_CODES.get(header.dtype)
    if dt is None:
        raise MalformedFrameError(f"unknown dtype code {header.dtype}")
    count = 1
    for d in header.shape:
        count *= d
    if count * dt.itemsize != header.nbytes:
        raise MalformedFrameError(
            f"shape {header.shape} x {dt} is {count * dt.itemsize} bytes, header says {header.nbytes}"
        )
    return dt


def payload_array(header: Header, payload: Sequence[memoryview]) -> np.ndarray:
    """View the payload frames as the header's dtype and shape (``check_layout``'s errors)."""
    dt = check_layout(header)
    if len(payload) == 1:
        buf: Buffer = payload[0]
    elif not payload:
        buf = b""
    else:
        buf = b"".join(bytes(p) for p in payload)
    return np.frombuffer(buf, dtype=dt).reshape(header.shape)


def derive_key(secret: str | bytes) -> bytes:
    """The 32-byte MAC key for a job secret."""
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not secret:
        raise PSConfigError(
            f"the parameter-server secret is empty: set {SECRET_ENV} (the same value for "
            "every shard and worker of the job) or pass secret=..."
        )
    return hashlib.sha256(b"shipyard.ps.v1\0" + secret).digest()


def secret_from_env(explicit: str | bytes | None = None) -> bytes:
    """The secret passed in, else ``$SHIPYARD_PS_SECRET``; PSConfigError if neither."""
    if explicit is not None:
        return explicit.encode("utf-8") if isinstance(explicit, str) else bytes(explicit)
    value = settings.get(SECRET_ENV) or ""
    if not value:
        raise PSConfigError(
            f"{SECRET_ENV} is not set: every shard and worker of a job needs the same secret "
            "to authenticate messages (the runner generates one per job)"
        )
    return value.encode("utf-8")


_POOL: ThreadPoolExecutor | None = None
PARALLEL_MIN = 8 * SEGMENT  # below this, one thread hashes faster than a pool hand-off


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(
            max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="ps-hash"
        )
    return _POOL


def _seg_digest(view: memoryview) -> bytes:
    return hashlib.sha256(view).digest()


def _blake3() -> Any:
    """The ``blake3`` hasher class, or None when the optional package is missing."""
    try:
        from blake3 import blake3  # type: ignore[import-not-found]
    except ImportError:
        return None
    return blake3


def _poly1305() -> Any:
    """``cryptography``'s Poly1305 class, or None when the optional package is missing."""
    try:
        from cryptography.hazmat.primitives.poly1305 import Poly1305  # type: ignore[import-not-found]
    except ImportError:
        return None
    return Poly1305


GCM_ONE_SHOT_MAX = 16 * 1024  # above this the frames are streamed into GCM (no concatenation)
GCM_TAG_SIZE = 16
SESSION_KEYS_MAX = 4096  # per-sender AES keys a Signer keeps (HKDF once per session)


@dataclass(frozen=True)
class _Gcm:
    """``cryptography``'s AES-GCM, its two documented entry points: ``one_shot(key)``
    (AESGCM: well under a microsecond for a small message, one additional-data buffer)
    and ``streaming(cipher_key, nonce)`` (a GCM encryptor whose additional data is fed buffer by
    buffer, so a large payload is authenticated where it lies); and HKDF."""

    one_shot: Any
    streaming: Any
    cipher_key: Any  # key -> the AES key object ``streaming`` takes (made once per session)
    hkdf: Any


def _gcm() -> _Gcm | None:
    """GCM and HKDF from ``cryptography``, or None when the optional package is missing."""
    try:
        from cryptography.hazmat.primitives import hashes  # type: ignore[import-not-found]
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # type: ignore[import-not-found]
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # type: ignore[import-not-found]
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF  # type: ignore[import-not-found]
    except ImportError:
        return None

    def streaming(cipher_key: Any, nonce: bytes) -> Any:
        return Cipher(cipher_key, modes.GCM(nonce)).encryptor()

    def hkdf(master: bytes, info: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master)

    return _Gcm(one_shot=AESGCM, streaming=streaming, cipher_key=algorithms.AES, hkdf=hkdf)


_OPTIONAL = {
    MAC_BLAKE3: (_blake3, "blake3"),
    MAC_POLY1305: (_poly1305, "cryptography"),
    MAC_GMAC: (_gcm, "cryptography"),
}


def mac_size(alg: int) -> int:
    """Bytes of the MAC frame: a 16-byte GCM tag for aes-gmac, 32 for the others."""
    return GCM_TAG_SIZE if alg == MAC_GMAC else MAC_SIZE


class ReplayGuard:
    """A receiver's memory of what it accepted: every authenticated message must be new.

    Each message carries the sender's random ``session``, its counter ``seq`` in that
    session and ``peer``, the receiver's own session as the sender learned it (a shard's
    in the HELLO reply; a client's is echoed in every reply), all inside the MAC. A
    message is accepted once: ``peer`` must be this receiver's session (0 only for a
    HELLO, which changes nothing but liveness), and ``seq`` must not have been seen in its
    session: an anti-replay window as in IPsec (RFC 4303 3.4.3) of ``WINDOW`` numbers
    below the highest seen, older ones refused. A captured message re-sent, to this
    process or to one started later (a new session), is dropped and counted.
    """

    WINDOW = 1024
    MAX_SESSIONS = 16384

    def __init__(self, session: int) -> None:
        self.session = session
        self._windows: dict[int, list[int]] = {}  # sender session -> [highest seq, bitmap]
        self._lock = threading.Lock()

    def check(self, h: Header) -> None:
        """Raise ReplayedMessageError unless ``h`` is fresh; record it when it is."""
        if h.peer != self.session and not (h.peer == 0 and h.msg_type == MsgType.HELLO):
            raise ReplayedMessageError(
                f"message for session {h.peer:#x}, this receiver is {self.session:#x} "
                "(replayed from another run, or sent before a restart)",
                code=ErrorCode.STALE_SESSION,
            )
        if h.seq < 1:
            raise ReplayedMessageError("message without a sequence number")
        with self._lock:
            win = self._windows.get(h.session)
            if win is None:
                if len(self._windows) >= self.MAX_SESSIONS:
                    self._windows.pop(next(iter(self._windows)))
                self._windows[h.session] = [h.seq, 1]
                return
            top, bits = win
            if h.seq > top:
                win[0] = h.seq
                win[1] = ((bits << (h.seq - top)) | 1) & ((1 << self.WINDOW) - 1)
                return
            age = top - h.seq
            if age >= self.WINDOW or bits >> age & 1:
                raise ReplayedMessageError(
                    f"message {h.seq} of session {h.session:#x} was already received"
                    if age < self.WINDOW
                    else f"message {h.seq} of session {h.session:#x} is older than the window"
                )
            win[1] = bits | 1 << age


def available_macs() -> list[str]:
    """MAC algorithm names usable in this process."""
    return [
        n for n, a in MAC_ALGORITHMS.items() if a not in _OPTIONAL or _OPTIONAL[a][0]() is not None
    ]


def default_mac() -> str:
    """aes-gmac when ``cryptography`` is installed (the ps extra has it: ~10x faster than
    HMAC-SHA256 and ~1.7x Poly1305 on AES-NI machines, see BENCHMARKS.md), else
    hmac-sha256 (stdlib only)."""
    return "aes-gmac" if _gcm() is not None else "hmac-sha256"


def resolve_mac(alg: str | int | None = None) -> int:
    """Algorithm id from a name/id, else ``$SHIPYARD_PS_MAC``, else ``default_mac()``."""
    if alg is None:
        alg = settings.get(MAC_ENV) or default_mac()
    if isinstance(alg, str):
        if alg.lower() not in MAC_ALGORITHMS:
            raise PSConfigError(
                f"unknown MAC algorithm {alg!r}; use one of: " + ", ".join(MAC_ALGORITHMS)
            )
        alg = MAC_ALGORITHMS[alg.lower()]
    if alg not in MAC_ALGORITHMS.values():
        raise PSConfigError(f"unknown MAC algorithm id {alg}")
    if alg in _OPTIONAL and _OPTIONAL[alg][0]() is None:
        name = next(n for n, a in MAC_ALGORITHMS.items() if a == alg)
        raise PSConfigError(
            f"MAC {name!r} needs the optional package {_OPTIONAL[alg][1]!r} "
            f"(pip install {_OPTIONAL[alg][1]})"
        )
    return int(alg)


def payload_digest(buf: Buffer, parallel: bool = True, alg: int = MAC_HMAC_SHA256) -> bytes:
    """D(frame): the byte length, then SHA-256 of each 1 MiB segment (HMAC-SHA256) or
    BLAKE3 of the whole frame (BLAKE3 hashes its own tree on several threads)."""
    view = as_bytes_view(buf)
    n = len(view)
    head = struct.pack("<Q", n)
    if alg == MAC_BLAKE3:
        b3 = _blake3()
        threads = b3.AUTO if parallel and n >= 4 * SEGMENT else 1
        return head + b3(view, max_threads=threads).digest()
    if n <= SEGMENT:
        return head + hashlib.sha256(view).digest()
    segs = [view[i : i + SEGMENT] for i in range(0, n, SEGMENT)]
    if parallel and n >= PARALLEL_MIN:
        return head + b"".join(_pool().map(_seg_digest, segs))
    return head + b"".join(hashlib.sha256(s).digest() for s in segs)


def as_bytes_view(buf: Buffer) -> memoryview:
    """A flat byte view of any contiguous buffer (numpy arrays included), no copy."""
    if type(buf) is memoryview and buf.ndim == 1 and buf.format == "B":
        return buf  # already one (what the stream hands over): the common case, no new view
    if isinstance(buf, np.ndarray):
        try:  # ~3x cheaper than reshape + view + memoryview, the same bytes
            return memoryview(buf).cast("B")
        except (TypeError, ValueError):  # not C-contiguous, or zero-size: the long way
            pass
        if not buf.flags.c_contiguous:
            raise PSConfigError("tensor payloads must be C-contiguous")
        return memoryview(buf.reshape(-1).view(np.uint8))
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


class Signer:
    """Computes and checks message MACs for one job secret.

    ``alg`` picks the MAC this side *sends* with (default ``$SHIPYARD_PS_MAC`` or
    ``hmac-sha256``); any available algorithm is accepted on receive, and a shard
    answers with the algorithm of the request.
    """

    def __init__(self, secret: str | bytes, alg: str | int | None = None) -> None:
        self._key = derive_key(secret)
        self._b3_key = hashlib.sha256(b"shipyard.ps.v1.blake3\0" + self._key).digest()
        self._poly_key = hashlib.sha256(b"shipyard.ps.v1.poly1305\0" + self._key).digest()
        self._gcm_master = hashlib.sha256(b"shipyard.ps.v2.aes-gcm\0" + self._key).digest()
        self.alg = resolve_mac(alg)
        self._poly = _poly1305()  # looked up once, not per message
        self._gcm = _gcm()
        self._session_keys: dict[int, tuple[Any, Any]] = {}
        # this sender's session: a random 64-bit id, and a counter that never repeats in it
        self.session = secrets.randbits(64) or 1
        self._seq = itertools.count(1)

    def next_seq(self) -> int:
        """The next message number of this session (thread-safe: ``count`` is atomic)."""
        return next(self._seq)

    def mac(
        self,
        header: bytes,
        payload: Sequence[Buffer],
        digests: Sequence[bytes | None] | None = None,
        parallel: bool = True,
        alg: int | None = None,
        nonce: bytes | None = None,
    ) -> bytes:
        """The 32-byte MAC frame; ``digests[i]``, when given, is a cached D(payload[i]).

        ``parallel=False`` when already running on the hash pool (no nested waits).
        ``nonce``: one-time-key MACs only, the receiver passes the one from the MAC frame.
        """
        alg = self.alg if alg is None else alg
        if alg == MAC_GMAC:
            return self._gmac(header, payload, nonce)
        if alg == MAC_POLY1305:
            return self._poly_mac(header, payload, nonce)
        if alg == MAC_BLAKE3:
            b3 = _blake3()
            if b3 is None:
                raise AuthenticationError("message uses MAC blake3, which is not installed here")
            h = b3(key=self._b3_key)
            h.update(header)
        elif alg == MAC_HMAC_SHA256:
            h = hmac.new(self._key, header, "sha256")
        else:
            raise AuthenticationError(f"unknown MAC algorithm id {alg}")
        h.update(struct.pack("<I", len(payload)))
        for i, p in enumerate(payload):
            d = digests[i] if digests is not None and i < len(digests) else None
            h.update(d if d is not None else payload_digest(p, parallel, alg))
        return h.digest()

    def _poly_mac(self, header: bytes, payload: Sequence[Buffer], nonce: bytes | None) -> bytes:
        """nonce || Poly1305(k, u32 n || (u64 len || frame)*), k = HMAC-SHA256(K', nonce || header).

        The one-time key is fresh per message (random 128-bit nonce) and bound to
        the header, the construction ChaCha20-Poly1305 and NaCl's secretbox use.
        """
        poly = self._poly or _poly1305()
        if poly is None:
            raise AuthenticationError(
                "message uses MAC poly1305, but 'cryptography' is not installed here"
            )
        nonce = os.urandom(NONCE_SIZE) if nonce is None else bytes(nonce)
        # hmac.digest: the one-shot C path (a few microseconds less per message than hmac.new)
        p = poly(hmac.digest(self._poly_key, nonce + bytes(header), "sha256"))
        p.update(_U32.pack(len(payload)))
        for frame in payload:
            view = as_bytes_view(frame)
            p.update(_U64.pack(len(view)))
            p.update(view)
        return nonce + p.finalize()

    def _session_key(self, session: int) -> tuple[Any, Any]:
        """(AES key object, AESGCM) of a sender session: HKDF-SHA256 of the job's GCM key with the
        session id as info, computed once per session and kept (bounded)."""
        hit = self._session_keys.get(session)
        if hit is None:
            gcm = self._gcm
            assert gcm is not None
            key = gcm.hkdf(
                self._gcm_master, b"shipyard.ps.v2 aes-gcm session " + _U64.pack(session)
            )
            hit = (gcm.cipher_key(key), gcm.one_shot(key))
            if len(self._session_keys) >= SESSION_KEYS_MAX:
                self._session_keys.pop(next(iter(self._session_keys)))
            self._session_keys[session] = hit
        return hit

    def _gmac(self, header: bytes, payload: Sequence[Buffer], nonce: bytes | None) -> bytes:
        """AES-256-GCM used as its documentation says, with nothing to encrypt: the tag of
        ``AESGCM(k_s).encrypt(nonce, b"", aad)`` where

            k_s   = HKDF-SHA256(K_gcm, info="shipyard.ps.v2 aes-gcm session" || u64 session)
            nonce = u64 seq || u32 0      (NIST SP 800-38D 8.2.1: a counter, unique per key)
            aad   = header || u32 n || u64 len(frame_1) .. u64 len(frame_n) || frame_1 .. frame_n

        ``session`` and ``seq`` are read from the header (``encode`` stamped them), so the
        header, the frame layout and every payload byte are the associated data. One
        sender session never reuses a seq, so no (key, nonce) pair repeats. Small
        messages are one AESGCM call; larger ones stream the frames into a GCM encryptor
        (the same tag, no payload byte copied)."""
        gcm = self._gcm or _gcm()
        if gcm is None:
            raise AuthenticationError(
                "message uses MAC aes-gmac, but 'cryptography' is not installed here"
            )
        self._gcm = gcm
        if type(header) is not bytes:
            header = bytes(header)
        if len(header) != HEADER_SIZE:
            raise AuthenticationError("aes-gmac needs a full header")
        session, seq = _SESSION_SEQ.unpack_from(header, _SESSION_OFFSET)
        hit = self._session_keys.get(session) or self._session_key(session)
        iv = _GCM_IV.pack(seq, 0)
        if len(payload) <= 1:  # the common shapes (a tensor, or nothing) without the lists
            if not payload:
                return hit[1].encrypt(iv, b"", header + _LAYOUT_0)
            v = payload[0]
            if type(v) is not bytes:
                v = as_bytes_view(v)
            if len(v) <= GCM_ONE_SHOT_MAX:
                return hit[1].encrypt(iv, b"", b"".join((header, _LAYOUT_1.pack(1, len(v)), v)))
        views = [p if type(p) is bytes else as_bytes_view(p) for p in payload]
        lens = [len(v) for v in views]
        layout = struct.pack(f"<I{len(lens)}Q", len(lens), *lens)
        if sum(lens) <= GCM_ONE_SHOT_MAX:
            return hit[1].encrypt(iv, b"", b"".join((header, layout, *views)))
        enc = gcm.streaming(hit[0], iv)
        enc.authenticate_additional_data(header + layout)
        for v in views:
            if len(v):
                enc.authenticate_additional_data(v)
        enc.finalize()
        return enc.tag

    def _gmac_one(self, header: bytes, v: Any) -> bytes:
        """``_gmac(header, [v], None)`` for a small frame whose session key is known (every
        message of a small push_pull): the same tag, without the general path's checks
        and dispatch; anything else goes the general way."""
        session, seq = _SESSION_SEQ.unpack_from(header, _SESSION_OFFSET)
        hit = self._session_keys.get(session)
        n = len(v)
        if hit is None or n > GCM_ONE_SHOT_MAX or len(header) != HEADER_SIZE:
            return self._gmac(header, (v,), None)
        return hit[1].encrypt(
            _GCM_IV.pack(seq, 0), b"", b"".join((header, _LAYOUT_1.pack(1, n), v))
        )

    def verify(
        self,
        header: Buffer,
        payload: Sequence[Buffer],
        mac: Buffer,
        parallel: bool = True,
        alg: int = MAC_HMAC_SHA256,
    ) -> bool:
        """Constant-time check of a received MAC."""
        mac = bytes(mac)
        nonce = mac[:NONCE_SIZE] if alg == MAC_POLY1305 else None
        expected = self.mac(bytes(header), payload, parallel=parallel, alg=alg, nonce=nonce)
        return hmac.compare_digest(expected, mac)


def encode(
    signer: Signer,
    header: Header,
    payload: Sequence[Buffer] = (),
    digests: Sequence[bytes | None] | None = None,
    parallel: bool = True,
    alg: int | None = None,
) -> list[Buffer]:
    """Frames for a message: [header, *payload, mac]. Payload buffers are not copied.

    ``alg``: MAC algorithm (default the signer's); a shard passes the request's.
    """
    alg = signer.alg if alg is None else alg
    if alg == MAC_GMAC and len(payload) == 1:  # one tensor under the default MAC: no lists
        v = payload[0]
        if type(v) is not bytes:
            v = as_bytes_view(v)
        if header.nbytes != len(v) or header.mac_alg != alg:
            header = dataclasses.replace(header, nbytes=len(v), mac_alg=alg)
        hb = header.pack(session=signer.session, seq=signer.next_seq())
        return [hb, v, signer._gmac_one(hb, v)]
    views = [p if type(p) is bytes else as_bytes_view(p) for p in payload]
    total = sum(len(v) for v in views)
    if header.nbytes != total or header.mac_alg != alg:
        header = dataclasses.replace(header, nbytes=total, mac_alg=alg)
    hb = header.pack(session=signer.session, seq=signer.next_seq())
    if alg == MAC_GMAC:  # the default: no digests to consult, straight to the tag
        return [hb, *views, signer._gmac(hb, views, None)]
    return [hb, *views, signer.mac(hb, views, digests, parallel, alg)]


def encode_tensor(
    signer: Signer,
    mtype: int,
    key: int,
    worker: int,
    request_id: int,
    shard: int,
    step: int,
    dtype: int,
    shape: tuple[int, ...],
    value: Buffer,
    peer: int,
    alg: int,
) -> list[Buffer]:
    """``encode(signer, Header(mtype, key, ...), (value,), alg=alg)`` for one tensor frame
    (a small push_pull's request and its TENSOR reply): the same frames, packed straight
    from the fields under aes-gmac, without a ``Header`` object, ``dataclasses.replace``
    or the general path's dispatch (both sides of a 1 KB round trip build one per
    message). Other MACs and large values go the general way."""
    v = value if type(value) is bytes else as_bytes_view(value)
    n = len(v)
    ndim = len(shape)
    if alg != MAC_GMAC or n > GCM_ONE_SHOT_MAX or ndim > MAX_NDIM:
        hdr = Header(
            mtype, key, worker, request_id, shard, step, dtype, shape, n, 0, alg, 0, 0, peer
        )
        return encode(signer, hdr, (v,), alg=alg)
    try:  # the field order of HEADER_FORMAT (Header.pack)
        hb = HEADER.pack(
            MAGIC, PROTOCOL_VERSION, mtype, dtype, ndim, 0, alg, 0, key, worker,
            request_id & U32_MAX, shard, step, n, *shape, *_PAD[ndim],
            signer.session, signer.next_seq(), peer,
        )  # fmt: skip
    except struct.error as exc:
        raise PSConfigError(f"header field out of range: {exc}") from None
    return [hb, v, signer._gmac_one(hb, v)]


def encode_json(signer: Signer, header: Header, obj: Any, alg: int | None = None) -> list[Buffer]:
    """Frames for a control message whose payload is ``obj`` as compact JSON."""
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")
    h = dataclasses.replace(header, flags=header.flags | FLAG_JSON, dtype=0, shape=())
    return encode(signer, h, [data] if data else [], alg=alg)


def decode(
    signer: Signer,
    frames: Sequence[Buffer],
    max_payload: int | None = None,
    parallel: bool = True,
    guard: ReplayGuard | None = None,
) -> Message:
    """Parse and authenticate ``[header, *payload, mac]`` (no identity frame); with a
    ``guard``, also refuse a message that is not fresh (replayed, stale, or addressed to
    another session: ``ReplayedMessageError``, never answered).

    Raises a ``WireError`` subclass. ``err.authenticated`` says whether the MAC
    verified (only then may the receiver answer with an error reply), and
    ``err.header`` carries the parsed header when there was one.
    """
    header: Header | None = None
    authenticated = False
    try:
        if len(frames) < 2:
            raise MalformedFrameError(f"{len(frames)} frame(s); a message has a header and a MAC")
        if len(frames) == 3 and type(frames[0]) is bytes and type(frames[1]) is bytes:
            # one small frame (what the stream hands over for a small push_pull): no lists
            head, p, mac = frames
            mac = mac if type(mac) is bytes else as_bytes_view(mac)
            header = Header.unpack(head)
            if header.mac_alg == MAC_GMAC:
                if len(mac) != GCM_TAG_SIZE:
                    raise MalformedFrameError(
                        f"MAC frame is {len(mac)} bytes, expected {GCM_TAG_SIZE}"
                    )
                if not hmac.compare_digest(signer._gmac_one(head, p), bytes(mac)):
                    raise AuthenticationError(
                        "MAC does not verify (wrong secret or altered message)"
                    )
                if guard is not None:
                    guard.check(header)
                authenticated = True
                return _checked(header, [p], len(p), GCM_TAG_SIZE, max_payload)
        views = [f if type(f) is bytes else as_bytes_view(f) for f in frames]
        header = Header.unpack(views[0])
        mac = views[-1]
        payload = views[1:-1]
        want = mac_size(header.mac_alg)
        if len(mac) != want:
            raise MalformedFrameError(f"MAC frame is {len(mac)} bytes, expected {want}")
        total = sum(len(p) for p in payload) if len(payload) != 1 else len(payload[0])
        if header.mac_alg == MAC_GMAC:  # the default: straight to the tag, no dispatch
            head = views[0] if type(views[0]) is bytes else bytes(views[0])
            ok = hmac.compare_digest(signer._gmac(head, payload, None), bytes(mac))
        else:
            ok = signer.verify(views[0], payload, mac, parallel, header.mac_alg)
        if not ok:
            raise AuthenticationError("MAC does not verify (wrong secret or altered message)")
        if guard is not None:  # authentic, but is it new and meant for this receiver?
            guard.check(header)
        authenticated = True
        return _checked(header, payload, total, want, max_payload)
    except WireError as err:
        err.authenticated = authenticated  # type: ignore[attr-defined]
        err.header = header  # type: ignore[attr-defined]
        raise


def _checked(
    header: Header, payload: list, total: int, mac_bytes: int, max_payload: int | None
) -> Message:
    """The checks of an authenticated message's size, type and layout (decode)."""
    if max_payload is not None and total > max_payload:
        raise OversizedFrameError(
            f"payload of {total} bytes exceeds this shard's limit of {max_payload}; "
            "use placement policy 'sliced' (or a smaller chunk_bytes)"
        )
    if header.msg_type not in _VALID_TYPES:
        raise UnknownMessageTypeError(f"unknown message type {header.msg_type}")
    if total < header.nbytes:
        raise TruncatedFrameError(f"payload is {total} bytes, header announces {header.nbytes}")
    if total > header.nbytes:
        raise OversizedFrameError(f"payload is {total} bytes, header announces {header.nbytes}")
    dt = None
    if header.dtype and not header.flags & FLAG_JSON:
        dt = check_layout(header)  # dtype code and shape vs nbytes
    return Message(header, payload, HEADER_SIZE + total + mac_bytes, dt)


_RID_OFFSET = struct.calcsize("<4sBBBBHBBII")


def request_id_of(frame: Buffer) -> int | None:
    """The request id of a header frame without parsing the rest (None if it is not
    one): how a client finds the request a reply answers before verifying it."""
    view = frame if type(frame) is bytes else as_bytes_view(frame)
    if len(view) != HEADER_SIZE:
        return None
    return int(_U32.unpack_from(view, _RID_OFFSET)[0])


def pack_keys(keys: Sequence[int], versions: Sequence[int] | None = None) -> bytes:
    """The index frame of PUSH_PULL_MANY (u32 key ids) or TENSORS (then u64 versions)."""
    out = np.asarray(keys, dtype="<u4").tobytes()
    return out if versions is None else out + np.asarray(versions, dtype="<u8").tobytes()


def unpack_keys(frame: Buffer, count: int, versions: bool = False) -> tuple[list[int], list[int]]:
    """(key ids, versions) from an index frame that must describe ``count`` tensors."""
    view = as_bytes_view(frame)
    want = count * (12 if versions else 4)
    if len(view) != want:
        raise MalformedFrameError(
            f"index frame is {len(view)} bytes; {count} tensor frame(s) need {want}"
        )
    keys = np.frombuffer(view, dtype="<u4", count=count).tolist()
    vers = (
        np.frombuffer(view, dtype="<u8", count=count, offset=4 * count).tolist() if versions else []
    )
    return keys, vers


def frames_nbytes(frames: Iterable[Buffer]) -> int:
    """Total bytes of a frame list (for traffic accounting)."""
    return sum(len(as_bytes_view(f)) for f in frames)
