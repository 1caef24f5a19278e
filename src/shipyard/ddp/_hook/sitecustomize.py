"""shipyard: the torch DDP step-timing hook of a job's processes, installed without torch.

On PYTHONPATH after shipyard's job-process ``sitecustomize`` (which chains here, maybe
through TensorFlow's hook), set by the agent for every job process: with
``SHIPYARD_REPORT_PATH`` set (inside a job), time each ``DistributedDataParallel`` step
into a file beside the report (shipyard/ddp/steptiming.py). Nothing is imported until
the script imports torch's DDP.

Chains on to the next ``sitecustomize`` on sys.path after this directory (skipping
shipyard's own) so a user's own customization still runs, and no hook runs twice.
"""

import os as _os
import sys as _sys


def _install() -> None:
    report_path = _os.environ.get("SHIPYARD_REPORT_PATH")
    if not report_path:
        return
    try:
        from shipyard.ddp import steptiming as _steps
        from shipyard.runtime import steptiming as _files
    except ImportError:
        return
    _steps.install(_files.path_beside(report_path))


def _chain() -> None:
    here = _os.path.dirname(_os.path.abspath(__file__))
    site = _os.path.join(_os.path.dirname(_os.path.dirname(here)), "runtime", "_site")
    paths = [_os.path.abspath(p or ".") for p in _sys.path]
    after = len(paths) - paths[::-1].index(here) if here in paths else 0
    others = [p for p in _sys.path[after:] if _os.path.abspath(p or ".") not in (here, site)]
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install()
_chain()
