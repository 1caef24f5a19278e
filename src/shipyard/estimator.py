"""``shipyard.estimator`` (as ``sagemaker.estimator``): Estimator, Framework."""

from shipyard.sdk.estimator import Estimator, EstimatorBase, Framework

__all__ = ["Estimator", "EstimatorBase", "Framework"]
