"""Run a function on a module right after it is first imported, without importing it early.

The hooks shipyard loads into a job's processes (variable placement in the PS chief,
the Keras fix in multi-worker mirrored jobs, the step timing of Keras, TF1 sessions and
torch DDP) must not import TensorFlow, Keras or torch themselves: a script that never uses them pays nothing, and a script that sets
``TF_USE_LEGACY_KERAS`` after start-up still gets the Keras it asked for. A meta-path
finder sees the target module's import, lets the real loader run it, then calls the
hook on the executed module.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # aliases are strings: job processes may run in Python 3.7/3.8
    from typing import TypeAlias

Hook: TypeAlias = "Callable[[ModuleType], None]"


class _Watcher(importlib.abc.MetaPathFinder):
    def __init__(self, hooks: dict[str, Hook]) -> None:
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:

                def exec_module(module, _exec=spec.loader.exec_module, _hook=hook):
                    _exec(module)
                    _hook(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def when_imported(hooks: dict[str, Hook]) -> None:
    """Call ``hooks[name](module)`` once ``name`` has been imported and executed.

    A module already imported (say, by another ``sitecustomize``) is hooked at once.
    """
    pending = {}
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, _Watcher(pending))
