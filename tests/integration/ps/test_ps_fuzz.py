"""Fuzz a live shard with random, mutated and hostile-but-authenticated frames.

The shard must stay up, keep serving a good client exactly, count every rejected
message once by reason, and answer (only) authenticated bad requests with an
error reply.
"""

from __future__ import annotations

import dataclasses
import random
import select
import socket
import time

import numpy as np
import pytest

from shipyard.ps import wire
from shipyard.ps.client import PSClient
from shipyard.ps.launch import start_shards, stop_shards
from shipyard.ps.stream import parse_endpoint, prefix
from shipyard.ps.wire import Header, MsgType

SECRET = "fuzz-secret"
LIMIT = 1 << 20
FRAME_TIMEOUT = 1.0


@pytest.fixture
def shard(tmp_path):
    shards = start_shards(
        1, SECRET, run_dir=str(tmp_path), max_message_bytes=LIMIT, frame_timeout=FRAME_TIMEOUT
    )
    yield shards[0]
    stop_shards(shards, timeout=10)


class Raw:
    """A bare TCP connection: sends whatever frames (or bytes) it is given. It says
    HELLO first, so that the messages it signs name the shard's session."""

    def __init__(self, endpoint):
        self.sock = socket.create_connection(parse_endpoint(endpoint), timeout=20)
        self.signer = wire.Signer(SECRET)
        self.session = 0
        self.send(self.signed(MsgType.HELLO, payload=b"{}", flags=wire.FLAG_JSON))
        self.session = self.reply().header.session

    def signed(self, mtype, key=0, payload=None, signer=None, **kw):
        kw.setdefault("peer", self.session)
        hdr = Header(mtype, key=key, worker=9, request_id=kw.pop("request_id", 1), **kw)
        body = [payload] if payload is not None else []
        return wire.encode(signer or self.signer, hdr, body)

    def send(self, frames):
        views = [memoryview(f).cast("B") for f in frames] or [memoryview(b"")]
        self.sock.sendall(prefix(views) + b"".join(bytes(v) for v in views))

    def _exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    def reply(self, timeout=20.0):
        if not select.select([self.sock], [], [], timeout)[0]:
            return None
        (count,) = np.frombuffer(self._exact(4), "<u4")
        lens = np.frombuffer(self._exact(8 * int(count)), "<u8")
        return wire.decode(wire.Signer(SECRET), [self._exact(int(n)) for n in lens])

    def no_reply(self):
        return not select.select([self.sock], [], [], 0)[0]

    def closed_by_peer(self, timeout=30.0):
        """True once the shard has closed this connection (what it does to bad streams)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if select.select([self.sock], [], [], 0.1)[0] and not self.sock.recv(65536):
                    return True
            except (ConnectionError, OSError):
                return True
        return False

    def close(self):
        self.sock.close()


def mutate(frames, rng):
    """A corrupted copy of a valid message (always invalid)."""
    fr = [bytearray(memoryview(f).cast("B")) for f in frames]
    kind = rng.choice(["flip", "truncate", "dup", "drop", "append"])
    if kind == "flip":
        i = rng.randrange(len(fr))
        if not fr[i]:
            i = 0
        fr[i][rng.randrange(len(fr[i]))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        i = rng.choice([j for j, f in enumerate(fr) if len(f)])
        fr[i] = fr[i][: rng.randrange(len(fr[i]))]
    elif kind == "dup" and len(fr) > 2:
        fr.insert(1, fr[1])
    elif kind == "drop" and len(fr) > 2:
        del fr[1]
    else:
        fr.insert(len(fr) - 1, bytearray(rng.randbytes(rng.randrange(1, 64))))
    return fr


def test_fuzzed_shard_stays_up_counts_everything_and_serves_a_good_client(shard):
    rng = random.Random(1234)
    good = PSClient([shard.endpoint], worker_id=0, secret=SECRET, timeout=30, heartbeat_interval=0)
    good.register(
        {"x": np.zeros(8, np.float32), "y": np.zeros((4, 4), np.float32)},
        {"name": "sgd", "lr": 1.0},
    )
    kid = good.placement("x").chunks[0].key_id
    f32 = wire.dtype_code(np.float32)
    raw = Raw(shard.endpoint)
    signed = raw.signed
    valid_push = signed(MsgType.PUSH, kid, np.ones(8, np.float32), dtype=f32, shape=(8,))
    valid_pull = signed(MsgType.PULL, kid)
    valid_json = wire.encode_json(
        raw.signer, Header(msg_type=MsgType.SET_LR, worker=9, peer=raw.session), {"lr": 1.0}
    )
    expected_x = 0.0
    n_dropped = 0
    try:
        for i in range(600):
            r = rng.random()
            if r < 0.3:  # random garbage
                n = rng.randrange(0, 5)
                frames = [
                    rng.randbytes(rng.choice([0, 3, wire.HEADER_SIZE, rng.randrange(200)]))
                    for _ in range(n)
                ]
                if n >= 1 and rng.random() < 0.5:  # plausible header start
                    frames[0] = b"SYPS" + bytes([1]) + rng.randbytes(wire.HEADER_SIZE - 5)
            elif r < 0.9:
                frames = mutate(rng.choice([valid_push, valid_pull, valid_json]), rng)
            else:  # signed with the wrong secret
                frames = signed(
                    MsgType.PUSH,
                    kid,
                    np.ones(8, np.float32),
                    signer=wire.Signer("intruder"),
                    dtype=f32,
                    shape=(8,),
                )
            raw.send(frames)
            n_dropped += 1
            if i % 100 == 99:  # the good client, in the middle of the storm
                out = good.push_pull({"x": np.ones(8, np.float32)})
                expected_x -= 1.0
                assert np.array_equal(out["x"], np.full(8, expected_x, np.float32))
        assert raw.no_reply()  # unauthenticated messages are never answered
        # a captured, correctly signed push re-sent three times is applied once
        captured = signed(MsgType.PUSH, kid, np.ones(8, np.float32), dtype=f32, shape=(8,))
        for _ in range(4):
            raw.send(captured)
        assert raw.reply().header.msg_type == MsgType.OK
        expected_x -= 1.0
        # a valid request on the same connection is served after everything sent before it
        raw.send(
            wire.encode_json(
                raw.signer, Header(msg_type=MsgType.STATS, worker=9, peer=raw.session), {}
            )
        )
        stats = raw.reply().json()
        assert stats["rejected"].pop("replayed") == 3
        assert sum(stats["rejected"].values()) == n_dropped
        assert set(stats["rejected"]) <= {"bad_mac", "malformed", "bad_magic", "bad_version"}
        assert stats["rejected"]["bad_mac"] > 50 and stats["rejected"]["malformed"] > 50
        assert np.array_equal(good.pull("x"), np.full(8, expected_x, np.float32))
        assert shard.alive
    finally:
        raw.close()
        good.close()


def test_authenticated_bad_requests_get_error_replies(shard):
    good = PSClient([shard.endpoint], worker_id=0, secret=SECRET, timeout=30, heartbeat_interval=0)
    good.register(
        {"x": np.zeros(8, np.float32), "n": np.zeros(2, np.int32)}, {"name": "sgd", "lr": 1.0}
    )
    kid = good.placement("x").chunks[0].key_id
    nid = good.placement("n").chunks[0].key_id
    f32, f64 = wire.dtype_code(np.float32), wire.dtype_code(np.float64)
    raw = Raw(shard.endpoint)
    signed = raw.signed
    s = raw.signer
    x8 = np.ones(8, np.float32).tobytes()

    def hand_signed(header, payload):  # header fields that encode() would fix up
        hb = dataclasses.replace(header, peer=raw.session).pack(s.session, s.next_seq())
        return [hb, *payload, s.mac(hb, payload, alg=header.mac_alg)]

    cases = [
        (signed(MsgType.PUSH, 4242, np.ones(8, np.float32), dtype=f32, shape=(8,)), "unknown_key"),
        (signed(MsgType.PULL, 4242), "unknown_key"),
        (
            signed(MsgType.PUSH, kid, np.ones(9, np.float32), dtype=f32, shape=(9,)),
            "shape_mismatch",
        ),
        (
            signed(MsgType.PUSH, kid, np.ones((2, 4), np.float32), dtype=f32, shape=(2, 4)),
            "shape_mismatch",
        ),
        (
            signed(MsgType.PUSH, kid, np.ones(8, np.float64), dtype=f64, shape=(8,)),
            "dtype_mismatch",
        ),
        (
            signed(
                MsgType.PUSH, nid, np.ones(2, np.int32), dtype=wire.dtype_code(np.int32), shape=(2,)
            ),
            "not_trainable",
        ),
        (
            hand_signed(
                Header(msg_type=MsgType.PUSH, key=kid, dtype=f32, shape=(8,), nbytes=32), [x8[:20]]
            ),
            "truncated",
        ),
        (
            hand_signed(
                Header(msg_type=MsgType.PUSH, key=kid, dtype=f32, shape=(8,), nbytes=32),
                [x8 + b"1234"],
            ),
            "oversized",
        ),
        (hand_signed(Header(msg_type=77, key=kid), []), "unknown_type"),
        (signed(MsgType.TENSOR, kid), "bad_request"),
        (signed(MsgType.PULL, kid, shard=5), "wrong_shard"),
        (signed(MsgType.REGISTER, payload=b"[1, 2", flags=wire.FLAG_JSON), "bad_request"),
        (
            signed(MsgType.REGISTER, payload=b'{"keys": [{"id": "x"}]}', flags=wire.FLAG_JSON),
            "bad_request",
        ),
        (
            wire.encode_json(
                s,
                Header(msg_type=MsgType.REGISTER, worker=9, peer=raw.session),
                {"keys": [{"id": kid, "name": "x", "shape": [3], "dtype": "float32"}]},
            ),
            "config_mismatch",
        ),
        (
            signed(
                MsgType.PUSH,
                kid,
                np.ones(LIMIT // 4 + 1024, np.float32),
                dtype=f32,
                shape=(LIMIT // 4 + 1024,),
            ),
            "oversized",
        ),
    ]
    try:
        for frames, code in cases:
            raw.send(frames)
            rep = raw.reply()
            assert rep is not None, code
            assert rep.header.msg_type == MsgType.ERROR and rep.json()["code"] == code, (
                code,
                rep.json(),
            )
        # far above the limit: the shard reads the frame lengths, drops the connection
        # before reading the rest, and counts it
        big = signed(MsgType.PUSH, kid, np.zeros(LIMIT, np.float32), dtype=f32, shape=(LIMIT,))
        try:
            raw.send(big)
        except ConnectionError:  # the shard may close before the last byte is sent
            pass
        assert raw.closed_by_peer()
        stats = good.shard_stats()[0]
        assert stats["rejected"]["unknown_key"] == 2 and stats["rejected"]["shape_mismatch"] == 2
        assert stats["rejected"]["oversized"] == 3 and stats["rejected"]["truncated"] == 1
        assert sum(stats["rejected"].values()) == len(cases) + 1
        assert np.array_equal(good.push_pull({"x": np.ones(8, np.float32)})["x"], -np.ones(8))
        assert shard.alive
    finally:
        raw.close()
        good.close()


def test_a_peer_that_stops_mid_frame_is_timed_out_without_blocking_others(shard):
    good = PSClient([shard.endpoint], worker_id=0, secret=SECRET, timeout=30, heartbeat_interval=0)
    good.register({"x": np.zeros(8, np.float32)}, {"name": "sgd", "lr": 1.0})
    stuck = Raw(shard.endpoint)
    frames = stuck.signed(MsgType.SET_LR, payload=b'{"lr": 1.0}' * 100, flags=wire.FLAG_JSON)
    views = [bytes(memoryview(f).cast("B")) for f in frames]
    whole = prefix([memoryview(v) for v in views]) + b"".join(views)
    stuck.sock.sendall(whole[: len(whole) // 2])  # ... and nothing more
    garbage = socket.create_connection(parse_endpoint(shard.endpoint), timeout=20)
    garbage.sendall(b"\xff" * 64)  # a frame count far above the limit: dropped at once
    try:
        for i in range(5):  # the shard keeps serving while one peer hangs mid-message
            assert good.push_pull({"x": np.ones(8, np.float32)})["x"][0] == -(i + 1)
        assert stuck.closed_by_peer(timeout=30 * FRAME_TIMEOUT)
        stats = good.shard_stats()[0]
        assert stats["rejected"]["frame_timeout"] == 1 and stats["rejected"]["malformed"] == 1
        assert good.pull("x")[0] == -5.0
        assert shard.alive
    finally:
        garbage.close()
        stuck.close()
        good.close()
