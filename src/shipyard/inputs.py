"""``shipyard.inputs`` (as ``sagemaker.inputs``)."""

from shipyard.sdk.inputs import TrainingInput

__all__ = ["TrainingInput"]
