"""Negotiation: before every data collective, each rank contributes one row to a small
Allgather; disagreeing rows become a TensorMismatchError on every rank, and joined ranks
answer with JOIN rows and neutral data (see engine.py's docstring).

``Negotiator`` owns only the row exchange; it moves no user data (the executor does, after
the rows agree). It is given the engine's timeline slot, nothing else of the engine.
"""

from __future__ import annotations

import time

import numpy as np

from . import errors
from .handles import _Ctx
from .ops import Average, Min, Product, Sum
from .rows import (
    _CODE_DTYPES,
    _KIND_NAMES,
    K_ALLGATHER,
    K_ALLGATHER_OBJ,
    K_ALLREDUCE,
    K_ALLTOALL,
    K_BCAST_OBJ,
    K_BROADCAST,
    K_JOIN,
    _mismatch_message,
    describe,
    signature,
)
from .timeline import TimelineSlot, now_us


def _neutral(dtype: np.dtype, n: int, op: int) -> np.ndarray:
    """What a joined rank contributes to a reduction: the identity of ``op``."""
    if op in (Sum, Average):
        return np.zeros(n, dtype)
    if op == Product:
        return np.ones(n, dtype)
    if dtype == np.bool_:
        return np.full(n, op == Min, dtype)
    v: float | int
    if op == Min:
        v = np.inf if dtype.kind == "f" else int(np.iinfo(dtype).max)
    else:
        v = -np.inf if dtype.kind == "f" else int(np.iinfo(dtype).min)
    return np.full(n, v, dtype)


class Negotiator:
    """The metadata exchange that precedes every collective, and a joined rank's answers."""

    __slots__ = ("_timeline",)

    def __init__(self, timeline: TimelineSlot) -> None:
        self._timeline = timeline

    def negotiate(
        self,
        ctx: _Ctx,
        kind: int,
        desc: tuple,
        dcode: int = 0,
        numel: int = 0,
        dim0: int = 0,
        root: int = -1,
        op: int = -1,
        local_error: str | None = None,
    ) -> np.ndarray:
        """Exchange one metadata row per rank; raise on every rank if they disagree.

        Returns the gathered table (size x 8, valid until the next collective on ``ctx``);
        rows of joined ranks have kind K_JOIN.
        """
        sig = signature(desc)
        row = ctx.row
        row[0] = kind
        row[1] = sig
        row[2] = dcode
        row[3] = op
        row[4] = root
        row[5] = numel
        row[6] = dim0
        row[7] = 1 if local_error else 0
        tl = self._timeline.current
        t0 = now_us() if tl is not None else 0.0
        table = ctx.ch.allgather_meta(row)
        if tl is not None:
            tl.complete(
                "NEGOTIATE_" + _KIND_NAMES[kind].upper(), "negotiate", t0, now_us(), ctx.tid
            )
        if ctx.ch.size == 1 and not local_error:
            return table
        rows = table.tolist()
        if all(r[0] == kind and r[1] == sig and not r[7] for r in rows):
            return table
        kinds = table[:, 0]
        sigs = table[:, 1]
        joined = kinds == K_JOIN
        active = ~joined
        if (
            (kinds[active] == kind).all()
            and (sigs[active] == sig).all()
            and not table[active, 7].any()
        ):
            return table
        # Disagreement (or a local error somewhere): everyone, joined ranks included, swaps descriptions.
        errors_flag = bool(table[:, 7].any())
        mine = f"error: {local_error}" if local_error else describe(desc)
        descs = ctx.ch.allgather_obj(mine)
        if errors_flag:
            bad = [f"  rank {r}: {d}" for r, d in enumerate(descs) if d and d.startswith("error: ")]
            raise errors.CollectiveArgumentError(
                f"shipyard.horovod: {_KIND_NAMES[kind]} refused on every rank because of an invalid argument:\n"
                + "\n".join(bad),
                descs,
            )
        raise errors.TensorMismatchError(_mismatch_message(_KIND_NAMES[kind], descs), descs)

    def serve_joined(self, ctx: _Ctx, joined_at_us: int) -> int:
        """A joined rank: answer every collective the active ranks run with neutral data,
        until every rank has joined. Returns the last rank to join (by the wall-clock time
        each rank called join(), carried in the JOIN rows; ties go to the higher rank)."""
        row = ctx.row
        size = ctx.ch.size
        while True:
            row[:] = 0
            row[0] = K_JOIN
            row[5] = joined_at_us
            ctx.inflight = ("join", None, time.monotonic())
            table = ctx.ch.allgather_meta(row).copy()
            ctx.inflight = None
            joined = table[:, 0] == K_JOIN
            if joined.all():
                times = table[:, 5].tolist()
                latest = max(times)
                return max(r for r, t in enumerate(times) if t == latest)
            act = table[~joined]
            kind = int(act[0, 0])
            consistent = (
                (act[:, 0] == kind).all() and (act[:, 1] == act[0, 1]).all() and not act[:, 7].any()
            )
            if not consistent:
                ctx.ch.allgather_obj(None)
                continue
            dtype = _CODE_DTYPES.get(int(act[0, 2]), np.dtype(np.uint8))
            op, root, numel = int(act[0, 3]), int(act[0, 4]), int(act[0, 5])
            if kind == K_ALLREDUCE:
                ctx.ch.allreduce_(_neutral(dtype, numel, op), op)
            elif kind == K_ALLGATHER:
                counts = table[:, 6] * numel
                recv = np.empty(int(counts.sum()), dtype)
                ctx.ch.allgather_rows(np.empty(0, dtype), counts, recv)
            elif kind == K_BROADCAST:
                if table[root, 0] != K_JOIN:
                    ctx.ch.bcast_(np.empty(numel, dtype), root)
            elif kind == K_ALLTOALL:
                rsplits = ctx.ch.alltoall_ints(np.zeros(size, np.int64))
                recv = np.empty(int(rsplits.sum()) * numel, dtype)
                ctx.ch.alltoallv(
                    np.empty(0, dtype), np.zeros(size, np.int64), recv, rsplits * numel
                )
            elif kind == K_BCAST_OBJ:
                if table[root, 0] != K_JOIN:
                    ctx.ch.bcast_obj(None, root)
            elif kind == K_ALLGATHER_OBJ:
                ctx.ch.allgather_obj(None)
