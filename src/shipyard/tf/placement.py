"""Where TensorFlow put each variable, recorded from inside the chief without script edits.

Installed by ``shipyard/tf/_hook/sitecustomize.py`` when ``SHIPYARD_TF_PLACEMENT_FILE``
is set (only in the chief/master process). It waits for TensorFlow's variable modules to
be imported -- nothing is imported early, scripts that never use TensorFlow pay nothing --
then wraps the constructors of resource variables (TF2, ``ParameterServerStrategy``,
Keras) and reference variables (TF1 graphs placed by ``replica_device_setter``). Each
new variable's name, shape, dtype, device and trainability is recorded as TensorFlow
placed it (the device string is TensorFlow's own decision: round-robin by creation
order, a ``variable_partitioner``'s shards, a custom device function); the records are
written as JSON when the process exits.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import threading
from types import ModuleType
from typing import Any

from shipyard.tf import postimport

PLACEMENT_ENV = "SHIPYARD_TF_PLACEMENT_FILE"
_PS_TASK = re.compile(r"/job:ps(?:/replica:\d+)?/task:(\d+)")
#: module -> the classes whose constructors to wrap, first found wins (TensorFlow before
#: 1.14 has ResourceVariable and no BaseResourceVariable; RefVariable lived in variables.py
#: until ref_variable.py took it over in TF 2.x)
_TARGETS = {
    "tensorflow.python.ops.resource_variable_ops": ("BaseResourceVariable", "ResourceVariable"),
    "tensorflow.python.ops.ref_variable": ("RefVariable",),
    "tensorflow.python.ops.variables": ("RefVariable",),
}
_SKIP_CLASSES = {"_UnreadVariable"}  # transient read handles of an existing variable


def ps_task_of(device: str) -> int | None:
    match = _PS_TASK.search(device or "")
    return int(match.group(1)) if match else None


class Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.variables: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, var: Any) -> None:
        try:
            shape = var.shape.as_list() if var.shape.rank is not None else None
            dtype = var.dtype.base_dtype
            numel = 1
            for dim in shape or []:
                numel *= dim if dim is not None else 0
            entry = {
                "name": var.name,
                "shape": shape,
                "dtype": dtype.name,
                "bytes": numel * dtype.size if shape is not None else 0,
                "device": var.device or "",
                "trainable": bool(var.trainable),
            }
        except (AttributeError, TypeError, ValueError):  # never break the model over a report
            return
        entry["ps_task"] = ps_task_of(entry["device"])
        with self._lock:
            self.variables.append(entry)

    def write(self) -> None:
        with self._lock:
            data = {
                "pid": os.getpid(),
                # the release the script ran (the report's advice differs for TF 1.x)
                "tensorflow": getattr(sys.modules.get("tensorflow"), "__version__", None),
                "variables": list(self.variables),
            }
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
            os.replace(tmp, self.path)
        except OSError:
            pass


def _wrap(cls: type, recorder: Recorder) -> None:
    original = cls.__init__  # type: ignore[misc]
    if getattr(original, "_shipyard_placement", False):  # one class reached by two names
        return

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if type(self).__name__ not in _SKIP_CLASSES:
            recorder.record(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._shipyard_placement = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def _wrap_targets(recorder: Recorder) -> dict[str, postimport.Hook]:
    def hook_for(class_names: tuple[str, ...]) -> postimport.Hook:
        def hook(module: ModuleType) -> None:
            for cls_name in class_names:
                cls = getattr(module, cls_name, None)
                if isinstance(cls, type):
                    _wrap(cls, recorder)
                    return

        return hook

    return {name: hook_for(classes) for name, classes in _TARGETS.items()}


def install(path: str) -> Recorder:
    recorder = Recorder(path)
    postimport.when_imported(_wrap_targets(recorder))
    atexit.register(recorder.write)
    return recorder


def read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
