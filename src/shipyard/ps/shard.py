"""The state of one server shard: parameters, optimizer state, versions. No sockets.

Why separate from the server loop: everything a shard *does* to its numbers
(register, first-writer init, apply a gradient, aggregate a sync round, change the
learning rate, snapshot for a checkpoint) is plain numpy on plain data, tested
without a network.

Zero-copy sends and in-place updates do not mix by themselves: a pull reply hands
the parameter buffer to the socket writer, which may still be sending it when
the next gradient arrives. Each slot therefore keeps the delivery trackers of its
in-flight sends (anything with a ``done`` attribute) and an update first moves the
parameters to a spare buffer if the current one is still in flight
(copy-on-write), so a reply always carries exactly one version.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import wire
from .errors import ErrorCode, RemoteError, ShapeMismatchError, UnknownKeyError
from .optimizers import SCRATCH_SLOTS, Optimizer, State, make_optimizer

DEFAULT_GROUP = "default"


def _prod(dims: tuple[int, ...]) -> int:
    """``math.prod`` of a shape (1 for ``()``): math.prod is Python 3.8+, and this module
    runs in framework environments down to Python 3.7."""
    return functools.reduce(operator.mul, dims, 1)


class RegistrationConflict(RemoteError):
    """A registration that contradicts what the shard holds (code config_mismatch)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.CONFIG_MISMATCH)


@dataclass
class Slot:
    """One server key: a whole tensor or a chunk of one."""

    key_id: int
    name: str
    chunk: int
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    group: str = DEFAULT_GROUP
    value: np.ndarray | None = None
    state: State = field(default_factory=dict)
    version: int = 0
    inflight: list[Any] = field(default_factory=list)
    spare: np.ndarray | None = None
    spare_inflight: list[Any] = field(default_factory=list)
    digest: tuple[int, int, bytes] | None = None  # (version, MAC alg, wire.payload_digest)
    acc: np.ndarray | None = None  # sync: sum of this round's gradients
    contributors: set[int] = field(default_factory=set)
    pushes: int = 0
    pulls: int = 0

    @property
    def nbytes(self) -> int:
        return _prod(self.shape) * self.dtype.itemsize

    @property
    def initialized(self) -> bool:
        return self.value is not None

    @property
    def label(self) -> str:
        return (
            self.name
            if self.chunk == 0 and self.offset == 0
            else f"{self.name}[chunk {self.chunk}]"
        )

    def spec_json(self) -> dict[str, Any]:
        return {
            "id": self.key_id,
            "name": self.name,
            "chunk": self.chunk,
            "offset": self.offset,
            "shape": list(self.shape),
            "dtype": self.dtype.name,
            "group": self.group,
        }


def _all_done(trackers: Sequence[Any]) -> bool:
    for t in trackers:  # a loop, not all(genexpr): every update of a pulled slot asks
        if not getattr(t, "done", True):
            return False
    return True


