"""Messages on a TCP stream: the framing, a non-blocking reader and writer.

Why this module: shipyard.ps moved off ZeroMQ (issue 17; BENCHMARKS.md): its I/O
thread per process cost a hop, a copy and wake-ups per message, and held a push+pull
near half of raw TCP. Here a message (the ``wire`` frame list) goes straight from the
caller's buffers into the kernel (``sendmsg`` with one iovec per frame) and large
frames come straight out of it into a buffer of their own (``recv_into``), with
nothing in between. Client (transport.py) and shard (server.py) share this code.

On the stream a message is::

    u32 n | u64 len(frame_1) .. u64 len(frame_n) | frame_1 .. frame_n

The framing carries no trust: the frames are authenticated by ``wire.decode``.
What the framing bounds is the work an untrusted peer can cause before that: at
most ``max_frames`` frames and ``max_bytes`` bytes per message (more drops the
connection: ``FramingError``), and the receiver times out a peer that stops in
the middle of a message (``Reader.partial_since``), without waiting on it: every
socket here is non-blocking.

Buffers: frames under ``SMALL`` bytes are copied out of a per-connection staging
buffer (one ``recv_into`` reads many small messages); larger ones are received
into a fresh ``np.empty`` of their size, which glibc recycles without page faults
once ``transport.tune_malloc`` has raised its thresholds. The receiver may keep a
frame as long as it likes (a shard queues requests that must wait; a client hands
values to the caller), so a frame's buffer is never reused behind its back.
"""

from __future__ import annotations

import errno
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .buffers import Buffer, array_view, as_bytes_view
from .errors import PSError

_COUNT = struct.Struct("<I")
_LEN = struct.Struct("<Q")
SMALL = 64 * 1024  # frames below this are copied out of the staging buffer
STAGING = 256 * 1024  # per-connection staging buffer
READ_CHUNK = 64 * 1024  # bytes asked per staging read (bounds the copy of a large frame's head)
READ_BUDGET = 8 << 20  # a connection yields to the others after this many bytes per call
IOV_MAX = 512  # iovecs per sendmsg (Linux allows 1024)
SOCKET_BUFFER = 4 << 20  # SO_SNDBUF / SO_RCVBUF on both ends
DEFAULT_MAX_FRAMES = 8192


class FramingError(PSError):
    """The byte stream is not a sequence of messages within limits: drop the peer."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class PeerClosed(PSError):
    """The peer closed the connection (or reset it)."""


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``tcp://host:port`` (``[v6]:port``, ``*`` = every address) -> (host, port)."""
    if not endpoint.startswith("tcp://"):
        raise PSError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT")
    rest = endpoint[len("tcp://") :]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise PSError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT")
    host = host.strip("[]")
    return ("0.0.0.0" if host in ("*", "") else host), int(port)


def tune_socket(sock: socket.socket) -> None:
    """No Nagle delay (small messages are latency-bound), large kernel buffers, and
    non-blocking: every wait happens in a selector, never in a send or a receive."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setblocking(False)


_PREFIX: dict[int, struct.Struct] = {}  # frame count -> the Struct of its prefix
_LENS: dict[int, struct.Struct] = {}  # frame count -> the Struct of its lengths


def close_watched(ep: Any, sock: socket.socket) -> int:
    """Stop watching ``sock`` in the epoll ``ep`` and close it (a dropped peer on a shard, a
    lost link on a client); returns its former fd, for the caller's fd map."""
    fd = sock.fileno()
    try:
        ep.unregister(fd)
    except (OSError, ValueError):  # pragma: no cover - already gone
        pass
    sock.close()
    return fd


def prefix(frames: Sequence[bytes | memoryview]) -> bytes:
    """The stream prefix of one message: its frame count and lengths."""
    n = len(frames)
    st = _PREFIX.get(n)
    if st is None:
        st = struct.Struct(f"<I{n}Q")
        if n <= 64:
            _PREFIX[n] = st
    return st.pack(n, *map(len, frames))


