"""The bytes on the wire, pinned: the frames of fixed messages hash to what the format
produced before its MACs and replay guard moved into modules of their own (issue 26).

Why: a shard and a worker of different builds must still understand each other, and a
refactor of the MAC code must not change one byte of what is sent. The digests were
taken from the commit before the split (1778bbd) with this same code; a change of the
format must come with a protocol version bump and new digests here.
"""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest

from shipyard.ps import wire
from shipyard.ps.wire import Header, MsgType

GOLDEN = {
    "hmac-sha256": "68754dd8fbacd3aa22aa76063fdbc9b0536ff078f4a3c751b487e72e69457d54",
    "blake3": "ae227a5eca75b4cd0e0449de54cdd8b1e31a0f4e1edd3f7da440d91c6b945ac1",
    "aes-gmac": "f3070379efc3fb4a64dd30c2926b060fee1dd008e1661b734caed2696d3a297e",
}
POLY1305_GOLDEN = "000102030405060708090a0b0c0d0e0fd6a587470c8469a0cb389e50cda727b7"


def _signer(name: str) -> wire.Signer:
    """A signer whose session and counter are fixed (normally random and from 1)."""
    s = wire.Signer("golden-secret", name)
    s.session = 0x1122334455667788
    s._seq = itertools.count(7)
    return s


def _frames(s: wire.Signer) -> bytes:
    """A tensor request, a JSON HELLO and a large tensor (the streamed GCM path)."""
    arr = np.arange(12, dtype="<f4").reshape(3, 4)
    hdr = Header(
        MsgType.PUSH_PULL, key=3, worker=2, request_id=9, shard=1, step=5, dtype=2,
        shape=(3, 4), peer=0xABCDEF,
    )  # fmt: skip
    frames = wire.encode(s, hdr, [arr])
    frames += wire.encode_json(
        s, Header(MsgType.HELLO, worker=2, request_id=10), {"worker": 2, "pid": 1}
    )
    big = np.arange(300_000, dtype="<f8")
    frames += wire.encode_tensor(
        s, MsgType.PUSH_PULL, 4, 2, 11, 0, 6, 3, big.shape, big, 0x77, s.alg
    )
    return b"".join(bytes(wire.as_bytes_view(f)) for f in frames)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_frames_are_byte_for_byte_those_of_the_format(name: str) -> None:
    if name not in wire.available_macs():
        pytest.skip(f"MAC {name} needs an optional package that is not installed")
    assert hashlib.sha256(_frames(_signer(name))).hexdigest() == GOLDEN[name]


def test_a_poly1305_mac_with_a_given_nonce_is_that_of_the_format() -> None:
    if "poly1305" not in wire.available_macs():
        pytest.skip("poly1305 needs 'cryptography'")
    s = _signer("poly1305")
    hb = Header(MsgType.PUSH, dtype=2, shape=(4,), nbytes=16, mac_alg=wire.MAC_POLY1305).pack()
    payload = [np.arange(4, dtype="<f4")]
    mac = s.mac(hb, payload, alg=wire.MAC_POLY1305, nonce=bytes(range(16)))
    assert mac.hex() == POLY1305_GOLDEN
    assert s.verify(hb, payload, mac, alg=wire.MAC_POLY1305)
