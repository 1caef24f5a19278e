"""TensorFlow's own distributions, run the SageMaker way: parameter servers and
multi-worker mirrored strategy.

Import-light on purpose (no TensorFlow at import time): the agent plans with
:mod:`shipyard.tf.cluster`; only the processes it starts (``shipyard.tf.server``,
the user's script) import TensorFlow.
"""

import importlib.util

EXTRA = "pip install 'shipyard[tensorflow]'"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here, without importing it (TF takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
