"""Where shipyard hooks into a Keras optimizer: the one module that touches Keras' private
methods.

The wrapped optimizer is a subclass of the user's optimizer class with one of the mixins
below in front (as Horovod builds it, so ``isinstance`` and saved configs keep working).
Keras 3's public ``apply`` reduces the gradients of every step; with
``backward_passes_per_step=k > 1`` the reduction moves into ``_clip_gradients``, a private
method Keras 3 calls only on the update step with the accumulated gradients. A Keras that
renamed it would silently train each rank on its own gradients, so the release this is
tested with is pinned in constraints.txt (``KERAS_TESTED``), another one gets a one-line
warning when an optimizer is wrapped, and an optimizer class without the method refuses
``backward_passes_per_step > 1`` with an error naming the supported release.
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import engine as _engine
from ..errors import UnsupportedError

#: The Keras release the ``_clip_gradients`` hook is written and tested against
#: (constraints.txt pins exactly this one; tests/integration/horovod/test_keras_hooks.py checks).
KERAS_TESTED = "3.15.1"
_PRIVATE_HOOK = "_clip_gradients"


def keras_note(installed: str) -> str | None:
    """What to tell the user when the installed Keras is not the tested one."""
    if installed == KERAS_TESTED:
        return None
    return (
        f"shipyard.horovod hooks Keras' private optimizer method {_PRIVATE_HOOK} and is "
        f"tested with keras {KERAS_TESTED} only; keras {installed} is installed. If training "
        f"misbehaves, install the tested one: pip install keras=={KERAS_TESTED}"
    )


def check_keras(installed: str, optimizer_cls: type, backward_passes_per_step: int) -> None:
    """At wrapping time: warn on an untested Keras; refuse accumulation when the hook the
    reduction relies on is missing (each rank would otherwise step on its own gradients)."""
    note = keras_note(installed)
    if note is not None:
        warnings.warn(note, RuntimeWarning, stacklevel=3)
    if backward_passes_per_step > 1 and not hasattr(optimizer_cls, _PRIVATE_HOOK):
        raise UnsupportedError(
            f"backward_passes_per_step > 1 reduces gradients in Keras' {_PRIVATE_HOOK}, which "
            f"{optimizer_cls.__name__} of keras {installed} does not have; use keras=="
            f"{KERAS_TESTED} (the tested release) or backward_passes_per_step=1"
        )


def is_keras3_optimizer(opt: Any) -> bool:
    """Keras 3's optimizer (the hooks below differ for tf_keras')."""
    try:
        import keras
    except ImportError:
        return False
    return keras.__version__.split(".")[0] >= "3" and isinstance(opt, keras.optimizers.Optimizer)


def is_tf1_keras_optimizer(opt: Any) -> bool:
    """A TensorFlow 1.x Keras optimizer (``tf.keras.optimizers.Adam(lr=...)`` in TF <= 1.15):
    ``fit`` builds its update ops from ``get_updates`` -> ``get_gradients`` and never calls
    ``apply_gradients``, so the reduction hooks ``get_gradients`` there, as Horovod 0.16 did."""
    return callable(getattr(opt, "get_updates", None)) and not hasattr(opt, "apply_gradients")


def keras_version() -> str:
    import keras

    return str(keras.__version__)


def _reduce(grads: Any, settings: dict[str, Any]) -> list[Any]:
    from . import _reduce_gradients

    if _engine.get().size == 1:
        return list(grads)
    return _reduce_gradients(
        list(grads),
        settings["op"],
        settings["compression"],
        settings["sparse_as_dense"],
        settings["prescale"],
        settings["postscale"],
    )


class _Settings:
    """What both hooks read: the reduction's settings, given by the wrapper right after the
    optimizer object is made (Keras builds the object itself, from its config)."""

    def _hvd_init(self, settings: dict[str, Any]) -> None:
        self._hvd_settings = settings


class Keras3Hooks(_Settings):
    """Mixed in front of a Keras 3 optimizer class."""

    def apply(self, grads, trainable_variables=None):
        if self._hvd_settings["bpps"] == 1:
            grads = _reduce(grads, self._hvd_settings)
        return super().apply(grads, trainable_variables)

    def _clip_gradients(self, grads):
        if self._hvd_settings["bpps"] > 1:
            grads = _reduce(grads, self._hvd_settings)
        return super()._clip_gradients(grads)


class TF1KerasHooks(_Settings):
    """Mixed in front of a TensorFlow 1.x Keras optimizer class: the gradients its graph
    applies are reduced (one fused py_function node, run with every training step)."""

    def get_gradients(self, loss, params):
        return _reduce(super().get_gradients(loss, params), self._hvd_settings)


class TFKerasHooks(_Settings):
    """Mixed in front of a tf_keras optimizer class (public ``apply_gradients`` only)."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        gv = list(grads_and_vars)
        grads = _reduce([g for g, _ in gv], self._hvd_settings)
        return super().apply_gradients(list(zip(grads, [v for _, v in gv])), *args, **kwargs)
