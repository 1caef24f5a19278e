"""shipyard.tensorflow.TensorFlow: sagemaker.tensorflow.TensorFlow on shipyard.

As the SageMaker SDK does, the script receives ``--model_dir``: here a directory
shared by all instances of the job (what SageMaker local mode uses), unless
``model_dir`` is given, or suppressed with ``model_dir=False``. SM_MODEL_DIR (what
becomes model.tar.gz) is separate, exactly as on SageMaker.
"""

from __future__ import annotations

from typing import Any

from shipyard.sdk.estimator import Framework


class TensorFlow(Framework):
    _framework = "tensorflow"
    _default_base_job_name = "tensorflow-training"

    def __init__(
        self,
        entry_point: str | None = None,
        framework_version: str | None = None,
        py_version: str | None = None,
        model_dir: Any = None,
        distribution: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            entry_point=entry_point,
            framework_version=framework_version,
            py_version=py_version,
            model_dir=model_dir,
            distribution=distribution,
            **kwargs,
        )