class Shard:
    """Parameters and optimizer state of shard ``index`` of ``num_shards``."""

    def __init__(self, index: int, num_shards: int) -> None:
        self.index = index
        self.num_shards = num_shards
        self.slots: dict[int, Slot] = {}
        self.by_name: dict[tuple[str, int], int] = {}
        self.optimizers: dict[str, Optimizer] = {}
        self.updates = 0  # optimizer applications, all keys
        self.dirty = False  # changed since the last checkpoint
        self._scratch: list[np.ndarray] = []

    # registration -------------------------------------------------------------
    def register(
        self, keys: Sequence[dict[str, Any]], optimizer: Any = None, group: str = DEFAULT_GROUP
    ) -> dict[str, Any]:
        """Declare keys (idempotent). Conflicts raise RegistrationConflict, nothing changes."""
        opt = make_optimizer(optimizer) if optimizer is not None else None
        existing = self.optimizers.get(group)
        if opt is not None and existing is not None and not _same_config(existing, opt):
            raise RegistrationConflict(
                f"optimizer group {group!r} is already {existing.config()}, not {opt.config()} "
                "(only lr may differ; it is set with set_lr)"
            )
        new: list[Slot] = []
        for entry in keys:
            try:
                kid = int(entry["id"])
                name = str(entry["name"])
                chunk = int(entry.get("chunk", 0))
                offset = int(entry.get("offset", 0))
                shape = tuple(int(d) for d in entry["shape"])
                dtype = np.dtype(entry["dtype"])
                wire.dtype_code(dtype)
            except (KeyError, TypeError, ValueError) as exc:
                raise RemoteError(
                    f"bad key entry {entry!r}: {exc}", code=ErrorCode.BAD_REQUEST
                ) from None
            if (
                kid < 0
                or kid > wire.U32_MAX
                or len(shape) > wire.MAX_NDIM
                or any(d < 0 for d in shape)
            ):
                raise RemoteError(f"bad key entry {entry!r}", code=ErrorCode.BAD_REQUEST)
            slot = self.slots.get(kid)
            if slot is not None:
                if (slot.name, slot.chunk, slot.shape, slot.dtype) != (name, chunk, shape, dtype):
                    raise RegistrationConflict(
                        f"key id {kid} is registered as {slot.label} {slot.shape} {slot.dtype.name}, "
                        f"not {name} chunk {chunk} {shape} {dtype.name}: every worker must register "
                        "the same parameters in the same order"
                    )
                continue
            other = self.by_name.get((name, chunk))
            if other is not None and other != kid:
                raise RegistrationConflict(f"{name} chunk {chunk} is key id {other}, not {kid}")
            new.append(Slot(kid, name, chunk, offset, shape, dtype, group=group))
        if opt is not None and existing is None:
            self.optimizers[group] = opt
        elif existing is None and new:
            self.optimizers[group] = make_optimizer(None)
        for slot in new:
            self.slots[slot.key_id] = slot
            self.by_name[(slot.name, slot.chunk)] = slot.key_id
        return {
            "registered": len(new),
            "keys": len(self.slots),
            "initialized": sorted(k.key_id for k in self.slots.values() if k.initialized),
            "optimizer": self.optimizers[group].config() if group in self.optimizers else None,
        }

    def slot(self, key_id: int) -> Slot:
        try:
            return self.slots[key_id]
        except KeyError:
            raise UnknownKeyError(f"shard {self.index} holds no key id {key_id}") from None

    def check_tensor(self, slot: Slot, dtype_code: int, shape: tuple[int, ...]) -> None:
        """A pushed/initial tensor must match the registered shape and dtype exactly."""
        dt = wire.DTYPE_CODES.get(dtype_code)
        if dt != slot.dtype and dt != slot.dtype.newbyteorder("<"):
            err = ShapeMismatchError(
                f"{slot.label}: dtype {dt.name if dt is not None else dtype_code} differs from registered {slot.dtype.name}"
            )
            err.code = ErrorCode.DTYPE_MISMATCH
            raise err
        if shape != slot.shape and tuple(shape) != slot.shape:
            raise ShapeMismatchError(
                f"{slot.label}: shape {tuple(shape)} differs from registered {slot.shape}"
            )

    # values -------------------------------------------------------------------
    def init(self, slot: Slot, value: np.ndarray) -> bool:
        """First writer wins: True if ``value`` became the parameter."""
        if slot.initialized:
            return False
        slot.value = np.array(value, dtype=slot.dtype, copy=True).reshape(slot.shape)
        opt = self.optimizers.setdefault(slot.group, make_optimizer(None))
        slot.state = opt.init_state(slot.value)
        slot.digest = None
        self.dirty = True
        return True

    def _writable(self, slot: Slot) -> np.ndarray:
        """The parameter array, safe to modify in place (copy-on-write if in flight)."""
        assert slot.value is not None
        if slot.inflight and not _all_done(slot.inflight):
            old = slot.value
            if slot.spare is not None and _all_done(slot.spare_inflight):
                new = slot.spare
            else:
                new = np.empty_like(old)
            np.copyto(new, old)
            slot.spare, slot.spare_inflight = old, slot.inflight
            slot.value, slot.inflight = new, []
        else:
            slot.inflight = []
        slot.digest = None
        return slot.value

    def scratch_for(self, slot: Slot):
        """scratch(i): reusable work arrays shaped like ``slot`` (one set per shard)."""
        need = slot.nbytes
        while len(self._scratch) < SCRATCH_SLOTS:
            self._scratch.append(np.empty(0, dtype=np.uint8))

        def scratch(i: int) -> np.ndarray:
            buf = self._scratch[i]
            if buf.nbytes < need:
                buf = self._scratch[i] = np.empty(need, dtype=np.uint8)
            return buf[:need].view(slot.dtype).reshape(slot.shape)

        return scratch

    def apply(self, slot: Slot, grad: np.ndarray) -> None:
        """Apply one gradient with the slot's optimizer (async / bounded modes)."""
        param = self._writable(slot)
        self.optimizers[slot.group].update(param, grad, slot.state, self.scratch_for(slot))
        slot.version += 1
        self.updates += 1
        self.dirty = True

    def accumulate(self, slot: Slot, worker: int, grad: np.ndarray) -> None:
        """Sync mode: add ``worker``'s gradient to the open round of ``slot``."""
        if slot.acc is None:
            slot.acc = np.empty(slot.shape, dtype=slot.dtype)
        if not slot.contributors:
            np.copyto(slot.acc, grad)
        else:
            slot.acc += grad
        slot.contributors.add(worker)

    def finish_round(self, slot: Slot) -> int:
        """Sync mode: apply the mean of the round's gradients; returns how many there were."""
        n = len(slot.contributors)
        assert n and slot.acc is not None
        if n > 1:
            slot.acc /= n
        self.apply(slot, slot.acc)
        slot.contributors.clear()
        return n

    def payload(
        self, slot: Slot, alg: int = wire.MAC_HMAC_SHA256
    ) -> tuple[np.ndarray, bytes | None]:
        """The current value and its payload digest (cached per version: several
        workers pulling the same version cost one hash)."""
        assert slot.value is not None
        if alg in wire.ONE_TIME_KEY_MACS:  # keyed per message: nothing to cache
            return slot.value, None
        if slot.digest is None or slot.digest[:2] != (slot.version, alg):
            slot.digest = (
                slot.version,
                alg,
                wire.payload_digest(slot.value, parallel=False, alg=alg),
            )
        return slot.value, slot.digest[2]

    def set_lr(self, lr: float, group: str | None = None) -> list[str]:
        """Change the learning rate of one group (or all); returns the groups changed."""
        names = [group] if group is not None else list(self.optimizers)
        missing = [g for g in names if g not in self.optimizers]
        if missing:
            raise RemoteError(
                f"no optimizer group {missing[0]!r} on shard {self.index}",
                code=ErrorCode.BAD_REQUEST,
            )
        for g in names:
            self.optimizers[g].lr = lr
        self.dirty = True
        return names

    # introspection --------------------------------------------------------------
    @property
    def param_bytes(self) -> int:
        return sum(s.nbytes for s in self.slots.values())

    @property
    def optimizer_bytes(self) -> int:
        return sum(
            v.nbytes
            for s in self.slots.values()
            for v in s.state.values()
            if isinstance(v, np.ndarray)
        )

    @property
    def global_step(self) -> int:
        """Highest key version (updates applied to the most-updated key)."""
        return max((s.version for s in self.slots.values()), default=0)


def _same_config(a: Optimizer, b: Optimizer) -> bool:
    ca, cb = a.config(), b.config()
    ca.pop("lr", None)
    cb.pop("lr", None)
    return ca == cb
