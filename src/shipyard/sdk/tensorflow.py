"""shipyard.tensorflow.TensorFlow: sagemaker.tensorflow.TensorFlow on shipyard.

As the SageMaker SDK does, the script receives ``--model_dir``: here a directory
shared by all instances of the job (what SageMaker local mode uses), unless
``model_dir`` is given, or suppressed with ``model_dir=False``. SM_MODEL_DIR (what
becomes model.tar.gz) is separate, exactly as on SageMaker.
"""

from __future__ import annotations

import warnings
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
        script_mode: bool | None = None,
        **kwargs: Any,
    ) -> None:
        if script_mode is not None:
            # SDK v1's flag: script mode is the only mode since v2 (and shipyard's)
            warnings.warn(
                "TensorFlow(script_mode=...) is a SageMaker SDK v1 argument; script mode is "
                "the only mode now: remove it",
                DeprecationWarning,
                stacklevel=2,
            )
            if script_mode is False:
                from shipyard.errors import ValidationError

                raise ValidationError(
                    "TensorFlow(script_mode=False) (legacy Estimator-API containers) is not "
                    "supported: write a script (entry_point) that trains and saves the model"
                )
        super().__init__(
            entry_point=entry_point,
            framework_version=framework_version,
            py_version=py_version,
            model_dir=model_dir,
            distribution=distribution,
            **kwargs,
        )
