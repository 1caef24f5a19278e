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
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from . import wire
from .client_requests import _ignore, _Req
from .errors import (
    PSError,
    PSTimeoutError,
    RemoteError,
    ReplayedMessageError,
    remote_error,
)
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
    payload: Any,
    alg: int,
    peer: bytes,
    label: str,
) -> _Req:
    """The request ``_round_trip_one`` sent (its header as ``wire.encode_tensor`` packed
    it), for its error paths only: a timeout names it, an error reply is mapped by it."""
    hdr = Header(
        mtype, key, worker, rid, shard, step, dtype, payload.shape, payload.nbytes, 0, alg,
        0, 0, peer,
    )  # fmt: skip
    return _Req(shard, hdr, _ignore, label, _no_frames)


class Exchange:
    """Mixin of PSClient: the request/reply exchange (the attributes are PSClient's)."""

    transport: Transport
    signer: wire.Signer
    timeout: float
    endpoints: list[str]
    _guard: wire.ReplayGuard
    _lock: Any
    _pending: dict[int, _Req]
    _results: dict[int, Any]
    _pool_hash: bool
    _closed: bool
    _peers: list[int]
    worker_id: int
    step: int
    _rids: Any

    def _learn_sessions(self, timeout: float | None = None) -> None:  # PSClient (client.py)
        raise NotImplementedError

    def _exchange(self, reqs: Sequence[_Req], timeout: float | None = None) -> None:
        """Send all requests, then wait for every reply (see ``_send`` and ``_wait``)."""
        self._wait(self._send(reqs), timeout)

    def _send(self, reqs: Sequence[_Req]) -> list[int]:
        """Put requests on the wire; returns their request ids.

        Large messages are MAC'd on the hash pool (hmac-sha256), in order, while
        earlier ones are already on the wire. After each large message, replies that
        have already come in are taken in: the shards' answers flow back while later
        requests are still being signed and sent, instead of piling up in the kernel
        (both directions of every connection stay busy, and the shards do not idle
        while this thread verifies a whole step's replies at the end).
        """
        if self._closed:
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

    def _wait(self, rids: Sequence[int], timeout: float | None = None) -> None:
        """Receive until every request in ``rids`` has its reply; replies to other
        outstanding requests (a split-phase push_pull) are delivered on the way.
        The first error is raised only after all of ``rids`` are in, so no stray
        reply is left behind."""
        timeout = self.timeout if timeout is None else timeout
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

    def _round_trip_one(
        self, shard: int, mtype: int, key: int, payload: Any, dtype: int, label: str
    ) -> Message | None:
        """Send one tensor request and return its verified reply when no other request
        is in flight: the exchange of ``_send`` + ``_wait`` for that case, without
        request objects. The same header fields, MAC, replay guard, stray/replayed-reply
        handling, error mapping and timeout. None (nothing sent) when another thread's
        request is in flight: its reply must reach it, so the general path goes."""
        if self._closed:
            raise PSError("this PSClient is closed")
        peer = self._peers[shard]
        if not peer:
            self._learn_sessions()
            peer = self._peers[shard]
        rid = next(self._rids) & wire.U32_MAX
        step, alg, worker = self.step, self.signer.alg, self.worker_id
        transport = self.transport
        wait_one = transport.wait_one
        timeout = self.timeout
        with self._lock:
            if self._pending:  # checked under the lock: no request can start meanwhile
                return None
            frames = wire.encode_tensor(  # the frames of encode(Header(...)), built directly
                self.signer, mtype, key, worker, rid, shard, step, dtype,
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
                    msg = wire.decode(self.signer, frames, None, guard=self._guard)
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
            if r is None or r.shard != shard:
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

    def _receive(self, r: _Req, frames: list, parallel: bool) -> BaseException | None:
        """Authenticate one reply and hand it to its request; returns the error, if any."""
        try:
            self._deliver(r, wire.decode(self.signer, frames, None, parallel, guard=self._guard))
        except PSError as exc:
            return exc
        return None

    def _timeout_error(self, pending: Mapping[int, _Req], timeout: float) -> PSTimeoutError:
        waiting = sorted({f"shard {r.shard} ({self.endpoints[r.shard]})" for r in pending.values()})
        example = next(iter(pending.values())).label
        return PSTimeoutError(
            f"no reply within {timeout:g}s from {', '.join(waiting)} for {len(pending)} request(s) "
            f"(e.g. {example}): is the shard running, and does SHIPYARD_PS_SECRET match? "
            "(a shard drops messages whose MAC does not verify)"
        )

    def _deliver(self, r: _Req, msg: Message) -> None:
        h = msg.header
        if h.shard != r.shard and r.header.msg_type != MsgType.HELLO:  # hello() says it better
            raise RemoteError(
                f"reply claims shard {h.shard}, came from shard {r.shard}", shard=r.shard
            )
        if r.header.msg_type == MsgType.HELLO:
            self._peers[r.shard] = h.session  # every later request to it names this session
        if h.msg_type == MsgType.ERROR:
            body = msg.json() or {}
            raise remote_error(
                str(body.get("code", "internal")),
                str(body.get("message", "")),
                shard=r.shard,
                key=r.label or None,
            )
        r.on_reply(msg)
