"""Where the ``sagemaker_tensorflow`` stand-in lives, and whether a job needs it."""

from __future__ import annotations

import importlib.util
import os


def sagemaker_tensorflow_path() -> str | None:
    """The directory to put on a job's PYTHONPATH so ``import sagemaker_tensorflow``
    finds shipyard's PipeModeDataset; None when the real package is installed (it is
    then left to win; its C++ op reads the same FIFOs)."""
    if importlib.util.find_spec("sagemaker_tensorflow") is not None:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shims")
