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
    """A TensorFlow training script (``sagemaker.tensorflow.TensorFlow``): Keras or
    ``tf.distribute`` scripts, with parameter servers (``distribution={'parameter_server':
    {'enabled': True}}``), Horovod (``{'mpi': {...}}``) or MultiWorkerMirroredStrategy.

    As on SageMaker, the script receives ``--model_dir``: a directory shared by all the
    job's instances unless ``model_dir`` says otherwise; the model to keep is what the
    script saves under ``SM_MODEL_DIR`` (``/opt/ml/model``), which becomes model.tar.gz.
    Every other argument is the estimator's (below, after ``*``).
    """

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
        """Describe a TensorFlow job; nothing runs until ``fit``.

        Args:
            entry_point: The training script, relative to ``source_dir`` when given.
            framework_version: The TensorFlow version the job runs in (``'2.16'``); an
                environment of it is built and cached. None: the installed TensorFlow.
            py_version: SageMaker's ``'py3x'`` tag; accepted for compatibility.
            model_dir: The ``--model_dir`` passed to the script: None for a directory
                shared by the job's instances, a path or URI of your own, or False to pass
                none.
            distribution: ``{'parameter_server': {'enabled': True}}``, ``{'mpi':
                {'enabled': True, 'processes_per_host': N}}``,
                ``{'multi_worker_mirrored_strategy': {'enabled': True}}`` or
                ``{'smdistributed': {'dataparallel': {'enabled': True}}}``.
            script_mode: SageMaker SDK v1's flag: True is the only mode (a
                DeprecationWarning says to remove it); False is refused.
            **kwargs: The estimator's arguments (``instance_count``, ``instance_type``,
                ``hyperparameters``, ...), as for shipyard.Estimator.
        """
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
