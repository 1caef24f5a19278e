"""The TCP framing (stream.py) over a socket pair: round trips, partial writes, limits."""

from __future__ import annotations

import socket
import struct

import numpy as np
import pytest

from shipyard.ps.stream import (
    SMALL,
    FramingError,
    PeerClosed,
    Reader,
    Sent,
    Writer,
    parse_endpoint,
    prefix,
)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def pump(writer, reader, want):
    """Alternate writes and reads until ``want`` messages arrived (a bounded loop)."""
    got = []
    for _ in range(10_000):
        writer.flush()
        got.extend(reader.read())
        if len(got) >= want:
            return got
    raise AssertionError(f"only {len(got)} of {want} messages arrived")


def test_messages_small_and_large_round_trip_in_order(pair):
    a, b = pair
    w, r = Writer(a), Reader(b, max_bytes=64 << 20, max_frames=16)
    big = np.arange(3 * SMALL, dtype=np.uint8)
    sent = [[b"h1", b"", b"mac"], [b"h2", big, b"m"], [b"h3", memoryview(b"x" * 100)]]
    trackers = [Sent() for _ in sent]
    for frames, t in zip(sent, trackers):
        w.send(frames, t)
    got = pump(w, r, 3)
    assert [bytes(memoryview(f).cast("B")) for f in got[0]] == [b"h1", b"", b"mac"]
    assert np.array_equal(np.frombuffer(got[1][1], np.uint8), big)
    assert bytes(got[2][1]) == b"x" * 100
    assert all(t.done for t in trackers) and not w.pending


def test_a_large_frame_lands_in_the_buffer_the_sink_names(pair):
    a, b = pair
    w, r = Writer(a), Reader(b, max_bytes=64 << 20, max_frames=16)
    dest = np.zeros(4 * SMALL, np.uint8)
    r.sink = lambda frames, size: dest if frames == [b"hdr"] and size == dest.nbytes else None
    payload = np.full(4 * SMALL, 7, np.uint8)
    w.send([b"hdr", payload, b"mac"])
    (msg,) = pump(w, r, 1)
    assert msg[1] is dest and (dest == 7).all()


def test_a_queue_larger_than_the_kernel_buffers_drains_without_blocking(pair):
    a, b = pair
    w, r = Writer(a), Reader(b, max_bytes=64 << 20, max_frames=16)
    chunk = np.ones(8 << 20, np.uint8)
    t = Sent()
    assert w.send([b"h", chunk], t) is False  # the kernel took part of it; the rest waits
    assert w.pending and not t.done
    (msg,) = pump(w, r, 1)
    assert t.done and len(msg[1]) == chunk.nbytes


@pytest.mark.parametrize(
    "raw, code",
    [
        (struct.pack("<I", 0), "malformed"),  # no frames
        (struct.pack("<I", 17), "malformed"),  # more frames than allowed
        (struct.pack("<IQ", 1, 1 << 40), "oversized"),  # a frame far above the limit
    ],
)
def test_a_stream_out_of_bounds_is_refused_before_its_bytes_are_read(pair, raw, code):
    a, b = pair
    r = Reader(b, max_bytes=1 << 20, max_frames=16)
    a.sendall(raw)
    with pytest.raises(FramingError) as err:
        r.read()
    assert err.value.code == code


def test_a_partial_message_is_remembered_and_the_end_of_stream_reported(pair):
    a, b = pair
    r = Reader(b, max_bytes=1 << 20, max_frames=16)
    whole = prefix([memoryview(b"abc"), memoryview(b"defg")]) + b"abcdefg"
    a.sendall(whole[:-2])
    assert r.read() == [] and r.partial_since is not None
    a.sendall(whole[-2:] + whole)  # the rest, then one more message whole
    msgs = r.read()
    assert [[bytes(f) for f in m] for m in msgs] == [[b"abc", b"defg"]] * 2
    assert r.partial_since is None
    a.close()
    with pytest.raises(PeerClosed):
        r.read()


def test_endpoints_parse_as_tcp_host_port():
    assert parse_endpoint("tcp://10.0.0.2:7100") == ("10.0.0.2", 7100)
    assert parse_endpoint("tcp://*:0") == ("0.0.0.0", 0)
    assert parse_endpoint("tcp://[::1]:5") == ("::1", 5)
    for bad in ("10.0.0.2:7100", "tcp://host", "tcp://host:port"):
        with pytest.raises(Exception, match="tcp://HOST:PORT"):
            parse_endpoint(bad)
