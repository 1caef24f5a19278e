"""The seam between ``PSClient`` and the network (httpx-style transports).

Why a seam: the client's logic (placement, chunking, pipelining, MAC checks,
error mapping) should be testable without sockets, and the socket layer should be
swappable (another fabric later) without touching that logic. A transport moves
opaque frame lists to and from shards; it knows nothing about the wire format.

* ``SocketTransport``: one TCP connection per shard, all non-blocking in one
  selector, so requests to every shard are pipelined (send everything, then
  collect replies from whichever shard answers first) and no shard's slowness
  holds another's replies. Frames go from the caller's buffers to the kernel with
  ``sendmsg`` and large ones come back with ``recv_into`` (stream.py); there is no
  I/O thread: the caller's thread does the I/O inside ``send`` and ``poll``.
  Connections are made lazily and remade after a loss (what is queued for a shard
  that is not reachable yet waits and goes out once it is, as ZeroMQ did).
* ``LocalNetwork`` / ``LocalTransport``: shards as in-process ``ServerCore``
  objects; used by unit tests and for single-process experiments.

Contract: ``send`` never blocks on the peer (frames are queued); ``poll`` waits
up to ``timeout`` seconds and returns the shards that have a message ready;
``recv(shard)`` returns that message's frames without blocking.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import select
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shipyard import settings

from .buffers import Buffer, as_bytes_view
from .errors import PSError
from .stream import (
    DEFAULT_MAX_FRAMES,
    FramingError,
    PeerClosed,
    Reader,
    Writer,
    close_watched,
    parse_endpoint,
    tune_socket,
)

if TYPE_CHECKING:  # pragma: no cover
    from .core import ServerCore

log = logging.getLogger("shipyard.ps.transport")

MALLOPT_ENV = "SHIPYARD_PS_MALLOPT"  # "0" leaves glibc's malloc settings alone
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_malloc_tuned = False


def tune_malloc(keep_bytes: int) -> bool:
    """Keep freed message buffers in the process instead of returning them to the OS.

    Why: every received large frame is a fresh allocation of its size (megabytes);
    with glibc's defaults such blocks are mmap'd or trimmed back to the OS when freed,
    so each message costs a page fault per 4 KiB, about as much as copying it again
    (measured with a 100 MB model: ~2,500 minor faults per push_pull step in the
    client and ~3,300 in each shard by default, about 1 with this). Raising the
    mmap and trim thresholds to ``keep_bytes`` lets freed buffers be reused. Once per
    process; a no-op off glibc or with SHIPYARD_PS_MALLOPT=0. Returns whether applied.
    """
    global _malloc_tuned
    if _malloc_tuned or settings.get(MALLOPT_ENV) == "0":
        return False
    try:
        libc = ctypes.CDLL(None)
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, keep_bytes)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, keep_bytes)
        )
    except (OSError, AttributeError):  # not glibc
        return False
    _malloc_tuned = ok
    return ok


class Transport(ABC):
    """Moves frame lists between one client and ``num_shards`` shards."""

    num_shards: int
    #: optional, set by the client: ``sink(shard, frames so far, size)`` names a writable
    #: buffer of ``size`` bytes to receive a large incoming frame into (or None); a
    #: transport that cannot receive into place ignores it
    sink: Callable[[int, list[Buffer], int], Any] | None = None

    @abstractmethod
    def send(self, shard: int, frames: Sequence[Buffer]) -> None:
        """Queue one message for ``shard``."""

    @abstractmethod
    def poll(self, timeout: float) -> list[int]:
        """Shards with a message ready, waiting at most ``timeout`` seconds."""

    @abstractmethod
    def recv(self, shard: int) -> list[Buffer]:
        """The next message from ``shard`` (call after ``poll`` listed it)."""

    def wait_one(self, timeout: float) -> tuple[int, list[Buffer]] | None:
        """The next message from any shard as ``(shard, frames)``, waiting at most
        ``timeout`` seconds; None if none came. (``poll`` then ``recv`` of the first
        ready shard: what a caller waiting on one reply needs; a transport may fuse it.)"""
        ready = self.poll(timeout)
        if not ready:
            return None
        return ready[0], self.recv(ready[0])

    def close(self) -> None:  # noqa: B027 - optional hook; most transports need it
        """Release sockets; pending sends are dropped."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Link:
    """The connection to one shard (absent while not connected)."""

    __slots__ = ("sock", "reader", "writer", "writing")

    def __init__(self, sock: socket.socket, max_bytes: int) -> None:
        self.sock = sock
        self.reader = Reader(sock, max_bytes, DEFAULT_MAX_FRAMES)
        self.writer = Writer(sock)
        self.writing = False  # registered for write readiness


