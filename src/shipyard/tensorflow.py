"""``shipyard.tensorflow`` (as ``sagemaker.tensorflow``)."""

from shipyard.sdk.tensorflow import TensorFlow

__all__ = ["TensorFlow"]
