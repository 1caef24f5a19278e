"""``import shipyard.horovod.torch as hvd``: Horovod's ``horovod.torch`` API.

Everything of ``shipyard.horovod`` (init, rank, size, local_rank, ..., Average/Sum/...) plus
torch-tensor collectives (``allreduce``, ``allgather``, ``broadcast``, ``alltoall``, grouped
and ``_async`` variants with ``synchronize``/``poll``), ``DistributedOptimizer``,
``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
``allgather_object`` and ``Compression``.
"""

from shipyard.horovod import (  # noqa: F401  (re-exported API)
    Adasum,
    Average,
    HorovodError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
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

from .compression import Compression  # noqa: F401
from .functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .mpi_ops import (  # noqa: F401
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    join,
    poll,
    synchronize,
)
from .optimizer import DistributedOptimizer  # noqa: F401
