"""``smdistributed.dataparallel.tensorflow``: SMDDP's TensorFlow 2 API on shipyard.horovod.

SageMaker's data-parallel library shipped a TensorFlow client from TF 2.3 to 2.11, "designed
to be close to Horovod APIs"; the workshop notebooks use it as::

    import smdistributed.dataparallel.tensorflow as dist
    dist.init()
    tape = dist.DistributedGradientTape(tape)
    dist.broadcast_variables(model.variables, root_rank=0)

The real library needs its own CUDA collectives. Here every name maps onto
``shipyard.horovod.tensorflow`` (the same engine the ``mpi`` runner starts), so a job with
``distribution={'smdistributed': {'dataparallel': {'enabled': True}}}`` and the TensorFlow
estimator runs under the mpi runner, ranks placed as SageMaker placed them.

Where SMDDP's signature differs from Horovod's it is kept: ``allreduce(tensor, param_index,
num_params, ...)`` takes the two index arguments (they only drove SMDDP's bucketing),
``ReduceOp.AVERAGE``/``SUM``/``MIN``/``MAX`` are its op names, and ``oob_allreduce``
(an average "out of band", for losses and metrics) returns the reduced tensor, as the
library's examples use it. The TF1 ``tf.estimator`` / ``MonitoredTrainingSession`` parts
are here too: ``DistributedOptimizer`` (a ``tf.compat.v1.train.Optimizer`` whose gradients
are averaged over all ranks; SMDDP's ``bucket_cap_mb`` is checked and accepted, the fusion
here sizes its own buffers) and ``BroadcastGlobalVariablesHook`` (every global variable
from ``root_rank`` once the session exists). ``overlap`` is an identity (it only helped XLA
overlap communication).
"""

from __future__ import annotations

import shipyard.horovod.tensorflow as _hvd
from shipyard.horovod.tensorflow import (  # noqa: F401 - SMDDP's names, same objects
    barrier,
    broadcast,
    broadcast_variables,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from shipyard.horovod.tensorflow.hooks import BroadcastGlobalVariablesHook  # noqa: F401

__version__ = "1.2.0+shipyard"  # the SMDDP release of the TF 2.4-era notebooks


class ReduceOp:
    """SMDDP's reduction names for Horovod's ops."""

    AVERAGE = _hvd.Average
    SUM = _hvd.Sum
    MIN = _hvd.Min
    MAX = _hvd.Max


class Compression:
    """``none`` or ``fp16`` (floating tensors travel as float16), as in SMDDP."""

    none = _hvd.Compression.none
    fp16 = _hvd.Compression.fp16


def _op(op):
    return ReduceOp.AVERAGE if op is None else op


def allreduce(
    tensor, param_index=0, num_params=1, compression=Compression.none, op=ReduceOp.AVERAGE
):
    """Reduce ``tensor`` over all ranks (average by default). ``param_index`` and
    ``num_params`` are accepted for SMDDP's signature; the fusion here does not need them."""
    if not isinstance(param_index, int) or not isinstance(num_params, int):
        raise TypeError(
            "smdistributed.dataparallel.tensorflow.allreduce(tensor, param_index, num_params): "
            f"param_index and num_params must be integers, got {param_index!r}, {num_params!r}"
        )
    return _hvd.allreduce(tensor, compression=compression, op=_op(op))


def oob_allreduce(tensor, compression=Compression.none, op=ReduceOp.AVERAGE):
    """Average a non-gradient tensor (a loss, a metric) over all ranks and return it."""
    return _hvd.allreduce(tensor, compression=compression, op=_op(op))


def broadcast_global_variables(root_rank):
    """TF1 graph mode: every global variable from ``root_rank`` (as Horovod's)."""
    return _hvd.broadcast_global_variables(root_rank)


def overlap(tensor):
    """Identity: SMDDP used it to overlap XLA's backward pass with its allreduce."""
    return tensor


def DistributedGradientTape(  # noqa: N802 - SMDDP's name
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=ReduceOp.AVERAGE,
):
    """Wrap a ``tf.GradientTape``: ``gradient()`` returns gradients averaged over all ranks."""
    _no_device("DistributedGradientTape", device_dense, device_sparse)
    return _hvd.DistributedGradientTape(
        gradtape, compression=compression, sparse_as_dense=sparse_as_dense, op=_op(op)
    )


def _no_device(what: str, device_dense: str, device_sparse: str) -> None:
    if device_dense or device_sparse:
        raise ValueError(
            f"smdistributed.dataparallel.tensorflow.{what}: device_dense and device_sparse are "
            "not supported (as in SMDDP); leave them out"
        )


def DistributedOptimizer(  # noqa: N802 - SMDDP's name
    optimizer,
    name=None,
    use_locking=False,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=ReduceOp.AVERAGE,
    bucket_cap_mb=25,
):
    """Wrap a TF1 optimizer (``tf.compat.v1.train.Optimizer``, as ``tf.estimator`` scripts
    use): ``compute_gradients`` returns gradients averaged over all ranks."""
    _no_device("DistributedOptimizer", device_dense, device_sparse)
    if (
        isinstance(bucket_cap_mb, bool)
        or not isinstance(bucket_cap_mb, (int, float))
        or bucket_cap_mb <= 0
        or (bucket_cap_mb * 1024 * 1024) % 128
    ):
        raise ValueError(
            "smdistributed.dataparallel.tensorflow.DistributedOptimizer: bucket_cap_mb must be "
            f"a positive size in MB whose bytes are a multiple of 128, got {bucket_cap_mb!r} "
            "(SMDDP's default is 25)"
        )
    return _hvd.DistributedOptimizer(
        optimizer,
        name=name,
        use_locking=use_locking,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        op=_op(op),
    )
