"""Collectives on torch tensors (Horovod's ``horovod.torch.mpi_ops``).

CPU tensors are handed to the engine as numpy views of their own memory (no copy for
contiguous tensors; in-place variants really are in place). bfloat16 travels as float32.
CUDA tensors go through ``_nccl`` (torch.distributed/NCCL; untested here, no GPU).
``allreduce``, ``allgather`` and ``broadcast`` are differentiable, as in Horovod.
Async variants return an integer handle for ``synchronize``/``poll``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import numpy as np
import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .. import engine as _engine
from ..fusion import plan_batches
from ..ops import (
    Adasum,
    Average,
    check_process_set,
    global_process_set,
    resolve_op,
)
from . import _nccl
from .compression import Compression


def _np_view(t: torch.Tensor):
    """(numpy array sharing t's memory or a staging copy, writeback or None)."""
    if t.dtype == torch.bfloat16:
        staged = t.detach().float().contiguous()
        return staged.numpy(), (lambda: t.copy_(staged))
    d = t.detach()
    if d.is_contiguous():
        return d.numpy(), None
    staged = d.contiguous()
    return staged.numpy(), (lambda: t.copy_(staged))


def _contiguous_clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone(memory_format=torch.contiguous_format)


# ---------------------------------------------------------------- handles
_handles: dict[int, tuple] = {}
_handle_ids = itertools.count(1)
_handles_lock = threading.Lock()


def _register(engine_handle, finish) -> int:
    with _handles_lock:
        hid = next(_handle_ids)
        _handles[hid] = (engine_handle, finish)
    return hid


def poll(handle: int) -> bool:
    """True when the async op is done (``synchronize`` will not block)."""
    h, _ = _handles[handle]
    return h is None or h.done()


def synchronize(handle: int):
    """Wait for an async op and return its output tensor."""
    with _handles_lock:
        h, finish = _handles.pop(handle)
    result = h.wait() if h is not None else None
    return finish(result)


# ---------------------------------------------------------------- allreduce
def _allreduce_impl(tensor, name, op, prescale, postscale, compression, inplace):
    compressed, cctx = compression.compress(tensor)
    if compressed.is_cuda:
        out = (
            compressed
            if (inplace and compressed is tensor and tensor.is_contiguous())
            else _contiguous_clone(compressed)
        )
        _nccl.allreduce_(out, name, op, prescale, postscale)
    elif not inplace and compressed.dtype != torch.bfloat16 and op != Adasum:
        # out of place: MPI reduces the input straight into a fresh output (no extra copy)
        src = compressed.detach().contiguous()
        out = torch.empty_like(src, memory_format=torch.contiguous_format)
        _engine.get().allreduce_into(src.numpy(), out.numpy(), name, op, prescale, postscale)
    else:
        out = compressed if (inplace and compressed is tensor) else _contiguous_clone(compressed)
        arr, writeback = _np_view(out)
        _engine.get().allreduce_(arr, name, op, prescale, postscale)
        if writeback:
            writeback()
    return _deliver(tensor, out, compression, cctx, inplace)


def _deliver(tensor, out, compression, cctx, inplace):
    """The reduced ``out`` as the caller asked for it: decompressed, and written back into
    ``tensor`` for the in-place variants."""
    result = compression.decompress(out, cctx)
    if inplace and result is not tensor:
        tensor.copy_(result)
        return tensor
    return result


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, compression):
        ctx.args = (op, prescale, postscale, compression)
        return _allreduce_impl(tensor, name, op, prescale, postscale, compression, inplace=False)

    @staticmethod
    def backward(ctx, grad_output):
        op, prescale, postscale, compression = ctx.args
        grad = _allreduce_impl(
            grad_output, None, op, prescale, postscale, compression, inplace=False
        )
        return grad, None, None, None, None, None


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Reduce ``tensor`` over all ranks and return the result (a new tensor)."""
    check_process_set(process_set)
    op = resolve_op(op, average)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor, compression)
    return _allreduce_impl(
        tensor, name, op, prescale_factor, postscale_factor, compression, inplace=False
    )


def allreduce_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """In-place allreduce; returns ``tensor``."""
    check_process_set(process_set)
    op = resolve_op(op, average)
    with torch.no_grad():
        return _allreduce_impl(
            tensor, name, op, prescale_factor, postscale_factor, Compression.none, inplace=True
        )


def _async_allreduce(tensor, name, op, prescale, postscale, compression, inplace):
    if tensor.is_cuda:  # NCCL path is synchronous; the handle is already complete
        result = _allreduce_impl(tensor, name, op, prescale, postscale, compression, inplace)
        return _register(None, lambda _: result)
    compressed, cctx = compression.compress(tensor)
    direct = (
        inplace
        and compressed is tensor
        and tensor.is_contiguous()
        and tensor.dtype != torch.bfloat16
    )
    out = tensor if direct else _contiguous_clone(compressed)
    arr, writeback = _np_view(out)
    h = _engine.get().allreduce_async(arr, name, op, prescale, postscale, inplace=True)

    def finish(_):
        if writeback:
            writeback()
        return _deliver(tensor, out, compression, cctx, inplace)

    return _register(h, finish)


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    compression=Compression.none,
    process_set=global_process_set,
) -> int:
    check_process_set(process_set)
    return _async_allreduce(
        tensor, name, resolve_op(op, average), prescale_factor, postscale_factor, compression, False
    )


def allreduce_async_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> int:
    check_process_set(process_set)
    return _async_allreduce(
        tensor,
        name,
        resolve_op(op, average),
        prescale_factor,
        postscale_factor,
        Compression.none,
        True,
    )


# ---------------------------------------------------------------- grouped allreduce
def _grouped_batches(tensors, compression, name):
    """Compress, group by dtype (order kept) and cut into fusion batches. Yields
    (member indices, packed flat tensor, shapes, names, compression contexts). Packing is
    torch's C++ flatten (one copy, no per-tensor Python views): with 100 small tensors the
    Python-level reshape + cat cost as much as the copy itself."""
    eng = _engine.get()
    if compression is Compression.none:
        comp = [(t, None) for t in tensors]
    else:
        comp = [compression.compress(t) for t in tensors]
    by_dtype: dict = {}
    for i, (c, _) in enumerate(comp):
        by_dtype.setdefault(c.dtype, []).append(i)
    for idxs in by_dtype.values():
        sizes = [comp[i][0].numel() * comp[i][0].element_size() for i in idxs]
        for batch in plan_batches(sizes, eng.fusion_threshold):
            members = [idxs[j] for j in batch]
            parts = [comp[i][0] for i in members]
            with torch.no_grad():  # a fresh tensor: the inputs are untouched (one part
                # alone comes back as a view of itself, hence the clone)
                flat = (
                    _flatten_dense_tensors(parts)
                    if len(parts) > 1
                    else parts[0].reshape(-1).clone(memory_format=torch.contiguous_format)
                )
            names = None if name is None else [f"{name}.{i}" for i in members]
            yield members, flat, parts, names, [comp[i][1] for i in members]


def _unpack(flat, parts, ctxs, compression):
    """Views of ``flat`` shaped like ``parts`` (C++ unflatten), decompressed."""
    outs = _unflatten_dense_tensors(flat, parts)
    if compression is Compression.none:
        return list(outs)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def _reduce_packed(flat, shapes, names, op, prescale, postscale, async_=False):
    eng = _engine.get()
    work = flat.float() if flat.dtype == torch.bfloat16 else flat
    if async_:
        return eng.allreduce_fused_async(work.numpy(), shapes, names, op, prescale, postscale), work
    eng.allreduce_fused_(work.numpy(), shapes, names, op, prescale, postscale)
    if work is not flat:
        flat.copy_(work)
    return None, work


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Reduce a list of tensors with tensor fusion (one collective per fusion buffer of
    ``HOROVOD_FUSION_THRESHOLD`` bytes and dtype); returns new tensors."""
    check_process_set(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    if any(t.is_cuda for t in tensors):
        return [
            allreduce(
                t,
                name=None if name is None else f"{name}.{i}",
                compression=compression,
                op=op,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor,
            )
            for i, t in enumerate(tensors)
        ]
    results = [None] * len(tensors)
    for members, flat, parts, names, ctxs in _grouped_batches(tensors, compression, name):
        _reduce_packed(
            flat, [tuple(p.shape) for p in parts], names, op, prescale_factor, postscale_factor
        )
        for i, out in zip(members, _unpack(flat, parts, ctxs, compression)):
            results[i] = out
    return results


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    check_process_set(process_set)
    tensors = list(tensors)
    results = grouped_allreduce(
        tensors,
        name=name,
        op=resolve_op(op, average),
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )
    with torch.no_grad():
        for t, r in zip(tensors, results):
            t.copy_(r)
    return tensors


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    compression=Compression.none,
    process_set=global_process_set,
) -> int:
    check_process_set(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    if any(t.is_cuda for t in tensors):
        result = grouped_allreduce(
            tensors,
            name=name,
            compression=compression,
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
        )
        return _register(None, lambda _: result)
    pending = []
    for members, flat, parts, names, ctxs in _grouped_batches(tensors, compression, name):
        h, work = _reduce_packed(
            flat,
            [tuple(p.shape) for p in parts],
            names,
            op,
            prescale_factor,
            postscale_factor,
            async_=True,
        )
        pending.append((h, members, flat, work, parts, ctxs))

    def finish(_):
        results = [None] * len(tensors)
        error = None
        for h, members, flat, work, parts, ctxs in pending:
            try:
                h.wait()
            except BaseException as e:  # noqa: BLE001 - wait for all batches, then raise the first error
                error = error or e
                continue
            if work is not flat:
                flat.copy_(work)
            for i, out in zip(members, _unpack(flat, parts, ctxs, compression)):
                results[i] = out
        if error is not None:
            raise error
        return results

    return _register(_AllDone(pending), finish)


class _AllDone:
    """Handle over several engine handles."""

    def __init__(self, pending):
        self._handles = [p[0] for p in pending]

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def wait(self, timeout=None):
        return None


def grouped_allreduce_async_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> int:
    tensors = list(tensors)
    hid = grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor)
    h, finish = _handles[hid]

    def finish_inplace(outs):
        results = finish(outs)
        with torch.no_grad():
            for t, r in zip(tensors, results):
                t.copy_(r)
        return tensors

    with _handles_lock:
        _handles[hid] = (h, finish_inplace)
    return hid


