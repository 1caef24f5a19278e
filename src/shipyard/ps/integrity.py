"""Message integrity for shipyard.ps: the MAC algorithms, the job key, the ``Signer``.

Why its own module: every message carries a MAC over its header and payload, keyed by
the per-job secret (``SHIPYARD_PS_SECRET``), so that only the job's own processes can
push gradients or read parameters. Four algorithms share one interface (``Signer.mac``
/ ``Signer.verify``); the header's MAC id says which one a message uses, a shard
answers in kind, and ``SHIPYARD_PS_MAC`` picks what a process sends with. Freshness
(a message accepted once) is replay.py's job; the framing around it is wire.py's.

``default_mac()``: **aes-gmac** when ``cryptography`` is installed (the ps extra),
else **hmac-sha256** (stdlib only). In the order of their ids:

* ``hmac-sha256`` (1), 32-byte MAC frame. Payload frames enter the HMAC through a
  SHA-256 digest per 1 MiB segment (``payload_digest``), so a large payload can be
  hashed on several cores (hashlib releases the GIL) and a shard can reuse the digest
  of a parameter version it already sent; the construction stays HMAC-SHA256 over the
  exact bytes (SHA-256 collision resistance)::

      mac = HMAC-SHA256(K, header || u32 n || D(frame_1) || ... || D(frame_n))
      D(frame) = u64 len(frame) || SHA256(seg_1) || SHA256(seg_2) || ...
      K = SHA256(b"shipyard.ps.v1\\0" || secret)

  SHA-256 runs at ~1.7 GB/s per core here, which caps a push+pull at about a fifth
  of loopback TCP on 2 cores (four hash passes per byte).
* ``blake3`` (2, needs the ``blake3`` package), 32 bytes: keyed BLAKE3 over the HMAC
  structure with D(frame) = u64 len || BLAKE3(frame).
* ``poly1305`` (3, needs ``cryptography``), 32 bytes: a one-time Poly1305 key per
  message, k = HMAC-SHA256(K', nonce || header) with a random 128-bit nonce, over
  u32 n || (u64 len || frame)*, sent as nonce || tag (~12 GB/s per core; the
  construction ChaCha20-Poly1305 and NaCl's secretbox use).
* ``aes-gmac`` (4, needs ``cryptography``; the default), 16 bytes: AES-256-GCM used
  as documented, with nothing encrypted: a key per sender session (HKDF-SHA256 of the
  job key, the session id as info), the nonce ``u64 seq || u32 0`` (a counter, never
  repeated under one key) and as associated data the header, the frame lengths and
  the frames; the MAC frame is GCM's tag (``Signer.gmac``; docs/decisions.md, issue
  17). One GHASH pass per byte, ~20 GB/s per core with AES-NI here.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import secrets
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from shipyard import settings

from .buffers import Buffer, as_bytes_view
from .errors import AuthenticationError, PSConfigError
from .header import (
    HEADER_SIZE,
    MAC_BLAKE3,
    MAC_GMAC,
    MAC_HMAC_SHA256,
    MAC_POLY1305,
    SESSION_OFFSET,
)

MAC_SIZE = 32
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

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SESSION_SEQ = struct.Struct("<QQ")  # the header's session and seq (at SESSION_OFFSET)
_GCM_IV = struct.Struct("<QI")  # the 96-bit GCM nonce: u64 seq || u32 0
_LAYOUT_1 = struct.Struct("<IQ")  # the frame layout of a one-frame payload (u32 1, u64 len)
_LAYOUT_0 = _U32.pack(0)


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


def hash_pool() -> ThreadPoolExecutor:
    """The shared thread pool large payloads are hashed and verified on (made on first use)."""
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
        from blake3 import blake3
    except ImportError:
        return None
    return blake3


def _poly1305() -> Any:
    """``cryptography``'s Poly1305 class, or None when the optional package is missing."""
    try:
        from cryptography.hazmat.primitives.poly1305 import Poly1305
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
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
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
        return head + b"".join(hash_pool().map(_seg_digest, segs))
    return head + b"".join(hashlib.sha256(s).digest() for s in segs)


class Signer:
    """Computes and checks message MACs for one job secret.

    ``alg`` picks the MAC this side *sends* with (default ``$SHIPYARD_PS_MAC``, else
    ``default_mac()``); any available algorithm is accepted on receive, and a shard
    answers with the algorithm of the request. Each Signer is also a sender session:
    a random ``session`` id and a counter (``next_seq``) that ``wire.encode`` stamps
    into every header it sends.
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
            return self.gmac(header, payload, nonce)
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

    def gmac(self, header: bytes, payload: Sequence[Buffer], nonce: bytes | None) -> bytes:
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
        session, seq = _SESSION_SEQ.unpack_from(header, SESSION_OFFSET)
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

    def gmac_one(self, header: bytes, v: Any) -> bytes:
        """``gmac(header, [v], None)`` for a small frame whose session key is known (every
        message of a small push_pull): the same tag, without the general path's checks
        and dispatch; anything else goes the general way."""
        session, seq = _SESSION_SEQ.unpack_from(header, SESSION_OFFSET)
        hit = self._session_keys.get(session)
        n = len(v)
        if hit is None or n > GCM_ONE_SHOT_MAX or len(header) != HEADER_SIZE:
            return self.gmac(header, (v,), None)
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
