"""Control requests (HELLO, REGISTER, SET_LR, STATS, LEAVE, CHECKPOINT, DONE, SHUTDOWN):
answered at once, never queued behind a worker's data requests.

``Commands`` is a mixin of ``ServerCore`` (core.py): one handler per message type, found
in ``HANDLERS``; each gets the request and returns the replies it made possible (a
LEAVE or DONE can unblock other workers' queued requests, so those come back too).
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import wire
from .consistency import SYNC, WorkerTable
from .errors import ErrorCode, PSError, RemoteError, WireError
from .replies import Outgoing, Replier
from .requests import Pending
from .shard import DEFAULT_GROUP, Shard
from .wire import Header, Message, MsgType

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


class Commands:
    # what the handlers use of ServerCore
    config: Any
    shard: Shard
    workers: WorkerTable
    replies: Replier
    queues: dict[int, deque[Pending]]
    resumed_from: str | None
    placement: dict[str, Any] | None
    exits: dict[int, int]
    errors: dict[int, str]
    held_done: list[tuple[bytes, Header]]
    shutdown_requested: bool
    _drain: Callable[[], list[Outgoing]]
    _maybe_end: Callable[[float], list[Outgoing]]
    checkpoint: Callable[..., Path | None]
    stats_json: Callable[..., dict[str, Any]]

    def _command(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
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
            self.placement = body["placement"]
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
        return [self.replies.json(peer, msg.header, self.stats_json(now))]

    def _leave(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        w = msg.header.worker
        self.workers.leave(w)
        self.queues.pop(w, None)
        return [self.replies.json(peer, msg.header, {"left": w})] + self._drain()

    def _checkpoint(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        path = self.checkpoint(force=True)
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
        self.exits[h.worker] = code
        if isinstance(body.get("error"), str):
            self.errors[h.worker] = body["error"][-2000:]
        self.workers.leave(h.worker)
        self.queues.pop(h.worker, None)
        self.held_done.append((peer, h))
        return self._drain() + self._maybe_end(now)

    def _shutdown(self, peer: bytes, msg: Message, now: float) -> list[Outgoing]:
        self.shutdown_requested = True
        return [self.replies.json(peer, msg.header, {"shutdown": True})]


Handler = Callable[[Commands, bytes, Message, float], list[Outgoing]]
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