class Sent:
    """A queued message: ``done`` once its last byte is in the kernel (what a shard's
    ``Hold`` waits for before it overwrites a parameter buffer the message points to)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


class Writer:
    """One connection's queue of outgoing messages, written without blocking."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._bufs: deque[memoryview] = deque()
        self._marks: deque[tuple[int, Sent]] = deque()  # (bytes queued when complete, tracker)
        self._queued = 0  # bytes ever queued
        self._written = 0  # bytes ever written

    @property
    def pending(self) -> bool:
        return bool(self._bufs)

    def queue(self, frames: Sequence[Buffer], sent: Sent | None = None) -> None:
        views = [f if type(f) is bytes else as_bytes_view(f) for f in frames]
        head = prefix(views)
        self._bufs.append(memoryview(head))
        self._queued += len(head)
        for v in views:
            if len(v):
                self._bufs.append(memoryview(v))
                self._queued += len(v)
        if sent is not None:
            self._marks.append((self._queued, sent))

    def send(self, frames: Sequence[Buffer], sent: Sent | None = None) -> bool:
        """Queue one message and write what the kernel takes now (``queue`` + ``flush``);
        True when nothing is left. The common case, an idle connection and a message
        the kernel takes whole, is one ``sendmsg`` and no queueing."""
        if self._bufs:
            self.queue(frames, sent)
            return self.flush()
        views = [f if type(f) is bytes else as_bytes_view(f) for f in frames]
        head = prefix(views)
        total = len(head) + sum(map(len, views))
        try:
            n = self.sock.sendmsg([head, *views])
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            raise PeerClosed(f"send failed: {exc}") from None
        if n == total:
            if sent is not None:
                sent.done = True
            return True
        self._written = self._queued + n  # the first n bytes of this message are out
        self.queue(views, sent)
        while n:  # drop what was written, as flush would
            first = self._bufs[0]
            if n >= len(first):
                n -= len(first)
                self._bufs.popleft()
            else:
                self._bufs[0] = first[n:]
                n = 0
        return self.flush()

    def flush(self) -> bool:
        """Write what the kernel takes now; True when nothing is left. PeerClosed if the
        connection broke."""
        bufs = self._bufs
        while bufs:
            batch = list(bufs) if len(bufs) <= IOV_MAX else [bufs[i] for i in range(IOV_MAX)]
            try:
                n = self.sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                raise PeerClosed(f"send failed: {exc}") from None
            self._written += n
            while n:
                first = bufs[0]
                if n >= len(first):
                    n -= len(first)
                    bufs.popleft()
                else:
                    bufs[0] = first[n:]
                    n = 0
            marks = self._marks
            while marks and marks[0][0] <= self._written:
                marks.popleft()[1].done = True
        return True

    def drop(self) -> None:
        """Forget everything queued (the connection is gone); trackers count as done,
        since no byte of theirs will be read from the buffers any more."""
        self._bufs.clear()
        while self._marks:
            self._marks.popleft()[1].done = True
        self._written = self._queued


