"""``horovod.keras`` (standalone Keras): the same API as ``shipyard.horovod.tensorflow.keras``,
with callbacks built on the standalone ``keras`` package's Callback."""

from shipyard.horovod.tensorflow.keras import *
from shipyard.horovod.tensorflow.keras import (  # noqa: F401
    DistributedOptimizer,
    allgather,
    allreduce,
    broadcast,
    broadcast_global_variables,
    load_model,
)

from . import callbacks  # noqa: F401