# ---------------------------------------------------------------- allgather
def _allgather_impl(tensor, name):
    if tensor.is_cuda:
        return _nccl.allgather(tensor, name)
    src = tensor.detach()
    arr = src.float().numpy() if src.dtype == torch.bfloat16 else src.numpy()
    return torch.from_numpy(_engine.get().allgather(arr, name)).to(tensor.dtype)


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.dim0 = tensor.shape[0] if tensor.dim() else 1
        return _allgather_impl(tensor, name)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _allreduce_impl(
            grad_output, None, Average, 1.0, 1.0, Compression.none, inplace=False
        )
        eng = _engine.get()
        dims = eng.allgather(np.array([ctx.dim0], np.int64))
        offset = int(dims[: eng.rank].sum())
        return grad.narrow(0, offset, ctx.dim0), None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate every rank's tensor along dim 0 (first dimensions may differ)."""
    check_process_set(process_set)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFn.apply(tensor, name)
    return _allgather_impl(tensor, name)


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    check_process_set(process_set)
    if tensor.is_cuda:
        result = _allgather_impl(tensor, name)
        return _register(None, lambda _: result)
    src = tensor.detach()
    arr = src.float().numpy() if src.dtype == torch.bfloat16 else src.numpy()
    h = _engine.get().allgather_async(arr, name)
    return _register(h, lambda out: torch.from_numpy(out).to(tensor.dtype))


