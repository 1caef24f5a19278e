"""Transformer: batch transform on a model (mirrors ``sagemaker.transformer.Transformer``).

``transform`` starts a model server for the model (a temporary endpoint), sends each
input file's records in mini-batches (``max_concurrent_transforms`` requests in flight)
and writes ``<output_path>/<input relative path>.out`` in record order, atomically.
A mini-batch the server refuses is retried record by record so that only the bad
records fail: each is reported with its file and position (1-based), its output line
left empty (with ``assemble_with='Line'``), and the rest still processed; the call
then raises TransformError listing them. Inputs and output_path are local paths,
file:// or s3:// URIs (through shipyard.storage); an input is a file, a directory or
a path prefix.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from shipyard.errors import ValidationError
from shipyard.sdk.naming import name_from_base
from shipyard.serving.transform import engine, records
from shipyard.serving.transform.engine import TransformError, TransformResult

__all__ = ["Transformer", "TransformError", "TransformResult"]

logger = logging.getLogger("shipyard.sdk")


class Transformer:
    """Batch transform (``sagemaker.transformer.Transformer``): ``transform(data)`` serves
    the model on a temporary endpoint, sends every record of the input files and writes
    ``<output_path>/<file>.out``. Made by ``Model.transformer`` or
    ``estimator.transformer``."""

    def __init__(
        self,
        model_name: str,
        instance_count: int = 1,
        instance_type: str = "local",
        strategy: str | None = None,
        assemble_with: str | None = None,
        output_path: str | None = None,
        output_kms_key: str | None = None,
        accept: str | None = None,
        max_concurrent_transforms: int | None = None,
        max_payload: int | None = None,
        tags: Any = None,
        env: dict[str, str] | None = None,
        base_transform_job_name: str | None = None,
        sagemaker_session: Any = None,
        volume_kms_key: str | None = None,
        model: Any = None,
    ) -> None:
        """Configure a batch transform; nothing runs until ``transform``.

        Args:
            model_name: The model's name; also the default prefix of transform job names.
            instance_count: Worker processes of the model server.
            instance_type: The instance type whose share of the machine the server gets.
            strategy: ``'MultiRecord'`` (default: as many records per request as fit in
                ``max_payload``) or ``'SingleRecord'``.
            assemble_with: ``'Line'``: one output line per input record (a failed record
                leaves its line empty); None: outputs concatenated.
            output_path: Where ``<input file>.out`` files go (``s3://``, ``file://`` or a
                path); default under ``SHIPYARD_HOME/transform/<job>``.
            output_kms_key: An AWS KMS key; accepted and ignored.
            accept: The content type asked of the model server.
            max_concurrent_transforms: Requests in flight at once (default the server's
                ``/execution-parameters``, else 1).
            max_payload: The largest request body in MB (default 6, as on SageMaker).
            tags: SageMaker's tags; accepted and ignored.
            env: Environment variables of the model server.
            base_transform_job_name: The prefix of generated transform job names.
            sagemaker_session: The shipyard.Session whose home is used.
            volume_kms_key: An AWS KMS key; accepted and ignored.
            model: The Model to serve (``Model.transformer`` passes itself). Required.
        """
        if strategy not in (None, "MultiRecord", "SingleRecord"):
            raise ValidationError(f"strategy {strategy!r}: use 'MultiRecord' or 'SingleRecord'")
        if assemble_with not in (None, "None", "Line"):
            raise ValidationError(f"assemble_with {assemble_with!r}: use 'Line' or None")
        if model is None:
            raise ValidationError(
                "this Transformer has no model to serve: create it with "
                "Model.transformer(...) or estimator.transformer(...)"
            )
        self.model_name = model_name
        self.model = model
        self.instance_count = instance_count
        self.instance_type = instance_type
        self.strategy = strategy or "MultiRecord"
        self.assemble_with = assemble_with
        self.output_path = output_path
        self.accept = accept
        self.max_concurrent_transforms = max_concurrent_transforms
        self.max_payload = 6 if max_payload is None else max_payload
        self.env = dict(env or {})
        self.base_transform_job_name = base_transform_job_name or model_name
        self.sagemaker_session = sagemaker_session
        self.latest_transform_job: str | None = None
        self.last_result: TransformResult | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def transform(
        self,
        data: str,
        data_type: str = "S3Prefix",
        content_type: str | None = None,
        compression_type: str | None = None,
        split_type: str | None = None,
        job_name: str | None = None,
        input_filter: str | None = None,
        output_filter: str | None = None,
        join_source: str | None = None,
        wait: bool = True,
        logs: bool = True,
        **kwargs: Any,
    ) -> None:
        """Run a batch transform job over ``data``; outputs are written atomically.

        Args:
            data: The input: an ``s3://`` or ``file://`` URI or a local path, naming a
                file, a directory or a key prefix.
            data_type: ``'S3Prefix'`` (the only kind here).
            content_type: The Content-Type of the requests (default
                ``application/octet-stream``).
            compression_type: None: uncompressed input (the only kind here).
            split_type: How a file splits into records: None (whole file), ``'Line'``,
                ``'RecordIO'`` or ``'TFRecord'``.
            job_name: The transform job's name; default the prefix plus a timestamp.
            input_filter: A JSONPath picking the part of each record sent (``'Line'``
                only).
            output_filter: A JSONPath picking the part of each output kept.
            join_source: ``'Input'``: each output is joined with its input record.
            wait: Block until the job ends (False: run in the background; ``wait()``).
            logs: SageMaker's argument; progress is logged either way.
            **kwargs: Other SageMaker options; accepted and ignored.

        Raises:
            TransformError: some records failed; it lists each with its file and position
            (the others were still written).
        """
        if data_type != "S3Prefix":
            raise ValidationError(
                f"data_type {data_type!r}: only 'S3Prefix' (a file, a "
                "directory or a path prefix) is available"
            )
        if compression_type not in (None, "None"):
            raise ValidationError("compression_type: only uncompressed input is available")
        if split_type not in records.SPLIT_TYPES:
            raise ValidationError(
                f"split_type {split_type!r}: use None, 'Line', 'RecordIO' or 'TFRecord'"
            )
        if join_source not in (None, "None", "Input"):
            raise ValidationError(f"join_source {join_source!r}: use 'Input' or None")
        if (join_source == "Input" or input_filter or output_filter) and split_type != "Line":
            raise ValidationError(
                "input_filter, output_filter and join_source need "
                "split_type='Line' (one record per line)"
            )
        files = engine.input_files(data)
        job = job_name or name_from_base(self.base_transform_job_name)
        self.latest_transform_job = job
        if self.output_path is None:
            self.output_path = os.path.join(self._home(), "transform", job)
        options = {
            "content_type": content_type or "application/octet-stream",
            "split_type": split_type,
            "input_filter": input_filter,
            "output_filter": output_filter,
            "join_source": join_source,
        }
        if wait:
            self._run(job, files, options)
            return

        def background() -> None:
            try:
                self._run(job, files, options)
            except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
                self._error = exc

        self._thread = threading.Thread(target=background, name=f"transform-{job}", daemon=True)
        self._thread.start()

    def wait(self, logs: bool = True) -> None:
        """Wait for a ``transform(..., wait=False)`` to end, raising its error if it failed.

        Args:
            logs: SageMaker's argument; accepted.
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    # -- the work ---------------------------------------------------------------------------
    def _home(self) -> str:
        from shipyard.control.home import Home

        return Home.from_env(getattr(self.sagemaker_session, "home", None)).root

    def _run(
        self, job: str, files: list[tuple[str, Callable[[], bytes]]], options: dict[str, Any]
    ) -> None:
        endpoints = self.model._endpoints()
        env = {
            **self.env,
            "SAGEMAKER_BATCH": "true",
            "SAGEMAKER_MAX_PAYLOAD_IN_MB": str(self.max_payload),
            "SAGEMAKER_BATCH_STRATEGY": (
                "SINGLE_RECORD" if self.strategy == "SingleRecord" else "MULTI_RECORD"
            ),
        }
        model = self.model
        output_path = self.output_path
        assert output_path is not None  # transform() sets it before starting this run
        endpoints.create(
            job,
            model.model_data,
            framework=model._framework,
            entry_point=model.entry_point,
            source_dir=model.source_dir,
            dependencies=model.dependencies,
            env={**model.env, **env},
            workers=max(1, self.instance_count),
            max_payload_mb=max(self.max_payload, 6) if self.max_payload else 1024,
            instance_type=self.instance_type,  # the model server's sandbox (issue 37)
        )
        try:
            record = endpoints.wait(job)
            concurrency = self.max_concurrent_transforms or self._execution_parameters(
                record.url
            ).get("MaxConcurrentTransforms", 1)
            result = engine.run(
                job,
                files,
                record.host,
                record.port,
                output_path,
                os.path.join(self._home(), "transform", job),
                concurrency,
                engine.Settings(self.strategy, self.max_payload, self.accept, self.assemble_with),
                options,
            )
            self.last_result = result
        finally:
            endpoints.delete(job)
        logger.info(
            "batch transform %s: %d record(s) in %d request(s) -> %s",
            job,
            result.records,
            result.requests,
            self.output_path,
        )
        if result.failures:
            raise TransformError(result)

    @staticmethod
    def _execution_parameters(url: str) -> dict[str, Any]:
        import urllib.request

        try:
            with urllib.request.urlopen(url + "/execution-parameters", timeout=5) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return {}
