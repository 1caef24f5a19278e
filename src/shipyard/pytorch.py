"""``shipyard.pytorch`` (as ``sagemaker.pytorch``)."""

from shipyard.sdk.pytorch import PyTorch

__all__ = ["PyTorch"]
