"""How ``PSClient`` turns calls into requests: headers, request objects, grouping.

Why its own module: a request (``Request``) carries everything the exchange needs without
knowing what it means (which shard, the header, how to encode it, what to do with the
reply); building them is where the protocol's choices sit: every header names this
worker, its step and the shard's session (replay.py's guard), and small
gradients to one shard share one PUSH_PULL_MANY message (one round trip instead of one
each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import wire
from .client_state import ClientState
from .errors import (
    RemoteError,
    WireError,
)
from .placement import Chunk, KeyPlacement
from .wire import Header, Message, MsgType

# push_pull sends the tensors below this size, per shard, in one PUSH_PULL_MANY message:
# a round trip costs ~90 us of CPU (client and shard) whatever its size, and a model has
# many small tensors (biases, norms): the tutorial CNN's 14 messages per step become 6,
# and its push+pull went from ~0.46 to ~0.51 of raw TCP (BENCHMARKS.md). 256 KiB (4
# messages) measured no better.
GROUP_MAX_BYTES = 64 * 1024
GROUP_MAX_COUNT = 1024


@dataclass
class Request:
    """One request: how to encode it and what to do with its reply."""

    shard: int
    header: Header
    on_reply: Callable[[Message], None]
    label: str
    make: Callable[[bool], list]  # make(parallel) -> frames
    nbytes: int = 0
    payload: np.ndarray | None = None  # a gradient to push (PUSH_PULL), for grouping
    dest: np.ndarray | None = None  # bytes where the reply's value goes (received into)


def ignore_reply(msg: Message) -> None:
    """The reply handler of a request whose reply carries nothing the caller needs."""
    return None


class RequestBuilder:
    """Builds a client's requests from what it shares (``ClientState``).

    ``learn_sessions`` is called when a request would go to a shard whose session is not
    known yet (a client made with ``connect=False``): it says HELLO to those shards."""

    def __init__(self, state: ClientState, learn_sessions: Callable[[], None]) -> None:
        self._state = state
        self._learn_sessions = learn_sessions

    def header(self, shard: int, mtype: MsgType, key: int = 0, **kw: Any) -> Header:
        """A request header: this worker, its step, a fresh request id and the shard's session."""
        state = self._state
        # the MAC id is set here so encode() need not rebuild the header per message
        if not state.peers[shard] and mtype != MsgType.HELLO:
            self._learn_sessions()
        return Header(
            msg_type=mtype,
            key=key,
            worker=state.worker_id,
            mac_alg=state.signer.alg,
            request_id=next(state.rids) & wire.U32_MAX,
            shard=shard,
            step=state.step,
            peer=state.peers[shard],
            **kw,
        )

    def json(
        self,
        shard: int,
        mtype: MsgType,
        body: Any,
        on_reply: Callable[[Message], None] | None,
        label: str,
    ) -> Request:
        hdr = self.header(shard, mtype)
        return Request(
            shard,
            hdr,
            on_reply or ignore_reply,
            label,
            lambda parallel: wire.encode_json(self._state.signer, hdr, body),
        )

    def tensor(
        self,
        kp: KeyPlacement,
        c: Chunk,
        mtype: MsgType,
        payload: np.ndarray | None,
        on_reply: Callable[[Message], None] | None,
    ) -> Request:
        label = kp.spec.name if c.whole else f"{kp.spec.name}[chunk {c.index}]"
        if payload is None:
            hdr = self.header(c.shard, mtype, c.key_id)
            return Request(
                c.shard,
                hdr,
                on_reply or ignore_reply,
                label,
                lambda parallel: wire.encode(self._state.signer, hdr),
            )
        hdr = self.header(
            c.shard,
            mtype,
            c.key_id,
            dtype=wire.dtype_code(kp.spec.dtype),
            shape=kp.chunk_shape(c),
            nbytes=int(payload.nbytes),
        )
        return Request(
            c.shard,
            hdr,
            on_reply or ignore_reply,
            label,
            lambda parallel: wire.encode(self._state.signer, hdr, [payload], parallel=parallel),
            nbytes=int(payload.nbytes),
            payload=payload,
        )

    def grouped(self, reqs: list[Request]) -> list[Request]:
        """Small PUSH_PULL requests to the same shard merged into one PUSH_PULL_MANY
        each (when every shard takes it); the others as they are, in order."""
        if not self._state.many:
            return reqs
        small: dict[int, list[Request]] = {}
        for r in reqs:
            if self.groupable(r):
                small.setdefault(r.shard, []).append(r)
        groups = [members for members in small.values() if len(members) > 1]
        if not groups:
            return reqs
        merged = {id(r) for members in groups for r in members}
        out = [r for r in reqs if id(r) not in merged]
        for members in groups:
            for i in range(0, len(members), GROUP_MAX_COUNT):
                part = members[i : i + GROUP_MAX_COUNT]
                out.append(self._many(part) if len(part) > 1 else part[0])
        return out

    @staticmethod
    def groupable(r: Request) -> bool:
        """A small gradient push_pull, which may share a PUSH_PULL_MANY message."""
        return (
            r.header.msg_type == MsgType.PUSH_PULL
            and r.payload is not None
            and r.nbytes < GROUP_MAX_BYTES
        )

    def _many(self, members: list[Request]) -> Request:
        shard = members[0].shard
        hdr = self.header(shard, MsgType.PUSH_PULL_MANY)
        index = wire.pack_keys([m.header.key for m in members])
        payloads = [m.payload for m in members if m.payload is not None]  # all (groupable)

        def on_reply(msg: Message) -> None:
            h = msg.header
            if h.msg_type != MsgType.TENSORS or len(msg.payload) != len(members) + 1:
                raise RemoteError(
                    f"push_pull_many of {len(members)} tensors got a reply of type "
                    f"{h.msg_type} with {len(msg.payload)} frame(s)",
                    shard=shard,
                )
            try:
                keys, versions = wire.unpack_keys(msg.payload[0], len(members), versions=True)
            except WireError as err:
                raise RemoteError(str(err), shard=shard) from None
            for m, key, version, frame in zip(members, keys, versions, msg.payload[1:]):
                if key != m.header.key:
                    raise RemoteError(
                        f"push_pull_many reply lists key {key} where {m.header.key} was sent",
                        shard=shard,
                    )
                mh = m.header
                sub = Header(
                    msg_type=MsgType.TENSOR,
                    key=key,
                    worker=h.worker,
                    request_id=h.request_id,
                    shard=h.shard,
                    step=version,
                    dtype=mh.dtype,
                    shape=mh.shape,
                    nbytes=len(frame),
                )
                try:
                    m.on_reply(Message(header=sub, payload=[frame]))
                except WireError as err:  # a value frame that does not fit the tensor
                    raise RemoteError(f"{m.label}: {err}", shard=shard) from None

        names = ", ".join(m.label for m in members[:3]) + (", ..." if len(members) > 3 else "")
        return Request(
            shard,
            hdr,
            on_reply,
            f"{len(members)} small tensors ({names})",
            lambda parallel: wire.encode(
                self._state.signer, hdr, [index, *payloads], parallel=parallel
            ),
            nbytes=sum(m.nbytes for m in members),
        )
