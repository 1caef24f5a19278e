"""Models, endpoint configs and endpoints: SageMaker's hosting API over
``control.endpoints`` (the same records ``shipyard endpoints`` lists).

CreateModel records the container (image -> framework, ModelDataUrl, Environment such as
SAGEMAKER_PROGRAM); CreateEndpointConfig its variant; CreateEndpoint starts a shipyard
model server for the config's model in the background and answers at once, as
SageMaker does: the endpoint is Creating until its server answers /ping, then InService
(or Failed with the reason). UpdateEndpoint replaces the server; DeleteEndpoint stops it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from shipyard.control.endpoints import Endpoints, ping
from shipyard.errors import EndpointNotFoundError, ShipyardError
from shipyard.server import images
from shipyard.server.errors import ApiError, validation
from shipyard.server.objects import ObjectStore
from shipyard.server.records import Records
from shipyard.server.training import arn

log = logging.getLogger("shipyard.server")
# SageMaker's real-time InvokeEndpoint payload limit (6 MB: the developer guide's
# quotas, and the Body member's max of 6291456 in botocore's sagemaker-runtime model)
REALTIME_PAYLOAD_MB = 6.0
PAYLOAD_ENV = "SAGEMAKER_MAX_PAYLOAD_IN_MB"  # a model's Environment raises it
MAX_RAISED_PAYLOAD_MB = 1024.0  # SageMaker's asynchronous inference limit (1 GB)


def payload_limit_mb(container: dict[str, Any]) -> float:
    """The request size a model's endpoint accepts, in MB: 6, or what its Environment's
    ``SAGEMAKER_MAX_PAYLOAD_IN_MB`` raises it to (shipyard's model server reads the same
    variable, so the API server and the model server agree)."""
    raw = (container.get("Environment") or {}).get(PAYLOAD_ENV)
    if raw is None:
        return REALTIME_PAYLOAD_MB
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = 0.0
    if not 0 < value <= MAX_RAISED_PAYLOAD_MB:
        raise validation(
            f"Environment {PAYLOAD_ENV}={raw!r}: give the largest InvokeEndpoint body this "
            f"model accepts in MB, a number above 0 and at most {MAX_RAISED_PAYLOAD_MB:g} "
            f"(default {REALTIME_PAYLOAD_MB:g}, SageMaker's real-time limit)"
        )
    return max(value, REALTIME_PAYLOAD_MB)


def model_container(model: dict[str, Any]) -> dict[str, Any]:
    container = model.get("PrimaryContainer") or (model.get("Containers") or [None])[0]
    if not container:
        raise validation("a model needs PrimaryContainer (or one entry in Containers)")
    return container


class HostingApi:
    def __init__(self, endpoints: Endpoints, objects: ObjectStore, records: Records) -> None:
        self.endpoints = endpoints
        self.objects = objects
        self.records = records
        self._starting: dict[str, threading.Thread] = {}
        self._errors: dict[str, str] = {}

    # -- models ---------------------------------------------------------------------------
    def create_model(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("ModelName") or "")
        if not name:
            raise validation("ModelName is required")
        container = model_container(req)
        images.parse(container.get("Image", ""), "inference")
        payload_limit_mb(container)
        data = container.get("ModelDataUrl")
        if data:
            self._check_s3(data, "ModelDataUrl")
        doc = dict(req, CreationTime=time.time(), ModelArn=arn(region, "model", name))
        if not self.records.add("model", name, doc):
            raise validation(
                f'Cannot create already existing model "{arn(region, "model", name)}".'
            )
        return {"ModelArn": doc["ModelArn"]}

    def _check_s3(self, uri: str, what: str) -> None:
        if not uri.startswith("s3://"):
            return
        bucket, _, key = uri[len("s3://") :].partition("/")
        try:
            self.objects.get(bucket, key)
        except ApiError:
            raise validation(f"Could not find {what} at {uri} on this server's S3.") from None

    def _model(self, name: str, region: str) -> dict[str, Any]:
        doc = self.records.get("model", name)
        if doc is None:
            raise validation(f'Could not find model "{arn(region, "model", name)}".')
        return doc

    def describe_model(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        return self._model(str(req.get("ModelName") or ""), region)

    def delete_model(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("ModelName") or "")
        if not self.records.delete("model", name):
            raise validation(f'Could not find model "{arn(region, "model", name)}".')
        return {}

    # -- endpoint configs -----------------------------------------------------------------
    def create_endpoint_config(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("EndpointConfigName") or "")
        variants = req.get("ProductionVariants") or []
        if len(variants) != 1:
            raise validation(
                f"endpoint config {name!r}: shipyard serves exactly one production variant, "
                f"got {len(variants)}"
            )
        self._model(variants[0].get("ModelName", ""), region)
        doc = dict(
            req, CreationTime=time.time(), EndpointConfigArn=arn(region, "endpoint-config", name)
        )
        if not self.records.add("endpoint-config", name, doc):
            raise validation(
                f'Cannot create already existing endpoint configuration "'
                f'{arn(region, "endpoint-config", name)}".'
            )
        return {"EndpointConfigArn": doc["EndpointConfigArn"]}

    def _config(self, name: str, region: str) -> dict[str, Any]:
        doc = self.records.get("endpoint-config", name)
        if doc is None:
            raise validation(
                f'Could not find endpoint configuration "{arn(region, "endpoint-config", name)}".'
            )
        return doc

    def describe_endpoint_config(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        return self._config(str(req.get("EndpointConfigName") or ""), region)

    def delete_endpoint_config(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("EndpointConfigName") or "")
        if not self.records.delete("endpoint-config", name):
            raise validation(
                f'Could not find endpoint configuration "{arn(region, "endpoint-config", name)}".'
            )
        return {}

    # -- endpoints ------------------------------------------------------------------------
    def create_endpoint(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("EndpointName") or "")
        config_name = str(req.get("EndpointConfigName") or "")
        config = self._config(config_name, region)
        variant = config["ProductionVariants"][0]
        model = self._model(variant["ModelName"], region)
        if self.records.get("endpoint", name) is not None or self._exists(name):
            raise validation(
                f'Cannot create already existing endpoint "{arn(region, "endpoint", name)}".'
            )
        if not name or len(name) > 63 or not all(c.isalnum() or c == "-" for c in name):
            raise validation(f"endpoint name {name!r}: use up to 63 letters, digits and hyphens")
        doc = {
            "EndpointName": name,
            "EndpointArn": arn(region, "endpoint", name),
            "EndpointConfigName": config_name,
            "CreationTime": time.time(),
            "Tags": req.get("Tags") or [],
        }
        self.records.put("endpoint", name, doc)
        self._start(name, model, variant)
        return {"EndpointArn": doc["EndpointArn"]}

    def _exists(self, name: str) -> bool:
        try:
            self.endpoints.get(name)
        except EndpointNotFoundError:
            return False
        return True

    def _start(self, name: str, model: dict[str, Any], variant: dict[str, Any]) -> None:
        """Prepare and launch the model server in the background (Creating meanwhile)."""
        container = model_container(model)
        framework, _ = images.parse(container.get("Image", ""), "inference")
        self._errors.pop(name, None)

        def work() -> None:
            try:
                self.endpoints.create(
                    name,
                    container.get("ModelDataUrl") or "",
                    framework=framework,
                    env=dict(container.get("Environment") or {}),
                    workers=max(1, int(variant.get("InitialInstanceCount") or 1)),
                    max_payload_mb=payload_limit_mb(container),
                    instance_type=variant.get("InstanceType") or "local",
                )
            except (ShipyardError, OSError) as exc:
                self._errors[name] = f"the model server could not be created: {exc}"
                log.warning("endpoint %s: %s", name, self._errors[name])
            finally:
                self._starting.pop(name, None)

        thread = threading.Thread(target=work, name=f"endpoint-{name}", daemon=True)
        self._starting[name] = thread
        thread.start()

    def status(self, name: str) -> tuple[str, str | None, Any]:
        """(EndpointStatus, FailureReason, record or None) as the API reports them."""
        if name in self._starting:
            return "Creating", None, None
        if name in self._errors:
            return "Failed", self._errors[name], None
        try:
            record = self.endpoints.get(name)
        except EndpointNotFoundError:
            return "Failed", "the model server is gone (deleted outside the API?)", None
        if record.status == "InService" and not ping(record):
            return "Creating", None, record
        return record.status, record.failure_reason, record

    def describe_endpoint(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("EndpointName") or "")
        doc = self.records.get("endpoint", name)
        if doc is None:
            raise validation(f'Could not find endpoint "{arn(region, "endpoint", name)}".')
        status, reason, record = self.status(name)
        if doc.get("Updating"):
            if status == "Creating":
                status = "Updating"
            else:
                doc.pop("Updating")
                self.records.put("endpoint", name, doc)
        config = self.records.get("endpoint-config", doc["EndpointConfigName"]) or {}
        variants = []
        for v in config.get("ProductionVariants", []):
            model = self.records.get("model", v.get("ModelName", "")) or {}
            image = model_container(model).get("Image") if model else None
            count = int(v.get("InitialInstanceCount") or 1)
            variants.append(
                {
                    "VariantName": v.get("VariantName", "AllTraffic"),
                    "DeployedImages": [{"SpecifiedImage": image, "ResolvedImage": image}]
                    if image
                    else [],
                    "CurrentWeight": float(v.get("InitialVariantWeight") or 1.0),
                    "DesiredWeight": float(v.get("InitialVariantWeight") or 1.0),
                    "CurrentInstanceCount": count,
                    "DesiredInstanceCount": count,
                }
            )
        out = {
            "EndpointName": name,
            "EndpointArn": doc["EndpointArn"],
            "EndpointConfigName": doc["EndpointConfigName"],
            "ProductionVariants": variants,
            "EndpointStatus": status,
            "CreationTime": doc["CreationTime"],
            "LastModifiedTime": record.modified_at if record else doc["CreationTime"],
        }
        if reason and status == "Failed":
            out["FailureReason"] = reason
        return out

    def update_endpoint(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("EndpointName") or "")
        doc = self.records.get("endpoint", name)
        if doc is None:
            raise validation(f'Could not find endpoint "{arn(region, "endpoint", name)}".')
        config_name = str(req.get("EndpointConfigName") or "")
        config = self._config(config_name, region)
        variant = config["ProductionVariants"][0]
        model = self._model(variant["ModelName"], region)
        if self.status(name)[0] == "Creating":
            raise validation(f"Cannot update in-progress endpoint {doc['EndpointArn']}.")
        if self._exists(name):
            self.endpoints.delete(name)
        doc.update(EndpointConfigName=config_name, Updating=True)
        self.records.put("endpoint", name, doc)
        self._start(name, model, variant)
        return {"EndpointArn": doc["EndpointArn"]}

    def delete_endpoint(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("EndpointName") or "")
        if self.records.get("endpoint", name) is None:
            raise validation(f'Could not find endpoint "{arn(region, "endpoint", name)}".')
        thread = self._starting.get(name)
        if thread is not None:
            thread.join(timeout=120)
        if self._exists(name):
            self.endpoints.delete(name)
        self.records.delete("endpoint", name)
        self._errors.pop(name, None)
        return {}

    def list_endpoints(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        out = []
        contains = req.get("NameContains")
        for name in self.records.names("endpoint"):
            if contains and contains not in name:
                continue
            doc = self.records.get("endpoint", name) or {}
            out.append(
                {
                    "EndpointName": name,
                    "EndpointArn": doc.get("EndpointArn"),
                    "CreationTime": doc.get("CreationTime"),
                    "LastModifiedTime": doc.get("CreationTime"),
                    "EndpointStatus": self.status(name)[0],
                }
            )
        return {"Endpoints": out}

    def payload_limit(self, name: str) -> int:
        """The largest InvokeEndpoint body endpoint ``name`` accepts, in bytes."""
        doc = self.records.get("endpoint", name) or {}
        config = self.records.get("endpoint-config", doc.get("EndpointConfigName", "")) or {}
        variants = config.get("ProductionVariants") or [{}]
        model = self.records.get("model", variants[0].get("ModelName", "")) or {}
        container = model_container(model) if model else {}
        return int(payload_limit_mb(container) * (1 << 20))

    def log_streams(self, group: str, prefix: str) -> dict[str, str]:
        """CloudWatch view: /aws/sagemaker/Endpoints/<name> -> the server's log."""
        name = group.rsplit("/", 1)[-1]
        try:
            record = self.endpoints.get(name)
        except EndpointNotFoundError:
            return {}
        stream = f"AllTraffic/{name}"
        return {stream: record.log_path} if stream.startswith(prefix) else {}
