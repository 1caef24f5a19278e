"""The ``horovod`` shim: put its parent directory (``shipyard.horovod.shim_path()``) first on
PYTHONPATH and unmodified scripts' ``import horovod.torch as hvd`` (``horovod.tensorflow``,
``horovod.tensorflow.keras``, ``horovod.keras``, ``horovod.common.exceptions``, ...) get the
matching ``shipyard.horovod`` module: the very same module object, so there is one engine
and one set of classes.

When a real Horovod is installed further down sys.path, this package steps aside and loads
it instead (set ``SHIPYARD_HOROVOD_SHIM=force`` to use shipyard's anyway). One line on
stderr (rank 0 only) says which one was used.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

from shipyard import settings

_SHIM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# horovod.X -> shipyard.horovod.Y where the names differ; everything else maps 1:1.
_RENAMES = {
    "horovod.common": "shipyard.horovod",
    "horovod.common.exceptions": "shipyard.horovod.errors",
    "horovod.common.basics": "shipyard.horovod",
    "horovod.common.util": "shipyard.horovod",
}


def _rank0() -> bool:
    for key in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK", "RANK"):
        if key in os.environ:
            return os.environ[key] == "0"
    return True


def _find_real():
    if (settings.optional_text("SHIPYARD_HOROVOD_SHIM") or "").lower() == "force":
        return None
    paths = []
    for p in sys.path:
        try:
            if os.path.abspath(p or os.getcwd()) == _SHIM_DIR:
                continue
        except Exception:  # noqa: BLE001, S112 - best-effort probe
            continue
        paths.append(p)
    try:
        return importlib.machinery.PathFinder.find_spec("horovod", paths)
    except Exception:  # noqa: BLE001 - best-effort probe
        return None


def _target(fullname: str) -> str:
    return _RENAMES.get(fullname, "shipyard." + fullname)


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``horovod.<x>`` -> the module object ``shipyard.horovod.<x>``."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("horovod."):
            return None
        name = _target(fullname)
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: shipyard.horovod (standing in for Horovod) does not provide it. "
                "Provided: horovod.torch, horovod.tensorflow, horovod.tensorflow.keras, horovod.keras, "
                "horovod.common.exceptions (no elastic, spark, ray or runner).",
                name=fullname,
            )
        return importlib.machinery.ModuleSpec(
            fullname, self, is_package=spec.submodule_search_locations is not None
        )

    def __init__(self):
        self._own_specs = {}

    def create_module(self, spec):
        module = importlib.import_module(_target(spec.name))
        self._own_specs[spec.name] = getattr(module, "__spec__", None)
        return module

    def exec_module(self, module):
        # The import system stamped our alias spec on the shared module; give it its own back.
        own = self._own_specs.pop(getattr(module.__spec__, "name", None), None)
        if own is not None:
            module.__spec__ = own


_real = _find_real()
if _real is not None and _real.origin and _real.submodule_search_locations:
    # A real Horovod is installed: become it.
    __path__[:] = list(_real.submodule_search_locations)
    __file__ = _real.origin
    if _rank0():
        sys.stderr.write(
            f"shipyard: using the installed Horovod at {os.path.dirname(_real.origin)}\n"
        )
    with open(_real.origin, "rb") as _fh:
        exec(compile(_fh.read(), _real.origin, "exec"), globals())  # noqa: S102 - become the real package
else:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    __version__ = "0.28.1+shipyard"
    if _rank0():
        sys.stderr.write(
            "shipyard: no Horovod installed; 'import horovod' resolves to shipyard.horovod "
            "(Horovod-compatible API on MPI)\n"
        )
        sys.stderr.flush()
