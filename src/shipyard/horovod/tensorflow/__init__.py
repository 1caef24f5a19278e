"""``import shipyard.horovod.tensorflow as hvd``: Horovod's ``horovod.tensorflow`` API.

How TF tensors reach MPI: in eager mode the engine gets ``tensor.numpy()`` directly; inside a
``tf.function`` (Keras ``model.fit`` traces its train step) the collective is a
``tf.py_function`` that calls the same numpy engine when the graph runs. So:

* works in eager code, in ``tf.function`` and in Keras 3 / tf_keras ``fit``;
* does NOT work under XLA (``jit_compile=True``): py_function cannot be compiled. Keras 3
  turns XLA on automatically ("auto") only when a GPU is visible: compile with
  ``jit_compile=False`` there;
* graphs with collectives are not serializable (``py_function``); save the model, not the
  train step.

``allreduce``, ``allgather`` and ``broadcast`` have gradients (as Horovod registers them).
``DistributedGradientTape`` reduces all dense gradients with one fused call; sparse
gradients (``IndexedSlices``) are allgathered unless ``sparse_as_dense=True``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from shipyard.horovod import allgather_object, barrier, broadcast_object, join  # noqa: F401 - re-exported
from shipyard.horovod.basics import *  # the framework-neutral API, listed once

from .. import engine as _engine
from ..compression import Compressor, NoneCompressor, compression_for  # noqa: F401 - re-exported
from ..ops import check_process_set, resolve_op

#: how the step recorder names a step (or its communication) Horovod's reduction saw
STEP_SOURCE = "horovod allreduce"

# ---------------------------------------------------------------- compression
Compression = compression_for(lambda t: t.dtype.is_floating, tf.cast, tf.float16)
FP16Compressor = Compression.fp16


# ---------------------------------------------------------------- numpy bridge
def _np_call(
    fn, inputs: Sequence[tf.Tensor], tout: Sequence[tf.DType], shapes=None, name: str | None = None
):
    """Run ``fn(list of numpy arrays) -> list of numpy arrays`` on TF tensors: directly in
    eager mode, as one ``tf.py_function`` node in a graph."""
    inputs = list(inputs)
    if tf.executing_eagerly():
        outs = fn([t.numpy() for t in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, tout)]

    def wrapper(*ts):
        return fn([t.numpy() for t in ts])

    outs = tf.py_function(wrapper, inputs, list(tout), name=name)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    outs = list(outs)
    if shapes is not None:
        for o, s in zip(outs, shapes):
            o.set_shape(s)
    return outs


def _widen(t: tf.Tensor):
    """bfloat16 has no numpy/MPI type: travel as float32."""
    if t.dtype == tf.bfloat16:
        return tf.cast(t, tf.float32), tf.bfloat16
    return t, None


def _narrow(t: tf.Tensor, orig):
    return t if orig is None else tf.cast(t, orig)


def _eng():
    return _engine.get()


# ---------------------------------------------------------------- allreduce
def _allreduce_dense_nograd(tensor, name, op, prescale, postscale):
    t, orig = _widen(tf.convert_to_tensor(tensor))
    out = _np_call(
        lambda a: [_eng().allreduce(a[0], name, op, prescale, postscale)],
        [t],
        [t.dtype],
        [t.shape],
        name="HorovodAllreduce",
    )[0]
    return _narrow(out, orig)


def _allreduce_dense(tensor, name, op, prescale, postscale):
    @tf.custom_gradient
    def fn(x):
        y = _allreduce_dense_nograd(x, name, op, prescale, postscale)

        def grad(dy):
            return _allreduce_dense_nograd(dy, None, op, prescale, postscale)

        return y, grad

    return fn(tensor)


def _allreduce_sparse(slices: tf.IndexedSlices, name, op, prescale, postscale):
    if op not in (Average, Sum):
        raise ValueError(
            "sparse (IndexedSlices) allreduce supports only op=Average or Sum; "
            "or pass sparse_as_dense=True"
        )
    values = slices.values
    if prescale != 1.0:
        values = values * tf.cast(prescale, values.dtype)
    values = allgather(values, name=None if name is None else f"{name}.values")
    indices = allgather(slices.indices, name=None if name is None else f"{name}.indices")
    scale = postscale / (size() if op == Average else 1)
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(
    tensor,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
):
    """Reduce a tensor (or ``IndexedSlices``, via allgather) over all ranks."""
    check_process_set(process_set)
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_sparse(tensor, name, op, prescale_factor, postscale_factor)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _allreduce_dense(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(
    tensors,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    name=None,
):
    """Reduce a list of dense tensors with one fused call (one py_function in a graph)."""
    check_process_set(process_set)
    op = resolve_op(op, average)
    return _grouped_allreduce(tensors, op, compression, prescale_factor, postscale_factor, name)


def _step_reduce(arrs, names, op, prescale, postscale):
    """A training step's gradients (the optimizer wrapper's and the tape's reduction):
    reduced, and timed into this rank's step recorder (runtime/steptiming.py): the wait
    is the step's communication; where no other library times the steps (Keras ``fit``,
    a TF1 session), each reduction ends one."""
    engine = _eng()
    start = time.perf_counter()
    out = engine.grouped_allreduce(arrs, names, op, prescale, postscale)
    steps = engine.steps
    if steps is not None:
        waited = time.perf_counter() - start
        steps.comm(waited, nbytes=sum(a.nbytes for a in arrs), source=STEP_SOURCE)
        if steps.claim(STEP_SOURCE):
            steps.mark()
    return out


def _grouped_allreduce(tensors, op, compression, prescale, postscale, name, step=False):
    """``grouped_allreduce``'s work; ``step``: these are a training step's gradients."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    comp = [compression.compress(t) for t in tensors]
    wide = [_widen(c) for c, _ in comp]
    names = None if name is None else [f"{name}.{i}" for i in range(len(tensors))]
    outs = _np_call(
        lambda arrs: (_step_reduce if step else _eng().grouped_allreduce)(
            arrs, names, op, prescale, postscale
        ),
        [w for w, _ in wide],
        [w.dtype for w, _ in wide],
        [w.shape for w, _ in wide],
        name="HorovodGroupedAllreduce",
    )
    return [
        compression.decompress(_narrow(o, orig), cctx)
        for o, (_, orig), (_, cctx) in zip(outs, wide, comp)
    ]


