"""Model, TensorFlowModel, PyTorchModel: deployable models (mirrors ``sagemaker.model``).

``deploy`` starts an endpoint (a detached model server recorded in the store) and
returns a Predictor once /ping answers 200; ``transformer`` returns a batch Transformer.
``entry_point``/``source_dir`` go into the model's ``code/`` as the SDK repacks them.
Options that only mean something on AWS are accepted and ignored.
"""

from __future__ import annotations

import logging
from typing import Any

from shipyard.control.endpoints import Endpoints
from shipyard.errors import ValidationError
from shipyard.observe import progress
from shipyard.sdk.naming import name_from_base
from shipyard.sdk.predictor import Predictor, PyTorchPredictor, TensorFlowPredictor

logger = logging.getLogger("shipyard.sdk")
_LOCAL_TYPES = ("local", "local_gpu")


def _name(base: str) -> str:
    return name_from_base(base)


class Model:
    """A trained model to serve (``sagemaker.model.Model``): ``deploy`` starts an endpoint
    (a model server on this machine) and returns a Predictor; ``transformer`` runs batch
    transform over files. The generic class serves with an ``inference.py``
    (``model_fn``/``input_fn``/``predict_fn``/``output_fn``)."""

    _framework = "python"
    _default_name = "shipyard-model"

    def __init__(
        self,
        model_data: str | None = None,
        image_uri: str | None = None,
        role: str | None = None,
        entry_point: str | None = None,
        source_dir: str | None = None,
        predictor_cls: Any = None,
        env: dict[str, str] | None = None,
        name: str | None = None,
        sagemaker_session: Any = None,
        dependencies: list[str] | None = None,
        model_server_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Name a model; nothing starts until ``deploy`` or ``transformer``.

        Args:
            model_data: The model: a ``model.tar.gz`` (``s3://``, ``file://`` or a path), a
                model directory, or a training job's name. Required.
            image_uri: A container image on SageMaker; accepted and ignored.
            role: An IAM role on SageMaker; accepted and ignored.
            entry_point: The inference script (``inference.py``) with the handlers that
                load the model and turn requests into predictions.
            source_dir: The inference script's directory (a ``requirements.txt`` in it is
                installed).
            predictor_cls: The Predictor class ``deploy`` returns; default the framework's.
            env: Environment variables of the model server.
            name: The model's name, also the default endpoint name.
            sagemaker_session: The shipyard.Session whose home records the endpoint.
            dependencies: Extra code copied beside the inference script.
            model_server_workers: Worker processes of the model server (default 1, or
                ``SAGEMAKER_MODEL_SERVER_WORKERS`` in ``env``).
            **kwargs: Other SageMaker options; accepted and ignored.
        """
        if model_data is None:
            raise ValidationError(
                "model_data is required: a model.tar.gz, a model directory or a training job name"
            )
        self.model_data = model_data
        self.entry_point = entry_point
        self.source_dir = source_dir
        self.dependencies = list(dependencies or [])
        self.predictor_cls = predictor_cls or self._predictor_cls()
        self.env = dict(env or {})
        self.name = name
        self.sagemaker_session = sagemaker_session
        self.model_server_workers = model_server_workers
        self.endpoint_name: str | None = None
        for key in kwargs:
            logger.debug("%s is accepted for SageMaker compatibility and not used", key)

    @staticmethod
    def _predictor_cls() -> Any:
        return Predictor

    def _endpoints(self) -> Endpoints:
        return Endpoints(getattr(self.sagemaker_session, "home", None))

    def deploy(
        self,
        initial_instance_count: int | None = 1,
        instance_type: str | None = "local",
        serializer: Any = None,
        deserializer: Any = None,
        endpoint_name: str | None = None,
        wait: bool = True,
        port: int | None = None,
        workers: int | None = None,
        batch_size: int = 0,
        batch_wait_ms: float = 2.0,
        **kwargs: Any,
    ) -> Any:
        """Start an endpoint serving this model and return its Predictor; with ``wait``
        (default) once it is InService (``/ping`` answers 200). An endpoint that fails to
        start is removed, leaving no process behind.

        Args:
            initial_instance_count: SageMaker's instance count; one model server (with
                ``workers`` processes) serves the endpoint on this machine.
            instance_type: The instance type whose share of the machine the server gets;
                ``'local'``: the whole machine.
            serializer: How ``predict`` encodes its data (default the predictor's own:
                JSON for TensorFlow, NumPy for PyTorch, raw bytes otherwise).
            deserializer: How ``predict`` decodes the answer.
            endpoint_name: The endpoint's name; default the model's name or a generated one.
            wait: Return only once the endpoint answers (False: at once, Creating).
            port: The server's port on 127.0.0.1; default a free one.
            workers: Worker processes of the server (shipyard's knob).
            batch_size: Dynamic batching: up to this many concurrent requests are run as
                one batch (0: off).
            batch_wait_ms: How long a batch waits for more requests before it runs.
            **kwargs: Other SageMaker options; accepted and ignored.

        Raises:
            EndpointError: the server did not start; the message has its log's tail.
        """
        if instance_type is not None and instance_type not in _LOCAL_TYPES:
            from shipyard import instance_types

            instance_types.resolve(instance_type)  # refuses unknown types with a clear error
        if (initial_instance_count or 1) != 1:
            logger.info(
                "initial_instance_count=%s: one server with several worker processes "
                "serves the endpoint on this machine",
                initial_instance_count,
            )
        name = endpoint_name or self.name or _name(self._default_name)
        endpoints = self._endpoints()
        workers = (
            workers
            or self.model_server_workers
            or int(self.env.get("SAGEMAKER_MODEL_SERVER_WORKERS", 1))
        )
        endpoints.create(
            name,
            self.model_data,
            framework=self._framework,
            entry_point=self.entry_point,
            source_dir=self.source_dir,
            dependencies=self.dependencies,
            env=self.env,
            port=port,
            workers=workers,
            batch_size=batch_size,
            batch_wait_ms=batch_wait_ms,
            instance_type=instance_type,  # the sandbox its workers get (issue 37)
        )
        self.endpoint_name = name
        if wait:
            try:
                with progress.step(f"Starting endpoint {name}"):
                    endpoints.wait(name)
            except BaseException:
                endpoints.delete(name)  # a failed endpoint leaves no process behind
                raise
        logger.info("endpoint %s is %s", name, endpoints.get(name).status)
        predictor = self.predictor_cls(name, self.sagemaker_session)
        if serializer is not None:
            predictor.serializer = serializer
        if deserializer is not None:
            predictor.deserializer = deserializer
        return predictor

    def transformer(
        self,
        instance_count: int = 1,
        instance_type: str = "local",
        strategy: str | None = None,
        assemble_with: str | None = None,
        output_path: str | None = None,
        output_kms_key: str | None = None,
        accept: str | None = None,
        env: dict[str, str] | None = None,
        max_concurrent_transforms: int | None = None,
        max_payload: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """A Transformer for batch transform with this model; ``transform(data)`` on it
        runs the job.

        Args:
            instance_count: Worker processes of the transform's model server.
            instance_type: The instance type whose share of the machine the server gets.
            strategy: ``'MultiRecord'`` (default: as many records per request as fit in
                ``max_payload``) or ``'SingleRecord'``.
            assemble_with: ``'Line'``: one output line per input record; None: outputs
                concatenated.
            output_path: Where ``<input file>.out`` files go (``s3://``, ``file://`` or a
                path); default under ``SHIPYARD_HOME/transform``.
            output_kms_key: An AWS KMS key; accepted and ignored.
            accept: The content type asked of the model server.
            env: Environment variables of the model server, over the model's.
            max_concurrent_transforms: Requests in flight at once (default the server's
                ``/execution-parameters``, else 1).
            max_payload: The largest request body in MB (default 6, as on SageMaker).
            **kwargs: The Transformer's other arguments (``tags``,
                ``base_transform_job_name``, ...).
        """
        from shipyard.sdk.transformer import Transformer

        return Transformer(
            model_name=self.name or self._default_name,
            instance_count=instance_count,
            instance_type=instance_type,
            strategy=strategy,
            assemble_with=assemble_with,
            output_path=output_path,
            accept=accept,
            max_concurrent_transforms=max_concurrent_transforms,
            max_payload=max_payload,
            env={**self.env, **(env or {})},
            sagemaker_session=self.sagemaker_session,
            model=self,
            **kwargs,
        )

    def delete_model(self) -> None:
        """SageMaker's call; nothing to delete here (models are not registered apart from
        their endpoints)."""


class TensorFlowModel(Model):
    """A TensorFlow SavedModel served with the TF Serving REST API and SageMaker's
    ``/invocations`` (``sagemaker.tensorflow.TensorFlowModel``); an ``inference.py`` with
    ``input_handler``/``output_handler`` (or ``handler``) pre- and post-processes."""

    _framework = "tensorflow"
    _default_name = "tensorflow-inference"

    def __init__(
        self,
        model_data: str | None = None,
        role: str | None = None,
        entry_point: str | None = None,
        framework_version: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Name a TensorFlow model.

        Args:
            model_data: The SavedModel: a ``model.tar.gz``, a directory or a job's name.
            role: An IAM role on SageMaker; accepted and ignored.
            entry_point: An ``inference.py`` with ``input_handler``/``output_handler``.
            framework_version: The TensorFlow version the server runs.
            **kwargs: Model's other arguments (``source_dir``, ``env``, ``name``, ...).
        """
        super().__init__(model_data, role=role, entry_point=entry_point, **kwargs)
        self.framework_version = framework_version

    @staticmethod
    def _predictor_cls() -> Any:
        return TensorFlowPredictor


