"""shipyard: hooks for TensorFlow jobs' processes, installed without importing TensorFlow.

On PYTHONPATH right after shipyard's job-process ``sitecustomize`` (which chains here),
set by the runners:

* ``SHIPYARD_TF_PLACEMENT_FILE`` (parameter_server chief): record TensorFlow's
  variable placement (shipyard/tf/placement.py);
* ``SHIPYARD_KERAS_MWMS_COMPAT`` (multi_worker_mirrored_strategy): make Keras 3
  ``model.fit`` work with more than one worker (shipyard/tf/keras_compat.py);
* ``SHIPYARD_REPORT_PATH`` (every job process): time Keras ``fit``'s training steps and
  TF1 ``Session.run``'s training runs into a file beside the report
  (shipyard/tf/steptiming.py).

The agent puts it on every job process's PYTHONPATH (the TF runners name it once more);
each part is imported only when its variable is set. Chains on to the next
``sitecustomize`` on sys.path after this directory (skipping shipyard's own) so a user's
own customization (or the DDP hook) still runs, and no hook runs twice.
"""

import os as _os


def _install() -> None:
    placement_file = _os.environ.get("SHIPYARD_TF_PLACEMENT_FILE")
    keras_compat = _os.environ.get("SHIPYARD_KERAS_MWMS_COMPAT")
    report_path = _os.environ.get("SHIPYARD_REPORT_PATH")
    if not placement_file and not keras_compat and not report_path:
        return
    try:
        if report_path:
            from shipyard.runtime import steptiming as _files
            from shipyard.tf import steptiming as _steps

            _steps.install(_files.path_beside(report_path))
        if placement_file:
            from shipyard.tf import placement

            placement.install(placement_file)
        if keras_compat:
            from shipyard.tf import keras_compat as _compat

            _compat.install()
    except ImportError:
        return


def _chain() -> None:
    try:
        from shipyard.runtime.sitehooks import chain_after
    except ImportError:
        return
    chain_after(_os.path.dirname(_os.path.abspath(__file__)))


_install()
_chain()
