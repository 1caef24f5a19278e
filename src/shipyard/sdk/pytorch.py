"""shipyard.pytorch.PyTorch: sagemaker.pytorch.PyTorch on shipyard."""

from __future__ import annotations

from typing import Any

from shipyard.sdk.estimator import Framework


class PyTorch(Framework):
    """A PyTorch training script (``sagemaker.pytorch.PyTorch``): one process per instance,
    or DDP/torchrun with ``distribution={'torch_distributed': {'enabled': True}}`` (also
    ``pytorchddp``, ``mpi`` and ``smdistributed`` data parallel). Every other argument is
    the estimator's (below, after ``*``).
    """

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
        """Describe a PyTorch job; nothing runs until ``fit``.

        Args:
            entry_point: The training script, relative to ``source_dir`` when given.
            framework_version: The PyTorch version the job runs in (``'2.3'``); an
                environment of it is built and cached. None: the installed torch.
            py_version: SageMaker's ``'py3x'`` tag; accepted for compatibility.
            distribution: ``{'torch_distributed': {'enabled': True}}`` (torchrun, one
                process per GPU or ``processes_per_host``), ``{'pytorchddp': {'enabled':
                True}}``, ``{'mpi': {...}}`` or ``{'smdistributed': {'dataparallel':
                {'enabled': True}}}``.
            **kwargs: The estimator's arguments (``instance_count``, ``instance_type``,
                ``hyperparameters``, ...), as for shipyard.Estimator.
        """
        super().__init__(
            entry_point=entry_point,
            framework_version=framework_version,
            py_version=py_version,
            distribution=distribution,
            **kwargs,
        )
