"""shipyard: SageMaker-style distributed training and hosting, self-hosted.

Change ``import sagemaker`` to ``import shipyard`` and the estimators, inputs and
describe() work the same, on local processes. Exports are lazy so that libraries
used inside training scripts (shipyard.ps, shipyard.horovod) import nothing extra.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Estimator": "shipyard.sdk.estimator",
    "EstimatorBase": "shipyard.sdk.estimator",
    "Framework": "shipyard.sdk.estimator",
    "TensorFlow": "shipyard.sdk.tensorflow",
    "PyTorch": "shipyard.sdk.pytorch",
    "TrainingInput": "shipyard.sdk.inputs",
    "Session": "shipyard.sdk.session",
    "Model": "shipyard.sdk.model",
    "TensorFlowModel": "shipyard.sdk.model",
    "PyTorchModel": "shipyard.sdk.model",
    "Predictor": "shipyard.sdk.predictor",
    "TensorFlowPredictor": "shipyard.sdk.predictor",
    "PyTorchPredictor": "shipyard.sdk.predictor",
    "Transformer": "shipyard.sdk.transformer",
    "TrainingJobAnalytics": "shipyard.sdk.analytics",
    "LocalSession": "shipyard.sdk.session",
    "get_execution_role": "shipyard.sdk.session",
    "s3_input": "shipyard.sdk.inputs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'shipyard' has no attribute {name!r}")
