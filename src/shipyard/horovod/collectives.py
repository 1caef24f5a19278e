"""The data collectives: allreduce (fused, grouped, Adasum), allgather, broadcast,
alltoall, barrier and the object variants, each after its negotiation.

``Collectives`` is a mixin of ``Engine``; the engine's public methods (sync and async)
call these on a channel context.
"""

from __future__ import annotations

import math
import time

import numpy as np

from . import errors
from .adasum import adasum_combine
from .fusion import plan_batches
from .handles import _Ctx
from .ops import Adasum, Average, Min, Product, Sum, op_name

# Row kinds.
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
    _ar_extra,
    _dname,
    _dtype_error,
)
from .timeline import now_us


def _neutral(dtype: np.dtype, n: int, op: int) -> np.ndarray:
    if op in (Sum, Average):
        return np.zeros(n, dtype)
    if op == Product:
        return np.ones(n, dtype)
    if dtype == np.bool_:
        return np.full(n, op == Min, dtype)
    if op == Min:
        v = np.inf if dtype.kind == "f" else np.iinfo(dtype).max
    else:
        v = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
    return np.full(n, v, dtype)


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


class Collectives:
    # ------------------------------------------------------------------ op bodies (run on a ctx)
    def _reduce_flat(
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
                self._adasum_flat(ctx, flat, desc, [(0, flat.size)])
                return
            dcode = _DTYPE_CODES.get(flat.dtype, 0)
            err = None
            if not dcode:
                err = f"unsupported dtype {flat.dtype}"
            elif op == Average and flat.dtype == np.bool_:
                err = "op=Average is not defined for bool tensors; use Sum (logical or) or Min (logical and)"
            self._negotiate(ctx, K_ALLREDUCE, desc, dcode, flat.size, op=op, local_error=err)
            tl = self.timeline
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

    def _adasum_flat(self, ctx: _Ctx, flat: np.ndarray, desc: tuple, segments) -> None:
        err = (
            None
            if flat.dtype.kind == "f"
            else f"op=Adasum needs floating-point tensors, got {flat.dtype}"
        )
        table = self._negotiate(
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

    def _grouped_reduce(
        self,
        ctx: _Ctx,
        arrays: list[np.ndarray],
        names: list[str | None],
        op: int,
        prescale: float,
        postscale: float,
        inplace: bool,
    ) -> list[np.ndarray]:
        """Reduce many arrays with fusion. ``inplace``: results written into ``arrays`` (which
        must be C-contiguous); else new arrays are returned (views of fused result buffers)."""
        results: list[np.ndarray | None] = [None] * len(arrays)
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype, []).append(i)
        for dtype, idxs in by_dtype.items():
            batches = plan_batches([arrays[i].nbytes for i in idxs], self.fusion_threshold)
            for batch in batches:
                members = [idxs[j] for j in batch]
                bnames = (
                    tuple(names[i] for i in members)
                    if any(names[i] is not None for i in members)
                    else None
                )
                shapes = tuple(arrays[i].shape for i in members)
                desc = (
                    "allreduce",
                    bnames,
                    _dname(dtype),
                    shapes,
                    _ar_extra(op, prescale, postscale),
                )
                label = (bnames[0] if bnames else "grouped") + (
                    f" +{len(members) - 1}" if len(members) > 1 else ""
                )
                if len(members) == 1:
                    i = members[0]
                    a = arrays[i]
                    out = a if inplace else a.copy()
                    self._reduce_flat(ctx, out.reshape(-1), desc, op, prescale, postscale, label)
                    results[i] = out
                    continue
                total = sum(arrays[i].size for i in members)
                fused = ctx.fusion_buffer(dtype, total) if inplace else np.empty(total, dtype)
                tl = self.timeline
                t0 = now_us() if tl is not None else 0.0
                off = 0
                for i in members:
                    n = arrays[i].size
                    fused[off : off + n] = arrays[i].reshape(-1)
                    off += n
                if tl is not None:
                    tl.complete(
                        "MEMCPY_IN_FUSION_BUFFER",
                        "collective",
                        t0,
                        now_us(),
                        ctx.tid,
                        {"bytes": int(fused.nbytes)},
                    )
                if op == Adasum:
                    segs, off = [], 0
                    for i in members:
                        segs.append((off, off + arrays[i].size))
                        off += arrays[i].size
                    ctx.inflight = ("allreduce", label, time.monotonic())
                    try:
                        self._adasum_flat(ctx, fused, desc, segs)
                    finally:
                        ctx.inflight = None
                else:
                    self._reduce_flat(
                        ctx, fused, desc, op, prescale, postscale, label, {"tensors": len(members)}
                    )
                t0 = now_us() if tl is not None else 0.0
                off = 0
                for i in members:
                    a = arrays[i]
                    n = a.size
                    if inplace:
                        a.reshape(-1)[...] = fused[off : off + n]
                        results[i] = a
                    else:
                        results[i] = fused[off : off + n].reshape(a.shape)
                    off += n
                if tl is not None:
                    tl.complete(
                        "MEMCPY_OUT_FUSION_BUFFER",
                        "collective",
                        t0,
                        now_us(),
                        ctx.tid,
                        {"bytes": int(fused.nbytes)},
                    )
        return results  # type: ignore[return-value]

    def _allgather(self, ctx: _Ctx, arr: np.ndarray, name: str | None) -> np.ndarray:
        if arr.ndim == 0:
            arr = arr.reshape(1)
        arr = np.asarray(arr, order="C")
        rest = arr.shape[1:]
        row_numel = int(math.prod(rest))
        desc = ("allgather", name, _dname(arr.dtype), rest, ())
        ctx.inflight = ("allgather", name, time.monotonic())
        try:
            table = self._negotiate(
                ctx,
                K_ALLGATHER,
                desc,
                _DTYPE_CODES.get(arr.dtype, 0),
                row_numel,
                dim0=arr.shape[0],
                local_error=_dtype_error(arr.dtype),
            )
            dims = table[:, 6].copy()
            tl = self.timeline
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

    def _broadcast_(self, ctx: _Ctx, arr: np.ndarray, root: int, name: str | None) -> np.ndarray:
        """In place on a C-contiguous array."""
        if not 0 <= root < ctx.ch.size:
            raise ValueError(f"root_rank {root} is out of range for {ctx.ch.size} ranks")
        desc = ("broadcast", name, _dname(arr.dtype), arr.shape, (("root", root),))
        ctx.inflight = ("broadcast", name, time.monotonic())
        try:
            table = self._negotiate(
                ctx,
                K_BROADCAST,
                desc,
                _DTYPE_CODES.get(arr.dtype, 0),
                arr.size,
                root=root,
                local_error=_dtype_error(arr.dtype),
            )
            if table[root, 0] == K_JOIN:
                raise errors.JoinedRankError(
                    f"shipyard.horovod: broadcast root rank {root} has already joined"
                )
            tl = self.timeline
            t0 = now_us() if tl is not None else 0.0
            ctx.ch.bcast_(arr.reshape(-1), root)
            if tl is not None:
                tl.complete(
                    "BROADCAST",
                    "collective",
                    t0,
                    now_us(),
                    ctx.tid,
                    {
                        "tensor": name or "",
                        "bytes": int(arr.nbytes),
                        "dtype": str(arr.dtype),
                        "root": root,
                    },
                )
            return arr
        finally:
            ctx.inflight = None

    def _grouped_broadcast_(
        self, ctx: _Ctx, arrays: list[np.ndarray], root: int, names: list[str | None]
    ) -> None:
        """Broadcast many C-contiguous arrays in place, fused per dtype (one Bcast per buffer)."""
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype, []).append(i)
        for dtype, idxs in by_dtype.items():
            for batch in plan_batches([arrays[i].nbytes for i in idxs], self.fusion_threshold):
                members = [idxs[j] for j in batch]
                if len(members) == 1:
                    a = arrays[members[0]]
                    self._broadcast_(ctx, a, root, names[members[0]])
                    continue
                bnames = (
                    tuple(names[i] for i in members)
                    if any(names[i] is not None for i in members)
                    else None
                )
                total = sum(arrays[i].size for i in members)
                fused = ctx.fusion_buffer(dtype, total)
                off = 0
                for i in members:
                    n = arrays[i].size
                    fused[off : off + n] = arrays[i].reshape(-1)
                    off += n
                if not 0 <= root < ctx.ch.size:
                    raise ValueError(f"root_rank {root} is out of range for {ctx.ch.size} ranks")
                desc = (
                    "broadcast",
                    bnames,
                    _dname(dtype),
                    tuple(arrays[i].shape for i in members),
                    (("root", root),),
                )
                ctx.inflight = ("grouped broadcast", None, time.monotonic())
                try:
                    table = self._negotiate(
                        ctx,
                        K_BROADCAST,
                        desc,
                        _DTYPE_CODES.get(dtype, 0),
                        total,
                        root=root,
                        local_error=_dtype_error(dtype),
                    )
                    if table[root, 0] == K_JOIN:
                        raise errors.JoinedRankError(
                            f"shipyard.horovod: broadcast root rank {root} has already joined"
                        )
                    tl = self.timeline
                    t0 = now_us() if tl is not None else 0.0
                    ctx.ch.bcast_(fused, root)
                    if tl is not None:
                        tl.complete(
                            "BROADCAST",
                            "collective",
                            t0,
                            now_us(),
                            ctx.tid,
                            {
                                "tensor": (bnames[0] if bnames else "grouped"),
                                "tensors": len(members),
                                "bytes": int(fused.nbytes),
                                "dtype": str(dtype),
                                "root": root,
                            },
                        )
                finally:
                    ctx.inflight = None
                off = 0
                for i in members:
                    n = arrays[i].size
                    arrays[i].reshape(-1)[...] = fused[off : off + n]
                    off += n

    def _alltoall(
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
        row_numel = int(math.prod(rest))
        desc = ("alltoall", name, _dname(arr.dtype), rest, ())
        ctx.inflight = ("alltoall", name, time.monotonic())
        try:
            self._negotiate(
                ctx,
                K_ALLTOALL,
                desc,
                _DTYPE_CODES.get(arr.dtype, 0),
                row_numel,
                dim0=dim0,
                local_error=err or _dtype_error(arr.dtype),
            )
            tl = self.timeline
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

    def _barrier(self, ctx: _Ctx) -> None:
        ctx.inflight = ("barrier", None, time.monotonic())
        try:
            self._negotiate(ctx, K_BARRIER, ("barrier", None, None, None, ()))
        finally:
            ctx.inflight = None

    def _broadcast_object(self, ctx: _Ctx, obj, root: int, name: str | None):
        if not 0 <= root < ctx.ch.size:
            raise ValueError(f"root_rank {root} is out of range for {ctx.ch.size} ranks")
        ctx.inflight = ("broadcast_object", name, time.monotonic())
        try:
            table = self._negotiate(
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

    def _allgather_object(self, ctx: _Ctx, obj, name: str | None) -> list:
        ctx.inflight = ("allgather_object", name, time.monotonic())
        try:
            self._negotiate(ctx, K_ALLGATHER_OBJ, ("allgather_object", name, None, None, ()))
            return ctx.ch.allgather_obj(obj)
        finally:
            ctx.inflight = None