# ---------------------------------------------------------------- broadcast
def _broadcast_impl(tensor, root_rank, name, inplace):
    out = tensor if inplace else _contiguous_clone(tensor)
    if out.is_cuda:
        if not out.is_contiguous():
            tmp = out.contiguous()
            _nccl.broadcast_(tmp, root_rank, name)
            out.copy_(tmp)
        else:
            _nccl.broadcast_(out, root_rank, name)
        return out
    arr, writeback = _np_view(out)
    _engine.get().broadcast_(arr, root_rank, name)
    if writeback:
        writeback()
    return out


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return _broadcast_impl(tensor, root_rank, name, inplace=False)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _allreduce_impl(
            grad_output, None, Average, 1.0, 1.0, Compression.none, inplace=False
        )
        if _engine.get().rank != ctx.root_rank:
            grad = grad * 0
        return grad, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    check_process_set(process_set)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFn.apply(tensor, root_rank, name)
    return _broadcast_impl(tensor, root_rank, name, inplace=False)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    check_process_set(process_set)
    with torch.no_grad():
        return _broadcast_impl(tensor, root_rank, name, inplace=True)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    check_process_set(process_set)
    if tensor.is_cuda or tensor.dtype == torch.bfloat16:
        result = _broadcast_impl(tensor, root_rank, name, inplace=False)
        return _register(None, lambda _: result)
    out = _contiguous_clone(tensor)
    h = _engine.get().broadcast_async(out.numpy(), root_rank, name, inplace=True)
    return _register(h, lambda _: out)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    check_process_set(process_set)
    if tensor.is_cuda or tensor.dtype == torch.bfloat16 or not tensor.is_contiguous():
        with torch.no_grad():
            _broadcast_impl(tensor, root_rank, name, inplace=True)
        return _register(None, lambda _: tensor)
    h = _engine.get().broadcast_async(tensor.detach().numpy(), root_rank, name, inplace=True)
    return _register(h, lambda _: tensor)


