"""Frameworks a test module names at its top, imported only when a test uses them.

Collecting the suite imports no TensorFlow, torch or Ray (each costs seconds to tens of
seconds of import; ``tests/unit/house/test_collection.py`` holds the unit tier to it). A
module that used ``torch = pytest.importorskip("torch")`` at its top writes instead::

    from tests.lazy import lazy, needs

    pytestmark = needs("torch")  # skipped at collection when torch is not installed
    torch = lazy("torch")  # imported by the first test that touches torch.<anything>

``needs`` asks the import system whether the package is there (``find_spec``: no import);
``lazy``'s first attribute access runs ``pytest.importorskip``, so a package that is
present but fails to import still skips the test, as the module-level call did.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest


def installed(name: str) -> bool:
    """Whether ``import name`` would find a module, without importing it (a dotted name
    imports its parents, so only the top-level package is looked up)."""
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def needs(*names: str) -> pytest.MarkDecorator:
    """A skip mark for a module or test that needs these packages installed."""
    missing = [n for n in names if not installed(n)]
    return pytest.mark.skipif(bool(missing), reason=f"could not import {', '.join(missing)}")


# what collection asks of every name in a test module (pytest: ``__test__``, ``__bases__``,
# ``_mock_name``; inspect.unwrap: ``__wrapped__``): answered without importing the module
_ASKED_AT_COLLECTION = ("_mock_", "_pytest")
_MODULE_DUNDERS = frozenset({"__version__", "__file__", "__path__", "__spec__", "__name__"})


class LazyModule:
    """Stands for a module; the first attribute access imports it (or skips the test)."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_lazy_name", name)

    def _lazy_load(self) -> Any:
        return pytest.importorskip(object.__getattribute__(self, "_lazy_name"))

    def __getattr__(self, attr: str) -> Any:
        dunder = attr.startswith("__") and attr.endswith("__")
        if (dunder and attr not in _MODULE_DUNDERS) or attr.startswith(_ASKED_AT_COLLECTION):
            raise AttributeError(attr)
        return getattr(self._lazy_load(), attr)

    def __repr__(self) -> str:
        return f"<lazy module {object.__getattribute__(self, '_lazy_name')!r}>"


def lazy(name: str) -> Any:
    """A stand-in for ``import name``, imported on first use (see the module's docstring)."""
    return LazyModule(name)
