"""TensorFlow's eager internals, behind one adapter: a SavedModel signature called one
level below ``fn(**inputs)`` (``DirectCall``), and the check of the TensorFlow release
that was tested.

The internals (``tensorflow.python.eager.execute.quick_execute``, a concrete function's
``_inference_function``, ``EagerTensor._numpy``) may change in any release. ``TFServable``
builds a ``DirectCall`` only after it returned exactly what the public call returns on a
sample, and falls back to the public call on any failure, so another TensorFlow costs
speed, not answers; constraints.txt pins the tested release (``TF_TESTED``) and a worker
on another one says so once, naming both, when it loads its first SavedModel.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np

log = logging.getLogger("shipyard.serving")

#: The TensorFlow release ``DirectCall`` is written and tested against (constraints.txt pins
#: tensorflow-cpu to exactly this one; tests/unit/serving/test_tf_eager_pin.py checks).
TF_TESTED = "2.21.0"
_warned: set[str] = set()


def tf_note(installed: str) -> str | None:
    """What to tell the operator when the installed TensorFlow is not the tested one."""
    if installed == TF_TESTED:
        return None
    return (
        f"shipyard's model server calls SavedModel signatures through TensorFlow internals "
        f"tested with tensorflow {TF_TESTED} only; tensorflow {installed} is installed. "
        f"Answers are checked and fall back to the public call; for the tested speed "
        f"install tensorflow-cpu=={TF_TESTED}"
    )


def warn_if_untested(installed: str) -> None:
    """Log ``tf_note`` once per process (a worker may load many models)."""
    note = tf_note(installed)
    if note is not None and installed not in _warned:
        _warned.add(installed)
        log.warning(note)


class DirectCall:
    """A signature's function called one level below ``fn(**inputs)``: one TF eager
    execute of the traced function, inputs wrapped as eager tensors in the signature's
    flat order (inputs sorted by name, as ``tf.nest`` flattens the keyword arguments),
    outputs read back in the same order.

    Why: ``fn(**inputs)`` spends most of a small model's call in Python (argument
    binding, structure checks, nest packing; ~340 us per batch-8 call of the digits CNN
    here against ~190 us this way), and that Python holds the GIL the worker's event
    loop needs. It leans on TensorFlow internals (``_inference_function``, eager
    ``quick_execute``), so ``TFServable`` builds it only after checking it returns
    exactly what ``fn(**inputs)`` returns on a sample, and falls back to ``fn`` for any
    request it fails on (which also gives that request TF's own error message).
    """

    def __init__(self, fn: Any, inputs: list[str], outputs: list[str]) -> None:
        from tensorflow.python.eager import context, execute
        from tensorflow.python.framework import ops

        ctx = context.context()
        ctx.ensure_initialized()
        self._ctx = ctx
        self._execute = execute.quick_execute
        self._tensor = ops.EagerTensor
        self._name = fn._inference_function.name
        self._captured = list(fn.captured_inputs)
        # the call options TF's own call passes (executor type, session config), read once
        self._attrs = tuple(itertools.chain(*ctx.function_call_options.as_attrs().items()))
        self.inputs = inputs
        self.outputs = outputs

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        device = self._ctx.device_name
        flat = [self._tensor(arrays[k], device, None) for k in self.inputs]
        out = self._execute(
            self._name, len(self.outputs), flat + self._captured, self._attrs, self._ctx
        )
        return {k: t._numpy() for k, t in zip(self.outputs, out)}
