"""shipyard.horovod reduces accumulated Keras 3 gradients in a private optimizer method
(``_clip_gradients``): constraints.txt pins the Keras it is tested with, the adapter names
the same one, another Keras is named in a warning when an optimizer is wrapped, and an
optimizer without the hook refuses accumulation instead of training each rank alone.

The version is faked at the adapter's seam (``check_keras`` takes it), so no Keras import
but the last test's; the adapter's package (shipyard.horovod.tensorflow) imports TensorFlow,
so these run in the integration tier, and the module is imported by the first test."""

from __future__ import annotations

import pathlib
import re
import warnings

import pytest
from tests.lazy import lazy, needs

from shipyard.horovod.errors import UnsupportedError

pytestmark = [pytest.mark.tensorflow, needs("tensorflow", "keras")]
keras_hooks = lazy("shipyard.horovod.tensorflow.keras_hooks")  # imports TensorFlow

ROOT = pathlib.Path(__file__).resolve().parents[3]


class _WithHook:
    def _clip_gradients(self, grads):
        return grads


class _WithoutHook:
    pass


def test_constraints_pin_the_keras_the_hooks_are_tested_with() -> None:
    pins = re.findall(r"^keras==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pins == [keras_hooks.KERAS_TESTED]


def test_the_tested_keras_wraps_silently() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keras_hooks.check_keras(keras_hooks.KERAS_TESTED, _WithHook, 4)


def test_another_keras_is_named_with_the_supported_one() -> None:
    with pytest.warns(RuntimeWarning) as caught:
        keras_hooks.check_keras("3.99.0", _WithHook, 1)
    (message,) = [str(w.message) for w in caught]
    assert "keras 3.99.0 is installed" in message
    assert f"keras=={keras_hooks.KERAS_TESTED}" in message


def test_accumulation_without_the_hook_is_refused_naming_the_supported_keras() -> None:
    with pytest.warns(RuntimeWarning), pytest.raises(UnsupportedError) as err:
        keras_hooks.check_keras("4.0.0", _WithoutHook, 2)
    text = str(err.value)
    assert "_clip_gradients" in text and "_WithoutHook" in text and "keras 4.0.0" in text
    assert f"keras=={keras_hooks.KERAS_TESTED}" in text
    # one pass per step reduces in the public apply(): no private hook needed
    with pytest.warns(RuntimeWarning):
        keras_hooks.check_keras("4.0.0", _WithoutHook, 1)


def test_the_installed_keras_optimizers_have_the_hook() -> None:
    import keras

    assert keras.__version__ == keras_hooks.KERAS_TESTED
    assert hasattr(keras.optimizers.SGD, "_clip_gradients")
