"""How ``PSClient`` talks to its shards: send requests, collect replies, map errors.

Why its own module: this is the pipelining engine. Every request of a call goes on the
wire at once (one connection per shard, the transport seam), replies are taken in
as they arrive (from whichever shard answers first, and already while later requests
are being sent), authenticated and checked for freshness (wire.ReplayGuard), and
delivered to their request; a shard's error reply becomes the matching
``RemoteError``, silence becomes ``PSTimeoutError`` with what to check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future

import numpy as np

from . import wire
from .buffers import Buffer
from .client_requests import Request, ignore_reply
from .client_state import ClientState
from .errors import (
    PSError,
    PSTimeoutError,
    RemoteError,
    ReplayedMessageError,
    remote_error,
)
from .replay import ReplayGuard
from .transport import Transport
from .wire import Header, Message, MsgType

log = logging.getLogger("shipyard.ps.client")

PARALLEL_DECODE_MIN = 256 * 1024  # replies larger than this are verified on the hash pool


def _no_frames(parallel: bool) -> list:
    return []


def _sent_request(
    shard: int,
    mtype: int,
    key: int,
    worker: int,
    rid: int,
    step: int,
    dtype: int,
    payload: np.ndarray,
    alg: int,
    peer: int,
    label: str,
) -> Request:
    """The request ``_round_trip_one`` sent (its header as ``wire.encode_tensor`` packed
    it), for its error paths only: a timeout names it, an error reply is mapped by it."""
    hdr = Header(
        mtype, key, worker, rid, shard, step, dtype, payload.shape, payload.nbytes, 0, alg,
        0, 0, peer,
    )  # fmt: skip
    return Request(shard, hdr, ignore_reply, label, _no_frames)


class Exchange:
    """A client's requests in flight and their replies.

    Owns the sockets' lock, the pending requests and their outcomes. ``learn_sessions``
    is called when a request would go to a shard whose session is not known yet."""

    def __init__(
        self, state: ClientState, transport: Transport, learn_sessions: Callable[[], None]
    ) -> None:
        self._state = state
        self.transport = transport
        self._learn_sessions = learn_sessions
        signer = state.signer
        # replies must be new and addressed to this client's session (replay.py)
        self._guard = ReplayGuard(signer.session)
        # SHA-256 segments are hashed on the pool; BLAKE3 threads itself (GIL held)
        self._pool_hash = signer.alg == wire.MAC_HMAC_SHA256
        self._lock = threading.RLock()  # one thread on the sockets at a time
        self._pending: dict[int, Request] = {}  # request id -> request, until its reply
        # request id -> its outcome (None, the error, or a Future of one), until waited for
        self._results: dict[int, BaseException | None | Future[BaseException | None]] = {}
        self.closed = False
        transport.sink = self.sink  # values land in the callers' arrays

    @property
    def busy(self) -> bool:
        """Whether a request is waiting for its reply (a split-phase push_pull's, say)."""
        return bool(self._pending)

    def close(self) -> None:
        self.closed = True
        self.transport.close()

    def sink(self, shard: int, frames: Sequence[Buffer], size: int) -> np.ndarray | None:
        """Where the transport should receive a large frame: the caller's array (``outs``,
        or the array a sliced tensor is reassembled in) when the frame is the value a
        pending request waits for, so that no copy follows. Until the reply is verified
        those bytes are not trusted: on any error the call raises, and what the array
        holds is unspecified."""
        if len(frames) != 1:  # only the frame right after the header carries a value
            return None
        r = self._pending.get(wire.request_id_of(frames[0]) or 0)
        if r is None or r.shard != shard or r.dest is None or r.dest.nbytes != size:
            return None
        return r.dest

    def exchange(self, reqs: Sequence[Request], timeout: float | None = None) -> None:
        """Send all requests, then wait for every reply (see ``send`` and ``wait``)."""
        self.wait(self.send(reqs), timeout)

    def send(self, reqs: Sequence[Request]) -> list[int]:
        """Put requests on the wire; returns their request ids.

        Large messages are MAC'd on the hash pool (hmac-sha256), in order, while
        earlier ones are already on the wire. After each large message, replies that
        have already come in are taken in: the shards' answers flow back while later
        requests are still being signed and sent, instead of piling up in the kernel
        (both directions of every connection stay busy, and the shards do not idle
        while this thread verifies a whole step's replies at the end).
        """
        if self.closed:
            raise PSError("this PSClient is closed")
        with self._lock:
            use_pool = (
                self._pool_hash
                and len(reqs) > 1
                and sum(1 for r in reqs if r.nbytes >= PARALLEL_DECODE_MIN) > 1
            )
            if use_pool:
                pool = wire.hash_pool()
                futures = [
                    pool.submit(r.make, False) if r.nbytes >= PARALLEL_DECODE_MIN else None
                    for r in reqs
                ]
            pending, send = self._pending, self.transport.send
            rids = []
            for i, r in enumerate(reqs):
                fut = futures[i] if use_pool else None
                frames = fut.result() if fut is not None else r.make(True)
                rid = r.header.request_id
                pending[rid] = r
                rids.append(rid)
                send(r.shard, frames)
                if r.nbytes >= PARALLEL_DECODE_MIN:
                    self._collect(self.transport.poll(0))
            return rids

    def wait(self, rids: Sequence[int], timeout: float | None = None) -> None:
        """Receive until every request in ``rids`` has its reply; replies to other
        outstanding requests (a split-phase push_pull) are delivered on the way.
        The first error is raised only after all of ``rids`` are in, so no stray
        reply is left behind."""
        timeout = self._state.timeout if timeout is None else timeout
        mine = set(rids)
        pending = self._pending
        with self._lock:
            deadline = time.monotonic() + timeout
            while (  # one request (a small push_pull): no set intersection per wake-up
                rids[0] in pending if len(rids) == 1 else mine & pending.keys()
            ):
                left = deadline - time.monotonic()
                ready = self.transport.poll(min(left, 1.0)) if left > 0 else []
                if not ready:
                    if time.monotonic() >= deadline:
                        late = {
                            rid: self._pending.pop(rid) for rid in list(mine & self._pending.keys())
                        }
                        for rid in mine:
                            self._results.pop(rid, None)
                        raise self._timeout_error(late, timeout)
                    continue
                deadline = time.monotonic() + timeout  # progress restarts the clock
                self._collect(ready)
            errors = []
            for rid in rids:
                res = self._results.pop(rid, None)
                if isinstance(res, Future):
                    res = res.result()
                if res is not None:
                    errors.append(res)
            if errors:
                raise errors[0]

    def round_trip_one(
        self, shard: int, mtype: int, key: int, payload: np.ndarray, dtype: int, label: str
    ) -> Message | None:
        """Send one tensor request and return its verified reply when no other request
        is in flight: the exchange of ``_send`` + ``_wait`` for that case, without
        request objects. The same header fields, MAC, replay guard, stray/replayed-reply
        handling, error mapping and timeout. None (nothing sent) when another thread's
        request is in flight: its reply must reach it, so the general path goes."""
        if self.closed:
            raise PSError("this PSClient is closed")
        state = self._state
        peer = state.peers[shard]
        if not peer:
            self._learn_sessions()
            peer = state.peers[shard]
        rid = next(state.rids) & wire.U32_MAX
        step, alg, worker = state.step, state.signer.alg, state.worker_id
        transport = self.transport
        wait_one = transport.wait_one
        timeout = state.timeout
        with self._lock:
            if self._pending:  # checked under the lock: no request can start meanwhile
                return None
            frames = wire.encode_tensor(  # the frames of encode(Header(...)), built directly
                state.signer, mtype, key, worker, rid, shard, step, dtype,
                payload.shape, payload, peer, alg,
            )  # fmt: skip
            transport.send(shard, frames)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                got = wait_one(left if left < 1.0 else 1.0) if left > 0 else None
                if got is None:
                    if time.monotonic() >= deadline:
                        req = _sent_request(
                            shard, mtype, key, worker, rid, step, dtype, payload, alg, peer, label
                        )
                        raise self._timeout_error({rid: req}, timeout)
                    continue
                deadline = time.monotonic() + timeout  # progress restarts the clock
                s, frames = got
                if s != shard or not frames or wire.request_id_of(frames[0]) != rid:
                    log.debug("dropping a reply that matches no pending request")
                    continue
                try:
                    msg = wire.decode(self._state.signer, frames, None, guard=self._guard)
                except ReplayedMessageError as exc:  # not this request's answer: wait on
                    log.warning("dropped a reply that is not new: %s", exc)
                    continue
                h = msg.header
                if h.msg_type == MsgType.ERROR or h.shard != shard:
                    req = _sent_request(
                        shard, mtype, key, worker, rid, step, dtype, payload, alg, peer, label
                    )
                    self._deliver(req, msg)
                return msg

    def _collect(self, ready: Sequence[int]) -> None:
        """Take in one message from each shard in ``ready``: verify it and deliver it to
        its pending request right away (its buffer is then free for the next reply).
        Large replies are verified on the hash pool when the MAC is hmac-sha256. The
        outcome (None or the error) waits in ``_results`` for whoever waits on it."""
        for shard in ready:
            frames = self.transport.recv(shard)
            rid = wire.request_id_of(frames[0]) if frames else None
            r = self._pending.get(rid) if rid is not None else None
            if rid is None or r is None or r.shard != shard:
                log.debug("dropping a reply that matches no pending request")
                continue
            del self._pending[rid]
            if self._pool_hash and wire.frames_nbytes(frames) >= PARALLEL_DECODE_MIN:
                self._results[rid] = wire.hash_pool().submit(self._receive, r, frames, False)
                continue
            res = self._receive(r, frames, True)
            if isinstance(res, ReplayedMessageError):
                # a copy of an old reply: not this request's answer; keep waiting
                log.warning("dropped a reply that is not new: %s", res)
                self._pending[rid] = r
                continue
            self._results[rid] = res

    def _receive(self, r: Request, frames: list, parallel: bool) -> BaseException | None:
        """Authenticate one reply and hand it to its request; returns the error, if any."""
        try:
            self._deliver(
                r, wire.decode(self._state.signer, frames, None, parallel, guard=self._guard)
            )
        except PSError as exc:
            return exc
        return None

    def _timeout_error(self, pending: Mapping[int, Request], timeout: float) -> PSTimeoutError:
        waiting = sorted(
            {f"shard {r.shard} ({self._state.endpoints[r.shard]})" for r in pending.values()}
        )
        example = next(iter(pending.values())).label
        return PSTimeoutError(
            f"no reply within {timeout:g}s from {', '.join(waiting)} for {len(pending)} request(s) "
            f"(e.g. {example}): is the shard running, and does SHIPYARD_PS_SECRET match? "
            "(a shard drops messages whose MAC does not verify)"
        )

    def _deliver(self, r: Request, msg: Message) -> None:
        h = msg.header
        if h.shard != r.shard and r.header.msg_type != MsgType.HELLO:  # hello() says it better
            raise RemoteError(
                f"reply claims shard {h.shard}, came from shard {r.shard}", shard=r.shard
            )
        if r.header.msg_type == MsgType.HELLO:
            self._state.peers[r.shard] = h.session  # every later request to it names this session
        if h.msg_type == MsgType.ERROR:
            body = msg.json() or {}
            raise remote_error(
                str(body.get("code", "internal")),
                str(body.get("message", "")),
                shard=r.shard,
                key=r.label or None,
            )
        r.on_reply(msg)
