"""``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
``allgather_object`` (Horovod's ``horovod.torch.functions``)."""

from __future__ import annotations

import io

import torch

from .. import engine as _engine
from ..ops import check_process_set, global_process_set
from . import _nccl


def broadcast_parameters(params, root_rank: int = 0, process_set=global_process_set) -> None:
    """Copy ``root_rank``'s values into every rank's tensors, in place.

    ``params``: ``model.state_dict()``, ``model.named_parameters()`` or a list of
    ``(name, tensor)``. CPU tensors are fused per dtype (one broadcast per fusion buffer).
    """
    check_process_set(process_set)
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [(f"param.{i}", p) for i, p in enumerate(items)]
    eng = _engine.get()
    cpu_arrays, cpu_names, writebacks = [], [], []
    with torch.no_grad():
        for name, p in items:
            if p is None:
                continue
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"broadcast_parameters: {name!r} is not a tensor")
            if p.is_cuda:
                if p.is_contiguous():
                    _nccl.broadcast_(p.data, root_rank, name)
                else:
                    tmp = p.data.contiguous()
                    _nccl.broadcast_(tmp, root_rank, name)
                    p.data.copy_(tmp)
                continue
            d = p.detach()
            if d.dtype == torch.bfloat16 or not d.is_contiguous():
                staged = d.float().contiguous() if d.dtype == torch.bfloat16 else d.contiguous()
                cpu_arrays.append(staged.numpy())
                writebacks.append((d, staged))
            else:
                cpu_arrays.append(d.numpy())
            cpu_names.append(name)
        if cpu_arrays:
            eng.grouped_broadcast_(cpu_arrays, root_rank, cpu_names)
        for dst, staged in writebacks:
            dst.copy_(staged)


def broadcast_optimizer_state(
    optimizer, root_rank: int = 0, process_set=global_process_set
) -> None:
    """Make every rank's optimizer state (and hyperparameters) equal to ``root_rank``'s.

    The root's ``state_dict()`` travels serialized with ``torch.save`` (tensors, scalars
    and hyperparameters alike); other ranks load it with ``weights_only=True`` (no code
    runs on receipt) and ``load_state_dict`` it, which casts state to each parameter's
    device.
    """
    check_process_set(process_set)
    eng = _engine.get()
    if eng.rank == root_rank:
        buf = io.BytesIO()
        torch.save(optimizer.state_dict(), buf)
        payload = buf.getvalue()
    else:
        payload = None
    payload = eng.broadcast_object(payload, root_rank, "shipyard.optimizer_state")
    if eng.rank != root_rank:
        optimizer.load_state_dict(_load_state(payload, root_rank))


def _load_state(payload: bytes, root_rank: int):
    """Tensors, numbers, strings and containers only (``weights_only=True``): the bytes
    came over the wire from another process, and a full unpickle would run whatever
    code the sender put in them."""
    import pickle

    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise TypeError(
            f"broadcast_optimizer_state: rank {root_rank}'s optimizer state holds an object "
            "that is not a tensor, number, string or container, and it is not unpickled on "
            "receipt (it could run code). Keep such objects out of the optimizer's "
            "param_groups/state, or allow their type with "
            f"torch.serialization.add_safe_globals([...]) on every rank. Detail: {exc}"
        ) from None


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=global_process_set):
    """Pickle ``obj`` on ``root_rank`` and return it on every rank."""
    check_process_set(process_set)
    return _engine.get().broadcast_object(obj, root_rank, name)


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every rank's ``obj``, in rank order."""
    check_process_set(process_set)
    return _engine.get().allgather_object(obj, name)
