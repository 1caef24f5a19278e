"""Keras ``fit``'s step times, recorded with no change to the script.

Loaded by shipyard's TensorFlow ``sitecustomize`` (``tf/_hook``) in the processes that run
the user's script; it imports neither TensorFlow nor Keras: when ``keras`` (Keras 2 or 3)
or ``tf_keras`` (what ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras``) is imported, its
``Model.fit`` is wrapped to add one callback that times each training batch
(``on_train_batch_begin``/``end``) into a :class:`~shipyard.runtime.steptiming.StepRecorder`.
The callback declares ``_supports_tf_logs`` so Keras does not turn each batch's logs into
numbers for it (under ParameterServerStrategy that would wait for every step, and
tf_keras refuses other batch-level callbacks there). A coordinator schedules steps
ahead, so a batch's end there is only its scheduling (1.5 ms measured, where Keras'
own epoch line said 52 ms/step): under ParameterServerStrategy the callback times
whole epochs (Keras waits for the epoch's steps before ``on_epoch_end``, and before
the validation ``fit`` may run, which ``on_test_begin`` cuts off) and marks the first
epoch as warm-up. A ``fit`` whose callbacks are passed positionally
or a ``CallbackList`` is left alone. Python 3.7-compatible: jobs may run old frameworks.
"""

import os
import time

from shipyard.runtime.steptiming import StepRecorder
from shipyard.tf import postimport

MODULES = ("keras", "tf_keras")
_recorder = None


def _callback_class(module):
    """A ``Callback`` subclass of this Keras (each Keras checks its own base class)."""
    base = module.callbacks.Callback

    class ShipyardStepTimes(base):
        def __init__(self, recorder):
            super().__init__()
            # after the base's __init__, which sets it False on the instance
            self._supports_tf_logs = True
            self._shipyard_recorder = recorder

        def on_train_begin(self, logs=None):
            strategy = getattr(self.model, "distribute_strategy", None)
            # a coordinator (ParameterServerStrategy) schedules steps ahead: a batch's
            # end is its scheduling, an epoch's end waits for them all
            self._shipyard_ahead = bool(getattr(strategy, "_should_use_with_coordinator", False))
            self._shipyard_epochs = 0

        def on_epoch_begin(self, epoch, logs=None):
            self._shipyard_epoch = (time.perf_counter(), 0)
            self._shipyard_steps_end = None

        def on_test_begin(self, logs=None):
            # fit's validation runs after the epoch's steps, before on_epoch_end
            if getattr(self, "_shipyard_steps_end", 0) is None:
                self._shipyard_steps_end = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            if not getattr(self, "_shipyard_ahead", False):
                self._shipyard_recorder.begin()

        def on_train_batch_end(self, batch, logs=None):
            if not getattr(self, "_shipyard_ahead", False):
                self._shipyard_recorder.end()
            elif hasattr(self, "_shipyard_epoch"):
                start, count = self._shipyard_epoch
                self._shipyard_epoch = (start, count + 1)

        def on_epoch_end(self, epoch, logs=None):
            if getattr(self, "_shipyard_ahead", False) and hasattr(self, "_shipyard_epoch"):
                start, count = self._shipyard_epoch
                end = getattr(self, "_shipyard_steps_end", None) or time.perf_counter()
                first = self._shipyard_epochs == 0
                self._shipyard_epochs += 1
                self._shipyard_recorder.add_group(end - start, count, first)

        def on_train_end(self, logs=None):
            self._shipyard_recorder.flush()

    return ShipyardStepTimes


def _patch(module):
    """Wrap ``module.Model.fit`` to add the step-time callback."""
    model = getattr(module, "Model", None)
    fit = getattr(model, "fit", None)
    if fit is None or getattr(fit, "_shipyard_steps", False) or _recorder is None:
        return
    try:
        cls = _callback_class(module)
    except AttributeError:
        return

    def timed_fit(self, *args, **kwargs):
        given = kwargs.get("callbacks")
        # a list (or none), not passed positionally: a CallbackList is the user's own
        if len(args) < 6 and (given is None or isinstance(given, (list, tuple))):
            kwargs["callbacks"] = list(given or []) + [cls(_recorder)]
        return fit(self, *args, **kwargs)

    timed_fit._shipyard_steps = True
    timed_fit.__doc__ = fit.__doc__
    timed_fit.__name__ = "fit"
    model.fit = timed_fit


def install(path):
    """Record every Keras ``fit``'s training steps of this process into ``path``."""
    global _recorder
    if _recorder is not None:
        return
    _recorder = StepRecorder(path, "keras fit", os.environ.get("CURRENT_HOST"))
    postimport.when_imported({name: _patch for name in MODULES})
