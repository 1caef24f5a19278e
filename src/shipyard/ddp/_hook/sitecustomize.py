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
    try:
        from shipyard.runtime.sitehooks import chain_after
    except ImportError:
        return
    chain_after(_os.path.dirname(_os.path.abspath(__file__)))


_install()
_chain()