class SocketTransport(Transport):
    """TCP connections, one per shard endpoint (``tcp://host:port``)."""

    RETRY_S = 0.1  # between connection attempts to a shard that is not reachable
    CONNECT_TIMEOUT_S = 5.0

    def __init__(self, endpoints: Sequence[str], max_message_bytes: int = 1 << 40) -> None:
        self.endpoints = list(endpoints)
        self.num_shards = len(self.endpoints)
        self._addrs = [parse_endpoint(ep) for ep in self.endpoints]
        self._max = max_message_bytes
        self._ep = select.epoll()  # epoll itself: the selectors wrapper costs ~5 us a call
        self._shard_of: dict[int, int] = {}  # fd -> shard
        self._links: list[_Link | None] = [None] * self.num_shards
        self._backlog: list[list[Sequence[Buffer]]] = [[] for _ in self.endpoints]
        self._retry_at = [0.0] * self.num_shards
        self._ready: list[deque[list[Buffer]]] = [deque() for _ in self.endpoints]
        self._waiting = 0  # messages in _ready, all shards together
        self._closed = False

    # connections -----------------------------------------------------------------
    def _link(self, shard: int) -> _Link | None:
        link = self._links[shard]
        if link is not None or self._closed:
            return link
        now = time.monotonic()
        if now < self._retry_at[shard]:
            return None
        try:
            sock = socket.create_connection(self._addrs[shard], timeout=self.CONNECT_TIMEOUT_S)
        except OSError as exc:
            self._retry_at[shard] = now + self.RETRY_S
            log.debug("shard %d (%s) not reachable yet: %s", shard, self.endpoints[shard], exc)
            return None
        tune_socket(sock)
        link = self._links[shard] = _Link(sock, self._max)
        link.reader.sink = functools.partial(self._sink, shard)
        self._shard_of[sock.fileno()] = shard
        self._ep.register(sock.fileno(), select.EPOLLIN)
        for frames in self._backlog[shard]:
            link.writer.queue(frames)
        self._backlog[shard].clear()
        self._flush(shard, link)
        return self._links[shard]

    def _sink(self, shard: int, frames: list[Buffer], size: int) -> Any:
        return self.sink(shard, frames, size) if self.sink is not None else None

    def _lost(self, shard: int, why: str) -> None:
        link = self._links[shard]
        if link is None:
            return
        log.debug("connection to shard %d (%s) lost: %s", shard, self.endpoints[shard], why)
        self._links[shard] = None
        link.writer.drop()
        self._shard_of.pop(close_watched(self._ep, link.sock), None)

    def _flush(self, shard: int, link: _Link, frames: Sequence[Buffer] | None = None) -> None:
        """Write what the kernel takes (after queueing ``frames``, if given); watch for
        write readiness only while something is left."""
        try:
            done = link.writer.flush() if frames is None else link.writer.send(frames)
        except PeerClosed as exc:
            self._lost(shard, str(exc))
            return
        if done == link.writing:
            link.writing = not done
            events = select.EPOLLIN | (select.EPOLLOUT if link.writing else 0)
            self._ep.modify(link.sock.fileno(), events)

    # the Transport contract ----------------------------------------------------------
    def send(self, shard: int, frames: Sequence[Buffer]) -> None:
        if self._closed:
            raise PSError("this transport is closed")
        link = self._links[shard] or self._link(shard)  # connected: no call
        if link is None:
            self._backlog[shard].append(frames)
            return
        self._flush(shard, link, frames)

    def poll(self, timeout: float) -> list[int]:
        if not self._waiting:
            self._pump(timeout)
        return [i for i, q in enumerate(self._ready) if q]

    def wait_one(self, timeout: float) -> tuple[int, list[Buffer]] | None:
        # poll + recv without the two scans of every shard's queue or a list per call
        if not self._waiting and not self._pump(timeout):
            return None
        for shard, q in enumerate(self._ready):
            if q:
                self._waiting -= 1
                return shard, q.popleft()
        return None  # pragma: no cover - _waiting counts what the queues hold

    def _pump(self, timeout: float) -> bool:
        """Read what the sockets have (and write what they take) until a message is
        ready or ``timeout`` passes; True when one is."""
        left = timeout if timeout > 0.0 else 0.0
        deadline = time.monotonic() + left
        links = self._links
        while True:
            if None in links:  # not connected (yet, or any more): retry what waits to go
                for i, link in enumerate(links):
                    if link is None and self._backlog[i]:
                        self._link(i)
                        if links[i] is None:
                            left = min(left, self.RETRY_S)
            for fd, events in self._ep.poll(max(0.0, left)):
                shard = self._shard_of.get(fd)
                if shard is None:
                    continue
                link = links[shard]
                if link is None:
                    continue
                if events & select.EPOLLOUT:
                    self._flush(shard, link)
                if events & ~select.EPOLLOUT and links[shard] is link:
                    try:
                        got = link.reader.read()
                    except (PeerClosed, FramingError) as exc:
                        self._lost(shard, str(exc))
                        continue
                    if got:
                        self._ready[shard].extend(got)
                        self._waiting += len(got)
            if self._waiting:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False

    def recv(self, shard: int) -> list[Buffer]:
        frames = self._ready[shard].popleft()  # IndexError if none, as before
        self._waiting -= 1
        return frames

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for i in range(self.num_shards):
            self._lost(i, "closed")
        self._ep.close()


