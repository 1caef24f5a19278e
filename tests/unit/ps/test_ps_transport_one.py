"""The one-reply wait over real sockets (issue 17 part 4): ``SocketTransport.wait_one``
and the small push_pull path that uses it, against a shard that meddles with its replies.

The shard here is a real ``ServerCore`` behind a real TCP socket (stream.py's framing),
served from a thread so the test can put extra frames on the wire before each real reply:
a copy of an earlier reply, frames that answer no request, a reply with a flipped MAC
byte, or nothing at all. What must hold on the fast path is what holds on the general
one: stray and stale replies dropped, replays refused by the replay guard, a forged reply
an AuthenticationError, silence a PSTimeoutError.
"""

from __future__ import annotations

import itertools
import select
import socket
import threading
import time

import numpy as np
import pytest

from shipyard.ps import wire
from shipyard.ps.client import PSClient
from shipyard.ps.core import ServerConfig, ServerCore
from shipyard.ps.errors import AuthenticationError, PSTimeoutError
from shipyard.ps.stream import PeerClosed, Reader, Writer
from shipyard.ps.transport import SocketTransport
from shipyard.ps.wire import MsgType

SECRET = "transport-one-secret"
_TYPE_AT = 5  # the message type's byte in the header (HEADER_FORMAT: magic, version, type)


class MeddlingShard:
    """A ServerCore on a TCP socket; ``mode`` says what happens around PUSH_PULL replies:
    "meddle" (the previous reply and a frame list for no request go first), "forge"
    (the real reply with its MAC flipped goes first), "drop" (no reply)."""

    def __init__(self, mode: str) -> None:
        pytest.importorskip("cryptography")
        self.mode = mode
        self.core = ServerCore(ServerConfig(index=0, num_shards=1), SECRET)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.last: list[bytes] | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(10)
        conn, _ = self.listener.accept()
        conn.setblocking(False)
        reader, writer = Reader(conn, 1 << 24, 64), Writer(conn)
        with conn:
            while not self.stop.is_set():
                writer.flush()
                if not select.select([conn], [], [], 0.02)[0]:
                    continue
                try:
                    messages = reader.read()
                except PeerClosed:
                    return
                for frames in messages:
                    pushpull = bytes(memoryview(frames[0]).cast("B"))[_TYPE_AT] == MsgType.PUSH_PULL
                    for out in self.core.handle(b"peer", frames, time.monotonic()):
                        real = [bytes(memoryview(f).cast("B")) for f in out.frames]
                        if out.hold is not None:
                            out.hold.released = True  # copied above
                        if pushpull:
                            if self.mode == "drop":
                                continue
                            if self.mode == "meddle":
                                if self.last is not None:
                                    writer.send(self.last)
                                writer.send([b"\0" * wire.HEADER_SIZE, b"x", b"y"])
                            if self.mode == "forge":
                                forged = bytearray(real[-1])
                                forged[0] ^= 1
                                writer.send([*real[:-1], bytes(forged)])
                            self.last = real
                        writer.send(real)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.listener.close()


@pytest.fixture
def shard_of():
    made: list[MeddlingShard] = []

    def make(mode: str) -> MeddlingShard:
        made.append(MeddlingShard(mode))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _client(shard: MeddlingShard, timeout: float = 20.0) -> PSClient:
    c = PSClient(
        [shard.endpoint], worker_id=0, secret=SECRET, heartbeat_interval=0, timeout=timeout
    )
    c.register({"w": np.zeros(4, np.float32)}, {"name": "sgd", "lr": 1.0})
    return c


def test_stray_and_earlier_replies_are_dropped_on_the_socket_path(shard_of, caplog):
    shard = shard_of("meddle")
    c = _client(shard)
    out = np.empty(4, np.float32)
    for step in range(1, 4):
        got = c.push_pull({"w": np.ones(4, np.float32)}, outs={"w": out})
        assert got["w"] is out and np.array_equal(out, -step * np.ones(4)) and c.step == step
    # a request id used again (u32 wrap-around): the copy of the earlier reply now names
    # this request, and only the replay guard tells it from the real answer
    c._state.rids = itertools.count(c._state.rids.__next__() - 1)
    with caplog.at_level("WARNING", logger="shipyard.ps.client"):
        got = c.push_pull({"w": np.ones(4, np.float32)})["w"]
    assert "dropped a reply that is not new" in caplog.text  # the replay guard said no
    assert np.array_equal(got, -4 * np.ones(4)) and got.flags.writeable
    assert shard.core.stats.pushes == 4  # every gradient applied once
    c.close()


def test_a_forged_reply_is_an_authentication_error_on_the_socket_path(shard_of):
    c = _client(shard_of("forge"))
    with pytest.raises(AuthenticationError, match="MAC does not verify"):
        c.push_pull({"w": np.ones(4, np.float32)})
    c.close(leave=False)


def test_silence_is_a_timeout_on_the_socket_path(shard_of):
    c = _client(shard_of("drop"), timeout=0.3)
    with pytest.raises(PSTimeoutError, match="no reply within 0.3s from shard 0"):
        c.push_pull({"w": np.ones(4, np.float32)})
    c.close(leave=False)


def test_wait_one_hands_over_every_message_once_and_times_out():
    """wait_one and poll/recv share one queue: nothing lost, nothing twice, in each
    shard's order; an empty wait returns None after its timeout, a closed peer too."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    t = SocketTransport([f"tcp://127.0.0.1:{ls.getsockname()[1]}" for ls in listeners])
    try:
        for shard in (0, 1):
            t.send(shard, [b"hello"])  # connects
        peers = [ls.accept()[0] for ls in listeners]
        for p in peers:
            p.setblocking(False)
        writers = [Writer(p) for p in peers]
        for i in range(3):
            writers[1].send([b"one", b"%d" % i])
        writers[0].send([b"zero", b"0"])
        got: list[tuple[int, list]] = []
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            one = t.wait_one(0.5)
            if one is not None:
                got.append(one)
                if len(got) == 1:  # mixed with poll/recv: the same queue
                    ready = t.poll(0.5)
                    got.append((ready[0], t.recv(ready[0])))
        seen = {(s, b"".join(bytes(f) for f in frames)) for s, frames in got}
        assert seen == {(0, b"zero0"), (1, b"one0"), (1, b"one1"), (1, b"one2")}
        assert [b"".join(bytes(f) for f in fr) for s, fr in got if s == 1] == [
            b"one0",
            b"one1",
            b"one2",
        ]
        assert t.wait_one(0.2) is None and t.poll(0) == []
        peers[0].close()
        assert t.wait_one(0.2) is None  # the lost link is dropped, not raised
    finally:
        t.close()
        for ls in listeners:
            ls.close()
