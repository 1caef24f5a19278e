"""Control requests (HELLO, REGISTER, SET_LR, STATS, LEAVE, CHECKPOINT, DONE, SHUTDOWN):
answered at once, never queued behind a worker's data requests.

``Commands`` is one object of a ``ServerCore`` (core.py), given in its constructor the
parts of the shard it acts on (the shard's tensors, worker table, queues, replier and
the job's end) and the core's three actions it triggers (serve what can proceed,
write a checkpoint, the STATS body). One handler per message type, found in
``HANDLERS``; each gets the request and returns the replies it made possible (a LEAVE
or DONE can unblock other workers' queued requests, so those come back too).
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import wire
from .consistency import SYNC, WorkerTable
from .ending import JobEnd
from .errors import ErrorCode, PSError, RemoteError, WireError
from .replies import Outgoing, Replier
from .requests import Pending
from .shard import DEFAULT_GROUP, Shard
from .shard_config import ServerConfig
from .wire import Message, MsgType

if TYPE_CHECKING:  # aliases are strings: job processes may run in Python 3.7/3.8
    from typing import TypeAlias

FEATURES = ("push_pull_many",)  # announced in HELLO; clients use only what every shard has


def json_body(msg: Message) -> dict[str, Any]:
    """A control request's JSON object (anything else is a BAD_REQUEST)."""
    try:
        body = msg.json()
    except WireError as err:
        raise RemoteError(str(err), code=ErrorCode.BAD_REQUEST) from None
    if not isinstance(body, dict):
        raise RemoteError(
            "control message payload must be a JSON object", code=ErrorCode.BAD_REQUEST
        )
    return body


@dataclass(frozen=True)
class CoreActions:
    """What control requests make the core do (its bound methods, handed over explicitly)."""

    drain: Callable[[], list[Outgoing]]  # serve the queued requests that can now proceed
    checkpoint: Callable[[bool], Path | None]  # write a checkpoint (forced: even unchanged)
    stats_json: Callable[[float], dict[str, Any]]  # this shard's STATS body


class Commands:
    """A shard's answers to control requests."""

    def __init__(
        self,
        config: ServerConfig,
        shard: Shard,
        workers: WorkerTable,
        queues: dict[int, deque[Pending]],
        replies: Replier,
        job: JobEnd,
        actions: CoreActions,
        resumed_from: str | None,
    ) -> None:
        self.config = config
        self.shard = shard
        self.workers = workers
        self.queues = queues  # the core's own dict: a leaving worker's queue is dropped
        self.replies = replies
        self.job = job
        self._actions = actions
        self.resumed_from = resumed_from
        self.shutdown_requested = False  # a SHUTDOWN came

    def command(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        """Answer one control request; the replies it made possible."""
        handler = HANDLERS.get(MsgType(msg.header.msg_type))
        if handler is None:
            name = MsgType(msg.header.msg_type).name
            raise RemoteError(f"unhandled message type {name}", code=ErrorCode.UNKNOWN_TYPE)
        return handler(self, peer, msg, now)

    def _hello(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        info = {
            "protocol": wire.PROTOCOL_VERSION,
            "shard": self.config.index,
            "num_shards": self.config.num_shards,
            "consistency": self.config.consistency.to_json(),
            "step": self._resume_step(msg.header.worker),
            "keys": len(self.shard.slots),
            "heartbeat_timeout": self.config.heartbeat_timeout,
            "pid": os.getpid(),
            "max_message_bytes": self.config.max_payload,
            "host": socket.gethostname(),
            "resumed_from": self.resumed_from,
            "features": list(FEATURES),
        }
        return [self.replies.json(peer, msg.header, info)]

    def _resume_step(self, w: int) -> int:
        """Where a joining worker's step counter starts. sync: the rounds completed (a
        worker that joins while round 0 is open takes part in round 0); otherwise its own
        progress or the slowest other worker's (WorkerTable.resume_step)."""
        if self.config.consistency.mode == SYNC:
            return self.shard.global_step
        return self.workers.resume_step(w)

    def _register(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        body = json_body(msg)
        result = self.shard.register(
            body.get("keys", []), body.get("optimizer"), str(body.get("group") or DEFAULT_GROUP)
        )
        if isinstance(body.get("placement"), dict):
            self.job.placement = body["placement"]
        return [self.replies.json(peer, msg.header, result)]

    def _set_lr(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        body = json_body(msg)
        lr = body.get("lr")
        if not isinstance(lr, (int, float)) or isinstance(lr, bool):
            raise RemoteError(f"set_lr needs a number, got {lr!r}", code=ErrorCode.BAD_REQUEST)
        try:
            groups = self.shard.set_lr(float(lr), body.get("group"))
        except PSError:
            raise
        except ValueError as exc:
            raise RemoteError(str(exc), code=ErrorCode.BAD_REQUEST) from None
        return [self.replies.json(peer, msg.header, {"lr": float(lr), "groups": groups})]

    def _stats(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        return [self.replies.json(peer, msg.header, self._actions.stats_json(now))]

    def _leave(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        w = msg.header.worker
        self.workers.leave(w)
        self.queues.pop(w, None)
        return [self.replies.json(peer, msg.header, {"left": w})] + self._actions.drain()

    def _checkpoint(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        path = self._actions.checkpoint(True)
        body = {"path": str(path) if path else None, "updates": self.shard.updates}
        return [self.replies.json(peer, msg.header, body)]

    def _done(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        """A worker's wrapper reports its exit; the answer waits for the job's end."""
        h = msg.header
        body = json_body(msg)
        code = body.get("exit_code")
        if isinstance(code, bool) or not isinstance(code, int):
            raise RemoteError(
                f"done needs an integer exit_code, got {code!r}", code=ErrorCode.BAD_REQUEST
            )
        error = body.get("error")
        self.job.worker_done(peer, h, code, error if isinstance(error, str) else None)
        self.workers.leave(h.worker)
        self.queues.pop(h.worker, None)
        return self._actions.drain() + self.job.maybe_end(now)

    def _shutdown(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        self.shutdown_requested = True
        return [self.replies.json(peer, msg.header, {"shutdown": True})]


Handler: TypeAlias = "Callable[[Commands, bytes, Message, float], list[Outgoing]]"
HANDLERS: dict[MsgType, Handler] = {
    MsgType.HELLO: Commands._hello,
    MsgType.REGISTER: Commands._register,
    MsgType.SET_LR: Commands._set_lr,
    MsgType.STATS: Commands._stats,
    MsgType.LEAVE: Commands._leave,
    MsgType.CHECKPOINT: Commands._checkpoint,
    MsgType.DONE: Commands._done,
    MsgType.SHUTDOWN: Commands._shutdown,
}
