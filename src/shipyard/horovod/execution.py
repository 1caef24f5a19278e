"""Execution: one collective on one channel context, after its negotiation. Allreduce
(plain, pre/post-scaled, Adasum), allgather, broadcast, alltoall, barrier and the object
variants.

``Executor`` is composed by the engine with the negotiator and the timeline slot it is
given; it knows nothing of fusion (the fuser packs buffers and hands them here) nor of
threads (the engine's runner picks the context).
"""

from __future__ import annotations

import functools
import operator
import time
from typing import Any

import numpy as np

from . import errors
from .adasum import adasum_combine
from .handles import _Ctx
from .negotiation import Negotiator
from .ops import Adasum, Average, op_name
from .rows import (
    _DTYPE_CODES,
    K_ADASUM,
    K_ALLGATHER,
    K_ALLGATHER_OBJ,
    K_ALLREDUCE,
    K_ALLTOALL,
    K_BARRIER,
    K_BCAST_OBJ,
    K_BROADCAST,
    K_JOIN,
    _dname,
    _dtype_error,
)
from .timeline import TimelineSlot, now_us


def _prod(dims: tuple[int, ...]) -> int:
    """``math.prod`` of a shape (1 for ``()``): math.prod is Python 3.8+, and this module
    runs in framework environments down to Python 3.7."""
    return functools.reduce(operator.mul, dims, 1)


def _scale_(flat: np.ndarray, factor: float) -> None:
    if flat.dtype.kind in "fc":
        np.multiply(flat, flat.dtype.type(factor), out=flat)
    else:
        np.multiply(flat, factor, out=flat, casting="unsafe")


def _divide_(flat: np.ndarray, n: int) -> None:
    if flat.dtype.kind in "fc":
        np.divide(flat, n, out=flat)
    elif flat.dtype.kind == "b":
        raise TypeError(
            "op=Average is not defined for bool tensors; use Sum (logical or) or Min (logical and)"
        )
    else:
        # Horovod averages integer tensors with floor division.
        np.floor_divide(flat, n, out=flat)


