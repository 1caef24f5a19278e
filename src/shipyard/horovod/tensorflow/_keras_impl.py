"""Keras optimizer wrapping and callbacks, shared by Keras 3 (TF backend) and tf_keras.

Keras 3: the wrapper is a subclass of the optimizer's class (rebuilt ``from_config``) whose
``apply(grads, variables)`` (what ``fit`` and ``apply_gradients`` call) reduces the
gradients first. With ``backward_passes_per_step=k > 1`` it uses Keras' own
``gradient_accumulation_steps=k`` and reduces in ``_clip_gradients``, which Keras calls
only on the update step with the averaged accumulated gradients (the hooks, and the check
of the Keras release they are tested with, live in keras_hooks.py), so the allreduce runs
once per k passes (Keras averages the k passes: ``average_aggregated_gradients`` is implied).

tf_keras (``TF_USE_LEGACY_KERAS=1``; both the new and the legacy optimizer classes):
``apply_gradients`` reduces first. ``backward_passes_per_step > 1`` is not supported there.

Callbacks are built per Keras flavour (their base class must be that flavour's Callback):
``make_callbacks(keras_module)``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np

from .. import engine as _engine
from ..errors import UnsupportedError
from ..ops import Average, Min
from .keras_hooks import (
    Keras3Hooks,
    TF1KerasHooks,
    TFKerasHooks,
    check_keras,
    is_keras3_optimizer,
    is_tf1_keras_optimizer,
    keras_version,
)


def _subclass(mixin, base):
    """Same name and module as ``base``: a saved model's optimizer config then names the
    plain Keras class, so ``keras.models.load_model`` works without shipyard."""
    return type(
        base.__name__,
        (mixin, base),
        {"__module__": base.__module__, "__qualname__": base.__qualname__},
    )


def _settings(
    compression, sparse_as_dense, backward_passes_per_step, op, gradient_predivide_factor
):
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor != 1.0 needs op=Average")
    return {
        "op": op,
        "compression": compression,
        "sparse_as_dense": sparse_as_dense,
        "prescale": 1.0 / gradient_predivide_factor,
        "postscale": float(gradient_predivide_factor),
        "bpps": int(backward_passes_per_step),
    }


def wrap_optimizer(
    optimizer,
    name=None,
    compression=None,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
):
    from . import Compression

    settings = _settings(
        compression or Compression.none,
        sparse_as_dense,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
    )
    if getattr(optimizer, "_hvd_settings", None) is not None:
        raise ValueError("the optimizer is already a DistributedOptimizer")
    config = optimizer.get_config()
    mixin: type
    if is_keras3_optimizer(optimizer):
        check_keras(keras_version(), optimizer.__class__, settings["bpps"])
        mixin = Keras3Hooks
        if settings["bpps"] > 1:
            if config.get("gradient_accumulation_steps") not in (None, settings["bpps"]):
                raise ValueError(
                    "backward_passes_per_step conflicts with the optimizer's gradient_accumulation_steps"
                )
            config["gradient_accumulation_steps"] = settings["bpps"]
    elif is_tf1_keras_optimizer(optimizer):
        mixin = TF1KerasHooks
        if settings["bpps"] > 1:
            raise UnsupportedError(
                "backward_passes_per_step > 1 with TensorFlow 1.x Keras optimizers is not "
                "supported by shipyard.horovod (nor was it by Horovod then); use 1"
            )
        name = None  # TF 1.x Keras optimizers take no name
    else:
        mixin = TFKerasHooks
        if settings["bpps"] > 1:
            raise UnsupportedError(
                "backward_passes_per_step > 1 with tf_keras optimizers is not supported by shipyard.horovod; "
                "use Keras 3 (gradient_accumulation_steps) or accumulate gradients yourself"
            )
    if name:
        config["name"] = name
    cls = _subclass(mixin, optimizer.__class__)
    wrapped = cls.from_config(config)
    wrapped._hvd_init(settings)
    return wrapped


def wrap_in_place(optimizer, compression=None, **kw):
    """Turn an existing (possibly built) optimizer into a distributed one, keeping its state
    (used by ``load_model``)."""
    from . import Compression

    settings = _settings(
        compression or Compression.none, kw.get("sparse_as_dense", False), 1, Average, 1.0
    )
    mixin: type = TFKerasHooks
    if is_keras3_optimizer(optimizer):
        check_keras(keras_version(), optimizer.__class__, 1)
        mixin = Keras3Hooks
    elif is_tf1_keras_optimizer(optimizer):
        mixin = TF1KerasHooks
    optimizer.__class__ = _subclass(mixin, optimizer.__class__)
    optimizer._hvd_init(settings)
    return optimizer


# ---------------------------------------------------------------- learning-rate helpers
# TensorFlow 1.x Keras optimizers hold ``lr`` and ``momentum`` as graph variables (read and
# written through the session, ``K.get_value``/``K.set_value``); Keras 3 and tf_keras hold
# ``learning_rate`` as a variable that converts to numpy and takes a float on assignment.
def _lr_name(opt) -> str:
    return "learning_rate" if hasattr(opt, "learning_rate") else "lr"


def _graph_variable(value) -> bool:
    import tensorflow as tf

    return not tf.executing_eagerly() and isinstance(value, tf.Variable)


def _get_hyper(opt, name: str) -> float:
    value = getattr(opt, name)
    if _graph_variable(value):
        import tensorflow as tf

        return float(tf.keras.backend.get_value(value))
    return float(np.asarray(value))


def _set_hyper(opt, name: str, new: float) -> None:
    value = getattr(opt, name)
    if _graph_variable(value):
        import tensorflow as tf

        tf.keras.backend.set_value(value, new)
    else:
        setattr(opt, name, new)


def _get_lr(opt) -> float:
    return _get_hyper(opt, _lr_name(opt))


def _set_lr(opt, value: float) -> None:
    _set_hyper(opt, _lr_name(opt), value)


def _momentum_var(opt):
    """Momentum as a value we may change per batch (tf_keras legacy optimizers; TF 1.x
    Keras' SGD, whose momentum is a variable), else None."""
    hyper = getattr(opt, "_hyper", None)
    if isinstance(hyper, dict) and "momentum" in hyper:
        return opt
    if is_tf1_keras_optimizer(opt) and _graph_variable(getattr(opt, "momentum", None)):
        return opt
    return None


def _optimizer_variables(opt) -> list:
    v = getattr(opt, "variables", None)
    if callable(v):
        v = v()
    if v is None and is_tf1_keras_optimizer(opt):
        v = opt.weights  # TF 1.x Keras: the iteration count and the slots
    return list(v or [])


def _run_in_session(op, keras_module) -> None:
    """A graph op (TF 1.x: a collective built by a callback) run in Keras' session; eager
    collectives are done already (``op`` is None)."""
    if op is not None:
        keras_module.backend.get_session().run(op)


CALLBACKS = (
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
)


def callbacks_for(keras_module) -> dict[str, type]:
    """The four callbacks for one Keras (tf.keras or standalone ``keras``), by name: what
    both ``callbacks`` modules export. Built once per Keras module, so when ``tf.keras`` is
    Keras 3 the two modules share the very same classes."""
    cached = _CALLBACKS.get(id(keras_module))
    if cached is None:
        made = make_callbacks(keras_module)
        cached = _CALLBACKS[id(keras_module)] = {name: getattr(made, name) for name in CALLBACKS}
    return cached


_CALLBACKS: dict[int, dict[str, type]] = {}


def make_callbacks(keras_module) -> types.SimpleNamespace:
    """Horovod's Keras callbacks, subclassing ``keras_module.callbacks.Callback``."""
    Callback: Any = keras_module.callbacks.Callback  # the flavour's own base class

    class BroadcastGlobalVariablesCallback(Callback):
        """Make every rank hold ``root_rank``'s model and optimizer variables.

        Horovod broadcasts once, after the first batch: a model built without an input shape
        (``Sequential([Dense(...)])``) has no weights before its first step, and optimizers
        create their slots on their first update. shipyard does the same; in addition, when the
        model is already built on every rank at ``on_train_begin`` (agreed by one allreduce, so
        all ranks take the same collective path), it broadcasts the model then as well, so the
        first step starts from identical weights and equals one process on the global batch.
        """

        def __init__(self, root_rank=0, device=""):
            super().__init__()
            self.root_rank = root_rank
            self.device = device
            self.broadcast_done = False

        def _model_variables(self) -> list:
            if not getattr(self.model, "built", True):
                return []  # tf_keras raises on .variables of a model without weights
            return list(self.model.variables)

        def on_train_begin(self, logs=None):
            from . import broadcast_variables

            if self.broadcast_done:
                return
            variables = self._model_variables()
            built_everywhere = _engine.get().allreduce(
                np.array([1 if variables else 0], np.int32), name="bcast-callback:built", op=Min
            )
            if int(built_everywhere[0]):
                _run_in_session(broadcast_variables(variables, self.root_rank), keras_module)

        def on_train_batch_end(self, batch, logs=None):
            from . import broadcast_variables

            if self.broadcast_done:
                return
            op = broadcast_variables(self._model_variables(), root_rank=self.root_rank)
            _run_in_session(op, keras_module)
            opt = getattr(self.model, "optimizer", None)
            if opt is not None:
                op = broadcast_variables(_optimizer_variables(opt), root_rank=self.root_rank)
                _run_in_session(op, keras_module)
            self.broadcast_done = True

    class MetricAverageCallback(Callback):
        """Average the epoch's metrics over all ranks (put it before callbacks that read them)."""

        def __init__(self, device=""):
            super().__init__()

        def on_epoch_end(self, epoch, logs=None):
            if logs is None:
                return
            keys = sorted(k for k, v in logs.items() if _is_number(v))
            if not keys:
                return
            values = np.array([float(np.asarray(logs[k])) for k in keys], np.float64)
            reduced = _engine.get().allreduce(values, name="metrics:" + ",".join(keys))
            for k, v in zip(keys, reduced.tolist()):
                # each value keeps its type: TF 1.x Keras logs numpy scalars, and scripts
                # test for them (the notebook's save_history keeps np.float32/np.float64
                # lists only, so python floats emptied its history)
                old = logs[k]
                logs[k] = old.dtype.type(v) if isinstance(old, np.generic) else v

    class LearningRateScheduleCallback(Callback):
        """lr = initial_lr * multiplier(epoch) between start_epoch and end_epoch, per epoch
        (staircase) or per batch.

        ``initial_lr`` left out (Horovod up to 0.20: ``LearningRateScheduleCallback(multiplier,
        start_epoch=0, ...)``, no initial_lr) is the optimizer's learning rate when training
        begins, as those releases read it."""

        def __init__(
            self,
            initial_lr=None,
            multiplier=None,
            start_epoch=0,
            end_epoch=None,
            staircase=True,
            momentum_correction=True,
            steps_per_epoch=None,
            *args,
        ):
            super().__init__()
            if multiplier is None:
                if initial_lr is None:
                    raise TypeError(
                        f"{type(self).__name__} needs a multiplier (a number or a function "
                        "of the epoch)"
                    )
                initial_lr, multiplier = None, initial_lr  # Horovod <= 0.20: multiplier only
            elif callable(initial_lr):
                raise TypeError(
                    f"{type(self).__name__}(multiplier, start_epoch, ...) is Horovod 0.20's "
                    "positional order; give the rest by keyword (start_epoch=..., "
                    "end_epoch=...) or pass initial_lr first, as Horovod 0.21 and later take it"
                )
            self.initial_lr = initial_lr
            self.start_epoch = start_epoch
            self.end_epoch = end_epoch
            self.staircase = staircase
            self.momentum_correction = momentum_correction
            self.steps_per_epoch = steps_per_epoch
            self.current_epoch = None
            self.restore_momentum = None
            if callable(multiplier):
                self.multiplier = multiplier
            else:  # Horovod: a constant multiplier is applied per epoch
                self.staircase = True
                self.multiplier = lambda epoch: multiplier

        def _in_range(self, epoch):
            return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

        def _adjust(self, epoch):
            opt = self.model.optimizer
            old = _get_lr(opt)
            new = self.initial_lr * self.multiplier(epoch)
            _set_lr(opt, new)
            holder = _momentum_var(opt) if self.momentum_correction else None
            if holder is not None and old > 0:
                self.restore_momentum = _get_hyper(holder, "momentum")
                _set_hyper(holder, "momentum", self.restore_momentum * new / old)

        def _restore(self):
            if self.restore_momentum is not None:
                _set_hyper(self.model.optimizer, "momentum", self.restore_momentum)
                self.restore_momentum = None

        def on_train_begin(self, logs=None):
            if self.initial_lr is None:
                self.initial_lr = _get_lr(self.model.optimizer)
            if not self.staircase and not self.steps_per_epoch:
                params = self.params or {}
                self.steps_per_epoch = params.get("steps")
                if not self.steps_per_epoch and params.get("samples") and params.get("batch_size"):
                    self.steps_per_epoch = params["samples"] // params["batch_size"]
                if not self.steps_per_epoch:
                    raise ValueError(
                        f"{type(self).__name__} could not tell the number of steps per epoch: "
                        "pass steps_per_epoch= to it or fit(steps_per_epoch=...)"
                    )

        def on_epoch_begin(self, epoch, logs=None):
            self.current_epoch = epoch
            if self.staircase and self._in_range(epoch):
                self._adjust(epoch)

        def on_train_batch_begin(self, batch, logs=None):
            if not self._in_range(self.current_epoch):
                return
            if self.staircase and batch == 0:
                # as Horovod, again on each epoch's first batch (another callback may have
                # moved it); only when it moved, so the momentum correction is not doubled
                target = self.initial_lr * self.multiplier(self.current_epoch)
                if abs(_get_lr(self.model.optimizer) - target) > 1e-12 * max(1.0, abs(target)):
                    self._adjust(self.current_epoch)
            elif not self.staircase:
                self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

        def on_train_batch_end(self, batch, logs=None):
            self._restore()

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = _get_lr(self.model.optimizer)

    class LearningRateWarmupCallback(LearningRateScheduleCallback):
        """Ramp lr from initial_lr / size to initial_lr over ``warmup_epochs`` (Goyal et al.).

        ``initial_lr`` left out (Horovod up to 0.20, e.g. the tf-distribution-options
        notebook's ``LearningRateWarmupCallback(warmup_epochs=5, verbose=1)``): the
        optimizer's learning rate when training begins, as those releases read it."""

        def __init__(
            self,
            initial_lr=None,
            warmup_epochs=5,
            momentum_correction=True,
            steps_per_epoch=None,
            verbose=0,
        ):
            def multiplier(epoch):
                n = _engine.get().size
                epoch += 1.0 / self.steps_per_epoch
                return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

            super().__init__(
                initial_lr,
                multiplier,
                start_epoch=0,
                end_epoch=warmup_epochs,
                staircase=False,
                momentum_correction=momentum_correction,
                steps_per_epoch=steps_per_epoch,
            )
            self.verbose = verbose

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.end_epoch - 1 and self.verbose > 0 and _engine.get().rank == 0:
                sys.stdout.write(
                    f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                    f"{_get_lr(self.model.optimizer):g}.\n"
                )

    return types.SimpleNamespace(
        BroadcastGlobalVariablesCallback=BroadcastGlobalVariablesCallback,
        MetricAverageCallback=MetricAverageCallback,
        LearningRateScheduleCallback=LearningRateScheduleCallback,
        LearningRateWarmupCallback=LearningRateWarmupCallback,
    )


def _is_number(v) -> bool:
    try:
        a = np.asarray(v)
    except Exception:  # noqa: BLE001 - best-effort probe
        return False
    return a.shape == () and a.dtype.kind in "fiub"
