"""Data requests as a shard queues them, and the checks they pass before they may wait.

A data request (INIT, PUSH, PULL, PUSH_PULL) names a key this shard holds and, when it
carries a tensor, one of that key's dtype and shape; a gradient only goes to a float
parameter. All of that is checked on arrival, so a request that is queued can only be
refused by the consistency rules later, never by its shape. A PUSH_PULL_MANY is checked
whole (a bad member refuses the message, nothing applied) and then becomes one
PUSH_PULL per key, tied together by a ``Group`` whose one reply leaves with the last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import wire
from .errors import ErrorCode, RemoteError, UnknownKeyError, WireError
from .shard import Shard, Slot
from .wire import Header, Message, MsgType

TENSOR_IN = frozenset({MsgType.INIT, MsgType.PUSH, MsgType.PUSH_PULL})
MAX_MANY = 4096  # tensors in one PUSH_PULL_MANY


@dataclass
class Group:
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
class Pending:
    """One queued data request; ``pushed`` once its gradient is in (its pull may still
    wait for the sync round)."""

    peer: bytes
    msg: Message
    slot: Slot
    pushed: bool = False
    arrived: float = 0.0
    group: Group | None = None
    member: int = 0


def slot_of(shard: Shard, key: int) -> Slot:
    try:
        return shard.slot(key)
    except UnknownKeyError as err:
        raise RemoteError(str(err), code=ErrorCode.UNKNOWN_KEY) from None


def check_trainable(slot: Slot) -> None:
    if slot.dtype.kind != "f":
        raise RemoteError(
            f"{slot.label} is {slot.dtype.name}: only float parameters take gradients",
            code=ErrorCode.NOT_TRAINABLE,
        )


def admit(shard: Shard, msg: Message) -> Slot:
    """The slot of one data request, once its tensor (if any) fits it."""
    h = msg.header
    slot = slot_of(shard, h.key)
    if h.msg_type in TENSOR_IN:
        if h.flags & wire.FLAG_JSON:
            raise RemoteError("tensor message with a JSON payload", code=ErrorCode.BAD_REQUEST)
        shard.check_tensor(slot, h.dtype, h.shape)
        if h.msg_type != MsgType.INIT:
            check_trainable(slot)
    return slot


def split_many(shard: Shard, msg: Message) -> tuple[list[int], list[tuple[Message, Slot]]]:
    """A PUSH_PULL_MANY's keys and one PUSH_PULL (with its slot) per key, every member
    checked before any is returned."""
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
        slot = slot_of(shard, key)
        check_trainable(slot)
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
    return keys, members
