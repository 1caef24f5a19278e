"""Wiring: every service the server answers, built over one SHIPYARD_HOME."""

from __future__ import annotations

import functools
import os
from typing import Any

from shipyard.control.client import ControlPlane
from shipyard.control.endpoints import Endpoints
from shipyard.server.hosting import HostingApi
from shipyard.server.identity import IamApi, StsApi
from shipyard.server.invocations import RuntimeApi
from shipyard.server.job_keys import KeyTable
from shipyard.server.logs import ENDPOINTS, TRAINING, TRANSFORM, LogsApi
from shipyard.server.monitoring import MonitoringApi, sources
from shipyard.server.objects import ObjectStore
from shipyard.server.records import Records
from shipyard.server.s3_api import S3Api
from shipyard.server.sagemaker import SageMakerApi, TagsApi, operations
from shipyard.server.training import TrainingApi
from shipyard.server.transform_jobs import TransformApi


def build(
    home: str,
    backend: str = "local",
    hosts: tuple[str, ...] = (),
    keys: KeyTable | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """Every service over ``home``; ``keys`` (the server's KeyTable) mints each job a
    credential of its own for reaching the server at ``url``, revoked when its job ends."""
    root = os.path.join(home, "server")
    os.makedirs(os.path.join(root, "staging"), exist_ok=True)
    objects = ObjectStore(os.path.join(home, "s3"))
    objects.sweep_temp()
    records = Records(os.path.join(root, "api.db"))
    control = ControlPlane(home=home, backend=backend)
    endpoints = Endpoints(home=home)
    if keys is not None:
        keys.ended = functools.partial(_ended, control)
    training = TrainingApi(
        control, objects, records, os.path.join(root, "staging"), keys=keys, url=url
    )
    hosting = HostingApi(endpoints, objects, records)
    transform = TransformApi(hosting, endpoints, records, os.path.join(root, "transform"))

    def streams(group: str, prefix: str) -> dict[str, str]:
        if group == TRAINING:
            job = prefix.split("/", 1)[0]
            if not control.store.exists(job):
                return {}
            created = int(control.store.get(job).created_at)
            found = {
                f"{job}/{host}-{created}": path for host, path in control.log_files(job).items()
            }
            return {k: v for k, v in found.items() if k.startswith(prefix)}
        if group == TRANSFORM:
            return transform.log_streams(group, prefix)
        if group.startswith(ENDPOINTS):
            return hosting.log_streams(group, prefix)
        return {}

    return {
        "sagemaker": SageMakerApi(operations(training, hosting, transform, TagsApi(records))),
        "sagemaker-runtime": RuntimeApi(hosting),
        "logs": LogsApi(streams),
        "monitoring": MonitoringApi(*sources(control)),  # CloudWatch metrics
        "s3": S3Api(objects, hosts),
        "sts": StsApi(),
        "iam": IamApi(),
    }


def _ended(control: ControlPlane, job: str) -> str | None:
    """A job's terminal status (its key is revoked then); None while it may still run."""
    if not control.store.exists(job):
        return "no such job any more"
    record = control.store.get(job)
    return str(getattr(record.status, "value", record.status)) if record.terminal else None