# ---------------------------------------------------------------- allgather / broadcast / alltoall
def _allgather_nograd(tensor, name):
    t, orig = _widen(tf.convert_to_tensor(tensor))
    shape = (
        tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank else tf.TensorShape([None])
    )
    out = _np_call(
        lambda a: [_eng().allgather(a[0], name)], [t], [t.dtype], [shape], name="HorovodAllgather"
    )[0]
    return _narrow(out, orig)


def allgather(tensor, name=None, process_set=global_process_set, ignore_name_scope=False):
    """Concatenate every rank's tensor along dimension 0 (which may differ between ranks)."""
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if not (tensor.dtype.is_floating or tensor.dtype.is_complex):
        return _allgather_nograd(tensor, name)

    @tf.custom_gradient
    def fn(x):
        y = _allgather_nograd(x, name)

        def grad(dy):
            # as Horovod registers it: sum the gradient over ranks, keep this rank's rows
            reduced = _allreduce_dense_nograd(dy, None, Sum, 1.0, 1.0)
            rows = tf.reshape(
                tf.shape(x, out_type=tf.int64)[0] if x.shape.rank else tf.constant(1, tf.int64), [1]
            )
            sizes = _allgather_nograd(rows, None)
            start = tf.reduce_sum(sizes[: rank()])
            return tf.reshape(reduced[start : start + rows[0]], tf.shape(x))

        return y, grad

    return fn(tensor)


def _broadcast_nograd(tensor, root_rank, name):
    t, orig = _widen(tf.convert_to_tensor(tensor))
    out = _np_call(
        lambda a: [_eng().broadcast(a[0], root_rank, name)],
        [t],
        [t.dtype],
        [t.shape],
        name="HorovodBroadcast",
    )[0]
    return _narrow(out, orig)


def broadcast(
    tensor, root_rank, name=None, process_set=global_process_set, ignore_name_scope=False
):
    """``root_rank``'s value of ``tensor`` on every rank."""
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if not (tensor.dtype.is_floating or tensor.dtype.is_complex):
        return _broadcast_nograd(tensor, root_rank, name)

    @tf.custom_gradient
    def fn(x):
        y = _broadcast_nograd(x, root_rank, name)

        def grad(dy):
            reduced = _allreduce_dense_nograd(dy, None, Sum, 1.0, 1.0)  # as Horovod's TF gradient
            return reduced if rank() == root_rank else reduced * 0

        return y, grad

    return fn(tensor)


def alltoall(
    tensor, splits=None, name=None, process_set=global_process_set, ignore_name_scope=False
):
    """Scatter slices of dimension 0 to all ranks and gather theirs. Returns the output, and
    ``received_splits`` too when ``splits`` is given."""
    check_process_set(process_set)
    t, orig = _widen(tf.convert_to_tensor(tensor))
    shape = (
        tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank else tf.TensorShape([None])
    )
    inputs = [t] if splits is None else [t, tf.cast(tf.convert_to_tensor(splits), tf.int64)]

    def fn(arrs):
        out, recv = _eng().alltoall(arrs[0], None if splits is None else arrs[1], name)
        return [out, recv.astype(np.int32)]

    out, recv = _np_call(
        fn, inputs, [t.dtype, tf.int32], [shape, tf.TensorShape([None])], name="HorovodAlltoall"
    )
    out = _narrow(out, orig)
    return out if splits is None else (out, recv)


