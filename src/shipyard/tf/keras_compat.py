"""Keras 3 ``model.fit`` under MultiWorkerMirroredStrategy with more than one worker.

Two faults in Keras 3.15's TensorFlow trainer (keras/src/backend/tensorflow/trainer.py;
the first is keras-team/keras#20585) stop ``fit``, ``evaluate`` and ``predict`` when
``CollectiveAllReduceStrategy`` is in multi-worker mode:

1. ``TensorFlowTrainer._maybe_symbolic_build`` builds the model from the distributed
   iterator's first batch -- a structure of ``PerReplica`` values, ``(x, y)`` -- by
   ``strategy.reduce("MEAN", batch, axis=None)`` on the whole structure.
   ``MirroredStrategy`` on one machine gets away with it; the multi-worker
   ``CollectiveAllReduce.reduce`` takes one tensor only: ``ValueError: Attempt to
   convert a value (PerReplica:{...}) ... to a Tensor``. The build needs only shapes
   and dtypes; a mean of input batches across workers is not needed at all.
2. ``reduce_per_replica`` (each step's logs: loss and metric results, scalars)
   reduces in multi-worker mode with ``strategy.reduce("MEAN", v, axis=0)``: axis 0
   of a scalar: ``ValueError: Invalid reduction dimension 0 for input with 0
   dimensions``. One machine's path averages over replicas, i.e. ``axis=None``.
3. With ``steps_per_execution > 1`` each step runs inside a ``tf.cond`` in a
   ``tf.while_loop`` (``_make_function``'s ``multi_step_on_iterator``); the step's
   cross-worker collectives fail there: ``You must feed a value for placeholder
   tensor '.../while/cond/Placeholder'``.

The fixes: (1) build from this worker's own replica values (the same per-replica
shapes on every worker) through Keras' own method; (2) average the logs across
workers with ``axis=None``; (3) ``fit``/``evaluate``/``predict`` set
``steps_per_execution`` to 1 in multi-worker mode, saying so (the same training, only
dispatched one step per call). Every other call goes to the original unchanged: the
train step and its gradient all-reduce are Keras'.

Guarded by what the installed Keras does rather than a version list: each fix applies
only when the faulty statement is in that function's source (a Keras that changed it
is left alone), and only in processes of a ``multi_worker_mirrored_strategy`` job with
more than one instance (the runner sets :data:`COMPAT_ENV` and loads
``shipyard/tf/_hook``). Applied fixes are logged in one line (and a lowered
``steps_per_execution`` in another, when it happens).
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any

from shipyard.tf import postimport

COMPAT_ENV = "SHIPYARD_KERAS_MWMS_COMPAT"
TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
ISSUE = "keras-team/keras#20585"


# Each fix: the module attribute it replaces, and the statement of the bug that must be in
# that attribute's source for the fix to apply (a Keras that changed it is left alone).
# (compared with all whitespace removed).
SYMBOLIC_BUILD_BUG = 'self.distribute_strategy.reduce("MEAN",maybe_distributed_data_batch,'
METRICS_MEAN_BUG = 'strategy.reduce("MEAN",v,axis=0)'
MULTI_STEP_LOOP = "lambda:iterator.get_next_as_optional(),"
RUN_METHODS = ("fit", "evaluate", "predict")


def _source(obj: Any) -> str:
    """The source of ``obj`` without any whitespace ("" when it cannot be read)."""
    try:
        return "".join(inspect.getsource(obj).split())
    except (OSError, TypeError):
        return ""


def _multi_worker(strategy: Any) -> bool:
    extended = getattr(strategy, "extended", None)
    in_mode = getattr(extended, "_in_multi_worker_mode", None)
    return callable(in_mode) and bool(in_mode())


def _local_batch(strategy: Any, batch: Any) -> Any:
    """This worker's first replica's values: same shapes and dtypes, no collective."""
    import tensorflow as tf

    def local(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    return tf.nest.map_structure(local, batch)


def _fix_symbolic_build(trainer_cls: type) -> bool:
    """Build from this worker's own first batch instead of reducing it across workers."""
    original = trainer_cls.__dict__.get("_maybe_symbolic_build")
    if original is None or SYMBOLIC_BUILD_BUG not in _source(original):
        return False

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None or not _multi_worker(strategy):
            return original(self, iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:  # what Keras does: the epoch's first batch
            data_batch = _local_batch(strategy, next(it))
            break
        return original(self, iterator=None, data_batch=data_batch)

    _maybe_symbolic_build.__wrapped__ = original  # type: ignore[attr-defined]
    trainer_cls._maybe_symbolic_build = _maybe_symbolic_build  # type: ignore[attr-defined]
    return True


def _fix_metrics_mean(module: ModuleType) -> bool:
    """Average each step's (scalar) logs across workers element-wise (``axis=None``)."""
    original = getattr(module, "reduce_per_replica", None)
    if original is None or METRICS_MEAN_BUG not in _source(original):
        return False

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and _multi_worker(strategy):
            import tensorflow as tf

            if not isinstance(strategy, tf.distribute.TPUStrategy):
                return tf.nest.map_structure(
                    lambda v: strategy.reduce("MEAN", v, axis=None), values
                )
        return original(values, strategy, reduction)

    reduce_per_replica.__wrapped__ = original  # type: ignore[attr-defined]
    module.reduce_per_replica = reduce_per_replica  # type: ignore[attr-defined]
    return True


def _fix_steps_per_execution(trainer_cls: type) -> bool:
    """Run one step per execution in multi-worker mode (each step's collectives would
    otherwise sit in a ``tf.cond`` inside Keras' ``tf.while_loop``)."""
    make = trainer_cls.__dict__.get("_make_function")
    if make is None or MULTI_STEP_LOOP not in _source(make):
        return False

    def guard(run):
        def method(self, *args, **kwargs):
            strategy = getattr(self, "_distribute_strategy", None)
            if (
                getattr(self, "steps_per_execution", 1) > 1
                and strategy is not None
                and _multi_worker(strategy)
            ):
                print(
                    f"shipyard: steps_per_execution={self.steps_per_execution} -> 1 under "
                    "MultiWorkerMirroredStrategy with more than one worker (Keras 3 "
                    "cannot loop collective steps there); same training, one step per "
                    "call",
                    file=sys.stderr,
                    flush=True,
                )
                self.steps_per_execution = 1
                self.train_function = self.test_function = self.predict_function = None
            return run(self, *args, **kwargs)

        method.__wrapped__ = run
        method.__name__, method.__doc__ = run.__name__, run.__doc__
        return method

    for name in RUN_METHODS:
        setattr(trainer_cls, name, guard(trainer_cls.__dict__[name]))
    return True


def patch(module: ModuleType) -> list[str]:
    """Apply the fixes this Keras needs to its executed TensorFlow trainer module.

    Returns what was fixed (empty: nothing needed, e.g. a Keras without the bug).
    """
    fixed = []
    trainer_cls = getattr(module, "TensorFlowTrainer", None)
    if isinstance(trainer_cls, type) and _fix_symbolic_build(trainer_cls):
        fixed.append("first batch built locally, not strategy.reduce'd")
    if _fix_metrics_mean(module):
        fixed.append("step logs averaged across workers with axis=None")
    if isinstance(trainer_cls, type) and _fix_steps_per_execution(trainer_cls):
        fixed.append("steps_per_execution > 1 run as 1")
    return fixed


def _on_import(module: ModuleType) -> None:
    fixed = patch(module)
    if fixed:
        version = getattr(sys.modules.get("keras.src.version"), "__version__", "?")
        print(
            f"shipyard: Keras {version} patched for model.fit under "
            f"MultiWorkerMirroredStrategy ({ISSUE}): " + "; ".join(fixed),
            file=sys.stderr,
            flush=True,
        )


def install() -> None:
    """Patch Keras' TensorFlow trainer when (and if) the script imports it."""
    postimport.when_imported({TRAINER_MODULE: _on_import})
