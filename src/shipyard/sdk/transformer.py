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

import http.client
import json
import logging
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shipyard.control.staging import local_path
from shipyard.errors import ShipyardError, ValidationError
from shipyard.serving import batch

logger = logging.getLogger("shipyard")


class TransformError(ShipyardError):
    """Some records failed; ``result.failures`` says which (file, position, message)."""

    def __init__(self, result: TransformResult) -> None:
        self.result = result
        shown = "; ".join(
            f"{f['File']} record {f['Position']}: {f['Error']}" for f in result.failures[:5]
        )
        more = len(result.failures) - 5
        super().__init__(
            f"batch transform {result.job_name}: {len(result.failures)} record(s) "
            f"failed ({shown}{f'; and {more} more' if more > 0 else ''}); the "
            f"other {result.records - len(result.failures)} were written"
        )


@dataclass
class TransformResult:
    job_name: str
    outputs: list[str] = field(default_factory=list)
    records: int = 0
    requests: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)


def input_files(data: str) -> list[tuple[str, Callable[[], bytes]]]:
    """(path relative to the input's "directory", reader) for each input: a file, a
    directory or a path prefix (S3Prefix semantics), local, file:// or s3://."""
    if data.startswith("s3://"):
        from shipyard.storage import list_channel, parse, store_for

        store = store_for(parse(data))
        return [
            (obj.relative, lambda o=obj: _read_all(store.open(o.location)))
            for obj in list_channel(data)
        ]
    path = local_path(data)
    if os.path.isfile(path):
        return [(os.path.basename(path), lambda: _read_file(path))]
    if os.path.isdir(path):
        base, prefix = path, ""
    else:
        base, prefix = os.path.dirname(path), os.path.basename(path)
    files = []
    if os.path.isdir(base):
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, base)
                if rel.startswith(prefix):
                    files.append((rel, lambda f=full: _read_file(f)))
    if not files:
        raise ValidationError(f"transform data {data!r} matches no file")
    return files


def _read_file(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _read_all(stream: Any) -> bytes:
    with stream:
        return stream.read()


class _Client:
    """One kept-alive connection per thread to the transform's server."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self.local = threading.local()

    def post(self, body: bytes, content_type: str, accept: str) -> tuple[int, bytes]:
        for attempt in (1, 2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = http.client.HTTPConnection(*self.address, timeout=600)
                conn.connect()
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.local.conn = conn
            try:
                conn.request(
                    "POST",
                    "/invocations",
                    body=body,
                    headers={"Content-Type": content_type, "Accept": accept},
                )
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


class Transformer:
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
        from shipyard.sdk.model import _name

        if data_type != "S3Prefix":
            raise ValidationError(
                f"data_type {data_type!r}: only 'S3Prefix' (a file, a "
                "directory or a path prefix) is available"
            )
        if compression_type not in (None, "None"):
            raise ValidationError("compression_type: only uncompressed input is available")
        if split_type not in batch.SPLIT_TYPES:
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
        files = input_files(data)
        job = job_name or _name(self.base_transform_job_name)
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
        )
        try:
            record = endpoints.wait(job)
            concurrency = self.max_concurrent_transforms or self._execution_parameters(
                record.url
            ).get("MaxConcurrentTransforms", 1)
            result = TransformResult(job)
            client = _Client(record.host, record.port)
            remote = self.output_path.startswith("s3://")
            out_dir = (
                os.path.join(self._home(), "transform", job)
                if remote
                else local_path(self.output_path)
            )
            with ThreadPoolExecutor(max(1, concurrency)) as pool:
                for rel, read in files:
                    out = os.path.join(out_dir, rel + ".out")
                    self._transform_file(rel, read(), out, client, pool, options, result)
                    if remote:
                        from shipyard.storage import parse, store_for

                        dest = parse(self.output_path).child(rel + ".out")
                        store_for(dest).upload(out, dest)
                        result.outputs[-1] = dest.uri
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

    def _transform_file(
        self,
        rel: str,
        data: bytes,
        out_path: str,
        client: _Client,
        pool: ThreadPoolExecutor,
        options: dict[str, Any],
        result: TransformResult,
    ) -> None:
        split_type = options["split_type"]
        ctype = options["content_type"]
        accept = self.accept or "application/json"
        originals = batch.split_records(data, split_type)
        # requests carry the filtered records; join_source joins the original ones
        records = [batch.filter_input(r, options["input_filter"], ctype) for r in originals]
        ranges = batch.mini_batches(
            records, self.strategy, int(self.max_payload * 1024 * 1024), split_type
        )
        per_record = bool(options["join_source"] or options["output_filter"])
        lock = threading.Lock()

        def run(span: tuple[int, int]) -> list[bytes | None]:
            """Outputs of records [start, end): a list of one body, or one per record."""
            start, end = span
            status, body = client.post(
                batch.join_payload(records[start:end], split_type), ctype, accept
            )
            with lock:
                result.requests += 1
            if status < 300 and not per_record:
                return [body]
            if status < 300:
                split = batch.per_record_outputs(body, end - start)
                if split is not None:
                    return split
                if end - start == 1:
                    return [body]
                status, body = (
                    400,
                    json.dumps(
                        {
                            "error": "the answer for a mini-batch cannot "
                            "be split per record; use an accept type "
                            "with one line per record"
                        }
                    ).encode(),
                )
            if end - start > 1:  # find the bad records; the others still get outputs
                return [o for i in range(start, end) for o in run((i, i + 1))]
            with lock:
                result.failures.append(
                    {
                        "File": rel,
                        "Position": start + 1,
                        "Status": status,
                        "Error": _error_text(body),
                    }
                )
            return [None]

        outputs = list(pool.map(run, ranges))
        result.records += len(records)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out_path), suffix=".tmp")
        line = self.assemble_with == "Line"
        try:
            with os.fdopen(fd, "wb") as fh:
                for (start, _end), bodies in zip(ranges, outputs):
                    for k, body in enumerate(bodies):
                        body = body if body is not None else b""
                        if per_record and body:
                            body = batch.join_output(
                                originals[start + k],
                                body,
                                options["join_source"],
                                options["output_filter"],
                                ctype,
                                accept,
                            )
                        fh.write(body)
                        if line and not body.endswith(b"\n"):
                            fh.write(b"\n")
            os.replace(tmp, out_path)
        except BaseException:
            os.unlink(tmp)
            raise
        result.outputs.append(out_path)


def _error_text(body: bytes) -> str:
    try:
        data = json.loads(body)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except ValueError:
        pass
    return body.decode("utf-8", "replace")[:500]
