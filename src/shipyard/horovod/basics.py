"""The framework-neutral part of the API, listed once.

Every framework module (``shipyard.horovod.torch``, ``.tensorflow``, ``.tensorflow.keras``,
``.keras``) re-exports these as they are, with ``from shipyard.horovod.basics import *``,
and adds its own tensor collectives, optimizers and callbacks on top: lifecycle and
topology, build/runtime facts, reduction ops, the (global) process set, the error classes
and the timeline. Adding a neutral function here adds it to every framework module.
"""

from shipyard.horovod import (  # noqa: F401 - re-exported, see __all__
    Adasum,
    Average,
    CollectiveArgumentError,
    HorovodError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    JoinedRankError,
    Max,
    Min,
    NotInitializedError,
    ProcessSet,
    Product,
    Sum,
    TensorMismatchError,
    UnsupportedError,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)

__all__ = [name for name in dir() if not name.startswith("_")]  # every name imported above
