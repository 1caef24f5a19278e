"""Estimator, Framework: the SageMaker Python SDK v2 training API on shipyard.

Porting a notebook means changing the import: the constructor takes the same
parameters (v1 names too, with a DeprecationWarning), ``fit`` the same inputs, and
``latest_training_job.describe()`` returns a DescribeTrainingJob-shaped dict. Options
that only make sense on AWS are accepted and ignored with a debug log line.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

from shipyard import distribution as dist_mod
from shipyard import instance_types
from shipyard.control.lifecycle import JobStatus
from shipyard.errors import JobExistsError, JobFailedError, ValidationError
from shipyard.sdk.inputs import channels_from_inputs
from shipyard.sdk.naming import name_from_base
from shipyard.sdk.session import Session
from shipyard.sdk.training_job import TrainingJob, _logs_on
from shipyard.spec import JobSpec, validated

logger = logging.getLogger("shipyard.sdk")
DEFAULT_NAME_TRIES = 20  # default names taken by other submits in the same millisecond
_root = logging.getLogger("shipyard")
if not _root.handlers and not logging.getLogger().handlers:
    # Like the SageMaker SDK, say what is happening (instance-type mapping, staging)
    # without the user configuring logging; a configured root logger takes over. Set on
    # the "shipyard" parent, so every "shipyard.<area>" logger in this process shares it.
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("shipyard: %(message)s"))
    _root.addHandler(_handler)
    _root.setLevel(logging.INFO)

# SageMaker parameters with no meaning without AWS: accepted, ignored, logged at debug.
_AWS_ONLY = (
    "role",
    "keep_alive_period_in_seconds",
    "volume_kms_key",
    "output_kms_key",
    "subnets",
    "security_group_ids",
    "model_uri",
    "model_channel_name",
    "encrypt_inter_container_traffic",
    "use_spot_instances",
    "max_wait",
    "rules",
    "debugger_hook_config",
    "enable_sagemaker_metrics",
    "profiler_config",
    "disable_profiler",
    "image_uri",
    "training_repository_access_mode",
    "training_repository_credentials_provider_arn",
    "enable_infra_check",
    "container_entry_point",
    "container_arguments",
    "disable_output_compression",
    "enable_remote_debug",
    "enable_session_tag_chaining",
    "training_plan",
    "instance_placement_config",
    "compiler_config",
    "instance_groups",
    "sagemaker_session",
    "image_name",
)
_V1_RENAMES = {
    "train_instance_count": "instance_count",
    "train_instance_type": "instance_type",
    "train_max_run": "max_run",
    "distributions": "distribution",
    "train_use_spot_instances": "use_spot_instances",
    "train_max_wait": "max_wait",
    "train_volume_size": "volume_size",
    "train_volume_kms_key": "volume_kms_key",
}


def _renamed(kwargs: dict[str, Any]) -> dict[str, Any]:
    for old, new in _V1_RENAMES.items():
        if old in kwargs:
            value = kwargs.pop(old)
            warnings.warn(
                f"the {old!r} parameter is deprecated (SageMaker Python SDK v2 renamed it); "
                f"use {new!r} instead",
                DeprecationWarning,
                stacklevel=4,
            )
            if new in kwargs and kwargs[new] is not None:
                raise ValidationError(f"both {old!r} and {new!r} were given; pass only {new!r}")
            kwargs[new] = value
    return kwargs


class EstimatorBase:
    """What every estimator shares (``sagemaker.estimator.EstimatorBase``): the job's
    configuration, ``fit`` to run it, and ``deploy``/``transformer`` for the trained model.
    It builds a JobSpec and hands it to the control plane; it never runs processes itself.
    After ``fit`` or ``attach``, ``latest_training_job`` is the job's handle:
    ``describe()`` (DescribeTrainingJob's dict), ``wait()``, ``logs()``, ``stop()``.
    """

    _framework: str | None = None
    _default_base_job_name = "shipyard-training"

    def __init__(
        self,
        entry_point: str | None = None,
        source_dir: str | None = None,
        hyperparameters: dict[str, Any] | None = None,
        instance_count: int | None = None,
        instance_type: str | None = None,
        distribution: dict[str, Any] | None = None,
        dependencies: list[str] | None = None,
        git_config: dict[str, str] | None = None,
        model_dir: Any = None,
        base_job_name: str | None = None,
        tags: list[dict[str, str]] | None = None,
        output_path: str | None = None,
        code_location: str | None = None,
        environment: dict[str, str] | None = None,
        max_run: int = 24 * 60 * 60,
        input_mode: str = "File",
        metric_definitions: list[dict[str, str]] | None = None,
        checkpoint_s3_uri: str | None = None,
        checkpoint_local_path: str | None = None,
        max_retry_attempts: int | None = None,
        framework_version: str | None = None,
        py_version: str | None = None,
        container_log_level: int = logging.INFO,
        enable_network_isolation: bool = False,
        volume_size: int = 30,
        session: Session | None = None,
        **kwargs: Any,
    ) -> None:
        """Describe a training job; nothing runs until ``fit``. A bad value is refused here.

        Args:
            entry_point: The training script (``train.py``), in ``source_dir`` if given.
            source_dir: A directory with the script and the code it imports; it becomes the
                instances' ``/opt/ml/code``. A ``requirements.txt`` in it is installed.
            hyperparameters: Passed to the script as ``--key value`` (sorted; single letters
                as ``-k``), in ``hyperparameters.json`` and as ``SM_HP_<KEY>``.
            instance_count: How many instances (hosts ``algo-1`` .. ``algo-N``). Required.
            instance_type: A SageMaker type (``'ml.p2.xlarge'``: its CPUs, memory, GPUs and
                network), or ``'local'``/``'local_gpu'`` for the whole machine. Required.
            distribution: How the instances train together, as SageMaker writes it
                (``{'parameter_server': {'enabled': True}}``, ``{'mpi': {...}}``, ...: see
                the framework estimators). None: one process per instance.
            dependencies: Extra directories or files copied next to the script in
                ``/opt/ml/code``.
            git_config: ``{'repo': ..., 'branch': ..., 'commit': ...}``: the code from git.
            model_dir: The ``--model_dir`` the script receives (framework estimators).
            base_job_name: The prefix of generated job names (``tensorflow-training``...).
            tags: ``[{'Key': ..., 'Value': ...}]``, kept with the job and shown by describe.
            output_path: Where ``model.tar.gz`` and ``output.tar.gz`` go: an ``s3://`` or
                ``file://`` URI or a local path; default under ``SHIPYARD_HOME``.
            code_location: Where the code bundle is staged; default beside ``output_path``.
            environment: Environment variables set in every instance.
            max_run: Seconds the job may run before it is stopped (``MaxRuntimeExceeded``).
            input_mode: ``'File'``, ``'FastFile'`` or ``'Pipe'`` for every channel (a
                TrainingInput's ``input_mode`` overrides it for its channel).
            metric_definitions: ``[{'Name': ..., 'Regex': ...}]``: metrics read from the
                log lines (the regex's first group), shown by ``shipyard metrics``.
            checkpoint_s3_uri: Where ``/opt/ml/checkpoints`` is synced during the job and
                restored from when a job starts (spot-style resumption).
            checkpoint_local_path: The instances' checkpoint directory, if not
                ``/opt/ml/checkpoints``.
            max_retry_attempts: How many times a failed job is run again (0 when None).
            framework_version: The framework version the job runs in; None: the installed.
            py_version: SageMaker's ``'py3x'`` tag; accepted for compatibility.
            container_log_level: The ``logging`` level the toolkit logs at inside the job
                (``SM_LOG_LEVEL``).
            enable_network_isolation: No outbound traffic from the (sandboxed) instances.
            volume_size: GB of each instance's disk under ``/opt/ml`` (SageMaker's
                ``VolumeSizeInGB``, 1..16384): a sparse disk of its own where shipyard runs
                as root, the host's filesystem (said in describe) elsewhere.
            session: The shipyard.Session the job goes to (or ``sagemaker_session=``).
            **kwargs: SageMaker SDK v1 names (``train_instance_count``, ...) with a
                DeprecationWarning; options that only mean something on AWS (``role``,
                ``subnets``, ...) are accepted and ignored.
        """
        kwargs = _renamed(dict(kwargs))
        instance_count = kwargs.pop("instance_count", instance_count)
        instance_type = kwargs.pop("instance_type", instance_type)
        max_run = kwargs.pop("max_run", max_run)
        from shipyard.spec import check_volume_size

        try:  # refused here, as SageMaker's SDK user learns it at once
            self.volume_size = check_volume_size(kwargs.pop("volume_size", volume_size))
        except ValueError as exc:
            raise ValidationError(f"volume_size: {exc}") from None
        distribution = kwargs.pop("distribution", distribution)
        from shipyard.debugger import tensorboard_spec

        self.tensorboard_output_config = kwargs.pop("tensorboard_output_config", None)
        self._tensorboard = tensorboard_spec(self.tensorboard_output_config)
        self.session = kwargs.pop("sagemaker_session", None) or session or Session()
        if not isinstance(self.session, Session):
            raise ValidationError("sagemaker_session/session must be a shipyard.Session")
        for name in list(kwargs):
            if name in _AWS_ONLY:
                logger.debug(
                    "%s=%r is accepted for SageMaker compatibility and not used",
                    name,
                    kwargs.pop(name),
                )
        if kwargs:
            raise TypeError(
                f"{type(self).__name__}() got unexpected keyword argument(s) {sorted(kwargs)}"
            )
        if entry_point is None:
            raise ValidationError(
                "entry_point is required: shipyard runs your training script "
                "(script mode); pass entry_point='train.py'"
            )
        if instance_count is None or instance_type is None:
            raise ValidationError(
                "instance_count and instance_type are required (e.g. "
                "instance_count=2, instance_type='local')"
            )
        self.entry_point = entry_point
        self.source_dir = source_dir
        self.dependencies = list(dependencies or [])
        self.git_config = git_config
        self._hyperparameters = dict(hyperparameters or {})
        self.instance_count = instance_count
        self.instance_type = instance_type
        self.distribution = dist_mod.parse(distribution)  # refuses bad forms right here
        self.model_dir = model_dir
        self.base_job_name = base_job_name
        self.tags = list(tags or [])
        self.output_path = output_path
        self.code_location = code_location
        self.environment = dict(environment or {})
        self.max_run = max_run
        self.input_mode = input_mode
        self.metric_definitions = list(metric_definitions or [])
        self.checkpoint_s3_uri = checkpoint_s3_uri
        self.checkpoint_local_path = checkpoint_local_path
        # as on SageMaker: no outbound traffic from the instances (sandboxed instances only)
        self.enable_network_isolation = bool(enable_network_isolation)
        self.max_retry_attempts = max_retry_attempts or 0
        self.framework_version = framework_version
        self.py_version = py_version
        self.container_log_level = container_log_level
        # resolved now so a bad instance_type is refused here; what it maps to is logged
        # once per job, by the submission (control.submit)
        self.resources = instance_types.resolve(instance_type)
        self.latest_training_job: TrainingJob | None = None
        self._current_job_name: str | None = None

    # -- SageMaker-compatible API ---------------------------------------------------------
    def hyperparameters(self) -> dict[str, str]:
        """The user's hyperparameters, JSON-encoded as the SDK sends them."""
        from shipyard.spec import json_encode_hyperparameters

        return json_encode_hyperparameters(self._hyperparameters)

    def set_hyperparameters(self, **kwargs: Any) -> None:
        """Add or replace hyperparameters (``set_hyperparameters(epochs=5)``) before ``fit``."""
        self._hyperparameters.update(kwargs)

    def _job_spec(self, inputs: Any, job_name: str | None) -> JobSpec:
        name = job_name or name_from_base(self.base_job_name or self._default_base_job_name)
        return validated(
            job_name=name,
            framework=self._framework,
            framework_version=self.framework_version,
            py_version=self.py_version,
            code=dict(
                entry_point=self.entry_point,
                source_dir=self.source_dir,
                dependencies=self.dependencies,
                git_config=self.git_config,
            ),
            hyperparameters=self._hyperparameters,
            instance_count=self.instance_count,
            instance_type=self.instance_type,
            distribution=self.distribution.to_dict(),
            channels=channels_from_inputs(inputs),
            input_mode=self.input_mode,
            output_path=self.output_path,
            code_location=self.code_location,
            checkpoint_s3_uri=self.checkpoint_s3_uri,
            checkpoint_local_path=self.checkpoint_local_path,
            tensorboard=self._tensorboard,
            environment=self.environment,
            max_run=self.max_run,
            volume_size_gb=self.volume_size,
            max_retry_attempts=self.max_retry_attempts,
            metric_definitions=self.metric_definitions,
            tags=self.tags,
            model_dir=self.model_dir,
            container_log_level=self.container_log_level,
            enable_network_isolation=self.enable_network_isolation,
        )

    def fit(
        self,
        inputs: Any = None,
        wait: bool = True,
        logs: Any = True,
        job_name: str | None = None,
        experiment_config: Any = None,
    ) -> None:
        """Run a training job. With ``wait`` it returns when the job ends; Ctrl-C stops it.

        Args:
            inputs: The channels: ``{'train': 's3://bucket/train', 'eval':
                TrainingInput(...)}``, or one URI or TrainingInput (the ``training``
                channel). A value is an ``s3://`` or ``file://`` URI or a local path. None:
                no channels.
            wait: Block until the job ends (False: return once it is submitted; follow it
                with ``logs()`` or ``shipyard logs``).
            logs: Stream every instance's log lines, each prefixed by its host, while
                waiting (``'None'`` or False: quiet).
            job_name: The job's name; default ``base_job_name`` plus a timestamp.
            experiment_config: SageMaker Experiments' settings; accepted and ignored.

        Raises:
            JobFailedError: the job failed; its message is the failure reason (the first
            failing host's error). ValidationError: a bad input, before anything runs.
        """
        control = self.session.control
        spec = self._submit(control, inputs, job_name)
        self._current_job_name = spec.job_name
        self.latest_training_job = TrainingJob(control, spec.job_name)
        if not wait:
            control.start(spec.job_name)
            return
        record = control.run(spec.job_name, stream=sys.stdout if _logs_on(logs) else None)
        if record.status is JobStatus.FAILED:
            raise JobFailedError(record.name, record.status, record.failure_reason)

    def _submit(self, control: Any, inputs: Any, job_name: str | None) -> JobSpec:
        """Submit; a default name (base + millisecond timestamp) that another submit took
        in the same millisecond gets a ``-1``, ``-2``... suffix instead of failing."""
        base = self.base_job_name or self._default_base_job_name
        for attempt in range(DEFAULT_NAME_TRIES):
            spec = self._job_spec(inputs, job_name or name_from_base(base, attempt=attempt))
            try:
                control.submit(spec, log=logger.info)
                return spec
            except JobExistsError:
                if job_name is not None or attempt == DEFAULT_NAME_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _require_job(self) -> TrainingJob:
        if self.latest_training_job is None:
            raise ValidationError("no training job yet: call fit() or attach() first")
        return self.latest_training_job

    def logs(self) -> None:
        """Stream the latest job's logs, following until it ends."""
        self._require_job().logs()

    def stop_training_job(self) -> None:
        """Stop the latest job: every instance gets SIGTERM, then SIGKILL after the grace
        period (``SHIPYARD_STOP_GRACE``); the job ends Stopped."""
        self._require_job().stop()

    def latest_job_tensorboard_artifacts_path(self) -> str | None:
        """Where the latest job's TensorBoard output is synced (SageMaker's method)."""
        if self._tensorboard is None or self.latest_training_job is None:
            return None
        base = self._tensorboard["s3_output_path"].rstrip("/")
        return f"{base}/{self.latest_training_job.job_name}/tensorboard-output"

    @property
    def training_job_analytics(self) -> Any:
        """The latest job's metric history (SageMaker's TrainingJobAnalytics):
        ``.dataframe()`` has columns timestamp, metric_name, value (and host)."""
        from shipyard.sdk.analytics import TrainingJobAnalytics

        job = self._require_job()
        return TrainingJobAnalytics(job.job_name, control=job.control)

    @property
    def model_data(self) -> str | None:
        """URI of model.tar.gz once the job has completed (S3ModelArtifacts)."""
        desc = self._require_job().describe()
        return desc.get("ModelArtifacts", {}).get("S3ModelArtifacts")

    # -- hosting (issue #8): the model of the latest job, served or batch-transformed ----
    def create_model(self, **kwargs: Any) -> Any:
        """The latest job's trained model as a Model of the framework's class
        (TensorFlowModel, PyTorchModel or Model), ready to ``deploy`` or ``transformer``.

        Args:
            entry_point (str): An inference script for the model server; default the
                training script for PyTorch and the generic estimator, none for TensorFlow.
            source_dir (str): The inference script's directory.
            dependencies (list[str]): Extra code copied beside the inference script.
            env (dict[str, str]): Environment variables of the model server.
            name (str): The model's name.
            predictor_cls (type): The Predictor class ``deploy`` returns.
            model_server_workers (int): Worker processes of the model server.
        """
        from shipyard.sdk.model import model_for_estimator

        return model_for_estimator(self, **kwargs)

    def deploy(self, *args: Any, **kwargs: Any) -> Any:
        """Serve the latest job's model on an endpoint; returns a Predictor once /ping
        answers (``create_model`` then ``Model.deploy``).

        Args:
            model_name (str): The model's (and default endpoint's) name.
            entry_point (str): An inference script (``inference.py``) for the model server;
                default the training script for PyTorch and the generic estimator, none
                for TensorFlow (the SavedModel is served as it is).
            source_dir (str): The inference script's directory.
            dependencies (list[str]): Extra code copied beside the inference script.
            env (dict[str, str]): Environment variables of the model server.
            predictor_cls (type): The Predictor class returned; default the framework's.
            model_server_workers (int): Worker processes of the model server.

        Forwards: Model.deploy
        """
        from shipyard.sdk.model import deploy_from_estimator

        return deploy_from_estimator(self, *args, **kwargs)

    def transformer(self, *args: Any, **kwargs: Any) -> Any:
        """A batch Transformer over the latest job's model (``create_model`` then
        ``Model.transformer``); ``transform()`` on it runs the batch job.

        Args:
            model_name (str): The model's name (and the transform jobs' name prefix).
            entry_point (str): An inference script for the model server.
            env (dict[str, str]): Environment variables of the model server.

        Forwards: Model.transformer
        """
        from shipyard.sdk.model import transformer_from_estimator

        return transformer_from_estimator(self, *args, **kwargs)

    @classmethod
    def attach(
        cls,
        training_job_name: str,
        sagemaker_session: Session | None = None,
        model_channel_name: str = "model",
    ) -> EstimatorBase:
        """An estimator for a job that already exists (submitted by a notebook, the CLI or
        ``shipyard server``), with its configuration; blocks until the job ends, as the
        SageMaker SDK does.

        Args:
            training_job_name: The job's name (``shipyard jobs`` lists them).
            sagemaker_session: The shipyard.Session whose home holds the job; default
                ``Session()``.
            model_channel_name: SageMaker's argument; accepted for compatibility.

        Raises:
            JobNotFoundError: no job of that name in the session's home.
            JobFailedError: the job failed.
        """
        session = sagemaker_session or Session()
        record = session.control.get(training_job_name)
        spec = record.spec
        code = spec.code
        estimator = cls(
            entry_point=code.entry_point,
            source_dir=code.source_dir,
            dependencies=list(code.dependencies),
            git_config=code.git_config,
            hyperparameters=dict(spec.hyperparameters),
            instance_count=spec.instance_count,
            instance_type=spec.instance_type,
            distribution=spec.dist.to_sagemaker(),
            output_path=spec.output_path,
            environment=dict(spec.environment),
            max_run=spec.max_run,
            volume_size=spec.volume_size_gb,
            metric_definitions=[m.model_dump() for m in spec.metric_definitions],
            max_retry_attempts=spec.max_retry_attempts,
            session=session,
            **cls._attach_kwargs(spec),
        )
        estimator._current_job_name = training_job_name
        estimator.latest_training_job = TrainingJob(session.control, training_job_name)
        estimator.latest_training_job.wait(logs=False)
        return estimator

    @classmethod
    def _attach_kwargs(cls, spec: JobSpec) -> dict[str, Any]:
        return {}


class Estimator(EstimatorBase):
    """The generic estimator (``sagemaker.estimator.Estimator``): any script in the
    installed Python, no framework conventions (no ``--model_dir``)."""


class Framework(EstimatorBase):
    """Base of the framework estimators (``TensorFlow``, ``PyTorch``): script mode with a
    framework's conventions and its ``framework_version``."""

    @classmethod
    def _attach_kwargs(cls, spec: JobSpec) -> dict[str, Any]:
        return {"framework_version": spec.framework_version, "py_version": spec.py_version}