class PyTorchModel(Model):
    """A PyTorch model served with an ``inference.py`` (``model_fn``, ``input_fn``,
    ``predict_fn``, ``output_fn``), as ``sagemaker.pytorch.PyTorchModel``."""

    _framework = "pytorch"
    _default_name = "pytorch-inference"

    def __init__(
        self,
        model_data: str | None = None,
        role: str | None = None,
        entry_point: str | None = None,
        framework_version: str | None = None,
        py_version: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Name a PyTorch model.

        Args:
            model_data: The model: a ``model.tar.gz``, a directory or a job's name.
            role: An IAM role on SageMaker; accepted and ignored.
            entry_point: The ``inference.py`` whose ``model_fn`` loads the model.
            framework_version: The PyTorch version the server runs.
            py_version: SageMaker's ``'py3x'`` tag; accepted for compatibility.
            **kwargs: Model's other arguments (``source_dir``, ``env``, ``name``, ...).
        """
        super().__init__(model_data, role=role, entry_point=entry_point, **kwargs)
        self.framework_version = framework_version

    @staticmethod
    def _predictor_cls() -> Any:
        return PyTorchPredictor


def model_for_estimator(estimator: Any, **kwargs: Any) -> Model:
    """``estimator.create_model(**kwargs)``: the trained model with the framework's class.

    As in the SageMaker SDK, the PyTorch (and generic) estimators serve with the training
    entry point and source_dir unless ``entry_point`` is given; TensorFlow serves the
    SavedModel with no code unless ``entry_point`` (an inference.py) is given.
    """
    job = estimator._require_job()
    model_data = estimator.model_data or job.job_name
    cls = {"tensorflow": TensorFlowModel, "pytorch": PyTorchModel}.get(
        getattr(estimator, "_framework", "") or "", Model
    )
    if cls is not TensorFlowModel and "entry_point" not in kwargs:
        kwargs.setdefault("source_dir", estimator.source_dir)
        kwargs["entry_point"] = estimator.entry_point
    return cls(model_data, sagemaker_session=estimator.session, **kwargs)


_MODEL_ARGS = (
    "entry_point",
    "source_dir",
    "dependencies",
    "env",
    "role",
    "name",
    "predictor_cls",
    "model_server_workers",
    "framework_version",
)


def deploy_from_estimator(estimator: Any, *args: Any, **kwargs: Any) -> Any:
    """``estimator.deploy(...)``: create_model with the model arguments, then deploy."""
    model_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _MODEL_ARGS}
    if "model_name" in kwargs:
        model_kwargs["name"] = kwargs.pop("model_name")
    return model_for_estimator(estimator, **model_kwargs).deploy(*args, **kwargs)


def transformer_from_estimator(estimator: Any, *args: Any, **kwargs: Any) -> Any:
    model_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _MODEL_ARGS}
    if "model_name" in kwargs:
        model_kwargs["name"] = kwargs.pop("model_name")
    return model_for_estimator(estimator, **model_kwargs).transformer(*args, **kwargs)