# ---------------------------------------------------------------- alltoall
def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send slices of dim 0 to every rank (equal slices, or ``splits``); returns the output,
    and ``received_splits`` too when ``splits`` was given (Horovod's convention)."""
    check_process_set(process_set)
    sp = (
        None
        if splits is None
        else np.asarray(splits.cpu() if isinstance(splits, torch.Tensor) else splits, np.int64)
    )
    if tensor.is_cuda:
        out, recv = _nccl.alltoall(tensor, sp, name)
    else:
        src = tensor.detach()
        arr = src.float().numpy() if src.dtype == torch.bfloat16 else src.numpy()
        out_np, recv = _engine.get().alltoall(arr, sp, name)
        out = torch.from_numpy(out_np).to(tensor.dtype)
    if splits is None:
        return out
    return out, torch.from_numpy(recv.astype(np.int32))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    check_process_set(process_set)
    if tensor.is_cuda or tensor.dtype == torch.bfloat16:
        result = alltoall(tensor, splits, name)
        return _register(None, lambda _: result)
    sp = (
        None
        if splits is None
        else np.asarray(splits.cpu() if isinstance(splits, torch.Tensor) else splits, np.int64)
    )
    h = _engine.get().alltoall_async(tensor.detach().numpy(), sp, name)

    def finish(res):
        out, recv = res
        out = torch.from_numpy(out)
        return out if splits is None else (out, torch.from_numpy(recv.astype(np.int32)))

    return _register(h, finish)


# ---------------------------------------------------------------- misc
def join(device=-1) -> int:
    """See ``shipyard.horovod.join``; returns the last rank to join."""
    return _engine.get().join()


def barrier(process_set=global_process_set) -> None:
    check_process_set(process_set)
    _engine.get().barrier()
