"""The shipyard.ps wire format: a fixed binary header, raw payload frames, a MAC.

Why this shape: tensors must cross the wire without pickling (unsafe) and without
copies (slow). A message is a list of frames (on TCP: stream.py's framing)::

    [header (HEADER_SIZE bytes)] [payload frame]* [mac (mac_size(alg) bytes)]

* header: header.py (fixed size, little-endian; message type, dtype, shape, the MAC
  algorithm id, and the sender's session and sequence number).
* payload: raw little-endian tensor bytes (``np.frombuffer`` on receive, sent
  from the caller's buffer), or a small UTF-8 JSON document for control messages
  (``FLAG_JSON``). Never pickle.
* mac: integrity.py, keyed by the per-job secret (``SHIPYARD_PS_SECRET``) over the
  header and every payload frame. The default is aes-gmac (a 16-byte AES-256-GCM tag)
  when ``cryptography`` is installed, else hmac-sha256 (32 bytes); ``SHIPYARD_PS_MAC``
  picks one of the four, the header's MAC id says which one a message uses, and a
  shard answers in kind.

This module puts those together: ``encode`` / ``encode_tensor`` / ``encode_json``
build the frames of a message, ``decode`` takes them apart. The decoder checks, in
order: frame count and header size, magic, version, the MAC (a message failing any
of these is not trusted, so it is dropped, never answered), then the size limit,
message type, shape/dtype and announced versus actual payload length (an
authenticated message failing those gets an error reply). With a ``ReplayGuard``
(replay.py) it then refuses what is not new (seen before, or addressed to another
session), dropped and never answered. The stream layer (stream.py) bounds the work
an untrusted peer can cause before any of this: frame count and message size
limits, and a timeout mid-message.

The names of header.py, integrity.py, replay.py and buffers.py are re-exported here:
``wire`` stays the one import a user of the format needs.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .buffers import Buffer, as_bytes_view
from .errors import (
    AuthenticationError,
    MalformedFrameError,
    OversizedFrameError,
    PSConfigError,
    TruncatedFrameError,
    UnknownMessageTypeError,
    WireError,
)
from .header import (
    DTYPE_CODES,
    FLAG_APPLIED,
    FLAG_JSON,
    FLOAT_CODES,
    HEADER,
    HEADER_FORMAT,
    HEADER_SIZE,
    MAC_BLAKE3,
    MAC_GMAC,
    MAC_HMAC_SHA256,
    MAC_POLY1305,
    MAGIC,
    MAX_NDIM,
    PAD,
    PROTOCOL_VERSION,
    SESSION_OFFSET,
    U32_MAX,
    VALID_TYPES,
    Header,
    MsgType,
    code_dtype,
    dtype_code,
)
from .integrity import (
    GCM_ONE_SHOT_MAX,
    GCM_TAG_SIZE,
    MAC_ALGORITHMS,
    MAC_ENV,
    MAC_SIZE,
    NONCE_SIZE,
    ONE_TIME_KEY_MACS,
    PARALLEL_MIN,
    SECRET_ENV,
    SEGMENT,
    SESSION_KEYS_MAX,
    Signer,
    available_macs,
    default_mac,
    derive_key,
    hash_pool,
    mac_size,
    payload_digest,
    resolve_mac,
    secret_from_env,
)
from .replay import ReplayGuard

__all__ = [
    "DTYPE_CODES", "FLAG_APPLIED", "FLAG_JSON", "FLOAT_CODES", "GCM_ONE_SHOT_MAX",
    "GCM_TAG_SIZE", "HEADER", "HEADER_FORMAT", "HEADER_SIZE", "MAC_ALGORITHMS", "MAC_BLAKE3",
    "MAC_ENV", "MAC_GMAC", "MAC_HMAC_SHA256", "MAC_POLY1305", "MAC_SIZE", "MAGIC", "MAX_NDIM",
    "NONCE_SIZE", "ONE_TIME_KEY_MACS", "PARALLEL_MIN", "PROTOCOL_VERSION", "SECRET_ENV",
    "SEGMENT", "SESSION_KEYS_MAX", "SESSION_OFFSET", "U32_MAX", "Buffer", "Header", "Message",
    "MsgType", "ReplayGuard", "Signer", "as_bytes_view", "available_macs", "check_layout",
    "code_dtype", "decode", "default_mac", "derive_key", "dtype_code", "encode",
    "encode_json", "encode_tensor", "frames_nbytes", "hash_pool", "mac_size", "pack_keys",
    "payload_array", "payload_digest", "request_id_of", "resolve_mac", "secret_from_env",
    "unpack_keys",
]  # fmt: skip


#: dataclass(slots=True) is Python 3.10+; older framework environments get a plain dataclass
_SLOTS = {"slots": True} if sys.version_info >= (3, 10) else {}


@dataclass(**_SLOTS)
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
        return [hb, v, signer.gmac_one(hb, v)]
    views = [p if type(p) is bytes else as_bytes_view(p) for p in payload]
    total = sum(len(v) for v in views)
    if header.nbytes != total or header.mac_alg != alg:
        header = dataclasses.replace(header, nbytes=total, mac_alg=alg)
    hb = header.pack(session=signer.session, seq=signer.next_seq())
    if alg == MAC_GMAC:  # the default: no digests to consult, straight to the tag
        return [hb, *views, signer.gmac(hb, views, None)]
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
            request_id & U32_MAX, shard, step, n, *shape, *PAD[ndim],
            signer.session, signer.next_seq(), peer,
        )  # fmt: skip
    except struct.error as exc:
        raise PSConfigError(f"header field out of range: {exc}") from None
    return [hb, v, signer.gmac_one(hb, v)]


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
        head, p = frames[0], frames[1]
        if len(frames) == 3 and type(head) is bytes and type(p) is bytes:
            # one small frame (what the stream hands over for a small push_pull): no lists
            mac = frames[2]
            mac = mac if type(mac) is bytes else as_bytes_view(mac)
            header = Header.unpack(head)
            if header.mac_alg == MAC_GMAC:
                if len(mac) != GCM_TAG_SIZE:
                    raise MalformedFrameError(
                        f"MAC frame is {len(mac)} bytes, expected {GCM_TAG_SIZE}"
                    )
                if not hmac.compare_digest(signer.gmac_one(head, p), bytes(mac)):
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
            ok = hmac.compare_digest(signer.gmac(head, payload, None), bytes(mac))
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
    if header.msg_type not in VALID_TYPES:
        raise UnknownMessageTypeError(f"unknown message type {header.msg_type}")
    if total < header.nbytes:
        raise TruncatedFrameError(f"payload is {total} bytes, header announces {header.nbytes}")
    if total > header.nbytes:
        raise OversizedFrameError(f"payload is {total} bytes, header announces {header.nbytes}")
    dt = None
    if header.dtype and not header.flags & FLAG_JSON:
        dt = check_layout(header)  # dtype code and shape vs nbytes
    return Message(header, payload, HEADER_SIZE + total + mac_bytes, dt)


_RID_OFFSET = struct.calcsize("<4sBBBBHBBII")  # where the header keeps the request id
_U32 = struct.Struct("<I")


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
