"""``import shipyard.horovod.tensorflow.keras as hvd``: Horovod's ``horovod.tensorflow.keras``.

Works with Keras 3 on the TensorFlow backend (``tf.keras`` in TF >= 2.16) and with tf_keras
(``TF_USE_LEGACY_KERAS=1``): ``DistributedOptimizer`` detects which optimizer it got; the
``callbacks`` module subclasses whatever ``tf.keras`` is in this process. See
``shipyard.horovod.tensorflow`` for how TF tensors reach MPI (py_function in graphs; no XLA).
"""

from __future__ import annotations

import tensorflow as tf

from shipyard.horovod import basics
from shipyard.horovod.basics import *  # the framework-neutral API, listed once
from shipyard.horovod.tensorflow import (  # re-exported
    Compression,
    allgather_object,
    barrier,
    broadcast_object,
    broadcast_variables,
    join,
)
from shipyard.horovod.tensorflow import allgather as _tf_allgather
from shipyard.horovod.tensorflow import allreduce as _tf_allreduce
from shipyard.horovod.tensorflow import broadcast as _tf_broadcast

from .. import _keras_impl
from . import callbacks

# What ``from shipyard.horovod.tensorflow.keras import *`` gives (horovod.keras is built so).
__all__ = basics.__all__ + [
    "Compression",
    "DistributedOptimizer",
    "allgather",
    "allgather_object",
    "allreduce",
    "barrier",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "join",
    "load_model",
]


def DistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Wrap a Keras optimizer (Keras 3 or tf_keras) so gradients are averaged over all
    ranks before they are applied. Returns a new optimizer of a subclass of its class."""
    return _keras_impl.wrap_optimizer(
        optimizer,
        name=name,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients,
    )


def allreduce(
    value,
    name=None,
    average=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    op=None,
    compression=Compression.none,
):
    """Allreduce a tensor-compatible value; returns a tensor."""
    return _tf_allreduce(
        tf.constant(value) if not tf.is_tensor(value) else value,
        name=name,
        average=average,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        op=op,
        compression=compression,
    )


def allgather(value, name=None):
    return _tf_allgather(tf.constant(value) if not tf.is_tensor(value) else value, name=name)


def broadcast(value, root_rank, name=None):
    return _tf_broadcast(
        tf.constant(value) if not tf.is_tensor(value) else value, root_rank, name=name
    )


def broadcast_global_variables(root_rank):
    """TF 1.x graph mode: every global variable takes ``root_rank``'s value, run in Keras'
    session (as Horovod's Keras API did then)."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() needs TF1 sessions; with TF2/Keras use "
            "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) or hvd.broadcast_variables(model.variables, root_rank)"
        )
    from shipyard.horovod.tensorflow import broadcast_global_variables as _tf_bcast

    return tf.keras.backend.get_session().run(_tf_bcast(root_rank))


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """``keras.models.load_model`` whose compiled optimizer is made distributed (state kept)."""
    objects = dict(custom_objects or {})
    for opt in custom_optimizers or []:
        objects[opt.__name__] = opt
    model = tf.keras.models.load_model(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if opt is not None and getattr(opt, "_hvd_settings", None) is None:
        _keras_impl.wrap_in_place(opt, compression=compression)
    return model
