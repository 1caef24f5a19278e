"""``shipyard.debugger.TensorBoardOutputConfig``: as ``sagemaker.debugger``'s.

What the training script writes under ``container_local_output_path`` (default
``/opt/ml/output/tensorboard``) is synced to ``<s3_output_path>/<job>/tensorboard-output``
while the job runs and once more when it ends; ``shipyard tensorboard JOB`` serves it.
"""

from __future__ import annotations

from typing import Any

from shipyard.spec import TENSORBOARD_LOCAL_PATH


class TensorBoardOutputConfig:
    def __init__(self, s3_output_path: str, container_local_output_path: str | None = None):
        self.s3_output_path = s3_output_path
        self.container_local_output_path = container_local_output_path

    def _to_request_dict(self) -> dict[str, Any]:
        """SageMaker's CreateTrainingJob ``TensorBoardOutputConfig`` field."""
        out: dict[str, Any] = {"S3OutputPath": self.s3_output_path}
        if self.container_local_output_path is not None:
            out["LocalPath"] = self.container_local_output_path
        return out


def tensorboard_spec(config: Any) -> dict[str, Any] | None:
    """A TensorBoardOutputConfig (ours, sagemaker's, or the request dict) -> spec fields."""
    if config is None:
        return None
    if isinstance(config, dict):
        s3, local = config.get("S3OutputPath"), config.get("LocalPath")
    else:
        s3 = getattr(config, "s3_output_path", None)
        local = getattr(config, "container_local_output_path", None)
    out: dict[str, Any] = {"s3_output_path": s3}
    if local:
        out["local_path"] = local
    return out  # validated (and refused with a clear message) by JobSpec


__all__ = ["TensorBoardOutputConfig", "TENSORBOARD_LOCAL_PATH", "tensorboard_spec"]
