"""Tensor fusion: which tensors travel together in one collective.

Horovod packs small tensors into a fusion buffer of at most ``HOROVOD_FUSION_THRESHOLD``
bytes (default 64 MiB) and reduces the buffer with one call: one latency instead of many.
Planning is a pure function of the tensors' byte sizes, so every rank computes the same
plan from the same inputs. ``Fuser`` carries the plan out: it packs each batch into a
fusion buffer, hands the buffer to the executor as one collective, and unpacks the result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

import numpy as np

from .execution import Executor
from .handles import _Ctx
from .ops import Adasum
from .rows import _ar_extra, _dname
from .timeline import TimelineSlot, now_us

DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024
# DDP's idea: the first bucket of the torch optimizer is small so communication starts
# while backward is still running.
FIRST_BUCKET_BYTES = 1024 * 1024


def fusion_threshold(env: Mapping[str, str] | None = None) -> int:
    """``HOROVOD_FUSION_THRESHOLD`` in bytes (0 disables fusion)."""
    env = os.environ if env is None else env
    raw = env.get("HOROVOD_FUSION_THRESHOLD")
    if raw is None or raw.strip() == "":
        return DEFAULT_FUSION_THRESHOLD
    try:
        value = int(float(raw))
    except ValueError as e:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD must be a number of bytes, got {raw!r}") from e
    if value < 0:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD must be >= 0, got {value}")
    return value


def plan_batches(
    nbytes: Sequence[int], threshold: int, first_cap: int | None = None
) -> list[list[int]]:
    """Split tensors (in order) into consecutive batches of at most ``threshold`` bytes.

    A tensor larger than the threshold gets a batch of its own (it is reduced in place,
    without a copy into a fusion buffer). ``threshold == 0`` means no fusion: one tensor per
    batch. ``first_cap`` caps the first batch only (used by the torch optimizer).
    """
    batches: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    cap = threshold if first_cap is None else min(first_cap, threshold)
    for i, n in enumerate(nbytes):
        if threshold <= 0:
            batches.append([i])
            continue
        if current and current_bytes + n > cap:
            batches.append(current)
            current, current_bytes = [], 0
            cap = threshold
        current.append(i)
        current_bytes += n
    if current:
        batches.append(current)
    return batches


def _label(names: tuple[str | None, ...] | None, k: int) -> str:
    """The timeline's name for a fused batch: its first tensor's name and how many follow."""
    first = names[0] if names else None
    return (first or "grouped") + (f" +{k - 1}" if k > 1 else "")


class Fuser:
    """Grouped ops through fusion buffers: same-dtype tensors packed up to ``threshold``
    bytes, one negotiation and one collective per buffer (run by the executor)."""

    __slots__ = ("_executor", "_timeline", "threshold")

    def __init__(self, executor: Executor, threshold: int, timeline: TimelineSlot) -> None:
        self._executor = executor
        self.threshold = threshold
        self._timeline = timeline

    def grouped_reduce(
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
        results: list[np.ndarray] = list(arrays)
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype, []).append(i)
        for dtype, idxs in by_dtype.items():
            batches = plan_batches([arrays[i].nbytes for i in idxs], self.threshold)
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
                label = _label(bnames, len(members))
                if len(members) == 1:
                    i = members[0]
                    a = arrays[i]
                    out = a if inplace else a.copy()
                    self._executor.reduce_flat(
                        ctx, out.reshape(-1), desc, op, prescale, postscale, label
                    )
                    results[i] = out
                    continue
                total = sum(arrays[i].size for i in members)
                fused = ctx.fusion_buffer(dtype, total) if inplace else np.empty(total, dtype)
                tl = self._timeline.current
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
                        self._executor.adasum_flat(ctx, fused, desc, segs)
                    finally:
                        ctx.inflight = None
                else:
                    self._executor.reduce_flat(
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
        return results

    def grouped_broadcast_(
        self, ctx: _Ctx, arrays: list[np.ndarray], root: int, names: list[str | None]
    ) -> None:
        """Broadcast many C-contiguous arrays in place, fused per dtype (one Bcast per buffer)."""
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype, []).append(i)
        for dtype, idxs in by_dtype.items():
            for batch in plan_batches([arrays[i].nbytes for i in idxs], self.threshold):
                members = [idxs[j] for j in batch]
                if len(members) == 1:
                    a = arrays[members[0]]
                    self._executor.broadcast_(ctx, a, root, names[members[0]])
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
                self._executor.broadcast_flat(
                    ctx,
                    fused,
                    root,
                    desc,
                    ("grouped broadcast", None),
                    _label(bnames, 1),
                    {"tensors": len(members)},
                )
                off = 0
                for i in members:
                    n = arrays[i].size
                    arrays[i].reshape(-1)[...] = fused[off : off + n]
                    off += n
