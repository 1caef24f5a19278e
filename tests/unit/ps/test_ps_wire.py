"""Wire format: round trips, MAC checks, and rejection of every kind of bad frame."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from shipyard.ps import wire
from shipyard.ps.errors import (
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
from shipyard.ps.wire import Header, MsgType

SIGNER = wire.Signer("secret-one")
OTHER = wire.Signer("secret-two")


def frames_of(arr, **kw):
    h = Header(
        msg_type=MsgType.PUSH,
        key=7,
        worker=3,
        request_id=99,
        shard=1,
        step=12,
        dtype=wire.dtype_code(arr.dtype),
        shape=arr.shape,
        **kw,
    )
    return [bytes(memoryview(f).cast("B")) for f in wire.encode(SIGNER, h, [arr])]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64", "uint8", "bool"])
def test_tensor_round_trip(dtype):
    arr = (np.arange(24).reshape(2, 3, 4) % 2).astype(dtype)
    frames = frames_of(arr)
    assert len(frames[0]) == wire.HEADER_SIZE and len(frames[-1]) == wire.mac_size(SIGNER.alg)
    msg = wire.decode(SIGNER, frames)
    h = msg.header
    assert (h.msg_type, h.key, h.worker, h.request_id, h.shard, h.step) == (
        MsgType.PUSH,
        7,
        3,
        99,
        1,
        12,
    )
    assert h.shape == (2, 3, 4) and h.nbytes == arr.nbytes
    out = msg.tensor()
    assert out.dtype == arr.dtype and np.array_equal(out, arr)
    assert msg.wire_bytes == sum(len(f) for f in frames)


def test_payload_is_not_copied_on_encode_or_decode():
    arr = np.arange(1 << 16, dtype=np.float32)
    frames = wire.encode(SIGNER, Header(msg_type=MsgType.PUSH, dtype=2, shape=arr.shape), [arr])
    assert np.shares_memory(np.frombuffer(frames[1], np.float32), arr)
    buf = bytearray(frames[1])
    msg = wire.decode(SIGNER, [frames[0], buf, frames[2]])
    assert np.shares_memory(msg.tensor(), np.frombuffer(buf, np.float32))


def test_large_payload_round_trip_uses_segment_digests():
    arr = np.random.default_rng(0).standard_normal(3 * wire.SEGMENT // 4 + 17).astype(np.float32)
    frames = frames_of(arr)
    assert np.array_equal(wire.decode(SIGNER, frames).tensor(), arr)
    # the parallel and the sequential digest are the same function
    assert wire.payload_digest(arr, parallel=True) == wire.payload_digest(arr, parallel=False)
    big = np.zeros(wire.PARALLEL_MIN + 5, np.uint8)
    assert wire.payload_digest(big, True) == wire.payload_digest(big, False)


def test_json_round_trip():
    h = Header(msg_type=MsgType.REGISTER, worker=1)
    frames = wire.encode_json(SIGNER, h, {"keys": [{"id": 1}], "x": "é"})
    msg = wire.decode(SIGNER, frames)
    assert msg.header.flags & wire.FLAG_JSON
    assert msg.json() == {"keys": [{"id": 1}], "x": "é"}


def test_header_only_message():
    frames = wire.encode(SIGNER, Header(msg_type=MsgType.PULL, key=5))
    assert len(frames) == 2
    assert wire.decode(SIGNER, frames).payload == []


def test_wrong_secret_is_an_authentication_error():
    frames = frames_of(np.ones(3, np.float32))
    with pytest.raises(AuthenticationError) as ei:
        wire.decode(OTHER, frames)
    assert ei.value.authenticated is False and ei.value.code == ErrorCode.BAD_MAC


def test_every_single_byte_flip_is_rejected():
    frames = frames_of(np.arange(6, dtype=np.float32))
    for fi, frame in enumerate(frames):
        for pos in range(len(frame)):
            mutated = list(frames)
            b = bytearray(frame)
            b[pos] ^= 0x41
            mutated[fi] = bytes(b)
            with pytest.raises(WireError) as ei:
                wire.decode(SIGNER, mutated)
            assert ei.value.authenticated is False, (fi, pos)


def test_truncated_and_extended_frames_are_rejected():
    frames = frames_of(np.arange(6, dtype=np.float32))
    cases = [
        [frames[0], frames[1][:-4], frames[2]],  # payload cut
        [frames[0], frames[1] + b"\0\0\0\0", frames[2]],  # payload grown
        [frames[0][:-1], frames[1], frames[2]],  # header cut
        [frames[0], frames[1], frames[2][:-1]],  # mac cut
        [frames[0], frames[2]],  # payload frame dropped
        [frames[0]],  # only a header
        [],
    ]
    for bad in cases:
        with pytest.raises(WireError):
            wire.decode(SIGNER, bad)


def test_authenticated_but_inconsistent_messages_say_why():
    """A client bug (not an attacker): the MAC verifies but the content does not add up."""
    arr = np.arange(6, dtype=np.float32)
    hb = Header(msg_type=MsgType.PUSH, dtype=2, shape=(6,), nbytes=24).pack()

    def signed(header_bytes, payload):
        return [header_bytes, *payload, SIGNER.mac(header_bytes, payload, alg=wire.MAC_HMAC_SHA256)]

    with pytest.raises(TruncatedFrameError) as ei:
        wire.decode(SIGNER, signed(hb, [arr.tobytes()[:20]]))
    assert ei.value.authenticated and ei.value.header.msg_type == MsgType.PUSH
    with pytest.raises(OversizedFrameError):
        wire.decode(SIGNER, signed(hb, [arr.tobytes() + b"xxxx"]))
    bad_type = bytearray(hb)
    bad_type[5] = 42  # message type byte
    with pytest.raises(UnknownMessageTypeError) as ei:
        wire.decode(SIGNER, signed(bytes(bad_type), [arr.tobytes()]))
    assert ei.value.code == ErrorCode.UNKNOWN_TYPE and ei.value.authenticated
    bad_shape = Header(msg_type=MsgType.PUSH, dtype=2, shape=(7,), nbytes=24).pack()
    with pytest.raises(MalformedFrameError, match="shape"):
        wire.decode(SIGNER, signed(bad_shape, [arr.tobytes()]))
    bad_dtype = Header(msg_type=MsgType.PUSH, dtype=99, shape=(6,), nbytes=24).pack()
    with pytest.raises(MalformedFrameError, match="dtype code"):
        wire.decode(SIGNER, signed(bad_dtype, [arr.tobytes()]))


def test_magic_version_and_limit_checks_come_before_trust():
    frames = frames_of(np.ones(4, np.float32))
    bad_magic = b"XXXX" + frames[0][4:]
    with pytest.raises(MalformedFrameError) as ei:
        wire.decode(SIGNER, [bad_magic, *frames[1:]])
    assert ei.value.code == ErrorCode.BAD_MAGIC
    bad_version = frames[0][:4] + bytes([wire.PROTOCOL_VERSION + 1]) + frames[0][5:]
    with pytest.raises(MalformedFrameError) as ei:
        wire.decode(SIGNER, [bad_version, *frames[1:]])
    assert ei.value.code == ErrorCode.BAD_VERSION
    with pytest.raises(OversizedFrameError):
        wire.decode(SIGNER, frames, max_payload=15)


def test_header_layout_is_fixed():
    assert wire.HEADER_SIZE == struct.calcsize(wire.HEADER_FORMAT) == 132
    hb = Header(msg_type=MsgType.PULL, key=1, shape=(2, 3)).pack()
    assert hb[:4] == b"SYPS" and hb[4] == wire.PROTOCOL_VERSION and hb[5] == MsgType.PULL
    with pytest.raises(PSConfigError):
        Header(msg_type=MsgType.PUSH, shape=(1,) * 9).pack()
    with pytest.raises(PSConfigError):
        Header(msg_type=MsgType.PUSH, key=-1).pack()


def test_dtype_codes():
    assert wire.code_dtype(wire.dtype_code(np.float32)) == np.dtype("<f4")
    assert wire.dtype_code(np.dtype(">f4")) == wire.dtype_code(np.float32)
    with pytest.raises(PSConfigError, match="not supported"):
        wire.dtype_code(np.complex64)
    with pytest.raises(PSConfigError, match="not supported"):
        wire.dtype_code(object)


def test_secret_handling(monkeypatch):
    monkeypatch.delenv(wire.SECRET_ENV, raising=False)
    with pytest.raises(PSConfigError, match="SHIPYARD_PS_SECRET is not set"):
        wire.secret_from_env()
    monkeypatch.setenv(wire.SECRET_ENV, "from-env")
    assert wire.secret_from_env() == b"from-env"
    assert wire.secret_from_env("explicit") == b"explicit"
    with pytest.raises(PSConfigError, match="empty"):
        wire.Signer("")


def test_mac_algorithm_selection(monkeypatch):
    with pytest.raises(PSConfigError, match="unknown MAC"):
        wire.Signer("s", "md5")
    monkeypatch.setenv(wire.MAC_ENV, "hmac-sha256")
    assert wire.Signer("s").alg == wire.MAC_HMAC_SHA256
    monkeypatch.delenv(wire.MAC_ENV)
    if (
        "aes-gmac" in wire.available_macs()
    ):  # the ps extra installs cryptography: the fastest MAC by default
        assert wire.default_mac() == "aes-gmac" and wire.Signer("s").alg == wire.MAC_GMAC
    if "blake3" not in wire.available_macs():
        with pytest.raises(PSConfigError, match="pip install blake3"):
            wire.Signer("s", "blake3")


def test_blake3_mac_round_trip_and_rejection():
    pytest.importorskip("blake3")
    b3 = wire.Signer("secret-one", "blake3")
    arr = np.arange(3 * wire.SEGMENT, dtype=np.uint8)
    frames = wire.encode(b3, Header(msg_type=MsgType.PUSH, dtype=8, shape=arr.shape), [arr])
    msg = wire.decode(SIGNER, frames)  # the receiver accepts any available algorithm
    assert msg.header.mac_alg == wire.MAC_BLAKE3 and np.array_equal(msg.tensor(), arr)
    tampered = bytearray(memoryview(frames[1]).cast("B"))
    tampered[12345] ^= 1
    with pytest.raises(AuthenticationError):
        wire.decode(SIGNER, [frames[0], bytes(tampered), frames[2]])
    with pytest.raises(AuthenticationError):
        wire.decode(wire.Signer("secret-two"), frames)


@pytest.mark.parametrize("name", ["poly1305", "aes-gmac"])
def test_one_time_key_mac_round_trip_and_rejection(name):
    pytest.importorskip("cryptography")
    signer = wire.Signer("secret-one", name)
    arr = np.arange(3 * wire.SEGMENT, dtype=np.uint8)
    hdr = Header(msg_type=MsgType.PUSH, dtype=8, shape=arr.shape)
    frames = wire.encode(signer, hdr, [arr])
    again = wire.encode(signer, hdr, [arr])
    assert bytes(frames[-1]) != bytes(
        again[-1]
    )  # a fresh nonce (poly1305) or sequence number (aes-gmac) per message
    msg = wire.decode(SIGNER, frames)  # the receiver accepts any available algorithm
    assert msg.header.mac_alg == wire.MAC_ALGORITHMS[name] and np.array_equal(msg.tensor(), arr)
    # frame boundaries are authenticated: the same bytes split differently do not verify
    split = [frames[0], memoryview(frames[1])[:100], memoryview(frames[1])[100:], frames[2]]
    with pytest.raises(AuthenticationError):
        wire.decode(SIGNER, split)
    for i in (0, 1, 2):  # header, payload, nonce/tag: any flipped bit is caught
        mutated = [bytearray(memoryview(f).cast("B")) for f in frames]
        mutated[i][7] ^= 1
        with pytest.raises(WireError):
            wire.decode(SIGNER, [bytes(m) for m in mutated])
    with pytest.raises(AuthenticationError):
        wire.decode(wire.Signer("secret-two"), frames)


@pytest.mark.parametrize("name", ["aes-gmac", "poly1305", "hmac-sha256"])
@pytest.mark.parametrize("size", [256, 5000])  # one-shot GCM, and above GCM_ONE_SHOT_MAX
def test_encode_tensor_is_encode_of_the_same_header(name, size):
    """The small push_pull's direct packing (wire.encode_tensor, issue 17 part 4) gives
    the frames ``encode(Header(...))`` gives: the same header bytes, payload and MAC
    under the same sequence number; and decode checks them as it checks any message."""
    if name != "hmac-sha256":
        pytest.importorskip("cryptography")
    arr = np.arange(size, dtype=np.float32).reshape(-1, 4)
    alg = wire.MAC_ALGORITHMS[name]
    fast, slow = wire.Signer("secret-one", name), wire.Signer("secret-one", name)
    slow.session = fast.session  # two senders of one session, at the same counter
    fields = (MsgType.PUSH_PULL, 7, 3, 99 + (1 << 33), 1, 12, wire.dtype_code(arr.dtype))
    got = wire.encode_tensor(fast, *fields, arr.shape, arr, 0xABC, alg)
    want = wire.encode(slow, Header(*fields, arr.shape, arr.nbytes, 0, alg, 0, 0, 0xABC), [arr])
    as_bytes = [bytes(memoryview(f).cast("B")) for f in got]
    if name == "poly1305":  # a random nonce per message: the same header and payload
        assert as_bytes[:2] == [bytes(memoryview(f).cast("B")) for f in want[:2]]
    else:
        assert as_bytes == [bytes(memoryview(f).cast("B")) for f in want]
    guard = wire.ReplayGuard(0xABC)
    msg = wire.decode(SIGNER, as_bytes, guard=guard)
    assert msg.header.request_id == 99 and msg.header.peer == 0xABC
    assert np.array_equal(msg.tensor(), arr) and msg.tensor().shape == arr.shape
    with pytest.raises(ReplayedMessageError):  # the same frames again: refused
        wire.decode(SIGNER, as_bytes, guard=guard)
    tampered = [as_bytes[0], b"\x01" + as_bytes[1][1:], as_bytes[2]]
    with pytest.raises(AuthenticationError):
        wire.decode(SIGNER, tampered)
    with pytest.raises(PSConfigError, match="out of range"):
        wire.encode_tensor(fast, MsgType.PUSH_PULL, 1 << 40, *fields[2:], arr.shape, arr, 1, alg)


def test_a_decoded_tensor_keeps_the_checked_layout():
    """decode checks the dtype and shape once and the Message remembers the dtype, so
    tensor() does not check again; a Message built by hand is still checked there."""
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    msg = wire.decode(SIGNER, frames_of(arr))
    assert msg.dtype == np.dtype("<f8") and np.array_equal(msg.tensor(), arr)
    bad = wire.Message(Header(msg_type=MsgType.PUSH, dtype=3, shape=(5,), nbytes=96), [b"x" * 96])
    with pytest.raises(MalformedFrameError, match="header says 96"):
        bad.tensor()