# ---------------------------------------------------------------- variables
def _var_value(v):
    value = getattr(v, "value", None)
    if callable(value):
        value = value()
    return tf.convert_to_tensor(value if value is not None else v)


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assign ``root_rank``'s values to ``variables`` (tf.Variable or Keras variables) on
    every rank; fused per dtype. Eager: done on return. In a graph: returns the op."""
    check_process_set(process_set)
    variables = [v for v in variables if v is not None]
    if not variables:
        return None
    if tf.executing_eagerly():
        arrays = []
        for v in variables:
            value = v.numpy()
            arrays.append(
                np.array(
                    value.astype(np.float32) if value.dtype.name == "bfloat16" else value,
                    order="C",
                    copy=True,
                )
            )
        _eng().grouped_broadcast_(arrays, root_rank)
        for v, a in zip(variables, arrays):
            v.assign(a.astype(v.numpy().dtype) if a.dtype != v.numpy().dtype else a)
        return None
    values = [_widen(_var_value(v)) for v in variables]

    def fn(arrs):
        arrs = [np.array(a, order="C", copy=True) for a in arrs]
        _eng().grouped_broadcast_(arrs, root_rank)
        return arrs

    outs = _np_call(
        fn,
        [w for w, _ in values],
        [w.dtype for w, _ in values],
        [w.shape for w, _ in values],
        name="HorovodBroadcastVariables",
    )
    return tf.group(
        *[v.assign(_narrow(o, orig)) for v, o, (_, orig) in zip(variables, outs, values)]
    )


def broadcast_global_variables(root_rank):
    """TF1 graph mode only, as in Horovod."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


# ---------------------------------------------------------------- gradients
def _reduce_gradients(grads, op, compression, sparse_as_dense, prescale, postscale):
    """Allreduce a flat list of gradients (None kept): dense ones fused in one call."""
    out = list(grads)
    dense_idx, dense = [], []
    for i, g in enumerate(out):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                g = tf.convert_to_tensor(g)
            else:
                out[i] = _allreduce_sparse(g, None, op, prescale, postscale)
                continue
        dense_idx.append(i)
        dense.append(g)
    if dense:
        if op == Adasum:
            reduced = [allreduce(g, op=op, compression=compression) for g in dense]
        else:
            reduced = _grouped_allreduce(
                dense, op, compression, prescale, postscale, None, step=True
            )
        for i, r in zip(dense_idx, reduced):
            out[i] = r
    return out


class _DistributedGradientTape:
    """Mixed into a subclass of the wrapped tape's class (so it still is a tf.GradientTape)."""

    def gradient(
        self,
        target,
        sources,
        output_gradients=None,
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    ):
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(grads, expand_composites=False)
        if self._hvd_size > 1:
            flat = _reduce_gradients(
                flat,
                self._hvd_op,
                self._hvd_compression,
                self._hvd_sparse_as_dense,
                self._hvd_prescale,
                self._hvd_postscale,
            )
        return tf.nest.pack_sequence_as(grads, flat, expand_composites=False)


def DistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Wrap a ``tf.GradientTape`` so ``gradient()`` returns gradients averaged (``op``) over
    all ranks (one fused allreduce for the dense ones)."""
    check_process_set(process_set)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor != 1.0 needs op=Average")
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hvd_op = op
    tape._hvd_compression = compression
    tape._hvd_sparse_as_dense = sparse_as_dense
    tape._hvd_prescale = 1.0 / gradient_predivide_factor
    tape._hvd_postscale = float(gradient_predivide_factor)
    tape._hvd_size = _eng().size
    return tape


class _DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """TF1 ``tf.compat.v1.train.Optimizer`` wrapper: ``compute_gradients`` allreduces."""

    def __init__(self, optimizer, name, op, compression, sparse_as_dense, prescale, postscale):
        super().__init__(use_locking=False, name=name or f"Distributed{type(optimizer).__name__}")
        self._optimizer = optimizer
        self._hvd = (op, compression, sparse_as_dense, prescale, postscale)

    def compute_gradients(self, *args, **kwargs):
        gv = self._optimizer.compute_gradients(*args, **kwargs)
        if _eng().size == 1:
            return gv
        grads, variables = zip(*gv) if gv else ((), ())
        reduced = _reduce_gradients(list(grads), *self._hvd)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
    optimizer,
    name=None,
    use_locking=False,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Keras optimizers (Keras 3 or tf_keras) are wrapped as ``shipyard.horovod.tensorflow.keras``
    does; ``tf.compat.v1.train.Optimizer`` gets a TF1-style wrapper."""
    check_process_set(process_set)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise UnsupportedError(
                "backward_passes_per_step > 1 is supported for Keras optimizers only"
            )
        return _DistributedOptimizerV1(
            optimizer,
            name,
            op,
            compression,
            sparse_as_dense,
            1.0 / gradient_predivide_factor,
            float(gradient_predivide_factor),
        )
    from ._keras_impl import wrap_optimizer

    return wrap_optimizer(
        optimizer,
        name=name,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients,
    )


# TF1 estimator / MonitoredTrainingSession scripts: hvd.BroadcastGlobalVariablesHook(0)
from .hooks import BroadcastGlobalVariablesHook  # noqa: E402,F401 - Horovod's public name
