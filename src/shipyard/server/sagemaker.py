"""The ``sagemaker`` service: ``X-Amz-Target: SageMaker.<Operation>`` to its handler.

Operations are the methods of the training, hosting and transform APIs (snake_case of
the operation name) plus tags; an operation not served is refused with a message
listing what is.
"""

from __future__ import annotations

import re
from typing import Any

from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, json_response
from shipyard.server.records import Records


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


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


class SageMakerApi:
    def __init__(self, *apis: Any) -> None:
        self.operations: dict[str, Any] = {}
        for api in apis:
            for attr in dir(api):
                if attr.startswith("_"):
                    continue
                method = getattr(api, attr)
                if callable(method) and attr not in ("handle", "log_streams", "status", "log_path"):
                    self.operations[attr] = method

    def handle(self, req: Request) -> Response:
        target = req.headers.get("x-amz-target", "")
        prefix, _, operation = target.partition(".")
        if prefix != "SageMaker" or not operation:
            raise ApiError(
                "UnknownOperationException", f"X-Amz-Target {target!r} is not a SageMaker operation"
            )
        method = self.operations.get(snake(operation))
        if method is None:
            served = sorted("".join(p.title() for p in name.split("_")) for name in self.operations)
            raise ApiError(
                "UnknownOperationException",
                f"SageMaker operation {operation} is not served by shipyard; served: "
                + ", ".join(served),
            )
        return json_response(method(req.json(), req.region))
