"""What a training job's own credential may do: what its SageMaker execution role would.

A request signed with a job's key (``job_keys``) is allowed only:

- S3: reading objects under the job's input channels' prefixes, and reading, writing and
  deleting under its output (``<S3OutputPath>/<job>/``), checkpoint and TensorBoard
  prefixes; listing a bucket only with a ``prefix`` inside one of those; the bucket's
  location and HEAD where it holds one. No ListBuckets, no bucket created or deleted, no
  DeleteObjects, no other bucket and no other job's prefix.
- CloudWatch Logs: its own streams (``<job>/...`` in ``/aws/sagemaker/TrainingJobs``).
- CloudWatch metrics: GetMetricStatistics/GetMetricData of its own dimension values
  (``TrainingJobName=<job>``, ``Host=<job>/algo-k``).
- STS GetCallerIdentity.

Everything else (every SageMaker operation: no CreateTrainingJob; invocations; IAM) is
refused in the service's own AccessDenied shape, as is any call once the key is revoked.
``check`` runs after the signature verified, so a refusal never says whether a
forged request would have been allowed.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from shipyard.server.errors import ApiError
from shipyard.server.guard import MONITORING_PATH, denied
from shipyard.server.http import Request
from shipyard.server.job_keys import JobGrant

TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
READS = ("GET", "HEAD")
WRITES = ("PUT", "POST", "DELETE")


def refuse(service: str, grant: JobGrant, what: str) -> ApiError:
    return denied(
        service,
        "AccessDeniedException",
        f"the credential of training job {grant.job!r} is not allowed to {what}; a job's "
        "own key reaches its channels, output, checkpoint and TensorBoard prefixes, its "
        "logs and its metrics",
    )


def check(
    grant: JobGrant,
    service: str,
    req: Request,
    split: Callable[[Request], tuple[str, str]],
) -> None:
    """Raise AccessDenied (the service's shape) unless ``grant`` allows ``req``."""
    if grant.revoked:
        raise denied(
            service,
            "AccessDeniedException",
            f"the credential of training job {grant.job!r} was revoked: {grant.revoked}",
        )
    token = req.headers.get("x-amz-security-token") or req.arg("X-Amz-Security-Token") or ""
    if token != grant.session_token:
        raise refuse(service, grant, "sign without its session token")
    if service == "s3":
        _s3(grant, req, *split(req))
    elif service == "logs":
        _logs(grant, req)
    elif service == "monitoring":
        _metrics(grant, req)
    elif service == "sts" and req.form().get("Action") == "GetCallerIdentity":
        return
    else:
        target = req.headers.get("x-amz-target", "").rpartition(".")[2] or req.method
        raise refuse(service, grant, f"call {service} {target}")


def covered(grant: JobGrant, path: str, write: bool) -> bool:
    """``bucket/key`` lies under one of the grant's prefixes (a write: a writable one)."""
    prefixes = grant.write if write else (*grant.read, *grant.write)
    return any(path.startswith(p) for p in prefixes)


def _s3(grant: JobGrant, req: Request, bucket: str, key: str) -> None:
    method = req.method
    if not bucket:
        raise refuse("s3", grant, "list buckets")
    if key:
        path = f"{bucket}/{key}"
        if not covered(grant, path, write=method in WRITES):
            raise refuse("s3", grant, f"{method} s3://{path}")
        source = req.headers.get("x-amz-copy-source")
        if source:
            src = source.split("?", 1)[0].lstrip("/")
            if not covered(grant, urllib.parse.unquote(src), write=False):
                raise refuse("s3", grant, f"copy from s3://{src}")
        return
    query = req.query
    if method in ("GET", "HEAD") and ("location" in query or method == "HEAD"):
        if any(p.startswith(bucket + "/") for p in (*grant.read, *grant.write)):
            return
        raise refuse("s3", grant, f"reach bucket {bucket}")
    if method == "GET" and not ({"delete", "policy", "acl", "tagging"} & set(query)):
        prefix = (query.get("prefix") or [""])[0]
        if covered(grant, f"{bucket}/{prefix}", write=False):
            return
        raise refuse("s3", grant, f"list s3://{bucket}/{prefix}")
    raise refuse("s3", grant, f"{method} bucket {bucket}")


def _logs(grant: JobGrant, req: Request) -> None:
    body = req.json()
    own = f"{grant.job}/"
    name = body.get("logStreamName") or body.get("logStreamNamePrefix") or ""
    if body.get("logGroupName") == TRAINING_LOG_GROUP and str(name).startswith(own):
        return
    raise refuse("logs", grant, f"read log streams {body.get('logGroupName')} {name!r}")


def _metrics(grant: JobGrant, req: Request) -> None:
    target = req.headers.get("x-amz-target", "").rpartition(".")[2]
    path = req.raw_path.split("?", 1)[0]
    if path.startswith(MONITORING_PATH):
        from shipyard.server.monitoring import decode

        operation, body = path[len(MONITORING_PATH) :].rpartition("/")[2], decode(req.body)
    else:
        operation, body = target, req.json()
    if operation == "GetMetricStatistics":
        dimension_sets: list[Any] = [body.get("Dimensions")]
    elif operation == "GetMetricData":
        dimension_sets = [
            ((q.get("MetricStat") or {}).get("Metric") or {}).get("Dimensions")
            for q in body.get("MetricDataQueries") or []
            if isinstance(q, dict)
        ]
    else:
        raise refuse("monitoring", grant, f"call CloudWatch {operation}")
    for dims in dimension_sets:
        values = [d.get("Value") for d in dims or [] if isinstance(d, dict)]
        if not values or not all(_own_metric(grant.job, v) for v in values):
            raise refuse("monitoring", grant, f"read metrics of {json.dumps(values)}")


def _own_metric(job: str, value: Any) -> bool:
    return isinstance(value, str) and (value == job or value.startswith(job + "/"))
