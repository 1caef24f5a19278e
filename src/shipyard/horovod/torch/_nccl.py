"""CUDA tensors: collectives through torch.distributed with NCCL.

The metadata negotiation still runs on the MPI channel (so shape/dtype mismatches give the
same clear error on every rank); the data moves GPU to GPU with NCCL. The process group is
created on first use, with rank 0's address (``MASTER_ADDR`` or the address of
``HOROVOD_HOSTNAME``/the hostname) and a free port broadcast over MPI.

NOT TESTED in shipyard's CI: the development machines have no GPU. The code path is guarded
(``is_cuda`` tensors only) and kept small on purpose. Without NCCL (or with
``SHIPYARD_HOROVOD_CUDA=host``) CUDA tensors are staged through host memory and MPI.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import numpy as np
import torch

from shipyard import settings

from .. import engine as _engine
from ..ops import Adasum, Average, Max, Min, Product, Sum

_lock = threading.Lock()
_ready = False


def use_nccl() -> bool:
    if (settings.optional_text("SHIPYARD_HOROVOD_CUDA") or "").lower() == "host":
        return False
    return bool(
        torch.distributed.is_available()
        and torch.distributed.is_nccl_available()
        and torch.cuda.is_available()
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def ensure_group() -> None:
    """Create the NCCL process group (collective over MPI; call from the same point on all ranks)."""
    global _ready
    with _lock:
        if _ready:
            return
        dist = torch.distributed
        eng = _engine.get()
        if not dist.is_initialized():
            if eng.rank == 0:
                host = (
                    os.environ.get("MASTER_ADDR")
                    or os.environ.get("HOROVOD_HOSTNAME")
                    or socket.gethostname()
                )
                try:
                    addr = socket.gethostbyname(host)
                except OSError:
                    addr = "127.0.0.1"
                info = (addr, _free_port())
            else:
                info = None
            addr, port = eng.broadcast_object(info, 0, "shipyard.nccl.rendezvous")
            dist.init_process_group(
                "nccl", init_method=f"tcp://{addr}:{port}", rank=eng.rank, world_size=eng.size
            )
        _ready = True


_TORCH_TO_NP: dict[Any, np.dtype] = {
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.bool: np.dtype(np.bool_),
    torch.bfloat16: np.dtype(np.float32),  # signature stand-in only
}


def _dcode(dtype: Any) -> int:
    """The negotiation row's dtype code of a torch dtype (0: none numpy knows)."""
    np_dtype = _TORCH_TO_NP.get(dtype)
    return 0 if np_dtype is None else _engine._DTYPE_CODES.get(np_dtype, 0)


def _red_op(op: int):
    R = torch.distributed.ReduceOp
    return {Sum: R.SUM, Average: R.SUM, Min: R.MIN, Max: R.MAX, Product: R.PRODUCT}[op]


def allreduce_(
    tensor: torch.Tensor, name, op: int, prescale: float, postscale: float, ctx=None
) -> torch.Tensor:
    """In place on a contiguous CUDA tensor. ``ctx``: run on that engine channel (the comm
    thread passes its own); None: the caller's (main) channel."""
    eng = _engine.get()
    if op == Adasum or not use_nccl():
        host = tensor.detach().cpu().contiguous()
        arr = host.float().numpy() if host.dtype == torch.bfloat16 else host.numpy()
        desc: tuple = ("allreduce", name, str(arr.dtype), tuple(tensor.shape), (("op", op),))
        if ctx is None:
            eng.run(
                lambda c: eng.executor.reduce_flat(
                    c, arr.reshape(-1), desc, op, prescale, postscale, name or ""
                )
            )
        else:
            eng.executor.reduce_flat(
                ctx, arr.reshape(-1), desc, op, prescale, postscale, name or ""
            )
        tensor.copy_(torch.from_numpy(arr).to(tensor.dtype))
        return tensor
    if ctx is None:
        ensure_group()
    elif not _ready:
        raise RuntimeError("NCCL process group not initialized (DistributedOptimizer creates it)")
    desc = ("allreduce", name, str(tensor.dtype), tuple(tensor.shape), (("op", op), ("cuda", True)))
    dcode = _dcode(tensor.dtype)

    def negotiate(c):
        eng.negotiator.negotiate(c, _engine.K_ALLREDUCE, desc, dcode, tensor.numel(), op=op)

    if ctx is None:
        eng.run(negotiate)
    else:
        negotiate(ctx)
    if prescale != 1.0:
        tensor.mul_(prescale)
    torch.distributed.all_reduce(tensor, op=_red_op(op))
    if op == Average:
        if tensor.dtype.is_floating_point:
            tensor.div_(eng.size)
        else:
            tensor.floor_divide_(eng.size)
    if postscale != 1.0:
        tensor.mul_(postscale)
    return tensor


def allgather(tensor: torch.Tensor, name) -> torch.Tensor:
    eng = _engine.get()
    if not use_nccl():
        out = eng.allgather(tensor.detach().cpu().numpy(), name)
        return torch.from_numpy(out).to(tensor.device)
    ensure_group()
    t = tensor if tensor.dim() else tensor.reshape(1)
    rest = tuple(t.shape[1:])
    desc = ("allgather", name, str(t.dtype), rest, (("cuda", True),))
    dcode = _dcode(t.dtype)
    table = eng.run(
        lambda c: eng.negotiator.negotiate(
            c, _engine.K_ALLGATHER, desc, dcode, int(np.prod(rest)), dim0=t.shape[0]
        ).copy()
    )
    dims = [int(d) for d in table[:, 6]]
    mx = max(dims)
    padded = torch.zeros((mx,) + rest, dtype=t.dtype, device=t.device)
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(eng.size)]
    torch.distributed.all_gather(parts, padded)
    return torch.cat([p[:d] for p, d in zip(parts, dims)], dim=0)


def broadcast_(tensor: torch.Tensor, root: int, name) -> torch.Tensor:
    eng = _engine.get()
    if not use_nccl():
        host = tensor.detach().cpu().contiguous().numpy()
        eng.broadcast_(host, root, name)
        tensor.copy_(torch.from_numpy(host))
        return tensor
    ensure_group()
    desc = (
        "broadcast",
        name,
        str(tensor.dtype),
        tuple(tensor.shape),
        (("root", root), ("cuda", True)),
    )
    dcode = _dcode(tensor.dtype)
    eng.run(
        lambda c: eng.negotiator.negotiate(
            c, _engine.K_BROADCAST, desc, dcode, tensor.numel(), root=root
        )
    )
    torch.distributed.broadcast(tensor, src=root)
    return tensor


def alltoall(tensor: torch.Tensor, splits, name):
    eng = _engine.get()
    host = tensor.detach().cpu().contiguous().numpy()
    out, recv = eng.alltoall(host, None if splits is None else np.asarray(splits), name)
    return torch.from_numpy(out).to(tensor.device), recv
