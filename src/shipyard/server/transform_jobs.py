"""CreateTransformJob & co.: batch transform through ``serving.transform.engine``.

The job runs in a server thread: a model server for the job's model (the endpoint
machinery, under the job's name), the engine sends each input file's records to it and
writes ``<output>/<file>.out``, then the model server is deleted. Its log is kept as the
job's CloudWatch stream (``/aws/sagemaker/TransformJobs``, ``<job>/<job>-1``).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from typing import Any

from shipyard.control.endpoints import Endpoints
from shipyard.errors import ShipyardError
from shipyard.server import images
from shipyard.server.errors import ApiError, in_use, validation
from shipyard.server.hosting import HostingApi, model_container
from shipyard.server.records import Records
from shipyard.server.training import arn
from shipyard.serving.transform import engine, records

log = logging.getLogger("shipyard.server")


class TransformApi:
    def __init__(self, hosting: HostingApi, endpoints: Endpoints, records_: Records, root: str):
        self.hosting = hosting
        self.endpoints = endpoints
        self.records = records_
        self.root = root
        self._stop: dict[str, threading.Event] = {}

    def log_path(self, name: str) -> str:
        return os.path.join(self.root, name, "transform.log")

    def create_transform_job(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("TransformJobName") or "")
        if not name or len(name) > 63 or not all(c.isalnum() or c == "-" for c in name):
            raise validation(f"transform job name {name!r}: use up to 63 letters, digits, hyphens")
        model = self.hosting._model(str(req.get("ModelName") or ""), region)
        framework, _ = images.parse(model_container(model).get("Image", ""), "inference")
        tin = req.get("TransformInput") or {}
        source = (tin.get("DataSource") or {}).get("S3DataSource") or {}
        split = tin.get("SplitType")
        split = None if split in (None, "None") else split
        if split not in records.SPLIT_TYPES:
            raise validation(f"SplitType {split!r}: use None, Line, RecordIO or TFRecord")
        if source.get("S3DataType", "S3Prefix") != "S3Prefix":
            raise validation("TransformInput: only S3DataType S3Prefix is supported")
        if tin.get("CompressionType") not in (None, "None"):
            raise validation("TransformInput: only uncompressed input is supported")
        output = req.get("TransformOutput") or {}
        if not output.get("S3OutputPath"):
            raise validation("TransformOutput.S3OutputPath is required")
        try:
            files = engine.input_files(source.get("S3Uri", ""))
        except ShipyardError as exc:
            raise validation(f"TransformInput {source.get('S3Uri')!r}: {exc}") from None
        if not files:
            raise validation(f"TransformInput {source.get('S3Uri')!r} has no objects")
        doc = dict(
            req,
            TransformJobArn=arn(region, "transform-job", name),
            TransformJobStatus="InProgress",
            CreationTime=time.time(),
            TransformStartTime=time.time(),
        )
        if not self.records.add("transform-job", name, doc):
            raise in_use(f"Job name must be unique within an AWS account and region: {name}")
        os.makedirs(os.path.dirname(self.log_path(name)), exist_ok=True)
        stop = self._stop[name] = threading.Event()
        threading.Thread(
            target=self._run, args=(name, doc, model, framework, files, stop), daemon=True
        ).start()
        return {"TransformJobArn": doc["TransformJobArn"]}

    def _run(self, name, doc, model, framework, files, stop: threading.Event) -> None:
        container = model_container(model)
        tin, output = doc.get("TransformInput") or {}, doc.get("TransformOutput") or {}
        resources = doc.get("TransformResources") or {}
        processing = doc.get("DataProcessing") or {}
        strategy = doc.get("BatchStrategy")
        max_payload = float(doc.get("MaxPayloadInMB") or 6)
        server = f"{name}-transform"[:63]
        status, reason = "Completed", None
        with open(self.log_path(name), "a", encoding="utf-8") as out:
            try:
                env = {
                    **(container.get("Environment") or {}),
                    **(doc.get("Environment") or {}),
                    "SAGEMAKER_BATCH": "true",
                    "SAGEMAKER_MAX_PAYLOAD_IN_MB": str(max_payload),
                    "SAGEMAKER_BATCH_STRATEGY": "SINGLE_RECORD"
                    if strategy == "SingleRecord"
                    else "MULTI_RECORD",
                }
                self.endpoints.create(
                    server,
                    container.get("ModelDataUrl") or "",
                    framework=framework,
                    env=env,
                    workers=max(1, int(resources.get("InstanceCount") or 1)),
                    max_payload_mb=max(max_payload, 6),
                    instance_type=resources.get("InstanceType") or "local",
                )
                try:
                    record = self.endpoints.wait(server)
                    out.write(f"model server for {name} is up at {record.url}\n")
                    out.flush()
                    if stop.is_set():
                        raise InterruptedError
                    result = engine.run(
                        name,
                        files,
                        record.host,
                        record.port,
                        output["S3OutputPath"],
                        os.path.join(self.root, name, "staging"),
                        int(doc.get("MaxConcurrentTransforms") or 1),
                        engine.Settings(
                            strategy, max_payload, output.get("Accept"), output.get("AssembleWith")
                        ),
                        {
                            "content_type": tin.get("ContentType") or "application/octet-stream",
                            "split_type": None
                            if tin.get("SplitType") in (None, "None")
                            else tin["SplitType"],
                            "input_filter": processing.get("InputFilter"),
                            "output_filter": processing.get("OutputFilter"),
                            "join_source": None
                            if processing.get("JoinSource") in (None, "None")
                            else processing["JoinSource"],
                        },
                    )
                    with open(record.log_path, encoding="utf-8", errors="replace") as fh:
                        shutil.copyfileobj(fh, out)
                finally:
                    self.endpoints.delete(server)
                out.write(
                    f"{name}: {result.records} record(s) in {result.requests} request(s) -> "
                    f"{output['S3OutputPath']}\n"
                )
                if result.failures:
                    raise engine.TransformError(result)
            except InterruptedError:
                status, reason = "Stopped", None
            except (ShipyardError, OSError, ApiError) as exc:
                status, reason = "Failed", str(exc)[:1024]
                out.write(f"{name} failed: {exc}\n")
        if stop.is_set() and status != "Failed":
            status = "Stopped"
        doc = self.records.get("transform-job", name) or doc
        doc.update(TransformJobStatus=status, TransformEndTime=time.time())
        if reason:
            doc["FailureReason"] = reason
        self.records.put("transform-job", name, doc)
        log.info("transform job %s: %s", name, status)

    def _doc(self, name: str, region: str) -> dict[str, Any]:
        doc = self.records.get("transform-job", name)
        if doc is None:
            raise validation(
                f'Could not find requested job with name "{arn(region, "transform-job", name)}".'
            )
        return doc

    def describe_transform_job(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        doc = self._doc(str(req.get("TransformJobName") or ""), region)
        status = doc["TransformJobStatus"]
        if status == "InProgress" and self._stop.get(doc["TransformJobName"], None) is None:
            # the server restarted while it ran: the thread is gone
            doc.update(TransformJobStatus="Failed", FailureReason="the server restarted")
        return doc

    def stop_transform_job(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("TransformJobName") or "")
        doc = self._doc(name, region)
        if doc["TransformJobStatus"] == "InProgress" and name in self._stop:
            self._stop[name].set()
            doc["TransformJobStatus"] = "Stopping"
            self.records.put("transform-job", name, doc)
        return {}

    def log_streams(self, group: str, prefix: str) -> dict[str, str]:
        name = prefix.split("/", 1)[0]
        path = self.log_path(name)
        stream = f"{name}/{name}-1"
        return {stream: path} if os.path.exists(path) and stream.startswith(prefix) else {}
