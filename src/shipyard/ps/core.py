"""The shard's protocol state machine: frames in, frames out. No sockets, no threads.

Why a separate core: the server loop (server.py) only moves frames between a
shard's sockets and this object, and tests (or an in-process transport) can
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

Where each part lives (one object, these modules): ``requests`` checks a data request
on arrival and splits a PUSH_PULL_MANY; this module queues them and serves each queue
head through three steps, ``_gate`` (may it proceed under the consistency mode?),
``_push`` (the update) and ``_pull`` (the value back); ``replies`` encodes and counts
every reply; ``commands`` answers the control requests; ``ending`` ends a job's shard
when every worker has; ``stats.shard_json`` is the STATS body; ``shard_config`` is
``ServerConfig``. The objects share nothing but what each is given in its constructor.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import checkpoint as ckpt
from . import wire
from .commands import FEATURES, Commands, CoreActions
from .consistency import (
    BOUNDED,
    SYNC,
    WorkerTable,
    staleness_blocked,
    sync_round_ready,
)
from .ending import JobEnd
from .errors import ErrorCode, PSError, RemoteError, WireError
from .replies import Hold, Outgoing, Replier
from .requests import MAX_MANY, Group, Pending, admit, split_many
from .shard import Shard
from .shard_config import DEFAULT_MAX_PAYLOAD, ServerConfig
from .stats import ShardStats, shard_json
from .wire import Buffer, Message, MsgType

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "FEATURES",
    "MAX_MANY",
    "Hold",
    "Outgoing",
    "ServerConfig",
    "ServerCore",
]

log = logging.getLogger("shipyard.ps.core")

DATA_TYPES = frozenset({MsgType.INIT, MsgType.PUSH, MsgType.PULL, MsgType.PUSH_PULL})
PUSHES = frozenset({MsgType.PUSH, MsgType.PUSH_PULL})


class ServerCore:
    """One shard's protocol logic: the data path here, control requests in ``commands``
    (commands.py), the end of the job in ``job`` (ending.py)."""

    def __init__(
        self, config: ServerConfig, secret: str | bytes, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.signer = wire.Signer(secret)
        self.replay = wire.ReplayGuard(self.signer.session)  # this shard's session = its run
        self.clock = clock
        self.shard = Shard(config.index, config.num_shards)
        self.workers = WorkerTable(config.heartbeat_timeout)
        self.stats = ShardStats()
        self.replies = Replier(self.signer, config.index, self.stats)
        self.queues: dict[int, deque[Pending]] = {}
        self.last_pull: dict[tuple[int, int], int] = {}
        self._changed = False
        self._last_checkpoint = clock()
        self.resumed_from: str | None = None
        self.job = JobEnd(config, self.workers, self.replies, clock(), self.stats_json)
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
        actions = CoreActions(self._drain, self.checkpoint, self.stats_json)
        self.commands = Commands(
            config, self.shard, self.workers, self.queues, self.replies, self.job, actions,
            self.resumed_from,
        )  # fmt: skip

    @property
    def shutdown_requested(self) -> bool:
        """True once a SHUTDOWN came or the job has ended: the server stops."""
        return self.commands.shutdown_requested or self.job.outcome is not None

    @property
    def exit_code(self) -> int:
        """0 unless the job ended with no worker that finished successfully."""
        return self.job.exit_code

    def failure_text(self) -> str | None:
        """Why the job's training failed when every worker failed (the shard's exit text)."""
        return self.job.failure_text()

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
                return [self.replies.error(peer, hdr, err.code, str(err))]
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
            return [self.replies.error(peer, h, err.code, str(err))]
        except Exception as exc:  # a bug must not stop the shard serving others
            log.exception("internal error handling %s", h)
            self.stats.reject(ErrorCode.INTERNAL)
            return [self.replies.error(peer, h, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")]

    def tick(self, now: float | None = None) -> list[Outgoing]:
        """Expire silent workers and serve whatever that unblocks."""
        now = self.clock() if now is None else now
        dead = self.workers.expire(now)
        for w in dead:  # its queued requests stay: a worker declared dead by mistake loses nothing
            log.info(
                "shard %d: worker %d missed heartbeats; continuing without it", self.config.index, w
            )
        return (self._drain() if dead else []) + self.job.maybe_end(now)

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

    def stats_json(self, now: float | None = None) -> dict[str, Any]:
        """This shard's STATS reply (see stats.py for the merged report schema)."""
        cfg, st = self.config, self.stats
        return shard_json(
            cfg.index,
            cfg.num_shards,
            cfg.consistency,
            self.shard,
            st,
            self.workers,
            self.queues,
            {
                "dir": cfg.checkpoint_dir,
                "count": st.checkpoints,
                "last": st.last_checkpoint,
                "resumed_from": self.resumed_from,
            },
        )

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
        self.workers.seen(h.worker, now)
        self.job.joined.add(h.worker)
        t = h.msg_type  # a plain int (IntEnum compares and hashes as one): no enum lookup
        if t == MsgType.HEARTBEAT:
            return []
        if t in DATA_TYPES:
            return self._enqueue(peer, msg, now)
        if t == MsgType.PUSH_PULL_MANY:
            return self._enqueue_many(peer, msg, now)
        return self.commands.command(peer, msg, now)

    # the data path: queue, then serve queue heads -------------------------------------
    def _queue(self, worker: int) -> deque[Pending]:
        """The worker's queue of data requests (made on its first)."""
        q = self.queues.get(worker)
        if q is None:
            q = self.queues[worker] = deque()
        return q

    def _enqueue(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        slot = admit(self.shard, msg)
        req = Pending(peer, msg, slot, arrived=now)
        if not self.queues and self.config.consistency.mode != SYNC:
            # nothing waits on this shard (the common case outside sync rounds): serve it
            # here, as _drain would, without queueing it first. Its push cannot unblock
            # anyone (no queue holds anything), so one _try is the whole drain.
            out: list[Outgoing] = []
            if not self._try(req, out):
                self.queues[msg.header.worker] = deque((req,))
            return out
        q = self._queue(msg.header.worker)
        q.append(req)
        if len(q) > 1:
            return []  # the head is waiting; an arrival alone unblocks nobody
        return self._drain()

    def _enqueue_many(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        """Check every member of a PUSH_PULL_MANY before any is queued (a bad one
        refuses the whole message, nothing applied), then queue one PUSH_PULL each."""
        h = msg.header
        keys, members = split_many(self.shard, msg)
        count = len(members)
        group = Group(peer, h, keys, [None] * count, [0] * count, count)
        q = self._queue(h.worker)
        waiting = bool(q)
        for i, (sub_msg, slot) in enumerate(members):
            q.append(Pending(peer, sub_msg, slot, arrived=now, group=group, member=i))
        return [] if waiting else self._drain()

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

    def _try(self, req: Pending, out: list[Outgoing]) -> bool:
        """Serve one request if its conditions hold; False = it must keep waiting."""
        h = req.msg.header
        if h.msg_type == MsgType.INIT:
            out.append(self._init(req))
            return True
        if not self._gate(req):
            return False
        if h.msg_type in PUSHES and not req.pushed:
            if not self._push(req):
                return False
            if h.msg_type == MsgType.PUSH:
                out.append(self.replies.ok(req.peer, h, step=req.slot.version))
                return True
        if self.config.consistency.mode == SYNC and h.worker in req.slot.contributors:
            return False  # the round holding this worker's gradient is still open
        self._pull(req, out)
        return True

    def _init(self, req: Pending) -> Outgoing:
        """INIT: the first value wins (every worker sends one; later ones are ignored)."""
        slot = req.slot
        applied = self.shard.init(slot, req.msg.tensor())
        self.stats.inits += 1
        self._changed = True
        flags = wire.FLAG_APPLIED if applied else 0
        return self.replies.ok(req.peer, req.msg.header, flags=flags, step=slot.version)

    def _gate(self, req: Pending) -> bool:
        """The consistency gate for a push or pull: the key has a value and, in bounded
        mode, this worker is not more than max_staleness steps ahead of the slowest."""
        if not req.slot.initialized:
            return False
        cons = self.config.consistency
        return not (
            cons.mode == BOUNDED
            and staleness_blocked(
                req.msg.header.step,
                self.workers.min_progress(exclude=req.msg.header.worker),
                int(cons.max_staleness or 0),
            )
        )

    def _push(self, req: Pending) -> bool:
        """The update: apply the gradient (async, bounded) or add it to the open round
        (sync; False while this worker's gradient is already in that round)."""
        h, slot, w = req.msg.header, req.slot, req.msg.header.worker
        sync = self.config.consistency.mode == SYNC
        grad = req.msg.tensor()
        if sync:
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
        if sync:
            self._finish_rounds()
        return True

    def _pull(self, req: Pending, out: list[Outgoing]) -> None:
        """The value back: alone from the parameter's own buffer (held until sent), or
        copied into its PUSH_PULL_MANY group, whose reply leaves with the last member."""
        h, slot, w = req.msg.header, req.slot, req.msg.header.worker
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
                out.append(self.replies.tensors(g.peer, g.header, g.keys, g.versions, g.values))
            return
        value, digest = self.shard.payload(slot, h.mac_alg)
        reply = self.replies.tensor(req.peer, h, slot, value, digest)
        slot.inflight = [t for t in slot.inflight if not t.done]
        slot.inflight.append(reply.hold)
        out.append(reply)
