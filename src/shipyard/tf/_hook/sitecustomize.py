"""shipyard: record TensorFlow's variable placement in the chief (see shipyard/tf/placement.py).

On PYTHONPATH right after the resolver shim (which chains here); active only when
SHIPYARD_TF_PLACEMENT_FILE is set. Chains on to the next ``sitecustomize`` on sys.path
(skipping the resolver's and this one) so a user's own customization still runs.
"""

import os as _os
import sys as _sys


def _install() -> None:
    path = _os.environ.get("SHIPYARD_TF_PLACEMENT_FILE")
    if not path:
        return
    try:
        from shipyard.tf import placement
    except ImportError:
        return
    placement.install(path)


def _chain() -> None:
    here = _os.path.dirname(_os.path.abspath(__file__))
    resolver = _os.path.join(_os.path.dirname(_os.path.dirname(here)), "agent", "_resolver")
    skip = {here, resolver}
    import importlib.machinery
    import importlib.util

    others = [p for p in _sys.path if _os.path.abspath(p or ".") not in skip]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install()
_chain()
