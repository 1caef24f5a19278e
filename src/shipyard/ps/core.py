"""The shard's protocol state machine: frames in, frames out. No sockets, no threads.

Why a separate core: the server loop (server.py) only moves frames between a
ZeroMQ ROUTER socket and this object, and tests (or an in-process transport) can
drive the very same logic by calling ``handle`` and ``tick`` with a fake clock.

``handle(peer, frames, now)`` decodes and authenticates one request and returns
the replies that became possible because of it (to this peer and, when a sync
round completes or a staleness bound moves, to others). ``tick(now)`` expires
silent workers and returns what that unblocked. Nothing here raises out: a bad
message is counted in ``stats.rejected`` by reason and, if it was authenticated,
answered with an ERROR reply; an unauthenticated one is dropped.

Ordering: data requests (INIT, PUSH, PULL, PUSH_PULL) of one worker are served in
arrival order; one that must wait (key not initialized yet, staleness bound,
sync round still open) holds back the worker's later data requests. A
PUSH_PULL_MANY (several small tensors in one message, one round trip instead of
one each) is validated whole, then queued as one PUSH_PULL per key, served by the
same rules; its TENSORS reply leaves when the last of them is served. Control
requests (HELLO, REGISTER, SET_LR, STATS, LEAVE, CHECKPOINT, SHUTDOWN) are
answered at once.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import checkpoint as ckpt
from . import wire
from .consistency import (
    BOUNDED,
    SYNC,
    Consistency,
    WorkerTable,
    job_outcome,
    staleness_blocked,
    sync_round_ready,
)
from .errors import (
    ErrorCode,
    PSConfigError,
    PSError,
    RemoteError,
    UnknownKeyError,
    WireError,
)
from .shard import DEFAULT_GROUP, Shard, Slot
from .stats import ShardStats
from .wire import Buffer, Header, Message, MsgType

log = logging.getLogger("shipyard.ps.core")

DEFAULT_MAX_PAYLOAD = 1 << 30  # 1 GiB per message; tensors above it are sliced by placement
DATA_TYPES = frozenset({MsgType.INIT, MsgType.PUSH, MsgType.PULL, MsgType.PUSH_PULL})
TENSOR_IN = frozenset({MsgType.INIT, MsgType.PUSH, MsgType.PUSH_PULL})
FEATURES = ("push_pull_many",)  # announced in HELLO; clients use only what every shard has
MAX_MANY = 4096  # tensors in one PUSH_PULL_MANY


class Hold:
    """A parameter buffer referenced by a reply: not to be overwritten until done.

    Set when the reply is produced (later replies of the same ``handle`` call may
    update the parameter in place); the sender then attaches the socket's delivery
    tracker (zero-copy send) or marks it released (it copied the bytes).
    """

    __slots__ = ("released", "tracker")

    def __init__(self) -> None:
        self.tracker: Any = None
        self.released = False

    @property
    def done(self) -> bool:
        return self.released or (self.tracker is not None and bool(self.tracker.done))


@dataclass
class Outgoing:
    """A reply to send: ``frames`` to ``peer``. ``hold``, when set, guards a parameter
    buffer inside the frames: the sender must attach a tracker or release it."""

    peer: bytes
    frames: list[Buffer]
    hold: Hold | None = None


@dataclass
class _Group:
    """The members of one PUSH_PULL_MANY: their values are collected (copied: small
    tensors, and the parameter may change before the last member is served) and go
    out in one TENSORS reply."""

    peer: bytes
    header: Header
    keys: list[int]
    values: list[Any]
    versions: list[int]
    left: int


@dataclass
class _Pending:
    peer: bytes
    msg: Message
    slot: Slot
    pushed: bool = False
    arrived: float = 0.0
    group: _Group | None = None
    member: int = 0


@dataclass
class ServerConfig:
    """Everything a shard needs besides its secret (CLI flags map 1:1 onto these)."""

    index: int = 0
    num_shards: int = 1
    consistency: Consistency = field(default_factory=Consistency)
    heartbeat_timeout: float = 10.0
    expected_workers: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_interval: float = 60.0  # seconds; <= 0 disables periodic checkpoints
    max_payload: int = DEFAULT_MAX_PAYLOAD
    # End once every one of ``expected_workers`` ranks has ended (DONE, lost, or never
    # joined within ``join_timeout``): how shards stop by themselves in a job.
    exit_when_done: bool = False
    join_timeout: float = 600.0

    def __post_init__(self) -> None:
        if self.num_shards < 1 or not 0 <= self.index < self.num_shards:
            raise PSConfigError(f"shard index {self.index} not in [0, {self.num_shards})")
        if self.heartbeat_timeout <= 0:
            raise PSConfigError(f"heartbeat_timeout must be > 0, got {self.heartbeat_timeout}")
        if self.expected_workers is not None and self.expected_workers < 1:
            raise PSConfigError(f"expected_workers must be >= 1, got {self.expected_workers}")
        if self.exit_when_done and self.expected_workers is None:
            raise PSConfigError("exit_when_done needs expected_workers (--num-workers)")
        if self.max_payload < 1:
            raise PSConfigError(f"max_payload must be >= 1, got {self.max_payload}")


class ServerCore:
    """One shard's protocol logic."""

    def __init__(
        self, config: ServerConfig, secret: str | bytes, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.signer = wire.Signer(secret)
        self.replay = wire.ReplayGuard(self.signer.session)  # this shard's session = its run
        self._macs = {wire.MAC_ALGORITHMS[n] for n in wire.available_macs()}
        self.clock = clock
        self.shard = Shard(config.index, config.num_shards)
        self.workers = WorkerTable(config.heartbeat_timeout)
        self.stats = ShardStats()
        self.queues: dict[int, deque[_Pending]] = {}
        self.last_pull: dict[tuple[int, int], int] = {}
        self.shutdown_requested = False
        self._changed = False
        self._last_checkpoint = clock()
        self.resumed_from: str | None = None
        self.started = clock()
        self.joined: set[int] = set()  # ranks heard from by this process (not restored ones)
        self.exits: dict[int, int] = {}  # rank -> exit status its wrapper reported (DONE)
        self.errors: dict[int, str] = {}  # rank -> the tail of its error output
        self.held_done: list[tuple[bytes, Header]] = []  # DONE requests answered at the end
        self.placement: dict[str, Any] | None = None  # the placement report rank 0 registered
        self.outcome: dict[int, dict[str, Any]] | None = None  # set when the job has ended
        if config.checkpoint_dir:
            loaded = ckpt.load(config.checkpoint_dir, config.index, config.num_shards)
            if loaded is not None:
                ckpt.restore(self.shard, self.workers, loaded)
                self.resumed_from = str(ckpt.manifest_path(config.checkpoint_dir, config.index))
                log.info(
                    "shard %d resumed from %s (updates=%d)",
                    config.index,
                    self.resumed_from,
                    self.shard.updates,
                )

    # entry points --------------------------------------------------------------
    def handle(
        self, peer: bytes, frames: Sequence[Buffer], now: float | None = None
    ) -> list[Outgoing]:
        """Process one request; returns the replies to send now (never raises)."""
        now = self.clock() if now is None else now
        try:
            msg = wire.decode(self.signer, frames, self.config.max_payload, guard=self.replay)
        except WireError as err:
            self.stats.reject(err.code)
            hdr = getattr(err, "header", None)
            if getattr(err, "authenticated", False) and hdr is not None:
                return [self._error(peer, hdr, err.code, str(err))]
            return []
        except Exception as exc:  # noqa: BLE001 - never let a frame take the server down
            self.stats.reject(ErrorCode.MALFORMED)
            log.debug("undecodable frames: %r", exc)
            return []
        h = msg.header
        self.stats.received(h.worker, msg.wire_bytes)
        try:
            return self._dispatch(peer, msg, now)
        except PSError as err:
            self.stats.reject(err.code)
            return [self._error(peer, h, err.code, str(err))]
        except Exception as exc:  # a bug must not stop the shard serving others
            log.exception("internal error handling %s", h)
            self.stats.reject(ErrorCode.INTERNAL)
            return [self._error(peer, h, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")]

    def tick(self, now: float | None = None) -> list[Outgoing]:
        """Expire silent workers and serve whatever that unblocks."""
        now = self.clock() if now is None else now
        dead = self.workers.expire(now)
        for w in dead:  # its queued requests stay: a worker declared dead by mistake loses nothing
            log.info(
                "shard %d: worker %d missed heartbeats; continuing without it", self.config.index, w
            )
        return (self._drain() if dead else []) + self._maybe_end(now)

    @property
    def exit_code(self) -> int:
        """0 unless the job ended with no worker that finished successfully."""
        if self.outcome is None:
            return 0
        return 0 if any(o.get("exit_code") == 0 for o in self.outcome.values()) else 1

    def failure_text(self) -> str | None:
        """Why the job's training failed when every worker failed (the shard's exit text)."""
        if self.exit_code == 0 or self.outcome is None:
            return None
        parts = [
            f"rank {r}: "
            + (f"exit status {o['exit_code']}" if "exit_code" in o else f"lost, {o['lost']}")
            for r, o in sorted(self.outcome.items())
        ]
        text = "every worker of the job failed (" + "; ".join(parts) + ")"
        first = next((r for r in sorted(self.errors) if self.errors[r].strip()), None)
        if first is not None:
            text += f". Rank {first}'s error:\n{self.errors[first].strip()}"
        return text

    def _maybe_end(self, now: float) -> list[Outgoing]:
        """When every worker has ended: answer the held DONE requests and stop."""
        cfg = self.config
        if not cfg.exit_when_done or self.outcome is not None or cfg.expected_workers is None:
            return []
        outcome = job_outcome(
            cfg.expected_workers,
            self.exits,
            self.workers,
            self.joined,
            now,
            self.started,
            cfg.join_timeout,
        )
        if outcome is None:
            return []
        self.outcome = outcome
        self.shutdown_requested = True
        log.info(
            "shard %d: every worker has ended (%s); stopping",
            cfg.index,
            ", ".join(f"{r}: {o}" for r, o in sorted(outcome.items())),
        )
        body = {
            "finished": {str(r): o for r, o in sorted(outcome.items())},
            "stats": self.stats_json(now),
            "placement": self.placement,
        }
        return [self._json(peer, h, body) for peer, h in self.held_done]

    def checkpoint_due(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        iv = self.config.checkpoint_interval
        return bool(
            self.config.checkpoint_dir
            and iv > 0
            and self.shard.dirty
            and now - self._last_checkpoint >= iv
        )

    def checkpoint(self, force: bool = False) -> Path | None:
        """Write a checkpoint now (if there is a directory and, unless forced, changes)."""
        if not self.config.checkpoint_dir:
            return None
        self._last_checkpoint = self.clock()
        if not (force or self.shard.dirty):
            return ckpt.manifest_path(self.config.checkpoint_dir, self.config.index)
        path = ckpt.save(self.shard, self.workers, self.config.checkpoint_dir)
        self.stats.checkpoints += 1
        self.stats.last_checkpoint = time.time()
        return path

    # dispatch ---------------------------------------------------------------------
    def _dispatch(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        h = msg.header
        if h.msg_type >= MsgType.OK:
            raise RemoteError("replies are not requests", code=ErrorCode.BAD_REQUEST)
        if h.shard != self.config.index and h.msg_type != MsgType.HELLO:
            raise RemoteError(
                f"request addressed to shard {h.shard} reached shard {self.config.index} "
                "(endpoint list out of order?)",
                code=ErrorCode.WRONG_SHARD,
            )
        w = h.worker
        self.workers.seen(w, now)
        self.joined.add(w)
        t = MsgType(h.msg_type)
        if t == MsgType.HEARTBEAT:
            return []
        if t in DATA_TYPES:
            return self._enqueue(peer, msg, now)
        if t == MsgType.PUSH_PULL_MANY:
            return self._enqueue_many(peer, msg, now)
        if t == MsgType.HELLO:
            info = {
                "protocol": wire.PROTOCOL_VERSION,
                "shard": self.config.index,
                "num_shards": self.config.num_shards,
                "consistency": self.config.consistency.to_json(),
                "step": self._resume_step(w),
                "keys": len(self.shard.slots),
                "heartbeat_timeout": self.config.heartbeat_timeout,
                "pid": os.getpid(),
                "max_message_bytes": self.config.max_payload,
                "host": socket.gethostname(),
                "resumed_from": self.resumed_from,
                "features": list(FEATURES),
            }
            return [self._json(peer, h, info)]
        if t == MsgType.REGISTER:
            body = self._json_body(msg)
            result = self.shard.register(
                body.get("keys", []), body.get("optimizer"), str(body.get("group") or DEFAULT_GROUP)
            )
            if isinstance(body.get("placement"), dict):
                self.placement = body["placement"]
            return [self._json(peer, h, result)]
        if t == MsgType.SET_LR:
            body = self._json_body(msg)
            lr = body.get("lr")
            if not isinstance(lr, (int, float)) or isinstance(lr, bool):
                raise RemoteError(f"set_lr needs a number, got {lr!r}", code=ErrorCode.BAD_REQUEST)
            try:
                groups = self.shard.set_lr(float(lr), body.get("group"))
            except PSError:
                raise
            except ValueError as exc:
                raise RemoteError(str(exc), code=ErrorCode.BAD_REQUEST) from None
            return [self._json(peer, h, {"lr": float(lr), "groups": groups})]
        if t == MsgType.STATS:
            return [self._json(peer, h, self.stats_json(now))]
        if t == MsgType.LEAVE:
            self.workers.leave(w)
            self.queues.pop(w, None)
            return [self._json(peer, h, {"left": w})] + self._drain()
        if t == MsgType.CHECKPOINT:
            path = self.checkpoint(force=True)
            return [
                self._json(
                    peer, h, {"path": str(path) if path else None, "updates": self.shard.updates}
                )
            ]
        if t == MsgType.DONE:
            body = self._json_body(msg)
            code = body.get("exit_code")
            if isinstance(code, bool) or not isinstance(code, int):
                raise RemoteError(
                    f"done needs an integer exit_code, got {code!r}", code=ErrorCode.BAD_REQUEST
                )
            self.exits[w] = code
            if isinstance(body.get("error"), str):
                self.errors[w] = body["error"][-2000:]
            self.workers.leave(w)
            self.queues.pop(w, None)
            self.held_done.append((peer, h))
            return self._drain() + self._maybe_end(now)
        if t == MsgType.SHUTDOWN:
            self.shutdown_requested = True
            return [self._json(peer, h, {"shutdown": True})]
        raise RemoteError(f"unhandled message type {t.name}", code=ErrorCode.UNKNOWN_TYPE)

    def _resume_step(self, w: int) -> int:
        """Where a joining worker's step counter starts. sync: the rounds completed (a
        worker that joins while round 0 is open takes part in round 0); otherwise its own
        progress or the slowest other worker's (WorkerTable.resume_step)."""
        if self.config.consistency.mode == SYNC:
            return self.shard.global_step
        return self.workers.resume_step(w)

    def _json_body(self, msg: Message) -> dict[str, Any]:
        try:
            body = msg.json()
        except WireError as err:
            raise RemoteError(str(err), code=ErrorCode.BAD_REQUEST) from None
        if not isinstance(body, dict):
            raise RemoteError(
                "control message payload must be a JSON object", code=ErrorCode.BAD_REQUEST
            )
        return body

    def _slot(self, key: int) -> Slot:
        try:
            return self.shard.slot(key)
        except UnknownKeyError as err:
            raise RemoteError(str(err), code=ErrorCode.UNKNOWN_KEY) from None

    @staticmethod
    def _check_trainable(slot: Slot) -> None:
        if slot.dtype.kind != "f":
            raise RemoteError(
                f"{slot.label} is {slot.dtype.name}: only float parameters take gradients",
                code=ErrorCode.NOT_TRAINABLE,
            )

    def _queue(self, worker: int) -> deque[_Pending]:
        """The worker's queue of data requests (made on its first)."""
        q = self.queues.get(worker)
        if q is None:
            q = self.queues[worker] = deque()
        return q

    def _enqueue(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        h = msg.header
        slot = self._slot(h.key)
        if h.msg_type in TENSOR_IN:
            if h.flags & wire.FLAG_JSON:
                raise RemoteError("tensor message with a JSON payload", code=ErrorCode.BAD_REQUEST)
            self.shard.check_tensor(slot, h.dtype, h.shape)
            if h.msg_type != MsgType.INIT:
                self._check_trainable(slot)
        q = self._queue(h.worker)
        q.append(_Pending(peer, msg, slot, arrived=now))
        if len(q) > 1:
            return []  # the head is waiting; an arrival alone unblocks nobody
        return self._drain()

    def _enqueue_many(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        """Check every member of a PUSH_PULL_MANY before any is queued (a bad one
        refuses the whole message, nothing applied), then queue one PUSH_PULL each."""
        h = msg.header
        if h.flags & wire.FLAG_JSON or h.dtype or len(msg.payload) < 2:
            raise RemoteError(
                "push_pull_many carries an index frame and one frame per tensor",
                code=ErrorCode.BAD_REQUEST,
            )
        count = len(msg.payload) - 1
        if count > MAX_MANY:
            raise RemoteError(
                f"push_pull_many of {count} tensors; at most {MAX_MANY}", code=ErrorCode.BAD_REQUEST
            )
        try:
            keys, _ = wire.unpack_keys(msg.payload[0], count)
        except WireError as err:
            raise RemoteError(str(err), code=ErrorCode.BAD_REQUEST) from None
        if len(set(keys)) != count:
            raise RemoteError("push_pull_many names a key twice", code=ErrorCode.BAD_REQUEST)
        members = []
        for key, frame in zip(keys, msg.payload[1:]):
            slot = self._slot(key)
            self._check_trainable(slot)
            if len(frame) != slot.nbytes:
                raise RemoteError(
                    f"{slot.label}: {len(frame)} bytes, expected {slot.nbytes} "
                    f"({slot.dtype.name} {list(slot.shape)})",
                    code=ErrorCode.SHAPE_MISMATCH,
                )
            sub = Header(
                msg_type=MsgType.PUSH_PULL,
                key=key,
                worker=h.worker,
                request_id=h.request_id,
                shard=h.shard,
                step=h.step,
                dtype=wire.dtype_code(slot.dtype),
                shape=slot.shape,
                nbytes=len(frame),
                mac_alg=h.mac_alg,
            )
            members.append((Message(header=sub, payload=[frame]), slot))
        group = _Group(peer, h, keys, [None] * count, [0] * count, count)
        q = self._queue(h.worker)
        waiting = bool(q)
        for i, (sub_msg, slot) in enumerate(members):
            q.append(_Pending(peer, sub_msg, slot, arrived=now, group=group, member=i))
        return [] if waiting else self._drain()

    def _group_reply(self, g: _Group) -> Outgoing:
        h = g.header
        hdr = Header(
            msg_type=MsgType.TENSORS,
            worker=h.worker,
            request_id=h.request_id,
            shard=self.config.index,
            step=max(g.versions),
            mac_alg=h.mac_alg,
            peer=h.session,
        )
        frames = wire.encode(
            self.signer,
            hdr,
            [wire.pack_keys(g.keys, g.versions), *g.values],
            alg=self._reply_alg(h),
        )
        self.stats.sent(h.worker, wire.frames_nbytes(frames))
        return Outgoing(g.peer, frames)

    def _drain(self) -> list[Outgoing]:
        """Serve queue heads until nothing more can proceed."""
        out: list[Outgoing] = []
        while True:
            self._changed = False
            for w in list(self.queues):
                q = self.queues.get(w)
                while q:
                    done = self._try(q[0], out)
                    if not done:
                        break
                    q.popleft()
                if q is not None and not q:
                    del self.queues[w]
            if self.config.consistency.mode == SYNC and self._finish_rounds():
                self._changed = True
            if not self._changed:
                return out

    def _finish_rounds(self) -> bool:
        live = self.workers.live()
        quorum = (
            self.config.expected_workers is None
            or len(self.workers.workers) >= self.config.expected_workers
        )
        finished = False
        for slot in self.shard.slots.values():
            if slot.contributors and sync_round_ready(slot.contributors, live, quorum):
                self.shard.finish_round(slot)
                self.stats.sync_rounds += 1
                finished = True
        return finished

    def _try(self, req: _Pending, out: list[Outgoing]) -> bool:
        """Serve one request if its conditions hold; False = it must keep waiting."""
        h = req.msg.header
        slot = req.slot
        w = h.worker
        mode = self.config.consistency.mode
        if h.msg_type == MsgType.INIT:
            applied = self.shard.init(slot, req.msg.tensor())
            self.stats.inits += 1
            self._changed = True
            flags = wire.FLAG_APPLIED if applied else 0
            out.append(self._reply(req.peer, h, MsgType.OK, flags=flags, step=slot.version))
            return True
        if not slot.initialized:
            return False
        if mode == BOUNDED and staleness_blocked(
            h.step,
            self.workers.min_progress(exclude=w),
            int(self.config.consistency.max_staleness or 0),
        ):
            return False
        if h.msg_type in (MsgType.PUSH, MsgType.PUSH_PULL) and not req.pushed:
            grad = req.msg.tensor()
            if mode == SYNC:
                if w in slot.contributors:
                    return False  # already gave a gradient to the open round
                self.shard.accumulate(slot, w, grad)
            else:
                self.stats.record_staleness(slot.version - self.last_pull.get((w, slot.key_id), 0))
                self.shard.apply(slot, grad)
            req.pushed = True
            slot.pushes += 1
            self.stats.pushes += 1
            self.stats.worker(w).pushes += 1
            self.workers.advance(w, h.step)
            self._changed = True
            if mode == SYNC:
                self._finish_rounds()
            if h.msg_type == MsgType.PUSH:
                out.append(self._reply(req.peer, h, MsgType.OK, step=slot.version))
                return True
        if mode == SYNC and w in slot.contributors:
            return False  # the round holding this worker's gradient is still open
        slot.pulls += 1
        self.stats.pulls += 1
        self.stats.worker(w).pulls += 1
        self.last_pull[(w, slot.key_id)] = slot.version
        g = req.group
        if g is not None:
            assert slot.value is not None
            g.values[req.member] = slot.value.copy()
            g.versions[req.member] = slot.version
            g.left -= 1
            if not g.left:
                out.append(self._group_reply(g))
            return True
        value, digest = self.shard.payload(slot, h.mac_alg)
        hdr = Header(
            msg_type=MsgType.TENSOR,
            key=h.key,
            worker=w,
            request_id=h.request_id,
            shard=self.config.index,
            step=slot.version,
            dtype=wire.dtype_code(slot.dtype),
            shape=slot.shape,
            nbytes=value.nbytes,
            mac_alg=h.mac_alg,
            peer=h.session,
        )
        frames = wire.encode(self.signer, hdr, [value], digests=[digest], alg=h.mac_alg)
        self.stats.sent(w, wire.frames_nbytes(frames))
        hold = Hold()
        slot.inflight = [t for t in slot.inflight if not t.done]
        slot.inflight.append(hold)
        out.append(Outgoing(req.peer, frames, hold=hold))
        return True

    # replies ------------------------------------------------------------------------
    def _reply(
        self, peer: bytes, req: Header, mtype: MsgType, flags: int = 0, step: int = 0
    ) -> Outgoing:
        hdr = Header(
            msg_type=mtype,
            key=req.key,
            worker=req.worker,
            request_id=req.request_id,
            shard=self.config.index,
            step=step,
            flags=flags,
            peer=req.session,
        )
        frames = wire.encode(self.signer, hdr, alg=self._reply_alg(req))
        self.stats.sent(req.worker, wire.frames_nbytes(frames))
        return Outgoing(peer, frames)

    def _json(self, peer: bytes, req: Header, obj: Any, mtype: MsgType = MsgType.OK) -> Outgoing:
        hdr = Header(
            msg_type=mtype,
            key=req.key,
            worker=req.worker,
            request_id=req.request_id,
            shard=self.config.index,
            peer=req.session,
        )
        frames = wire.encode_json(self.signer, hdr, obj, alg=self._reply_alg(req))
        self.stats.sent(req.worker, wire.frames_nbytes(frames))
        return Outgoing(peer, frames)

    def _reply_alg(self, req: Header) -> int:
        """Answer with the request's MAC algorithm when this process has it."""
        return req.mac_alg if req.mac_alg in self._macs else self.signer.alg

    def _error(self, peer: bytes, req: Header, code: str, message: str) -> Outgoing:
        return self._json(peer, req, {"code": code, "message": message}, MsgType.ERROR)

    # introspection ------------------------------------------------------------------
    def stats_json(self, now: float | None = None) -> dict[str, Any]:
        """This shard's STATS reply (see stats.py for the merged report schema)."""
        s, st = self.shard, self.stats
        workers = {}
        table = self.workers.workers
        for w in sorted(set(st.workers) | set(table)):
            t = st.worker(w)
            ws = table.get(w)
            workers[str(w)] = {
                "live": bool(ws and ws.live),
                "progress": ws.progress if ws else 0,
                "rejoins": ws.rejoins if ws else 0,
                "bytes_in": t.bytes_in,
                "bytes_out": t.bytes_out,
                "pushes": t.pushes,
                "pulls": t.pulls,
                "waiting": len(self.queues.get(w, ())),
            }
        return {
            "shard": self.config.index,
            "num_shards": self.config.num_shards,
            "consistency": self.config.consistency.to_json(),
            "keys": len(s.slots),
            "bytes": s.param_bytes,
            "optimizer_bytes": s.optimizer_bytes,
            "pushes": st.pushes,
            "pulls": st.pulls,
            "inits": st.inits,
            "updates": s.updates,
            "sync_rounds": st.sync_rounds,
            "global_step": s.global_step,
            "bytes_in": st.bytes_in,
            "bytes_out": st.bytes_out,
            "messages_in": st.messages_in,
            "messages_out": st.messages_out,
            "rejected": dict(sorted(st.rejected.items())),
            "live_workers": sorted(self.workers.live()),
            "workers": workers,
            "staleness_histogram": st.staleness_json(),
            "optimizers": {g: o.config() for g, o in s.optimizers.items()},
            "keys_detail": [
                {
                    "id": k.key_id,
                    "name": k.name,
                    "chunk": k.chunk,
                    "bytes": k.nbytes,
                    "version": k.version,
                    "pushes": k.pushes,
                    "pulls": k.pulls,
                    "initialized": k.initialized,
                }
                for k in sorted(s.slots.values(), key=lambda k: k.key_id)
            ],
            "checkpoint": {
                "dir": self.config.checkpoint_dir,
                "count": st.checkpoints,
                "last": st.last_checkpoint,
                "resumed_from": self.resumed_from,
            },
            "uptime_s": round(time.time() - st.started, 3),
        }
