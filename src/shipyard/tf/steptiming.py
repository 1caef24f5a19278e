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
epoch as warm-up. Its W workers run the epoch's steps side by side, so a worker's step
(what the planner scales, as it does every other source's) is W times the epoch over its
steps: Keras' own "ms/step" is the cluster's interval, W times shorter. A ``fit`` whose callbacks are passed positionally
or a ``CallbackList`` is left alone.

TF1 graphs (``tf.compat.v1.Session``, ``MonitoredTrainingSession``, whose wrapped
sessions all end in ``BaseSession.run``): when ``tensorflow.python.client.session`` is
imported, ``BaseSession.run`` is wrapped; a run is a step when what it fetches depends on
a training op: an optimizer's kernel (``ApplyAdam``, ``ResourceApplyGradientDescent``,
...: every ``tf.compat.v1.train`` optimizer ends in one) or an op of the graph's
``train_op`` collection. Summary, evaluation and initialization runs are not steps. The
answer is kept per graph and fetch names, so a loop pays one graph walk.

Every library of a process times into one recorder (``runtime/steptiming.shared``): a
Horovod allreduce inside the step adds its communication to it. Python 3.7-compatible:
jobs may run old frameworks.
"""

import json
import os
import time

from shipyard.runtime.steptiming import shared
from shipyard.tf import postimport

MODULES = ("keras", "tf_keras")
SESSION_MODULE = "tensorflow.python.client.session"
KERAS_SOURCE = "keras fit"
SESSION_SOURCE = "tf session"
# the kernels of tf.compat.v1.train's (and TF1 Keras') optimizers: a run that reaches one
# trains the model
TRAIN_KERNELS = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")
WALK_LIMIT = 200000  # ops looked at per distinct fetch (a graph this size is rare)
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
            self._shipyard_workers = _workers(strategy) if self._shipyard_ahead else 1
            self._shipyard_epochs = 0

        def on_epoch_begin(self, epoch, logs=None):
            self._shipyard_epoch = (time.perf_counter(), 0)
            self._shipyard_steps_end = None

        def on_test_begin(self, logs=None):
            # fit's validation runs after the epoch's steps, before on_epoch_end
            if getattr(self, "_shipyard_steps_end", 0) is None:
                self._shipyard_steps_end = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            recorder = self._shipyard_recorder
            if not getattr(self, "_shipyard_ahead", False) and recorder.claim(KERAS_SOURCE):
                recorder.begin()

        def on_train_batch_end(self, batch, logs=None):
            recorder = self._shipyard_recorder
            if not getattr(self, "_shipyard_ahead", False) and recorder.claim(KERAS_SOURCE):
                recorder.end()
            elif hasattr(self, "_shipyard_epoch"):
                start, count = self._shipyard_epoch
                self._shipyard_epoch = (start, count + 1)

        def on_epoch_end(self, epoch, logs=None):
            if getattr(self, "_shipyard_ahead", False) and hasattr(self, "_shipyard_epoch"):
                start, count = self._shipyard_epoch
                end = getattr(self, "_shipyard_steps_end", None) or time.perf_counter()
                first = self._shipyard_epochs == 0
                self._shipyard_epochs += 1
                if self._shipyard_recorder.claim(KERAS_SOURCE):
                    # W workers ran the epoch's steps side by side: each one's step took
                    # W times the interval at which the cluster finished them
                    seconds = (end - start) * self._shipyard_workers
                    self._shipyard_recorder.add_group(seconds, count, first)

        def on_train_end(self, logs=None):
            self._shipyard_recorder.flush()

    return ShipyardStepTimes


def _workers(strategy):
    """How many workers a coordinator's steps run on (its cluster's ``worker`` tasks)."""
    try:
        spec = strategy._cluster_resolver.cluster_spec()
        return max(1, int(spec.num_tasks("worker")))
    except (AttributeError, ValueError, TypeError):
        pass
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
        return max(1, len(cluster.get("worker") or []))
    except (ValueError, AttributeError):
        return 1


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


def _fetched_ops(fetches, graph, out):
    """The operations ``fetches`` names (a tensor, an op, a name, nested in lists,
    tuples and dicts, as ``Session.run`` takes them)."""
    if isinstance(fetches, (list, tuple)):
        for item in fetches:
            _fetched_ops(item, graph, out)
    elif isinstance(fetches, dict):
        for item in fetches.values():
            _fetched_ops(item, graph, out)
    elif isinstance(fetches, str):
        try:
            _fetched_ops(graph.as_graph_element(fetches), graph, out)
        except (KeyError, ValueError, TypeError):
            pass
    elif hasattr(fetches, "control_inputs") and hasattr(fetches, "inputs"):
        out.append(fetches)  # an Operation
    elif hasattr(fetches, "op"):
        _fetched_ops(fetches.op, graph, out)  # a Tensor (or SparseTensor's values)


def _trains(ops, graph):
    """Whether running ``ops`` runs a training op (an optimizer's kernel, or an op of
    the graph's ``train_op`` collection)."""
    chosen = graph.get_collection("train_op")
    marked = {id(getattr(o, "op", o)) for o in chosen}  # a tensor's op, or the op
    seen = set()
    todo = list(ops)
    while todo and len(seen) < WALK_LIMIT:
        op = todo.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        if id(op) in marked or str(getattr(op, "type", "")).startswith(TRAIN_KERNELS):
            return True
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return False


def _patch_session(module):
    """Wrap ``BaseSession.run`` to time the runs that train."""
    base = getattr(module, "BaseSession", None)
    run = getattr(base, "run", None)
    if run is None or getattr(run, "_shipyard_steps", False) or _recorder is None:
        return
    known = {}  # (graph, fetch names) -> whether such a run trains

    def is_step(session, fetches):
        graph = session.graph
        ops = []
        _fetched_ops(fetches, graph, ops)
        key = (id(graph), tuple(sorted(o.name for o in ops)))
        answer = known.get(key)
        if answer is None:
            answer = known[key] = _trains(ops, graph)
        return answer

    def timed_run(self, fetches, *args, **kwargs):
        try:
            step = is_step(self, fetches) and _recorder.claim(SESSION_SOURCE)
        except Exception:  # noqa: BLE001 - never fail the user's run over timing it
            step = False
        if not step:
            return run(self, fetches, *args, **kwargs)
        _recorder.begin()
        result = run(self, fetches, *args, **kwargs)
        _recorder.end()
        return result

    timed_run._shipyard_steps = True
    timed_run.__doc__ = run.__doc__
    timed_run.__name__ = "run"
    base.run = timed_run


def install(path):
    """Record every Keras ``fit``'s and TF1 session's training steps of this process
    into ``path``."""
    global _recorder
    if _recorder is not None or not path:
        return
    _recorder = shared(path, KERAS_SOURCE, os.environ.get("CURRENT_HOST"))
    hooks = {name: _patch for name in MODULES}
    hooks[SESSION_MODULE] = _patch_session
    postimport.when_imported(hooks)
