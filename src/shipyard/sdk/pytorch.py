"""shipyard.pytorch.PyTorch: sagemaker.pytorch.PyTorch on shipyard."""

from __future__ import annotations

from typing import Any

from shipyard.sdk.estimator import Framework


class PyTorch(Framework):
    _framework = "pytorch"
    _default_base_job_name = "pytorch-training"

    def __init__(
        self,
        entry_point: str | None = None,
        framework_version: str | None = None,
        py_version: str | None = None,
        distribution: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            entry_point=entry_point,
            framework_version=framework_version,
            py_version=py_version,
            distribution=distribution,
            **kwargs,
        )
