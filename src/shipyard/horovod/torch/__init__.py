"""``import shipyard.horovod.torch as hvd``: Horovod's ``horovod.torch`` API.

Everything of ``shipyard.horovod`` (init, rank, size, local_rank, ..., Average/Sum/...) plus
torch-tensor collectives (``allreduce``, ``allgather``, ``broadcast``, ``alltoall``, grouped
and ``_async`` variants with ``synchronize``/``poll``), ``DistributedOptimizer``,
``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
``allgather_object`` and ``Compression``.
"""

from shipyard.horovod.basics import *  # the framework-neutral API, listed once

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