class Executor:
    """Runs one collective on one channel context: negotiate, then move the data (and
    record it in the timeline). Every method takes the ``_Ctx`` it runs on, so the same
    executor serves the caller's channel and the communication thread's."""

    __slots__ = ("_negotiator", "_timeline")

    def __init__(self, negotiator: Negotiator, timeline: TimelineSlot) -> None:
        self._negotiator = negotiator
        self._timeline = timeline

    def reduce_flat(
        self,
        ctx: _Ctx,
        flat: np.ndarray,
        desc: tuple,
        op: int,
        prescale: float,
        postscale: float,
        tl_name: str,
        tl_args: dict | None = None,
        src: np.ndarray | None = None,
    ) -> None:
        """Allreduce one contiguous 1-D buffer in place (after negotiation). With ``src``
        (same size and dtype, and no prescale), reduce ``src`` into ``flat`` out of place."""
        ctx.inflight = ("allreduce", tl_name, time.monotonic())
        try:
            if op == Adasum:
                self.adasum_flat(ctx, flat, desc, [(0, flat.size)])
                return
            dcode = _DTYPE_CODES.get(flat.dtype, 0)
            err = None
            if not dcode:
                err = f"unsupported dtype {flat.dtype}"
            elif op == Average and flat.dtype == np.bool_:
                err = "op=Average is not defined for bool tensors; use Sum (logical or) or Min (logical and)"
            self._negotiator.negotiate(
                ctx, K_ALLREDUCE, desc, dcode, flat.size, op=op, local_error=err
            )
            tl = self._timeline.current
            t0 = now_us() if tl is not None else 0.0
            if src is not None and prescale == 1.0:
                ctx.ch.allreduce_into(src, flat, op)
            else:
                if src is not None:
                    flat[...] = src
                if prescale != 1.0:
                    _scale_(flat, prescale)
                ctx.ch.allreduce_(flat, op)
            if op == Average and ctx.ch.size > 1:
                _divide_(flat, ctx.ch.size)
            if postscale != 1.0:
                _scale_(flat, postscale)
            if tl is not None:
                args = {
                    "tensor": tl_name,
                    "bytes": int(flat.nbytes),
                    "dtype": str(flat.dtype),
                    "op": op_name(op),
                }
                if tl_args:
                    args.update(tl_args)
                tl.complete("ALLREDUCE", "collective", t0, now_us(), ctx.tid, args)
        finally:
            ctx.inflight = None

    def adasum_flat(self, ctx: _Ctx, flat: np.ndarray, desc: tuple, segments) -> None:
        err = (
            None
            if flat.dtype.kind == "f"
            else f"op=Adasum needs floating-point tensors, got {flat.dtype}"
        )
        table = self._negotiator.negotiate(
            ctx,
            K_ADASUM,
            desc,
            _DTYPE_CODES.get(flat.dtype, 0),
            flat.size,
            op=Adasum,
            local_error=err,
        )
        if (table[:, 0] == K_JOIN).any():
            raise errors.JoinedRankError(
                "shipyard.horovod: Adasum cannot run while some rank has joined"
            )
        gathered = np.empty((ctx.ch.size, flat.size), flat.dtype)
        ctx.ch.allgather_buf(flat, gathered)
        flat[...] = adasum_combine(list(gathered), segments).astype(flat.dtype, copy=False)

    def allgather(self, ctx: _Ctx, arr: np.ndarray, name: str | None) -> np.ndarray:
        if arr.ndim == 0:
            arr = arr.reshape(1)
        arr = np.asarray(arr, order="C")
        rest = arr.shape[1:]
        row_numel = _prod(rest)
        desc = ("allgather", name, _dname(arr.dtype), rest, ())
        ctx.inflight = ("allgather", name, time.monotonic())
        try:
            table = self._negotiator.negotiate(
                ctx,
                K_ALLGATHER,
                desc,
                _DTYPE_CODES.get(arr.dtype, 0),
                row_numel,
                dim0=arr.shape[0],
                local_error=_dtype_error(arr.dtype),
            )
            dims = table[:, 6].copy()
            tl = self._timeline.current
            t0 = now_us() if tl is not None else 0.0
            out = np.empty((int(dims.sum()),) + rest, arr.dtype)
            ctx.ch.allgather_rows(arr.reshape(-1), dims * row_numel, out.reshape(-1))
            if tl is not None:
                tl.complete(
                    "ALLGATHER",
                    "collective",
                    t0,
                    now_us(),
                    ctx.tid,
                    {
                        "tensor": name or "",
                        "bytes": int(out.nbytes),
                        "dtype": str(arr.dtype),
                        "rows": dims.tolist(),
                    },
                )
            return out
        finally:
            ctx.inflight = None

    def broadcast_(self, ctx: _Ctx, arr: np.ndarray, root: int, name: str | None) -> np.ndarray:
        """In place on a C-contiguous array."""
        if not 0 <= root < ctx.ch.size:
            raise ValueError(f"root_rank {root} is out of range for {ctx.ch.size} ranks")
        desc = ("broadcast", name, _dname(arr.dtype), arr.shape, (("root", root),))
        self.broadcast_flat(ctx, arr.reshape(-1), root, desc, ("broadcast", name), name or "")
        return arr

    def broadcast_flat(
        self,
        ctx: _Ctx,
        flat: np.ndarray,
        root: int,
        desc: tuple,
        inflight: tuple[str, str | None],
        tl_name: str,
        tl_args: dict[str, Any] | None = None,
    ) -> None:
        """Broadcast one contiguous 1-D buffer in place (after negotiation); ``root`` is
        already checked. ``inflight`` is what the watchdog names while it waits."""
        ctx.inflight = (inflight[0], inflight[1], time.monotonic())
        try:
            table = self._negotiator.negotiate(
                ctx,
                K_BROADCAST,
                desc,
                _DTYPE_CODES.get(flat.dtype, 0),
                flat.size,
                root=root,
                local_error=_dtype_error(flat.dtype),
            )
            if table[root, 0] == K_JOIN:
                raise errors.JoinedRankError(
                    f"shipyard.horovod: broadcast root rank {root} has already joined"
                )
            tl = self._timeline.current
            t0 = now_us() if tl is not None else 0.0
            ctx.ch.bcast_(flat, root)
            if tl is not None:
                args: dict[str, Any] = {"tensor": tl_name}
                if tl_args:
                    args.update(tl_args)
                args.update(bytes=int(flat.nbytes), dtype=str(flat.dtype), root=root)
                tl.complete("BROADCAST", "collective", t0, now_us(), ctx.tid, args)
        finally:
            ctx.inflight = None

    def alltoall(
        self, ctx: _Ctx, arr: np.ndarray, splits, name: str | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if arr.ndim == 0:
            arr = arr.reshape(1)
        arr = np.asarray(arr, order="C")
        size = ctx.ch.size
        dim0 = arr.shape[0]
        err = None
        if splits is None:
            if dim0 % size:
                err = f"first dimension {dim0} is not divisible by {size} ranks; pass splits="
                send_splits = np.zeros(size, np.int64)
            else:
                send_splits = np.full(size, dim0 // size, np.int64)
        else:
            send_splits = np.asarray(splits, dtype=np.int64).reshape(-1)
            if (
                send_splits.size != size
                or (send_splits < 0).any()
                or int(send_splits.sum()) != dim0
            ):
                err = f"splits {send_splits.tolist()} must have {size} non-negative entries summing to {dim0}"
                send_splits = np.zeros(size, np.int64)
        rest = arr.shape[1:]
        row_numel = _prod(rest)
        desc = ("alltoall", name, _dname(arr.dtype), rest, ())
        ctx.inflight = ("alltoall", name, time.monotonic())
        try:
            self._negotiator.negotiate(
                ctx,
                K_ALLTOALL,
                desc,
                _DTYPE_CODES.get(arr.dtype, 0),
                row_numel,
                dim0=dim0,
                local_error=err or _dtype_error(arr.dtype),
            )
            tl = self._timeline.current
            t0 = now_us() if tl is not None else 0.0
            recv_splits = ctx.ch.alltoall_ints(send_splits)
            out = np.empty((int(recv_splits.sum()),) + rest, arr.dtype)
            ctx.ch.alltoallv(
                arr.reshape(-1), send_splits * row_numel, out.reshape(-1), recv_splits * row_numel
            )
            if tl is not None:
                tl.complete(
                    "ALLTOALL",
                    "collective",
                    t0,
                    now_us(),
                    ctx.tid,
                    {"tensor": name or "", "bytes": int(arr.nbytes), "dtype": str(arr.dtype)},
                )
            return out, recv_splits
        finally:
            ctx.inflight = None

    def barrier(self, ctx: _Ctx) -> None:
        ctx.inflight = ("barrier", None, time.monotonic())
        try:
            self._negotiator.negotiate(ctx, K_BARRIER, ("barrier", None, None, None, ()))
        finally:
            ctx.inflight = None

    def broadcast_object(self, ctx: _Ctx, obj, root: int, name: str | None):
        if not 0 <= root < ctx.ch.size:
            raise ValueError(f"root_rank {root} is out of range for {ctx.ch.size} ranks")
        ctx.inflight = ("broadcast_object", name, time.monotonic())
        try:
            table = self._negotiator.negotiate(
                ctx,
                K_BCAST_OBJ,
                ("broadcast_object", name, None, None, (("root", root),)),
                root=root,
            )
            if table[root, 0] == K_JOIN:
                raise errors.JoinedRankError(
                    f"shipyard.horovod: broadcast_object root rank {root} has already joined"
                )
            return ctx.ch.bcast_obj(obj if ctx.ch.rank == root else None, root)
        finally:
            ctx.inflight = None

    def allgather_object(self, ctx: _Ctx, obj, name: str | None) -> list:
        ctx.inflight = ("allgather_object", name, time.monotonic())
        try:
            self._negotiator.negotiate(
                ctx, K_ALLGATHER_OBJ, ("allgather_object", name, None, None, ())
            )
            return ctx.ch.allgather_obj(obj)
        finally:
            ctx.inflight = None
