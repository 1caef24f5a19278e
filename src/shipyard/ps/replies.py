"""What a shard sends back: signed reply frames, counted in the shard's stats.

Why a module of its own: every path of the core (control requests, the data path,
errors) ends in one of these few reply shapes, each answered with the request's MAC
algorithm when this process has it, and each counted as bytes out to its worker. The
core decides *what* to answer; this decides how it goes on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import wire
from .shard import Slot
from .stats import ShardStats
from .wire import Buffer, Header, MsgType


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


class Replier:
    """Encodes one shard's replies (OK, JSON, ERROR, TENSOR, TENSORS)."""

    def __init__(self, signer: wire.Signer, shard: int, stats: ShardStats) -> None:
        self.signer = signer
        self.shard = shard
        self.stats = stats
        self._macs = {wire.MAC_ALGORITHMS[n] for n in wire.available_macs()}

    def alg(self, req: Header) -> int:
        """Answer with the request's MAC algorithm when this process has it."""
        return req.mac_alg if req.mac_alg in self._macs else self.signer.alg

    def _out(
        self, peer: bytes, worker: int, frames: list[Buffer], hold: Hold | None = None
    ) -> Outgoing:
        self.stats.sent(worker, sum(map(len, frames)))  # encode's frames are flat byte views
        return Outgoing(peer, frames, hold)

    def ok(
        self, peer: bytes, req: Header, mtype: MsgType = MsgType.OK, flags: int = 0, step: int = 0
    ) -> Outgoing:
        """A bodiless reply (OK to INIT and PUSH, with the parameter's version)."""
        alg = self.alg(req)
        hdr = Header(
            msg_type=mtype,
            key=req.key,
            worker=req.worker,
            request_id=req.request_id,
            peer=req.session,  # only the requesting session accepts it (wire.ReplayGuard)
            shard=self.shard,
            step=step,
            flags=flags,
            mac_alg=alg,  # set here, so encode need not rebuild the header
        )
        return self._out(peer, req.worker, wire.encode(self.signer, hdr, alg=alg))

    def json(self, peer: bytes, req: Header, obj: Any, mtype: MsgType = MsgType.OK) -> Outgoing:
        hdr = Header(
            msg_type=mtype,
            key=req.key,
            worker=req.worker,
            request_id=req.request_id,
            peer=req.session,  # only the requesting session accepts it (wire.ReplayGuard)
            shard=self.shard,
        )
        frames = wire.encode_json(self.signer, hdr, obj, alg=self.alg(req))
        return self._out(peer, req.worker, frames)

    def error(self, peer: bytes, req: Header, code: str, message: str) -> Outgoing:
        return self.json(peer, req, {"code": code, "message": message}, MsgType.ERROR)

    def tensor(self, peer: bytes, req: Header, slot: Slot, value: Any, digest: Any) -> Outgoing:
        """One parameter, sent from its own buffer (zero copy): the reply holds it."""
        if digest is None:  # aes-gmac / poly1305: the header packed straight from the fields
            frames = wire.encode_tensor(
                self.signer, MsgType.TENSOR, req.key, req.worker, req.request_id, self.shard,
                slot.version, wire.dtype_code(slot.dtype), slot.shape, value, req.session,
                req.mac_alg,
            )  # fmt: skip
            return self._out(peer, req.worker, frames, Hold())
        # positional (Header's field order: a keyword call costs ~2x); peer = the
        # requesting session, the only one that accepts it (wire.ReplayGuard)
        hdr = Header(
            MsgType.TENSOR, req.key, req.worker, req.request_id, self.shard, slot.version,
            wire.dtype_code(slot.dtype), slot.shape, value.nbytes, 0, req.mac_alg, 0, 0,
            req.session,
        )  # fmt: skip
        frames = wire.encode(self.signer, hdr, (value,), digests=(digest,), alg=req.mac_alg)
        return self._out(peer, req.worker, frames, Hold())

    def tensors(
        self, peer: bytes, req: Header, keys: list[int], versions: list[int], values: list[Any]
    ) -> Outgoing:
        """The one reply to a PUSH_PULL_MANY: an index frame, then one frame per key."""
        hdr = Header(
            msg_type=MsgType.TENSORS,
            worker=req.worker,
            request_id=req.request_id,
            peer=req.session,  # only the requesting session accepts it (wire.ReplayGuard)
            shard=self.shard,
            step=max(versions),
            mac_alg=req.mac_alg,
        )
        frames = wire.encode(
            self.signer, hdr, [wire.pack_keys(keys, versions), *values], alg=self.alg(req)
        )
        return self._out(peer, req.worker, frames)