class Reader:
    """One connection's incoming byte stream, parsed into frame lists."""

    def __init__(self, sock: socket.socket, max_bytes: int, max_frames: int) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self.max_frames = max_frames
        self._stage = bytearray(STAGING)
        self._view = memoryview(self._stage)
        self._start = 0
        self._end = 0
        self._lens: list[int] | None = None  # lengths of the message being read
        self._frames: list[Buffer] = []
        self._big: Any = None  # np.ndarray a large frame is received into
        self._big_view: memoryview | None = None
        self._big_got = 0
        self.partial_since: float | None = None  # when the unfinished message began
        self._closed = False
        # sink(frames so far, size) -> a writable buffer of exactly size bytes where a
        # large frame should be received, or None for a fresh one (transport.Transport.sink)
        self.sink: Callable[[list[Buffer], int], Any] | None = None

    def read(self) -> list[list[Buffer]]:
        """Every message complete after reading what the socket has now (may be none).
        Raises PeerClosed at end of stream (after the messages that came before it),
        FramingError on a stream out of bounds."""
        if self._closed:
            raise PeerClosed("the peer closed the connection")
        out: list[list[Buffer]] = []
        try:
            self._read(out)
        except PeerClosed:
            if not out:
                raise
            self._closed = True
        return out

    def _read(self, out: list[list[Buffer]]) -> None:
        budget = READ_BUDGET
        if self._start == self._end:  # nothing staged: read from the front again, so a
            self._start = self._end = 0  # stream of small messages reuses the same cache lines
        while budget > 0:
            if self._big_view is not None:
                want = len(self._big_view) - self._big_got
                n = self._recv(self._big_view[self._big_got :])
                if n is None:
                    break
                budget -= n
                self._big_got += n
                if self._big_got == len(self._big_view):
                    self._frames.append(self._big)
                    self._big = self._big_view = None
                    self._finish_frame(out)
                    self._parse(out)
                elif n < want:
                    break  # the socket is drained for now
                continue
            if self._end == len(self._stage):
                self._compact()
            room = min(READ_CHUNK, len(self._stage) - self._end)
            try:  # _recv inlined: every small message comes through here
                n = self.sock.recv_into(self._view[self._end : self._end + room])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                raise PeerClosed(f"receive failed: {exc}") from None
            if n == 0:
                raise PeerClosed("the peer closed the connection")
            budget -= n
            self._end += n
            self._parse(out)
            if n < room:
                break
        if self._lens is not None or self._start < self._end:
            if self.partial_since is None:
                self.partial_since = time.monotonic()
        else:
            self.partial_since = None

    def _recv(self, view: memoryview) -> int | None:
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return None
            raise PeerClosed(f"receive failed: {exc}") from None
        if n == 0:
            raise PeerClosed("the peer closed the connection")
        return n

    def _compact(self) -> None:
        live = self._end - self._start
        if self._start:
            self._view[:live] = self._view[self._start : self._end]
            self._start, self._end = 0, live

    def _parse(self, out: list[list[Buffer]]) -> None:
        """Consume what the staging buffer holds."""
        view = self._view
        while True:
            start = self._start
            avail = self._end - start
            if self._lens is None:
                if avail < 4:
                    break
                (count,) = _COUNT.unpack_from(self._stage, start)
                if not 1 <= count <= self.max_frames:
                    raise FramingError(
                        f"a message of {count} frames (at most {self.max_frames})", "malformed"
                    )
                head = 4 + 8 * count
                if avail < head:
                    if head > len(self._stage) - start:
                        self._compact()
                    break
                st = _LENS.get(count)
                if st is None:
                    st = struct.Struct(f"<{count}Q")
                    if count <= 64:
                        _LENS[count] = st
                got = st.unpack_from(self._stage, start + 4)
                size = sum(got)
                if size > self.max_bytes:
                    raise FramingError(
                        f"a message of {size} bytes (at most {self.max_bytes})", "oversized"
                    )
                if size <= avail - head and (size < SMALL or max(got) < SMALL):
                    # the whole message is here and its frames are small (every request
                    # and reply of a small push_pull, whose size alone says so): its
                    # frames in one go, not frame by frame
                    at = start + head
                    frames: list[Buffer] = []
                    for n in got:
                        frames.append(view[at : at + n].tobytes())
                        at += n
                    self._start = at
                    out.append(frames)
                    continue
                lens = list(got)
                self._start += 4 + 8 * count
                self._lens = lens
                self._frames = []
                self.partial_since = self.partial_since or time.monotonic()
                continue
            if len(self._frames) == len(self._lens):  # pragma: no cover - finished below
                self._finish_frame(out)
                continue
            size = self._lens[len(self._frames)]
            avail = self._end - self._start
            if size < SMALL:
                if avail < size:
                    if size > len(self._stage) - self._start:
                        self._compact()
                    break
                self._frames.append(bytes(view[self._start : self._start + size]))
                self._start += size
                self._finish_frame(out)
                continue
            big = self.sink(self._frames, size) if self.sink is not None else None
            if big is None:
                big = np.empty(size, dtype=np.uint8)
            bview = array_view(big).cast("B")
            head = min(avail, size)
            bview[:head] = view[self._start : self._start + head]
            self._start += head
            if head == size:
                self._frames.append(big)
                self._finish_frame(out)
                continue
            self._big, self._big_view, self._big_got = big, bview, head
            self._start = self._end = 0  # staging is empty now
            break

    def _finish_frame(self, out: list[list[Buffer]]) -> None:
        if self._lens is not None and len(self._frames) == len(self._lens):
            out.append(self._frames)
            self._lens, self._frames = None, []
            self.partial_since = None
