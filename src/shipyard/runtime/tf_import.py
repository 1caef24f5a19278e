"""Import TensorFlow without Keras, for shipyard's own TensorFlow processes (the ps and
worker servers of shipyard.tf, the model server's TensorFlow servables).

TensorFlow 2.16 and later import Keras while ``import tensorflow`` runs ("an eager load
for Keras' code", inside a try/except ImportError), and Keras 3 imports scikit-learn,
SciPy and pandas when they are installed (its scikit-learn wrappers). A parameter server
or a serving-only worker (``python -m shipyard.tf.server --serve``) runs no Keras code:
the chief sends it graph functions of TensorFlow's own ops; a model server calls a
SavedModel's signatures, which ``tf.saved_model.load`` restores without Keras (a user's
inference handlers that use Keras import it as usual, once TensorFlow is in). Refusing
Keras while TensorFlow imports saves about a third of the CPU such a process spends
importing it (9.0 -> 5.8 s on the test machine, docs/decisions.md), in every ps and
worker server of every parameter-server job and every TensorFlow model server.

A user's training script imports TensorFlow as usual. Older TensorFlows are imported
plainly: their Keras import is not known to be guarded.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

#: the top-level packages refused while TensorFlow imports
KERAS = ("keras", "tf_keras")
#: the first TensorFlow whose ``__init__`` imports Keras inside ``try/except ImportError``
FIRST_GUARDED = (2, 16)


class _Refuse(importlib.abc.Loader):
    """A loader that fails the import: the finder still reports where the package is
    (TensorFlow reads a spec's origin to extend its own ``__path__``), but running it
    raises ImportError."""

    def create_module(self, spec: Any) -> None:
        raise ImportError(
            f"{spec.name} is not imported in this process (shipyard.runtime.tf_import)"
        )

    def exec_module(self, module: Any) -> None:  # never reached: create_module raises
        raise ImportError(f"{module.__name__} is not imported in this process")


class _Refuser:
    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".", 1)[0] not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _Refuse()
        return spec


@contextmanager
def refusing(names: Sequence[str]) -> Iterator[None]:
    """While inside, importing any of the top-level packages ``names`` (or their
    submodules) raises ImportError; ``importlib.util.find_spec`` still finds them. Once
    out, they import normally: a refused import leaves nothing in ``sys.modules``."""
    finder = _Refuser(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def guarded(version: str) -> bool:
    """Whether this TensorFlow version's own import survives Keras being refused."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            return False
        parts.append(int(digits))
    return tuple(parts) >= FIRST_GUARDED


def installed_version() -> str | None:
    """The installed TensorFlow's version, read from its metadata (no import); None
    where it cannot be read (Python 3.7, which framework environments run, has no
    importlib.metadata)."""
    try:
        from importlib import metadata
    except ImportError:
        return None

    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-intel"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def import_tensorflow() -> Any:
    """``import tensorflow``, without Keras where the version allows it."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    version = installed_version()
    if version is None or not guarded(version):
        import tensorflow

        return tensorflow
    with refusing(KERAS):
        import tensorflow
    return tensorflow
