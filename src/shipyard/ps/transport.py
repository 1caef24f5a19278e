"""The seam between ``PSClient`` and the network (httpx-style transports).

Why a seam: the client's logic (placement, chunking, pipelining, MAC checks,
error mapping) should be testable without sockets, and the socket layer should be
swappable (another fabric later) without touching that logic. A transport moves
opaque frame lists to and from shards; it knows nothing about the wire format.

* ``ZmqTransport``: one ZeroMQ DEALER socket per shard, so requests to all shards
  are pipelined (send everything, then collect replies from whichever shard
  answers first). Large frames are sent with ``copy=False`` and received as
  zero-copy ``zmq.Frame`` buffers.
* ``LocalNetwork`` / ``LocalTransport``: shards as in-process ``ServerCore``
  objects; used by unit tests and for single-process experiments.

Contract: ``send`` never blocks on the peer (frames are queued); ``poll`` waits
up to ``timeout`` seconds and returns the shards that have a message ready;
``recv(shard)`` returns that message's frames without blocking.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .wire import Buffer

if TYPE_CHECKING:  # pragma: no cover
    from .core import ServerCore

ZERO_COPY_MIN = 64 * 1024  # below this ZeroMQ copies anyway


MALLOPT_ENV = "SHIPYARD_PS_MALLOPT"  # "0" leaves glibc's malloc settings alone
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_malloc_tuned = False


def tune_malloc(keep_bytes: int) -> bool:
    """Keep freed message buffers in the process instead of returning them to the OS.

    Why: every received ZeroMQ message is a fresh allocation of its size (megabytes);
    with glibc's defaults such blocks are mmap'd or trimmed back to the OS when freed,
    so each message costs a page fault per 4 KiB, about as much as copying it again
    (measured with a 100 MB model: ~2,500 minor faults per push_pull step in the
    client and ~3,300 in each shard by default, about 1 with this). Raising the
    mmap and trim thresholds to ``keep_bytes`` lets freed buffers be reused. Once per
    process; a no-op off glibc or with SHIPYARD_PS_MALLOPT=0. Returns whether applied.
    """
    global _malloc_tuned
    if _malloc_tuned or os.environ.get(MALLOPT_ENV) == "0":
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


def tuned_socket(ctx: Any, kind: int, *, linger: int, sndbuf: int, rcvbuf: int) -> Any:
    """A ZeroMQ socket set up the same way on both ends: no high-water mark (the
    client bounds what is in flight), explicit kernel buffers when given (> 0)."""
    import zmq

    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, linger)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    if sndbuf > 0:
        s.setsockopt(zmq.SNDBUF, sndbuf)
    if rcvbuf > 0:
        s.setsockopt(zmq.RCVBUF, rcvbuf)
    return s


class Transport(ABC):
    """Moves frame lists between one client and ``num_shards`` shards."""

    num_shards: int

    @abstractmethod
    def send(self, shard: int, frames: Sequence[Buffer]) -> None:
        """Queue one message for ``shard``."""

    @abstractmethod
    def poll(self, timeout: float) -> list[int]:
        """Shards with a message ready, waiting at most ``timeout`` seconds."""

    @abstractmethod
    def recv(self, shard: int) -> list[Buffer]:
        """The next message from ``shard`` (call after ``poll`` listed it)."""

    def close(self) -> None:  # noqa: B027 - optional hook; most transports need it
        """Release sockets; pending sends are dropped."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ZmqTransport(Transport):
    """DEALER sockets, one per shard endpoint (``tcp://host:port``)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        context: object | None = None,
        sndbuf: int = 4 << 20,
        rcvbuf: int = 4 << 20,
    ) -> None:
        import zmq  # imported here: only this transport needs pyzmq

        self._zmq = zmq
        self.endpoints = list(endpoints)
        self.num_shards = len(self.endpoints)
        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        self._socks = []
        self._poller = zmq.Poller()
        self._index = {}
        for i, ep in enumerate(self.endpoints):
            s = tuned_socket(self._ctx, zmq.DEALER, linger=0, sndbuf=sndbuf, rcvbuf=rcvbuf)
            s.connect(ep)
            self._socks.append(s)
            self._poller.register(s, zmq.POLLIN)
            self._index[s] = i

    def send(self, shard: int, frames: Sequence[Buffer]) -> None:
        zmq = self._zmq
        s = self._socks[shard]
        last = len(frames) - 1
        for i, f in enumerate(frames):
            big = len(memoryview(f).cast("B")) >= ZERO_COPY_MIN
            s.send(f, zmq.SNDMORE if i < last else 0, copy=not big)

    def poll(self, timeout: float) -> list[int]:
        events = self._poller.poll(max(0, int(timeout * 1000)))
        return [self._index[s] for s, _ in events]

    def recv(self, shard: int) -> list[Buffer]:
        frames = self._socks[shard].recv_multipart(copy=False)
        return [f.buffer for f in frames]

    def close(self) -> None:
        for s in self._socks:
            s.close(linger=0)
        self._socks = []
        if self._own_ctx:
            self._ctx.term()


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
            wire_frames = [
                bytes(memoryview(f).cast("B")) for f in frames
            ]  # what a socket would carry
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
