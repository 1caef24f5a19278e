"""Stand-in for the ``sagemaker_tensorflow`` package (sagemaker-tensorflow-extensions).

shipyard puts the directory holding this package on a job's PYTHONPATH only when the
real package is not installed, so ``from sagemaker_tensorflow import PipeModeDataset``
in an unmodified SageMaker script reads shipyard's Pipe channels.
"""

from shipyard.data.tensorflow import PipeModeDataset, PipeModeDatasetException

__all__ = ["PipeModeDataset", "PipeModeDatasetException"]