class LocalNetwork:
    """In-process shards: ``ServerCore`` objects driven under one lock.

    ``connect()`` gives each client its own ``LocalTransport`` (its own peer id),
    so deferred replies (sync rounds, staleness waits) reach the right client.
    ``advance(seconds)`` moves the fake clock handed to ``tick`` (heartbeats).
    """

    def __init__(self, cores: Sequence[ServerCore]) -> None:
        self.cores = list(cores)
        self._lock = threading.Condition()
        self._inboxes: dict[bytes, list[deque]] = {}
        self._next = 0
        self.now = 0.0

    def connect(self) -> LocalTransport:
        with self._lock:
            self._next += 1
            peer = f"local-{self._next}".encode()
            self._inboxes[peer] = [deque() for _ in self.cores]
        return LocalTransport(self, peer)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
            for i, core in enumerate(self.cores):
                self._route(i, core.tick(self.now))
            self._lock.notify_all()

    def _route(self, shard: int, outgoing) -> None:
        for o in outgoing:
            box = self._inboxes.get(o.peer)
            if box is not None:  # a departed client: dropped, as ROUTER does
                # snapshot: a parameter buffer in the frames may be updated in place later
                box[shard].append([bytearray(memoryview(f).cast("B")) for f in o.frames])
            if o.hold is not None:
                o.hold.released = True

    def _send(self, peer: bytes, shard: int, frames: Sequence[Buffer]) -> None:
        with self._lock:
            wire_frames: list[Buffer] = [bytes(as_bytes_view(f)) for f in frames]  # as on a socket
            self._route(shard, self.cores[shard].handle(peer, wire_frames, self.now))
            self._lock.notify_all()

    def _poll(self, peer: bytes, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                ready = [i for i, q in enumerate(self._inboxes[peer]) if q]
                left = deadline - time.monotonic()
                if ready or left <= 0:
                    return ready
                self._lock.wait(left)

    def _recv(self, peer: bytes, shard: int) -> list[Buffer]:
        with self._lock:
            return self._inboxes[peer][shard].popleft()

    def _close(self, peer: bytes) -> None:
        with self._lock:
            self._inboxes.pop(peer, None)


class LocalTransport(Transport):
    """One client's view of a ``LocalNetwork``."""

    def __init__(self, network: LocalNetwork, peer: bytes) -> None:
        self.network = network
        self.peer = peer
        self.num_shards = len(network.cores)

    def send(self, shard: int, frames: Sequence[Buffer]) -> None:
        self.network._send(self.peer, shard, frames)

    def poll(self, timeout: float) -> list[int]:
        return self.network._poll(self.peer, timeout)

    def recv(self, shard: int) -> list[Buffer]:
        return self.network._recv(self.peer, shard)

    def close(self) -> None:
        self.network._close(self.peer)
