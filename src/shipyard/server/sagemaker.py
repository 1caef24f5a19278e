"""The ``sagemaker`` service: ``X-Amz-Target: SageMaker.<Operation>`` to its handler.

Operations are listed by name in ``operations`` (no reflection: only what is listed is
callable) and each request is validated against botocore's model of its input
(contract.py) before its handler sees it; an operation not served is AWS's
UnknownOperationException, with a message listing what is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shipyard.server.contract import Contract, unknown_operation
from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, json_response
from shipyard.server.records import Records


class TagsApi:
    def __init__(self, records: Records) -> None:
        self.records = records

    def add_tags(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        resource = str(req.get("ResourceArn") or "")
        tags = {
            t["Key"]: t.get("Value", "")
            for t in (self.records.get("tags", resource) or {}).get("Tags", [])
        }
        tags.update({t["Key"]: t.get("Value", "") for t in req.get("Tags") or []})
        listed = [{"Key": k, "Value": v} for k, v in tags.items()]
        self.records.put("tags", resource, {"Tags": listed})
        return {"Tags": listed}

    def list_tags(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        resource = str(req.get("ResourceArn") or "")
        return {"Tags": (self.records.get("tags", resource) or {}).get("Tags", [])}

    def delete_tags(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        resource = str(req.get("ResourceArn") or "")
        drop = set(req.get("TagKeys") or [])
        tags = (self.records.get("tags", resource) or {}).get("Tags", [])
        self.records.put("tags", resource, {"Tags": [t for t in tags if t["Key"] not in drop]})
        return {}


Operation = Callable[[dict[str, Any], str], dict[str, Any]]


def operations(training: Any, hosting: Any, transform: Any, tags: TagsApi) -> dict[str, Operation]:
    """Every SageMaker operation shipyard answers, by its API name: an explicit table, so
    a helper method is never reachable as an operation (it was: ``SpecFromRequest``)."""
    return {
        "CreateTrainingJob": training.create_training_job,
        "DescribeTrainingJob": training.describe_training_job,
        "StopTrainingJob": training.stop_training_job,
        "ListTrainingJobs": training.list_training_jobs,
        "CreateModel": hosting.create_model,
        "DescribeModel": hosting.describe_model,
        "DeleteModel": hosting.delete_model,
        "CreateEndpointConfig": hosting.create_endpoint_config,
        "DescribeEndpointConfig": hosting.describe_endpoint_config,
        "DeleteEndpointConfig": hosting.delete_endpoint_config,
        "CreateEndpoint": hosting.create_endpoint,
        "DescribeEndpoint": hosting.describe_endpoint,
        "UpdateEndpoint": hosting.update_endpoint,
        "DeleteEndpoint": hosting.delete_endpoint,
        "ListEndpoints": hosting.list_endpoints,
        "CreateTransformJob": transform.create_transform_job,
        "DescribeTransformJob": transform.describe_transform_job,
        "StopTransformJob": transform.stop_transform_job,
        "AddTags": tags.add_tags,
        "ListTags": tags.list_tags,
        "DeleteTags": tags.delete_tags,
    }


class SageMakerApi:
    """``X-Amz-Target: SageMaker.<Operation>``: the operation looked up in the table, its
    input validated against botocore's model of it, then handled."""

    def __init__(self, table: dict[str, Operation]) -> None:
        self.operations = table
        self.contract = Contract("sagemaker", set(table))

    def handle(self, req: Request) -> Response:
        target = req.headers.get("x-amz-target", "")
        prefix, _, operation = target.partition(".")
        if prefix != "SageMaker" or not operation:
            raise ApiError(
                "UnknownOperationException", f"X-Amz-Target {target!r} is not a SageMaker operation"
            )
        method = self.operations.get(operation)
        if method is None:
            err = unknown_operation("SageMaker", operation)
            err.message += "; served: " + ", ".join(sorted(self.operations))
            raise err
        body = req.json()
        self.contract.validate(operation, body)
        return json_response(method(self.contract.known(operation, body), req.region))
